//! Kernel family: the loss functions, NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
//!
//! Both read an input of shape `[N, C, d1, ..., dk]` and integer class targets of shape
//! `[N, d1, ..., dk]`. The per-element loss is `-w[t] * logp[n, t, d]` where `t` is the target
//! class and `w[t]` the optional class weight (1 without weights); elements whose target equals
//! `ignore_index` contribute nothing and weigh 0. `reduction` is `none` (the per-element losses),
//! `sum`, or `mean` (the sum divided by the summed weights of the elements that count).
//! Values are computed in f64 and stored in the input's float type.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use half::{bf16, f16};

use super::{bad_type, def, opt_tensor_in, tensor_in, LATEST};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::FLOATS;
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("NegativeLogLikelihoodLoss", 12, LATEST, build_nll).types(FLOATS),
    def("SoftmaxCrossEntropyLoss", 12, LATEST, build_sce).types(FLOATS),
];

// ----------------------------------------------------------------------------- shared helpers

/// The elements of a float tensor (f16, bf16, f32, f64) widened to f64.
pub(super) fn load_f64(t: &Tensor, op: &str) -> Result<Vec<f64>> {
    match t.dtype() {
        DataType::Double => Ok(t.as_slice::<f64>()?.into_owned()),
        DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
            Ok(t.to_f32_vec()?.into_iter().map(f64::from).collect())
        }
        other => Err(bad_type(op, other)),
    }
}

/// A tensor of float type `dt` from f64 values (rounded to the nearest representable value).
pub(super) fn store_f64(dt: DataType, shape: &[usize], v: Vec<f64>, op: &str) -> Result<Tensor> {
    match dt {
        DataType::Double => Tensor::from_vec(shape, v),
        DataType::Float => Tensor::from_vec(shape, v.into_iter().map(|x| x as f32).collect()),
        DataType::Float16 => {
            Tensor::from_vec(shape, v.into_iter().map(f16::from_f64).collect::<Vec<_>>())
        }
        DataType::Bfloat16 => {
            Tensor::from_vec(shape, v.into_iter().map(bf16::from_f64).collect::<Vec<_>>())
        }
        other => Err(bad_type(op, other)),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reduction {
    None,
    Sum,
    Mean,
}

/// The attributes both losses share, checked at load time.
#[derive(Clone, Copy, Debug)]
struct LossAttrs {
    reduction: Reduction,
    ignore_index: Option<i64>,
}

fn loss_attrs(node: &Node, op: &str) -> Result<LossAttrs> {
    let reduction = match node.get_s("reduction", "mean")?.as_str() {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        other => unsupported!("{op} reduction '{other}' is not one of none, sum, mean"),
    };
    Ok(LossAttrs {
        reduction,
        ignore_index: node.attr_i("ignore_index")?,
    })
}

/// Shapes of one loss evaluation: `n` batches, `c` classes, `d` positions per batch.
struct Dims {
    n: usize,
    c: usize,
    d: usize,
}

/// Checks the input, target and weight shapes and types; returns the dims, the targets and the
/// weights (as f64).
fn check_inputs(
    op: &str,
    x: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
) -> Result<(Dims, Vec<i64>, Option<Vec<f64>>)> {
    let xs = x.shape();
    if xs.len() < 2 {
        bail!("{op}: input must have rank >= 2 ([N, C, d1, ...]), has shape {xs:?}");
    }
    let (n, c) = (xs[0], xs[1]);
    let d: usize = xs[2..].iter().product();
    let ts = target.shape();
    if ts.len() + 1 != xs.len() || ts[0] != n || ts[1..] != xs[2..] {
        bail!(
            "{op}: target shape {ts:?} does not match input shape {xs:?} (expected [N, d1, ...])"
        );
    }
    match target.dtype() {
        DataType::Int32 | DataType::Int64 => {}
        other => return Err(bad_type(op, other)),
    }
    let w = match weight {
        Some(w) => {
            if w.shape() != [c] {
                bail!("{op}: weight shape {:?} should be [C] = [{c}]", w.shape());
            }
            if w.dtype() != x.dtype() {
                bail!(
                    "{op}: weight type {} differs from input type {}",
                    w.dtype(),
                    x.dtype()
                );
            }
            Some(load_f64(w, op)?)
        }
        None => None,
    };
    Ok((Dims { n, c, d }, target.to_i64_vec()?, w))
}

/// The gathered negative log-likelihood: per-element losses (target-shaped, row-major over
/// `[N, d]`) and the summed weights of the elements that count. `logp[(i * c + k) * d + j]` is
/// the log-probability of class `k` at batch `i`, position `j`.
fn nll_gather(
    op: &str,
    logp: &[f64],
    dims: &Dims,
    target: &[i64],
    weight: Option<&[f64]>,
    ignore_index: Option<i64>,
) -> Result<(Vec<f64>, f64)> {
    let Dims { n, c, d } = *dims;
    let mut loss = vec![0.0f64; n * d];
    let mut wsum = 0.0f64;
    for i in 0..n {
        for j in 0..d {
            let t = target[i * d + j];
            if Some(t) == ignore_index {
                continue;
            }
            if t < 0 || t as u64 >= c as u64 {
                bail!("{op}: target {t} is outside the class range [0, {c})");
            }
            let t = t as usize;
            let w = weight.map_or(1.0, |w| w[t]);
            loss[i * d + j] = -logp[(i * c + t) * d + j] * w;
            wsum += w;
        }
    }
    Ok((loss, wsum))
}

/// Applies the reduction; returns the loss values and their shape.
fn reduce(
    loss: Vec<f64>,
    wsum: f64,
    reduction: Reduction,
    target_shape: &[usize],
) -> (Vec<f64>, Vec<usize>) {
    match reduction {
        Reduction::None => (loss, target_shape.to_vec()),
        Reduction::Sum => (vec![loss.iter().sum()], Vec::new()),
        // no element counted: 0 / 0 = NaN, as the definition gives
        Reduction::Mean => (vec![loss.iter().sum::<f64>() / wsum], Vec::new()),
    }
}

// ----------------------------------------------------------------------------- NLL

fn build_nll(node: &Node) -> Result<Box<dyn Kernel>> {
    const OP: &str = "NegativeLogLikelihoodLoss";
    let attrs = loss_attrs(node, OP)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let target = tensor_in(inputs, 1)?;
            let weight = opt_tensor_in(inputs, 2)?;
            let (dims, tv, wv) = check_inputs(OP, x, target, weight)?;
            let xv = load_f64(x, OP)?;
            let (loss, wsum) = nll_gather(OP, &xv, &dims, &tv, wv.as_deref(), attrs.ignore_index)?;
            let (v, shape) = reduce(loss, wsum, attrs.reduction, target.shape());
            Ok(vec![Value::Tensor(store_f64(x.dtype(), &shape, v, OP)?)])
        },
    ))
}

