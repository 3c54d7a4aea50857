//! com.microsoft GroupQueryAttention on the device, so a decoder's KV cache stays on the GPU
//! between steps (the semantics are core's CPU kernel's, `core/src/kernels/contrib.rs`, and
//! docs/genai.md).
//!
//! Three kinds of dispatch per call:
//! - the present keys and values: the past rows copied and the new rows written (keys
//!   rotated); when the executor hands the past over and nothing else holds it, and it has
//!   room for every row, only the new rows are written, into the past's own buffer
//!   (onnxruntime-genai's shared past/present buffer, without a copy of the cache per step);
//! - the queries rotated (with `do_rotary`) into a scratch buffer;
//! - attention: one workgroup per (batch, token, head) row scores its causal (and windowed)
//!   keys into a scratch row, takes the maximum and the sum in workgroup memory, and writes the
//!   row's output as the weighted sum of the values.
//!
//! The per-batch lengths and each new token's rotary position are computed on the host (from
//! `seqlens_k`, `total_sequence_length` and `position_ids`, read there) and passed with the
//! kernel parameters. float32 only.

use std::sync::Arc;

use nxrt_core::ir::Node;
use nxrt_core::kernels::contrib::GqaPlan;
use nxrt_core::kernels::opt_tensor_in;
use nxrt_core::provider::{Kernel, KernelCx};
use nxrt_core::{DataType, Error, Result, Tensor, Value};

use super::reduce::{line_shader, run_lines, word, Mode, MAX, SUM};
use super::{dev_buf, module_header, shader_1d, Exec, Gpu, OpDef, Store};

/// The registration `supports` and `input_placement` read; kernels are made by [`kernel`]
/// (which can write the present into the past's buffer).
pub(crate) const MS_OPS: &[OpDef] = &[OpDef {
    op: "GroupQueryAttention",
    since: 1,
    type_input: 0,
    half: false,
    // seqlens_k, total_sequence_length, position_ids
    host: &[5, 6, 9],
    build: build_exec,
}];

#[derive(Clone, Copy, Debug)]
struct Cfg {
    heads: usize,
    kv_heads: usize,
    scale: f32,
    softcap: f32,
    window: i64,
    rotary: bool,
    interleaved: bool,
    smooth: bool,
}

fn parse(node: &Node) -> Result<Cfg> {
    let heads = node.get_i("num_heads", 0)?;
    let kv_heads = node.get_i("kv_num_heads", 0)?;
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(Error::Other(format!(
            "GroupQueryAttention: num_heads {heads} and kv_num_heads {kv_heads}"
        )));
    }
    if node.get_i("qk_output", 0)? != 0 {
        return Err(Error::Other(
            "the WebGPU GroupQueryAttention kernel does not produce qk_output".into(),
        ));
    }
    if node.outputs.iter().skip(3).any(Option::is_some) {
        return Err(Error::Other(
            "the WebGPU GroupQueryAttention kernel does not produce output_qk".into(),
        ));
    }
    Ok(Cfg {
        heads: heads as usize,
        kv_heads: kv_heads as usize,
        scale: node.get_f("scale", 0.0)?,
        softcap: node.get_f("softcap", 0.0)?,
        window: node.get_i("local_window_size", -1)?,
        rotary: node.get_i("do_rotary", 0)? != 0,
        interleaved: node.get_i("rotary_interleaved", 0)? != 0,
        smooth: node.get_i("smooth_softmax", 0)? != 0,
    })
}

fn build_exec(node: &Node) -> Result<Exec> {
    let cfg = parse(node)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        run(gpu, &cfg, inputs, None)
    }))
}

/// The kernel for a node [`MS_OPS`] accepts.
pub(crate) fn kernel(gpu: Arc<Gpu>, node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(GqaKernel {
        gpu,
        cfg: parse(node)?,
    }))
}

struct GqaKernel {
    gpu: Arc<Gpu>,
    cfg: Cfg,
}

impl Kernel for GqaKernel {
    fn compute(&self, _cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        self.gpu.check()?;
        run(&self.gpu, &self.cfg, inputs, None)
    }

    /// past key and value: written over when the executor hands them over and nothing else
    /// holds them.
    fn reusable_inputs(&self) -> &[usize] {
        &[3, 4]
    }

