//! Reductions (ReduceSum, Mean, Max, Min, Prod, SumSquare, L1, L2, LogSum, LogSumExp) and the
//! "line" machinery the softmax, normalisation and attention kernels share.
//!
//! A line is one independent reduction: the elements that fold into one output of a Reduce*,
//! one softmax row, one normalised row. Kernels are written once over lines and run in one
//! of two layouts ([`Mode`]): a workgroup per line (long lines: the invocations stride over the
//! line and combine in a workgroup-memory tree), or an invocation per line (many short lines:
//! each walks its line alone). A reduction reads its input in place through strides: the kept
//! and the reduced axes, merged where adjacent, index the input directly, so reducing any set
//! of axes needs no transpose.

use nxrt_core::ir::Node;
use nxrt_core::kernels::norm_axis;
use nxrt_core::{DataType, Error, Result, Tensor};

use super::{dev_in, host_i64s, out1, shader_1d, Exec, Gpu, OpDef, Store};

/// Invocations of a workgroup that owns one line.
pub(crate) const WG: u32 = 256;
/// Workgroup width when each invocation owns a line.
const COL_WG: u32 = 64;

macro_rules! reduce_ops {
    ($($op:literal,)*) => {
        &[$(OpDef { op: $op, since: 1, type_input: 0, half: true, host: &[1], build: build_reduce },)*]
    };
}

pub(crate) const OPS: &[OpDef] = reduce_ops! {
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
};

// ----------------------------------------------------------------------------- lines

/// How a line kernel maps lines to invocations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// One workgroup of [`WG`] invocations per line.
    Row,
    /// One invocation per line.
    Col,
}

impl Mode {
    /// A workgroup per line for long lines or few lines, an invocation per line otherwise.
    pub(crate) fn pick(len: usize, lines: usize) -> Mode {
        if len >= 64 || lines < 256 {
            Mode::Row
        } else {
            Mode::Col
        }
    }

    pub(crate) fn tag(self) -> &'static str {
        match self {
            Mode::Row => "row",
            Mode::Col => "col",
        }
    }
}

/// WGSL combine expressions of `a` and `b` for [`line_shader`]'s reducers.
pub(crate) const SUM: &str = "a + b";
/// Maximum with NaN propagating (as the CPU's reductions).
pub(crate) const MAX_NAN: &str = "select(a, b, b > a || b != b)";
/// Minimum with NaN propagating.
pub(crate) const MIN_NAN: &str = "select(a, b, b < a || b != b)";
/// Maximum skipping NaN (as the CPU's softmax).
pub(crate) const MAX: &str = "select(a, b, b > a)";

/// A line kernel. `bufs` bind from 1 as in [`shader_1d`]; each `(name, combine)` reducer
/// becomes `fn wg_<name>(t: u32, v: f32) -> f32`, which combines `v` across the invocations
/// of a line (the identity in [`Mode::Col`]) and must be called in uniform control flow,
/// and `fn c_<name>(a: f32, b: f32) -> f32`, the combine itself. The body sees `line` (the
/// line index, not yet checked against the count), `t` (this invocation's place in the line)
/// and `S` (the stride between an invocation's elements): `for (var k = t; k < n; k += S)`
/// visits a line; per-line results are written where `t == 0u`.
pub(crate) fn line_shader(
    bufs: &[(&str, &str, &str)],
    mode: Mode,
    reducers: &[(&str, &str)],
    prelude: &str,
    body: &str,
) -> String {
    let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
    for (k, (name, access, ty)) in bufs.iter().enumerate() {
        s.push_str(&format!(
            "@group(0) @binding({}) var<storage, {access}> {name}: array<{ty}>;\n",
            k + 1
        ));
    }
    if mode == Mode::Row && !reducers.is_empty() {
        s.push_str(&format!("var<workgroup> red_sh: array<f32, {WG}>;\n"));
    }
    for (name, comb) in reducers {
        s.push_str(&format!(
            "fn c_{name}(a: f32, b: f32) -> f32 {{ return {comb}; }}\n"
        ));
        match mode {
            Mode::Row => s.push_str(&format!(
                "fn wg_{name}(t: u32, v: f32) -> f32 {{
  red_sh[t] = v;
  workgroupBarrier();
  for (var h = {half}u; h > 0u; h = h >> 1u) {{
    if (t < h) {{ red_sh[t] = c_{name}(red_sh[t], red_sh[t + h]); }}
    workgroupBarrier();
  }}
  let r = red_sh[0];
  workgroupBarrier();
  return r;
}}
",
                half = WG / 2
            )),
            Mode::Col => s.push_str(&format!(
                "fn wg_{name}(t: u32, v: f32) -> f32 {{ return v; }}\n"
            )),
        }
    }
    s.push_str(prelude);
    match mode {
        Mode::Row => s.push_str(&format!(
            "\n@compute @workgroup_size({WG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {{
  let line = wid.x + wid.y * p[0];
  let S = {WG}u;
{body}
}}
"
        )),
        Mode::Col => s.push_str(&format!(
            "\n@compute @workgroup_size({COL_WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
  let line = gid.x + gid.y * p[0];
  let t = 0u;
  let S = 1u;
{body}
}}
"
        )),
    }
    s
}

