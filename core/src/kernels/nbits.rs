//! `com.microsoft:MatMulNBits`: `Y = A · dequant(B)ᵀ (+ bias)` with B's N columns of K weights
//! stored as blocks of 2-, 4- or 8-bit codes (float32 A).
//!
//! B is `(N, blocks, block_size * bits / 8)` bytes, codes packed low bits first; `scales` is
//! `(N, blocks)`; `zero_points` either packed codes (uint8, `ceil(blocks * bits / 8)` bytes a
//! column) or floats `(N, blocks)`, `2^(bits - 1)` when absent; `g_idx` (int32, K) names the
//! block of each row of B in place of `k / block_size`. A weight is `(code - zp) * scale`.
//!
//! `accuracy_level` 4 (the int4 models onnxruntime-genai builds) follows ONNX Runtime's CPU
//! kernel: each block of an A row is quantized to int8 before the product (see
//! `simd::nbits`). Its tokens differ from float activations within a few dozen steps, so this
//! is the product's definition here, not a speed option. With `g_idx` or float zero points,
//! and at other levels, A stays float.
//!
//! Few rows (a decode step) take the SIMD layer's direct kernel, which reads the packed codes;
//! more rows dequantize B a panel of columns at a time and use the SGEMM (with A replaced by
//! its int8 values times their scales where it is quantized: the same sums, rounded
//! differently only in the last bits).

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use super::par::SyncPtr;
use super::{def_in, opt_tensor_in, out1, tensor_in};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::simd::{Gemm, NBits, Operand, Q4Packed, W8Packed};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::weight_cache::DenseSlot;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def_in("com.microsoft", "MatMulNBits", 1, 1, build).types(&[DataType::Float]),
    def_in(
        crate::kernels::nn::nchwc::DOMAIN,
        "GatherMatMulNBits",
        1,
        1,
        build_gather,
    )
    .types(&[DataType::Float]),
];

/// `nxrt:GatherMatMulNBits(X, B, scales, zero_points, experts)`: `MatMul(X, W[experts])` where
/// `W` is `E` MatMulNBits weights stacked along a leading axis (B `[E, N, blocks, blob]`,
/// scales `[E, N, blocks]`, zero points `[E, N * blocks]`) and `experts` indexes them (what
/// `fuse::quant` makes of a mixture of experts' gathered weights). Batch axes broadcast as
/// MatMul's: `X [..., M, K]` against `experts`' shape; each product reads one expert's codes.
struct GatherNBits {
    inner: Box<dyn Kernel>,
    k: usize,
    n: usize,
    bits: usize,
    bs: usize,
    accuracy: i64,
    /// Each expert's weights packed at load (see [`W8Packed`]), with the stacked tensors'
    /// keys.
    w8: Option<(Vec<W8Weights>, Keys)>,
}

/// The data address and length of B, the scales and the zero points (see [`key_of`]).
type Keys = [(usize, usize); 3];

fn build_gather(node: &Node) -> Result<Box<dyn Kernel>> {
    let inner = build(node)?;
    Ok(Box::new(GatherNBits {
        inner,
        k: node.get_i("K", 0)? as usize,
        n: node.get_i("N", 0)? as usize,
        bits: node.get_i("bits", 4)? as usize,
        bs: node.get_i("block_size", 0)? as usize,
        accuracy: node.get_i("accuracy_level", 0)?,
        w8: None,
    }))
}

impl GatherNBits {
    /// Packs every expert's constant weights, or nothing where one does not fit.
    fn pack(&self, (b, s, z): (&Tensor, &Tensor, &Tensor)) -> Option<Vec<W8Weights>> {
        if self.accuracy == 4 && z.dtype() == DataType::Uint8 {
            return None;
        }
        let e = *b.shape().first()?;
        if s.shape().first() != Some(&e) || z.shape().first() != Some(&e) {
            return None;
        }
        let g = float_geom(self.k, self.bs, self.bits);
        (0..e)
            .map(|ei| {
                let be = b.slice_axis(0, ei, 1, 1).ok()?;
                let se = s.slice_axis(0, ei, 1, 1).ok()?;
                let ze = z.slice_axis(0, ei, 1, 1).ok()?;
                let mut w = w8_prepare(&g, self.n, (&be, &se, Some(&ze)))?;
                w.keys = [(0, 0); 3];
                // every row count takes the int8 product here: no dequantizing path
                w.zps = None;
                Some(w)
            })
            .collect()
    }
}

impl Kernel for GatherNBits {
    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        let c = |i: usize| consts.get(i).copied().flatten();
        let (Some(b), Some(s), Some(z)) = (c(1), c(2), c(3)) else {
            return 0;
        };
        let Some(keys) = keys_of(b, s, Some(z)) else {
            return 0;
        };
        let Some(packs) = self.pack((b, s, z)) else {
            return 0;
        };
        let bytes = packs.iter().map(|w| w.packed.bytes()).sum();
        self.w8 = Some((packs, keys));
        bytes
    }

    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (k, n) = (self.k, self.n);
        let x = tensor_in(inputs, 0)?;
        let (b, s, z) = (
            tensor_in(inputs, 1)?,
            tensor_in(inputs, 2)?,
            tensor_in(inputs, 3)?,
        );
        let idx = tensor_in(inputs, 4)?;
        let e = b.shape().first().copied().unwrap_or(0);
        if x.rank() < 2 || x.shape()[x.rank() - 1] != k || s.shape().first() != Some(&e) {
            bail!(
                "GatherMatMulNBits: X {:?}, B {:?} and scales {:?} do not fit K {k}",
                x.shape(),
                b.shape(),
                s.shape()
            );
        }
        let m = x.shape()[x.rank() - 2];
        let xb = &x.shape()[..x.rank() - 2];
        let batch = crate::kernels::broadcast_shapes(xb, idx.shape())?;
        let experts = idx.to_i64_vec()?;
        let xv = x.as_slice::<f32>()?;
        let nb: usize = batch.iter().product();
        // the flat index into a [.., d, ..] operand broadcast to `batch`
        let flat = |shape: &[usize], bi: usize| -> usize {
            let mut rem = bi;
            let mut at = 0;
            let mut stride = 1;
            let off = batch.len() - shape.len();
            for ax in (0..batch.len()).rev() {
                let c = rem % batch[ax];
                rem /= batch[ax];
                if ax >= off {
                    let d = shape[ax - off];
                    if d != 1 {
                        at += c * stride;
                    }
                    stride *= d;
                }
            }
            at
        };
        let packs = self.w8.as_ref().and_then(|(p, keys)| {
            (keys_of(b, s, Some(z)) == Some(*keys) && p.len() == e).then_some(p)
        });
        let mut y = vec![0f32; nb * m * n];
        // each product's expert and rows of X, checked before any is computed
        let mut jobs = Vec::with_capacity(nb);
        for bi in 0..nb {
            let ei = experts[flat(idx.shape(), bi)];
            let ei = if ei < 0 { ei + e as i64 } else { ei };
            if !(0..e as i64).contains(&ei) {
                bail!("GatherMatMulNBits: expert index {ei} outside 0..{e}");
            }
            jobs.push((ei as usize, bi, flat(xb, bi)));
        }
        // the products of one expert as one product of all their rows (the tokens routed to
        // an expert read its weights once); the float path below takes what is left
        let mut left = Vec::new();
        if let (Some(p), true) = (packs, m > 0) {
            jobs.sort_by_key(|j| j.0);
            for run in jobs.chunk_by(|a, b| a.0 == b.0) {
                let w = &p[run[0].0];
                let rows = run.len() * m;
                let done = if run.len() == 1 {
                    let (_, bi, xi) = run[0];
                    let (xr, yr) = (
                        &xv[xi * m * k..(xi + 1) * m * k],
                        &mut y[bi * m * n..(bi + 1) * m * n],
                    );
                    w8_any(cx, w, (xr, m, k), yr)
                } else {
                    let mut a = crate::simd::scratch::<f32>(rows * k);
                    for (dst, &(_, _, xi)) in a.chunks_exact_mut(m * k).zip(run) {
                        dst.copy_from_slice(&xv[xi * m * k..(xi + 1) * m * k]);
                    }
                    let mut out = crate::simd::scratch::<f32>(rows * n);
                    let ok = w8_any(cx, w, (&a, rows, k), &mut out);
                    if ok {
                        for (src, &(_, bi, _)) in out.chunks_exact(m * n).zip(run) {
                            y[bi * m * n..(bi + 1) * m * n].copy_from_slice(src);
                        }
                    }
                    ok
                };
                if !done {
                    left.extend_from_slice(run);
                }
            }
        } else {
            left = jobs;
        }
        for (ei, bi, xi) in left {
            let a = Tensor::from_vec(&[m, k], xv[xi * m * k..(xi + 1) * m * k].to_vec())?;
            let be = b.slice_axis(0, ei, 1, 1)?;
            let se = s.slice_axis(0, ei, 1, 1)?;
            let ze = z.slice_axis(0, ei, 1, 1)?;
            let args = [a, be, se, ze].map(Value::Tensor);
            let refs: Vec<Option<&Value>> = args.iter().map(Some).collect();
            let out = self.inner.compute(cx, &refs)?;
            let Some(Value::Tensor(t)) = out.first() else {
                bail!("GatherMatMulNBits: no product");
            };
            y[bi * m * n..(bi + 1) * m * n].copy_from_slice(&t.as_slice::<f32>()?);
        }
        let mut shape = batch;
        shape.extend([m, n]);
        out1(Tensor::from_vec(&shape, y)?)
    }
}

