//! Checking a session against reference values: the comparison every target's conformance and
//! parity runners share (native in `tests/`, wasm through `nxrt-wasm`'s `conformanceCase`), so
//! "passes" means the same thing everywhere.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::loader;
use crate::session::Session;
use crate::tensor::Tensor;
use crate::value::Value;

/// Worst absolute and relative error seen in a comparison.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrStats {
    pub max_abs: f64,
    pub max_rel: f64,
}

impl ErrStats {
    fn add(&mut self, got: f64, want: f64) {
        let a = (got - want).abs();
        if a.is_finite() {
            self.max_abs = self.max_abs.max(a);
            if want != 0.0 {
                self.max_rel = self.max_rel.max(a / want.abs());
            }
        }
    }
}

fn as_f64(t: &Tensor) -> Option<Vec<f64>> {
    let t = t.contiguous().ok()?;
    Some(match t.dtype() {
        DataType::Double => t.as_slice::<f64>().ok()?.to_vec(),
        DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
            t.to_f32_vec().ok()?.into_iter().map(|x| x as f64).collect()
        }
        _ => return None,
    })
}

/// Compares a result against a reference: floats elementwise within `atol + rtol*|want|` (NaN
/// equals NaN, infinities must match), everything else exactly; shapes and types must match.
pub fn compare(
    got: &Value,
    want: &Value,
    rtol: f64,
    atol: f64,
    stats: &mut ErrStats,
) -> Result<(), String> {
    match (got, want) {
        (Value::Tensor(g), Value::Tensor(w)) => {
            if g.dtype() != w.dtype() {
                return Err(format!("dtype {} != expected {}", g.dtype(), w.dtype()));
            }
            if g.shape() != w.shape() {
                return Err(format!("shape {:?} != expected {:?}", g.shape(), w.shape()));
            }
            if let (Some(gv), Some(wv)) = (as_f64(g), as_f64(w)) {
                let mut bad = 0usize;
                let mut first = None;
                for (i, (&a, &b)) in gv.iter().zip(&wv).enumerate() {
                    stats.add(a, b);
                    let ok = if b.is_nan() {
                        a.is_nan()
                    } else if b.is_infinite() {
                        a == b
                    } else {
                        (a - b).abs() <= atol + rtol * b.abs()
                    };
                    if !ok {
                        bad += 1;
                        first.get_or_insert((i, a, b));
                    }
                }
                if let Some((i, a, b)) = first {
                    return Err(format!(
                        "{bad} of {} elements differ (first at {i}: got {a}, want {b}; max abs err {:.3e})",
                        gv.len(),
                        stats.max_abs
                    ));
                }
                return Ok(());
            }
            let same = match g.dtype() {
                DataType::String => g.as_slice::<String>().ok() == w.as_slice::<String>().ok(),
                dt if dt.is_sub_byte()
                    || dt.is_float8()
                    || matches!(dt, DataType::Complex64 | DataType::Complex128) =>
                {
                    let gb = loader::tensor_to_le_bytes(g).ok();
                    let wb = loader::tensor_to_le_bytes(w).ok();
                    gb.is_some() && gb == wb
                }
                _ => {
                    let gi = g.to_i64_vec().ok();
                    gi.is_some() && gi == w.to_i64_vec().ok()
                }
            };
            if same {
                Ok(())
            } else {
                Err(format!("{} values differ", g.dtype()))
            }
        }
        (Value::Sequence { items: g, .. }, Value::Sequence { items: w, .. }) => {
            if g.len() != w.len() {
                return Err(format!(
                    "sequence length {} != expected {}",
                    g.len(),
                    w.len()
                ));
            }
            for (k, (a, b)) in g.iter().zip(w).enumerate() {
                compare(a, b, rtol, atol, stats).map_err(|e| format!("item {k}: {e}"))?;
            }
            Ok(())
        }
        (Value::Map(g), Value::Map(w)) => {
            compare(
                &Value::Tensor(g.keys.clone()),
                &Value::Tensor(w.keys.clone()),
                0.0,
                0.0,
                stats,
            )
            .map_err(|e| format!("map keys: {e}"))?;
            if g.values.len() != w.values.len() {
                return Err("map value counts differ".into());
            }
            for (a, b) in g.values.iter().zip(&w.values) {
                compare(a, b, rtol, atol, stats)?;
            }
            Ok(())
        }
        (Value::Optional { value: g, .. }, Value::Optional { value: w, .. }) => match (g, w) {
            (None, None) => Ok(()),
            (Some(a), Some(b)) => compare(a, b, rtol, atol, stats),
            _ => Err("optional presence differs".into()),
        },
        (g, w) => Err(format!(
            "got a {}, expected a {}",
            g.kind_name(),
            w.kind_name()
        )),
    }
}

