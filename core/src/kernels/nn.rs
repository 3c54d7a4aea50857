//! Kernel family nn: Conv, ConvTranspose, ConvInteger, QLinearConv, pooling and MaxUnpool.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::linalg::{narrow_f32, widen_f32, Num};
use crate::kernels::par::{par_chunks_mut, SyncPtr};
use crate::kernels::types::{FLOATS, INT8, PLAIN};
use crate::kernels::{
    bad_type, def, def_in, dims_of, opt_tensor_in, out1, tensor_in, Prepacked, LATEST,
};
use crate::provider::{CpuBackend, Gemm, GemmEpi, Kernel, KernelCx, KernelDef, Operand};
use crate::simd;
use crate::tensor::{Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) mod nchwc;
mod qconv;
pub(crate) use qconv::{q8_bytes, q8_key};

/// MaxPool's typed paths: the floats (f16/bf16 through f32), int8, uint8 and int32.
const MAX_POOL_TYPES: &[DataType] = &[
    DataType::Float,
    DataType::Double,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Int8,
    DataType::Uint8,
    DataType::Int32,
];

/// GlobalMaxPool: the floats, and int8/uint8 (exact through f32).
const GLOBAL_MAX_POOL_TYPES: &[DataType] = &[
    DataType::Float,
    DataType::Double,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Int8,
    DataType::Uint8,
];

pub(crate) const KERNELS: &[KernelDef] = &[
    def("Conv", 1, LATEST, build_conv).types(FLOATS),
    def_in("com.microsoft", "FusedConv", 1, 1, build_fused_conv).types(&[DataType::Float]),
    def("ConvTranspose", 1, LATEST, build_conv_transpose).types(FLOATS),
    def("ConvInteger", 10, LATEST, build_conv_integer).types(INT8),
    def("QLinearConv", 10, LATEST, build_qlinear_conv).types(INT8),
    def("MaxPool", 1, LATEST, build_max_pool).types(MAX_POOL_TYPES),
    def("AveragePool", 1, LATEST, build_average_pool).types(FLOATS),
    def("LpPool", 1, LATEST, build_lp_pool).types(FLOATS),
    def("GlobalAveragePool", 1, LATEST, build_global_average_pool).types(FLOATS),
    def("GlobalMaxPool", 1, LATEST, build_global_max_pool).types(GLOBAL_MAX_POOL_TYPES),
    def("GlobalLpPool", 1, LATEST, build_global_lp_pool).types(FLOATS),
    def("MaxUnpool", 9, LATEST, build_max_unpool).types(PLAIN),
];

/// Most spatial dimensions the kernels here handle (decoded on the stack).
const MAX_SPATIAL: usize = 8;

/// Elements of one im2col / col2im tile: small enough to stay in a core's L2 cache between
/// the im2col pass and the GEMM that reads it (512 KiB of f32).
const COL_BUDGET: usize = 1 << 17;

// ----------------------------------------------------------------------------- attributes

#[derive(Clone, Copy, Debug, PartialEq)]
enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Spatial attributes shared by convolutions and pools (unresolved until the rank is known).
#[derive(Clone, Debug)]
struct Spatial {
    auto_pad: AutoPad,
    kernel: Option<Vec<usize>>,
    strides: Option<Vec<usize>>,
    dilations: Option<Vec<usize>>,
    pads: Option<Vec<usize>>,
}

fn positive(node: &Node, name: &str) -> Result<Option<Vec<usize>>> {
    match node.attr_ints(name)? {
        None => Ok(None),
        Some(v) => {
            if v.iter().any(|&x| x <= 0) {
                bail!("attribute {name} must be positive, is {v:?}");
            }
            Ok(Some(dims_of(&v)?))
        }
    }
}

fn parse_spatial(node: &Node) -> Result<Spatial> {
    let auto_pad = match node.get_s("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => unsupported!("auto_pad '{other}' is not supported"),
    };
    let pads = match node.attr_ints("pads")? {
        None => None,
        Some(p) => {
            if p.iter().any(|&x| x < 0) {
                unsupported!("negative pads {p:?} are not supported");
            }
            Some(dims_of(&p)?)
        }
    };
    Ok(Spatial {
        auto_pad,
        kernel: positive(node, "kernel_shape")?,
        strides: positive(node, "strides")?,
        dilations: positive(node, "dilations")?,
        pads,
    })
}

impl Spatial {
    fn per_dim(
        v: &Option<Vec<usize>>,
        nd: usize,
        name: &str,
        default: usize,
    ) -> Result<Vec<usize>> {
        match v {
            None => Ok(vec![default; nd]),
            Some(v) if v.len() == nd => Ok(v.clone()),
            Some(v) => bail!(
                "attribute {name} has {} values for {nd} spatial dimensions",
                v.len()
            ),
        }
    }
    fn strides(&self, nd: usize) -> Result<Vec<usize>> {
        Self::per_dim(&self.strides, nd, "strides", 1)
    }
    fn dilations(&self, nd: usize) -> Result<Vec<usize>> {
        Self::per_dim(&self.dilations, nd, "dilations", 1)
    }
    /// Explicit (begin, end) pads.
    fn pads(&self, nd: usize) -> Result<(Vec<usize>, Vec<usize>)> {
        match &self.pads {
            None => Ok((vec![0; nd], vec![0; nd])),
            Some(p) if p.len() == 2 * nd => Ok((p[..nd].to_vec(), p[nd..].to_vec())),
            Some(p) => bail!(
                "attribute pads has {} values for {nd} spatial dimensions",
                p.len()
            ),
        }
    }
}

/// Resolved geometry of a convolution or pooling window over `nd` spatial dimensions.
/// For ConvTranspose, `inp` is the input (X) and `out` the output (Y) extent, with output
/// position `i*s + k*d - pb` for input position `i`.
#[derive(Clone, Debug)]
struct Geom {
    inp: Vec<usize>,
    out: Vec<usize>,
    k: Vec<usize>,
    s: Vec<usize>,
    d: Vec<usize>,
    pb: Vec<isize>,
}

impl Geom {
    fn nd(&self) -> usize {
        self.inp.len()
    }

    /// The same convolution on fewer axes: without its unit axes (input, kernel and output
    /// extent 1, no padding), which add nothing but per-element work to im2col (magika's
    /// [512, 1] planes with a [5, 1] kernel become 1-D runs), and with a trailing axis the
    /// kernel does not move along merged into the one before. At least one axis stays.
    fn simplified(&self) -> Geom {
        let keep: Vec<usize> = (0..self.nd())
            .filter(|&i| {
                !(self.inp[i] == 1 && self.k[i] == 1 && self.out[i] == 1 && self.pb[i] == 0)
            })
            .collect();
        let keep = if keep.is_empty() {
            vec![self.nd() - 1]
        } else {
            keep
        };
        let pick = |v: &[usize]| keep.iter().map(|&i| v[i]).collect::<Vec<_>>();
        let mut g = Geom {
            inp: pick(&self.inp),
            out: pick(&self.out),
            k: pick(&self.k),
            s: pick(&self.s),
            d: pick(&self.d),
            pb: keep.iter().map(|&i| self.pb[i]).collect(),
        };
        // A last axis the kernel does not move along (extent 1, stride 1, no padding) merges
        // into the axis before it when that one has stride 1: row r of W positions is then
        // positions r*W.. of one axis, and a tap ky reads ky*d*W further on. A [3, 1] kernel
        // over [H, W] planes becomes a 1-D conv over H*W with dilation W (long im2col runs
        // instead of one per row).
        while g.nd() >= 2 {
            let (l, p) = (g.nd() - 1, g.nd() - 2);
            let w = g.inp[l];
            if !(g.k[l] == 1 && g.s[l] == 1 && g.pb[l] == 0 && g.out[l] == w && g.s[p] == 1) {
                break;
            }
            g.inp[p] *= w;
            g.out[p] *= w;
            g.d[p] *= w;
            g.pb[p] *= w as isize;
            for v in [&mut g.inp, &mut g.out, &mut g.k, &mut g.s, &mut g.d] {
                v.pop();
            }
            g.pb.pop();
        }
        g
    }
}

fn check_nd(nd: usize) -> Result<()> {
    if nd == 0 || nd > MAX_SPATIAL {
        unsupported!("{nd} spatial dimensions are not supported");
    }
    Ok(())
}

/// Output extents and begin pads of a convolution (ONNX Conv rules).
fn conv_geom(sp: &Spatial, inp: &[usize], k: &[usize]) -> Result<Geom> {
    let nd = inp.len();
    check_nd(nd)?;
    let s = sp.strides(nd)?;
    let d = sp.dilations(nd)?;
    let (pb, pe) = sp.pads(nd)?;
    let mut out = vec![0; nd];
    let mut pbv = vec![0isize; nd];
    for j in 0..nd {
        let keff = (k[j] - 1) * d[j] + 1;
        match sp.auto_pad {
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = if sp.auto_pad == AutoPad::Valid {
                    (0, 0)
                } else {
                    (pb[j], pe[j])
                };
                let padded = inp[j] + b + e;
                if padded < keff {
                    bail!(
                        "kernel extent {keff} exceeds the padded input extent {padded} (axis {})",
                        j + 2
                    );
                }
                out[j] = (padded - keff) / s[j] + 1;
                pbv[j] = b as isize;
            }
            AutoPad::SameUpper | AutoPad::SameLower => {
                out[j] = inp[j].div_ceil(s[j]);
                let total = ((out[j].max(1) - 1) * s[j] + keff).saturating_sub(inp[j]);
                pbv[j] = if sp.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                } as isize;
            }
        }
    }
    Ok(Geom {
        inp: inp.to_vec(),
        out,
        k: k.to_vec(),
        s,
        d,
        pb: pbv,
    })
}

/// Output extents and begin/end pads of a pooling window (ONNX pool rules, with ceil_mode).
fn pool_geom(sp: &Spatial, inp: &[usize], k: &[usize], ceil: bool) -> Result<(Geom, Vec<isize>)> {
    let nd = inp.len();
    check_nd(nd)?;
    if k.len() != nd {
        bail!(
            "kernel_shape has {} values for {nd} spatial dimensions",
            k.len()
        );
    }
    let s = sp.strides(nd)?;
    let d = sp.dilations(nd)?;
    let (pb, pe) = sp.pads(nd)?;
    let mut out = vec![0; nd];
    let mut pbv = vec![0isize; nd];
    let mut pev = vec![0isize; nd];
    for j in 0..nd {
        let keff = (k[j] - 1) * d[j] + 1;
        match sp.auto_pad {
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = if sp.auto_pad == AutoPad::Valid {
                    (0, 0)
                } else {
                    (pb[j], pe[j])
                };
                let padded = inp[j] + b + e;
                if padded < keff {
                    bail!(
                        "kernel extent {keff} exceeds the padded input extent {padded} (axis {})",
                        j + 2
                    );
                }
                let span = padded - keff;
                out[j] = if ceil {
                    let mut o = span.div_ceil(s[j]) + 1;
                    // The last window must start inside the input or its begin padding.
                    if (o - 1) * s[j] >= inp[j] + b {
                        o -= 1;
                    }
                    o
                } else {
                    span / s[j] + 1
                };
                pbv[j] = b as isize;
                pev[j] = e as isize;
            }
            AutoPad::SameUpper | AutoPad::SameLower => {
                out[j] = inp[j].div_ceil(s[j]);
                let total = ((out[j].max(1) - 1) * s[j] + keff).saturating_sub(inp[j]);
                let b = if sp.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                pbv[j] = b as isize;
                pev[j] = (total - b) as isize;
            }
        }
    }
    Ok((
        Geom {
            inp: inp.to_vec(),
            out,
            k: k.to_vec(),
            s,
            d,
            pb: pbv,
        },
        pev,
    ))
}

/// `ceil(a / b)` for `b > 0`.
#[inline]
fn ceil_div(a: isize, b: isize) -> isize {
    if a >= 0 {
        (a + b - 1) / b
    } else {
        -((-a) / b)
    }
}

/// The range `[lo, hi)` of positions `p` (within `[p0, p1)`) for which `p*s + off` lies in
/// `[0, n)`.
#[inline]
fn valid_range(p0: usize, p1: usize, s: usize, off: isize, n: usize) -> (usize, usize) {
    let s = s as isize;
    let lo = ceil_div(-off, s).max(p0 as isize);
    let top = n as isize - 1 - off; // p*s <= top
    let hi = if top < 0 { 0 } else { top / s + 1 };
    let hi = hi.min(p1 as isize);
    let lo = lo.min(p1 as isize);
    (lo as usize, hi.max(lo) as usize)
}

/// Kernel offsets of flat kernel index `r` (row-major over `k`), on the stack.
#[inline]
fn decode(mut r: usize, k: &[usize], out: &mut [usize; MAX_SPATIAL]) {
    for j in (0..k.len()).rev() {
        out[j] = r % k[j];
        r /= k[j];
    }
}

/// Row-major element strides of a shape.
fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for j in (0..shape.len().saturating_sub(1)).rev() {
        s[j] = s[j + 1] * shape[j + 1];
    }
    s
}

/// Runs of consecutive positions `[p0, p0+n)` over a grid `ext` that share all but the last
/// coordinate: (prefix coordinates, first last-coordinate, end, offset in the run list).
struct Runs {
    pre: Vec<usize>,
    runs: Vec<(usize, usize, usize)>,
}

fn runs_of(ext: &[usize], p0: usize, n: usize) -> Runs {
    let nd = ext.len();
    let w = ext[nd - 1];
    let mut pre = Vec::new();
    let mut runs = Vec::new();
    let mut p = p0;
    let end = p0 + n;
    while p < end && w > 0 {
        let mut q = p / w;
        let x0 = p % w;
        let x1 = (x0 + (end - p)).min(w);
        let at = pre.len();
        pre.resize(at + nd - 1, 0);
        for j in (0..nd - 1).rev() {
            pre[at + j] = q % ext[j];
            q /= ext[j];
        }
        runs.push((x0, x1, p - p0));
        p += x1 - x0;
    }
    Runs { pre, runs }
}

// ----------------------------------------------------------------------------- im2col / col2im

/// What [`im2col_row`] needs of one tile of output positions, computed once per tile.
struct PatchTile {
    kk: usize,
    plane: usize,
    ist: Vec<usize>,
    runs: Runs,
}

impl PatchTile {
    fn new(g: &Geom, p0: usize, ncols: usize) -> PatchTile {
        PatchTile {
            kk: g.k.iter().product(),
            plane: g.inp.iter().product(),
            ist: strides_of(&g.inp),
            runs: runs_of(&g.out, p0, ncols),
        }
    }
}

/// Row `r` (channel `r / prod(k)`, kernel offset `r % prod(k)`) of the patch matrix of a
/// tile into `row` (one value per output position of the tile; padding is `zero`).
#[inline]
fn im2col_row<T: Copy>(x: &[T], g: &Geom, t: &PatchTile, r: usize, row: &mut [T], zero: T) {
    let last = g.nd() - 1;
    let w = g.inp[last];
    let (sl, dl, pl) = (g.s[last], g.d[last] as isize, g.pb[last]);
    let mut ko = [0usize; MAX_SPATIAL];
    let c = r / t.kk;
    decode(r % t.kk, &g.k, &mut ko);
    let off = ko[last] as isize * dl - pl;
    for (si, &(x0, x1, at)) in t.runs.runs.iter().enumerate() {
        let dst = &mut row[at..at + (x1 - x0)];
        let mut base = c * t.plane;
        let mut inside = true;
        for j in 0..last {
            let o = t.runs.pre[si * last + j];
            let i = (o * g.s[j]) as isize + (ko[j] * g.d[j]) as isize - g.pb[j];
            if i < 0 || i >= g.inp[j] as isize {
                inside = false;
                break;
            }
            base += i as usize * t.ist[j];
        }
        if !inside {
            dst.fill(zero);
            continue;
        }
        let (lo, hi) = valid_range(x0, x1, sl, off, w);
        dst[..lo - x0].fill(zero);
        dst[hi - x0..].fill(zero);
        if lo == hi {
            continue;
        }
        let xs = &x[base..base + w];
        let start = (lo * sl) as isize + off;
        let d = &mut dst[lo - x0..hi - x0];
        if sl == 1 {
            d.copy_from_slice(&xs[start as usize..start as usize + (hi - lo)]);
        } else {
            for (dv, &xv) in d.iter_mut().zip(xs[start as usize..].iter().step_by(sl)) {
                *dv = xv;
            }
        }
    }
}

/// Fills `col` (`c_cnt*prod(k)` rows of `ncols`) with the patches of output positions
/// `p0..p0+ncols` of one image group `x` (`c_cnt` planes of `prod(g.inp)`); padding is `zero`.
fn im2col<T: Copy + Send + Sync>(
    cpu: &dyn CpuBackend,
    x: &[T],
    g: &Geom,
    p0: usize,
    ncols: usize,
    col: &mut [T],
    zero: T,
) {
    let t = PatchTile::new(g, p0, ncols);
    let rows_per_task = (16384 / ncols.max(1)).max(1);
    par_chunks_mut(cpu, col, rows_per_task * ncols, 1, &|q, chunk| {
        for (ri, row) in chunk.chunks_mut(ncols).enumerate() {
            im2col_row(x, g, &t, q * rows_per_task + ri, row, zero);
        }
    });
}

/// The patches of a 1-D convolution without dilation whose windows for output positions
/// `p0..p0+ncols` lie inside the input (no padding read): each channel's windows are rows of
/// the input at the stride's step, so its block of patch rows is their transpose, taken a
/// register block at a time (a per-row gather costs more than the product for a long kernel
/// over a few positions: oww_melspectrogram's 512-tap STFT filters at stride 160). Returns
/// false, writing nothing, for any other convolution.
fn im2col_windows(x: &[f32], g: &Geom, p0: usize, ncols: usize, col: &mut [f32]) -> bool {
    if g.nd() != 1 || g.d[0] != 1 || ncols == 0 {
        return false;
    }
    let (w, k, s) = (g.inp[0], g.k[0], g.s[0]);
    let first = (p0 * s) as isize - g.pb[0];
    let last = ((p0 + ncols - 1) * s + k) as isize - g.pb[0];
    if first < 0 || last > w as isize || k == 0 {
        return false;
    }
    let channels = x.len() / w;
    if col.len() < channels * k * ncols {
        return false;
    }
    for (c, rows) in col.chunks_exact_mut(k * ncols).take(channels).enumerate() {
        let src = &x[c * w + first as usize..(c + 1) * w];
        crate::simd::transpose_matrix(src, s, ncols, k, rows, ncols);
    }
    true
}

/// The patches of output positions `p0..p0+ncols` (`rows` rows: channels times kernel
/// offsets) written straight into the SGEMM's B panels (`nr` columns each, the layout of
/// `Operand::Panels`; columns past `ncols` are zero), so the product packs nothing.
fn im2col_panels(
    x: &[f32],
    g: &Geom,
    p0: usize,
    ncols: usize,
    rows: usize,
    nr: usize,
    out: &mut [f32],
) {
    let t = PatchTile::new(g, p0, ncols);
    let padded = ncols.div_ceil(nr) * nr;
    debug_assert!(out.len() >= rows * padded);
    let mut row = crate::simd::scratch::<f32>(padded);
    row[ncols..].fill(0.0);
    for r in 0..rows {
        im2col_row(x, g, &t, r, &mut row[..ncols], 0.0);
        for (pj, piece) in row.chunks_exact(nr).enumerate() {
            let o = (pj * rows + r) * nr;
            out[o..o + nr].copy_from_slice(piece);
        }
    }
}

/// One tile's product `C = W_g · patches (+ C when beta = 1)` (`mg` x `nc`, row stride
/// `ldc`) for output positions `p0..p0+nc` of one image group. f32 writes the patches straight
/// into the SGEMM's B panels; other types go through `col` (`kdim * nc`) and their GEMM.
#[allow(clippy::too_many_arguments)]
fn conv_tile_product<T: Num>(
    cx: &KernelCx<'_>,
    xg: &[T],
    (wg, wpg): (&[T], Option<&[f32]>),
    g: &Geom,
    (p0, nc): (usize, usize),
    (mg, kdim): (usize, usize),
    col: &mut [T],
    c: &mut [T],
    (ldc, beta): (usize, f32),
    gepi: GemmEpi<'_>,
) {
    let gm = Gemm {
        m: mg,
        n: nc,
        k: kdim,
        a_rs: kdim as isize,
        a_cs: 1,
        b_rs: nc as isize,
        b_cs: 1,
        ldc,
        alpha: 1.0,
        beta,
    };
    let pays = crate::simd::panels_pay(mg, nc);
    if let (Some(x), Some(w), Some(c), true) =
        (T::as_f32(xg), T::as_f32(wg), T::as_f32_mut(c), pays)
    {
        let (_, nr) = crate::simd::gemm_tile();
        let mut bp = crate::simd::scratch::<f32>(kdim * nc.div_ceil(nr) * nr);
        im2col_panels(x, g, p0, nc, kdim, nr, &mut bp);
        let b = Operand::Panels {
            data: &bp,
            panel: nr,
        };
        cx.cpu
            .sgemm_ops_epi(&gm, weights_operand(w, wpg, gm.m), b, c, gepi);
        return;
    }
    // a few rows or a narrow C (a strided 1-D convolution with a few output positions): the
    // SGEMM's strided paths (unpacked rows, the transposed narrow product) win; f32 callers
    // pass no patch buffer, so take one here
    let mut own = crate::simd::scratch::<T>(if col.len() < kdim * nc { kdim * nc } else { 0 });
    let col = if col.len() < kdim * nc {
        &mut own[..]
    } else {
        &mut col[..kdim * nc]
    };
    let windows = match (T::as_f32(xg), T::as_f32_mut(col)) {
        (Some(x), Some(col)) => im2col_windows(x, g, p0, nc, col),
        _ => false,
    };
    if !windows {
        im2col(cx.cpu, xg, g, p0, nc, col, T::ZERO);
    }
    let (_, nr) = crate::simd::gemm_tile();
    if let (Some(w), Some(wp), Some(b), Some(c), true) = (
        T::as_f32(wg),
        wpg,
        T::as_f32(col),
        T::as_f32_mut(c),
        (2..=nr / 2).contains(&nc),
    ) {
        // a narrow C from weights packed at load: the SGEMM's narrow product streams them as
        // they are (a few rows, or one column, keep the strided paths below)
        return cx.cpu.sgemm_ops_epi(
            &gm,
            weights_operand(w, Some(wp), mg),
            Operand::Strided(b),
            c,
            gepi,
        );
    }
    T::gemm(cx, &gm, wg, col, c);
    gemm_epi_after(&gm, c, gepi);
}

/// Group `gi`'s rows of convolution weights packed by [`pack_conv_weights`] (`mg` rows of
/// `kdim` per group, each group starting on a panel of its own).
fn packed_group(wp: Option<&[f32]>, gi: usize, mg: usize, kdim: usize) -> Option<&[f32]> {
    let mr = crate::simd::gemm_mr_for(mg);
    wp.map(|p| &p[gi * mg.div_ceil(mr) * mr * kdim..])
}

/// The A operand of a group's product: its packed panels when there are some, else W's rows.
fn weights_operand<'a>(w: &'a [f32], wpg: Option<&'a [f32]>, mg: usize) -> Operand<'a> {
    match wpg {
        Some(data) => Operand::Panels {
            data,
            panel: crate::simd::gemm_mr_for(mg),
        },
        None => Operand::Strided(w),
    }
}

/// A 1x1 convolution's product `C = W_g · X_g (+ beta C)` (B strided), from packed weights
/// when f32 has them.
fn pointwise_gemm<T: Num>(
    cx: &KernelCx<'_>,
    gm: &Gemm,
    (wg, wpg): (&[T], Option<&[f32]>),
    b: &[T],
    c: &mut [T],
    gepi: GemmEpi<'_>,
) {
    let wpg = wpg.filter(|_| crate::simd::panels_pay(gm.m, gm.n));
    if let (Some(b), Some(c)) = (T::as_f32(b), T::as_f32_mut(c)) {
        let a = match (wpg, T::as_f32(wg)) {
            (Some(wpg), _) => weights_operand(&[], Some(wpg), gm.m),
            (None, Some(w)) => Operand::Strided(w),
            // (f32 weights are f32)
            (None, None) => return,
        };
        return cx.cpu.sgemm_ops_epi(gm, a, Operand::Strided(b), c, gepi);
    }
    T::gemm(cx, gm, wg, b, c);
    gemm_epi_after(gm, c, gepi);
}

