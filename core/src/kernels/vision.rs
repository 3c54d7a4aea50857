//! Vision and detection ops: GridSample, AffineGrid, NonMaxSuppression, RoiAlign,
//! CenterCropPad, Col2Im, DeformConv.
//!
//! Floating-point kernels compute in f64 and store back in the input's element type
//! (f32, f64, f16, bf16); other element types are rejected with an unsupported error.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use half::{bf16, f16};

use super::{bad_type, def, opt_tensor_in, out1, tensor_in, LATEST};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::{FLOATS, PLAIN};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("GridSample", 16, LATEST, build_grid_sample).types(FLOATS),
    def("AffineGrid", 20, LATEST, build_affine_grid).types(FLOATS),
    def("NonMaxSuppression", 10, LATEST, build_nms).types(FLOATS),
    def("RoiAlign", 10, 15, build_roi_align_v10).types(FLOATS),
    def("RoiAlign", 16, LATEST, build_roi_align_v16).types(FLOATS),
    def("CenterCropPad", 18, LATEST, build_center_crop_pad).types(PLAIN),
    def("Col2Im", 18, LATEST, build_col2im).types(FLOATS),
    def("DeformConv", 19, LATEST, build_deform_conv).types(FLOATS),
];

// ----------------------------------------------------------------------------- helpers

/// A float tensor's elements widened to f64.
fn load_f64(op: &str, t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DataType::Float => t.as_slice::<f32>()?.iter().map(|&v| v as f64).collect(),
        DataType::Double => t.as_slice::<f64>()?.into_owned(),
        DataType::Float16 => t.as_slice::<f16>()?.iter().map(|v| v.to_f64()).collect(),
        DataType::Bfloat16 => t.as_slice::<bf16>()?.iter().map(|v| v.to_f64()).collect(),
        dt => return Err(bad_type(op, dt)),
    })
}

/// Stores f64 values as a tensor of float element type `dt`.
fn store_f64(op: &str, dt: DataType, shape: &[usize], v: Vec<f64>) -> Result<Tensor> {
    match dt {
        DataType::Float => Tensor::from_vec(shape, v.into_iter().map(|x| x as f32).collect()),
        DataType::Double => Tensor::from_vec(shape, v),
        DataType::Float16 => Tensor::from_vec(shape, v.into_iter().map(f16::from_f64).collect()),
        DataType::Bfloat16 => Tensor::from_vec(shape, v.into_iter().map(bf16::from_f64).collect()),
        dt => Err(bad_type(op, dt)),
    }
}

fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
    )
}

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

/// An integer attribute list if present; checks its length (when `n` > 0) and lower bound.
fn ints_attr(node: &Node, name: &str, n: usize, min: i64) -> Result<Option<Vec<i64>>> {
    match node.attr_ints(name)? {
        None => Ok(None),
        Some(v) => {
            if n != 0 && v.len() != n {
                bail!("attribute {name} should have {n} values, has {}", v.len());
            }
            if let Some(bad) = v.iter().find(|&&x| x < min) {
                bail!("attribute {name} has value {bad}, must be >= {min}");
            }
            Ok(Some(v))
        }
    }
}

// ----------------------------------------------------------------------------- GridSample

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GsMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GsPad {
    Zeros,
    Border,
    Reflection,
}

/// Reflects `x` off the borders `lo`/`hi` until it lies within them.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if rng <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = libm::trunc(dx / rng);
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = libm::trunc(dx / rng);
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

