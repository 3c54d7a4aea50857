//! The com.microsoft quantized element-wise and pooling ops of ONNX Runtime's QOperator
//! format: QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool,
//! QLinearAveragePool and QLinearConcat (QGemm is with the products, in `qmatmul`).
//!
//! They compute as ONNX Runtime's kernels do: the integer values less their zero points,
//! scaled in f32, rounded half to even, plus the output's zero point, saturated. One-input
//! ops are a 256-entry table computed once per scale set (every input byte's answer).

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use crate::arena::OutBuf;
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::nn::q8_bytes;
use crate::kernels::par::par_chunks_mut;
use crate::kernels::{bad_type, def_in, opt_tensor_in, out1, tensor_in};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::simd::{self, QBin, Q8};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

const Q8: &[DataType] = &[DataType::Uint8, DataType::Int8];

pub(crate) const KERNELS: &[KernelDef] = &[
    def_in("com.microsoft", "QLinearAdd", 1, 1, build_add).types(Q8),
    def_in("com.microsoft", "QLinearMul", 1, 1, build_mul).types(Q8),
    def_in("com.microsoft", "QLinearSigmoid", 1, 1, build_sigmoid).types(Q8),
    def_in("com.microsoft", "QLinearLeakyRelu", 1, 1, build_leaky_relu).types(Q8),
    def_in("com.microsoft", "QLinearGlobalAveragePool", 1, 1, build_gap).types(Q8),
    def_in("com.microsoft", "QLinearAveragePool", 1, 1, build_avg_pool).types(Q8),
    def_in("com.microsoft", "QLinearConcat", 1, 1, build_concat).types(Q8),
    def_in(
        crate::kernels::nn::nchwc::DOMAIN,
        "QLookup",
        1,
        1,
        build_lookup,
    )
    .types(Q8),
];

/// `nxrt:QLookup(x, table)`: `y[i] = table[x[i]]`, `table` 256 codes of the output's type
/// (int8 or uint8), indexed by `x`'s bytes: a one-input op between a DequantizeLinear and a
/// QuantizeLinear, tabulated at load (`fuse::quant::qdq_ops`).
fn build_lookup(_n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let t = tensor_in(inputs, 1)?;
            if t.len() != 256 {
                bail!("QLookup: a table of {} entries (needs 256)", t.len());
            }
            let (tb, _) = q8_bytes(t)?;
            let table: &[u8; 256] = tb[..].try_into().expect("256 entries");
            let (xb, _) = q8_bytes(x)?;
            let mut y = Q8Buf::new(cx, t.dtype(), x.shape())?;
            lookup(cx, table, &xb, y.bytes());
            out1(y.into_tensor())
        },
    ))
}

/// An int8 or uint8 output of a quantized kernel, written as bytes: in the planned arena
/// where the run has one.
pub(crate) enum Q8Buf {
    U(OutBuf<u8>),
    I(OutBuf<i8>),
}

impl Q8Buf {
    /// Output 0 of `shape` and type `dt` (int8 or uint8); contents unspecified.
    pub(crate) fn new(cx: &KernelCx<'_>, dt: DataType, shape: &[usize]) -> Result<Q8Buf> {
        match dt {
            DataType::Int8 => Ok(Q8Buf::I(cx.output::<i8>(0, shape)?)),
            DataType::Uint8 => Ok(Q8Buf::U(cx.output::<u8>(0, shape)?)),
            dt => Err(bad_type("a quantized output", dt)),
        }
    }
    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        match self {
            Q8Buf::U(b) => b,
            Q8Buf::I(b) => bytemuck::cast_slice_mut(&mut b[..]),
        }
    }
    pub(crate) fn into_tensor(self) -> Tensor {
        match self {
            Q8Buf::U(b) => b.into_tensor(),
            Q8Buf::I(b) => b.into_tensor(),
        }
    }
}

/// `y[i] = table[x[i]]`, in parallel chunks.
pub(crate) fn lookup(cx: &KernelCx<'_>, table: &[u8; 256], x: &[u8], y: &mut [u8]) {
    par_chunks_mut(cx.cpu, y, 1 << 14, 2, &|ci, yc| {
        let xc = &x[ci << 14..(ci << 14) + yc.len()];
        for (d, &b) in yc.iter_mut().zip(xc) {
            *d = table[b as usize];
        }
    });
}

