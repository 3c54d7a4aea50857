//! Quantized-model parity: every model of the quantized set (`../shared/quant/fetch_quant.sh`:
//! int8 QDQ and QOperator, dynamic int8, MatMulNBits 4/8-bit, MXFP4 matmuls and an MXFP4
//! mixture of experts) runs through `nxrt run --output-dir` on its reference case, and every
//! output is judged by the set's rule (`../shared/README.md`): integers exactly; floats within
//! 4 steps + 1e-3 |ref|, a step being the scale of the last DequantizeLinear feeding the
//! output, else within 2.5e-3 max |ref| (7.5e-3 after dynamic quantization) + 1e-3 |ref|.
//!
//! "The last DequantizeLinear feeding the output" is found by walking back from the output
//! through ops that only move or reshape values; an output computed by anything else (a float
//! MatMul, a LayerNormalization) takes the fallback bound.
//!
//! The MatMulNBits models run again on WebGPU when the machine has an adapter.

use std::path::{Path, PathBuf};
use std::process::Command;

use nxrt::{Tensor, Value};
use nxrt_core::ir::Graph;
use nxrt_tests::{cache_dir, nxrt_bin, webgpu_available};
use serde_json::Value as Json;

/// Ops an output's value passes through unchanged (but for its shape or order).
const MOVES: &[&str] = &[
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Identity",
];

/// The step of output `name`: the (largest) scale of the DequantizeLinear reached by walking
/// back through [`MOVES`], if any.
fn step_of(g: &Graph, name: &str) -> Option<f64> {
    let mut id = g.find_value(name)?;
    loop {
        let node = g
            .nodes
            .iter()
            .find(|n| n.outputs.iter().flatten().any(|&o| o == id))?;
        if node.op_type == "DequantizeLinear" && node.domain.is_empty() {
            let scale = (*node.inputs.get(1)?)?;
            let (_, v) = g.initializers.iter().find(|(i, _)| *i == scale)?;
            let Value::Tensor(t) = v else { return None };
            return t
                .to_f32_vec()
                .ok()?
                .into_iter()
                .map(|s| s.abs() as f64)
                .reduce(f64::max);
        }
        if !MOVES.contains(&node.op_type.as_str()) || !node.domain.is_empty() {
            return None;
        }
        id = (*node.inputs.first()?)?;
    }
}

fn check(bin: &Path, provider: &str, dir: &Path, out: &Path) -> Result<String, String> {
    let model = dir.join("model.onnx");
    let bytes = std::fs::read(&model).map_err(|e| e.to_string())?;
    let m = nxrt_core::loader::load_model(&bytes, &nxrt_core::loader::NoExternalData)
        .map_err(|e| e.to_string())?;
    let dynamic = m
        .graph
        .nodes
        .iter()
        .any(|n| n.op_type == "DynamicQuantizeLinear");
    let case = dir.join("ref").join("default");
    let io: Json = serde_json::from_slice(&std::fs::read(case.join("io.json")).unwrap()).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg(&model)
        .args(["--provider", provider, "--runs", "2", "--output-dir"])
        .arg(out);
    for i in io["inputs"].as_array().unwrap() {
        cmd.arg("--input").arg(format!(
            "{}={}",
            i["name"].as_str().unwrap(),
            case.join(i["file"].as_str().unwrap()).display()
        ));
    }
    let r = cmd.output().map_err(|e| e.to_string())?;
    if !r.status.success() {
        return Err(format!(
            "nxrt run failed: {}",
            String::from_utf8_lossy(&r.stderr).trim()
        ));
    }
    let mut report = Vec::new();
    for o in io["outputs"].as_array().unwrap() {
        let name = o["name"].as_str().unwrap();
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let read = |p: PathBuf| -> Result<Tensor, String> {
            nxrt::npy::read_npy(&std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?)
                .map_err(|e| e.to_string())
        };
        let got = read(out.join(format!("{safe}.npy")))?;
        let want = read(case.join(o["file"].as_str().unwrap()))?;
        if got.shape() != want.shape() || got.dtype() != want.dtype() {
            return Err(format!(
                "{name}: {:?} {:?} where the reference is {:?} {:?}",
                got.dtype(),
                got.shape(),
                want.dtype(),
                want.shape()
            ));
        }
        if !want.dtype().is_float() {
            let (g, w) = (got.to_i64_vec().unwrap(), want.to_i64_vec().unwrap());
            if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
                return Err(format!(
                    "{name}[{i}]: {} where the reference is {}",
                    g[i], w[i]
                ));
            }
            report.push(format!("{name}: exact"));
            continue;
        }
        let (g, w) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
        let max_ref = w.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let step = step_of(&m.graph, name);
        let atol = match step {
            Some(s) => 4.0 * s,
            None => (if dynamic { 7.5e-3 } else { 2.5e-3 }) * max_ref,
        };
        let mut worst = (0f64, 0usize);
        for i in 0..g.len() {
            let (a, b) = (g[i] as f64, w[i] as f64);
            let d = (a - b).abs();
            if d.is_nan() || d > atol + 1e-3 * b.abs() {
                return Err(format!(
                    "{name}[{i}]: {a} where the reference is {b} (|diff| {d:.3e} > {atol:.3e} + 1e-3 |ref|; step {step:?})"
                ));
            }
            if d > worst.0 {
                worst = (d, i);
            }
        }
        let unit = match step {
            Some(s) => format!("{:.2} steps of {s:.3e}", worst.0 / s),
            None => format!(
                "{:.2e} of max|ref| {max_ref:.3e}",
                worst.0 / max_ref.max(1e-30)
            ),
        };
        report.push(format!("{name}: max |diff| {:.3e} ({unit})", worst.0));
    }
    Ok(report.join("; "))
}

fn parity(provider: &str, only: impl Fn(&str) -> bool) {
    let quant = cache_dir().join("quant");
    assert!(
        quant.join("manifest.json").exists(),
        "no quantized set at {}: run ../shared/quant/fetch_quant.sh (the README's test command does)",
        quant.display()
    );
    let bin = nxrt_bin();
    let mut models: Vec<PathBuf> = std::fs::read_dir(&quant)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    models.sort();
    assert!(
        models.len() >= 11,
        "expected the 11 quantized models, found {}",
        models.len()
    );
    let tmp = std::env::temp_dir().join(format!("nxrt-quant-{provider}-{}", std::process::id()));
    let mut failures = Vec::new();
    let mut ran = 0;
    for m in &models {
        let name = m.file_name().unwrap().to_string_lossy().to_string();
        if !only(&name) {
            continue;
        }
        ran += 1;
        let out = tmp.join(&name);
        std::fs::create_dir_all(&out).unwrap();
        match check(&bin, provider, m, &out) {
            Ok(r) => println!("{name:<32} ok   {r}"),
            Err(e) => {
                println!("{name:<32} FAIL {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(ran > 0, "no model ran on {provider}");
    assert!(
        failures.is_empty(),
        "{} quantized model(s) outside the rule on {provider}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn quantized_models_match_onnx_runtime_within_the_rule() {
    parity("cpu", |_| true);
}

#[test]
fn matmul_nbits_models_match_on_webgpu() {
    if !webgpu_available() {
        return;
    }
    parity("webgpu", |n| n.contains("nbits"));
}
