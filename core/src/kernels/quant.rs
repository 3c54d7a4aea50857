//! Quantization kernels: QuantizeLinear, DequantizeLinear (per-tensor, per-axis and blocked,
//! integer, float8, 4- and 2-bit element types), DynamicQuantizeLinear and BitCast.
//!
//! Quantized element types are read and written through the Cast kernel's small-float and
//! packed-integer codecs, so every op agrees on one encoding (packed types low bits first).

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use half::{bf16, f16};

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::elementwise::{decode_raw, is_raw, mini_encode, mini_of, pack, raw_data};
use crate::kernels::types::NOT_STRING;
use crate::kernels::{def, norm_axis, opt_tensor_in, out1, tensor_in, LATEST};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::{Data, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

/// What QuantizeLinear quantizes (its input check in the kernel).
const QUANTIZE_INPUT_TYPES: &[DataType] = &[
    DataType::Float,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Int32,
];

/// What DequantizeLinear reads (`dequant_source`): the integer ranges of `int_range`, the
/// float8/float4 codes of `mini_of`, and int32.
const DEQUANTIZE_INPUT_TYPES: &[DataType] = &[
    DataType::Int8,
    DataType::Uint8,
    DataType::Int16,
    DataType::Uint16,
    DataType::Int4,
    DataType::Uint4,
    DataType::Int2,
    DataType::Uint2,
    DataType::Float8E4M3FN,
    DataType::Float8E4M3FNUZ,
    DataType::Float8E5M2,
    DataType::Float8E5M2FNUZ,
    DataType::Float4E2M1,
    DataType::Int32,
];

pub(crate) const KERNELS: &[KernelDef] = &[
    def("QuantizeLinear", 10, LATEST, build_quantize).types(QUANTIZE_INPUT_TYPES),
    def("DequantizeLinear", 10, LATEST, build_dequantize).types(DEQUANTIZE_INPUT_TYPES),
    def("DynamicQuantizeLinear", 11, LATEST, build_dynamic_quantize).types(&[DataType::Float]),
    // the kernel checks that input and `to` have the same width
    def("BitCast", 26, LATEST, build_bitcast).types(NOT_STRING),
];

fn kernel<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(f))
}

// ----------------------------------------------------------------------------- shared parts

/// Every element of a numeric, float8, 4- or 2-bit tensor as f64 (exact for all of them but
/// 64-bit integers beyond 2^53).
pub(crate) fn values_f64(t: &Tensor, what: &str) -> Result<Vec<f64>> {
    let dt = t.dtype();
    if is_raw(dt) {
        return values_f64(&decode_raw(&t.contiguous()?)?, what);
    }
    match dt {
        DataType::Double => Ok(t.as_slice::<f64>()?.to_vec()),
        DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
            Ok(t.to_f32_vec()?.into_iter().map(f64::from).collect())
        }
        d if d.is_int() => Ok(t.to_i64_vec()?.into_iter().map(|v| v as f64).collect()),
        _ => unsupported!("{what} of element type {dt} is not supported"),
    }
}

/// Which scale (and zero point) each element uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gran {
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per index along the axis.
    Axis,
    /// `s` scales along the axis, each covering `b` consecutive indices.
    Block { s: usize, b: usize },
}

/// The input split around the quantization axis, and the granularity.
#[derive(Clone, Copy, Debug)]
struct Layout {
    outer: usize,
    d: usize,
    inner: usize,
    gran: Gran,
}

impl Layout {
    /// Calls `f(element index, scale index)` for every element.
    fn for_each(&self, mut f: impl FnMut(usize, usize)) {
        let mut idx = 0;
        for o in 0..self.outer {
            for k in 0..self.d {
                for i in 0..self.inner {
                    let si = match self.gran {
                        Gran::Tensor => 0,
                        Gran::Axis => k,
                        Gran::Block { s, b } => (o * s + k / b) * self.inner + i,
                    };
                    f(idx, si);
                    idx += 1;
                }
            }
        }
    }
}