/// Runs a [`line_shader`] over `lines` lines (word 0 of `params` is filled in).
pub(crate) fn run_lines(
    gpu: &Gpu,
    pipe: &wgpu::ComputePipeline,
    mode: Mode,
    params: &mut [u32],
    bufs: &[&wgpu::Buffer],
    lines: usize,
) -> Result<()> {
    if lines == 0 {
        return Ok(());
    }
    match mode {
        Mode::Col => gpu.dispatch(pipe, params, bufs, lines as u64, COL_WG),
        Mode::Row => {
            let grid = fold_groups(gpu, lines as u64)?;
            params[0] = grid[0];
            gpu.dispatch_grid(pipe, params, bufs, grid)
        }
    }
}

/// `groups` workgroups as a grid of at most two dimensions (`wid.x + wid.y * grid[0]`).
pub(crate) fn fold_groups(gpu: &Gpu, groups: u64) -> Result<[u32; 3]> {
    let max = gpu.limits.max_compute_workgroups_per_dimension as u64;
    let x = groups.clamp(1, max);
    let y = groups.div_ceil(x);
    if y > max {
        return Err(Error::Provider(format!(
            "webgpu: {groups} workgroups exceed this adapter's maxComputeWorkgroupsPerDimension \
             ({max}) squared"
        )));
    }
    Ok([x as u32, y as u32, 1])
}

/// `v` as a kernel parameter word.
pub(crate) fn word(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::Provider(format!("webgpu: {what} ({v}) does not fit 32 bits")))
}

/// Fills a new float tensor of `dt` and `shape` with `v` rounded to `dt` (any bits:
/// infinities and NaN too, which a kernel's `st` would not store exactly in f16).
pub(crate) fn fill(gpu: &Gpu, dt: DataType, shape: &[usize], v: f32) -> Result<Tensor> {
    let st = gpu.store(dt)?;
    let (y, yb) = gpu.alloc(dt, shape)?;
    // the buffer as 32-bit words: one f32, or two f16 (the buffer is padded to whole words)
    let (w, words) = match st {
        Store::F32 => (v.to_bits(), y.len()),
        Store::F16AsF32 => (half::f16::from_f32(v).to_f32().to_bits(), y.len()),
        Store::F16 => {
            let h = u32::from(half::f16::from_f32(v).to_bits());
            (h | h << 16, y.len().div_ceil(2))
        }
    };
    let pipe = gpu.pipeline("fill", || {
        shader_1d(
            &[("y", "read_write", "u32")],
            256,
            "",
            "  if (i >= p[1]) { return; }\n  y[i] = p[2];",
        )
    })?;
    let mut params = [0, word(words, "a fill")?, w];
    gpu.dispatch(&pipe, &mut params, &[yb.raw()], words as u64, 256)?;
    Ok(y)
}

/// The storage of each float tensor of `ts` and a pipeline-cache key part naming them all.
pub(crate) fn stores_of(gpu: &Gpu, ts: &[&Tensor]) -> Result<(Vec<Store>, String)> {
    let st = ts
        .iter()
        .map(|t| gpu.store(t.dtype()))
        .collect::<Result<Vec<_>>>()?;
    let key = st.iter().map(|s| s.key()).collect::<Vec<_>>().join(",");
    Ok((st, key))
}

// ----------------------------------------------------------------------------- Reduce*

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    L1,
    L2,
    LogSum,
    LogSumExp,
}

