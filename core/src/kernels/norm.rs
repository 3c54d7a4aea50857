//! Kernel family: softmax/log-softmax/hardmax, the normalisations (batch, instance, layer, group, RMS, Lp, mean-variance, LRN) and Resize/Upsample.

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::{AddAssign, MulAssign, Neg, SubAssign};
use core::sync::atomic::{AtomicU32, Ordering};

use half::{bf16, f16};

use super::{bad_type, def, norm_axis, opt_tensor_in, out1, tensor_in, Float, LATEST};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::Node;
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::{Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("Softmax", 1, LATEST, build_softmax),
    def("LogSoftmax", 1, LATEST, build_log_softmax),
    def("Hardmax", 1, LATEST, build_hardmax),
    def("BatchNormalization", 1, LATEST, build_batch_norm),
    def("InstanceNormalization", 1, LATEST, build_instance_norm),
    // Opset 17 made it standard; earlier "opsets" cover the identical ai.onnx-domain contrib form
    // that fusion tools emit.
    def("LayerNormalization", 1, LATEST, build_layer_norm),
    def("GroupNormalization", 18, LATEST, build_group_norm),
    def("RMSNormalization", 23, LATEST, build_rms_norm),
    def("LpNormalization", 1, LATEST, build_lp_norm),
    def("MeanVarianceNormalization", 9, LATEST, build_mvn),
    def("LRN", 1, LATEST, build_lrn),
    def("Resize", 10, LATEST, build_resize),
    def("Upsample", 7, 9, build_upsample),
];

// ----------------------------------------------------------------------------- shared helpers

/// A float type kernels compute in: f32 (for f32, f16 and bf16 tensors) or f64.
trait Real: Float + AddAssign + SubAssign + MulAssign + Neg<Output = Self> {
    const ZERO: Self;
    const ONE: Self;
    fn fexp(self) -> Self;
    fn fln(self) -> Self;
    fn fpow(self, e: Self) -> Self;
    /// The elements of a float tensor in this type (borrowed when no conversion is needed).
    fn load(t: &Tensor) -> Result<Cow<'_, [Self]>>;
    /// A tensor of element type `dt` (any float type) from values in this type.
    fn store(dt: DataType, shape: &[usize], v: Vec<Self>) -> Result<Tensor>;
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    #[inline]
    fn fexp(self) -> f32 {
        libm::expf(self)
    }
    #[inline]
    fn fln(self) -> f32 {
        libm::logf(self)
    }
    #[inline]
    fn fpow(self, e: f32) -> f32 {
        libm::powf(self, e)
    }
    fn load(t: &Tensor) -> Result<Cow<'_, [f32]>> {
        match t.dtype() {
            DataType::Float => t.as_slice::<f32>(),
            DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
                Ok(Cow::Owned(t.to_f32_vec()?))
            }
            other => Err(bad_type("float kernel", other)),
        }
    }
    fn store(dt: DataType, shape: &[usize], v: Vec<f32>) -> Result<Tensor> {
        match dt {
            DataType::Float => Tensor::from_vec(shape, v),
            DataType::Float16 => {
                Tensor::from_vec(shape, v.into_iter().map(f16::from_f32).collect::<Vec<_>>())
            }
            DataType::Bfloat16 => {
                Tensor::from_vec(shape, v.into_iter().map(bf16::from_f32).collect::<Vec<_>>())
            }
            DataType::Double => {
                Tensor::from_vec(shape, v.into_iter().map(f64::from).collect::<Vec<_>>())
            }
            other => Err(bad_type("float kernel", other)),
        }
    }
}

impl Real for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    #[inline]
    fn fexp(self) -> f64 {
        libm::exp(self)
    }
    #[inline]
    fn fln(self) -> f64 {
        libm::log(self)
    }
    #[inline]
    fn fpow(self, e: f64) -> f64 {
        libm::pow(self, e)
    }
    fn load(t: &Tensor) -> Result<Cow<'_, [f64]>> {
        match t.dtype() {
            DataType::Double => t.as_slice::<f64>(),
            DataType::Float | DataType::Float16 | DataType::Bfloat16 => Ok(Cow::Owned(
                t.to_f32_vec()?.into_iter().map(f64::from).collect(),
            )),
            other => Err(bad_type("float kernel", other)),
        }
    }
    fn store(dt: DataType, shape: &[usize], v: Vec<f64>) -> Result<Tensor> {
        match dt {
            DataType::Double => Tensor::from_vec(shape, v),
            _ => f32::store(dt, shape, v.into_iter().map(|x| x as f32).collect()),
        }
    }
}

/// Runs `$body` with `$R` bound to the compute type for a float element type: f64 for double,
/// f32 for float, float16 and bfloat16. Other types give an unsupported-type error.
macro_rules! with_real {
    ($op:expr, $dt:expr, $R:ident => $body:expr) => {
        match $dt {
            DataType::Double => {
                type $R = f64;
                $body
            }
            DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
                type $R = f32;
                $body
            }
            other => Err(bad_type($op, other)),
        }
    };
}

/// Work (in element operations) below which a kernel stays on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// A raw pointer that may be shared between the workers of [`par_out`].
struct SyncPtr<T>(*mut T);
// SAFETY: `par_out` only derives disjoint sub-slices from the pointer, one per worker task.
unsafe impl<T: Send> Sync for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    #[inline]
    fn get(&self) -> *mut T {
        self.0
    }
}

/// Splits `out` (a whole number of `unit`-sized pieces) into runs of whole units and calls
/// `f(first_unit, run)` for each run, in parallel when the backend has threads and `work`
/// (estimated element operations) is large enough.
fn par_out<T: Send>(
    cx: &KernelCx<'_>,
    out: &mut [T],
    unit: usize,
    work: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    if unit == 0 || out.is_empty() {
        return;
    }
    debug_assert_eq!(out.len() % unit, 0);
    let units = out.len() / unit;
    let threads = cx.cpu.threads();
    if threads <= 1 || units <= 1 || work < PAR_MIN {
        f(0, out);
        return;
    }
    let per = units.div_ceil(units.min(threads * 4));
    let groups = units.div_ceil(per);
    let len = out.len();
    let base = SyncPtr(out.as_mut_ptr());
    cx.cpu.parallel_for(groups, &|g| {
        let start = (g * per * unit).min(len);
        let end = ((g + 1) * per * unit).min(len);
        // SAFETY: every task `g` gets its own range [start, end) of `out`; the ranges are
        // disjoint and in bounds, and `out` stays exclusively borrowed by this function (so
        // alive and untouched elsewhere) until `parallel_for` has returned.
        let run = unsafe { core::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        f(g * per, run);
    });
}

/// Mean and population variance of a slice, accumulated in f64 (two passes).
fn mean_var<R: Real>(xs: &[R]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mut acc = [0f64; 4];
    let mut ch = xs.chunks_exact(4);
    for c in &mut ch {
        for k in 0..4 {
            acc[k] += c[k].to_f64();
        }
    }
    let mut s = acc[0] + acc[1] + acc[2] + acc[3];
    for v in ch.remainder() {
        s += v.to_f64();
    }
    let mean = s / n;
    let mut acc = [0f64; 4];
    let mut ch = xs.chunks_exact(4);
    for c in &mut ch {
        for k in 0..4 {
            let d = c[k].to_f64() - mean;
            acc[k] += d * d;
        }
    }
    let mut q = acc[0] + acc[1] + acc[2] + acc[3];
    for v in ch.remainder() {
        let d = v.to_f64() - mean;
        q += d * d;
    }
    (mean, q / n)
}

/// Mean of squares of a slice, accumulated in f64.
fn mean_square<R: Real>(xs: &[R]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut acc = [0f64; 4];
    let mut ch = xs.chunks_exact(4);
    for c in &mut ch {
        for k in 0..4 {
            let v = c[k].to_f64();
            acc[k] += v * v;
        }
    }
    let mut q = acc[0] + acc[1] + acc[2] + acc[3];
    for v in ch.remainder() {
        let v = v.to_f64();
        q += v * v;
    }
    q / xs.len() as f64
}

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

/// Checks that a per-channel parameter has `want` elements.
fn check_len(what: &str, t: &Tensor, want: usize) -> Result<()> {
    if t.len() != want {
        bail!(
            "{what} has shape {:?} ({} elements), expected {want} elements",
            t.shape(),
            t.len()
        );
    }
    Ok(())
}

// ----------------------------------------------------------------------------- softmax family

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SoftKind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

impl SoftKind {
    fn name(self) -> &'static str {
        match self {
            SoftKind::Softmax => "Softmax",
            SoftKind::LogSoftmax => "LogSoftmax",
            SoftKind::Hardmax => "Hardmax",
        }
    }
}

