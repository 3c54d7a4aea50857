//! Softmax and LogSoftmax along any axis; LayerNormalization, RMSNormalization and
//! InstanceNormalization (one line per normalised row, see [`super::reduce::line_shader`]);
//! inference-mode BatchNormalization (element-wise).

use nxrt_core::ir::Node;
use nxrt_core::kernels::{norm_axis, opt_tensor_in};
use nxrt_core::{Error, Result, Tensor, Value};

use super::module_header;
use super::reduce::{line_shader, run_lines, stores_of, word, Mode, MAX, SUM};
use super::{dev_buf, dev_in, out1, shader_1d, Exec, Gpu, GpuBuf, OpDef};

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Softmax",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_softmax,
    },
    OpDef {
        op: "LogSoftmax",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_softmax,
    },
    OpDef {
        op: "LayerNormalization",
        since: 17,
        type_input: 0,
        half: true,
        host: &[],
        build: build_layer_norm,
    },
    OpDef {
        op: "RMSNormalization",
        since: 23,
        type_input: 0,
        half: true,
        host: &[],
        build: build_layer_norm,
    },
    OpDef {
        // ONNX Runtime's contrib op in the ai.onnx domain (RMSNormalization's forerunner)
        op: "SimplifiedLayerNormalization",
        since: 1,
        type_input: 0,
        half: false,
        host: &[],
        build: build_layer_norm,
    },
    OpDef {
        op: "InstanceNormalization",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_instance_norm,
    },
    OpDef {
        op: "BatchNormalization",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_batch_norm,
    },
];

/// com.microsoft ops ([`super::WebGpuProvider`] matches them by domain).
pub(crate) const MS_OPS: &[OpDef] = &[
    OpDef {
        op: "SkipSimplifiedLayerNormalization",
        since: 1,
        type_input: 0,
        half: false,
        host: &[],
        build: build_skip_norm,
    },
    OpDef {
        op: "SkipLayerNormalization",
        since: 1,
        type_input: 0,
        half: false,
        host: &[],
        build: build_skip_norm,
    },
];

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

// ----------------------------------------------------------------------------- softmax

/// Softmax / LogSoftmax: opset 13+ normalises along `axis` (default -1); older opsets flatten
/// the axes from `axis` (default 1) into one row.
fn build_softmax(node: &Node) -> Result<Exec> {
    let log = node.op_type == "LogSoftmax";
    let legacy = node.opset < 13;
    let axis = node.get_i("axis", if legacy { 1 } else { -1 })?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let dims: Vec<usize> = if x.rank() == 0 {
            vec![1]
        } else {
            x.shape().to_vec()
        };
        let r = dims.len();
        let (n, inner) = if legacy {
            let a = if axis < 0 { axis + r as i64 } else { axis };
            if a < 0 || a > r as i64 {
                return Err(Error::Shape(format!(
                    "axis {axis} is out of range for rank {r}"
                )));
            }
            (prod(&dims[a as usize..]), 1)
        } else {
            let a = norm_axis(axis, r)?;
            (dims[a], prod(&dims[a + 1..]))
        };
        let st = gpu.store(x.dtype())?;
        let (y, yb) = gpu.alloc(x.dtype(), x.shape())?;
        if y.is_empty() {
            return out1(y);
        }
        let lines = y.len() / n;
        let mode = Mode::pick(n, lines);
        let key = format!("softmax:{log}:{}:{}", mode.tag(), st.key());
        let pipe = gpu.pipeline(&key, || {
            let write = if log {
                "  let ls = log(s);
  for (var k = t; k < n; k += S) {
    let o = base + k * inner;
    y[o] = st((f32(x[o]) - m) - ls);
  }"
            } else {
                "  let inv = 1.0 / s;
  for (var k = t; k < n; k += S) { let o = base + k * inner; y[o] = st(exp(f32(x[o]) - m) * inv); }"
            };
            let body = line_shader(
                &[("x", "read", "T"), ("y", "read_write", "T")],
                mode,
                &[("m", MAX), ("s", SUM)],
                "",
                &format!(
                    "  if (line >= p[1]) {{ return; }}
  let n = p[2];
  let inner = p[3];
  let base = (line / inner) * n * inner + line % inner;
  var m = bitcast<f32>(p[4]);
  for (var k = t; k < n; k += S) {{ m = c_m(m, f32(x[base + k * inner])); }}
  m = wg_m(t, m);
  var s = 0.0;
  for (var k = t; k < n; k += S) {{ s += exp(f32(x[base + k * inner]) - m); }}
  s = wg_s(t, s);
{write}"
                ),
            );
            format!("{}{body}", st.header())
        })?;
        let mut params = [
            0,
            word(lines, "softmax rows")?,
            word(n, "the softmax axis")?,
            word(inner, "the softmax inner size")?,
            f32::NEG_INFINITY.to_bits(),
        ];
        run_lines(gpu, &pipe, mode, &mut params, &[xb.raw(), yb.raw()], lines)?;
        out1(y)
    }))
}

