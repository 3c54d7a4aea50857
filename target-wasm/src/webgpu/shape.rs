//! Split (sizes from the attribute, the host input or `num_outputs`), Expand (the shape on
//! the host), for float32 and float16 alike, and Cast between float32 and float16 (to its own
//! type: a view; every other Cast stays on the CPU).

use nxrt_core::ir::{AttrValue, Node};
use nxrt_core::kernels::{broadcast_shapes, norm_axis};
use nxrt_core::{DataType, Error, Result, Tensor, Value};

use super::data::copy_elems;
use super::ew::bcast_strides;
use super::module_header;
use super::reduce::word;
use super::{dev_in, host_i64s, out1, shader_1d, view_of, Exec, Gpu, GpuBuf, OpDef, Store};

const WG: u32 = 256;

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Split",
        since: 2,
        type_input: 0,
        half: true,
        host: &[1],
        build: build_split,
    },
    OpDef {
        op: "Expand",
        since: 8,
        type_input: 0,
        half: true,
        host: &[1],
        build: build_expand,
    },
    OpDef {
        op: "Cast",
        since: 6,
        type_input: 0,
        half: true,
        host: &[],
        build: build_cast,
    },
];

fn dims(v: &[i64], what: &str) -> Result<Vec<usize>> {
    v.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| Error::Shape(format!("{what}: negative size {d}")))
        })
        .collect()
}

// ----------------------------------------------------------------------------- Split

fn build_split(node: &Node) -> Result<Exec> {
    let axis = node.get_i("axis", 0)?;
    let n_out = node.outputs.len();
    let opset = node.opset;
    let attr_split = if opset < 13 {
        node.attr_ints("split")?
    } else {
        None
    };
    let num_outputs = if opset >= 18 {
        node.attr_i("num_outputs")?
    } else {
        None
    };
    if let Some(n) = num_outputs {
        if n < 1 || n as usize != n_out {
            return Err(Error::Other(format!(
                "Split num_outputs={n} does not match the node's {n_out} outputs"
            )));
        }
    }
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        if x.rank() == 0 {
            return Err(Error::Shape("Split input must have rank >= 1".into()));
        }
        let a = norm_axis(axis, x.rank())?;
        let d = x.shape()[a];
        let given = match host_i64s(inputs, 1)? {
            Some(s) if opset >= 13 => Some(s),
            _ => attr_split.clone(),
        };
        let sizes: Vec<usize> = match given {
            Some(s) => {
                let s = dims(&s, "Split")?;
                if s.len() != n_out || s.iter().sum::<usize>() != d {
                    return Err(Error::Shape(format!(
                        "Split sizes {s:?} do not cut a dim of {d} into {n_out} outputs"
                    )));
                }
                s
            }
            None if num_outputs.is_some() => {
                let c = d.div_ceil(n_out);
                if c * (n_out - 1) > d {
                    return Err(Error::Shape(format!(
                        "cannot split a dim of {d} into {n_out} outputs"
                    )));
                }
                let mut s = vec![c; n_out];
                s[n_out - 1] = d - c * (n_out - 1);
                s
            }
            None => {
                if n_out == 0 || d % n_out != 0 {
                    return Err(Error::Shape(format!(
                        "cannot split a dim of {d} evenly into {n_out} outputs"
                    )));
                }
                vec![d / n_out; n_out]
            }
        };
        split(gpu, x, xb, a, &sizes)
    }))
}

