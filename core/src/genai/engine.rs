//! The decode loop: a decoder session, its KV cache between runs, prefill in chunks, then one
//! run per new token until a stop condition.
//!
//! The KV cache is the decoder's own `present.N.key|value` outputs fed back as the next run's
//! `past_key_values.N.key|value` (batch 1), never sized from the context length.
//!
//! When every past input is read only by GroupQueryAttention (onnxruntime-genai's decoders),
//! the cache is one buffer per layer shared by past and present, with room for more rows than
//! the sequence holds: GroupQueryAttention writes the new rows into it in place (its valid
//! length comes from the attention mask), and the buffer grows geometrically when full (one
//! copy per doubling instead of one per token). Other decoders (present = Concat(past, new))
//! get a past of exactly the sequence's length.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::borrow::Borrow;

use super::config::DecoderConfig;
use super::sampling::{LogitsProcessor, Sampler, SamplingOptions};
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
    has_branch: bool,
    /// Every id the cache holds, in order.
    ids: Vec<i64>,
    /// Keys then values per layer: `[1, kv_heads, rows, head_size]` (rows: the sequence's
    /// length, or the capacity in shared-buffer mode).
    past: Vec<Value>,
    /// Past and present share one buffer with spare rows (see the module's doc).
    shared: bool,
    /// Present KV outputs a device provider made stay on it and are fed back as they are:
    /// only the logits are read back each step.
    device_kv: bool,
    /// The logits after the last id fed.
    logits: Vec<f32>,
}

