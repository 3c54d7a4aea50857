//! Kernel family: the transformer-block operators: Attention, RotaryEmbedding, TensorScatter
//! (KV-cache update) and SwiGLU.
//!
//! Float inputs compute in f32 (f16 and bf16 widen, results round back) or natively in f64.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use half::{bf16, f16};

use super::par::par_chunks_mut;
use super::{bad_type, def, def_in, opt_tensor_in, tensor_in, Float, LATEST};
use crate::bail;
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::{FLOATS, PLAIN};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;

pub(crate) const KERNELS: &[KernelDef] = &[
    def("Attention", 23, LATEST, build_attention).types(FLOATS),
    def("RotaryEmbedding", 23, LATEST, build_rotary).types(FLOATS),
    def("TensorScatter", 24, LATEST, build_tensor_scatter).types(PLAIN),
    def("SwiGLU", 28, LATEST, build_swiglu).types(FLOATS),
    // computed in f32; the kernel refuses double
    def("LinearAttention", 27, LATEST, build_linear_attention).types(&[
        DataType::Float,
        DataType::Float16,
        DataType::Bfloat16,
    ]),
    def("CausalConvWithState", 27, LATEST, build_causal_conv).types(FLOATS),
    def_in(
        "ai.onnx.preview",
        "FlexAttention",
        1,
        1,
        build_flex_attention,
    )
    .types(FLOATS),
];

// ----------------------------------------------------------------------------- compute type

/// The type a float kernel computes in: f32 (for f32, f16, bf16) or f64 (for f64).
pub(crate) trait Cf:
    Float + core::ops::AddAssign + core::ops::Neg<Output = Self> + Default
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    fn exp(self) -> Self;
    fn tanh(self) -> Self;
    fn is_nan(self) -> bool;
    /// The elements of a float tensor (any float type) in this type.
    fn load(t: &Tensor) -> Result<Vec<Self>>;
    /// A tensor of element type `dt` (any float type) from values in this type.
    fn store(dt: DataType, shape: &[usize], v: Vec<Self>) -> Result<Tensor>;
}

impl Cf for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    const NEG_INF: f32 = f32::NEG_INFINITY;
    #[inline]
    fn exp(self) -> f32 {
        libm::expf(self)
    }
    #[inline]
    fn tanh(self) -> f32 {
        libm::tanhf(self)
    }
    #[inline]
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn load(t: &Tensor) -> Result<Vec<f32>> {
        match t.dtype() {
            DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
                t.to_f32_vec()
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

impl Cf for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    const NEG_INF: f64 = f64::NEG_INFINITY;
    #[inline]
    fn exp(self) -> f64 {
        libm::exp(self)
    }
    #[inline]
    fn tanh(self) -> f64 {
        libm::tanh(self)
    }
    #[inline]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn load(t: &Tensor) -> Result<Vec<f64>> {
        match t.dtype() {
            DataType::Double => Ok(t.as_slice::<f64>()?.into_owned()),
            DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
                Ok(t.to_f32_vec()?.into_iter().map(f64::from).collect())
            }
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

/// Runs `$body` with `$R` bound to the compute type for float element type `$dt`.
macro_rules! with_cf {
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

fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
    )
}

// ----------------------------------------------------------------------------- Attention

/// Attention's attributes, checked at load time.
#[derive(Clone, Copy, Debug)]
struct AttnCfg {
    is_causal: bool,
    q_heads: Option<usize>,
    kv_heads: Option<usize>,
    scale: Option<f64>,
    softcap: f64,
    /// 0: QK (after softcap); 1: after softcap; 2: plus bias; 3: softmax probabilities.
    qk_mode: i64,
    left_window: i64,
    right_window: i64,
    n_out: usize,
    opset: i64,
}

fn heads_attr(node: &Node, name: &str) -> Result<Option<usize>> {
    match node.attr_i(name)? {
        None => Ok(None),
        Some(h) if h > 0 => Ok(Some(h as usize)),
        Some(h) => bail!("Attention: {name} must be positive, is {h}"),
    }
}

fn build_attention(node: &Node) -> Result<Box<dyn Kernel>> {
    let is_causal = match node.get_i("is_causal", 0)? {
        0 => false,
        1 => true,
        v => bail!("Attention: is_causal must be 0 or 1, is {v}"),
    };
    let qk_mode = node.get_i("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&qk_mode) {
        bail!("Attention: qk_matmul_output_mode must be 0, 1, 2 or 3, is {qk_mode}");
    }
    let (mut left_window, mut right_window) = (-1, -1);
    for (name, slot) in [
        ("left_window_size", &mut left_window),
        ("right_window_size", &mut right_window),
    ] {
        if let Some(v) = node.attr_i(name)? {
            if node.opset < 25 {
                bail!(
                    "Attention: {name} needs opset 25 or newer (model uses {})",
                    node.opset
                );
            }
            if v < -1 {
                bail!("Attention: {name} must be -1 or nonnegative, is {v}");
            }
            *slot = v;
        }
    }
    if let Some(p) = node.attr_i("softmax_precision")? {
        // Any float precision is fine: the softmax computes in f32 or f64 anyway.
        let ok = matches!(p, 1 | 10 | 11 | 16);
        if !ok {
            bail!("Attention: softmax_precision {p} is not a float type");
        }
    }
    let scale = node.attr_f("scale")?.map(f64::from);
    let cfg = AttnCfg {
        is_causal,
        q_heads: heads_attr(node, "q_num_heads")?,
        kv_heads: heads_attr(node, "kv_num_heads")?,
        scale,
        softcap: node.get_f("softcap", 0.0)? as f64,
        qk_mode,
        left_window,
        right_window,
        n_out: node.outputs.len().clamp(1, 4),
        opset: node.opset,
    };
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let q = tensor_in(inputs, 0)?;
            with_cf!("Attention", q.dtype(), R => attention::<R>(cx, &cfg, inputs))
        },
    ))
}

/// Q, K and V as (batch, heads, seq, head_size) data, with their dimensions.
struct Heads<R> {
    data: Vec<R>,
    heads: usize,
    seq: usize,
    size: usize,
}

