//! Constrained decoding: JSON schemas, regular expressions and Lark grammars through the
//! `llguidance` crate, as a processor of the generation's chain (the types are written once,
//! in the crate shared with the browser's tokenizer module; see
//! [`nxrt_wasm_tokenizer::guidance`]). This module adds reading a folder's tokenizer.json.

use std::path::Path;

pub use nxrt_wasm_tokenizer::guidance::{Grammar, GrammarProcessor, Guidance};

use crate::tokenizer::read_tokenizer_file;
use crate::Result;

/// [`Guidance`] from a tokenizer.json file (or a folder holding one, which must resolve inside
/// it) and the decoder's end-of-sequence ids.
pub fn from_path(path: impl AsRef<Path>, eos: &[i64]) -> Result<Guidance> {
    let (_, bytes) = read_tokenizer_file(path.as_ref())?;
    Guidance::new(&bytes, eos)
}