/// The KV cache is charged to the session's account: it goes before the session (which this
/// generator may hold the last pin on), so the session never closes with cache still live.
impl<S: Borrow<Session>> Drop for Generator<S> {
    fn drop(&mut self) {
        self.past.clear();
    }
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
        let has_branch = has(&cfg.use_cache_branch);
        let shared = has_mask && past_read_only_by_gqa(session.borrow(), &cfg);
        let mut g = Generator {
            session,
            cfg,
            kv_dtype,
            has_mask,
            has_pos,
            has_branch,
            ids: Vec::new(),
            past: Vec::new(),
            shared,
            device_kv: true,
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

    /// Charges the KV tensors to the session's `cache` holder: the present outputs each step
    /// keeps (leased as outputs when they were made) and buffers the generator grew itself.
    fn hold_cache(&mut self) -> Result<()> {
        let acc = self.session.borrow().memory_account().clone();
        for v in &mut self.past {
            if let Value::Tensor(t) = v {
                t.hold_as(Some(&acc), crate::governor::Holder::Cache, &|| {
                    "the KV cache".into()
                })?;
            }
        }
        Ok(())
    }

    /// The KV cache's element type.
    pub(super) fn kv_dtype(&self) -> DataType {
        self.kv_dtype
    }

    /// The ids, KV tensors and logits (for the paged pool).
    pub(super) fn state(&self) -> (&[i64], &[Value], &[f32]) {
        (&self.ids, &self.past, &self.logits)
    }

    /// Replaces the sequence: its ids, KV tensors (`[1, kv_heads, rows, head_size]`, rows at
    /// least the ids' count) and the logits after its last id (for the paged pool).
    pub(super) fn set_state(&mut self, ids: Vec<i64>, past: Vec<Value>, logits: Vec<f32>) {
        self.ids = ids;
        self.past = past;
        self.logits = logits;
    }

    /// Whether present KV outputs made on a device stay there between steps (the default);
    /// off, every present is read back to the host after each run.
    pub fn set_device_kv(&mut self, on: bool) {
        self.device_kv = on;
    }

    /// Whether the KV cache is on a device now.
    pub fn kv_on_device(&self) -> bool {
        self.past
            .iter()
            .any(|v| matches!(v, Value::Tensor(t) if t.location() != crate::tensor::Location::Host))
    }

    /// Reads every KV tensor kept on a device back to the host.
    pub(super) async fn kv_to_host(&mut self) -> Result<()> {
        for i in 0..self.past.len() {
            let t = match &self.past[i] {
                Value::Tensor(t) if t.location() != crate::tensor::Location::Host => t.clone(),
                _ => continue,
            };
            self.past[i] = Value::Tensor(self.download(&t).await?);
        }
        Ok(())
    }

    /// Logits kept on a device: the last row of the second-to-last axis copied there and read
    /// back, or all of them when the provider does not slice (host logits: as they are).
    async fn last_row(&self, t: Tensor) -> Result<Tensor> {
        let crate::tensor::Location::Device(p) = t.location() else {
            return Ok(t);
        };
        let r = t.rank();
        if r >= 2 && t.shape()[r - 2] > 1 {
            let prov = self.session.borrow().providers().get(p as usize).cloned();
            if let Some(Some(row)) =
                prov.map(|prov| prov.slice_axis(&t, r - 2, t.shape()[r - 2] - 1, 1))
            {
                return self.download(&row?).await;
            }
        }
        self.download(&t).await
    }

    async fn download(&self, t: &Tensor) -> Result<Tensor> {
        let crate::tensor::Location::Device(p) = t.location() else {
            return Ok(t.clone());
        };
        let prov = self.session.borrow().providers().get(p as usize).cloned();
        match prov {
            Some(prov) => prov.download(t).await,
            None => Err(Error::Provider("a KV tensor of an unknown provider".into())),
        }
    }

    /// Whether past and present share one buffer with spare rows (GroupQueryAttention
    /// decoders).
    pub fn shared_kv_buffer(&self) -> bool {
        self.shared
    }

    /// Makes room for `need` rows in shared-buffer mode: a new buffer of twice the rows (at
    /// least `need`, at most the context length) holding the valid rows so far.
    async fn reserve(&mut self, need: usize) -> Result<()> {
        let have = self.kv_rows();
        if !self.shared || need <= have {
            return Ok(());
        }
        let rows = need
            .max(2 * have)
            .max(16)
            .min(self.cfg.context_length.max(need));
        let valid = self.ids.len();
        let (heads, h) = (self.cfg.kv_heads, self.cfg.head_size);
        for i in 0..self.past.len() {
            let Value::Tensor(t) = &self.past[i] else {
                return Err(Error::Other("a KV cache entry is not a tensor".into()));
            };
            // a buffer on a device grows there when its provider can (else through the host):
            // once per doubling, not per token
            let loc = t.location();
            if let crate::tensor::Location::Device(p) = loc {
                let prov = self.session.borrow().providers()[p as usize].clone();
                if let Some(r) = prov.resize_axis(t, 2, valid, rows) {
                    self.past[i] = Value::Tensor(r?);
                    continue;
                }
            }
            let host = self.download(t).await?;
            let grown = match host.dtype() {
                DataType::Float16 => grow::<half::f16>(&host, heads, valid, rows, h)?,
                _ => grow::<f32>(&host, heads, valid, rows, h)?,
            };
            self.past[i] = Value::Tensor(match loc {
                crate::tensor::Location::Device(p) => {
                    self.session.borrow().providers()[p as usize].upload(&grown)?
                }
                crate::tensor::Location::Host => grown,
            });
        }
        Ok(())
    }

    /// Rows of the past buffers (the sequence's length, or the capacity of a shared buffer).
    fn kv_rows(&self) -> usize {
        match self.past.first() {
            Some(Value::Tensor(t)) => t.shape().get(2).copied().unwrap_or(0),
            _ => 0,
        }
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
        if !self.shared {
            // (a shared buffer keeps its rows: those past the sequence are never read)
            self.kv_to_host().await?;
            for v in self.past.iter_mut() {
                if let Value::Tensor(t) = v {
                    *t = t.slice_axis(2, 0, keep, 1)?.contiguous()?;
                }
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
        self.reserve(past + n).await?;
        let rows_after = if self.shared {
            self.kv_rows()
        } else {
            past + n
        };
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
        if self.has_branch {
            feeds.push((
                cfg.use_cache_branch.clone().expect("checked"),
                Value::Tensor(Tensor::from_vec(&[1], vec![past > 0])?),
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
        let mut opts = crate::session::RunOptions::default();
        if self.device_kv {
            for t in [&cfg.present_key, &cfg.present_value] {
                for l in 0..cfg.layers {
                    opts.keep_on_device.push(DecoderConfig::layer_name(t, l));
                }
            }
            // a prompt's logits: only the last row is read back (below)
            if n > 1 {
                opts.keep_on_device.push(cfg.logits.clone());
            }
        }
        let mut outs = self.session.borrow().run_async_with(feeds, opts).await?;
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
                Value::Tensor(t) if t.rank() == 4 && t.shape()[2] == rows_after => {}
                Value::Tensor(t) => {
                    return Err(Error::InvalidModel(alloc::format!(
                        "a present KV output has shape {:?} after {} tokens ({rows_after} rows expected)",
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
        self.hold_cache()?;
        let vocab = logits.shape().last().copied().unwrap_or(0);
        if vocab == 0 || logits.len() < vocab {
            return Err(Error::InvalidModel(alloc::format!(
                "logits of shape {:?}",
                logits.shape()
            )));
        }
        let logits = self.last_row(logits).await?;
        let all = logits.to_f32_vec()?;
        self.logits = all[all.len() - vocab..].to_vec();
        self.ids.extend_from_slice(ids);
        Ok(())
    }

    /// Starts a generation after `prompt` (appended to what the cache holds): runs the prompt
    /// (prefill) and returns the state [`Generator::next_token`] advances, one id per call. The
    /// caller drives the loop, so a host can yield between tokens (a browser's event loop) or
    /// end it early ([`Decoding::stop`]: a stop string).
    pub async fn begin(&mut self, prompt: &[i64], opts: &GenOptions) -> Result<Decoding> {
        if prompt.is_empty() && self.ids.is_empty() {
            return Err(Error::Input("an empty prompt".into()));
        }
        let clock = self.session.borrow().clock();
        let mut d = Decoding {
            sampler: Sampler::new(opts.sampling.clone()),
            max_new_tokens: opts.max_new_tokens,
            min_new_tokens: opts.min_new_tokens,
            prompt: prompt.to_vec(),
            tokens: Vec::new(),
            pending: None,
            finish: None,
            prefill_ns: 0,
            t_first: None,
            t_last: 0,
            decode_runs: 0,
        };
        if opts.max_new_tokens == 0 {
            d.finish = Some(FinishReason::Length);
            return Ok(d);
        }
        let t0 = clock();
        self.append_tokens(prompt, opts.prefill_chunk).await?;
        d.prefill_ns = clock().saturating_sub(t0);
        Ok(d)
    }

    /// The next id of the generation `d` (`None` once it has finished): feeds the id chosen
    /// before (if any) through the decoder, then chooses one from the logits. After the call
    /// that returns the last id, [`Decoding::finish_reason`] says why it was the last.
    pub async fn next_token(&mut self, d: &mut Decoding) -> Result<Option<i64>> {
        if d.finish.is_some() {
            return Ok(None);
        }
        if let Some(id) = d.pending.take() {
            self.run(&[id]).await?;
            d.decode_runs += 1;
        }
        let clock = self.session.borrow().clock();
        let hold_eos = d.tokens.len() < d.min_new_tokens;
        let banned: &[i64] = if hold_eos {
            &self.cfg.eos_token_ids
        } else {
            &[]
        };
        let id = d.sampler.choose(&mut self.logits, banned, &self.ids)?;
        d.tokens.push(id);
        let now = clock();
        d.t_first.get_or_insert(now);
        d.t_last = now;
        d.finish = if !hold_eos && self.cfg.eos_token_ids.contains(&id) {
            Some(FinishReason::Eos)
        } else if d.tokens.len() >= d.max_new_tokens || self.ids.len() >= self.cfg.context_length {
            Some(FinishReason::Length)
        } else {
            d.pending = Some(id);
            None
        };
        Ok(Some(id))
    }

    /// Generates after `prompt` (appended to what the cache holds), calling `on_token` with
    /// each new id as it is chosen; `on_token` returns `false` to stop (a stop string).
    pub async fn generate(
        &mut self,
        prompt: &[i64],
        opts: &GenOptions,
        on_token: &mut dyn FnMut(i64) -> bool,
    ) -> Result<Generation> {
        self.generate_with(prompt, opts, Vec::new(), on_token).await
    }

    /// [`Generator::generate`] with `processors` added to the chain, in order (see
    /// [`LogitsProcessor`]).
    pub async fn generate_with(
        &mut self,
        prompt: &[i64],
        opts: &GenOptions,
        processors: Vec<alloc::boxed::Box<dyn LogitsProcessor>>,
        on_token: &mut dyn FnMut(i64) -> bool,
    ) -> Result<Generation> {
        let mut d = self.begin(prompt, opts).await?;
        for p in processors {
            d.add_processor(p);
        }
        while let Some(id) = self.next_token(&mut d).await? {
            if !on_token(id) {
                d.stop();
            }
        }
        Ok(d.into_generation())
    }
}

/// A copy of `t` (`[1, heads, rows, h]`) with `rows` rows, the first `valid` of each head
/// copied.
fn grow<T: crate::tensor::Elem + Copy + Default>(
    t: &Tensor,
    heads: usize,
    valid: usize,
    rows: usize,
    h: usize,
) -> Result<Tensor> {
    let old_rows = t.shape().get(2).copied().unwrap_or(0);
    let old = t.as_slice::<T>()?;
    let mut v = vec![T::default(); heads * rows * h];
    if valid > 0 {
        for j in 0..heads {
            v[j * rows * h..][..valid * h].copy_from_slice(&old[j * old_rows * h..][..valid * h]);
        }
    }
    Tensor::from_vec(&[1, heads, rows, h], v)
}

/// Whether every past KV input of the decoder is read only by GroupQueryAttention (as its
/// past key or value) and every present output is GroupQueryAttention's: then past and
/// present may share one buffer with spare rows, as onnxruntime-genai binds them.
fn past_read_only_by_gqa(session: &Session, cfg: &DecoderConfig) -> bool {
    let g = session.graph();
    let gqa =
        |n: &crate::ir::Node| n.op_type == "GroupQueryAttention" && n.domain == "com.microsoft";
    (0..cfg.layers).all(|l| {
        let ok_past = |template: &str, slot: usize| {
            let Some(id) = g.find_value(&DecoderConfig::layer_name(template, l)) else {
                return false;
            };
            let mut readers = g
                .nodes
                .iter()
                .flat_map(|n| n.inputs.iter().enumerate().map(move |(k, i)| (n, k, *i)))
                .filter(|(_, _, i)| *i == Some(id))
                .peekable();
            readers.peek().is_some()
                && readers.all(|(n, k, _)| gqa(n) && k == slot)
                && !g.nodes.iter().any(|n| n.implicit_inputs.contains(&id))
        };
        let ok_present = |template: &str, slot: usize| {
            let Some(id) = g.find_value(&DecoderConfig::layer_name(template, l)) else {
                return false;
            };
            g.outputs.contains(&id)
                && g.nodes
                    .iter()
                    .any(|n| gqa(n) && n.outputs.get(slot).copied().flatten() == Some(id))
        };
        ok_past(&cfg.past_key, 3)
            && ok_past(&cfg.past_value, 4)
            && ok_present(&cfg.present_key, 1)
            && ok_present(&cfg.present_value, 2)
    })
}

/// A generation in progress ([`Generator::begin`], [`Generator::next_token`]).
pub struct Decoding {
    sampler: Sampler,
    max_new_tokens: usize,
    min_new_tokens: usize,
    prompt: Vec<i64>,
    tokens: Vec<i64>,
    /// The last id chosen, not yet fed to the decoder.
    pending: Option<i64>,
    finish: Option<FinishReason>,
    prefill_ns: u64,
    /// When the first and the last new ids were chosen.
    t_first: Option<u64>,
    t_last: u64,
    decode_runs: usize,
}

impl Decoding {
    /// Adds a logits processor at the end of this generation's chain (see
    /// [`LogitsProcessor`]): it runs at every choice from the next one on.
    pub fn add_processor(&mut self, p: alloc::boxed::Box<dyn LogitsProcessor>) {
        self.sampler.push(p);
    }

    /// Ends the generation after the ids given so far with `finish_reason` `stop` (a stop
    /// string the last id completed), unless that id was an end-of-sequence id.
    pub fn stop(&mut self) {
        if self.finish != Some(FinishReason::Eos) {
            self.pending = None;
            self.finish = Some(FinishReason::Stop);
        }
    }

    /// Why the generation ended (`None` while it goes on).
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// The ids generated so far.
    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }

    /// The generation so far (`finish_reason` `stop` if it has not finished).
    pub fn into_generation(self) -> Generation {
        let decode_ns = match (self.t_first, self.decode_runs) {
            (Some(t), 1..) => self.t_last.saturating_sub(t),
            _ => 0,
        };
        Generation {
            prompt_ids: self.prompt,
            tokens: self.tokens,
            finish_reason: self.finish.unwrap_or(FinishReason::Stop),
            prefill_ns: self.prefill_ns,
            decode_ns,
            decode_runs: self.decode_runs,
        }
    }
}
