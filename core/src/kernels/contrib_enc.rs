//! Kernel family: the `com.microsoft` operators ONNX Runtime's transformer optimizer writes
//! into BERT-style encoders and Phi/Qwen-style decoders besides attention: Gelu, FastGelu,
//! BiasGelu, QuickGelu, BiasAdd, SkipLayerNormalization, RotaryEmbedding and
//! MultiHeadAttention. Float32; the
//! semantics are ONNX Runtime's contrib-op definitions (docs/operators.md lists what each
//! accepts), checked against ONNX Runtime's outputs (`tests/tests/contrib_refs.rs`).

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::contrib::{skip_norm_outputs, skip_norm_run};
use super::{def_in, opt_tensor_in, tensor_in};
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
    def_in(MS, "Gelu", 1, 1, build_gelu).types(F32),
    def_in(MS, "FastGelu", 1, 1, build_fast_gelu).types(F32),
    def_in(MS, "BiasGelu", 1, 1, build_bias_gelu).types(F32),
    def_in(MS, "QuickGelu", 1, 1, build_quick_gelu).types(F32),
    def_in(MS, "BiasAdd", 1, 1, build_bias_add).types(F32),
    def_in(MS, "SkipLayerNormalization", 1, 1, build_skip_ln).types(F32),
    def_in(MS, "RotaryEmbedding", 1, 1, build_rotary).types(F32),
    def_in(MS, "MultiHeadAttention", 1, 1, build_mha).types(F32),
];

/// `erf`-based GELU of one value.
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * core::f32::consts::FRAC_1_SQRT_2))
}

/// The tanh approximation FastGelu computes.
fn gelu_tanh(x: f32) -> f32 {
    // sqrt(2 / pi)
    const C: f32 = 0.797_884_6;
    0.5 * x * (1.0 + libm::tanhf(C * (x + 0.044715 * x * x * x)))
}

/// `x` plus a bias repeated over its last axis (the bias's length must be that axis's).
fn with_bias(x: &Tensor, bias: Option<&Tensor>, what: &str) -> Result<Vec<f32>> {
    let mut v = x.as_slice::<f32>()?.into_owned();
    if let Some(b) = bias {
        let c = x.shape().last().copied().unwrap_or(0);
        if x.rank() == 0 || b.len() != c {
            bail!(
                "{what}: bias of shape {:?} for input {:?} (one value per element of the last axis)",
                b.shape(),
                x.shape()
            );
        }
        let bv = b.as_slice::<f32>()?;
        for row in v.chunks_exact_mut(c) {
            row.iter_mut().zip(bv.iter()).for_each(|(x, b)| *x += b);
        }
    }
    Ok(v)
}

fn map_out(x: &Tensor, mut v: Vec<f32>, f: impl Fn(f32) -> f32) -> Result<Vec<Value>> {
    v.iter_mut().for_each(|x| *x = f(*x));
    Ok(vec![Value::Tensor(Tensor::from_vec(x.shape(), v)?)])
}

fn build_gelu(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            map_out(x, with_bias(x, None, "Gelu")?, gelu)
        },
    ))
}

/// FastGelu: the tanh approximation of `x + bias` (bias optional, over the last axis).
fn build_fast_gelu(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let v = with_bias(x, opt_tensor_in(inputs, 1)?, "FastGelu")?;
            map_out(x, v, gelu_tanh)
        },
    ))
}

/// BiasGelu: the erf GELU of `A + B`, B over A's last axis.
fn build_bias_gelu(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let v = with_bias(x, Some(tensor_in(inputs, 1)?), "BiasGelu")?;
            map_out(x, v, gelu)
        },
    ))
}

/// QuickGelu: `x * sigmoid(alpha * x)` (alpha 1.702 by default).
fn build_quick_gelu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.702)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            map_out(x, with_bias(x, None, "QuickGelu")?, |v| {
                v / (1.0 + libm::expf(-alpha * v))
            })
        },
    ))
}

