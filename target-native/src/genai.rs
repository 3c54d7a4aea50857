//! Generation from a model folder: the core engine ([`nxrt_core::genai`]) over a native
//! session, with blocking calls.
//!
//! A folder is onnxruntime-genai's layout (`genai_config.json` naming the decoder file, with
//! its external data beside it, its input and output names, head counts and special ids) or a
//! transformers.js / Optimum one (`config.json`, `generation_config.json`, the decoder in
//! `onnx/` or at the top); with a `tokenizer.json` beside it, prompts and stop strings can be
//! text ([`Generator::generate_text`]).

use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;

pub use nxrt_core::genai::{
    DecoderConfig, FinishReason, GenOptions, Generation, LogitsProcessor, PoolStats,
    SamplingOptions, SearchDefaults, SeqId, StopText,
};

#[cfg(feature = "tokenizers")]
use crate::tokenizer::Tokenizer;

use crate::{Error, Result, Session, SessionBuilder};

/// A decoder loaded from a folder, with its KV cache and the sequence so far.
pub struct Generator {
    inner: nxrt_core::genai::Generator<Arc<nxrt_core::Session>>,
    load_time: Duration,
    #[cfg(feature = "tokenizers")]
    tokenizer: Option<Tokenizer>,
}

/// A prompt: text (encoded by the folder's tokenizer, special tokens added as its
/// post-processor says) or ids.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    Text(&'a str),
    Ids(&'a [i64]),
}

/// What [`Generator::generate_text`] returns.
#[derive(Clone, Debug)]
pub struct TextGeneration {
    pub generation: Generation,
    /// The generated text (special tokens skipped), cut before the stop string that ended it.
    pub text: String,
}

/// Decoder files a transformers.js / Optimum folder may hold, in the order they are tried.
pub const HF_DECODER_FILES: &[&str] = &[
    "onnx/model.onnx",
    "onnx/decoder_model_merged.onnx",
    "model.onnx",
    "decoder_model_merged.onnx",
    "onnx/decoder_model.onnx",
    "decoder_model.onnx",
];

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))
}

/// Reads a decoder folder's description: onnxruntime-genai's `genai_config.json`, or else a
/// transformers.js / Optimum folder's `config.json` (with `generation_config.json` when there
/// is one) and the first decoder file of [`HF_DECODER_FILES`] it holds.
pub fn read_config(dir: &Path) -> Result<DecoderConfig> {
    let path = dir.join("genai_config.json");
    if path.exists() {
        return DecoderConfig::from_genai_json(&read_text(&path)?);
    }
    let hf = dir.join("config.json");
    if !hf.exists() {
        return Err(Error::Io(format!(
            "{}: no genai_config.json (onnxruntime-genai) or config.json (transformers.js / Optimum)",
            dir.display()
        )));
    }
    let file = HF_DECODER_FILES
        .iter()
        .find(|f| dir.join(f).is_file())
        .ok_or_else(|| {
            Error::Io(format!(
                "{}: config.json but no decoder ({})",
                dir.display(),
                HF_DECODER_FILES.join(", ")
            ))
        })?;
    let gen_path = dir.join("generation_config.json");
    let gen = if gen_path.exists() {
        Some(read_text(&gen_path)?)
    } else {
        None
    };
    DecoderConfig::from_hf_config(&read_text(&hf)?, gen.as_deref(), file)
}

impl Generator {
    /// What the decoder's session holds: its weights, arenas and, as `cache`, the KV cache
    /// this generator keeps between steps.
    pub fn memory_snapshot(&self) -> crate::governor::MemorySnapshot {
        self.inner.session().memory_snapshot()
    }

