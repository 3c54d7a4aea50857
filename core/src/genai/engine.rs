//! The decode loop: a decoder session, its KV cache between runs, prefill in chunks, then one
//! run per new token until a stop condition.
//!
//! The KV cache is the decoder's own `present.N.key|value` outputs fed back as the next run's
//! `past_key_values.N.key|value` (batch 1), so it grows with the sequence and is never sized
//! from the context length.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::borrow::Borrow;

use super::config::DecoderConfig;
use super::sampling::{Sampler, SamplingOptions};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::session::Session;
use crate::tensor::Tensor;
use crate::value::{Dim, TypeInfo, Value};

/// How a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_new_tokens` tokens were generated (or the context is full).
    Length,
    /// An end-of-sequence id was generated.
    Eos,
    /// A stop condition of the caller's (a stop string) matched.
    Stop,
}

impl FinishReason {
    /// `length`, `eos` or `stop`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
        }
    }
}

/// Options of one generation.
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// New tokens at most.
    pub max_new_tokens: usize,
    /// End-of-sequence ids are held back until this many new tokens exist.
    pub min_new_tokens: usize,
    /// Prompt tokens per prefill run (0: the whole prompt in one run).
    pub prefill_chunk: usize,
    /// Greedy when `None`.
    pub sampling: Option<SamplingOptions>,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            max_new_tokens: 128,
            min_new_tokens: 0,
            prefill_chunk: 512,
            sampling: None,
        }
    }
}

/// What [`Generator::generate`] returns.
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_ids: Vec<i64>,
    /// The generated ids only.
    pub tokens: Vec<i64>,
    pub finish_reason: FinishReason,
    /// Time of the prompt's runs (nanoseconds of the session's clock).
    pub prefill_ns: u64,
    /// Time from the first new token chosen to the last: the runs that fed each new token
    /// and the choices after them (onnxruntime-genai's decode time, measured the same way).
    pub decode_ns: u64,
    /// Decoder runs after the prefill.
    pub decode_runs: usize,
}

/// A decoder session (`S`: a `Session` or a handle to one, such as `Arc<Session>`) with its KV
/// cache and the sequence so far (batch 1).
pub struct Generator<S: Borrow<Session>> {
    session: S,
    cfg: DecoderConfig,
    kv_dtype: DataType,
    has_mask: bool,
    has_pos: bool,
    /// Every id the cache holds, in order.
    ids: Vec<i64>,
    /// Keys then values per layer: `[1, kv_heads, len, head_size]`.
    past: Vec<Value>,
    /// The logits after the last id fed.
    logits: Vec<f32>,
}

impl<S: Borrow<Session>> Generator<S> {
    /// A generator over `session`, which must be the decoder `cfg` describes.
    pub fn new(session: S, cfg: DecoderConfig) -> Result<Generator<S>> {
        let inputs = session.borrow().inputs();
        let find = |n: &str| inputs.iter().find(|i| i.name == n);
        if find(&cfg.input_ids).is_none() {
            return Err(Error::InvalidModel(alloc::format!(
                "the decoder has no input `{}`",
                cfg.input_ids
            )));
        }
        let mut kv_dtype = None;
        for l in 0..cfg.layers {
            for t in [&cfg.past_key, &cfg.past_value] {
                let n = DecoderConfig::layer_name(t, l);
                let Some(io) = find(&n) else {
                    return Err(Error::InvalidModel(alloc::format!(
                        "the decoder has no input `{n}` ({} layers configured)",
                        cfg.layers
                    )));
                };
                if let TypeInfo::Tensor { dtype, shape } = &io.ty {
                    kv_dtype = kv_dtype.or(*dtype);
                    if let Some(s) = shape {
                        let bad = |i: usize, want: usize| matches!(s.get(i), Some(Dim::Known(d)) if *d != want);
                        if s.len() != 4 || bad(1, cfg.kv_heads) || bad(3, cfg.head_size) {
                            return Err(Error::InvalidModel(alloc::format!(
                                "input `{n}` has shape {s:?}, not [batch, {}, past, {}]",
                                cfg.kv_heads,
                                cfg.head_size
                            )));
                        }
                    }
                }
            }
        }
        let kv_dtype = kv_dtype.unwrap_or(DataType::Float);
        if !matches!(kv_dtype, DataType::Float | DataType::Float16) {
            return Err(Error::Unsupported {
                ctx: Default::default(),
                detail: alloc::format!("a KV cache of {kv_dtype} (float or float16)"),
            });
        }
        let has = |o: &Option<String>| o.as_deref().is_some_and(|n| find(n).is_some());
        let has_mask = has(&cfg.attention_mask);
        let has_pos = has(&cfg.position_ids);
        let mut g = Generator {
            session,
            cfg,
            kv_dtype,
            has_mask,
            has_pos,
            ids: Vec::new(),
            past: Vec::new(),
            logits: Vec::new(),
        };
        g.reset()?;
        Ok(g)
    }

