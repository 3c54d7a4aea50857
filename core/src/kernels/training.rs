//! Kernel family: the optimiser steps of domain `ai.onnx.preview.training` (Adagrad, Adam,
//! Momentum).
//!
//! Each takes a scalar learning rate `R`, a scalar int64 update count `T`, then `k` groups of `n`
//! tensors (the values, their gradients, and one or two accumulators) and returns the updated
//! values followed by the updated accumulators, group by group. Every tensor of one optimised
//! variable must have that variable's shape and float type; values are computed in f64.

use alloc::boxed::Box;
use alloc::vec::Vec;

use super::loss::{load_f64, store_f64};
use super::{bad_type, def_in, tensor_in};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

const TRAINING: &str = "ai.onnx.preview.training";

/// The element types of the optimised tensors X (input 2 on); R, T and the other groups are
/// checked against them by the kernel.
const OPTIMISED: &[DataType] = &[DataType::Float, DataType::Double];

pub(crate) const KERNELS: &[KernelDef] = &[
    def_in(TRAINING, "Adagrad", 1, 1, build_adagrad).types_at(2, OPTIMISED),
    def_in(TRAINING, "Adam", 1, 1, build_adam).types_at(2, OPTIMISED),
    def_in(TRAINING, "Momentum", 1, 1, build_momentum).types_at(2, OPTIMISED),
];

/// A scalar (one-element) float tensor's value.
fn scalar_f64(t: &Tensor, op: &str, what: &str) -> Result<f64> {
    if t.len() != 1 || t.rank() > 1 {
        bail!("{op}: {what} must be a scalar, has shape {:?}", t.shape());
    }
    match t.dtype() {
        DataType::Float | DataType::Double => Ok(load_f64(t, op)?[0]),
        other => Err(bad_type(op, other)),
    }
}

/// A scalar int64 tensor's value.
fn scalar_count(t: &Tensor, op: &str) -> Result<i64> {
    if t.len() != 1 || t.rank() > 1 {
        bail!("{op}: T must be a scalar, has shape {:?}", t.shape());
    }
    if t.dtype() != DataType::Int64 {
        return Err(bad_type(op, t.dtype()));
    }
    Ok(t.to_i64_vec()?[0])
}

/// One element's update: `(r, t, [x, g, accumulators...], [new x, new accumulators...])`.
type Step<'a> = &'a dyn Fn(f64, i64, &[f64], &mut [f64]);

/// The common frame of the three optimisers: reads `R`, `T` and `groups` groups of tensors,
/// checks them, and calls `step(r, t, [x, g, accumulators...], outs)` once per element of each
/// optimised tensor, where `outs` receives `groups - 1` values (new x, new accumulators).
fn run_optimizer(
    op: &str,
    inputs: &[Option<&Value>],
    groups: usize,
    step: Step<'_>,
) -> Result<Vec<Value>> {
    let r = scalar_f64(tensor_in(inputs, 0)?, op, "R")?;
    let t = scalar_count(tensor_in(inputs, 1)?, op)?;
    let rest = inputs.len().saturating_sub(2);
    if rest == 0 || !rest.is_multiple_of(groups) {
        bail!(
            "{op}: expects R, T and {groups} tensors per optimised variable, got {} inputs",
            inputs.len()
        );
    }
    let n = rest / groups;
    let nouts = groups - 1;
    // outputs: for each output group, the n variables
    let mut outs: Vec<Option<Value>> = (0..nouts * n).map(|_| None).collect();
    for v in 0..n {
        let ts: Vec<&Tensor> = (0..groups)
            .map(|g| tensor_in(inputs, 2 + g * n + v))
            .collect::<Result<_>>()?;
        let x = ts[0];
        let dt = x.dtype();
        if !matches!(dt, DataType::Float | DataType::Double) {
            return Err(bad_type(op, dt));
        }
        for (g, t) in ts.iter().enumerate().skip(1) {
            if t.shape() != x.shape() || t.dtype() != dt {
                bail!(
                    "{op}: input {} ({} {:?}) does not match the optimised tensor ({} {:?})",
                    2 + g * n + v,
                    t.dtype(),
                    t.shape(),
                    dt,
                    x.shape()
                );
            }
        }
        let vals: Vec<Vec<f64>> = ts.iter().map(|t| load_f64(t, op)).collect::<Result<_>>()?;
        let len = x.len();
        let mut res: Vec<Vec<f64>> = (0..nouts).map(|_| Vec::with_capacity(len)).collect();
        let mut ins = alloc::vec![0.0f64; groups];
        let mut o = alloc::vec![0.0f64; nouts];
        for e in 0..len {
            for (slot, vv) in ins.iter_mut().zip(&vals) {
                *slot = vv[e];
            }
            step(r, t, &ins, &mut o);
            for (rv, &ov) in res.iter_mut().zip(&o) {
                rv.push(ov);
            }
        }
        for (k, rv) in res.into_iter().enumerate() {
            outs[k * n + v] = Some(Value::Tensor(store_f64(dt, x.shape(), rv, op)?));
        }
    }
    Ok(outs
        .into_iter()
        .map(|v| v.expect("every output set"))
        .collect())
}