/// Keys cubic convolution weights (A = -0.75) for the taps at -1, 0, 1, 2 around a point at
/// fractional offset `t` in [0, 1).
fn cubic_coeffs(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A; // 1 <= |x| < 2
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0; // |x| < 1
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

struct GridSampler {
    mode: GsMode,
    pad: GsPad,
    align: bool,
}

impl GridSampler {
    /// Maps an integer pixel index along a dimension of size `d` to a stored index, or `None`
    /// for a zero (padding) value.
    fn pixel(&self, i: i64, d: usize, lo: f64, hi: f64) -> Option<usize> {
        if d == 0 {
            return None;
        }
        let di = d as i64;
        match self.pad {
            GsPad::Zeros => (i >= 0 && i < di).then_some(i as usize),
            GsPad::Border => Some(i.clamp(0, di - 1) as usize),
            GsPad::Reflection => {
                let r = libm::trunc(reflect(i as f64, lo, hi)) as i64;
                Some(r.clamp(0, di - 1) as usize)
            }
        }
    }

    /// The taps (stored index or padding, weight) along one spatial dimension of size `d`
    /// for the normalized coordinate `g`.
    fn taps(&self, g: f32, d: usize, out: &mut Vec<(Option<usize>, f64)>) {
        out.clear();
        // Denormalize in f32 like the reference (matters for nearest's half-way rounding).
        let df = d as f32;
        let mut x = if self.align {
            (g + 1.0) / 2.0 * (df - 1.0)
        } else {
            ((g + 1.0) * df - 1.0) / 2.0
        };
        let (lo, hi) = if self.align {
            (0.0f32, df - 1.0)
        } else {
            (-0.5f32, df - 0.5)
        };
        if self.mode == GsMode::Nearest {
            x = libm::rintf(x);
        }
        if !x.is_finite() {
            out.push((None, 0.0));
            return;
        }
        if x < lo || x > hi {
            match self.pad {
                GsPad::Border => x = x.clamp(0.0, df - 1.0),
                GsPad::Reflection => x = reflect(x as f64, lo as f64, hi as f64) as f32,
                // Far outside, every tap is padding: keep the index arithmetic small.
                GsPad::Zeros => x = x.clamp(lo - 4.0, hi + 4.0),
            }
        }
        let (lo, hi) = (lo as f64, hi as f64);
        let x = x as f64;
        match self.mode {
            GsMode::Nearest => {
                let i = libm::trunc(x) as i64;
                out.push((self.pixel(i, d, lo, hi), 1.0));
            }
            GsMode::Linear => {
                let x0 = libm::floor(x);
                let t = x - x0;
                let i = x0 as i64;
                out.push((self.pixel(i, d, lo, hi), 1.0 - t));
                out.push((self.pixel(i + 1, d, lo, hi), t));
            }
            GsMode::Cubic => {
                let x0 = libm::floor(x);
                let c = cubic_coeffs(x - x0);
                let i = x0 as i64;
                for (k, &w) in c.iter().enumerate() {
                    out.push((self.pixel(i - 1 + k as i64, d, lo, hi), w));
                }
            }
        }
    }
}

fn build_grid_sample(node: &Node) -> Result<Box<dyn Kernel>> {
    let mode = match node.get_s("mode", "linear")?.as_str() {
        "bilinear" | "linear" => GsMode::Linear,
        "nearest" => GsMode::Nearest,
        "bicubic" | "cubic" => GsMode::Cubic,
        m => unsupported!("GridSample mode '{m}' is not supported"),
    };
    let pad = match node.get_s("padding_mode", "zeros")?.as_str() {
        "zeros" => GsPad::Zeros,
        "border" => GsPad::Border,
        "reflection" => GsPad::Reflection,
        m => unsupported!("GridSample padding_mode '{m}' is not supported"),
    };
    let align = match node.get_i("align_corners", 0)? {
        0 => false,
        1 => true,
        v => bail!("GridSample align_corners must be 0 or 1, is {v}"),
    };
    let gs = GridSampler { mode, pad, align };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let grid = tensor_in(inputs, 1)?;
            let xs_shape = x.shape();
            let gshape = grid.shape();
            if xs_shape.len() < 3 {
                bail!("GridSample input X must have rank >= 3, has shape {xs_shape:?}");
            }
            let r = xs_shape.len() - 2;
            if gshape.len() != r + 2 || gshape[0] != xs_shape[0] || gshape[r + 1] != r {
                bail!(
                    "GridSample grid shape {gshape:?} does not match X shape {xs_shape:?} \
                     (expected [N, spatial..., {r}])"
                );
            }
            if !is_float(x.dtype()) {
                return Err(bad_type("GridSample", x.dtype()));
            }
            let xs = load_f64("GridSample", x)?;
            let gs_vals: Vec<f32> = grid.to_f32_vec()?;
            let (n, c) = (xs_shape[0], xs_shape[1]);
            let in_dims = &xs_shape[2..];
            let in_size = prod(in_dims);
            let out_dims = &gshape[1..r + 1];
            let out_size = prod(out_dims);
            let mut out_shape = vec![n, c];
            out_shape.extend_from_slice(out_dims);
            let mut ys = vec![0.0f64; n * c * out_size];
            let mut in_strides = vec![1usize; r];
            for i in (0..r.saturating_sub(1)).rev() {
                in_strides[i] = in_strides[i + 1] * in_dims[i + 1];
            }
            let mut taps: Vec<Vec<(Option<usize>, f64)>> = vec![Vec::new(); r];
            // Flattened combination of taps: (offset or padding, weight).
            let mut combo: Vec<(Option<usize>, f64)> = Vec::new();
            let mut next: Vec<(Option<usize>, f64)> = Vec::new();
            for b in 0..n {
                for o in 0..out_size {
                    let g = &gs_vals[(b * out_size + o) * r..][..r];
                    for (i, t) in taps.iter_mut().enumerate() {
                        // The grid's last axis lists coordinates innermost dimension first.
                        gs.taps(g[r - 1 - i], in_dims[i], t);
                    }
                    combo.clear();
                    combo.push((Some(0), 1.0));
                    for (i, t) in taps.iter().enumerate() {
                        next.clear();
                        for &(off, w) in &combo {
                            for &(ix, tw) in t {
                                let o2 = match (off, ix) {
                                    (Some(a), Some(ix)) => Some(a + ix * in_strides[i]),
                                    _ => None,
                                };
                                next.push((o2, w * tw));
                            }
                        }
                        core::mem::swap(&mut combo, &mut next);
                    }
                    for ch in 0..c {
                        let plane = &xs[(b * c + ch) * in_size..][..in_size];
                        let mut acc = 0.0;
                        for &(off, w) in &combo {
                            if let Some(off) = off {
                                acc += w * plane[off];
                            }
                        }
                        ys[(b * c + ch) * out_size + o] = acc;
                    }
                }
            }
            out1(store_f64("GridSample", x.dtype(), &out_shape, ys)?)
        },
    ))
}

// ----------------------------------------------------------------------------- AffineGrid

