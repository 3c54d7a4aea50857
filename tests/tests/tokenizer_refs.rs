//! Tokenizers against HF `tokenizers` (`$NXRT_CACHE/genai/tokenizers/refs.json`, from
//! `../shared/genai/fetch_genai.sh`): for every tokenizer (byte-level BPE, SentencePiece-style
//! BPE with byte fallback, WordPiece, and a model folder's file) and every text of the suite,
//! `nxrt tokenize --text` must print HF's ids and tokens and `nxrt tokenize --decode` HF's
//! decoded text. Then streaming decode, hostile files, and text prompts and stop strings in
//! `nxrt generate`.

use std::path::{Path, PathBuf};
use std::process::Command;

use nxrt::tokenizer::{Tokenizer, MAX_TOKENIZER_BYTES};
use nxrt::Error;
use nxrt_tests::{cache_dir, nxrt_bin, nxrt_json};
use serde_json::Value as Json;

fn refs() -> (PathBuf, Json) {
    let dir = cache_dir().join("genai/tokenizers");
    let path = dir.join("refs.json");
    assert!(
        path.exists(),
        "no {}: run ../shared/genai/fetch_genai.sh (the README's test command does)",
        path.display()
    );
    (
        dir,
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap(),
    )
}

/// Each tokenizer's name, path (file or folder) and cases (each with its `text` added).
fn tokenizers() -> Vec<(String, PathBuf, Vec<Json>)> {
    let (dir, j) = refs();
    let base = dir.parent().unwrap();
    let texts: std::collections::HashMap<&str, &Json> = j["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), &t["text"]))
        .collect();
    let all = j["tokenizers"].as_object().unwrap();
    assert!(all.len() >= 4, "refs.json lists {} tokenizers", all.len());
    all.iter()
        .map(|(name, t)| {
            let path = base.join(t["path"].as_str().unwrap());
            let mut cases = t["cases"].as_array().unwrap().clone();
            for c in cases.iter_mut() {
                let text = texts[c["name"].as_str().unwrap()].clone();
                c["text"] = text;
            }
            (name.clone(), path, cases)
        })
        .collect()
}

fn u32s(j: &Json) -> Vec<u32> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn cli_matches_hf_tokenizers_on_every_tokenizer_and_text() {
    let mut checked = 0;
    for (name, path, cases) in tokenizers() {
        let p = path.to_str().unwrap();
        for case in &cases {
            let text = case["text"].as_str().unwrap();
            let want_ids = u32s(&case["ids"]);
            let got = nxrt_json(&["tokenize", p, &format!("--text={text}"), "--json"]);
            let ctx = format!("{name} / {}", case["name"]);
            assert_eq!(u32s(&got["ids"]), want_ids, "{ctx}: ids");
            assert_eq!(got["tokens"], case["tokens"], "{ctx}: tokens");
            let list: Vec<String> = want_ids.iter().map(u32::to_string).collect();
            let got = nxrt_json(&["tokenize", p, "--decode", &list.join(","), "--json"]);
            assert_eq!(got["text"], case["decoded"], "{ctx}: decoded text");
            checked += 1;
        }
        assert!(cases.len() >= 40, "{name}: {} cases", cases.len());
    }
    println!("{checked} texts encoded and decoded as HF tokenizers does");
}

#[test]
fn streamed_pieces_join_to_the_decoded_text() {
    for (name, path, cases) in tokenizers() {
        let tok = Tokenizer::from_path(&path).unwrap();
        let mut split_chars = 0;
        for case in &cases {
            let ids = u32s(&case["ids"]);
            let mut stream = tok.stream(true);
            let mut joined = String::new();
            for &id in &ids {
                if let Some(piece) = stream.step(id).unwrap() {
                    joined.push_str(&piece);
                } else {
                    split_chars += 1;
                }
            }
            assert_eq!(
                joined,
                case["decoded"].as_str().unwrap(),
                "{name} / {}",
                case["name"]
            );
        }
        println!("{name}: {split_chars} ids held back until a later id completed their text");
    }
}

fn tokenizer_err(r: Result<Tokenizer, Error>) -> String {
    match r {
        Err(e @ Error::Tokenizer(_)) => e.to_string(),
        Err(e) => panic!("expected a tokenizer error, got {e}"),
        Ok(_) => panic!("a hostile tokenizer file was accepted"),
    }
}

#[test]
fn hostile_tokenizer_files_give_typed_errors() {
    let tmp = std::env::temp_dir().join(format!("nxrt-tok-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("model")).unwrap();
    // not JSON, and JSON that is not a tokenizer
    for bytes in [&b"\x00\xffnot json"[..], b"{\"model\": 42}", b"[]"] {
        let msg = tokenizer_err(Tokenizer::from_bytes(bytes));
        assert!(!msg.is_empty());
    }
    // a BPE whose merge names a missing token
    let bad_merge = br#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
        "model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]}}"#;
    tokenizer_err(Tokenizer::from_bytes(bad_merge));
    // over the size limit (a sparse file: nothing is read)
    let big = tmp.join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_TOKENIZER_BYTES + 1)
        .unwrap();
    assert!(tokenizer_err(Tokenizer::from_path(&big)).contains("over the limit"));
    // a folder whose tokenizer.json leads out of it
    #[cfg(unix)]
    {
        let (_, path, _) = tokenizers().remove(0);
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path
        };
        std::os::unix::fs::symlink(&file, tmp.join("model/tokenizer.json")).unwrap();
        let msg = tokenizer_err(Tokenizer::from_path(tmp.join("model")));
        assert!(msg.contains("outside its folder"), "{msg}");
        // the file itself, named directly, is fine
        Tokenizer::from_path(&file).unwrap();
    }
    // a folder without one
    std::fs::create_dir_all(tmp.join("empty")).unwrap();
    assert!(matches!(
        Tokenizer::from_path(tmp.join("empty")),
        Err(Error::Io(_))
    ));
    // the CLI reports the kind
    let out = Command::new(nxrt_bin())
        .args(["tokenize", big.to_str().unwrap(), "--text", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("error[tokenizer]"));
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// The model folder of the tokenizer suite (`nxrt tokenize DIR`), with its reference cases.
fn model_folder() -> (PathBuf, Vec<Json>) {
    tokenizers()
        .into_iter()
        .find(|(_, p, _)| p.join("genai_config.json").exists())
        .map(|(_, p, c)| (p, c))
        .expect("refs.json lists a model folder")
}

fn generate(dir: &Path, extra: &[&str]) -> Json {
    let mut args = vec!["generate", dir.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    nxrt_json(&args)
}

#[test]
fn generate_takes_text_prompts_and_stops_at_stop_strings() {
    let (dir, cases) = model_folder();
    let case = cases
        .iter()
        .find(|c| c["ids"].as_array().unwrap().len() >= 6)
        .unwrap();
    let prompt = case["text"].as_str().unwrap();
    let n = "24";
    let free = generate(
        &dir,
        &[
            &format!("--prompt={prompt}"),
            "--max-new-tokens",
            n,
            "--min-new-tokens",
            n,
        ],
    );
    // the prompt is encoded as HF does
    assert_eq!(free["prompt_ids"], case["ids"]);
    let tokens = u32s(&free["tokens"]);
    assert_eq!(tokens.len(), 24);
    // the text is the decoded tokens
    let list: Vec<String> = tokens.iter().map(u32::to_string).collect();
    let p = dir.to_str().unwrap();
    let decoded = nxrt_json(&["tokenize", p, "--decode", &list.join(","), "--json"]);
    let text = free["text"].as_str().unwrap();
    assert_eq!(free["text"], decoded["text"]);
    assert_eq!(free["finish_reason"], "length");

    // a stop string from the middle of that text: the same tokens up to the one completing
    // it, the text cut before it
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    assert!(chars.len() > 8, "too little text to cut: {text:?}");
    let (a, b) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 3].0);
    let stop = &text[a..b];
    let first = text.find(stop).unwrap();
    let stopped = generate(
        &dir,
        &[
            &format!("--prompt={prompt}"),
            "--max-new-tokens",
            n,
            "--stop",
            "never-in-this-text-\u{1}",
            &format!("--stop={stop}"),
        ],
    );
    assert_eq!(
        stopped["finish_reason"], "stop",
        "stop {stop:?} in {text:?}"
    );
    assert_eq!(stopped["text"].as_str().unwrap(), &text[..first]);
    let st = u32s(&stopped["tokens"]);
    assert!(st.len() < tokens.len() && tokens.starts_with(&st));

    // without --json the text streams to stdout, and is the same text
    let out = Command::new(nxrt_bin())
        .args(["generate", p, &format!("--prompt={prompt}")])
        .args(["--max-new-tokens", n, &format!("--stop={stop}")])
        .output()
        .unwrap();
    assert!(out.status.success());
    let streamed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(streamed.strip_suffix('\n').unwrap(), &text[..first]);

    // a prompt id outside the vocabulary is a typed error, before any run
    let out = Command::new(nxrt_bin())
        .args(["generate", p, "--prompt-ids", "1,999999", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error[input]") && err.contains("999999"),
        "{err}"
    );
}

/// Chat templates against HF `transformers`' `apply_chat_template`
/// (`$NXRT_CACHE/genai/chat_refs.json`, written by `scripts/chat_refs.py`, which the README's
/// test command runs): the llama3 folder's own template and templates exercising what
/// templates use, every conversation with and without the generation prompt: the same text,
/// the same ids (encoded without the post-processor's special tokens, as HF does), and an error
/// where HF raises. Then `nxrt tokenize --chat` and `nxrt generate --chat` on that folder's
/// template.
#[test]
fn chat_templates_render_as_transformers_does() {
    use nxrt::chat::{ChatTemplate, Message};
    let path = cache_dir().join("genai/chat_refs.json");
    assert!(
        path.exists(),
        "no {}: run scripts/chat_refs.py (the README's test command does)",
        path.display()
    );
    let r: Json = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let folder = cache_dir().join(r["folder"].as_str().unwrap());
    let tok = Tokenizer::from_path(&folder).unwrap();
    let own = ChatTemplate::from_folder(&folder)
        .unwrap()
        .expect("llama3 has a template");
    let tokens: Vec<(&str, &str)> = ["bos_token", "eos_token"]
        .iter()
        .map(|k| (*k, r["tokens"][k].as_str().unwrap()))
        .collect();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 40);
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let name = c["template"].as_str().unwrap();
        let t = match r["templates"].get(name) {
            Some(src) => ChatTemplate::new(src.as_str().unwrap(), &tokens),
            None => own.clone(),
        };
        let msgs: Vec<Message> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let got = t.render(&msgs, c["add_generation_prompt"].as_bool().unwrap());
        match (&got, c.get("text")) {
            (Ok(text), Some(want)) => {
                if text != want.as_str().unwrap() {
                    failures.push(format!("case {i} ({name}): {text:?} != {want}"));
                    continue;
                }
                let ids: Vec<u64> = tok
                    .encode(text, false)
                    .unwrap()
                    .ids
                    .iter()
                    .map(|&x| x as u64)
                    .collect();
                let want: Vec<u64> = c["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect();
                if ids != want {
                    failures.push(format!("case {i} ({name}): ids {ids:?} != {want:?}"));
                }
            }
            (Err(e), None) => assert!(
                matches!(e, Error::Tokenizer(_)),
                "case {i}: a typed error, got {e:?}"
            ),
            (got, _) => failures.push(format!("case {i} ({name}): {got:?} vs {c}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        cases.iter().any(|c| c.get("error").is_some()),
        "the references include a template that raises"
    );

    // the CLI: tokenize --chat prints the folder template's ids and text
    let c = cases
        .iter()
        .find(|c| {
            c["template"] == "llama3"
                && c["add_generation_prompt"] == true
                && c["messages"].as_array().unwrap().len() == 2
        })
        .unwrap();
    let m = c["messages"].as_array().unwrap();
    let j = nxrt_json(&[
        "tokenize",
        folder.to_str().unwrap(),
        "--system",
        m[0]["content"].as_str().unwrap(),
        "--chat",
        m[1]["content"].as_str().unwrap(),
        "--json",
    ]);
    assert_eq!(j["ids"], c["ids"]);
    assert_eq!(j["text"], c["text"]);
    // generate --chat: the prompt is the template's text encoded as written (a copy of the
    // tiny decoder's folder given a template of our own)
    let src = cache_dir().join("corpus/tiny_llama_genai_fp32");
    let dir = std::env::temp_dir().join(format!("nxrt-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    let tmpl = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}\
                {% if add_generation_prompt %}assistant:{% endif %}";
    let mut cfg: Json = serde_json::from_slice(
        &std::fs::read(dir.join("tokenizer_config.json")).unwrap_or_else(|_| b"{}".to_vec()),
    )
    .unwrap();
    cfg["chat_template"] = Json::from(tmpl);
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let j = nxrt_json(&[
        "generate",
        dir.to_str().unwrap(),
        "--chat",
        "what now",
        "--max-new-tokens",
        "2",
        "--json",
    ]);
    let t = ChatTemplate::from_folder(&dir).unwrap().unwrap();
    let text = t.render(&[Message::new("user", "what now")], true).unwrap();
    assert_eq!(text, "user: what now assistant:");
    let want: Vec<u64> = Tokenizer::from_path(&dir)
        .unwrap()
        .encode(&text, false)
        .unwrap()
        .ids
        .iter()
        .map(|&x| x as u64)
        .collect();
    let got: Vec<u64> = j["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).ok();
    // a folder without a template: a typed one-line error
    let out = Command::new(nxrt_bin())
        .args(["tokenize"])
        .arg(cache_dir().join("genai/tokenizers/llama2"))
        .args(["--chat", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no chat template"));
}