fn build_adagrad(node: &Node) -> Result<Box<dyn Kernel>> {
    let decay = node.get_f("decay_factor", 0.0)? as f64;
    let eps = node.get_f("epsilon", 0.0)? as f64;
    let norm = node.get_f("norm_coefficient", 0.0)? as f64;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            run_optimizer("Adagrad", inputs, 3, &|r, t, v, o| {
                let (x, g, h) = (v[0], v[1], v[2]);
                let rate = r / (1.0 + t as f64 * decay);
                let gr = norm * x + g;
                let h_new = h + gr * gr;
                o[0] = x - rate * gr / (libm::sqrt(h_new) + eps);
                o[1] = h_new;
            })
        },
    ))
}

fn build_adam(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 0.9)? as f64;
    let beta = node.get_f("beta", 0.999)? as f64;
    let eps = node.get_f("epsilon", 0.0)? as f64;
    let norm = node.get_f("norm_coefficient", 0.0)? as f64;
    let norm_post = node.get_f("norm_coefficient_post", 0.0)? as f64;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            run_optimizer("Adam", inputs, 4, &|r, t, v, o| {
                let (x, g, m, h) = (v[0], v[1], v[2], v[3]);
                let gr = norm * x + g;
                let m_new = alpha * m + (1.0 - alpha) * gr;
                let h_new = beta * h + (1.0 - beta) * gr * gr;
                let rate = if t > 0 {
                    // bias correction; T beyond i32 range leaves both powers at their limit 0
                    let tp = i32::try_from(t).unwrap_or(i32::MAX);
                    r * libm::sqrt(1.0 - libm::pow(beta, tp as f64))
                        / (1.0 - libm::pow(alpha, tp as f64))
                } else {
                    r
                };
                let x_new = x - rate * m_new / (libm::sqrt(h_new) + eps);
                o[0] = (1.0 - norm_post) * x_new;
                o[1] = m_new;
                o[2] = h_new;
            })
        },
    ))
}

fn build_momentum(node: &Node) -> Result<Box<dyn Kernel>> {
    let req = |name: &str| -> Result<f64> {
        match node.attr_f(name)? {
            Some(v) => Ok(v as f64),
            None => bail!("Momentum: required attribute '{name}' is missing"),
        }
    };
    let alpha = req("alpha")?;
    let beta = req("beta")?;
    let norm = req("norm_coefficient")?;
    let nesterov = match node.attr_s("mode")?.as_deref() {
        Some("standard") => false,
        Some("nesterov") => true,
        Some(other) => unsupported!("Momentum mode '{other}' is not 'standard' or 'nesterov'"),
        None => bail!("Momentum: required attribute 'mode' is missing"),
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            run_optimizer("Momentum", inputs, 3, &|r, t, v, o| {
                let (x, g, m) = (v[0], v[1], v[2]);
                let gr = norm * x + g;
                let b = if t > 0 { beta } else { 1.0 };
                let m_new = alpha * m + b * gr;
                o[0] = if nesterov {
                    x - r * (gr + alpha * m_new)
                } else {
                    x - r * m_new
                };
                o[1] = m_new;
            })
        },
    ))
}

#[cfg(test)]
mod tests {
    //! Expected values are worked out by hand from the update rules in the operator definitions.
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;
    use alloc::string::ToString;
    use alloc::vec;