/// Output positions per im2col tile: about `COL_BUDGET` patch values, a whole number of the
/// SGEMM's panel widths when there is room for one.
fn patch_tile(kdim: usize, out_plane: usize) -> usize {
    let (_, nr) = crate::simd::gemm_tile();
    let t = (COL_BUDGET / kdim.max(1)).max(1);
    let t = if t > nr { t / nr * nr } else { t };
    t.clamp(1, out_plane.max(1))
}

/// Adds `col` (`m_cnt*prod(k)` rows of `ncols`, for input positions `p0..p0+ncols`) into the
/// output planes `y` (`m_cnt` planes of `prod(g.out)`) of a transposed convolution.
fn col2im<T: Num>(cpu: &dyn CpuBackend, col: &[T], g: &Geom, p0: usize, ncols: usize, y: &mut [T]) {
    let nd = g.nd();
    let last = nd - 1;
    let kk: usize = g.k.iter().product();
    let plane: usize = g.out.iter().product();
    let ost = strides_of(&g.out);
    let runs = runs_of(&g.inp, p0, ncols);
    let w = g.out[last];
    let (sl, dl, pl) = (g.s[last], g.d[last] as isize, g.pb[last]);
    par_chunks_mut(cpu, y, plane, kk, &|m, yp| {
        let mut ko = [0usize; MAX_SPATIAL];
        for kr in 0..kk {
            let r = m * kk + kr;
            let row = &col[r * ncols..(r + 1) * ncols];
            decode(kr, &g.k, &mut ko);
            let off = ko[last] as isize * dl - pl;
            for (si, &(x0, x1, at)) in runs.runs.iter().enumerate() {
                let mut base = 0;
                let mut inside = true;
                for j in 0..last {
                    let i = runs.pre[si * last + j];
                    let o = (i * g.s[j]) as isize + (ko[j] * g.d[j]) as isize - g.pb[j];
                    if o < 0 || o >= g.out[j] as isize {
                        inside = false;
                        break;
                    }
                    base += o as usize * ost[j];
                }
                if !inside {
                    continue;
                }
                let (lo, hi) = valid_range(x0, x1, sl, off, w);
                if lo == hi {
                    continue;
                }
                let src = &row[at + lo - x0..at + hi - x0];
                let ys = &mut yp[base..base + w];
                let start = ((lo * sl) as isize + off) as usize;
                if sl == 1 {
                    for (yv, &cv) in ys[start..start + (hi - lo)].iter_mut().zip(src) {
                        *yv = yv.add(cv);
                    }
                } else {
                    for (yv, &cv) in ys[start..].iter_mut().step_by(sl).zip(src) {
                        *yv = yv.add(cv);
                    }
                }
            }
        }
    });
}

/// [`col2im`] for a 2-D transposed convolution whose kernel equals its stride (no padding,
/// no dilation, output = input x stride): output pixel (i*sh + ki, j*sw + kj) of channel m
/// is `bias[m] + col[(m, ki, kj), (i, j)]`, one tap each, so the tile's columns (input
/// positions `p0..p0 + ncols`) are stored, not added, and the bias goes with them.
fn taps_to_pixels<T: Num>(
    cpu: &dyn CpuBackend,
    col: &[T],
    g: &Geom,
    p0: usize,
    ncols: usize,
    bias: Option<&[T]>,
    y: &mut [T],
) {
    let ((sh, sw), iw, ow) = ((g.s[0], g.s[1]), g.inp[1], g.out[1]);
    let kk = sh * sw;
    let plane = g.out[0] * ow;
    par_chunks_mut(cpu, y, plane, kk, &|m, yp| {
        let b = bias.map_or(T::ZERO, |b| b[m]);
        let mut p = p0;
        while p < p0 + ncols {
            // one input row's run of the tile: row i, columns j0..j1
            let (i, j0) = (p / iw, p % iw);
            let j1 = iw.min(j0 + p0 + ncols - p);
            let at = p - p0;
            for ki in 0..sh {
                let out = &mut yp[(i * sh + ki) * ow + j0 * sw..(i * sh + ki) * ow + j1 * sw];
                let tap = |kj: usize| {
                    let r = m * kk + ki * sw + kj;
                    &col[r * ncols + at..r * ncols + at + (j1 - j0)]
                };
                if sw == 2 {
                    let (c0, c1) = (tap(0), tap(1));
                    for ((o, &a), &c) in out.chunks_exact_mut(2).zip(c0).zip(c1) {
                        o[0] = a.add(b);
                        o[1] = c.add(b);
                    }
                } else {
                    for kj in 0..sw {
                        for (o, &v) in out[kj..].iter_mut().step_by(sw).zip(tap(kj)) {
                            *o = v.add(b);
                        }
                    }
                }
            }
            p += j1 - j0;
        }
    });
}

// ----------------------------------------------------------------------------- Conv

/// Shapes and geometry of one convolution call.
struct ConvShape {
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    g: Geom,
}

/// Output elements of one strip of a depthwise plane (its accumulator and padded input stay
/// in the L1 cache between the copy, the taps and the epilogue).
const DW_STRIP: usize = 2048;

/// The columns of one stride phase of a zero-padded row of `width` phase columns: column
/// `p` holds input column `p * s + r - pad`. Returns `(lo, hi, j0)`: columns `lo..hi` come
/// from the input, from column `j0` on in steps of `s`; the rest are padding.
fn phase_cols(len: usize, pad: isize, s: usize, r: usize, width: usize) -> (usize, usize, usize) {
    let (len, r) = (len as isize, r as isize);
    let lo = ((pad - r).max(0) as usize).div_ceil(s).min(width);
    let hi = ((len + pad - r).max(0) as usize)
        .div_ceil(s)
        .clamp(lo, width);
    let j0 = (lo as isize * s as isize + r - pad).max(0) as usize;
    (lo, hi, j0)
}

/// Writes a zero-padded row: `dst[p] = src[p - pad]`, zero where that is outside `src`.
#[inline]
fn fill_padded_row<T: Num>(dst: &mut [T], src: &[T], pad: isize) {
    let (lo, hi, j0) = phase_cols(src.len(), pad, 1, 0, dst.len());
    dst[..lo].fill(T::ZERO);
    dst[lo..hi].copy_from_slice(&src[j0..j0 + hi - lo]);
    dst[hi..].fill(T::ZERO);
}

/// Writes the `s` stride phases of one zero-padded input row: phase `r` (the `width` values
/// at `out[base + r * pitch..]`, `pitch >= width`) holds padded columns `p * s + r`, i.e.
/// `src[p * s + r - pad]`, zero outside `src`. `tmp` is scratch of at least `width * s`
/// values: the padded row is laid out there first, then split (a pass the compiler vectorises).
#[allow(clippy::too_many_arguments)]
fn fill_phase_rows<T: Num>(
    out: &mut [T],
    base: usize,
    pitch: usize,
    width: usize,
    src: &[T],
    pad: isize,
    s: usize,
    tmp: &mut [T],
) {
    if s == 1 {
        return fill_padded_row(&mut out[base..base + width], src, pad);
    }
    if s == 2 {
        let (a, b) = out[base..].split_at_mut(pitch);
        let (d0, d1) = (&mut a[..width], &mut b[..width]);
        if let (Some(x), Some(e), Some(o)) = (T::as_f32(src), T::as_f32_mut(d0), T::as_f32_mut(d1))
        {
            // f32: both phases straight from the row, no padded copy in between
            return crate::simd::phases2(x, pad, e, o);
        }
    }
    let tmp = &mut tmp[..width * s];
    fill_padded_row(tmp, src, pad);
    if s == 2 {
        let (a, b) = out[base..].split_at_mut(pitch);
        let (d0, d1) = (&mut a[..width], &mut b[..width]);
        for ((x, y), p) in d0.iter_mut().zip(d1.iter_mut()).zip(tmp.chunks_exact(2)) {
            *x = p[0];
            *y = p[1];
        }
    } else {
        for r in 0..s {
            let d = &mut out[base + r * pitch..base + r * pitch + width];
            for (x, p) in d.iter_mut().zip(tmp.chunks_exact(s)) {
                *x = p[r];
            }
        }
    }
}

/// A depthwise convolution's geometry on 2-D planes (1-D as 2-D with a unit leading axis).
#[derive(Clone, Copy)]
struct Dw2d {
    ih: usize,
    iw: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    ph: isize,
    pw: isize,
}

impl Dw2d {
    fn of(g: &Geom) -> Dw2d {
        let two = |v: &[usize], one: usize| {
            if v.len() == 1 {
                (one, v[0])
            } else {
                (v[0], v[1])
            }
        };
        let (ih, iw) = two(&g.inp, 1);
        let (oh, ow) = two(&g.out, 1);
        let (kh, kw) = two(&g.k, 1);
        let (sh, sw) = two(&g.s, 1);
        let (dh, dw) = two(&g.d, 1);
        let (ph, pw) = if g.pb.len() == 1 {
            (0, g.pb[0])
        } else {
            (g.pb[0], g.pb[1])
        };
        Dw2d {
            ih,
            iw,
            oh,
            ow,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            ph,
            pw,
        }
    }
}

/// Output rows narrower than this take the channel-blocked depthwise kernel
/// ([`conv_depthwise_blocked`]); wider ones vectorise along the row ([`conv_depthwise`]),
/// unless [`dw_blocked_pays`] says otherwise.
const DW_BLOCKED_MAX_OW: usize = 20;

/// Whether a depthwise convolution takes the channel-blocked kernel: rows narrower than
/// [`DW_BLOCKED_MAX_OW`] always; rows up to 96 wide (a few vectors, where the row kernel's
/// partial vectors waste much of each) while one block's interleaved input, phases and output
/// stay within about 1 MiB (a core's L2 on current x86), since the blocked kernel works on a
/// whole plane per block. Measured (1 thread, AVX-512): 192x30x40 5x5 0.60 -> 0.25 ms,
/// 96x60x80 3x3 0.37 -> 0.33; 48x120x160 3x3 stays on rows (0.55 against 0.93 blocked).
fn dw_blocked_pays(geo: &Dw2d) -> bool {
    if geo.ow < DW_BLOCKED_MAX_OW {
        return true;
    }
    let (qh, qw) = (
        (geo.kh - 1) * geo.dh / geo.sh,
        (geo.kw - 1) * geo.dw / geo.sw,
    );
    let phases = geo.sh * geo.sw * (geo.oh + qh) * (geo.ow + qw);
    let floats = (geo.ih * geo.iw + phases + geo.oh * geo.ow) * crate::simd::DW_BLOCK;
    geo.ow <= 96 && floats <= 256 * 1024
}

/// Depthwise convolution of f32 planes with the channels vectorised: each block of
/// [`simd::DW_BLOCK`] channels of an image is copied once, zero-padded and split into the
/// stride's phases, into a channel-interleaved buffer ([phase][row][column][channel]); every
/// tap then reads a whole vector of channels at a constant offset and multiplies it by a
/// vector of the channels' weights (`simd::dw_rows`). The result is scattered back to the
/// channels' planes, where the epilogue runs. For small planes, where a row is too short to
/// fill vectors along it.
#[allow(clippy::too_many_arguments)]
fn conv_depthwise_blocked<T: Num>(
    cpu: &dyn CpuBackend,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    c: usize,
    geo: Dw2d,
    y: &mut [T],
    epi: ConvEpilogue<'_, T>,
) {
    const B: usize = crate::simd::DW_BLOCK;
    let Dw2d {
        ih,
        iw,
        oh,
        ow,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        ph,
        pw,
    } = geo;
    let (taps, in_plane, plane) = (kh * kw, ih * iw, oh * ow);
    if plane == 0 || c == 0 {
        return;
    }
    let images = y.len() / (c * plane);
    let blocks = c.div_ceil(B);
    let (qh_max, qw_max) = ((kh - 1) * dh / sh, (kw - 1) * dw / sw);
    let (hp, wp) = (oh + qh_max, ow + qw_max);
    let phase_len = hp * wp * B;
    // tap (ki, kj): phase (ki*dh % sh, kj*dw % sw), rows and columns on by ki*dh / sh, kj*dw / sw
    let offs: Vec<usize> = (0..taps)
        .map(|t| {
            let (ki, kj) = (t / kw, t % kw);
            let (rh, qh) = ((ki * dh) % sh, (ki * dh) / sh);
            let (rw, qw) = ((kj * dw) % sw, (kj * dw) / sw);
            (rh * sw + rw) * phase_len + (qh * wp + qw) * B
        })
        .collect();
    // the weights and biases in blocks: [block][tap][channel], zero past the last channel
    // (in a pooled scratch buffer: nothing allocated per run)
    let mut wbb = crate::simd::scratch::<f32>(blocks * taps * B + blocks * B);
    wbb.fill(0.0);
    let (wb, bb) = wbb.split_at_mut(blocks * taps * B);
    for ch in 0..c {
        let (blk, lane) = (ch / B, ch % B);
        for t in 0..taps {
            wb[(blk * taps + t) * B + lane] = w[ch * taps + t];
        }
        bb[blk * B + lane] = bias.map_or(0.0, |b| b[ch]);
    }
    let yp = SyncPtr(y.as_mut_ptr());
    let ylen = y.len();
    let npos = sh * sw * hp * wp;
    let work = images * blocks * plane * B * (taps + 2);
    cpu.parallel_for_work(images * blocks, work, &|task| {
        let (ni, blk) = (task / blocks, task % blocks);
        let (c0, cn) = (blk * B, B.min(c - blk * B));
        let mut buf = crate::simd::scratch::<f32>(in_plane * B + npos * B + plane * B);
        let (xt, rest) = buf.split_at_mut(in_plane * B);
        let (src, out) = rest.split_at_mut(npos * B);
        // the block's planes interleaved ([position][channel]; channels past cn are zero) ...
        if cn < B {
            xt.fill(0.0);
        }
        let xb = &x[(ni * c + c0) * in_plane..(ni * c + c0 + cn) * in_plane];
        crate::simd::transpose_matrix(xb, in_plane, cn, in_plane, xt, B);
        // ... then each position's channels copied to its place in the zero-padded phases
        // ([phase][row][column][channel]); padding written as zeros
        for rh in 0..sh {
            for q in 0..hp {
                let i = (q * sh + rh) as isize - ph;
                for rw in 0..sw {
                    let row = &mut src[((rh * sw + rw) * hp + q) * wp * B..][..wp * B];
                    if i < 0 || i as usize >= ih {
                        row.fill(0.0);
                        continue;
                    }
                    // phase columns lo..hi hold input columns j0, j0 + sw, ...
                    let (lo, hi, j0) = phase_cols(iw, pw, sw, rw, wp);
                    row[..lo * B].fill(0.0);
                    row[hi * B..].fill(0.0);
                    let from = (i as usize * iw + j0) * B;
                    if sw == 1 {
                        row[lo * B..hi * B].copy_from_slice(&xt[from..from + (hi - lo) * B]);
                    } else {
                        let dsts = row[lo * B..hi * B].chunks_exact_mut(B);
                        for (d, s) in dsts.zip(xt[from..].chunks(sw * B)) {
                            d.copy_from_slice(&s[..B]);
                        }
                    }
                }
            }
        }
        let wt = &wb[blk * taps * B..(blk + 1) * taps * B];
        let bt = &bb[blk * B..(blk + 1) * B];
        crate::simd::dw_rows(wt, bt, &offs, src, wp * B, ow * B, out);
        // back to the channels' planes, then the epilogue on each (still in cache)
        let o = (ni * c + c0) * plane;
        debug_assert!(o + cn * plane <= ylen);
        // SAFETY: task (ni, blk) alone writes the planes of its image's channels
        // c0..c0 + cn, which lie inside `y`, borrowed until `parallel_for_work` returns.
        let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(o), cn * plane) };
        let d32 = T::as_f32_mut(dst).expect("the blocked depthwise kernel is f32");
        crate::simd::transpose_matrix(out, B, plane, cn, d32, plane);
        if let Some(z) = epi.z {
            dst.iter_mut()
                .zip(&z[o..o + cn * plane])
                .for_each(|(v, &zv)| *v = v.add(zv));
        }
        if let Some(act) = epi.act {
            act(dst);
        }
    });
}

/// Direct depthwise convolution (one filter per channel) over 1-D/2-D planes, a strip of
/// output rows at a time: the strip's input rows are copied zero-padded and split into the
/// stride's phases (so every tap reads at a constant offset), the taps accumulate in registers,
/// and the rows are stored with the epilogue while they are in cache.
#[allow(clippy::too_many_arguments)]
fn conv_depthwise<T: Num>(
    cpu: &dyn CpuBackend,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    c: usize,
    g: &Geom,
    y: &mut [T],
    epi: ConvEpilogue<'_, T>,
) {
    let Dw2d {
        ih,
        iw,
        oh,
        ow,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        ph,
        pw,
    } = Dw2d::of(g);
    if oh == 0 || ow == 0 {
        return;
    }
    // Tap (ki, kj) reads padded input (oi*sh + ki*dh, oj*sw + kj*dw) = stride phase
    // (ki*dh % sh, kj*dw % sw) at phase position (oi + ki*dh / sh, oj + kj*dw / sw).
    let (qh_max, qw_max) = ((kh - 1) * dh / sh, (kw - 1) * dw / sw);
    let wp = ow + qw_max;
    let rows = (DW_STRIP / wp).clamp(1, oh);
    let hs = rows + qh_max;
    let phase_len = hs * wp;
    let offs: Vec<usize> = (0..kh * kw)
        .map(|t| {
            let (ki, kj) = (t / kw, t % kw);
            let (rh, qh) = ((ki * dh) % sh, (ki * dh) / sh);
            let (rw, qw) = ((kj * dw) % sw, (kj * dw) / sw);
            (rh * sw + rw) * phase_len + qh * wp + qw
        })
        .collect();
    // positions are computed in whole vectors (up to 16 lanes): the padded tail is read from
    // the slack after the phases and dropped
    const SLACK: usize = 16;
    let plane = oh * ow;
    let planes = y.len() / plane;
    // several planes per task, so that each task takes its buffers from the pool once
    let per = planes.div_ceil(4 * cpu.threads().max(1)).max(1);
    par_chunks_mut(cpu, y, per * plane, kh * kw + 2, &|ti, outs| {
        let mut phases = crate::simd::scratch::<T>(sh * sw * phase_len + SLACK);
        // the strip buffer only narrow rows use (wide ones are computed in place)
        let acc_len = if ow >= SLACK {
            0
        } else {
            (rows * wp).next_multiple_of(SLACK)
        };
        let mut acc = crate::simd::scratch::<T>(acc_len);
        let mut tmp = crate::simd::scratch::<T>(wp * sw);
        phases[sh * sw * phase_len..].fill(T::ZERO);
        for (k, out) in outs.chunks_exact_mut(plane).enumerate() {
            let pi = ti * per + k;
            let ch = pi % c;
            let xp = &x[pi * ih * iw..(pi + 1) * ih * iw];
            let wk = &w[ch * kh * kw..(ch + 1) * kh * kw];
            let bias_v = bias.map_or(T::ZERO, |b| b[ch]);
            let mut r0 = 0;
            while r0 < oh {
                let nr = rows.min(oh - r0);
                for rh in 0..sh {
                    for q in 0..nr + qh_max {
                        // phase row q of the strip: padded row (r0 + q) * sh + rh
                        let i = ((r0 + q) * sh + rh) as isize - ph;
                        let o = rh * sw * phase_len + q * wp;
                        if i >= 0 && (i as usize) < ih {
                            let row = &xp[i as usize * iw..(i as usize + 1) * iw];
                            fill_phase_rows(&mut phases, o, phase_len, wp, row, pw, sw, &mut tmp);
                        } else {
                            for rw in 0..sw {
                                phases[o + rw * phase_len..][..wp].fill(T::ZERO);
                            }
                        }
                    }
                }
                let strip = &mut out[r0 * ow..(r0 + nr) * ow];
                if ow >= SLACK {
                    // T::taps accumulates all taps in registers (SIMD for f32), each output
                    // row straight from its phase rows
                    for (r, orow) in strip.chunks_exact_mut(ow).enumerate() {
                        T::taps(wk, &offs, &phases[r * wp..], bias_v, orow);
                    }
                } else {
                    // narrow rows: the whole strip at once into a buffer, then the rows
                    let span = ((nr - 1) * wp + ow).next_multiple_of(SLACK);
                    T::taps(wk, &offs, &phases, bias_v, &mut acc[..span]);
                    for (orow, arow) in strip.chunks_exact_mut(ow).zip(acc.chunks(wp)) {
                        orow.copy_from_slice(&arow[..ow]);
                    }
                }
                if let Some(z) = epi.z {
                    let zp = &z[pi * plane + r0 * ow..pi * plane + (r0 + nr) * ow];
                    strip.iter_mut().zip(zp).for_each(|(o, &v)| *o = o.add(v));
                }
                if let Some(act) = epi.act {
                    act(strip);
                }
                r0 += nr;
            }
        }
    });
}

/// Depthwise convolution of f32 planes with horizontal stride 1, read straight from the
/// input (`simd::dw_plane_rows`: no padded copy of the plane; the taps of padding rows are
/// left out and the few columns at the edges summed over the taps inside the row). The
/// activation runs in registers unless a residual `Z` comes first; then each strip of rows
/// takes `Z` and the activation while it is in cache.
#[allow(clippy::too_many_arguments)]
fn conv_depthwise_direct<T: Num>(
    cpu: &dyn CpuBackend,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    c: usize,
    geo: Dw2d,
    y: &mut [T],
    epi: ConvEpilogue<'_, T>,
) {
    let Dw2d {
        ih,
        iw,
        oh,
        ow,
        kh,
        kw,
        sh,
        dh,
        dw,
        ph,
        pw,
        ..
    } = geo;
    let plane = oh * ow;
    if plane == 0 || c == 0 {
        return;
    }
    let g = simd::DwPlane {
        ih,
        iw,
        oh,
        ow,
        kh,
        kw,
        sh,
        dh,
        dw,
        ph,
        pw,
    };
    // in registers when nothing comes between the sums and the activation
    let (in_regs, after) = match (epi.z, epi.simd_act.and_then(simd::Clamp::of)) {
        (None, Some(c)) => (Some(c), None),
        _ => (None, epi.act),
    };
    let rows = (DW_STRIP / ow).clamp(1, oh);
    let planes = y.len() / plane;
    let per = planes.div_ceil(4 * cpu.threads().max(1)).max(1);
    par_chunks_mut(cpu, y, per * plane, kh * kw + 2, &|ti, outs| {
        for (k, out) in outs.chunks_exact_mut(plane).enumerate() {
            let pi = ti * per + k;
            let ch = pi % c;
            let xp = &x[pi * ih * iw..(pi + 1) * ih * iw];
            let wk = &w[ch * kh * kw..(ch + 1) * kh * kw];
            let b = bias.map_or(0.0, |b| b[ch]);
            if epi.z.is_none() && after.is_none() {
                let out32 = T::as_f32_mut(out).expect("an f32 output for f32 inputs");
                simd::dw_plane_rows(&g, xp, wk, b, in_regs, 0, out32);
                continue;
            }
            for (si, strip) in out.chunks_mut(rows * ow).enumerate() {
                let s32 = T::as_f32_mut(strip).expect("an f32 output for f32 inputs");
                simd::dw_plane_rows(&g, xp, wk, b, in_regs, si * rows, s32);
                if let Some(z) = epi.z {
                    let zp = &z[pi * plane + si * rows * ow..][..strip.len()];
                    strip.iter_mut().zip(zp).for_each(|(o, &v)| *o = o.add(v));
                }
                if let Some(act) = after {
                    act(strip);
                }
            }
        }
    });
}

/// An in-place epilogue over a run of outputs.
pub(crate) type TileFn<'a, T> = &'a (dyn Fn(&mut [T]) + Sync);

