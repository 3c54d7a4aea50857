//! Real-model parity: every public corpus model runs through `nxrt run --output-dir` on each
//! reference case, and every output matches ONNX Runtime's (floats within rtol 1e-3 + atol
//! 1e-4, the rest exactly). The onnxruntime-genai pair (`tiny_llama_genai_fp32` and `_int4`:
//! com.microsoft GroupQueryAttention, RMS norms and MatMulNBits, prefill and decode) runs on
//! both; on WebGPU every one of their ops runs on the device.
//!
//! Needs the corpus (`../shared/corpus/fetch_corpus.sh`) and the `nxrt` binary (found next to
//! this test's target dir, or at `$NXRT_BIN`). Prints each model's worst absolute/relative error.
//!
//! The same models run again with `--provider webgpu` (WebGPU first, the CPU for what it
//! declines) when the machine has a WebGPU adapter (CI: Mesa's lavapipe through Vulkan), held
//! to the same tolerance; the table adds how many nodes ran on WebGPU and how many copies the
//! partition needed. Without an adapter that test prints why and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

use nxrt::{Tensor, Value};
use nxrt_tests::{cache_dir, compare, nxrt_bin, webgpu_available, ErrStats};
use serde_json::Value as Json;

const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-4;

/// Outputs that cannot meet the strict tolerance for a measured reason other than a wrong
/// answer: (model, output or `*` for all, looser atol, why). Each is still compared, at the looser bound, and
/// reported as such. ONNX Runtime's STFT is off the exact result (reproduce with
/// `scripts/stft_accuracy.py`); the int4 model's activations are rounded to int8 (MatMulNBits
/// `accuracy_level` 4), which turns last-bit differences into whole quantization steps.
const REFERENCE_ERRORS: &[(&str, &str, f64, &str)] = &[
    (
        "asr_whisper80",
        "features",
        2e-3,
        "ORT's float32 STFT (n_fft 400) is up to 9.3e-4 off the float64 result at 28 of 240000 \
         elements; nxrt is within 1.3e-7 of it",
    ),
    (
        "tiny_llama_genai_int4",
        "*",
        4e-2,
        "MatMulNBits rounds each block of activations to int8 (accuracy_level 4), so a \
         last-bit difference upstream can land on the other int8 neighbour; our kernels round \
         as ONNX Runtime's AVX-512 VNNI ones (equal bit for bit there, where this entry is \
         not used), and on other machines ONNX Runtime's own kernels round otherwise (before \
         they were matched: up to 1.7e-2 in logits over a 64-token prefill); on WebGPU every \
         op before a quantization rounds as the GPU does (1.6e-2 over the prefill)",
    ),
];

/// Whether a [`REFERENCE_ERRORS`] entry applies on this machine and provider: the int4
/// model's is for WebGPU and for machines where ONNX Runtime's int4 kernels are not the AVX-512
/// VNNI ones ours reproduce (there, on the CPU, its outputs must be within the strict
/// tolerance: measured equal bit for bit).
fn reference_error_applies(model: &str, provider: &str) -> bool {
    model != "tiny_llama_genai_int4"
        || provider != "cpu"
        || nxrt_core::simd::q4_isa().0 != nxrt_core::simd::Isa::Avx512
}