fn build_affine_grid(node: &Node) -> Result<Box<dyn Kernel>> {
    let align = match node.get_i("align_corners", 0)? {
        0 => false,
        1 => true,
        v => bail!("AffineGrid align_corners must be 0 or 1, is {v}"),
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let theta = tensor_in(inputs, 0)?;
            let size = tensor_in(inputs, 1)?.to_i64_vec()?;
            if size.len() != 4 && size.len() != 5 {
                bail!(
                    "AffineGrid size must have 4 or 5 values, has {}",
                    size.len()
                );
            }
            if size.iter().any(|&s| s < 0) {
                bail!("AffineGrid size {size:?} has a negative value");
            }
            let r = size.len() - 2;
            let n = size[0] as usize;
            let ts = theta.shape();
            if ts != [n, r, r + 1] {
                bail!(
                    "AffineGrid theta shape {ts:?} does not match size {size:?} (expected [{n}, {r}, {}])",
                    r + 1
                );
            }
            if !is_float(theta.dtype()) {
                return Err(bad_type("AffineGrid", theta.dtype()));
            }
            let th = load_f64("AffineGrid", theta)?;
            let dims: Vec<usize> = size[2..].iter().map(|&s| s as usize).collect();
            // Base coordinates per spatial dimension (outermost first).
            let base: Vec<Vec<f64>> = dims
                .iter()
                .map(|&d| {
                    (0..d)
                        .map(|i| {
                            let (i, df) = (i as f64, d as f64);
                            if align {
                                if d > 1 {
                                    -1.0 + 2.0 * i / (df - 1.0)
                                } else {
                                    -1.0
                                }
                            } else {
                                -1.0 + (2.0 * i + 1.0) / df
                            }
                        })
                        .collect()
                })
                .collect();
            let sp = crate::tensor::numel(&dims)?;
            crate::tensor::numel(&[n, sp, r])?;
            let mut out = vec![0.0f64; n * sp * r];
            let mut idx = vec![0usize; r];
            let mut h = vec![0.0f64; r + 1];
            for s in 0..sp {
                let mut rem = s;
                for i in (0..r).rev() {
                    idx[i] = rem % dims[i];
                    rem /= dims[i];
                }
                // Homogeneous point (x, y[, z], 1): x is the innermost dimension.
                for j in 0..r {
                    h[j] = base[r - 1 - j][idx[r - 1 - j]];
                }
                h[r] = 1.0;
                for b in 0..n {
                    let t = &th[b * r * (r + 1)..][..r * (r + 1)];
                    for k in 0..r {
                        let row = &t[k * (r + 1)..][..r + 1];
                        out[(b * sp + s) * r + k] = row.iter().zip(&h).map(|(a, b)| a * b).sum();
                    }
                }
            }
            let mut shape = vec![n];
            shape.extend_from_slice(&dims);
            shape.push(r);
            out1(store_f64("AffineGrid", theta.dtype(), &shape, out)?)
        },
    ))
}

// ----------------------------------------------------------------------------- NonMaxSuppression

/// Whether boxes `a` and `b` overlap with IoU above `thr`.
fn nms_suppress(a: &[f32], b: &[f32], center: bool, thr: f32) -> bool {
    let (ax0, ax1, ay0, ay1, bx0, bx1, by0, by1);
    if center {
        (ax0, ax1) = (a[0] - a[2] / 2.0, a[0] + a[2] / 2.0);
        (ay0, ay1) = (a[1] - a[3] / 2.0, a[1] + a[3] / 2.0);
        (bx0, bx1) = (b[0] - b[2] / 2.0, b[0] + b[2] / 2.0);
        (by0, by1) = (b[1] - b[3] / 2.0, b[1] + b[3] / 2.0);
    } else {
        // [y1, x1, y2, x2], corners in either order.
        (ax0, ax1) = (a[1].min(a[3]), a[1].max(a[3]));
        (ay0, ay1) = (a[0].min(a[2]), a[0].max(a[2]));
        (bx0, bx1) = (b[1].min(b[3]), b[1].max(b[3]));
        (by0, by1) = (b[0].min(b[2]), b[0].max(b[2]));
    }
    let (ix0, ix1) = (ax0.max(bx0), ax1.min(bx1));
    let (iy0, iy1) = (ay0.max(by0), ay1.min(by1));
    if ix1 <= ix0 || iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let area_a = (ax1 - ax0) * (ay1 - ay0);
    let area_b = (bx1 - bx0) * (by1 - by0);
    let union = area_a + area_b - inter;
    if inter <= 0.0 || area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > thr
}

