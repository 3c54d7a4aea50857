//! A decoder folder's description: onnxruntime-genai's `genai_config.json` (the decoder file,
//! its input and output names, head counts and sizes, the special ids, the search defaults), or
//! a transformers.js / Optimum folder's `config.json` and `generation_config.json` (a decoder
//! with `past_key_values.N.key|value` inputs and `present.N.key|value` outputs).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::Value as Json;

use crate::error::{Error, Result};

/// Search defaults a folder carries (`search` in genai_config.json).
#[derive(Clone, Debug, PartialEq)]
pub struct SearchDefaults {
    /// Prompt plus generated tokens, at most.
    pub max_length: Option<usize>,
    pub min_length: usize,
    pub do_sample: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub repetition_penalty: f32,
}

impl SearchDefaults {
    /// From genai_config.json's `search` or a generation_config.json (the same key names).
    fn from_json(j: &Json) -> SearchDefaults {
        let f = |key: &str, d: f64| j.get(key).and_then(Json::as_f64).unwrap_or(d) as f32;
        let n = |key: &str| j.get(key).and_then(Json::as_u64).map(|v| v as usize);
        SearchDefaults {
            max_length: n("max_length"),
            min_length: n("min_length").unwrap_or(0),
            do_sample: j.get("do_sample").and_then(Json::as_bool).unwrap_or(false),
            temperature: f("temperature", 1.0),
            top_k: n("top_k").unwrap_or(0),
            top_p: f("top_p", 1.0),
            repetition_penalty: f("repetition_penalty", 1.0),
        }
    }
}

/// What the generation engine needs to know about a decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// The model family (`llama`, `qwen2`, `phi3`, ...), for reports.
    pub model_type: String,
    /// The decoder's ONNX file, relative to the folder.
    pub filename: String,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
    pub input_ids: String,
    pub attention_mask: Option<String>,
    pub position_ids: Option<String>,
    /// A merged decoder's `use_cache_branch` input (fed `true` once a past exists).
    pub use_cache_branch: Option<String>,
    /// Name templates with `%d` for the layer.
    pub past_key: String,
    pub past_value: String,
    pub logits: String,
    pub present_key: String,
    pub present_value: String,
    pub search: SearchDefaults,
}

fn bad(what: impl core::fmt::Display) -> Error {
    Error::InvalidModel(format!("genai_config.json: {what}"))
}

fn usize_at(j: &Json, key: &str) -> Result<usize> {
    j.get(key)
        .and_then(Json::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| bad(format!("`{key}` must be a non-negative integer")))
}

fn str_at(j: &Json, key: &str) -> Option<String> {
    j.get(key).and_then(Json::as_str).map(ToString::to_string)
}

/// An id or a list of ids (`eos_token_id` takes both forms).
fn ids_at(j: &Json, key: &str) -> Result<Vec<i64>> {
    match j.get(key) {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| bad(format!("`{key}` holds a non-integer")))
            })
            .collect(),
        Some(v) => Ok(alloc::vec![v.as_i64().ok_or_else(|| bad(format!(
            "`{key}` must be an integer or a list"
        )))?]),
    }
}