/// [`simd::qbinary_q8`] into `y` in parallel chunks where the operands split evenly: `b` of
/// `a`'s length, one value, or one value per row of `per_b >= 256` elements (a channel's
/// plane); otherwise on one thread.
#[allow(clippy::too_many_arguments)]
fn qbinary_par(
    cx: &KernelCx<'_>,
    p: QBin,
    a: &[u8],
    b: &[u8],
    per_b: usize,
    signed: bool,
    q: Q8,
    y: &mut [u8],
) {
    const CHUNK: usize = 1 << 14;
    let n = a.len();
    if b.len() == n && per_b == 1 {
        par_chunks_mut(cx.cpu, y, CHUNK, 4, &|ci, yc| {
            let r = ci * CHUNK..ci * CHUNK + yc.len();
            simd::qbinary_q8(p, &a[r.clone()], &b[r], 1, signed, q, yc);
        });
    } else if b.len() == 1 {
        par_chunks_mut(cx.cpu, y, CHUNK, 4, &|ci, yc| {
            let r = ci * CHUNK..ci * CHUNK + yc.len();
            simd::qbinary_q8(p, &a[r], b, yc.len().max(2), signed, q, yc);
        });
    } else if per_b >= 256 {
        let rows = (CHUNK / per_b).max(1);
        par_chunks_mut(cx.cpu, y, rows * per_b, 4, &|ci, yc| {
            for (ri, yr) in yc.chunks_mut(per_b).enumerate() {
                let row = ci * rows + ri;
                let (a0, bi) = (row * per_b, row % b.len());
                let ar = &a[a0..a0 + yr.len()];
                simd::qbinary_q8(p, ar, &b[bi..bi + 1], yr.len().max(2), signed, q, yr);
            }
        });
    } else {
        simd::qbinary_q8(p, a, b, per_b, signed, q, y);
    }
}

/// Rounds half to even, adds `zp` and saturates to `lo..=hi`, as a byte. (Values beyond
/// 2^22 in magnitude, where the rounding trick would not hold, are clamped there first: they
/// saturate either way.)
#[inline(always)]
pub(crate) fn requant(v: f32, zp: f32, lo: f32, hi: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it leaves no fraction bits
    let v = v.clamp(-4_194_304.0, 4_194_304.0);
    let r = (v + MAGIC) - MAGIC;
    (r + zp).clamp(lo, hi) as i32 as u8
}

/// A scalar quantization parameter pair: (scale, zero point) of a tensor whose elements have
/// type `dt`.
fn qparams(
    inputs: &[Option<&Value>],
    scale: usize,
    zp: usize,
    dt: DataType,
    what: &str,
) -> Result<(f32, f32)> {
    let s = tensor_in(inputs, scale)?;
    if s.len() != 1 {
        unsupported!("{what}: only per-tensor scales are supported");
    }
    let s = s.to_f32_vec()?[0];
    let z = match opt_tensor_in(inputs, zp)? {
        Some(z) if z.len() != 1 => {
            unsupported!("{what}: only per-tensor zero points are supported")
        }
        Some(z) if z.dtype() != dt => {
            bail!("{what}: zero point type {} differs from {dt}", z.dtype())
        }
        Some(z) => z.to_i64_vec()?[0] as f32,
        None => 0.0,
    };
    Ok((s, z))
}

/// The range of a quantized type.
fn range(dt: DataType) -> Result<(f32, f32)> {
    match dt {
        DataType::Uint8 => Ok((0.0, 255.0)),
        DataType::Int8 => Ok((-128.0, 127.0)),
        dt => Err(bad_type("quantized op", dt)),
    }
}

/// A byte's integer value for type `dt`.
#[inline(always)]
fn val(b: u8, signed: bool) -> f32 {
    if signed {
        b as i8 as f32
    } else {
        b as f32
    }
}

/// Bytes as a tensor of `dt` (uint8 or int8).
pub(crate) fn q8_tensor(dt: DataType, shape: &[usize], y: Vec<u8>) -> Result<Tensor> {
    if dt == DataType::Int8 {
        Tensor::from_vec(shape, bytemuck::cast_vec::<u8, i8>(y))
    } else {
        Tensor::from_vec(shape, y)
    }
}

