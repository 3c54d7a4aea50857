//! The quantized set's rule (`../shared/README.md`), written once for every target: the native
//! parity test (`tests/quant_parity.rs`) and the wasm ones (`js/test/quant.test.mjs`, through
//! the `quant_judge` binary) judge their outputs here.
//!
//! Integers must be exact; floats within 4 steps + 1e-3 |ref|, a step being the scale of the
//! last DequantizeLinear feeding the output, else within 2.5e-3 max |ref| (7.5e-3 after dynamic
//! quantization) + 1e-3 |ref|. "The last DequantizeLinear feeding the output" is found by
//! walking back from the output through ops that only move or reshape values; an output
//! computed by anything else (a float MatMul, a LayerNormalization) takes the fallback bound.
//!
//! An output outside the rule against the set's reference is judged again against ONNX
//! Runtime's outputs for the model's uint8-weight twin (`scripts/quant_refs.py`, written into
//! `$NXRT_CACHE/quant_refs`): on x86 without VNNI ONNX Runtime's u8s8 kernels saturate int16
//! pair sums, so its reference there departs from the ONNX definition (by up to 50 steps on the
//! set), while the twin (int8 weights as uint8 + 128, the same values) runs its exact u8u8
//! kernels. The report says which reference an output matched.

use std::path::{Path, PathBuf};

