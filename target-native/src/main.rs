//! The `nxrt` command line: `run`, `bench` and `inspect` (a contract other tools script against).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use nxrt::{DataType, Dim, Error, ExecMode, Session, SessionBuilder, Tensor, TypeInfo, Value};
use nxrt_core::loader;
use serde_json::json;

#[cfg(feature = "ort-bench")]
mod vs_ort;

#[derive(Parser)]
#[command(
    name = "nxrt",
    version,
    about = "Run, benchmark and inspect ONNX models"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a model once (without MODEL: the small model built into this binary).
    Run(RunArgs),
    /// Time repeated runs of a model.
    Bench(BenchArgs),
    /// Show a model's opsets, ops, inputs/outputs, weights and unsupported nodes.
    Inspect(InspectArgs),
    /// Generate tokens with a decoder folder (onnxruntime-genai or transformers.js / Optimum layout).
    Generate(GenerateArgs),
    /// Encode text to ids, or decode ids to text, with a tokenizer.json (HF `tokenizers`).
    Tokenize(TokenizeArgs),
}

#[derive(Args)]
struct TokenizeArgs {
    /// A tokenizer.json, or a model folder holding one.
    path: PathBuf,
    /// The text to encode (`--text=VALUE` for a text that starts with `-`).
    #[arg(
        long,
        allow_hyphen_values = true,
        conflicts_with_all = ["decode", "chat"],
        required_unless_present_any = ["decode", "chat"]
    )]
    text: Option<String>,
    /// Ids to decode: 1,2,3 (special tokens are skipped; "" is no ids).
    #[arg(long, conflicts_with = "chat")]
    decode: Option<String>,
    /// A user message rendered by the folder's chat template (tokenizer_config.json), with the
    /// assistant's turn opened, then encoded as the template wrote it (the JSON adds "text").
    #[arg(long, allow_hyphen_values = true)]
    chat: Option<String>,
    /// With --chat: a system message before the user's.
    #[arg(long, allow_hyphen_values = true, requires = "chat")]
    system: Option<String>,
    /// One JSON object: {"ids": [...], "tokens": [...]} or {"text": ...}.
    #[arg(long)]
    json: bool,
}

/// The conversation `--system` / `--chat` give, rendered by the folder's chat template with the
/// assistant's turn opened.
#[cfg(feature = "tokenizers")]
fn chat_prompt(dir: &Path, system: Option<&str>, user: &str) -> Result<String, Error> {
    use nxrt::chat::{ChatTemplate, Message};
    if !dir.is_dir() {
        return Err(Error::Input(format!(
            "--chat needs a model folder (its tokenizer_config.json), not {}",
            dir.display()
        )));
    }
    let t = ChatTemplate::from_folder(dir)?.ok_or_else(|| {
        Error::Tokenizer(format!(
            "{}: no chat template (tokenizer_config.json's chat_template or chat_template.jinja)",
            dir.display()
        ))
    })?;
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(Message::new("system", s));
    }
    msgs.push(Message::new("user", user));
    t.render(&msgs, true)
}

