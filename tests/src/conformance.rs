//! ONNX backend node-test runner: loads every case that `../shared/conformance/fetch-node-tests.sh`
//! wrote, runs it on nxrt's native CPU provider, compares with the case's expected outputs at the
//! manifest's tolerances, prints `N passed, M failed`, and writes the per-case result to JSON.
//!
//! usage: conformance [--dir DIR] [--filter SUBSTR[|SUBSTR...]] [--out FILE] [--baseline FILE]
//!                    [--verbose] [--timeout SECS]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nxrt::Session;
use nxrt_core::conformance::{self, Outcome};
use nxrt_tests::cache_dir;
use serde_json::{json, Value as Json};

struct Opts {
    dir: PathBuf,
    filter: Vec<String>,
    out: Option<PathBuf>,
    baseline: Option<PathBuf>,
    verbose: bool,
    timeout: u64,
}

/// `--mode eager`: run each case once, eagerly (default: planned, run twice).
static EAGER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn parse() -> Opts {
    let mut o = Opts {
        dir: cache_dir().join("conformance"),
        filter: vec![],
        out: None,
        baseline: None,
        verbose: false,
        timeout: 60,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => o.dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--filter" => {
                o.filter = args
                    .next()
                    .expect("--filter PATTERN")
                    .split('|')
                    .map(String::from)
                    .collect()
            }
            "--out" => o.out = Some(PathBuf::from(args.next().expect("--out FILE"))),
            "--baseline" => o.baseline = Some(PathBuf::from(args.next().expect("--baseline FILE"))),
            "--verbose" | "-v" => o.verbose = true,
            "--mode" => {
                let m = args.next().expect("--mode eager|planned");
                EAGER.store(m == "eager", std::sync::atomic::Ordering::Relaxed);
            }
            "--timeout" => {
                o.timeout = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--timeout SECS")
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    o
}

/// Reads `test_data_set_0/{prefix}_0.pb`, `_1.pb`, ... while they exist.
fn read_set(dir: &Path, prefix: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        out.push(std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    Ok(out)
}

fn run_case(case_dir: &Path, rtol: f64, atol: f64) -> Outcome {
    let model = case_dir.join("model.onnx");
    let mode = if EAGER.load(std::sync::atomic::Ordering::Relaxed) {
        nxrt::ExecMode::Eager
    } else {
        nxrt::ExecMode::Planned
    };
    let session = match Session::builder().mode(mode).load(&model) {
        Ok(s) => s,
        Err(e) => return conformance::load_error(e),
    };
    let set = case_dir.join("test_data_set_0");
    let (ins, outs) = match (read_set(&set, "input"), read_set(&set, "output")) {
        (Ok(i), Ok(o)) => (i, o),
        (Err(e), _) | (_, Err(e)) => return Outcome::Error(e),
    };
    // In planned mode the first run records sizes and builds the memory plan; the second runs
    // from the arena. Both must match.
    let runs = if mode == nxrt::ExecMode::Planned {
        2
    } else {
        1
    };
    pollster::block_on(conformance::check_case(
        session.core(),
        &ins,
        &outs,
        rtol,
        atol,
        runs,
    ))
}

fn main() {
    let o = parse();
    let manifest_path = o.dir.join("node_manifest.json");
    let manifest: Json = match std::fs::read(&manifest_path) {
        Ok(b) => serde_json::from_slice(&b).expect("manifest is JSON"),
        Err(e) => {
            eprintln!(
                "{}: {e}\nfetch the node tests first: ../shared/conformance/fetch-node-tests.sh {}",
                manifest_path.display(),
                o.dir.display()
            );
            std::process::exit(2);
        }
    };
    let cases = manifest["cases"].as_object().expect("manifest has cases");
    let t0 = Instant::now();
    let mut results: BTreeMap<String, String> = BTreeMap::new();
    let (mut pass, mut fail, mut err) = (0usize, 0usize, 0usize);
    for (name, meta) in cases {
        if !o.filter.is_empty() && !o.filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let rtol = meta["rtol"].as_f64().unwrap_or(1e-3);
        let atol = meta["atol"].as_f64().unwrap_or(1e-7);
        let dir = o.dir.join("node").join(name);
        let (tx, rx) = mpsc::channel();
        let d = dir.clone();
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || {
                let r = std::panic::catch_unwind(|| run_case(&d, rtol, atol));
                let _ = tx.send(match r {
                    Ok(o) => o,
                    Err(p) => Outcome::Error(format!(
                        "PANIC: {}",
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    )),
                });
            })
            .expect("spawn");
        let outcome = rx
            .recv_timeout(Duration::from_secs(o.timeout))
            .unwrap_or_else(|_| Outcome::Error(format!("timeout after {} s", o.timeout)));
        let (tag, msg) = match outcome {
            Outcome::Pass => {
                pass += 1;
                ("pass", String::new())
            }
            Outcome::Fail(m) => {
                fail += 1;
                ("FAIL", m)
            }
            Outcome::Error(m) => {
                err += 1;
                ("ERROR", m)
            }
        };
        if o.verbose || tag != "pass" && !o.filter.is_empty() {
            println!("{tag:5} {name} {msg}");
        }
        let mut m = msg.replace('\n', " ");
        if m.len() > 300 {
            let mut cut = 300;
            while !m.is_char_boundary(cut) {
                cut -= 1;
            }
            m.truncate(cut);
        }
        results.insert(
            name.clone(),
            if tag == "pass" {
                "pass".into()
            } else {
                format!("{}: {m}", tag.to_lowercase())
            },
        );
    }
    let total = pass + fail + err;
    println!(
        "{pass} passed, {} failed ({fail} wrong or mismatched, {err} errors) of {total} cases in {:.1} s",
        fail + err,
        t0.elapsed().as_secs_f64()
    );
    if let Some(out) = &o.out {
        let passed: Vec<&String> = results
            .iter()
            .filter(|(_, r)| *r == "pass")
            .map(|(n, _)| n)
            .collect();
        let failing: BTreeMap<&String, &String> =
            results.iter().filter(|(_, r)| *r != "pass").collect();
        let j = json!({
            "suite": "onnx backend node tests",
            "onnx_version": manifest["onnx_version"],
            "target": "native-cpu",
            "total": total,
            "passed": pass,
            "failed": fail + err,
            "passing_cases": passed,
            "failing_cases": failing,
        });
        std::fs::write(out, serde_json::to_string_pretty(&j).unwrap() + "\n")
            .expect("write results");
        println!("wrote {}", out.display());
    }
    if let Some(b) = &o.baseline {
        let base: Json = serde_json::from_slice(&std::fs::read(b).expect("baseline file"))
            .expect("baseline JSON");
        let lost: Vec<&str> = base["passing_cases"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| results.get(*c).is_some_and(|r| r != "pass"))
            .collect();
        if !lost.is_empty() {
            println!(
                "REGRESSION: {} case(s) that passed in {} now fail:",
                lost.len(),
                b.display()
            );
            for c in &lost {
                println!("  {c}: {}", results[*c]);
            }
            std::process::exit(1);
        }
        println!("no regressions against {}", b.display());
    }
}