fn build_softmax(node: &Node) -> Result<Box<dyn Kernel>> {
    build_soft(node, SoftKind::Softmax)
}
fn build_log_softmax(node: &Node) -> Result<Box<dyn Kernel>> {
    build_soft(node, SoftKind::LogSoftmax)
}
fn build_hardmax(node: &Node) -> Result<Box<dyn Kernel>> {
    build_soft(node, SoftKind::Hardmax)
}

/// Opsets < 13 coerce the input to 2-D at `axis` (default 1) and normalise each row of the
/// flattened trailing block; opset 13 normalises along the one axis `axis` (default -1).
fn build_soft(node: &Node, kind: SoftKind) -> Result<Box<dyn Kernel>> {
    let legacy = node.opset < 13;
    let axis = node.get_i("axis", if legacy { 1 } else { -1 })?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let dims: Vec<usize> = if x.rank() == 0 {
                vec![1]
            } else {
                x.shape().to_vec()
            };
            let (n, inner) = soft_layout(&dims, axis, legacy)?;
            with_real!(kind.name(), x.dtype(), R => {
                let xs = R::load(x)?;
                let mut ys = vec![R::ZERO; xs.len()];
                soft_apply(cx, &xs, &mut ys, n, inner, kind);
                out1(R::store(x.dtype(), x.shape(), ys)?)
            })
        },
    ))
}

/// (length of the normalised axis, product of the dims after it) for a softmax-style op.
fn soft_layout(dims: &[usize], axis: i64, legacy: bool) -> Result<(usize, usize)> {
    let r = dims.len();
    if legacy {
        let a = if axis < 0 { axis + r as i64 } else { axis };
        if a < 0 || a > r as i64 {
            bail!("axis {axis} is out of range for rank {r}");
        }
        Ok((prod(&dims[a as usize..]), 1))
    } else {
        let a = norm_axis(axis, r)?;
        Ok((dims[a], prod(&dims[a + 1..])))
    }
}

fn soft_apply<R: Real>(
    cx: &KernelCx<'_>,
    xs: &[R],
    ys: &mut [R],
    n: usize,
    inner: usize,
    kind: SoftKind,
) {
    let unit = n * inner;
    par_out(cx, ys, unit, xs.len() * 8, &|first, run| {
        for (k, y) in run.chunks_mut(unit).enumerate() {
            let x = &xs[(first + k) * unit..][..unit];
            if inner == 1 {
                soft_row(x, y, kind);
            } else {
                soft_cols(x, y, n, inner, kind);
            }
        }
    });
}

/// Softmax-style normalisation of one contiguous row.
fn soft_row<R: Real>(x: &[R], y: &mut [R], kind: SoftKind) {
    let mut m = x[0];
    let mut arg = 0;
    for (i, &v) in x.iter().enumerate().skip(1) {
        if v > m {
            m = v;
            arg = i;
        }
    }
    match kind {
        SoftKind::Softmax => {
            let mut s = R::ZERO;
            for (o, &v) in y.iter_mut().zip(x) {
                let e = (v - m).fexp();
                *o = e;
                s += e;
            }
            let inv = R::ONE / s;
            for o in y.iter_mut() {
                *o *= inv;
            }
        }
        SoftKind::LogSoftmax => {
            let mut s = R::ZERO;
            for &v in x {
                s += (v - m).fexp();
            }
            let ls = s.fln();
            for (o, &v) in y.iter_mut().zip(x) {
                *o = (v - m) - ls;
            }
        }
        SoftKind::Hardmax => {
            y.fill(R::ZERO);
            y[arg] = R::ONE;
        }
    }
}

/// Softmax-style normalisation along the outer axis of an `[n, inner]` block.
fn soft_cols<R: Real>(x: &[R], y: &mut [R], n: usize, inner: usize, kind: SoftKind) {
    let mut m = x[..inner].to_vec();
    let mut arg = vec![0usize; if kind == SoftKind::Hardmax { inner } else { 0 }];
    for k in 1..n {
        let row = &x[k * inner..][..inner];
        if kind == SoftKind::Hardmax {
            for (j, &v) in row.iter().enumerate() {
                if v > m[j] {
                    m[j] = v;
                    arg[j] = k;
                }
            }
        } else {
            for (mj, &v) in m.iter_mut().zip(row) {
                if v > *mj {
                    *mj = v;
                }
            }
        }
    }
    match kind {
        SoftKind::Softmax => {
            let mut s = vec![R::ZERO; inner];
            for (yr, xr) in y.chunks_mut(inner).zip(x.chunks(inner)) {
                for j in 0..inner {
                    let e = (xr[j] - m[j]).fexp();
                    yr[j] = e;
                    s[j] += e;
                }
            }
            for v in s.iter_mut() {
                *v = R::ONE / *v;
            }
            for yr in y.chunks_mut(inner) {
                for (o, &iv) in yr.iter_mut().zip(&s) {
                    *o *= iv;
                }
            }
        }
        SoftKind::LogSoftmax => {
            let mut s = vec![R::ZERO; inner];
            for xr in x.chunks(inner) {
                for j in 0..inner {
                    s[j] += (xr[j] - m[j]).fexp();
                }
            }
            for v in s.iter_mut() {
                *v = v.fln();
            }
            for (yr, xr) in y.chunks_mut(inner).zip(x.chunks(inner)) {
                for j in 0..inner {
                    yr[j] = (xr[j] - m[j]) - s[j];
                }
            }
        }
        SoftKind::Hardmax => {
            y.fill(R::ZERO);
            for (j, &k) in arg.iter().enumerate() {
                y[k * inner + j] = R::ONE;
            }
        }
    }
}

// ----------------------------------------------------------------------------- batch norm

