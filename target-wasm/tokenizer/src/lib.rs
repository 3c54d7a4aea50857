//! The tokenizer module of the npm package (`js/wasm/nxrt_tokenizer*`): HF `tokenizer.json`
//! files through the `tokenizers` crate (its pure-Rust regex engine), a streaming decoder that
//! never emits half a UTF-8 character, and stop strings over the streamed text (core's
//! [`StopText`]). It is a wasm module of its own so that the main module does not grow for
//! users who never generate text; `nxrt/genai` loads it on first use.
//!
//! It mirrors the native `nxrt::tokenizer` (same crate, same settings: padding and truncation a
//! file configures are turned off), so ids are HF's by construction on both.
//!
//! Chat templates ([`chat`]) and grammars ([`guidance`], feature `guidance`) are written once
//! here, target-free: the native crate re-exports them (`nxrt::chat`, `nxrt::guidance`).

pub mod chat;
#[cfg(feature = "guidance")]
pub mod guidance;

#[cfg(target_arch = "wasm32")]
mod wasm {
    use std::rc::Rc;

    use js_sys::{Array, Object, Reflect};
    use nxrt_core::genai::StopText;
    use wasm_bindgen::prelude::*;

    /// The largest tokenizer.json read (real ones are 0.5 to 35 MB), as natively.
    const MAX_TOKENIZER_BYTES: usize = 256 << 20;

    fn err(e: impl std::fmt::Display) -> JsError {
        JsError::new(&format!("tokenizer: {e}"))
    }

    /// A tokenizer read from a `tokenizer.json`.
    #[wasm_bindgen]
    pub struct WasmTokenizer {
        inner: Rc<tokenizers::Tokenizer>,
    }

    #[wasm_bindgen]
    impl WasmTokenizer {
        /// Reads a tokenizer.json's bytes (padding and truncation turned off).
        #[wasm_bindgen(constructor)]
        pub fn new(bytes: &[u8]) -> Result<WasmTokenizer, JsError> {
            if bytes.len() > MAX_TOKENIZER_BYTES {
                return Err(err(format!(
                    "{} bytes, over the limit of {MAX_TOKENIZER_BYTES}",
                    bytes.len()
                )));
            }
            let mut t = tokenizers::Tokenizer::from_bytes(bytes).map_err(err)?;
            t.with_padding(None);
            t.with_truncation(None).map_err(err)?;
            Ok(WasmTokenizer { inner: Rc::new(t) })
        }

        /// `{ids, tokens}` of `text`, with the special tokens the post-processor adds when
        /// `add_special_tokens`.
        pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Object, JsError> {
            let e = self.inner.encode(text, add_special_tokens).map_err(err)?;
            let ids = Array::new();
            for &i in e.get_ids() {
                ids.push(&JsValue::from_f64(i as f64));
            }
            let tokens = Array::new();
            for t in e.get_tokens() {
                tokens.push(&JsValue::from_str(t));
            }
            let o = Object::new();
            let _ = Reflect::set(&o, &"ids".into(), &ids);
            let _ = Reflect::set(&o, &"tokens".into(), &tokens);
            Ok(o)
        }

        /// The text of `ids` (special tokens skipped when `skip_special_tokens`; ids outside
        /// the vocabulary skipped, as HF does).
        pub fn decode(&self, ids: Vec<u32>, skip_special_tokens: bool) -> Result<String, JsError> {
            self.inner.decode(&ids, skip_special_tokens).map_err(err)
        }

        /// Ids, added tokens included.
        #[wasm_bindgen(js_name = vocabSize)]
        pub fn vocab_size(&self) -> usize {
            self.inner.get_vocab_size(true)
        }

        /// A streaming decoder over this tokenizer.
        pub fn stream(&self, skip_special_tokens: bool) -> WasmTextStream {
            WasmTextStream {
                tok: self.inner.clone(),
                skip: skip_special_tokens,
                ids: Vec::new(),
                prefix: String::new(),
                prefix_index: 0,
            }
        }
    }

    /// Text pieces of a growing id sequence: each piece is the text the new id adds after a
    /// window of the ids before it; a piece that would end inside a UTF-8 character waits for
    /// the ids that complete it.
    #[wasm_bindgen]
    pub struct WasmTextStream {
        tok: Rc<tokenizers::Tokenizer>,
        skip: bool,
        ids: Vec<u32>,
        prefix: String,
        prefix_index: usize,
    }

    #[wasm_bindgen]
    impl WasmTextStream {
        /// Feeds one id; returns the text it completes (`undefined` while none).
        pub fn push(&mut self, id: u32) -> Result<Option<String>, JsError> {
            tokenizers::tokenizer::step_decode_stream(
                &self.tok,
                vec![id],
                self.skip,
                &mut self.ids,
                &mut self.prefix,
                &mut self.prefix_index,
            )
            .map_err(err)
        }
    }

    /// A folder's chat template (see [`crate::chat`]).
    #[wasm_bindgen]
    pub struct WasmChatTemplate {
        inner: crate::chat::ChatTemplate,
    }

