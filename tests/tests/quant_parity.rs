//! Quantized-model parity: every model of the quantized set (`../shared/quant/fetch_quant.sh`:
//! int8 QDQ and QOperator, dynamic int8, MatMulNBits 4/8-bit, MXFP4 matmuls and an MXFP4
//! mixture of experts) runs through `nxrt run --output-dir` on its reference case, and every
//! output is judged by the set's rule ([`nxrt_tests::quant`]: integers exactly; floats within
//! 4 steps of the last DequantizeLinear + 1e-3 |ref|, else a fraction of max |ref|).
//!
//! The MatMulNBits models run again on WebGPU when the machine has an adapter. The wasm build
//! is judged by the same rule in `js/test/quant.test.mjs` (Node and Chromium).

use std::path::Path;
use std::process::Command;

use nxrt_tests::quant::{quant_models, QuantCase};
use nxrt_tests::{nxrt_bin, webgpu_available};

fn check(
    bin: &Path,
    (provider, extra): (&str, &[&str]),
    dir: &Path,
    out: &Path,
) -> Result<String, String> {
    let case = QuantCase::open(dir)?;
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .arg(&case.model)
        .args(["--provider", provider, "--runs", "2", "--output-dir"])
        .arg(out)
        .args(extra);
    for (name, file) in case.inputs() {
        cmd.arg("--input").arg(format!("{name}={}", file.display()));
    }
    let r = cmd.output().map_err(|e| e.to_string())?;
    if !r.status.success() {
        return Err(format!(
            "nxrt run failed: {}",
            String::from_utf8_lossy(&r.stderr).trim()
        ));
    }
    case.judge(out)
}

fn parity(provider: &str, only: impl Fn(&str) -> bool) {
    parity_with(provider, &[], only)
}

fn parity_with(provider: &str, extra: &[&str], only: impl Fn(&str) -> bool) {
    let models = quant_models().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        models.len() >= 11,
        "expected the 11 quantized models, found {}",
        models.len()
    );
    let bin = nxrt_bin();
    let tmp = std::env::temp_dir().join(format!(
        "nxrt-quant-{provider}-{}-{}",
        extra.join("-"),
        std::process::id()
    ));
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
        match check(&bin, (provider, extra), m, &out) {
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

/// The block-quantized models (MXFP4 matmuls and mixture of experts, MatMulNBits) in every arm
/// of `--block-weights` (the default, `auto`, ran above): from the codes, from the cached dense
/// copy (the second run of each reads the copy the first made), pre-expanded at load.
#[test]
fn block_weight_arms_match_onnx_runtime_within_the_rule() {
    for policy in ["codes", "cached", "expanded"] {
        parity_with("cpu", &["--block-weights", policy], |n| {
            n.contains("mxfp4") || n.contains("nbits")
        });
    }
}

#[test]
fn matmul_nbits_models_match_on_webgpu() {
    if !webgpu_available() {
        return;
    }
    parity("webgpu", |n| n.contains("nbits"));
}
