//! The one provider trait every target implements, kernels, and the kernel registry keyed by
//! domain, op type, opset range and element type.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::future::Future;
use core::pin::Pin;
use hashbrown::HashMap;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::Node;
use crate::tensor::{Location, Tensor};
use crate::value::Value;

/// A boxed future, so that provider traits stay object-safe and the run path stays async.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use crate::simd::gemm::{
    gemm_fits, pack_a, pack_b, reference_sgemm, scale_c, Gemm, GemmEpi, Operand,
};

/// Hot primitives a CPU target may accelerate (SIMD, threads). Core's reference kernels call
/// these, so every kernel written once in core gets the target's fast paths.
pub trait CpuBackend: Send + Sync {
    /// Name for reports (e.g. `reference`, `avx2+fma x4`).
    fn name(&self) -> String;
    /// `C = alpha*A*B + beta*C` (see [`Gemm`]).
    fn sgemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]);
    /// [`sgemm`](Self::sgemm) with operands that may come packed in the SIMD layer's panels
    /// ([`Operand::Panels`], `crate::simd::gemm_tile`'s sizes); strides of a packed side are
    /// ignored. Operands that do not fit are a caller's bug (this panics).
    fn sgemm_ops(&self, g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
        if let (Operand::Strided(a), Operand::Strided(b)) = (a, b) {
            return self.sgemm(g, a, b, c);
        }
        assert!(
            crate::simd::sgemm_ops_checked(g, a, b, c),
            "sgemm_ops: packed operands do not fit the product"
        );
    }
    /// [`sgemm_ops`](Self::sgemm_ops), then `epi` on C (a bias per row, a clamp). A backend
    /// with a register-blocked micro-kernel applies it as it stores each tile of C, so the
    /// bias and a bounded activation cost no passes over C of their own.
    fn sgemm_ops_epi(
        &self,
        g: &Gemm,
        a: Operand<'_>,
        b: Operand<'_>,
        c: &mut [f32],
        epi: GemmEpi<'_>,
    ) {
        self.sgemm_ops(g, a, b, c);
        epi.apply(g.m, g.n, g.ldc, c);
    }
    /// Runs `f(i)` for `i in 0..n`, possibly in parallel.
    fn parallel_for(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        for i in 0..n {
            f(i)
        }
    }
    /// [`parallel_for`](Self::parallel_for) for a job whose whole cost is about `work` simple
    /// operations (multiply-adds, element reads and writes): a backend runs it on the caller's
    /// thread when it is too small to repay waking other threads (the minimum grain).
    fn parallel_for_work(&self, n: usize, work: usize, f: &(dyn Fn(usize) + Sync)) {
        let _ = work;
        self.parallel_for(n, f)
    }
    /// Worker threads available to `parallel_for`.
    fn threads(&self) -> usize {
        1
    }
}

/// What a kernel sees of its environment while computing: the CPU primitives, and (in a planned
/// run) where its outputs go. Build one with [`KernelCx::new`]; ask it for output memory with
/// [`KernelCx::output`].
pub struct KernelCx<'a> {
    pub cpu: &'a dyn CpuBackend,
    pub(crate) mem: Option<crate::arena::StepMem<'a>>,
    /// The session's memory account, which heap outputs are leased from (the process's
    /// budget alone without one).
    pub(crate) account: Option<&'a alloc::sync::Arc<crate::governor::Account>>,
    /// Per node output: host storage the caller bound to it (I/O binding), taken by the
    /// output's allocation ([`KernelCx::output`], [`KernelCx::output_raw`]).
    pub(crate) bound: Option<&'a spin::Mutex<alloc::vec::Vec<Option<crate::Tensor>>>>,
    /// The session's dense weight cache (see [`crate::weight_cache`]); `None` outside a
    /// session (constant folding, kernels run alone): block-quantized products then read
    /// their codes.
    pub(crate) weights: Option<&'a crate::weight_cache::WeightCache>,
}

