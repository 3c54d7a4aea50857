//! The mutated-model gauge: real corpus models with one hostile change each (an integer
//! constant such as a Pad amount, a shape, an axis or a trip count replaced, negated or
//! blown up; an integer attribute likewise; a graph input's dimension made huge) run through
//! `nxrt run` on the model's reference inputs. Every run must end with a result or a typed error (exit
//! code 0 or 1): a panic (101), an abort or any other signal fails the gauge. Runs that do
//! not finish within the time limit are killed and reported apart (a separate defect from an
//! abort; the gauge prints them).
//!
//! Each run has an address-space limit (`ulimit -v`, 8 GiB), so an allocation no budget
//! checked fails there instead of exhausting the machine, and `--memory-limit 1GiB`, the
//! governor's budget for what nxrt allocates.
//!
//! `NXRT_GAUGE_N` sets the number of mutations (default 1000),
//! `NXRT_GAUGE_SEED` the first seed, `NXRT_GAUGE_KEEP` a folder that keeps each model that
//! crashed (`<model>-<seed>.onnx`). Needs the corpus and the `nxrt` binary, like
//! corpus_parity.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nxrt_core::proto::{GraphProto, ModelProto, TensorProto};
use nxrt_tests::{cache_dir, nxrt_bin};
use prost::Message;

const MODELS: &[&str] = &[
    "silero_vad",
    "silero_vad_16k_op15",
    "asr_kaldi",
    "asr_nemo128",
    "asr_whisper80",
    "oww_melspectrogram",
    "ppocr_mobile_v2_cls",
    "ort_logreg_iris",
    "oww_alexa",
    "magika_standard_v3_3",
];

// TensorProto.DataType and AttributeProto.AttributeType codes of onnx.proto
const INT32: i32 = 6;
const INT64: i32 = 7;
const A_INT: i32 = 2;
const A_TENSOR: i32 = 4;
const A_GRAPH: i32 = 5;
const A_INTS: i32 = 7;

