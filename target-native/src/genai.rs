//! Generation from a model folder: the core engine ([`nxrt_core::genai`]) over a native
//! session, with blocking calls.
//!
//! A folder is onnxruntime-genai's layout: `genai_config.json` naming the decoder file (with
//! its external data beside it), its input and output names, head counts and special ids.

use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;

pub use nxrt_core::genai::{
    DecoderConfig, FinishReason, GenOptions, Generation, SamplingOptions, SearchDefaults,
};

use crate::{Error, Result, Session, SessionBuilder};

/// A decoder loaded from a folder, with its KV cache and the sequence so far.
pub struct Generator {
    inner: nxrt_core::genai::Generator<Arc<nxrt_core::Session>>,
    load_time: Duration,
}

/// Reads a decoder folder's `genai_config.json`.
pub fn read_config(dir: &Path) -> Result<DecoderConfig> {
    let path = dir.join("genai_config.json");
    if !path.exists() {
        let hint = if dir.join("config.json").exists() {
            " (a transformers.js / Optimum folder with config.json is not supported yet)"
        } else {
            ""
        };
        return Err(Error::Io(format!(
            "{}: no genai_config.json{hint}",
            dir.display()
        )));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    DecoderConfig::from_genai_json(&text)
}

impl Generator {
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
        Ok(Generator { inner, load_time })
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
}
