//! Data movement: the reshaping ops are views of their input's buffer (no dispatch);
//! Transpose, Slice and Gather are one gather-style dispatch each; Concat is one buffer copy per
//! input when it joins along the outermost non-unit axis, one dispatch per input otherwise.
//!
//! Every kernel here moves elements without arithmetic, so float32 and float16 (either
//! [`Store`](super::Store)) are the same code over the storage type `T`, and exact. Buffer
//! copies need 4-byte offsets and sizes, which 2-byte f16 elements only give at even positions
//! ([`copy_elems`]); a part at an odd one takes the element-indexed copy shader instead.

use nxrt_core::ir::Node;
use nxrt_core::kernels::tensor_in;
use nxrt_core::{Error, Result};

use super::ew::MAX_RANK;
use super::{dev_in, host_i64s, out1, shader_1d, view_of, Exec, Gpu, GpuBuf, OpDef};

const WG: u32 = 256;

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Reshape",
        since: 5,
        type_input: 0,
        half: true,
        host: &[1],
        build: build_reshape,
    },
    OpDef {
        op: "Flatten",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_flatten,
    },
    OpDef {
        op: "Squeeze",
        since: 1,
        type_input: 0,
        half: true,
        host: &[1],
        build: build_squeeze,
    },
    OpDef {
        op: "Unsqueeze",
        since: 1,
        type_input: 0,
        half: true,
        host: &[1],
        build: build_unsqueeze,
    },
    OpDef {
        op: "Transpose",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_transpose,
    },
    OpDef {
        op: "Slice",
        since: 10,
        type_input: 0,
        half: true,
        host: &[1, 2, 3, 4],
        build: build_slice,
    },
    OpDef {
        op: "Gather",
        since: 1,
        type_input: 0,
        half: true,
        host: &[1],
        build: build_gather,
    },
    OpDef {
        op: "Concat",
        since: 4,
        type_input: 0,
        half: true,
        host: &[],
        build: build_concat,
    },
];

/// `src` elements `src_at..src_at + len` (of `src_n`) copied to `dst` from element `dst_at` (of
/// `dst_n`) as one buffer copy, elements `eb` bytes wide; `false` (nothing done) where that
/// cannot be one: a buffer copy's offsets and size are multiples of 4 bytes, so 2-byte elements
/// need even offsets, and an odd count only when the range ends both tensors (the copy then
/// rounds up into the buffers' padding: their sizes round up to 4 bytes).
pub(super) fn copy_elems(
    gpu: &Gpu,
    src: &wgpu::Buffer,
    (src_at, src_n): (usize, usize),
    dst: &wgpu::Buffer,
    (dst_at, dst_n): (usize, usize),
    len: usize,
    eb: u64,
) -> Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    let (so, doff) = (src_at as u64 * eb, dst_at as u64 * eb);
    let mut bytes = len as u64 * eb;
    if so % 4 != 0 || doff % 4 != 0 {
        return Ok(false);
    }
    if !bytes.is_multiple_of(4) {
        if src_at + len != src_n || dst_at + len != dst_n {
            return Ok(false);
        }
        bytes = bytes.div_ceil(4) * 4;
    }
    gpu.copy(src, so, dst, doff, bytes)?;
    Ok(true)
}

fn norm_axis(a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    if (0..r).contains(&v) {
        Ok(v as usize)
    } else {
        Err(Error::Shape(format!(
            "axis {a} is out of range for rank {rank}"
        )))
    }
}

fn build_reshape(node: &Node) -> Result<Exec> {
    let allowzero = node.get_i("allowzero", 0)? != 0;
    Ok(Box::new(move |_gpu: &Gpu, inputs| {
        let x = tensor_in(inputs, 0)?;
        let spec =
            host_i64s(inputs, 1)?.ok_or_else(|| Error::Other("Reshape without shape".into()))?;
        let shape = nxrt_core::kernels::shape::reshape_dims(x.shape(), &spec, allowzero)?;
        out1(view_of(x, shape)?)
    }))
}