/// Rows of A up to which the direct kernel runs (more take the dequantize + SGEMM path).
const DIRECT_ROWS: usize = 8;
/// Rows of A up to which float activations take the int8 weights (`w8_product`): its work
/// grows with every row, while the dequantize + SGEMM path unpacks B once for all rows. On
/// AVX2 (Zen 3, 1 thread) they cross between 12 and 16 rows for K x N of 1536 x 384,
/// 384 x 1536 and 4096 x 4096 (at 32 rows the SGEMM path takes 0.7-0.8 of the time).
const W8_ROWS: usize = 12;
/// The layouts of the dense copies the weight cache keeps for these kernels: the SGEMM's B
/// panels (int8 weights), and rows of B's columns, K floats each in the SIMD layer's order
/// within groups or in plain order.
const LAYOUT_W8_PANELS: u32 = 1;
const LAYOUT_COLUMNS_SIMD: u32 = 2;
const LAYOUT_COLUMNS: u32 = 3;
/// Columns a task of the direct kernel computes.
const PANEL_COLS: usize = 64;
/// Columns a task of the dequantizing path unpacks and multiplies at a time.
const GEMM_PANEL_COLS: usize = 128;
/// Columns a task of [`w8_gemm`] dequantizes and multiplies (rounded up to whole SGEMM
/// panels).
const W8_GEMM_COLS: usize = 64;

struct MatMulNBits {
    k: usize,
    n: usize,
    bits: usize,
    bs: usize,
    accuracy: i64,
    /// The vector type the SIMD kernels run on for this block geometry (chosen at load).
    isa: crate::simd::Isa,
    /// Constant 4-bit weights repacked at load for the int8 path (`accuracy_level` 4).
    q4: Option<Q4Weights>,
    /// Constant weights repacked at load as int8 for float activations (see `W8Packed`).
    w8: Option<W8Weights>,
    /// The keys of constant B, scales and zero points, seen at load (see [`key_of`]): the float
    /// path keeps a dense copy of them in `dense` only for calls given these very tensors.
    consts: Option<Keys>,
    /// Where the session's weight cache keeps the float path's dense copy.
    dense: Arc<DenseSlot>,
}

/// [`W8Packed`] weights, the vector type they were packed for and the tensors they came from
/// (as [`Q4Weights`]).
struct W8Weights {
    isa: crate::simd::Isa,
    packed: W8Packed,
    keys: [(usize, usize); 3],
    /// The zero points decoded (as [`zero_points`]) for the rows past [`W8_ROWS`], which
    /// dequantize the same tensors on every call.
    zps: Option<(Vec<f32>, bool)>,
    /// Where the session's weight cache keeps these weights dequantized into the SGEMM's
    /// panels (the cached dense arm, see [`crate::weight_cache`]).
    dense: Arc<DenseSlot>,
}

/// Packs constant weights for [`w8_product`], or `None` where they do not fit int8.
fn w8_prepare(
    g: &NBits,
    n: usize,
    (b, scales, zp): (&Tensor, &Tensor, Option<&Tensor>),
) -> Option<W8Weights> {
    let keys = keys_of(b, scales, zp)?;
    let blocks = g.blocks();
    let (bv, sv) = (b.as_slice::<u8>().ok()?, scales.as_slice::<f32>().ok()?);
    if bv.len() != n * blocks * g.blob() || sv.len() != n * blocks {
        return None;
    }
    let zps = zero_points(zp, n, blocks, g.bits).ok()?;
    let (isa, lanes) = crate::simd::q4_isa();
    let packed = crate::simd::w8_pack(lanes, g, &bv, &sv, zps.as_ref().map(|z| z.0.as_slice()), n)?;
    Some(W8Weights {
        isa,
        packed,
        keys,
        zps,
        dense: DenseSlot::new(),
    })
}

/// `Y = A · Bᵀ` for `m` rows of A through the int8 weights (activations split into int16
/// parts), column groups in parallel; false (nothing written) where A holds values the split
/// does not take (NaN, infinities, tiny maxima), which the float paths then compute.
fn w8_product(
    cx: &KernelCx<'_>,
    w: &W8Weights,
    (a, m, k): (&[f32], usize, usize),
    y: &mut [f32],
) -> bool {
    let p = &w.packed;
    let x = crate::simd::x16_rows(a, m, k, p.kp, p.sub);
    if !x.exact {
        return false;
    }
    let geom = (p.groups(), p.lanes, p.n, m);
    by_groups(cx, geom, m * p.n * k * 2, y, &|g, out, ld| {
        crate::simd::w8_rows_on(w.isa, p, &x, g, out, ld)
    });
    true
}

/// The SGEMM's panel width and whether [`w8_gemm`] takes these weights with `k` columns of A
/// (this machine's SGEMM panels must hold whole groups of the packed lanes).
fn w8_gemm_fits(w: &W8Weights, k: usize) -> Option<usize> {
    let nr = crate::simd::gemm_tile().1;
    (nr.is_multiple_of(w.packed.lanes) && k <= w.packed.kp).then_some(nr)
}

/// Columns of one task of [`w8_gemm`] and [`w8_dense_fill`]: [`W8_GEMM_COLS`] rounded up to
/// whole panels of `nr`.
fn w8_task_cols(nr: usize) -> usize {
    W8_GEMM_COLS.div_ceil(nr) * nr
}

/// Floats of every column's panels of `k` rows (the dense copy [`w8_gemm`] reads).
fn w8_dense_len(w: &W8Weights, k: usize, nr: usize) -> usize {
    w.packed.n.div_ceil(nr) * k * nr
}

/// Dequantizes every column of the int8 weights into the SGEMM's B panels of `k` rows, in
/// parallel: the dense copy the cached arm keeps ([`w8_dense_len`] floats).
fn w8_dense_fill(cx: &KernelCx<'_>, w: &W8Weights, k: usize, nr: usize, out: &mut [f32]) {
    let n = w.packed.n;
    let panel = w8_task_cols(nr);
    let op = SyncPtr(out.as_mut_ptr());
    let total = out.len();
    cx.cpu
        .parallel_for_work(n.div_ceil(panel), n * k * 2, &|t| {
            let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
            let (at, len) = (j0 / nr * k * nr, (j1 - j0).div_ceil(nr) * k * nr);
            assert!(at + len <= total, "w8_dense_fill: panels fit the copy");
            // SAFETY: each task writes its own columns' panels, disjoint ranges of `out`
            let dst = unsafe { core::slice::from_raw_parts_mut(op.get().add(at), len) };
            crate::simd::w8_panels_on(w.isa, &w.packed, k, (j0, j1 - j0), nr, dst);
        });
}

