//! nxrt's benchmark suite (criterion): `cargo bench -p nxrt --bench suite`.
//!
//! `cargo bench -p nxrt --bench suite -- --list` lists every scenario; `-- --quick` runs each
//! briefly (what the test run does); a filter (`-- matmul/`) runs some. Scenario names follow
//! the ones the runtime our users come from reports (`matmul/medium_generic_f32_threads=1/
//! 32x512x512`), so figures line up. A scenario exists only where nxrt has the feature: a type
//! a kernel does not take is left out with a line saying so, never timed as a placeholder.
//! Scenarios that read the quantized set (`$NXRT_CACHE/quant`, written by the test run's
//! set-up) are left out with a line when it is absent.
//!
//! Single ops run through a whole `Session` (planned mode, inputs fed each run), so a figure
//! includes what a user's call pays: feeding, the executor, the output's allocation. Whole
//! models of the public corpus run as `model/NAME_threads=1/CASE` (`$NXRT_CACHE/corpus`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::path::PathBuf;

use common::{f32s, i64s, node, opset17_model, vi, xorshift_data};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use half::{bf16, f16};
use nxrt::{OptLevel, Session, Tensor};
use nxrt_core::genai::sampling::{candidates, candidates_full_sort};
use nxrt_core::genai::{KvPool, Sampler, SamplingOptions};
use nxrt_core::proto::{AttributeProto, GraphProto, NodeProto};

/// The machine's thread count (the `threads=N` scenarios).
fn all_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// ONNX element type codes.
const F32: i32 = 1;
const F16: i32 = 10;
const BF16: i32 = 16;
const I64: i32 = 7;

fn type_name(elem: i32) -> &'static str {
    match elem {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        _ => "other",
    }
}

/// A tensor of `shape` with deterministic values in [-1, 1) of element type `elem`.
fn tensor(elem: i32, shape: &[usize], seed: u32) -> Tensor {
    let v = xorshift_data(shape.iter().product(), seed);
    match elem {
        F16 => Tensor::from_vec(shape, v.iter().map(|&x| f16::from_f32(x)).collect()),
        BF16 => Tensor::from_vec(shape, v.iter().map(|&x| bf16::from_f32(x)).collect()),
        _ => Tensor::from_vec(shape, v),
    }
    .expect("a tensor of its own shape")
}

fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: 2,
        i: v,
        ..Default::default()
    }
}

fn with_attrs(mut n: NodeProto, attrs: Vec<AttributeProto>) -> NodeProto {
    n.attribute = attrs;
    n
}

fn dims(s: &[usize]) -> Vec<String> {
    s.iter().map(|d| d.to_string()).collect()
}

fn graph(
    nodes: Vec<NodeProto>,
    inputs: &[(&str, i32, &[usize])],
    output: (&str, i32),
    inits: Vec<nxrt_core::proto::TensorProto>,
) -> Vec<u8> {
    opset17_model(GraphProto {
        name: "bench".into(),
        node: nodes,
        input: inputs
            .iter()
            .map(|(n, e, s)| {
                let d = dims(s);
                vi(n, *e, &d.iter().map(|x| x.as_str()).collect::<Vec<_>>())
            })
            .collect(),
        output: vec![vi(output.0, output.1, &[])],
        initializer: inits,
        ..Default::default()
    })
}

/// A session of `model` at `threads`, run once with `feeds` (so that the plan is built and
/// checked), or why it cannot run here.
fn ready(model: &[u8], threads: usize, feeds: &[(&str, Tensor)]) -> Result<Session, String> {
    let s = Session::builder()
        .threads(threads)
        .load_bytes(model)
        .map_err(|e| e.to_string())?;
    for _ in 0..2 {
        s.run(feeds.iter().map(|(n, t)| (*n, t.clone())))
            .map_err(|e| e.to_string())?;
    }
    Ok(s)
}

/// Times `session` on `feeds` under `name` (or says why the scenario is left out).
fn bench_session(
    c: &mut Criterion,
    name: &str,
    elements: u64,
    made: Result<Session, String>,
    feeds: &[(&str, Tensor)],
) {
    bench_session_sized(c, name, Some(elements), made, feeds, 100)
}