    fn compute_owned(
        &self,
        _cx: &KernelCx<'_>,
        mut inputs: Vec<Option<Value>>,
    ) -> Result<Vec<Value>> {
        self.gpu.check()?;
        let unique = |v: Option<&Option<Value>>| {
            matches!(v, Some(Some(Value::Tensor(t))) if t.dtype() == DataType::Float
                && t.is_unique_device() && dev_buf(t).is_ok())
        };
        let owned = if unique(inputs.get(3)) && unique(inputs.get(4)) {
            match (inputs[3].take(), inputs[4].take()) {
                (Some(Value::Tensor(k)), Some(Value::Tensor(v))) => Some((k, v)),
                _ => None,
            }
        } else {
            None
        };
        let refs: Vec<Option<&Value>> = inputs.iter().map(Option::as_ref).collect();
        run(&self.gpu, &self.cfg, &refs, owned)
    }
}

fn f32_dev<'a>(t: &'a Tensor, what: &str) -> Result<&'a Tensor> {
    if t.dtype() != DataType::Float {
        return Err(Error::Other(format!(
            "the WebGPU GroupQueryAttention kernel takes f32 {what}, not {}",
            t.dtype()
        )));
    }
    dev_buf(t)?;
    Ok(t)
}

/// Words of the kernel parameters before the per-batch table.
const HDR: usize = 24;

/// The present rows. Params: [width, count, s, nkv, h, plen, past_len, in_place, src row
/// stride, src offset, rotate, h2, interleaved, has_past, batch, ...] then per batch
/// (past_b, total_b) and per (batch, token) the rotary position.
const KV_BODY: &str = "
  if (i >= p[1]) { return; }
  let s = p[2]; let nkv = p[3]; let h = p[4]; let plen = p[5];
  let e = i % h;
  var bi = 0u; var j = 0u; var row = 0u; var si = 0u; var fresh = false;
  let pb0 = HDR;
  if (p[7] != 0u) {
    let r1 = i / h;
    si = r1 % s;
    let r2 = r1 / s;
    j = r2 % nkv;
    bi = r2 / nkv;
    row = p[pb0 + 2u * bi] + si;
    fresh = true;
  } else {
    let r1 = i / h;
    row = r1 % plen;
    let r2 = r1 / plen;
    j = r2 % nkv;
    bi = r2 / nkv;
    let pb = p[pb0 + 2u * bi];
    if (row >= pb && row < pb + s) { si = row - pb; fresh = true; }
  }
  let dst = ((bi * nkv + j) * plen + row) * h + e;
  var val = 0.0;
  if (fresh) {
    let base = (bi * s + si) * p[8] + p[9] + j * h;
    val = VALUE;
  } else if (p[13] != 0u && row < p[pb0 + 2u * bi]) {
    val = f32(past[((bi * nkv + j) * p[6] + row) * h + e]);
  }
  y[dst] = st(val);
";

/// Element `e` of the row at `base` of `x`, rotated by position `pos`'s angles (halves or
/// interleaved pairs over the first 2 * h2 elements), rounded as ONNX Runtime's rotary.
pub(crate) const ROT_FN: &str = "
fn rot(base: u32, e: u32, pos: u32, h2: u32, inter: bool) -> f32 {
  if (e >= 2u * h2) { return f32(x[base + e]); }
  var a = 0.0; var b = 0.0; var k = 0u; var first = true;
  if (inter) {
    k = e / 2u; a = f32(x[base + 2u * k]); b = f32(x[base + 2u * k + 1u]); first = e % 2u == 0u;
  } else {
    k = select(e - h2, e, e < h2); a = f32(x[base + k]); b = f32(x[base + k + h2]); first = e < h2;
  }
  let c = f32(cs[pos * h2 + k]);
  let sn = f32(sn_[pos * h2 + k]);
  if (first) { return fma(a, c, -(b * sn)); }
  return fma(a, sn, b * c);
}
";

/// The queries rotated into `y` (batch, token, head, h). Params: [width, count, s, nh, h,
/// q row stride, h2, interleaved, ...] then the table as in KV_BODY.
const Q_BODY: &str = "
  if (i >= p[1]) { return; }
  let s = p[2]; let nh = p[3]; let h = p[4];
  let e = i % h;
  let n = (i / h) % nh;
  let r = i / (h * nh);
  let base = r * p[5] + n * h;
  let pos = p[HDR + 2u * p[8] + r];
  y[i] = st(rot(base, e, pos, p[6], p[7] != 0u));
";