/// `Y = A · Bᵀ` for many rows of A (a prompt, an encoder's tokens): the int8 weights
/// dequantized a task's panel of columns at a time straight into the SGEMM's B panels (where
/// they are still in cache when the SGEMM reads them), or read from `dense` (every column's
/// panels, dequantized once: the cached arm), A packed once for every task; false (nothing
/// written) where this machine's SGEMM panels do not hold whole groups of the packed lanes.
/// Both arms hand the SGEMM the same panels: their answers are the same bits.
fn w8_gemm(
    cx: &KernelCx<'_>,
    w: &W8Weights,
    dense: Option<&[f32]>,
    (a, m, k): (&[f32], usize, usize),
    y: &mut [f32],
) -> bool {
    let p = &w.packed;
    let n = p.n;
    let Some(nr) = w8_gemm_fits(w, k) else {
        return false;
    };
    if let (Some(d), true) = (dense, m <= DIRECT_ROWS) {
        dense_panel_rows(cx, d, (a, m, k), (n, nr), y);
        return true;
    }
    let mr = crate::simd::gemm_mr_for(m);
    // A in the SGEMM's panels, in a pooled buffer (nothing allocated per call)
    let mut ap = crate::simd::scratch::<f32>(m.div_ceil(mr) * k * mr);
    crate::simd::gemm::pack_a_into(m, k, a, k as isize, 1, mr, &mut ap);
    let ap = &ap[..m.div_ceil(mr) * k * mr];
    let panel = w8_task_cols(nr);
    let tasks = n.div_ceil(panel);
    let yp = SyncPtr(y.as_mut_ptr());
    let work = m * n * k * 2 + if dense.is_some() { 0 } else { n * k * 2 };
    cx.cpu.parallel_for_work(tasks, work, &|t| {
        let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
        let cols = j1 - j0;
        let len = cols.div_ceil(nr) * k * nr;
        let mut bp;
        let panels: &[f32] = match dense {
            Some(d) => &d[j0 / nr * k * nr..j0 / nr * k * nr + len],
            None => {
                bp = crate::simd::scratch::<f32>(len);
                crate::simd::w8_panels_on(w.isa, p, k, (j0, cols), nr, &mut bp);
                &bp
            }
        };
        let mut buf = crate::simd::scratch::<f32>(m * cols);
        let gm = Gemm {
            m,
            n: cols,
            k,
            a_rs: 0,
            a_cs: 0,
            b_rs: 0,
            b_cs: 0,
            ldc: cols,
            alpha: 1.0,
            beta: 0.0,
        };
        let a = Operand::Panels {
            data: ap,
            panel: mr,
        };
        let b = Operand::Panels {
            data: panels,
            panel: nr,
        };
        let ok = crate::simd::sgemm_ops_checked(&gm, a, b, &mut buf);
        debug_assert!(ok, "MatMulNBits: SGEMM operands fit by construction");
        for r in 0..m {
            // SAFETY: as in `direct_rows`: disjoint columns per task.
            let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(r * n + j0), cols) };
            dst.copy_from_slice(&buf[r * cols..(r + 1) * cols]);
        }
    });
    true
}

/// `Y = A · Bᵀ` for few rows of A from the dense copy in the SGEMM's B panels (`nr` columns
/// of `k` rows each): row by row, each panel's columns as sums of its rows scaled by A's
/// (where the SGEMM would pad the few rows to its micro-kernel's height), column panels in
/// parallel.
fn dense_panel_rows(
    cx: &KernelCx<'_>,
    d: &[f32],
    (a, m, k): (&[f32], usize, usize),
    (n, nr): (usize, usize),
    y: &mut [f32],
) {
    let panel = w8_task_cols(nr);
    let yp = SyncPtr(y.as_mut_ptr());
    cx.cpu
        .parallel_for_work(n.div_ceil(panel), m * n * k * 2, &|t| {
            let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
            for p0 in (j0..j1).step_by(nr) {
                let cols = nr.min(j1 - p0);
                let pan = &d[p0 / nr * k * nr..(p0 / nr + 1) * k * nr];
                for r in 0..m {
                    // SAFETY: as in `direct_rows`: disjoint columns per task.
                    let out =
                        unsafe { core::slice::from_raw_parts_mut(yp.get().add(r * n + p0), cols) };
                    out.fill(0.0);
                    crate::simd::axpy_rows(&a[r * k..(r + 1) * k], pan, nr, out);
                }
            }
        });
}

/// `Y = A · Bᵀ` through the int8 weights: from the session's cached dense copy where its
/// policy wants one for `m` rows and the cache holds (or makes) it, else by whichever of
/// [`w8_gemm`] (many rows) and [`w8_product`] takes it; false (nothing written) where none
/// does.
fn w8_any(
    cx: &KernelCx<'_>,
    w: &W8Weights,
    (a, m, k): (&[f32], usize, usize),
    y: &mut [f32],
) -> bool {
    if let (Some(cache), Some(nr)) = (cx.weights, w8_gemm_fits(w, k)) {
        if cache.wants(m, W8_ROWS) {
            let len = w8_dense_len(w, k, nr);
            let fill = |out: &mut [f32]| w8_dense_fill(cx, w, k, nr, out);
            if let Some(d) = cache.get(&w.dense, LAYOUT_W8_PANELS, cx.account, len, &fill) {
                return w8_gemm(cx, w, Some(d.data()), (a, m, k), y);
            }
        }
    }
    (m > W8_ROWS && w8_gemm(cx, w, None, (a, m, k), y)) || w8_product(cx, w, (a, m, k), y)
}

/// [`Q4Packed`] weights, the vector type they were packed for, and which tensors they came
/// from (data address and length of B, scales and the zero points, if any).
struct Q4Weights {
    isa: crate::simd::Isa,
    packed: Q4Packed,
    keys: [(usize, usize); 3],
}

/// A tensor's data address and length (to recognise the constant a kernel prepared from):
/// `(0, 0)` for none, `None` for data that is not stored as-is (uint8 or float).
fn key_of(t: Option<&Tensor>) -> Option<(usize, usize)> {
    use alloc::borrow::Cow;
    let Some(t) = t else { return Some((0, 0)) };
    match t.dtype() {
        DataType::Uint8 => match t.as_slice::<u8>().ok()? {
            Cow::Borrowed(v) => Some((v.as_ptr() as usize, v.len())),
            Cow::Owned(_) => None,
        },
        DataType::Float => match t.as_slice::<f32>().ok()? {
            Cow::Borrowed(v) => Some((v.as_ptr() as usize, 4 * v.len())),
            Cow::Owned(_) => None,
        },
        _ => None,
    }
}

/// The keys of B, the scales and the zero points, or `None` where one is not stored as-is.
fn keys_of(b: &Tensor, scales: &Tensor, zp: Option<&Tensor>) -> Option<Keys> {
    Some([key_of(Some(b))?, key_of(Some(scales))?, key_of(zp)?])
}

/// The geometry of a product with float activations and default zero points `2^(bits - 1)`.
fn float_geom(k: usize, bs: usize, bits: usize) -> NBits {
    NBits {
        k,
        bs,
        bits,
        int8_a: false,
        zp0: (1u32 << (bits - 1)) as f32,
    }
}

fn build(node: &Node) -> Result<Box<dyn Kernel>> {
    let k = node.get_i("K", 0)?;
    let n = node.get_i("N", 0)?;
    let bits = node.get_i("bits", 4)?;
    let bs = node.get_i("block_size", 0)?;
    if k <= 0 || n <= 0 {
        bail!("MatMulNBits: K {k} and N {n} must be positive");
    }
    if !matches!(bits, 2 | 4 | 8) {
        unsupported!("MatMulNBits with bits {bits} (2, 4 or 8)");
    }
    if !(16..=1 << 20).contains(&bs) || (bs & (bs - 1)) != 0 {
        unsupported!("MatMulNBits with block_size {bs} (a power of two, at least 16)");
    }
    Ok(Box::new(MatMulNBits {
        k: k as usize,
        n: n as usize,
        bits: bits as usize,
        bs: bs as usize,
        accuracy: node.get_i("accuracy_level", 0)?,
        isa: simd_isa(&NBits {
            k: k as usize,
            bs: bs as usize,
            bits: bits as usize,
            int8_a: false,
            zp0: 0.0,
        }),
        q4: None,
        w8: None,
        consts: None,
        dense: DenseSlot::new(),
    }))
}