#[derive(Args)]
struct GenerateArgs {
    /// The model folder: genai_config.json (onnxruntime-genai) or config.json (transformers.js / Optimum), the decoder, tokenizer.json.
    model_dir: PathBuf,
    /// The prompt as text (needs the folder's tokenizer).
    #[arg(long, conflicts_with_all = ["prompt_ids", "chat"])]
    prompt: Option<String>,
    /// The prompt as token ids: 1,2,3.
    #[arg(long, value_delimiter = ',', conflicts_with = "chat")]
    prompt_ids: Option<Vec<i64>>,
    /// The prompt as a user message rendered by the folder's chat template (tokenizer_config.json)
    /// with the assistant's turn opened.
    #[arg(long, allow_hyphen_values = true)]
    chat: Option<String>,
    /// With --chat: a system message before the user's.
    #[arg(long, allow_hyphen_values = true, requires = "chat")]
    system: Option<String>,
    /// New tokens at most.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// End-of-sequence ids are ignored until this many new tokens exist.
    #[arg(long, default_value_t = 0)]
    min_new_tokens: usize,
    /// Sample (with the options below) instead of greedy decoding.
    #[arg(long)]
    sample: bool,
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Keep the K most likely ids (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// OpenAI's frequency penalty.
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// OpenAI's presence penalty.
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Never repeat an n-gram of this size (HF's no_repeat_ngram_size; 0: off).
    #[arg(long, default_value_t = 0)]
    no_repeat_ngram_size: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the text ends with this (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Constrained decoding: the output is one JSON value valid against this JSON schema (a
    /// file, or the schema itself when it starts with `{`).
    #[arg(long, conflicts_with_all = ["regex", "grammar"])]
    json_schema: Option<String>,
    /// Constrained decoding: the whole output matches this regular expression.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "grammar")]
    regex: Option<String>,
    /// Constrained decoding: the output follows this Lark grammar file (llguidance's dialect).
    #[arg(long)]
    grammar: Option<PathBuf>,
    /// Execution provider: cpu, or webgpu (builds with the default `webgpu` feature).
    #[arg(long, default_value = "cpu")]
    provider: String,
    /// Intra-op threads (0 = all cores).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Execution mode of the decoder session: `eager` or `planned`.
    #[arg(long, default_value = "eager")]
    mode: String,
    /// Prompt tokens per prefill run (0: the whole prompt in one run).
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// The last stdout line is one JSON object (ids, text, finish reason, timings).
    #[arg(long)]
    json: bool,
    /// Profile phases and kernels over the whole generation (prefill and every decode step);
    /// prints a table to stderr.
    #[arg(long)]
    phase_profile: bool,
    /// With --phase-profile: how many of the slowest nodes the table lists (0 = all).
    #[arg(long, default_value_t = 15)]
    profile_nodes: usize,
}

#[derive(Args, Clone)]
struct Common {
    /// Input as NAME=FILE (.npy, or .pb holding a TensorProto/SequenceProto/MapProto/OptionalProto).
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// Fix a symbolic dimension for generated inputs (default 1).
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Execution provider: cpu, or webgpu (builds with the default `webgpu` feature).
    #[arg(long, default_value = "cpu")]
    provider: String,
    /// Intra-op threads (0 = all cores).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seed for generated inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Execution mode: `planned` (memory plan per input shapes, run from one arena) or `eager`.
    #[arg(long, default_value = "planned")]
    mode: String,
    /// Graph optimisation: `all` (folding, the CPU fusions and the blocked layout for
    /// convolutions), `extended` (folding and the fusions, layouts as given), `basic` (folding
    /// only) or `none`.
    #[arg(long, default_value = "all")]
    optimization: String,
    /// Profile phases and kernels (the profiler only); prints a table to stderr.
    #[arg(long)]
    phase_profile: bool,
    /// With --phase-profile: also write the spans as Chrome-trace JSON (opens in Perfetto).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// With --phase-profile: how many of the slowest nodes the table lists (0 = all).
    #[arg(long, default_value_t = 15, value_name = "N")]
    profile_nodes: usize,
    /// The process's host memory budget for what nxrt allocates (weights, activation arenas,
    /// outputs), e.g. `64MiB`, `1.5GB`, `1000000` (bytes). Over it the command fails with an
    /// out-of-memory error (exit code 1) instead of allocating.
    #[arg(long, value_name = "SIZE")]
    memory_limit: Option<String>,
    /// How block-quantized weights (MXFP4, blocked DequantizeLinear before a MatMul,
    /// MatMulNBits with float activations) are multiplied: `auto` (their codes for a few rows,
    /// a cached dense copy for more), `codes` (never a dense copy), `cached` (always the dense
    /// copy where the cache holds it) or `expanded` (dense float weights made at load).
    #[arg(long, default_value = "auto", value_name = "POLICY")]
    block_weights: String,
    /// The most the session's dense weight copies may hold together, e.g. `64MiB`, or `none`
    /// (only the memory budget bounds them).
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    weight_cache_limit: String,
}

#[derive(Args)]
struct RunArgs {
    model: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
    /// Write every output to DIR/<name>.npy (or .pb for types .npy cannot hold).
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Print the activation memory plan (planned peak, sum of activations, reuse) and the
    /// process's peak resident memory.
    #[arg(long)]
    memory_report: bool,
    /// Run this many times (the first planned run records sizes and builds the memory plan;
    /// later ones run from the arena); outputs and time are the last run's.
    #[arg(long, default_value_t = 1)]
    runs: usize,
}

#[derive(Args)]
struct BenchArgs {
    model: PathBuf,
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Also time ONNX Runtime's CPU EP on the same model in this process (its C API, loaded at
    /// run time), arms interleaved with nxrt and a null control (nxrt against nxrt); `--threads`
    /// sets both runtimes' intra-op threads; `--runs` is then the runs per arm per round.
    #[arg(long)]
    vs_ort: bool,
    /// ONNX Runtime's shared library for --vs-ort (default: $ORT_DYLIB_PATH, else the one the
    /// `onnxruntime` Python package ships).
    #[arg(long, requires = "vs_ort")]
    ort_lib: Option<PathBuf>,
    /// The model ONNX Runtime runs for --vs-ort (default: MODEL): a twin of the same weights
    /// where ONNX Runtime has no kernel for MODEL's form (the quantized set's ort_anchor.onnx).
    #[arg(long, requires = "vs_ort")]
    ort_model: Option<PathBuf>,
    /// Rounds of --vs-ort (each runs every arm --runs times; the arms' order rotates).
    #[arg(long, default_value_t = 5, requires = "vs_ort")]
    rounds: usize,
}

#[derive(Args)]
struct InspectArgs {
    model: PathBuf,
    #[arg(long)]
    json: bool,
    #[arg(long, default_value = "cpu")]
    provider: String,
}

/// Large blocks (weights, arenas, big outputs) on transparent huge pages: see `nxrt::alloc`.
#[global_allocator]
static ALLOC: nxrt::LargePages = nxrt::LargePages;

fn main() -> ExitCode {
    // Behave like other Unix tools when stdout is a closed pipe (`nxrt inspect m | head`).
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let res = match cli.cmd {
        None => run(RunArgs {
            model: None,
            common: Common {
                inputs: vec![],
                dims: vec![],
                provider: "cpu".into(),
                threads: 1,
                seed: 0,
                mode: "planned".into(),
                optimization: "all".into(),
                phase_profile: false,
                trace: None,
                profile_nodes: 15,
                memory_limit: None,
                block_weights: "auto".into(),
                weight_cache_limit: "256MiB".into(),
            },
            output_dir: None,
            memory_report: false,
            runs: 1,
        }),
        Some(Cmd::Run(a)) => run(a),
        Some(Cmd::Bench(a)) => bench(a),
        Some(Cmd::Inspect(a)) => inspect(a),
        Some(Cmd::Generate(a)) => generate(a),
        Some(Cmd::Tokenize(a)) => tokenize(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error[{}]: {e}", e.kind());
            ExitCode::from(1)
        }
    }
}

/// A size as `--memory-limit` takes it: bytes, or a number with a unit (`KiB`, `MiB`, `GiB`,
/// `TiB` in powers of 1024; `kB`, `KB`, `MB`, `GB`, `TB` in powers of 1000; `B`).
fn parse_size(s: &str) -> Result<usize, Error> {
    let t = s.trim();
    let split = t
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let bad = || {
        Error::Input(format!(
            "--memory-limit {s}: expected a size such as 64MiB, 1.5GB or 1000000"
        ))
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit {
        "" | "B" => 1.0,
        "KiB" | "K" | "k" => 1024.0,
        "MiB" | "M" => 1024.0 * 1024.0,
        "GiB" | "G" => 1024.0 * 1024.0 * 1024.0,
        "TiB" | "T" => 1024.0f64.powi(4),
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return Err(bad()),
    };
    let b = v * mult;
    if !b.is_finite() || b < 0.0 || b >= usize::MAX as f64 {
        return Err(bad());
    }
    Ok(b as usize)
}

/// Applies `--memory-limit` to the process's host budget.
fn apply_memory_limit(c: &Common) -> Result<(), Error> {
    if let Some(s) = &c.memory_limit {
        nxrt::governor::set_process_limit(nxrt::governor::Tier::Host, Some(parse_size(s)?));
    }
    Ok(())
}

/// The governor's figures for `--memory-report`.
fn print_governor(session: &Session) {
    let show = |b: usize| mib(b as u64);
    let limit = |l: Option<usize>| l.map_or("none".to_string(), show);
    for snap in [
        session.memory_snapshot(),
        nxrt::governor::process_snapshot(),
    ] {
        for t in &snap.tiers {
            println!(
                "memory leases ({} {}): in use {}, peak {}, limit {}, {} leases",
                snap.name,
                t.tier,
                show(t.in_use),
                show(t.peak),
                limit(t.limit),
                t.leases
            );
            for h in &t.holders {
                println!(
                    "  {}: in use {}, peak {}, {} leases",
                    h.holder.name(),
                    show(h.in_use),
                    show(h.peak),
                    h.leases
                );
            }
        }
    }
    let w = session.weight_cache();
    println!(
        "dense weight cache: policy {}, limit {}, holds {} in {} copies; {} fills, {} hits, {} declined, {} given back",
        w.policy,
        limit(w.limit),
        show(w.bytes),
        w.copies,
        w.fills,
        w.hits,
        w.declined,
        show(w.released)
    );
    for m in session.mechanisms() {
        let state = match (&m.failure, &m.last_failure) {
            (Some(f), _) => format!(", dead: {f}"),
            (None, Some(f)) => format!(", {} restore(s), last dropped {f}", m.restores),
            (None, None) => String::new(),
        };
        println!(
            "memory mechanism ({}): {}, keeps {}{state}",
            m.tier,
            m.current,
            show(m.cached)
        );
    }
}

fn builder(c: &Common) -> Result<SessionBuilder, Error> {
    let mode = match c.mode.as_str() {
        "planned" => ExecMode::Planned,
        "eager" => ExecMode::Eager,
        other => {
            return Err(Error::Input(format!(
                "--mode {other}: expected 'planned' or 'eager'"
            )))
        }
    };
    let level = match c.optimization.as_str() {
        "all" => nxrt::OptLevel::All,
        "extended" => nxrt::OptLevel::Extended,
        "basic" => nxrt::OptLevel::Basic,
        "none" => nxrt::OptLevel::None,
        other => {
            return Err(Error::Input(format!(
                "--optimization {other}: expected 'all', 'extended', 'basic' or 'none'"
            )))
        }
    };
    let policy = nxrt::BlockWeights::parse(&c.block_weights).map_err(|_| {
        Error::Input(format!(
            "--block-weights {}: expected 'auto', 'codes', 'cached' or 'expanded'",
            c.block_weights
        ))
    })?;
    let cache_limit = match c.weight_cache_limit.as_str() {
        "none" => None,
        s => Some(parse_size(s).map_err(|e| {
            Error::Input(
                e.to_string()
                    .replace("--memory-limit", "--weight-cache-limit"),
            )
        })?),
    };
    Ok(Session::builder()
        .threads(c.threads)
        .optimization(level)
        .providers(&[c.provider.as_str()])
        .mode(mode)
        .phase_profile(c.phase_profile || c.trace.is_some())
        .block_weights(policy)
        .weight_cache_limit(cache_limit))
}

/// Prints the phase profile to stderr and writes the trace, when asked for.
fn report_profile(session: &Session, c: &Common) -> Result<(), Error> {
    if !(c.phase_profile || c.trace.is_some()) {
        return Ok(());
    }
    let Some(p) = session.phase_profile() else {
        return Ok(());
    };
    let top = if c.profile_nodes == 0 {
        usize::MAX
    } else {
        c.profile_nodes
    };
    eprint!("{}", p.table(top));
    if let Some(path) = &c.trace {
        std::fs::write(path, p.chrome_trace())
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        eprintln!("trace: wrote {} ({} spans)", path.display(), p.spans.len());
    }
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0))
}

fn split_kv<'a>(s: &'a str, what: &str) -> Result<(&'a str, &'a str), Error> {
    s.split_once('=')
        .ok_or_else(|| Error::Input(format!("{what} '{s}' should be NAME=VALUE")))
}

/// Reads a value file: `.npy` or a `.pb` value proto (decoded by the input's declared kind).
fn read_value(path: &Path, declared: &TypeInfo) -> Result<Value, Error> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => Ok(Value::Tensor(nxrt::npy::read_npy(&bytes)?)),
        Some("pb") => loader::value_from_proto_bytes(&bytes, declared),
        _ => Err(Error::Input(format!(
            "{}: input files must be .npy or .pb",
            path.display()
        ))),
    }
}