use nxrt::{Tensor, Value};
use nxrt_core::ir::Graph;
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
pub fn step_of(g: &Graph, name: &str) -> Option<f64> {
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

/// The file name `nxrt run --output-dir` (and the wasm tests) give output `name`.
pub fn npy_name(name: &str) -> String {
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
    format!("{safe}.npy")
}

/// A model of the quantized set with its reference case (`ref/default`).
pub struct QuantCase {
    pub model: PathBuf,
    pub case: PathBuf,
    pub graph: Graph,
    /// Whether the graph quantizes activations at run time (the looser fallback bound).
    pub dynamic: bool,
    io: Json,
    /// ONNX Runtime's outputs for the uint8-weight twin (`scripts/quant_refs.py`), where written.
    twin: Option<(PathBuf, Json)>,
}

impl QuantCase {
    pub fn open(dir: &Path) -> Result<Self, String> {
        let model = dir.join("model.onnx");
        let bytes = std::fs::read(&model).map_err(|e| format!("{}: {e}", model.display()))?;
        let m = nxrt_core::loader::load_model(&bytes, &nxrt_core::loader::NoExternalData)
            .map_err(|e| e.to_string())?;
        let dynamic = m
            .graph
            .nodes
            .iter()
            .any(|n| n.op_type == "DynamicQuantizeLinear");
        let case = dir.join("ref").join("default");
        let io_path = case.join("io.json");
        let io: Json = std::fs::read(&io_path)
            .map_err(|e| format!("{}: {e}", io_path.display()))
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))?;
        let twin_dir = crate::cache_dir()
            .join("quant_refs")
            .join(dir.file_name().unwrap_or_default());
        let twin = std::fs::read(twin_dir.join("io.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Json>(&b).ok())
            .map(|j| (twin_dir, j));
        Ok(QuantCase {
            model,
            case,
            graph: m.graph,
            dynamic,
            io,
            twin,
        })
    }

    /// `(input name, .npy path)` of the reference case's inputs.
    pub fn inputs(&self) -> Vec<(String, PathBuf)> {
        self.entries("inputs")
    }

    fn entries(&self, key: &str) -> Vec<(String, PathBuf)> {
        self.io[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| Some((i["name"].as_str()?, i["file"].as_str()?)))
            .map(|(n, f)| (n.to_string(), self.case.join(f)))
            .collect()
    }

    /// Judges the outputs found in `out` (one [`npy_name`] file per output) against ONNX
    /// Runtime's by the rule; returns a one-line report per output, or the first violation.
    pub fn judge(&self, out: &Path) -> Result<String, String> {
        let read = |p: &Path| -> Result<Tensor, String> {
            nxrt::npy::read_npy(&std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)
                .map_err(|e| e.to_string())
        };
        let outputs = self.entries("outputs");
        if outputs.is_empty() {
            return Err("the reference case lists no outputs".into());
        }
        let mut report = Vec::new();
        for (name, file) in outputs {
            let got = read(&out.join(npy_name(&name)))?;
            let want = read(&file)?;
            let verdict = match (self.judge_one(&name, &got, &want), self.twin_file(&name)) {
                (Ok(r), _) => r,
                (Err(e), None) => return Err(e),
                // ORT's reference departs from the definition where its u8s8 kernels saturate
                // (x86 without VNNI): its uint8-weight twin computes the definition
                (Err(e), Some(tf)) => match self.judge_one(&name, &got, &read(&tf)?) {
                    Ok(r) => format!(
                        "{r} against ORT's uint8-weight twin; ORT's own reference is {} off",
                        self.distance(&name, &got, &want)
                    ),
                    Err(t) => return Err(format!("{e}; against the uint8-weight twin: {t}")),
                },
            };
            report.push(format!("{name}: {verdict}"));
        }
        Ok(report.join("; "))
    }

    /// The twin's output file for `name`, where the twin was written.
    fn twin_file(&self, name: &str) -> Option<PathBuf> {
        let (dir, io) = self.twin.as_ref()?;
        io["outputs"]
            .as_array()?
            .iter()
            .find(|o| o["name"].as_str() == Some(name))
            .and_then(|o| o["file"].as_str())
            .map(|f| dir.join(f))
    }

    fn judge_one(&self, name: &str, got: &Tensor, want: &Tensor) -> Result<String, String> {
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
            return Ok("exact".into());
        }
        let (g, w) = (got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap());
        let max_ref = w.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let step = step_of(&self.graph, name);
        let atol = match step {
            Some(s) => 4.0 * s,
            None => (if self.dynamic { 7.5e-3 } else { 2.5e-3 }) * max_ref,
        };
        let mut worst = 0f64;
        for i in 0..g.len() {
            let (a, b) = (g[i] as f64, w[i] as f64);
            let d = (a - b).abs();
            if d.is_nan() || d > atol + 1e-3 * b.abs() {
                return Err(format!(
                    "{name}[{i}]: {a} where the reference is {b} (|diff| {d:.3e} > {atol:.3e} + 1e-3 |ref|; step {step:?})"
                ));
            }
            worst = worst.max(d);
        }
        Ok(format!(
            "max |diff| {worst:.3e} ({})",
            self.unit(name, worst, max_ref)
        ))
    }

    /// `worst` in the rule's unit for output `name`: steps, or a fraction of max |ref|.
    fn unit(&self, name: &str, worst: f64, max_ref: f64) -> String {
        match step_of(&self.graph, name) {
            Some(s) => format!("{:.2} steps of {s:.3e}", worst / s),
            None => format!(
                "{:.2e} of max|ref| {max_ref:.3e}",
                worst / max_ref.max(1e-30)
            ),
        }
    }

    /// The largest difference between two float outputs of the same shape, in the rule's unit.
    fn distance(&self, name: &str, got: &Tensor, want: &Tensor) -> String {
        let (Ok(g), Ok(w)) = (got.to_f32_vec(), want.to_f32_vec()) else {
            return "?".into();
        };
        let max_ref = w.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let worst = g
            .iter()
            .zip(&w)
            .fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
        self.unit(name, worst, max_ref)
    }
}

/// The models of the quantized set under `$NXRT_CACHE/quant`, sorted.
pub fn quant_models() -> Result<Vec<PathBuf>, String> {
    let quant = crate::cache_dir().join("quant");
    if !quant.join("manifest.json").exists() {
        return Err(format!(
            "no quantized set at {}: run ../shared/quant/fetch_quant.sh (the README's test command does)",
            quant.display()
        ));
    }
    let mut models: Vec<PathBuf> = std::fs::read_dir(&quant)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    models.sort();
    Ok(models)
}