/// The result of one conformance case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// Ran, but an output is wrong.
    Fail(String),
    /// Did not run (load or run error).
    Error(String),
}

impl Outcome {
    /// `pass`, `fail: ...` or `error: ...`: the form the conformance records keep.
    pub fn record(&self) -> String {
        match self {
            Outcome::Pass => "pass".into(),
            Outcome::Fail(m) => format!("fail: {m}"),
            Outcome::Error(m) => format!("error: {m}"),
        }
    }
}

/// Runs `session` on a case's inputs (value protos, in declared input order) `runs` times and
/// compares every run's outputs with the expected value protos. In planned mode the first run
/// records and plans, later ones run from the arena: each must match.
pub async fn check_case(
    session: &Session,
    inputs: &[Vec<u8>],
    outputs: &[Vec<u8>],
    rtol: f64,
    atol: f64,
    runs: usize,
) -> Outcome {
    let ins = session.inputs();
    let outs = session.outputs();
    let mut feeds = Vec::with_capacity(inputs.len());
    for (k, bytes) in inputs.iter().enumerate() {
        let Some(info) = ins.get(k) else {
            return Outcome::Error(format!(
                "the case has more inputs ({}) than the model",
                inputs.len()
            ));
        };
        match loader::value_from_proto_bytes(bytes, &info.ty) {
            Ok(v) => feeds.push((info.name.clone(), v)),
            Err(e) => return Outcome::Error(format!("reading input {k}: {e}")),
        }
    }
    let mut expected = Vec::with_capacity(outputs.len());
    for (k, bytes) in outputs.iter().enumerate() {
        let Some(info) = outs.get(k) else {
            return Outcome::Error(format!(
                "the case has more outputs ({}) than the model",
                outputs.len()
            ));
        };
        match loader::value_from_proto_bytes(bytes, &info.ty) {
            Ok(v) => expected.push(v),
            Err(e) => return Outcome::Error(format!("reading output {k}: {e}")),
        }
    }
    for run in 1..=runs.max(1) {
        let got = match session.run_async(feeds.clone()).await {
            Ok(o) => o,
            Err(e) => return Outcome::Error(format!("run {run}: {e}")),
        };
        if got.len() < expected.len() {
            return Outcome::Fail(format!(
                "{} outputs, expected {}",
                got.len(),
                expected.len()
            ));
        }
        let mut stats = ErrStats::default();
        for (k, ((name, g), w)) in got.iter().zip(&expected).enumerate() {
            if let Err(e) = compare(g, w, rtol, atol, &mut stats) {
                return Outcome::Fail(format!("run {run}: output {k} '{name}': {e}"));
            }
        }
    }
    Outcome::Pass
}

/// A load error as a case outcome.
pub fn load_error(e: impl ToString) -> Outcome {
    Outcome::Error(format!("load: {}", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn t(v: &[f32]) -> Value {
        Value::Tensor(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
    }

    #[test]
    fn floats_compare_within_atol_plus_rtol() {
        let mut s = ErrStats::default();
        assert!(compare(&t(&[1.0, 100.0]), &t(&[1.0, 100.05]), 1e-3, 1e-7, &mut s).is_ok());
        assert!(compare(&t(&[1.0, 100.0]), &t(&[1.0, 100.2]), 1e-3, 1e-7, &mut s).is_err());
        assert!(compare(&t(&[f32::NAN]), &t(&[f32::NAN]), 0.0, 0.0, &mut s).is_ok());
        assert!(compare(&t(&[1.0]), &t(&[f32::NAN]), 1.0, 1.0, &mut s).is_err());
        assert!(compare(
            &t(&[f32::INFINITY]),
            &t(&[f32::NEG_INFINITY]),
            1.0,
            1.0,
            &mut s
        )
        .is_err());
    }

    #[test]
    fn shapes_and_types_must_match() {
        let mut s = ErrStats::default();
        let a = Value::Tensor(Tensor::from_vec(&[2, 1], vec![1f32, 2.0]).unwrap());
        assert!(compare(&a, &t(&[1.0, 2.0]), 1.0, 1.0, &mut s).is_err());
        let i = Value::Tensor(Tensor::from_vec(&[2], vec![1i64, 2]).unwrap());
        assert!(compare(&i, &t(&[1.0, 2.0]), 1.0, 1.0, &mut s).is_err());
        let j = Value::Tensor(Tensor::from_vec(&[2], vec![1i64, 3]).unwrap());
        assert!(
            compare(&i, &j, 1.0, 1.0, &mut s).is_err(),
            "integers compare exactly"
        );
    }
}