/// BatchNormalization. Inference everywhere; training mode (batch statistics, updated running
/// statistics) for the opset 14+ form. Opsets < 9 honour `spatial = 0` (per-element statistics).
fn build_batch_norm(node: &Node) -> Result<Box<dyn Kernel>> {
    let opset = node.opset;
    let eps = node.get_f("epsilon", 1e-5)? as f64;
    let momentum = node.get_f("momentum", 0.9)? as f64;
    let spatial = if opset < 9 {
        node.get_i("spatial", 1)? != 0
    } else {
        true
    };
    let training = if opset >= 14 {
        node.get_i("training_mode", 0)? != 0
    } else if opset < 7 {
        node.get_i("is_test", 0)? == 0
    } else {
        node.outputs.iter().skip(1).any(Option::is_some)
    };
    if training && opset < 14 {
        unsupported!(
            "BatchNormalization training mode of opset {opset} (is_test=0 or saved mean/var \
             outputs) is not supported; only inference and the opset-14+ training_mode"
        );
    }
    let n_out = node.outputs.len().clamp(1, 3);
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let scale = tensor_in(inputs, 1)?;
            let bias = tensor_in(inputs, 2)?;
            let mean = tensor_in(inputs, 3)?;
            let var = tensor_in(inputs, 4)?;
            let shape = x.shape();
            if shape.len() < 2 {
                bail!("BatchNormalization input must have rank >= 2, has shape {shape:?}");
            }
            let nb = shape[0];
            let (ch, inner) = if spatial {
                (shape[1], prod(&shape[2..]))
            } else {
                (prod(&shape[1..]), 1)
            };
            for (what, t) in [("scale", scale), ("B", bias), ("mean", mean), ("var", var)] {
                check_len(what, t, ch)?;
            }
            with_real!("BatchNormalization", x.dtype(), R => {
                let xs = R::load(x)?;
                let sc = R::load(scale)?;
                let bs = R::load(bias)?;
                let rm = R::load(mean)?;
                let rv = R::load(var)?;
                let (mu, va): (Vec<f64>, Vec<f64>) = if training {
                    channel_stats(&xs, nb, ch, inner)
                } else {
                    (
                        rm.iter().map(|v| v.to_f64()).collect(),
                        rv.iter().map(|v| v.to_f64()).collect(),
                    )
                };
                let a: Vec<R> = (0..ch)
                    .map(|c| R::from_f64(sc[c].to_f64() / libm::sqrt(va[c] + eps)))
                    .collect();
                let m: Vec<R> = mu.iter().map(|&v| R::from_f64(v)).collect();
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, inner, xs.len(), &|first, run| {
                    for (k, y) in run.chunks_mut(inner).enumerate() {
                        let i = first + k;
                        let c = i % ch;
                        let xr = &xs[i * inner..][..inner];
                        let (mc, ac, bc) = (m[c], a[c], bs[c]);
                        for (o, &v) in y.iter_mut().zip(xr) {
                            *o = (v - mc) * ac + bc;
                        }
                    }
                });
                let mut outs = vec![Value::Tensor(R::store(x.dtype(), shape, ys)?)];
                if training && n_out > 1 {
                    let upd = |run: &[R], cur: &[f64]| -> Vec<R> {
                        run.iter()
                            .zip(cur)
                            .map(|(r, &c)| R::from_f64(r.to_f64() * momentum + c * (1.0 - momentum)))
                            .collect()
                    };
                    outs.push(Value::Tensor(R::store(mean.dtype(), mean.shape(), upd(&rm, &mu))?));
                    if n_out > 2 {
                        outs.push(Value::Tensor(R::store(var.dtype(), var.shape(), upd(&rv, &va))?));
                    }
                }
                Ok(outs)
            })
        },
    ))
}

/// Per-channel mean and population variance over the batch and spatial axes.
fn channel_stats<R: Real>(xs: &[R], nb: usize, ch: usize, inner: usize) -> (Vec<f64>, Vec<f64>) {
    let cnt = (nb * inner) as f64;
    let mut mean = vec![0f64; ch];
    let mut var = vec![0f64; ch];
    if cnt == 0.0 {
        return (mean, var);
    }
    for c in 0..ch {
        let mut s = 0f64;
        for n in 0..nb {
            for v in &xs[(n * ch + c) * inner..][..inner] {
                s += v.to_f64();
            }
        }
        let mu = s / cnt;
        let mut q = 0f64;
        for n in 0..nb {
            for v in &xs[(n * ch + c) * inner..][..inner] {
                let d = v.to_f64() - mu;
                q += d * d;
            }
        }
        mean[c] = mu;
        var[c] = q / cnt;
    }
    (mean, var)
}

// ----------------------------------------------------------------------------- instance norm

fn build_instance_norm(node: &Node) -> Result<Box<dyn Kernel>> {
    let eps = node.get_f("epsilon", 1e-5)? as f64;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let scale = tensor_in(inputs, 1)?;
            let bias = tensor_in(inputs, 2)?;
            let shape = x.shape();
            if shape.len() < 2 {
                bail!("InstanceNormalization input must have rank >= 2, has shape {shape:?}");
            }
            let ch = shape[1];
            let inner = prod(&shape[2..]);
            check_len("scale", scale, ch)?;
            check_len("B", bias, ch)?;
            with_real!("InstanceNormalization", x.dtype(), R => {
                let xs = R::load(x)?;
                let sc = R::load(scale)?;
                let bs = R::load(bias)?;
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, inner, xs.len() * 3, &|first, run| {
                    for (k, y) in run.chunks_mut(inner).enumerate() {
                        let i = first + k;
                        let c = i % ch;
                        let xr = &xs[i * inner..][..inner];
                        let (mu, va) = mean_var(xr);
                        let a = R::from_f64(sc[c].to_f64() / libm::sqrt(va + eps));
                        let m = R::from_f64(mu);
                        let b = bs[c];
                        for (o, &v) in y.iter_mut().zip(xr) {
                            *o = (v - m) * a + b;
                        }
                    }
                });
                out1(R::store(x.dtype(), shape, ys)?)
            })
        },
    ))
}

// ----------------------------------------------------------------------------- layer / RMS norm

fn stash_check(node: &Node) -> Result<()> {
    let stash = node.get_i("stash_type", 1)?;
    if stash != 1 {
        unsupported!(
            "{} with stash_type {stash} is not supported (only 1 = float)",
            node.op_type
        );
    }
    Ok(())
}

/// Loads an optional per-element parameter broadcast to the normalised shape.
fn load_bcast<R: Real>(t: &Tensor, norm_shape: &[usize], what: &str) -> Result<Vec<R>> {
    let b = t.broadcast_to(norm_shape).map_err(|_| {
        Error::Other(alloc::format!(
            "{what} of shape {:?} does not broadcast to the normalised shape {norm_shape:?}",
            t.shape()
        ))
    })?;
    Ok(R::load(&b)?.into_owned())
}

/// LayerNormalization (opset 17; also the identical pre-17 contrib form): normalises over the
/// axes from `axis` on; optional Mean and InvStdDev outputs are float (stash_type 1).
fn build_layer_norm(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", -1)?;
    let eps = node.get_f("epsilon", 1e-5)? as f64;
    stash_check(node)?;
    let n_out = node.outputs.len().clamp(1, 3);
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let scale = tensor_in(inputs, 1)?;
            let bias = opt_tensor_in(inputs, 2)?;
            let shape = x.shape();
            let r = shape.len();
            let ax = norm_axis(axis, r)?;
            let rows = prod(&shape[..ax]);
            let n = prod(&shape[ax..]);
            let norm_shape = &shape[ax..];
            let stats: Vec<AtomicU32> = if n_out > 1 {
                (0..2 * rows).map(|_| AtomicU32::new(0)).collect()
            } else {
                Vec::new()
            };
            let mut outs = with_real!("LayerNormalization", x.dtype(), R => {
                let xs = R::load(x)?;
                let sc: Vec<R> = load_bcast(scale, norm_shape, "Scale")?;
                let bs: Option<Vec<R>> = match bias {
                    Some(b) => Some(load_bcast(b, norm_shape, "B")?),
                    None => None,
                };
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, n, xs.len() * 3, &|first, run| {
                    for (k, y) in run.chunks_mut(n).enumerate() {
                        let i = first + k;
                        let xr = &xs[i * n..][..n];
                        let (mu, va) = mean_var(xr);
                        let inv = 1.0 / libm::sqrt(va + eps);
                        if !stats.is_empty() {
                            stats[2 * i].store((mu as f32).to_bits(), Ordering::Relaxed);
                            stats[2 * i + 1].store((inv as f32).to_bits(), Ordering::Relaxed);
                        }
                        let (m, iv) = (R::from_f64(mu), R::from_f64(inv));
                        match &bs {
                            Some(b) => {
                                for j in 0..n {
                                    y[j] = (xr[j] - m) * iv * sc[j] + b[j];
                                }
                            }
                            None => {
                                for j in 0..n {
                                    y[j] = (xr[j] - m) * iv * sc[j];
                                }
                            }
                        }
                    }
                });
                Ok(vec![Value::Tensor(R::store(x.dtype(), shape, ys)?)])
            })?;
            if n_out > 1 {
                let mut st_shape = shape[..ax].to_vec();
                st_shape.resize(r, 1);
                let get = |o: usize| -> Vec<f32> {
                    (0..rows)
                        .map(|i| f32::from_bits(stats[2 * i + o].load(Ordering::Relaxed)))
                        .collect()
                };
                outs.push(Value::Tensor(Tensor::from_vec(&st_shape, get(0))?));
                if n_out > 2 {
                    outs.push(Value::Tensor(Tensor::from_vec(&st_shape, get(1))?));
                }
            }
            Ok(outs)
        },
    ))
}

