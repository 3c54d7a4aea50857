//! Kernel family: the decoder operators onnxruntime-genai's model builder and ONNX Runtime's
//! transformer optimizer emit (domain `com.microsoft`, and `SimplifiedLayerNormalization`,
//! which ONNX Runtime registers in the ONNX domain): GroupQueryAttention, the RMS norms with
//! and without a residual input. Float32; the semantics follow ONNX Runtime's CPU kernels
//! (docs/operators.md lists what each accepts).

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::par::SyncPtr;
use super::{def, def_in, opt_tensor_in, tensor_in, LATEST};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

const MS: &str = "com.microsoft";
const F32: &[DataType] = &[DataType::Float];

pub(crate) const KERNELS: &[KernelDef] = &[
    def(
        "SimplifiedLayerNormalization",
        1,
        LATEST,
        build_simplified_ln,
    )
    .types(F32),
    def_in(
        MS,
        "SimplifiedLayerNormalization",
        1,
        1,
        build_simplified_ln,
    )
    .types(F32),
    def_in(
        MS,
        "SkipSimplifiedLayerNormalization",
        1,
        1,
        build_skip_simplified_ln,
    )
    .types(F32),
    def_in(MS, "GroupQueryAttention", 1, 1, build_gqa).types(F32),
];

/// An unused optional output's placeholder (the executor drops outputs the node leaves unnamed).
fn none() -> Value {
    Value::Tensor(Tensor::from_vec::<f32>(&[0], Vec::new()).expect("an empty tensor"))
}

/// `y = v / sqrt(mean(v^2) + eps) * gamma` for one row, in f32 with a sequential sum of
/// squares (ONNX Runtime's order); returns `1 / sqrt(mean(v^2) + eps)`.
fn rms_row(v: &[f32], gamma: &[f32], eps: f32, y: &mut [f32]) -> f32 {
    let mut ss = 0f32;
    for &x in v {
        ss += x * x;
    }
    let d = libm::sqrtf(ss / v.len() as f32 + eps);
    for ((o, &x), &g) in y.iter_mut().zip(v).zip(gamma) {
        *o = x / d * g;
    }
    1.0 / d
}

/// SimplifiedLayerNormalization's row as ONNX Runtime's CPU kernel (1.32) rounds it, which
/// differs from its SkipSimplifiedLayerNormalization ([`rms_row`]); fitted bit for bit to its
/// outputs on x86-64 (every element of 240 rows of 512): the squares accumulate in 8 lanes by
/// fused multiply-adds (element i into lane i % 8), the lanes are added as halves (4 + 4, then
/// 2 + 2, then 1 + 1), `inv = 1 / sqrt(sum / n + eps)` and `y = x * inv * gamma`. Elements
/// past the last 8 (no such row was measured) are fused into the sum in order. Returns `inv`.
/// Where an int8-quantizing MatMulNBits follows (accuracy level 4), a last-bit difference here
/// becomes a quantization step downstream, so the int4 decoders' greedy tokens depend on it.
fn rms_row_lanes(v: &[f32], gamma: &[f32], eps: f32, y: &mut [f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n8 = v.len() / 8 * 8;
    for c in v[..n8].chunks_exact(8) {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = libm::fmaf(x, x, *a);
        }
    }
    for w in [4, 2, 1] {
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    let mut ss = acc[0];
    for &x in &v[n8..] {
        ss = libm::fmaf(x, x, ss);
    }
    let inv = 1.0 / libm::sqrtf(ss / v.len() as f32 + eps);
    for ((o, &x), &g) in y.iter_mut().zip(v).zip(gamma) {
        *o = x * inv * g;
    }
    inv
}

// ----------------------------------------------------------------------------- RMS norms

/// SimplifiedLayerNormalization: RMS normalisation over the axes from `axis` on; output 1 is
/// `inv_std_var` (shape X's leading dims, then ones).
fn build_simplified_ln(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", -1)?;
    let eps = node.get_f("epsilon", 1e-5)?;
    let stash = node.get_i("stash_type", 1)?;
    if stash != 1 {
        unsupported!("SimplifiedLayerNormalization with stash_type {stash} (only 1 = float)");
    }
    let n_out = node.outputs.len().clamp(1, 2);
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let scale = tensor_in(inputs, 1)?;
            let shape = x.shape();
            let ax = super::norm_axis(axis, shape.len())?;
            let n: usize = shape[ax..].iter().product();
            if scale.len() != n {
                bail!(
                    "scale has {} elements, the normalised shape {:?} {n}",
                    scale.len(),
                    &shape[ax..]
                );
            }
            let (xs, g) = (x.as_slice::<f32>()?, scale.as_slice::<f32>()?);
            let rows = xs.len().checked_div(n).unwrap_or(0);
            let mut y = cx.output::<f32>(0, shape)?;
            let mut inv = vec![0f32; rows];
            for (r, iv) in inv.iter_mut().enumerate() {
                *iv = rms_row_lanes(&xs[r * n..][..n], &g, eps, &mut y[r * n..][..n]);
            }
            let mut outs = vec![Value::Tensor(y.into_tensor())];
            if n_out > 1 {
                let mut s = shape[..ax].to_vec();
                s.resize(shape.len(), 1);
                outs.push(Value::Tensor(Tensor::from_vec(&s, inv)?));
            }
            Ok(outs)
        },
    ))
}

/// The outputs of the Skip*LayerNormalization family: `(want_sum, n_out)`. Outputs 1 and 2
/// (mean, inv_std_var) are not written by ONNX Runtime's CPU kernels and are refused at load.
pub fn skip_norm_outputs(node: &Node) -> Result<(bool, usize)> {
    let wired = |k: usize| node.outputs.get(k).copied().flatten().is_some();
    if wired(1) || wired(2) {
        unsupported!(
            "{}'s mean and inv_std_var outputs are not produced",
            node.op_type
        );
    }
    Ok((wired(3), node.outputs.len().clamp(1, 4)))
}