/// A compiled operator instance (attributes parsed, ready to run).
pub trait Kernel: Send + Sync {
    /// Computes the node's outputs from its inputs (`None` for omitted optional inputs).
    /// Returns one value per output the node declares (trailing optional outputs may be
    /// omitted when the node does not use them).
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>>;

    /// Inputs (by index) whose storage this kernel can turn into an output's, writing in place
    /// (GroupQueryAttention's past KV becoming its present). The eager executor then calls
    /// [`Kernel::compute_owned`] instead of `compute`.
    fn reusable_inputs(&self) -> &[usize] {
        &[]
    }

    /// `compute` with the inputs by value: an input named by [`Kernel::reusable_inputs`] whose
    /// last reader is this node was moved here (so a tensor nothing else holds is unique and
    /// may be reused); the others are clones (shared storage). Must compute what `compute`
    /// does.
    fn compute_owned(&self, cx: &KernelCx<'_>, inputs: Vec<Option<Value>>) -> Result<Vec<Value>> {
        let refs: Vec<Option<&Value>> = inputs.iter().map(Option::as_ref).collect();
        self.compute(cx, &refs)
    }

    /// Called once at load with the node's inputs that are constant initializers (`None` for
    /// the others), so a kernel can prepare what depends only on them (weights packed into
    /// the SGEMM's layout). A prepared kernel must still compute right when `compute` is
    /// given other values (it checks that they are the ones it prepared). Returns the bytes
    /// it now holds for that (reported as `PartitionReport::prepacked_bytes`).
    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        let _ = consts;
        0
    }
}

impl<F> Kernel for F
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync,
{
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        self(cx, inputs)
    }
}

/// Builds a kernel for a node (parses and checks attributes at load time).
pub type KernelFactory = fn(&Node) -> Result<Box<dyn Kernel>>;

/// One registration: a kernel for `domain::op` over opsets `since..=until`, for the listed
/// element types of input `type_input` (empty list: any type; the kernel checks).
///
/// The list is checked at load against the inferred type of that input, so a node whose
/// type-deciding input has another type is an `Unsupported` error naming node, op, domain,
/// opset and element type before anything runs. Other inputs are checked by the kernel.
#[derive(Clone, Copy)]
pub struct KernelDef {
    pub domain: &'static str,
    pub op: &'static str,
    pub since: i64,
    pub until: i64,
    pub type_input: usize,
    pub types: &'static [DataType],
    pub build: KernelFactory,
}

impl KernelDef {
    /// The same registration, declaring the element types input 0 may have.
    pub const fn types(self, types: &'static [DataType]) -> KernelDef {
        self.types_at(0, types)
    }

    /// The same registration, declaring the element types input `input` may have.
    pub const fn types_at(self, input: usize, types: &'static [DataType]) -> KernelDef {
        KernelDef {
            type_input: input,
            types,
            ..self
        }
    }
}

/// Outcome of a registry lookup, precise enough for a useful error.
pub enum Lookup<'a> {
    Found(&'a KernelDef),
    UnknownOp,
    NoOpsetVersion {
        have: Vec<(i64, i64)>,
    },
    /// Input `input` has element type `dtype`, which no in-range registration lists (the last
    /// one checked takes `supported`).
    NoType {
        dtype: DataType,
        input: usize,
        supported: &'static [DataType],
    },
}

/// Kernels keyed by (domain, op type).
#[derive(Default)]
pub struct KernelRegistry {
    map: HashMap<&'static str, HashMap<&'static str, Vec<KernelDef>>>,
}