/// Loads a 3-D (batch, seq, heads * size) or 4-D (batch, heads, seq, size) input as 4-D data.
fn load_heads<R: Cf>(
    t: &Tensor,
    name: &str,
    batch: usize,
    heads: Option<usize>,
) -> Result<Heads<R>> {
    let s = t.shape();
    if s[0] != batch {
        bail!("Attention: {name} has batch {}, Q has {batch}", s[0]);
    }
    let v = R::load(t)?;
    if s.len() == 4 {
        return Ok(Heads {
            data: v,
            heads: s[1],
            seq: s[2],
            size: s[3],
        });
    }
    let h = heads.unwrap_or(1);
    if !s[2].is_multiple_of(h) {
        bail!(
            "Attention: {name}'s hidden size {} is not a multiple of its {h} heads",
            s[2]
        );
    }
    let (seq, size) = (s[1], s[2] / h);
    let mut data = vec![R::ZERO; v.len()];
    for b in 0..batch {
        for i in 0..seq {
            for hh in 0..h {
                let src = ((b * seq + i) * h + hh) * size;
                let dst = ((b * h + hh) * seq + i) * size;
                data[dst..dst + size].copy_from_slice(&v[src..src + size]);
            }
        }
    }
    Ok(Heads {
        data,
        heads: h,
        seq,
        size,
    })
}

/// Concatenates a past cache (batch, heads, past, size) before `cur` along the sequence axis.
fn concat_past<R: Cf>(
    past: Option<&Tensor>,
    cur: &Heads<R>,
    batch: usize,
    name: &str,
) -> Result<(Vec<R>, usize)> {
    let Some(p) = past else {
        return Ok((cur.data.clone(), cur.seq));
    };
    let ps = p.shape();
    if ps.len() != 4 || ps[0] != batch || ps[1] != cur.heads || ps[3] != cur.size {
        bail!(
            "Attention: {name} has shape {ps:?}, expected ({batch}, {}, past, {})",
            cur.heads,
            cur.size
        );
    }
    let pv = R::load(p)?;
    let (pl, total, sz) = (ps[2], ps[2] + cur.seq, cur.size);
    let mut out = Vec::with_capacity(batch * cur.heads * total * sz);
    for bh in 0..batch * cur.heads {
        out.extend_from_slice(&pv[bh * pl * sz..(bh + 1) * pl * sz]);
        out.extend_from_slice(&cur.data[bh * cur.seq * sz..(bh + 1) * cur.seq * sz]);
    }
    Ok((out, total))
}

/// The attention mask as additive values (bool: true -> 0, false -> -inf), with its dims
/// right-aligned to (batch, q_heads, q_seq, mask_kv).
struct Mask<R> {
    vals: Vec<R>,
    dims: [usize; 4],
}

impl<R: Cf> Mask<R> {
    /// The mask value for (b, h, i, j); -inf past the mask's kv length (padding).
    #[inline]
    fn at(&self, b: usize, h: usize, i: usize, j: usize) -> R {
        let [mb, mh, mq, mk] = self.dims;
        if j >= mk {
            return R::NEG_INF;
        }
        let (b, h, i) = (b % mb, h % mh, i % mq);
        self.vals[((b * mh + h) * mq + i) * mk + j]
    }
}

fn load_mask<R: Cf>(m: &Tensor, want: [usize; 4]) -> Result<Mask<R>> {
    let s = m.shape();
    if s.is_empty() || s.len() > 4 {
        bail!("Attention: attn_mask must have rank 1 to 4, has shape {s:?}");
    }
    let mut dims = [1usize; 4];
    dims[4 - s.len()..].copy_from_slice(s);
    for k in 0..3 {
        if dims[k] != 1 && dims[k] != want[k] {
            bail!(
                "Attention: attn_mask shape {s:?} does not broadcast to (batch {}, heads {}, q {}, kv {})",
                want[0],
                want[1],
                want[2],
                want[3]
            );
        }
    }
    if dims[3] > want[3] {
        bail!(
            "Attention: attn_mask's last dimension {} exceeds the total kv length {}",
            dims[3],
            want[3]
        );
    }
    let vals = match m.dtype() {
        DataType::Bool => m
            .as_slice::<bool>()?
            .iter()
            .map(|&x| if x { R::ZERO } else { R::NEG_INF })
            .collect(),
        dt if is_float(dt) => R::load(m)?,
        other => bail!("Attention: attn_mask must be bool or float, is {other}"),
    };
    Ok(Mask { vals, dims })
}

