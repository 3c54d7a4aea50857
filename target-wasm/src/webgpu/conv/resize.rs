//! Resize and Pad as one gather kernel over per-axis tables.
//!
//! Each axis gets, per output position, `taps` source indices (a sentinel marks a position
//! outside the input: Pad's constant, tf_crop_and_resize's extrapolation value) and weights.
//! The tables are built on the host, in f64, by the same rules as the CPU kernels, so nearest
//! indices agree exactly; an output element sums weight products over the taps of the axes
//! that have more than one (a pure gather when none has).

use nxrt_core::ir::Node;
use nxrt_core::kernels::norm::{
    cubic_kernel, nearest_index, resize_geometry, src_coord, Coord, Interp, Policy, Rounding,
};
use nxrt_core::kernels::opt_tensor_in;
use nxrt_core::{DataType, Location, Result, Tensor, Value};

use super::super::ew::MAX_RANK;
use super::super::{dev_in, host_f32, host_i64s, out1, shader_1d, Exec, Gpu};
use super::{fail, word};

const WG: u32 = 256;
/// A table entry for a position outside the input.
const OOB: u32 = u32::MAX;

/// Source indices (`OOB` outside the input) and weights of every output position of one axis;
/// a 1-tap table has weight 1 everywhere.
struct AxisTab {
    taps: usize,
    idx: Vec<u32>,
    w: Vec<f32>,
}

/// Params: [row, total, rank, fill bits, out dims (r), input strides (r), taps (r), index
/// table offsets (r), weight table offsets (r)].
fn gather_shader() -> String {
    shader_1d(
        &[
            ("tab", "read", "u32"),
            ("x", "read", "T"),
            ("y", "read_write", "T"),
        ],
        WG,
        "",
        &format!(
            "  if (i >= p[1]) {{ return; }}
  let r = p[2];
  var co: array<u32, {MAX_RANK}>;
  var rem = i;
  for (var d = r; d > 0u; d--) {{
    let a = d - 1u;
    let dim = p[4u + a];
    co[a] = rem % dim;
    rem = rem / dim;
  }}
  var base = 0u;
  var ncomb = 1u;
  for (var a = 0u; a < r; a++) {{
    let nt = p[4u + 2u * r + a];
    let e = tab[p[4u + 3u * r + a] + co[a] * nt];
    if (e == {OOB}u) {{ y[i] = st(bitcast<f32>(p[3])); return; }}
    if (nt == 1u) {{ base += e * p[4u + r + a]; }} else {{ ncomb *= nt; }}
  }}
  if (ncomb == 1u) {{ y[i] = x[base]; return; }}
  var acc = 0.0;
  for (var c = 0u; c < ncomb; c++) {{
    var cr = c;
    var off = base;
    var wt = 1.0;
    for (var a = 0u; a < r; a++) {{
      let nt = p[4u + 2u * r + a];
      if (nt == 1u) {{ continue; }}
      let t = cr % nt;
      cr = cr / nt;
      let e = co[a] * nt + t;
      off += tab[p[4u + 3u * r + a] + e] * p[4u + r + a];
      wt *= bitcast<f32>(tab[p[4u + 4u * r + a] + e]);
    }}
    acc = fma(wt, f32(x[off]), acc);
  }}
  y[i] = st(acc);"
        ),
    )
}

/// Runs the gather of `x` (device) into a new tensor of `out` through `tabs`.
fn gather(
    gpu: &Gpu,
    inputs: &[Option<&Value>],
    out: &[usize],
    tabs: &[AxisTab],
    fill: f32,
) -> Result<Vec<Value>> {
    let (x, xb) = dev_in(inputs, 0)?;
    let r = out.len();
    if r > MAX_RANK {
        return Err(fail(format!(
            "the WebGPU gather takes rank {MAX_RANK} at most, not {r}"
        )));
    }
    let st = gpu.store(x.dtype())?;
    let (y, yb) = gpu.alloc(x.dtype(), out)?;
    if y.is_empty() {
        return out1(y);
    }
    let mut strides = vec![1usize; r];
    for a in (0..r.saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * x.shape()[a + 1];
    }
    let mut words: Vec<u32> = Vec::new();
    let mut ioff = Vec::with_capacity(r);
    for t in tabs {
        ioff.push(word(words.len(), "a table offset")?);
        words.extend(&t.idx);
    }
    let mut woff = Vec::with_capacity(r);
    for t in tabs {
        woff.push(word(words.len(), "a table offset")?);
        words.extend(t.w.iter().map(|v| v.to_bits()));
    }
    let mut params = vec![
        0,
        word(y.len(), "an output size")?,
        r as u32,
        fill.to_bits(),
    ];
    for &d in out {
        params.push(word(d, "an extent")?);
    }
    for &s in &strides {
        params.push(word(s, "a stride")?);
    }
    for t in tabs {
        params.push(word(t.taps, "a tap count")?);
    }
    params.extend(ioff);
    params.extend(woff);
    if words.is_empty() {
        words.push(0);
    }
    let tbytes: &[u8] = bytemuck::cast_slice(&words);
    let tbuf = gpu.table(tbytes, "a Resize/Pad table")?;
    let pipe = gpu.pipeline(&format!("gather:tables:{}", st.key()), || {
        format!("{}{}", st.header(), gather_shader())
    })?;
    gpu.dispatch(
        &pipe,
        &mut params,
        &[tbuf.raw(), xb.raw(), yb.raw()],
        y.len() as u64,
        WG,
    )?;
    out1(y)
}