impl KernelRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, def: KernelDef) {
        self.map
            .entry(def.domain)
            .or_default()
            .entry(def.op)
            .or_default()
            .push(def);
    }

    pub fn extend(&mut self, defs: &[KernelDef]) {
        for d in defs {
            self.add(*d);
        }
    }

    /// Finds the kernel for a node, given the element type of its type-deciding input when known.
    pub fn lookup(&self, node: &Node, input_types: &[Option<DataType>]) -> Lookup<'_> {
        let Some(defs) = self
            .map
            .get(node.domain.as_str())
            .and_then(|m| m.get(node.op_type.as_str()))
        else {
            return Lookup::UnknownOp;
        };
        let in_range: Vec<&KernelDef> = defs
            .iter()
            .filter(|d| node.opset >= d.since && node.opset <= d.until)
            .collect();
        if in_range.is_empty() {
            return Lookup::NoOpsetVersion {
                have: defs.iter().map(|d| (d.since, d.until)).collect(),
            };
        }
        let mut refused = None;
        for d in in_range {
            let dt = input_types.get(d.type_input).copied().flatten();
            match dt {
                Some(dt) if !d.types.is_empty() && !d.types.contains(&dt) => {
                    refused = Some((dt, d.type_input, d.types))
                }
                _ => return Lookup::Found(d),
            }
        }
        // every in-range registration refused a known type (so `refused` is set)
        let (dtype, input, supported) = refused.unwrap_or((DataType::Float, 0, &[]));
        Lookup::NoType {
            dtype,
            input,
            supported,
        }
    }

    /// Every registered (domain, op, since, until, types), for docs and `inspect`.
    pub fn entries(&self) -> impl Iterator<Item = &KernelDef> {
        self.map.values().flat_map(|m| m.values()).flatten()
    }

    pub fn has_op(&self, domain: &str, op: &str) -> bool {
        self.map.get(domain).is_some_and(|m| m.contains_key(op))
    }
}

/// Whether a provider can run a node.
pub enum Support {
    Yes,
    /// Not supported, with the reason (shown in partition reports).
    No(String),
}

/// Where a kernel wants one of its inputs when the graph is partitioned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputPlacement {
    /// In the provider's own memory (the default): a copy is inserted when it is elsewhere.
    Provider,
    /// On the host, wherever the kernel runs: small shape-like operands (Reshape's shape,
    /// Slice's starts, Gather's indices) that a device kernel reads while it encodes its work.
    Host,
    /// Anywhere: the kernel reads only metadata (Shape and Size read the shape, not the data).
    Any,
}

