//! `nxrt bench MODEL --vs-ort`: ONNX Runtime's CPU EP timed in nxrt's process through its C API
//! (the `onnxruntime` wheel's library, found through the corpus venv's python), arms
//! interleaved with nxrt and a null control (MiniLM: int64 inputs, float outputs); and the
//! errors when it cannot run.

use std::path::PathBuf;
use std::process::Command;

use nxrt_tests::{cache_dir, nxrt_bin, nxrt_json};

/// The wheel's library is reachable the way `nxrt` looks for it (ORT_DYLIB_PATH, or the corpus
/// venv's onnxruntime); without it the timing test prints why and passes.
fn ort_reachable() -> bool {
    std::env::var_os("ORT_DYLIB_PATH").is_some()
        || cache_dir()
            .join("corpus-venv")
            .join("bin")
            .join("python")
            .exists()
}

fn model(name: &str) -> Option<PathBuf> {
    let p = cache_dir().join("corpus").join(name).join("model.onnx");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: no {} (the test run's set-up fetches the corpus)",
            p.display()
        );
        None
    }
}

#[test]
fn the_in_process_comparison_times_three_arms_and_checks_the_answers() {
    if !ort_reachable() {
        eprintln!("skipped: no ONNX Runtime library (no corpus venv, no ORT_DYLIB_PATH)");
        return;
    }
    let Some(m) = model("minilm_l6_v2") else {
        return;
    };
    let (rounds, runs) = (3, 2);
    // the reference case's input, so the outputs are the model's real scale
    let case = m.parent().unwrap().join("ref");
    let case = std::fs::read_dir(&case)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .min()
        .expect("a reference case");
    let io: serde_json::Value =
        serde_json::from_slice(&std::fs::read(case.join("io.json")).unwrap()).unwrap();
    let mut inputs = Vec::new();
    for i in io["inputs"].as_array().unwrap() {
        inputs.push("--input".to_string());
        inputs.push(format!(
            "{}={}",
            i["name"].as_str().unwrap(),
            case.join(i["file"].as_str().unwrap()).display()
        ));
    }
    let mut args = vec![
        "bench".to_string(),
        m.display().to_string(),
        "--vs-ort".into(),
        "--threads".into(),
        "1".into(),
        "--warmup".into(),
        "1".into(),
        "--runs".into(),
        runs.to_string(),
        "--rounds".into(),
        rounds.to_string(),
        "--json".into(),
    ];
    args.extend(inputs);
    let j = nxrt_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let v = &j["vs_ort"];
    assert!(
        v["ort_version"].as_str().unwrap_or("").starts_with("1."),
        "the library's version is named: {v}"
    );
    assert_eq!(v["threads"], 1, "--threads sets ONNX Runtime's threads too");
    for arm in ["nxrt", "ort", "nxrt_control"] {
        let a = &v[arm];
        assert_eq!(
            a["runs"].as_u64(),
            Some((rounds * runs) as u64),
            "{arm}: every round runs every arm --runs times"
        );
        let (med, min) = (
            a["median_ms"].as_f64().unwrap(),
            a["min_ms"].as_f64().unwrap(),
        );
        assert!(min > 0.0 && min <= med, "{arm}: min {min} <= median {med}");
    }
    let ratio = v["nxrt"]["median_ms"].as_f64().unwrap() / v["ort"]["median_ms"].as_f64().unwrap();
    assert!((v["ratio_median"].as_f64().unwrap() - ratio).abs() < 1e-9 * ratio);
    // the bench object keeps its fields (nxrt's arm)
    assert_eq!(j["median_ms"], v["nxrt"]["median_ms"]);
    // both runtimes ran the same inputs: their outputs agree
    let outs = v["outputs"].as_object().expect("per-output agreement");
    assert!(!outs.is_empty(), "the model's outputs are compared");
    for (name, o) in outs {
        let d = o["max_abs_diff"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}: {o}"));
        let scale = o["max_abs_ort"].as_f64().unwrap();
        assert!(
            scale > 0.1,
            "{name}: the reference input gives real outputs ({scale})"
        );
        assert!(
            d <= 1e-4 * scale.max(1.0),
            "{name}: nxrt and ONNX Runtime differ by {d} (scale {scale})"
        );
    }
}

#[test]
fn an_unreachable_library_or_a_device_provider_is_a_one_line_error() {
    let Some(m) = model("ort_sigmoid") else {
        return;
    };
    let run = |args: &[&str]| {
        let out = Command::new(nxrt_bin())
            .arg("bench")
            .arg(&m)
            .args(args)
            .output()
            .expect("start nxrt");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(!err.contains("panicked"), "{args:?}: a panic: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        err
    };
    let e = run(&["--vs-ort", "--ort-lib", "/nonexistent/libonnxruntime.so"]);
    assert!(e.contains("--ort-lib") && e.contains("no such file"), "{e}");
    // a file that is not a library: the loader's refusal, named
    let e = run(&["--vs-ort", "--ort-lib", m.to_str().unwrap()]);
    assert!(e.contains("onnxruntime: loading the library"), "{e}");
    let e = run(&["--vs-ort", "--provider", "webgpu"]);
    assert!(e.contains("--provider webgpu"), "{e}");
}