fn build_nms(node: &Node) -> Result<Box<dyn Kernel>> {
    let center = match node.get_i("center_point_box", 0)? {
        0 => false,
        1 => true,
        v => bail!("NonMaxSuppression center_point_box must be 0 or 1, is {v}"),
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let boxes_t = tensor_in(inputs, 0)?;
            let scores_t = tensor_in(inputs, 1)?;
            let bs = boxes_t.shape();
            let ss = scores_t.shape();
            if bs.len() != 3 || bs[2] != 4 {
                bail!("NonMaxSuppression boxes must have shape [batches, boxes, 4], has {bs:?}");
            }
            if ss.len() != 3 || ss[0] != bs[0] || ss[2] != bs[1] {
                bail!(
                    "NonMaxSuppression scores shape {ss:?} does not match boxes shape {bs:?} \
                     (expected [batches, classes, boxes])"
                );
            }
            let scalar_i = |i: usize| -> Result<Option<i64>> {
                match opt_tensor_in(inputs, i)? {
                    Some(t) if !t.is_empty() => Ok(Some(t.to_i64_vec()?[0])),
                    _ => Ok(None),
                }
            };
            let scalar_f = |i: usize| -> Result<Option<f32>> {
                match opt_tensor_in(inputs, i)? {
                    Some(t) if !t.is_empty() => Ok(Some(t.to_f32_vec()?[0])),
                    _ => Ok(None),
                }
            };
            let max_out = scalar_i(2)?.unwrap_or(0).max(0) as u64;
            let iou_thr = scalar_f(3)?.unwrap_or(0.0);
            let score_thr = scalar_f(4)?;
            let boxes = boxes_t.to_f32_vec()?;
            let scores = scores_t.to_f32_vec()?;
            let (nb, nc, nbox) = (ss[0], ss[1], ss[2]);
            let mut sel: Vec<i64> = Vec::new();
            let mut cand: Vec<(f32, usize)> = Vec::new();
            let mut kept: Vec<usize> = Vec::new();
            for b in 0..nb {
                let bb = &boxes[b * nbox * 4..][..nbox * 4];
                for c in 0..nc {
                    let sc = &scores[(b * nc + c) * nbox..][..nbox];
                    cand.clear();
                    cand.extend(
                        sc.iter()
                            .enumerate()
                            .filter(|(_, &s)| score_thr.is_none_or(|t| s > t))
                            .map(|(i, &s)| (s, i)),
                    );
                    // Highest score first; ties keep the lower box index first.
                    cand.sort_by(|a, b| {
                        b.0.partial_cmp(&a.0)
                            .unwrap_or(core::cmp::Ordering::Equal)
                            .then(a.1.cmp(&b.1))
                    });
                    kept.clear();
                    for &(_, i) in &cand {
                        if kept.len() as u64 >= max_out {
                            break;
                        }
                        let bi = &bb[i * 4..][..4];
                        if kept
                            .iter()
                            .all(|&k| !nms_suppress(bi, &bb[k * 4..][..4], center, iou_thr))
                        {
                            kept.push(i);
                            sel.extend_from_slice(&[b as i64, c as i64, i as i64]);
                        }
                    }
                }
            }
            let k = sel.len() / 3;
            out1(Tensor::from_vec(&[k, 3], sel)?)
        },
    ))
}

// ----------------------------------------------------------------------------- RoiAlign

struct RoiAlignCfg {
    max_mode: bool,
    out_h: usize,
    out_w: usize,
    sampling: usize,
    scale: f64,
    half_pixel: bool,
}

fn build_roi_align_v10(node: &Node) -> Result<Box<dyn Kernel>> {
    build_roi_align(node, "output_half_pixel")
}

fn build_roi_align_v16(node: &Node) -> Result<Box<dyn Kernel>> {
    build_roi_align(node, "half_pixel")
}

