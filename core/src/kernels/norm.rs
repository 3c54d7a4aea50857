//! Kernel family: softmax/log-softmax/hardmax, the normalisations (batch, instance, layer, group, RMS, Lp, mean-variance, LRN) and Resize/Upsample.

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::mem::MaybeUninit;
use core::ops::{AddAssign, MulAssign, Neg, SubAssign};
use core::sync::atomic::{AtomicU32, Ordering};

use half::{bf16, f16};

use super::{bad_type, def, norm_axis, opt_tensor_in, out1, tensor_in, Float, LATEST};
use crate::arena::OutBuf;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::Node;
use crate::kernels::par::SyncPtr;
use crate::kernels::types::{FLOATS, NUMERIC};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::{Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("Softmax", 1, LATEST, build_softmax).types(FLOATS),
    def("LogSoftmax", 1, LATEST, build_log_softmax).types(FLOATS),
    def("Hardmax", 1, LATEST, build_hardmax).types(FLOATS),
    def("BatchNormalization", 1, LATEST, build_batch_norm).types(FLOATS),
    def("InstanceNormalization", 1, LATEST, build_instance_norm).types(FLOATS),
    // Opset 17 made it standard; earlier "opsets" cover the identical ai.onnx-domain contrib form
    // that fusion tools emit.
    def("LayerNormalization", 1, LATEST, build_layer_norm).types(FLOATS),
    def("GroupNormalization", 18, LATEST, build_group_norm).types(FLOATS),
    def("RMSNormalization", 23, LATEST, build_rms_norm).types(FLOATS),
    def("LpNormalization", 1, LATEST, build_lp_norm).types(FLOATS),
    def("MeanVarianceNormalization", 9, LATEST, build_mvn).types(FLOATS),
    def("LRN", 1, LATEST, build_lrn).types(FLOATS),
    // nearest copies any numeric type; linear and cubic interpolate floats only (the kernel
    // checks, as it does the scales, sizes and roi inputs)
    def("Resize", 10, LATEST, build_resize).types(NUMERIC),
    def("Upsample", 7, 9, build_upsample).types(NUMERIC),
];

// ----------------------------------------------------------------------------- shared helpers

/// A float type kernels compute in: f32 (for f32, f16 and bf16 tensors) or f64.
trait Real: Float + AddAssign + SubAssign + MulAssign + Neg<Output = Self> + Elem {
    const ZERO: Self;
    const ONE: Self;
    /// e^self for self <= 0 (or NaN), the softmax case.
    fn exp_nonpos(self) -> Self;
    fn fln(self) -> Self;
    fn fpow(self, e: Self) -> Self;
    /// The elements of a float tensor in this type (borrowed when no conversion is needed).
    fn load(t: &Tensor) -> Result<Cow<'_, [Self]>>;
    /// A tensor of element type `dt` (any float type) from values in this type.
    fn store(dt: DataType, shape: &[usize], v: Vec<Self>) -> Result<Tensor>;
    /// Softmax of one contiguous row through the SIMD layer; `false` where this type has no
    /// fast path (the caller then runs the generic loop).
    fn softmax_row_simd(_x: &[Self], _y: &mut [Self]) -> bool {
        false
    }
    /// `y = (x - mean) * inv_std * scale (+ bias)` over one row through the SIMD layer;
    /// `false` where this type has no fast path.
    fn normalize_row_simd(
        _x: &[Self],
        _mean: Self,
        _inv_std: Self,
        _scale: &[Self],
        _bias: Option<&[Self]>,
        _y: &mut [Self],
    ) -> bool {
        false
    }
    /// Mean and variance of a row through the SIMD layer, where the type has one.
    fn moments_simd(_x: &[Self]) -> Option<(f64, f64)> {
        None
    }
}

impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    fn softmax_row_simd(x: &[f32], y: &mut [f32]) -> bool {
        crate::simd::softmax_row(x, y);
        true
    }
    fn normalize_row_simd(
        x: &[f32],
        mean: f32,
        inv_std: f32,
        scale: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> bool {
        crate::simd::normalize_row(x, mean, inv_std, scale, bias, y);
        true
    }
    fn moments_simd(x: &[f32]) -> Option<(f64, f64)> {
        Some(crate::simd::moments(x))
    }
    #[inline(always)]
    fn exp_nonpos(self) -> f32 {
        exp_nonpos_f32(self)
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
    fn exp_nonpos(self) -> f64 {
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

/// e^x for x <= 0 (or NaN), written to vectorise: x = k ln2 + r with |r| <= ln2/2, e^r from its
/// Taylor polynomial to degree 7 (truncation error < 1e-8, below f32 epsilon), times 2^k built
/// in the exponent bits. Results below f32's normal range flush to 0; NaN stays NaN.
#[inline(always)]
fn exp_nonpos_f32(x: f32) -> f32 {
    const LO: f32 = -87.3365; // just above ln(f32::MIN_POSITIVE)
                              // 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer.
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_145_75; // few mantissa bits: k * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    let xc = if x < LO { LO } else { x };
    let t = xc * core::f32::consts::LOG2_E + MAGIC;
    let kf = t - MAGIC;
    let k = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = xc - kf * LN2_HI - kf * LN2_LO;
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let scale = f32::from_bits((k.wrapping_add(127) as u32) << 23);
    // Flush by masking bits rather than branching, so the loop stays vectorised.
    let under = ((x < LO) as u32).wrapping_neg();
    f32::from_bits((p * scale).to_bits() & !under)
}

/// Writes e^(x - m) to `y` and returns the sum (8 independent accumulators, so it vectorises).
fn exp_sum<R: Real>(x: &[R], m: R, y: &mut [R]) -> R {
    let mut acc = [R::ZERO; 8];
    let mut yc = y.chunks_exact_mut(8);
    let mut xc = x.chunks_exact(8);
    for (yo, xi) in (&mut yc).zip(&mut xc) {
        for k in 0..8 {
            let e = (xi[k] - m).exp_nonpos();
            yo[k] = e;
            acc[k] += e;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (o, &v) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        let e = (v - m).exp_nonpos();
        *o = e;
        s += e;
    }
    s
}

/// Maximum (NaNs are skipped; a NaN still poisons a softmax row through its exponential).
fn max_lanes<R: Real>(v: &[R]) -> R {
    let mut acc = [v[0]; 8];
    let mut ch = v.chunks_exact(8);
    for c in &mut ch {
        for k in 0..8 {
            if c[k] > acc[k] {
                acc[k] = c[k];
            }
        }
    }
    let mut m = acc[0];
    for &x in acc[1..].iter().chain(ch.remainder()) {
        if x > m {
            m = x;
        }
    }
    m
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

/// Output 0's memory for a result of element type `dt` computed in `R` (planned arena memory
/// when `R` is `dt` itself; contents unspecified, every element must be written).
fn out_for<R: Real>(cx: &KernelCx<'_>, dt: DataType, shape: &[usize]) -> Result<OutBuf<R>> {
    if R::DT == dt {
        cx.output::<R>(0, shape)
    } else {
        OutBuf::heap(shape)
    }
}

/// Finishes a result computed in `R` as a tensor of element type `dt`.
fn store_out<R: Real>(dt: DataType, shape: &[usize], ys: OutBuf<R>) -> Result<Tensor> {
    if R::DT == dt {
        Ok(ys.into_tensor())
    } else {
        R::store(dt, shape, ys.into_vec())
    }
}

/// Work (in element operations) below which a kernel stays on the calling thread.
const PAR_MIN: usize = 1 << 15;

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

/// Mean and population variance of a slice (two passes): f32 rows through the SIMD layer
/// (f32 lanes within blocks, f64 across), other types accumulated in f64.
fn mean_var<R: Real>(xs: &[R]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    if let Some(m) = R::moments_simd(xs) {
        return m;
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
                let mut ys = out_for::<R>(cx, x.dtype(), x.shape())?;
                soft_apply(cx, &xs, &mut ys, n, inner, kind);
                out1(store_out(x.dtype(), x.shape(), ys)?)
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
                if kind == SoftKind::Softmax && R::softmax_row_simd(x, y) {
                    continue;
                }
                soft_row(x, y, kind);
            } else {
                soft_cols(x, y, n, inner, kind);
            }
        }
    });
}

/// Softmax-style normalisation of one contiguous row.
fn soft_row<R: Real>(x: &[R], y: &mut [R], kind: SoftKind) {
    if kind == SoftKind::Hardmax {
        let mut m = x[0];
        let mut arg = 0;
        for (i, &v) in x.iter().enumerate().skip(1) {
            if v > m {
                m = v;
                arg = i;
            }
        }
        y.fill(R::ZERO);
        y[arg] = R::ONE;
        return;
    }
    let m = max_lanes(x);
    let s = exp_sum(x, m, y);
    if kind == SoftKind::Softmax {
        let inv = R::ONE / s;
        for o in y.iter_mut() {
            *o *= inv;
        }
    } else {
        let ls = s.fln();
        for (o, &v) in y.iter_mut().zip(x) {
            *o = (v - m) - ls;
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
                    let e = (xr[j] - m[j]).exp_nonpos();
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
                    s[j] += (xr[j] - m[j]).exp_nonpos();
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
                let mut ys = out_for::<R>(cx, x.dtype(), shape)?;
                // Work in (n, c) planes, or whole batch items when planes are tiny.
                let unit = if inner >= 64 { inner } else { ch * inner };
                par_out(cx, &mut ys, unit, xs.len(), &|first, run| {
                    for (k, y) in run.chunks_mut(unit).enumerate() {
                        let i = first + k;
                        let xb = &xs[i * unit..][..unit];
                        if inner == 1 {
                            for c in 0..ch {
                                y[c] = (xb[c] - m[c]) * a[c] + bs[c];
                            }
                            continue;
                        }
                        for (j, (yr, xr)) in y.chunks_mut(inner).zip(xb.chunks(inner)).enumerate() {
                            let c = if unit == inner { i % ch } else { j };
                            let (mc, ac, bc) = (m[c], a[c], bs[c]);
                            for (o, &v) in yr.iter_mut().zip(xr) {
                                *o = (v - mc) * ac + bc;
                            }
                        }
                    }
                });
                let mut outs = vec![Value::Tensor(store_out(x.dtype(), shape, ys)?)];
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
                let mut ys = out_for::<R>(cx, x.dtype(), shape)?;
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
                        if R::normalize_row_simd(xr, m, iv, &sc, bs.as_deref(), y) {
                            continue;
                        }
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
                Ok(vec![Value::Tensor(store_out(x.dtype(), shape, ys)?)])
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
/// Resize's interpolation mode (shared with the WebGPU provider).
pub enum Interp {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
/// Resize's coordinate_transformation_mode.
pub enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
    TfHalfPixelForNn,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
/// Resize's nearest_mode.
pub enum Rounding {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Upsample and Resize-10: floor when enlarging, ceil when shrinking (what onnxruntime does).
    Legacy,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
/// Resize's keep_aspect_ratio_policy.
pub enum Policy {
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
/// Resize's per-axis scales and output sizes from `scales` or `sizes`.
pub fn resize_geometry(
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
pub fn src_coord(
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

/// The input index nearest-mode resizing picks for source coordinate `x`.
pub fn nearest_index(x: f64, rounding: Rounding, scale: f64) -> i64 {
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

/// Resize's cubic convolution weight at distance `d` with coefficient `a`.
pub fn cubic_kernel(d: f64, a: f64) -> f64 {
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
    // An error, not an overflow or an absurd allocation attempt, for huge scales.
    crate::tensor::numel(&out_shape)?;
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
    let k0 = g.k0;
    let (tabs, in_dims) = (&tabs[k0..], &g.in_shape[k0..]);
    let in_block = prod(in_dims);
    let rows_out = g.out_shape[k0];
    let sub_out = prod(&g.out_shape[k0 + 1..]);
    let total = prod(g.out_shape);
    if xs.is_empty() {
        return Tensor::from_vec(g.out_shape, Vec::<T>::new());
    }
    // every output element is written below (by a gather or a copy of a row before it), so
    // the result is built in the vector's spare capacity without a fill first; the input is
    // read as initialized `MaybeUninit` values of the same layout
    let xs: &[MaybeUninit<T>] =
        // SAFETY: MaybeUninit<T> has T's size and alignment, and every T is a valid one
        unsafe { core::slice::from_raw_parts(xs.as_ptr().cast(), xs.len()) };
    let extrap = MaybeUninit::new(T::from_f64_lossy(extrap));
    let rep = tabs
        .last()
        .and_then(|t| repeat_factor(t, in_dims[in_dims.len() - 1]));
    let mut ys: Vec<T> = Vec::with_capacity(total);
    par_out(
        cx,
        &mut ys.spare_capacity_mut()[..total],
        sub_out,
        total,
        &|first, run| {
            let mut prev: Option<(usize, usize)> = None;
            let mut at = 0;
            while at < run.len() {
                let u = first + at / sub_out;
                let (p, o) = (u / rows_out, u % rows_out);
                let (done, d) = run.split_at_mut(at);
                let d = &mut d[..sub_out];
                match prev {
                    // an output row that repeats the one before it (upsampling) is a copy of it
                    Some((pp, po)) if pp == p && same_source(&tabs[0], po, o) => {
                        d.copy_from_slice(&done[at - sub_out..]);
                    }
                    _ => gather_row(
                        &xs[p * in_block..][..in_block],
                        d,
                        o,
                        tabs,
                        in_dims,
                        extrap,
                        rep,
                    ),
                }
                prev = Some((p, o));
                at += sub_out;
            }
        },
    );
    // SAFETY: par_out hands out every unit of 0..total once, and each unit's row is written
    // whole (gather_row writes every element of its row; a copied row is a written one)
    unsafe { ys.set_len(total) };
    Tensor::from_vec(g.out_shape, ys)
}

/// `r` where a nearest table repeats each of its axis's `n_in` input positions `r` times in
/// order (an upsampling by a whole factor: output `o` reads input `o / r`).
fn repeat_factor(t: &AxisTab<f64>, n_in: usize) -> Option<usize> {
    let n_out = t.idx.len();
    if t.taps != 1 || n_in == 0 || !n_out.is_multiple_of(n_in) {
        return None;
    }
    let r = n_out / n_in;
    (r > 1 && !t.oob.contains(&true) && t.idx.iter().enumerate().all(|(o, &i)| i == o / r))
        .then_some(r)
}

/// Whether output positions `a` and `b` of an axis read the same input position (neither
/// outside the input).
fn same_source(t: &AxisTab<f64>, a: usize, b: usize) -> bool {
    !t.oob[a] && !t.oob[b] && t.idx[a] == t.idx[b]
}

/// Computes one output row of a resize: (plane input, row output, row index, scratch).
type RowFn<'a, T> = dyn Fn(&[T], &mut [T], usize, &mut Vec<Vec<T>>) + Sync + 'a;

/// Splits a resize into independent output rows of axis `k0` (over the leading identity axes
/// too) and runs `row(plane_input, row_output, o, scratch)` for each, possibly in parallel.
fn run_planes<T: Copy + Send + Sync>(
    cx: &KernelCx<'_>,
    xs: &[T],
    g: &Geometry<'_>,
    cost: usize,
    row: &RowFn<'_, T>,
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
#[allow(clippy::too_many_arguments)]
fn gather_row<T: Copy>(
    src: &[T],
    d: &mut [T],
    o: usize,
    tabs: &[AxisTab<f64>],
    in_dims: &[usize],
    extrap: T,
    rep: Option<usize>,
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
        gather_level(s, d, &tabs[1..], &in_dims[1..], extrap, rep);
    }
}

/// `rep`: the last axis's [`repeat_factor`], if it has one.
fn gather_level<T: Copy>(
    src: &[T],
    dst: &mut [T],
    tabs: &[AxisTab<f64>],
    in_dims: &[usize],
    extrap: T,
    rep: Option<usize>,
) {
    let t = &tabs[0];
    if t.tail_identity {
        dst.copy_from_slice(src);
        return;
    }
    if tabs.len() == 1 {
        match rep {
            // each input value `r` times: whole-factor upsampling, without an index per value
            Some(2) => {
                for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
                    d[0] = v;
                    d[1] = v;
                }
            }
            Some(r) => {
                for (d, &v) in dst.chunks_exact_mut(r).zip(src) {
                    d.fill(v);
                }
            }
            None if t.oob.contains(&true) => {
                for ((o, &i), &b) in dst.iter_mut().zip(&t.idx).zip(&t.oob) {
                    *o = if b { extrap } else { src[i] };
                }
            }
            None => {
                for (o, &i) in dst.iter_mut().zip(&t.idx) {
                    *o = src[i];
                }
            }
        }
        return;
    }
    let sub_out = dst.len() / t.oob.len();
    for o in 0..t.oob.len() {
        let (done, d) = dst.split_at_mut(o * sub_out);
        let d = &mut d[..sub_out];
        if o > 0 && same_source(t, o - 1, o) {
            d.copy_from_slice(&done[(o - 1) * sub_out..]);
        } else {
            gather_row(src, d, o, tabs, in_dims, extrap, rep);
        }
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
            4 => {
                for (o, out) in dst.iter_mut().enumerate() {
                    let (w, i) = (&t.w[4 * o..4 * o + 4], &t.idx[4 * o..4 * o + 4]);
                    *out = if t.oob[o] {
                        extrap
                    } else {
                        (w[0] * src[i[0]] + w[1] * src[i[1]])
                            + (w[2] * src[i[2]] + w[3] * src[i[3]])
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

#[cfg(test)]
mod tests {
    //! Expected values come from onnxruntime 1.32 (or onnx 1.23's reference implementation where
    //! noted), computed on the same inputs in Python.
    use super::*;
    use crate::ir::AttrValue;
    use crate::kernels::cpu_registry;
    use crate::provider::{reference_sgemm, CpuBackend, Gemm, Lookup, ReferenceCpu};
    use alloc::string::String;

    fn node(
        op: &str,
        opset: i64,
        n_in: usize,
        n_out: usize,
        attrs: Vec<(&str, AttrValue)>,
    ) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            opset,
            inputs: (0..n_in).map(Some).collect(),
            outputs: (0..n_out).map(|i| Some(100 + i)).collect(),
            attrs: attrs.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            implicit_inputs: Vec::new(),
        }
    }

    fn build(n: &Node) -> Result<Box<dyn Kernel>> {
        match cpu_registry().lookup(n, &[]) {
            Lookup::Found(d) => (d.build)(n),
            _ => panic!("no kernel registered for {} opset {}", n.op_type, n.opset),
        }
    }

    fn run_on(cpu: &dyn CpuBackend, n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
        let k = build(n)?;
        let vals: Vec<Option<Value>> = ins.iter().map(|t| t.clone().map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = k.compute(&KernelCx::new(cpu), &refs)?;
        Ok(out.into_iter().map(|v| v.into_tensor().unwrap()).collect())
    }

    fn run(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
        run_on(&ReferenceCpu, n, ins)
    }

    fn t(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    fn ti(v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
    }

    /// The test input pattern ((i * 7) % 11) / 4 - 1, exact in f32.
    fn xs(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7) % 11) as f32 / 4.0 - 1.0).collect()
    }

    fn s(v: &str) -> AttrValue {
        AttrValue::String(v.as_bytes().to_vec())
    }

    #[track_caller]
    fn close(got: &Tensor, shape: &[usize], want: &[f32], tol: f32) {
        assert_eq!(got.shape(), shape);
        let g = got.to_f32_vec().unwrap();
        assert_eq!(g.len(), want.len());
        for (k, (a, b)) in g.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "element {k}: got {a}, want {b}\n got {g:?}\nwant {want:?}"
            );
        }
    }

    fn is_unsupported<T>(r: Result<T>) -> bool {
        matches!(r, Err(Error::Unsupported { .. }))
    }

    // ------------------------------------------------------------------ resize

    #[test]
    fn resize_half_pixel_linear_2x() {
        let n = node("Resize", 19, 3, 1, vec![("mode", s("linear"))]);
        let y = run(
            &n,
            &[
                t(&[1, 1, 2, 2], &[1., 2., 3., 4.]),
                None,
                t(&[4], &[1., 1., 2., 2.]),
            ],
        );
        #[rustfmt::skip]
        let want = [1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0];
        close(&y.unwrap()[0], &[1, 1, 4, 4], &want, 1e-6);
    }

    /// A Resize (opset 19): nearest, asymmetric coordinates, rounded down.
    fn nearest_asymmetric_floor() -> Node {
        node(
            "Resize",
            19,
            4,
            1,
            vec![
                ("mode", s("nearest")),
                ("coordinate_transformation_mode", s("asymmetric")),
                ("nearest_mode", s("floor")),
            ],
        )
    }

    #[test]
    fn resize_asymmetric_nearest_floor_sizes() {
        let n = nearest_asymmetric_floor();
        let x: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        let y = run(&n, &[t(&[1, 1, 2, 4], &x), None, None, ti(&[1, 1, 3, 7])]).unwrap();
        #[rustfmt::skip]
        let want = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 7.0, 8.0];
        close(&y[0], &[1, 1, 3, 7], &want, 0.0);
    }

    #[test]
    fn resize_align_corners_linear() {
        let n = node(
            "Resize",
            19,
            4,
            1,
            vec![
                ("mode", s("linear")),
                ("coordinate_transformation_mode", s("align_corners")),
            ],
        );
        let y = run(
            &n,
            &[
                t(&[1, 1, 2, 2], &[1., 2., 3., 4.]),
                None,
                None,
                ti(&[1, 1, 3, 4]),
            ],
        );
        #[rustfmt::skip]
        let want = [1.0, 1.333333, 1.666667, 2.0, 2.0, 2.333333, 2.666667, 3.0, 3.0, 3.333333, 3.666667, 4.0];
        close(&y.unwrap()[0], &[1, 1, 3, 4], &want, 1e-6);
    }

    fn x44() -> Option<Tensor> {
        let v: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
        t(&[1, 1, 4, 4], &v)
    }

    #[test]
    fn resize_cubic_half_pixel() {
        let n = node("Resize", 19, 3, 1, vec![("mode", s("cubic"))]);
        let y = run(&n, &[x44(), None, t(&[4], &[1., 1., 0.75, 1.5])]).unwrap();
        #[rustfmt::skip]
        let want = [0.208912, 0.4554398, 0.8587971, 1.145834, 1.54919, 1.795718, 2.956599, 3.203125, 3.606483, 3.893519, 4.296875, 4.543403, 5.704286, 5.950811, 6.35417, 6.641206, 7.044561, 7.29109];
        close(&y[0], &[1, 1, 3, 6], &want, 1e-5);
    }

    #[test]
    fn resize_tf_crop_and_resize_extrapolates() {
        let n = node(
            "Resize",
            19,
            4,
            1,
            vec![
                ("mode", s("linear")),
                ("coordinate_transformation_mode", s("tf_crop_and_resize")),
                ("extrapolation_value", AttrValue::Float(9.0)),
            ],
        );
        let roi = t(&[8], &[0., 0., 0.25, -0.2, 1., 1., 0.75, 0.8]);
        let y = run(&n, &[x44(), roi, None, ti(&[1, 1, 3, 3])]).unwrap();
        let want = [9.0, 1.95, 2.7, 9.0, 3.45, 4.2, 9.0, 4.95, 5.7];
        close(&y[0], &[1, 1, 3, 3], &want, 1e-5);
    }

    #[test]
    fn resize_axes_and_keep_aspect_ratio() {
        let x: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        let n = node(
            "Resize",
            19,
            4,
            1,
            vec![
                ("mode", s("nearest")),
                ("axes", AttrValue::Ints(vec![3])),
                ("keep_aspect_ratio_policy", s("not_smaller")),
            ],
        );
        let y = run(&n, &[t(&[1, 1, 2, 4], &x), None, None, ti(&[6])]).unwrap();
        let want = [1.0, 1.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0, 6.0, 7.0, 7.0, 8.0];
        close(&y[0], &[1, 1, 2, 6], &want, 0.0);

        let n = node(
            "Resize",
            19,
            4,
            1,
            vec![
                ("mode", s("linear")),
                ("axes", AttrValue::Ints(vec![2, 3])),
                ("keep_aspect_ratio_policy", s("not_larger")),
            ],
        );
        let y = run(&n, &[t(&[1, 1, 2, 4], &x), None, None, ti(&[6, 6])]).unwrap();
        #[rustfmt::skip]
        let want = [1.0, 1.5, 2.166667, 2.833333, 3.5, 4.0, 3.0, 3.5, 4.166667, 4.833333, 5.5, 6.0, 5.0, 5.5, 6.166666, 6.833333, 7.5, 8.0];
        close(&y[0], &[1, 1, 3, 6], &want, 1e-6);
    }

    #[test]
    fn resize_antialias_linear_downsample() {
        let n = node(
            "Resize",
            19,
            3,
            1,
            vec![("mode", s("linear")), ("antialias", AttrValue::Int(1))],
        );
        let y = run(&n, &[x44(), None, t(&[4], &[1., 1., 0.5, 0.5])]).unwrap();
        close(
            &y[0],
            &[1, 1, 2, 2],
            &[1.5625, 2.4375, 5.0625, 5.9375],
            1e-6,
        );
    }

    #[test]
    fn resize_10_and_upsample_legacy_nearest() {
        let x: Vec<f32> = (0..10).map(|v| v as f32).collect();
        let n = node("Resize", 10, 2, 1, vec![("mode", s("nearest"))]);
        let y = run(&n, &[t(&[1, 1, 1, 10], &x), t(&[4], &[1., 1., 1., 0.6])]).unwrap();
        close(&y[0], &[1, 1, 1, 6], &[0.0, 2.0, 4.0, 5.0, 7.0, 9.0], 0.0);

        let n = node(
            "Upsample",
            7,
            1,
            1,
            vec![
                ("mode", s("nearest")),
                ("scales", AttrValue::Floats(vec![1., 1., 2., 1.5])),
            ],
        );
        let y = run(&n, &[t(&[1, 1, 2, 2], &[1., 2., 3., 4.])]).unwrap();
        #[rustfmt::skip]
        let want = [1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0, 3.0, 3.0, 4.0];
        close(&y[0], &[1, 1, 4, 3], &want, 0.0);

        let n = node("Upsample", 9, 2, 1, vec![("mode", s("linear"))]);
        let y = run(
            &n,
            &[
                t(&[1, 1, 2, 2], &[1., 2., 3., 4.]),
                t(&[4], &[1., 1., 2., 2.]),
            ],
        );
        #[rustfmt::skip]
        let want = [1.0, 1.5, 2.0, 2.0, 2.0, 2.5, 3.0, 3.0, 3.0, 3.5, 4.0, 4.0, 3.0, 3.5, 4.0, 4.0];
        close(&y.unwrap()[0], &[1, 1, 4, 4], &want, 1e-6);
    }

    #[test]
    fn resize_nearest_u8() {
        let x: Vec<u8> = (0..8).map(|v| v * 30).collect();
        let x = Tensor::from_vec(&[1, 1, 2, 4], x).unwrap();
        let n = node("Resize", 13, 3, 1, vec![("mode", s("nearest"))]);
        let y = run(&n, &[Some(x), None, t(&[4], &[1., 1., 1.5, 0.5])]).unwrap();
        assert_eq!(y[0].dtype(), DataType::Uint8);
        close(
            &y[0],
            &[1, 1, 3, 2],
            &[0.0, 60.0, 0.0, 60.0, 120.0, 180.0],
            0.0,
        );
    }

    /// Bilinear half_pixel resize written straight from the spec formula, one output at a time.
    fn naive_bilinear(x: &[f32], c: usize, h: usize, w: usize, oh: usize, ow: usize) -> Vec<f32> {
        let mut out = Vec::new();
        let coord = |o: usize, n_in: usize, n_out: usize| -> (usize, usize, f32) {
            let s = n_out as f64 / n_in as f64;
            let v = ((o as f64 + 0.5) / s - 0.5).clamp(0.0, (n_in - 1) as f64);
            let i0 = v as usize;
            (i0, (i0 + 1).min(n_in - 1), (v - i0 as f64) as f32)
        };
        for ch in 0..c {
            for oy in 0..oh {
                let (y0, y1, fy) = coord(oy, h, oh);
                for ox in 0..ow {
                    let (x0, x1, fx) = coord(ox, w, ow);
                    let p = |yy: usize, xx: usize| x[(ch * h + yy) * w + xx];
                    let top = p(y0, x0) * (1.0 - fx) + p(y0, x1) * fx;
                    let bot = p(y1, x0) * (1.0 - fx) + p(y1, x1) * fx;
                    out.push(top * (1.0 - fy) + bot * fy);
                }
            }
        }
        out
    }

    #[test]
    fn resize_bilinear_fast_path_matches_naive() {
        let (c, h, w, oh, ow) = (3, 5, 7, 11, 16);
        let x = xs(c * h * w);
        let n = node("Resize", 13, 4, 1, vec![("mode", s("linear"))]);
        let y = run(
            &n,
            &[
                t(&[1, c, h, w], &x),
                None,
                None,
                ti(&[1, c as i64, oh as i64, ow as i64]),
            ],
        );
        let want = naive_bilinear(&x, c, h, w, oh, ow);
        close(&y.unwrap()[0], &[1, c, oh, ow], &want, 1e-5);
    }

    #[test]
    fn resize_nearest_upsampling_matches_naive() {
        // whole factors (each value repeated, rows copied), one axis only, a fraction
        // (the index gather, rows repeating unevenly) and a downsampling, over two images of
        // three channels (sequential and threaded)
        let n = nearest_asymmetric_floor();
        let (b, c, w) = (2, 3, 7);
        // (an input one row high: every output row of a plane repeats the same input row,
        // and the next plane's first row must not be taken for a repeat of the last)
        for (h, oh, ow) in [
            (5, 10, 14),
            (5, 15, 21),
            (5, 5, 14),
            (5, 10, 7),
            (5, 8, 11),
            (5, 3, 4),
            (1, 3, 14),
        ] {
            let x = xs(b * c * h * w);
            let y = run(
                &n,
                &[
                    t(&[b, c, h, w], &x),
                    None,
                    None,
                    ti(&[b as i64, c as i64, oh as i64, ow as i64]),
                ],
            )
            .unwrap();
            let mut want = Vec::new();
            for p in 0..b * c {
                for i in 0..oh {
                    for j in 0..ow {
                        // asymmetric, floor: input (i * h / oh, j * w / ow), rounded down
                        want.push(x[(p * h + i * h / oh) * w + j * w / ow]);
                    }
                }
            }
            close(&y[0], &[b, c, oh, ow], &want, 0.0);
        }
    }

    #[test]
    fn resize_errors() {
        let n = node("Resize", 13, 3, 1, vec![("mode", s("bicubic"))]);
        assert!(is_unsupported(build(&n)));
        let n = node(
            "Resize",
            13,
            3,
            1,
            vec![("coordinate_transformation_mode", s("foo"))],
        );
        assert!(is_unsupported(build(&n)));
        // linear interpolation of integers is not implemented: an error, not a guess
        let n = node("Resize", 13, 3, 1, vec![("mode", s("linear"))]);
        let x = Tensor::from_vec(&[1, 1, 2, 2], vec![1i32, 2, 3, 4]).unwrap();
        assert!(is_unsupported(run(
            &n,
            &[Some(x), None, t(&[4], &[1., 1., 1.5, 1.5])]
        )));
        // an output whose element count overflows
        let n = node("Resize", 13, 3, 1, vec![]);
        let r = run(&n, &[x44(), None, t(&[4], &[1e30, 1e30, 1e30, 1e30])]);
        assert!(r.is_err());
        // scales and sizes together
        let n = node("Resize", 13, 4, 1, vec![]);
        let r = run(
            &n,
            &[x44(), None, t(&[4], &[1., 1., 2., 2.]), ti(&[1, 1, 8, 8])],
        );
        assert!(r.is_err());
    }

    // ------------------------------------------------------------------ softmax family

    #[test]
    fn softmax_opset_11_vs_13_axis_semantics() {
        let x = t(&[2, 3, 4], &xs(24));
        let n11 = node("Softmax", 11, 1, 1, vec![("axis", AttrValue::Int(1))]);
        let n13 = node("Softmax", 13, 1, 1, vec![("axis", AttrValue::Int(1))]);
        #[rustfmt::skip]
        let want11 = [0.01902807, 0.109499, 0.04028241, 0.2318093, 0.08527787, 0.03137197, 0.1805333, 0.06641448, 0.02443252, 0.1405994, 0.05172364, 0.01902807, 0.1004144, 0.03694039, 0.2125773, 0.07820281, 0.0287692, 0.1655553, 0.06090441, 0.02240548, 0.1289346, 0.0474324, 0.0174494, 0.1004144];
        #[rustfmt::skip]
        let want13 = [0.1478041, 0.3890248, 0.1478041, 0.7306792, 0.6624118, 0.1114575, 0.6624118, 0.2093431, 0.1897842, 0.4995177, 0.1897842, 0.0599778, 0.3890248, 0.1478041, 0.7306792, 0.3890248, 0.1114575, 0.6624118, 0.2093431, 0.1114575, 0.4995177, 0.1897842, 0.0599778, 0.4995177];
        close(
            &run(&n11, core::slice::from_ref(&x)).unwrap()[0],
            &[2, 3, 4],
            &want11,
            1e-6,
        );
        close(&run(&n13, &[x]).unwrap()[0], &[2, 3, 4], &want13, 1e-6);
    }

    #[test]
    fn log_softmax_and_hardmax() {
        let x = t(&[2, 3, 4], &xs(24));
        let n = node("LogSoftmax", 13, 1, 1, vec![("axis", AttrValue::Int(0))]);
        #[rustfmt::skip]
        let want = [-1.910224, -0.3132617, -1.910224, -0.3132617, -0.3132617, -1.910224, -0.3132617, -0.3132617, -1.910224, -0.3132617, -0.3132617, -1.910224, -0.1602242, -1.313262, -0.1602242, -1.313262, -1.313262, -0.1602242, -1.313262, -1.313262, -0.1602242, -1.313262, -1.313262, -0.1602242];
        close(
            &run(&n, core::slice::from_ref(&x)).unwrap()[0],
            &[2, 3, 4],
            &want,
            1e-6,
        );
        let n = node("LogSoftmax", 11, 1, 1, vec![]);
        #[rustfmt::skip]
        let want = [-3.96184, -2.21184, -3.21184, -1.46184, -2.46184, -3.46184, -1.71184, -2.71184, -3.71184, -1.96184, -2.96184, -3.96184, -2.29845, -3.29845, -1.54845, -2.54845, -3.54845, -1.79845, -2.79845, -3.79845, -2.04845, -3.04845, -4.04845, -2.29845];
        close(
            &run(&n, core::slice::from_ref(&x)).unwrap()[0],
            &[2, 3, 4],
            &want,
            1e-6,
        );

        let n = node("Hardmax", 11, 1, 1, vec![]);
        let mut want = [0f32; 24];
        want[3] = 1.0;
        want[14] = 1.0;
        close(
            &run(&n, core::slice::from_ref(&x)).unwrap()[0],
            &[2, 3, 4],
            &want,
            0.0,
        );
        let n = node("Hardmax", 13, 1, 1, vec![("axis", AttrValue::Int(1))]);
        #[rustfmt::skip]
        let want = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0];
        close(&run(&n, &[x]).unwrap()[0], &[2, 3, 4], &want, 0.0);
    }

    #[test]
    fn fast_exp_accuracy() {
        let mut worst = 0f64;
        let mut x = 0f32;
        while x > -90.0 {
            let want = libm::exp(x as f64);
            let got = exp_nonpos_f32(x) as f64;
            if want > 1.2e-38 {
                worst = worst.max((got - want).abs() / want);
            } else {
                assert!(
                    got == 0.0 || (got - want).abs() < 1e-37,
                    "{x}: {got} vs {want}"
                );
            }
            x -= 0.000_731;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos_f32(0.0), 1.0);
        assert_eq!(exp_nonpos_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpos_f32(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_f16_f64_and_large_values() {
        let n = node("Softmax", 13, 1, 1, vec![]);
        let x16: Vec<f16> = [1.0f32, 2.0, 3.0]
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect();
        let y = run(&n, &[Some(Tensor::from_vec(&[1, 3], x16).unwrap())]).unwrap();
        assert_eq!(y[0].dtype(), DataType::Float16);
        close(&y[0], &[1, 3], &[0.09003057, 0.24472848, 0.66524094], 1e-3);
        let y = run(
            &n,
            &[Some(
                Tensor::from_vec(&[3], vec![1000.0f64, 1001.0, 1002.0]).unwrap(),
            )],
        );
        let y = y.unwrap();
        assert_eq!(y[0].dtype(), DataType::Double);
        close(&y[0], &[3], &[0.09003057, 0.24472848, 0.66524094], 1e-6);
        let ni = node("Softmax", 13, 1, 1, vec![]);
        let xi = Tensor::from_vec(&[2], vec![1i32, 2]).unwrap();
        assert!(is_unsupported(run(&ni, &[Some(xi)])));
    }

    // ------------------------------------------------------------------ layer / rms norm

    #[test]
    fn layer_norm_axis_minus_1_with_stats() {
        let n = node(
            "LayerNormalization",
            17,
            3,
            3,
            vec![("axis", AttrValue::Int(-1))],
        );
        let y = run(
            &n,
            &[
                t(&[2, 3, 4], &xs(24)),
                t(&[4], &[1., 0.5, -1., 2.]),
                t(&[4], &[0.1, 0.2, 0.3, 0.4]),
            ],
        )
        .unwrap();
        #[rustfmt::skip]
        let want = [-1.213057, 0.4626114, 0.8252228, 3.026114, 0.2999974, -0.499991, -1.099982, 5.155802e-06, -0.6228914, 0.963052, 0.0590362, -1.688353, 0.2999974, -0.499991, -1.099982, 5.155802e-06, -0.6228914, 0.963052, 0.05903621, -1.688353, 1.144176, 0.0795181, 1.826104, 1.845783];
        close(&y[0], &[2, 3, 4], &want, 1e-5);
        close(
            &y[1],
            &[2, 3, 1],
            &[0.25, 0.375, -0.1875, 0.625, 0.0625, 0.1875],
            1e-6,
        );
        let want = [1.050446, 1.599979, 1.28514, 1.599979, 1.28514, 1.28514];
        close(&y[2], &[2, 3, 1], &want, 1e-5);
    }

    #[test]
    fn layer_norm_axis_1_no_bias() {
        let n = node(
            "LayerNormalization",
            17,
            2,
            3,
            vec![
                ("axis", AttrValue::Int(1)),
                ("epsilon", AttrValue::Float(0.1)),
            ],
        );
        let mut sc = xs(12);
        sc.reverse();
        let y = run(&n, &[t(&[2, 3, 4], &xs(24)), t(&[3, 4], &sc)]).unwrap();
        #[rustfmt::skip]
        let want = [1.287312, 0.0, -0.4447076, -1.141026, 0.09947407, -0.9069694, -0.62025, 0.05851416, -1.509665, -0.2399081, -0.1228797, 1.287312, -0.5509651, -0.0, 1.452544, -0.187829, -0.2379167, 1.440022, 0.02504386, -0.6260966, 1.277237, 0.08765353, -1.16454, -0.5509651];
        close(&y[0], &[2, 3, 4], &want, 1e-5);
        close(&y[1], &[2, 1, 1], &[0.1458333, 0.2916667], 1e-6);
        close(&y[2], &[2, 1, 1], &[1.123472, 1.202106], 1e-5);
        let n = node(
            "LayerNormalization",
            17,
            2,
            1,
            vec![("stash_type", AttrValue::Int(16))],
        );
        assert!(is_unsupported(build(&n)));
    }

    #[test]
    fn rms_norm() {
        let n = node("RMSNormalization", 23, 2, 1, vec![]);
        let y = run(&n, &[t(&[2, 3, 4], &xs(24)), t(&[4], &[1., 0.5, -1., 2.])]).unwrap();
        #[rustfmt::skip]
        let want = [-1.015996, 0.3809984, 0.2539989, 3.047987, 0.6859878, -0.3429939, -1.71497, 0.6859878, -0.9370352, 0.6246902, -0.0, -2.498761, 0.8485227, -0.1414205, -1.697045, 1.131364, -0.6405073, 0.8006341, -0.3202537, -1.921522, 1.24938, 0.0, 1.24938, 1.87407];
        close(&y[0], &[2, 3, 4], &want, 1e-5);
    }

    // ------------------------------------------------------------------ batch / instance / group

    fn bn_inputs() -> Vec<Option<Tensor>> {
        let x: Vec<f32> = xs(12).iter().map(|v| v * 3.0).collect();
        vec![
            t(&[2, 3, 1, 2], &x),
            t(&[3], &[1., 2., 0.5]),
            t(&[3], &[0., 1., -1.]),
            t(&[3], &[0.1, -0.2, 0.3]),
            t(&[3], &[1., 0.5, 2.]),
        ]
    }

    #[test]
    fn batch_norm_inference_and_training() {
        let n = node(
            "BatchNormalization",
            15,
            5,
            1,
            vec![("epsilon", AttrValue::Float(1e-3))],
        );
        #[rustfmt::skip]
        let want = [-3.098451, 2.148926, -0.5540814, 14.28033, -0.575842, -1.636237, 3.648176, 0.6496753, -4.792486, 10.04193, -1.10604, -2.166435];
        close(
            &run(&n, &bn_inputs()).unwrap()[0],
            &[2, 3, 1, 2],
            &want,
            1e-5,
        );
        // the same numbers through the opset-7 and opset-9 forms
        for opset in [7, 9] {
            let n = node(
                "BatchNormalization",
                opset,
                5,
                1,
                vec![("epsilon", AttrValue::Float(1e-3))],
            );
            close(
                &run(&n, &bn_inputs()).unwrap()[0],
                &[2, 3, 1, 2],
                &want,
                1e-5,
            );
        }

        // training mode (expected values from the onnx reference implementation)
        let n = node(
            "BatchNormalization",
            15,
            5,
            3,
            vec![
                ("training_mode", AttrValue::Int(1)),
                ("momentum", AttrValue::Float(0.8)),
            ],
        );
        let y = run(&n, &bn_inputs()).unwrap();
        #[rustfmt::skip]
        let want = [-1.569613, 0.5232041, -0.3736048, 3.472489, -0.3291808, -1.223606, 1.121152, -0.07474345, -1.472489, 2.373605, -0.7763936, -1.670819];
        close(&y[0], &[2, 3, 1, 2], &want, 1e-5);
        close(&y[1], &[3], &[0.2675, 0.06499998, 0.09000002], 1e-5);
        close(&y[2], &[3], &[2.058594, 1.890625, 2.1625], 1e-5);

        // the pre-14 training forms are refused at build time
        let n = node("BatchNormalization", 9, 5, 5, vec![]);
        assert!(is_unsupported(build(&n)));
        let n = node("BatchNormalization", 6, 5, 1, vec![]);
        assert!(is_unsupported(build(&n)));
        let n = node(
            "BatchNormalization",
            6,
            5,
            1,
            vec![("is_test", AttrValue::Int(1))],
        );
        assert!(build(&n).is_ok());
    }

    #[test]
    fn instance_norm() {
        let n = node("InstanceNormalization", 6, 3, 1, vec![]);
        let ins = bn_inputs();
        let y = run(&n, &ins[..3]).unwrap();
        #[rustfmt::skip]
        let want = [-0.9999992, 0.9999992, -0.9999985, 2.999999, -0.5000011, -1.499999, 0.9999979, -0.9999977, -0.9999985, 2.999999, -0.5000011, -1.499999];
        close(&y[0], &[2, 3, 1, 2], &want, 1e-5);
    }

    #[test]
    fn group_norm_18_vs_21() {
        let x = t(&[2, 4, 2, 2], &xs(32));
        let n = node(
            "GroupNormalization",
            18,
            3,
            1,
            vec![("num_groups", AttrValue::Int(2))],
        );
        // onnx reference implementation (the function body of opset 18)
        let y = run(&n, &[x.clone(), t(&[2], &[2., -1.]), t(&[2], &[0.5, 1.])]).unwrap();
        #[rustfmt::skip]
        let want = [-2.750033, 1.583344, -0.8928711, 3.440506, 0.9642904, -1.511925, 2.821452, 0.3452365, 2.189662, 0.04059529, 1.268633, 2.496671, 0.3476048, 1.575643, -0.5734237, 0.6546143, -1.101268, 3.382283, 0.8202537, -1.741776, 2.741776, 0.1797463, -2.382283, 2.101268, 1.800634, -0.4411415, 0.8398732, 2.120888, -0.1208879, 1.160127, 2.441142, 0.1993659];
        close(&y[0], &[2, 4, 2, 2], &want, 1e-5);
        let n = node(
            "GroupNormalization",
            21,
            3,
            1,
            vec![("num_groups", AttrValue::Int(2))],
        );
        let y = run(
            &n,
            &[
                x,
                t(&[4], &[2., -1., 1., 0.5]),
                t(&[4], &[0.5, 1., 0., -1.]),
            ],
        )
        .unwrap();
        #[rustfmt::skip]
        let want = [-2.750033, 1.583344, -0.8928711, 3.440506, 0.7678548, 2.005962, -0.160726, 1.077382, -1.189662, 0.9594047, -0.2686333, -1.496671, -0.6738024, -1.287821, -0.2132881, -0.8273072, -1.101268, 3.382283, 0.8202537, -1.741776, -0.1208879, 1.160127, 2.441142, 0.1993659, -0.8006341, 1.441141, 0.1601268, -1.120888, -0.4395561, -1.080063, -1.720571, -0.5996829];
        close(&y[0], &[2, 4, 2, 2], &want, 1e-5);
    }

    // ------------------------------------------------------------------ Lp, MVN, LRN

    #[test]
    fn lp_norm() {
        let x = t(&[2, 3, 4], &xs(24));
        let n = node(
            "LpNormalization",
            1,
            1,
            1,
            vec![("axis", AttrValue::Int(1)), ("p", AttrValue::Int(1))],
        );
        #[rustfmt::skip]
        let want = [-0.4444444, 0.3333333, -0.1666667, 0.5454546, 0.2222222, -0.2222222, 0.8333333, 0.09090909, -0.3333333, 0.4444444, 0.0, -0.3636364, 0.3333333, -0.1666667, 0.5454546, 0.25, -0.2222222, 0.8333333, 0.09090909, -0.375, 0.4444444, 0.0, -0.3636364, 0.375];
        close(
            &run(&n, core::slice::from_ref(&x)).unwrap()[0],
            &[2, 3, 4],
            &want,
            1e-6,
        );
        let n = node("LpNormalization", 1, 1, 1, vec![]);
        #[rustfmt::skip]
        let want = [-0.5080005, 0.3810004, -0.1270001, 0.7620008, 0.3429972, -0.3429972, 0.857493, 0.1714986, -0.4685213, 0.6246951, 0.0, -0.6246951, 0.4242641, -0.1414214, 0.8485281, 0.2828427, -0.3202563, 0.8006408, 0.1601282, -0.4803845, 0.6246951, 0.0, -0.6246951, 0.4685213];
        close(&run(&n, &[x]).unwrap()[0], &[2, 3, 4], &want, 1e-6);
        // a zero vector normalises to zeros, not NaN
        let y = run(&n, &[t(&[2], &[0., 0.])]).unwrap();
        close(&y[0], &[2], &[0., 0.], 0.0);
        let n = node("LpNormalization", 1, 1, 1, vec![("p", AttrValue::Int(3))]);
        assert!(is_unsupported(build(&n)));
    }

    #[test]
    fn mean_variance_norm() {
        let n = node("MeanVarianceNormalization", 13, 1, 1, vec![]);
        let y = run(&n, &[t(&[3, 3, 3, 1], &xs(27))]).unwrap();
        #[rustfmt::skip]
        let want = [-1.309307, 0.9819806, -0.3273268, 1.393237, 0.1699069, -1.053423, 1.091089, -0.2182179, -1.527525, 1.309307, 0.0, -1.309307, 0.4757394, -0.7475905, 1.393237, 0.109109, -1.200198, 1.091089, 0.3273268, -0.9819806, 1.309307, -0.441758, -1.665088, 0.4757394, -0.8728715, 1.418416, 0.109109];
        close(&y[0], &[3, 3, 3, 1], &want, 1e-5);
    }

    #[test]
    fn lrn() {
        let n = node(
            "LRN",
            13,
            1,
            1,
            vec![
                ("size", AttrValue::Int(3)),
                ("alpha", AttrValue::Float(0.1)),
            ],
        );
        let y = run(&n, &[t(&[1, 5, 2, 2], &xs(20))]).unwrap();
        #[rustfmt::skip]
        let want = [-0.9698475, 0.7351179, -0.2403024, 1.418745, 0.4784787, -0.4784787, 1.201512, 0.2311136, -0.7252111, 0.9683953, 0.0, -0.9683953, 0.7252111, -0.2347567, 1.418745, 0.4784787, -0.4900786, 1.201512, 0.2364575, -0.7351179];
        close(&y[0], &[1, 5, 2, 2], &want, 1e-5);
    }

    // ------------------------------------------------------------------ threading

    /// A backend that claims 4 threads and runs tasks in reverse order, to exercise the
    /// splitting of outputs between workers.
    struct Threads4;
    impl CpuBackend for Threads4 {
        fn name(&self) -> String {
            "threads4".into()
        }
        fn sgemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
            reference_sgemm(g, a, b, c)
        }
        fn parallel_for(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            for i in (0..n).rev() {
                f(i)
            }
        }
        fn threads(&self) -> usize {
            4
        }
    }

    #[test]
    fn parallel_split_matches_serial() {
        let big = |shape: &[usize]| t(shape, &xs(shape.iter().product()));
        let cases: Vec<(Node, Vec<Option<Tensor>>)> = vec![
            (node("Softmax", 13, 1, 1, vec![]), vec![big(&[37, 1001])]),
            (
                node("Softmax", 13, 1, 1, vec![("axis", AttrValue::Int(1))]),
                vec![big(&[7, 301, 23])],
            ),
            (
                node("LayerNormalization", 17, 3, 3, vec![]),
                vec![big(&[333, 257]), big(&[257]), big(&[257])],
            ),
            (
                node("InstanceNormalization", 6, 3, 1, vec![]),
                vec![big(&[3, 5, 50, 60]), big(&[5]), big(&[5])],
            ),
            (
                node("Resize", 13, 3, 1, vec![("mode", s("linear"))]),
                vec![big(&[2, 3, 40, 50]), None, t(&[4], &[1., 1., 2., 2.])],
            ),
            (
                node("Resize", 13, 3, 1, vec![("mode", s("nearest"))]),
                vec![big(&[1, 1, 200, 150]), None, t(&[4], &[1., 1., 1.5, 2.])],
            ),
            (
                node("Resize", 13, 3, 1, vec![("mode", s("cubic"))]),
                vec![big(&[2, 60, 70]), None, t(&[3], &[1., 1.7, 0.6])],
            ),
        ];
        for (n, ins) in cases {
            let a = run(&n, &ins).unwrap();
            let b = run_on(&Threads4, &n, &ins).unwrap();
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.shape(), y.shape());
                assert_eq!(
                    x.to_f32_vec().unwrap(),
                    y.to_f32_vec().unwrap(),
                    "{}",
                    n.op_type
                );
            }
        }
    }
}