/// The checks of a Skip*LayerNormalization call (every provider's kernel makes them): input of
/// rank 2 or more, `skip` repeating over it by whole rows, gamma, beta and bias a hidden size
/// each. Returns the hidden size (input's last axis).
pub fn skip_norm_hidden(
    op: &str,
    x: &Tensor,
    skip: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Result<usize> {
    let shape = x.shape();
    let h = *shape.last().unwrap_or(&0);
    if shape.len() < 2 || h == 0 {
        bail!("{op}: input of shape {shape:?}");
    }
    if skip.is_empty() || !x.len().is_multiple_of(skip.len()) || !skip.len().is_multiple_of(h) {
        bail!(
            "{op}: skip of shape {:?} does not repeat over input {shape:?}",
            skip.shape()
        );
    }
    for (t, what) in [(Some(gamma), "gamma"), (beta, "beta"), (bias, "bias")] {
        if let Some(t) = t.filter(|t| t.len() != h) {
            bail!(
                "{op}: {what} has {} elements, the hidden size is {h}",
                t.len()
            );
        }
    }
    Ok(h)
}

/// The row loop of the Skip*LayerNormalization family: `v = input + skip (+ bias)` per row of
/// the last axis, `skip` being input's shape or a trailing part of it ((1, S, H) or (S, H))
/// repeated over the leading rows; `norm(v, gamma, beta, y_row)` writes each output row.
/// Output 3 (when wired) is `v`; gamma, beta and bias must hold a hidden size each.
#[allow(clippy::too_many_arguments)]
pub(crate) fn skip_norm_run(
    cx: &KernelCx<'_>,
    op: &str,
    x: &Tensor,
    skip: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    bias: Option<&Tensor>,
    (want_sum, n_out): (bool, usize),
    norm: impl Fn(&[f32], &[f32], Option<&[f32]>, &mut [f32]),
) -> Result<Vec<Value>> {
    let shape = x.shape();
    let h = skip_norm_hidden(op, x, skip, gamma, beta, bias)?;
    let xs = x.as_slice::<f32>()?;
    let ss = skip.as_slice::<f32>()?;
    let g = gamma.as_slice::<f32>()?;
    let be = beta.map(|t| t.as_slice::<f32>()).transpose()?;
    let bi = bias.map(|t| t.as_slice::<f32>()).transpose()?;
    let mut y = cx.output::<f32>(0, shape)?;
    let mut sum = vec![0f32; if want_sum { xs.len() } else { h }];
    for r in 0..xs.len() / h {
        let v = if want_sum {
            &mut sum[r * h..][..h]
        } else {
            &mut sum[..]
        };
        let xr = &xs[r * h..][..h];
        let sr = &ss[(r * h) % ss.len()..][..h];
        for j in 0..h {
            v[j] = xr[j] + sr[j];
        }
        if let Some(b) = &bi {
            v.iter_mut().zip(b.iter()).for_each(|(v, b)| *v += b);
        }
        norm(v, &g, be.as_deref(), &mut y[r * h..][..h]);
    }
    let mut outs = vec![Value::Tensor(y.into_tensor())];
    while outs.len() < n_out {
        if outs.len() == 3 && want_sum {
            outs.push(Value::Tensor(Tensor::from_vec(
                shape,
                core::mem::take(&mut sum),
            )?));
        } else {
            outs.push(none());
        }
    }
    Ok(outs)
}

/// SkipSimplifiedLayerNormalization: `v = input + skip (+ bias)`, RMS-normalised over the last
/// axis and scaled by gamma; output 3 is `v` (see [`skip_norm_run`]).
fn build_skip_simplified_ln(node: &Node) -> Result<Box<dyn Kernel>> {
    let eps = node.get_f("epsilon", 1e-12)?;
    let outs = skip_norm_outputs(node)?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            skip_norm_run(
                cx,
                "SkipSimplifiedLayerNormalization",
                tensor_in(inputs, 0)?,
                tensor_in(inputs, 1)?,
                tensor_in(inputs, 2)?,
                None,
                opt_tensor_in(inputs, 3)?,
                outs,
                |v, g, _, y| {
                    rms_row(v, g, eps, y);
                },
            )
        },
    ))
}

// ----------------------------------------------------------------------------- GQA

struct Gqa {
    heads: usize,
    kv_heads: usize,
    scale: f32,
    softcap: f32,
    window: i64,
    rotary: bool,
    interleaved: bool,
    smooth: bool,
}

fn build_gqa(node: &Node) -> Result<Box<dyn Kernel>> {
    let heads = node.get_i("num_heads", 0)?;
    let kv_heads = node.get_i("kv_num_heads", 0)?;
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        bail!("GroupQueryAttention: num_heads {heads} and kv_num_heads {kv_heads}");
    }
    let qk = node.get_i("qk_output", 0)?;
    if qk != 0 {
        unsupported!("GroupQueryAttention with qk_output {qk} (only 0)");
    }
    let smooth = node.get_i("smooth_softmax", 0)? != 0;
    Ok(Box::new(Gqa {
        heads: heads as usize,
        kv_heads: kv_heads as usize,
        scale: node.get_f("scale", 0.0)?,
        softcap: node.get_f("softcap", 0.0)?,
        window: node.get_i("local_window_size", -1)?,
        rotary: node.get_i("do_rotary", 0)? != 0,
        interleaved: node.get_i("rotary_interleaved", 0)? != 0,
        smooth,
    }))
}

/// Rotates the first `2 * cos.len()` elements of `x` by the angles of one position.
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    if !interleaved {
        return crate::simd::rotate_halves(x, cos, sin);
    }
    let h2 = cos.len();
    for i in 0..h2 {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + h2)
        };
        let (xa, xb) = (x[a], x[b]);
        // ONNX Runtime's rounding (its rotary kernel's fused multiply-adds, fitted to its
        // rotated keys bit for bit)
        x[a] = libm::fmaf(xa, cos[i], -(xb * sin[i]));
        x[b] = libm::fmaf(xa, sin[i], xb * cos[i]);
    }
}

