//! Text for generation: HF `tokenizer.json` files (byte-level BPE, SentencePiece-style BPE
//! with byte fallback, WordPiece, Unigram, with their normalizers, pre-tokenizers,
//! post-processors, decoders and added tokens) through the `tokenizers` crate, so that ids are
//! those of HF `tokenizers` by construction.
//!
//! Padding and truncation a file may configure are turned off: a generation prompt is never
//! padded or cut. Files over [`MAX_TOKENIZER_BYTES`] and folder files that resolve outside their
//! folder are refused with typed errors, and a panic inside the crate on a hostile file becomes
//! an [`Error::Tokenizer`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The largest tokenizer.json read (real ones are 0.5 to 35 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A tokenizer read from a `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

/// The ids of a text and the token strings they stand for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub tokens: Vec<String>,
}

fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Err(Error::Tokenizer(format!("{what} failed: {msg}")))
    })
}

/// The tokenizer file `path` names: `path` itself, or `path/tokenizer.json` for a folder, which
/// must then resolve inside the folder.
pub fn tokenizer_file(path: &Path) -> Result<PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let file = path.join("tokenizer.json");
    if !file.exists() {
        return Err(Error::Io(format!("{}: no tokenizer.json", path.display())));
    }
    let canon = |p: &Path| {
        p.canonicalize()
            .map_err(|e| Error::Io(format!("{}: {e}", p.display())))
    };
    if !canon(&file)?.starts_with(canon(path)?) {
        return Err(Error::Tokenizer(format!(
            "{} resolves outside its folder",
            file.display()
        )));
    }
    Ok(file)
}

/// The file [`tokenizer_file`] names and its bytes (at most [`MAX_TOKENIZER_BYTES`]).
pub fn read_tokenizer_file(path: &Path) -> Result<(PathBuf, Vec<u8>)> {
    let file = tokenizer_file(path)?;
    let meta = std::fs::metadata(&file)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", file.display())))?;
    if !meta.is_file() {
        return Err(Error::Io(format!("{} is not a file", file.display())));
    }
    if meta.len() > MAX_TOKENIZER_BYTES {
        return Err(Error::Tokenizer(format!(
            "{} has {} bytes, over the limit of {MAX_TOKENIZER_BYTES}",
            file.display(),
            meta.len()
        )));
    }
    let bytes = std::fs::read(&file)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", file.display())))?;
    Ok((file, bytes))
}

impl Tokenizer {
    /// Reads a tokenizer.json file, or a folder's `tokenizer.json`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let (file, bytes) = read_tokenizer_file(path.as_ref())?;
        let mut t = Self::from_bytes(&bytes).map_err(|e| match e {
            Error::Tokenizer(d) => Error::Tokenizer(format!("{}: {d}", file.display())),
            e => e,
        })?;
        t.path = file;
        Ok(t)
    }

    /// A tokenizer from the bytes of a tokenizer.json.
    pub fn from_bytes(bytes: &[u8]) -> Result<Tokenizer> {
        if bytes.len() as u64 > MAX_TOKENIZER_BYTES {
            return Err(Error::Tokenizer(format!(
                "{} bytes, over the limit of {MAX_TOKENIZER_BYTES}",
                bytes.len()
            )));
        }
        let mut inner = guarded("reading tokenizer.json", || {
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| Error::Tokenizer(e.to_string()))
        })?;
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(Tokenizer {
            inner,
            path: PathBuf::new(),
        })
    }

    /// The file read (empty for [`Tokenizer::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text`, with the special tokens the post-processor adds when
    /// `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Encoded> {
        guarded("encoding", || {
            let e = self
                .inner
                .encode(text, add_special_tokens)
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
            Ok(Encoded {
                ids: e.get_ids().to_vec(),
                tokens: e.get_tokens().to_vec(),
            })
        })
    }

    /// The text of `ids` (special tokens left out when `skip_special_tokens`; ids the
    /// vocabulary lacks are skipped, as HF `tokenizers` does).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        guarded("decoding", || {
            self.inner
                .decode(ids, skip_special_tokens)
                .map_err(|e| Error::Tokenizer(e.to_string()))
        })
    }

    /// The vocabulary's string for `id` (as the model stores it: `▁` for a SentencePiece
    /// space, `Ġ` for a byte-level one, `<0x41>` for a fallback byte), None past the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// An incremental decoder: text pieces as ids arrive, never half a character.
    pub fn stream(&self, skip_special_tokens: bool) -> TextStream<'_> {
        TextStream {
            tok: self,
            skip: skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }
}

/// Text pieces of a growing id sequence (see [`Tokenizer::stream`]). Each piece is the text the
/// new id adds after a window of the ids before it, so decoders that look at neighbours (the
/// leading-space rule of SentencePiece, WordPiece's `##`) see them; a piece that would end
/// inside a UTF-8 character (byte-fallback tokens) waits for the ids that complete it.
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    skip: bool,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl TextStream<'_> {
    /// Feeds one id; returns the text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        let (ids, prefix, index) = (&mut self.ids, &mut self.prefix, &mut self.prefix_index);
        guarded("decoding", || {
            tokenizers::tokenizer::step_decode_stream(
                &self.tok.inner,
                vec![id],
                self.skip,
                ids,
                prefix,
                index,
            )
            .map_err(|e| Error::Tokenizer(e.to_string()))
        })
    }
}