/// One (batch, token, head) row per workgroup. Params: [width, rows, s, nh, group, nkv, h,
/// plen, q row stride, q head stride, alpha, softcap, window, has_bias, bias b, bias n, total,
/// sink mode (0 none, 1 head_sink, 2 smooth), -inf, batch, ...] then per batch (past_b,
/// total_b).
const ATT_BODY: &str = "
  if (line >= p[1]) { return; }
  let s = p[2]; let nh = p[3]; let h = p[6]; let plen = p[7];
  let n = line % nh;
  let si = (line / nh) % s;
  let bi = line / (nh * s);
  let j = n / p[4];
  let pb = p[HDR + 2u * bi];
  let tb = p[HDR + 2u * bi + 1u];
  let len = min(pb + si + 1u, tb);
  var start = 0u;
  let w = bitcast<i32>(p[12]);
  if (w >= 0 && len > u32(w)) { start = len - u32(w); }
  let qo = (bi * s + si) * p[8] + n * p[9];
  let kb = (bi * p[5] + j) * plen * h;
  let so = line * plen;
  let alpha = bitcast<f32>(p[10]);
  let cap = bitcast<f32>(p[11]);
  let ninf = bitcast<f32>(p[18]);
  var mx = ninf;
  for (var tk = start + t; tk < len; tk += S) {
    var d = 0.0;
    let ko = kb + tk * h;
    for (var u = 0u; u < h; u++) { d += f32(q[qo + u]) * f32(k[ko + u]); }
    var xv = d * alpha;
    if (cap > 0.0) { xv = cap * tanh(clamp(xv / cap, -30.0, 30.0)); }
BIAS
    sc[so + tk] = xv;
    mx = max(mx, xv);
  }
  mx = wg_m(t, mx);
  var sk = 0.0;
  let has_sink = p[17] != 0u;
SINK
  if (has_sink) { mx = max(mx, sk); }
  var den = 0.0;
  for (var tk = start + t; tk < len; tk += S) {
    let ev = exp(sc[so + tk] - mx);
    sc[so + tk] = ev;
    den += ev;
  }
  den = wg_s(t, den);
  if (has_sink) { den += exp(sk - mx); }
  storageBarrier();
  let yo = line * h;
  for (var u = t; u < h; u += S) {
    var acc = 0.0;
    if (len > start && den > 0.0) {
      for (var tk = start; tk < len; tk++) { acc += sc[so + tk] * f32(v[kb + tk * h + u]); }
      acc = acc * (1.0 / den);
    }
    y[yo + u] = st(acc);
  }
";

const BIAS_CODE: &str = "    {
      let bb = select(bi, 0u, p[14] == 1u);
      let bn = select(n, 0u, p[15] == 1u);
      xv += f32(bias[((bb * p[15] + bn) * s + si) * p[16] + tk]);
    }
";