impl Op {
    fn of(name: &str) -> Result<Op> {
        Ok(match name {
            "ReduceSum" => Op::Sum,
            "ReduceMean" => Op::Mean,
            "ReduceMax" => Op::Max,
            "ReduceMin" => Op::Min,
            "ReduceProd" => Op::Prod,
            "ReduceSumSquare" => Op::SumSquare,
            "ReduceL1" => Op::L1,
            "ReduceL2" => Op::L2,
            "ReduceLogSum" => Op::LogSum,
            "ReduceLogSumExp" => Op::LogSumExp,
            op => return Err(Error::Other(format!("no WebGPU kernel for {op}"))),
        })
    }

    /// (map of an element `v`, combine, identity, finish of `acc` over `n` elements)
    fn wgsl(self) -> (&'static str, &'static str, f32, &'static str) {
        let inf = f32::INFINITY;
        match self {
            Op::Sum => ("v", SUM, 0.0, "acc"),
            Op::Mean => ("v", SUM, 0.0, "acc / f32(n)"),
            Op::Max => ("v", MAX_NAN, -inf, "acc"),
            Op::Min => ("v", MIN_NAN, inf, "acc"),
            Op::Prod => ("v", "a * b", 1.0, "acc"),
            Op::SumSquare => ("v * v", SUM, 0.0, "acc"),
            Op::L1 => ("abs(v)", SUM, 0.0, "acc"),
            Op::L2 => ("v * v", SUM, 0.0, "sqrt(acc)"),
            Op::LogSum => ("v", SUM, 0.0, "log(acc)"),
            // two passes, see LSE_BODY
            Op::LogSumExp => ("v", MAX_NAN, -inf, "acc"),
        }
    }

    /// The result over an empty set (the CPU's identities).
    fn empty(self) -> f32 {
        match self {
            Op::Sum | Op::SumSquare | Op::L1 | Op::L2 => 0.0,
            Op::Mean => f32::NAN,
            Op::Max | Op::LogSum | Op::LogSumExp => f32::NEG_INFINITY,
            Op::Min => f32::INFINITY,
            Op::Prod => 1.0,
        }
    }
}

/// Offsets of output `o` (over the kept axes) and of reduced element `k` (over the reduced
/// axes). Params: [row, outputs, n, identity, nk, nr, kept dims, kept strides, reduced dims,
/// reduced strides].
const OFFSETS: &str = "
fn kept_off(o: u32) -> u32 {
  let nk = p[4];
  var rem = o;
  var off = 0u;
  for (var d = nk; d > 0u; d--) {
    let dim = p[5u + d];
    off += (rem % dim) * p[5u + nk + d];
    rem = rem / dim;
  }
  return off;
}
fn red_off(k: u32) -> u32 {
  let nk = p[4];
  let nr = p[5];
  let b = 5u + 2u * nk;
  var rem = k;
  var off = 0u;
  for (var d = nr; d > 0u; d--) {
    let dim = p[b + d];
    off += (rem % dim) * p[b + nr + d];
    rem = rem / dim;
  }
  return off;
}
";

/// ReduceLogSumExp: the maximum, then the sum of exponentials below it (infinite or NaN
/// maxima pass through, as on the CPU).
const LSE_BODY: &str = "
  if (line >= p[1]) { return; }
  let n = p[2];
  let base = kept_off(line);
  var m = bitcast<f32>(p[3]);
  for (var k = t; k < n; k += S) { m = c_r(m, f32(x[base + red_off(k)])); }
  m = wg_r(t, m);
  let fin = abs(m) <= 3.4028235e38;
  var s = 0.0;
  if (fin) {
    for (var k = t; k < n; k += S) { s += exp(f32(x[base + red_off(k)]) - m); }
  }
  s = wg_s(t, s);
  if (t == 0u) { y[line] = st(select(m, m + log(s), fin)); }
";

struct Reduce {
    op: Op,
    keepdims: bool,
    noop: bool,
    /// axes come from input 1 (ReduceSum from opset 13, the others from 18)
    from_input: bool,
    attr_axes: Option<Vec<i64>>,
}