/// A softmax's sum of exponentials in ONNX Runtime's order (its 16-lane kernel): element i
/// into sum i % 16 in order, sums i and i + 8 added, then the 8 folded as
/// `((m0 + m1) + (m2 + m3)) + ((m4 + m5) + (m6 + m7))`.
fn sum_lanes16(e: &[f32]) -> f32 {
    let mut l = [0f32; 16];
    for c in e.chunks(16) {
        for (s, &v) in l.iter_mut().zip(c) {
            *s += v;
        }
    }
    let m: [f32; 8] = core::array::from_fn(|i| l[i] + l[i + 8]);
    ((m[0] + m[1]) + (m[2] + m[3])) + ((m[4] + m[5]) + (m[6] + m[7]))
}

/// The block of keys ONNX Runtime's GEMM sums in one chain before adding it to the output
/// (longer rows of weighted values are summed 256 keys at a time).
const PV_BLOCK: usize = 256;

fn ints32(t: &Tensor, what: &str) -> Result<Vec<i64>> {
    if t.dtype() != DataType::Int32 {
        bail!(
            "GroupQueryAttention: {what} must be int32, is {}",
            t.dtype()
        );
    }
    t.to_i64_vec()
}

/// One GroupQueryAttention call's inputs, checked: shapes, dtypes of the host integers, the
/// per-batch lengths and each new token's rotary row. Every provider's kernel starts here, so
/// they accept and refuse the same calls.
pub struct GqaPlan<'a> {
    pub q: &'a Tensor,
    /// separate key and value (None: packed into `q`)
    pub key: Option<&'a Tensor>,
    pub value: Option<&'a Tensor>,
    pub b: usize,
    /// new tokens per sequence
    pub s: usize,
    /// the query's last axis
    pub qdim: usize,
    /// head size
    pub h: usize,
    pub total: usize,
    /// rows of the past buffer
    pub past_len: usize,
    /// rows of present: `max(total, past_len)`
    pub plen: usize,
    /// a first prompt (`s == total`)
    pub first: bool,
    /// cos and sin caches, their rows and half the rotary width
    pub rot: Option<(&'a Tensor, &'a Tensor, usize, usize)>,
    /// attention_bias and its first two extents (1 or the batch, 1 or the heads)
    pub bias: Option<(&'a Tensor, usize, usize)>,
    pub sink: Option<&'a Tensor>,
    /// per sequence: (past tokens, total tokens)
    pub lens: Vec<(usize, usize)>,
    /// with rotary: each new token's rotary row, `b * s` of them
    pub positions: Vec<usize>,
}