    /// Forgets the sequence (an empty KV cache).
    pub fn reset(&mut self) -> Result<()> {
        let shape = [1, self.cfg.kv_heads, 0, self.cfg.head_size];
        self.past = (0..2 * self.cfg.layers)
            .map(|_| Tensor::zeros(self.kv_dtype, &shape).map(Value::Tensor))
            .collect::<Result<_>>()?;
        self.ids.clear();
        self.logits.clear();
        Ok(())
    }

    /// The session the generator runs.
    pub fn session(&self) -> &Session {
        self.session.borrow()
    }

    /// The decoder's description.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// Every id fed so far (prompt and generated).
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// The logits after the last id fed (empty before the first).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Bytes the KV cache holds now.
    pub fn kv_bytes(&self) -> usize {
        self.past
            .iter()
            .map(|v| match v {
                Value::Tensor(t) => (t.len() * t.dtype().bits()).div_ceil(8),
                _ => 0,
            })
            .sum()
    }

    /// Keeps the first `n` ids of the sequence (and their KV entries) and forgets the rest;
    /// the logits are then those after id `n - 1` (its entry is recomputed). `n` past the
    /// sequence is an error.
    pub async fn rewind_to(&mut self, n: usize) -> Result<()> {
        if n > self.ids.len() {
            return Err(Error::Input(alloc::format!(
                "cannot rewind to {n} tokens: the sequence has {}",
                self.ids.len()
            )));
        }
        if n == self.ids.len() {
            return Ok(());
        }
        if n == 0 {
            return self.reset();
        }
        let keep = n - 1;
        for v in self.past.iter_mut() {
            if let Value::Tensor(t) = v {
                *t = t.slice_axis(2, 0, keep, 1)?.contiguous()?;
            }
        }
        let last = self.ids[keep];
        self.ids.truncate(keep);
        self.run(&[last]).await
    }

    /// Feeds `ids` after the sequence so far, `chunk` at a time (0: at once), leaving the
    /// logits after the last one.
    pub async fn append_tokens(&mut self, ids: &[i64], chunk: usize) -> Result<()> {
        let vocab = self.cfg.vocab_size as i64;
        if let Some(bad) = ids.iter().find(|&&id| id < 0 || id >= vocab) {
            return Err(Error::Input(alloc::format!(
                "prompt id {bad} is outside the vocabulary (0..{vocab})"
            )));
        }
        let chunk = if chunk == 0 { ids.len().max(1) } else { chunk };
        for part in ids.chunks(chunk) {
            self.run(part).await?;
        }
        Ok(())
    }

