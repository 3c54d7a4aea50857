//! Constrained decoding: JSON schemas, regular expressions and Lark grammars through the
//! `llguidance` crate, applied as a logit mask in the generation's processor chain.
//!
//! [`Guidance`] is built once per tokenizer (it walks the vocabulary: every id's bytes, from
//! the tokenizer.json's own description of its decoding, into a token trie); each generation
//! then takes a fresh [`GrammarProcessor`] from [`Guidance::processor`]. At every step the
//! processor feeds the grammar the ids chosen since the last step and sets the logit of every
//! id the grammar cannot accept next to `-inf`. Once the grammar is complete and cannot go
//! on, only the end-of-sequence ids stay allowed, so the generation ends with `eos`.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use nxrt_core::genai::LogitsProcessor;
use nxrt_core::{Error, Result};

/// What the output must match.
#[derive(Clone, Debug)]
pub enum Grammar {
    /// A JSON schema (the output is one JSON value valid against it).
    JsonSchema(String),
    /// A regular expression the whole output must match.
    Regex(String),
    /// A Lark grammar (llguidance's dialect: `start: ...`, `/regex/` terminals, `%json`).
    Lark(String),
}

impl Grammar {
    fn top_level(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Grammar::JsonSchema(s) => {
                let v: serde_json::Value = serde_json::from_str(s)
                    .map_err(|e| Error::Other(format!("JSON schema: {e}")))?;
                TopLevelGrammar::from_json_schema(v)
            }
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
            Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        })
    }
}

/// The tokenizer as llguidance sees it: the trie of every id's bytes, and encoding (used for
/// the grammar's forced text).
struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // the trie covers bytes that are not whole UTF-8 characters
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Ids at most this (the largest real vocabularies hold about 260 000).
const MAX_TOKEN_ID: u64 = 1 << 24;

/// What the token-bytes reader needs, checked before it runs: a byte-level decoder, or a
/// sequence with byte fallback (SentencePiece-style); ids below [`MAX_TOKEN_ID`] (the reader
/// makes a list as long as the largest id); byte-fallback names `<0xNN>` with hex digits.
fn check_tokenizer(json: &serde_json::Value) -> Result<()> {
    let bad = |m: String| Err(Error::Tokenizer(format!("constrained decoding: {m}")));
    let decoder = &json["decoder"];
    let byte_level = decoder["type"] == "ByteLevel";
    let fallback = decoder["type"] == "Sequence"
        && decoder["decoders"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x["type"] == "ByteFallback"));
    if !byte_level && !fallback {
        return bad(format!(
            "the tokenizer's decoder ({}) is neither byte-level nor a sequence with byte fallback",
            decoder["type"]
        ));
    }
    let Some(vocab) = json["model"]["vocab"].as_object() else {
        return bad("the tokenizer's model has no vocabulary map".into());
    };
    let added = json["added_tokens"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for id in vocab.values().chain(added.iter().map(|t| &t["id"])) {
        if id.as_u64().is_none_or(|i| i >= MAX_TOKEN_ID) {
            return bad(format!("token id {id} (ids must be below {MAX_TOKEN_ID})"));
        }
    }
    if fallback {
        for name in vocab.keys().filter(|n| n.starts_with("<0x")) {
            let hex = name.len() == 6
                && name.ends_with('>')
                && u8::from_str_radix(&name[3..5], 16).is_ok();
            if !hex {
                return bad(format!("the byte-fallback token {name:?} is not <0xNN>"));
            }
        }
    }
    Ok(())
}

/// Turns off what adds a space before a text's start: `Prepend` normalizers, Metaspace's
/// `prepend_scheme` (and its older `add_prefix_space`), ByteLevel's `add_prefix_space`.
fn no_leading_space(json: &mut serde_json::Value) {
    use serde_json::Value;
    fn fix(v: &mut Value) -> bool {
        let Some(o) = v.as_object_mut() else {
            return true;
        };
        match o.get("type").and_then(Value::as_str) {
            Some("Prepend") => return false,
            Some("Metaspace") => {
                o.insert("prepend_scheme".into(), "never".into());
                if o.contains_key("add_prefix_space") {
                    o.insert("add_prefix_space".into(), false.into());
                }
            }
            Some("ByteLevel") => {
                o.insert("add_prefix_space".into(), false.into());
            }
            Some("Sequence") => {
                for key in ["normalizers", "pretokenizers"] {
                    if let Some(Value::Array(items)) = o.get_mut(key) {
                        items.retain_mut(fix);
                    }
                }
            }
            _ => {}
        }
        true
    }
    for key in ["normalizer", "pre_tokenizer"] {
        if let Some(v) = json.get_mut(key) {
            if !fix(v) {
                *v = Value::Null;
            }
        }
    }
}