/// The zero points as one float per (column, block), or `None` for the default.
fn zero_points(
    zp: Option<&crate::tensor::Tensor>,
    n: usize,
    blocks: usize,
    bits: usize,
) -> Result<Option<(Vec<f32>, bool)>> {
    let Some(zp) = zp else { return Ok(None) };
    match zp.dtype() {
        DataType::Uint8 => {
            let per_col = (blocks * bits).div_ceil(8);
            if zp.len() != n * per_col {
                bail!(
                    "MatMulNBits: packed zero_points hold {} bytes, expected {n} x {per_col}",
                    zp.len()
                );
            }
            let v = zp.as_slice::<u8>()?;
            let mask = (1u16 << bits) - 1;
            let mut out = Vec::with_capacity(n * blocks);
            for c in 0..n {
                let col = &v[c * per_col..(c + 1) * per_col];
                out.extend((0..blocks).map(|b| {
                    let bit = b * bits;
                    ((col[bit / 8] as u16 >> (bit % 8)) & mask) as f32
                }));
            }
            Ok(Some((out, false)))
        }
        DataType::Float => {
            if zp.len() != n * blocks {
                bail!(
                    "MatMulNBits: float zero_points hold {} values, expected {n} x {blocks}",
                    zp.len()
                );
            }
            Ok(Some((zp.as_slice::<f32>()?.into_owned(), true)))
        }
        t => unsupported!("MatMulNBits with zero_points of type {t} (uint8 or float)"),
    }
}

/// Block index of each of the K rows of B from `g_idx`, or `None` where it is absent or the
/// plain `k / block_size`.
fn block_index(
    g: Option<&crate::tensor::Tensor>,
    k: usize,
    bs: usize,
    blocks: usize,
) -> Result<Option<Vec<usize>>> {
    let Some(g) = g else { return Ok(None) };
    if g.dtype() != DataType::Int32 || g.len() != k {
        bail!(
            "MatMulNBits: g_idx must be {k} int32 values (is {} {:?})",
            g.dtype(),
            g.shape()
        );
    }
    let v = g.as_slice::<i32>()?;
    let mut idx = Vec::with_capacity(k);
    for &x in v.iter() {
        if x < 0 || x as usize >= blocks {
            bail!("MatMulNBits: g_idx value {x} is outside 0..{blocks}");
        }
        idx.push(x as usize);
    }
    if idx.iter().enumerate().all(|(i, &b)| b == i / bs) {
        return Ok(None);
    }
    Ok(Some(idx))
}

/// `x` rounded to the nearest integer, ties to even, for |x| <= 2^22 (adding and taking
/// away 1.5 * 2^23 leaves no fraction bits, and the default rounding mode is ties to even).
#[inline(always)]
fn round_even(x: f32) -> f32 {
    const BIG: f32 = 12_582_912.0;
    (x + BIG) - BIG
}

/// A's rows replaced by their int8 block values times the block scales (the activations the
/// `accuracy_level` 4 product sees), for the SGEMM path.
fn fake_quantize(a: &[f32], k: usize, bs: usize) -> Vec<f32> {
    let mut out = a.to_vec();
    for row in out.chunks_exact_mut(k) {
        for blk in row.chunks_mut(bs) {
            let amax = blk.iter().fold(0f32, |m, x| x.abs().max(m));
            let s = amax / 127.0;
            let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            for x in blk.iter_mut() {
                *x = round_even(*x * inv) * s;
            }
        }
    }
    out
}

impl Kernel for MatMulNBits {
    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        let c = |i: usize| consts.get(i).copied().flatten();
        let (Some(b), Some(scales)) = (c(1), c(2)) else {
            return 0;
        };
        if c(4).is_none() {
            self.consts = keys_of(b, scales, c(3));
        }
        // the int8 path: 4 bits at accuracy level 4, integer zero points, no g_idx (an input
        // present at run time that is not what was packed sends the call to the other paths)
        let zp = c(3);
        let float_zp = zp.is_some_and(|z| z.dtype() != DataType::Uint8);
        if self.accuracy != 4 || float_zp || self.bits == 8 {
            // float activations (int8 at accuracy level 4 with integer zero points)
            if (self.accuracy == 4 && !float_zp) || c(4).is_some() {
                return 0;
            }
            let g = float_geom(self.k, self.bs, self.bits);
            self.w8 = w8_prepare(&g, self.n, (b, scales, zp));
            return self.w8.as_ref().map_or(0, |w| {
                w.packed.bytes() + w.zps.as_ref().map_or(0, |z| 4 * z.0.len())
            });
        }
        if self.bits != 4 {
            return 0;
        }
        let (k, n, bs) = (self.k, self.n, self.bs);
        let blocks = k.div_ceil(bs);
        let (Ok(bv), Ok(sv)) = (b.as_slice::<u8>(), scales.as_slice::<f32>()) else {
            return 0;
        };
        if bv.len() != n * blocks * bs / 2 || sv.len() != n * blocks {
            return 0;
        }
        let Ok(zps) = zero_points(zp, n, blocks, 4) else {
            return 0;
        };
        let Some(keys) = keys_of(b, scales, zp) else {
            return 0;
        };
        let g = NBits {
            k,
            bs,
            bits: 4,
            int8_a: true,
            zp0: 8.0,
        };
        let (isa, lanes) = crate::simd::q4_isa();
        let packed =
            crate::simd::q4_pack(lanes, &g, &bv, &sv, zps.as_ref().map(|z| z.0.as_slice()), n);
        let bytes = packed.bytes();
        self.q4 = Some(Q4Weights { isa, packed, keys });
        bytes
    }

    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (k, n, bits, bs) = (self.k, self.n, self.bits, self.bs);
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 1)?;
        let scales = tensor_in(inputs, 2)?;
        let zp = opt_tensor_in(inputs, 3)?;
        let g_idx = opt_tensor_in(inputs, 4)?;
        let bias = opt_tensor_in(inputs, 5)?;
        if a.rank() == 0 || a.shape()[a.rank() - 1] != k {
            bail!("MatMulNBits: A {:?} must end in K = {k}", a.shape());
        }
        let blocks = k.div_ceil(bs);
        let blob = bs * bits / 8;
        if b.dtype() != DataType::Uint8 || b.len() != n * blocks * blob {
            bail!(
                "MatMulNBits: B must be {n} x {blocks} x {blob} uint8 (is {} {:?})",
                b.dtype(),
                b.shape()
            );
        }
        if scales.dtype() != DataType::Float || scales.len() != n * blocks {
            bail!(
                "MatMulNBits: scales must be {n} x {blocks} floats (is {} {:?})",
                scales.dtype(),
                scales.shape()
            );
        }
        if let Some(bias) = bias {
            if bias.dtype() != DataType::Float || bias.len() != n {
                bail!(
                    "MatMulNBits: bias must be {n} floats (is {:?})",
                    bias.shape()
                );
            }
        }
        // weights packed at load from these very tensors: their zero points were decoded and
        // checked then, and there is no g_idx, so nothing below needs decoding per call
        let now = keys_of(b, scales, zp);
        let q4 = self
            .q4
            .as_ref()
            .filter(|q| g_idx.is_none() && now == Some(q.keys));
        let m = a.len() / k;
        let w8 = self
            .w8
            .as_ref()
            .filter(|w| g_idx.is_none() && now == Some(w.keys));
        if let Some(w) = w8.filter(|_| m > 0) {
            let mut shape = a.shape().to_vec();
            *shape.last_mut().expect("rank >= 1") = n;
            let mut y = cx.output::<f32>(0, &shape)?;
            if w8_any(cx, w, (&a.as_slice::<f32>()?, m, k), &mut y) {
                if let Some(bias) = bias {
                    let bias = bias.as_slice::<f32>()?;
                    for row in y.chunks_exact_mut(n) {
                        row.iter_mut().zip(bias.iter()).for_each(|(y, b)| *y += b);
                    }
                }
                return out1(y.into_tensor());
            }
        }
        let decoded;
        let (zps, gidx) = match (q4, w8) {
            (Some(_), _) => (None, None),
            // the packed tensors' zero points, decoded at load (and no g_idx)
            (None, Some(w)) => (w.zps.as_ref(), None),
            (None, None) => {
                decoded = zero_points(zp, n, blocks, bits)?;
                (decoded.as_ref(), block_index(g_idx, k, bs, blocks)?)
            }
        };
        let float_zp = zps.is_some_and(|z| z.1);
        let int8_a = self.accuracy == 4 && gidx.is_none() && !float_zp && bits != 2;
        let zp0 = (1u32 << (bits - 1)) as f32;

        let av = a.as_slice::<f32>()?;
        let bv = b.as_slice::<u8>()?;
        let sv = scales.as_slice::<f32>()?;
        let mut shape = a.shape().to_vec();
        *shape.last_mut().expect("rank >= 1") = n;
        let mut y = cx.output::<f32>(0, &shape)?;
        let g = NBits {
            k,
            bs,
            bits,
            int8_a,
            zp0,
        };
        let zt = zps.map(|z| z.0.as_slice());
        let direct = m <= DIRECT_ROWS && gidx.is_none() && bits != 2;
        // the dense copy the weight cache keeps, for the constants seen at load only
        let cache = cx.weights.filter(|c| {
            q4.is_none()
                && gidx.is_none()
                && now.is_some()
                && now == self.consts
                && c.wants(m, DIRECT_ROWS)
        });
        let bias_v = bias.map(|b| b.as_slice::<f32>()).transpose()?;
        // the int8 kernel adds the bias itself (before the zero points' share, as ONNX Runtime)
        let bias_done = m > 0 && q4.is_some();
        if let (true, Some(q4)) = (m > 0, q4) {
            q4_product(cx, q4, (&av, m, k, bs), n, bias_v.as_deref(), &mut y);
        } else if m > 0 && direct && cache.is_none() {
            direct_rows(cx, (&g, self.isa), (&av, m), (&bv, &sv, zt), n, &mut y);
        } else if m > 0 {
            let fq;
            let a_used: &[f32] = if int8_a {
                fq = fake_quantize(&av, k, bs);
                &fq
            } else {
                &av
            };
            let isa = self.isa;
            if gidx.is_none() && crate::simd::nbits_fits_on(isa, &g) {
                // the SIMD layer dequantizes with codes reordered within groups; A's rows are
                // padded to whole blocks and reordered to match
                let kp = g.blocks() * bs;
                let mut ap = vec![0f32; m * kp];
                for (src, dst) in a_used.chunks_exact(k).zip(ap.chunks_exact_mut(kp)) {
                    dst[..k].copy_from_slice(src);
                    crate::simd::nbits_permute_on(isa, &g, dst);
                }
                let (blocks, blob) = (g.blocks(), g.blob());
                let fill = |j0: usize, cols: usize, out: &mut [f32]| {
                    crate::simd::nbits_dequant_on(
                        isa,
                        &g,
                        &bv[j0 * blocks * blob..(j0 + cols) * blocks * blob],
                        &sv[j0 * blocks..(j0 + cols) * blocks],
                        zt.map(|z| &z[j0 * blocks..(j0 + cols) * blocks]),
                        cols,
                        out,
                    )
                };
                let dense = cache.and_then(|c| {
                    let all = |out: &mut [f32]| fill_columns(cx, n, kp, &fill, out);
                    c.get(&self.dense, LAYOUT_COLUMNS_SIMD, cx.account, n * kp, &all)
                });
                let dense = dense.as_ref().map(|d| d.data());
                dequant_gemm(cx, (&ap, kp, m), n, &fill, dense, &mut y);
            } else {
                let w = Weights {
                    b: &bv,
                    scales: &sv,
                    zp: zt,
                    zp0,
                    gidx: gidx.as_deref(),
                };
                let fill = |j0: usize, cols: usize, out: &mut [f32]| {
                    for c in 0..cols {
                        w.column(&g, j0 + c, &mut out[c * k..(c + 1) * k]);
                    }
                };
                let dense = cache.and_then(|c| {
                    let all = |out: &mut [f32]| fill_columns(cx, n, k, &fill, out);
                    c.get(&self.dense, LAYOUT_COLUMNS, cx.account, n * k, &all)
                });
                let dense = dense.as_ref().map(|d| d.data());
                dequant_gemm(cx, (a_used, k, m), n, &fill, dense, &mut y);
            }
        }
        if let (Some(bias), false) = (&bias_v, bias_done) {
            for row in y.chunks_exact_mut(n) {
                row.iter_mut().zip(bias.iter()).for_each(|(y, b)| *y += b);
            }
        }
        out1(y.into_tensor())
    }
}