/// What a fused convolution does to its result before storing it: add `z` (a tensor of the
/// output's shape) and then apply `act` to each tile while it is in cache.
#[derive(Clone, Copy)]
pub(crate) struct ConvEpilogue<'a, T> {
    pub z: Option<&'a [T]>,
    pub act: Option<TileFn<'a, T>>,
    /// What `act` computes, as the SIMD layer's activation, where it is one (kernels that
    /// apply it in registers take this instead of calling `act` on their outputs).
    pub simd_act: Option<simd::Act>,
}

impl<T: 'static> ConvEpilogue<'static, T> {
    const NONE: ConvEpilogue<'static, T> = ConvEpilogue {
        z: None,
        act: None,
        simd_act: None,
    };
}

/// What an f32 convolution's SGEMM applies as it stores each tile of C ([`GemmEpi`]): the
/// bias, and a Relu or Clip when no residual `+ Z` comes between the product and it. Other
/// element types fill C with the bias before the product and pass over each tile after it.
#[derive(Clone, Copy)]
struct ConvFusion<'a> {
    bias: Option<&'a [f32]>,
    clamp: Option<simd::Clamp>,
}

impl<'a> ConvFusion<'a> {
    fn of<T: Num>(bias: Option<&'a [T]>, epi: &ConvEpilogue<'_, T>) -> ConvFusion<'a> {
        if T::as_f32(&[]).is_none() {
            return ConvFusion {
                bias: None,
                clamp: None,
            };
        }
        ConvFusion {
            bias: bias.and_then(T::as_f32),
            clamp: epi
                .simd_act
                .filter(|_| epi.z.is_none())
                .and_then(simd::Clamp::of),
        }
    }

    /// The SGEMM's epilogue for group `gi` (its `mg` rows of C).
    fn gemm(&self, gi: usize, mg: usize) -> GemmEpi<'a> {
        GemmEpi {
            bias: self.bias.map(|b| &b[gi * mg..]),
            clamp: self.clamp,
        }
    }

    /// Whether the bias is left to a fill of C before the product (then `beta = 1`).
    fn fills_bias<T>(&self, bias: Option<&[T]>) -> bool {
        bias.is_some() && self.bias.is_none()
    }

    /// The activation left to a pass over each tile after the product, if any.
    fn act_after<'e, T>(&self, epi: &ConvEpilogue<'e, T>) -> Option<TileFn<'e, T>> {
        epi.act.filter(|_| self.clamp.is_none())
    }
}

/// Applies a [`GemmEpi`] to C after a product that did not take it (a generic GEMM; only f32
/// products are given a non-empty one).
fn gemm_epi_after<T: Num>(gm: &Gemm, c: &mut [T], gepi: GemmEpi<'_>) {
    if let Some(c) = T::as_f32_mut(c) {
        gepi.apply(gm.m, gm.n, gm.ldc, c);
    } else {
        debug_assert!(gepi.is_none(), "an epilogue for a non-f32 product");
    }
}

/// Convolution of `x` ([N, C, inp..]) with `w` ([M, C/group, k..]; `wp`: the same packed by
/// [`pack_conv_weights`], when it was) plus optional bias, into `y` ([N, M, out..]; every
/// element is written), then the epilogue.
#[allow(clippy::too_many_arguments)]
fn conv_compute_into<T: Num>(
    cx: &KernelCx<'_>,
    x: &[T],
    w: &[T],
    wp: Option<&[f32]>,
    bias: Option<&[T]>,
    cs: &ConvShape,
    y: &mut [T],
    epi: ConvEpilogue<'_, T>,
) {
    let simplified = cs.g.simplified();
    let g = &simplified;
    let (n, c, m, group) = (cs.n, cs.c, cs.m, cs.group);
    let (cg, mg) = (c / group, m / group);
    let kk: usize = g.k.iter().product();
    let kdim = cg * kk;
    let in_plane: usize = g.inp.iter().product();
    let out_plane: usize = g.out.iter().product();
    debug_assert_eq!(y.len(), n * m * out_plane);
    if y.is_empty() {
        return;
    }
    if group == c && m == c && g.nd() <= 2 {
        let geo = Dw2d::of(g);
        if let (Some(x32), Some(w32), true) = (T::as_f32(x), T::as_f32(w), dw_blocked_pays(&geo)) {
            let b32 = bias.and_then(T::as_f32);
            conv_depthwise_blocked(cx.cpu, x32, w32, b32, c, geo, y, epi);
        } else if let (Some(x32), Some(w32), true) =
            (T::as_f32(x), T::as_f32(w), dw_direct_takes(&geo))
        {
            let b32 = bias.and_then(T::as_f32);
            conv_depthwise_direct(cx.cpu, x32, w32, b32, c, geo, y, epi);
        } else {
            conv_depthwise(cx.cpu, x, w, bias, c, g, y, epi);
        }
        return;
    }
    if kdim > 0 && implicit_fits::<T>(g, kk) {
        conv_implicit(cx, x, (w, wp), bias, g, (n, c, m, group), y, epi);
        return;
    }
    let par = cx.cpu.threads() > 1 && kdim > 0 && n * m * out_plane * kdim >= PAR_CONV_MIN_MACS;
    let fusion = ConvFusion::of(bias, &epi);
    let fill_bias = fusion.fills_bias(bias);
    let act_after = fusion.act_after(&epi);
    // the bias of one tile (mg rows of nc positions from p0 of one image and group), written
    // just before the products add to it, while it is in cache (where the SGEMM does not add it)
    let tile_bias = |yg: &mut [T], gi: usize, p0: usize, nc: usize| {
        if let (Some(b), true) = (bias, fill_bias) {
            for r in 0..mg {
                yg[r * out_plane + p0..r * out_plane + p0 + nc].fill(b[gi * mg + r]);
            }
        }
    };
    // The epilogue of one tile (mg rows of nc positions from p0 of one image and group), while
    // it is in cache: `+ Z` (after the bias and the products, as the unfused Add would), then
    // `act` (the activation the SGEMM did not apply).
    let tile_epi =
        |yg: &mut [T], zg: Option<&[T]>, p0: usize, nc: usize, act: Option<TileFn<'_, T>>| {
            for r in 0..mg {
                let row = &mut yg[r * out_plane + p0..r * out_plane + p0 + nc];
                if let Some(zg) = zg {
                    let zr = &zg[r * out_plane + p0..r * out_plane + p0 + nc];
                    row.iter_mut().zip(zr).for_each(|(v, &z)| *v = v.add(z));
                }
                if let Some(act) = act {
                    act(row);
                }
            }
        };
    if kdim == 0 {
        // no products: the bias or zero
        match bias {
            Some(b) => {
                for (pi, plane) in y.chunks_mut(out_plane).enumerate() {
                    plane.fill(b[pi % m]);
                }
            }
            None => y.fill(T::ZERO),
        }
        // (no SGEMM ran: the whole activation here)
        for ni in 0..n {
            for gi in 0..group {
                let o = (ni * m + gi * mg) * out_plane;
                let zg = epi.z.map(|z| &z[o..o + mg * out_plane]);
                tile_epi(&mut y[o..o + mg * out_plane], zg, 0, out_plane, epi.act);
            }
        }
        return;
    }
    let has_epi = epi.z.is_some() || act_after.is_some();
    let beta = if fill_bias { 1.0 } else { 0.0 };
    let pointwise =
        kk == 1 && g.s.iter().all(|&s| s == 1) && g.pb.iter().all(|&p| p == 0) && g.out == g.inp;
    if par {
        let sh = TileShape {
            n,
            c,
            m,
            group,
            kdim,
            in_plane,
            out_plane,
            pointwise,
        };
        conv_tiles_parallel(cx, x, (w, wp), bias, g, &sh, y, epi);
        return;
    }
    let tile = patch_tile(kdim, out_plane);
    // the tile comes from the scratch pool (im2col writes every element it reads); f32 packs
    // its patches straight into the SGEMM's panels instead
    let direct = T::as_f32(&[]).is_some();
    let mut col = crate::simd::scratch::<T>(if pointwise || direct { 0 } else { kdim * tile });
    for ni in 0..n {
        for gi in 0..group {
            let xg = &x[(ni * c + gi * cg) * in_plane..(ni * c + (gi + 1) * cg) * in_plane];
            let wg = &w[gi * mg * kdim..(gi + 1) * mg * kdim];
            let wpg = packed_group(wp, gi, mg, kdim);
            let yo = (ni * m + gi * mg) * out_plane;
            let yg = &mut y[yo..yo + mg * out_plane];
            let zg = epi.z.map(|z| &z[yo..yo + mg * out_plane]);
            if pointwise {
                // X is already the [C/group, positions] matrix; tile the positions (tiles of
                // C that stay in cache between the bias, the product and the epilogue)
                let pt = (COL_BUDGET / 2 / cg.max(mg)).max(64).clamp(1, out_plane);
                let mut p0 = 0;
                while p0 < out_plane {
                    let nc = pt.min(out_plane - p0);
                    tile_bias(yg, gi, p0, nc);
                    let gm = Gemm {
                        m: mg,
                        n: nc,
                        k: cg,
                        a_rs: kdim as isize,
                        a_cs: 1,
                        b_rs: in_plane as isize,
                        b_cs: 1,
                        ldc: out_plane,
                        alpha: 1.0,
                        beta,
                    };
                    let (w, gepi) = ((wg, wpg), fusion.gemm(gi, mg));
                    pointwise_gemm(cx, &gm, w, &xg[p0..], &mut yg[p0..], gepi);
                    if has_epi {
                        tile_epi(yg, zg, p0, nc, act_after);
                    }
                    p0 += nc;
                }
                continue;
            }
            let mut p0 = 0;
            while p0 < out_plane {
                let nc = tile.min(out_plane - p0);
                tile_bias(yg, gi, p0, nc);
                conv_tile_product(
                    cx,
                    xg,
                    (wg, wpg),
                    g,
                    (p0, nc),
                    (mg, kdim),
                    &mut col,
                    &mut yg[p0..],
                    (out_plane, beta),
                    fusion.gemm(gi, mg),
                );
                if has_epi {
                    tile_epi(yg, zg, p0, nc, act_after);
                }
                p0 += nc;
            }
        }
    }
}

/// Whether [`conv_implicit`] takes a convolution: f32, no negative padding, a kernel wider
/// than one tap, and few enough wasted columns (each output row of the padded phase grid has
/// `(k - 1) * d / s` extra positions, computed and dropped).
fn implicit_fits<T: Num>(g: &Geom, kk: usize) -> bool {
    let last = g.nd() - 1;
    let extra = (g.k[last] - 1) * g.d[last] / g.s[last];
    // a strided one only where its windows overlap (else im2col copies each input once too)
    // and it has enough positions to fill panels (else im2col's narrow-product paths win:
    // silero's STFT as a 256-tap, stride-128 convolution with a handful of positions)
    let out_plane: usize = g.out.iter().product();
    let strided = g.s.iter().any(|&s| s > 1);
    T::as_f32(&[]).is_some()
        && kk > 1
        && g.pb.iter().all(|&p| p >= 0)
        && g.out.iter().all(|&o| o > 0)
        && 4 * extra <= g.out[last] + extra
        && (!strided || (out_plane >= 64 && g.s.iter().zip(&g.k).all(|(s, k)| s <= k)))
}

/// A convolution as an implicit GEMM (f32): each image group's input is copied once into a
/// zero-padded buffer split into the stride's phases (phase `r` of an axis holds padded
/// positions `p * s + r`), so that row `(c, kernel offset)` of the patch matrix is that buffer
/// from an offset on: the SGEMM reads B in place ([`Operand::Rows`]) and nothing is gathered
/// per tile. The products run over positions of the phase grid (each output row plus
/// `(k - 1) * d / s` positions that are dropped), in tiles shared across the threads, each
/// tile's rows stored with the epilogue applied.
#[allow(clippy::too_many_arguments)]
fn conv_implicit<T: Num>(
    cx: &KernelCx<'_>,
    x: &[T],
    (w, wp): (&[T], Option<&[f32]>),
    bias: Option<&[T]>,
    g: &Geom,
    (n, c, m, group): (usize, usize, usize, usize),
    y: &mut [T],
    epi: ConvEpilogue<'_, T>,
) {
    let nd = g.nd();
    let last = nd - 1;
    let (cg, mg) = (c / group, m / group);
    let kk: usize = g.k.iter().product();
    let kdim = cg * kk;
    let in_plane: usize = g.inp.iter().product();
    let out_plane: usize = g.out.iter().product();
    let (_, nr) = crate::simd::gemm_tile();
    let mr = crate::simd::gemm_mr_for(mg);
    // a phase plane (output extent + (k - 1) * d / s), its strides and positions; the stride's
    // phases of one channel, one after the other
    let pext: Vec<usize> = (0..nd)
        .map(|j| g.out[j] + (g.k[j] - 1) * g.d[j] / g.s[j])
        .collect();
    let pst = strides_of(&pext);
    let pplane: usize = pext.iter().product();
    let nph: usize = g.s.iter().product();
    let cplane = nph * pplane;
    let q_len = (0..nd).map(|j| (g.out[j] - 1) * pst[j]).sum::<usize>() + 1;
    let ost = strides_of(&g.out);
    let ist = strides_of(&g.inp);
    // row r = (channel, kernel offset) starts at this offset of the padded buffer: tap t on
    // an axis reads phase t % s at phase position (output position + t / s)
    let mut offs = vec![0usize; kdim];
    let mut ko = [0usize; MAX_SPATIAL];
    for t in 0..kk {
        decode(t, &g.k, &mut ko);
        let (mut phase, mut at) = (0, 0);
        for j in 0..nd {
            let t = ko[j] * g.d[j];
            phase = phase * g.s[j] + t % g.s[j];
            at += t / g.s[j] * pst[j];
        }
        offs[t] = phase * pplane + at;
    }
    for r in kk..kdim {
        offs[r] = offs[r % kk] + (r / kk) * cplane;
    }
    // tiles of the padded positions: whole panels, enough for the threads
    let threads = cx.cpu.threads();
    let mut tile = (COL_BUDGET / (2 * mg.max(1))).clamp(nr, 1024) / nr * nr;
    let want = 4 * threads;
    if threads > 1 && q_len.div_ceil(tile) < want {
        tile = q_len
            .div_ceil(want)
            .div_ceil(nr)
            .saturating_mul(nr)
            .max(2 * nr);
    }
    let tile = tile.min(q_len.div_ceil(nr) * nr);
    let tiles = q_len.div_ceil(tile);
    // conv_implicit is f32 only (implicit_fits): the bias and a bounded activation always go
    // to the SGEMM
    let fusion = ConvFusion::of(bias, &epi);
    let act_after = fusion.act_after(&epi);
    let mut xp = crate::simd::scratch::<T>(cg * cplane + nr);
    xp[cg * cplane..].fill(T::ZERO);
    let yp = SyncPtr(y.as_mut_ptr());
    let ylen = y.len();
    let prows = pplane / pext[last];
    // the rows of a channel's phase planes that hold an input row (the others are padding):
    // (offset in the phases, offset of the input row), the same for every channel; the last
    // axis's s_last phases are written together
    let s_last = g.s[last];
    let mut row_map = Vec::new();
    let (mut rs, mut co) = ([0usize; MAX_SPATIAL], [0usize; MAX_SPATIAL]);
    for ph_hi in 0..nph / s_last {
        decode(ph_hi, &g.s[..last], &mut rs);
        for pr in 0..prows {
            decode(pr, &pext[..last], &mut co);
            let mut src = Some(0);
            for j in 0..last {
                let i = (co[j] * g.s[j] + rs[j]) as isize - g.pb[j];
                src = src.filter(|_| i >= 0 && (i as usize) < g.inp[j]);
                src = src.map(|o| o + i.max(0) as usize * ist[j]);
            }
            if let Some(o) = src {
                row_map.push((ph_hi * s_last * pplane + pr * pext[last], o));
            }
        }
    }
    // the phase rows no input row lands in (all padding): zeroed, the others written whole
    let pw = pext[last];
    let mut written = vec![false; nph * prows];
    for &(dst, _) in &row_map {
        let first = dst / pplane * prows + dst % pplane / pw;
        for r in 0..s_last {
            written[first + r * prows] = true;
        }
    }
    let pad_rows: Vec<usize> = (0..nph * prows)
        .filter(|&i| !written[i])
        .map(|i| i / prows * pplane + i % prows * pw)
        .collect();
    let mut tmp = crate::simd::scratch::<T>(pext[last] * g.s[last]);
    for ng in 0..n * group {
        let (ni, gi) = (ng / group, ng % group);
        let xg = &x[(ni * c + gi * cg) * in_plane..(ni * c + (gi + 1) * cg) * in_plane];
        // the padded, phase-split copy of this image group: every value written once (the
        // padding rows zeroed, the input rows with their padding columns)
        let (lo, hi, j0) = phase_cols(g.inp[last], g.pb[last], 1, 0, pext[last]);
        for ci in 0..cg {
            for &o in &pad_rows {
                xp[ci * cplane + o..ci * cplane + o + pw].fill(T::ZERO);
            }
            for &(dst, src) in &row_map {
                let (dst, src) = (ci * cplane + dst, ci * in_plane + src);
                if s_last == 1 {
                    xp[dst..dst + lo].fill(T::ZERO);
                    xp[dst + lo..dst + hi].copy_from_slice(&xg[src + j0..src + j0 + hi - lo]);
                    xp[dst + hi..dst + pw].fill(T::ZERO);
                } else {
                    let row = &xg[src..src + g.inp[last]];
                    let (xs, pb) = (&mut xp[..], g.pb[last]);
                    fill_phase_rows(xs, dst, pplane, pext[last], row, pb, s_last, &mut tmp);
                }
            }
        }
        let xpr: &[T] = &xp;
        let wg = &w[gi * mg * kdim..(gi + 1) * mg * kdim];
        // weights not packed at load are packed here once for all tiles when there are
        // several (else every tile's SGEMM would pack them again)
        let own = match (packed_group(wp, gi, mg, kdim), T::as_f32(wg)) {
            (None, Some(w32)) if tiles > 1 => Some(crate::simd::gemm::pack_a(
                mg,
                kdim,
                w32,
                kdim as isize,
                1,
                mr,
            )),
            _ => None,
        };
        let wpg = own.as_deref().or(packed_group(wp, gi, mg, kdim));
        let yo = (ni * m + gi * mg) * out_plane;
        cx.cpu
            .parallel_for_work(tiles, mg * tile * tiles * kdim, &|ti| {
                let q0 = ti * tile;
                let nc = tile.min(q_len - q0);
                let mut ct = crate::simd::scratch::<T>(mg * nc);
                // (f32 only: the bias and a Relu/Clip go to the SGEMM's epilogue)
                let gepi = fusion.gemm(gi, mg);
                let gm = Gemm {
                    m: mg,
                    n: nc,
                    k: kdim,
                    a_rs: kdim as isize,
                    a_cs: 1,
                    b_rs: 0,
                    b_cs: 0,
                    ldc: nc,
                    alpha: 1.0,
                    beta: 0.0,
                };
                let (Some(w32), Some(x32), Some(c32)) =
                    (T::as_f32(wg), T::as_f32(&xpr[q0..]), T::as_f32_mut(&mut ct))
                else {
                    return;
                };
                let b = Operand::Rows {
                    data: x32,
                    offs: &offs,
                };
                let wpg = wpg.filter(|_| crate::simd::panels_pay(mg, nc));
                cx.cpu
                    .sgemm_ops_epi(&gm, weights_operand(w32, wpg, mg), b, c32, gepi);
                // the valid positions of each padded row that meets [q0, q0 + nc): calls
                // f(range in the tile, offset in y) for each row of C
                let segments = |f: &mut dyn FnMut(core::ops::Range<usize>, usize)| {
                    let mut qr = q0 / pw * pw;
                    let mut co = [0usize; MAX_SPATIAL];
                    while qr < q0 + nc {
                        decode(qr / pw, &pext[..last], &mut co);
                        let valid = (0..last).all(|j| co[j] < g.out[j]);
                        let x0 = q0.saturating_sub(qr);
                        let x1 = (q0 + nc - qr).min(g.out[last]);
                        if valid && x0 < x1 {
                            let ybase = (0..last).map(|j| co[j] * ost[j]).sum::<usize>();
                            for r in 0..mg {
                                let at = r * nc + qr + x0 - q0;
                                f(at..at + x1 - x0, yo + r * out_plane + ybase + x0);
                            }
                        }
                        qr += pw;
                    }
                };
                // the epilogue: + Z on the valid positions, then the activation over the
                // whole tile at once (the dropped positions too: one call, not one a row)
                if let Some(z) = epi.z {
                    segments(&mut |at, o| {
                        let len = at.len();
                        ct[at]
                            .iter_mut()
                            .zip(&z[o..o + len])
                            .for_each(|(v, &zv)| *v = v.add(zv));
                    });
                }
                if let Some(act) = act_after {
                    act(&mut ct);
                }
                segments(&mut |at, o| {
                    debug_assert!(o + at.len() <= ylen);
                    // SAFETY: positions [q0, q0 + nc) of the padded grid map to output
                    // positions no other tile has; they lie inside `y`, which stays borrowed
                    // until `parallel_for_work` returns.
                    let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(o), at.len()) };
                    dst.copy_from_slice(&ct[at]);
                });
            });
    }
}

/// Below this many multiply-adds a convolution runs on one thread.
const PAR_CONV_MIN_MACS: usize = 1 << 20;

/// The sizes [`conv_tiles_parallel`] works with.
struct TileShape {
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    kdim: usize,
    in_plane: usize,
    out_plane: usize,
    pointwise: bool,
}

/// The threaded convolution (GEMM paths): one task per (image, group, tile of output
/// positions), each doing its own im2col, GEMM and epilogue into a tile of its own, then
/// storing the tile's rows. One fork-join per convolution, and no task repacks what another
/// packed; the products are the same as the serial path's (a tile's sums do not depend on how
/// the positions are split).
#[allow(clippy::too_many_arguments)]
fn conv_tiles_parallel<T: Num>(
    cx: &KernelCx<'_>,
    x: &[T],
    (w, wp): (&[T], Option<&[f32]>),
    bias: Option<&[T]>,
    g: &Geom,
    sh: &TileShape,
    y: &mut [T],
    epi: ConvEpilogue<'_, T>,
) {
    let TileShape {
        n,
        c,
        m,
        group,
        kdim,
        in_plane,
        out_plane,
        pointwise,
    } = *sh;
    let (cg, mg) = (c / group, m / group);
    let threads = cx.cpu.threads();
    let base = n * group;
    let budget = if pointwise { cg } else { kdim };
    let mut tile = patch_tile(budget, out_plane);
    let direct = !pointwise && T::as_f32(&[]).is_some();
    // enough tasks for the threads to share (four each), but tiles of at least 64 positions
    let want = 4 * threads;
    if base * out_plane.div_ceil(tile) < want {
        let (_, nr) = crate::simd::gemm_tile();
        tile = out_plane
            .div_ceil(want.div_ceil(base))
            .div_ceil(nr)
            .saturating_mul(nr)
            .max(64)
            .min(out_plane);
    }
    let tiles = out_plane.div_ceil(tile);
    let yp = SyncPtr(y.as_mut_ptr());
    let ylen = y.len();
    let fusion = ConvFusion::of(bias, &epi);
    let fill_bias = fusion.fills_bias(bias);
    let act_after = fusion.act_after(&epi);
    cx.cpu
        .parallel_for_work(base * tiles, n * m * out_plane * kdim, &|it| {
            let (ng, ti) = (it / tiles, it % tiles);
            let (ni, gi) = (ng / group, ng % group);
            let p0 = ti * tile;
            let nc = tile.min(out_plane - p0);
            let xg = &x[(ni * c + gi * cg) * in_plane..(ni * c + (gi + 1) * cg) * in_plane];
            let wg = &w[gi * mg * kdim..(gi + 1) * mg * kdim];
            let wpg = packed_group(wp, gi, mg, kdim);
            let mut buf = crate::simd::scratch::<T>(
                mg * nc + if pointwise || direct { 0 } else { kdim * nc },
            );
            let (ct, colt) = buf.split_at_mut(mg * nc);
            let beta = match bias {
                Some(b) if fill_bias => {
                    for (r, row) in ct.chunks_exact_mut(nc).enumerate() {
                        row.fill(b[gi * mg + r]);
                    }
                    1.0
                }
                _ => 0.0,
            };
            let gepi = fusion.gemm(gi, mg);
            if pointwise {
                let gm = Gemm {
                    m: mg,
                    n: nc,
                    k: cg,
                    a_rs: kdim as isize,
                    a_cs: 1,
                    b_rs: in_plane as isize,
                    b_cs: 1,
                    ldc: nc,
                    alpha: 1.0,
                    beta,
                };
                pointwise_gemm(cx, &gm, (wg, wpg), &xg[p0..], ct, gepi);
            } else {
                let (w, pos) = ((wg, wpg), (p0, nc));
                conv_tile_product(cx, xg, w, g, pos, (mg, kdim), colt, ct, (nc, beta), gepi);
            }
            let yo = (ni * m + gi * mg) * out_plane;
            for (r, row) in ct.chunks_exact_mut(nc).enumerate() {
                let o = yo + r * out_plane + p0;
                if let Some(z) = epi.z {
                    row.iter_mut()
                        .zip(&z[o..o + nc])
                        .for_each(|(v, &zv)| *v = v.add(zv));
                }
                if let Some(act) = act_after {
                    act(row);
                }
                debug_assert!(o + nc <= ylen);
                // SAFETY: task `it` alone writes positions [p0, p0 + nc) of the rows of its
                // image and group; the ranges are disjoint and inside `y`, which stays
                // borrowed until `parallel_for_work` returns.
                let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(o), nc) };
                dst.copy_from_slice(row);
            }
        });
}