fn attention<R: Cf>(
    cx: &KernelCx<'_>,
    cfg: &AttnCfg,
    inputs: &[Option<&Value>],
) -> Result<Vec<Value>> {
    let qt = tensor_in(inputs, 0)?;
    let kt = tensor_in(inputs, 1)?;
    let vt = tensor_in(inputs, 2)?;
    let mask_t = opt_tensor_in(inputs, 3)?;
    let past_k = opt_tensor_in(inputs, 4)?;
    let past_v = opt_tensor_in(inputs, 5)?;
    let nonpad_t = if cfg.opset >= 24 {
        opt_tensor_in(inputs, 6)?
    } else {
        None
    };
    let rank = qt.shape().len();
    if rank != 3 && rank != 4 {
        bail!(
            "Attention: Q must be 3-D or 4-D, has shape {:?}",
            qt.shape()
        );
    }
    if kt.shape().len() != rank || vt.shape().len() != rank {
        bail!(
            "Attention: Q, K and V must have the same rank (shapes {:?}, {:?}, {:?})",
            qt.shape(),
            kt.shape(),
            vt.shape()
        );
    }
    if rank == 3 && (cfg.q_heads.is_none() || cfg.kv_heads.is_none()) {
        bail!("Attention: 3-D inputs need the q_num_heads and kv_num_heads attributes");
    }
    if past_k.is_some() != past_v.is_some() {
        bail!("Attention: past_key and past_value must be given together");
    }
    if nonpad_t.is_some() && past_k.is_some() {
        bail!("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value");
    }
    for (t, n) in [(kt, "K"), (vt, "V")] {
        if !is_float(t.dtype()) {
            bail!("Attention: {n} must be a float tensor, is {}", t.dtype());
        }
    }
    let batch = qt.shape()[0];
    let q = load_heads::<R>(qt, "Q", batch, cfg.q_heads)?;
    let k = load_heads::<R>(kt, "K", batch, cfg.kv_heads)?;
    let v = load_heads::<R>(vt, "V", batch, cfg.kv_heads)?;
    if rank == 4 {
        for (h, given, n) in [(q.heads, cfg.q_heads, "q"), (k.heads, cfg.kv_heads, "kv")] {
            if given.is_some_and(|g| g != h) {
                bail!("Attention: {n}_num_heads does not match the 4-D input's {h} heads");
            }
        }
    }
    if k.size != q.size {
        bail!(
            "Attention: Q's head size {} differs from K's {}",
            q.size,
            k.size
        );
    }
    if k.heads != v.heads || k.seq != v.seq {
        bail!(
            "Attention: K ({} heads, {} positions) and V ({} heads, {} positions) disagree",
            k.heads,
            k.seq,
            v.heads,
            v.seq
        );
    }
    let (hq, hkv) = (q.heads, k.heads);
    if hkv == 0 || hq % hkv != 0 {
        bail!("Attention: {hq} query heads are not a multiple of {hkv} key/value heads");
    }
    let reps = hq / hkv;
    let past_len = past_k.map_or(0, |p| p.shape().get(2).copied().unwrap_or(0));
    let (kf, total) = concat_past(past_k, &k, batch, "past_key")?;
    let (vf, total_v) = concat_past(past_v, &v, batch, "past_value")?;
    if total != total_v {
        bail!("Attention: past_key and past_value have different lengths");
    }
    let (sq, d, dv) = (q.seq, q.size, v.size);
    let nonpad: Option<Vec<i64>> = match nonpad_t {
        Some(t) => {
            if t.shape() != [batch] {
                bail!(
                    "Attention: nonpad_kv_seqlen must have shape ({batch}), has {:?}",
                    t.shape()
                );
            }
            if t.dtype() != DataType::Int64 {
                bail!(
                    "Attention: nonpad_kv_seqlen must be int64, is {}",
                    t.dtype()
                );
            }
            Some(t.to_i64_vec()?)
        }
        None => None,
    };
    let mask = match mask_t {
        Some(m) => Some(load_mask::<R>(m, [batch, hq, sq, total])?),
        None => None,
    };
    let scale = match cfg.scale {
        Some(s) => s,
        None => 1.0 / libm::sqrt(d as f64),
    };
    // The spec scales Q and K by sqrt(scale) each before the product.
    let sqs = R::from_f64(libm::sqrt(scale));
    let softcap = R::from_f64(cfg.softcap);
    let want_qk = cfg.n_out >= 4;

    let rows = batch * hq * sq;
    // Per row: the output (dv values) followed by the qk output row (total values, if wanted).
    let qk_len = if want_qk { total } else { 0 };
    let unit = dv + qk_len;
    let mut buf = vec![R::ZERO; rows * unit];
    let qd = &q.data;
    let (kf, vf) = (&kf, &vf);
    let nonpad = nonpad.as_deref();
    let mask = mask.as_ref();
    let row_fn = |r: usize, out: &mut [R]| {
        let i = r % sq;
        let h = (r / sq) % hq;
        let b = r / (sq * hq);
        let kh = h / reps;
        let (y, qk_out) = out.split_at_mut(dv);
        let qrow: Vec<R> = qd[r * d..(r + 1) * d].iter().map(|&x| x * sqs).collect();
        let kbase = (b * hkv + kh) * total;
        // Offset of this query block within the keys (causal / window frontier).
        let offset: i64 = match nonpad {
            Some(np) if past_len == 0 => np[b] - sq as i64,
            _ => past_len as i64,
        };
        let pos = offset + i as i64;
        let mut bias = vec![R::ZERO; total];
        let mut scores = vec![R::ZERO; total];
        let mut bias_max = R::NEG_INF;
        for j in 0..total {
            let mut bj = match mask {
                Some(m) => m.at(b, h, i, j),
                None => R::ZERO,
            };
            let jj = j as i64;
            if cfg.is_causal && jj > pos {
                bj += R::NEG_INF;
            }
            if (cfg.left_window >= 0 && pos - jj > cfg.left_window)
                || (cfg.right_window >= 0 && jj - pos > cfg.right_window)
            {
                bj += R::NEG_INF;
            }
            if let Some(np) = nonpad {
                if jj >= np[b] {
                    bj += R::NEG_INF;
                }
            }
            bias[j] = bj;
            if bj > bias_max || bj.is_nan() {
                bias_max = if bias_max.is_nan() { bias_max } else { bj };
            }
            let krow = &kf[(kbase + j) * d..(kbase + j + 1) * d];
            let mut s = R::ZERO;
            for t in 0..d {
                s += qrow[t] * (krow[t] * sqs);
            }
            if cfg.softcap > 0.0 {
                s = (s / softcap).tanh() * softcap;
            }
            scores[j] = s;
        }
        if want_qk && cfg.qk_mode <= 1 {
            qk_out.copy_from_slice(&scores);
        }
        for j in 0..total {
            scores[j] += bias[j];
        }
        if want_qk && cfg.qk_mode == 2 {
            qk_out.copy_from_slice(&scores);
        }
        // A row whose bias is all -inf has no attendable key: probabilities are all 0.
        let all_masked = bias_max == R::NEG_INF;
        if all_masked {
            scores.iter_mut().for_each(|s| *s = R::ZERO);
        } else {
            // Softmax with NaN propagating through the max like numpy's.
            let mut m = R::NEG_INF;
            for &s in &scores {
                if s.is_nan() || m.is_nan() {
                    m = if m.is_nan() { m } else { s };
                } else if s > m {
                    m = s;
                }
            }
            if m == R::NEG_INF {
                m = R::ZERO;
            }
            let mut sum = R::ZERO;
            for s in scores.iter_mut() {
                *s = (*s - m).exp();
                sum += *s;
            }
            if sum == R::ZERO {
                sum = R::ONE;
            }
            for s in scores.iter_mut() {
                *s = *s / sum;
            }
        }
        if want_qk && cfg.qk_mode == 3 {
            qk_out.copy_from_slice(&scores);
        }
        let vbase = (b * hkv + kh) * total;
        for (j, &p) in scores.iter().enumerate() {
            let vrow = &vf[(vbase + j) * dv..(vbase + j + 1) * dv];
            for (yo, &vv) in y.iter_mut().zip(vrow) {
                *yo += p * vv;
            }
        }
    };
    let chunk_rows = if rows == 0 {
        1
    } else {
        rows.div_ceil(cx.cpu.threads().max(1) * 4).max(1)
    };
    if unit > 0 {
        let cost = (total * (d + dv + 4)).div_ceil(unit);
        par_chunks_mut(cx.cpu, &mut buf, chunk_rows * unit, cost, &|c, run| {
            for (k, out) in run.chunks_mut(unit).enumerate() {
                row_fn(c * chunk_rows + k, out);
            }
        });
    }

    // Y: (batch, hq, sq, dv) or, for 3-D inputs, (batch, sq, hq * dv).
    let mut y = vec![R::ZERO; rows * dv];
    for r in 0..rows {
        let src = &buf[r * unit..r * unit + dv];
        let dst = if rank == 4 {
            r
        } else {
            let (i, h, b) = (r % sq, (r / sq) % hq, r / (sq * hq));
            (b * sq + i) * hq + h
        };
        y[dst * dv..(dst + 1) * dv].copy_from_slice(src);
    }
    let y_shape: Vec<usize> = if rank == 4 {
        vec![batch, hq, sq, dv]
    } else {
        vec![batch, sq, hq * dv]
    };
    let mut outs = vec![Value::Tensor(R::store(qt.dtype(), &y_shape, y)?)];
    if cfg.n_out >= 2 {
        outs.push(Value::Tensor(R::store(
            kt.dtype(),
            &[batch, hkv, total, d],
            kf.clone(),
        )?));
    }
    if cfg.n_out >= 3 {
        outs.push(Value::Tensor(R::store(
            vt.dtype(),
            &[batch, hkv, total, dv],
            vf.clone(),
        )?));
    }
    if want_qk {
        let qk: Vec<R> = (0..rows)
            .flat_map(|r| buf[r * unit + dv..(r + 1) * unit].iter().copied())
            .collect();
        outs.push(Value::Tensor(R::store(
            qt.dtype(),
            &[batch, hq, sq, total],
            qk,
        )?));
    }
    Ok(outs)
}