/// Each part: `outer` rows of `s * inner` elements, copied with one buffer copy when there is
/// one row (and, for f16 storage, 4-byte aligned: [`copy_elems`]), one dispatch otherwise.
fn split(gpu: &Gpu, x: &Tensor, xb: &GpuBuf, a: usize, sizes: &[usize]) -> Result<Vec<Value>> {
    let st = gpu.store(x.dtype())?;
    let shape = x.shape();
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product();
    let row = shape[a] * inner;
    let mut outs = Vec::with_capacity(sizes.len());
    let mut at = 0usize;
    for &s in sizes {
        let mut sh = shape.to_vec();
        sh[a] = s;
        let (y, yb) = gpu.alloc(x.dtype(), &sh)?;
        let len = s * inner;
        let copied = outer == 1
            && copy_elems(
                gpu,
                xb.raw(),
                (at, x.len()),
                yb.raw(),
                (0, len),
                len,
                st.bytes(),
            )?;
        if !copied && !y.is_empty() {
            let n = y.len();
            let mut p = [
                0,
                word(n, "elements")?,
                word(len, "a Split row")?,
                word(row, "a row")?,
                word(at, "an offset")?,
            ];
            let pipe = gpu.pipeline(&format!("split_rows:{}", st.key()), || {
                let body = shader_1d(
                    &[("x", "read", "T"), ("y", "read_write", "T")],
                    WG,
                    "",
                    "  if (i >= p[1]) { return; }
  y[i] = x[(i / p[2]) * p[3] + p[4] + i % p[2]];",
                );
                format!("{}{body}", st.header())
            })?;
            gpu.dispatch(&pipe, &mut p, &[xb.raw(), yb.raw()], n as u64, WG)?;
        }
        at += len;
        outs.push(Value::Tensor(y));
    }
    Ok(outs)
}

// ----------------------------------------------------------------------------- Expand

/// A new device tensor of shape `out` with `x` broadcast into it (numpy rules, `x`'s shape
/// right-aligned; the caller checks that it broadcasts), of `x`'s element type.
pub(crate) fn expand_to(gpu: &Gpu, x: &Tensor, xb: &GpuBuf, out: &[usize]) -> Result<Tensor> {
    let store = gpu.store(x.dtype())?;
    let (y, yb) = gpu.alloc(x.dtype(), out)?;
    let n = y.len();
    if n == 0 {
        return Ok(y);
    }
    // drop the output's unit axes (they do not move the index) and merge neighbours that
    // both repeat or are both contiguous in x
    let st = bcast_strides(x.shape(), out);
    let mut ds: Vec<(u32, u32)> = Vec::new();
    for (k, &d) in out.iter().enumerate() {
        if d == 1 {
            continue;
        }
        let (d, s) = (word(d, "a dimension")?, st[k]);
        match ds.last_mut() {
            Some(last) if (last.1 == 0 && s == 0) || (s != 0 && last.1 == s * d) => {
                last.0 *= d;
                last.1 = s;
            }
            _ => ds.push((d, s)),
        }
    }
    let mut p = vec![0, word(n, "elements")?, ds.len() as u32];
    p.extend(ds.iter().map(|v| v.0));
    p.extend(ds.iter().map(|v| v.1));
    let pipe = gpu.pipeline(&format!("expand:{}", store.key()), || {
        let body = shader_1d(
            &[("x", "read", "T"), ("y", "read_write", "T")],
            WG,
            "",
            "  if (i >= p[1]) { return; }
  let r = p[2];
  var rem = i;
  var o = 0u;
  for (var d = r; d > 0u; d--) {
    let dim = p[2u + d];
    o += (rem % dim) * p[2u + r + d];
    rem = rem / dim;
  }
  y[i] = x[o];",
        );
        format!("{}{body}", store.header())
    })?;
    gpu.dispatch(&pipe, &mut p, &[xb.raw(), yb.raw()], n as u64, WG)?;
    Ok(y)
}

fn build_expand(_node: &Node) -> Result<Exec> {
    Ok(Box::new(|gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let target =
            host_i64s(inputs, 1)?.ok_or_else(|| Error::Other("Expand without a shape".into()))?;
        let shape = broadcast_shapes(x.shape(), &dims(&target, "Expand")?)?;
        if shape == x.shape() {
            return out1(view_of(x, shape)?);
        }
        out1(expand_to(gpu, x, xb, &shape)?)
    }))
}

// ----------------------------------------------------------------------------- Cast