// ----------------------------------------------------------------------------- row norms

fn stash_check(node: &Node) -> Result<()> {
    let stash = node.get_i("stash_type", 1)?;
    if stash != 1 {
        return Err(Error::Other(format!(
            "the WebGPU {} kernel takes stash_type 1, not {stash}",
            node.op_type
        )));
    }
    Ok(())
}

/// A per-element parameter (Scale, B) over the normalised shape: `None` when its buffer
/// already is one (its shape is `norm` up to unit axes), else a broadcast copy of its type.
fn norm_param(gpu: &Gpu, t: &Tensor, norm: &[usize], what: &str) -> Result<Option<Tensor>> {
    let s = t.shape();
    let bad = || {
        Error::Shape(format!(
            "{what} of shape {s:?} does not broadcast to the normalised shape {norm:?}"
        ))
    };
    if s.len() > norm.len() {
        return Err(bad());
    }
    let pad = norm.len() - s.len();
    if s.iter().zip(&norm[pad..]).any(|(&a, &b)| a != b && a != 1) {
        return Err(bad());
    }
    if t.len() == prod(norm) {
        // it broadcasts without repeating anything: the same elements in the same order
        return Ok(None);
    }
    Ok(Some(super::shape::expand_to(gpu, t, dev_buf(t)?, norm)?))
}

/// LayerNormalization (opset 17) and RMSNormalization (opset 23) over the axes from `axis`.
fn build_layer_norm(node: &Node) -> Result<Exec> {
    let rms = node.op_type == "RMSNormalization" || node.op_type == "SimplifiedLayerNormalization";
    let axis = node.get_i("axis", -1)?;
    let eps = node.get_f("epsilon", 1e-5)?;
    stash_check(node)?;
    if node.outputs.iter().skip(1).any(Option::is_some) {
        return Err(Error::Other(format!(
            "the WebGPU {} kernel computes output 0 only (Mean / InvStdDev stay on the CPU)",
            node.op_type
        )));
    }
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let (sc, _) = dev_in(inputs, 1)?;
        let bias = if rms { None } else { opt_tensor_in(inputs, 2)? };
        let shape = x.shape();
        let ax = norm_axis(axis, shape.len())?;
        let norm = &shape[ax..];
        let n = prod(norm);
        let sc_x = norm_param(gpu, sc, norm, "Scale")?;
        let b_x = match bias {
            Some(b) => Some((b, norm_param(gpu, b, norm, "B")?)),
            None => None,
        };
        // X, Scale and B each read in their own float type; Y is X's
        let mut ins = vec![x, sc];
        ins.extend(bias);
        let (sts, skey) = stores_of(gpu, &ins)?;
        let (y, yb) = gpu.alloc(x.dtype(), shape)?;
        if y.is_empty() {
            return out1(y);
        }
        let rows = y.len() / n;
        let scb = dev_buf(sc_x.as_ref().unwrap_or(sc))?;
        let bb: Option<&GpuBuf> = match &b_x {
            Some((b, e)) => Some(dev_buf(e.as_ref().unwrap_or(b))?),
            None => None,
        };
        let mode = Mode::pick(n, rows);
        let has_b = bb.is_some();
        let key = format!("layernorm:{rms}:{has_b}:{}:{skey}", mode.tag());
        let pipe = gpu.pipeline(&key, || {
            let mut bufs = vec![("x", "read", sts[0].ty()), ("sc", "read", sts[1].ty())];
            if has_b {
                bufs.push(("bb", "read", sts[2].ty()));
            }
            bufs.push(("y", "read_write", "T"));
            let plus_b = if has_b { " + f32(bb[k])" } else { "" };
            let body = if rms {
                "  var q = 0.0;
  for (var k = t; k < n; k += S) { let v = f32(x[base + k]); q += v * v; }
  q = wg_s(t, q);
  let inv = 1.0 / sqrt(q / f32(n) + eps);
  for (var k = t; k < n; k += S) { y[base + k] = st(f32(x[base + k]) * inv * f32(sc[k])); }"
                    .to_string()
            } else {
                format!(
                    "  var s = 0.0;
  for (var k = t; k < n; k += S) {{ s += f32(x[base + k]); }}
  let mean = wg_s(t, s) / f32(n);
  var q = 0.0;
  for (var k = t; k < n; k += S) {{ let d = f32(x[base + k]) - mean; q += d * d; }}
  q = wg_s(t, q);
  let inv = 1.0 / sqrt(q / f32(n) + eps);
  for (var k = t; k < n; k += S) {{
    y[base + k] = st((f32(x[base + k]) - mean) * inv * f32(sc[k]){plus_b});
  }}"
                )
            };
            row_norm_shader(&bufs, mode, &sts, &body)
        })?;
        let mut params = [
            0,
            word(rows, "rows")?,
            word(n, "the normalised size")?,
            eps.to_bits(),
        ];
        let mut bufs = vec![xb.raw(), scb.raw()];
        if let Some(b) = bb {
            bufs.push(b.raw());
        }
        bufs.push(yb.raw());
        run_lines(gpu, &pipe, mode, &mut params, &bufs, rows)?;
        out1(y)
    }))
}