/// Checks the scale's shape against the input's and works out the granularity.
fn layout(
    op: &str,
    x_shape: &[usize],
    scale_shape: &[usize],
    axis: i64,
    block: usize,
) -> Result<Layout> {
    let n: usize = x_shape.iter().product();
    let scale_n: usize = scale_shape.iter().product();
    let whole = Layout {
        outer: 1,
        d: 1,
        inner: n,
        gran: Gran::Tensor,
    };
    if scale_n == 1 && (block == 0 || scale_shape.len() <= 1) {
        return Ok(whole);
    }
    if x_shape.is_empty() {
        bail!("{op}: a scalar input needs a scalar scale, got shape {scale_shape:?}");
    }
    let a = norm_axis(axis, x_shape.len())?;
    let d = x_shape[a];
    let outer: usize = x_shape[..a].iter().product();
    let inner: usize = x_shape[a + 1..].iter().product();
    if block == 0 {
        if scale_shape.len() != 1 || scale_shape[0] != d {
            bail!(
                "{op}: per-axis scale should have shape [{d}] (axis {a} of input {x_shape:?}), \
                 got {scale_shape:?}"
            );
        }
        return Ok(Layout {
            outer,
            d,
            inner,
            gran: Gran::Axis,
        });
    }
    let same_elsewhere = scale_shape.len() == x_shape.len()
        && scale_shape
            .iter()
            .zip(x_shape)
            .enumerate()
            .all(|(i, (s, x))| i == a || s == x);
    let s = scale_shape.get(a).copied().unwrap_or(0);
    if !same_elsewhere || s != d.div_ceil(block) {
        bail!(
            "{op}: blocked scale shape {scale_shape:?} does not fit input {x_shape:?} with \
             axis {a} and block_size {block}"
        );
    }
    Ok(Layout {
        outer,
        d,
        inner,
        gran: Gran::Block { s, b: block },
    })
}

/// Reads `block_size` (opset 21+), rejecting negative values.
fn block_size(node: &Node, op: &str) -> Result<usize> {
    let b = if node.opset >= 21 {
        node.get_i("block_size", 0)?
    } else {
        0
    };
    if b < 0 {
        bail!("{op}: block_size must not be negative, is {b}");
    }
    Ok(b as usize)
}

/// An optional element-type attribute (0 = absent).
fn dtype_attr(node: &Node, name: &str, op: &str) -> Result<Option<DataType>> {
    match node.get_i(name, 0)? {
        0 => Ok(None),
        c => match i32::try_from(c).ok().and_then(DataType::from_code) {
            Some(dt) => Ok(Some(dt)),
            None => unsupported!("{op}: unknown element type code {c} in '{name}'"),
        },
    }
}

/// The checked zero point: same shape as the scale.
fn zero_point<'a>(op: &str, zp: Option<&'a Tensor>, scale: &Tensor) -> Result<Option<&'a Tensor>> {
    if let Some(z) = zp {
        // a single value may be given as a scalar or a one-element vector on either side
        if z.shape() != scale.shape() && !(z.len() == 1 && scale.len() == 1) {
            bail!(
                "{op}: zero point shape {:?} differs from scale shape {:?}",
                z.shape(),
                scale.shape()
            );
        }
    }
    Ok(zp)
}

// ----------------------------------------------------------------------------- QuantizeLinear

/// Integer range of a quantized integer type.
fn int_range(dt: DataType) -> Option<(i64, i64)> {
    Some(match dt {
        DataType::Uint8 => (0, 255),
        DataType::Int8 => (-128, 127),
        DataType::Uint16 => (0, 65535),
        DataType::Int16 => (-32768, 32767),
        DataType::Uint4 => (0, 15),
        DataType::Int4 => (-8, 7),
        DataType::Uint2 => (0, 3),
        DataType::Int2 => (-2, 1),
        _ => return None,
    })
}

/// Types QuantizeLinear produces.
fn quant_target(dt: DataType) -> bool {
    int_range(dt).is_some() || (mini_of(dt).is_some())
}

/// Precision of the division `x / y_scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prec {
    F16,
    BF16,
    F32,
    F64,
}

impl Prec {
    fn of(dt: DataType) -> Option<Prec> {
        Some(match dt {
            DataType::Float16 => Prec::F16,
            DataType::Bfloat16 => Prec::BF16,
            DataType::Float | DataType::Float8E8M0 => Prec::F32,
            DataType::Double | DataType::Int32 => Prec::F64,
            _ => return None,
        })
    }