fn build_reduce(node: &Node) -> Result<Exec> {
    let op = Op::of(&node.op_type)?;
    let from_input = node.opset >= if op == Op::Sum { 13 } else { 18 };
    let r = Reduce {
        op,
        keepdims: node.get_i("keepdims", 1)? != 0,
        noop: node.get_i("noop_with_empty_axes", 0)? != 0,
        from_input,
        attr_axes: if from_input {
            None
        } else {
            node.attr_ints("axes")?
        },
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let axes = if r.from_input {
            host_i64s(inputs, 1)?
        } else {
            r.attr_axes.clone()
        };
        let (x, xb) = dev_in(inputs, 0)?;
        let shape = x.shape();
        let rank = shape.len();
        let mut red = vec![false; rank];
        match axes.as_deref() {
            Some(a) if !a.is_empty() => {
                for &ax in a {
                    if rank == 0 {
                        return Err(Error::Shape(format!(
                            "{}: axis {ax} is out of range for a scalar",
                            node_name(r.op)
                        )));
                    }
                    red[norm_axis(ax, rank)?] = true;
                }
            }
            _ => {
                if !r.noop {
                    red.fill(true);
                }
            }
        }
        let out_shape: Vec<usize> = shape
            .iter()
            .zip(&red)
            .filter_map(|(&d, &rd)| match (rd, r.keepdims) {
                (false, _) => Some(d),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect();
        // the kept and the reduced axes, unit axes dropped and neighbours of a kind merged
        let mut kept: Vec<(usize, usize)> = Vec::new();
        let mut rdc: Vec<(usize, usize)> = Vec::new();
        let mut stride = 1usize;
        let mut prev: Option<bool> = None;
        for i in (0..rank).rev() {
            let d = shape[i];
            if d != 1 {
                let list = if red[i] { &mut rdc } else { &mut kept };
                match (prev, list.last_mut()) {
                    (Some(pr), Some(last)) if pr == red[i] => last.0 *= d,
                    _ => list.push((d, stride)),
                }
                prev = Some(red[i]);
            }
            stride *= d;
        }
        kept.reverse();
        rdc.reverse();
        let outputs: usize = kept.iter().map(|k| k.0).product();
        let n: usize = rdc.iter().map(|k| k.0).product();
        if outputs == 0 {
            return out1(gpu.alloc(x.dtype(), &out_shape)?.0);
        }
        if n == 0 {
            return out1(fill(gpu, x.dtype(), &out_shape, r.op.empty())?);
        }
        let st = gpu.store(x.dtype())?;
        let (y, yb) = gpu.alloc(x.dtype(), &out_shape)?;
        let mode = Mode::pick(n, outputs);
        let (map, comb, init, fin) = r.op.wgsl();
        let key = format!("reduce:{:?}:{}:{}", r.op, mode.tag(), st.key());
        let pipe = gpu.pipeline(&key, || {
            let bufs = [("x", "read", "T"), ("y", "read_write", "T")];
            if r.op == Op::LogSumExp {
                let body = line_shader(
                    &bufs,
                    mode,
                    &[("r", MAX_NAN), ("s", SUM)],
                    OFFSETS,
                    LSE_BODY,
                );
                return format!("{}{body}", st.header());
            }
            let body = format!(
                "  if (line >= p[1]) {{ return; }}
  let n = p[2];
  let base = kept_off(line);
  var acc = bitcast<f32>(p[3]);
  for (var k = t; k < n; k += S) {{
    let v = f32(x[base + red_off(k)]);
    acc = c_r(acc, {map});
  }}
  acc = wg_r(t, acc);
  if (t == 0u) {{ y[line] = st({fin}); }}"
            );
            let body = line_shader(&bufs, mode, &[("r", comb)], OFFSETS, &body);
            format!("{}{body}", st.header())
        })?;
        let mut params = vec![
            0,
            word(outputs, "outputs")?,
            word(n, "reduced elements")?,
            init.to_bits(),
            kept.len() as u32,
            rdc.len() as u32,
        ];
        for list in [&kept, &rdc] {
            for &(d, _) in list.iter() {
                params.push(word(d, "a dimension")?);
            }
            for &(_, s) in list.iter() {
                params.push(word(s, "a stride")?);
            }
        }
        run_lines(
            gpu,
            &pipe,
            mode,
            &mut params,
            &[xb.raw(), yb.raw()],
            outputs,
        )?;
        out1(y)
    }))
}

fn node_name(op: Op) -> String {
    format!("Reduce{:?}", op)
}