/// com.microsoft SkipSimplifiedLayerNormalization and SkipLayerNormalization: `v = input +
/// skip (+ bias)` per row of the last axis (`skip` repeats over the leading rows), then
/// `y = v / sqrt(mean(v^2) + eps) * gamma` (simplified) or `y = (v - mean) / sqrt(var + eps) *
/// gamma (+ beta)`, and `v` itself as output 3 when the graph reads it (the residual stream).
/// The mean and inv_std_var outputs (1, 2) are refused, as on the CPU.
fn build_skip_norm(node: &Node) -> Result<Exec> {
    let rms = node.op_type == "SkipSimplifiedLayerNormalization";
    let op = node.op_type.clone();
    let eps = node.get_f("epsilon", 1e-12)?;
    let (want_sum, n_out) = nxrt_core::kernels::contrib::skip_norm_outputs(node)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let (skip, sb) = dev_in(inputs, 1)?;
        let (gamma, gb) = dev_in(inputs, 2)?;
        let beta = if rms { None } else { opt_tensor_in(inputs, 3)? };
        let bias = opt_tensor_in(inputs, if rms { 3 } else { 4 })?;
        let shape = x.shape();
        // the checks are the CPU kernel's
        let h = nxrt_core::kernels::contrib::skip_norm_hidden(&op, x, skip, gamma, beta, bias)?;
        let mut ins = vec![x, skip, gamma];
        ins.extend(beta);
        ins.extend(bias);
        let (sts, skey) = stores_of(gpu, &ins)?;
        let (y, yb) = gpu.alloc(x.dtype(), shape)?;
        let sum = if want_sum {
            Some(gpu.alloc(x.dtype(), shape)?)
        } else {
            None
        };
        if !y.is_empty() {
            let rows = y.len() / h;
            let mode = Mode::pick(h, rows);
            let (has_be, has_b) = (beta.is_some(), bias.is_some());
            let key = format!(
                "skipln:{rms}:{has_be}:{has_b}:{want_sum}:{}:{skey}",
                mode.tag()
            );
            let pipe = gpu.pipeline(&key, || {
                let mut bufs = vec![
                    ("x", "read", sts[0].ty()),
                    ("sk", "read", sts[1].ty()),
                    ("g", "read", sts[2].ty()),
                ];
                let mut k = 3;
                if has_be {
                    bufs.push(("be", "read", sts[k].ty()));
                    k += 1;
                }
                if has_b {
                    bufs.push(("bb", "read", sts[k].ty()));
                }
                bufs.push(("y", "read_write", "T"));
                if want_sum {
                    bufs.push(("vs", "read_write", "T"));
                }
                let plus_b = if has_b { " + f32(bb[k])" } else { "" };
                let plus_be = if has_be { " + f32(be[k])" } else { "" };
                let keep = if want_sum {
                    "vs[base + k] = st(v); "
                } else {
                    ""
                };
                let v = format!("let v = f32(x[base + k]) + f32(sk[sbase + k]){plus_b};");
                let body = if rms {
                    format!(
                        "  let sbase = base % p[4];
  var q = 0.0;
  for (var k = t; k < n; k += S) {{ {v} q += v * v; }}
  q = wg_s(t, q);
  let d = sqrt(q / f32(n) + eps);
  for (var k = t; k < n; k += S) {{
    {v}
    {keep}y[base + k] = st(v / d * f32(g[k]));
  }}"
                    )
                } else {
                    format!(
                        "  let sbase = base % p[4];
  var s = 0.0;
  for (var k = t; k < n; k += S) {{ {v} s += v; }}
  let mean = wg_s(t, s) / f32(n);
  var q = 0.0;
  for (var k = t; k < n; k += S) {{ {v} let d = v - mean; q += d * d; }}
  q = wg_s(t, q);
  let inv = 1.0 / sqrt(q / f32(n) + eps);
  for (var k = t; k < n; k += S) {{
    {v}
    {keep}y[base + k] = st((v - mean) * inv * f32(g[k]){plus_be});
  }}"
                    )
                };
                row_norm_shader(&bufs, mode, &sts, &body)
            })?;
            let mut params = [
                0,
                word(rows, "rows")?,
                word(h, "the hidden size")?,
                eps.to_bits(),
                word(skip.len(), "the skip size")?,
            ];
            let mut bufs = vec![xb.raw(), sb.raw(), gb.raw()];
            for t in [beta, bias].into_iter().flatten() {
                bufs.push(dev_buf(t)?.raw());
            }
            bufs.push(yb.raw());
            if let Some((_, vb)) = &sum {
                bufs.push(vb.raw());
            }
            run_lines(gpu, &pipe, mode, &mut params, &bufs, rows)?;
        }
        // unused optional outputs get an empty placeholder (the executor drops them); a wired
        // output 3 means the node has all four
        let mut outs = vec![Value::Tensor(y)];
        for _ in 1..n_out {
            outs.push(Value::Tensor(Tensor::from_vec::<f32>(&[0], Vec::new())?));
        }
        if let Some((v, _)) = sum {
            outs[3] = Value::Tensor(v);
        }
        Ok(outs)
    }))
}