/// A small xorshift generator for seeded inputs.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn gen_tensor(dt: DataType, shape: &[usize], rng: &mut Rng) -> Result<Tensor, Error> {
    let n = nxrt_core::tensor::numel(shape)?;
    if n > (1 << 28) {
        return Err(Error::Shape(format!(
            "generated input of shape {shape:?} is too large; give it with --input or fix --dim"
        )));
    }
    macro_rules! ints {
        ($t:ty) => {
            Tensor::from_vec(
                shape,
                (0..n).map(|_| (rng.next() % 10) as $t).collect::<Vec<$t>>(),
            )
        };
    }
    match dt {
        DataType::Float => Tensor::from_vec(
            shape,
            (0..n).map(|_| (rng.unit() * 2.0 - 1.0) as f32).collect(),
        ),
        DataType::Double => {
            Tensor::from_vec(shape, (0..n).map(|_| rng.unit() * 2.0 - 1.0).collect())
        }
        DataType::Float16 => Tensor::from_vec(
            shape,
            (0..n)
                .map(|_| half::f16::from_f64(rng.unit() * 2.0 - 1.0))
                .collect(),
        ),
        DataType::Int64 => ints!(i64),
        DataType::Int32 => ints!(i32),
        DataType::Int16 => ints!(i16),
        DataType::Int8 => ints!(i8),
        DataType::Uint8 => ints!(u8),
        DataType::Uint16 => ints!(u16),
        DataType::Uint32 => ints!(u32),
        DataType::Uint64 => ints!(u64),
        DataType::Bool => Tensor::from_vec(shape, (0..n).map(|_| rng.next() % 2 == 1).collect()),
        DataType::String => Tensor::from_vec(shape, (0..n).map(|i| format!("s{i}")).collect()),
        other => Err(Error::Input(format!(
            "cannot generate {other} inputs; give one with --input"
        ))),
    }
}