/// An execution provider: a target that owns a memory location and runs kernels there.
///
/// The CPU provider's location is [`Location::Host`]; device providers (WebGPU, CUDA) own a
/// [`Location::Device`]. The session partitions a graph across providers and inserts explicit
/// copies where a value crosses locations; read-back is async so a browser never blocks.
pub trait ExecutionProvider: Send + Sync {
    /// Short name (`cpu`, `webgpu`, `cuda`).
    fn name(&self) -> &str;
    /// Where this provider's kernels read and write tensors.
    fn location(&self) -> Location;
    /// Whether this provider has a kernel for `node` given its inputs' element types.
    fn supports(&self, node: &Node, input_types: &[Option<DataType>]) -> Support;
    /// Where the kernel for `node` wants its input `k` (see [`InputPlacement`]).
    fn input_placement(&self, _node: &Node, _k: usize) -> InputPlacement {
        InputPlacement::Provider
    }
    /// Builds the kernel for `node`.
    fn create_kernel(
        &self,
        node: &Node,
        input_types: &[Option<DataType>],
    ) -> Result<Box<dyn Kernel>>;
    /// The CPU primitives kernels on this provider may use.
    fn cpu_backend(&self) -> &dyn CpuBackend;
    /// A tensor of `dt` and `shape` in this provider's device memory with unspecified
    /// contents, for a caller to fill with its own device commands (JS `Tensor.fromGpuBuffer`
    /// copies a caller's buffer into one). `None`: not a device provider.
    fn alloc_device(&self, dt: DataType, shape: &[usize]) -> Option<Result<Tensor>> {
        let _ = (dt, shape);
        None
    }
    /// Copies a host tensor into this provider's memory (identity for host providers).
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        if self.location() == Location::Host {
            Ok(t.clone())
        } else {
            Err(Error::Provider(alloc::format!(
                "provider {} has no upload",
                self.name()
            )))
        }
    }
    /// What the provider runs on, for reports (`nxrt inspect`): a device provider's adapter,
    /// features and limits. Empty by default.
    fn describe(&self) -> String {
        String::new()
    }
    /// A copy of `t` (one of this provider's tensors) whose `axis` has `len` entries: the first
    /// `keep` of each copied from `t`, the rest zero; made on the device, without a read-back
    /// (a decoder's KV cache growing). `None`: not offered here (the caller goes through the
    /// host).
    fn resize_axis(
        &self,
        t: &Tensor,
        axis: usize,
        keep: usize,
        len: usize,
    ) -> Option<Result<Tensor>> {
        let _ = (t, axis, keep, len);
        None
    }
    /// Entries `start..start + len` of `t`'s `axis` (`t` one of this provider's tensors),
    /// copied on the device (a decoder's last logits row out of a prompt's, so only that row
    /// is read back). `None`: not offered here (the caller reads all of `t` back).
    fn slice_axis(
        &self,
        t: &Tensor,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Option<Result<Tensor>> {
        let _ = (t, axis, start, len);
        None
    }
    /// Counters for reports (`nxrt run` prints them): e.g. a device provider's dispatches,
    /// uploads, downloads and bytes on the device. Empty by default.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// Frees what the provider caches between runs (buffer pools); called by
    /// `Session::release`, and safe to call at any time: later runs allocate again.
    fn release_cached(&self) {}
    /// The memory account of a session this provider serves (see [`crate::governor`]): a
    /// device provider leases its device memory from it, under
    /// `Tier::Device(its index in the session)`, and from the process's budget of that tier.
    /// A provider serving several sessions keeps the first account it was given (a shared
    /// device pool; a [`crate::governor::MemoryPool`] bounds such sessions together).
    fn bind_account(&self, _account: &alloc::sync::Arc<crate::governor::Account>) {}
    /// The mechanism this provider's device memory comes from (its buffer pool; see
    /// [`crate::mechanism`]), for reports. `None`: it allocates host memory only.
    fn mechanism(&self) -> Option<alloc::sync::Arc<dyn crate::mechanism::Mechanism>> {
        None
    }
    /// Copies a tensor of this provider back to the host; async because device read-back is.
    fn download<'a>(&'a self, t: &'a Tensor) -> BoxFuture<'a, Result<Tensor>> {
        Box::pin(async move {
            if t.location() == Location::Host {
                Ok(t.clone())
            } else {
                Err(Error::Provider(alloc::format!(
                    "provider {} cannot read back {:?}",
                    self.name(),
                    t.location()
                )))
            }
        })
    }
}

/// Portable single-threaded primitives: what wasm and `no_std` builds use.
pub struct ReferenceCpu;

impl CpuBackend for ReferenceCpu {
    fn name(&self) -> String {
        alloc::format!("portable ({})", crate::simd::isa_name())
    }
    fn sgemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        // the SIMD micro-kernel when the operands' strides allow it, else the checked loop
        if !crate::simd::sgemm_checked(g, a, b, c) {
            reference_sgemm(g, a, b, c)
        }
    }
    fn sgemm_ops_epi(
        &self,
        g: &Gemm,
        a: Operand<'_>,
        b: Operand<'_>,
        c: &mut [f32],
        epi: GemmEpi<'_>,
    ) {
        // the micro-kernel applies the epilogue where it takes the product (a packed A only
        // with alpha 1: the packed path folds no alpha in)
        let takes = g.alpha == 1.0 || matches!(a, Operand::Strided(_));
        if takes && crate::simd::sgemm_ops_fit(g, &a, &b, c.len()) {
            return crate::simd::sgemm_ops_epi_unchecked(g, a, b, c, epi);
        }
        self.sgemm_ops(g, a, b, c);
        epi.apply(g.m, g.n, g.ldc, c);
    }
}