    /// `x / s` rounded as the precision's own division would round it.
    #[inline]
    fn div(self, x: f64, s: f64) -> f64 {
        match self {
            // f32 carries more than twice the bits of f16/bf16, so dividing there and rounding
            // once more gives the correctly rounded narrow quotient
            Prec::F16 => {
                let q = f16::from_f64(x).to_f32() / f16::from_f64(s).to_f32();
                f16::from_f32(q).to_f64()
            }
            Prec::BF16 => {
                let q = bf16::from_f64(x).to_f32() / bf16::from_f64(s).to_f32();
                bf16::from_f32(q).to_f64()
            }
            Prec::F32 => f64::from(x as f32 / s as f32),
            Prec::F64 => x / s,
        }
    }
}

/// Writes quantized codes as a tensor of element type `dt`.
fn int_tensor(dt: DataType, shape: &[usize], q: Vec<i64>) -> Result<Tensor> {
    let n = q.len();
    match dt {
        DataType::Uint8 => Tensor::from_vec(shape, q.into_iter().map(|v| v as u8).collect()),
        DataType::Int8 => Tensor::from_vec(shape, q.into_iter().map(|v| v as i8).collect()),
        DataType::Uint16 => Tensor::from_vec(shape, q.into_iter().map(|v| v as u16).collect()),
        DataType::Int16 => Tensor::from_vec(shape, q.into_iter().map(|v| v as i16).collect()),
        DataType::Uint4 | DataType::Int4 => Tensor::from_data(
            dt,
            shape.to_vec(),
            Data::Raw(pack(q.into_iter().map(|v| v as u8), 4, n)),
        ),
        DataType::Uint2 | DataType::Int2 => Tensor::from_data(
            dt,
            shape.to_vec(),
            Data::Raw(pack(q.into_iter().map(|v| v as u8), 2, n)),
        ),
        _ => unsupported!("QuantizeLinear to {dt} is not supported"),
    }
}

/// Rounds half to even and saturates into `[lo, hi]` after adding the zero point.
#[inline]
fn quant_int(q: f64, zp: f64, lo: i64, hi: i64) -> i64 {
    let r = libm::rint(q);
    let v = if r.is_nan() {
        // NaN has no integer image; the reference's cast gives the most negative value
        return lo;
    } else {
        r.clamp(-9.0e15, 9.0e15) as i64
    };
    (v + zp as i64).clamp(lo, hi)
}

fn encode_mini(dt: DataType, shape: &[usize], q: Vec<u8>) -> Result<Tensor> {
    let n = q.len();
    let bytes = if dt == DataType::Float4E2M1 {
        pack(q.into_iter(), 4, n)
    } else {
        q
    };
    Tensor::from_data(dt, shape.to_vec(), Data::Raw(bytes))
}

