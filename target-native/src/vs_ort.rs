//! `nxrt bench MODEL --vs-ort`: ONNX Runtime's CPU execution provider timed in this process,
//! through its C API (the `ort` crate, the library loaded at run time), in the same loop as
//! nxrt, on the same inputs and thread count, with a null-control arm (a second nxrt session
//! of the same model) that shows the harness's own noise.
//!
//! Arms run in rounds: each round runs every arm `runs` times back to back, and the arms'
//! order rotates from round to round, so a slow spell of a shared machine falls on each arm in
//! turn; with more than one thread each block starts after a 0.3 s pause, as ONNX Runtime's
//! workers spin for a while after its runs. Calls cross no process boundary and no Python: what each arm's figure holds is one
//! `run` of that runtime's own API on tensors it already holds (nxrt's `Session::run` on its
//! `Value`s, ORT's `Session::run` on its `OrtValue`s), outputs dropped inside the timing.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nxrt::{DataType, Error, Session, Tensor, Value};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::SessionInputValue;
use ort::value::DynValue;
use serde_json::{json, Value as Json};

/// The pause before each arm's block of runs when more than one thread runs.
pub const SETTLE_MS: u64 = 300;

/// One arm's timings (milliseconds per run).
pub struct Arm {
    pub name: &'static str,
    pub times: Vec<f64>,
}