/// BiasAdd: `X + bias + skip`, X and skip (B, S, C), bias (C).
fn build_bias_add(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let bias = tensor_in(inputs, 1)?;
            let skip = tensor_in(inputs, 2)?;
            if x.rank() != 3 || skip.shape() != x.shape() {
                bail!(
                    "BiasAdd: X {:?} and skip {:?} must both be (batch, sequence, channels)",
                    x.shape(),
                    skip.shape()
                );
            }
            let mut v = with_bias(x, Some(bias), "BiasAdd")?;
            let s = skip.as_slice::<f32>()?;
            v.iter_mut().zip(s.iter()).for_each(|(a, b)| *a += b);
            Ok(vec![Value::Tensor(Tensor::from_vec(x.shape(), v)?)])
        },
    ))
}

/// SkipLayerNormalization: `v = input + skip (+ bias)`, layer-normalised over the last axis,
/// times gamma (+ beta); output 3 is `v`. `skip` is input's shape or a trailing part of it
/// ((1, S, H) or (S, H)), repeated over the leading rows. The mean and inv_std_var outputs
/// (1 and 2) are refused: ONNX Runtime's CPU kernel does not write them.
fn build_skip_ln(node: &Node) -> Result<Box<dyn Kernel>> {
    let eps = node.get_f("epsilon", 1e-12)?;
    let outs = skip_norm_outputs(node)?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            skip_norm_run(
                cx,
                "SkipLayerNormalization",
                tensor_in(inputs, 0)?,
                tensor_in(inputs, 1)?,
                tensor_in(inputs, 2)?,
                opt_tensor_in(inputs, 3)?,
                opt_tensor_in(inputs, 4)?,
                outs,
                |v, g, beta, y| {
                    // mean and variance in f64 (the row is at most a hidden size long)
                    let n = v.len() as f64;
                    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
                    let var = v
                        .iter()
                        .map(|&x| {
                            let d = x as f64 - mean;
                            d * d
                        })
                        .sum::<f64>()
                        / n;
                    let inv = 1.0 / libm::sqrt(var + eps as f64);
                    for j in 0..v.len() {
                        y[j] =
                            ((v[j] as f64 - mean) * inv) as f32 * g[j] + beta.map_or(0.0, |b| b[j]);
                    }
                },
            )
        },
    ))
}

/// RotaryEmbedding (com.microsoft): inputs (input, position_ids, cos_cache, sin_cache). The
/// input is (B, S, hidden) or (B, N, S, H); `position_ids` is (B, S), or one value: the
/// position of the first token (the others follow it). Without `num_heads`, a 3-D input's
/// head size is the caches' width times two (or `rotary_embedding_dim`). Computed by the ONNX
/// RotaryEmbedding kernel (opset 23) with the positions expanded.
fn build_rotary(node: &Node) -> Result<Box<dyn Kernel>> {
    let interleaved = node.get_i("interleaved", 0)? != 0;
    let rot_dim = node.get_i("rotary_embedding_dim", 0)?;
    let num_heads = node.get_i("num_heads", 0)?;
    if rot_dim < 0 || num_heads < 0 {
        bail!("RotaryEmbedding: rotary_embedding_dim {rot_dim} and num_heads {num_heads} must be nonnegative");
    }
    if node.get_i("is_packed_batching", 0)? != 0 {
        unsupported!("RotaryEmbedding with is_packed_batching 1");
    }
    if rot_dim > 0 && num_heads == 0 {
        bail!("RotaryEmbedding: rotary_embedding_dim needs the num_heads attribute");
    }
    let (rot_dim, num_heads) = (rot_dim as usize, num_heads as usize);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let (x, cos, sin) = (
                tensor_in(inputs, 0)?,
                tensor_in(inputs, 2)?,
                tensor_in(inputs, 3)?,
            );
            let plan = ms_rotary_plan(x, tensor_in(inputs, 1)?, cos, sin, rot_dim, num_heads)?;
            super::attention::rotary_apply::<f32>(x, cos, sin, &plan, interleaved)
        },
    ))
}