// ----------------------------------------------------------------------------- RotaryEmbedding

fn build_rotary(node: &Node) -> Result<Box<dyn Kernel>> {
    let interleaved = match node.get_i("interleaved", 0)? {
        0 => false,
        1 => true,
        v => bail!("RotaryEmbedding: interleaved must be 0 or 1, is {v}"),
    };
    let rot_dim = node.get_i("rotary_embedding_dim", 0)?;
    if rot_dim < 0 {
        bail!("RotaryEmbedding: rotary_embedding_dim must be nonnegative, is {rot_dim}");
    }
    let num_heads = node.get_i("num_heads", 0)?;
    if num_heads < 0 {
        bail!("RotaryEmbedding: num_heads must be nonnegative, is {num_heads}");
    }
    let (rot_dim, num_heads) = (rot_dim as usize, num_heads as usize);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            with_cf!("RotaryEmbedding", x.dtype(), R => {
                rotary::<R>(inputs, interleaved, rot_dim, num_heads)
            })
        },
    ))
}

/// One RotaryEmbedding call's layout, checked: element (b, seq, head, d) of X lives at
/// `b * sb + seq * ss + head * sh + d`; the first `2 * half` elements of each head rotate by
/// the caches' row `rows[b * seq + n]`. Shared by every provider's kernel (ONNX opset 23 and
/// com.microsoft).
pub struct RotaryPlan {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub sb: usize,
    pub ss: usize,
    pub sh: usize,
    pub half: usize,
    pub rows: Vec<usize>,
}

impl RotaryPlan {
    /// `x`, the caches and the ONNX op's `position_ids` (None: the caches are per token).
    pub fn new(
        x: &Tensor,
        cos_t: &Tensor,
        sin_t: &Tensor,
        pos_t: Option<&Tensor>,
        rot_dim: usize,
        num_heads: usize,
    ) -> Result<Self> {
        let s = x.shape();
        let (batch, seq, heads, hs, sb, ss, sh) = match s.len() {
            4 => {
                let (b, h, n, d) = (s[0], s[1], s[2], s[3]);
                (b, n, h, d, h * n * d, d, n * d)
            }
            3 => {
                if num_heads == 0 {
                    bail!("RotaryEmbedding: 3-D input needs the num_heads attribute");
                }
                let (b, n, hid) = (s[0], s[1], s[2]);
                if hid % num_heads != 0 {
                    bail!(
                        "RotaryEmbedding: hidden size {hid} is not a multiple of num_heads {num_heads}"
                    );
                }
                let d = hid / num_heads;
                (b, n, num_heads, d, n * hid, hid, d)
            }
            _ => bail!("RotaryEmbedding: input must be 3-D or 4-D, has shape {s:?}"),
        };
        let rd = if rot_dim == 0 { hs } else { rot_dim };
        if rd > hs || rd % 2 != 0 {
            bail!("RotaryEmbedding: rotary_embedding_dim {rd} must be even and at most the head size {hs}");
        }
        let half = rd / 2;
        let (cs, sn) = (cos_t.shape(), sin_t.shape());
        if cs != sn {
            bail!("RotaryEmbedding: cos_cache {cs:?} and sin_cache {sn:?} differ in shape");
        }
        if cs.last().copied() != Some(half) {
            bail!("RotaryEmbedding: cache's last dimension must be rotary_embedding_dim/2 = {half}, shape is {cs:?}");
        }
        // row of the caches for (b, seq)
        let rows: Vec<usize> = match pos_t {
            Some(p) => {
                if p.shape() != [batch, seq] {
                    bail!(
                        "RotaryEmbedding: position_ids must have shape ({batch}, {seq}), has {:?}",
                        p.shape()
                    );
                }
                if cs.len() != 2 {
                    bail!("RotaryEmbedding: with position_ids the caches must be 2-D, are {cs:?}");
                }
                let v = p.to_i64_vec()?;
                if let Some(&bad) = v.iter().find(|&&x| x < 0 || x as usize >= cs[0]) {
                    bail!(
                        "RotaryEmbedding: position id {bad} outside the cache's {} rows",
                        cs[0]
                    );
                }
                v.into_iter().map(|x| x as usize).collect()
            }
            None => {
                if cs != [batch, seq, half] {
                    bail!("RotaryEmbedding: without position_ids the caches must have shape ({batch}, {seq}, {half}), are {cs:?}");
                }
                (0..batch * seq).collect()
            }
        };
        Ok(RotaryPlan {
            batch,
            seq,
            heads,
            sb,
            ss,
            sh,
            half,
            rows,
        })
    }
}

/// ONNX RotaryEmbedding (inputs X, cos_cache, sin_cache, position_ids) on the host.
pub(crate) fn rotary<R: Cf>(
    inputs: &[Option<&Value>],
    interleaved: bool,
    rot_dim: usize,
    num_heads: usize,
) -> Result<Vec<Value>> {
    let xt = tensor_in(inputs, 0)?;
    let cos_t = tensor_in(inputs, 1)?;
    let sin_t = tensor_in(inputs, 2)?;
    let plan = RotaryPlan::new(
        xt,
        cos_t,
        sin_t,
        opt_tensor_in(inputs, 3)?,
        rot_dim,
        num_heads,
    )?;
    rotary_apply::<R>(xt, cos_t, sin_t, &plan, interleaved)
}