fn feeds_for(session: &Session, c: &Common) -> Result<Vec<(String, Value)>, Error> {
    let mut given: BTreeMap<String, PathBuf> = BTreeMap::new();
    for s in &c.inputs {
        let (n, f) = split_kv(s, "--input")?;
        given.insert(n.to_string(), PathBuf::from(f));
    }
    let mut dims: BTreeMap<String, usize> = BTreeMap::new();
    for s in &c.dims {
        let (n, v) = split_kv(s, "--dim")?;
        dims.insert(
            n.to_string(),
            v.parse()
                .map_err(|_| Error::Input(format!("--dim {s}: value must be a size")))?,
        );
    }
    let inputs = session.inputs();
    for name in given.keys() {
        if !inputs.iter().any(|i| &i.name == name) {
            let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(Error::Input(format!(
                "the model has no input named '{name}' (inputs: {names:?})"
            )));
        }
    }
    let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ c.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut feeds = Vec::new();
    for i in inputs {
        let v = match given.get(&i.name) {
            Some(path) => read_value(path, &i.ty)?,
            None => match &i.ty {
                TypeInfo::Tensor { dtype, shape } => {
                    let dt = dtype.ok_or_else(|| {
                        Error::Input(format!(
                            "input '{}' has no declared type; give it with --input",
                            i.name
                        ))
                    })?;
                    let shape: Vec<usize> = shape
                        .as_deref()
                        .unwrap_or(&[])
                        .iter()
                        .map(|d| match d {
                            Dim::Known(n) => *n,
                            Dim::Sym(s) => dims.get(s).copied().unwrap_or(1),
                            Dim::Unknown => 1,
                        })
                        .collect();
                    Value::Tensor(gen_tensor(dt, &shape, &mut rng)?)
                }
                other => {
                    return Err(Error::Input(format!(
                        "input '{}' is a {other}; give it with --input",
                        i.name
                    )))
                }
            },
        };
        feeds.push((i.name, v));
    }
    Ok(feeds)
}

/// `[A-Za-z0-9._-]` kept, everything else becomes `_`.
fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn write_output(dir: &Path, name: &str, v: &Value) -> Result<PathBuf, Error> {
    let base = safe_name(name);
    let (path, bytes) = match v {
        Value::Tensor(t) if nxrt::npy::can_hold(t.dtype()) => {
            (dir.join(format!("{base}.npy")), nxrt::npy::write_npy(t)?)
        }
        other => (
            dir.join(format!("{base}.pb")),
            loader::value_to_proto_bytes(name, other)?,
        ),
    };
    std::fs::write(&path, bytes).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    Ok(path)
}

fn summarize(v: &Value) -> String {
    match v {
        Value::Tensor(t) => {
            let head = match t.dtype() {
                DataType::String => t
                    .as_slice::<String>()
                    .map(|s| format!("{:?}", &s[..s.len().min(6)]))
                    .unwrap_or_default(),
                _ => match t.to_f32_vec() {
                    Ok(v) => {
                        let shown: Vec<String> =
                            v.iter().take(8).map(|x| format!("{x:.5}")).collect();
                        format!(
                            "[{}{}]",
                            shown.join(", "),
                            if v.len() > 8 { ", ..." } else { "" }
                        )
                    }
                    Err(_) => String::from("(packed)"),
                },
            };
            format!("{} {:?} {}", t.dtype(), t.shape(), head)
        }
        Value::Sequence { items, .. } => format!("sequence of {} items", items.len()),
        Value::Map(m) => format!("map with {} keys", m.keys.len()),
        Value::Optional { value, .. } => {
            if value.is_some() {
                "optional (present)".into()
            } else {
                "optional (empty)".into()
            }
        }
    }
}