/// [`bench_session`] with criterion's sample count (fewer for whole models) and an optional
/// throughput.
fn bench_session_sized(
    c: &mut Criterion,
    name: &str,
    elements: Option<u64>,
    made: Result<Session, String>,
    feeds: &[(&str, Tensor)],
    samples: usize,
) {
    let s = match made {
        Ok(s) => s,
        Err(e) => {
            eprintln!("left out: {name}: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group(name.split_once('/').map_or(name, |(a, _)| a));
    g.sample_size(samples);
    if let Some(n) = elements {
        g.throughput(Throughput::Elements(n));
    }
    g.bench_function(name.split_once('/').map_or("", |(_, b)| b), |b| {
        b.iter(|| {
            let out = s
                .run(feeds.iter().map(|(n, t)| (*n, t.clone())))
                .expect("ran before");
            black_box(out);
        })
    });
    g.finish();
}

fn matmul(c: &mut Criterion) {
    let n_all = all_threads();
    for (size, (m, k, n)) in [
        ("small", (1, 256, 256)),
        ("medium", (32, 512, 512)),
        ("large", (32, 1024, 1024)),
    ] {
        for elem in [F32, F16, BF16] {
            let mut threads = vec![1];
            if n_all > 1 {
                threads.push(n_all);
            }
            for t in threads {
                let name = format!(
                    "matmul/{size}_generic_{}_threads={t}/{m}x{k}x{n}",
                    type_name(elem)
                );
                let model = graph(
                    vec![node("MatMul", &["a", "b"], &["y"])],
                    &[("a", elem, &[m, k]), ("b", elem, &[k, n])],
                    ("y", elem),
                    vec![],
                );
                let feeds = [
                    ("a", tensor(elem, &[m, k], 1)),
                    ("b", tensor(elem, &[k, n], 2)),
                ];
                let s = ready(&model, t, &feeds);
                bench_session(c, &name, (2 * m * k * n) as u64, s, &feeds);
            }
        }
    }
}

fn add(c: &mut Criterion) {
    for (size, n) in [("small", 1024), ("medium", 262_144), ("large", 4_194_304)] {
        for elem in [F32, F16, BF16] {
            let name = format!("add/{size}_{}_threads=1-internal/{n}", type_name(elem));
            let model = graph(
                vec![node("Add", &["a", "b"], &["y"])],
                &[("a", elem, &[n]), ("b", elem, &[n])],
                ("y", elem),
                vec![],
            );
            let feeds = [("a", tensor(elem, &[n], 3)), ("b", tensor(elem, &[n], 4))];
            let s = ready(&model, 1, &feeds);
            bench_session(c, &name, n as u64, s, &feeds);
        }
    }
}

/// Row-wise ops over `[rows, cols]`: softmax, layernorm, reduce_mean.
fn rowwise(c: &mut Criterion) {
    let sizes = [
        ("small", (1usize, 1024usize)),
        ("medium", (64, 1024)),
        ("large", (512, 4096)),
    ];
    for (size, (r, cols)) in sizes {
        let x = [("x", tensor(F32, &[r, cols], 5))];
        let shape = format!("{r}x{cols}");
        let softmax = graph(
            vec![with_attrs(
                node("Softmax", &["x"], &["y"]),
                vec![attr_i("axis", -1)],
            )],
            &[("x", F32, &[r, cols])],
            ("y", F32),
            vec![],
        );
        bench_session(
            c,
            &format!("softmax/{size}_f32_threads=1/{shape}"),
            (r * cols) as u64,
            ready(&softmax, 1, &x),
            &x,
        );
        let ln = graph(
            vec![with_attrs(
                node("LayerNormalization", &["x", "g", "b"], &["y"]),
                vec![attr_i("axis", -1)],
            )],
            &[("x", F32, &[r, cols])],
            ("y", F32),
            vec![
                f32s("g", &[cols as i64], &xorshift_data(cols, 6)),
                f32s("b", &[cols as i64], &xorshift_data(cols, 7)),
            ],
        );
        bench_session(
            c,
            &format!("layernorm/{size}_f32_threads=1/{shape}"),
            (r * cols) as u64,
            ready(&ln, 1, &x),
            &x,
        );
        let rm = graph(
            vec![node("ReduceMean", &["x", "axes"], &["y"])],
            &[("x", F32, &[r, cols])],
            ("y", F32),
            vec![i64s("axes", &[-1])],
        );
        // ReduceMean takes axes as an input from opset 18; opset 17 has the attribute
        let rm = if ready(&rm, 1, &x).is_ok() {
            rm
        } else {
            graph(
                vec![with_attrs(
                    node("ReduceMean", &["x"], &["y"]),
                    vec![AttributeProto {
                        name: "axes".into(),
                        r#type: 7,
                        ints: vec![-1],
                        ..Default::default()
                    }],
                )],
                &[("x", F32, &[r, cols])],
                ("y", F32),
                vec![],
            )
        };
        bench_session(
            c,
            &format!("reduce_mean/{size}_f32_threads=1/{shape}"),
            (r * cols) as u64,
            ready(&rm, 1, &x),
            &x,
        );
    }
}

/// Embedding lookups: a `[vocab, dim]` table gathered at `count` ids.
fn gather(c: &mut Criterion) {
    for (size, (vocab, dim, count)) in [
        ("small", (1000usize, 64usize, 16usize)),
        ("medium", (32_000, 512, 128)),
        ("large", (32_000, 2048, 512)),
    ] {
        let model = graph(
            vec![node("Gather", &["table", "ids"], &["y"])],
            &[("ids", I64, &[count])],
            ("y", F32),
            vec![f32s(
                "table",
                &[vocab as i64, dim as i64],
                &xorshift_data(vocab * dim, 8),
            )],
        );
        let ids: Vec<i64> = (0..count).map(|i| ((i * 7919) % vocab) as i64).collect();
        let feeds = [("ids", Tensor::from_vec(&[count], ids).unwrap())];
        bench_session(
            c,
            &format!("gather/{size}_f32_threads=1/{vocab}x{dim}x{count}"),
            (count * dim) as u64,
            ready(&model, 1, &feeds),
            &feeds,
        );
    }
}

/// 3x3 convolutions, padding 1, stride 1, weights constant (packed at load).
fn conv(c: &mut Criterion) {
    for (size, (ch, hw, out)) in [
        ("small", (16usize, 56usize, 16usize)),
        ("medium", (64, 28, 64)),
    ] {
        let model = graph(
            vec![with_attrs(
                node("Conv", &["x", "w"], &["y"]),
                vec![AttributeProto {
                    name: "pads".into(),
                    r#type: 7,
                    ints: vec![1, 1, 1, 1],
                    ..Default::default()
                }],
            )],
            &[("x", F32, &[1, ch, hw, hw])],
            ("y", F32),
            vec![f32s(
                "w",
                &[out as i64, ch as i64, 3, 3],
                &xorshift_data(out * ch * 9, 9),
            )],
        );
        let feeds = [("x", tensor(F32, &[1, ch, hw, hw], 10))];
        bench_session(
            c,
            &format!("conv/{size}_f32_threads=1/1x{ch}x{hw}x{hw}_k3x3_o{out}"),
            (2 * out * ch * 9 * hw * hw) as u64,
            ready(&model, 1, &feeds),
            &feeds,
        );
    }
}

/// One LSTM layer over a sequence.
fn lstm(c: &mut Criterion) {
    let (seq, batch, input, hidden) = (16usize, 1usize, 64usize, 128usize);
    let model = graph(
        vec![with_attrs(
            node("LSTM", &["x", "w", "r"], &["y"]),
            vec![attr_i("hidden_size", hidden as i64)],
        )],
        &[("x", F32, &[seq, batch, input])],
        ("y", F32),
        vec![
            f32s(
                "w",
                &[1, 4 * hidden as i64, input as i64],
                &xorshift_data(4 * hidden * input, 11),
            ),
            f32s(
                "r",
                &[1, 4 * hidden as i64, hidden as i64],
                &xorshift_data(4 * hidden * hidden, 12),
            ),
        ],
    );
    let feeds = [("x", tensor(F32, &[seq, batch, input], 13))];
    bench_session(
        c,
        &format!("lstm/small_f32_threads=1/{seq}x{batch}x{input}x{hidden}"),
        (seq * 8 * hidden * (input + hidden)) as u64,
        ready(&model, 1, &feeds),
        &feeds,
    );
}

/// Choosing one token from a 32 000-entry vocabulary's logits (a fresh copy each time).
fn sampling(c: &mut Criterion) {
    let vocab = 32_000;
    let logits: Vec<f32> = xorshift_data(vocab, 14).iter().map(|x| x * 8.0).collect();
    let history: Vec<i64> = (0..64).map(|i| (i * 131) % vocab as i64).collect();
    let mut g = c.benchmark_group("sampling_latency");
    for (name, opts) in [
        ("greedy_per_token", SamplingOptions::default()),
        (
            "top_k_per_token",
            SamplingOptions {
                do_sample: true,
                top_k: 50,
                ..Default::default()
            },
        ),
        (
            "top_p_per_token",
            SamplingOptions {
                do_sample: true,
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "min_p_per_token",
            SamplingOptions {
                do_sample: true,
                min_p: 0.05,
                ..Default::default()
            },
        ),
    ] {
        let mut sampler = Sampler::new(Some(opts));
        g.bench_function(name, |b| {
            b.iter_batched_ref(
                || logits.clone(),
                |l| black_box(sampler.choose(l, &[], &history).unwrap()),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// Qwen3's vocabulary size (151 936 ids).
const QWEN3_VOCAB: usize = 151_936;

/// Logits shaped like a language model's: a broad bell of ids (a sum of three uniforms,
/// spread about 0) and a few dozen likely ones well above it, so top-p keeps tens of ids, not
/// a sizeable part of the vocabulary as flat random logits would make it.
fn lm_logits(vocab: usize, seed: u32) -> Vec<f32> {
    let (a, b, c) = (
        xorshift_data(vocab, seed),
        xorshift_data(vocab, seed + 1),
        xorshift_data(vocab, seed + 2),
    );
    let mut l: Vec<f32> = (0..vocab).map(|i| 2.0 * (a[i] + b[i] + c[i])).collect();
    for j in 0..40 {
        let id = (j * 7919 + 13) % vocab;
        l[id] += 14.0 - j as f32 * 0.2;
    }
    l
}

/// The sampling filters over Qwen3's 151 936-id vocabulary: each with the direct form (full
/// softmax and one sort of the whole vocabulary, `candidates_full_sort`) and nxrt's path
/// (`candidates`: integer rank keys, partial selection), which keep the same candidates bit
/// for bit. `qwen3_defaults` is the model card's sampling (temperature 0.6, top-k 20, top-p
/// 0.95).
fn qwen3_sampling(c: &mut Criterion) {
    let logits = lm_logits(QWEN3_VOCAB, 21);
    let mut g = c.benchmark_group("qwen3_sampling_processors");
    g.throughput(Throughput::Elements(QWEN3_VOCAB as u64));
    for (name, opts) in [
        (
            "top_k",
            SamplingOptions {
                top_k: 50,
                ..Default::default()
            },
        ),
        (
            "top_p",
            SamplingOptions {
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "min_p",
            SamplingOptions {
                min_p: 0.05,
                ..Default::default()
            },
        ),
        (
            "qwen3_defaults",
            SamplingOptions {
                temperature: 0.6,
                top_k: 20,
                top_p: 0.95,
                ..Default::default()
            },
        ),
    ] {
        let opts = SamplingOptions {
            do_sample: true,
            ..opts
        };
        assert_eq!(
            candidates(&logits, &opts),
            candidates_full_sort(&logits, &opts),
            "{name}: the two forms keep the same candidates"
        );
        g.bench_function(format!("{name}_full_sort_baseline"), |b| {
            b.iter(|| black_box(candidates_full_sort(black_box(&logits), &opts)))
        });
        g.bench_function(format!("{name}_fast_path"), |b| {
            b.iter(|| black_box(candidates(black_box(&logits), &opts)))
        });
    }
    g.finish();
}

/// One decode step's whole processor chain over Qwen3's vocabulary with a 512-id history:
/// the seven processors nxrt has (repetition, frequency and presence penalties, no-repeat
/// 3-grams, temperature, top-k, top-p) and the seeded draw, on a fresh copy of the logits.
fn logit_processing(c: &mut Criterion) {
    let logits = lm_logits(QWEN3_VOCAB, 24);
    let history: Vec<i64> = (0..512)
        .map(|i: i64| (i * 7919 + 13) % QWEN3_VOCAB as i64)
        .collect();
    let mut sampler = Sampler::new(Some(SamplingOptions {
        do_sample: true,
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        presence_penalty: 0.3,
        no_repeat_ngram_size: 3,
        temperature: 0.7,
        top_k: 50,
        top_p: 0.9,
        ..Default::default()
    }));
    let mut g = c.benchmark_group("logit_processing");
    g.bench_function("seven_processor_chain_per_step", |b| {
        b.iter_batched_ref(
            || logits.clone(),
            |l| black_box(sampler.choose(l, &[], &history).unwrap()),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// The genai set's tokenizer folder (`$NXRT_CACHE/genai/tokenizers/NAME`), where the test
/// run's set-up wrote it.
#[cfg(feature = "tokenizers")]
fn tokenizer_json(name: &str) -> Option<PathBuf> {
    let p = cache_dir()
        .join("genai")
        .join("tokenizers")
        .join(name)
        .join("tokenizer.json");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "left out: scenarios on the {name} tokenizer: no {} (the test run's set-up writes it)",
            p.display()
        );
        None
    }
}

/// About 5 KB of English prose (written for this suite) with numbers, punctuation and code.
#[cfg(feature = "tokenizers")]
fn prose() -> String {
    let para = "The night ferry left the harbour at ten past eleven, carrying forty-two \
        passengers, three bicycles and a crate of oranges bound for the island market. \
        Somewhere below deck an engineer named Tomasz checked the pressure gauge (it read \
        2.75 bar), wiped his hands and wrote `pressure_ok = true;` in the log before \
        climbing back up to watch the lights of the mainland shrink to a thin, wavering line. ";
    para.repeat(12)
}

/// Llama 3's tokenizer (128 256 ids, byte-level BPE) on about 5 KB of prose: encoding the
/// text and decoding its ids, as tokens per second.
#[cfg(feature = "tokenizers")]
fn tokenization(c: &mut Criterion) {
    let Some(path) = tokenizer_json("llama3") else {
        return;
    };
    let tok = nxrt::tokenizer::Tokenizer::from_path(&path).expect("the llama3 tokenizer loads");
    let text = prose();
    let ids = tok.encode(&text, false).expect("encodes").ids;
    assert_eq!(
        tok.decode(&ids, false).expect("decodes"),
        text,
        "the round trip gives the text back"
    );
    let mut g = c.benchmark_group("tokenization");
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("encode_tokens_per_second", |b| {
        b.iter(|| black_box(tok.encode(black_box(&text), false).unwrap()))
    });
    g.bench_function("decode_tokens_per_second", |b| {
        b.iter(|| black_box(tok.decode(black_box(&ids), false).unwrap()))
    });
    g.finish();
}

/// A JSON schema held by llguidance over Llama 3's vocabulary: 32 decode steps, each
/// computing the mask of allowed ids and applying it to the logits, then taking the next id
/// of a valid answer (a fresh grammar state each iteration).
#[cfg(feature = "guidance")]
fn grammar_masking(c: &mut Criterion) {
    use nxrt::guidance::Grammar;
    use nxrt_core::genai::LogitsProcessor;
    let Some(path) = tokenizer_json("llama3") else {
        return;
    };
    let eos = [128_001i64, 128_009];
    let guidance = nxrt::guidance::from_path(&path, &eos).expect("the vocabulary prepares");
    let schema = Grammar::JsonSchema(
        r#"{"type": "object", "properties": {"name": {"type": "string"},
            "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "age", "tags"], "additionalProperties": false}"#
            .into(),
    );
    let tok = nxrt::tokenizer::Tokenizer::from_path(&path).expect("the llama3 tokenizer loads");
    let answer = r#"{"name": "Orla Keane", "age": 41, "tags": ["lighthouse", "harbour", "clockwork", "evening", "ninety-one steps"]}"#;
    let ids: Vec<i64> = tok
        .encode(answer, false)
        .expect("encodes")
        .ids
        .iter()
        .map(|&i| i as i64)
        .collect();
    assert!(ids.len() >= 32, "the answer has 32 tokens");
    let ids = &ids[..32];
    let vocab = 128_256;
    let logits = vec![0.0f32; vocab];
    // every id of the answer is one the grammar allows at its step
    let steps = |p: &mut nxrt::guidance::GrammarProcessor, l: &mut Vec<f32>| {
        for n in 0..ids.len() {
            l.copy_from_slice(&logits);
            p.process(l, &ids[..n])
                .expect("the grammar takes the answer");
            assert!(
                l[ids[n] as usize] == 0.0,
                "step {n}: the answer's id is allowed"
            );
        }
    };
    let mut g = c.benchmark_group("grammar_masking");
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("llguidance_compute_mask/32", |b| {
        b.iter_batched_ref(
            || (guidance.processor(&schema).unwrap(), logits.clone()),
            |(p, l)| steps(p, l),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// A sequence takes 64 rows (4 pages of 16) of a 2-layer, 4-head pool and gives them back.
fn kv_cache(c: &mut Criterion) {
    let (layers, heads, hs, rows, cap) = (2usize, 4usize, 64usize, 16usize, 64usize);
    let mut pool = KvPool::new(layers, heads, hs, rows, 64).unwrap();
    let src = vec![0.5f32; heads * cap * hs];
    let srcs: Vec<&[f32]> = (0..2 * layers).map(|_| src.as_slice()).collect();
    let ids: Vec<i64> = (0..cap as i64).collect();
    let mut g = c.benchmark_group("kv_cache");
    g.bench_function("alloc_dealloc_pages", |b| {
        b.iter(|| {
            let s = pool.create();
            pool.write_rows(s, &ids, 0, &srcs, cap, &[]).unwrap();
            pool.release(s).unwrap();
        })
    });
    g.finish();
}

/// Whole models: every model of the public corpus (`$NXRT_CACHE/corpus`, the test run's set-up
/// fetches it) on its first reference case's inputs, 1 thread, planned mode, all
/// optimisations: what a user's `Session::run` pays. A model that does not load or run is left
/// out with a line saying why (`scripts/bench-compare` lists it as in one arm only).
fn corpus_models(c: &mut Criterion) {
    let root = cache_dir().join("corpus");
    let Ok(dirs) = std::fs::read_dir(&root) else {
        eprintln!(
            "left out: model/*: no corpus at {} (the test run's set-up fetches it)",
            root.display()
        );
        return;
    };
    let mut models: Vec<PathBuf> = dirs
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        // the generation pair runs through the decode loop, not one call
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("tiny_llama_genai")
        })
        .collect();
    models.sort();
    for dir in models {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let case = (|| {
            let mut cases: Vec<PathBuf> = std::fs::read_dir(dir.join("ref"))
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            cases.sort();
            let case = cases.into_iter().next().ok_or("no reference case")?;
            let io: serde_json::Value = serde_json::from_slice(
                &std::fs::read(case.join("io.json")).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string())?;
            let mut feeds = Vec::new();
            for i in io["inputs"].as_array().ok_or("io.json has no inputs")? {
                let file = case.join(i["file"].as_str().ok_or("an input without a file")?);
                let bytes = std::fs::read(&file).map_err(|e| e.to_string())?;
                let t = nxrt::npy::read_npy(&bytes).map_err(|e| e.to_string())?;
                feeds.push((i["name"].as_str().unwrap_or("").to_string(), t));
            }
            let s = Session::builder()
                .threads(1)
                .load(dir.join("model.onnx"))
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((case, s, feeds))
        })();
        let (case, s, feeds) = match case {
            Ok(x) => x,
            Err(e) => {
                eprintln!("left out: model/{name}_threads=1: {e}");
                continue;
            }
        };
        let case = case.file_name().unwrap().to_string_lossy().to_string();
        let feeds: Vec<(&str, Tensor)> =
            feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let made = (|| {
            for _ in 0..2 {
                s.run(feeds.iter().map(|(n, t)| (*n, t.clone())))
                    .map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(s)
        })();
        bench_session_sized(
            c,
            &format!("model/{name}_threads=1/{case}"),
            None,
            made,
            &feeds,
            10,
        );
    }
}

/// The quantized set's folder (`$NXRT_CACHE/quant`), where the test run's set-up wrote it.
fn quant_dir() -> PathBuf {
    cache_dir().join("quant")
}

/// `$NXRT_CACHE` (default `~/.cache/nxrt`).
fn cache_dir() -> PathBuf {
    std::env::var_os("NXRT_CACHE").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache")
                .join("nxrt")
        },
        PathBuf::from,
    )
}

/// Block-quantized products in the arms the reference runtime names (see
/// `nxrt::weight_cache`), on the quantized set's MXFP4 models: dequantizing the FLOAT4E2M1
/// blocks on every call (the graph as written, unoptimised), a dense copy made on the first
/// call and kept by the session's bounded weight cache (`--block-weights cached`), dense
/// float weights made at load (`expanded`), and nxrt's reading of the codes (`codes`, which
/// `auto`, the default, takes for as few rows as these). The matmul is 1x1024x1024; the
/// mixture of experts is 4 tokens of 512 routed to 2 of 8 SwiGLU experts of 512.
fn block_quantized(c: &mut Criterion) {
    use nxrt::BlockWeights;
    for (model_dir, group, label, arm_prefix, elements) in [
        (
            "mxfp4_matmul_1x1024x1024",
            "block_quantized_matmul_cached_dense",
            "1x1024x1024",
            "mxfp4_",
            2 * 1024 * 1024,
        ),
        (
            "mxfp4_moe_t4_h512_i512_e8_k2",
            "block_quantized_moe_cached_dense",
            "t4_h512_i512_e8_k2",
            "moe_",
            // 4 tokens x 2 experts x three 512x512 products
            4 * 2 * 3 * 2 * 512 * 512,
        ),
    ] {
        let model = quant_dir().join(model_dir).join("model.onnx");
        if !model.exists() {
            eprintln!(
                "left out: {group}/*: no {} (the test run's set-up writes it)",
                model.display()
            );
            continue;
        }
        let load = |opt: OptLevel, policy: BlockWeights| {
            Session::builder()
                .optimization(opt)
                .block_weights(policy)
                .load(&model)
                .map_err(|e| e.to_string())
        };
        let arms = [
            (
                "uncached_dequant_each_call",
                OptLevel::None,
                BlockWeights::Codes,
            ),
            (
                "cached_dense_repeated_call",
                OptLevel::All,
                BlockWeights::Cached,
            ),
            ("preexpanded_dense", OptLevel::All, BlockWeights::Expanded),
            ("fused_codes", OptLevel::All, BlockWeights::Codes),
        ];
        for (arm, opt, policy) in arms {
            let name = format!("{group}/{arm_prefix}{arm}/{label}");
            let made = load(opt, policy).and_then(|s| {
                let feeds: Vec<(String, Tensor)> = s
                    .inputs()
                    .iter()
                    .enumerate()
                    .map(|(i, io)| {
                        let shape: Vec<usize> = io
                            .ty
                            .tensor_shape()
                            .unwrap_or_default()
                            .iter()
                            .map(|d| match d {
                                nxrt::Dim::Known(n) => *n,
                                _ => 1,
                            })
                            .collect();
                        (io.name.clone(), tensor(F32, &shape, 15 + i as u32))
                    })
                    .collect();
                for _ in 0..2 {
                    s.run(feeds.iter().map(|(n, t)| (n.as_str(), t.clone())))
                        .map_err(|e| e.to_string())?;
                }
                if policy == BlockWeights::Cached && s.weight_cache().copies == 0 {
                    return Err("the weight cache made no dense copy".into());
                }
                Ok((s, feeds))
            });
            match made {
                Ok((s, feeds)) => {
                    let feeds: Vec<(&str, Tensor)> =
                        feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                    bench_session(c, &name, elements, Ok(s), &feeds);
                }
                Err(e) => eprintln!("left out: {name}: {e}"),
            }
        }
    }
}

criterion_group!(
    suite,
    matmul,
    add,
    rowwise,
    gather,
    conv,
    lstm,
    sampling,
    qwen3_sampling,
    logit_processing,
    kv_cache,
    block_quantized,
    corpus_models
);

#[cfg(feature = "tokenizers")]
criterion_group!(text, tokenization);
#[cfg(not(feature = "tokenizers"))]
fn text() {
    eprintln!("left out: tokenization/*: built without the tokenizers feature");
}

#[cfg(feature = "guidance")]
criterion_group!(grammars, grammar_masking);
#[cfg(not(feature = "guidance"))]
fn grammars() {
    eprintln!("left out: grammar_masking/*: built without the guidance feature");
}

criterion_main!(suite, text, grammars);