impl DecoderConfig {
    /// Parses `genai_config.json`'s text.
    pub fn from_genai_json(text: &str) -> Result<DecoderConfig> {
        let root: Json = serde_json::from_str(text).map_err(|e| bad(format!("not JSON ({e})")))?;
        let model = root.get("model").ok_or_else(|| bad("no `model` object"))?;
        let dec = model
            .get("decoder")
            .ok_or_else(|| bad("no `model.decoder` object"))?;
        let inputs = dec.get("inputs").cloned().unwrap_or(Json::Null);
        let outputs = dec.get("outputs").cloned().unwrap_or(Json::Null);
        if inputs.get("past_names").is_some() {
            return Err(Error::Unsupported {
                ctx: Default::default(),
                detail: String::from(
                    "genai_config.json: a decoder with combined `past_names` (one tensor for \
                     keys and values); separate key and value names are supported",
                ),
            });
        }
        let name = |j: &Json, key: &str, default: &str| {
            str_at(j, key).unwrap_or_else(|| String::from(default))
        };
        let heads = usize_at(dec, "num_attention_heads")?;
        let search = root.get("search").cloned().unwrap_or(Json::Null);
        let cfg = DecoderConfig {
            model_type: str_at(model, "type").unwrap_or_default(),
            filename: str_at(dec, "filename").ok_or_else(|| bad("no `model.decoder.filename`"))?,
            layers: usize_at(dec, "num_hidden_layers")?,
            heads,
            kv_heads: dec
                .get("num_key_value_heads")
                .and_then(Json::as_u64)
                .map_or(heads, |v| v as usize),
            head_size: usize_at(dec, "head_size")?,
            hidden_size: usize_at(dec, "hidden_size")?,
            vocab_size: usize_at(model, "vocab_size")?,
            context_length: usize_at(model, "context_length")?,
            bos_token_id: model.get("bos_token_id").and_then(Json::as_i64),
            eos_token_ids: ids_at(model, "eos_token_id")?,
            pad_token_id: ids_at(model, "pad_token_id")?.first().copied(),
            input_ids: name(&inputs, "input_ids", "input_ids"),
            attention_mask: Some(name(&inputs, "attention_mask", "attention_mask")),
            position_ids: Some(name(&inputs, "position_ids", "position_ids")),
            use_cache_branch: None,
            past_key: name(&inputs, "past_key_names", "past_key_values.%d.key"),
            past_value: name(&inputs, "past_value_names", "past_key_values.%d.value"),
            logits: name(&outputs, "logits", "logits"),
            present_key: name(&outputs, "present_key_names", "present.%d.key"),
            present_value: name(&outputs, "present_value_names", "present.%d.value"),
            search: SearchDefaults::from_json(&search),
        };
        if cfg.layers == 0 || cfg.heads == 0 || cfg.kv_heads == 0 || cfg.head_size == 0 {
            return Err(bad(
                "layer and head counts and the head size must be positive",
            ));
        }
        for t in [
            &cfg.past_key,
            &cfg.past_value,
            &cfg.present_key,
            &cfg.present_value,
        ] {
            if t.matches("%d").count() != 1 {
                return Err(bad(format!("name template `{t}` must hold one `%d`")));
            }
        }
        Ok(cfg)
    }