fn run(a: RunArgs) -> Result<(), Error> {
    let c = &a.common;
    apply_memory_limit(c)?;
    if a.memory_report && c.mode == "eager" {
        // an eager run reports its plan only through the planner's own diagnostics gate
        nxrt::enable_activation_memory_plan_for_process();
    }
    let (session, label) = match &a.model {
        Some(p) => (builder(c)?.load(p)?, p.display().to_string()),
        None => (
            builder(c)?.load_bytes(&nxrt::embedded::tiny_cnn())?,
            "embedded tiny_cnn (16x16 image -> 10 classes)".to_string(),
        ),
    };
    let feeds = feeds_for(&session, c)?;
    for _ in 1..a.runs {
        session.run(feeds.clone())?;
    }
    let counters = |s: &Session| -> Vec<(String, Vec<(&'static str, u64)>)> {
        s.core()
            .providers()
            .iter()
            .map(|p| (p.name().to_string(), p.counters()))
            .filter(|(_, c)| !c.is_empty())
            .collect()
    };
    let before = counters(&session);
    let t0 = Instant::now();
    let outs = session.run(feeds)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    // device providers' counters for the reported run, on stderr (stdout keeps its format)
    for ((name, after), (_, was)) in counters(&session).iter().zip(&before) {
        let parts: Vec<String> = after
            .iter()
            .zip(was)
            .map(|((k, v), (_, w))| {
                if k.ends_with("bytes") {
                    format!("{k} {v}")
                } else {
                    format!("{k} {}", v - w)
                }
            })
            .collect();
        eprintln!("provider {name} (this run): {}", parts.join(", "));
    }
    println!("model: {label}");
    println!(
        "load: {:.3} ms, run: {:.3} ms ({} thread{}, provider {})",
        session.load_time().as_secs_f64() * 1e3,
        ms,
        session.threads(),
        if session.threads() == 1 { "" } else { "s" },
        c.provider
    );
    for (name, v) in outs.iter() {
        println!("  {name}: {}", summarize(v));
    }
    if let Some(dir) = &a.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        for (name, v) in outs.iter() {
            let p = write_output(dir, name, v)?;
            println!("  wrote {}", p.display());
        }
    }
    if a.memory_report {
        match session.activation_memory_plan_stats() {
            Some(s) => {
                println!(
                    "memory plan ({} mode): planned peak {} (arena), sum of activations {}, reuse {:.2}x, live peak {}",
                    c.mode,
                    mib(s.arena_bytes as u64),
                    mib(s.activation_bytes as u64),
                    s.reuse_ratio,
                    mib(s.live_peak_bytes as u64)
                );
                println!(
                    "  {} activations planned ({} views, {} in place), {} left on the heap ({})",
                    s.planned_values,
                    s.views,
                    s.in_place,
                    s.heap_values,
                    mib(s.heap_bytes as u64)
                );
                println!(
                    "  {} shape-arithmetic steps kept by the plan ({})",
                    s.folded_steps,
                    mib(s.folded_bytes as u64)
                );
            }
            None => println!("memory plan: none (no plan was built)"),
        }
        match nxrt::peak_rss_bytes() {
            Some(b) => println!("peak resident memory: {}", mib(b)),
            None => println!("peak resident memory: unknown on this OS"),
        }
        print_governor(&session);
    }
    report_profile(&session, c)?;
    Ok(())
}