/// The widest vector type whose width divides the block (AVX-512 lanes are too many for
/// 16-code 4-bit blocks; the portable type always fits).
fn simd_isa(g: &NBits) -> crate::simd::Isa {
    crate::simd::available_isas()
        .into_iter()
        .rev()
        .find(|&i| crate::simd::nbits_fits_on(i, g))
        .unwrap_or(crate::simd::Isa::Portable)
}

/// The direct kernel over column panels in parallel (each task writes its columns of every
/// row through a buffer of its own).
fn direct_rows(
    cx: &KernelCx<'_>,
    (g, isa): (&NBits, crate::simd::Isa),
    (a, m): (&[f32], usize),
    (b, scales, zp): (&[u8], &[f32], Option<&[f32]>),
    n: usize,
    y: &mut [f32],
) {
    let (blocks, blob) = (g.blocks(), g.blob());
    let panel = PANEL_COLS;
    let tasks = n.div_ceil(panel);
    let yp = SyncPtr(y.as_mut_ptr());
    cx.cpu.parallel_for_work(tasks, m * n * g.k * 2, &|t| {
        let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
        let cols = j1 - j0;
        let mut buf = crate::simd::scratch::<f32>(m * cols);
        crate::simd::nbits_rows_on(
            isa,
            g,
            a,
            m,
            &b[j0 * blocks * blob..j1 * blocks * blob],
            &scales[j0 * blocks..j1 * blocks],
            zp.map(|z| &z[j0 * blocks..j1 * blocks]),
            cols,
            &mut buf,
            cols,
        );
        for r in 0..m {
            // SAFETY: row r's columns j0..j1 of the m x n output belong to this task alone
            // (tasks cover disjoint column ranges), and `y` stays borrowed until
            // `parallel_for_work` returns.
            let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(r * n + j0), cols) };
            dst.copy_from_slice(&buf[r * cols..(r + 1) * cols]);
        }
    });
}

/// The int8 x 4-bit product with weights packed at load, every row (A quantized once), column
/// groups in parallel.
fn q4_product(
    cx: &KernelCx<'_>,
    q4: &Q4Weights,
    (a, m, k, bs): (&[f32], usize, usize, usize),
    n: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let a8 = crate::simd::q8_rows(a, m, k, bs);
    let p = &q4.packed;
    by_groups(
        cx,
        (p.groups(), p.lanes, n, m),
        m * n * k * 2,
        y,
        &|g, out, ld| crate::simd::q4_rows_on(q4.isa, p, &a8, g, out, ld, bias),
    );
}

/// What [`by_groups`] runs per task: column groups `g0..g1` into `out` at row stride `ld`.
type GroupRows<'a> = dyn Fn((usize, usize), &mut [f32], usize) + Sync + 'a;

/// Runs `rows((g0, g1), out, ld)` on tasks of column groups in parallel: each writes the
/// columns of groups `g0..g1` of every row of the `m x n` output `y` (`lanes` columns a group,
/// none past N) into `out` at row stride `ld`: `y` itself for one row, else a buffer of the
/// task's that is then copied into place.
fn by_groups(
    cx: &KernelCx<'_>,
    (groups, lanes, n, m): (usize, usize, usize, usize),
    work: usize,
    y: &mut [f32],
    rows: &GroupRows<'_>,
) {
    let per_task = (PANEL_COLS / lanes).max(1);
    let tasks = groups.div_ceil(per_task);
    let yp = SyncPtr(y.as_mut_ptr());
    cx.cpu.parallel_for_work(tasks, work, &|t| {
        let (g0, g1) = (t * per_task, ((t + 1) * per_task).min(groups));
        let (j0, j1) = (g0 * lanes, (g1 * lanes).min(n));
        if m == 1 {
            // SAFETY: columns j0..j1 of the one row belong to this task alone (tasks cover
            // disjoint column groups), and `y` stays borrowed until `parallel_for_work`
            // returns.
            let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(j0), j1 - j0) };
            rows((g0, g1), dst, j1 - j0);
            return;
        }
        let ld = (g1 - g0) * lanes;
        let mut buf = crate::simd::scratch::<f32>(m * ld);
        rows((g0, g1), &mut buf, ld);
        for r in 0..m {
            // SAFETY: row r's columns j0..j1 belong to this task alone, as above.
            let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(r * n + j0), j1 - j0) };
            dst.copy_from_slice(&buf[r * ld..r * ld + j1 - j0]);
        }
    });
}