#[derive(Clone, Copy)]
enum Bin {
    Add,
    Mul,
}

struct QBinary(Bin);

fn build_add(_n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QBinary(Bin::Add)))
}

fn build_mul(_n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QBinary(Bin::Mul)))
}

impl Kernel for QBinary {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let what = match self.0 {
            Bin::Add => "QLinearAdd",
            Bin::Mul => "QLinearMul",
        };
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 3)?;
        let dt = a.dtype();
        if b.dtype() != dt {
            bail!("{what}: inputs of types {dt} and {}", b.dtype());
        }
        let (sa, za) = qparams(inputs, 1, 2, dt, what)?;
        let (sb, zb) = qparams(inputs, 4, 5, dt, what)?;
        let (sc, zc) = qparams(inputs, 6, 7, dt, what)?;
        let (lo, hi) = range(dt)?;
        let shape = crate::kernels::broadcast_shapes(a.shape(), b.shape())?;
        let p = match self.0 {
            Bin::Add => QBin {
                mul: false,
                za,
                zb,
                ra: sa / sc,
                rb: sb / sc,
            },
            Bin::Mul => QBin {
                mul: true,
                za,
                zb,
                ra: sa * sb / sc,
                rb: 0.0,
            },
        };
        let q = Q8 { zp: zc, lo, hi };
        let signed = dt == DataType::Int8;
        // the operand of the output's shape first (both ops commute)
        let (big, small, pb) = if a.shape() == shape.as_slice() {
            (a, b, p)
        } else {
            (
                b,
                a,
                QBin {
                    za: zb,
                    zb: za,
                    ra: if p.mul { p.ra } else { p.rb },
                    rb: p.ra,
                    ..p
                },
            )
        };
        let n: usize = shape.iter().product();
        let mut out = Q8Buf::new(cx, dt, &shape)?;
        let y = out.bytes();
        let (bb, _) = q8_bytes(big)?;
        // the smaller one: the same shape, or a suffix repeated, or one value per channel of
        // a [N, C, ...] output ([1, C, 1..] or [N, C, 1..]); else broadcast in full
        let ss = small.shape();
        let r = shape.len();
        let pad: Vec<usize> = core::iter::repeat_n(1, r - ss.len())
            .chain(ss.iter().copied())
            .collect();
        let lead = pad.iter().position(|&d| d != 1).unwrap_or(r);
        let suffix = pad[lead..] == shape[lead..];
        let channel = r >= 3
            && pad[2..].iter().all(|&d| d == 1)
            && pad[1] == shape[1]
            && (pad[0] == 1 || pad[0] == shape[0]);
        if small.len() == 1 {
            let (sb, _) = q8_bytes(small)?;
            qbinary_par(cx, pb, &bb, &sb, n.max(2), signed, q, y);
        } else if suffix {
            let (sb, _) = q8_bytes(small)?;
            qbinary_par(cx, pb, &bb, &sb, 1, signed, q, y);
        } else if channel {
            let (sb, _) = q8_bytes(small)?;
            let plane: usize = shape[2..].iter().product();
            qbinary_par(cx, pb, &bb, &sb, plane.max(1), signed, q, y);
        } else {
            let full = small.broadcast_to(&shape)?.contiguous()?;
            let (sb, _) = q8_bytes(&full)?;
            qbinary_par(cx, pb, &bb, &sb, 1, signed, q, y);
        }
        out1(out.into_tensor())
    }
}

/// A one-input op as a table of its 256 answers.
struct QUnary {
    what: &'static str,
    f: fn(f32, f32) -> f32,
    alpha: f32,
}

fn build_sigmoid(_n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QUnary {
        what: "QLinearSigmoid",
        f: |x, _| 1.0 / (1.0 + libm::expf(-x)),
        alpha: 0.0,
    }))
}

fn build_leaky_relu(n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QUnary {
        what: "QLinearLeakyRelu",
        f: |x, a| if x >= 0.0 { x } else { a * x },
        alpha: n.get_f("alpha", 0.01)?,
    }))
}