fn bench(a: BenchArgs) -> Result<(), Error> {
    let c = &a.common;
    apply_memory_limit(c)?;
    if a.vs_ort {
        return bench_vs_ort(&a);
    }
    let session = builder(c)?.load(&a.model)?;
    let feeds = feeds_for(&session, c)?;
    for _ in 0..a.warmup {
        session.run(feeds.clone())?;
    }
    if a.warmup > 0 {
        // the profile describes the timed runs (load-time spans stay)
        let keep = session.phase_profile();
        session.reset_phase_profile();
        if let Some(p) = keep {
            for sp in p.spans.iter().filter(|s| s.run == 0) {
                session
                    .core()
                    .record_phase(sp.phase, sp.start_ns, sp.dur_ns);
            }
        }
    }
    let mut times = Vec::with_capacity(a.runs);
    for _ in 0..a.runs.max(1) {
        let f = feeds.clone();
        let t0 = Instant::now();
        session.run(f)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|x, y| x.total_cmp(y));
    let median = if times.len() % 2 == 1 {
        times[times.len() / 2]
    } else {
        (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2.0
    };
    let (min, max) = (times[0], times[times.len() - 1]);
    let load_ms = session.load_time().as_secs_f64() * 1e3;
    if a.json {
        println!(
            "{}",
            bench_object(&a, &session, times.len(), median, min, max)
        );
    } else {
        println!(
            "{}: median {median:.3} ms, min {min:.3} ms, max {max:.3} ms over {} runs ({} warm-up), load {load_ms:.1} ms, {} thread(s), provider {}",
            a.model.display(),
            times.len(),
            a.warmup,
            session.threads(),
            c.provider
        );
    }
    report_profile(&session, c)?;
    Ok(())
}

/// The `bench --json` object (the contract in the README): one session's timed runs.
fn bench_object(
    a: &BenchArgs,
    session: &Session,
    runs: usize,
    median: f64,
    min: f64,
    max: f64,
) -> serde_json::Value {
    json!({
        "model": a.model.display().to_string(),
        "provider": a.common.provider,
        "threads": session.threads(),
        "warmup": a.warmup,
        "runs": runs,
        "median_ms": median,
        "min_ms": min,
        "max_ms": max,
        "load_ms": session.load_time().as_secs_f64() * 1e3,
    })
}

/// `nxrt bench --vs-ort`: see `vs_ort`.
#[cfg(feature = "ort-bench")]
fn bench_vs_ort(a: &BenchArgs) -> Result<(), Error> {
    let c = &a.common;
    if c.provider != "cpu" {
        return Err(Error::Input(format!(
            "--vs-ort compares CPU execution providers: --provider {} is not one",
            c.provider
        )));
    }
    let lib = vs_ort::find_lib(a.ort_lib.as_deref())?;
    let session = builder(c)?.load(&a.model)?;
    let control = builder(c)?.load(&a.model)?;
    let feeds = feeds_for(&session, c)?;
    let r = vs_ort::compare(
        a.ort_model.as_deref().unwrap_or(&a.model),
        &lib,
        &session,
        &control,
        &feeds,
        a.warmup,
        a.runs,
        a.rounds,
    )?;
    if a.json {
        let max = r.nxrt.times.iter().copied().fold(0.0, f64::max);
        let mut j = bench_object(
            a,
            &session,
            r.nxrt.times.len(),
            r.nxrt.median(),
            r.nxrt.min(),
            max,
        );
        j["vs_ort"] = r.json();
        println!("{j}");
    } else {
        print!("{}", r.text(&a.model));
    }
    Ok(())
}

#[cfg(not(feature = "ort-bench"))]
fn bench_vs_ort(_a: &BenchArgs) -> Result<(), Error> {
    Err(Error::Other(
        "--vs-ort needs nxrt built with the `ort-bench` feature".into(),
    ))
}

/// The grammar `--json-schema`, `--regex` or `--grammar` gives, as a processor (none without
/// one).
#[cfg(feature = "guidance")]
fn grammar_processors(
    a: &GenerateArgs,
    g: &nxrt::genai::Generator,
) -> Result<Vec<Box<dyn nxrt::genai::LogitsProcessor>>, Error> {
    use nxrt::guidance::Grammar;
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", p.display())))
    };
    let grammar = match (&a.json_schema, &a.regex, &a.grammar) {
        (None, None, None) => return Ok(Vec::new()),
        (Some(s), _, _) if s.trim_start().starts_with('{') => Grammar::JsonSchema(s.clone()),
        (Some(path), _, _) => Grammar::JsonSchema(read(Path::new(path))?),
        (_, Some(rx), _) => Grammar::Regex(rx.clone()),
        (_, _, Some(path)) => Grammar::Lark(read(path)?),
    };
    Ok(vec![Box::new(g.guidance()?.processor(&grammar)?)])
}

/// Without the `guidance` feature a grammar is an error.
#[cfg(all(feature = "tokenizers", not(feature = "guidance")))]
fn grammar_processors(
    a: &GenerateArgs,
    _g: &nxrt::genai::Generator,
) -> Result<Vec<Box<dyn nxrt::genai::LogitsProcessor>>, Error> {
    if a.json_schema.is_none() && a.regex.is_none() && a.grammar.is_none() {
        return Ok(Vec::new());
    }
    Err(Error::Other(
        "constrained decoding needs nxrt built with the `guidance` feature".into(),
    ))
}