/// X rotated as `plan` says.
pub(crate) fn rotary_apply<R: Cf>(
    xt: &Tensor,
    cos_t: &Tensor,
    sin_t: &Tensor,
    plan: &RotaryPlan,
    interleaved: bool,
) -> Result<Vec<Value>> {
    let half = plan.half;
    let cosv = R::load(cos_t)?;
    let sinv = R::load(sin_t)?;
    let mut y = R::load(xt)?;
    for b in 0..plan.batch {
        for n in 0..plan.seq {
            let row = plan.rows[b * plan.seq + n];
            let (c, sv) = (&cosv[row * half..][..half], &sinv[row * half..][..half]);
            for h in 0..plan.heads {
                let base = b * plan.sb + n * plan.ss + h * plan.sh;
                let xs = &mut y[base..base + 2 * half];
                for k in 0..half {
                    let (i1, i2) = if interleaved {
                        (2 * k, 2 * k + 1)
                    } else {
                        (k, k + half)
                    };
                    let (x1, x2) = (xs[i1], xs[i2]);
                    xs[i1] = c[k] * x1 - sv[k] * x2;
                    xs[i2] = sv[k] * x1 + c[k] * x2;
                }
            }
        }
    }
    Ok(vec![Value::Tensor(R::store(xt.dtype(), xt.shape(), y)?)])
}

// ----------------------------------------------------------------------------- TensorScatter

fn build_tensor_scatter(node: &Node) -> Result<Box<dyn Kernel>> {
    let circular = match node.get_s("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        other => bail!("TensorScatter: mode must be linear or circular, is {other:?}"),
    };
    let axis = node.get_i("axis", -2)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let past = tensor_in(inputs, 0)?;
            let upd = tensor_in(inputs, 1)?;
            let idx_t = opt_tensor_in(inputs, 2)?;
            let (ps, us) = (past.shape(), upd.shape());
            let r = ps.len() as i64;
            if r < 2 {
                bail!("TensorScatter: past_cache must have rank >= 2, has shape {ps:?}");
            }
            let ax = if axis < 0 { axis + r } else { axis };
            if ax < 1 || ax >= r {
                bail!("TensorScatter: axis {axis} must name a non-batch axis of rank {r}");
            }
            let ax = ax as usize;
            if us.len() != ps.len()
                || (0..ps.len()).any(|i| {
                    if i == ax {
                        us[i] > ps[i]
                    } else {
                        us[i] != ps[i]
                    }
                })
            {
                bail!("TensorScatter: update shape {us:?} does not fit past_cache shape {ps:?} on axis {ax}");
            }
            if upd.dtype() != past.dtype() {
                bail!(
                    "TensorScatter: update is {}, past_cache is {}",
                    upd.dtype(),
                    past.dtype()
                );
            }
            let batch = ps[0];
            let idx: Vec<i64> = match idx_t {
                Some(t) => {
                    if t.shape() != [batch] {
                        bail!(
                            "TensorScatter: write_indices must have shape ({batch}), has {:?}",
                            t.shape()
                        );
                    }
                    t.to_i64_vec()?
                }
                None => vec![0; batch],
            };
            let max_len = ps[ax];
            let seq = us[ax];
            let inner: usize = ps[ax + 1..].iter().product();
            let outer: usize = ps[1..ax].iter().product();
            // Destination position along the axis for each update position, per batch.
            let mut dest = vec![0usize; batch * seq];
            for b in 0..batch {
                for k in 0..seq {
                    let p = idx[b] + k as i64;
                    let p = if circular {
                        if max_len == 0 {
                            bail!("TensorScatter: circular mode on an empty axis");
                        }
                        p.rem_euclid(max_len as i64)
                    } else {
                        p
                    };
                    if p < 0 || p >= max_len as i64 {
                        bail!("TensorScatter: write index {} + {k} is outside the cache's {max_len} positions", idx[b]);
                    }
                    dest[b * seq + k] = p as usize;
                }
            }
            let out = crate::dispatch_any!(past.dtype(), T => {
                let src = upd.as_slice::<T>()?;
                let mut dst: Vec<T> = past.as_slice::<T>()?.into_owned();
                for b in 0..batch {
                    for o in 0..outer {
                        for k in 0..seq {
                            let s0 = ((b * outer + o) * seq + k) * inner;
                            let d0 = ((b * outer + o) * max_len + dest[b * seq + k]) * inner;
                            dst[d0..d0 + inner].clone_from_slice(&src[s0..s0 + inner]);
                        }
                    }
                }
                Tensor::from_vec(ps, dst)?
            }, else bail!("TensorScatter: unsupported element type {}", past.dtype()));
            Ok(vec![Value::Tensor(out)])
        },
    ))
}

// ----------------------------------------------------------------------------- SwiGLU

fn build_swiglu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.0)? as f64;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let a = tensor_in(inputs, 0)?;
            let b = tensor_in(inputs, 1)?;
            if a.shape() != b.shape() || a.dtype() != b.dtype() {
                bail!(
                    "SwiGLU: A ({} {:?}) and B ({} {:?}) must have the same shape and type",
                    a.dtype(),
                    a.shape(),
                    b.dtype(),
                    b.shape()
                );
            }
            with_cf!("SwiGLU", a.dtype(), R => {
                let al = R::from_f64(alpha);
                let av = R::load(a)?;
                let bv = R::load(b)?;
                let y: Vec<R> = av
                    .iter()
                    .zip(&bv)
                    .map(|(&x, &v)| x * (R::ONE / (R::ONE + (-(al * x)).exp())) * v)
                    .collect();
                Ok(vec![Value::Tensor(R::store(a.dtype(), a.shape(), y)?)])
            })
        },
    ))
}

// ----------------------------------------------------------------------------- LinearAttention

#[derive(Clone, Copy, Debug)]
struct LinCfg {
    q_heads: usize,
    kv_heads: usize,
    scale: f32,
    gating: bool,
    delta: bool,
}

/// LinearAttention (opset 27): the recurrent state S (B, H_kv, d_k, d_v) is, per step,
/// decayed by exp(decay) (gated rules), corrected towards v with rate beta (delta rules), and
/// updated by k (x) v; the output reads q . S scaled. Computes in f32 like the reference.
fn build_linear_attention(node: &Node) -> Result<Box<dyn Kernel>> {
    let (gating, delta) = match node.get_s("update_rule", "gated_delta")?.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        other => bail!("LinearAttention: unknown update_rule {other:?}"),
    };
    let (Some(qh), Some(kvh)) = (node.attr_i("q_num_heads")?, node.attr_i("kv_num_heads")?) else {
        bail!("LinearAttention: q_num_heads and kv_num_heads are required");
    };
    if qh <= 0 || kvh <= 0 || qh % kvh != 0 {
        bail!("LinearAttention: q_num_heads ({qh}) must be a positive multiple of kv_num_heads ({kvh})");
    }
    let cfg = LinCfg {
        q_heads: qh as usize,
        kv_heads: kvh as usize,
        scale: node.get_f("scale", 0.0)?,
        gating,
        delta,
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            linear_attention(&cfg, inputs)
        },
    ))
}