fn build_roi_align(node: &Node, default_ctm: &str) -> Result<Box<dyn Kernel>> {
    let max_mode = match node.get_s("mode", "avg")?.as_str() {
        "avg" => false,
        "max" => true,
        m => unsupported!("RoiAlign mode '{m}' is not supported"),
    };
    let half_pixel = match node
        .get_s("coordinate_transformation_mode", default_ctm)?
        .as_str()
    {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => unsupported!("RoiAlign coordinate_transformation_mode '{m}' is not supported"),
    };
    let out_h = node.get_i("output_height", 1)?;
    let out_w = node.get_i("output_width", 1)?;
    let sampling = node.get_i("sampling_ratio", 0)?;
    if out_h < 1 || out_w < 1 {
        bail!("RoiAlign output_height/output_width must be >= 1, are {out_h}/{out_w}");
    }
    if sampling < 0 {
        bail!("RoiAlign sampling_ratio must be >= 0, is {sampling}");
    }
    let cfg = RoiAlignCfg {
        max_mode,
        out_h: out_h as usize,
        out_w: out_w as usize,
        sampling: sampling as usize,
        scale: node.get_f("spatial_scale", 1.0)? as f64,
        half_pixel,
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let rois_t = tensor_in(inputs, 1)?;
            let bi_t = tensor_in(inputs, 2)?;
            let xsh = x.shape();
            if xsh.len() != 4 {
                bail!("RoiAlign X must have shape [N, C, H, W], has {xsh:?}");
            }
            let nr = bi_t.len();
            if rois_t.shape() != [nr, 4] || bi_t.rank() != 1 {
                bail!(
                    "RoiAlign rois shape {:?} / batch_indices shape {:?} mismatch (expected [R, 4] and [R])",
                    rois_t.shape(),
                    bi_t.shape()
                );
            }
            let (n, c, h, w) = (xsh[0], xsh[1], xsh[2], xsh[3]);
            let xs = load_f64("RoiAlign", x)?;
            let rois = load_f64("RoiAlign", rois_t)?;
            let bidx = bi_t.to_i64_vec()?;
            let (ph_n, pw_n) = (cfg.out_h, cfg.out_w);
            let mut ys = vec![0.0f64; crate::tensor::numel(&[nr, c, ph_n, pw_n])?];
            // Per sample point: four (offset, weight) corners.
            let mut pre: Vec<[(usize, f64); 4]> = Vec::new();
            for r in 0..nr {
                let b = bidx[r];
                if b < 0 || b as usize >= n {
                    bail!("RoiAlign batch index {b} is out of range for batch size {n}");
                }
                let b = b as usize;
                if h == 0 || w == 0 {
                    continue; // nothing to sample: the output stays zero
                }
                let off = if cfg.half_pixel { 0.5 } else { 0.0 };
                let roi = &rois[r * 4..][..4];
                let (sw, sh) = (roi[0] * cfg.scale - off, roi[1] * cfg.scale - off);
                let (ew, eh) = (roi[2] * cfg.scale - off, roi[3] * cfg.scale - off);
                let (mut rw, mut rh) = (ew - sw, eh - sh);
                if !cfg.half_pixel {
                    rw = rw.max(1.0);
                    rh = rh.max(1.0);
                }
                let (bh, bw) = (rh / ph_n as f64, rw / pw_n as f64);
                let grid = |v: f64| -> usize {
                    if cfg.sampling > 0 {
                        cfg.sampling
                    } else {
                        let g = libm::ceil(v);
                        if g.is_finite() && g > 0.0 {
                            g as usize
                        } else {
                            0
                        }
                    }
                };
                let (gh, gw) = (grid(bh), grid(bw));
                if gh
                    .saturating_mul(gw)
                    .saturating_mul(ph_n.saturating_mul(pw_n))
                    > (1 << 28)
                {
                    bail!("RoiAlign sampling grid {gh}x{gw} is too large");
                }
                let count = (gh * gw).max(1) as f64;
                pre.clear();
                for ph in 0..ph_n {
                    for pw in 0..pw_n {
                        for iy in 0..gh {
                            let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                            for ix in 0..gw {
                                let xx = sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                                pre.push(bilinear_corners(yy, xx, h, w));
                            }
                        }
                    }
                }
                for ch in 0..c {
                    let plane = &xs[(b * c + ch) * h * w..][..h * w];
                    let yo = &mut ys[(r * c + ch) * ph_n * pw_n..][..ph_n * pw_n];
                    let per = gh * gw;
                    for (bin, y) in yo.iter_mut().enumerate() {
                        let pts = &pre[bin * per..][..per];
                        if cfg.max_mode {
                            let mut m: Option<f64> = None;
                            for p in pts {
                                let v = p
                                    .iter()
                                    .map(|&(o, wt)| wt * plane[o])
                                    .fold(f64::NEG_INFINITY, f64::max);
                                m = Some(m.map_or(v, |m| m.max(v)));
                            }
                            *y = m.unwrap_or(0.0);
                        } else {
                            let s: f64 = pts
                                .iter()
                                .map(|p| p.iter().map(|&(o, wt)| wt * plane[o]).sum::<f64>())
                                .sum();
                            *y = s / count;
                        }
                    }
                }
            }
            out1(store_f64("RoiAlign", x.dtype(), &[nr, c, ph_n, pw_n], ys)?)
        },
    ))
}

/// RoiAlign's bilinear corners for the point (y, x) in an h×w plane: zero weights outside
/// [-1, h] × [-1, w], clamped to the edge otherwise.
fn bilinear_corners(y: f64, x: f64, h: usize, w: usize) -> [(usize, f64); 4] {
    if h == 0 || w == 0 || !(y >= -1.0 && y <= h as f64 && x >= -1.0 && x <= w as f64) {
        return [(0, 0.0); 4];
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut yl, mut xl) = (y as usize, x as usize);
    let (yh, xh);
    if yl >= h - 1 {
        yl = h - 1;
        yh = yl;
        y = yl as f64;
    } else {
        yh = yl + 1;
    }
    if xl >= w - 1 {
        xl = w - 1;
        xh = xl;
        x = xl as f64;
    } else {
        xh = xl + 1;
    }
    let (ly, lx) = (y - yl as f64, x - xl as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    [
        (yl * w + xl, hy * hx),
        (yl * w + xh, hy * lx),
        (yh * w + xl, ly * hx),
        (yh * w + xh, ly * lx),
    ]
}

// ----------------------------------------------------------------------------- CenterCropPad

fn build_center_crop_pad(node: &Node) -> Result<Box<dyn Kernel>> {
    let axes = node.attr_ints("axes")?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let target = tensor_in(inputs, 1)?.to_i64_vec()?;
            let shape = x.shape();
            let rank = shape.len();
            let axes: Vec<usize> = match &axes {
                None => (0..rank).collect(),
                Some(a) => a
                    .iter()
                    .map(|&ax| super::norm_axis(ax, rank))
                    .collect::<Result<_>>()?,
            };
            if target.len() != axes.len() {
                bail!(
                    "CenterCropPad shape has {} values but {} axes are cropped/padded",
                    target.len(),
                    axes.len()
                );
            }
            let mut seen = vec![false; rank];
            // Per axis: output index + shift = input index.
            let mut out_shape = shape.to_vec();
            let mut shift = vec![0i64; rank];
            for (&a, &t) in axes.iter().zip(&target) {
                if seen[a] {
                    bail!("CenterCropPad axis {a} is listed twice");
                }
                seen[a] = true;
                if t < 0 {
                    bail!("CenterCropPad target size {t} is negative");
                }
                let d = shape[a] as i64;
                out_shape[a] = t as usize;
                shift[a] = if t < d { (d - t) / 2 } else { -((t - d) / 2) };
            }
            let total = prod(&out_shape);
            let mut in_strides = vec![1usize; rank];
            for i in (0..rank.saturating_sub(1)).rev() {
                in_strides[i] = in_strides[i + 1] * shape[i + 1];
            }
            let mut src: Vec<Option<usize>> = Vec::with_capacity(total);
            let mut idx = vec![0usize; rank];
            for _ in 0..total {
                let mut off = Some(0usize);
                for i in 0..rank {
                    let j = idx[i] as i64 + shift[i];
                    if j < 0 || j >= shape[i] as i64 {
                        off = None;
                        break;
                    }
                    off = off.map(|o| o + j as usize * in_strides[i]);
                }
                src.push(off);
                for i in (0..rank).rev() {
                    idx[i] += 1;
                    if idx[i] < out_shape[i] {
                        break;
                    }
                    idx[i] = 0;
                }
            }
            crate::dispatch_any!(x.dtype(), T => {
                let xs = x.as_slice::<T>()?;
                let zero = Tensor::zeros(x.dtype(), &[1])?.into_vec::<T>()?.remove(0);
                let v = gather_or(&xs, &src, zero);
                out1(Tensor::from_vec(&out_shape, v)?)
            }, else Err(bad_type("CenterCropPad", x.dtype())))
        },
    ))
}