fn generate(a: GenerateArgs) -> Result<(), Error> {
    use nxrt::genai::{GenOptions, Generator, SamplingOptions};
    use std::io::Write;
    if a.prompt.is_none() && a.prompt_ids.is_none() && a.chat.is_none() {
        return Err(Error::Input("give --prompt, --prompt-ids or --chat".into()));
    }
    let sampling = SamplingOptions {
        do_sample: a.sample,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        frequency_penalty: a.frequency_penalty,
        presence_penalty: a.presence_penalty,
        no_repeat_ngram_size: a.no_repeat_ngram_size,
        seed: a.seed,
    };
    sampling.validate()?;
    let common = Common {
        inputs: vec![],
        dims: vec![],
        provider: a.provider.clone(),
        threads: a.threads,
        seed: 0,
        mode: a.mode.clone(),
        optimization: "all".into(),
        phase_profile: a.phase_profile,
        trace: None,
        profile_nodes: a.profile_nodes,
        memory_limit: None,
        block_weights: "auto".into(),
        weight_cache_limit: "256MiB".into(),
    };
    let mut g = Generator::from_folder(&a.model_dir, &builder(&common)?)?;
    let opts = GenOptions {
        max_new_tokens: a.max_new_tokens,
        min_new_tokens: a.min_new_tokens,
        prefill_chunk: a.prefill_chunk,
        sampling: Some(sampling),
    };
    let mut out = std::io::stdout().lock();
    let json = a.json;
    #[cfg(feature = "tokenizers")]
    let text_gen = g.tokenizer().is_some();
    #[cfg(not(feature = "tokenizers"))]
    let text_gen = false;
    let (gen, text) = if text_gen {
        #[cfg(feature = "tokenizers")]
        {
            use nxrt::genai::Prompt;
            // a chat: the template's text encoded as written (it holds its special tokens)
            let chat_ids: Option<Vec<i64>> = match &a.chat {
                Some(user) => {
                    let text = chat_prompt(&a.model_dir, a.system.as_deref(), user)?;
                    let tok = g.tokenizer().expect("checked above");
                    Some(
                        tok.encode(&text, false)?
                            .ids
                            .into_iter()
                            .map(i64::from)
                            .collect(),
                    )
                }
                None => None,
            };
            let prompt = match (&a.prompt, &a.prompt_ids, &chat_ids) {
                (_, _, Some(ids)) => Prompt::Ids(ids),
                (Some(text), _, _) => Prompt::Text(text),
                (None, ids, None) => Prompt::Ids(ids.as_deref().unwrap_or_default()),
            };
            let processors = grammar_processors(&a, &g)?;
            let r = g.generate_text_with(prompt, &opts, &a.stop, processors, |piece| {
                if !json && !piece.is_empty() {
                    let _ = out.write_all(piece.as_bytes());
                    let _ = out.flush();
                }
            })?;
            (r.generation, r.text)
        }
        #[cfg(not(feature = "tokenizers"))]
        unreachable!()
    } else {
        let constrained = a.json_schema.is_some() || a.regex.is_some() || a.grammar.is_some();
        if a.prompt.is_some() || a.chat.is_some() || !a.stop.is_empty() || constrained {
            return Err(Error::Tokenizer(format!(
                "--prompt, --chat, --stop, --json-schema, --regex and --grammar need a tokenizer.json in {}",
                a.model_dir.display()
            )));
        }
        let prompt = a.prompt_ids.clone().unwrap_or_default();
        let gen = g.generate(&prompt, &opts, |id| {
            if !json {
                // without a tokenizer the ids stream as they are chosen
                let _ = write!(out, "{id} ");
                let _ = out.flush();
            }
            true
        })?;
        (gen, String::new())
    };
    let load_ms = g.load_time().as_secs_f64() * 1e3;
    let prefill_ms = gen.prefill_ns as f64 / 1e6;
    let decode_ms = gen.decode_ns as f64 / 1e6;
    let tps = if gen.decode_ns > 0 {
        gen.decode_runs as f64 / (gen.decode_ns as f64 / 1e9)
    } else {
        0.0
    };
    if json {
        let j = json!({
            "prompt_ids": gen.prompt_ids,
            "tokens": gen.tokens,
            "text": text,
            "finish_reason": gen.finish_reason.as_str(),
            "load_ms": load_ms,
            "prefill_ms": prefill_ms,
            "decode_ms": decode_ms,
            "decode_tokens_per_s": tps,
            "prefill_tokens_per_s": gen.prompt_ids.len() as f64 / (prefill_ms / 1e3).max(1e-9),
            "decode_runs": gen.decode_runs,
            "kv_bytes": g.kv_bytes(),
            "threads": a.threads,
            "provider": a.provider,
        });
        writeln!(out, "{j}").map_err(|e| Error::Io(e.to_string()))?;
    } else {
        writeln!(out).map_err(|e| Error::Io(e.to_string()))?;
        eprintln!(
            "{} prompt ids, {} new ({}); load {load_ms:.0} ms, prefill {prefill_ms:.1} ms, \
             decode {tps:.1} tok/s, KV {:.1} MiB",
            gen.prompt_ids.len(),
            gen.tokens.len(),
            gen.finish_reason.as_str(),
            g.kv_bytes() as f64 / (1 << 20) as f64
        );
    }
    if a.phase_profile {
        if let Some(p) = g.core_session().phase_profile() {
            let top = if a.profile_nodes == 0 {
                usize::MAX
            } else {
                a.profile_nodes
            };
            eprint!("{}", p.table(top));
        }
    }
    Ok(())
}

#[cfg(feature = "tokenizers")]
fn tokenize(a: TokenizeArgs) -> Result<(), Error> {
    use std::io::Write;
    let tok = nxrt::tokenizer::Tokenizer::from_path(&a.path)?;
    let mut out = std::io::stdout().lock();
    if let Some(user) = &a.chat {
        let text = chat_prompt(&a.path, a.system.as_deref(), user)?;
        let e = tok.encode(&text, false)?;
        let res = if a.json {
            writeln!(
                out,
                "{}",
                json!({"ids": e.ids, "tokens": e.tokens, "text": text})
            )
        } else {
            e.ids
                .iter()
                .zip(&e.tokens)
                .try_for_each(|(id, t)| writeln!(out, "{id}\t{t:?}"))
        };
        return res.map_err(|e| Error::Io(e.to_string()));
    }
    let res = match (&a.text, &a.decode) {
        (Some(text), _) => {
            let e = tok.encode(text, true)?;
            if a.json {
                writeln!(out, "{}", json!({"ids": e.ids, "tokens": e.tokens}))
            } else {
                e.ids
                    .iter()
                    .zip(&e.tokens)
                    .try_for_each(|(id, t)| writeln!(out, "{id}\t{t:?}"))
            }
        }
        (None, Some(list)) => {
            let ids = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.parse::<u32>()
                        .map_err(|_| Error::Input(format!("--decode: `{s}` is not an id")))
                })
                .collect::<Result<Vec<u32>, Error>>()?;
            let text = tok.decode(&ids, true)?;
            if a.json {
                writeln!(out, "{}", json!({ "text": text }))
            } else {
                writeln!(out, "{text}")
            }
        }
        (None, None) => return Err(Error::Input("give --text or --decode".into())),
    };
    res.map_err(|e| Error::Io(e.to_string()))
}