fn build_quantize(node: &Node) -> Result<Box<dyn Kernel>> {
    const OP: &str = "QuantizeLinear";
    let opset = node.opset;
    let axis = if opset >= 13 {
        node.get_i("axis", 1)?
    } else {
        1
    };
    let saturate = if opset >= 19 {
        node.get_i("saturate", 1)? != 0
    } else {
        true
    };
    let block = block_size(node, OP)?;
    let out_attr = if opset >= 21 {
        dtype_attr(node, "output_dtype", OP)?
    } else {
        None
    };
    if let Some(dt) = out_attr {
        if !quant_target(dt) {
            unsupported!("{OP}: output_dtype {dt} is not a quantized type");
        }
    }
    let precision = if opset >= 23 {
        match dtype_attr(node, "precision", OP)? {
            None => None,
            Some(dt) => match dt {
                DataType::Float | DataType::Float16 | DataType::Bfloat16 | DataType::Double => {
                    Prec::of(dt)
                }
                _ => unsupported!("{OP}: precision {dt} is not supported"),
            },
        }
    } else {
        None
    };
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let scale = tensor_in(inputs, 1)?;
        let zp = zero_point(OP, opt_tensor_in(inputs, 2)?, scale)?;
        if opset < 21 && scale.rank() > 1 {
            bail!("{OP}: scale must be a scalar or 1-D before opset 21");
        }
        if opset < 13 && scale.len() != 1 {
            bail!("{OP}: scale must be a scalar before opset 13");
        }
        let to = match (zp, out_attr) {
            (Some(z), Some(o)) if z.dtype() != o => {
                bail!(
                    "{OP}: output_dtype {o} differs from zero point type {}",
                    z.dtype()
                )
            }
            (Some(z), _) => z.dtype(),
            (None, Some(o)) => o,
            (None, None) => DataType::Uint8,
        };
        if !quant_target(to) {
            unsupported!("{OP}: quantizing to {to} is not supported");
        }
        if !matches!(
            x.dtype(),
            DataType::Float | DataType::Float16 | DataType::Bfloat16 | DataType::Int32
        ) {
            unsupported!("{OP}: input type {} is not supported", x.dtype());
        }
        let prec = match precision {
            Some(p) => p,
            None => match Prec::of(scale.dtype()) {
                Some(p) => p,
                None => unsupported!("{OP}: scale type {} is not supported", scale.dtype()),
            },
        };
        let lay = layout(OP, x.shape(), scale.shape(), axis, block)?;
        if let Some(t) = quantize_fast(x, scale, zp, to, prec, &lay)? {
            return out1(t);
        }
        let xv = values_f64(x, OP)?;
        let sv = values_f64(scale, OP)?;
        let zv = match zp {
            Some(z) => values_f64(z, OP)?,
            None => vec![0.0; sv.len()],
        };
        let n = xv.len();
        if let Some((lo, hi)) = int_range(to) {
            let mut q = vec![0i64; n];
            lay.for_each(|i, s| q[i] = quant_int(prec.div(xv[i], sv[s]), zv[s], lo, hi));
            return out1(int_tensor(to, x.shape(), q)?);
        }
        let Some(m) = mini_of(to) else {
            unsupported!("{OP}: quantizing to {to} is not supported");
        };
        let mut q = vec![0u8; n];
        // float4 always adds the zero point (so -0 becomes +0, as in the reference); float8
        // adds it only when it is not zero, keeping the sign of a zero quotient
        let fp4 = to == DataType::Float4E2M1;
        lay.for_each(|i, s| {
            let v = prec.div(xv[i], sv[s]);
            let v = if fp4 || zv[s] != 0.0 { v + zv[s] } else { v };
            q[i] = mini_encode(m, v, saturate);
        });
        out1(encode_mini(to, x.shape(), q)?)
    })
}

impl Layout {
    /// Calls `f(elements, scale index)` for each run of consecutive elements that share a
    /// scale, where runs exist (per tensor, per axis, and blocks along the innermost axis);
    /// returns false, calling nothing, otherwise.
    fn for_runs(&self, mut f: impl FnMut(core::ops::Range<usize>, usize)) -> bool {
        match self.gran {
            Gran::Tensor => f(0..self.outer * self.d * self.inner, 0),
            Gran::Axis => {
                for o in 0..self.outer {
                    for k in 0..self.d {
                        let at = (o * self.d + k) * self.inner;
                        f(at..at + self.inner, k);
                    }
                }
            }
            Gran::Block { s, b } if self.inner == 1 => {
                for o in 0..self.outer {
                    for bi in 0..s {
                        let k0 = bi * b;
                        let at = o * self.d + k0;
                        f(at..at + b.min(self.d.saturating_sub(k0)), o * s + bi);
                    }
                }
            }
            Gran::Block { .. } => return false,
        }
        true
    }
}

