//! Attention (ai.onnx opset 23): 3-D inputs with `q_num_heads` / `kv_num_heads` or 4-D
//! inputs, grouped-query heads, a bool or float `attn_mask` (read on the device, broadcast,
//! shorter than the keys = padding), `is_causal`, `scale` and `softcap`.
//!
//! One workgroup per query row: its invocations score the keys (QK^T, softcap, mask) into a
//! scratch row, take the row's maximum and sum in workgroup memory, and then each writes some
//! output columns as the probability-weighted sum of V's rows. The past key/value cache and
//! the present / QK outputs stay on the CPU.

use nxrt_core::ir::Node;
use nxrt_core::kernels::opt_tensor_in;
use nxrt_core::{DataType, Error, Result, Tensor};

use super::module_header;
use super::reduce::{line_shader, run_lines, stores_of, word, Mode, MAX_NAN, SUM};
use super::{dev_buf, dev_in, out1, Exec, Gpu, OpDef};

pub(crate) const OPS: &[OpDef] = &[OpDef {
    op: "Attention",
    since: 23,
    type_input: 0,
    half: true,
    host: &[],
    build: build_attention,
}];

#[derive(Clone, Copy, Debug)]
struct Cfg {
    causal: bool,
    q_heads: Option<usize>,
    kv_heads: Option<usize>,
    scale: Option<f32>,
    softcap: f32,
}

fn heads_attr(node: &Node, name: &str) -> Result<Option<usize>> {
    match node.attr_i(name)? {
        None => Ok(None),
        Some(h) if h > 0 => Ok(Some(h as usize)),
        Some(h) => Err(Error::Other(format!(
            "Attention: {name} must be positive, is {h}"
        ))),
    }
}

fn decline(why: &str) -> Result<Exec> {
    Err(Error::Other(format!(
        "the WebGPU Attention kernel does not take {why}"
    )))
}

fn build_attention(node: &Node) -> Result<Exec> {
    let causal = match node.get_i("is_causal", 0)? {
        0 => false,
        1 => true,
        v => {
            return Err(Error::Other(format!(
                "Attention: is_causal must be 0 or 1, is {v}"
            )))
        }
    };
    if node.get_i("qk_matmul_output_mode", 0)? != 0 {
        return decline("qk_matmul_output_mode != 0");
    }
    for w in ["left_window_size", "right_window_size"] {
        if node.attr_i(w)?.is_some_and(|v| v != -1) {
            return decline(w);
        }
    }
    if let Some(p) = node.attr_i("softmax_precision")? {
        // the softmax computes in f32 whatever the float type asked for
        if !matches!(p, 1 | 10 | 11 | 16) {
            return Err(Error::Other(format!(
                "Attention: softmax_precision {p} is not a float type"
            )));
        }
    }
    let has_in = |k: usize| node.inputs.get(k).is_some_and(Option::is_some);
    if has_in(4) || has_in(5) {
        return decline("past_key / past_value");
    }
    if has_in(6) {
        return decline("nonpad_kv_seqlen");
    }
    if node.outputs.iter().skip(1).any(Option::is_some) {
        return decline("the present_key / present_value / qk_matmul_output outputs");
    }
    let cfg = Cfg {
        causal,
        q_heads: heads_attr(node, "q_num_heads")?,
        kv_heads: heads_attr(node, "kv_num_heads")?,
        scale: node.attr_f("scale")?,
        softcap: node.get_f("softcap", 0.0)?,
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        attention(gpu, &cfg, inputs)
    }))
}

/// A Q/K/V operand's layout: heads, sequence length, head size, and element strides of
/// (batch, head, position); the head-size axis is contiguous.
struct Lay {
    heads: usize,
    seq: usize,
    size: usize,
    strides: [usize; 3],
}

fn layout(t: &Tensor, name: &str, batch: usize, heads: Option<usize>) -> Result<Lay> {
    let s = t.shape();
    if s[0] != batch {
        return Err(Error::Shape(format!(
            "Attention: {name} has batch {}, Q has {batch}",
            s[0]
        )));
    }
    if s.len() == 4 {
        if heads.is_some_and(|h| h != s[1]) {
            return Err(Error::Shape(format!(
                "Attention: the heads attribute does not match {name}'s {} heads",
                s[1]
            )));
        }
        let (h, q, d) = (s[1], s[2], s[3]);
        return Ok(Lay {
            heads: h,
            seq: q,
            size: d,
            strides: [h * q * d, q * d, d],
        });
    }
    let h = heads.unwrap_or(1);
    if !s[2].is_multiple_of(h) {
        return Err(Error::Shape(format!(
            "Attention: {name}'s hidden size {} is not a multiple of its {h} heads",
            s[2]
        )));
    }
    let (q, d) = (s[1], s[2] / h);
    Ok(Lay {
        heads: h,
        seq: q,
        size: d,
        strides: [q * h * d, d, h * d],
    })
}