/// The layout of a com.microsoft RotaryEmbedding call (inputs X, position_ids, cos_cache,
/// sin_cache): `position_ids` per token, or one value: the first token's position (the others
/// follow it); without `num_heads`, a 3-D input's head size is the caches' width times two.
pub fn ms_rotary_plan(
    x: &Tensor,
    pos: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    rot_dim: usize,
    num_heads: usize,
) -> Result<super::attention::RotaryPlan> {
    let s = x.shape();
    let (b, seq) = match s.len() {
        3 => (s[0], s[1]),
        4 => (s[0], s[2]),
        _ => bail!("RotaryEmbedding: input must be 3-D or 4-D, has shape {s:?}"),
    };
    let heads = if s.len() == 3 && num_heads == 0 {
        let hs = 2 * cos.shape().get(1).copied().unwrap_or(0);
        if hs == 0 || !s[2].is_multiple_of(hs) {
            bail!(
                "RotaryEmbedding: hidden size {} is not a multiple of the head size {hs} the caches give",
                s[2]
            );
        }
        s[2] / hs
    } else {
        num_heads
    };
    let p = pos.to_i64_vec()?;
    let ids: Vec<i64> = if p.len() == 1 && pos.rank() <= 1 {
        (0..b * seq)
            .map(|i| p[0] + (i % seq.max(1)) as i64)
            .collect()
    } else if pos.shape() == [b, seq] {
        p
    } else {
        bail!(
            "RotaryEmbedding: position_ids of shape {:?}, expected ({b}, {seq}) or (1)",
            pos.shape()
        );
    };
    let pt = Tensor::from_vec(&[b, seq], ids)?;
    super::attention::RotaryPlan::new(x, cos, sin, Some(&pt), rot_dim, heads)
}

// ----------------------------------------------------------------------------- MultiHeadAttention

struct Mha {
    heads: usize,
    mask_filter: f32,
    scale: f32,
    causal: bool,
}

/// MultiHeadAttention (com.microsoft): separate 3-D query (B, S, D), key (B, L, D) and value
/// (B, L, Dv); an optional bias (D + D + Dv) added to each first; a 2-D key padding mask
/// (B, P + L: 0 adds `mask_filter_value` to that key's scores), an additive attention bias
/// (B or 1, N or 1, S, P + L), past key/value (B, N, P, H) put before the new rows (outputs 1
/// and 2 are the present: (B, N, P + L, H)); `unidirectional`: query s sees keys up to P + s
/// (the others get `mask_filter_value` too). Packed QKV, keys given per head (4-D), other mask
/// forms, `past_sequence_length` and `cache_indirection` are unsupported (a clear error).
fn build_mha(node: &Node) -> Result<Box<dyn Kernel>> {
    let heads = node.get_i("num_heads", 0)?;
    if heads <= 0 {
        bail!("MultiHeadAttention: num_heads must be positive, is {heads}");
    }
    if node.outputs.iter().skip(3).any(Option::is_some) {
        unsupported!("MultiHeadAttention's qk output");
    }
    Ok(Box::new(Mha {
        heads: heads as usize,
        mask_filter: node.get_f("mask_filter_value", -10000.0)?,
        scale: node.get_f("scale", 0.0)?,
        causal: node.get_i("unidirectional", 0)? != 0,
    }))
}

