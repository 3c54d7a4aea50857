//! The cross-target report's charts: `report_charts DIR/report.json DIR` writes SVGs (through
//! the `plotters` crate) from the figures `scripts/cross-target-report` measured:
//!
//! - `ratio_<target>.svg` per nxrt target with an anchor: each model's nxrt/anchor time ratio
//!   as a bar (below 1: nxrt faster), with the geomean in the title;
//! - `latency.svg`: every target's median time per model (log scale);
//! - `memory.svg`: peak resident memory per model, nxrt against ONNX Runtime, where measured.
//!
//! It prints the files it wrote, one per line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plotters::prelude::*;
use serde_json::Value;

/// One bar chart: rows (models) of grouped bars (series).
struct Bars<'a> {
    title: String,
    x_label: &'a str,
    rows: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
    log: bool,
    /// A vertical line (1.0 on a ratio chart).
    reference: Option<f64>,
}

/// Twelve distinguishable colours (a target each); a ratio chart's bars are green (nxrt
/// faster) or red (slower) instead.
const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(174, 199, 232),
    RGBColor(255, 127, 14),
    RGBColor(255, 187, 120),
    RGBColor(44, 160, 44),
    RGBColor(152, 223, 138),
    RGBColor(148, 103, 189),
    RGBColor(197, 176, 213),
    RGBColor(140, 86, 75),
    RGBColor(196, 156, 148),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
const GREEN: RGBColor = RGBColor(44, 160, 44);
const RED: RGBColor = RGBColor(214, 39, 40);