/// RMSNormalization (opset 23): `x / sqrt(mean(x^2) + epsilon) * scale` over the axes from `axis`.
fn build_rms_norm(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", -1)?;
    let eps = node.get_f("epsilon", 1e-5)? as f64;
    stash_check(node)?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let scale = tensor_in(inputs, 1)?;
            let shape = x.shape();
            let ax = norm_axis(axis, shape.len())?;
            let n = prod(&shape[ax..]);
            with_real!("RMSNormalization", x.dtype(), R => {
                let xs = R::load(x)?;
                let sc: Vec<R> = load_bcast(scale, &shape[ax..], "scale")?;
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, n, xs.len() * 2, &|first, run| {
                    for (k, y) in run.chunks_mut(n).enumerate() {
                        let xr = &xs[(first + k) * n..][..n];
                        let iv = R::from_f64(1.0 / libm::sqrt(mean_square(xr) + eps));
                        for j in 0..n {
                            y[j] = xr[j] * iv * sc[j];
                        }
                    }
                });
                out1(R::store(x.dtype(), shape, ys)?)
            })
        },
    ))
}

// ----------------------------------------------------------------------------- group norm

/// GroupNormalization: opset 18 takes one scale/bias per group, opset 21 one per channel.
fn build_group_norm(node: &Node) -> Result<Box<dyn Kernel>> {
    let groups = match node.attr_i("num_groups")? {
        Some(g) if g > 0 => g as usize,
        Some(g) => bail!("num_groups must be positive, is {g}"),
        None => bail!("GroupNormalization requires the num_groups attribute"),
    };
    let eps = node.get_f("epsilon", 1e-5)? as f64;
    if node.opset >= 21 {
        stash_check(node)?;
    }
    let per_channel = node.opset >= 21;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let scale = tensor_in(inputs, 1)?;
            let bias = tensor_in(inputs, 2)?;
            let shape = x.shape();
            if shape.len() < 2 {
                bail!("GroupNormalization input must have rank >= 2, has shape {shape:?}");
            }
            let ch = shape[1];
            if ch % groups != 0 {
                bail!("{ch} channels do not split into {groups} groups");
            }
            let cg = ch / groups;
            let inner = prod(&shape[2..]);
            let plen = if per_channel { ch } else { groups };
            check_len("scale", scale, plen)?;
            check_len("bias", bias, plen)?;
            let unit = cg * inner;
            with_real!("GroupNormalization", x.dtype(), R => {
                let xs = R::load(x)?;
                let sc = R::load(scale)?;
                let bs = R::load(bias)?;
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, unit, xs.len() * 3, &|first, run| {
                    for (k, y) in run.chunks_mut(unit).enumerate() {
                        let i = first + k;
                        let g = i % groups;
                        let xr = &xs[i * unit..][..unit];
                        let (mu, va) = mean_var(xr);
                        let inv = 1.0 / libm::sqrt(va + eps);
                        let m = R::from_f64(mu);
                        for ci in 0..cg {
                            let p = if per_channel { g * cg + ci } else { g };
                            let a = R::from_f64(sc[p].to_f64() * inv);
                            let b = bs[p];
                            let sl = ci * inner..(ci + 1) * inner;
                            for (o, &v) in y[sl.clone()].iter_mut().zip(&xr[sl]) {
                                *o = (v - m) * a + b;
                            }
                        }
                    }
                });
                out1(R::store(x.dtype(), shape, ys)?)
            })
        },
    ))
}

// ----------------------------------------------------------------------------- Lp norm, MVN, LRN

/// LpNormalization: `x / ||x||_p` along `axis` (p = 1 or 2); a zero norm gives zeros.
fn build_lp_norm(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", -1)?;
    let p = node.get_i("p", 2)?;
    if p != 1 && p != 2 {
        unsupported!("LpNormalization with p = {p} is not supported (only 1 and 2)");
    }
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let shape = x.shape();
            let a = norm_axis(axis, shape.len())?;
            let (n, inner) = (shape[a], prod(&shape[a + 1..]));
            let unit = n * inner;
            with_real!("LpNormalization", x.dtype(), R => {
                let xs = R::load(x)?;
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, unit, xs.len() * 2, &|first, run| {
                    let mut norms = vec![0f64; inner];
                    for (k, y) in run.chunks_mut(unit).enumerate() {
                        let xb = &xs[(first + k) * unit..][..unit];
                        norms.fill(0.0);
                        for xr in xb.chunks(inner) {
                            for (s, v) in norms.iter_mut().zip(xr) {
                                let v = v.to_f64();
                                *s += if p == 1 { libm::fabs(v) } else { v * v };
                            }
                        }
                        let inv: Vec<R> = norms
                            .iter()
                            .map(|&s| {
                                let nv = if p == 1 { s } else { libm::sqrt(s) };
                                if nv == 0.0 { R::ZERO } else { R::from_f64(1.0 / nv) }
                            })
                            .collect();
                        for (yr, xr) in y.chunks_mut(inner).zip(xb.chunks(inner)) {
                            for j in 0..inner {
                                yr[j] = xr[j] * inv[j];
                            }
                        }
                    }
                });
                out1(R::store(x.dtype(), shape, ys)?)
            })
        },
    ))
}

/// MeanVarianceNormalization: `(x - mean) / (std + 1e-9)` over `axes` (default [0, 2, 3]).
fn build_mvn(node: &Node) -> Result<Box<dyn Kernel>> {
    let axes = node
        .attr_ints("axes")?
        .unwrap_or_else(|| alloc::vec![0, 2, 3]);
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let shape = x.shape();
            let r = shape.len();
            let mut red = vec![false; r];
            for &a in &axes {
                let a = norm_axis(a, r)?;
                if red[a] {
                    bail!("axis {a} is repeated in axes {axes:?}");
                }
                red[a] = true;
            }
            let perm: Vec<usize> = (0..r)
                .filter(|&a| !red[a])
                .chain((0..r).filter(|&a| red[a]))
                .collect();
            let xp = x.permute(&perm)?;
            let pshape = xp.shape().to_vec();
            let m: usize = (0..r).filter(|&a| red[a]).map(|a| shape[a]).product();
            let yt = with_real!("MeanVarianceNormalization", x.dtype(), R => {
                let xs = R::load(&xp)?;
                let mut ys = vec![R::ZERO; xs.len()];
                par_out(cx, &mut ys, m, xs.len() * 3, &|first, run| {
                    for (k, y) in run.chunks_mut(m).enumerate() {
                        let xr = &xs[(first + k) * m..][..m];
                        let (mu, va) = mean_var(xr);
                        let mr = R::from_f64(mu);
                        let iv = R::from_f64(1.0 / (libm::sqrt(va) + 1e-9));
                        for (o, &v) in y.iter_mut().zip(xr) {
                            *o = (v - mr) * iv;
                        }
                    }
                });
                R::store(x.dtype(), &pshape, ys)
            })?;
            let mut inv = vec![0usize; r];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            out1(yt.permute(&inv)?.contiguous()?)
        },
    ))
}