/// Host input `k`, `None` when omitted or empty.
fn host_in<'a>(inputs: &[Option<&'a Value>], k: usize) -> Result<Option<&'a Tensor>> {
    match opt_tensor_in(inputs, k)? {
        Some(t) if t.location() != Location::Host => {
            Err(fail(format!("input {k} should be on the host")))
        }
        Some(t) if t.is_empty() => Ok(None),
        t => Ok(t),
    }
}

fn norm_axes(axes: &[i64], r: usize) -> Result<Vec<usize>> {
    let mut seen = vec![false; r];
    let mut v = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = if a < 0 { a + r as i64 } else { a };
        if !(0..r as i64).contains(&n) || seen[n as usize] {
            return Err(fail(format!("axes {axes:?} for rank {r}")));
        }
        seen[n as usize] = true;
        v.push(n as usize);
    }
    Ok(v)
}

// ----------------------------------------------------------------------------- Resize

#[derive(Clone, Debug)]
struct ResizeSpec {
    interp: Interp,
    coord: Coord,
    rounding: Rounding,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f32,
    antialias: bool,
    policy: Policy,
    axes: Option<Vec<i64>>,
}

pub(super) fn build_resize(node: &Node) -> Result<Exec> {
    if node.opset < 11 {
        return Err(fail("Resize-10 stays on the CPU"));
    }
    let interp = match node.get_s("mode", "nearest")?.as_str() {
        "nearest" => Interp::Nearest,
        "linear" => Interp::Linear,
        "cubic" => Interp::Cubic,
        m => return Err(fail(format!("Resize mode '{m}'"))),
    };
    let coord = match node
        .get_s("coordinate_transformation_mode", "half_pixel")?
        .as_str()
    {
        "half_pixel" => Coord::HalfPixel,
        "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
        "pytorch_half_pixel" => Coord::PytorchHalfPixel,
        "align_corners" => Coord::AlignCorners,
        "asymmetric" => Coord::Asymmetric,
        "tf_crop_and_resize" => Coord::TfCropAndResize,
        "tf_half_pixel_for_nn" => Coord::TfHalfPixelForNn,
        m => return Err(fail(format!("Resize coordinate_transformation_mode '{m}'"))),
    };
    let rounding = match node.get_s("nearest_mode", "round_prefer_floor")?.as_str() {
        "round_prefer_floor" => Rounding::RoundPreferFloor,
        "round_prefer_ceil" => Rounding::RoundPreferCeil,
        "floor" => Rounding::Floor,
        "ceil" => Rounding::Ceil,
        m => return Err(fail(format!("Resize nearest_mode '{m}'"))),
    };
    let (antialias, axes, policy) = if node.opset >= 18 {
        let policy = match node.get_s("keep_aspect_ratio_policy", "stretch")?.as_str() {
            "stretch" => Policy::Stretch,
            "not_larger" => Policy::NotLarger,
            "not_smaller" => Policy::NotSmaller,
            m => return Err(fail(format!("Resize keep_aspect_ratio_policy '{m}'"))),
        };
        (
            node.get_i("antialias", 0)? != 0,
            node.attr_ints("axes")?,
            policy,
        )
    } else {
        (false, None, Policy::Stretch)
    };
    let spec = ResizeSpec {
        interp,
        coord,
        rounding,
        cubic_a: node.get_f("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: node.get_i("exclude_outside", 0)? != 0,
        extrapolation: node.get_f("extrapolation_value", 0.0)?,
        antialias,
        policy,
        axes,
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        resize_run(&spec, gpu, inputs)
    }))
}

