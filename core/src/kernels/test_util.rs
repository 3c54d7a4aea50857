//! Helpers shared by the kernel families' unit tests: a backend that really runs on several
//! threads, input generators, node builders and a runner that checks threaded against
//! sequential results.

extern crate std;

use alloc::string::String;
use alloc::vec::Vec;

use crate::error::Result;
use crate::ir::{AttrValue, Node};
use crate::provider::{CpuBackend, Gemm, KernelCx, Lookup};
use crate::tensor::Tensor;
use crate::value::Value;

/// A backend that really runs `parallel_for` on several threads.
pub struct ThreadedCpu;

impl CpuBackend for ThreadedCpu {
    fn name(&self) -> String {
        String::from("test-threads")
    }
    fn sgemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        // the sequential backend's SGEMM, so the two runs differ only in threading
        crate::provider::ReferenceCpu.sgemm(g, a, b, c)
    }
    fn parallel_for(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|s| {
            for t in 0..3 {
                s.spawn(move || {
                    let mut i = t;
                    while i < n {
                        f(i);
                        i += 3;
                    }
                });
            }
        });
    }
    fn threads(&self) -> usize {
        3
    }
}

/// `((i*mul + 3) % m - m/2) * scale` for i in 0..n (mirrored in the numpy scripts).
pub fn seq(n: usize, mul: usize, m: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * mul + 3) % m) as f32 - (m / 2) as f32) * scale)
        .collect()
}

pub fn t32(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

pub fn i64s(shape: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

pub fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>, n_out: usize) -> Node {
    Node {
        name: String::from("n"),
        op_type: String::from(op),
        domain: String::new(),
        opset,
        inputs: Vec::new(),
        outputs: (0..n_out).map(Some).collect(),
        attrs: attrs
            .into_iter()
            .map(|(k, v)| (String::from(k), v))
            .collect(),
        implicit_inputs: Vec::new(),
    }
}

pub fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

/// Builds the node's kernel through the registry and runs it on both backends, checking
/// that the threaded run agrees with the sequential one.
pub fn run(node: &Node, inputs: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
    run_prepared(node, inputs, &[]).map(|(out, _)| out)
}

/// The kernel's [`Kernel::compute_owned`] with `inputs` by value (a tensor the caller built
/// and gave up is unique, so the kernel may reuse its storage).
pub fn run_owned(node: &Node, inputs: Vec<Option<Tensor>>) -> Result<Vec<Tensor>> {
    let reg = crate::kernels::cpu_registry();
    let Lookup::Found(def) = reg.lookup(node, &[]) else {
        panic!("no kernel for {}", node.op_type);
    };
    let k = (def.build)(node)?;
    let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| t.map(Value::Tensor)).collect();
    let out = k.compute_owned(&KernelCx::new(&ThreadedCpu), vals)?;
    Ok(out
        .into_iter()
        .map(|v| match v {
            Value::Tensor(t) => t,
            _ => panic!("not a tensor"),
        })
        .collect())
}

/// [`run`] after [`Kernel::prepare`](crate::provider::Kernel::prepare) with the inputs whose
/// index `consts` lists as the constants; also returns the bytes the kernel prepared.
pub fn run_prepared(
    node: &Node,
    inputs: &[Option<Tensor>],
    consts: &[usize],
) -> Result<(Vec<Tensor>, usize)> {
    let reg = crate::kernels::cpu_registry();
    let Lookup::Found(def) = reg.lookup(node, &[]) else {
        panic!("no kernel for {}", node.op_type);
    };
    let mut k = (def.build)(node)?;
    let prepared = if consts.is_empty() {
        0
    } else {
        let c: Vec<Option<&Tensor>> = (0..inputs.len())
            .map(|i| inputs[i].as_ref().filter(|_| consts.contains(&i)))
            .collect();
        k.prepare(&c)
    };
    let vals: Vec<Option<Value>> = inputs
        .iter()
        .map(|t| t.clone().map(Value::Tensor))
        .collect();
    let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
    let seq = k.compute(&KernelCx::new(&crate::provider::ReferenceCpu), &refs)?;
    let par = k.compute(&KernelCx::new(&ThreadedCpu), &refs)?;
    let unwrap = |v: Vec<Value>| -> Vec<Tensor> {
        v.into_iter()
            .map(|v| match v {
                Value::Tensor(t) => t,
                _ => panic!("not a tensor"),
            })
            .collect()
    };
    let (seq, par) = (unwrap(seq), unwrap(par));
    for (a, b) in seq.iter().zip(&par) {
        assert_eq!(a.shape(), b.shape());
        if let (Ok(x), Ok(y)) = (a.to_f32_vec(), b.to_f32_vec()) {
            // bit for bit (a NaN equals itself here)
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x), bits(&y), "threaded result differs");
        }
    }
    Ok((seq, prepared))
}

pub fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w} (got {got:?})"
        );
    }
}