fn linear_attention(cfg: &LinCfg, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let qt = tensor_in(inputs, 0)?;
    let kt = tensor_in(inputs, 1)?;
    let vt = tensor_in(inputs, 2)?;
    let past = opt_tensor_in(inputs, 3)?;
    let decay = opt_tensor_in(inputs, 4)?;
    let beta = opt_tensor_in(inputs, 5)?;
    for t in [Some(qt), Some(kt), Some(vt), past, decay, beta]
        .into_iter()
        .flatten()
    {
        if !matches!(
            t.dtype(),
            DataType::Float | DataType::Float16 | DataType::Bfloat16
        ) {
            bail!(
                "LinearAttention: inputs must be float, float16 or bfloat16, got {}",
                t.dtype()
            );
        }
    }
    if cfg.gating != decay.is_some() {
        bail!("LinearAttention: decay must be given exactly for the gated update rules");
    }
    if cfg.delta != beta.is_some() {
        bail!("LinearAttention: beta must be given exactly for the delta update rules");
    }
    let (qs, ks, vs) = (qt.shape(), kt.shape(), vt.shape());
    if qs.len() != 3 || ks.len() != 3 || vs.len() != 3 {
        bail!("LinearAttention: query, key and value must be 3-D, are {qs:?}, {ks:?}, {vs:?}");
    }
    let (b, t) = (qs[0], qs[1]);
    let (hq, hk) = (cfg.q_heads, cfg.kv_heads);
    if qs[2] % hq != 0 || vs[2] % hk != 0 {
        bail!(
            "LinearAttention: hidden sizes {} and {} do not split into {hq} and {hk} heads",
            qs[2],
            vs[2]
        );
    }
    let (dk, dv) = (qs[2] / hq, vs[2] / hk);
    if ks != [b, t, hk * dk] || vs[..2] != [b, t] {
        bail!("LinearAttention: key {ks:?} / value {vs:?} do not match query {qs:?} with {hk} kv heads");
    }
    let group = hq / hk;
    let q = qt.to_f32_vec()?;
    let k = kt.to_f32_vec()?;
    let v = vt.to_f32_vec()?;
    // decay per (b, t, head, d) with stride: per-head (dd = 0) or per-key-dim.
    let dec = match decay {
        Some(d) => {
            let s = d.shape();
            if s.len() != 3 || s[0] != b || s[1] != t || (s[2] != hk && s[2] != hk * dk) {
                bail!(
                    "LinearAttention: decay must be ({b}, {t}, {hk} or {}), is {s:?}",
                    hk * dk
                );
            }
            Some((d.to_f32_vec()?, s[2] == hk * dk))
        }
        None => None,
    };
    let bet = match beta {
        Some(d) => {
            let s = d.shape();
            if s.len() != 3 || s[0] != b || s[1] != t || (s[2] != hk && s[2] != 1) {
                bail!("LinearAttention: beta must be ({b}, {t}, {hk} or 1), is {s:?}");
            }
            Some((d.to_f32_vec()?, s[2]))
        }
        None => None,
    };
    let (mut state, state_dt) = match past {
        Some(p) => {
            if p.shape() != [b, hk, dk, dv] {
                bail!(
                    "LinearAttention: past_state must be ({b}, {hk}, {dk}, {dv}), is {:?}",
                    p.shape()
                );
            }
            (p.to_f32_vec()?, p.dtype())
        }
        None => (vec![0f32; b * hk * dk * dv], qt.dtype()),
    };
    let scale = if cfg.scale == 0.0 {
        (1.0 / libm::sqrt(dk as f64)) as f32
    } else {
        cfg.scale
    };
    let mut out = vec![0f32; b * t * hq * dv];
    let mut vt_row = vec![0f32; dv];
    for bb in 0..b {
        for ti in 0..t {
            for h in 0..hk {
                let st = &mut state[(bb * hk + h) * dk * dv..][..dk * dv];
                let krow = &k[((bb * t + ti) * hk + h) * dk..][..dk];
                vt_row.copy_from_slice(&v[((bb * t + ti) * hk + h) * dv..][..dv]);
                if let Some((dvals, per_dim)) = &dec {
                    for d in 0..dk {
                        let g = if *per_dim {
                            dvals[((bb * t + ti) * hk + h) * dk + d]
                        } else {
                            dvals[(bb * t + ti) * hk + h]
                        };
                        let e = libm::expf(g);
                        st[d * dv..(d + 1) * dv].iter_mut().for_each(|x| *x *= e);
                    }
                }
                if let Some((bvals, bl)) = &bet {
                    let be = bvals[(bb * t + ti) * bl + if *bl == 1 { 0 } else { h }];
                    for m in 0..dv {
                        let mut r = 0f32;
                        for d in 0..dk {
                            r += st[d * dv + m] * krow[d];
                        }
                        vt_row[m] = be * (vt_row[m] - r);
                    }
                }
                for d in 0..dk {
                    for m in 0..dv {
                        st[d * dv + m] += krow[d] * vt_row[m];
                    }
                }
                for g in 0..group {
                    let qh = h * group + g;
                    let qrow = &q[((bb * t + ti) * hq + qh) * dk..][..dk];
                    let o = &mut out[((bb * t + ti) * hq + qh) * dv..][..dv];
                    for m in 0..dv {
                        let mut acc = 0f32;
                        for d in 0..dk {
                            acc += qrow[d] * st[d * dv + m];
                        }
                        o[m] = scale * acc;
                    }
                }
            }
        }
    }
    Ok(vec![
        Value::Tensor(f32::store(qt.dtype(), &[b, t, hq * dv], out)?),
        Value::Tensor(f32::store(state_dt, &[b, hk, dk, dv], state)?),
    ])
}

// ----------------------------------------------------------------------------- CausalConvWithState

/// CausalConvWithState (opset 27): depthwise 1-D convolution over (batch, channels, length)
/// left-padded by the carried state (or zeros), with optional fused SiLU; the new state is the
/// last k - 1 positions of the padded input.
fn build_causal_conv(node: &Node) -> Result<Box<dyn Kernel>> {
    let silu = match node.get_s("activation", "none")?.as_str() {
        "none" => false,
        "silu" | "swish" => true,
        other => bail!("CausalConvWithState: unknown activation {other:?}"),
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            with_cf!("CausalConvWithState", x.dtype(), R => causal_conv::<R>(inputs, silu))
        },
    ))
}