/// B's codes, scales and zero points, for dequantizing.
struct Weights<'a> {
    b: &'a [u8],
    scales: &'a [f32],
    zp: Option<&'a [f32]>,
    zp0: f32,
    gidx: Option<&'a [usize]>,
}

impl Weights<'_> {
    /// Column `c`'s K weights as floats into `out`.
    fn column(&self, g: &NBits, c: usize, out: &mut [f32]) {
        let (blocks, blob, bits) = (g.blocks(), g.blob(), g.bits);
        let col = &self.b[c * blocks * blob..(c + 1) * blocks * blob];
        let mask = (1u16 << bits) - 1;
        let per_byte = 8 / bits;
        for (kk, o) in out.iter_mut().enumerate().take(g.k) {
            let code = {
                let (blk, e) = (kk / g.bs, kk % g.bs);
                let byte = col[blk * blob + e / per_byte] as u16;
                ((byte >> ((e % per_byte) * bits)) & mask) as f32
            };
            let bi = self.gidx.map_or(kk / g.bs, |gi| gi[kk]);
            let z = self.zp.map_or(self.zp0, |z| z[c * blocks + bi]);
            *o = (code - z) * self.scales[c * blocks + bi];
        }
    }
}

/// Every column of B dequantized by `fill` (as [`dequant_gemm`] calls it) into `out`: `n`
/// rows of `kk` floats, panels in parallel (the dense copy the weight cache keeps).
fn fill_columns(
    cx: &KernelCx<'_>,
    n: usize,
    kk: usize,
    fill: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
    out: &mut [f32],
) {
    let panel = GEMM_PANEL_COLS;
    assert!(out.len() >= n * kk, "fill_columns: room for every column");
    let op = SyncPtr(out.as_mut_ptr());
    cx.cpu
        .parallel_for_work(n.div_ceil(panel), n * kk * 4, &|t| {
            let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
            // SAFETY: each task writes its own columns' rows, disjoint ranges of `out`
            let dst =
                unsafe { core::slice::from_raw_parts_mut(op.get().add(j0 * kk), (j1 - j0) * kk) };
            fill(j0, j1 - j0, dst);
        });
}

