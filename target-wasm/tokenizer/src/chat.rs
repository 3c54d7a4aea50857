//! Chat templates: the Jinja template of a model folder's `tokenizer_config.json`
//! (`chat_template`: a string, or a list of named templates of which `default` is taken; or a
//! `chat_template.jinja` file beside it) rendered as HF `transformers`' `apply_chat_template`
//! renders it: blocks trimmed (`trim_blocks`, `lstrip_blocks`), the conversation as `messages`
//! (maps with `role` and `content`), `add_generation_prompt`, the special tokens the config
//! names (`bos_token`, `eos_token`, `unk_token`, `pad_token`), `raise_exception(message)`,
//! `tojson` as Python's `json.dumps` writes it (non-ASCII kept, `indent`), and Python's string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`...). The rendered text is then
//! encoded without the post-processor's special tokens (the template writes them), as
//! `apply_chat_template(..., tokenize=True)` does.
//!
//! Tools, documents and `strftime_now` are not supported: a template that uses them renders
//! with them undefined (or fails with a typed error naming the template's problem).

use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};

use nxrt_core::{Error, Result};

/// The largest tokenizer_config.json or chat_template.jinja read.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A model folder's chat template with the special tokens its config names.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    tokens: Vec<(String, String)>,
}

fn read_small(path: &Path) -> Result<String> {
    let meta =
        std::fs::metadata(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(Error::Tokenizer(format!(
            "{} has {} bytes, over the limit of {MAX_CONFIG_BYTES}",
            path.display(),
            meta.len()
        )));
    }
    std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
}

/// A special token as a config writes it: a string, or an added-token object's `content`.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// The template of a model folder: `tokenizer_config.json`'s `chat_template`, else
    /// `chat_template.jinja`; `None` when the folder has neither.
    pub fn from_folder(dir: impl AsRef<Path>) -> Result<Option<ChatTemplate>> {
        let dir = dir.as_ref();
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.is_file() {
            Some(read_small(&cfg_path)?)
        } else {
            None
        };
        let jinja = dir.join("chat_template.jinja");
        let jinja = if jinja.is_file() {
            Some(read_small(&jinja)?)
        } else {
            None
        };
        Self::from_config(cfg.as_deref(), jinja.as_deref()).map_err(|e| match e {
            Error::Tokenizer(d) => Error::Tokenizer(format!("{}: {d}", dir.display())),
            e => e,
        })
    }

    /// The template a folder's files give: `tokenizer_config` (the text of
    /// tokenizer_config.json) and `jinja` (of chat_template.jinja), either absent; the config's
    /// `chat_template` is taken first. `None` when neither has a template.
    pub fn from_config(
        tokenizer_config: Option<&str>,
        jinja: Option<&str>,
    ) -> Result<Option<ChatTemplate>> {
        let cfg: serde_json::Value = match tokenizer_config {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| Error::Tokenizer(format!("tokenizer_config.json: {e}")))?,
            None => serde_json::Value::Null,
        };
        let source = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => {
                let named = |n: &str| {
                    list.iter()
                        .find(|t| t.get("name").and_then(|x| x.as_str()) == Some(n))
                };
                let t = named("default").ok_or_else(|| {
                    Error::Tokenizer(
                        "tokenizer_config.json: chat_template is a list without a 'default' template"
                            .into(),
                    )
                })?;
                t.get("template")
                    .and_then(|x| x.as_str())
                    .map(str::to_string)
            }
            _ => None,
        };
        let Some(source) = source.or_else(|| jinja.map(str::to_string)) else {
            return Ok(None);
        };
        let tokens = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .into_iter()
            .filter_map(|k| Some((k.to_string(), token_text(cfg.get(k)?)?)))
            .collect();
        Ok(Some(ChatTemplate { source, tokens }))
    }

    /// A template from its source, with the special tokens it may name.
    pub fn new(source: impl Into<String>, tokens: &[(&str, &str)]) -> ChatTemplate {
        ChatTemplate {
            source: source.into(),
            tokens: tokens
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The template's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The conversation as the template writes it; with `add_generation_prompt`, followed by
    /// what opens the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| Error::Tokenizer(format!("chat template syntax: {e}")))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_filter("tojson", tojson);
        let tmpl = env
            .template_from_str(&self.source)
            .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))?;
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(msgs)),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
        ];
        for (k, v) in &self.tokens {
            ctx.push((k.clone(), Value::from(v.as_str())));
        }
        tmpl.render(Value::from_pairs(ctx))
            .map_err(|e| Error::Tokenizer(format!("chat template: {e}")))
    }
}

/// `tojson` as HF's renderer defines it: Python's `json.dumps(x, ensure_ascii=False)`, with
/// `indent` (and Python's item separators, `", "` and `": "`, without it); maps keep their
/// order.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_py_json(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Python's `json.dumps` layout (`ensure_ascii=False`) of a template value.
fn write_py_json(
    v: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    use minijinja::value::ValueKind as K;
    let newline = |out: &mut String, d: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * d));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    let json_str = |s: &str| serde_json::to_string(s).unwrap_or_default();
    match v.kind() {
        K::Undefined | K::None => out.push_str("null"),
        K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        K::String => out.push_str(&json_str(v.as_str().unwrap_or_default())),
        K::Number => match (i64::try_from(v.clone()), f64::try_from(v.clone())) {
            (Ok(i), _) if v.is_integer() => out.push_str(&i.to_string()),
            // Python writes floats with a fraction or an exponent (1.0, not 1)
            (_, Ok(f)) => out.push_str(&format!("{f:?}")),
            _ => out.push_str(&v.to_string()),
        },
        K::Seq | K::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_py_json(x, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        K::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&json_str(&k.to_string()));
                out.push_str(": ");
                write_py_json(&v.get_item(k)?, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => out.push_str(&json_str(&v.to_string())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config's list of named templates (the `default` one is taken), special tokens written
    /// as added-token objects, and a list without `default` refused with a typed error.
    #[test]
    fn named_templates_and_token_objects_are_read() {
        let dir = std::env::temp_dir().join(format!("nxrt-chat-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = serde_json::json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}
            ]
        });
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let t = ChatTemplate::from_folder(&dir).unwrap().unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "x")], false).unwrap(),
            "<s>x</s>"
        );
        let cfg = serde_json::json!({"chat_template": [{"name": "tool_use", "template": "t"}]});
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        assert!(matches!(
            ChatTemplate::from_folder(&dir),
            Err(Error::Tokenizer(_))
        ));
        std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
        assert!(ChatTemplate::from_folder(&dir).unwrap().is_none());
        std::fs::remove_dir_all(&dir).ok();
    }
}