/// LRN: `x / (bias + alpha / size * sum of squares over a channel window)^beta`.
fn build_lrn(node: &Node) -> Result<Box<dyn Kernel>> {
    let size = match node.attr_i("size")? {
        Some(s) if s > 0 => s as usize,
        Some(s) => bail!("LRN size must be positive, is {s}"),
        None => bail!("LRN requires the size attribute"),
    };
    let alpha = node.get_f("alpha", 1e-4)? as f64;
    let beta = node.get_f("beta", 0.75)? as f64;
    let bias = node.get_f("bias", 1.0)? as f64;
    let lo = (size - 1) / 2;
    let hi = size - 1 - lo;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let shape = x.shape();
            if shape.len() < 2 {
                bail!("LRN input must have rank >= 2, has shape {shape:?}");
            }
            let ch = shape[1];
            let inner = prod(&shape[2..]);
            with_real!("LRN", x.dtype(), R => {
                let xs = R::load(x)?;
                let mut ys = vec![R::ZERO; xs.len()];
                let (k, a, b) = (R::from_f64(bias), R::from_f64(alpha / size as f64), R::from_f64(beta));
                par_out(cx, &mut ys, inner, xs.len() * (size + 2), &|first, run| {
                    let mut acc = vec![R::ZERO; inner];
                    for (u, y) in run.chunks_mut(inner).enumerate() {
                        let i = first + u;
                        let (n, c) = (i / ch, i % ch);
                        acc.fill(R::ZERO);
                        for cc in c.saturating_sub(lo)..=(c + hi).min(ch - 1) {
                            for (s, &v) in acc.iter_mut().zip(&xs[(n * ch + cc) * inner..][..inner]) {
                                *s += v * v;
                            }
                        }
                        let xr = &xs[i * inner..][..inner];
                        for j in 0..inner {
                            y[j] = xr[j] / (k + a * acc[j]).fpow(b);
                        }
                    }
                });
                out1(R::store(x.dtype(), shape, ys)?)
            })
        },
    ))
}

// ----------------------------------------------------------------------------- resize

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Interp {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
    TfHalfPixelForNn,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rounding {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Upsample and Resize-10: floor when enlarging, ceil when shrinking (what onnxruntime does).
    Legacy,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Policy {
    Stretch,
    NotLarger,
    NotSmaller,
}

#[derive(Clone, Debug)]
struct ResizeSpec {
    interp: Interp,
    coord: Coord,
    rounding: Rounding,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
    policy: Policy,
    axes: Option<Vec<i64>>,
    /// Upsample-7 takes its scales from an attribute.
    scales_attr: Option<Vec<f32>>,
    roi_in: Option<usize>,
    scales_in: Option<usize>,
    sizes_in: Option<usize>,
}

impl ResizeSpec {
    fn legacy(interp: Interp) -> ResizeSpec {
        ResizeSpec {
            interp,
            coord: Coord::Asymmetric,
            rounding: Rounding::Legacy,
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            antialias: false,
            policy: Policy::Stretch,
            axes: None,
            scales_attr: None,
            roi_in: None,
            scales_in: Some(1),
            sizes_in: None,
        }
    }
}

fn legacy_interp(node: &Node) -> Result<Interp> {
    Ok(match node.get_s("mode", "nearest")?.as_str() {
        "nearest" => Interp::Nearest,
        "linear" => Interp::Linear,
        m => unsupported!("{} mode '{m}' is not supported", node.op_type),
    })
}

fn build_resize(node: &Node) -> Result<Box<dyn Kernel>> {
    let opset = node.opset;
    let spec = if opset < 11 {
        ResizeSpec::legacy(legacy_interp(node)?)
    } else {
        let interp = match node.get_s("mode", "nearest")?.as_str() {
            "nearest" => Interp::Nearest,
            "linear" => Interp::Linear,
            "cubic" => Interp::Cubic,
            m => unsupported!("Resize mode '{m}' is not supported"),
        };
        let coord = match node
            .get_s("coordinate_transformation_mode", "half_pixel")?
            .as_str()
        {
            "half_pixel" => Coord::HalfPixel,
            "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
            "pytorch_half_pixel" => Coord::PytorchHalfPixel,
            "align_corners" => Coord::AlignCorners,
            "asymmetric" => Coord::Asymmetric,
            "tf_crop_and_resize" => Coord::TfCropAndResize,
            "tf_half_pixel_for_nn" => Coord::TfHalfPixelForNn,
            m => unsupported!("Resize coordinate_transformation_mode '{m}' is not supported"),
        };
        let rounding = match node.get_s("nearest_mode", "round_prefer_floor")?.as_str() {
            "round_prefer_floor" => Rounding::RoundPreferFloor,
            "round_prefer_ceil" => Rounding::RoundPreferCeil,
            "floor" => Rounding::Floor,
            "ceil" => Rounding::Ceil,
            m => unsupported!("Resize nearest_mode '{m}' is not supported"),
        };
        let (antialias, axes, policy) = if opset >= 18 {
            let policy = match node.get_s("keep_aspect_ratio_policy", "stretch")?.as_str() {
                "stretch" => Policy::Stretch,
                "not_larger" => Policy::NotLarger,
                "not_smaller" => Policy::NotSmaller,
                m => unsupported!("Resize keep_aspect_ratio_policy '{m}' is not supported"),
            };
            (
                node.get_i("antialias", 0)? != 0,
                node.attr_ints("axes")?,
                policy,
            )
        } else {
            (false, None, Policy::Stretch)
        };
        ResizeSpec {
            interp,
            coord,
            rounding,
            cubic_a: node.get_f("cubic_coeff_a", -0.75)? as f64,
            exclude_outside: node.get_i("exclude_outside", 0)? != 0,
            extrapolation: node.get_f("extrapolation_value", 0.0)? as f64,
            antialias,
            policy,
            axes,
            scales_attr: None,
            roi_in: Some(1),
            scales_in: Some(2),
            sizes_in: Some(3),
        }
    };
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            resize_run(&spec, cx, inputs)
        },
    ))
}

/// Upsample (opsets 7-9): nearest or linear, asymmetric coordinates; scales from the attribute
/// (7, 8) or the second input (9).
fn build_upsample(node: &Node) -> Result<Box<dyn Kernel>> {
    let mut spec = ResizeSpec::legacy(legacy_interp(node)?);
    if node.opset < 9 {
        match node.attr_floats("scales")? {
            Some(s) => spec.scales_attr = Some(s),
            None => bail!("Upsample requires the scales attribute"),
        }
        spec.scales_in = None;
    }
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            resize_run(&spec, cx, inputs)
        },
    ))
}