impl Kernel for Mha {
    fn compute(&self, _cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let n = self.heads;
        let q = tensor_in(inputs, 0)?;
        let (Some(k), Some(v)) = (opt_tensor_in(inputs, 1)?, opt_tensor_in(inputs, 2)?) else {
            unsupported!("MultiHeadAttention with packed QKV (no key and value inputs)");
        };
        for (i, what) in [(8, "past_sequence_length"), (9, "cache_indirection")] {
            if opt_tensor_in(inputs, i)?.is_some() {
                unsupported!("MultiHeadAttention with {what}");
            }
        }
        if q.rank() != 3 || k.rank() != 3 || v.rank() != 3 {
            unsupported!(
                "MultiHeadAttention with query {:?}, key {:?}, value {:?} (3-D each)",
                q.shape(),
                k.shape(),
                v.shape()
            );
        }
        let (b, s, d) = (q.shape()[0], q.shape()[1], q.shape()[2]);
        let (l, dv) = (k.shape()[1], v.shape()[2]);
        if k.shape() != [b, l, d] || v.shape()[..2] != [b, l] || d % n != 0 || dv % n != 0 {
            bail!(
                "MultiHeadAttention: query {:?}, key {:?}, value {:?} for {n} heads",
                q.shape(),
                k.shape(),
                v.shape()
            );
        }
        let (h, hv) = (d / n, dv / n);
        let bias = match opt_tensor_in(inputs, 3)? {
            Some(t) if t.len() != 2 * d + dv => {
                bail!(
                    "MultiHeadAttention: bias of shape {:?}, expected ({})",
                    t.shape(),
                    2 * d + dv
                )
            }
            Some(t) => Some(t.as_slice::<f32>()?.into_owned()),
            None => None,
        };
        let past = match (opt_tensor_in(inputs, 6)?, opt_tensor_in(inputs, 7)?) {
            (Some(pk), Some(pv)) => {
                let p = pk.shape().get(2).copied().unwrap_or(0);
                if pk.shape() != [b, n, p, h] || pv.shape() != [b, n, p, hv] {
                    bail!(
                        "MultiHeadAttention: past key {:?} / value {:?}, expected ({b}, {n}, P, {h} / {hv})",
                        pk.shape(),
                        pv.shape()
                    );
                }
                Some((p, pk.as_slice::<f32>()?, pv.as_slice::<f32>()?))
            }
            (None, None) => None,
            _ => bail!("MultiHeadAttention: past_key and past_value go together"),
        };
        let p = past.as_ref().map_or(0, |x| x.0);
        let t = p + l;
        let mask = match opt_tensor_in(inputs, 4)? {
            Some(m) if m.shape() == [b, t] => Some(m.to_i64_vec()?),
            Some(m) => unsupported!(
                "MultiHeadAttention with a key_padding_mask of shape {:?} (only ({b}, {t}))",
                m.shape()
            ),
            None => None,
        };
        let ab = match opt_tensor_in(inputs, 5)? {
            Some(a) => {
                let sh = a.shape();
                if sh.len() != 4
                    || (sh[0] != 1 && sh[0] != b)
                    || (sh[1] != 1 && sh[1] != n)
                    || sh[2] != s
                    || sh[3] != t
                {
                    bail!("MultiHeadAttention: attention_bias of shape {sh:?}");
                }
                Some((a.as_slice::<f32>()?, sh[0], sh[1]))
            }
            None => None,
        };
        let (qv, kv, vv) = (
            q.as_slice::<f32>()?,
            k.as_slice::<f32>()?,
            v.as_slice::<f32>()?,
        );
        let bias_at = |off: usize| bias.as_ref().map_or(0.0, |bb| bb[off]);
        // present: past rows, then the new rows (bias added), per (batch, head)
        let mut pk = vec![0f32; b * n * t * h];
        let mut pv = vec![0f32; b * n * t * hv];
        for bi in 0..b {
            for hd in 0..n {
                let kb = (bi * n + hd) * t;
                if let Some((_, pkk, pvv)) = &past {
                    let src = (bi * n + hd) * p;
                    pk[kb * h..][..p * h].copy_from_slice(&pkk[src * h..][..p * h]);
                    pv[kb * hv..][..p * hv].copy_from_slice(&pvv[src * hv..][..p * hv]);
                }
                for li in 0..l {
                    for e in 0..h {
                        pk[(kb + p + li) * h + e] =
                            kv[(bi * l + li) * d + hd * h + e] + bias_at(d + hd * h + e);
                    }
                    for e in 0..hv {
                        pv[(kb + p + li) * hv + e] =
                            vv[(bi * l + li) * dv + hd * hv + e] + bias_at(2 * d + hd * hv + e);
                    }
                }
            }
        }
        let scale = if self.scale == 0.0 {
            1.0 / libm::sqrtf(h as f32)
        } else {
            self.scale
        };
        let mut out = vec![0f32; b * s * dv];
        let mut sc = vec![0f32; t];
        let mut qr = vec![0f32; h];
        for bi in 0..b {
            for hd in 0..n {
                let kb = (bi * n + hd) * t;
                for si in 0..s {
                    for (e, x) in qr.iter_mut().enumerate() {
                        *x = qv[(bi * s + si) * d + hd * h + e] + bias_at(hd * h + e);
                    }
                    let mut mx = f32::NEG_INFINITY;
                    for (ti, x) in sc.iter_mut().enumerate() {
                        let kr = &pk[(kb + ti) * h..][..h];
                        let mut dot = 0f32;
                        for e in 0..h {
                            dot += qr[e] * kr[e];
                        }
                        let mut y = dot * scale;
                        if let Some(m) = &mask {
                            if m[bi * t + ti] == 0 {
                                y += self.mask_filter;
                            }
                        }
                        if let Some((a, a0, a1)) = &ab {
                            let (ba, na) =
                                (if *a0 == 1 { 0 } else { bi }, if *a1 == 1 { 0 } else { hd });
                            y += a[((ba * a1 + na) * s + si) * t + ti];
                        }
                        if self.causal && ti > p + si {
                            y += self.mask_filter;
                        }
                        *x = y;
                        mx = mx.max(y);
                    }
                    let mut den = 0f32;
                    for x in sc.iter_mut() {
                        *x = libm::expf(*x - mx);
                        den += *x;
                    }
                    let o = &mut out[(bi * s + si) * dv + hd * hv..][..hv];
                    for (ti, &w) in sc.iter().enumerate() {
                        let vr = &pv[(kb + ti) * hv..][..hv];
                        for e in 0..hv {
                            o[e] += w * vr[e];
                        }
                    }
                    let inv = 1.0 / den;
                    o.iter_mut().for_each(|x| *x *= inv);
                }
            }
        }
        Ok(vec![
            Value::Tensor(Tensor::from_vec(&[b, s, dv], out)?),
            Value::Tensor(Tensor::from_vec(&[b, n, t, h], pk)?),
            Value::Tensor(Tensor::from_vec(&[b, n, t, hv], pv)?),
        ])
    }
}