impl<'a> GqaPlan<'a> {
    /// `past_k`, `past_v`: inputs 3 and 4, or the tensors the caller moved out of them.
    pub fn new(
        nh: usize,
        nkv: usize,
        rotary: bool,
        inputs: &[Option<&'a Value>],
        past_k: Option<&Tensor>,
        past_v: Option<&Tensor>,
    ) -> Result<Self> {
        let q = tensor_in(inputs, 0)?;
        let key = opt_tensor_in(inputs, 1)?;
        let value = opt_tensor_in(inputs, 2)?;
        let seqlens = ints32(tensor_in(inputs, 5)?, "seqlens_k")?;
        let total = ints32(tensor_in(inputs, 6)?, "total_sequence_length")?;
        let cos = opt_tensor_in(inputs, 7)?;
        let sin = opt_tensor_in(inputs, 8)?;
        let pos_ids = opt_tensor_in(inputs, 9)?;
        let bias = opt_tensor_in(inputs, 10)?;
        let sink = opt_tensor_in(inputs, 11)?;
        let [b, s, qdim] = match *q.shape() {
            [b, s, d] => [b, s, d],
            ref sh => bail!("GroupQueryAttention: query of shape {sh:?}, expected 3-D"),
        };
        let packed = key.is_none();
        if packed != value.is_none() {
            bail!("GroupQueryAttention: key and value must both be given or both be absent");
        }
        let h = if packed {
            qdim / (nh + 2 * nkv)
        } else {
            qdim / nh
        };
        if h == 0 || (packed && qdim != (nh + 2 * nkv) * h) || (!packed && qdim != nh * h) {
            bail!("GroupQueryAttention: query width {qdim} does not split into {nh} heads (+{nkv} kv heads)");
        }
        if let (Some(k), Some(v)) = (key, value) {
            let want = [b, s, nkv * h];
            if k.shape() != want || v.shape() != want {
                bail!(
                    "GroupQueryAttention: key {:?} / value {:?}, expected {want:?}",
                    k.shape(),
                    v.shape()
                );
            }
        }
        if seqlens.len() != b || total.len() != 1 {
            bail!(
                "GroupQueryAttention: seqlens_k has {} values for batch {b}, total_sequence_length {}",
                seqlens.len(),
                total.len()
            );
        }
        let total = usize::try_from(total[0])
            .map_err(|_| crate::error::Error::Other("negative total_sequence_length".into()))?;
        let past_len = match (past_k, past_v) {
            (Some(pk), Some(pv)) => {
                let ps = pk.shape();
                if ps.len() != 4 || ps[0] != b || ps[1] != nkv || ps[3] != h || pv.shape() != ps {
                    bail!(
                        "GroupQueryAttention: past key {ps:?} / value {:?}, expected [{b}, {nkv}, P, {h}]",
                        pv.shape()
                    );
                }
                ps[2]
            }
            (None, None) => 0,
            _ => bail!(
                "GroupQueryAttention: past_key and past_value must both be given or both be absent"
            ),
        };
        let first = s == total;
        if !first && s > 1 && b > 1 {
            unsupported!("GroupQueryAttention: a continued prompt ({s} new of {total} tokens) with batch {b} > 1");
        }
        if !first && s != 1 && s > total {
            bail!("GroupQueryAttention: {s} new tokens but total_sequence_length {total}");
        }
        let plen = total.max(past_len);
        let rot = if rotary {
            let (Some(c), Some(sn)) = (cos, sin) else {
                bail!("GroupQueryAttention: do_rotary needs cos_cache and sin_cache");
            };
            let cs = c.shape();
            if cs.len() != 2 || sn.shape() != cs || 2 * cs[1] > h {
                bail!(
                    "GroupQueryAttention: cos/sin caches {cs:?} / {:?} for head size {h}",
                    sn.shape()
                );
            }
            Some((c, sn, cs[0], cs[1]))
        } else {
            None
        };
        let pos_ids = match pos_ids {
            Some(p) => {
                if p.len() < b * s && (!first || p.is_empty()) {
                    bail!("GroupQueryAttention: position_ids of shape {:?}", p.shape());
                }
                Some(p.to_i64_vec()?)
            }
            None => None,
        };
        let bias = match bias {
            Some(t) => {
                let bs = t.shape();
                if bs.len() != 4
                    || (bs[0] != 1 && bs[0] != b)
                    || (bs[1] != 1 && bs[1] != nh)
                    || bs[2] != s
                    || bs[3] != total
                {
                    bail!("GroupQueryAttention: attention_bias of shape {bs:?}");
                }
                Some((t, bs[0], bs[1]))
            }
            None => None,
        };
        if let Some(t) = sink {
            if t.len() != nh {
                bail!("GroupQueryAttention: head_sink of shape {:?}", t.shape());
            }
        }
        let mut lens = Vec::with_capacity(b);
        let mut positions = Vec::with_capacity(if rot.is_some() { b * s } else { 0 });
        for (bi, &sl) in seqlens.iter().enumerate() {
            let total_b = usize::try_from(sl + 1)
                .ok()
                .filter(|&t| t <= plen && (first || t >= s))
                .ok_or_else(|| {
                    crate::error::Error::Other(alloc::format!(
                        "GroupQueryAttention: seqlens_k[{bi}] = {sl} outside 0..{plen} for {s} new tokens"
                    ))
                })?;
            let past_b = if first { 0 } else { total_b - s };
            if past_b > past_len {
                bail!("GroupQueryAttention: {past_b} past tokens, the past holds {past_len}");
            }
            lens.push((past_b, total_b));
            if let Some((_, _, rows, _)) = &rot {
                for si in 0..s {
                    let p = match &pos_ids {
                        Some(ids) if first => ids[0] + si as i64,
                        Some(ids) => ids[bi * s + si],
                        None => (past_b + si) as i64,
                    };
                    match usize::try_from(p) {
                        Ok(p) if p < *rows => positions.push(p),
                        _ => bail!(
                            "GroupQueryAttention: position {p} outside the {rows}-row rotary cache"
                        ),
                    }
                }
            }
        }
        Ok(GqaPlan {
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
            first,
            rot,
            bias,
            sink,
            lens,
            positions,
        })
    }
}

impl Kernel for Gqa {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        self.run(cx, inputs, None)
    }

    /// past key and value: when the executor hands them over and nothing else holds them,
    /// present is written into their storage (onnxruntime-genai's shared past/present buffer,
    /// without a copy of the cache per step).
    fn reusable_inputs(&self) -> &[usize] {
        &[3, 4]
    }

    fn compute_owned(
        &self,
        cx: &KernelCx<'_>,
        mut inputs: Vec<Option<Value>>,
    ) -> Result<Vec<Value>> {
        let unique = |v: Option<&Option<Value>>| matches!(v, Some(Some(Value::Tensor(t))) if t.dtype() == DataType::Float && t.is_unique_host());
        let owned = if unique(inputs.get(3)) && unique(inputs.get(4)) {
            match (inputs[3].take(), inputs[4].take()) {
                (Some(Value::Tensor(k)), Some(Value::Tensor(v))) => Some((k, v)),
                _ => None,
            }
        } else {
            None
        };
        let refs: Vec<Option<&Value>> = inputs.iter().map(Option::as_ref).collect();
        self.run(cx, &refs, owned)
    }
}