/// `Y = A · Bᵀ` with B dequantized a panel of columns at a time by `fill(j0, cols, out)`
/// (`cols` rows of `kk` floats, matching A's `m` rows of `kk`), or read from `dense` (every
/// column so dequantized, [`fill_columns`]: the cached arm, same bits), tasks in parallel,
/// each with a single-threaded SGEMM. Each task computes `Yᵀ = B_panel · Aᵀ`, so the dequantized panel
/// is the SGEMM's A side, read along its rows, and Aᵀ is packed once for all tasks.
fn dequant_gemm(
    cx: &KernelCx<'_>,
    (a, kk, m): (&[f32], usize, usize),
    n: usize,
    fill: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
    dense: Option<&[f32]>,
    y: &mut [f32],
) {
    let panel = GEMM_PANEL_COLS;
    let tasks = n.div_ceil(panel);
    let yp = SyncPtr(y.as_mut_ptr());
    if let (Some(d), true) = (dense, m <= DIRECT_ROWS) {
        // few rows: each output a dot product of A's row and a dense column
        cx.cpu.parallel_for_work(tasks, m * n * kk * 2, &|t| {
            let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
            for r in 0..m {
                // SAFETY: as below: disjoint columns per task.
                let out =
                    unsafe { core::slice::from_raw_parts_mut(yp.get().add(r * n + j0), j1 - j0) };
                crate::simd::dot_rows(&d[j0 * kk..j1 * kk], kk, &a[r * kk..(r + 1) * kk], out);
            }
        });
        return;
    }
    // Aᵀ (kk x m) in the SGEMM's B panels: element (p, r) is a[r * kk + p]
    let nr = crate::simd::gemm_tile().1;
    let pb = crate::simd::gemm::pack_b(kk, m, a, 1, kk as isize, nr);
    let work = m * n * kk * 2 + if dense.is_some() { 0 } else { n * kk * 4 };
    cx.cpu.parallel_for_work(tasks, work, &|t| {
        let (j0, j1) = (t * panel, ((t + 1) * panel).min(n));
        let cols = j1 - j0;
        let mut own;
        let bt: &[f32] = match dense {
            Some(d) => &d[j0 * kk..j1 * kk],
            None => {
                own = crate::simd::scratch::<f32>(cols * kk);
                fill(j0, cols, &mut own);
                &own
            }
        };
        let mut buf = crate::simd::scratch::<f32>(cols * m);
        let gm = Gemm {
            m: cols,
            n: m,
            k: kk,
            a_rs: kk as isize,
            a_cs: 1,
            b_rs: 0,
            b_cs: 0,
            ldc: m,
            alpha: 1.0,
            beta: 0.0,
        };
        let b = Operand::Panels {
            data: &pb,
            panel: nr,
        };
        let ok = crate::simd::sgemm_ops_checked(&gm, Operand::Strided(bt), b, &mut buf);
        debug_assert!(ok, "MatMulNBits: SGEMM operands fit by construction");
        for r in 0..m {
            // SAFETY: as in `direct_rows`: disjoint columns per task.
            let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(r * n + j0), cols) };
            for (c, d) in dst.iter_mut().enumerate() {
                *d = buf[c * m + r];
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use alloc::string::String;
    use alloc::vec::Vec;

    use super::super::test_util::{close, node, run, run_prepared, t32};
    use crate::ir::AttrValue;
    use crate::tensor::Tensor;

    /// A small deterministic generator (64-bit LCG, top bits).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        fn f(&mut self) -> f32 {
            (self.next() % 20001) as f32 / 10000.0 - 1.0
        }
    }

    /// One MatMulNBits case: codes (N x K, unpacked), scales and zero points per (n, block).
    #[derive(Clone)]
    struct Case {
        m: usize,
        k: usize,
        n: usize,
        bits: usize,
        bs: usize,
        a: Vec<f32>,
        codes: Vec<u8>,
        scales: Vec<f32>,
        zp: Option<Vec<u8>>,
        fzp: Option<Vec<f32>>,
        gidx: Option<Vec<i32>>,
        bias: Option<Vec<f32>>,
        accuracy: i64,
    }

    impl Case {
        fn new(m: usize, k: usize, n: usize, bits: usize, bs: usize, seed: u64) -> Case {
            let mut r = Lcg(seed);
            let blocks = k.div_ceil(bs);
            let a = (0..m * k).map(|_| r.f() * 3.0).collect();
            let codes = (0..n * k).map(|_| (r.next() % (1 << bits)) as u8).collect();
            let scales = (0..n * blocks).map(|_| 0.01 + r.f().abs() * 0.1).collect();
            Case {
                m,
                k,
                n,
                bits,
                bs,
                a,
                codes,
                scales,
                zp: None,
                fzp: None,
                gidx: None,
                bias: None,
                accuracy: 0,
            }
        }
        fn blocks(&self) -> usize {
            self.k.div_ceil(self.bs)
        }
        /// The node's inputs: B packed low bits first, the last block padded with code 0.
        fn inputs(&self) -> Vec<Option<Tensor>> {
            let (blocks, per) = (self.blocks(), 8 / self.bits);
            let blob = self.bs / per;
            let mut b = alloc::vec![0u8; self.n * blocks * blob];
            for c in 0..self.n {
                for kk in 0..self.k {
                    let (bi, e) = (kk / self.bs, kk % self.bs);
                    let code = self.codes[c * self.k + kk];
                    b[(c * blocks + bi) * blob + e / per] |= code << ((e % per) * self.bits);
                }
            }
            let zp = self.zp.as_ref().map(|z| {
                let per_col = (blocks * self.bits).div_ceil(8);
                let mut p = alloc::vec![0u8; self.n * per_col];
                for c in 0..self.n {
                    for bi in 0..blocks {
                        let bit = bi * self.bits;
                        p[c * per_col + bit / 8] |= z[c * blocks + bi] << (bit % 8);
                    }
                }
                Tensor::from_vec(&[self.n, per_col], p).unwrap()
            });
            let zp = zp.or_else(|| self.fzp.as_ref().map(|z| t32(&[self.n, blocks], z.clone())));
            let with_bias = self.bias.is_some();
            alloc::vec![
                Some(t32(&[self.m, self.k], self.a.clone())),
                Some(Tensor::from_vec(&[self.n, blocks, blob], b).unwrap()),
                Some(t32(&[self.n, blocks], self.scales.clone())),
                zp,
                self.gidx
                    .as_ref()
                    .map(|g| Tensor::from_vec(&[self.k], g.clone()).unwrap()),
                if with_bias {
                    Some(t32(&[self.n], self.bias.clone().unwrap()))
                } else {
                    None
                },
            ]
        }
        fn node(&self) -> crate::ir::Node {
            let mut nd = node(
                "MatMulNBits",
                1,
                alloc::vec![
                    ("K", AttrValue::Int(self.k as i64)),
                    ("N", AttrValue::Int(self.n as i64)),
                    ("bits", AttrValue::Int(self.bits as i64)),
                    ("block_size", AttrValue::Int(self.bs as i64)),
                    ("accuracy_level", AttrValue::Int(self.accuracy)),
                ],
                1,
            );
            nd.domain = String::from("com.microsoft");
            nd
        }
        /// The activations the product sees: int8 block values times their scale at
        /// accuracy level 4 (computed in f32 exactly as the definition reads), else A.
        fn a_seen(&self, int8: bool) -> Vec<f64> {
            let mut out = Vec::new();
            for row in self.a.chunks(self.k) {
                for blk in row.chunks(self.bs) {
                    let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                    for &x in blk {
                        out.push(if int8 {
                            libm::rint((x * inv) as f64) * (amax / 127.0) as f64
                        } else {
                            x as f64
                        });
                    }
                }
            }
            out
        }
        /// `A · dequant(B)ᵀ + bias` in f64.
        fn reference(&self, int8: bool) -> Vec<f32> {
            let (blocks, a) = (self.blocks(), self.a_seen(int8));
            let mut y = Vec::new();
            for r in 0..self.m {
                for c in 0..self.n {
                    let mut s = 0f64;
                    for kk in 0..self.k {
                        let bi = self.gidx.as_ref().map_or(kk / self.bs, |g| g[kk] as usize);
                        let z = match (&self.zp, &self.fzp) {
                            (Some(z), _) => z[c * blocks + bi] as f64,
                            (_, Some(z)) => z[c * blocks + bi] as f64,
                            _ => (1u32 << (self.bits - 1)) as f64,
                        };
                        let w = (self.codes[c * self.k + kk] as f64 - z)
                            * self.scales[c * blocks + bi] as f64;
                        s += a[r * self.k + kk] * w;
                    }
                    y.push((s + self.bias.as_ref().map_or(0.0, |b| b[c] as f64)) as f32);
                }
            }
            y
        }
        fn run(&self) -> Vec<f32> {
            let out = run(&self.node(), &self.inputs()).unwrap();
            assert_eq!(out[0].shape(), &[self.m, self.n]);
            out[0].to_f32_vec().unwrap()
        }
    }

    #[test]
    fn four_bit_codes_with_packed_zero_points_a_partial_block_and_bias() {
        for m in [1, 2, 5] {
            let mut c = Case::new(m, 40, 9, 4, 16, 7);
            let blocks = c.blocks();
            let mut r = Lcg(99);
            c.zp = Some((0..9 * blocks).map(|_| (r.next() % 16) as u8).collect());
            c.bias = Some((0..9).map(|i| i as f32 * 0.25 - 1.0).collect());
            close(&c.run(), &c.reference(false), 2e-5);
        }
    }

    #[test]
    fn accuracy_level_4_quantizes_each_block_of_a_to_int8() {
        for (m, bits, bs) in [(1, 4, 32), (3, 4, 64), (6, 4, 32), (1, 8, 32), (4, 8, 16)] {
            let mut c = Case::new(m, 96, 21, bits, bs, 3 + m as u64);
            c.accuracy = 4;
            let got = c.run();
            close(&got, &c.reference(true), 2e-5);
            // the case tells the two numerics apart
            let float = c.reference(false);
            let apart = got
                .iter()
                .zip(&float)
                .any(|(g, f)| (g - f).abs() > 1e-3 * (1.0 + f.abs()));
            assert!(apart, "m {m} bits {bits}: int8 and float activations agree");
        }
    }

    #[test]
    fn eight_bit_codes_default_to_zero_point_128() {
        for m in [1, 7] {
            let c = Case::new(m, 64, 17, 8, 32, 11);
            close(&c.run(), &c.reference(false), 2e-5);
        }
    }

    #[test]
    fn two_bit_codes_take_the_dequantizing_path() {
        let mut c = Case::new(2, 48, 5, 2, 16, 5);
        c.accuracy = 4;
        close(&c.run(), &c.reference(false), 2e-5);
    }

    #[test]
    fn g_idx_names_each_rows_block_and_keeps_a_float() {
        let mut c = Case::new(1, 64, 6, 4, 16, 13);
        c.accuracy = 4;
        // rows dealt to the blocks round robin (act-order quantization)
        c.gidx = Some((0..64).map(|k| k % 4).collect());
        close(&c.run(), &c.reference(false), 2e-5);
    }

    #[test]
    fn float_zero_points_keep_a_float() {
        let mut c = Case::new(1, 32, 4, 4, 16, 17);
        c.accuracy = 4;
        c.fzp = Some((0..8).map(|i| 7.5 + i as f32 * 0.1).collect());
        close(&c.run(), &c.reference(false), 2e-5);
    }

    #[test]
    fn every_vector_type_gives_the_portable_sums() {
        for (bits, bs) in [(4, 32), (8, 64)] {
            let c = Case::new(2, 256, 13, bits, bs, 23);
            let inputs = c.inputs();
            let b = inputs[1].as_ref().unwrap().as_slice::<u8>().unwrap();
            let g = crate::simd::NBits {
                k: 256,
                bs,
                bits,
                int8_a: true,
                zp0: 8.0,
            };
            let want = {
                let mut y = alloc::vec![0f32; 2 * 13];
                crate::simd::nbits_rows_on(
                    crate::simd::Isa::Portable,
                    &g,
                    &c.a,
                    2,
                    &b,
                    &c.scales,
                    None,
                    13,
                    &mut y,
                    13,
                );
                y
            };
            for isa in crate::simd::available_isas() {
                if !crate::simd::nbits_fits_on(isa, &g) {
                    continue;
                }
                let mut y = alloc::vec![0f32; 2 * 13];
                crate::simd::nbits_rows_on(isa, &g, &c.a, 2, &b, &c.scales, None, 13, &mut y, 13);
                close(&y, &want, 1e-5);
            }
        }
    }

    #[test]
    fn packed_int8_path_matches_the_definition() {
        // constant 4-bit weights at level 4 are repacked at load; every row count goes
        // through the int8 kernel, with default, packed and partial-block zero points
        for (m, k, n, bs, zp) in [
            (1, 96, 21, 32, false),
            (3, 100, 37, 32, true),
            (6, 128, 16, 64, true),
            (13, 64, 40, 16, false),
            (1, 512, 70, 128, true),
        ] {
            let mut c = Case::new(m, k, n, 4, bs, 41 + m as u64);
            c.accuracy = 4;
            if zp {
                let mut r = Lcg(5);
                c.zp = Some((0..n * c.blocks()).map(|_| (r.next() % 16) as u8).collect());
            }
            c.bias = Some((0..n).map(|i| i as f32 * 0.5 - 3.0).collect());
            let (out, bytes) = run_prepared(&c.node(), &c.inputs(), &[1, 2, 3]).unwrap();
            assert!(bytes > 0, "m {m}: nothing prepared");
            close(&out[0].to_f32_vec().unwrap(), &c.reference(true), 2e-5);
            // other weights at run time than the ones prepared: not the packed ones
            let (prep_inputs, mut other) = (c.inputs(), c.clone());
            other.codes.iter_mut().for_each(|x| *x = 15 - *x);
            let k8 = super::build(&c.node()).and_then(|mut kern| {
                let consts: Vec<Option<&Tensor>> = prep_inputs.iter().map(|t| t.as_ref()).collect();
                assert!(kern.prepare(&consts) > 0);
                let vals: Vec<Option<crate::value::Value>> = other
                    .inputs()
                    .into_iter()
                    .map(|t| t.map(crate::value::Value::Tensor))
                    .collect();
                let refs: Vec<Option<&crate::value::Value>> =
                    vals.iter().map(|v| v.as_ref()).collect();
                kern.compute(
                    &crate::provider::KernelCx::new(&crate::provider::ReferenceCpu),
                    &refs,
                )
            });
            let y = match &k8.unwrap()[0] {
                crate::value::Value::Tensor(t) => t.to_f32_vec().unwrap(),
                _ => panic!("not a tensor"),
            };
            close(&y, &other.reference(true), 2e-5);
        }
    }

    #[test]
    fn packed_float_path_matches_the_definition() {
        // constant 4- and 8-bit weights with float activations are repacked at load as int8
        // (code - zero point); up to W8_ROWS rows go through the split-activation kernel,
        // more through the dequantizing SGEMM; default, packed and float zero points, partial
        // blocks and a bias on both sides
        for (m, k, n, bits, bs, zp) in [
            (1, 96, 21, 4, 32, 0),
            (3, 100, 37, 4, 32, 1),
            (6, 128, 16, 8, 64, 0),
            (super::W8_ROWS, 64, 40, 4, 16, 2),
            (super::W8_ROWS + 1, 64, 40, 4, 16, 2),
            (super::W8_ROWS + 5, 100, 37, 4, 32, 1),
            (1, 700, 70, 8, 512, 0),
            (33, 64, 19, 8, 32, 0),
            // an odd K, and columns over two of w8_gemm's tasks with a partial group
            (20, 45, 150, 4, 16, 1),
        ] {
            let mut c = Case::new(m, k, n, bits, bs, 71 + m as u64);
            let mut r = Lcg(9);
            match zp {
                1 => c.zp = Some((0..n * c.blocks()).map(|_| (r.next() % 16) as u8).collect()),
                2 => {
                    c.fzp = Some(
                        (0..n * c.blocks())
                            .map(|_| (r.next() % 16) as f32)
                            .collect(),
                    )
                }
                _ => {}
            }
            c.bias = Some((0..n).map(|i| i as f32 * 0.5 - 3.0).collect());
            let (out, bytes) = run_prepared(&c.node(), &c.inputs(), &[1, 2, 3]).unwrap();
            assert!(
                bytes >= n * k * bits / 8,
                "m {m}: nothing prepared ({bytes} bytes)"
            );
            // within float rounding of the largest output (sums of about 2^7 terms)
            let near = |got: &[f32], want: &[f32]| {
                let big = want.iter().fold(0f32, |m, w| m.max(w.abs()));
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    assert!((g - w).abs() <= 1e-6 * big, "m {m} y[{i}]: {g} vs {w}");
                }
            };
            near(&out[0].to_f32_vec().unwrap(), &c.reference(false));
            // a NaN in A reaches its row's outputs (through the float path) and no other
            let mut nan = c.clone();
            nan.a[k / 2] = f32::NAN;
            let (out, _) = run_prepared(&nan.node(), &nan.inputs(), &[1, 2, 3]).unwrap();
            let y = out[0].to_f32_vec().unwrap();
            assert!(y[..n].iter().all(|v| v.is_nan()), "m {m}: NaN lost");
            near(&y[n..], &nan.reference(false)[n..]);
        }
    }

    #[test]
    fn gathered_experts_match_each_experts_product() {
        // nxrt:GatherMatMulNBits: tokens routed to the same expert are multiplied together
        // (one row each, then three rows each, so that one expert's 15 rows take the SGEMM
        // path), a negative index counts from the end, and every product equals the expert's
        // own MatMulNBits definition
        let (e, k, n, bs) = (3usize, 64usize, 40usize, 32usize);
        let experts: Vec<Case> = (0..e)
            .map(|i| {
                let mut c = Case::new(1, k, n, 8, bs, 500 + i as u64);
                let mut r = Lcg(77 + i as u64);
                // every code - zero point an int8 (as the fused MXFP4 codes), so that the
                // weights are packed
                c.zp = Some(
                    (0..n * c.blocks())
                        .map(|_| 120 + (r.next() % 17) as u8)
                        .collect(),
                );
                c.codes = (0..n * k).map(|_| 28 + (r.next() % 200) as u8).collect();
                c
            })
            .collect();
        let stack = |i: usize| -> Tensor {
            let parts: Vec<Tensor> = experts
                .iter()
                .map(|c| c.inputs()[i].clone().unwrap())
                .collect();
            let mut shape = alloc::vec![e];
            shape.extend_from_slice(parts[0].shape());
            if i == 3 {
                shape = alloc::vec![e, parts[0].len()];
            }
            match parts[0].dtype() {
                crate::dtype::DataType::Float => t32(
                    &shape,
                    parts.iter().flat_map(|t| t.to_f32_vec().unwrap()).collect(),
                ),
                _ => Tensor::from_vec(
                    &shape,
                    parts
                        .iter()
                        .flat_map(|t| t.as_slice::<u8>().unwrap().to_vec())
                        .collect::<Vec<u8>>(),
                )
                .unwrap(),
            }
        };
        let mut nd = experts[0].node();
        nd.op_type = String::from("GatherMatMulNBits");
        nd.domain = String::from(crate::kernels::nn::nchwc::DOMAIN);
        for (m, idx) in [
            (1usize, alloc::vec![2i64, 0, 2, 2, 1, 0]),
            (3, alloc::vec![1, 1, 1, -2, 1, 0, -1]),
        ] {
            let t = idx.len();
            let mut r = Lcg(5 + m as u64);
            let x: Vec<f32> = (0..t * m * k).map(|_| r.f() * 2.0).collect();
            let inputs = alloc::vec![
                Some(t32(&[t, m, k], x.clone())),
                Some(stack(1)),
                Some(stack(2)),
                Some(stack(3)),
                Some(Tensor::from_vec(&[t], idx.clone()).unwrap()),
            ];
            let (out, bytes) = run_prepared(&nd, &inputs, &[1, 2, 3]).unwrap();
            assert!(bytes >= e * n * k, "nothing prepared");
            assert_eq!(out[0].shape(), &[t, m, n]);
            let y = out[0].to_f32_vec().unwrap();
            for (ti, &ei) in idx.iter().enumerate() {
                let ei = if ei < 0 { ei + e as i64 } else { ei } as usize;
                let mut c = experts[ei].clone();
                c.m = m;
                c.a = x[ti * m * k..(ti + 1) * m * k].to_vec();
                let want = c.reference(false);
                let big = want.iter().fold(0f32, |a, w| a.max(w.abs()));
                let got = &y[ti * m * n..(ti + 1) * m * n];
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-6 * big,
                        "m {m} token {ti} y[{i}]: {g} vs {w}"
                    );
                }
            }
        }
    }

    #[test]
    fn mismatched_inputs_are_errors() {
        let c = Case::new(1, 32, 4, 4, 16, 1);
        let mut inputs = c.inputs();
        inputs[2] = Some(t32(&[4, 1], alloc::vec![1.0; 4]));
        assert!(run(&c.node(), &inputs).is_err());
        let mut inputs = c.inputs();
        inputs[0] = Some(t32(&[1, 31], alloc::vec![1.0; 31]));
        assert!(run(&c.node(), &inputs).is_err());
        let mut bad = c.node();
        for (k, v) in bad.attrs.iter_mut() {
            if k == "bits" {
                *v = AttrValue::Int(3);
            }
        }
        assert!(run(&bad, &c.inputs()).is_err());
    }
}