    /// Loads the decoder of the folder `dir` with `builder`'s options.
    pub fn from_folder(dir: impl AsRef<Path>, builder: &SessionBuilder) -> Result<Generator> {
        let dir = dir.as_ref();
        let cfg = read_config(dir)?;
        let rel = Path::new(&cfg.filename);
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(Error::InvalidModel(format!(
                "genai_config.json: decoder file `{}` is not inside the folder",
                cfg.filename
            )));
        }
        let session: Session = builder.load(dir.join(rel))?;
        let load_time = session.load_time();
        let inner = nxrt_core::genai::Generator::new(session.core_shared(), cfg)?;
        #[cfg(feature = "tokenizers")]
        let tokenizer = if dir.join("tokenizer.json").exists() {
            Some(Tokenizer::from_path(dir)?)
        } else {
            None
        };
        Ok(Generator {
            inner,
            load_time,
            #[cfg(feature = "tokenizers")]
            tokenizer,
        })
    }

    /// The folder's tokenizer, if it has a `tokenizer.json`.
    #[cfg(feature = "tokenizers")]
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The folder's tokenizer prepared for grammars (constrained decoding), ending with the
    /// decoder's end-of-sequence ids. Build it once and take a processor per generation.
    #[cfg(feature = "guidance")]
    pub fn guidance(&self) -> Result<crate::guidance::Guidance> {
        let tok = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| Error::Tokenizer("the model folder has no tokenizer.json".into()))?;
        crate::guidance::from_path(tok.path(), &self.config().eos_token_ids)
    }

    /// Generates after a text or id prompt with the folder's tokenizer: `on_text` receives the
    /// text as it is decoded (never half a character, never a stop string or a part of one
    /// that may still complete), and the generation stops at the first of `stop`.
    #[cfg(feature = "tokenizers")]
    pub fn generate_text(
        &mut self,
        prompt: Prompt<'_>,
        opts: &GenOptions,
        stop: &[String],
        on_text: impl FnMut(&str),
    ) -> Result<TextGeneration> {
        self.generate_text_with(prompt, opts, stop, Vec::new(), on_text)
    }

    #[cfg(feature = "tokenizers")]
    /// [`Generator::generate_text`] with `processors` added to the chain, in order (see
    /// [`Generator::generate_with`]); a grammar ([`Generator::guidance`]) is one.
    pub fn generate_text_with(
        &mut self,
        prompt: Prompt<'_>,
        opts: &GenOptions,
        stop: &[String],
        processors: Vec<Box<dyn LogitsProcessor>>,
        mut on_text: impl FnMut(&str),
    ) -> Result<TextGeneration> {
        let tok = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| Error::Tokenizer("the model folder has no tokenizer.json".into()))?;
        let ids: Vec<i64> = match prompt {
            Prompt::Ids(ids) => ids.to_vec(),
            Prompt::Text(text) => tok
                .encode(text, true)?
                .ids
                .into_iter()
                .map(i64::from)
                .collect(),
        };
        let mut stream = tok.stream(true);
        let mut stops = StopText::new(stop.iter().cloned());
        let mut failed = None;
        let generation =
            pollster::block_on(self.inner.generate_with(&ids, opts, processors, &mut |id| {
                let piece = u32::try_from(id)
                    .map_err(|_| Error::Tokenizer(format!("id {id} cannot be decoded")))
                    .and_then(|id| stream.step(id));
                match piece {
                    Ok(Some(p)) => on_text(stops.push(&p)),
                    Ok(None) => {}
                    Err(e) => failed = Some(e),
                }
                failed.is_none() && !stops.stopped()
            }))?;
        if let Some(e) = failed {
            return Err(e);
        }
        let text = if stops.stopped() {
            stops.text().to_string()
        } else {
            on_text(stops.finish());
            let ids: Vec<u32> = generation.tokens.iter().map(|&id| id as u32).collect();
            tok.decode(&ids, true)?
        };
        Ok(TextGeneration { generation, text })
    }

    /// The decoder's description.
    pub fn config(&self) -> &DecoderConfig {
        self.inner.config()
    }

    /// The time the decoder took to load.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Every id fed so far.
    pub fn ids(&self) -> &[i64] {
        self.inner.ids()
    }

    /// The logits after the last id fed.
    pub fn logits(&self) -> &[f32] {
        self.inner.logits()
    }

    /// Bytes the KV cache holds.
    pub fn kv_bytes(&self) -> usize {
        self.inner.kv_bytes()
    }

    /// Whether past and present share one KV buffer with spare rows (decoders whose past only
    /// GroupQueryAttention reads): the cache grows geometrically and is written in place.
    pub fn shared_kv_buffer(&self) -> bool {
        self.inner.shared_kv_buffer()
    }

    /// Whether the KV cache is on a device now: a device provider ran the decoder's attention,
    /// and its present KV stays there between steps (only the logits are read back).
    pub fn kv_on_device(&self) -> bool {
        self.inner.kv_on_device()
    }

    /// The decoder's session (core), for its providers' counters.
    pub fn core_session(&self) -> &nxrt_core::Session {
        self.inner.session()
    }

    /// Forgets the sequence.
    pub fn reset(&mut self) -> Result<()> {
        self.inner.reset()
    }

    /// Feeds ids after the sequence (`chunk` per run; 0: at once).
    pub fn append_tokens(&mut self, ids: &[i64], chunk: usize) -> Result<()> {
        pollster::block_on(self.inner.append_tokens(ids, chunk))
    }

    /// Keeps the first `n` ids of the sequence.
    pub fn rewind_to(&mut self, n: usize) -> Result<()> {
        pollster::block_on(self.inner.rewind_to(n))
    }

    /// Generates after `prompt`, calling `on_token` with each new id (return `false` to stop).
    pub fn generate(
        &mut self,
        prompt: &[i64],
        opts: &GenOptions,
        mut on_token: impl FnMut(i64) -> bool,
    ) -> Result<Generation> {
        pollster::block_on(self.inner.generate(prompt, opts, &mut on_token))
    }

    /// [`Generator::generate`] with the caller's logits processors added to the chain, in
    /// order: each sees every step's logits (after the built-in penalties) and the ids so far,
    /// and may change the logits (`-inf` bans an id). Closures
    /// `FnMut(&mut [f32], &[i64]) -> Result<()>` are processors.
    pub fn generate_with(
        &mut self,
        prompt: &[i64],
        opts: &GenOptions,
        processors: Vec<Box<dyn LogitsProcessor>>,
        mut on_token: impl FnMut(i64) -> bool,
    ) -> Result<Generation> {
        pollster::block_on(
            self.inner
                .generate_with(prompt, opts, processors, &mut on_token),
        )
    }
}