/// Checks X/W/B shapes of a convolution and resolves its geometry.
fn conv_shape(
    sp: &Spatial,
    group: usize,
    xs: &[usize],
    ws: &[usize],
    b: Option<&Tensor>,
) -> Result<ConvShape> {
    if xs.len() < 3 || ws.len() != xs.len() {
        bail!("Conv needs X of rank >= 3 and W of the same rank (got {xs:?} and {ws:?})");
    }
    let (n, c, m) = (xs[0], xs[1], ws[0]);
    if group == 0 || c % group != 0 || m % group != 0 || ws[1] * group != c {
        bail!("Conv: X {xs:?}, W {ws:?} and group {group} do not fit");
    }
    let k = &ws[2..];
    if let Some(ks) = &sp.kernel {
        if ks.as_slice() != k {
            bail!("Conv: kernel_shape {ks:?} differs from W's spatial shape {k:?}");
        }
    }
    if let Some(b) = b {
        if b.len() != m {
            bail!("Conv: bias has {} values for {m} output channels", b.len());
        }
    }
    if k.contains(&0) {
        bail!("Conv: empty kernel {k:?}");
    }
    let g = conv_geom(sp, &xs[2..], k)?;
    Ok(ConvShape { n, c, m, group, g })
}

fn conv_typed<T: Num>(
    cx: &KernelCx<'_>,
    x: &Tensor,
    (w, wp): (&Tensor, Option<&[f32]>),
    b: Option<&Tensor>,
    cs: &ConvShape,
    epi: ConvEpilogue<'_, T>,
) -> Result<Tensor> {
    let xv = x.as_slice::<T>()?;
    let wv = w.as_slice::<T>()?;
    let bv = match b {
        Some(b) => Some(b.as_slice::<T>()?),
        None => None,
    };
    let mut shape = vec![cs.n, cs.m];
    shape.extend_from_slice(&cs.g.out);
    if T::as_f32(&[]).is_some() && takes_dw_direct(cs) {
        // conv_depthwise_direct writes every output before it reads any: a fresh output (a
        // graph output, an eager run) is not zero-filled first
        let mut y = cx.output_raw::<T>(0, &shape)?;
        let len = y.len();
        // SAFETY: the `len` elements from the pointer are the output's; the kernel writes
        // each of them before any is read (f32 elements, no drop)
        let ys = unsafe { core::slice::from_raw_parts_mut(y.as_mut_ptr(), len) };
        conv_compute_into(cx, &xv, &wv, wp, bv.as_deref(), cs, ys, epi);
        // SAFETY: every element was written (above)
        return Ok(unsafe { y.assume_written() }?.into_tensor());
    }
    let mut y = cx.output::<T>(0, &shape)?;
    conv_compute_into(cx, &xv, &wv, wp, bv.as_deref(), cs, &mut y, epi);
    Ok(y.into_tensor())
}

/// Whether [`conv_compute_into`] gives an f32 convolution of this shape to
/// [`conv_depthwise_direct`] (depthwise, at most two spatial axes, [`dw_direct_takes`]).
fn takes_dw_direct(cs: &ConvShape) -> bool {
    if cs.group != cs.c || cs.m != cs.c {
        return false;
    }
    let g = cs.g.simplified();
    g.nd() <= 2 && dw_direct_takes(&Dw2d::of(&g))
}

/// Whether an f32 depthwise convolution of this geometry takes [`conv_depthwise_direct`]:
/// horizontal stride 1, where the channel-blocked kernel does not pay. The one decision both
/// the kernel choice and the output allocation (not zero-filled for this kernel) follow.
fn dw_direct_takes(geo: &Dw2d) -> bool {
    geo.sw == 1 && !dw_blocked_pays(geo)
}

/// Packs convolution weights W ([M, C/group, k..]) into the SGEMM's A panels, group by group
/// (each group's `M/group` rows start on a panel of their own); not depthwise weights, which
/// a direct kernel reads as they are.
fn pack_conv_weights(w: &Tensor, group: usize) -> Option<Prepacked> {
    Prepacked::new(w, |wv, ws| {
        if ws.len() < 3 || group == 0 || !ws[0].is_multiple_of(group) {
            return None;
        }
        let (m, cg) = (ws[0], ws[1]);
        let (mg, kdim) = (m / group, ws[1..].iter().product::<usize>());
        if (cg == 1 && group == m) || kdim == 0 || mg == 0 {
            return None;
        }
        let mr = crate::simd::gemm_mr_for(mg);
        let mut data = Vec::with_capacity(group * mg.div_ceil(mr) * mr * kdim);
        for gi in 0..group {
            let wg = &wv[gi * mg * kdim..(gi + 1) * mg * kdim];
            data.extend(crate::simd::gemm::pack_a(
                mg,
                kdim,
                wg,
                kdim as isize,
                1,
                mr,
            ));
        }
        Some(data)
    })
}

/// `Conv` and `com.microsoft:FusedConv` (`fused`: inputs X, W, B, Z and an activation),
/// with weights that are initializers packed once at load ([`Kernel::prepare`]).
struct ConvKernel {
    sp: Spatial,
    group: usize,
    fused: bool,
    act: Option<simd::Act>,
    packed: Option<Prepacked>,
}

impl ConvKernel {
    fn packed_for(&self, w: &Tensor) -> Option<&[f32]> {
        self.packed.as_ref().and_then(|p| p.for_tensor(w))
    }

    fn conv(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let group = self.group;
        let x = tensor_in(inputs, 0)?;
        let w = tensor_in(inputs, 1)?;
        let b = opt_tensor_in(inputs, 2)?;
        let dt = x.dtype();
        if w.dtype() != dt || b.is_some_and(|b| b.dtype() != dt) {
            bail!("Conv: input types differ");
        }
        let cs = conv_shape(&self.sp, group, x.shape(), w.shape(), b)?;
        let wp = self.packed_for(w);
        let y = match dt {
            DataType::Float => conv_typed::<f32>(cx, x, (w, wp), b, &cs, ConvEpilogue::NONE)?,
            DataType::Double => conv_typed::<f64>(cx, x, (w, None), b, &cs, ConvEpilogue::NONE)?,
            DataType::Float16 | DataType::Bfloat16 => {
                let bw = match b {
                    Some(b) => Some(widen_f32(b)?),
                    None => None,
                };
                let (xw, ww) = (widen_f32(x)?, widen_f32(w)?);
                let none = ConvEpilogue::NONE;
                let y = conv_typed::<f32>(cx, &xw, (&ww, None), bw.as_ref(), &cs, none)?;
                narrow_f32(y, dt)?
            }
            dt => return Err(bad_type("Conv", dt)),
        };
        out1(y)
    }
}

impl Kernel for ConvKernel {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        if self.fused {
            self.fused_conv(cx, inputs)
        } else {
            self.conv(cx, inputs)
        }
    }

    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        if let Some(Some(w)) = consts.get(1) {
            self.packed = pack_conv_weights(w, self.group);
        }
        self.packed.as_ref().map_or(0, Prepacked::bytes)
    }
}

fn build_conv(node: &Node) -> Result<Box<dyn Kernel>> {
    let sp = parse_spatial(node)?;
    let group = node.get_i("group", 1)?;
    if group <= 0 {
        bail!("group must be positive, is {group}");
    }
    Ok(Box::new(ConvKernel {
        sp,
        group: group as usize,
        fused: false,
        act: None,
        packed: None,
    }))
}

/// The activation of a `com.microsoft:FusedConv` (`activation`, `activation_params`; the
/// names of ONNX Runtime's contrib op, plus HardSwish).
fn fused_activation(node: &Node) -> Result<Option<simd::Act>> {
    let Some(name) = node.attr_s("activation")? else {
        return Ok(None);
    };
    let p = node.attr_floats("activation_params")?.unwrap_or_default();
    let need = |k: usize| -> Result<()> {
        if p.len() != k {
            bail!(
                "FusedConv activation {name} needs {k} activation_params, has {}",
                p.len()
            );
        }
        Ok(())
    };
    Ok(Some(match name.as_str() {
        "Relu" => simd::Act::Relu,
        "Sigmoid" => simd::Act::Sigmoid,
        "Tanh" => simd::Act::Tanh,
        // no parameters: ONNX's HardSwish; four (nxrt's extension): the spelled-out chain
        // x * Clip(x + shift, lo, hi) / div, op by op
        "HardSwish" if p.is_empty() => simd::Act::HardSwish,
        "HardSwish" => {
            need(4)?;
            simd::Act::HardSwishParts {
                shift: p[0],
                lo: p[1],
                hi: p[2],
                div: p[3],
            }
        }
        // one parameter: ONNX's LeakyRelu; three (nxrt's extension): alpha and the bounds of
        // the Max/Min/Clip with constants fused after it
        "LeakyRelu" if p.len() == 3 => simd::Act::LeakyReluClip {
            alpha: p[0],
            lo: p[1],
            hi: p[2],
        },
        "LeakyRelu" => {
            need(1)?;
            simd::Act::LeakyRelu(p[0])
        }
        "HardSigmoid" => {
            need(2)?;
            simd::Act::HardSigmoid(p[0], p[1])
        }
        "Clip" => {
            need(2)?;
            simd::Act::Clip(p[0], p[1])
        }
        other => unsupported!("FusedConv activation {other} is not supported"),
    }))
}

/// `com.microsoft:FusedConv`: `Y = act(Conv(X, W, B) + Z)` in one pass (float32). The
/// optimiser makes these from Conv, a residual Add and an activation (`fuse`); models that
/// ONNX Runtime optimised offline carry them too.
fn build_fused_conv(node: &Node) -> Result<Box<dyn Kernel>> {
    let sp = parse_spatial(node)?;
    let group = node.get_i("group", 1)?;
    if group <= 0 {
        bail!("group must be positive, is {group}");
    }
    Ok(Box::new(ConvKernel {
        sp,
        group: group as usize,
        fused: true,
        act: fused_activation(node)?,
        packed: None,
    }))
}

impl ConvKernel {
    fn fused_conv(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let act = self.act;
        let x = tensor_in(inputs, 0)?;
        let w = tensor_in(inputs, 1)?;
        let b = opt_tensor_in(inputs, 2)?;
        let z = opt_tensor_in(inputs, 3)?;
        if [Some(x), Some(w), b, z]
            .iter()
            .flatten()
            .any(|t| t.dtype() != DataType::Float)
        {
            return Err(bad_type("FusedConv", x.dtype()));
        }
        let cs = conv_shape(&self.sp, self.group, x.shape(), w.shape(), b)?;
        let mut shape = vec![cs.n, cs.m];
        shape.extend_from_slice(&cs.g.out);
        if let Some(z) = z {
            if z.shape() != shape.as_slice() {
                bail!(
                    "FusedConv: Z has shape {:?}, the output {shape:?}",
                    z.shape()
                );
            }
        }
        let zv = match z {
            Some(z) => Some(z.as_slice::<f32>()?),
            None => None,
        };
        let f = |s: &mut [f32]| {
            if let Some(a) = act {
                simd::unary_inplace(a, s)
            }
        };
        let epi = ConvEpilogue {
            z: zv.as_deref(),
            act: act.map(|_| &f as TileFn<'_, f32>),
            simd_act: act,
        };
        out1(conv_typed::<f32>(
            cx,
            x,
            (w, self.packed_for(w)),
            b,
            &cs,
            epi,
        )?)
    }
}

// ----------------------------------------------------------------------------- ConvInteger / QLinearConv

fn conv_attrs(node: &Node) -> Result<(Spatial, usize)> {
    let sp = parse_spatial(node)?;
    let group = node.get_i("group", 1)?;
    if group <= 0 {
        bail!("group must be positive, is {group}");
    }
    Ok((sp, group as usize))
}

fn build_conv_integer(node: &Node) -> Result<Box<dyn Kernel>> {
    qconv::build_qconv(node, false)
}

fn build_qlinear_conv(node: &Node) -> Result<Box<dyn Kernel>> {
    qconv::build_qconv(node, true)
}

// ----------------------------------------------------------------------------- ConvTranspose

struct ConvTAttrs {
    sp: Spatial,
    group: usize,
    output_padding: Option<Vec<usize>>,
    output_shape: Option<Vec<usize>>,
}

fn conv_transpose_shape(
    a: &ConvTAttrs,
    xs: &[usize],
    ws: &[usize],
    b: Option<&Tensor>,
) -> Result<ConvShape> {
    if xs.len() < 3 || ws.len() != xs.len() {
        bail!("ConvTranspose needs X of rank >= 3 and W of the same rank (got {xs:?} and {ws:?})");
    }
    let nd = xs.len() - 2;
    check_nd(nd)?;
    let (n, c) = (xs[0], xs[1]);
    let group = a.group;
    if ws[0] != c || c % group != 0 {
        bail!("ConvTranspose: X {xs:?}, W {ws:?} and group {group} do not fit");
    }
    let m = ws[1] * group;
    let k = ws[2..].to_vec();
    if let Some(ks) = &a.sp.kernel {
        if ks != &k {
            bail!("ConvTranspose: kernel_shape {ks:?} differs from W's spatial shape {k:?}");
        }
    }
    if k.contains(&0) {
        bail!("ConvTranspose: empty kernel {k:?}");
    }
    if let Some(b) = b {
        if b.len() != m {
            bail!(
                "ConvTranspose: bias has {} values for {m} output channels",
                b.len()
            );
        }
    }
    let s = a.sp.strides(nd)?;
    let d = a.sp.dilations(nd)?;
    let op = Spatial::per_dim(&a.output_padding, nd, "output_padding", 0)?;
    let inp = &xs[2..];
    let mut out = vec![0usize; nd];
    let mut pb = vec![0isize; nd];
    let explicit_out = match &a.output_shape {
        Some(os) if os.len() == nd => Some(os.clone()),
        Some(os) if os.len() == nd + 2 => Some(os[2..].to_vec()),
        Some(os) => bail!("ConvTranspose: output_shape {os:?} does not fit {nd} spatial dims"),
        None => None,
    };
    let (pads_b, pads_e) = a.sp.pads(nd)?;
    for j in 0..nd {
        let keff = ((k[j] - 1) * d[j] + 1) as isize;
        let natural = (s[j] * inp[j].saturating_sub(1)) as isize + op[j] as isize + keff;
        let target = match (&explicit_out, a.sp.auto_pad) {
            (Some(o), _) => Some(o[j] as isize),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some((inp[j] * s[j]) as isize),
            _ => None,
        };
        match target {
            Some(t) => {
                // A requested extent up to stride-1 beyond the natural one pads the end (as
                // onnxruntime does); more than that cannot come from this input.
                if natural - t <= -(s[j] as isize) {
                    bail!(
                        "ConvTranspose: output extent {t} is unreachable from input extent {} on axis {}",
                        inp[j],
                        j + 2
                    );
                }
                let total = (natural - t).max(0);
                let begin = if a.sp.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                out[j] = t as usize;
                pb[j] = begin;
            }
            None => {
                let (b, e) = if a.sp.auto_pad == AutoPad::Valid {
                    (0, 0)
                } else {
                    (pads_b[j] as isize, pads_e[j] as isize)
                };
                let o = natural - b - e;
                if o < 0 {
                    bail!("ConvTranspose: negative output extent on axis {}", j + 2);
                }
                out[j] = o as usize;
                pb[j] = b;
            }
        }
    }
    Ok(ConvShape {
        n,
        c,
        m,
        group,
        g: Geom {
            inp: inp.to_vec(),
            out,
            k,
            s,
            d,
            pb,
        },
    })
}

fn conv_transpose_compute<T: Num>(
    cx: &KernelCx<'_>,
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    cs: &ConvShape,
) -> Vec<T> {
    let g = &cs.g;
    let (n, c, m, group) = (cs.n, cs.c, cs.m, cs.group);
    let (cg, mg) = (c / group, m / group);
    let kk: usize = g.k.iter().product();
    let rows = mg * kk;
    let in_plane: usize = g.inp.iter().product();
    let out_plane: usize = g.out.iter().product();
    let mut y = vec![T::ZERO; n * m * out_plane];
    if y.is_empty() {
        return y;
    }
    // kernel == stride, no padding, no dilation, the natural output extent: every output
    // element takes exactly one tap, written (with the bias) straight from the GEMM's tile
    let shuffle = g.nd() == 2
        && g.k == g.s
        && g.d.iter().all(|&d| d == 1)
        && g.pb.iter().all(|&p| p == 0)
        && g.out
            .iter()
            .zip(&g.inp)
            .zip(&g.s)
            .all(|((&o, &i), &s)| o == i * s);
    if let (Some(b), false) = (bias, shuffle) {
        for (pi, plane) in y.chunks_mut(out_plane).enumerate() {
            plane.fill(b[pi % m]);
        }
    }
    if rows == 0 || in_plane == 0 || cg == 0 {
        return y;
    }
    let tile = (COL_BUDGET / rows).clamp(1, in_plane);
    // from the scratch pool: each GEMM below writes the whole tile (beta = 0)
    let mut col = crate::simd::scratch::<T>(rows * tile);
    for ni in 0..n {
        for gi in 0..group {
            let xg = &x[(ni * c + gi * cg) * in_plane..(ni * c + (gi + 1) * cg) * in_plane];
            let wg = &w[gi * cg * rows..(gi + 1) * cg * rows];
            let yg = &mut y[(ni * m + gi * mg) * out_plane..(ni * m + (gi + 1) * mg) * out_plane];
            let mut p0 = 0;
            while p0 < in_plane {
                let nc = tile.min(in_plane - p0);
                let colt = &mut col[..rows * nc];
                // col = Wgᵀ · Xg[:, p0..p0+nc]
                let gm = Gemm {
                    m: rows,
                    n: nc,
                    k: cg,
                    a_rs: 1,
                    a_cs: rows as isize,
                    b_rs: in_plane as isize,
                    b_cs: 1,
                    ldc: nc,
                    alpha: 1.0,
                    beta: 0.0,
                };
                T::gemm(cx, &gm, wg, &xg[p0..], colt);
                if shuffle {
                    let bg = bias.map(|b| &b[gi * mg..(gi + 1) * mg]);
                    taps_to_pixels(cx.cpu, colt, g, p0, nc, bg, yg);
                } else {
                    col2im(cx.cpu, colt, g, p0, nc, yg);
                }
                p0 += nc;
            }
        }
    }
    y
}

fn conv_transpose_typed<T: Num>(
    cx: &KernelCx<'_>,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    cs: &ConvShape,
) -> Result<Tensor> {
    let xv = x.as_slice::<T>()?;
    let wv = w.as_slice::<T>()?;
    let bv = match b {
        Some(b) => Some(b.as_slice::<T>()?),
        None => None,
    };
    let y = conv_transpose_compute(cx, &xv, &wv, bv.as_deref(), cs);
    let mut shape = vec![cs.n, cs.m];
    shape.extend_from_slice(&cs.g.out);
    Tensor::from_vec(&shape, y)
}

fn build_conv_transpose(node: &Node) -> Result<Box<dyn Kernel>> {
    let (sp, group) = conv_attrs(node)?;
    let output_padding = match node.attr_ints("output_padding")? {
        Some(v) if v.iter().any(|&x| x < 0) => bail!("output_padding must be >= 0, is {v:?}"),
        Some(v) => Some(dims_of(&v)?),
        None => None,
    };
    let output_shape = match node.attr_ints("output_shape")? {
        Some(v) => Some(dims_of(&v)?),
        None => None,
    };
    let a = ConvTAttrs {
        sp,
        group,
        output_padding,
        output_shape,
    };
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let w = tensor_in(inputs, 1)?;
            let b = opt_tensor_in(inputs, 2)?;
            let dt = x.dtype();
            if w.dtype() != dt || b.is_some_and(|b| b.dtype() != dt) {
                bail!("ConvTranspose: input types differ");
            }
            let cs = conv_transpose_shape(&a, x.shape(), w.shape(), b)?;
            let y = match dt {
                DataType::Float => conv_transpose_typed::<f32>(cx, x, w, b, &cs)?,
                DataType::Double => conv_transpose_typed::<f64>(cx, x, w, b, &cs)?,
                DataType::Float16 | DataType::Bfloat16 => {
                    let bw = match b {
                        Some(b) => Some(widen_f32(b)?),
                        None => None,
                    };
                    let y = conv_transpose_typed::<f32>(
                        cx,
                        &widen_f32(x)?,
                        &widen_f32(w)?,
                        bw.as_ref(),
                        &cs,
                    )?;
                    narrow_f32(y, dt)?
                }
                dt => return Err(bad_type("ConvTranspose", dt)),
            };
            out1(y)
        },
    ))
}

// ----------------------------------------------------------------------------- pooling

/// Per output coordinate of one axis: window start (input coordinate of tap 0), the valid tap
/// range, and the number of taps inside input + explicit padding.
#[derive(Clone, Copy)]
struct Win {
    base: isize,
    lo: usize,
    hi: usize,
    padded: usize,
}

/// Window tables of the 3 (padded with unit axes) pooling dimensions.
struct PoolPlan {
    inp: [usize; 3],
    out: [usize; 3],
    d: [usize; 3],
    wins: [Vec<Win>; 3],
    /// Stride of the last axis, and per kernel tap of the last axis: the valid output range
    /// and the input offset (input = output*stride + offset).
    s2: usize,
    cols: Vec<(usize, usize, isize)>,
}

impl PoolPlan {
    /// Taps per output (for the threads' minimum grain).
    fn window_len(&self) -> usize {
        self.wins
            .iter()
            .map(|w| w.iter().map(|x| x.hi - x.lo).max().unwrap_or(1))
            .product::<usize>()
            .max(1)
    }
}

fn pool_plan(g: &Geom, pe: &[isize]) -> Result<PoolPlan> {
    let nd = g.nd();
    if nd > 3 {
        unsupported!("pooling over {nd} spatial dimensions is not supported");
    }
    let mut p = PoolPlan {
        inp: [1; 3],
        out: [1; 3],
        d: [1; 3],
        wins: [
            vec![Win {
                base: 0,
                lo: 0,
                hi: 1,
                padded: 1,
            }],
            Vec::new(),
            Vec::new(),
        ],
        s2: 1,
        cols: Vec::new(),
    };
    p.wins[1] = p.wins[0].clone();
    p.wins[2] = p.wins[0].clone();
    for j in 0..nd {
        let a = 3 - nd + j;
        p.inp[a] = g.inp[j];
        p.out[a] = g.out[j];
        p.d[a] = g.d[j];
        let (k, s, d, inn) = (g.k[j], g.s[j], g.d[j] as isize, g.inp[j] as isize);
        p.wins[a] = (0..g.out[j])
            .map(|o| {
                let base = (o * s) as isize - g.pb[j];
                let (lo, hi) = valid_range(0, k, d as usize, base, inn as usize);
                let padded = (0..k)
                    .filter(|&t| {
                        let pos = base + t as isize * d;
                        pos >= -g.pb[j] && pos < inn + pe[j]
                    })
                    .count();
                Win {
                    base,
                    lo,
                    hi,
                    padded,
                }
            })
            .collect();
    }
    let last = nd - 1;
    p.s2 = g.s[last];
    p.cols = (0..g.k[last])
        .map(|t| {
            let off = (t * g.d[last]) as isize - g.pb[last];
            let (lo, hi) = valid_range(0, g.out[last], g.s[last], off, g.inp[last]);
            (lo, hi, off)
        })
        .collect();
    Ok(p)
}