impl Kernel for QUnary {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor_in(inputs, 0)?;
        let dt = x.dtype();
        let (sx, zx) = qparams(inputs, 1, 2, dt, self.what)?;
        let (sy, zy) = qparams(inputs, 3, 4, dt, self.what)?;
        let (lo, hi) = range(dt)?;
        let signed = dt == DataType::Int8;
        let table: Vec<u8> = (0..=255u8)
            .map(|b| {
                let v = (self.f)((val(b, signed) - zx) * sx, self.alpha);
                requant(v / sy, zy, lo, hi)
            })
            .collect();
        let (xb, _) = q8_bytes(x)?;
        let table: &[u8; 256] = table[..].try_into().expect("256 entries");
        let mut y = Q8Buf::new(cx, dt, x.shape())?;
        lookup(cx, table, &xb, y.bytes());
        out1(y.into_tensor())
    }
}

struct QGap {
    channels_last: bool,
}

fn build_gap(n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QGap {
        channels_last: n.get_i("channels_last", 0)? != 0,
    }))
}

impl Kernel for QGap {
    fn compute(&self, _cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor_in(inputs, 0)?;
        let dt = x.dtype();
        let what = "QLinearGlobalAveragePool";
        let (sx, zx) = qparams(inputs, 1, 2, dt, what)?;
        let (sy, zy) = qparams(inputs, 3, 4, dt, what)?;
        let (lo, hi) = range(dt)?;
        let s = x.shape();
        if s.len() < 3 {
            bail!("{what}: input of rank {} (needs at least 3)", s.len());
        }
        let (n, c) = if self.channels_last {
            (s[0], s[s.len() - 1])
        } else {
            (s[0], s[1])
        };
        let plane: usize = if self.channels_last {
            s[1..s.len() - 1].iter().product()
        } else {
            s[2..].iter().product()
        };
        let (xb, signed) = q8_bytes(x)?;
        let mut y = vec![0u8; n * c];
        // the integer sum less the zero points, times sx / (sy * count)
        let r = sx / (sy * plane.max(1) as f32);
        for img in 0..n {
            for ch in 0..c {
                let sum: i32 = if self.channels_last {
                    (0..plane)
                        .map(|p| val(xb[(img * plane + p) * c + ch], signed) as i32)
                        .sum()
                } else {
                    // separate loops per signedness: each vectorises
                    let row = &xb[(img * c + ch) * plane..(img * c + ch + 1) * plane];
                    if signed {
                        row.iter().map(|&b| b as i8 as i32).sum()
                    } else {
                        row.iter().map(|&b| b as i32).sum()
                    }
                };
                let v = (sum as f32 - zx * plane as f32) * r;
                y[img * c + ch] = requant(v, zy, lo, hi);
            }
        }
        let mut shape = vec![n];
        if self.channels_last {
            shape.extend(core::iter::repeat_n(1, s.len() - 2));
            shape.push(c);
        } else {
            shape.push(c);
            shape.extend(core::iter::repeat_n(1, s.len() - 2));
        }
        out1(q8_tensor(dt, &shape, y)?)
    }
}

/// `QLinearAveragePool`: the float AveragePool (its geometry, padding and counting rules) of
/// the dequantized input, `(x - zx) * sx`, quantized by `(y_scale, y_zero_point)`: as ONNX
/// Runtime computes it (dequantize, float average, round half to even). One difference from
/// the standard op, ONNX Runtime's: with `count_include_pad` a window that `ceil_mode` runs
/// past the end padding still divides by the whole kernel, so there the end padding is
/// widened to cover it and `ceil_mode` dropped (the same windows, counted as ONNX Runtime does).
struct QAvgPool {
    /// The AveragePool node of the same attributes (one input, standard domain).
    avg: Node,
    inner: Box<dyn Kernel>,
    /// `count_include_pad` and `ceil_mode` both set, with explicit pads.
    widen: bool,
}

/// The float AveragePool kernel of `avg`, built directly (no registry lookup, which would
/// build every family's table: the widened case builds one per run).
fn avg_kernel(avg: &Node) -> Result<Box<dyn Kernel>> {
    crate::kernels::nn::build_average_pool(avg)
}