fn draw(b: &Bars, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let k = b.series.len().max(1) as i32 + 1; // slots per row: one per series and a gap
    let n = b.rows.len() as i32;
    let values: Vec<f64> = b
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if values.is_empty() {
        return Err(format!("{}: nothing to draw", path.display()));
    }
    let (lo, hi) = values
        .iter()
        .fold((f64::INFINITY, 0f64), |(l, h), &v| (l.min(v), h.max(v)));
    let lo = b.reference.map_or(lo, |r| lo.min(r));
    let hi = b.reference.map_or(hi, |r| hi.max(r));
    // a legend goes on the right, over room the x range keeps free of bars
    let legend = b.series.len() > 1;
    let height = (90 + (n * k) as u32 * 9).max(if legend {
        140 + b.series.len() as u32 * 19
    } else {
        0
    });
    let root = SVGBackend::new(path, (900, height.max(220))).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let label_w = b.rows.iter().map(|r| r.len()).max().unwrap_or(8) as u32 * 7 + 10;
    let y_fmt = |y: &i32| {
        if y.rem_euclid(k) == k / 2 && *y / k < n {
            // rows top to bottom in the order given
            b.rows[(n - 1 - *y / k) as usize].clone()
        } else {
            String::new()
        }
    };
    macro_rules! body {
        ($chart:expr, $x0:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .y_labels((n * k) as usize)
                .y_label_formatter(&y_fmt)
                .disable_y_mesh()
                .x_desc(b.x_label)
                .draw()
                .map_err(|e| err(&e))?;
            for (j, (name, vals)) in b.series.iter().enumerate() {
                let color = PALETTE[j % PALETTE.len()];
                let bars = vals.iter().enumerate().filter_map(|(i, v)| {
                    let v = (*v)?;
                    let y = (n - 1 - i as i32) * k + (k - 2 - j as i32);
                    let fill = match b.reference {
                        Some(r) if b.series.len() == 1 && v > r => RED,
                        Some(_) if b.series.len() == 1 => GREEN,
                        _ => color,
                    };
                    Some(Rectangle::new([($x0, y), (v, y + 1)], fill.filled()))
                });
                let s = chart.draw_series(bars).map_err(|e| err(&e))?;
                if b.series.len() > 1 {
                    s.label(name.as_str()).legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                    });
                }
            }
            if let Some(r) = b.reference {
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(r, 0), (r, n * k)],
                        BLACK.stroke_width(1),
                    )))
                    .map_err(|e| err(&e))?;
            }
            if b.series.len() > 1 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| err(&e))?;
            }
        }};
    }
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&b.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(label_w);
    if b.log {
        let (x0, x1) = (lo / 1.5, if legend { hi * 300.0 } else { hi * 1.5 });
        body!(
            builder
                .build_cartesian_2d((x0..x1).log_scale(), 0..n * k)
                .map_err(|e| err(&e))?,
            x0
        );
    } else {
        let x1 = if legend { hi * 1.8 } else { hi * 1.08 };
        body!(
            builder
                .build_cartesian_2d(0f64..x1, 0..n * k)
                .map_err(|e| err(&e))?,
            0f64
        );
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn geomean(xs: &[f64]) -> f64 {
    (xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp()
}

fn run(report: &Path, out: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(report).map_err(|e| format!("{}: {e}", report.display()))?;
    let r: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", report.display()))?;
    let models: Vec<&Value> = r["models"]
        .as_array()
        .ok_or("report.json has no models array")?
        .iter()
        .collect();
    let targets: Vec<&Value> = r["targets"]
        .as_array()
        .ok_or("report.json has no targets array")?
        .iter()
        .collect();
    let names: Vec<String> = models
        .iter()
        .map(|m| m["name"].as_str().unwrap_or("?").to_string())
        .collect();
    let time = |m: &Value, t: &str| m["results"][t]["median_ms"].as_f64();
    let mut written = Vec::new();
    // ratio bars per nxrt target with an anchor
    for t in &targets {
        let (Some(id), Some(anchor)) = (t["id"].as_str(), t["anchor"].as_str()) else {
            continue;
        };
        let ratios: Vec<Option<f64>> = models
            .iter()
            .map(|m| Some(time(m, id)? / time(m, anchor)?))
            .collect();
        let have: Vec<f64> = ratios.iter().flatten().copied().collect();
        if have.is_empty() {
            continue;
        }
        let anchor_label = targets
            .iter()
            .find(|a| a["id"].as_str() == Some(anchor))
            .and_then(|a| a["label"].as_str())
            .unwrap_or(anchor);
        let path = out.join(format!("ratio_{id}.svg"));
        draw(
            &Bars {
                title: format!(
                    "{} / {}: geomean {:.2} over {} models (below 1: nxrt faster)",
                    t["label"].as_str().unwrap_or(id),
                    anchor_label,
                    geomean(&have),
                    have.len()
                ),
                x_label: "time ratio (median run)",
                rows: names.clone(),
                series: vec![("ratio".into(), ratios)],
                log: false,
                reference: Some(1.0),
            },
            &path,
        )?;
        written.push(path);
    }
    // every target's latency
    let series: Vec<(String, Vec<Option<f64>>)> = targets
        .iter()
        .filter_map(|t| {
            let id = t["id"].as_str()?;
            let v: Vec<Option<f64>> = models.iter().map(|m| time(m, id)).collect();
            v.iter()
                .any(|x| x.is_some())
                .then(|| (t["label"].as_str().unwrap_or(id).to_string(), v))
        })
        .collect();
    if !series.is_empty() {
        let path = out.join("latency.svg");
        draw(
            &Bars {
                title: "Median run time per target (log scale)".into(),
                x_label: "milliseconds",
                rows: names.clone(),
                series,
                log: true,
                reference: None,
            },
            &path,
        )?;
        written.push(path);
    }
    // memory peaks
    let mem = |m: &Value, k: &str| m["memory"][k]["peak_mib"].as_f64();
    let mut mseries = Vec::new();
    for (key, label) in [("nxrt", "nxrt"), ("ort", "ONNX Runtime")] {
        let v: Vec<Option<f64>> = models.iter().map(|m| mem(m, key)).collect();
        if v.iter().any(|x| x.is_some()) {
            mseries.push((label.to_string(), v));
        }
    }
    if !mseries.is_empty() {
        let path = out.join("memory.svg");
        draw(
            &Bars {
                title: "Peak resident memory of a process that loads and runs the model".into(),
                x_label: "MiB",
                rows: names,
                series: mseries,
                log: false,
                reference: None,
            },
            &path,
        )?;
        written.push(path);
    }
    Ok(written)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [report, out] = args.as_slice() else {
        eprintln!("usage: report_charts DIR/report.json OUT_DIR");
        return ExitCode::from(2);
    };
    match run(Path::new(report), Path::new(out)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("report_charts: {e}");
            ExitCode::FAILURE
        }
    }
}
