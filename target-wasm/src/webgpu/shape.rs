//! Split (sizes from the attribute, the host input or `num_outputs`), Expand (the shape on
//! the host) and Cast from f32 to f32 (a view; every other Cast stays on the CPU).

use nxrt_core::ir::{AttrValue, Node};
use nxrt_core::kernels::{broadcast_shapes, norm_axis, tensor_in};
use nxrt_core::{DataType, Error, Result, Tensor, Value};

use super::ew::bcast_strides;
use super::reduce::word;
use super::{dev_in, host_i64s, out1, shader_1d, view_of, Exec, Gpu, GpuBuf, OpDef};

const WG: u32 = 256;

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Split",
        since: 2,
        type_input: 0,
        half: false,
        host: &[1],
        build: build_split,
    },
    OpDef {
        op: "Expand",
        since: 8,
        type_input: 0,
        half: false,
        host: &[1],
        build: build_expand,
    },
    OpDef {
        op: "Cast",
        since: 6,
        type_input: 0,
        half: false,
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
/// one row, one dispatch otherwise.
fn split(gpu: &Gpu, x: &Tensor, xb: &GpuBuf, a: usize, sizes: &[usize]) -> Result<Vec<Value>> {
    let shape = x.shape();
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product();
    let row = shape[a] * inner;
    let mut outs = Vec::with_capacity(sizes.len());
    let mut at = 0usize;
    for &s in sizes {
        let mut sh = shape.to_vec();
        sh[a] = s;
        let (y, yb) = gpu.alloc(DataType::Float, &sh)?;
        let len = s * inner;
        if outer == 1 {
            gpu.copy(xb.raw(), (at * 4) as u64, yb.raw(), 0, (len * 4) as u64)?;
        } else if !y.is_empty() {
            let n = y.len();
            let mut p = [
                0,
                word(n, "elements")?,
                word(len, "a Split row")?,
                word(row, "a row")?,
                word(at, "an offset")?,
            ];
            let pipe = gpu.pipeline("split_rows", || {
                shader_1d(
                    &[("x", "read", "f32"), ("y", "read_write", "f32")],
                    WG,
                    "",
                    "  if (i >= p[1]) { return; }
  y[i] = x[(i / p[2]) * p[3] + p[4] + i % p[2]];",
                )
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
/// right-aligned; the caller checks that it broadcasts).
pub(crate) fn expand_to(gpu: &Gpu, x: &Tensor, xb: &GpuBuf, out: &[usize]) -> Result<Tensor> {
    let (y, yb) = gpu.alloc(DataType::Float, out)?;
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
    let pipe = gpu.pipeline("expand", || {
        shader_1d(
            &[("x", "read", "f32"), ("y", "read_write", "f32")],
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
        )
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

/// Cast to float of a float tensor (the type input is checked to be f32): the input's buffer.
fn build_cast(node: &Node) -> Result<Exec> {
    match node.attr("to") {
        Some(AttrValue::Int(c)) if *c == DataType::Float.code() as i64 => {}
        _ => {
            return Err(Error::Other(
                "the WebGPU Cast kernel casts f32 to f32 only".into(),
            ))
        }
    }
    Ok(Box::new(|_gpu: &Gpu, inputs| {
        let x = tensor_in(inputs, 0)?;
        out1(view_of(x, x.shape().to_vec())?)
    }))
}