// ----------------------------------------------------------------------------- SCE

/// Log-softmax over axis 1 of an `[N, C, d]` array.
fn log_softmax_axis1(x: &[f64], dims: &Dims) -> Vec<f64> {
    let Dims { n, c, d } = *dims;
    let mut y = vec![0.0f64; x.len()];
    for i in 0..n {
        let base = i * c * d;
        for j in 0..d {
            let at = |k: usize| base + k * d + j;
            let m = (0..c).map(|k| x[at(k)]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..c).map(|k| libm::exp(x[at(k)] - m)).sum();
            let ls = libm::log(s);
            for k in 0..c {
                y[at(k)] = x[at(k)] - m - ls;
            }
        }
    }
    y
}

fn build_sce(node: &Node) -> Result<Box<dyn Kernel>> {
    const OP: &str = "SoftmaxCrossEntropyLoss";
    let attrs = loss_attrs(node, OP)?;
    let want_log_prob = node.outputs.get(1).is_some_and(|o| o.is_some());
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let target = tensor_in(inputs, 1)?;
            let weight = opt_tensor_in(inputs, 2)?;
            let (dims, tv, wv) = check_inputs(OP, x, target, weight)?;
            let xv = load_f64(x, OP)?;
            let logp = log_softmax_axis1(&xv, &dims);
            let (loss, wsum) =
                nll_gather(OP, &logp, &dims, &tv, wv.as_deref(), attrs.ignore_index)?;
            let (v, shape) = reduce(loss, wsum, attrs.reduction, target.shape());
            let mut outs = vec![Value::Tensor(store_f64(x.dtype(), &shape, v, OP)?)];
            if want_log_prob {
                outs.push(Value::Tensor(store_f64(x.dtype(), x.shape(), logp, OP)?));
            }
            Ok(outs)
        },
    ))
}

#[cfg(test)]
mod tests {
    //! Expected values are worked out by hand from the operators' definitions.
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;
    use alloc::string::{String, ToString};