    #[wasm_bindgen]
    impl WasmChatTemplate {
        /// The template of a folder whose tokenizer_config.json and chat_template.jinja texts
        /// are given (either may be absent); `undefined` when neither has one.
        #[wasm_bindgen(js_name = fromConfig)]
        pub fn from_config(
            tokenizer_config: Option<String>,
            jinja: Option<String>,
        ) -> Result<Option<WasmChatTemplate>, JsError> {
            let t = crate::chat::ChatTemplate::from_config(
                tokenizer_config.as_deref(),
                jinja.as_deref(),
            )
            .map_err(err)?;
            Ok(t.map(|inner| WasmChatTemplate { inner }))
        }

        /// The text of `messages` (an array of `{role, content}` strings), with the
        /// assistant's turn opened when `add_generation_prompt`.
        pub fn render(
            &self,
            messages: Vec<JsValue>,
            add_generation_prompt: bool,
        ) -> Result<String, JsError> {
            let field = |m: &JsValue, k: &str| {
                Reflect::get(m, &k.into())
                    .ok()
                    .and_then(|v| v.as_string())
                    .ok_or_else(|| {
                        JsError::new(&format!("chat: every message needs a string `{k}`"))
                    })
            };
            let msgs = messages
                .iter()
                .map(|m| {
                    Ok(crate::chat::Message::new(
                        field(m, "role")?,
                        field(m, "content")?,
                    ))
                })
                .collect::<Result<Vec<_>, JsError>>()?;
            self.inner.render(&msgs, add_generation_prompt).map_err(err)
        }
    }

    /// A tokenizer's vocabulary prepared for grammars (see [`crate::guidance`]).
    #[cfg(feature = "guidance")]
    #[wasm_bindgen]
    pub struct WasmGuidance {
        inner: crate::guidance::Guidance,
    }

    #[cfg(feature = "guidance")]
    #[wasm_bindgen]
    impl WasmGuidance {
        /// From a tokenizer.json's bytes and the decoder's end-of-sequence ids.
        #[wasm_bindgen(constructor)]
        pub fn new(tokenizer_json: &[u8], eos: Vec<f64>) -> Result<WasmGuidance, JsError> {
            let eos: Vec<i64> = eos.iter().map(|&e| e as i64).collect();
            let inner = crate::guidance::Guidance::new(tokenizer_json, &eos).map_err(err)?;
            Ok(WasmGuidance { inner })
        }

        /// A grammar for one generation: `kind` `json_schema`, `regex` or `lark`, `text` its
        /// source. An error when it does not compile.
        pub fn grammar(&self, kind: &str, text: String) -> Result<WasmGrammar, JsError> {
            use crate::guidance::Grammar;
            let g = match kind {
                "json_schema" => Grammar::JsonSchema(text),
                "regex" => Grammar::Regex(text),
                "lark" => Grammar::Lark(text),
                k => return Err(JsError::new(&format!("grammar: unknown kind `{k}`"))),
            };
            Ok(WasmGrammar {
                inner: self
                    .inner
                    .processor(&g)
                    .map_err(|e| JsError::new(&e.to_string()))?,
            })
        }
    }

    /// A grammar as a logits processor: `process(logits, ids)` bans what it cannot take next.
    #[cfg(feature = "guidance")]
    #[wasm_bindgen]
    pub struct WasmGrammar {
        inner: crate::guidance::GrammarProcessor,
    }

    #[cfg(feature = "guidance")]
    #[wasm_bindgen]
    impl WasmGrammar {
        /// Feeds the ids chosen since the last call (the first call's `ids` are the prompt)
        /// and sets every id the grammar cannot take next to `-Infinity`, in place.
        pub fn process(&mut self, logits: &mut [f32], ids: Vec<f64>) -> Result<(), JsError> {
            use nxrt_core::genai::LogitsProcessor;
            let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
            self.inner
                .process(logits, &ids)
                .map_err(|e| JsError::new(&e.to_string()))
        }
    }

    /// Streamed text checked against stop strings (core's `StopText`).
    #[wasm_bindgen]
    pub struct WasmStopText {
        inner: StopText,
    }

    #[wasm_bindgen]
    impl WasmStopText {
        #[wasm_bindgen(constructor)]
        pub fn new(stops: Vec<String>) -> WasmStopText {
            WasmStopText {
                inner: StopText::new(stops),
            }
        }

        /// Appends a piece; returns the text that can be shown now (never a stop string or a
        /// tail that may still become one).
        pub fn push(&mut self, piece: &str) -> String {
            self.inner.push(piece).to_string()
        }

        /// Whether a stop string has matched.
        pub fn stopped(&self) -> bool {
            self.inner.stopped()
        }

        /// The held-back text, shown once the generation ends without a match.
        pub fn finish(&mut self) -> String {
            self.inner.finish().to_string()
        }

        /// The text so far (after a match: the text before the stop string).
        pub fn text(&self) -> String {
            self.inner.text().to_string()
        }
    }
}