/// The module of a row normalisation: one line per row of `n` (`p[2]`) elements from `base`,
/// `eps` from `p[3]`, one summing reducer `wg_s`; `body` computes and writes the row.
fn row_norm_shader(
    bufs: &[(&str, &str, &str)],
    mode: Mode,
    sts: &[super::Store],
    body: &str,
) -> String {
    let text = line_shader(
        bufs,
        mode,
        &[("s", SUM)],
        "",
        &format!(
            "  if (line >= p[1]) {{ return; }}
  let n = p[2];
  let eps = bitcast<f32>(p[3]);
  let base = line * n;
{body}"
        ),
    );
    format!("{}{text}", module_header(sts, sts[0]))
}

fn check_len(what: &str, t: &Tensor, want: usize) -> Result<()> {
    if t.len() != want {
        return Err(Error::Shape(format!(
            "{what} has shape {:?} ({} elements), expected {want} elements",
            t.shape(),
            t.len()
        )));
    }
    Ok(())
}

/// InstanceNormalization: each (batch, channel) plane normalised on its own, then scaled and
/// shifted per channel.
fn build_instance_norm(node: &Node) -> Result<Exec> {
    let eps = node.get_f("epsilon", 1e-5)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let (sc, scb) = dev_in(inputs, 1)?;
        let (b, bb) = dev_in(inputs, 2)?;
        let shape = x.shape();
        if shape.len() < 2 {
            return Err(Error::Shape(format!(
                "InstanceNormalization input must have rank >= 2, has shape {shape:?}"
            )));
        }
        let ch = shape[1];
        let n = prod(&shape[2..]);
        check_len("scale", sc, ch)?;
        check_len("B", b, ch)?;
        let (sts, skey) = stores_of(gpu, &[x, sc, b])?;
        let (y, yb) = gpu.alloc(x.dtype(), shape)?;
        if y.is_empty() {
            return out1(y);
        }
        let rows = y.len() / n;
        let mode = Mode::pick(n, rows);
        let key = format!("instancenorm:{}:{skey}", mode.tag());
        let pipe = gpu.pipeline(&key, || {
            let text = line_shader(
                &[
                    ("x", "read", sts[0].ty()),
                    ("sc", "read", sts[1].ty()),
                    ("bb", "read", sts[2].ty()),
                    ("y", "read_write", "T"),
                ],
                mode,
                &[("s", SUM)],
                "",
                "  if (line >= p[1]) { return; }
  let n = p[2];
  let eps = bitcast<f32>(p[3]);
  let c = line % p[4];
  let base = line * n;
  var s = 0.0;
  for (var k = t; k < n; k += S) { s += f32(x[base + k]); }
  let mean = wg_s(t, s) / f32(n);
  var q = 0.0;
  for (var k = t; k < n; k += S) { let d = f32(x[base + k]) - mean; q += d * d; }
  q = wg_s(t, q);
  let a = f32(sc[c]) / sqrt(q / f32(n) + eps);
  let b = f32(bb[c]);
  for (var k = t; k < n; k += S) { y[base + k] = st((f32(x[base + k]) - mean) * a + b); }",
            );
            format!("{}{text}", module_header(&sts, sts[0]))
        })?;
        let mut params = [
            0,
            word(rows, "rows")?,
            word(n, "the plane size")?,
            eps.to_bits(),
            word(ch, "channels")?,
        ];
        let bufs = [xb.raw(), scb.raw(), bb.raw(), yb.raw()];
        run_lines(gpu, &pipe, mode, &mut params, &bufs, rows)?;
        out1(y)
    }))
}