/// QuantizeLinear of f32 by f32 scales into int8 or uint8 (what quantized graphs run): in f32,
/// rounding half to even as the general path does. `None` for anything else.
fn quantize_fast(
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
    to: DataType,
    prec: Prec,
    lay: &Layout,
) -> Result<Option<Tensor>> {
    if x.dtype() != DataType::Float
        || scale.dtype() != DataType::Float
        || prec != Prec::F32
        || !matches!(to, DataType::Uint8 | DataType::Int8)
    {
        return Ok(None);
    }
    let (lo, hi) = if to == DataType::Uint8 {
        (0.0f32, 255.0f32)
    } else {
        (-128.0, 127.0)
    };
    let xs = x.as_slice::<f32>()?;
    let sv = scale.as_slice::<f32>()?;
    let zv: Vec<f32> = match zp {
        Some(z) => z.to_i64_vec()?.into_iter().map(|v| v as f32).collect(),
        None => vec![0.0; sv.len()],
    };
    let mut y = vec![0u8; xs.len()];
    let whole = lay.for_runs(|r, si| {
        let q = crate::simd::Q8 { zp: zv[si], lo, hi };
        crate::simd::quantize_q8(&xs[r.clone()], sv[si], q, &mut y[r]);
    });
    if !whole {
        return Ok(None);
    }
    Ok(Some(crate::kernels::qlinear::q8_tensor(to, x.shape(), y)?))
}

/// DequantizeLinear of int8 or uint8 by f32 scales into f32: `(x - z) * s` in f32 (the
/// difference is exact). `None` for anything else.
fn dequantize_fast(
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
    to: DataType,
    lay: &Layout,
) -> Result<Option<Tensor>> {
    if !matches!(x.dtype(), DataType::Uint8 | DataType::Int8)
        || scale.dtype() != DataType::Float
        || to != DataType::Float
    {
        return Ok(None);
    }
    let (xb, signed) = crate::kernels::nn::q8_bytes(x)?;
    let sv = scale.as_slice::<f32>()?;
    let zv: Vec<f32> = match zp {
        Some(z) => z.to_i64_vec()?.into_iter().map(|v| v as f32).collect(),
        None => vec![0.0; sv.len()],
    };
    let mut y = vec![0f32; xb.len()];
    let whole = lay.for_runs(|r, si| {
        crate::simd::dequantize_q8(&xb[r.clone()], signed, zv[si], sv[si], &mut y[r]);
    });
    if !whole {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(x.shape(), y)?))
}

// ----------------------------------------------------------------------------- DequantizeLinear

/// Types DequantizeLinear reads.
fn dequant_source(dt: DataType) -> bool {
    int_range(dt).is_some() || mini_of(dt).is_some() || dt == DataType::Int32
}

fn build_dequantize(node: &Node) -> Result<Box<dyn Kernel>> {
    const OP: &str = "DequantizeLinear";
    let opset = node.opset;
    let axis = if opset >= 13 {
        node.get_i("axis", 1)?
    } else {
        1
    };
    let block = block_size(node, OP)?;
    let out_attr = if opset >= 23 {
        dtype_attr(node, "output_dtype", OP)?
    } else {
        None
    };
    if let Some(dt) = out_attr {
        if !matches!(dt, DataType::Float | DataType::Float16 | DataType::Bfloat16) {
            unsupported!("{OP}: output_dtype {dt} is not supported (float, float16, bfloat16)");
        }
    }
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let scale = tensor_in(inputs, 1)?;
        let zp = zero_point(OP, opt_tensor_in(inputs, 2)?, scale)?;
        if opset < 21 && scale.rank() > 1 {
            bail!("{OP}: scale must be a scalar or 1-D before opset 21");
        }
        if opset < 13 && scale.len() != 1 {
            bail!("{OP}: scale must be a scalar before opset 13");
        }
        let xdt = x.dtype();
        if !dequant_source(xdt) {
            unsupported!("{OP}: input type {xdt} is not supported");
        }
        if let Some(z) = zp {
            if z.dtype() != xdt {
                bail!(
                    "{OP}: zero point type {} differs from input type {xdt}",
                    z.dtype()
                );
            }
        }
        let sdt = scale.dtype();
        if !matches!(
            sdt,
            DataType::Float | DataType::Float16 | DataType::Bfloat16 | DataType::Float8E8M0
        ) {
            unsupported!("{OP}: scale type {sdt} is not supported");
        }
        let to = match out_attr {
            Some(o) => o,
            None if sdt == DataType::Float8E8M0 => {
                unsupported!("{OP}: a float8e8m0 scale needs the output_dtype attribute")
            }
            None => sdt,
        };
        let lay = layout(OP, x.shape(), scale.shape(), axis, block)?;
        if let Some(t) = dequantize_fast(x, scale, zp, to, &lay)? {
            return out1(t);
        }
        let xv = values_f64(x, OP)?;
        let sv = values_f64(scale, OP)?;
        let zv = match zp {
            Some(z) => values_f64(z, OP)?,
            None => vec![0.0; sv.len()],
        };
        // (x - zero_point) is exact in f64; the product is taken in f32 like the reference,
        // except for int32 inputs, whose differences need f64
        let wide = xdt == DataType::Int32;
        let mut y = vec![0f64; xv.len()];
        lay.for_each(|i, s| {
            let p = (xv[i] - zv[s]) * sv[s];
            y[i] = if wide { p } else { f64::from(p as f32) };
        });
        let shape = x.shape();
        out1(match to {
            DataType::Float => Tensor::from_vec(shape, y.into_iter().map(|v| v as f32).collect())?,
            DataType::Float16 => {
                Tensor::from_vec(shape, y.into_iter().map(f16::from_f64).collect())?
            }
            DataType::Bfloat16 => {
                Tensor::from_vec(shape, y.into_iter().map(bf16::from_f64).collect())?
            }
            _ => unsupported!("{OP}: output type {to} is not supported"),
        })
    })
}