fn causal_conv<R: Cf>(inputs: &[Option<&Value>], silu: bool) -> Result<Vec<Value>> {
    let xt = tensor_in(inputs, 0)?;
    let wt = tensor_in(inputs, 1)?;
    let bt = opt_tensor_in(inputs, 2)?;
    let pt = opt_tensor_in(inputs, 3)?;
    let (xs, ws) = (xt.shape(), wt.shape());
    if xs.len() != 3 {
        bail!("CausalConvWithState: input must be (batch, channels, length), is {xs:?}");
    }
    let (b, c, l) = (xs[0], xs[1], xs[2]);
    if ws.len() != 3 || ws[0] != c || ws[1] != 1 || ws[2] == 0 {
        bail!("CausalConvWithState: weight must be ({c}, 1, k) with k >= 1, is {ws:?}");
    }
    let k = ws[2];
    let w = R::load(wt)?;
    let bias = match bt {
        Some(t) => {
            if t.shape() != [c] {
                bail!(
                    "CausalConvWithState: bias must be ({c}), is {:?}",
                    t.shape()
                );
            }
            Some(R::load(t)?)
        }
        None => None,
    };
    let past = match pt {
        Some(t) => {
            if t.shape() != [b, c, k - 1] {
                bail!(
                    "CausalConvWithState: past_state must be ({b}, {c}, {}), is {:?}",
                    k - 1,
                    t.shape()
                );
            }
            Some(R::load(t)?)
        }
        None => None,
    };
    let x = R::load(xt)?;
    let pl = l + k - 1;
    let mut y = vec![R::ZERO; b * c * l];
    let mut state = vec![R::ZERO; b * c * (k - 1)];
    let mut padded = vec![R::ZERO; pl];
    for bc in 0..b * c {
        let ch = bc % c;
        if let Some(p) = &past {
            padded[..k - 1].copy_from_slice(&p[bc * (k - 1)..(bc + 1) * (k - 1)]);
        } else {
            padded[..k - 1].iter_mut().for_each(|v| *v = R::ZERO);
        }
        padded[k - 1..].copy_from_slice(&x[bc * l..(bc + 1) * l]);
        let wr = &w[ch * k..(ch + 1) * k];
        for ti in 0..l {
            let mut acc = R::ZERO;
            for m in 0..k {
                acc += wr[m] * padded[ti + m];
            }
            if let Some(bv) = &bias {
                acc += bv[ch];
            }
            if silu {
                acc = acc / (R::ONE + (-acc).exp());
            }
            y[bc * l + ti] = acc;
        }
        state[bc * (k - 1)..(bc + 1) * (k - 1)].copy_from_slice(&padded[pl - (k - 1)..]);
    }
    Ok(vec![
        Value::Tensor(R::store(xt.dtype(), xs, y)?),
        Value::Tensor(R::store(xt.dtype(), &[b, c, k - 1], state)?),
    ])
}

// ----------------------------------------------------------------------------- FlexAttention

/// FlexAttention (ai.onnx.preview opset 1) without score/prob modifier graphs: 4-D
/// (batch, heads, seq, size) Q, K, V with GQA head sharing, softmax(Q K^T * scale) V.
/// Computes in f32 for f32/f16/bf16 (f64 for double, or where softmax_precision asks).
fn build_flex_attention(node: &Node) -> Result<Box<dyn Kernel>> {
    for g in ["score_mod", "prob_mod"] {
        if node.attr(g).is_some() {
            bail!("FlexAttention: the {g} graph attribute is not supported");
        }
    }
    let wide = match node.attr_i("softmax_precision")? {
        None | Some(1) | Some(10) | Some(16) => false,
        Some(11) => true,
        Some(p) => bail!("FlexAttention: unsupported softmax_precision {p}"),
    };
    let scale = node.attr_f("scale")?.map(f64::from);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let q = tensor_in(inputs, 0)?;
            let dt = if wide { DataType::Double } else { q.dtype() };
            if !is_float(q.dtype()) {
                return Err(bad_type("FlexAttention", q.dtype()));
            }
            with_cf!("FlexAttention", dt, R => flex_attention::<R>(inputs, scale))
        },
    ))
}

fn flex_attention<R: Cf>(inputs: &[Option<&Value>], scale: Option<f64>) -> Result<Vec<Value>> {
    let (qt, kt, vt) = (
        tensor_in(inputs, 0)?,
        tensor_in(inputs, 1)?,
        tensor_in(inputs, 2)?,
    );
    let (qs, ks, vs) = (qt.shape(), kt.shape(), vt.shape());
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 {
        bail!("FlexAttention: Q, K, V must be 4-D, are {qs:?}, {ks:?}, {vs:?}");
    }
    let (b, hq, l, e) = (qs[0], qs[1], qs[2], qs[3]);
    let (hkv, s, dv) = (ks[1], ks[2], vs[3]);
    if ks[0] != b || vs[0] != b || ks[3] != e || vs[1] != hkv || vs[2] != s {
        bail!("FlexAttention: shapes Q {qs:?}, K {ks:?}, V {vs:?} do not agree");
    }
    if hkv == 0 || hq % hkv != 0 {
        bail!("FlexAttention: {hq} query heads are not a multiple of {hkv} kv heads");
    }
    let reps = hq / hkv;
    let sc = scale.unwrap_or_else(|| 1.0 / libm::sqrt(e as f64));
    let sqs = R::from_f64(libm::sqrt(sc));
    let (q, k, v) = (R::load(qt)?, R::load(kt)?, R::load(vt)?);
    let mut y = vec![R::ZERO; b * hq * l * dv];
    let mut p = vec![R::ZERO; s];
    for bb in 0..b {
        for h in 0..hq {
            let kh = (bb * hkv + h / reps) * s;
            for i in 0..l {
                let qrow = &q[((bb * hq + h) * l + i) * e..][..e];
                let mut m = R::NEG_INF;
                for j in 0..s {
                    let krow = &k[(kh + j) * e..][..e];
                    let mut acc = R::ZERO;
                    for t in 0..e {
                        acc += (qrow[t] * sqs) * (krow[t] * sqs);
                    }
                    p[j] = acc;
                    if acc.is_nan() || m.is_nan() {
                        m = if m.is_nan() { m } else { acc };
                    } else if acc > m {
                        m = acc;
                    }
                }
                let mut sum = R::ZERO;
                for x in p.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                let yrow = &mut y[((bb * hq + h) * l + i) * dv..][..dv];
                for (j, &pj) in p.iter().enumerate() {
                    let w = pj / sum;
                    for (yo, &vv) in yrow.iter_mut().zip(&v[(kh + j) * dv..][..dv]) {
                        *yo += w * vv;
                    }
                }
            }
        }
    }
    Ok(vec![Value::Tensor(R::store(
        vt.dtype(),
        &[b, hq, l, dv],
        y,
    )?)])
}