fn build_avg_pool(n: &Node) -> Result<Box<dyn Kernel>> {
    if n.get_i("channels_last", 0)? != 0 {
        unsupported!("QLinearAveragePool: channels_last = 1 (NHWC input) is not supported");
    }
    // the same attributes on a standard AveragePool of the one input
    let mut avg = n.clone();
    avg.op_type = "AveragePool".into();
    avg.domain.clear();
    avg.opset = 19;
    avg.attrs.retain(|(k, _)| k != "channels_last");
    avg.inputs.truncate(1);
    avg.outputs.truncate(1);
    let explicit = matches!(n.get_s("auto_pad", "NOTSET")?.as_str(), "NOTSET");
    let widen = explicit && n.get_i("count_include_pad", 0)? != 0 && n.get_i("ceil_mode", 0)? != 0;
    Ok(Box::new(QAvgPool {
        inner: avg_kernel(&avg)?,
        avg,
        widen,
    }))
}

impl QAvgPool {
    /// The node with `ceil_mode` dropped and each axis' end padding widened to cover the
    /// windows `ceil_mode` added, for input spatial dims `dims`.
    fn widened(&self, dims: &[usize]) -> Result<Node> {
        let nd = dims.len();
        let ks = self.avg.attr_ints("kernel_shape")?.unwrap_or_default();
        let st = self
            .avg
            .attr_ints("strides")?
            .unwrap_or_else(|| vec![1; nd]);
        let mut pads = self
            .avg
            .attr_ints("pads")?
            .unwrap_or_else(|| vec![0; 2 * nd]);
        if ks.len() != nd || st.len() != nd || pads.len() != 2 * nd {
            bail!(
                "QLinearAveragePool: kernel_shape, strides and pads do not fit {nd} spatial axes"
            );
        }
        for i in 0..nd {
            let (k, s) = (ks[i], st[i].max(1));
            let span = dims[i] as i64 + pads[i] + pads[nd + i] - k;
            if span < 0 {
                continue; // the standard op reports it
            }
            let out = (span + s - 1) / s + 1; // ceil
            pads[nd + i] += ((out - 1) * s + k - (dims[i] as i64 + pads[i] + pads[nd + i])).max(0);
        }
        let mut n = self.avg.clone();
        n.attrs.retain(|(k, _)| k != "ceil_mode" && k != "pads");
        n.attrs
            .push(("pads".into(), crate::ir::AttrValue::Ints(pads)));
        Ok(n)
    }
}

impl Kernel for QAvgPool {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor_in(inputs, 0)?;
        let dt = x.dtype();
        let what = "QLinearAveragePool";
        let (sx, zx) = qparams(inputs, 1, 2, dt, what)?;
        let (sy, zy) = qparams(inputs, 3, 4, dt, what)?;
        let (lo, hi) = range(dt)?;
        let (xb, signed) = q8_bytes(x)?;
        let mut xf = vec![0f32; xb.len()];
        simd::dequantize_q8(&xb, signed, zx, sx, &mut xf);
        let xf = Value::Tensor(Tensor::from_vec(x.shape(), xf)?);
        let widened;
        let inner = if self.widen && x.shape().len() > 2 {
            widened = avg_kernel(&self.widened(&x.shape()[2..])?)?;
            &widened
        } else {
            &self.inner
        };
        let out = inner.compute(cx, &[Some(&xf)])?;
        let Some(Value::Tensor(yf)) = out.into_iter().next() else {
            bail!("{what}: the average gave no tensor");
        };
        let yv = yf.as_slice::<f32>()?;
        let y: Vec<u8> = yv.iter().map(|&v| requant(v / sy, zy, lo, hi)).collect();
        out1(q8_tensor(dt, yf.shape(), y)?)
    }
}

struct QConcat {
    axis: i64,
}

fn build_concat(n: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QConcat {
        axis: n.get_i("axis", 0)?,
    }))
}