// ----------------------------------------------------------------------------- DynamicQuantizeLinear

fn build_dynamic_quantize(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.dtype() != DataType::Float {
            unsupported!(
                "DynamicQuantizeLinear: input type {} is not supported",
                x.dtype()
            );
        }
        let xv = x.as_slice::<f32>()?;
        let (qmin, qmax) = (0.0f32, 255.0f32);
        // the range always includes 0; NaN propagates like numpy's max/min
        let (lo, hi) = crate::simd::range_with_zero(&xv);
        let scale = if hi == lo { 1.0 } else { hi - lo } / (qmax - qmin);
        let zp0 = qmin - lo / scale;
        let zp = libm::rintf(zp0.clamp(qmin, qmax));
        let mut y = vec![0u8; xv.len()];
        if zp.is_nan() || scale.is_nan() {
            // NaN everywhere: the general path's rule (NaN quantizes to 0)
        } else {
            let q = crate::simd::Q8 {
                zp,
                lo: qmin,
                hi: qmax,
            };
            crate::simd::quantize_q8(&xv, scale, q, &mut y);
        }
        Ok(vec![
            Value::Tensor(Tensor::from_vec(x.shape(), y)?),
            Value::Tensor(Tensor::scalar(scale)),
            Value::Tensor(Tensor::scalar(if zp.is_nan() { 0u8 } else { zp as u8 })),
        ])
    })
}

// ----------------------------------------------------------------------------- BitCast

/// Little-endian storage bytes of every element.
fn le_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.contiguous()?;
    macro_rules! le {
        ($T:ty) => {
            t.as_slice::<$T>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        };
    }
    Ok(match t.dtype() {
        DataType::Float => le!(f32),
        DataType::Double => le!(f64),
        DataType::Float16 => le!(f16),
        DataType::Bfloat16 => le!(bf16),
        DataType::Int8 => le!(i8),
        DataType::Int16 => le!(i16),
        DataType::Int32 => le!(i32),
        DataType::Int64 => le!(i64),
        DataType::Uint8 => le!(u8),
        DataType::Uint16 => le!(u16),
        DataType::Uint32 => le!(u32),
        DataType::Uint64 => le!(u64),
        DataType::Bool => t.as_slice::<bool>()?.iter().map(|&b| b as u8).collect(),
        DataType::String => unsupported!("BitCast from string is not supported"),
        dt => {
            let need = dt.storage_bytes(t.len()).unwrap_or(usize::MAX);
            let b = if is_raw(dt) {
                raw_data(&t)?
            } else {
                t.raw_bytes()?
            };
            if b.len() < need {
                bail!("{dt} tensor storage is too short");
            }
            b[..need].to_vec()
        }
    })
}