/// Per-axis scale (as used by the coordinate transform) and output length.
fn resize_geometry(
    in_shape: &[usize],
    axes: &[usize],
    scales: Option<&[f32]>,
    sizes: Option<&[i64]>,
    policy: Policy,
) -> Result<(Vec<f64>, Vec<usize>)> {
    let r = in_shape.len();
    let mut scale = vec![1.0f64; r];
    let mut out = in_shape.to_vec();
    match (scales, sizes) {
        (Some(_), Some(_)) => bail!("only one of 'scales' and 'sizes' may be given"),
        (None, None) => bail!("one of 'scales' and 'sizes' must be given"),
        (Some(s), None) => {
            if s.len() != axes.len() {
                bail!("'scales' has {} values, expected {}", s.len(), axes.len());
            }
            for (&a, &v) in axes.iter().zip(s) {
                if !(v > 0.0 && v.is_finite()) {
                    bail!("scale {v} must be positive");
                }
                let v = v as f64;
                scale[a] = v;
                out[a] = libm::floor(v * in_shape[a] as f64) as usize;
            }
        }
        (None, Some(z)) => {
            if z.len() != axes.len() {
                bail!("'sizes' has {} values, expected {}", z.len(), axes.len());
            }
            for (&a, &v) in axes.iter().zip(z) {
                if v < 0 {
                    bail!("size {v} must not be negative");
                }
                if in_shape[a] == 0 {
                    if v != 0 {
                        bail!("cannot resize an empty axis to size {v}");
                    }
                    continue;
                }
                scale[a] = v as f64 / in_shape[a] as f64;
                out[a] = v as usize;
            }
            if policy != Policy::Stretch && !axes.is_empty() {
                let pick = |acc: f64, v: f64| match policy {
                    Policy::NotLarger => acc.min(v),
                    _ => acc.max(v),
                };
                let first = scale[axes[0]];
                let s = axes.iter().map(|&a| scale[a]).fold(first, pick);
                for &a in axes {
                    scale[a] = s;
                    out[a] = libm::floor(s * in_shape[a] as f64 + 0.5) as usize;
                }
            }
        }
    }
    Ok((scale, out))
}