    fn run(
        op: &str,
        attrs: Vec<(&str, AttrValue)>,
        inputs: Vec<Option<Tensor>>,
        n_out: usize,
    ) -> Result<Vec<Tensor>> {
        let node = Node {
            name: "n".to_string(),
            op_type: op.to_string(),
            domain: String::new(),
            opset: 13,
            inputs: Vec::new(),
            outputs: (0..n_out).map(Some).collect(),
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        };
        let def = KERNELS.iter().find(|d| d.op == op).unwrap();
        let k = (def.build)(&node)?;
        let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| t.map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &refs)?;
        out.into_iter().map(|v| v.into_tensor()).collect()
    }

    fn f(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }
    fn i(shape: &[usize], v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }
    fn fv(t: &Tensor) -> Vec<f32> {
        t.as_slice::<f32>().unwrap().into_owned()
    }
    fn s(v: &str) -> AttrValue {
        AttrValue::String(v.as_bytes().to_vec())
    }
    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn nll_reductions_weights_and_ignore_index() {
        // x: N=2, C=3; targets [2, 0]
        let x = f(&[2, 3], &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]);
        let t = i(&[2], &[2, 0]);
        let none = run(
            "NegativeLogLikelihoodLoss",
            vec![("reduction", s("none"))],
            vec![x.clone(), t.clone()],
            1,
        )
        .unwrap();
        assert_eq!(none[0].shape(), &[2]);
        close(&fv(&none[0]), &[-0.3, -0.4]);
        // default mean: (-0.3 - 0.4) / 2
        let mean = run(
            "NegativeLogLikelihoodLoss",
            vec![],
            vec![x.clone(), t.clone()],
            1,
        )
        .unwrap();
        assert_eq!(mean[0].shape(), &[] as &[usize]);
        close(&fv(&mean[0]), &[-0.35]);
        // weights [1, 2, 3]: (-0.3*3 - 0.4*1) / (3 + 1)
        let w = f(&[3], &[1.0, 2.0, 3.0]);
        let mean_w = run(
            "NegativeLogLikelihoodLoss",
            vec![],
            vec![x.clone(), t.clone(), w.clone()],
            1,
        )
        .unwrap();
        close(&fv(&mean_w[0]), &[-1.3 / 4.0]);
        // ignore_index 0 drops the second element (weight too): -0.3*3 / 3
        let ii = run(
            "NegativeLogLikelihoodLoss",
            vec![("ignore_index", AttrValue::Int(0))],
            vec![x.clone(), t.clone(), w],
            1,
        )
        .unwrap();
        close(&fv(&ii[0]), &[-0.3]);
        let sum = run(
            "NegativeLogLikelihoodLoss",
            vec![("reduction", s("sum"))],
            vec![x, t],
            1,
        )
        .unwrap();
        close(&fv(&sum[0]), &[-0.7]);
    }

    #[test]
    fn nll_spatial_dims() {
        // N=1, C=2, d1=2: x[0, k, j] at (k * 2 + j); targets [1, 0]
        let x = f(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let t = i(&[1, 2], &[1, 0]);
        let y = run(
            "NegativeLogLikelihoodLoss",
            vec![("reduction", s("none"))],
            vec![x, t],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape(), &[1, 2]);
        close(&fv(&y[0]), &[-3.0, -2.0]);
    }

    #[test]
    fn sce_matches_definition() {
        // one row [0, ln 3]: softmax = [1/4, 3/4]; target 0 -> loss ln 4
        let ln3 = libm::log(3.0) as f32;
        let x = f(&[1, 2], &[0.0, ln3]);
        let t = i(&[1], &[0]);
        let y = run("SoftmaxCrossEntropyLoss", vec![], vec![x, t], 2).unwrap();
        close(&fv(&y[0]), &[libm::log(4.0) as f32]);
        assert_eq!(y[1].shape(), &[1, 2]);
        close(
            &fv(&y[1]),
            &[-libm::log(4.0) as f32, libm::log(0.75) as f32],
        );
        // all elements ignored: mean is 0 / 0
        let x = f(&[1, 2], &[0.0, 0.0]);
        let y = run(
            "SoftmaxCrossEntropyLoss",
            vec![("ignore_index", AttrValue::Int(1))],
            vec![x, i(&[1], &[1])],
            1,
        )
        .unwrap();
        assert!(fv(&y[0])[0].is_nan());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let x = f(&[2, 3], &[0.0; 6]);
        // target out of range
        assert!(run(
            "NegativeLogLikelihoodLoss",
            vec![],
            vec![x.clone(), i(&[2], &[0, 3])],
            1
        )
        .is_err());
        // target shape mismatch
        assert!(run(
            "SoftmaxCrossEntropyLoss",
            vec![],
            vec![x.clone(), i(&[3], &[0, 1, 2])],
            1
        )
        .is_err());
        // weight of the wrong length
        assert!(run(
            "SoftmaxCrossEntropyLoss",
            vec![],
            vec![x.clone(), i(&[2], &[0, 1]), f(&[2], &[1.0, 1.0])],
            1
        )
        .is_err());
        // rank-1 input
        assert!(run(
            "NegativeLogLikelihoodLoss",
            vec![],
            vec![f(&[3], &[0.0; 3]), i(&[], &[0])],
            1
        )
        .is_err());
        // unknown reduction
        assert!(run(
            "NegativeLogLikelihoodLoss",
            vec![("reduction", s("max"))],
            vec![x, i(&[2], &[0, 1])],
            1
        )
        .is_err());
    }
}