/// A tensor of element type `dt` over little-endian storage bytes.
fn from_le_bytes(dt: DataType, shape: &[usize], b: Vec<u8>) -> Result<Tensor> {
    macro_rules! fr {
        ($T:ty, $w:expr) => {
            Tensor::from_vec(
                shape,
                b.chunks_exact($w)
                    .map(|c| <$T>::from_le_bytes(c.try_into().unwrap_or([0; $w])))
                    .collect::<Vec<$T>>(),
            )
        };
    }
    match dt {
        DataType::Float => fr!(f32, 4),
        DataType::Double => fr!(f64, 8),
        DataType::Float16 => fr!(f16, 2),
        DataType::Bfloat16 => fr!(bf16, 2),
        DataType::Int8 => fr!(i8, 1),
        DataType::Int16 => fr!(i16, 2),
        DataType::Int32 => fr!(i32, 4),
        DataType::Int64 => fr!(i64, 8),
        DataType::Uint8 => fr!(u8, 1),
        DataType::Uint16 => fr!(u16, 2),
        DataType::Uint32 => fr!(u32, 4),
        DataType::Uint64 => fr!(u64, 8),
        DataType::Bool => {
            if let Some(&bad) = b.iter().find(|&&v| v > 1) {
                bail!("BitCast to bool: byte {bad} is not a valid bool");
            }
            Tensor::from_vec(shape, b.into_iter().map(|v| v != 0).collect())
        }
        DataType::String => unsupported!("BitCast to string is not supported"),
        _ => Tensor::from_data(dt, shape.to_vec(), Data::Raw(b)),
    }
}

fn build_bitcast(node: &Node) -> Result<Box<dyn Kernel>> {
    let to = match node.attr_i("to")? {
        Some(c) => match i32::try_from(c).ok().and_then(DataType::from_code) {
            Some(dt) => dt,
            None => unsupported!("BitCast: unknown target element type code {c}"),
        },
        None => bail!("BitCast: attribute 'to' is required"),
    };
    if to == DataType::String {
        unsupported!("BitCast to string is not supported");
    }
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let from = x.dtype();
        if from == DataType::String {
            unsupported!("BitCast from string is not supported");
        }
        if from.bits() != to.bits() {
            bail!(
                "BitCast: {from} ({} bits) and {to} ({} bits) differ in width",
                from.bits(),
                to.bits()
            );
        }
        if from == to {
            return out1(x.clone());
        }
        out1(from_le_bytes(to, x.shape(), le_bytes(x)?)?)
    })
}

#[cfg(test)]
mod tests {
    //! Expected values are worked out by hand from the ONNX definitions.
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;
    use crate::tensor::Elem;
    use alloc::string::{String, ToString};

