//! Shared helpers of the cross-crate tests: value comparison with tolerances, the cache paths
//! of the fetched corpora.

use std::path::PathBuf;

use nxrt::{DataType, Tensor, Value};

/// `$NXRT_CACHE`, default `~/.cache/nxrt`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("NXRT_CACHE") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".cache/nxrt")
        }
    }
}

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
                    let gb = nxrt_core::loader::tensor_to_le_bytes(g).ok();
                    let wb = nxrt_core::loader::tensor_to_le_bytes(w).ok();
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