fn axis_table(
    spec: &ResizeSpec,
    n_in: usize,
    n_out: usize,
    scale: f64,
    roi: (f64, f64),
) -> Result<AxisTab> {
    let last = n_in as i64 - 1;
    let crop = spec.coord == Coord::TfCropAndResize;
    let outside = |x: f64| crop && (x < 0.0 || x > last as f64);
    let ix = |v: i64| word(v as usize, "a Resize index");
    if spec.interp == Interp::Nearest {
        let mut idx = Vec::with_capacity(n_out);
        for o in 0..n_out {
            let x = src_coord(spec.coord, o, scale, n_in, n_out, roi);
            idx.push(if outside(x) {
                OOB
            } else {
                ix(nearest_index(x, spec.rounding, scale).clamp(0, last))?
            });
        }
        return Ok(AxisTab {
            taps: 1,
            idx,
            w: vec![1.0; n_out],
        });
    }
    // tap t of a window sits at x0 + i_start + t, at distance (i_start + t - ratio) from x
    let s_eff = if spec.antialias { scale.min(1.0) } else { 1.0 };
    let i_start: i64 = match (spec.interp, spec.antialias) {
        (Interp::Cubic, true) => (-2.0 / s_eff).floor() as i64 + 1,
        (Interp::Cubic, false) => -1,
        (_, true) => (-1.0 / s_eff).floor() as i64 + 1,
        (_, false) => 0,
    };
    let taps = (2 - 2 * i_start) as usize;
    let mut idx = Vec::with_capacity(n_out * taps);
    let mut wf = Vec::with_capacity(n_out * taps);
    let mut oob = vec![false; n_out];
    let mut ws = vec![0f64; taps];
    for (o, out_of) in oob.iter_mut().enumerate() {
        let x = src_coord(spec.coord, o, scale, n_in, n_out, roi);
        if outside(x) {
            *out_of = true;
            idx.extend(std::iter::repeat_n(0, taps));
            wf.extend(std::iter::repeat_n(0.0, taps));
            continue;
        }
        let fl = x.floor();
        let (x0, ratio) = if fl == x {
            (fl - 1.0, 1.0)
        } else {
            (fl, x - fl)
        };
        let x0 = x0 as i64;
        let mut sum = 0.0;
        for (t, wt) in ws.iter_mut().enumerate() {
            let d = ((i_start + t as i64) as f64 - ratio) * s_eff;
            *wt = match spec.interp {
                Interp::Cubic => cubic_kernel(d, spec.cubic_a),
                _ => (1.0 - d.abs()).max(0.0),
            };
            sum += *wt;
        }
        if spec.antialias && sum != 0.0 {
            ws.iter_mut().for_each(|v| *v /= sum);
        }
        if spec.exclude_outside {
            let mut sum = 0.0;
            for (t, wt) in ws.iter_mut().enumerate() {
                let i = x0 + i_start + t as i64;
                if i < 0 || i > last {
                    *wt = 0.0;
                }
                sum += *wt;
            }
            if sum != 0.0 {
                ws.iter_mut().for_each(|v| *v /= sum);
            }
        }
        for (t, &wt) in ws.iter().enumerate() {
            idx.push((x0 + i_start + t as i64).clamp(0, last.max(0)));
            wf.push(wt);
        }
    }
    // a table whose every position has one weight of exactly 1 (the rest 0) is a gather
    let mut single = Vec::with_capacity(n_out);
    for o in 0..n_out {
        if oob[o] {
            single.push(None);
            continue;
        }
        let w = &wf[o * taps..][..taps];
        let mut one = None;
        let mut pure = true;
        for (k, &v) in w.iter().enumerate() {
            if v == 1.0 && one.is_none() {
                one = Some(k);
            } else if v != 0.0 {
                pure = false;
            }
        }
        match one {
            Some(k) if pure => single.push(Some(idx[o * taps + k])),
            _ => break,
        }
    }
    if single.len() == n_out {
        return Ok(AxisTab {
            taps: 1,
            idx: single
                .into_iter()
                .map(|v| v.map_or(Ok(OOB), ix))
                .collect::<Result<_>>()?,
            w: vec![1.0; n_out],
        });
    }
    let mut tidx = Vec::with_capacity(idx.len());
    for (o, chunk) in idx.chunks(taps).enumerate() {
        for (t, &v) in chunk.iter().enumerate() {
            tidx.push(if oob[o] && t == 0 { OOB } else { ix(v)? });
        }
    }
    Ok(AxisTab {
        taps,
        idx: tidx,
        w: wf.into_iter().map(|v| v as f32).collect(),
    })
}