/// float32 -> float16 with IEEE round-to-nearest-even, as the f16 bits in the low half of a
/// u32: computed on the integers, so overflow (to infinity: 65520 and up), subnormals, ties and
/// NaN come out exactly as the CPU's `f16::from_f32` whatever the driver's conversions do
/// (WGSL leaves out-of-range conversions and packing indeterminate).
const F16_BITS: &str = "
fn f16_bits(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  let s = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return s | 0x7e00u; }
  if (a >= 0x477ff000u) { return s | 0x7c00u; }
  if (a >= 0x38800000u) {
    let m = a - 0x38000000u;
    return s | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
  }
  if (a <= 0x33000000u) { return s; }
  let sh = 126u - (a >> 23u);
  let man = (a & 0x7fffffu) | 0x800000u;
  var q = man >> sh;
  let rem = man & ((1u << sh) - 1u);
  let hf = 1u << (sh - 1u);
  if (rem > hf || (rem == hf && (q & 1u) == 1u)) { q += 1u; }
  return s | q;
}
";

/// The module of a Cast from `from` to `to` storage, over output words: into f16 storage, each
/// invocation writes one u32 holding two elements' f16 bits (exact: WGSL's own f32 -> f16
/// conversion is indeterminate past f16's range, and naga has no bitcast from u32 to
/// `vec2<f16>`); into f16 values held as f32 words, the same rounded value widened (infinite
/// past f16's range, like a real f16); from f16 into f32, the value (f16 widens exactly). The
/// f32 words of F16AsF32 may hold values past f16's range (its `st` leaves them there): they
/// read as the f16 they stand for.
fn cast_module(from: Store, to: Store) -> String {
    if to == Store::F16 {
        let body = shader_1d(
            &[("x", "read", "f32"), ("y", "read_write", "u32")],
            WG,
            F16_BITS,
            "  let j = 2u * i;
  if (j >= p[1]) { return; }
  var hi = 0u;
  if (j + 1u < p[1]) { hi = f16_bits(x[j + 1u]); }
  y[i] = f16_bits(x[j]) | (hi << 16u);",
        );
        return format!("{}{body}", module_header(&[from], to));
    }
    let cv = if from == Store::F16AsF32 || to == Store::F16AsF32 {
        format!("{F16_BITS}fn cv(v: f32) -> T {{ return unpack2x16float(f16_bits(v)).x; }}\n")
    } else {
        "fn cv(v: f32) -> T { return v; }\n".into()
    };
    let body = shader_1d(
        &[("x", "read", from.ty()), ("y", "read_write", "T")],
        WG,
        &cv,
        "  if (i >= p[1]) { return; }\n  y[i] = cv(f32(x[i]));",
    );
    format!("{}{body}", module_header(&[from], to))
}

/// Cast between float32 and float16 (the type input is checked to be one of them): to the
/// input's own type a view, otherwise one dispatch; any other target stays on the CPU.
fn build_cast(node: &Node) -> Result<Exec> {
    let to = match node.attr("to") {
        Some(AttrValue::Int(c)) if *c == DataType::Float.code() as i64 => DataType::Float,
        Some(AttrValue::Int(c)) if *c == DataType::Float16.code() as i64 => DataType::Float16,
        _ => {
            return Err(Error::Other(
                "the WebGPU Cast kernel casts between float32 and float16 only".into(),
            ))
        }
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        if x.dtype() == to {
            return out1(view_of(x, x.shape().to_vec())?);
        }
        let (from, into) = (gpu.store(x.dtype())?, gpu.store(to)?);
        let (y, yb) = gpu.alloc(to, x.shape())?;
        let n = y.len();
        if n == 0 {
            return out1(y);
        }
        let mut p = [0, word(n, "elements")?];
        let key = format!("cast:{}:{}", from.key(), into.key());
        let pipe = gpu.pipeline(&key, || cast_module(from, into))?;
        // into f16 storage: an invocation per pair of elements
        let count = if into == Store::F16 { n.div_ceil(2) } else { n };
        gpu.dispatch(&pipe, &mut p, &[xb.raw(), yb.raw()], count as u64, WG)?;
        out1(y)
    }))
}