#[cfg(not(feature = "tokenizers"))]
fn tokenize(_: TokenizeArgs) -> Result<(), Error> {
    Err(Error::Tokenizer(
        "this nxrt was built without the `tokenizers` feature".into(),
    ))
}

fn inspect(a: InspectArgs) -> Result<(), Error> {
    let bytes = std::fs::read(&a.model)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", a.model.display())))?;
    let dir = a
        .model
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let model = loader::load_model(&bytes, &nxrt::FolderData::new(dir)?)?;
    let g = &model.graph;
    let mut hist: BTreeMap<String, usize> = BTreeMap::new();
    g.walk_nodes(&mut |n, _| {
        let key = if n.domain.is_empty() {
            n.op_type.clone()
        } else {
            format!("{}:{}", n.domain, n.op_type)
        };
        *hist.entry(key).or_default() += 1;
    });
    let io = |ids: &[usize]| -> Vec<(String, String)> {
        ids.iter()
            .map(|&i| (g.values[i].name.clone(), g.values[i].ty.to_string()))
            .collect()
    };
    let inputs = io(&g.inputs);
    let outputs = io(&g.outputs);
    let init_bytes = g.initializer_bytes();
    let report = Session::builder()
        .providers(&[a.provider.as_str()])
        .analyze(&a.model)?;
    if a.json {
        let v = json!({
            "model": a.model.display().to_string(),
            "ir_version": model.ir_version,
            "producer": model.producer,
            "opsets": model.opsets.iter().map(|(d, v)| json!({"domain": if d.is_empty() {"ai.onnx"} else {d}, "version": v})).collect::<Vec<_>>(),
            "node_count": hist.values().sum::<usize>(),
            "ops": hist,
            "inputs": inputs.iter().map(|(n, t)| json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "outputs": outputs.iter().map(|(n, t)| json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "initializer_bytes": init_bytes,
            "partition": {
                "nodes_per_provider": report.nodes_per_provider.iter().map(|(p, n)| json!({"provider": p, "nodes": n})).collect::<Vec<_>>(),
                "copies": report.copies,
                "nodes": report.assignments.iter().map(|(n, op, p)| json!({"node": n, "op": op, "provider": p})).collect::<Vec<_>>(),
                "copy_list": report.copy_list.iter().map(|c| json!({"value": c.value, "from": c.from, "to": c.to, "before_node": c.node, "once": c.once})).collect::<Vec<_>>(),
                "copies_per_run": report.copy_list.iter().filter(|c| !c.once).count(),
                "devices": report.devices.iter().map(|(p, d)| json!({"provider": p, "device": d})).collect::<Vec<_>>(),
                "fallbacks": report.fallbacks.iter().map(|f| json!({"node": f.node, "op": f.op, "to": f.to, "declined": f.declined.iter().map(|(p, r)| json!({"provider": p, "reason": r})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
            },
            "unsupported": report.unsupported.iter().map(|u| json!({"node": u.node, "op": u.op, "domain": u.domain, "opset": u.opset, "reason": u.reason})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    println!("model: {}", a.model.display());
    println!(
        "ir_version: {}  producer: {}",
        model.ir_version, model.producer
    );
    let ops: Vec<String> = model
        .opsets
        .iter()
        .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    println!("opsets: {}", ops.join(", "));
    println!("inputs:");
    for (n, t) in &inputs {
        println!("  {n}: {t}");
    }
    println!("outputs:");
    for (n, t) in &outputs {
        println!("  {n}: {t}");
    }
    println!("initializer bytes: {init_bytes}");
    println!(
        "ops ({} nodes, incl. subgraphs):",
        hist.values().sum::<usize>()
    );
    for (op, n) in &hist {
        println!("  {op:<28} {n}");
    }
    let parts: Vec<String> = report
        .nodes_per_provider
        .iter()
        .map(|(p, n)| format!("{p}: {n}"))
        .collect();
    println!(
        "partition: {} (copies: {})",
        parts.join(", "),
        report.copies
    );
    for (p, d) in &report.devices {
        println!("device {p}: {d}");
    }
    if report.nodes_per_provider.len() > 1 || a.provider != "cpu" {
        println!("nodes by provider:");
        for (n, op, p) in &report.assignments {
            println!("  {p:<8} {op:<24} {n}");
        }
        if !report.fallbacks.is_empty() {
            println!("fallbacks ({}):", report.fallbacks.len());
            for f in &report.fallbacks {
                let why: Vec<String> = f
                    .declined
                    .iter()
                    .map(|(p, r)| format!("{p}: {r}"))
                    .collect();
                println!("  {} ({}) -> {}: {}", f.node, f.op, f.to, why.join("; "));
            }
        }
        println!(
            "copies ({}, {} per run):",
            report.copy_list.len(),
            report.copy_list.iter().filter(|c| !c.once).count()
        );
        for c in &report.copy_list {
            let at = if c.node.is_empty() {
                "graph output".to_string()
            } else {
                format!("before {}", c.node)
            };
            let once = if c.once {
                ", initializer: uploaded once"
            } else {
                ""
            };
            println!("  {} {} -> {} ({at}{once})", c.value, c.from, c.to);
        }
    }
    if report.unsupported.is_empty() {
        println!("unsupported nodes: none");
    } else {
        println!("unsupported nodes: {}", report.unsupported.len());
        for u in &report.unsupported {
            println!(
                "  {} ({} of {}, opset {}): {}",
                u.node, u.op, u.domain, u.opset, u.reason
            );
        }
    }
    Ok(())
}