fn run(
    gpu: &Gpu,
    cfg: &Cfg,
    inputs: &[Option<&Value>],
    owned: Option<(Tensor, Tensor)>,
) -> Result<Vec<Value>> {
    let (nh, nkv) = (cfg.heads, cfg.kv_heads);
    let (past_k, past_v) = match &owned {
        Some((k, v)) => (Some(k), Some(v)),
        None => (opt_tensor_in(inputs, 3)?, opt_tensor_in(inputs, 4)?),
    };
    // the checks are the CPU kernel's
    let plan = GqaPlan::new(nh, nkv, cfg.rotary, inputs, past_k, past_v)?;
    let GqaPlan {
        q,
        key,
        value,
        b,
        s,
        qdim,
        h,
        total,
        past_len,
        plen,
        rot,
        ..
    } = plan;
    let (bias, sink) = (plan.bias.map(|t| t.0), plan.sink);
    // every float input on the device, as float32
    for (t, what) in [
        (Some(q), "query"),
        (key, "key"),
        (value, "value"),
        (past_k, "past_key"),
        (past_v, "past_value"),
        (rot.map(|r| r.0), "cos_cache"),
        (rot.map(|r| r.1), "sin_cache"),
        (bias, "attention_bias"),
        (sink, "head_sink"),
    ] {
        if let Some(t) = t {
            f32_dev(t, what)?;
        }
    }
    // the per-batch lengths and the rotary positions, passed with the kernel parameters
    let mut table: Vec<u32> = Vec::with_capacity(2 * b + b * s);
    for &(past_b, total_b) in &plan.lens {
        table.push(word(past_b, "a past length")?);
        table.push(word(total_b, "a sequence length")?);
    }
    let mut positions: Vec<u32> = Vec::with_capacity(b * s);
    if rot.is_some() {
        for &p in &plan.positions {
            positions.push(word(p, "a position")?);
        }
    } else {
        positions.resize(b * s, 0);
    }
    table.extend(positions);
    let hdr = format!("{HDR}u");
    let pshape = [b, nkv, plen, h];
    let in_place = owned.is_some() && plen == past_len;
    // (the clones share the past's buffers; `owned` is dropped on return, leaving the present
    // their only holder)
    let (present_k, present_v) = match &owned {
        Some((k, v)) if in_place => (k.clone(), v.clone()),
        _ => (
            gpu.alloc(DataType::Float, &pshape)?.0,
            gpu.alloc(DataType::Float, &pshape)?.0,
        ),
    };
    let (y, yb) = gpu.alloc(DataType::Float, &[b, s, nh * h])?;
    let header = module_header(&[Store::F32], Store::F32);
    // --- present keys and values
    let (src_k, src_v, stride, off_k, off_v) = match (key, value) {
        (Some(k), Some(v)) => (k, v, nkv * h, 0, 0),
        _ => (q, q, qdim, nh * h, (nh + nkv) * h),
    };
    let count = if in_place {
        b * nkv * s * h
    } else {
        b * nkv * plen * h
    };
    for (is_key, src, past, off, present) in [
        (true, src_k, past_k, off_k, &present_k),
        (false, src_v, past_v, off_v, &present_v),
    ] {
        let rotate = is_key && rot.is_some();
        let key = format!("gqa_kv:{rotate}");
        let pipe = gpu.pipeline(&key, || {
            let mut bufs = vec![("x", "read", "f32"), ("past", "read", "f32")];
            if rotate {
                bufs.push(("cs", "read", "f32"));
                bufs.push(("sn_", "read", "f32"));
            }
            bufs.push(("y", "read_write", "T"));
            let value = if rotate {
                "rot(base, e, p[HDR + 2u * p[14] + bi * s + si], p[11], p[12] != 0u)"
            } else {
                "f32(x[base + e])"
            };
            let body = KV_BODY.replace("VALUE", value).replace("HDR", &hdr);
            let prelude = if rotate { ROT_FN } else { "" };
            format!("{header}{}", shader_1d(&bufs, 256, prelude, &body))
        })?;
        let (h2, inter) = rot.map_or((0, false), |r| (r.3, cfg.interleaved));
        let mut params = vec![0u32; HDR];
        params[1] = word(count, "present elements")?;
        params[2] = word(s, "new tokens")?;
        params[3] = word(nkv, "kv heads")?;
        params[4] = word(h, "the head size")?;
        params[5] = word(plen, "present rows")?;
        params[6] = word(past_len, "past rows")?;
        params[7] = u32::from(in_place);
        params[8] = word(stride, "a row stride")?;
        params[9] = word(off, "an offset")?;
        params[10] = u32::from(rotate);
        params[11] = word(h2, "the rotary width")?;
        params[12] = u32::from(inter);
        params[13] = u32::from(past.is_some() && !in_place);
        params[14] = word(b, "the batch")?;
        params.extend_from_slice(&table);
        let past_buf = match past {
            Some(t) if !in_place => dev_buf(t)?.raw(),
            // never read (in place, or no past): any other buffer fills the binding (the
            // past's own is the output in place, which cannot be bound twice)
            _ => dev_buf(src)?.raw(),
        };
        let mut bufs = vec![dev_buf(src)?.raw(), past_buf];
        if let Some((c, sn, _, _)) = rot.filter(|_| rotate) {
            bufs.push(dev_buf(c)?.raw());
            bufs.push(dev_buf(sn)?.raw());
        }
        bufs.push(dev_buf(present)?.raw());
        gpu.dispatch(&pipe, &mut params, &bufs, count as u64, 256)?;
    }
    // --- the queries, rotated
    let rows = b * s * nh;
    let qrot = match rot {
        Some((c, sn, _, h2)) if rows > 0 => {
            let (qt, qtb) = gpu.alloc(DataType::Float, &[b, s, nh, h])?;
            let pipe = gpu.pipeline("gqa_q", || {
                let bufs = [
                    ("x", "read", "f32"),
                    ("cs", "read", "f32"),
                    ("sn_", "read", "f32"),
                    ("y", "read_write", "T"),
                ];
                let body = Q_BODY.replace("HDR", &hdr);
                format!("{header}{}", shader_1d(&bufs, 256, ROT_FN, &body))
            })?;
            let n = qt.len();
            let mut params = vec![0u32; HDR];
            params[1] = word(n, "query elements")?;
            params[2] = word(s, "new tokens")?;
            params[3] = word(nh, "heads")?;
            params[4] = word(h, "the head size")?;
            params[5] = word(qdim, "a row stride")?;
            params[6] = word(h2, "the rotary width")?;
            params[7] = u32::from(cfg.interleaved);
            params[8] = word(b, "the batch")?;
            params.extend_from_slice(&table);
            let bufs = [
                dev_buf(q)?.raw(),
                dev_buf(c)?.raw(),
                dev_buf(sn)?.raw(),
                qtb.raw(),
            ];
            gpu.dispatch(&pipe, &mut params, &bufs, n as u64, 256)?;
            Some(qt)
        }
        _ => None,
    };
    // --- attention
    if rows > 0 && h > 0 {
        let sink_mode = match (sink, cfg.smooth) {
            (Some(_), _) => 1u32,
            (None, true) => 2,
            (None, false) => 0,
        };
        let has_bias = bias.is_some();
        let key = format!("gqa_att:{has_bias}:{}", sink_mode == 1);
        let pipe = gpu.pipeline(&key, || {
            let mut bufs = vec![
                ("q", "read", "f32"),
                ("k", "read", "f32"),
                ("v", "read", "f32"),
                ("sc", "read_write", "f32"),
                ("y", "read_write", "T"),
            ];
            if has_bias {
                bufs.push(("bias", "read", "f32"));
            }
            if sink_mode == 1 {
                bufs.push(("sink", "read", "f32"));
            }
            let body = ATT_BODY
                .replace("BIAS\n", if has_bias { BIAS_CODE } else { "" })
                .replace(
                    "SINK\n",
                    if sink_mode == 1 {
                        "  if (p[17] == 1u) { sk = f32(sink[n]); }\n"
                    } else {
                        ""
                    },
                )
                .replace("HDR", &hdr);
            let text = line_shader(&bufs, Mode::Row, &[("m", MAX), ("s", SUM)], "", &body);
            format!("{header}{text}")
        })?;
        let scratch = gpu.buffer((rows * plen) as u64 * 4, "GroupQueryAttention scores")?;
        let alpha = if cfg.scale == 0.0 {
            1.0 / (h as f32).sqrt()
        } else {
            cfg.scale
        };
        let (qsrc, q_row, q_head) = match &qrot {
            Some(t) => (t, nh * h, h),
            None => (q, qdim, h),
        };
        let (bias_b, bias_n) = bias.map_or((1, 1), |t| (t.shape()[0], t.shape()[1]));
        let mut params = vec![0u32; HDR];
        params[1] = word(rows, "attention rows")?;
        params[2] = word(s, "new tokens")?;
        params[3] = word(nh, "heads")?;
        params[4] = word(nh / nkv, "heads per group")?;
        params[5] = word(nkv, "kv heads")?;
        params[6] = word(h, "the head size")?;
        params[7] = word(plen, "present rows")?;
        params[8] = word(q_row, "a row stride")?;
        params[9] = word(q_head, "a head stride")?;
        params[10] = alpha.to_bits();
        params[11] = cfg.softcap.to_bits();
        params[12] = (cfg.window.clamp(-1, i32::MAX as i64) as i32) as u32;
        params[13] = u32::from(has_bias);
        params[14] = word(bias_b, "a bias dimension")?;
        params[15] = word(bias_n, "a bias dimension")?;
        params[16] = word(total, "the total length")?;
        params[17] = sink_mode;
        params[18] = f32::NEG_INFINITY.to_bits();
        params[19] = word(b, "the batch")?;
        params.extend_from_slice(&table);
        let mut bufs = vec![
            dev_buf(qsrc)?.raw(),
            dev_buf(&present_k)?.raw(),
            dev_buf(&present_v)?.raw(),
            scratch.raw(),
            yb.raw(),
        ];
        if let Some(t) = bias {
            bufs.push(dev_buf(t)?.raw());
        }
        if let Some(t) = sink {
            bufs.push(dev_buf(t)?.raw());
        }
        run_lines(gpu, &pipe, Mode::Row, &mut params, &bufs, rows)?;
    }
    Ok(vec![
        Value::Tensor(y),
        Value::Tensor(present_k),
        Value::Tensor(present_v),
    ])
}
