//! Constrained decoding (`nxrt::guidance`, llguidance behind the `guidance` feature) on the
//! `llama_bench_fp32` folder of `$NXRT_CACHE/genai` (a random-weight Llama with a Llama 2
//! SentencePiece-style tokenizer of 32 000 ids, from `../shared/genai/fetch_genai.sh`).
//!
//! The mask is checked against a direct computation from the vocabulary (the ids whose bytes
//! are all digits, for `[0-9]+`), and whole generations are checked by parsers that are not
//! llguidance's (the `regex` crate, serde_json). The random decoder left alone produces text
//! that matches none of the grammars, which the tests check too, so a mask that does nothing
//! fails them.

use std::path::PathBuf;

use nxrt::genai::{FinishReason, GenOptions, Generator, LogitsProcessor, Prompt};
use nxrt::guidance::Grammar;
use nxrt::tokenizer::Tokenizer;
use nxrt_tests::{cache_dir, nxrt_bin, nxrt_json};

fn folder() -> PathBuf {
    let dir = cache_dir().join("genai/models/llama_bench_fp32");
    assert!(
        dir.join("tokenizer.json").exists(),
        "no {}: run ../shared/genai/fetch_genai.sh (the README's test command does)",
        dir.display()
    );
    dir
}

/// A Llama 2 vocabulary string's bytes: `<0xHH>` is one byte, `▁` a space.
fn token_bytes(tok: &str) -> Vec<u8> {
    if tok.len() == 6 && tok.starts_with("<0x") && tok.ends_with('>') {
        return vec![u8::from_str_radix(&tok[3..5], 16).unwrap()];
    }
    tok.replace('\u{2581}', " ").into_bytes()
}

const EOS: i64 = 2;

#[test]
fn the_mask_for_digits_is_exactly_the_digit_tokens() {
    let dir = folder();
    let tok = Tokenizer::from_path(&dir).unwrap();
    let guidance = nxrt::guidance::from_path(&dir, &[EOS]).unwrap();
    let n = tok.vocab_size();
    assert_eq!(guidance.vocab_size(), n);
    let mut p = guidance
        .processor(&Grammar::Regex("[0-9]+".into()))
        .unwrap();
    let allowed = p.allowed(n + 7).unwrap();
    // direct: ordinary (non-special) ids whose bytes are one or more ASCII digits
    let special = |id: u32| id < 3; // <unk>, <s>, </s>
    let digits = |id: u32| {
        let b = token_bytes(&tok.id_to_token(id).unwrap());
        !special(id) && !b.is_empty() && b.iter().all(u8::is_ascii_digit)
    };
    let expect: Vec<bool> = (0..n as u32).map(digits).collect();
    let count = expect.iter().filter(|&&e| e).count();
    assert!(
        count >= 10,
        "the vocabulary has at least the ten digits ({count})"
    );
    for id in 0..n {
        assert_eq!(
            allowed[id],
            expect[id],
            "id {id} {:?}",
            tok.id_to_token(id as u32)
        );
    }
    assert!(
        allowed[n..].iter().all(|&a| !a),
        "ids past the vocabulary are never allowed"
    );
    assert!(
        !allowed[EOS as usize],
        "an empty output does not match [0-9]+"
    );

    // after a digit: digits again, and the end
    let one = tok.encode("1", false).unwrap().ids;
    let one = *one.iter().find(|&&id| digits(id)).expect("a digit token");
    let mut logits = vec![0.0f32; n];
    p.process(&mut logits, &[1, 450]).unwrap(); // first step: the history is the prompt
    let mut logits = vec![0.0f32; n];
    p.process(&mut logits, &[1, 450, one as i64]).unwrap();
    for id in 0..n {
        let ok = expect[id] || id == EOS as usize;
        assert_eq!(logits[id] == 0.0, ok, "id {id} after a digit");
    }
}

fn generator() -> Generator {
    Generator::from_folder(folder(), &nxrt::Session::builder()).unwrap()
}

/// Greedy text after `prompt`, with the grammar when there is one.
fn run(g: &mut Generator, grammar: Option<&Grammar>, max: usize) -> (String, FinishReason) {
    let opts = GenOptions {
        max_new_tokens: max,
        ..GenOptions::default()
    };
    let processors: Vec<Box<dyn LogitsProcessor>> = match grammar {
        Some(gr) => vec![Box::new(g.guidance().unwrap().processor(gr).unwrap())],
        None => Vec::new(),
    };
    let r = g
        .generate_text_with(
            Prompt::Text("The answer is"),
            &opts,
            &[],
            processors,
            |_| {},
        )
        .unwrap();
    println!(
        "{grammar:?}: {:?} ({:?})",
        r.text, r.generation.finish_reason
    );
    (r.text, r.generation.finish_reason)
}

#[test]
fn generations_follow_regexes_json_schemas_and_lark_grammars() {
    let mut g = generator();
    let t = std::time::Instant::now();
    g.guidance().unwrap();
    println!(
        "the vocabulary prepared in {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let (free, _) = run(&mut g, None, 24);

    let rx = r"(yes|no), [a-z]{2,6}( [a-z]{2,6}){0,2}\.";
    let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    assert!(
        !full.is_match(&free),
        "the free text already matches: {free:?}"
    );
    let (text, why) = run(&mut g, Some(&Grammar::Regex(rx.into())), 48);
    assert!(full.is_match(&text), "{text:?} does not match {rx}");
    assert_eq!(why, FinishReason::Eos, "{text:?}");

    let schema = r#"{"type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "ok": {"type": "boolean"},
            "level": {"enum": ["low", "mid", "high"]}},
        "required": ["name", "ok", "level"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false}}"#;
    assert!(serde_json::from_str::<serde_json::Value>(&free).is_err());
    let (text, why) = run(&mut g, Some(&Grammar::JsonSchema(schema.into())), 64);
    assert_eq!(why, FinishReason::Eos, "{text:?}");
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 3, "{text}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 8, "{text}");
    assert!(o["ok"].is_boolean(), "{text}");
    assert!(
        ["low", "mid", "high"].contains(&o["level"].as_str().unwrap()),
        "{text}"
    );

    let lark =
        "start: \"(\" expr \")\"\nexpr: num | num \"+\" num | num \"*\" num\nnum: /[0-9]{1,3}/\n";
    let sum = regex::Regex::new(r"^\([0-9]{1,3}([+*][0-9]{1,3})?\)$").unwrap();
    assert!(!sum.is_match(&free));
    let (text, why) = run(&mut g, Some(&Grammar::Lark(lark.into())), 48);
    assert!(sum.is_match(&text), "{text:?}");
    assert_eq!(why, FinishReason::Eos, "{text:?}");
}