fn build_flatten(node: &Node) -> Result<Exec> {
    let axis = node.get_i("axis", 1)?;
    Ok(Box::new(move |_gpu: &Gpu, inputs| {
        let x = tensor_in(inputs, 0)?;
        let a = if axis < 0 {
            axis + x.rank() as i64
        } else {
            axis
        };
        if a < 0 || a > x.rank() as i64 {
            return Err(Error::Shape(format!(
                "Flatten axis {axis} for rank {}",
                x.rank()
            )));
        }
        let (l, r) = x.shape().split_at(a as usize);
        out1(view_of(x, vec![l.iter().product(), r.iter().product()])?)
    }))
}

fn axes_of(node: &Node, inputs: &[Option<&nxrt_core::Value>]) -> Result<Option<Vec<i64>>> {
    Ok(match node_axes(node)? {
        Some(a) => Some(a),
        None => host_i64s(inputs, 1)?,
    })
}

fn node_axes(node: &Node) -> Result<Option<Vec<i64>>> {
    node.attr_ints("axes")
}

fn build_squeeze(node: &Node) -> Result<Exec> {
    let node = node.clone();
    Ok(Box::new(move |_gpu: &Gpu, inputs| {
        let x = tensor_in(inputs, 0)?;
        let shape = match axes_of(&node, inputs)? {
            Some(axes) => {
                let ax: Vec<usize> = axes
                    .iter()
                    .map(|&a| norm_axis(a, x.rank()))
                    .collect::<Result<_>>()?;
                for &a in &ax {
                    if x.shape()[a] != 1 {
                        return Err(Error::Shape(format!(
                            "Squeeze axis {a} has size {}",
                            x.shape()[a]
                        )));
                    }
                }
                x.shape()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !ax.contains(i))
                    .map(|(_, &d)| d)
                    .collect()
            }
            None => x.shape().iter().copied().filter(|&d| d != 1).collect(),
        };
        out1(view_of(x, shape)?)
    }))
}

fn build_unsqueeze(node: &Node) -> Result<Exec> {
    let node = node.clone();
    Ok(Box::new(move |_gpu: &Gpu, inputs| {
        let x = tensor_in(inputs, 0)?;
        let axes =
            axes_of(&node, inputs)?.ok_or_else(|| Error::Other("Unsqueeze without axes".into()))?;
        let r = x.rank() + axes.len();
        let mut ax: Vec<usize> = axes
            .iter()
            .map(|&a| norm_axis(a, r))
            .collect::<Result<_>>()?;
        ax.sort_unstable();
        let mut shape = x.shape().to_vec();
        for a in ax {
            shape.insert(a, 1);
        }
        out1(view_of(x, shape)?)
    }))
}

/// A gather dispatch: output element `i` reads `x[base(i)]`, where the output index is split
/// over `dims` and each coordinate `c_d` adds `c_d * mul_d` (params: n, rank, start, dims,
/// muls). Transpose and Slice are both this.
fn strided_gather(
    gpu: &Gpu,
    x: &nxrt_core::Tensor,
    xb: &GpuBuf,
    out: &[usize],
    start: u32,
    muls: &[i64],
) -> Result<nxrt_core::Tensor> {
    if out.len() > MAX_RANK {
        return Err(Error::Other(format!("rank {} above {MAX_RANK}", out.len())));
    }
    let st = gpu.store(x.dtype())?;
    let (y, yb) = gpu.alloc(x.dtype(), out)?;
    let n = y.len();
    let mut p = vec![0, n as u32, out.len() as u32, start];
    p.extend(out.iter().map(|&d| d as u32));
    p.extend(muls.iter().map(|&m| m as i32 as u32));
    let pipe = gpu.pipeline(&format!("strided_gather:{}", st.key()), || {
        let body = shader_1d(
            &[("x", "read", "T"), ("y", "read_write", "T")],
            WG,
            "",
            "  if (i >= p[1]) { return; }
  let r = p[2];
  var rem = i;
  var o = i32(p[3]);
  for (var d = r; d > 0u; d--) {
    let dim = p[3u + d];
    let c = rem % dim;
    rem = rem / dim;
    o += i32(c) * bitcast<i32>(p[3u + r + d]);
  }
  y[i] = x[u32(o)];",
        );
        format!("{}{body}", st.header())
    })?;
    gpu.dispatch(&pipe, &mut p, &[xb.raw(), yb.raw()], n as u64, WG)?;
    Ok(y)
}