/// Params: [row, rows, sq, hq, reps, total, d, dv, q strides (3), k strides (3),
/// v strides (3), y strides (3), sqrt(scale), softcap, causal, neg inf, mask dims (4)].
const BODY: &str = "
  if (line >= p[1]) { return; }
  let sq = p[2]; let hq = p[3]; let total = p[5]; let d = p[6]; let dv = p[7];
  let i = line % sq;
  let h = (line / sq) % hq;
  let b = line / (sq * hq);
  let kh = h / p[4];
  let qo = b * p[8] + h * p[9] + i * p[10];
  let ko = b * p[11] + kh * p[12];
  let vo = b * p[14] + kh * p[15];
  let yo = b * p[17] + h * p[18] + i * p[19];
  let sqs = bitcast<f32>(p[20]);
  let cap = bitcast<f32>(p[21]);
  let ninf = bitcast<f32>(p[23]);
  let so = line * total;
  var bmax = ninf;
  var smax = ninf;
  for (var j = t; j < total; j += S) {
    let kr = ko + j * p[13];
    var s = 0.0;
    for (var u = 0u; u < d; u++) { s += (f32(q[qo + u]) * sqs) * (f32(k[kr + u]) * sqs); }
    if (cap > 0.0) { s = tanh(clamp(s / cap, -30.0, 30.0)) * cap; }
    var bj = 0.0;
MASK
    if (p[22] != 0u && j > i) { bj += ninf; }
    if (bj > bmax || bj != bj) { bmax = select(bj, bmax, bmax != bmax); }
    let sv = s + bj;
    sc[so + j] = sv;
    smax = c_m(smax, sv);
  }
  bmax = wg_m(t, bmax);
  smax = wg_m(t, smax);
  // a row whose keys are all masked out attends to nothing: its output is 0
  let none = bmax == ninf;
  var m = smax;
  if (m == ninf) { m = 0.0; }
  var sum = 0.0;
  for (var j = t; j < total; j += S) {
    let e = exp(sc[so + j] - m);
    sc[so + j] = e;
    sum += e;
  }
  sum = wg_s(t, sum);
  if (sum == 0.0) { sum = 1.0; }
  storageBarrier();
  for (var u = t; u < dv; u += S) {
    var acc = 0.0;
    if (!none) {
      for (var j = 0u; j < total; j++) { acc += (sc[so + j] / sum) * f32(v[vo + j * p[16] + u]); }
    }
    y[yo + u] = st(acc);
  }
";

/// The mask term of key `j` for row (b, h, i), mask dims right-aligned and broadcast; keys
/// past the mask's last dimension are masked out.
const MASK_AT: &str = "
    let mb = p[24]; let mh = p[25]; let mq = p[26]; let mk = p[27];
    if (j >= mk) {
      bj = ninf;
    } else {
      let mo = (((b % mb) * mh + h % mh) * mq + i % mq) * mk + j;
      bj = MASKVAL;
    }
";