impl Kernel for QConcat {
    fn compute(&self, _cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        // Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input
        let what = "QLinearConcat";
        if inputs.len() < 5 || !(inputs.len() - 2).is_multiple_of(3) {
            bail!("{what}: {} inputs (needs 2 + 3 per tensor)", inputs.len());
        }
        let x0 = tensor_in(inputs, 2)?;
        let dt = x0.dtype();
        let (sy, zy) = qparams(inputs, 0, 1, dt, what)?;
        let (lo, hi) = range(dt)?;
        let rank = x0.rank();
        crate::kernels::norm_axis(self.axis, rank)?;
        let mut parts = Vec::new();
        for t in 0..(inputs.len() - 2) / 3 {
            let x = tensor_in(inputs, 2 + 3 * t)?;
            if x.dtype() != dt || x.rank() != rank {
                bail!("{what}: input {t} is {} of rank {}", x.dtype(), x.rank());
            }
            let (sx, zx) = qparams(inputs, 3 + 3 * t, 4 + 3 * t, dt, what)?;
            let (xb, signed) = q8_bytes(x)?;
            let y: Vec<u8> = if sx == sy && zx == zy {
                xb.into_owned()
            } else {
                let r = sx / sy;
                xb.iter()
                    .map(|&b| requant((val(b, signed) - zx) * r, zy, lo, hi))
                    .collect()
            };
            parts.push(q8_tensor(dt, x.shape(), y)?);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        out1(crate::kernels::shape::concat(None, &refs, self.axis)?)
    }
}

#[cfg(test)]
mod tests {
    use alloc::string::String;
    use alloc::vec::Vec;

    use super::super::test_util::{node, run};
    use super::requant;
    use crate::tensor::Tensor;

    fn codes(n: usize, seed: u32) -> Vec<u8> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 9) as u8
            })
            .collect()
    }

    fn q(v: u8) -> Tensor {
        Tensor::scalar(v)
    }

    fn f(v: f32) -> Tensor {
        Tensor::scalar(v)
    }

    #[test]
    fn binary_ops_split_between_threads_give_the_definition() {
        // same shapes, one value, and one value per channel of 17 x 18 planes: each large
        // enough to be split between threads (`run` checks threaded against sequential)
        let (sa, za, sb, zb, sc, zc) = (0.02f32, 120u8, 0.05f32, 3u8, 0.07f32, 130u8);
        let sh = [2usize, 70, 17, 18];
        let n: usize = sh.iter().product();
        let a = codes(n, 1);
        for (op, bshape) in [
            ("QLinearAdd", alloc::vec![2usize, 70, 17, 18]),
            ("QLinearMul", alloc::vec![1]),
            ("QLinearMul", alloc::vec![1, 70, 1, 1]),
            ("QLinearAdd", alloc::vec![1, 70, 1, 1]),
        ] {
            let bn: usize = bshape.iter().product();
            let b = codes(bn, 2 + bn as u32);
            let mut nd = node(op, 1, alloc::vec![], 1);
            nd.domain = String::from("com.microsoft");
            let inputs = [
                Tensor::from_vec(&sh, a.clone()).unwrap(),
                f(sa),
                q(za),
                Tensor::from_vec(&bshape, b.clone()).unwrap(),
                f(sb),
                q(zb),
                f(sc),
                q(zc),
            ]
            .map(Some);
            let y = run(&nd, &inputs).unwrap()[0]
                .as_slice::<u8>()
                .unwrap()
                .into_owned();
            let plane = 17 * 18;
            for i in 0..n {
                let bv = b[match bn {
                    1 => 0,
                    70 => (i / plane) % 70,
                    _ => i,
                }] as f32
                    - zb as f32;
                let av = a[i] as f32 - za as f32;
                let v = if op == "QLinearMul" {
                    av * bv * (sa * sb / sc)
                } else {
                    av * (sa / sc) + bv * (sb / sc)
                };
                assert_eq!(
                    y[i],
                    requant(v, zc as f32, 0.0, 255.0),
                    "{op} {bshape:?} [{i}]"
                );
            }
        }
    }

    #[test]
    fn table_lookups_split_between_threads_give_the_table() {
        let n = 50_000;
        let x = codes(n, 5);
        let table = codes(256, 6);
        let mut nd = node("QLookup", 1, alloc::vec![], 1);
        nd.domain = String::from(crate::kernels::nn::nchwc::DOMAIN);
        let inputs = [
            Tensor::from_vec(&[n], x.clone()).unwrap(),
            Tensor::from_vec(&[256], table.clone()).unwrap(),
        ]
        .map(Some);
        let y = run(&nd, &inputs).unwrap()[0]
            .as_slice::<u8>()
            .unwrap()
            .into_owned();
        for i in 0..n {
            assert_eq!(y[i], table[x[i] as usize], "[{i}]");
        }
    }
}