/// `xs[o]` for each `Some(o)` in `src`, `zero` for each `None`.
fn gather_or<T: Clone>(xs: &[T], src: &[Option<usize>], zero: T) -> Vec<T> {
    src.iter()
        .map(|s| match s {
            Some(o) => xs[*o].clone(),
            None => zero.clone(),
        })
        .collect()
}

// ----------------------------------------------------------------------------- Col2Im

fn build_col2im(node: &Node) -> Result<Box<dyn Kernel>> {
    let dil = ints_attr(node, "dilations", 0, 1)?;
    let pads = ints_attr(node, "pads", 0, 0)?;
    let strides = ints_attr(node, "strides", 0, 1)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let img = tensor_in(inputs, 1)?.to_i64_vec()?;
            let blk = tensor_in(inputs, 2)?.to_i64_vec()?;
            let r = img.len();
            if r == 0 || blk.len() != r {
                bail!("Col2Im image_shape {img:?} and block_shape {blk:?} must have the same non-zero length");
            }
            if img.iter().chain(&blk).any(|&v| v < 1) {
                bail!("Col2Im image_shape {img:?} and block_shape {blk:?} must be positive");
            }
            let get = |v: &Option<Vec<i64>>, n: usize, d: i64, what: &str| -> Result<Vec<i64>> {
                match v {
                    None => Ok(vec![d; n]),
                    Some(v) if v.len() == n => Ok(v.clone()),
                    Some(v) => bail!("Col2Im {what} has {} values, expected {n}", v.len()),
                }
            };
            let dil = get(&dil, r, 1, "dilations")?;
            let pads = get(&pads, 2 * r, 0, "pads")?;
            let strides = get(&strides, r, 1, "strides")?;
            let xs_shape = x.shape();
            if xs_shape.len() != 3 {
                bail!("Col2Im input must have shape [N, C*prod(block_shape), L], has {xs_shape:?}");
            }
            let kprod: usize = blk.iter().map(|&b| b as usize).product();
            if xs_shape[1] % kprod != 0 {
                bail!(
                    "Col2Im input dimension 1 ({}) is not divisible by the block size {kprod}",
                    xs_shape[1]
                );
            }
            let c = xs_shape[1] / kprod;
            let n = xs_shape[0];
            let mut ncol = Vec::with_capacity(r);
            for i in 0..r {
                let span = img[i]
                    .saturating_add(pads[i])
                    .saturating_add(pads[i + r])
                    .saturating_sub(dil[i].saturating_mul(blk[i] - 1).saturating_add(1));
                if span < 0 {
                    bail!("Col2Im block does not fit the padded image along dimension {i}");
                }
                ncol.push((span / strides[i] + 1) as usize);
            }
            let l = prod(&ncol);
            if xs_shape[2] != l {
                bail!(
                    "Col2Im input has {} blocks, the shapes give {l}",
                    xs_shape[2]
                );
            }
            if !is_float(x.dtype()) {
                return Err(bad_type("Col2Im", x.dtype()));
            }
            let xs = load_f64("Col2Im", x)?;
            let imgu: Vec<usize> = img.iter().map(|&v| v as usize).collect();
            let isz = prod(&imgu);
            let mut ys = vec![0.0f64; n * c * isz];
            let blku: Vec<usize> = blk.iter().map(|&v| v as usize).collect();
            let mut kidx = vec![0usize; r];
            let mut cidx = vec![0usize; r];
            for k in 0..kprod {
                let mut rem = k;
                for i in (0..r).rev() {
                    kidx[i] = rem % blku[i];
                    rem /= blku[i];
                }
                for col in 0..l {
                    let mut rem = col;
                    for i in (0..r).rev() {
                        cidx[i] = rem % ncol[i];
                        rem /= ncol[i];
                    }
                    let mut off = 0usize;
                    let mut inside = true;
                    for i in 0..r {
                        let p = cidx[i] as i64 * strides[i] - pads[i] + kidx[i] as i64 * dil[i];
                        if p < 0 || p >= img[i] {
                            inside = false;
                            break;
                        }
                        off = off * imgu[i] + p as usize;
                    }
                    if !inside {
                        continue;
                    }
                    for bc in 0..n * c {
                        ys[bc * isz + off] += xs[(bc * kprod + k) * l + col];
                    }
                }
            }
            let mut shape = vec![n, c];
            shape.extend_from_slice(&imgu);
            out1(store_f64("Col2Im", x.dtype(), &shape, ys)?)
        },
    ))
}