fn resize_run(spec: &ResizeSpec, gpu: &Gpu, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
    let (x, _) = dev_in(inputs, 0)?;
    let in_shape = x.shape().to_vec();
    let r = in_shape.len();
    let scales = host_in(inputs, 2)?.map(|t| t.to_f32_vec()).transpose()?;
    let sizes = host_in(inputs, 3)?.map(|t| t.to_i64_vec()).transpose()?;
    let axes = match &spec.axes {
        Some(a) => norm_axes(a, r)?,
        None => (0..r).collect(),
    };
    let (scale, out) = resize_geometry(
        &in_shape,
        &axes,
        scales.as_deref(),
        sizes.as_deref(),
        spec.policy,
    )?;
    let mut roi = vec![(0.0f64, 1.0f64); r];
    if spec.coord == Coord::TfCropAndResize {
        let t =
            host_in(inputs, 1)?.ok_or_else(|| fail("tf_crop_and_resize needs the roi input"))?;
        let v: Vec<f64> = match t.dtype() {
            DataType::Double => t.as_slice::<f64>()?.into_owned(),
            _ => t.to_f32_vec()?.into_iter().map(f64::from).collect(),
        };
        if v.len() != 2 * axes.len() {
            return Err(fail(format!(
                "roi has {} values, expected {}",
                v.len(),
                2 * axes.len()
            )));
        }
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = (v[i], v[axes.len() + i]);
        }
    }
    nxrt_core::tensor::numel(&out)?;
    if out.contains(&0) {
        return gather(gpu, inputs, &out, &[], 0.0);
    }
    let tabs = (0..r)
        .map(|a| axis_table(spec, in_shape[a], out[a], scale[a], roi[a]))
        .collect::<Result<Vec<_>>>()?;
    gather(gpu, inputs, &out, &tabs, spec.extrapolation)
}

// ----------------------------------------------------------------------------- Pad

#[derive(Clone, Copy, PartialEq, Debug)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

pub(super) fn build_pad(node: &Node) -> Result<Exec> {
    let mode = match node.get_s("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => return Err(fail(format!("Pad mode '{m}'"))),
    };
    // before opset 11 the pads and the value are attributes
    let attrs = if node.opset < 11 {
        let name = if node.opset < 2 { "paddings" } else { "pads" };
        let Some(pads) = node.attr_ints(name)? else {
            return Err(fail(format!("Pad without '{name}'")));
        };
        Some((pads, node.get_f("value", 0.0)?))
    } else {
        None
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, _) = dev_in(inputs, 0)?;
        let r = x.rank();
        let (pads, value) = match &attrs {
            Some((p, v)) => (p.clone(), *v),
            None => {
                let raw = host_i64s(inputs, 1)?.ok_or_else(|| fail("Pad without pads"))?;
                let value = host_f32(inputs, 2)?.unwrap_or(0.0);
                let pads = match host_i64s(inputs, 3)? {
                    None => raw,
                    Some(axes) => {
                        let n = axes.len();
                        if raw.len() != 2 * n {
                            return Err(fail(format!("Pad has {} pads for {n} axes", raw.len())));
                        }
                        let axes = norm_axes(&axes, r)?;
                        let mut full = vec![0i64; 2 * r];
                        for (i, &a) in axes.iter().enumerate() {
                            full[a] = raw[i];
                            full[r + a] = raw[n + i];
                        }
                        full
                    }
                };
                (pads, value)
            }
        };
        if pads.len() != 2 * r {
            return Err(fail(format!("Pad has {} pads for rank {r}", pads.len())));
        }
        let tabs = (0..r)
            .map(|a| pad_table(x.shape()[a], pads[a], pads[r + a], mode))
            .collect::<Result<Vec<_>>>()?;
        let out: Vec<usize> = tabs.iter().map(|t| t.idx.len()).collect();
        nxrt_core::tensor::numel(&out)?;
        gather(gpu, inputs, &out, &tabs, value)
    }))
}

/// The source index of every output position along one axis (`OOB`: the constant); negative
/// pads crop first.
fn pad_table(d: usize, pb: i64, pe: i64, mode: PadMode) -> Result<AxisTab> {
    let d = d as i64;
    let lo = (-pb).max(0);
    let hi = d - (-pe).max(0);
    let cd = hi - lo;
    if cd < 0 {
        return Err(fail(format!("Pad crops more than the extent {d}")));
    }
    let (pb, pe) = (pb.max(0), pe.max(0));
    let n = cd + pb + pe;
    if n > 0 && cd == 0 && mode != PadMode::Constant {
        return Err(fail(format!("Pad mode {mode:?} of an empty axis")));
    }
    let mut idx = Vec::with_capacity(n as usize);
    for o in 0..n {
        let j = o - pb;
        let k = if (0..cd).contains(&j) {
            j
        } else {
            match mode {
                PadMode::Constant => {
                    idx.push(OOB);
                    continue;
                }
                PadMode::Edge => j.clamp(0, cd - 1),
                PadMode::Wrap => j.rem_euclid(cd),
                PadMode::Reflect => {
                    if cd == 1 {
                        0
                    } else {
                        let p = 2 * (cd - 1);
                        let m = j.rem_euclid(p);
                        if m >= cd {
                            p - m
                        } else {
                            m
                        }
                    }
                }
            }
        };
        idx.push(word((lo + k) as usize, "a Pad index")?);
    }
    let len = idx.len();
    Ok(AxisTab {
        taps: 1,
        idx,
        w: vec![1.0; len],
    })
}