/// Element types pooled row by row: splitting a row into its two stride-2 phases (the f32
/// one through the SIMD layer).
trait PoolElem: Copy + bytemuck::Pod {
    /// `ph0[q] = src[2q]`, `ph1[q] = src[2q + 1]` for the `q` where those exist.
    fn split2(src: &[Self], ph0: &mut [Self], ph1: &mut [Self]) {
        for (q, pair) in src.chunks(2).enumerate() {
            ph0[q] = pair[0];
            if let Some(&v) = pair.get(1) {
                ph1[q] = v;
            }
        }
    }
}
impl PoolElem for f32 {
    fn split2(src: &[f32], ph0: &mut [f32], ph1: &mut [f32]) {
        crate::simd::phases2(src, 0, ph0, ph1)
    }
}
impl PoolElem for f64 {}
impl PoolElem for i8 {}
impl PoolElem for u8 {}
impl PoolElem for i32 {}

/// Row-wise pooling of one plane: every output folds `op` over its taps starting from
/// `init` (vectorised along the last axis), then `fin(acc, taps inside the input, taps
/// inside input + padding)` finishes it. At stride 2 along the last axis each wide input row
/// is split into its two phases once, so that every tap reads one of them contiguously.
#[inline(always)]
fn pool_rows<T: PoolElem>(
    p: &PoolPlan,
    xp: &[T],
    out: &mut [T],
    init: T,
    op: impl Fn(T, T) -> T + Copy,
    fin: impl Fn(T, usize, usize) -> T,
) {
    let (i1, i2, o2, s2) = (p.inp[1], p.inp[2], p.out[2], p.s2);
    if out.is_empty() {
        return;
    }
    // (narrow rows would spend more on the split than on the taps)
    let split = s2 == 2 && i2 >= 64;
    let half = i2.div_ceil(2);
    // (from the scratch pool: each row is split into it before its taps read it)
    let mut phases = crate::simd::scratch::<T>(if split { 2 * half } else { 0 });
    let mut orows = out.chunks_mut(o2);
    for w0 in &p.wins[0] {
        for w1 in &p.wins[1] {
            let Some(orow) = orows.next() else {
                return;
            };
            orow.fill(init);
            for a in w0.lo..w0.hi {
                let x0 = (w0.base + (a * p.d[0]) as isize) as usize;
                for b in w1.lo..w1.hi {
                    let x1 = (w1.base + (b * p.d[1]) as isize) as usize;
                    let xrow = &xp[(x0 * i1 + x1) * i2..(x0 * i1 + x1 + 1) * i2];
                    if split {
                        let (ph0, ph1) = phases.split_at_mut(half);
                        T::split2(xrow, ph0, ph1);
                    }
                    for &(lo, hi, off) in &p.cols {
                        if lo >= hi {
                            continue;
                        }
                        let start = ((lo * s2) as isize + off) as usize;
                        let o = &mut orow[lo..hi];
                        let src = match s2 {
                            1 => &xrow[start..start + (hi - lo)],
                            2 if split => {
                                let ph = &phases[(start % 2) * half..];
                                &ph[start / 2..start / 2 + (hi - lo)]
                            }
                            _ => {
                                for (ov, &xv) in o.iter_mut().zip(xrow[start..].iter().step_by(s2))
                                {
                                    *ov = op(*ov, xv);
                                }
                                continue;
                            }
                        };
                        for (ov, &xv) in o.iter_mut().zip(src) {
                            *ov = op(*ov, xv);
                        }
                    }
                }
            }
            let rows_in = (w0.hi - w0.lo) * (w1.hi - w1.lo);
            let rows_pad = w0.padded * w1.padded;
            for (ov, w2) in orow.iter_mut().zip(&p.wins[2]) {
                *ov = fin(*ov, rows_in * (w2.hi - w2.lo), rows_pad * w2.padded);
            }
        }
    }
}

/// One pooling window: its taps per axis.
struct Window<'a> {
    p: &'a PoolPlan,
    w: [Win; 3],
}

impl Window<'_> {
    /// Calls `g` with the plane index of every tap inside the input.
    #[inline(always)]
    fn taps(&self, mut g: impl FnMut(usize)) {
        let p = self.p;
        let [w0, w1, w2] = self.w;
        let (i1, i2) = (p.inp[1], p.inp[2]);
        for a in w0.lo..w0.hi {
            let x0 = (w0.base + (a * p.d[0]) as isize) as usize;
            for b in w1.lo..w1.hi {
                let x1 = (w1.base + (b * p.d[1]) as isize) as usize;
                let row = (x0 * i1 + x1) * i2;
                let mut x2 = w2.base + (w2.lo * p.d[2]) as isize;
                for _ in w2.lo..w2.hi {
                    g(row + x2 as usize);
                    x2 += p.d[2] as isize;
                }
            }
        }
    }
}

/// Calls `f(output, window)` for every output position of a plane, in order.
#[inline(always)]
fn for_each_window<O>(p: &PoolPlan, out: &mut [O], mut f: impl FnMut(&mut O, &Window<'_>)) {
    let mut oi = 0;
    for &w0 in &p.wins[0] {
        for &w1 in &p.wins[1] {
            for &w2 in &p.wins[2] {
                f(&mut out[oi], &Window { p, w: [w0, w1, w2] });
                oi += 1;
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum PoolKind {
    Max,
    Avg { include_pad: bool },
    Lp { p: f32 },
}

/// Element types of max pooling. Values fold from `LOWEST` as `if v > acc { v } else { acc }`
/// (a NaN never replaces a number).
trait MaxElem: Copy + Send + Sync + PartialOrd + Elem + PoolElem {
    const LOWEST: Self;

    /// `out[j]` = the fold of `src[2j]` and `src[2j + 1]`.
    fn pair_max(src: &[Self], out: &mut [Self]) {
        for (o, pair) in out.iter_mut().zip(src.chunks_exact(2)) {
            let a = if pair[0] > Self::LOWEST {
                pair[0]
            } else {
                Self::LOWEST
            };
            *o = if pair[1] > a { pair[1] } else { a };
        }
    }
}
impl MaxElem for f32 {
    const LOWEST: Self = f32::NEG_INFINITY;

    fn pair_max(src: &[f32], out: &mut [f32]) {
        crate::simd::pair_max(src, out)
    }
}
impl MaxElem for f64 {
    const LOWEST: Self = f64::NEG_INFINITY;
}
impl MaxElem for i8 {
    const LOWEST: Self = i8::MIN;
}
impl MaxElem for u8 {
    const LOWEST: Self = u8::MIN;
}
impl MaxElem for i32 {
    const LOWEST: Self = i32::MIN;
}

/// Max pooling of [N, C, ..] planes; with `idx`, also the argmax (flat index over the whole
/// input, column-major within a plane when `col_major`).
fn max_pool_t<T: MaxElem>(
    cpu: &dyn CpuBackend,
    x: &[T],
    planes: usize,
    p: &PoolPlan,
    want_idx: bool,
    col_major: bool,
) -> (Vec<T>, Vec<i64>) {
    let in_plane = p.inp.iter().product::<usize>();
    let out_plane = p.out.iter().product::<usize>();
    // windows of two along the last axis that tile each row exactly (2x2 or 1x2 with stride
    // 2, no padding there): the rows of a window fold first, then the pairs of the whole
    // plane at once (one pass, however narrow the rows)
    let pairs = p.s2 == 2
        && p.cols.as_slice() == [(0, p.out[2], 0), (0, p.out[2], 1)]
        && p.inp[2] == 2 * p.out[2]
        && p.inp[0] == 1
        && p.out[0] == 1;
    if !want_idx && pairs {
        let (i2, o1) = (p.inp[2], p.out[1]);
        let mut y = vec![T::LOWEST; planes * out_plane];
        par_chunks_mut(cpu, &mut y, out_plane.max(1), p.window_len(), &|pi, out| {
            let xp = &x[pi * in_plane..(pi + 1) * in_plane];
            let mut rows = crate::simd::scratch::<T>(o1 * i2);
            rows.fill(T::LOWEST);
            for (t, w1) in rows.chunks_exact_mut(i2).zip(&p.wins[1]) {
                for b in w1.lo..w1.hi {
                    let x1 = (w1.base + (b * p.d[1]) as isize) as usize;
                    for (a, &v) in t.iter_mut().zip(&xp[x1 * i2..(x1 + 1) * i2]) {
                        // (a select, not a conditional store: it vectorises)
                        *a = if v > *a { v } else { *a };
                    }
                }
            }
            T::pair_max(&rows, out);
        });
        return (y, Vec::new());
    }
    if !want_idx {
        let mut y = vec![T::LOWEST; planes * out_plane];
        par_chunks_mut(cpu, &mut y, out_plane.max(1), p.window_len(), &|pi, out| {
            let xp = &x[pi * in_plane..(pi + 1) * in_plane];
            pool_rows(
                p,
                xp,
                out,
                T::LOWEST,
                |a, v| if v > a { v } else { a },
                |a, _, _| a,
            );
        });
        return (y, Vec::new());
    }
    let mut y: Vec<(T, i64)> = vec![(T::LOWEST, -1); planes * out_plane];
    let (i1, i2) = (p.inp[1], p.inp[2]);
    par_chunks_mut(cpu, &mut y, out_plane.max(1), p.window_len(), &|pi, out| {
        let xp = &x[pi * in_plane..(pi + 1) * in_plane];
        for_each_window(p, out, |o, win| {
            let mut best = T::LOWEST;
            let mut at = usize::MAX;
            win.taps(|i| {
                let v = xp[i];
                if at == usize::MAX || v > best {
                    best = v;
                    at = i;
                }
            });
            let idx = if at == usize::MAX || !want_idx {
                -1
            } else if col_major {
                let (x0, r) = (at / (i1 * i2), at % (i1 * i2));
                let (x1, x2) = (r / i2, r % i2);
                // Column-major over the real axes (the unit leading ones contribute 0).
                (x2 * p.inp[0] * i1 + x1 * p.inp[0] + x0 + pi * in_plane) as i64
            } else {
                (at + pi * in_plane) as i64
            };
            *o = (best, idx);
        });
    });
    let (v, i): (Vec<T>, Vec<i64>) = y.into_iter().unzip();
    (v, if want_idx { i } else { Vec::new() })
}

/// Average or Lp pooling of [N, C, ..] planes, computed in `T` (f32 or f64).
fn avg_lp_pool_t<T: Num + PoolElem>(
    cpu: &dyn CpuBackend,
    x: &[T],
    planes: usize,
    p: &PoolPlan,
    kind: PoolKind,
) -> Vec<T> {
    let in_plane = p.inp.iter().product::<usize>();
    let out_plane = p.out.iter().product::<usize>();
    let mut y = vec![T::ZERO; planes * out_plane];
    par_chunks_mut(cpu, &mut y, out_plane.max(1), p.window_len(), &|pi, out| {
        let xp = &x[pi * in_plane..(pi + 1) * in_plane];
        match kind {
            PoolKind::Avg { include_pad } => pool_rows(
                p,
                xp,
                out,
                T::ZERO,
                |a, x| a.add(x),
                |s, n, padded| {
                    let div = if include_pad { padded } else { n };
                    if div == 0 {
                        T::ZERO
                    } else {
                        T::from_f64(s.to_f64() / div as f64)
                    }
                },
            ),
            PoolKind::Lp { p: 2.0 } => pool_rows(
                p,
                xp,
                out,
                T::ZERO,
                |a, x| a.add(x.mul(x)),
                |s, _, _| T::from_f64(libm::sqrt(s.to_f64())),
            ),
            PoolKind::Lp { p: pw } => {
                let pe = pw as f64;
                pool_rows(
                    p,
                    xp,
                    out,
                    T::ZERO,
                    |a, x| T::from_f64(a.to_f64() + libm::pow(libm::fabs(x.to_f64()), pe)),
                    |s, _, _| T::from_f64(libm::pow(s.to_f64(), 1.0 / pe)),
                )
            }
            PoolKind::Max => {}
        }
    });
    y
}

struct PoolAttrs {
    sp: Spatial,
    ceil: bool,
    kind: PoolKind,
    storage_order: i64,
    want_idx: bool,
}

fn pool_run(cx: &KernelCx<'_>, a: &PoolAttrs, x: &Tensor) -> Result<Vec<Value>> {
    let xs = x.shape();
    if xs.len() < 3 {
        bail!("pooling needs an input of rank >= 3, got {xs:?}");
    }
    let Some(k) = &a.sp.kernel else {
        bail!("pooling needs kernel_shape");
    };
    let (g, pe) = pool_geom(&a.sp, &xs[2..], k, a.ceil)?;
    let plan = pool_plan(&g, &pe)?;
    let planes = xs[0] * xs[1];
    let mut shape = vec![xs[0], xs[1]];
    shape.extend_from_slice(&g.out);
    let dt = x.dtype();
    match a.kind {
        PoolKind::Max => {
            let col_major = a.storage_order == 1;
            macro_rules! mp {
                ($t:ty, $xv:expr, $wrap:expr) => {{
                    let (v, i) =
                        max_pool_t::<$t>(cx.cpu, &$xv, planes, &plan, a.want_idx, col_major);
                    let y = $wrap(v)?;
                    let mut outs = vec![Value::Tensor(y)];
                    if a.want_idx {
                        outs.push(Value::Tensor(Tensor::from_vec(&shape, i)?));
                    }
                    Ok(outs)
                }};
            }
            match dt {
                DataType::Float => mp!(f32, x.as_slice::<f32>()?, |v| Tensor::from_vec(&shape, v)),
                DataType::Double => mp!(f64, x.as_slice::<f64>()?, |v| Tensor::from_vec(&shape, v)),
                DataType::Int8 => mp!(i8, x.as_slice::<i8>()?, |v| Tensor::from_vec(&shape, v)),
                DataType::Uint8 => mp!(u8, x.as_slice::<u8>()?, |v| Tensor::from_vec(&shape, v)),
                DataType::Int32 => mp!(i32, x.as_slice::<i32>()?, |v| Tensor::from_vec(&shape, v)),
                DataType::Float16 | DataType::Bfloat16 => mp!(
                    f32,
                    x.to_f32_vec()?,
                    |v| narrow_f32(Tensor::from_vec(&shape, v)?, dt)
                ),
                dt => Err(bad_type("MaxPool", dt)),
            }
        }
        kind => {
            let y = match dt {
                DataType::Float => Tensor::from_vec(
                    &shape,
                    avg_lp_pool_t::<f32>(cx.cpu, &x.as_slice::<f32>()?, planes, &plan, kind),
                )?,
                DataType::Double => Tensor::from_vec(
                    &shape,
                    avg_lp_pool_t::<f64>(cx.cpu, &x.as_slice::<f64>()?, planes, &plan, kind),
                )?,
                DataType::Float16 | DataType::Bfloat16 => narrow_f32(
                    Tensor::from_vec(
                        &shape,
                        avg_lp_pool_t::<f32>(cx.cpu, &x.to_f32_vec()?, planes, &plan, kind),
                    )?,
                    dt,
                )?,
                dt => return Err(bad_type("pooling", dt)),
            };
            out1(y)
        }
    }
}

fn pool_attrs(node: &Node, kind: PoolKind) -> Result<PoolAttrs> {
    let sp = parse_spatial(node)?;
    if sp.kernel.is_none() {
        bail!("attribute kernel_shape is required");
    }
    let storage_order = node.get_i("storage_order", 0)?;
    if !(0..=1).contains(&storage_order) {
        unsupported!("storage_order {storage_order} is not supported");
    }
    let want_idx = node.outputs.get(1).is_some_and(|o| o.is_some());
    if want_idx && kind != PoolKind::Max {
        bail!("only MaxPool has an Indices output");
    }
    Ok(PoolAttrs {
        sp,
        ceil: node.get_i("ceil_mode", 0)? != 0,
        kind,
        storage_order,
        want_idx,
    })
}

fn build_pool(node: &Node, kind: PoolKind) -> Result<Box<dyn Kernel>> {
    let a = pool_attrs(node, kind)?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            pool_run(cx, &a, tensor_in(inputs, 0)?)
        },
    ))
}

fn build_max_pool(node: &Node) -> Result<Box<dyn Kernel>> {
    build_pool(node, PoolKind::Max)
}

pub(crate) fn build_average_pool(node: &Node) -> Result<Box<dyn Kernel>> {
    let include_pad = node.get_i("count_include_pad", 0)? != 0;
    build_pool(node, PoolKind::Avg { include_pad })
}

fn lp_p(node: &Node) -> Result<f32> {
    let p = node.get_f("p", 2.0)?;
    if p.is_nan() || p <= 0.0 || !p.is_finite() {
        unsupported!("p = {p} is not supported");
    }
    Ok(p)
}

fn build_lp_pool(node: &Node) -> Result<Box<dyn Kernel>> {
    let p = lp_p(node)?;
    build_pool(node, PoolKind::Lp { p })
}

// ----------------------------------------------------------------------------- global pools

fn global_pool(cx: &KernelCx<'_>, x: &Tensor, kind: PoolKind) -> Result<Vec<Value>> {
    let xs = x.shape();
    if xs.len() < 2 {
        bail!("global pooling needs an input of rank >= 2, got {xs:?}");
    }
    let planes = xs[0] * xs[1];
    let plane: usize = xs[2..].iter().product();
    let mut shape = xs.to_vec();
    shape[2..].iter_mut().for_each(|d| *d = 1);
    let dt = x.dtype();
    fn reduce<T: Num>(
        cpu: &dyn CpuBackend,
        x: &[T],
        planes: usize,
        plane: usize,
        kind: PoolKind,
    ) -> Vec<T> {
        let mut y = vec![T::ZERO; planes];
        par_chunks_mut(cpu, &mut y, 64, plane, &|ci, out| {
            for (j, o) in out.iter_mut().enumerate() {
                let pi = ci * 64 + j;
                let xp = &x[pi * plane..(pi + 1) * plane];
                // f32 planes: the SIMD layer's sum (several partial sums, no f64 chain) and max
                if let (Some(xf), PoolKind::Avg { .. } | PoolKind::Max) = (T::as_f32(xp), kind) {
                    *o = T::from_f64(match kind {
                        PoolKind::Max if !xf.is_empty() => crate::simd::max(xf) as f64,
                        PoolKind::Max => 0.0,
                        _ => crate::simd::sum(xf) as f64 / plane.max(1) as f64,
                    });
                    continue;
                }
                *o = match kind {
                    PoolKind::Max => {
                        let mut it = xp.iter().copied();
                        let first = it.next().unwrap_or(T::ZERO);
                        it.fold(first, |m, v| if v > m { v } else { m })
                    }
                    PoolKind::Avg { .. } => {
                        let s = xp.iter().fold(T::ZERO, |s, &v| s.add(v));
                        T::from_f64(s.to_f64() / plane.max(1) as f64)
                    }
                    PoolKind::Lp { p } => {
                        let pe = p as f64;
                        let s: f64 = xp
                            .iter()
                            .map(|v| libm::pow(libm::fabs(v.to_f64()), pe))
                            .sum();
                        T::from_f64(libm::pow(s, 1.0 / pe))
                    }
                };
            }
        });
        y
    }
    let y = match dt {
        DataType::Float => Tensor::from_vec(
            &shape,
            reduce::<f32>(cx.cpu, &x.as_slice::<f32>()?, planes, plane, kind),
        )?,
        DataType::Double => Tensor::from_vec(
            &shape,
            reduce::<f64>(cx.cpu, &x.as_slice::<f64>()?, planes, plane, kind),
        )?,
        DataType::Float16 | DataType::Bfloat16 => narrow_f32(
            Tensor::from_vec(
                &shape,
                reduce::<f32>(cx.cpu, &x.to_f32_vec()?, planes, plane, kind),
            )?,
            dt,
        )?,
        DataType::Int8 | DataType::Uint8 if kind == PoolKind::Max => {
            let v = x.to_f32_vec()?;
            let r = reduce::<f32>(cx.cpu, &v, planes, plane, kind);
            if dt == DataType::Int8 {
                Tensor::from_vec(&shape, r.into_iter().map(|v| v as i8).collect())?
            } else {
                Tensor::from_vec(&shape, r.into_iter().map(|v| v as u8).collect())?
            }
        }
        dt => return Err(bad_type("global pooling", dt)),
    };
    out1(y)
}

fn build_global_average_pool(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            global_pool(
                cx,
                tensor_in(inputs, 0)?,
                PoolKind::Avg { include_pad: false },
            )
        },
    ))
}

fn build_global_max_pool(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            global_pool(cx, tensor_in(inputs, 0)?, PoolKind::Max)
        },
    ))
}

fn build_global_lp_pool(node: &Node) -> Result<Box<dyn Kernel>> {
    let p = lp_p(node)?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            global_pool(cx, tensor_in(inputs, 0)?, PoolKind::Lp { p })
        },
    ))
}

// ----------------------------------------------------------------------------- MaxUnpool

#[allow(clippy::clone_on_copy)]
fn build_max_unpool(node: &Node) -> Result<Box<dyn Kernel>> {
    let sp = parse_spatial(node)?;
    if sp.auto_pad != AutoPad::NotSet {
        unsupported!("MaxUnpool has no auto_pad");
    }
    let Some(k) = sp.kernel.clone() else {
        bail!("attribute kernel_shape is required");
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let idx = tensor_in(inputs, 1)?;
            let out_shape = opt_tensor_in(inputs, 2)?;
            let xs = x.shape();
            if xs.len() < 3 || idx.shape() != xs {
                bail!(
                    "MaxUnpool: X {xs:?} and I {:?} must match and have rank >= 3",
                    idx.shape()
                );
            }
            let nd = xs.len() - 2;
            if k.len() != nd {
                bail!(
                    "kernel_shape has {} values for {nd} spatial dimensions",
                    k.len()
                );
            }
            let s = sp.strides(nd)?;
            let (pb, pe) = sp.pads(nd)?;
            let mut inferred = vec![xs[0], xs[1]];
            for j in 0..nd {
                let v = ((xs[j + 2].max(1) - 1) * s[j] + k[j]) as isize - (pb[j] + pe[j]) as isize;
                if v < 0 {
                    bail!("MaxUnpool: negative output extent");
                }
                inferred.push(v as usize);
            }
            let target = match out_shape {
                Some(t) => {
                    let v = dims_of(&t.to_i64_vec()?)?;
                    if v.len() != xs.len() || v[0] != xs[0] || v[1] != xs[1] {
                        bail!("MaxUnpool: output_shape {v:?} does not fit input {xs:?}");
                    }
                    if v.iter().zip(&inferred).any(|(a, b)| a < b) {
                        unsupported!("MaxUnpool: output_shape {v:?} smaller than the unpooled shape {inferred:?}");
                    }
                    v
                }
                None => inferred.clone(),
            };
            let iv = idx.to_i64_vec()?;
            let total: usize = inferred.iter().product();
            let dt = x.dtype();
            let y = crate::dispatch_any!(dt, T => {
                let xv = x.as_slice::<T>()?;
                let mut y: Vec<T> = vec![T::default(); total];
                for (v, &i) in xv.iter().zip(&iv) {
                    if i < 0 || i as usize >= total {
                        bail!("MaxUnpool: index {i} out of range for {inferred:?}");
                    }
                    y[i as usize] = v.clone();
                }
                if target == inferred {
                    Tensor::from_vec(&target, y)?
                } else {
                    // Place the unpooled block at the origin of the larger output.
                    let tn: usize = target.iter().product();
                    let mut out: Vec<T> = vec![T::default(); tn];
                    let ist = strides_of(&inferred);
                    let ost = strides_of(&target);
                    for (lin, v) in y.into_iter().enumerate() {
                        let mut o = 0;
                        let mut r = lin;
                        for j in 0..inferred.len() {
                            o += (r / ist[j]) * ost[j];
                            r %= ist[j];
                        }
                        out[o] = v;
                    }
                    Tensor::from_vec(&target, out)?
                }
            }, else return Err(bad_type("MaxUnpool", dt)));
            out1(y)
        },
    ))
}