#[test]
fn bad_grammars_are_errors_before_decoding() {
    let guidance = nxrt::guidance::from_path(folder(), &[EOS]).unwrap();
    for bad in [
        Grammar::Regex("(unclosed".into()),
        Grammar::JsonSchema("{not json".into()),
        Grammar::JsonSchema(r#"{"type": "no-such-type"}"#.into()),
        Grammar::Lark("start: undefined_rule\n".into()),
    ] {
        let e = guidance.processor(&bad).err();
        assert!(e.is_some(), "{bad:?} compiled");
    }
    assert!(
        nxrt::guidance::from_path(folder(), &[]).is_err(),
        "no end-of-sequence id"
    );
    assert!(
        nxrt::guidance::from_path(folder(), &[1 << 40]).is_err(),
        "an id past the vocabulary"
    );
}

#[test]
fn the_cli_takes_a_regex_a_schema_and_a_grammar_file() {
    let dir = folder();
    let dir = dir.to_str().unwrap();
    let gen = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            dir,
            "--prompt",
            "Name:",
            "--max-new-tokens",
            "40",
            "--json",
        ];
        args.extend_from_slice(extra);
        nxrt_json(&args)
    };
    let rx = "[A-Z][a-z]{2,7} [A-Z][a-z]{2,9}";
    let j = gen(&["--regex", rx]);
    let text = j["text"].as_str().unwrap();
    assert!(
        regex::Regex::new(&format!("^(?:{rx})$"))
            .unwrap()
            .is_match(text),
        "{j}"
    );
    assert_eq!(j["finish_reason"], "eos", "{j}");

    let schema = r#"{"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 2, "maxItems": 4, "x-guidance": {"whitespace_flexible": false}}"#;
    let file = std::env::temp_dir().join(format!("nxrt-schema-{}.json", std::process::id()));
    std::fs::write(&file, schema).unwrap();
    for arg in [schema, file.to_str().unwrap()] {
        let j = gen(&["--json-schema", arg]);
        let v: serde_json::Value = serde_json::from_str(j["text"].as_str().unwrap()).unwrap();
        let items = v.as_array().unwrap_or_else(|| panic!("{j}"));
        assert!((2..=4).contains(&items.len()), "{j}");
        assert!(
            items
                .iter()
                .all(|x| (0..=99).contains(&x.as_i64().unwrap())),
            "{j}"
        );
    }
    let lark = file.with_extension("lark");
    std::fs::write(
        &lark,
        "start: word \".\"\nword: \"ab\" | \"ba\" | \"aab\"\n",
    )
    .unwrap();
    let j = gen(&["--grammar", lark.to_str().unwrap()]);
    let text = j["text"].as_str().unwrap();
    assert!(["ab.", "ba.", "aab."].contains(&text), "{j}");
    assert_eq!(j["finish_reason"], "eos", "{j}");
    let _ = (std::fs::remove_file(&file), std::fs::remove_file(&lark));

    // a grammar that does not compile is a one-line error before decoding
    let out = std::process::Command::new(nxrt_bin())
        .args(["generate", dir, "--prompt", "x", "--regex", "(unclosed"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("grammar") && err.contains("unclosed"), "{err}");
    assert!(out.stdout.is_empty(), "nothing decoded: {:?}", out.stdout);
}

/// Tokenizers the grammar's vocabulary reader cannot take, or hostile ones, are typed errors:
/// never a panic, never a list as long as an absurd id.
#[test]
fn unsupported_and_hostile_tokenizers_are_typed_errors() {
    let bert = cache_dir().join("genai/tokenizers/bert/tokenizer.json");
    let bytes = std::fs::read(&bert).unwrap_or_else(|e| panic!("{}: {e}", bert.display()));
    let e = nxrt::guidance::Guidance::new(&bytes, &[102])
        .err()
        .expect("WordPiece refused");
    assert!(e.to_string().contains("byte-level"), "{e}");

    let base: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder().join("tokenizer.json")).unwrap()).unwrap();
    let hostile = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut j = base.clone();
        edit(&mut j);
        nxrt::guidance::Guidance::new(j.to_string().as_bytes(), &[EOS]).err()
    };
    let e = hostile(&|j| j["model"]["vocab"]["huge"] = 4_000_000_000u64.into()).expect("huge id");
    assert!(e.to_string().contains("4000000000"), "{e}");
    let e = hostile(&|j| j["model"]["vocab"]["<0xZZ>"] = 31999.into()).expect("bad byte token");
    assert!(e.to_string().contains("<0xZZ>"), "{e}");
    let e = hostile(&|j| j["model"]["vocab"]["neg"] = (-5).into()).expect("negative id");
    assert!(e.to_string().contains("-5"), "{e}");
    assert!(hostile(&|_| {}).is_none(), "the file itself is fine");
}