    /// One decoder run over `ids`.
    async fn run(&mut self, ids: &[i64]) -> Result<()> {
        let (n, past) = (ids.len(), self.ids.len());
        if past + n > self.cfg.context_length {
            return Err(Error::Input(alloc::format!(
                "{} tokens exceed the decoder's context length {}",
                past + n,
                self.cfg.context_length
            )));
        }
        let cfg = &self.cfg;
        let mut feeds: Vec<(String, Value)> = Vec::with_capacity(3 + 2 * cfg.layers);
        feeds.push((
            cfg.input_ids.clone(),
            Value::Tensor(Tensor::from_vec(&[1, n], ids.to_vec())?),
        ));
        if self.has_mask {
            let mask = vec![1i64; past + n];
            feeds.push((
                cfg.attention_mask.clone().expect("checked"),
                Value::Tensor(Tensor::from_vec(&[1, past + n], mask)?),
            ));
        }
        if self.has_pos {
            let pos: Vec<i64> = (past as i64..(past + n) as i64).collect();
            feeds.push((
                cfg.position_ids.clone().expect("checked"),
                Value::Tensor(Tensor::from_vec(&[1, n], pos)?),
            ));
        }
        let past_vals = core::mem::take(&mut self.past);
        for (i, v) in past_vals.into_iter().enumerate() {
            let t = if i < cfg.layers {
                &cfg.past_key
            } else {
                &cfg.past_value
            };
            feeds.push((DecoderConfig::layer_name(t, i % cfg.layers), v));
        }
        let mut outs = self.session.borrow().run_async(feeds).await?;
        let mut take = |name: &str| -> Result<Value> {
            let i = outs.iter().position(|(n, _)| n == name).ok_or_else(|| {
                Error::InvalidModel(alloc::format!("the decoder has no output `{name}`"))
            })?;
            Ok(outs.swap_remove(i).1)
        };
        let logits = match take(&cfg.logits)? {
            Value::Tensor(t) => t,
            _ => return Err(Error::InvalidModel("logits is not a tensor".into())),
        };
        let mut past_new = Vec::with_capacity(2 * cfg.layers);
        for t in [&cfg.present_key, &cfg.present_value] {
            for l in 0..cfg.layers {
                past_new.push(take(&DecoderConfig::layer_name(t, l))?);
            }
        }
        for v in &past_new {
            match v {
                Value::Tensor(t) if t.rank() == 4 && t.shape()[2] == past + n => {}
                Value::Tensor(t) => {
                    return Err(Error::InvalidModel(alloc::format!(
                        "a present KV output has shape {:?} after {} tokens",
                        t.shape(),
                        past + n
                    )))
                }
                _ => {
                    return Err(Error::InvalidModel(
                        "a present KV output is not a tensor".into(),
                    ))
                }
            }
        }
        self.past = past_new;
        let vocab = logits.shape().last().copied().unwrap_or(0);
        if vocab == 0 || logits.len() < vocab {
            return Err(Error::InvalidModel(alloc::format!(
                "logits of shape {:?}",
                logits.shape()
            )));
        }
        let all = logits.to_f32_vec()?;
        self.logits = all[all.len() - vocab..].to_vec();
        self.ids.extend_from_slice(ids);
        Ok(())
    }

    /// Generates after `prompt` (appended to what the cache holds), calling `on_token` with
    /// each new id as it is chosen; `on_token` returns `false` to stop (a stop string).
    pub async fn generate(
        &mut self,
        prompt: &[i64],
        opts: &GenOptions,
        on_token: &mut dyn FnMut(i64) -> bool,
    ) -> Result<Generation> {
        if prompt.is_empty() && self.ids.is_empty() {
            return Err(Error::Input("an empty prompt".into()));
        }
        let clock = self.session.borrow().clock();
        if opts.max_new_tokens == 0 {
            return Ok(Generation {
                prompt_ids: prompt.to_vec(),
                tokens: Vec::new(),
                finish_reason: FinishReason::Length,
                prefill_ns: 0,
                decode_ns: 0,
                decode_runs: 0,
            });
        }
        let t0 = clock();
        self.append_tokens(prompt, opts.prefill_chunk).await?;
        let prefill_ns = clock().saturating_sub(t0);
        let mut sampler = Sampler::new(opts.sampling.clone());
        let mut tokens = Vec::new();
        let mut decode_runs = 0usize;
        // decode time: from the first new token chosen to the last (runs and choices)
        let mut t_first = None;
        let finish = loop {
            let hold_eos = tokens.len() < opts.min_new_tokens;
            let eos: &[i64] = if hold_eos {
                &self.cfg.eos_token_ids
            } else {
                &[]
            };
            let history = &self.ids;
            let id = sampler.choose(&mut self.logits, eos, history)?;
            tokens.push(id);
            if t_first.is_none() {
                t_first = Some(clock());
            }
            let go_on = on_token(id);
            if !hold_eos && self.cfg.eos_token_ids.contains(&id) {
                break FinishReason::Eos;
            }
            if !go_on {
                break FinishReason::Stop;
            }
            if tokens.len() >= opts.max_new_tokens {
                break FinishReason::Length;
            }
            if self.ids.len() >= self.cfg.context_length {
                break FinishReason::Length;
            }
            self.run(&[id]).await?;
            decode_runs += 1;
        };
        let decode_ns = match (t_first, decode_runs) {
            (Some(t), 1..) => clock().saturating_sub(t),
            _ => 0,
        };
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            tokens,
            finish_reason: finish,
            prefill_ns,
            decode_ns,
            decode_runs,
        })
    }
}