/// Input coordinate of output index `o` along one axis.
fn src_coord(
    coord: Coord,
    o: usize,
    scale: f64,
    n_in: usize,
    n_out: usize,
    roi: (f64, f64),
) -> f64 {
    let y = o as f64;
    let lin = n_in as f64;
    // The "resized length" of the spec is the unrounded `scale * n_in`.
    let lout = scale * lin;
    match coord {
        Coord::HalfPixel => (y + 0.5) / scale - 0.5,
        Coord::HalfPixelSymmetric => {
            let adj = n_out as f64 / lout;
            let offset = lin / 2.0 * (1.0 - adj);
            offset + (y + 0.5) / scale - 0.5
        }
        Coord::PytorchHalfPixel => {
            if lout > 1.0 {
                (y + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        Coord::AlignCorners => {
            if lout == 1.0 {
                0.0
            } else {
                y * (lin - 1.0) / (lout - 1.0)
            }
        }
        Coord::Asymmetric => y / scale,
        Coord::TfCropAndResize => {
            let (s, e) = roi;
            let v = if lout == 1.0 {
                (e - s) * (lin - 1.0) / 2.0
            } else {
                y * (e - s) * (lin - 1.0) / (lout - 1.0)
            };
            v + s * (lin - 1.0)
        }
        Coord::TfHalfPixelForNn => (y + 0.5) / scale,
    }
}

fn nearest_index(x: f64, rounding: Rounding, scale: f64) -> i64 {
    let fl = libm::floor(x);
    if fl == x {
        return x as i64;
    }
    let frac = x - fl;
    let up = match rounding {
        Rounding::RoundPreferFloor => frac > 0.5,
        Rounding::RoundPreferCeil => frac >= 0.5,
        Rounding::Floor => false,
        Rounding::Ceil => true,
        Rounding::Legacy => scale < 1.0,
    };
    fl as i64 + up as i64
}

fn cubic_kernel(d: f64, a: f64) -> f64 {
    let d = libm::fabs(d);
    if d <= 1.0 {
        ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
    } else if d < 2.0 {
        ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
    } else {
        0.0
    }
}

/// Source indices and weights of every output position along one axis.
/// Invariant: a 1-tap table has weight 1 everywhere (a pure gather).
#[derive(Clone, Debug)]
struct AxisTab<W> {
    taps: usize,
    idx: Vec<usize>,
    w: Vec<W>,
    /// tf_crop_and_resize: the position falls outside the input (extrapolation value).
    oob: Vec<bool>,
    /// This axis and all later ones map every position to itself.
    tail_identity: bool,
}

impl<W> AxisTab<W> {
    fn identity(&self, n_in: usize) -> bool {
        self.taps == 1
            && self.idx.len() == n_in
            && !self.oob.iter().any(|&b| b)
            && self.idx.iter().enumerate().all(|(o, &i)| o == i)
    }
}

fn axis_table(
    spec: &ResizeSpec,
    n_in: usize,
    n_out: usize,
    scale: f64,
    roi: (f64, f64),
) -> AxisTab<f64> {
    let last = n_in as i64 - 1;
    let mut oob = vec![false; n_out];
    let crop = spec.coord == Coord::TfCropAndResize;
    let outside = |x: f64| crop && (x < 0.0 || x > last as f64);
    if spec.interp == Interp::Nearest {
        let mut idx = Vec::with_capacity(n_out);
        for o in 0..n_out {
            let x = src_coord(spec.coord, o, scale, n_in, n_out, roi);
            if outside(x) {
                oob[o] = true;
                idx.push(0);
            } else {
                idx.push(nearest_index(x, spec.rounding, scale).clamp(0, last) as usize);
            }
        }
        return AxisTab {
            taps: 1,
            idx,
            w: vec![1.0; n_out],
            oob,
            tail_identity: false,
        };
    }
    // Tap i (from i_start) of the window sits at x0 + i, at distance (i - ratio) from x, where
    // x0 is the pixel left of x (one further left when x is a whole number, ratio = 1).
    let s_eff = if spec.antialias { scale.min(1.0) } else { 1.0 };
    let i_start: i64 = match (spec.interp, spec.antialias) {
        (Interp::Cubic, true) => libm::floor(-2.0 / s_eff) as i64 + 1,
        (Interp::Cubic, false) => -1,
        (_, true) => libm::floor(-1.0 / s_eff) as i64 + 1,
        (_, false) => 0,
    };
    let taps = (2 - 2 * i_start) as usize;
    let mut idx = Vec::with_capacity(n_out * taps);
    let mut w = Vec::with_capacity(n_out * taps);
    let mut ws = vec![0f64; taps];
    for o in 0..n_out {
        let x = src_coord(spec.coord, o, scale, n_in, n_out, roi);
        if outside(x) {
            oob[o] = true;
            idx.extend(core::iter::repeat_n(0, taps));
            w.extend(core::iter::repeat_n(0.0, taps));
            continue;
        }
        let fl = libm::floor(x);
        let (x0, ratio) = if fl == x {
            (fl - 1.0, 1.0)
        } else {
            (fl, x - fl)
        };
        let x0 = x0 as i64;
        let mut sum = 0.0;
        for (t, wt) in ws.iter_mut().enumerate() {
            let d = ((i_start + t as i64) as f64 - ratio) * s_eff;
            *wt = match spec.interp {
                Interp::Cubic => cubic_kernel(d, spec.cubic_a),
                _ => (1.0 - libm::fabs(d)).max(0.0),
            };
            sum += *wt;
        }
        if spec.antialias && sum != 0.0 {
            ws.iter_mut().for_each(|v| *v /= sum);
        }
        if spec.exclude_outside {
            let mut sum = 0.0;
            for (t, wt) in ws.iter_mut().enumerate() {
                let i = x0 + i_start + t as i64;
                if i < 0 || i > last {
                    *wt = 0.0;
                }
                sum += *wt;
            }
            if sum != 0.0 {
                ws.iter_mut().for_each(|v| *v /= sum);
            }
        }
        for (t, &wt) in ws.iter().enumerate() {
            idx.push((x0 + i_start + t as i64).clamp(0, last.max(0)) as usize);
            w.push(wt);
        }
    }
    let mut tab = AxisTab {
        taps,
        idx,
        w,
        oob,
        tail_identity: false,
    };
    simplify(&mut tab);
    tab
}

/// Turns a table whose every position has one weight of exactly 1 (the rest 0) into a 1-tap
/// gather table.
fn simplify(t: &mut AxisTab<f64>) {
    if t.taps == 1 {
        return;
    }
    let n_out = t.oob.len();
    let mut idx = Vec::with_capacity(n_out);
    for o in 0..n_out {
        if t.oob[o] {
            idx.push(0);
            continue;
        }
        let w = &t.w[o * t.taps..][..t.taps];
        let mut one = None;
        for (k, &v) in w.iter().enumerate() {
            if v == 1.0 && one.is_none() {
                one = Some(k);
            } else if v != 0.0 {
                return;
            }
        }
        match one {
            Some(k) => idx.push(t.idx[o * t.taps + k]),
            None => return,
        }
    }
    t.taps = 1;
    t.idx = idx;
    t.w = vec![1.0; n_out];
}

/// Reads a float tensor as f64 values.
fn floats_f64(t: &Tensor) -> Result<Vec<f64>> {
    match t.dtype() {
        DataType::Double => Ok(t.as_slice::<f64>()?.into_owned()),
        _ => Ok(t.to_f32_vec()?.into_iter().map(f64::from).collect()),
    }
}

fn resize_run(
    spec: &ResizeSpec,
    cx: &KernelCx<'_>,
    inputs: &[Option<&Value>],
) -> Result<Vec<Value>> {
    let x = tensor_in(inputs, 0)?;
    let in_shape = x.shape().to_vec();
    let r = in_shape.len();
    let nonempty = |i: Option<usize>| -> Result<Option<&Tensor>> {
        match i {
            Some(i) => Ok(opt_tensor_in(inputs, i)?.filter(|t| !t.is_empty())),
            None => Ok(None),
        }
    };
    let scales: Option<Vec<f32>> = match &spec.scales_attr {
        Some(v) => Some(v.clone()),
        None => nonempty(spec.scales_in)?
            .map(|t| t.to_f32_vec())
            .transpose()?,
    };
    let sizes: Option<Vec<i64>> = nonempty(spec.sizes_in)?
        .map(|t| t.to_i64_vec())
        .transpose()?;
    let axes: Vec<usize> = match &spec.axes {
        Some(a) => {
            let mut seen = vec![false; r];
            let mut v = Vec::with_capacity(a.len());
            for &ax in a {
                let ax = norm_axis(ax, r)?;
                if seen[ax] {
                    bail!("axis {ax} is repeated in axes {a:?}");
                }
                seen[ax] = true;
                v.push(ax);
            }
            v
        }
        None => (0..r).collect(),
    };
    let (scale, out_shape) = resize_geometry(
        &in_shape,
        &axes,
        scales.as_deref(),
        sizes.as_deref(),
        spec.policy,
    )?;
    let mut roi = vec![(0.0f64, 1.0f64); r];
    if spec.coord == Coord::TfCropAndResize {
        let t = nonempty(spec.roi_in)?
            .ok_or_else(|| Error::Other("tf_crop_and_resize needs the roi input".into()))?;
        let v = floats_f64(t)?;
        if v.len() != 2 * axes.len() {
            bail!("roi has {} values, expected {}", v.len(), 2 * axes.len());
        }
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = (v[i], v[axes.len() + i]);
        }
    }
    let dt = x.dtype();
    if out_shape.contains(&0) {
        return out1(Tensor::zeros(dt, &out_shape)?);
    }
    let mut tabs: Vec<AxisTab<f64>> = (0..r)
        .map(|a| axis_table(spec, in_shape[a], out_shape[a], scale[a], roi[a]))
        .collect();
    let mut tail = true;
    for a in (0..r).rev() {
        tail = tail && tabs[a].identity(in_shape[a]);
        tabs[a].tail_identity = tail;
    }
    let Some(k0) = (0..r).find(|&a| !tabs[a].identity(in_shape[a])) else {
        return out1(x.clone());
    };
    let g = Geometry {
        in_shape: &in_shape,
        out_shape: &out_shape,
        k0,
    };
    if tabs.iter().all(|t| t.taps == 1) {
        let ex = spec.extrapolation;
        let t = match dt {
            DataType::Float => gather_typed::<f32>(cx, x, &g, &tabs, ex),
            DataType::Double => gather_typed::<f64>(cx, x, &g, &tabs, ex),
            DataType::Float16 => gather_typed::<f16>(cx, x, &g, &tabs, ex),
            DataType::Bfloat16 => gather_typed::<bf16>(cx, x, &g, &tabs, ex),
            DataType::Int8 => gather_typed::<i8>(cx, x, &g, &tabs, ex),
            DataType::Int16 => gather_typed::<i16>(cx, x, &g, &tabs, ex),
            DataType::Int32 => gather_typed::<i32>(cx, x, &g, &tabs, ex),
            DataType::Int64 => gather_typed::<i64>(cx, x, &g, &tabs, ex),
            DataType::Uint8 => gather_typed::<u8>(cx, x, &g, &tabs, ex),
            DataType::Uint16 => gather_typed::<u16>(cx, x, &g, &tabs, ex),
            DataType::Uint32 => gather_typed::<u32>(cx, x, &g, &tabs, ex),
            DataType::Uint64 => gather_typed::<u64>(cx, x, &g, &tabs, ex),
            other => Err(bad_type("Resize", other)),
        }?;
        return out1(t);
    }
    match dt {
        DataType::Float | DataType::Float16 | DataType::Bfloat16 | DataType::Double => {}
        other => unsupported!(
            "Resize {:?} interpolation of {other} tensors is not supported",
            spec.interp
        ),
    }
    with_real!("Resize", dt, R => {
        let xs = R::load(x)?;
        let tr: Vec<AxisTab<R>> = tabs
            .iter()
            .map(|t| AxisTab {
                taps: t.taps,
                idx: t.idx.clone(),
                w: t.w.iter().map(|&v| R::from_f64(v)).collect(),
                oob: t.oob.clone(),
                tail_identity: t.tail_identity,
            })
            .collect();
        let ys = interp_float(cx, &xs, &g, &tr, R::from_f64(spec.extrapolation));
        out1(R::store(dt, &out_shape, ys)?)
    })
}

/// Shapes of a resize and its first axis that is not the identity.
struct Geometry<'a> {
    in_shape: &'a [usize],
    out_shape: &'a [usize],
    k0: usize,
}

/// Element types a nearest-neighbour gather can fill with the extrapolation value.
trait FromF64Lossy: Copy + Send + Sync + Elem {
    fn from_f64_lossy(v: f64) -> Self;
}
macro_rules! lossy_as {
    ($($t:ty),*) => {$(
        impl FromF64Lossy for $t {
            #[inline]
            fn from_f64_lossy(v: f64) -> Self { v as $t }
        }
    )*};
}
lossy_as!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);
impl FromF64Lossy for f16 {
    fn from_f64_lossy(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl FromF64Lossy for bf16 {
    fn from_f64_lossy(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

fn gather_typed<T: FromF64Lossy>(
    cx: &KernelCx<'_>,
    x: &Tensor,
    g: &Geometry<'_>,
    tabs: &[AxisTab<f64>],
    extrap: f64,
) -> Result<Tensor> {
    let xs = x.as_slice::<T>()?;
    let ys = run_planes(cx, &xs, g, 1, &|src, d, o, scratch: &mut Vec<Vec<T>>| {
        let _ = scratch;
        gather_row(
            src,
            d,
            o,
            &tabs[g.k0..],
            &g.in_shape[g.k0..],
            T::from_f64_lossy(extrap),
        );
    });
    Tensor::from_vec(g.out_shape, ys)
}

/// Splits a resize into independent output rows of axis `k0` (over the leading identity axes
/// too) and runs `row(plane_input, row_output, o, scratch)` for each, possibly in parallel.
fn run_planes<T: Copy + Send + Sync>(
    cx: &KernelCx<'_>,
    xs: &[T],
    g: &Geometry<'_>,
    cost: usize,
    row: &(dyn Fn(&[T], &mut [T], usize, &mut Vec<Vec<T>>) + Sync),
) -> Vec<T> {
    let k0 = g.k0;
    let in_block = prod(&g.in_shape[k0..]);
    let rows_out = g.out_shape[k0];
    let sub_out = prod(&g.out_shape[k0 + 1..]);
    let total = prod(g.out_shape);
    let Some(&fill) = xs.first() else {
        return Vec::new();
    };
    let mut ys = vec![fill; total];
    par_out(cx, &mut ys, sub_out, total * cost, &|first, run| {
        let mut scratch = Vec::new();
        for (k, d) in run.chunks_mut(sub_out).enumerate() {
            let u = first + k;
            let (p, o) = (u / rows_out, u % rows_out);
            row(&xs[p * in_block..][..in_block], d, o, &mut scratch);
        }
    });
    ys
}

/// Output row `o` of the first axis of `tabs` (nearest gather): `d` gets the resized
/// sub-block of `src` (dims `in_dims`).
fn gather_row<T: Copy>(
    src: &[T],
    d: &mut [T],
    o: usize,
    tabs: &[AxisTab<f64>],
    in_dims: &[usize],
    extrap: T,
) {
    let t = &tabs[0];
    if t.oob[o] {
        d.fill(extrap);
        return;
    }
    let sub_in = prod(&in_dims[1..]);
    let s = &src[t.idx[o] * sub_in..][..sub_in];
    if tabs.len() == 1 {
        d[0] = s[0];
    } else {
        gather_level(s, d, &tabs[1..], &in_dims[1..], extrap);
    }
}

fn gather_level<T: Copy>(
    src: &[T],
    dst: &mut [T],
    tabs: &[AxisTab<f64>],
    in_dims: &[usize],
    extrap: T,
) {
    let t = &tabs[0];
    if t.tail_identity {
        dst.copy_from_slice(src);
        return;
    }
    if tabs.len() == 1 {
        for ((o, &i), &b) in dst.iter_mut().zip(&t.idx).zip(&t.oob) {
            *o = if b { extrap } else { src[i] };
        }
        return;
    }
    let sub_out = dst.len() / t.oob.len();
    for (o, d) in dst.chunks_mut(sub_out).enumerate() {
        gather_row(src, d, o, tabs, in_dims, extrap);
    }
}

fn interp_float<R: Real>(
    cx: &KernelCx<'_>,
    xs: &[R],
    g: &Geometry<'_>,
    tabs: &[AxisTab<R>],
    extrap: R,
) -> Vec<R> {
    let k0 = g.k0;
    let in_dims = &g.in_shape[k0..];
    let taps: usize = tabs[k0..].iter().map(|t| t.taps).product();
    run_planes(
        cx,
        xs,
        g,
        taps.min(64),
        &|src, d, o, scratch: &mut Vec<Vec<R>>| {
            if scratch.is_empty() {
                // One blend buffer per resized level: level j holds a sub-block of dims in_dims[j+1..].
                *scratch = (1..in_dims.len())
                    .map(|j| vec![R::ZERO; prod(&in_dims[j..])])
                    .collect();
            }
            interp_row(src, d, o, &tabs[k0..], in_dims, extrap, scratch);
        },
    )
}

/// Output row `o` of the first axis of `tabs` (weighted taps): blends the source sub-blocks
/// of the taps, then resizes the blend along the remaining axes.
fn interp_row<R: Real>(
    src: &[R],
    d: &mut [R],
    o: usize,
    tabs: &[AxisTab<R>],
    in_dims: &[usize],
    extrap: R,
    scratch: &mut [Vec<R>],
) {
    let t = &tabs[0];
    if t.oob[o] {
        d.fill(extrap);
        return;
    }
    let idx = &t.idx[o * t.taps..][..t.taps];
    let w = &t.w[o * t.taps..][..t.taps];
    if tabs.len() == 1 {
        let mut acc = R::ZERO;
        for (&i, &wv) in idx.iter().zip(w) {
            acc += wv * src[i];
        }
        d[0] = acc;
        return;
    }
    let sub_in = prod(&in_dims[1..]);
    let (buf, rest) = scratch
        .split_first_mut()
        .expect("one scratch buffer per level");
    if t.taps == 1 {
        interp_level(
            &src[idx[0] * sub_in..][..sub_in],
            d,
            &tabs[1..],
            &in_dims[1..],
            extrap,
            rest,
        );
        return;
    }
    let mut started = false;
    for (&i, &wv) in idx.iter().zip(w) {
        if wv == R::ZERO {
            continue;
        }
        let s = &src[i * sub_in..][..sub_in];
        if started {
            for (b, &v) in buf.iter_mut().zip(s) {
                *b += wv * v;
            }
        } else {
            for (b, &v) in buf.iter_mut().zip(s) {
                *b = wv * v;
            }
            started = true;
        }
    }
    if !started {
        buf.fill(R::ZERO);
    }
    interp_level(buf, d, &tabs[1..], &in_dims[1..], extrap, rest);
}

/// Resizes the block `src` (dims `in_dims`) into `dst` along every axis of `tabs`.
fn interp_level<R: Real>(
    src: &[R],
    dst: &mut [R],
    tabs: &[AxisTab<R>],
    in_dims: &[usize],
    extrap: R,
    scratch: &mut [Vec<R>],
) {
    let t = &tabs[0];
    if t.tail_identity {
        dst.copy_from_slice(src);
        return;
    }
    if tabs.len() == 1 {
        match t.taps {
            1 => {
                for ((o, &i), &b) in dst.iter_mut().zip(&t.idx).zip(&t.oob) {
                    *o = if b { extrap } else { src[i] };
                }
            }
            2 => {
                for (o, out) in dst.iter_mut().enumerate() {
                    *out = if t.oob[o] {
                        extrap
                    } else {
                        t.w[2 * o] * src[t.idx[2 * o]] + t.w[2 * o + 1] * src[t.idx[2 * o + 1]]
                    };
                }
            }
            n => {
                for (o, out) in dst.iter_mut().enumerate() {
                    *out = if t.oob[o] {
                        extrap
                    } else {
                        let mut acc = R::ZERO;
                        for k in o * n..(o + 1) * n {
                            acc += t.w[k] * src[t.idx[k]];
                        }
                        acc
                    };
                }
            }
        }
        return;
    }
    let sub_out = dst.len() / t.oob.len();
    for (o, d) in dst.chunks_mut(sub_out).enumerate() {
        interp_row(src, d, o, tabs, in_dims, extrap, scratch);
    }
}