// ----------------------------------------------------------------------------- batch norm

/// BatchNormalization with running statistics (inference). Training (opset 14+
/// `training_mode = 1`, opset < 7 `is_test = 0`, the statistics outputs) and opset < 9's
/// `spatial = 0` stay on the CPU.
fn build_batch_norm(node: &Node) -> Result<Exec> {
    let opset = node.opset;
    let eps = node.get_f("epsilon", 1e-5)?;
    let decline = |why: &str| {
        Err(Error::Other(format!(
            "the WebGPU BatchNormalization kernel runs inference only: {why}"
        )))
    };
    if opset >= 14 && node.get_i("training_mode", 0)? != 0 {
        return decline("training_mode = 1");
    }
    if opset < 7 && node.get_i("is_test", 0)? == 0 {
        return decline("is_test = 0");
    }
    if opset < 9 && node.get_i("spatial", 1)? == 0 {
        return decline("spatial = 0");
    }
    if node.outputs.iter().skip(1).any(Option::is_some) {
        return decline("the node uses the statistics outputs");
    }
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let shape = x.shape();
        if shape.len() < 2 {
            return Err(Error::Shape(format!(
                "BatchNormalization input must have rank >= 2, has shape {shape:?}"
            )));
        }
        let ch = shape[1];
        let inner = prod(&shape[2..]);
        let mut ps = Vec::with_capacity(4);
        let mut ts = vec![x];
        for (k, what) in [(1, "scale"), (2, "B"), (3, "mean"), (4, "var")] {
            let (t, b) = dev_in(inputs, k)?;
            check_len(what, t, ch)?;
            ps.push(b);
            ts.push(t);
        }
        // each input in its own float type (scale and B may differ from X, mean and var
        // from both); Y is X's
        let (sts, skey) = stores_of(gpu, &ts)?;
        let (y, yb) = gpu.alloc(x.dtype(), shape)?;
        let pipe = gpu.pipeline(&format!("batchnorm:{skey}"), || {
            let text = shader_1d(
                &[
                    ("x", "read", sts[0].ty()),
                    ("sc", "read", sts[1].ty()),
                    ("bb", "read", sts[2].ty()),
                    ("mu", "read", sts[3].ty()),
                    ("va", "read", sts[4].ty()),
                    ("y", "read_write", "T"),
                ],
                256,
                "",
                "  if (i >= p[1]) { return; }
  let c = (i / p[3]) % p[2];
  let a = f32(sc[c]) / sqrt(f32(va[c]) + bitcast<f32>(p[4]));
  y[i] = st((f32(x[i]) - f32(mu[c])) * a + f32(bb[c]));",
            );
            format!("{}{text}", module_header(&sts, sts[0]))
        })?;
        let n = y.len();
        let mut params = [
            0,
            word(n, "elements")?,
            word(ch, "channels")?,
            word(inner.max(1), "the plane size")?,
            eps.to_bits(),
        ];
        let bufs = [
            xb.raw(),
            ps[0].raw(),
            ps[1].raw(),
            ps[2].raw(),
            ps[3].raw(),
            yb.raw(),
        ];
        gpu.dispatch(&pipe, &mut params, &bufs, n as u64, 256)?;
        out1(y)
    }))
}