const HOSTILE: &[i64] = &[
    i64::MAX,
    i64::MIN,
    1 << 40,
    -(1 << 40),
    1 << 32,
    (1 << 31) - 1,
    1 << 20,
    -1,
    0,
    -2,
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One place a mutation can change.
enum Slot<'a> {
    /// The values of an int32/int64 tensor (an initializer or a Constant's value).
    Ints(&'a mut TensorProto),
    /// An integer attribute (one value or a list).
    Attr(&'a mut i64),
    AttrList(&'a mut Vec<i64>),
    /// A graph input's dimension.
    Dim(&'a mut i64),
}

fn int_tensor(t: &TensorProto) -> bool {
    let n: i64 = t.dims.iter().product();
    (t.data_type == INT64 || t.data_type == INT32) && (1..=64).contains(&n)
}

/// Calls `f` on every slot of `g` (and its subgraphs) in a fixed order.
fn visit<'a>(g: &'a mut GraphProto, f: &mut dyn FnMut(Slot<'a>)) {
    for t in g.initializer.iter_mut() {
        if int_tensor(t) {
            f(Slot::Ints(t));
        }
    }
    for i in g.input.iter_mut() {
        if let Some(nxrt_core::proto::type_proto::Value::TensorType(tt)) =
            i.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            for d in tt.shape.iter_mut().flat_map(|s| s.dim.iter_mut()) {
                if let Some(nxrt_core::proto::tensor_shape_proto::dimension::Value::DimValue(v)) =
                    d.value.as_mut()
                {
                    f(Slot::Dim(v));
                }
            }
        }
    }
    for n in g.node.iter_mut() {
        for a in n.attribute.iter_mut() {
            let ty = a.r#type;
            if ty == A_INT {
                f(Slot::Attr(&mut a.i));
            } else if ty == A_INTS && !a.ints.is_empty() {
                f(Slot::AttrList(&mut a.ints));
            } else if ty == A_TENSOR {
                if let Some(t) = a.t.as_mut().filter(|t| int_tensor(t)) {
                    f(Slot::Ints(t));
                }
            } else if ty == A_GRAPH {
                if let Some(sg) = a.g.as_mut() {
                    visit(sg, f);
                }
            }
        }
    }
}

fn tensor_ints(t: &TensorProto) -> Vec<i64> {
    let i64s = t.data_type == INT64;
    if !t.raw_data.is_empty() {
        if i64s {
            t.raw_data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        } else {
            t.raw_data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect()
        }
    } else if i64s {
        t.int64_data.clone()
    } else {
        t.int32_data.iter().map(|&v| v as i64).collect()
    }
}

fn set_tensor_ints(t: &mut TensorProto, v: &[i64]) {
    let i64s = t.data_type == INT64;
    if !t.raw_data.is_empty() {
        t.raw_data = if i64s {
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        } else {
            v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
        };
    } else if i64s {
        t.int64_data = v.to_vec();
    } else {
        t.int32_data = v.iter().map(|&x| x as i32).collect();
    }
}

/// Changes `v` one hostile way; returns what it did.
fn mutate_ints(v: &mut [i64], rng: &mut Rng) -> String {
    let i = rng.below(v.len());
    match rng.below(4) {
        0 => {
            v[i] = HOSTILE[rng.below(HOSTILE.len())];
            format!("[{i}] = {}", v[i])
        }
        1 => {
            v.iter_mut().for_each(|x| *x = x.wrapping_neg());
            "negated".into()
        }
        2 => {
            v[i] = v[i].wrapping_mul(1000).wrapping_add(1);
            format!("[{i}] x1000+1 = {}", v[i])
        }
        _ => {
            v[i] = v[i].wrapping_neg().wrapping_sub(1);
            format!("[{i}] = -x-1 = {}", v[i])
        }
    }
}

/// Applies mutation `seed` to `m`; returns its description.
fn mutate(m: &mut ModelProto, seed: u64) -> String {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let g = m.graph.as_mut().expect("a graph");
    let mut count = 0;
    visit(g, &mut |_| count += 1);
    if count == 0 {
        return "unchanged".into();
    }
    let target = rng.below(count);
    let mut k = 0;
    let mut what = String::new();
    visit(g, &mut |s| {
        if k == target {
            what = match s {
                Slot::Ints(t) => {
                    let mut v = tensor_ints(t);
                    if v.is_empty() {
                        "an empty tensor".into()
                    } else {
                        let d = mutate_ints(&mut v, &mut rng);
                        set_tensor_ints(t, &v);
                        format!("tensor '{}' {d}", t.name)
                    }
                }
                Slot::Attr(x) => format!(
                    "attribute {}",
                    mutate_ints(std::slice::from_mut(x), &mut rng)
                ),
                Slot::AttrList(v) => format!("attribute list {}", mutate_ints(v, &mut rng)),
                Slot::Dim(d) => {
                    *d = [1 << 31, 1 << 40, 0, 1 << 16][rng.below(4)];
                    format!("input dim = {d}")
                }
            };
        }
        k += 1;
    });
    what
}

enum Outcome {
    Done(bool),
    Failed(String),
    TimedOut,
}

/// `--input NAME=FILE` arguments for the reference inputs of `model`'s first case
/// (`ref/<case>/input_<k>_<name>.npy`).
fn ref_inputs(model: &Path) -> String {
    let Some(case) = std::fs::read_dir(model.join("ref"))
        .ok()
        .and_then(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).min())
    else {
        return String::new();
    };
    let mut args = Vec::new();
    for e in std::fs::read_dir(&case).unwrap().filter_map(|e| e.ok()) {
        let f = e.file_name().to_string_lossy().to_string();
        if let Some(rest) = f
            .strip_prefix("input_")
            .and_then(|r| r.strip_suffix(".npy"))
        {
            if let Some((_, name)) = rest.split_once('_') {
                args.push(format!("--input '{name}={}'", e.path().display()));
            }
        }
    }
    args.sort();
    args.join(" ")
}

fn run_one(model: &Path, inputs: &str, limit: Duration) -> Outcome {
    let cmd = format!(
        "ulimit -v 8388608; exec '{}' run '{}' {inputs} --memory-limit 1GiB",
        nxrt_bin().display(),
        model.display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &cmd])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start nxrt");
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                e.read_to_string(&mut err).ok();
            }
            return match st.code() {
                Some(c @ (0 | 1)) => Outcome::Done(c == 0),
                c => {
                    // the panic's or the allocator's message, not the backtrace
                    let lines: Vec<&str> = err.lines().collect();
                    let at = lines
                        .iter()
                        .position(|l| l.contains("panicked at") || l.contains("memory allocation"))
                        .unwrap_or(0);
                    let tail = lines[at..]
                        .iter()
                        .take(2)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(" | ");
                    Outcome::Failed(format!("{c:?} ({st}): {tail}"))
                }
            };
        }
        if t0.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            return Outcome::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn mutated_models_never_abort() {
    let corpus = cache_dir().join("corpus");
    let models: Vec<(&str, ModelProto, String)> = MODELS
        .iter()
        .filter_map(|m| {
            let b = std::fs::read(corpus.join(m).join("model.onnx")).ok()?;
            let inputs = ref_inputs(&corpus.join(m));
            Some((
                *m,
                ModelProto::decode(&b[..]).expect("a corpus model decodes"),
                inputs,
            ))
        })
        .collect();
    assert!(
        models.len() == MODELS.len(),
        "the corpus is missing models (run ../shared/corpus/fetch_corpus.sh): found {}",
        models.len()
    );
    let env_num = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env_num("NXRT_GAUGE_N", 1000) as usize;
    let seed0 = env_num("NXRT_GAUGE_SEED", 1);
    let dir = std::env::temp_dir().join(format!("nxrt-gauge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let timeouts = Mutex::new(Vec::new());
    let done = AtomicUsize::new(0);
    let succeeded = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..2 {
            let (models, dir, next, failures, timeouts, done, succeeded) = (
                &models, &dir, &next, &failures, &timeouts, &done, &succeeded,
            );
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let seed = seed0 + i as u64;
                let (name, base, inputs) = &models[i % models.len()];
                let mut m = base.clone();
                let what = mutate(&mut m, seed);
                let p = dir.join(format!("w{w}.onnx"));
                std::fs::write(&p, m.encode_to_vec()).unwrap();
                let label = format!("{name} seed {seed}: {what}");
                match run_one(&p, inputs, Duration::from_secs(20)) {
                    Outcome::Done(ok) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        if ok {
                            succeeded.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Outcome::Failed(e) => {
                        if let Some(keep) = std::env::var_os("NXRT_GAUGE_KEEP") {
                            let to = Path::new(&keep).join(format!("{name}-{seed}.onnx"));
                            std::fs::copy(&p, to).ok();
                        }
                        failures.lock().unwrap().push(format!("{label}: {e}"))
                    }
                    Outcome::TimedOut => timeouts.lock().unwrap().push(label),
                }
            });
        }
    });
    std::fs::remove_dir_all(&dir).ok();
    let (failures, timeouts) = (
        failures.into_inner().unwrap(),
        timeouts.into_inner().unwrap(),
    );
    println!(
        "mutation gauge: {n} mutated models, {} ended with a result or a typed error ({} with a result), {} crashed, {} timed out (20 s)",
        done.load(Ordering::Relaxed),
        succeeded.load(Ordering::Relaxed),
        failures.len(),
        timeouts.len()
    );
    for t in &timeouts {
        println!("  timed out: {t}");
    }
    for f in &failures {
        println!("  crashed: {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {n} mutated models crashed nxrt",
        failures.len()
    );
}