/// A tokenizer's vocabulary prepared for grammars; makes one [`GrammarProcessor`] per
/// generation.
pub struct Guidance {
    factory: ParserFactory,
    eos: Vec<i64>,
}

fn llg_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("{what}: {e}"))
}

impl Guidance {
    /// From the bytes of a tokenizer.json and the decoder's end-of-sequence ids (the first is
    /// the one the grammar ends with; every one of them is allowed where it may end).
    pub fn new(tokenizer_json: &[u8], eos: &[i64]) -> Result<Guidance> {
        // the crates below assert on what they do not expect: natively a panic becomes this
        // error (on wasm, where nothing unwinds, the checks in `check_tokenizer` come first)
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::build(tokenizer_json, eos)
        }))
        .unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(Error::Tokenizer(format!(
                "preparing the vocabulary for grammars failed: {msg}"
            )))
        })
    }

    fn build(tokenizer_json: &[u8], eos: &[i64]) -> Result<Guidance> {
        let first = *eos.first().ok_or_else(|| {
            Error::Other("constrained decoding needs an end-of-sequence id".into())
        })?;
        let mut json: serde_json::Value = serde_json::from_slice(tokenizer_json)
            .map_err(|e| Error::Tokenizer(format!("tokenizer.json: {e}")))?;
        check_tokenizer(&json)?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| llg_err("the tokenizer's token bytes", e))?;
        // The grammar's forced text continues the output: encode it without the space a
        // SentencePiece-style or GPT-2-style tokenizer puts before a text's start.
        no_leading_space(&mut json);
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes())
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        drop(json);
        let vocab = words.len().max(tokenizer.get_vocab_size(true));
        let in_vocab = |e: i64| u32::try_from(e).ok().filter(|&e| (e as usize) < vocab);
        let eos_id = in_vocab(first).ok_or_else(|| {
            Error::Other(format!(
                "end-of-sequence id {first} is not in the vocabulary"
            ))
        })?;
        let eos_ids: Vec<u32> = eos.iter().filter_map(|&e| in_vocab(e)).collect();
        let mut words = words;
        words.resize(vocab, Vec::new());
        let info = TokRxInfo::new(vocab as u32, eos_id);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_ids);
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| llg_err("llguidance", e))?;
        factory.quiet();
        Ok(Guidance {
            factory,
            eos: eos.to_vec(),
        })
    }

    /// The ids the trie knows (the tokenizer's vocabulary, added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// A processor holding the generation to `grammar`; a grammar that does not compile is an
    /// error here, before any decoding.
    pub fn processor(&self, grammar: &Grammar) -> Result<GrammarProcessor> {
        let parser = self
            .factory
            .create_parser(grammar.top_level()?)
            .map_err(|e| llg_err("grammar", e))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(llg_err("grammar", e));
        }
        Ok(GrammarProcessor {
            matcher,
            eos: self.eos.clone(),
            vocab: self.vocab_size(),
            fed: None,
        })
    }
}

/// Masks the logits to what a grammar accepts next (see the module's description).
pub struct GrammarProcessor {
    matcher: Matcher,
    eos: Vec<i64>,
    vocab: usize,
    /// How many ids of the history the grammar has seen (None before the first step, whose
    /// history is the prompt).
    fed: Option<usize>,
}

impl GrammarProcessor {
    /// The ids the grammar allows next, as a mask over `n` ids (ids past the vocabulary are
    /// never allowed; any end-of-sequence id where the grammar may end).
    pub fn allowed(&mut self, n: usize) -> Result<Vec<bool>> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| llg_err("grammar", e))?;
        let mut out = vec![false; n];
        for (i, o) in out.iter_mut().enumerate().take(self.vocab.min(mask.len())) {
            *o = mask.is_allowed(i as TokenId);
        }
        Ok(out)
    }

    /// The ids chosen so far and accepted by the grammar.
    fn feed(&mut self, history: &[i64]) -> Result<()> {
        let from = *self.fed.get_or_insert(history.len());
        for &id in &history[from.min(history.len())..] {
            let t = u32::try_from(id).map_err(|_| llg_err("grammar", format!("id {id}")))?;
            if self.eos.contains(&id) {
                continue;
            }
            self.matcher
                .consume_token(t)
                .map_err(|e| llg_err("grammar", e))?;
        }
        self.fed = Some(history.len());
        Ok(())
    }

    /// Whether the grammar is complete (the output may end here).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

impl LogitsProcessor for GrammarProcessor {
    fn process(&mut self, logits: &mut [f32], history: &[i64]) -> Result<()> {
        self.feed(history)?;
        let allowed = self.allowed(logits.len())?;
        for (l, ok) in logits.iter_mut().zip(allowed) {
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
}