impl Gqa {
    /// The kernel; `owned`: past key and value moved out of `inputs` (slots 3 and 4 empty),
    /// unique, reused as present when they hold enough rows.
    fn run(
        &self,
        cx: &KernelCx<'_>,
        inputs: &[Option<&Value>],
        owned: Option<(Tensor, Tensor)>,
    ) -> Result<Vec<Value>> {
        let (nh, nkv) = (self.heads, self.kv_heads);
        let (past_k, past_v) = match &owned {
            Some((k, v)) => (Some(k), Some(v)),
            None => (opt_tensor_in(inputs, 3)?, opt_tensor_in(inputs, 4)?),
        };
        let plan = GqaPlan::new(nh, nkv, self.rotary, inputs, past_k, past_v)?;
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
            ..
        } = plan;
        let rot = match plan.rot {
            Some((c, sn, _, h2)) => Some((c.as_slice::<f32>()?, sn.as_slice::<f32>()?, h2)),
            None => None,
        };
        let bias_v = match plan.bias {
            Some((t, b0, b1)) => Some((t.as_slice::<f32>()?, b0, b1)),
            None => None,
        };
        let sink_v = plan.sink.map(|t| t.as_slice::<f32>()).transpose()?;
        let qv = q.as_slice::<f32>()?;
        let kv_in = match (key, value) {
            (Some(k), Some(v)) => Some((k.as_slice::<f32>()?, v.as_slice::<f32>()?)),
            _ => None,
        };
        let n_present = b * nkv * plen * h;
        // present in the past's own storage when it is ours and holds every row
        let (mut present_k, mut present_v, pk, pv) = match owned {
            Some((k, v)) if plen == past_len => {
                (k.into_vec::<f32>()?, v.into_vec::<f32>()?, None, None)
            }
            _ => (
                vec![0f32; n_present],
                vec![0f32; n_present],
                past_k.map(|t| t.as_slice::<f32>()).transpose()?,
                past_v.map(|t| t.as_slice::<f32>()).transpose()?,
            ),
        };
        let alpha = if self.scale == 0.0 {
            1.0 / libm::sqrtf(h as f32)
        } else {
            self.scale
        };
        let group = nh / nkv;
        let row = |bi: usize, si: usize| (bi * s + si) * qdim;
        let mut out = vec![0f32; b * s * nh * h];
        let mut qrot = vec![0f32; s * nh * h];
        for bi in 0..b {
            let (past_b, total_b) = plan.lens[bi];
            let at_pos = &plan.positions[if rot.is_some() {
                bi * s..(bi + 1) * s
            } else {
                0..0
            }];
            let turn = |x: &mut [f32], si: usize| {
                if let Some((c, sn, h2)) = &rot {
                    let p = at_pos[si];
                    rope(
                        x,
                        &c[p * h2..][..*h2],
                        &sn[p * h2..][..*h2],
                        self.interleaved,
                    );
                }
            };
            // past rows, then the new rows (keys rotated) into present
            for j in 0..nkv {
                let base = (bi * nkv + j) * plen * h;
                if let (Some(pk), Some(pv)) = (&pk, &pv) {
                    let src = (bi * nkv + j) * past_len * h;
                    present_k[base..base + past_b * h].copy_from_slice(&pk[src..src + past_b * h]);
                    present_v[base..base + past_b * h].copy_from_slice(&pv[src..src + past_b * h]);
                }
                for si in 0..s {
                    let (kr, vr) = match &kv_in {
                        Some((k, v)) => {
                            let o = (bi * s + si) * nkv * h + j * h;
                            (&k[o..o + h], &v[o..o + h])
                        }
                        None => {
                            let o = row(bi, si) + (nh + j) * h;
                            let ov = row(bi, si) + (nh + nkv + j) * h;
                            (&qv[o..o + h], &qv[ov..ov + h])
                        }
                    };
                    let at = base + (past_b + si) * h;
                    present_k[at..at + h].copy_from_slice(kr);
                    present_v[at..at + h].copy_from_slice(vr);
                    turn(&mut present_k[at..at + h], si);
                }
            }
            // queries, rotated
            for si in 0..s {
                for n in 0..nh {
                    let dst = &mut qrot[(si * nh + n) * h..][..h];
                    dst.copy_from_slice(&qv[row(bi, si) + n * h..][..h]);
                    turn(dst, si);
                }
            }
            // scores over the causal (and windowed) keys, softmax, weighted values: heads in
            // parallel, each writing its own rows of `out`
            let (pk_all, pv_all) = (&present_k, &present_v);
            let outp = SyncPtr(out.as_mut_ptr());
            let qrot = &qrot;
            let (bias_v, sink_v) = (&bias_v, &sink_v);
            cx.cpu.parallel_for_work(nh, s * nh * plen * h * 4, &|n| {
                let j = n / group;
                let kb = &pk_all[(bi * nkv + j) * plen * h..][..plen * h];
                let vb = &pv_all[(bi * nkv + j) * plen * h..][..plen * h];
                let mut scores = crate::simd::scratch::<f32>(2 * plen + h);
                let (scores, ex) = scores.split_at_mut(plen);
                let (ex, blk) = ex.split_at_mut(plen);
                // a prompt's scores: keys transposed (k-major), one fused chain per score
                let mut kt = crate::simd::scratch::<f32>(if s > 1 { total_b * h } else { 0 });
                if s > 1 {
                    for (t, key) in kb[..total_b * h].chunks_exact(h).enumerate() {
                        for (k, &x) in key.iter().enumerate() {
                            kt[k * total_b + t] = x;
                        }
                    }
                }
                for si in 0..s {
                    let len = (past_b + si + 1).min(total_b);
                    let start = if self.window >= 0 && len > self.window as usize {
                        len - self.window as usize
                    } else {
                        0
                    };
                    let qr = &qrot[(si * nh + n) * h..][..h];
                    let sc = &mut scores[start..len];
                    // scores rounded as ONNX Runtime's: its one-row kernel for one new token,
                    // its GEMM's fused chains for a prompt
                    if s == 1 {
                        let isa = crate::simd::isa().min(crate::simd::Isa::Avx2);
                        crate::simd::dots_lanes8_on(isa, &kb[start * h..], h, qr, sc);
                    } else {
                        crate::simd::fma_chains(&kt[start..], total_b, qr, sc);
                    }
                    let mut mx = f32::NEG_INFINITY;
                    for (t, x) in (start..len).zip(sc.iter_mut()) {
                        *x *= alpha;
                        if self.softcap > 0.0 {
                            *x = self.softcap * libm::tanhf(*x / self.softcap);
                        }
                        if let Some((bv, b0, b1)) = bias_v {
                            let bb = if *b0 == 1 { 0 } else { bi };
                            let bn = if *b1 == 1 { 0 } else { n };
                            *x += bv[((bb * b1 + bn) * s + si) * total + t];
                        }
                        mx = mx.max(*x);
                    }
                    let sink_x = match sink_v {
                        Some(sv) => Some(sv[n]),
                        None if self.smooth => Some(0.0),
                        None => None,
                    };
                    if let Some(sx) = sink_x {
                        mx = mx.max(sx);
                    }
                    let ex = &mut ex[start..len];
                    crate::simd::exp_shifted(sc, -mx, ex);
                    let mut den = sum_lanes16(ex);
                    if let Some(sx) = sink_x {
                        den += libm::expf(sx - mx);
                    }
                    // SAFETY: row (bi, si, n) of `out` is written by this task alone (one task
                    // per head), and `out` outlives `parallel_for_work`.
                    let o = unsafe {
                        core::slice::from_raw_parts_mut(
                            outp.get().add(((bi * s + si) * nh + n) * h),
                            h,
                        )
                    };
                    if len > start && den > 0.0 {
                        // the weighted values rounded as ONNX Runtime's: unfused products
                        // added in order for one new token; for a prompt, fused chains over
                        // blocks of PV_BLOCK keys (from key 0), each block added to the output
                        if s == 1 {
                            for (t, &e) in (start..len).zip(ex.iter()) {
                                for (od, &v) in o.iter_mut().zip(&vb[t * h..][..h]) {
                                    *od += e * v;
                                }
                            }
                        } else {
                            let mut b0 = start / PV_BLOCK * PV_BLOCK;
                            while b0 < len {
                                let (lo, hi) = (b0.max(start), (b0 + PV_BLOCK).min(len));
                                blk.fill(0.0);
                                crate::simd::axpy_rows(
                                    &ex[lo - start..hi - start],
                                    &vb[lo * h..],
                                    h,
                                    blk,
                                );
                                o.iter_mut().zip(blk.iter()).for_each(|(od, &b)| *od += b);
                                b0 += PV_BLOCK;
                            }
                        }
                        let inv = 1.0 / den;
                        o.iter_mut().for_each(|x| *x *= inv);
                    }
                }
            });
        }
        let pshape = [b, nkv, plen, h];
        Ok(vec![
            Value::Tensor(Tensor::from_vec(&[b, s, nh * h], out)?),
            Value::Tensor(Tensor::from_vec(&pshape, present_k)?),
            Value::Tensor(Tensor::from_vec(&pshape, present_v)?),
        ])
    }
}