#[cfg(test)]
mod tests {
    //! Expected values are worked out by hand from the operator definitions.
    use super::*;
    use crate::ir::AttrValue;
    use crate::kernels::cpu_registry;
    use crate::provider::{Lookup, ReferenceCpu};
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

    fn run(n: &Node, ins: &[Option<Tensor>]) -> Result<Vec<Tensor>> {
        let k = match cpu_registry().lookup(n, &[]) {
            Lookup::Found(d) => (d.build)(n)?,
            _ => panic!("no kernel for {}", n.op_type),
        };
        let vals: Vec<Option<Value>> = ins.iter().map(|t| t.clone().map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &refs)?;
        Ok(out.into_iter().map(|v| v.into_tensor().unwrap()).collect())
    }

    fn t(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    #[track_caller]
    fn close(got: &Tensor, shape: &[usize], want: &[f32]) {
        assert_eq!(got.shape(), shape);
        let g = got.to_f32_vec().unwrap();
        for (a, b) in g.iter().zip(want) {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "got {g:?}, want {want:?}"
            );
        }
        assert_eq!(g.len(), want.len());
    }

    #[test]
    fn attention_causal_with_qk_output() {
        let n = node(
            "Attention",
            23,
            3,
            4,
            vec![
                ("is_causal", AttrValue::Int(1)),
                ("scale", AttrValue::Float(1.0)),
            ],
        );
        let q = t(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
        let v = t(&[1, 1, 2, 1], &[1.0, 3.0]);
        let out = run(&n, &[q.clone(), q.clone(), v]).unwrap();
        let e = core::f32::consts::E;
        // Row 0 sees key 0 only; row 1 has scores [0, 1].
        close(&out[0], &[1, 1, 2, 1], &[1.0, (1.0 + 3.0 * e) / (1.0 + e)]);
        close(&out[1], &[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
        close(&out[3], &[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn attention_gqa_3d_and_fully_masked_row() {
        // Two query heads share one kv head; 3-D packing (batch, seq, heads * size).
        let n = node(
            "Attention",
            23,
            4,
            1,
            vec![
                ("q_num_heads", AttrValue::Int(2)),
                ("kv_num_heads", AttrValue::Int(1)),
            ],
        );
        let q = t(&[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let k = t(&[1, 2, 1], &[0.0, 0.0]);
        let v = t(&[1, 2, 1], &[2.0, 4.0]);
        // Query 0 attends nothing (zero output); query 1 attends both keys equally.
        let mask = Some(Tensor::from_vec(&[2, 2], vec![false, false, true, true]).unwrap());
        let out = run(&n, &[q, k, v, mask]).unwrap();
        close(&out[0], &[1, 2, 2], &[0.0, 0.0, 3.0, 3.0]);
    }

    #[test]
    fn rotary_half_and_interleaved() {
        let x = t(&[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let cos = t(&[1, 1, 2], &[0.0, 1.0]);
        let sin = t(&[1, 1, 2], &[1.0, 0.0]);
        let n = node("RotaryEmbedding", 23, 3, 1, vec![]);
        let out = run(&n, &[x.clone(), cos.clone(), sin.clone()]).unwrap();
        close(&out[0], &[1, 1, 1, 4], &[-3.0, 2.0, 1.0, 4.0]);
        let n = node(
            "RotaryEmbedding",
            23,
            3,
            1,
            vec![("interleaved", AttrValue::Int(1))],
        );
        let out = run(&n, &[x, cos, sin]).unwrap();
        close(&out[0], &[1, 1, 1, 4], &[-2.0, 1.0, 3.0, 4.0]);
    }

    #[test]
    fn swiglu_gate() {
        let n = node("SwiGLU", 28, 2, 1, vec![]);
        let l3 = libm::logf(3.0);
        let out = run(&n, &[t(&[2], &[0.0, l3]), t(&[2], &[5.0, 2.0])]).unwrap();
        close(&out[0], &[2], &[0.0, 0.75 * l3 * 2.0]);
    }

    #[test]
    fn tensor_scatter_linear_and_circular() {
        let past = t(&[2, 3, 1], &[0.0; 6]);
        let upd = t(&[2, 1, 1], &[5.0, 6.0]);
        let idx = |v: &[i64]| Some(Tensor::from_vec(&[2], v.to_vec()).unwrap());
        let n = node("TensorScatter", 24, 3, 1, vec![]);
        let out = run(&n, &[past.clone(), upd.clone(), idx(&[2, 0])]).unwrap();
        close(&out[0], &[2, 3, 1], &[0.0, 0.0, 5.0, 6.0, 0.0, 0.0]);
        assert!(run(&n, &[past.clone(), upd.clone(), idx(&[3, 0])]).is_err());
        let mode = AttrValue::String(b"circular".to_vec());
        let n = node("TensorScatter", 24, 3, 1, vec![("mode", mode)]);
        let out = run(&n, &[past, upd, idx(&[3, 4])]).unwrap();
        close(&out[0], &[2, 3, 1], &[5.0, 0.0, 0.0, 0.0, 6.0, 0.0]);
    }

    #[test]
    fn causal_conv_with_past_state() {
        let n = node("CausalConvWithState", 27, 4, 2, vec![]);
        let x = t(&[1, 1, 3], &[1.0, 2.0, 3.0]);
        let w = t(&[1, 1, 2], &[1.0, 10.0]);
        let out = run(&n, &[x, w, None, t(&[1, 1, 1], &[4.0])]).unwrap();
        close(&out[0], &[1, 1, 3], &[14.0, 21.0, 32.0]);
        close(&out[1], &[1, 1, 1], &[3.0]);
    }

    #[test]
    fn linear_attention_linear_rule() {
        let n = node(
            "LinearAttention",
            27,
            3,
            2,
            vec![
                ("q_num_heads", AttrValue::Int(1)),
                ("kv_num_heads", AttrValue::Int(1)),
                ("scale", AttrValue::Float(1.0)),
                ("update_rule", AttrValue::String(b"linear".to_vec())),
            ],
        );
        let q = t(&[1, 2, 1], &[1.0, 1.0]);
        let k = t(&[1, 2, 1], &[1.0, 2.0]);
        let v = t(&[1, 2, 1], &[3.0, 4.0]);
        let out = run(&n, &[q, k, v]).unwrap();
        close(&out[0], &[1, 2, 1], &[3.0, 11.0]);
        close(&out[1], &[1, 1, 1, 1], &[11.0]);
    }
}