impl Generator {
    /// Several sequences over this decoder, their KV rows in a pool of `max_pages` pages of
    /// `page_rows` tokens (see [`PagedGenerator`]). The current sequence is forgotten.
    pub fn into_paged(self, page_rows: usize, max_pages: usize) -> Result<PagedGenerator> {
        Ok(PagedGenerator {
            inner: nxrt_core::genai::PagedGenerator::new(self.inner, page_rows, max_pages)?,
        })
    }
}

/// Several sequences over one decoder (`Generator::into_paged`), with blocking calls: each
/// sequence's KV rows live in reference-counted pages, so a fork shares them (a shared page is
/// copied on its first write), a new sequence whose prompt starts as a live one's takes its
/// whole pages and runs only the rest, and a rewind drops pages. The sequence being advanced is
/// gathered into the decoder's contiguous cache when another was advanced last (one copy of
/// its rows). See `nxrt_core::genai::kvpool`.
pub struct PagedGenerator {
    inner: nxrt_core::genai::PagedGenerator<Arc<nxrt_core::Session>>,
}

impl PagedGenerator {
    /// A new, empty sequence.
    pub fn create(&mut self) -> SeqId {
        self.inner.create()
    }

    /// A new sequence holding what `s` holds (pages shared, not copied).
    pub fn fork(&mut self, s: SeqId) -> Result<SeqId> {
        self.inner.fork(s)
    }

    /// Ends `s`, giving back the pages only it held.
    pub fn release(&mut self, s: SeqId) -> Result<()> {
        self.inner.release(s)
    }

    /// Feeds `ids` after what `s` holds, `chunk` at a time (0: at once).
    pub fn append_tokens(&mut self, s: SeqId, ids: &[i64], chunk: usize) -> Result<()> {
        pollster::block_on(self.inner.append_tokens(s, ids, chunk))
    }

    /// Keeps the first `n` ids of `s`; the logits are then those after id `n - 1`.
    pub fn rewind_to(&mut self, s: SeqId, n: usize) -> Result<()> {
        pollster::block_on(self.inner.rewind_to(s, n))
    }

    /// The ids `s` holds KV rows for.
    pub fn ids(&self, s: SeqId) -> Result<&[i64]> {
        self.inner.ids(s)
    }

    /// The logits after the last id `s` holds.
    pub fn logits(&self, s: SeqId) -> Result<&[f32]> {
        self.inner.logits(s)
    }

    /// Generates on `s` after `prompt`, as [`Generator::generate_with`] (the last id chosen
    /// is not fed: the sequence holds the ids before it).
    pub fn generate_with(
        &mut self,
        s: SeqId,
        prompt: &[i64],
        opts: &GenOptions,
        processors: Vec<Box<dyn LogitsProcessor>>,
        mut on_token: impl FnMut(i64) -> bool,
    ) -> Result<Generation> {
        pollster::block_on(
            self.inner
                .generate_with(s, prompt, opts, processors, &mut on_token),
        )
    }

    /// The pool's figures (pages in use and allocated, allocations, copies, shared prefixes).
    pub fn stats(&self) -> PoolStats {
        self.inner.pool().stats()
    }

    /// What the decoder's session holds, the pages among it (holder `cache`; see
    /// [`crate::governor`]). A session memory limit (`SessionBuilder::memory_limit`) bounds
    /// the pages too: a page over it is `Error::OutOfMemory`.
    pub fn memory_snapshot(&self) -> crate::governor::MemorySnapshot {
        self.inner.generator().session().memory_snapshot()
    }

    /// Gives back the free pages' memory and what the session caches between runs; returns
    /// the pages' bytes given back.
    pub fn release_cached(&mut self) -> usize {
        self.inner.release_cached()
    }
}
