//! I/O binding: inputs and outputs bound to a session once and used run after run, so that a
//! loop of runs allocates and copies nothing for them (ONNX Runtime's `IoBinding`).
//!
//! ```no_run
//! # fn main() -> nxrt::Result<()> {
//! let session = nxrt::Session::load("model.onnx")?;
//! let mut io = nxrt::IoBinding::new();
//! io.bind_input("x", nxrt::Tensor::from_vec(&[1, 4], vec![0f32; 4])?);
//! io.bind_output_to_host("y"); // allocated by the first run, written in place after that
//! for _ in 0..100 {
//!     session.run_binding(&mut io)?;
//!     let y = io.output("y").unwrap();
//!     # let _ = y;
//! }
//! println!("{:?}", io.stats()); // written in place: 99 of 100 after the first run
//! # Ok(()) }
//! ```
//!
//! An output is written into its bound storage when the kernel that makes it allocates
//! through the executor (most do) and the storage is host memory of the output's type and
//! element count that nothing else shares: a caller that keeps a clone of an output tensor
//! across the next run makes that run allocate a new one ([`BindingStats::allocated`] counts
//! them). Outputs kept on a device ([`IoBinding::bind_output_to_device`]) stay there and can be
//! bound as the next run's inputs, read where they lie.

use nxrt_core::tensor::Buffer;
use nxrt_core::{Error, Result, RunOptions, Tensor, Value};

use crate::Session;

/// Where a bound output goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Place {
    Host,
    Device,
}

/// Inputs and outputs bound to a session for repeated runs; see the module docs.
#[derive(Debug, Default)]
pub struct IoBinding {
    inputs: Vec<(String, Value)>,
    outputs: Vec<(String, Place, Option<Value>)>,
    stats: BindingStats,
}

/// What the runs of a binding did with its host outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindingStats {
    pub runs: u64,
    /// Host outputs written into the storage they were bound to (no allocation, no copy).
    pub written_in_place: u64,
    /// Host outputs that got new storage: the first run of one bound without storage, a
    /// changed shape or type, storage shared with another tensor, or a kernel that makes its
    /// own.
    pub allocated: u64,
}

/// The address of a tensor's heap storage (`None` off the host).
fn storage_addr(t: &Tensor) -> Option<usize> {
    match t.buffer() {
        Buffer::Host(d, _) => d.as_bytes().map(|b| b.as_ptr() as usize),
        _ => None,
    }
}

impl IoBinding {
    pub fn new() -> IoBinding {
        IoBinding::default()
    }

    /// Binds input `name` to `value` (a host tensor, or a device tensor an earlier run kept),
    /// replacing what it was bound to.
    pub fn bind_input(&mut self, name: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        let name = name.into();
        let value = value.into();
        match self.inputs.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.inputs.push((name, value)),
        }
        self
    }

    /// Binds output `name` to `tensor`, pre-allocated host storage that runs write into.
    pub fn bind_output(&mut self, name: impl Into<String>, tensor: Tensor) -> &mut Self {
        self.set_output(name.into(), Place::Host, Some(Value::Tensor(tensor)))
    }

    /// Binds output `name` to the host without storage: the first run allocates it, later
    /// runs write into it.
    pub fn bind_output_to_host(&mut self, name: impl Into<String>) -> &mut Self {
        self.set_output(name.into(), Place::Host, None)
    }

    /// Binds output `name` to the device of the provider that computes it: it is not read
    /// back (a host provider's output stays on the host).
    pub fn bind_output_to_device(&mut self, name: impl Into<String>) -> &mut Self {
        self.set_output(name.into(), Place::Device, None)
    }

    fn set_output(&mut self, name: String, place: Place, v: Option<Value>) -> &mut Self {
        match self.outputs.iter_mut().find(|(n, ..)| *n == name) {
            Some(slot) => {
                slot.1 = place;
                slot.2 = v;
            }
            None => self.outputs.push((name, place, v)),
        }
        self
    }

    /// The bound inputs.
    pub fn inputs(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.inputs.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// Output `name` after the latest run (or its pre-allocated storage before one).
    pub fn output(&self, name: &str) -> Option<&Value> {
        self.outputs
            .iter()
            .find(|(n, ..)| n == name)
            .and_then(|(_, _, v)| v.as_ref())
    }

    /// The bound outputs, in the order they were bound.
    pub fn outputs(&self) -> impl Iterator<Item = (&str, Option<&Value>)> {
        self.outputs
            .iter()
            .map(|(n, _, v)| (n.as_str(), v.as_ref()))
    }

    /// Output `name`, taken out of the binding (it stays bound; the next run allocates it).
    pub fn take_output(&mut self, name: &str) -> Option<Value> {
        self.outputs
            .iter_mut()
            .find(|(n, ..)| n == name)
            .and_then(|(_, _, v)| v.take())
    }

    pub fn stats(&self) -> BindingStats {
        self.stats
    }

    /// Unbinds every input and output.
    pub fn clear(&mut self) {
        self.inputs.clear();
        self.outputs.clear();
    }
}

impl Session {
    /// Runs with the binding's inputs; its outputs are written into their bound storage
    /// where they can be (see [`IoBinding`]). Only bound outputs are kept. On an error the
    /// binding's host storage is lost (the next run allocates it again).
    pub fn run_binding(&self, io: &mut IoBinding) -> Result<()> {
        pollster::block_on(self.run_binding_async(io))
    }

    /// The async form of [`Session::run_binding`].
    pub async fn run_binding_async(&self, io: &mut IoBinding) -> Result<()> {
        if io.outputs.is_empty() {
            return Err(Error::Input(
                "the binding has no outputs: bind at least one (bind_output_to_host)".into(),
            ));
        }
        for (name, ..) in &io.outputs {
            self.core().bound_output_id(name)?;
        }
        let mut opts = RunOptions::default();
        let mut before = Vec::with_capacity(io.outputs.len());
        for (name, place, v) in &mut io.outputs {
            match place {
                Place::Device => opts.keep_on_device.push(name.clone()),
                Place::Host => {
                    let t = match v.take() {
                        Some(Value::Tensor(t)) => Some(t),
                        _ => None,
                    };
                    before.push((name.clone(), t.as_ref().and_then(storage_addr)));
                    if let Some(t) = t {
                        opts.outputs.push((name.clone(), t));
                    }
                }
            }
        }
        let outs = self.core().run_async_with(io.inputs.clone(), opts).await?;
        io.stats.runs += 1;
        for (name, v) in outs {
            let Some(slot) = io.outputs.iter_mut().find(|(n, ..)| *n == name) else {
                continue;
            };
            if let Some((_, addr)) = before.iter().find(|(n, _)| *n == name) {
                let now = match &v {
                    Value::Tensor(t) => storage_addr(t),
                    _ => None,
                };
                if addr.is_some() && now == *addr {
                    io.stats.written_in_place += 1;
                } else {
                    io.stats.allocated += 1;
                }
            }
            slot.2 = Some(v);
        }
        Ok(())
    }
}
