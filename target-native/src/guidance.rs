//! Constrained decoding: JSON schemas, regular expressions and Lark grammars through the
//! `llguidance` crate, as a processor of the generation's chain (the types are written once,
//! in the crate shared with the browser's tokenizer module; see
//! [`nxrt_wasm_tokenizer::guidance`]). This module adds reading a folder's tokenizer.json.

use std::path::Path;

pub use nxrt_wasm_tokenizer::guidance::{Grammar, GrammarProcessor, Guidance};

use crate::tokenizer::{tokenizer_file, MAX_TOKENIZER_BYTES};
use crate::{Error, Result};

/// [`Guidance`] from a tokenizer.json file (or a folder holding one, which must resolve inside
/// it) and the decoder's end-of-sequence ids.
pub fn from_path(path: impl AsRef<Path>, eos: &[i64]) -> Result<Guidance> {
    let file = tokenizer_file(path.as_ref())?;
    let meta = std::fs::metadata(&file)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", file.display())))?;
    if meta.len() > MAX_TOKENIZER_BYTES {
        return Err(Error::Tokenizer(format!(
            "{} has {} bytes, over the limit of {MAX_TOKENIZER_BYTES}",
            file.display(),
            meta.len()
        )));
    }
    let bytes = std::fs::read(&file)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", file.display())))?;
    Guidance::new(&bytes, eos)
}