#[cfg(test)]
mod tests {
    use alloc::string::String;
    use alloc::vec::Vec;

    use super::super::test_util::{node, run, t32};

    /// BiasAdd (ONNX Runtime has no CPU kernel to compare with): `X + bias + skip`, the bias
    /// repeated over the rows, computed directly.
    #[test]
    fn bias_add_adds_the_bias_per_channel_and_the_skip() {
        let mut n = node("BiasAdd", 1, alloc::vec![], 1);
        n.domain = String::from("com.microsoft");
        let (b, s, c) = (2, 3, 5);
        let x: Vec<f32> = (0..b * s * c).map(|i| i as f32 * 0.5 - 3.0).collect();
        let bias: Vec<f32> = (0..c).map(|i| 10.0 * i as f32).collect();
        let skip: Vec<f32> = (0..b * s * c).map(|i| (i * i) as f32 * 0.01).collect();
        let y = run(
            &n,
            &[
                Some(t32(&[b, s, c], x.clone())),
                Some(t32(&[c], bias.clone())),
                Some(t32(&[b, s, c], skip.clone())),
            ],
        )
        .unwrap();
        let want: Vec<f32> = (0..b * s * c)
            .map(|i| x[i] + bias[i % c] + skip[i])
            .collect();
        assert_eq!(y[0].shape(), &[b, s, c]);
        assert_eq!(y[0].as_slice::<f32>().unwrap().into_owned(), want);
        // a skip of another shape is an error, not a broadcast
        let bad = run(
            &n,
            &[
                Some(t32(&[b, s, c], x)),
                Some(t32(&[c], bias)),
                Some(t32(&[s, c], skip[..s * c].to_vec())),
            ],
        );
        assert!(bad.is_err());
    }
}