    fn run(op: &str, attrs: Vec<(&str, AttrValue)>, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let node = Node {
            name: "n".to_string(),
            op_type: op.to_string(),
            domain: TRAINING.to_string(),
            opset: 1,
            inputs: Vec::new(),
            outputs: Vec::new(),
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        };
        let def = KERNELS.iter().find(|d| d.op == op).unwrap();
        let k = (def.build)(&node)?;
        let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| Some(Value::Tensor(t))).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &refs)?;
        out.into_iter().map(|v| v.into_tensor()).collect()
    }
    fn f(v: &[f32]) -> Tensor {
        Tensor::from_vec(&[v.len()], v.to_vec()).unwrap()
    }
    fn fv(t: &Tensor) -> Vec<f32> {
        t.as_slice::<f32>().unwrap().into_owned()
    }
    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }
    fn fl(v: f32) -> AttrValue {
        AttrValue::Float(v)
    }

    #[test]
    fn adagrad_step() {
        // R=1, T=1, decay 1 -> rate 0.5; g=3, h=0 -> h_new=9, x_new = 1 - 0.5*3/3 = 0.5
        let ys = run(
            "Adagrad",
            vec![("decay_factor", fl(1.0))],
            vec![
                Tensor::scalar(1.0f32),
                Tensor::scalar(1i64),
                f(&[1.0]),
                f(&[3.0]),
                f(&[0.0]),
            ],
        )
        .unwrap();
        close(&fv(&ys[0]), &[0.5]);
        close(&fv(&ys[1]), &[9.0]);
    }

    #[test]
    fn adam_step_with_bias_correction() {
        // alpha=0.5, beta=0.75, T=1: m=0.5*g=1, h=0.25*g^2=1, rate = R*sqrt(0.25)/0.5 = R
        // x_new = 3 - 1 * 1 / 1 = 2
        let ys = run(
            "Adam",
            vec![("alpha", fl(0.5)), ("beta", fl(0.75))],
            vec![
                Tensor::scalar(1.0f32),
                Tensor::scalar(1i64),
                f(&[3.0]),
                f(&[2.0]),
                f(&[0.0]),
                f(&[0.0]),
            ],
        )
        .unwrap();
        close(&fv(&ys[0]), &[2.0]);
        close(&fv(&ys[1]), &[1.0]);
        close(&fv(&ys[2]), &[1.0]);
    }

    #[test]
    fn momentum_standard_and_nesterov_with_two_tensors() {
        let attrs = |mode: &str| {
            vec![
                ("alpha", fl(0.5)),
                ("beta", fl(0.25)),
                ("norm_coefficient", fl(0.0)),
                ("mode", AttrValue::String(mode.as_bytes().to_vec())),
            ]
        };
        // T=1: v_new = 0.5*v + 0.25*g
        let ins = || {
            vec![
                Tensor::scalar(0.1f32),
                Tensor::scalar(1i64),
                f(&[1.0]),
                f(&[2.0, 3.0]),
                f(&[4.0]),
                f(&[8.0, 12.0]),
                f(&[2.0]),
                f(&[0.0, 4.0]),
            ]
        };
        let ys = run("Momentum", attrs("standard"), ins()).unwrap();
        // v_new: [0.5*2 + 0.25*4 = 2], [0 + 2 = 2, 2 + 3 = 5]
        close(&fv(&ys[0]), &[1.0 - 0.1 * 2.0]);
        close(&fv(&ys[1]), &[2.0 - 0.2, 3.0 - 0.5]);
        close(&fv(&ys[2]), &[2.0]);
        close(&fv(&ys[3]), &[2.0, 5.0]);
        let ys = run("Momentum", attrs("nesterov"), ins()).unwrap();
        // x_new = x - R * (g + alpha * v_new)
        close(&fv(&ys[0]), &[1.0 - 0.1 * (4.0 + 1.0)]);
        close(&fv(&ys[1]), &[2.0 - 0.1 * 9.0, 3.0 - 0.1 * 14.5]);
        assert!(run("Momentum", attrs("heavy"), ins()).is_err());
        // mismatched gradient shape
        let mut bad = ins();
        bad[4] = f(&[4.0, 5.0]);
        assert!(run("Momentum", attrs("standard"), bad).is_err());
    }
}