#[cfg(test)]
mod tests {
    use alloc::string::String;
    use alloc::vec;
    use alloc::vec::Vec;

    use super::super::test_util::{close, node, run, run_owned, seq, t32};
    use crate::ir::{AttrValue, Node};
    use crate::tensor::Tensor;

    fn ms(mut n: Node) -> Node {
        n.domain = String::from("com.microsoft");
        n
    }

    fn i32s(shape: &[usize], v: Vec<i32>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    /// RMS norm of one row in f64, straight from the definition.
    fn rms(v: &[f64], g: &[f64], eps: f64) -> Vec<f64> {
        let ms = v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64;
        let d = (ms + eps).sqrt();
        v.iter().zip(g).map(|(x, g)| x / d * g).collect()
    }

    #[test]
    fn simplified_layer_norm_matches_the_definition_over_trailing_axes() {
        let x = seq(24, 7, 11, 0.3);
        let g = seq(12, 5, 7, 0.2);
        let n = node(
            "SimplifiedLayerNormalization",
            22,
            vec![
                ("axis", AttrValue::Int(1)),
                ("epsilon", AttrValue::Float(1e-3)),
            ],
            2,
        );
        let out = run(
            &n,
            &[
                Some(t32(&[2, 3, 4], x.clone())),
                Some(t32(&[3, 4], g.clone())),
            ],
        )
        .unwrap();
        assert_eq!(out[1].shape(), &[2, 1, 1]);
        let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
        let mut want = Vec::new();
        let mut inv = Vec::new();
        for r in 0..2 {
            let row: Vec<f64> = x[r * 12..(r + 1) * 12].iter().map(|&v| v as f64).collect();
            want.extend(rms(&row, &g64, 1e-3).into_iter().map(|v| v as f32));
            let ms = row.iter().map(|v| v * v).sum::<f64>() / 12.0;
            inv.push((1.0 / (ms + 1e-3).sqrt()) as f32);
        }
        close(&out[0].to_f32_vec().unwrap(), &want, 1e-5);
        close(&out[1].to_f32_vec().unwrap(), &inv, 1e-5);
    }

    #[test]
    fn skip_simplified_layer_norm_adds_a_repeated_skip_and_the_bias_first() {
        let x = seq(24, 7, 11, 0.3);
        let skip = seq(12, 3, 5, 0.4);
        let g = seq(4, 5, 7, 0.2);
        let b = seq(4, 2, 9, 0.1);
        let mut n = ms(node(
            "SkipSimplifiedLayerNormalization",
            1,
            vec![("epsilon", AttrValue::Float(1e-4))],
            4,
        ));
        n.outputs = vec![Some(0), None, None, Some(3)];
        let out = run(
            &n,
            &[
                Some(t32(&[2, 3, 4], x.clone())),
                Some(t32(&[3, 4], skip.clone())),
                Some(t32(&[4], g.clone())),
                Some(t32(&[4], b.clone())),
            ],
        )
        .unwrap();
        let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
        let (mut want, mut sum) = (Vec::new(), Vec::new());
        for r in 0..6 {
            let v: Vec<f64> = (0..4)
                .map(|j| x[r * 4 + j] as f64 + skip[(r % 3) * 4 + j] as f64 + b[j] as f64)
                .collect();
            sum.extend(v.iter().map(|&s| s as f32));
            want.extend(rms(&v, &g64, 1e-4).into_iter().map(|v| v as f32));
        }
        close(&out[0].to_f32_vec().unwrap(), &want, 1e-5);
        close(&out[3].to_f32_vec().unwrap(), &sum, 1e-6);
        // the mean and inv_std_var outputs are refused at build time, not left unwritten
        n.outputs = vec![Some(0), Some(1)];
        assert!(run(&n, &[None]).is_err());
    }

    /// One GroupQueryAttention case, written out the long way in f64: every batch's full key and
    /// value rows (the valid past, then the new tokens), rotation by angle pairs, an explicit
    /// key range per query, softmax with the optional sink.
    struct Case {
        b: usize,
        s: usize,
        nh: usize,
        nkv: usize,
        h: usize,
        past: usize,
        seqlens: Vec<i32>,
        total: usize,
        packed: bool,
        rot_half: usize,
        interleaved: bool,
        window: i64,
        softcap: f32,
        bias: bool,
        smooth: bool,
        /// the `scale` attribute (0: the default 1/sqrt(H))
        scale: f32,
        /// a `head_sink` input
        sink: bool,
    }

    fn gqa_case(c: &Case) {
        let qd = if c.packed {
            (c.nh + 2 * c.nkv) * c.h
        } else {
            c.nh * c.h
        };
        let kd = c.nkv * c.h;
        let q = seq(c.b * c.s * qd, 13, 17, 0.11);
        let k = seq(c.b * c.s * kd, 7, 19, 0.09);
        let v = seq(c.b * c.s * kd, 5, 23, 0.13);
        let pk = seq(c.b * c.nkv * c.past * c.h, 11, 13, 0.1);
        let pv = seq(c.b * c.nkv * c.past * c.h, 3, 29, 0.07);
        let rows = 16;
        // angles of position p, pair i: p * (i + 1) * 0.1
        let ang = |p: usize, i: usize| p as f64 * (i + 1) as f64 * 0.1;
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        for p in 0..rows {
            for i in 0..c.rot_half {
                cos.push(libm::cos(ang(p, i)) as f32);
                sin.push(libm::sin(ang(p, i)) as f32);
            }
        }
        let bias = seq(c.b * c.s * c.total, 7, 9, 0.3);
        let sinks = seq(c.nh, 5, 7, 0.4);
        let mut n = ms(node(
            "GroupQueryAttention",
            1,
            vec![
                ("num_heads", AttrValue::Int(c.nh as i64)),
                ("kv_num_heads", AttrValue::Int(c.nkv as i64)),
                ("do_rotary", AttrValue::Int(1)),
                ("rotary_interleaved", AttrValue::Int(c.interleaved as i64)),
                ("local_window_size", AttrValue::Int(c.window)),
                ("softcap", AttrValue::Float(c.softcap)),
                ("smooth_softmax", AttrValue::Int(c.smooth as i64)),
                ("scale", AttrValue::Float(c.scale)),
            ],
            3,
        ));
        n.inputs = (0..12).map(Some).collect();
        let mut ins: Vec<Option<Tensor>> = vec![
            Some(t32(&[c.b, c.s, qd], q.clone())),
            None,
            None,
            None,
            None,
            Some(i32s(&[c.b], c.seqlens.clone())),
            Some(i32s(&[1], vec![c.total as i32])),
            Some(t32(&[rows, c.rot_half], cos)),
            Some(t32(&[rows, c.rot_half], sin)),
            None,
            None,
            None,
        ];
        if !c.packed {
            ins[1] = Some(t32(&[c.b, c.s, kd], k.clone()));
            ins[2] = Some(t32(&[c.b, c.s, kd], v.clone()));
        }
        if c.past > 0 {
            ins[3] = Some(t32(&[c.b, c.nkv, c.past, c.h], pk.clone()));
            ins[4] = Some(t32(&[c.b, c.nkv, c.past, c.h], pv.clone()));
        }
        if c.bias {
            ins[10] = Some(t32(&[c.b, 1, c.s, c.total], bias.clone()));
        }
        if c.sink {
            ins[11] = Some(t32(&[c.nh], sinks.clone()));
        }
        let out = run(&n, &ins).unwrap();
        let plen = c.total.max(c.past);
        if c.past > 0 {
            // past key/value given up by the caller: the same results, and present written
            // into the past's own storage when it holds every row (a copy otherwise)
            let mut owned = ins.clone();
            let (upk, upv) = (
                t32(&[c.b, c.nkv, c.past, c.h], pk.clone()),
                t32(&[c.b, c.nkv, c.past, c.h], pv.clone()),
            );
            let ptr = upk.as_slice::<f32>().unwrap().as_ptr();
            owned[3] = Some(upk);
            owned[4] = Some(upv);
            let got = run_owned(&n, owned).unwrap();
            assert_eq!(got[0].to_f32_vec().unwrap(), out[0].to_f32_vec().unwrap());
            let same = got[1].as_slice::<f32>().unwrap().as_ptr() == ptr;
            assert_eq!(same, plen == c.past, "present reuses the past's storage");
            for o in 1..3 {
                let (g, w) = (got[o].to_f32_vec().unwrap(), out[o].to_f32_vec().unwrap());
                for bi in 0..c.b {
                    let valid = if c.s == c.total {
                        c.total
                    } else {
                        c.seqlens[bi] as usize + 1
                    };
                    for j in 0..c.nkv {
                        let at = (bi * c.nkv + j) * plen * c.h;
                        assert_eq!(g[at..at + valid * c.h], w[at..at + valid * c.h]);
                    }
                }
            }
        }
        let first = c.s == c.total;
        let rotate = |x: &mut [f64], p: usize| {
            for i in 0..c.rot_half {
                let (a, b) = if c.interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + c.rot_half)
                };
                let (cs, sn) = (libm::cos(ang(p, i)), libm::sin(ang(p, i)));
                let (xa, xb) = (x[a], x[b]);
                x[a] = xa * cs - xb * sn;
                x[b] = xa * sn + xb * cs;
            }
        };
        let (mut want, mut want_k, mut want_v) = (
            vec![0f32; c.b * c.s * c.nh * c.h],
            vec![0f32; c.b * c.nkv * plen * c.h],
            vec![0f32; c.b * c.nkv * plen * c.h],
        );
        for bi in 0..c.b {
            let total_b = c.seqlens[bi] as usize + 1;
            let past_b = if first { 0 } else { total_b - c.s };
            for j in 0..c.nkv {
                // the key and value rows of kv head j
                let mut keys: Vec<Vec<f64>> = Vec::new();
                let mut vals: Vec<Vec<f64>> = Vec::new();
                for t in 0..past_b {
                    let o = ((bi * c.nkv + j) * c.past + t) * c.h;
                    keys.push(pk[o..o + c.h].iter().map(|&x| x as f64).collect());
                    vals.push(pv[o..o + c.h].iter().map(|&x| x as f64).collect());
                }
                for si in 0..c.s {
                    let (kr, vr): (Vec<f64>, Vec<f64>) = if c.packed {
                        let o = (bi * c.s + si) * qd;
                        (
                            q[o + (c.nh + j) * c.h..][..c.h]
                                .iter()
                                .map(|&x| x as f64)
                                .collect(),
                            q[o + (c.nh + c.nkv + j) * c.h..][..c.h]
                                .iter()
                                .map(|&x| x as f64)
                                .collect(),
                        )
                    } else {
                        let o = ((bi * c.s + si) * c.nkv + j) * c.h;
                        (
                            k[o..o + c.h].iter().map(|&x| x as f64).collect(),
                            v[o..o + c.h].iter().map(|&x| x as f64).collect(),
                        )
                    };
                    let mut kr = kr;
                    rotate(&mut kr, past_b + si);
                    keys.push(kr);
                    vals.push(vr);
                }
                for (t, (kr, vr)) in keys.iter().zip(&vals).enumerate() {
                    let o = ((bi * c.nkv + j) * plen + t) * c.h;
                    for e in 0..c.h {
                        want_k[o + e] = kr[e] as f32;
                        want_v[o + e] = vr[e] as f32;
                    }
                }
                for n in (0..c.nh).filter(|n| n / (c.nh / c.nkv) == j) {
                    for si in 0..c.s {
                        let o = (bi * c.s + si) * qd + n * c.h;
                        let mut qr: Vec<f64> = q[o..o + c.h].iter().map(|&x| x as f64).collect();
                        let p = past_b + si;
                        rotate(&mut qr, p);
                        // keys 0..=p, the last `window` of them when windowed
                        let hi = p + 1;
                        let lo = if c.window >= 0 {
                            hi.saturating_sub(c.window as usize)
                        } else {
                            0
                        };
                        let mut sc: Vec<f64> = (lo..hi)
                            .map(|t| {
                                let d: f64 = qr.iter().zip(&keys[t]).map(|(a, b)| a * b).sum();
                                let mut x = if c.scale == 0.0 {
                                    d / (c.h as f64).sqrt()
                                } else {
                                    d * c.scale as f64
                                };
                                if c.softcap > 0.0 {
                                    let cap = c.softcap as f64;
                                    x = cap * (x / cap).tanh();
                                }
                                if c.bias {
                                    x += bias[(bi * c.s + si) * c.total + t] as f64;
                                }
                                x
                            })
                            .collect();
                        // the sink: head_sink's value for this head, or 0 with smooth_softmax
                        let sink = if c.sink {
                            Some(sinks[n] as f64)
                        } else if c.smooth {
                            Some(0.0)
                        } else {
                            None
                        };
                        let mut m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        if let Some(sk) = sink {
                            m = m.max(sk);
                        }
                        let mut den = 0.0;
                        for x in &mut sc {
                            *x = (*x - m).exp();
                            den += *x;
                        }
                        if let Some(sk) = sink {
                            den += (sk - m).exp();
                        }
                        for e in 0..c.h {
                            let acc: f64 = sc
                                .iter()
                                .enumerate()
                                .map(|(i, p)| p * vals[lo + i][e])
                                .sum();
                            want[((bi * c.s + si) * c.nh + n) * c.h + e] = (acc / den) as f32;
                        }
                    }
                }
            }
        }
        assert_eq!(out[0].shape(), &[c.b, c.s, c.nh * c.h]);
        assert_eq!(out[1].shape(), &[c.b, c.nkv, plen, c.h]);
        close(&out[0].to_f32_vec().unwrap(), &want, 2e-5);
        close(&out[1].to_f32_vec().unwrap(), &want_k, 2e-5);
        close(&out[2].to_f32_vec().unwrap(), &want_v, 2e-5);
    }

    #[test]
    fn gqa_decodes_a_batch_of_unequal_lengths_in_a_longer_past_buffer() {
        // separate K/V, interleaved rotation of half of each head, a scale, softcap, a bias and
        // a head sink; batch
        // 1 has fewer valid past rows than the buffer holds (the rest must not be carried)
        gqa_case(&Case {
            b: 2,
            s: 1,
            nh: 4,
            nkv: 2,
            h: 8,
            past: 6,
            seqlens: vec![4, 2],
            total: 5,
            packed: false,
            rot_half: 2,
            interleaved: true,
            window: -1,
            softcap: 0.5,
            bias: true,
            smooth: false,
            scale: 0.3,
            sink: true,
        });
    }

    #[test]
    fn gqa_first_prompt_packed_with_a_local_window_and_a_sink() {
        gqa_case(&Case {
            b: 1,
            s: 6,
            nh: 6,
            nkv: 2,
            h: 8,
            past: 0,
            seqlens: vec![5],
            total: 6,
            packed: true,
            rot_half: 4,
            interleaved: false,
            window: 3,
            softcap: 0.0,
            bias: false,
            smooth: true,
            scale: 0.0,
            sink: false,
        });
    }

    #[test]
    fn gqa_continues_a_prompt_after_a_past() {
        gqa_case(&Case {
            b: 1,
            s: 3,
            nh: 2,
            nkv: 1,
            h: 16,
            past: 4,
            seqlens: vec![6],
            total: 7,
            packed: true,
            rot_half: 8,
            interleaved: false,
            window: -1,
            softcap: 0.0,
            bias: false,
            smooth: false,
            scale: 0.0,
            sink: false,
        });
    }
}