    /// Reads a transformers.js / Optimum folder's `config.json` (its `text_config` when it has
    /// one) and `generation_config.json` (special ids and search defaults, which take
    /// precedence), for the decoder file `filename` with the Optimum names: `input_ids`,
    /// `attention_mask`, `position_ids`, `use_cache_branch` (each used when the decoder has
    /// it), `past_key_values.%d.key|value`, `logits`, `present.%d.key|value`.
    pub fn from_hf_config(
        config: &str,
        generation: Option<&str>,
        filename: &str,
    ) -> Result<DecoderConfig> {
        let bad = |w: String| Error::InvalidModel(format!("config.json: {w}"));
        let root: Json =
            serde_json::from_str(config).map_err(|e| bad(format!("not JSON ({e})")))?;
        let gen: Json = match generation {
            Some(t) => serde_json::from_str(t).map_err(|e| {
                Error::InvalidModel(format!("generation_config.json: not JSON ({e})"))
            })?,
            None => Json::Null,
        };
        let c = root.get("text_config").unwrap_or(&root);
        let first = |keys: &[&str]| keys.iter().find_map(|k| c.get(*k).and_then(Json::as_u64));
        let need = |keys: &[&str]| {
            first(keys)
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("no `{}`", keys[0])))
        };
        let layers = need(&["num_hidden_layers", "n_layer", "num_layers"])?;
        let heads = need(&["num_attention_heads", "n_head"])?;
        let hidden = need(&["hidden_size", "n_embd", "d_model"])?;
        let kv_heads = match first(&["num_key_value_heads"]) {
            Some(v) => v as usize,
            None if c.get("multi_query").and_then(Json::as_bool) == Some(true) => 1,
            None => heads,
        };
        let head_size = match first(&["head_dim"]) {
            Some(v) => v as usize,
            None if heads > 0 => hidden / heads,
            None => 0,
        };
        // special ids: generation_config.json first (as transformers reads them), then config
        let pick = |key: &str| -> Result<Vec<i64>> {
            let g = ids_at(&gen, key)?;
            if g.is_empty() {
                ids_at(c, key).or_else(|_| ids_at(&root, key))
            } else {
                Ok(g)
            }
        };
        let cfg = DecoderConfig {
            model_type: str_at(c, "model_type")
                .or_else(|| str_at(&root, "model_type"))
                .unwrap_or_default(),
            filename: filename.into(),
            layers,
            heads,
            kv_heads,
            head_size,
            hidden_size: hidden,
            vocab_size: need(&["vocab_size"])?,
            context_length: first(&["max_position_embeddings", "n_positions", "seq_length"])
                .map_or(2048, |v| v as usize),
            bos_token_id: pick("bos_token_id")?.first().copied(),
            eos_token_ids: pick("eos_token_id")?,
            pad_token_id: pick("pad_token_id")?.first().copied(),
            input_ids: "input_ids".into(),
            attention_mask: Some("attention_mask".into()),
            position_ids: Some("position_ids".into()),
            use_cache_branch: Some("use_cache_branch".into()),
            past_key: "past_key_values.%d.key".into(),
            past_value: "past_key_values.%d.value".into(),
            logits: "logits".into(),
            present_key: "present.%d.key".into(),
            present_value: "present.%d.value".into(),
            search: SearchDefaults::from_json(&gen),
        };
        if cfg.layers == 0 || cfg.heads == 0 || cfg.kv_heads == 0 || cfg.head_size == 0 {
            return Err(bad(
                "layer and head counts and the head size must be positive".into(),
            ));
        }
        Ok(cfg)
    }

    /// A name template (`past_key_values.%d.key`) for layer `i`.
    pub fn layer_name(template: &str, i: usize) -> String {
        template.replacen("%d", &format!("{i}"), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = r#"{"model": {"bos_token_id": 1, "context_length": 2048,
        "decoder": {"filename": "model.onnx", "head_size": 64, "hidden_size": 512,
          "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                     "past_key_names": "past_key_values.%d.key",
                     "past_value_names": "past_key_values.%d.value"},
          "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                      "present_value_names": "present.%d.value"},
          "num_attention_heads": 8, "num_hidden_layers": 8, "num_key_value_heads": 2},
        "eos_token_id": [2, 32000], "pad_token_id": 0, "type": "llama", "vocab_size": 32000},
      "search": {"max_length": 2048, "min_length": 3, "top_k": 50, "temperature": 0.7}}"#;

    #[test]
    fn reads_an_onnxruntime_genai_config() {
        let c = DecoderConfig::from_genai_json(CFG).unwrap();
        assert_eq!((c.layers, c.heads, c.kv_heads, c.head_size), (8, 8, 2, 64));
        assert_eq!(c.eos_token_ids, alloc::vec![2, 32000]);
        assert_eq!((c.bos_token_id, c.pad_token_id), (Some(1), Some(0)));
        assert_eq!(
            DecoderConfig::layer_name(&c.past_value, 7),
            "past_key_values.7.value"
        );
        assert_eq!(c.search.min_length, 3);
        assert_eq!(c.search.top_k, 50);
        assert!((c.search.temperature - 0.7).abs() < 1e-6);
    }

    #[test]
    fn reads_a_transformers_config_with_generation_defaults() {
        let cfg = r#"{"model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "hidden_size": 896, "vocab_size": 151936,
            "max_position_embeddings": 32768, "bos_token_id": 151643, "eos_token_id": 151643}"#;
        let gen = r#"{"eos_token_id": [151645, 151643], "do_sample": true, "top_k": 20,
            "top_p": 0.8, "temperature": 0.7}"#;
        let c = DecoderConfig::from_hf_config(cfg, Some(gen), "onnx/model.onnx").unwrap();
        assert_eq!(
            (c.layers, c.heads, c.kv_heads, c.head_size),
            (24, 14, 2, 64)
        );
        assert_eq!(c.eos_token_ids, alloc::vec![151645, 151643]);
        assert_eq!(c.bos_token_id, Some(151643));
        assert_eq!((c.context_length, c.vocab_size), (32768, 151936));
        assert!(c.search.do_sample && c.search.top_k == 20);
        assert_eq!(c.filename, "onnx/model.onnx");
        assert_eq!(c.model_type, "qwen2");
        // without generation_config.json, config.json's ids; a nested text_config
        let nested = alloc::format!(r#"{{"model_type": "x", "text_config": {cfg}}}"#);
        let c = DecoderConfig::from_hf_config(&nested, None, "model.onnx").unwrap();
        assert_eq!(c.eos_token_ids, alloc::vec![151643]);
        assert_eq!(c.layers, 24);
        assert!(DecoderConfig::from_hf_config("{}", None, "model.onnx").is_err());
        assert!(DecoderConfig::from_hf_config(cfg, Some("{"), "model.onnx").is_err());
    }

    #[test]
    fn rejects_what_it_cannot_use() {
        assert!(DecoderConfig::from_genai_json("{").is_err());
        let no_layers = CFG.replace("\"num_hidden_layers\": 8,", "");
        assert!(DecoderConfig::from_genai_json(&no_layers).is_err());
        let combined = CFG.replace("\"past_key_names\"", "\"past_names\"");
        assert!(matches!(
            DecoderConfig::from_genai_json(&combined),
            Err(Error::Unsupported { .. })
        ));
        let bad_template = CFG.replace("present.%d.key", "present.key");
        assert!(DecoderConfig::from_genai_json(&bad_template).is_err());
    }
}