impl Arm {
    pub fn median(&self) -> f64 {
        median(&self.times)
    }
    pub fn min(&self) -> f64 {
        self.times.iter().copied().fold(f64::INFINITY, f64::min)
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What `--vs-ort` measured.
pub struct Report {
    pub lib: PathBuf,
    /// The model ONNX Runtime ran.
    pub ort_model: PathBuf,
    pub version: String,
    pub threads: usize,
    pub rounds: usize,
    pub runs: usize,
    pub warmup: usize,
    pub nxrt: Arm,
    pub ort: Arm,
    pub control: Arm,
    /// Per output: the largest absolute difference of nxrt's values from ORT's (float outputs),
    /// or whether they are equal (other types).
    pub agreement: Vec<(String, Json)>,
}

impl Report {
    pub fn ratio_median(&self) -> f64 {
        self.nxrt.median() / self.ort.median()
    }
    pub fn ratio_min(&self) -> f64 {
        self.nxrt.min() / self.ort.min()
    }
    pub fn control_ratio(&self) -> f64 {
        self.nxrt.median() / self.control.median()
    }

    pub fn json(&self) -> Json {
        let arm =
            |a: &Arm| json!({"median_ms": a.median(), "min_ms": a.min(), "runs": a.times.len()});
        json!({
            "ort_lib": self.lib.display().to_string(),
            "ort_model": self.ort_model.display().to_string(),
            "ort_version": self.version,
            "threads": self.threads,
            "rounds": self.rounds,
            "runs_per_round": self.runs,
            "warmup": self.warmup,
            "nxrt": arm(&self.nxrt),
            "ort": arm(&self.ort),
            "nxrt_control": arm(&self.control),
            "ratio_median": self.ratio_median(),
            "ratio_min": self.ratio_min(),
            "control_ratio_median": self.control_ratio(),
            "outputs": self.agreement.iter().cloned().collect::<serde_json::Map<_, _>>(),
        })
    }

    pub fn text(&self, model: &Path) -> String {
        let mut s = format!(
            "{}: nxrt vs ONNX Runtime {} (CPU EP, in this process), {} thread(s), {} rounds x {} runs per arm ({} warm-up)\n",
            model.display(),
            self.version,
            self.threads,
            self.rounds,
            self.runs,
            self.warmup
        );
        if self.ort_model != model {
            s += &format!("  ONNX Runtime runs {}\n", self.ort_model.display());
        }
        for a in [&self.nxrt, &self.ort, &self.control] {
            s += &format!(
                "  {:<15} median {:.3} ms, min {:.3} ms\n",
                a.name,
                a.median(),
                a.min()
            );
        }
        s += &format!(
            "  nxrt/ort: {:.3} (median), {:.3} (min); null control nxrt/nxrt: {:.3}\n",
            self.ratio_median(),
            self.ratio_min(),
            self.control_ratio()
        );
        for (name, v) in &self.agreement {
            s += &format!("  output {name}: {v}\n");
        }
        s
    }
}

fn ort_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Other(format!("onnxruntime: {what}: {e}"))
}

/// ONNX Runtime's shared library: `--ort-lib`, else `$ORT_DYLIB_PATH`, else the one the
/// `onnxruntime` Python package ships (`capi/libonnxruntime.so*`), asked of the corpus venv's
/// python (`$NXRT_CACHE/corpus-venv`) and then of `python3`.
pub fn find_lib(given: Option<&Path>) -> Result<PathBuf, Error> {
    let explain = "give --ort-lib PATH (the onnxruntime wheel ships onnxruntime/capi/libonnxruntime.so.*) or set ORT_DYLIB_PATH";
    if let Some(p) = given {
        return if p.is_file() {
            Ok(std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()))
        } else {
            Err(Error::Io(format!(
                "--ort-lib {}: no such file",
                p.display()
            )))
        };
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::Io(format!(
                "ORT_DYLIB_PATH={}: no such file",
                p.display()
            )))
        };
    }
    let cache = std::env::var_os("NXRT_CACHE").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache")
                .join("nxrt")
        },
        PathBuf::from,
    );
    let pythons = [
        cache.join("corpus-venv").join("bin").join("python"),
        PathBuf::from("python3"),
    ];
    let probe = "import glob, os, onnxruntime as o; d = os.path.join(os.path.dirname(o.__file__), 'capi'); \
                 print(sorted(glob.glob(os.path.join(d, 'libonnxruntime.so*')) + glob.glob(os.path.join(d, 'libonnxruntime*.dylib')) + glob.glob(os.path.join(d, 'onnxruntime.dll')))[0])";
    for py in pythons {
        let Ok(out) = std::process::Command::new(&py).args(["-c", probe]).output() else {
            continue;
        };
        if out.status.success() {
            let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(Error::Io(format!(
        "ONNX Runtime's library not found: {explain}"
    )))
}

/// ONNX Runtime's version: from the library's file name (`libonnxruntime.so.1.32.0`, after
/// links), else from its build information (`git-branch=rel-1.32.0`), else "unknown".
fn version_of(lib: &Path) -> String {
    let real = std::fs::canonicalize(lib).unwrap_or_else(|_| lib.to_path_buf());
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let from_name = name
        .split_once(".so.")
        .map(|(_, v)| v.to_string())
        .or_else(|| {
            let stem = name.strip_suffix(".dylib")?;
            stem.split_once('.').map(|(_, v)| v.to_string())
        })
        .filter(|v| v.split('.').all(|p| p.parse::<u32>().is_ok()));
    from_name
        .or_else(|| {
            ort::info()
                .split(|c: char| c == ',' || c.is_whitespace())
                .find_map(|f| f.strip_prefix("git-branch=rel-"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// One nxrt tensor as an ORT value of the same type, shape and contents.
fn to_ort(name: &str, t: &Tensor) -> Result<DynValue, Error> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    macro_rules! typed {
        ($t:ty) => {
            ort::value::Tensor::<$t>::from_array((shape, t.as_slice::<$t>()?.into_owned()))
                .map(|v| v.into_dyn())
                .map_err(|e| ort_err(&format!("input {name}"), e))
        };
    }
    match t.dtype() {
        DataType::Float => typed!(f32),
        DataType::Double => typed!(f64),
        DataType::Float16 => typed!(half::f16),
        DataType::Bfloat16 => typed!(half::bf16),
        DataType::Int8 => typed!(i8),
        DataType::Int16 => typed!(i16),
        DataType::Int32 => typed!(i32),
        DataType::Int64 => typed!(i64),
        DataType::Uint8 => typed!(u8),
        DataType::Uint16 => typed!(u16),
        DataType::Uint32 => typed!(u32),
        DataType::Uint64 => typed!(u64),
        DataType::Bool => typed!(bool),
        other => Err(Error::Input(format!(
            "--vs-ort: input {name} is {other:?}, which this comparison does not pass to ONNX Runtime"
        ))),
    }
}

/// How nxrt's output agrees with ORT's: the largest absolute difference for float types (NaN
/// where one is NaN and the other not), equality for the rest.
fn agree(ours: &Value, theirs: &DynValue) -> Json {
    let Value::Tensor(t) = ours else {
        return json!("not a tensor (not compared)");
    };
    let float = matches!(
        t.dtype(),
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
    );
    if float {
        let Ok(a) = t.to_f32_vec() else {
            return json!("not compared");
        };
        let b: Vec<f32> = if let Ok((_, v)) = theirs.try_extract_tensor::<f32>() {
            v.to_vec()
        } else if let Ok((_, v)) = theirs.try_extract_tensor::<f64>() {
            v.iter().map(|&x| x as f32).collect()
        } else if let Ok((_, v)) = theirs.try_extract_tensor::<half::f16>() {
            v.iter().map(|x| x.to_f32()).collect()
        } else if let Ok((_, v)) = theirs.try_extract_tensor::<half::bf16>() {
            v.iter().map(|x| x.to_f32()).collect()
        } else {
            return json!("ONNX Runtime's output has another type");
        };
        if a.len() != b.len() {
            return json!(format!(
                "sizes differ: nxrt {} values, ONNX Runtime {}",
                a.len(),
                b.len()
            ));
        }
        let mut worst = 0f64;
        for (x, y) in a.iter().zip(&b) {
            let d = if x.is_nan() || y.is_nan() {
                if x.is_nan() && y.is_nan() {
                    0.0
                } else {
                    f64::NAN
                }
            } else if x == y {
                0.0
            } else {
                (*x as f64 - *y as f64).abs()
            };
            if d.is_nan() || d > worst {
                worst = d;
            }
            if worst.is_nan() {
                break;
            }
        }
        // the scale the difference is to be read against
        let scale = b
            .iter()
            .filter(|y| y.is_finite())
            .fold(0f64, |m, y| m.max(y.abs() as f64));
        return json!({
            "max_abs_diff": if worst.is_nan() { Json::Null } else { json!(worst) },
            "max_abs_ort": scale,
        });
    }
    macro_rules! eq {
        ($ty:ty) => {
            match (t.as_slice::<$ty>(), theirs.try_extract_tensor::<$ty>()) {
                (Ok(a), Ok((_, b))) => json!({ "equal": a.as_ref() == b }),
                _ => json!("not compared"),
            }
        };
    }
    match t.dtype() {
        DataType::Int64 => eq!(i64),
        DataType::Int32 => eq!(i32),
        DataType::Int8 => eq!(i8),
        DataType::Uint8 => eq!(u8),
        DataType::Bool => eq!(bool),
        _ => json!("not compared"),
    }
}

/// Runs the three arms (see the module's description): `session` and `control` are two nxrt
/// sessions of one model with the same options; ONNX Runtime runs `ort_model` (that model,
/// or a twin it can run where it has no kernel for the model's own form).
#[allow(clippy::too_many_arguments)]
pub fn compare(
    ort_model: &Path,
    lib: &Path,
    session: &Session,
    control: &Session,
    feeds: &[(String, Value)],
    warmup: usize,
    runs: usize,
    rounds: usize,
) -> Result<Report, Error> {
    let threads = session.threads();
    let env = ort::init_from(lib)
        .map_err(|e| ort_err("loading the library", e))?
        .with_name("nxrt-bench")
        .with_telemetry(false)
        .build()
        .map_err(|e| ort_err("environment", e))?;
    let version = version_of(lib);
    let mut ort_session = ort::session::Session::builder(&env)
        .map_err(|e| ort_err("session options", e))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| ort_err("optimization level", e))?
        .with_intra_threads(threads)
        .map_err(|e| ort_err("intra-op threads", e))?
        .with_inter_threads(1)
        .map_err(|e| ort_err("inter-op threads", e))?
        .with_parallel_execution(false)
        .map_err(|e| ort_err("sequential execution", e))?
        .commit_from_file(ort_model)
        .map_err(|e| ort_err(&format!("loading {}", ort_model.display()), e))?;
    let mut ort_inputs: Vec<(String, DynValue)> = Vec::new();
    for (name, v) in feeds {
        let Value::Tensor(t) = v else {
            return Err(Error::Input(format!(
                "--vs-ort: input {name} is not a tensor"
            )));
        };
        ort_inputs.push((name.clone(), to_ort(name, t)?));
    }
    let inputs = || -> Vec<(Cow<'_, str>, SessionInputValue<'_>)> {
        ort_inputs
            .iter()
            .map(|(n, v)| (Cow::Borrowed(n.as_str()), SessionInputValue::from(v)))
            .collect()
    };
    // the answers, compared once before timing
    let ours = session.run(feeds.to_vec())?;
    let mut agreement = Vec::new();
    {
        let theirs = ort_session.run(inputs()).map_err(|e| ort_err("run", e))?;
        for name in theirs.keys() {
            let verdict = match (ours.get(name), theirs.get(name)) {
                (Some(o), Some(v)) => agree(o, v),
                _ => json!("nxrt has no output of this name"),
            };
            agreement.push((name.to_string(), verdict));
        }
    }
    let mut arms = [
        Arm {
            name: "nxrt",
            times: Vec::new(),
        },
        Arm {
            name: "onnxruntime",
            times: Vec::new(),
        },
        Arm {
            name: "nxrt (control)",
            times: Vec::new(),
        },
    ];
    let one = |arm: usize, ort_session: &mut ort::session::Session| -> Result<f64, Error> {
        let t0 = Instant::now();
        match arm {
            0 => drop(session.run(feeds.to_vec())?),
            1 => drop(ort_session.run(inputs()).map_err(|e| ort_err("run", e))?),
            _ => drop(control.run(feeds.to_vec())?),
        }
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    for arm in 0..3 {
        for _ in 0..warmup {
            one(arm, &mut ort_session)?;
        }
    }
    for r in 0..rounds.max(1) {
        for k in 0..3 {
            let arm = (r + k) % 3;
            if threads > 1 {
                // ONNX Runtime's idle workers spin for a while after a run: let them stop, or
                // the arm timed right after it shares the cores with them
                std::thread::sleep(std::time::Duration::from_millis(SETTLE_MS));
            }
            for _ in 0..runs.max(1) {
                let t = one(arm, &mut ort_session)?;
                arms[arm].times.push(t);
            }
        }
    }
    let [nxrt, ort, control] = arms;
    Ok(Report {
        lib: lib.to_path_buf(),
        ort_model: ort_model.to_path_buf(),
        version,
        threads,
        rounds: rounds.max(1),
        runs: runs.max(1),
        warmup,
        nxrt,
        ort,
        control,
        agreement,
    })
}