fn contiguous(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as i64;
    }
    s
}

fn build_transpose(node: &Node) -> Result<Exec> {
    let perm = node.attr_ints("perm")?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let r = x.rank();
        let p: Vec<usize> = match &perm {
            Some(p) => p.iter().map(|&a| norm_axis(a, r)).collect::<Result<_>>()?,
            None => (0..r).rev().collect(),
        };
        let mut seen = vec![false; r];
        for &a in &p {
            if std::mem::replace(&mut seen[a], true) {
                return Err(Error::Shape(format!(
                    "Transpose perm {p:?} repeats an axis"
                )));
            }
        }
        if p.len() != r {
            return Err(Error::Shape(format!("Transpose perm {p:?} for rank {r}")));
        }
        let xs = contiguous(x.shape());
        let out: Vec<usize> = p.iter().map(|&a| x.shape()[a]).collect();
        let muls: Vec<i64> = p.iter().map(|&a| xs[a]).collect();
        out1(strided_gather(gpu, x, xb, &out, 0, &muls)?)
    }))
}

fn build_slice(_node: &Node) -> Result<Exec> {
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let r = x.rank();
        let starts =
            host_i64s(inputs, 1)?.ok_or_else(|| Error::Other("Slice without starts".into()))?;
        let ends =
            host_i64s(inputs, 2)?.ok_or_else(|| Error::Other("Slice without ends".into()))?;
        let axes = host_i64s(inputs, 3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = host_i64s(inputs, 4)?.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(Error::Shape(
                "Slice starts/ends/axes/steps differ in length".into(),
            ));
        }
        let xs = contiguous(x.shape());
        let mut out = x.shape().to_vec();
        let mut muls = xs.clone();
        let mut start_off = 0i64;
        for j in 0..starts.len() {
            let a = norm_axis(axes[j], r)?;
            let d = x.shape()[a] as i64;
            let step = steps[j];
            if step == 0 {
                return Err(Error::Shape("Slice step 0".into()));
            }
            let clampv = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
            let fix = |v: i64| if v < 0 { v + d } else { v };
            let (s, e) = if step > 0 {
                (clampv(fix(starts[j]), 0, d), clampv(fix(ends[j]), 0, d))
            } else {
                (
                    clampv(fix(starts[j]), -1, d - 1),
                    clampv(fix(ends[j]), -1, d - 1),
                )
            };
            let len = if step > 0 {
                if e > s {
                    (e - s + step - 1) / step
                } else {
                    0
                }
            } else if s > e {
                (s - e + (-step) - 1) / (-step)
            } else {
                0
            };
            out[a] = len as usize;
            muls[a] = xs[a] * step;
            if len > 0 {
                start_off += s * xs[a];
            }
        }
        let start = u32::try_from(start_off).map_err(|_| Error::Shape("Slice offset".into()))?;
        out1(strided_gather(gpu, x, xb, &out, start, &muls)?)
    }))
}