// ----------------------------------------------------------------------------- DeformConv

fn build_deform_conv(node: &Node) -> Result<Box<dyn Kernel>> {
    let dil = ints_attr(node, "dilations", 2, 1)?.unwrap_or(vec![1, 1]);
    let pads = ints_attr(node, "pads", 4, 0)?.unwrap_or(vec![0, 0, 0, 0]);
    let strides = ints_attr(node, "strides", 2, 1)?.unwrap_or(vec![1, 1]);
    let kshape = ints_attr(node, "kernel_shape", 2, 1)?;
    let group = node.get_i("group", 1)?;
    let og = node.get_i("offset_group", 1)?;
    if group < 1 || og < 1 {
        bail!("DeformConv group ({group}) and offset_group ({og}) must be >= 1");
    }
    let (group, og) = (group as usize, og as usize);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let wt = tensor_in(inputs, 1)?;
            let offt = tensor_in(inputs, 2)?;
            let bias = opt_tensor_in(inputs, 3)?;
            let mask = opt_tensor_in(inputs, 4)?;
            let (xsh, wsh, osh) = (x.shape(), wt.shape(), offt.shape());
            if xsh.len() != 4 || wsh.len() != 4 || osh.len() != 4 {
                unsupported!(
                    "DeformConv supports 2-D convolution only (X {xsh:?}, W {wsh:?}, offset {osh:?})"
                );
            }
            let (n, ic, ih, iw) = (xsh[0], xsh[1], xsh[2], xsh[3]);
            let (oc, icg) = (wsh[0], wsh[1]);
            let (kh, kw) = (wsh[2], wsh[3]);
            if let Some(k) = &kshape {
                if k[0] as usize != kh || k[1] as usize != kw {
                    bail!("DeformConv kernel_shape {k:?} does not match W shape {wsh:?}");
                }
            }
            if icg * group != ic || oc % group != 0 {
                bail!("DeformConv shapes X {xsh:?}, W {wsh:?} do not fit group {group}");
            }
            if ic % og != 0 {
                bail!("DeformConv input channels {ic} are not divisible by offset_group {og}");
            }
            let ocg = oc / group;
            let ext = |k: usize, d: i64| (k as i64 - 1) * d + 1;
            let oh = (ih as i64 + pads[0] + pads[2] - ext(kh, dil[0])) / strides[0] + 1;
            let ow = (iw as i64 + pads[1] + pads[3] - ext(kw, dil[1])) / strides[1] + 1;
            if oh < 1 || ow < 1 {
                bail!("DeformConv output would be empty or negative ({oh}x{ow})");
            }
            let (oh, ow) = (oh as usize, ow as usize);
            let kk = kh * kw;
            if osh != [n, og * kk * 2, oh, ow] {
                bail!(
                    "DeformConv offset shape {osh:?} should be [{n}, {}, {oh}, {ow}]",
                    og * kk * 2
                );
            }
            if let Some(m) = mask {
                if m.shape() != [n, og * kk, oh, ow] {
                    bail!(
                        "DeformConv mask shape {:?} should be [{n}, {}, {oh}, {ow}]",
                        m.shape(),
                        og * kk
                    );
                }
            }
            if let Some(b) = bias {
                if b.shape() != [oc] {
                    bail!("DeformConv bias shape {:?} should be [{oc}]", b.shape());
                }
            }
            if !is_float(x.dtype()) {
                return Err(bad_type("DeformConv", x.dtype()));
            }
            let xs = load_f64("DeformConv", x)?;
            let ws = load_f64("DeformConv", wt)?;
            let offs = load_f64("DeformConv", offt)?;
            let ms = mask.map(|m| load_f64("DeformConv", m)).transpose()?;
            let bs = bias.map(|b| load_f64("DeformConv", b)).transpose()?;
            let osz = oh * ow;
            // Sampled (masked) input columns: [ic, kh*kw, oh*ow] per batch.
            let mut cols = vec![0.0f64; ic * kk * osz];
            let mut ys = vec![0.0f64; n * oc * osz];
            let icpg = ic / og;
            for b in 0..n {
                for ci in 0..ic {
                    let g = ci / icpg;
                    let plane = &xs[(b * ic + ci) * ih * iw..][..ih * iw];
                    for ki in 0..kh {
                        for kj in 0..kw {
                            let k = ki * kw + kj;
                            let obase = ((b * og + g) * kk + k) * 2;
                            for i in 0..oh {
                                for j in 0..ow {
                                    let p = i * ow + j;
                                    let dy = offs[obase * osz + p];
                                    let dx = offs[(obase + 1) * osz + p];
                                    let y = (i as i64 * strides[0] - pads[0] + ki as i64 * dil[0])
                                        as f64
                                        + dy;
                                    let xx = (j as i64 * strides[1] - pads[1] + kj as i64 * dil[1])
                                        as f64
                                        + dx;
                                    let mut v = bilinear_zero(plane, ih, iw, y, xx);
                                    if let Some(ms) = &ms {
                                        v *= ms[((b * og + g) * kk + k) * osz + p];
                                    }
                                    cols[(ci * kk + k) * osz + p] = v;
                                }
                            }
                        }
                    }
                }
                for o in 0..oc {
                    let g = o / ocg;
                    let y = &mut ys[(b * oc + o) * osz..][..osz];
                    if let Some(bs) = &bs {
                        y.fill(bs[o]);
                    }
                    for cl in 0..icg {
                        let ci = g * icg + cl;
                        for k in 0..kk {
                            let wv = ws[(o * icg + cl) * kk + k];
                            let col = &cols[(ci * kk + k) * osz..][..osz];
                            for (yv, &cv) in y.iter_mut().zip(col) {
                                *yv += wv * cv;
                            }
                        }
                    }
                }
            }
            out1(store_f64("DeformConv", x.dtype(), &[n, oc, oh, ow], ys)?)
        },
    ))
}