fn attention(
    gpu: &Gpu,
    cfg: &Cfg,
    inputs: &[Option<&nxrt_core::Value>],
) -> Result<Vec<nxrt_core::Value>> {
    let (qt, qb) = dev_in(inputs, 0)?;
    let (kt, kb) = dev_in(inputs, 1)?;
    let (vt, vb) = dev_in(inputs, 2)?;
    let mask = opt_tensor_in(inputs, 3)?;
    let rank = qt.rank();
    if rank != 3 && rank != 4 {
        return Err(Error::Shape(format!(
            "Attention: Q must be 3-D or 4-D, has shape {:?}",
            qt.shape()
        )));
    }
    if kt.rank() != rank || vt.rank() != rank {
        return Err(Error::Shape(format!(
            "Attention: Q, K and V must have the same rank (shapes {:?}, {:?}, {:?})",
            qt.shape(),
            kt.shape(),
            vt.shape()
        )));
    }
    if rank == 3 && (cfg.q_heads.is_none() || cfg.kv_heads.is_none()) {
        return Err(Error::Other(
            "Attention: 3-D inputs need the q_num_heads and kv_num_heads attributes".into(),
        ));
    }
    for (t, n) in [(kt, "K"), (vt, "V")] {
        if !matches!(t.dtype(), DataType::Float | DataType::Float16) {
            return Err(Error::Other(format!(
                "the WebGPU Attention kernel takes f32 or f16 {n}, not {}",
                t.dtype()
            )));
        }
    }
    let batch = qt.shape()[0];
    let q = layout(qt, "Q", batch, cfg.q_heads)?;
    let k = layout(kt, "K", batch, cfg.kv_heads)?;
    let v = layout(vt, "V", batch, cfg.kv_heads)?;
    if k.size != q.size {
        return Err(Error::Shape(format!(
            "Attention: Q's head size {} differs from K's {}",
            q.size, k.size
        )));
    }
    if k.heads != v.heads || k.seq != v.seq {
        return Err(Error::Shape(format!(
            "Attention: K ({} heads, {} positions) and V ({} heads, {} positions) disagree",
            k.heads, k.seq, v.heads, v.seq
        )));
    }
    let (hq, hkv) = (q.heads, k.heads);
    if hkv == 0 || hq % hkv != 0 {
        return Err(Error::Shape(format!(
            "Attention: {hq} query heads are not a multiple of {hkv} key/value heads"
        )));
    }
    let (sq, total, d, dv) = (q.seq, k.seq, q.size, v.size);
    let (y_shape, y_strides) = if rank == 4 {
        (vec![batch, hq, sq, dv], [hq * sq * dv, sq * dv, dv])
    } else {
        (vec![batch, sq, hq * dv], [sq * hq * dv, dv, hq * dv])
    };
    // the mask: its kind (none, bool words, float) and its dims right-aligned to 4
    let mut mdims = [1usize; 4];
    let mask_kind = match mask {
        None => "none",
        Some(m) => {
            let s = m.shape();
            if s.is_empty() || s.len() > 4 {
                return Err(Error::Shape(format!(
                    "Attention: attn_mask must have rank 1 to 4, has shape {s:?}"
                )));
            }
            mdims[4 - s.len()..].copy_from_slice(s);
            let want = [batch, hq, sq];
            if (0..3).any(|a| mdims[a] != 1 && mdims[a] != want[a]) || mdims[3] > total {
                return Err(Error::Shape(format!(
                    "Attention: attn_mask shape {s:?} does not broadcast to (batch {batch}, \
                     heads {hq}, q {sq}, kv {total})"
                )));
            }
            match m.dtype() {
                DataType::Bool => "bool",
                DataType::Float | DataType::Float16 => "float",
                dt => {
                    return Err(Error::Other(format!(
                        "the WebGPU Attention kernel takes a bool, f32 or f16 attn_mask, not {dt}"
                    )))
                }
            }
        }
    };
    // Q, K, V and a float mask each read in their own float type; Y is Q's (T1)
    let mut floats = vec![qt, kt, vt];
    floats.extend(mask.filter(|_| mask_kind == "float"));
    let (sts, skey) = stores_of(gpu, &floats)?;
    let (y, yb) = gpu.alloc(qt.dtype(), &y_shape)?;
    let rows = batch * hq * sq;
    if y.is_empty() {
        return out1(y);
    }
    let scratch = gpu.buffer((rows * total) as u64 * 4, "Attention scores")?;
    // the spec scales Q and K by sqrt(scale) each (as the CPU kernel does)
    let scale = cfg.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let sqs = scale.sqrt() as f32;
    let mode = Mode::Row;
    let key = format!("attention:{mask_kind}:{skey}");
    let pipe = gpu.pipeline(&key, || {
        let mut bufs = vec![
            ("q", "read", sts[0].ty()),
            ("k", "read", sts[1].ty()),
            ("v", "read", sts[2].ty()),
        ];
        let mask_code = match mask_kind {
            "bool" => {
                bufs.push(("mask", "read", "u32"));
                MASK_AT.replace("MASKVAL", "select(ninf, 0.0, mask[mo] != 0u)")
            }
            "float" => {
                bufs.push(("mask", "read", sts[3].ty()));
                MASK_AT.replace("MASKVAL", "f32(mask[mo])")
            }
            _ => String::new(),
        };
        bufs.push(("sc", "read_write", "f32"));
        bufs.push(("y", "read_write", "T"));
        let text = line_shader(
            &bufs,
            mode,
            &[("m", MAX_NAN), ("s", SUM)],
            "",
            &BODY.replace("MASK\n", &mask_code),
        );
        format!("{}{text}", module_header(&sts, sts[0]))
    })?;
    let mut params = vec![
        0,
        word(rows, "Attention rows")?,
        word(sq, "the query length")?,
        word(hq, "query heads")?,
        word(hq / hkv, "heads per group")?,
        word(total, "the key length")?,
        word(d, "the head size")?,
        word(dv, "the value head size")?,
    ];
    for s in [q.strides, k.strides, v.strides, y_strides] {
        for x in s {
            params.push(word(x, "a stride")?);
        }
    }
    params.extend([
        sqs.to_bits(),
        cfg.softcap.to_bits(),
        u32::from(cfg.causal),
        f32::NEG_INFINITY.to_bits(),
    ]);
    for m in mdims {
        params.push(word(m, "a mask dimension")?);
    }
    let mut bufs = vec![qb.raw(), kb.raw(), vb.raw()];
    if let Some(m) = mask {
        bufs.push(dev_buf(m)?.raw());
    }
    bufs.push(scratch.raw());
    bufs.push(yb.raw());
    run_lines(gpu, &pipe, mode, &mut params, &bufs, rows)?;
    out1(y)
}