fn build_gather(node: &Node) -> Result<Exec> {
    let axis = node.get_i("axis", 0)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let idx_t = tensor_in(inputs, 1)?;
        let idx = host_i64s(inputs, 1)?.unwrap_or_default();
        let a = norm_axis(axis, x.rank())?;
        let d = x.shape()[a] as i64;
        let fixed: Vec<u32> = idx
            .iter()
            .map(|&v| {
                let w = if v < 0 { v + d } else { v };
                if (0..d).contains(&w) {
                    Ok(w as u32)
                } else {
                    Err(Error::Shape(format!(
                        "Gather index {v} out of range for size {d}"
                    )))
                }
            })
            .collect::<Result<_>>()?;
        let outer: usize = x.shape()[..a].iter().product();
        let inner: usize = x.shape()[a + 1..].iter().product();
        let mut out: Vec<usize> = x.shape()[..a].to_vec();
        out.extend(idx_t.shape());
        out.extend(&x.shape()[a + 1..]);
        let st = gpu.store(x.dtype())?;
        let (y, yb) = gpu.alloc(x.dtype(), &out)?;
        if y.is_empty() {
            return out1(y);
        }
        let ib = gpu.table(bytemuck::cast_slice(&fixed), "Gather indices")?;
        let n = y.len();
        let mut p = vec![
            0,
            n as u32,
            inner as u32,
            fixed.len() as u32,
            d as u32,
            outer as u32,
        ];
        let pipe = gpu.pipeline(&format!("gather:{}", st.key()), || {
            let body = shader_1d(
                &[
                    ("x", "read", "T"),
                    ("ix", "read", "u32"),
                    ("y", "read_write", "T"),
                ],
                WG,
                "",
                "  if (i >= p[1]) { return; }
  let inner = p[2]; let ni = p[3];
  let c = i % inner;
  let j = (i / inner) % ni;
  let o = i / (inner * ni);
  y[i] = x[(o * p[4] + ix[j]) * inner + c];",
            );
            format!("{}{body}", st.header())
        })?;
        gpu.dispatch(&pipe, &mut p, &[xb.raw(), ib.raw(), yb.raw()], n as u64, WG)?;
        out1(y)
    }))
}

fn build_concat(node: &Node) -> Result<Exec> {
    let axis = node
        .attr_i("axis")?
        .ok_or_else(|| Error::Other("Concat without axis".into()))?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let first = tensor_in(inputs, 0)?;
        let r = first.rank();
        let a = norm_axis(axis, r)?;
        let mut out = first.shape().to_vec();
        out[a] = 0;
        let mut parts = Vec::new();
        for k in 0..inputs.len() {
            let (t, b) = dev_in(inputs, k)?;
            if t.rank() != r
                || t.shape()
                    .iter()
                    .enumerate()
                    .any(|(i, &d)| i != a && d != first.shape()[i])
            {
                return Err(Error::Shape(format!(
                    "Concat of {:?} and {:?} on axis {a}",
                    first.shape(),
                    t.shape()
                )));
            }
            if t.dtype() != first.dtype() {
                return Err(Error::Other(format!(
                    "Concat of {} and {}",
                    first.dtype(),
                    t.dtype()
                )));
            }
            out[a] += t.shape()[a];
            parts.push((t, b));
        }
        let st = gpu.store(first.dtype())?;
        let (y, yb) = gpu.alloc(first.dtype(), &out)?;
        let total = y.len();
        let outer: usize = out[..a].iter().product();
        let inner: usize = out[a + 1..].iter().product();
        let mut at = 0usize;
        for (t, b) in parts {
            let len = t.shape()[a] * inner;
            let copied = outer == 1
                && copy_elems(
                    gpu,
                    b.raw(),
                    (0, t.len()),
                    yb.raw(),
                    (at, total),
                    len,
                    st.bytes(),
                )?;
            if !copied && len > 0 {
                // rows of `len` elements from each input, spread across the output's rows
                // (one row: an f16 part at an odd offset)
                let n = outer * len;
                let mut p = vec![0, n as u32, len as u32, (out[a] * inner) as u32, at as u32];
                let pipe = gpu.pipeline(&format!("concat_rows:{}", st.key()), || {
                    let body = shader_1d(
                        &[("x", "read", "T"), ("y", "read_write", "T")],
                        WG,
                        "",
                        "  if (i >= p[1]) { return; }
  let row = i / p[2];
  let c = i % p[2];
  y[row * p[3] + p[4] + c] = x[i];",
                    );
                    format!("{}{body}", st.header())
                })?;
                gpu.dispatch(&pipe, &mut p, &[b.raw(), yb.raw()], n as u64, WG)?;
            }
            at += len;
        }
        out1(y)
    }))
}