#[cfg(test)]
mod tests {
    use crate::ir::AttrValue;
    use crate::kernels::test_util::{close, ints, node, run, seq, t32};
    use crate::tensor::Tensor;
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn conv_2d_pads_strides_dilations() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("pads", ints(&[1, 0, 2, 1])),
                    ("strides", ints(&[2, 1])),
                    ("dilations", ints(&[1, 2])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 3, 7, 6], seq(126, 7, 11, 0.25))),
                Some(t32(&[4, 3, 3, 3], seq(108, 5, 13, 0.125))),
                Some(t32(&[4], seq(4, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 4, 4, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -1.375, -3.125, 0.6875, -2.9375, 1.5625, 0.40625, 1.5625, -0.46875, 1.84375,
                -0.15625, -1.0, -0.5, 1.0, 4.1875, 1.90625, 4.3125, 1.3125, -2.375, 1.3125,
                -2.03125, 2.28125, -0.25, 3.15625, 1.375, 1.5, -2.15625, -0.78125, -2.09375,
                -2.03125, 2.71875, -2.03125, 3.875, -1.1875, 1.84375, -1.0625, -2.28125, -0.1875,
                -0.53125, 2.875, 1.09375, 2.59375, -1.28125, 2.59375, -1.75, 0.875, -0.28125,
                1.0625, 2.03125,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_group2_same_upper() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("group", AttrValue::Int(2)),
                    ("auto_pad", AttrValue::String(b"SAME_UPPER".to_vec())),
                    ("strides", ints(&[2, 2])),
                ],
                1,
            ),
            &[
                Some(t32(&[2, 4, 5, 5], seq(200, 7, 11, 0.25))),
                Some(t32(&[6, 2, 3, 3], seq(108, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 6, 3, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.6875, 1.84375, -1.0625, 1.65625, -0.65625, -1.625, -1.5, -0.375, 0.75, -0.5,
                -0.0625, -1.78125, 0.21875, -1.25, -0.59375, -1.78125, 0.78125, 0.375, -0.3125,
                0.0625, -1.6875, 0.0, -0.21875, 1.65625, -0.84375, -1.3125, -0.8125, 0.84375,
                -0.375, 0.5, -0.28125, -1.625, -0.03125, -0.28125, 2.21875, -0.625, -1.1875,
                -1.34375, 0.8125, -0.4375, 1.1875, 1.0625, 0.8125, -0.625, -0.90625, 0.84375,
                -2.71875, 0.71875, -1.0, 1.5625, 1.34375, 0.6875, -0.625, -0.78125, -0.40625,
                0.1875, -0.3125, -0.71875, 2.9375, -0.15625, 1.125, -0.3125, -1.21875, -0.59375,
                0.90625, 1.4375, 0.8125, -1.0625, -0.96875, -0.125, -0.65625, -0.9375, -0.78125,
                0.8125, 1.15625, -0.90625, -1.8125, -0.5625, -0.15625, 0.21875, 1.375, -0.59375,
                -1.125, 0.5625, 1.4375, -0.875, -0.40625, -0.5625, -1.1875, -0.1875, -0.15625,
                0.875, -0.78125, -0.90625, -1.46875, 1.34375, -0.78125, 1.78125, 0.71875, -0.125,
                2.46875, -0.90625, 0.8125, -2.875, 1.0625, -0.59375, 1.90625, 0.8125,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_same_lower_even_kernel() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("auto_pad", AttrValue::String(b"SAME_LOWER".to_vec())),
                    ("kernel_shape", ints(&[2, 2])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 4, 5], seq(40, 7, 11, 0.25))),
                Some(t32(&[3, 2, 2, 2], seq(24, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 3, 4, 5]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.875, 0.4375, -1.28125, 0.78125, 0.78125, -0.0625, 0.40625, 0.875, -2.4375,
                1.8125, 0.125, -2.40625, 1.5, -1.125, -0.3125, 0.3125, -1.09375, 0.40625, 0.875,
                -2.4375, 0.9375, -0.375, -0.28125, -1.21875, 0.59375, 0.84375, -1.3125, 1.15625,
                -0.84375, 0.59375, 0.46875, -0.65625, 0.78125, -0.1875, -2.53125, 0.09375, 0.0,
                -1.3125, 1.15625, -0.84375, 0.71875, -0.375, -0.09375, -1.1875, 0.8125, 0.53125,
                -1.40625, 1.4375, -0.875, 0.59375, 0.40625, -0.9375, 0.875, -0.0625, -2.71875,
                0.28125, -0.125, -1.40625, 1.4375, -0.875,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_depthwise_3x3() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![("group", AttrValue::Int(3)), ("pads", ints(&[1, 1, 1, 1]))],
                1,
            ),
            &[
                Some(t32(&[1, 3, 6, 7], seq(126, 7, 11, 0.25))),
                Some(t32(&[3, 1, 3, 3], seq(27, 5, 13, 0.125))),
                Some(t32(&[3], seq(3, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 3, 6, 7]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.25, 0.78125, -0.75, -0.5625, -0.03125, 1.1875, -0.15625, -1.375, 1.375, -0.3125,
                -1.3125, 0.09375, 1.15625, -1.25, 0.0, 0.5625, 0.59375, 0.625, -1.40625, 1.375,
                -0.875, -1.375, 0.09375, 1.15625, -1.5625, 0.1875, 0.5625, 0.53125, 0.0, -1.40625,
                1.375, -0.3125, -1.3125, 0.09375, 0.21875, -0.3125, -0.15625, 1.1875, -0.21875,
                0.09375, -0.625, 0.28125, 1.59375, 0.90625, 2.84375, -0.375, 2.59375, 2.8125,
                0.34375, 2.0, -0.0625, 1.4375, 1.21875, 1.0, 1.46875, 1.75, 0.5, 3.21875, 1.96875,
                1.40625, 2.90625, -0.0625, 1.0, 0.375, 1.0, 1.46875, 1.9375, 0.0, 3.21875, 1.96875,
                1.96875, 2.90625, -0.0625, 1.4375, 1.21875, 1.0, 1.21875, 1.375, 1.15625, 2.625,
                1.34375, 1.09375, 2.5625, 1.09375, -0.90625, 0.625, -0.84375, -0.59375, -1.03125,
                0.25, -1.5, -1.0, -2.0625, 0.90625, -0.59375, -0.03125, 1.21875, -1.5, -0.25,
                -0.53125, -1.0, -0.78125, -0.5625, -2.0625, 0.0, -1.21875, -0.03125, 1.21875, -2.0,
                -0.0625, -0.53125, -0.5625, -0.46875, -0.5625, -2.0625, 0.90625, -0.59375,
                -0.03125, 0.25, -1.8125, 0.84375, -1.09375, -1.3125, 0.1875, -1.0625, -0.34375,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_depthwise_strided_dilated() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("group", AttrValue::Int(4)),
                    ("strides", ints(&[2, 2])),
                    ("dilations", ints(&[2, 1])),
                    ("pads", ints(&[2, 1, 1, 2])),
                ],
                1,
            ),
            &[
                Some(t32(&[2, 4, 7, 8], seq(448, 7, 11, 0.25))),
                Some(t32(&[4, 1, 3, 5], seq(60, 5, 13, 0.125))),
                Some(t32(&[4], seq(4, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 4, 3, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.4375, -0.34375, 2.0, 0.90625, -3.21875, 1.9375, 2.1875, -1.4375, 0.5625, 2.5625,
                -1.3125, -2.03125, 2.65625, 2.1875, -0.65625, -0.25, 3.0625, 1.375, -2.375, 2.0,
                1.625, -0.09375, 2.0, 3.1875, -1.4375, -2.375, 1.28125, 0.15625, -3.25, -1.40625,
                2.03125, -0.625, -2.4375, 1.34375, 1.34375, -2.03125, 1.09375, 2.75, 2.09375,
                -0.875, 2.25, 3.46875, -1.375, -0.53125, 3.03125, 1.5, -0.59375, 0.875, 1.46875,
                0.21875, -3.28125, 0.78125, 1.9375, -2.71875, -0.0625, 1.9375, -0.8125, -3.125,
                1.9375, 1.34375, -0.625, 0.96875, 2.9375, 2.84375, -0.21875, 3.5, 3.1875, 1.09375,
                1.78125, 3.75, 1.375, -1.84375, 1.15625, 1.15625, -2.40625, -0.8125, 1.59375,
                -0.375, -2.4375, -0.375, 1.03125, -3.125, -1.40625, 0.96875, 2.03125, -2.6875,
                1.125, 2.0625, -1.25, -1.0625, 2.6875, 2.65625, -0.46875, 2.125, 3.46875, 1.3125,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_depthwise_1d() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("group", AttrValue::Int(2)),
                    ("pads", ints(&[2, 1])),
                    ("strides", ints(&[2])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 9], seq(18, 7, 11, 0.25))),
                Some(t32(&[2, 1, 4], seq(8, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 5]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.21875, 0.40625, -1.03125, 0.28125, 0.75, 0.21875, 0.0, -1.40625, 0.625, 0.375,
            ],
            1e-5,
        );
    }

    #[test]
    fn unit_axes_give_the_same_convolution_as_without_them() {
        // [N, C, H, 1] with a [k, 1] kernel (im2col and depthwise paths), and [N, C, 1, H, 1]
        // (a 3-D depthwise conv that only the squeezed geometry sends to the direct kernel),
        // against the 1-D conv over H
        for group in [1i64, 3] {
            let x = seq(3 * 11, 7, 11, 0.25);
            let w = seq(3 / group as usize * 3 * 4, 5, 13, 0.125);
            let wc = 3 / group as usize;
            let conv = |rank_extra: &[usize], pads: &[i64], strides: &[i64]| {
                let mut xs = vec![1, 3];
                let mut ws = vec![3, wc];
                let mut spatial_x = vec![11];
                let mut spatial_w = vec![4];
                for &e in rank_extra {
                    if e == 0 {
                        spatial_x.insert(0, 1);
                        spatial_w.insert(0, 1);
                    } else {
                        spatial_x.push(1);
                        spatial_w.push(1);
                    }
                }
                xs.extend(&spatial_x);
                ws.extend(&spatial_w);
                run(
                    &node(
                        "Conv",
                        11,
                        vec![
                            ("group", AttrValue::Int(group)),
                            ("pads", ints(pads)),
                            ("strides", ints(strides)),
                        ],
                        1,
                    ),
                    &[Some(t32(&xs, x.clone())), Some(t32(&ws, w.clone()))],
                )
                .unwrap()[0]
                    .to_f32_vec()
                    .unwrap()
            };
            let one_d = conv(&[], &[1, 2], &[2]);
            assert_eq!(
                conv(&[1], &[1, 0, 2, 0], &[2, 1]),
                one_d,
                "group {group}, [H, 1]"
            );
            assert_eq!(
                conv(&[0, 1], &[0, 1, 0, 0, 2, 0], &[1, 2, 1]),
                one_d,
                "group {group}, [1, H, 1]"
            );
        }
    }

    /// A direct N-d convolution (stride 1, the given dilations and begin pads, bias) for
    /// checking the fast paths.
    #[allow(clippy::too_many_arguments)]
    fn direct_conv(
        x: &[f32],
        xs: &[usize],
        w: &[f32],
        ws: &[usize],
        b: &[f32],
        group: usize,
        st: &[usize],
        dil: &[usize],
        pb: &[usize],
        out: &[usize],
    ) -> Vec<f32> {
        let nd = out.len();
        let (n, c, m) = (xs[0], xs[1], ws[0]);
        let (cg, mg) = (c / group, m / group);
        let plane: usize = out.iter().product();
        let kk: usize = ws[2..].iter().product();
        let inp = &xs[2..];
        let in_plane: usize = inp.iter().product();
        let mut y = vec![0f32; n * m * plane];
        for ni in 0..n {
            for o in 0..m {
                let gi = o / mg;
                for p in 0..plane {
                    let mut oc = vec![0usize; nd];
                    let mut q = p;
                    for j in (0..nd).rev() {
                        oc[j] = q % out[j];
                        q /= out[j];
                    }
                    let mut acc = b[o];
                    for ci in 0..cg {
                        for t in 0..kk {
                            let mut kc = vec![0usize; nd];
                            let mut q = t;
                            for j in (0..nd).rev() {
                                kc[j] = q % ws[2 + j];
                                q /= ws[2 + j];
                            }
                            let mut idx = 0usize;
                            let mut inside = true;
                            for j in 0..nd {
                                let i = (oc[j] * st[j] + kc[j] * dil[j]) as isize - pb[j] as isize;
                                inside &= i >= 0 && (i as usize) < inp[j];
                                idx = idx * inp[j] + i.max(0) as usize;
                            }
                            if inside {
                                let xv = x[(ni * c + gi * cg + ci) * in_plane + idx];
                                acc += w[(o * cg + ci) * kk + t] * xv;
                            }
                        }
                    }
                    y[(ni * m + o) * plane + p] = acc;
                }
            }
        }
        y
    }

    #[test]
    fn convolutions_match_a_direct_convolution() {
        // the implicit GEMM's cases (and the depthwise kernel's): asymmetric pads, dilation,
        // strides (the stride phases), groups, several images, a reduction deeper than one
        // SGEMM block (C/group * k > 256), several position tiles, and 1-D and 3-D planes
        // (3-D has padded rows between valid ones), depthwise planes taller than one strip
        struct Case {
            xs: Vec<usize>,
            ws: Vec<usize>,
            group: usize,
            st: Vec<usize>,
            dil: Vec<usize>,
            pads: Vec<usize>,
        }
        let cases = [
            Case {
                xs: vec![2, 6, 7, 13],
                ws: vec![10, 3, 3, 3],
                group: 2,
                st: vec![1, 1],
                dil: vec![1, 2],
                pads: vec![1, 2, 0, 1],
            },
            Case {
                xs: vec![1, 30, 40, 40],
                ws: vec![72, 30, 3, 3],
                group: 1,
                st: vec![1, 1],
                dil: vec![1, 1],
                pads: vec![1, 1, 1, 1],
            },
            Case {
                xs: vec![1, 3, 50],
                ws: vec![4, 3, 5],
                group: 1,
                st: vec![1],
                dil: vec![2],
                pads: vec![3, 1],
            },
            // depthwise: the direct kernel (rows over 96 wide), and the channel-blocked one
            // for a narrow plane and one of mid-width rows (a small plane)
            Case {
                xs: vec![2, 4, 5, 130],
                ws: vec![4, 1, 3, 3],
                group: 4,
                st: vec![1, 1],
                dil: vec![1, 2],
                pads: vec![1, 2, 0, 1],
            },
            Case {
                xs: vec![1, 4, 9, 9],
                ws: vec![4, 1, 3, 3],
                group: 4,
                st: vec![1, 1],
                dil: vec![1, 1],
                pads: vec![1, 1, 1, 1],
            },
            Case {
                xs: vec![1, 2, 4, 5, 6],
                ws: vec![3, 2, 2, 3, 3],
                group: 1,
                st: vec![1, 1, 1],
                dil: vec![1, 1, 1],
                pads: vec![1, 1, 1, 0, 1, 2],
            },
            Case {
                xs: vec![1, 18, 7, 45],
                ws: vec![18, 1, 5, 5],
                group: 18,
                st: vec![1, 1],
                dil: vec![1, 1],
                pads: vec![2, 2, 2, 2],
            },
            // channel-blocked depthwise: two images, a full block of 16 channels and 4 more
            Case {
                xs: vec![2, 20, 9, 8],
                ws: vec![20, 1, 3, 3],
                group: 20,
                st: vec![1, 1],
                dil: vec![1, 1],
                pads: vec![1, 1, 1, 1],
            },
            // strided: the stem's stride 2 (an odd and an even extent), stride 3 with
            // dilation, a stride larger than the kernel, 1-D; depthwise strided, 5x5
            Case {
                xs: vec![1, 3, 33, 34],
                ws: vec![16, 3, 3, 3],
                group: 1,
                st: vec![2, 2],
                dil: vec![1, 1],
                pads: vec![1, 1, 1, 1],
            },
            Case {
                xs: vec![2, 4, 23, 19],
                ws: vec![6, 2, 3, 2],
                group: 2,
                st: vec![3, 2],
                dil: vec![2, 1],
                pads: vec![2, 0, 1, 3],
            },
            Case {
                xs: vec![1, 5, 40],
                ws: vec![7, 5, 2],
                group: 1,
                st: vec![3],
                dil: vec![1],
                pads: vec![1, 0],
            },
            Case {
                xs: vec![1, 6, 30, 29],
                ws: vec![6, 1, 5, 5],
                group: 6,
                st: vec![2, 2],
                dil: vec![1, 1],
                pads: vec![2, 2, 2, 2],
            },
            Case {
                xs: vec![1, 3, 300, 11],
                ws: vec![3, 1, 3, 3],
                group: 3,
                st: vec![1, 2],
                dil: vec![1, 1],
                pads: vec![0, 1, 2, 1],
            },
            Case {
                xs: vec![2, 4, 9, 300],
                ws: vec![4, 1, 3, 5],
                group: 4,
                st: vec![2, 3],
                dil: vec![2, 1],
                pads: vec![1, 0, 3, 2],
            },
            // 1-D, a long kernel over a few positions (the patches as transposed windows),
            // inside the input and with pads (the gather again), two groups
            Case {
                xs: vec![2, 3, 300],
                ws: vec![20, 3, 40],
                group: 1,
                st: vec![23],
                dil: vec![1],
                pads: vec![0, 0],
            },
            Case {
                xs: vec![1, 4, 200],
                ws: vec![6, 2, 33],
                group: 2,
                st: vec![17],
                dil: vec![1],
                pads: vec![5, 4],
            },
        ];
        for cs in &cases {
            let nd = cs.xs.len() - 2;
            let x = seq(cs.xs.iter().product(), 7, 11, 0.25);
            let w = seq(cs.ws.iter().product(), 5, 13, 0.125);
            let b = seq(cs.ws[0], 3, 7, 0.5);
            let out: Vec<usize> = (0..nd)
                .map(|j| {
                    (cs.xs[2 + j] + cs.pads[j] + cs.pads[nd + j]
                        - (cs.ws[2 + j] - 1) * cs.dil[j]
                        - 1)
                        / cs.st[j]
                        + 1
                })
                .collect();
            let want = direct_conv(
                &x, &cs.xs, &w, &cs.ws, &b, cs.group, &cs.st, &cs.dil, &cs.pads, &out,
            );
            let to_i = |v: &[usize]| v.iter().map(|&u| u as i64).collect::<Vec<_>>();
            let ys = run(
                &node(
                    "Conv",
                    11,
                    vec![
                        ("group", AttrValue::Int(cs.group as i64)),
                        ("pads", ints(&to_i(&cs.pads))),
                        ("strides", ints(&to_i(&cs.st))),
                        ("dilations", ints(&to_i(&cs.dil))),
                    ],
                    1,
                ),
                &[
                    Some(t32(&cs.xs, x.clone())),
                    Some(t32(&cs.ws, w.clone())),
                    Some(t32(&[cs.ws[0]], b.clone())),
                ],
            )
            .unwrap();
            let mut shape = vec![cs.xs[0], cs.ws[0]];
            shape.extend(&out);
            assert_eq!(ys[0].shape(), shape.as_slice());
            close(&ys[0].to_f32_vec().unwrap(), &want, 1e-4);
        }
    }

    #[test]
    fn weights_packed_at_load_give_the_same_result_and_only_for_their_tensor() {
        use crate::provider::{KernelCx, ReferenceCpu};
        use crate::value::Value;
        // the implicit GEMM (3x3, stride 1), the panel im2col (stride 2), 1x1, and groups
        for (ks, stride, group) in [(3usize, 1i64, 1usize), (3, 2, 2), (1, 1, 1), (1, 1, 2)] {
            let (c, m, h) = (6usize, 20usize, 12usize);
            let xs = [1, c, h, h];
            let ws = [m, c / group, ks, ks];
            let x = t32(&xs, seq(xs.iter().product(), 7, 11, 0.25));
            let w = t32(&ws, seq(ws.iter().product(), 5, 13, 0.125));
            let w2 = t32(&ws, seq(ws.iter().product(), 3, 17, 0.5));
            let n = node(
                "Conv",
                11,
                vec![
                    ("group", AttrValue::Int(group as i64)),
                    ("strides", ints(&[stride, stride])),
                ],
                1,
            );
            let plain = |w: &Tensor| run(&n, &[Some(x.clone()), Some(w.clone())]).unwrap();
            let mut k = super::build_conv(&n).unwrap();
            k.prepare(&[None, Some(&w)]);
            let cx = KernelCx::new(&ReferenceCpu);
            let go = |w: &Tensor| {
                let vals = [Value::Tensor(x.clone()), Value::Tensor(w.clone())];
                let ins: Vec<Option<&Value>> = vals.iter().map(Some).collect();
                match k.compute(&cx, &ins).unwrap().remove(0) {
                    Value::Tensor(t) => t.to_f32_vec().unwrap(),
                    _ => panic!("not a tensor"),
                }
            };
            let case = alloc::format!("k {ks} stride {stride} group {group}");
            // the tensor it was prepared with (the same storage, as a session passes it)
            assert_eq!(go(&w), plain(&w)[0].to_f32_vec().unwrap(), "{case}");
            // another W of the same shape: computed from that W, not from the packed one
            assert_eq!(
                go(&w2),
                plain(&w2)[0].to_f32_vec().unwrap(),
                "{case}, other W"
            );
        }
    }

    #[test]
    fn a_kernel_that_spans_one_column_matches_a_direct_convolution() {
        // [3, 1] taps over [H, W] planes (merged into one axis of H*W with dilation W), with
        // padding and dilation along H, plain and depthwise
        let (h, w, k) = (9usize, 5usize, 3usize);
        for (group, dil, pad) in [(1usize, 1usize, 1usize), (1, 2, 2), (4, 1, 0), (4, 2, 1)] {
            let (c, m) = (4usize, 4usize);
            let cg = c / group;
            let x = seq(c * h * w, 7, 11, 0.25);
            let wt = seq(m * cg * k, 5, 13, 0.125);
            let ys = run(
                &node(
                    "Conv",
                    11,
                    vec![
                        ("group", AttrValue::Int(group as i64)),
                        ("pads", ints(&[pad as i64, 0, pad as i64, 0])),
                        ("dilations", ints(&[dil as i64, 1])),
                    ],
                    1,
                ),
                &[
                    Some(t32(&[1, c, h, w], x.clone())),
                    Some(t32(&[m, cg, k, 1], wt.clone())),
                ],
            )
            .unwrap();
            let oh = h + 2 * pad - dil * (k - 1);
            assert_eq!(ys[0].shape(), &[1, m, oh, w]);
            let mut want = vec![0f32; m * oh * w];
            for o in 0..m {
                let gi = o / (m / group);
                for i in 0..oh {
                    for j in 0..w {
                        let mut acc = 0f32;
                        for ci in 0..cg {
                            for t in 0..k {
                                let r = (i + t * dil) as isize - pad as isize;
                                if r >= 0 && (r as usize) < h {
                                    let xv = x[((gi * cg + ci) * h + r as usize) * w + j];
                                    acc += wt[(o * cg + ci) * k + t] * xv;
                                }
                            }
                        }
                        want[(o * oh + i) * w + j] = acc;
                    }
                }
            }
            close(&ys[0].to_f32_vec().unwrap(), &want, 1e-5);
        }
    }

    #[test]
    fn conv_pointwise() {
        let ys = run(
            &node("Conv", 11, vec![], 1),
            &[
                Some(t32(&[2, 5, 3, 4], seq(120, 7, 11, 0.25))),
                Some(t32(&[3, 5, 1, 1], seq(15, 5, 13, 0.125))),
                Some(t32(&[3], seq(3, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 3, 3, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.90625, 0.03125, -1.53125, 1.03125, 0.15625, -1.40625, 1.15625, 0.28125, 0.09375,
                0.9375, -1.65625, 0.90625, 2.65625, 0.09375, 1.65625, 2.53125, -0.03125, 1.53125,
                2.40625, -0.15625, 2.4375, 1.59375, 1.78125, 2.65625, 0.5, -2.125, -0.28125,
                0.53125, -2.09375, -0.25, 0.5625, -2.0625, 0.46875, -0.4375, -0.3125, 0.5,
                -1.40625, 1.15625, 0.28125, 0.09375, 0.9375, -1.65625, 0.90625, 0.03125, -1.53125,
                1.03125, 0.15625, -1.40625, 1.53125, 2.40625, -0.15625, 2.4375, 1.59375, 1.78125,
                2.65625, 0.09375, 1.65625, 2.53125, -0.03125, 1.53125, -0.25, 0.5625, -2.0625,
                0.46875, -0.4375, -0.3125, 0.5, -2.125, -0.28125, 0.53125, -2.09375, -0.25,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_1d() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("strides", ints(&[2])),
                    ("pads", ints(&[1, 1])),
                    ("dilations", ints(&[2])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 9], seq(18, 7, 11, 0.25))),
                Some(t32(&[3, 2, 3], seq(18, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 3, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.5, 0.28125, -0.8125, 0.28125, 0.8125, -1.0, 0.65625, 0.28125, -0.09375, 0.15625,
                -1.125, 0.28125,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_3d() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("pads", ints(&[1, 1, 1, 1, 1, 1])),
                    ("strides", ints(&[1, 2, 1])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 4, 5, 3], seq(120, 7, 11, 0.25))),
                Some(t32(&[2, 2, 2, 3, 2], seq(48, 5, 13, 0.125))),
                Some(t32(&[2], seq(2, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 5, 3, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.03125, 2.0, -2.5625, 0.6875, -0.375, 0.34375, 1.46875, 0.3125, -0.3125, -0.4375,
                -0.53125, -0.0625, 0.21875, -1.96875, -0.03125, 0.3125, 0.84375, 0.1875, -0.5625,
                -1.625, 0.71875, -2.84375, 1.0625, 2.1875, 0.90625, -0.0625, -1.21875, 0.84375,
                -1.125, 1.65625, -0.8125, -0.25, -1.6875, 1.4375, 0.1875, -1.4375, 1.59375,
                -2.96875, 1.71875, 0.34375, 0.34375, 3.46875, -2.4375, -0.9375, 1.0625, -0.8125,
                1.71875, 0.09375, -0.53125, -0.875, 0.46875, 0.0625, -0.0625, -1.375, -0.15625,
                1.5625, -0.84375, 0.59375, 2.1875, -2.15625, 0.90625, 2.9375, 1.125, 1.53125,
                0.65625, 0.5625, 2.15625, 1.40625, 2.5625, 2.15625, 0.9375, 1.28125, 2.21875,
                5.09375, -2.34375, 1.875, 2.34375, 1.9375, 4.09375, 0.75, 1.71875, 0.1875, 0.21875,
                1.75, 0.84375, -0.59375, 2.28125, 2.375, 0.53125, 0.25, 5.15625, -0.15625, 0.6875,
                1.34375, 1.71875, 2.5625, 2.90625, 2.3125, -1.34375, 1.84375, 1.125, 3.375, 0.375,
                0.3125, 1.375, 1.46875, 0.125, 3.03125, 3.0, -1.25, 2.40625, 2.25, 1.03125, 2.5625,
                1.75, 0.625, 1.59375, 0.84375, 3.125, 0.96875,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_valid() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("auto_pad", AttrValue::String(b"VALID".to_vec())),
                    ("strides", ints(&[2, 2])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 1, 6, 5], seq(30, 7, 11, 0.25))),
                Some(t32(&[2, 1, 3, 2], seq(12, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 2, 2]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                1.125, -0.3125, -1.9375, -0.625, 0.1875, -1.59375, 0.21875, 1.1875,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_transpose_strides_pads_outpad() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![
                    ("strides", ints(&[2, 3])),
                    ("pads", ints(&[1, 0, 0, 1])),
                    ("output_padding", ints(&[1, 2])),
                    ("dilations", ints(&[1, 2])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 3, 4], seq(24, 7, 11, 0.25))),
                Some(t32(&[2, 3, 3, 3], seq(54, 5, 13, 0.125))),
                Some(t32(&[3], seq(3, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 3, 7, 15]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.6875, 0.0, -0.875, -0.03125, 0.40625, 0.5, -0.40625, -0.59375, 0.5, 0.59375,
                -0.21875, -0.875, 0.0, 0.5, 0.0, 0.5, 0.0, -0.4375, 0.09375, -0.15625, 1.625,
                0.03125, -0.09375, -0.4375, 0.3125, 0.3125, -0.4375, 0.0, 0.03125, 0.0, -0.125,
                0.0, 0.5, -0.5, -0.5, 0.5, 0.5, -0.125, -0.875, -0.21875, 0.59375, 0.5, 0.0,
                -0.40625, 0.0, -0.09375, 0.0, 1.625, -0.15625, 0.09375, -0.4375, 0.125, 0.5,
                -0.4375, 0.40625, 0.21875, -0.4375, 0.0, -0.0625, 0.0, -0.59375, 0.0, 0.5, 0.40625,
                -0.03125, -0.875, -0.3125, 0.6875, 0.5, 0.6875, -0.3125, -0.875, 0.0, 0.40625, 0.0,
                -0.96875, 0.0, 0.125, 0.21875, -0.40625, -1.0625, -0.3125, 0.5, 0.5, 0.875,
                -0.3125, -0.6875, 0.0, 0.59375, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.71875, 1.5, 2.0, 2.1875, 0.4375, 1.09375, 1.9375,
                1.625, 1.21875, 0.65625, 2.125, 2.03125, 1.5, 0.5625, 1.5, 2.09375, 1.5, 1.5625,
                1.15625, 0.625, 1.46875, 0.5625, 1.375, 1.71875, 2.375, 2.46875, 1.625, 1.5,
                0.46875, 1.5, 2.125, 1.5, 1.125, 1.875, 1.75, 1.25, 0.59375, 2.25, 2.0625, 2.0625,
                0.6875, 1.15625, 1.5, 1.875, 1.5, 1.4375, 1.5, 1.53125, 0.84375, 1.21875, 1.78125,
                2.65625, 2.3125, 1.6875, 0.0, 0.3125, 1.59375, 1.5, 2.78125, 1.5, 1.8125, 1.5,
                1.28125, 0.53125, 2.375, 2.09375, 2.0, 0.8125, 1.1875, 0.71875, 2.0, 2.0, 1.5,
                0.4375, 1.5, 1.84375, 1.5, 0.90625, 2.375, 2.0, 1.90625, 1.1875, 0.625, 1.1875,
                1.71875, 2.0, 2.1875, 1.5, 0.625, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5,
                1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 0.09375, -0.5, -1.46875, -0.71875, -0.1875, -0.1875,
                -0.84375, -1.28125, 0.0625, 0.0625, -0.65625, -1.40625, -0.5, -0.03125, -0.5,
                -0.21875, -0.5, -1.15625, -0.46875, 0.75, -0.5625, -0.375, -0.65625, 0.375,
                -0.28125, -1.71875, -1.4375, -0.5, 0.65625, -0.5, -0.75, -0.5, -0.125, -0.875,
                -1.125, 0.125, 0.03125, -0.5, -1.34375, -0.78125, 0.125, -0.0625, -0.5, -0.96875,
                -0.5, -0.53125, -0.5, -0.84375, -0.4375, -0.75, 0.09375, -0.34375, -1.8125,
                -1.71875, -0.25, 0.5625, 0.9375, -0.5, -1.53125, -0.5, -0.90625, -0.5, 0.1875, 0.0,
                -0.34375, -1.28125, -0.8125, 0.28125, 0.0, 0.09375, -0.8125, -1.46875, -0.5,
                -0.1875, -0.5, -1.28125, -0.5, -0.1875, -0.1875, -0.71875, -1.46875, -0.8125,
                0.09375, 0.0, 0.28125, -0.8125, -1.28125, -0.5, 0.0, -0.5, -0.5, -0.5, -0.5, -0.5,
                -0.5, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_transpose_kernel_equal_to_stride_matches_naive() {
        // kernel == stride (each output pixel one tap, stored straight from the GEMM tile):
        // strides 2x2 (the paired store), 3x2 and 2x3, two groups, with and without bias,
        // and a plane large enough that the GEMM's tiles end inside an input row
        for (c, m, group, (h, w), (sh, sw), with_bias) in [
            (3, 4, 1, (5, 7), (2, 2), true),
            (4, 6, 2, (4, 5), (3, 2), true),
            (2, 3, 1, (3, 6), (2, 3), false),
            (2, 1, 1, (170, 210), (2, 2), true),
        ] {
            let (cg, mg) = (c / group, m / group);
            let x = seq(c * h * w, 7, 13, 0.25);
            let wt = seq(c * mg * sh * sw, 5, 11, 0.125);
            let b = seq(m, 3, 7, 0.5);
            let mut ins = vec![
                Some(t32(&[1, c, h, w], x.clone())),
                Some(t32(&[c, mg, sh, sw], wt.clone())),
            ];
            if with_bias {
                ins.push(Some(t32(&[m], b.clone())));
            }
            let n = node(
                "ConvTranspose",
                11,
                vec![
                    ("group", AttrValue::Int(group as i64)),
                    ("strides", ints(&[sh as i64, sw as i64])),
                    ("kernel_shape", ints(&[sh as i64, sw as i64])),
                ],
                1,
            );
            let ys = run(&n, &ins).unwrap();
            let (oh, ow) = (h * sh, w * sw);
            assert_eq!(ys[0].shape(), &[1, m, oh, ow]);
            let mut want = vec![0f32; m * oh * ow];
            for oc in 0..m {
                let (gi, ml) = (oc / mg, oc % mg);
                for oi in 0..oh {
                    for oj in 0..ow {
                        let (i, ki, j, kj) = (oi / sh, oi % sh, oj / sw, oj % sw);
                        let mut acc = if with_bias { b[oc] as f64 } else { 0.0 };
                        for ci in gi * cg..(gi + 1) * cg {
                            let wv = wt[((ci * mg + ml) * sh + ki) * sw + kj];
                            acc += x[(ci * h + i) * w + j] as f64 * wv as f64;
                        }
                        want[(oc * oh + oi) * ow + oj] = acc as f32;
                    }
                }
            }
            close(&ys[0].to_f32_vec().unwrap(), &want, 1e-5);
        }
    }

    #[test]
    fn conv_transpose_group2() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![("group", AttrValue::Int(2)), ("strides", ints(&[2, 2]))],
                1,
            ),
            &[
                Some(t32(&[2, 4, 3, 3], seq(72, 7, 11, 0.25))),
                Some(t32(&[4, 1, 2, 2], seq(16, 5, 13, 0.125))),
                Some(t32(&[2], seq(2, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 2, 6, 6]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.4375, 0.5, -0.21875, 0.0625, -0.34375, 0.3125, 0.21875, -0.875, -0.875, 0.21875,
                -0.25, -0.40625, 0.90625, -0.8125, -0.25, 0.125, -0.375, 0.375, 0.71875, 1.03125,
                -0.71875, 0.0625, -0.09375, -0.5625, 0.875, -0.75, -0.28125, 0.1875, -0.40625,
                0.4375, 0.875, 0.875, -0.5625, -0.09375, 0.0625, -0.71875, 1.3125, 1.78125, 0.9375,
                1.78125, 2.28125, 0.75, 1.03125, 1.5, 1.40625, 2.25, 2.46875, 0.9375, 1.21875,
                1.78125, 0.84375, 1.78125, 1.5, 1.78125, 1.125, 1.6875, 1.5, 2.4375, 0.84375,
                1.125, 1.125, 1.78125, 2.46875, 0.75, 1.40625, 1.78125, 1.21875, 1.875, 2.28125,
                0.5625, 0.9375, 1.3125, 0.90625, -0.8125, -0.25, 0.125, -0.375, 0.375, 0.71875,
                1.03125, -0.71875, 0.0625, -0.09375, -0.5625, 0.875, -0.75, -0.28125, 0.1875,
                -0.40625, 0.4375, 0.875, 0.875, -0.5625, -0.09375, 0.0625, -0.71875, 0.84375,
                -0.6875, -0.3125, 0.25, -0.4375, 0.5, 1.03125, 0.71875, -0.40625, -0.25, 0.21875,
                -0.875, 1.21875, 1.78125, 0.84375, 1.78125, 1.5, 1.78125, 1.125, 1.6875, 1.5,
                2.4375, 0.84375, 1.125, 1.125, 1.78125, 2.46875, 0.75, 1.40625, 1.78125, 1.21875,
                1.875, 2.28125, 0.5625, 0.9375, 1.3125, 1.03125, 1.78125, 2.375, 0.75, 1.3125,
                1.78125, 1.3125, 2.0625, 2.375, 0.75, 1.03125, 1.5,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_transpose_1d_output_shape() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![("strides", ints(&[2])), ("output_shape", ints(&[10]))],
                1,
            ),
            &[
                Some(t32(&[1, 2, 4], seq(8, 7, 11, 0.25))),
                Some(t32(&[2, 2, 3], seq(12, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 10]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.3125, 0.625, -0.34375, 0.3125, -1.15625, -0.6875, 0.4375, 0.375, 0.375, 0.0,
                0.4375, -0.875, 0.09375, 0.625, -1.03125, 0.75, 0.25, -0.84375, 0.375, 0.0,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_transpose_same_upper() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![
                    ("strides", ints(&[2, 2])),
                    ("auto_pad", AttrValue::String(b"SAME_UPPER".to_vec())),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 1, 3, 3], seq(9, 7, 11, 0.25))),
                Some(t32(&[1, 2, 3, 3], seq(18, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 6, 6]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.1875, -0.125, -0.09375, 0.3125, -1.03125, 0.0625, 0.0625, -0.25, 0.09375, 0.625,
                -0.65625, 0.125, 0.21875, -0.5625, 0.46875, 1.1875, -1.03125, 0.1875, 0.09375,
                -0.375, 0.25, 0.5, -0.5, 0.0, 0.28125, -0.8125, 0.78125, 0.9375, -0.71875, -0.0625,
                0.125, -0.5, 0.40625, 0.375, -0.34375, -0.125, -0.1875, 0.3125, 0.46875, -0.78125,
                0.09375, -0.15625, -0.3125, 0.1875, 0.65625, -0.46875, 0.46875, -0.09375, 0.09375,
                0.53125, -0.8125, -0.78125, 0.4375, -0.03125, -0.46875, 0.28125, 0.4375, -0.375,
                0.25, 0.0, 0.1875, 0.71875, -0.84375, -0.59375, 0.40625, 0.15625, -0.625, 0.375,
                0.21875, -0.28125, 0.03125, 0.09375,
            ],
            1e-5,
        );
    }

    #[test]
    fn max_pool_pairs_of_whole_rows_match_the_fold() {
        // 2x2 and 1x2 windows at stride 2 that tile the rows (the pair path, one pass per
        // plane; 20 wide: vectors and a tail) against the fold from -inf that every f32 path
        // without Indices computes (a NaN never replaces a number), NaNs among the values
        for (k, shape) in [([2usize, 2], [2usize, 3, 6, 20]), ([1, 2], [1, 2, 3, 36])] {
            let n: usize = shape.iter().product();
            let mut v = seq(n, 13, 17, 0.5);
            for i in (0..n).step_by(7) {
                v[i] = f32::NAN;
            }
            v[3] = f32::NEG_INFINITY;
            let ki: Vec<i64> = k.iter().map(|&d| d as i64).collect();
            let ys = run(
                &node(
                    "MaxPool",
                    12,
                    vec![("kernel_shape", ints(&ki)), ("strides", ints(&[2, 2]))],
                    1,
                ),
                &[Some(t32(&shape, v.clone()))],
            )
            .unwrap();
            let (h, w) = (shape[2], shape[3]);
            let (oh, ow) = ((h - k[0]) / 2 + 1, w / 2);
            assert_eq!(ys[0].shape(), &[shape[0], shape[1], oh, ow]);
            let mut want = Vec::new();
            for p in 0..shape[0] * shape[1] {
                for r in 0..oh {
                    for c in 0..ow {
                        let mut acc = f32::NEG_INFINITY;
                        for a in 0..k[0] {
                            for b in 0..2 {
                                let x = v[(p * h + 2 * r + a) * w + 2 * c + b];
                                if x > acc {
                                    acc = x;
                                }
                            }
                        }
                        want.push(acc.to_bits());
                    }
                }
            }
            let got: Vec<u32> = ys[0]
                .to_f32_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(got, want, "{k:?} {shape:?}");
        }
    }

    #[test]
    fn max_pool_pads_strides_indices() {
        let ys = run(
            &node(
                "MaxPool",
                12,
                vec![
                    ("kernel_shape", ints(&[3, 2])),
                    ("pads", ints(&[1, 1, 1, 0])),
                    ("strides", ints(&[2, 2])),
                ],
                2,
            ),
            &[Some(t32(&[1, 2, 5, 6], seq(60, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 3, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.5, 1.25, 1.0, 1.25, 0.75, 1.0, 0.75, 1.0, 0.5, -0.25, 1.0, 1.25, 1.0, 1.0, 1.25,
                1.0, 1.25, 0.75,
            ],
            1e-5,
        );
        assert_eq!(ys[1].shape(), &[1, 2, 3, 3]);
        assert_eq!(
            ys[1].to_i64_vec().unwrap(),
            vec![0, 1, 4, 12, 7, 15, 18, 26, 21, 30, 37, 34, 48, 37, 45, 48, 56, 51]
        );
    }

    #[test]
    fn max_pool_ceil_dilations_col_major() {
        let ys = run(
            &node(
                "MaxPool",
                12,
                vec![
                    ("kernel_shape", ints(&[2, 2])),
                    ("dilations", ints(&[2, 1])),
                    ("strides", ints(&[2, 2])),
                    ("ceil_mode", AttrValue::Int(1)),
                    ("storage_order", AttrValue::Int(1)),
                ],
                2,
            ),
            &[Some(t32(&[1, 1, 6, 7], seq(42, 7, 13, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 1, 3, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                1.0, 1.25, 1.5, 0.0, 1.25, 1.5, 1.5, 0.25, 1.25, 1.5, 0.0, 0.25,
            ],
            1e-5,
        );
        assert_eq!(ys[1].shape(), &[1, 1, 3, 4]);
        assert_eq!(
            ys[1].to_i64_vec().unwrap(),
            vec![6, 18, 30, 36, 10, 22, 26, 40, 10, 22, 28, 40]
        );
    }

    #[test]
    fn max_pool_uint8() {
        let ys = run(
            &node(
                "MaxPool",
                12,
                vec![
                    ("kernel_shape", ints(&[3, 3])),
                    ("pads", ints(&[1, 1, 1, 1])),
                ],
                1,
            ),
            &[Some(
                Tensor::from_vec(
                    &[1, 1, 4, 4],
                    Vec::<u8>::from([
                        11, 48, 85, 122, 159, 196, 233, 14, 51, 88, 125, 162, 199, 236, 17, 54,
                    ]),
                )
                .unwrap(),
            )],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 1, 4, 4]);
        assert_eq!(
            ys[0].to_i64_vec().unwrap(),
            vec![196, 233, 233, 233, 196, 233, 233, 233, 236, 236, 236, 233, 236, 236, 236, 162]
        );
    }

    #[test]
    fn max_pool_1d_same_lower() {
        let ys = run(
            &node(
                "MaxPool",
                12,
                vec![
                    ("kernel_shape", ints(&[4])),
                    ("auto_pad", AttrValue::String(b"SAME_LOWER".to_vec())),
                    ("strides", ints(&[3])),
                ],
                1,
            ),
            &[Some(t32(&[2, 1, 10], seq(20, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 1, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[1.25, 1.25, 1.0, 0.75, 0.5, 1.25, 1.0, 0.75],
            1e-5,
        );
    }

    #[test]
    fn avg_pool_pads_exclude() {
        let ys = run(
            &node(
                "AveragePool",
                19,
                vec![
                    ("kernel_shape", ints(&[3, 3])),
                    ("pads", ints(&[1, 2, 1, 0])),
                    ("strides", ints(&[2, 2])),
                ],
                1,
            ),
            &[Some(t32(&[1, 2, 5, 6], seq(60, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 3, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.75,
                0.083333336,
                -0.083333336,
                0.33333334,
                -0.055555556,
                -0.22222222,
                0.5,
                -0.041666668,
                -0.20833333,
                -0.5,
                -0.125,
                0.16666667,
                -0.33333334,
                -0.11111111,
                0.027777778,
                0.75,
                0.20833333,
                0.041666668,
            ],
            1e-5,
        );
    }

    #[test]
    fn avg_pool_include_pad_ceil() {
        let ys = run(
            &node(
                "AveragePool",
                19,
                vec![
                    ("kernel_shape", ints(&[3, 2])),
                    ("pads", ints(&[1, 1, 1, 1])),
                    ("strides", ints(&[2, 3])),
                    ("ceil_mode", AttrValue::Int(1)),
                    ("count_include_pad", AttrValue::Int(1)),
                ],
                1,
            ),
            &[Some(t32(&[1, 1, 6, 7], seq(42, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 1, 4, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.041666668,
                -0.20833333,
                0.083333336,
                0.083333336,
                -0.041666668,
                0.16666667,
                -0.041666668,
                0.16666667,
                0.375,
                0.0625,
                0.25,
                0.125,
            ],
            1e-5,
        );
    }

    #[test]
    fn avg_pool_3d_dilations() {
        let ys = run(
            &node(
                "AveragePool",
                19,
                vec![
                    ("kernel_shape", ints(&[2, 2, 2])),
                    ("dilations", ints(&[2, 1, 2])),
                    ("strides", ints(&[1, 2, 1])),
                    ("pads", ints(&[0, 1, 0, 1, 0, 1])),
                ],
                1,
            ),
            &[Some(t32(&[1, 1, 4, 4, 5], seq(80, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 1, 3, 2, 4]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.1875, 0.1875, -0.125, -0.125, 0.21875, -0.09375, -0.0625, -0.0625, -0.25, 0.125,
                -0.1875, 0.5, 0.15625, -0.15625, 0.21875, -0.125, -0.25, 0.125, -0.875, 0.5,
                -0.1875, 0.1875, -0.125, -0.125,
            ],
            1e-5,
        );
    }

    #[test]
    fn lp_pool_p3_pads() {
        let ys = run(
            &node(
                "LpPool",
                18,
                vec![
                    ("kernel_shape", ints(&[2, 3])),
                    ("p", AttrValue::Int(3)),
                    ("pads", ints(&[1, 1, 0, 1])),
                    ("strides", ints(&[1, 2])),
                ],
                1,
            ),
            &[Some(t32(&[1, 2, 4, 5], seq(40, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 4, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                1.2761172, 1.3371203, 1.1244854, 1.454662, 1.5643312, 1.5023112, 1.0772173,
                1.5227998, 1.3400271, 1.0772173, 1.5205505, 0.9564656, 1.2761172, 1.301207,
                1.2533245, 1.5182945, 1.6138288, 1.5023112, 1.5023112, 1.6138288, 1.5182945,
                1.3400271, 1.5361584, 1.454662,
            ],
            1e-5,
        );
    }

    #[test]
    fn global_pools_avg() {
        let ys = run(
            &node("GlobalAveragePool", 1, vec![], 1),
            &[Some(t32(&[2, 3, 3, 4], seq(72, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 3, 1, 1]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.041666668,
                0.104166664,
                0.020833334,
                -0.0625,
                0.083333336,
                0.0,
            ],
            1e-5,
        );
    }

    #[test]
    fn global_pools_max() {
        let ys = run(
            &node("GlobalMaxPool", 1, vec![], 1),
            &[Some(t32(&[2, 3, 3, 4], seq(72, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 3, 1, 1]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[1.25, 1.25, 1.25, 1.25, 1.25, 1.25],
            1e-5,
        );
    }

    #[test]
    fn global_pools_lp() {
        let ys = run(
            &node("GlobalLpPool", 2, vec![("p", AttrValue::Int(3))], 1),
            &[Some(t32(&[2, 3, 3, 4], seq(72, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[2, 3, 1, 1]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                1.9270598, 2.0788794, 1.9171916, 1.9533473, 2.002601, 1.9157736,
            ],
            1e-5,
        );
    }

    #[test]
    fn max_unpool_output_shape() {
        let ys = run(
            &node(
                "MaxUnpool",
                11,
                vec![("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))],
                1,
            ),
            &[
                Some(t32(&[1, 1, 2, 2], seq(4, 7, 11, 0.25))),
                Some(Tensor::from_vec(&[1, 1, 2, 2], Vec::<i64>::from([5, 2, 13, 15])).unwrap()),
                Some(Tensor::from_vec(&[4], Vec::<i64>::from([1, 1, 5, 5])).unwrap()),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 1, 5, 5]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.0, 0.0, 1.25, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                0.25, 0.0, -0.75, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_integer_per_channel_zp() {
        let ys = run(
            &node("ConvInteger", 10, vec![("pads", ints(&[1, 0, 1, 1]))], 1),
            &[
                Some(
                    Tensor::from_vec(
                        &[1, 2, 3, 4],
                        Vec::<u8>::from([
                            11, 48, 85, 122, 159, 196, 233, 14, 51, 88, 125, 162, 199, 236, 17, 54,
                            91, 128, 165, 202, 239, 20, 57, 94,
                        ]),
                    )
                    .unwrap(),
                ),
                Some(
                    Tensor::from_vec(
                        &[2, 2, 2, 2],
                        Vec::<u8>::from([
                            7, 60, 113, 166, 219, 16, 69, 122, 175, 228, 25, 78, 131, 184, 237, 34,
                        ]),
                    )
                    .unwrap(),
                ),
                Some(Tensor::from_vec(&[], Vec::<u8>::from([7])).unwrap()),
                Some(Tensor::from_vec(&[2], Vec::<u8>::from([100, 3])).unwrap()),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 4, 4]);
        assert_eq!(
            ys[0].to_i64_vec().unwrap(),
            vec![
                1844, -1198, 9328, 38, 16108, 36576, -11820, -11056, -22852, -15952, -6748, 21872,
                19184, -14906, -18532, -4062, 55190, 60648, 14138, 13528, 116864, 110044, 97592,
                71580, 163056, 142668, 124584, 49932, 57842, 51196, 77318, 37796
            ]
        );
    }
    /// Many column groups (so the packing splits between threads) on padded, strided 3x3
    /// patches: ConvInteger against the definition's sums, computed here directly.
    #[test]
    fn conv_integer_many_columns_is_the_definition() {
        let (c, h, w, m, k) = (3usize, 23usize, 19usize, 5usize, 3usize);
        let x: Vec<u8> = (0..c * h * w).map(|i| (i * 37 % 251) as u8).collect();
        let wt: Vec<i8> = (0..m * c * k * k)
            .map(|i| ((i * 53 % 255) as i32 - 127) as i8)
            .collect();
        let (xz, wz) = (9u8, [3i8, -2, 0, 7, -128]);
        let (pad, stride) = (1usize, 2usize);
        let (oh, ow) = (
            (h + 2 * pad - k) / stride + 1,
            (w + 2 * pad - k) / stride + 1,
        );
        let ys = run(
            &node(
                "ConvInteger",
                10,
                vec![("pads", ints(&[1, 1, 1, 1])), ("strides", ints(&[2, 2]))],
                1,
            ),
            &[
                Some(Tensor::from_vec(&[1, c, h, w], x.clone()).unwrap()),
                Some(Tensor::from_vec(&[m, c, k, k], wt.clone()).unwrap()),
                Some(Tensor::from_vec(&[], vec![xz]).unwrap()),
                Some(Tensor::from_vec(&[m], wz.to_vec()).unwrap()),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, m, oh, ow]);
        let got = ys[0].to_i64_vec().unwrap();
        for o in 0..m {
            for (yi, xi) in (0..oh).flat_map(|a| (0..ow).map(move |b| (a, b))) {
                let mut sum = 0i64;
                for ci in 0..c {
                    for (ky, kx) in (0..k).flat_map(|a| (0..k).map(move |b| (a, b))) {
                        let (iy, ix) = (
                            (yi * stride + ky) as isize - 1,
                            (xi * stride + kx) as isize - 1,
                        );
                        let xv = if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            xz as i64 // padding is the zero point
                        } else {
                            x[(ci * h + iy as usize) * w + ix as usize] as i64
                        };
                        let wv = wt[((o * c + ci) * k + ky) * k + kx] as i64;
                        sum += (xv - xz as i64) * (wv - wz[o] as i64);
                    }
                }
                assert_eq!(
                    got[(o * oh + yi) * ow + xi],
                    sum,
                    "channel {o} at ({yi}, {xi})"
                );
            }
        }
    }

    /// A depthwise QLinearConv (the centered-float path) over enough planes that its
    /// dequantization, sums and requantization split between threads, against the definition:
    /// integer sums, times x_scale * w_scale / y_scale in f32, rounded half to even, plus the
    /// zero point, saturated.
    #[test]
    fn qlinear_conv_depthwise_is_the_definition() {
        let (n, c, h, w) = (2usize, 12usize, 48usize, 48usize);
        let x: Vec<u8> = (0..n * c * h * w).map(|i| (i * 29 % 253) as u8).collect();
        let wt: Vec<i8> = (0..c * 9)
            .map(|i| ((i * 71 % 255) as i32 - 127) as i8)
            .collect();
        let (xs, xz, ws, ys, yz) = (0.02f32, 131u8, 0.003f32, 0.05f32, 120u8);
        let wscales: Vec<f32> = (0..c).map(|i| ws * (1.0 + i as f32 / 8.0)).collect();
        let s = |v: f32| Some(Tensor::from_vec(&[], vec![v]).unwrap());
        let ys_out = run(
            &node(
                "QLinearConv",
                10,
                vec![
                    ("group", AttrValue::Int(c as i64)),
                    ("pads", ints(&[1, 1, 1, 1])),
                ],
                1,
            ),
            &[
                Some(Tensor::from_vec(&[n, c, h, w], x.clone()).unwrap()),
                s(xs),
                Some(Tensor::from_vec(&[], vec![xz]).unwrap()),
                Some(Tensor::from_vec(&[c, 1, 3, 3], wt.clone()).unwrap()),
                Some(Tensor::from_vec(&[c], wscales.clone()).unwrap()),
                Some(Tensor::from_vec(&[c], vec![0i8; c]).unwrap()),
                s(ys),
                Some(Tensor::from_vec(&[], vec![yz]).unwrap()),
            ],
        )
        .unwrap();
        assert_eq!(ys_out[0].shape(), &[n, c, h, w]);
        let got = ys_out[0].to_i64_vec().unwrap();
        for (img, ch) in (0..n).flat_map(|a| (0..c).map(move |b| (a, b))) {
            let mult = xs * wscales[ch] / ys;
            for (yi, xi) in (0..h).flat_map(|a| (0..w).map(move |b| (a, b))) {
                let mut sum = 0i32;
                for (ky, kx) in (0..3).flat_map(|a| (0..3).map(move |b| (a, b))) {
                    let (iy, ix) = ((yi + ky) as isize - 1, (xi + kx) as isize - 1);
                    if iy >= 0 && ix >= 0 && iy < h as isize && ix < w as isize {
                        let xv = x[((img * c + ch) * h + iy as usize) * w + ix as usize];
                        sum += (xv as i32 - xz as i32) * wt[ch * 9 + ky * 3 + kx] as i32;
                    }
                }
                let q = ((sum as f32 * mult).round_ties_even() + yz as f32).clamp(0.0, 255.0);
                let at = ((img * c + ch) * h + yi) * w + xi;
                assert_eq!(
                    got[at], q as i64,
                    "image {img} channel {ch} at ({yi}, {xi})"
                );
            }
        }
    }

    #[test]
    fn conv_depthwise_stride3_dilation2() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![
                    ("group", AttrValue::Int(2)),
                    ("strides", ints(&[3, 2])),
                    ("dilations", ints(&[2, 3])),
                    ("pads", ints(&[2, 1, 0, 3])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 11, 10], seq(220, 7, 11, 0.25))),
                Some(t32(&[2, 1, 3, 2], seq(12, 5, 13, 0.125))),
                Some(t32(&[2], seq(2, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 3, 6]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.21875, -0.9375, 0.8125, 0.15625, -0.5625, 1.3125, 0.375, 0.90625, -0.875, -0.25,
                -0.25, 1.34375, -0.40625, 1.0, 0.25, -0.5, -0.40625, 1.1875, 1.59375, 1.25,
                0.53125, 1.875, 1.3125, 1.34375, 2.625, 1.1875, 2.15625, 2.4375, 0.96875, 1.09375,
                0.84375, 0.25, 2.25, 2.53125, 0.78125, 0.90625,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_channel_multiplier() {
        let ys = run(
            &node(
                "Conv",
                11,
                vec![("group", AttrValue::Int(2)), ("pads", ints(&[1, 1, 1, 1]))],
                1,
            ),
            &[
                Some(t32(&[1, 2, 4, 5], seq(40, 7, 11, 0.25))),
                Some(t32(&[4, 1, 3, 3], seq(36, 5, 13, 0.125))),
                Some(t32(&[4], seq(4, 3, 7, 0.5))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 4, 4, 5]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.625, -0.375, 0.84375, -0.6875, -0.375, -0.0625, -1.1875, 1.59375, -0.09375,
                -0.59375, 2.0, -1.375, 0.375, 1.4375, -0.71875, 1.0, -0.875, -0.5625, 0.78125,
                -0.5, 1.5, 1.28125, 2.53125, 1.03125, 1.0, 1.25, 1.40625, 1.1875, 0.96875, 0.8125,
                1.0625, 1.6875, 0.4375, 2.96875, 2.09375, 0.8125, 2.375, 1.09375, 0.84375, 2.625,
                -2.125, 0.9375, -1.21875, -0.96875, -0.25, -0.875, -0.59375, 1.0, -1.53125,
                0.21875, 1.28125, -1.5625, -0.3125, -0.78125, 0.0625, -0.90625, -1.125, 0.375, 0.5,
                -0.46875, 2.25, -0.75, 2.03125, 0.6875, 0.5625, 1.96875, -0.1875, 0.46875, 1.46875,
                -0.4375, 1.0625, 1.375, -0.375, 2.6875, -0.4375, 1.125, 2.4375, -0.5, 1.71875,
                0.4375,
            ],
            1e-5,
        );
    }

    #[test]
    fn max_pool_ceil_dilated_rows() {
        let ys = run(
            &node(
                "MaxPool",
                12,
                vec![
                    ("kernel_shape", ints(&[3, 2])),
                    ("strides", ints(&[2, 3])),
                    ("dilations", ints(&[1, 2])),
                    ("pads", ints(&[1, 0, 1, 1])),
                    ("ceil_mode", AttrValue::Int(1)),
                ],
                1,
            ),
            &[Some(t32(&[1, 2, 7, 9], seq(126, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 4, 3]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.25, 1.25, 1.0, 0.75, 1.25, 1.0, 1.25, 1.0, 0.75, 1.25, 1.0, 0.75, 0.5, 0.25,
                1.25, 1.0, 0.75, 1.25, 1.0, 1.25, 1.0, 0.75, 1.25, 1.0,
            ],
            1e-5,
        );
    }

    #[test]
    fn avg_pool_1d_stride_ceil() {
        let ys = run(
            &node(
                "AveragePool",
                19,
                vec![
                    ("kernel_shape", ints(&[3])),
                    ("strides", ints(&[2])),
                    ("pads", ints(&[1, 1])),
                    ("ceil_mode", AttrValue::Int(1)),
                ],
                1,
            ),
            &[Some(t32(&[1, 2, 8], seq(16, 7, 11, 0.25)))],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 5]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.375,
                0.25,
                0.083333336,
                -0.083333336,
                0.75,
                -0.75,
                -0.41666666,
                0.33333334,
                0.16666667,
                1.0,
            ],
            1e-5,
        );
    }
    #[test]
    fn conv_multi_tile_im2col() {
        let ys = run(
            &node("Conv", 11, vec![("pads", ints(&[1, 1, 1, 1]))], 1),
            &[
                Some(t32(&[1, 16, 40, 45], seq(28800, 7, 11, 0.25))),
                Some(t32(&[3, 16, 3, 3], seq(432, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 3, 40, 45]);
        let y = ys[0].to_f32_vec().unwrap();
        let sum: f64 = y.iter().map(|&v| v as f64).sum();
        let sq: f64 = y.iter().map(|&v| (v as f64) * (v as f64)).sum();
        assert!((sum - -6.5).abs() < 1e-3 * (1.0 + 6.5), "sum {sum}");
        assert!(
            (sq - 95075.96484375).abs() < 1e-4 * 95075.96484375,
            "sq {sq}"
        );
        let at = [
            0, 1, 44, 45, 909, 910, 911, 1799, 1800, 2709, 2710, 3600, 5399,
        ];
        let want = [
            -1.46875, 2.46875, -2.03125, -0.28125, -1.96875, -1.59375, 1.1875, -0.4375, -0.09375,
            1.1875, 0.9375, 2.09375, 2.8125,
        ];
        for (i, w) in at.iter().zip(want) {
            assert!(
                (y[*i] - w).abs() < 1e-4 * (1.0 + w.abs()),
                "at {i}: {} vs {w}",
                y[*i]
            );
        }
    }

    #[test]
    fn conv_multi_tile_pointwise() {
        let ys = run(
            &node("Conv", 11, vec![], 1),
            &[
                Some(t32(&[1, 200, 30, 30], seq(180000, 7, 11, 0.25))),
                Some(t32(&[5, 200, 1, 1], seq(1000, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 5, 30, 30]);
        let y = ys[0].to_f32_vec().unwrap();
        let sum: f64 = y.iter().map(|&v| v as f64).sum();
        let sq: f64 = y.iter().map(|&v| (v as f64) * (v as f64)).sum();
        assert!((sum - 1.40625).abs() < 1e-3 * (1.0 + 1.40625), "sum {sum}");
        assert!(
            (sq - 9039.2900390625).abs() < 1e-4 * 9039.2900390625,
            "sq {sq}"
        );
        let at = [0, 654, 655, 656, 899, 1309, 1310, 4499];
        let want = [
            -0.375, -1.65625, -0.46875, 2.09375, 0.53125, -0.53125, -1.03125, 0.34375,
        ];
        for (i, w) in at.iter().zip(want) {
            assert!(
                (y[*i] - w).abs() < 1e-4 * (1.0 + w.abs()),
                "at {i}: {} vs {w}",
                y[*i]
            );
        }
    }

    #[test]
    fn conv_transpose_multi_tile() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![("strides", ints(&[2, 2])), ("pads", ints(&[1, 1, 0, 0]))],
                1,
            ),
            &[
                Some(t32(&[1, 8, 40, 45], seq(14400, 7, 11, 0.25))),
                Some(t32(&[8, 16, 3, 3], seq(1152, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 16, 80, 90]);
        let y = ys[0].to_f32_vec().unwrap();
        let sum: f64 = y.iter().map(|&v| v as f64).sum();
        let sq: f64 = y.iter().map(|&v| (v as f64) * (v as f64)).sum();
        assert!((sum - -3.09375).abs() < 1e-3 * (1.0 + 3.09375), "sum {sum}");
        assert!(
            (sq - 240007.2548828125).abs() < 1e-4 * 240007.2548828125,
            "sq {sq}"
        );
        let at = [0, 1, 90, 91, 1819, 1820, 1821, 3640, 7000, 20000];
        let want = [
            0.78125, -0.15625, -0.25, -2.21875, 0.375, -1.5625, -0.03125, -0.46875, 0.34375, 0.875,
        ];
        for (i, w) in at.iter().zip(want) {
            assert!(
                (y[*i] - w).abs() < 1e-4 * (1.0 + w.abs()),
                "at {i}: {} vs {w}",
                y[*i]
            );
        }
    }
    #[test]
    fn conv_transpose_output_shape_beyond_natural() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![("strides", ints(&[2, 2])), ("output_shape", ints(&[8, 7]))],
                1,
            ),
            &[
                Some(t32(&[1, 1, 3, 3], seq(9, 7, 11, 0.25))),
                Some(t32(&[1, 2, 3, 3], seq(18, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 2, 8, 7]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                0.1875, -0.125, -0.09375, 0.3125, -1.03125, 0.0625, -0.1875, 0.0625, -0.25,
                0.09375, 0.625, -0.65625, 0.125, -0.125, 0.21875, -0.5625, 0.46875, 1.1875,
                -1.03125, 0.1875, -0.0625, 0.09375, -0.375, 0.25, 0.5, -0.5, 0.0, 0.0, 0.28125,
                -0.8125, 0.78125, 0.9375, -0.71875, -0.0625, 0.1875, 0.125, -0.5, 0.40625, 0.375,
                -0.34375, -0.125, 0.125, -0.125, -0.75, 0.34375, 0.5625, -0.21875, -0.1875, 0.0625,
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.1875, 0.3125, 0.46875, -0.78125, 0.09375,
                -0.15625, 0.0, -0.3125, 0.1875, 0.65625, -0.46875, 0.46875, -0.09375, 0.0625,
                0.09375, 0.53125, -0.8125, -0.78125, 0.4375, -0.03125, 0.125, -0.46875, 0.28125,
                0.4375, -0.375, 0.25, 0.0, 0.0, 0.1875, 0.71875, -0.84375, -0.59375, 0.40625,
                0.15625, 0.0, -0.625, 0.375, 0.21875, -0.28125, 0.03125, 0.09375, -0.0625, 0.75,
                0.125, -1.0625, -0.09375, 0.5625, 0.03125, -0.125, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                0.0,
            ],
            1e-5,
        );
    }

    #[test]
    fn conv_transpose_3d_dilated() {
        let ys = run(
            &node(
                "ConvTranspose",
                11,
                vec![
                    ("strides", ints(&[1, 2, 2])),
                    ("dilations", ints(&[2, 1, 1])),
                    ("pads", ints(&[1, 0, 1, 0, 1, 0])),
                ],
                1,
            ),
            &[
                Some(t32(&[1, 2, 3, 2, 3], seq(36, 7, 11, 0.25))),
                Some(t32(&[2, 1, 2, 3, 2], seq(24, 5, 13, 0.125))),
            ],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 1, 4, 4, 5]);
        close(
            &ys[0].to_f32_vec().unwrap(),
            &[
                -0.34375, -0.75, 0.46875, 0.71875, -0.4375, -0.0625, -0.75, 0.46875, 0.4375,
                -0.71875, 0.3125, -0.34375, -0.25, 0.40625, 0.21875, 0.15625, -0.625, 0.6875,
                0.5625, -0.5, 0.125, -0.59375, 1.4375, 1.25, -0.34375, -0.34375, -1.0, 1.4375,
                -0.3125, 0.125, -1.28125, 0.5625, -0.375, -1.15625, 1.21875, -0.15625, -0.3125,
                -0.4375, 1.75, -0.375, -0.71875, 0.46875, 0.46875, -0.53125, -0.0625, -0.4375,
                -0.75, 0.46875, 0.8125, -0.34375, -1.09375, -0.1875, 0.71875, 0.09375, -0.90625,
                -0.46875, -0.875, 0.4375, 0.6875, -0.375, 0.90625, 0.65625, 0.03125, -0.34375,
                -0.5, 0.53125, -1.0, 0.40625, 0.5625, -0.40625, 0.84375, -1.25, 0.9375, 0.40625,
                -1.03125, 0.5, 0.9375, -0.3125, 0.4375, -0.4375,
            ],
            1e-5,
        );
    }
}

#[cfg(test)]
mod im2col_tests {
    use super::*;
    use crate::kernels::test_util::ThreadedCpu;

    #[test]
    fn packed_patches_are_im2col_then_the_packer() {
        // 1-, 2- and 3-D, strides, dilations, pads on every side (wider than the kernel too),
        // output rows narrower and wider than a column group, K not a whole number of quads
        // input, kernel, strides, dilations, pads at the start and at the end
        type Case<'a> = (
            &'a [usize],
            &'a [usize],
            &'a [usize],
            &'a [usize],
            &'a [isize],
            &'a [isize],
        );
        let cases: [Case<'_>; 10] = [
            (&[76, 32], &[1, 3], &[1, 1], &[1, 1], &[0, 1], &[0, 1]),
            // pads at the end only, and strides that leave the input's last columns unread
            (&[6, 11], &[2, 3], &[2, 4], &[1, 1], &[0, 0], &[1, 2]),
            (&[6, 13], &[2, 3], &[2, 4], &[1, 1], &[0, 0], &[0, 0]),
            (&[76, 32], &[3, 1], &[1, 1], &[1, 1], &[0, 0], &[0, 0]),
            (&[23, 29], &[3, 3], &[2, 2], &[1, 1], &[1, 1], &[1, 1]),
            (&[9, 40], &[3, 5], &[1, 3], &[2, 1], &[2, 3], &[1, 4]),
            (&[7, 7], &[5, 5], &[1, 1], &[1, 1], &[6, 6], &[6, 6]),
            (&[50], &[7], &[2], &[1], &[3], &[2]),
            (&[5, 3], &[1, 1], &[1, 1], &[1, 1], &[0, 0], &[0, 0]),
            (
                &[4, 5, 6],
                &[2, 3, 2],
                &[1, 2, 1],
                &[1, 1, 2],
                &[1, 0, 1],
                &[0, 1, 2],
            ),
        ];
        for (inp, k, s, d, pb, pe) in cases {
            let c = 3;
            let out: Vec<usize> = (0..inp.len())
                .map(|i| {
                    let span = (d[i] * (k[i] - 1) + 1) as isize;
                    ((inp[i] as isize + pb[i] + pe[i] - span) / s[i] as isize + 1) as usize
                })
                .collect();
            let g = Geom {
                inp: inp.to_vec(),
                out: out.clone(),
                k: k.to_vec(),
                s: s.to_vec(),
                d: d.to_vec(),
                pb: pb.to_vec(),
            };
            let plane: usize = inp.iter().product();
            let x: Vec<u8> = (0..c * plane).map(|i| (i * 7 % 251) as u8).collect();
            let ncols: usize = out.iter().product();
            let rows = c * k.iter().product::<usize>();
            let mut col = alloc::vec![0u8; rows * ncols];
            im2col(&ThreadedCpu, &x, &g, 0, ncols, &mut col, 9);
            for (lanes, flip) in [(4, 0), (8, 0x80), (16, 0x80)] {
                let qg = crate::simd::QGeom {
                    lanes,
                    pairs: false,
                    k: rows,
                    n: ncols,
                };
                let mut want = alloc::vec![0u8; qg.packed_len()];
                let mut want_sums = alloc::vec![0i32; ncols];
                crate::simd::qcols_pack(&qg, &col, ncols, flip, &mut want, Some(&mut want_sums));
                // on 2 threads (the split by column groups) and on one
                for cpu in [
                    &ThreadedCpu as &dyn CpuBackend,
                    &crate::provider::ReferenceCpu,
                ] {
                    let mut got = alloc::vec![1u8; qg.packed_len()];
                    let mut sums = alloc::vec![-1i32; ncols];
                    qconv::patches_pack_par(cpu, &g, &x, &qg, (flip, 9), &mut got, Some(&mut sums));
                    let what = alloc::format!(
                        "{inp:?} k {k:?} s {s:?} d {d:?} pads {pb:?} {pe:?}, {lanes} lanes"
                    );
                    assert_eq!(got, want, "{what}");
                    assert_eq!(sums, want_sums, "{what}");
                }
            }
        }
    }
}