fn safe(name: &str) -> String {
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

/// The ZipMap reference (a JSON list of {label: prob}) as our value type.
fn zipmap_from_json(j: &Json) -> Value {
    let items = j
        .as_array()
        .expect("list of maps")
        .iter()
        .map(|m| {
            let m = m.as_object().expect("map");
            let mut keys: Vec<i64> = m.keys().map(|k| k.parse().expect("int key")).collect();
            keys.sort_unstable();
            let values = keys
                .iter()
                .map(|k| Value::Tensor(Tensor::scalar(m[&k.to_string()].as_f64().unwrap() as f32)))
                .collect();
            Value::Map(nxrt_core::value::MapValue {
                keys: Tensor::from_vec(&[keys.len()], keys).unwrap(),
                values,
            })
        })
        .collect();
    Value::Sequence {
        elem: nxrt::TypeInfo::Unknown,
        items,
    }
}

/// Our ZipMap output with keys sorted (map order is not part of the contract).
fn sorted_maps(v: Value) -> Value {
    match v {
        Value::Sequence { elem, items } => Value::Sequence {
            elem,
            items: items.into_iter().map(sorted_maps).collect(),
        },
        Value::Map(m) => {
            let keys = m.keys.to_i64_vec().unwrap();
            let mut idx: Vec<usize> = (0..keys.len()).collect();
            idx.sort_by_key(|&i| keys[i]);
            let sk: Vec<i64> = idx.iter().map(|&i| keys[i]).collect();
            Value::Map(nxrt_core::value::MapValue {
                keys: Tensor::from_vec(&[sk.len()], sk).unwrap(),
                values: idx.iter().map(|&i| m.values[i].clone()).collect(),
            })
        }
        other => other,
    }
}

fn check_case(
    bin: &Path,
    provider: &str,
    model_name: &str,
    model: &Path,
    case_dir: &Path,
    out_dir: &Path,
    notes: &mut Vec<String>,
) -> Result<ErrStats, String> {
    let io: Json = serde_json::from_slice(
        &std::fs::read(case_dir.join("io.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    // two runs: the first records and plans, the second (whose outputs are written) runs from
    // the planned arena
    cmd.arg("run")
        .arg(model)
        .arg("--provider")
        .arg(provider)
        .arg("--runs")
        .arg("2")
        .arg("--output-dir")
        .arg(out_dir);
    for i in io["inputs"].as_array().unwrap() {
        cmd.arg("--input").arg(format!(
            "{}={}",
            i["name"].as_str().unwrap(),
            case_dir.join(i["file"].as_str().unwrap()).display()
        ));
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "nxrt run failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut stats = ErrStats::default();
    for o in io["outputs"].as_array().unwrap() {
        let name = o["name"].as_str().unwrap();
        let file = o["file"].as_str().unwrap();
        let (got, want) = if file.ends_with(".json") {
            let pb = out_dir.join(format!("{}.pb", safe(name)));
            let bytes = std::fs::read(&pb).map_err(|e| format!("{}: {e}", pb.display()))?;
            let ty = nxrt::TypeInfo::Sequence(Box::new(nxrt::TypeInfo::Unknown));
            let got = nxrt_core::loader::value_from_proto_bytes(&bytes, &ty)
                .map_err(|e| e.to_string())?;
            let j: Json =
                serde_json::from_slice(&std::fs::read(case_dir.join(file)).unwrap()).unwrap();
            (sorted_maps(got), zipmap_from_json(&j))
        } else {
            let npy = out_dir.join(format!("{}.npy", safe(name)));
            let got = nxrt::npy::read_npy(
                &std::fs::read(&npy).map_err(|e| format!("{}: {e}", npy.display()))?,
            )
            .map_err(|e| e.to_string())?;
            let want = nxrt::npy::read_npy(&std::fs::read(case_dir.join(file)).unwrap())
                .map_err(|e| e.to_string())?;
            (Value::Tensor(got), Value::Tensor(want))
        };
        if let Err(e) = compare(&got, &want, RTOL, ATOL, &mut stats) {
            let known = REFERENCE_ERRORS
                .iter()
                .find(|(m, o, _, _)| *m == model_name && (*o == name || *o == "*"))
                .filter(|_| reference_error_applies(model_name, provider));
            match known {
                Some((_, _, atol, why)) => {
                    compare(&got, &want, RTOL, *atol, &mut ErrStats::default())
                        .map_err(|e| format!("output '{name}' (even at atol {atol}): {e}"))?;
                    notes.push(format!(
                        "{model_name}/{name}: {e}; accepted at atol {atol}: {why}"
                    ));
                }
                None => return Err(format!("output '{name}': {e}")),
            }
        }
    }
    Ok(stats)
}

#[test]
fn corpus_models_match_onnx_runtime() {
    parity("cpu");
}

#[test]
fn corpus_models_match_onnx_runtime_on_webgpu() {
    // the embedded model is the probe: no adapter, no test
    if !webgpu_available() {
        return;
    }
    parity("webgpu");
}

/// (nodes on WebGPU, all nodes, copies) from `nxrt inspect --provider webgpu --json`.
fn webgpu_partition(bin: &Path, model: &Path) -> Option<(u64, u64, u64)> {
    let out = Command::new(bin)
        .args(["inspect", "--json", "--provider", "webgpu"])
        .arg(model)
        .output()
        .ok()?;
    let j: Json = serde_json::from_slice(&out.stdout).ok()?;
    // the adapter the partition was made for is named, with its float16 support and limits
    let dev = j["partition"]["devices"][0]["device"]
        .as_str()
        .unwrap_or("");
    assert!(
        j["partition"]["devices"][0]["provider"] == "webgpu"
            && dev.contains("shader-f16")
            && dev.contains("maxStorageBufferBindingSize"),
        "inspect names no WebGPU device: {}",
        j["partition"]["devices"]
    );
    let per = j["partition"]["nodes_per_provider"].as_array()?;
    let count = |name: &str| {
        per.iter()
            .filter(|p| p["provider"] == name)
            .filter_map(|p| p["nodes"].as_u64())
            .sum::<u64>()
    };
    let all: u64 = per.iter().filter_map(|p| p["nodes"].as_u64()).sum();
    Some((count("webgpu"), all, j["partition"]["copies"].as_u64()?))
}

fn parity(provider: &str) {
    let corpus = cache_dir().join("corpus");
    assert!(
        corpus.join("manifest.json").exists(),
        "no corpus at {}: run ../shared/corpus/fetch_corpus.sh (the README's test command does)",
        corpus.display()
    );
    let bin = nxrt_bin();
    assert!(
        bin.exists(),
        "nxrt binary not found at {} (build it, or set NXRT_BIN)",
        bin.display()
    );
    let mut models: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    models.sort();
    assert!(
        models.len() >= 19,
        "expected the 19 corpus models, found {}",
        models.len()
    );
    let tmp = std::env::temp_dir().join(format!("nxrt-parity-{provider}-{}", std::process::id()));
    let mut failures = Vec::new();
    println!(
        "{:<24} {:<16} {:>12} {:>12}  result",
        "model", "case", "max abs err", "max rel err"
    );
    for m in &models {
        let name = m.file_name().unwrap().to_string_lossy().to_string();
        if provider == "webgpu" {
            if let Some((on, all, copies)) = webgpu_partition(&bin, &m.join("model.onnx")) {
                println!("{name:<24} partition: {on} of {all} nodes on webgpu, {copies} copies");
            }
        }
        let mut cases: Vec<PathBuf> = std::fs::read_dir(m.join("ref"))
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        cases.sort();
        assert!(!cases.is_empty(), "{name} has no reference cases");
        for c in cases {
            let case = c.file_name().unwrap().to_string_lossy().to_string();
            let out = tmp.join(&name).join(&case);
            std::fs::create_dir_all(&out).unwrap();
            let mut notes = Vec::new();
            match check_case(
                &bin,
                provider,
                &name,
                &m.join("model.onnx"),
                &c,
                &out,
                &mut notes,
            ) {
                Ok(s) => {
                    let tag = if notes.is_empty() {
                        "ok"
                    } else {
                        "ok (reference error, see note)"
                    };
                    println!(
                        "{name:<24} {case:<16} {:>12.3e} {:>12.3e}  {tag}",
                        s.max_abs, s.max_rel
                    );
                    for n in notes {
                        println!("    note: {n}");
                    }
                }
                Err(e) => {
                    println!("{name:<24} {case:<16} {:>12} {:>12}  FAIL {e}", "-", "-");
                    failures.push(format!("{name}/{case}: {e}"));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        failures.is_empty(),
        "{} case(s) differ from ONNX Runtime on {provider}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