    fn run_n(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: Vec<Option<Tensor>>,
    ) -> Result<Vec<Tensor>> {
        let n = Node {
            name: "n".to_string(),
            op_type: op.to_string(),
            domain: String::new(),
            opset,
            inputs: Vec::new(),
            outputs: vec![Some(0), Some(1), Some(2)],
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        };
        let def = KERNELS
            .iter()
            .find(|d| d.op == op && opset >= d.since && opset <= d.until)
            .expect("kernel registered");
        let k = (def.build)(&n)?;
        let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| t.map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &refs)?;
        out.into_iter().map(|v| v.into_tensor()).collect()
    }

    fn run(op: &str, attrs: Vec<(&str, AttrValue)>, inputs: Vec<Option<Tensor>>) -> Result<Tensor> {
        Ok(run_n(op, 28, attrs, inputs)?.remove(0))
    }

    fn t<T: Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    #[test]
    fn quantize_uint8_rounds_half_to_even_and_saturates() {
        let x = t(&[6], vec![0.0f32, 1.0, 3.0, 5.0, 1000.0, -1000.0]);
        let y = run(
            "QuantizeLinear",
            vec![],
            vec![
                Some(x),
                Some(Tensor::scalar(2.0f32)),
                Some(Tensor::scalar(128u8)),
            ],
        )
        .unwrap();
        // 0.5 -> 0, 1.5 -> 2, 2.5 -> 2 (ties to even), then + 128 and clip to [0, 255]
        assert_eq!(&*y.as_slice::<u8>().unwrap(), &[128, 128, 130, 130, 255, 0]);
    }

    #[test]
    fn quantize_per_axis_and_int4_packing() {
        let x = t(&[2, 2], vec![1.0f32, 4.0, -3.0, 20.0]);
        let scale = t(&[2], vec![1.0f32, 2.0]);
        let zp = Tensor::from_data(DataType::Int4, vec![2], Data::Raw(vec![0x10])).unwrap();
        let y = run(
            "QuantizeLinear",
            vec![],
            vec![Some(x), Some(scale), Some(zp)],
        )
        .unwrap();
        // column 0: scale 1, zp 0 -> 1, -3; column 1: scale 2, zp 1 -> 3, 11 -> clipped to 7
        assert_eq!(y.dtype(), DataType::Int4);
        // codes 1, 3, -3 (0xD), 7 packed low nibble first
        assert_eq!(y.raw_bytes().unwrap(), &[0x31, 0x7D]);
    }

    #[test]
    fn dequantize_blocked() {
        // x [2, 4], blocks of 2 along axis 1 -> scale [2, 2]
        let x = t(&[2, 4], vec![1i8, 2, 3, 4, -1, -2, -3, -4]);
        let scale = t(&[2, 2], vec![1.0f32, 10.0, 0.5, 2.0]);
        let zp = t(&[2, 2], vec![0i8, 1, 0, -1]);
        let y = run(
            "DequantizeLinear",
            vec![("block_size", AttrValue::Int(2))],
            vec![Some(x), Some(scale), Some(zp)],
        )
        .unwrap();
        assert_eq!(
            &*y.as_slice::<f32>().unwrap(),
            &[1.0, 2.0, 20.0, 30.0, -0.5, -1.0, -4.0, -6.0]
        );
        // a scale that does not tile the input is an error
        let bad = run(
            "DequantizeLinear",
            vec![("block_size", AttrValue::Int(3))],
            vec![
                Some(t(&[2, 4], vec![0i8; 8])),
                Some(t(&[2, 3], vec![1.0f32; 6])),
                None,
            ],
        );
        assert!(bad.is_err());
    }

    #[test]
    fn float8_round_trip() {
        // 3.3 / 1 -> e4m3fn: 3.25 (0x45) is nearest (step 0.25 in [2, 4)); 1000 saturates to 448
        let x = t(&[2], vec![3.3f32, 1000.0]);
        let zp = Tensor::from_data(DataType::Float8E4M3FN, vec![], Data::Raw(vec![0])).unwrap();
        let q = run(
            "QuantizeLinear",
            vec![],
            vec![Some(x), Some(Tensor::scalar(1.0f32)), Some(zp)],
        )
        .unwrap();
        assert_eq!(q.raw_bytes().unwrap(), &[0x45, 0x7E]);
        let y = run(
            "DequantizeLinear",
            vec![],
            vec![Some(q), Some(Tensor::scalar(2.0f32)), None],
        )
        .unwrap();
        assert_eq!(&*y.as_slice::<f32>().unwrap(), &[6.5, 896.0]);
    }

    #[test]
    fn dynamic_quantize() {
        // range [-1, 2] -> scale 3/255; zp = rint(1 / (3/255)) = rint(85) = 85
        let x = t(&[3], vec![-1.0f32, 0.0, 2.0]);
        let out = run_n("DynamicQuantizeLinear", 11, vec![], vec![Some(x)]).unwrap();
        assert_eq!(&*out[0].as_slice::<u8>().unwrap(), &[0, 85, 255]);
        assert_eq!(out[1].as_slice::<f32>().unwrap()[0], 3.0f32 / 255.0);
        assert_eq!(out[2].as_slice::<u8>().unwrap()[0], 85);
    }

    #[test]
    fn bitcast_reinterprets_bits() {
        let x = t(&[2], vec![1.0f32, -2.0]);
        let y = run(
            "BitCast",
            vec![("to", AttrValue::Int(DataType::Int32.code() as i64))],
            vec![Some(x.clone())],
        )
        .unwrap();
        assert_eq!(
            &*y.as_slice::<i32>().unwrap(),
            &[0x3F80_0000, 0xC000_0000u32 as i32]
        );
        let bad = run(
            "BitCast",
            vec![("to", AttrValue::Int(DataType::Int64.code() as i64))],
            vec![Some(x)],
        );
        assert!(bad.is_err());
    }
}