/// Bilinear sample of an h×w plane at (y, x), with zeros outside the plane.
fn bilinear_zero(plane: &[f64], h: usize, w: usize, y: f64, x: f64) -> f64 {
    // Beyond one pixel outside the plane every tap is padding (also catches NaN).
    if !(y > -2.0 && y < h as f64 + 1.0 && x > -2.0 && x < w as f64 + 1.0) {
        return 0.0;
    }
    let (y0, x0) = (libm::floor(y), libm::floor(x));
    let (ty, tx) = (y - y0, x - x0);
    let (y0, x0) = (y0 as i64, x0 as i64);
    let at = |yy: i64, xx: i64| -> f64 {
        if yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < w {
            plane[yy as usize * w + xx as usize]
        } else {
            0.0
        }
    };
    (1.0 - ty) * ((1.0 - tx) * at(y0, x0) + tx * at(y0, x0 + 1))
        + ty * ((1.0 - tx) * at(y0 + 1, x0) + tx * at(y0 + 1, x0 + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cubic_coeffs_sum_to_one_and_interpolate() {
        // At t = 0 the kernel passes through the sample: weights (0, 1, 0, 0).
        let c = cubic_coeffs(0.0);
        assert!((c[0]).abs() < 1e-12 && (c[1] - 1.0).abs() < 1e-12 && c[2].abs() < 1e-12);
        // At t = 0.5 with A = -0.75: far taps = -0.09375, near taps = 0.59375.
        let c = cubic_coeffs(0.5);
        assert!((c[0] + 0.09375).abs() < 1e-12 && (c[3] + 0.09375).abs() < 1e-12);
        assert!((c[1] - 0.59375).abs() < 1e-12 && (c[2] - 0.59375).abs() < 1e-12);
    }

    #[test]
    fn reflect_folds_back() {
        // Borders [-0.5, 3.5]: -1 reflects to 0, 4 reflects to 3.
        assert_eq!(reflect(-1.0, -0.5, 3.5), 0.0);
        assert_eq!(reflect(4.0, -0.5, 3.5), 3.0);
        // dx = 4.5 = 1 range + 0.5, odd count: lo + 0.5.
        assert_eq!(reflect(8.0, -0.5, 3.5), 0.0);
        assert_eq!(reflect(2.0, -0.5, 3.5), 2.0);
    }

    #[test]
    fn nms_iou() {
        // Two unit squares overlapping by half: IoU = 0.5 / 1.5 = 1/3.
        let a = [0.0, 0.0, 1.0, 1.0];
        let b = [0.0, 0.5, 1.0, 1.5];
        assert!(nms_suppress(&a, &b, false, 0.3));
        assert!(!nms_suppress(&a, &b, false, 0.34));
        // The same boxes as centre + size.
        let a = [0.5, 0.5, 1.0, 1.0];
        let b = [1.0, 0.5, 1.0, 1.0];
        assert!(nms_suppress(&a, &b, true, 0.3));
    }

    #[test]
    fn bilinear_zero_outside() {
        let p = [1.0, 2.0, 3.0, 4.0];
        // Centre of a 2×2 plane: mean of all four.
        assert!((bilinear_zero(&p, 2, 2, 0.5, 0.5) - 2.5).abs() < 1e-12);
        // Half a pixel left of column 0 on row 0: half of 1.0 (the other half is padding).
        assert!((bilinear_zero(&p, 2, 2, 0.0, -0.5) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn roi_corners_clamp_at_edge() {
        // A point past the last row/column (but within one pixel) clamps to the corner pixel
        // with full weight.
        let c = bilinear_corners(1.8, 1.8, 2, 2);
        assert_eq!(c[0], (3, 1.0));
        // Beyond h (or w) it contributes nothing.
        assert!(bilinear_corners(2.5, 0.0, 2, 2)
            .iter()
            .all(|&(_, w)| w == 0.0));
        // A point past -1 contributes nothing.
        assert!(bilinear_corners(-1.5, 0.0, 2, 2)
            .iter()
            .all(|&(_, w)| w == 0.0));
    }
}
