//! Direct convolutions over the blocked channel layout (NCHWc): a tensor [N, C, H, W] held as
//! [N, ceil(C/16), H, W, 16], the sixteen channels of a block side by side at each position.
//! One block is one vector on AVX-512, two on AVX2, four on SIMD128 and NEON; the layout is
//! the same on every ISA, so a graph rewritten for it runs anywhere.
//!
//! Both kernels compute a segment of one output row of one or two output blocks. Positions
//! whose taps all fall inside the input take register tiles of `R` positions (a vector of
//! weights is loaded once per tap and reused for `R` positions; the stride is only an address
//! step, no phase split); the few positions at the borders take a one-position path that
//! skips the taps falling in the padding.

use super::kernels::Then;
use super::{Clamp, VF32};

/// Channels per block of the blocked layout.
pub const NCHWC: usize = 16;

/// The geometry of a blocked convolution. Input channel `c` at position `p` (row-major over
/// the input plane) is at `(c / xbs) * x_blk + p * x_pos + (c % xbs) * x_lane`: blocked input
/// has `xbs = 16`, `x_pos = 16`, `x_lane = 1`; plain NCHW is one block of all channels,
/// `x_pos = 1`, `x_lane = H * W`. Pads are the leading ones (the trailing ones follow from the
/// output size).
#[derive(Clone, Copy, Debug, Default)]
pub struct NcGeom {
    /// Input channels each output sums over (group 1; the depthwise kernel ignores it).
    pub cin: usize,
    pub xbs: usize,
    pub x_blk: usize,
    pub x_pos: usize,
    pub x_lane: usize,
    pub ih: usize,
    pub iw: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub sw: usize,
    pub dh: usize,
    pub dw: usize,
    pub ph: usize,
    pub pw: usize,
    /// Relu or Clip applied in registers as the finished sums are stored (after the last
    /// input channels); `None`: stored as they are.
    pub clamp: Option<Clamp>,
}

impl NcGeom {
    /// The kernel rows `ki` whose input row for output row `oh` lies inside the input.
    #[inline(always)]
    fn rows_in(&self, oh: usize) -> (usize, usize) {
        let top = oh * self.sh;
        let mut lo = 0;
        while lo < self.kh && top + lo * self.dh < self.ph {
            lo += 1;
        }
        let mut hi = lo;
        while hi < self.kh && top + hi * self.dh < self.ph + self.ih {
            hi += 1;
        }
        (lo, hi)
    }

    /// Output columns `lo..hi` whose taps all read inside the input row.
    #[inline(always)]
    fn interior(&self) -> (usize, usize) {
        let lo = self.pw.div_ceil(self.sw).min(self.ow);
        let reach = (self.kw - 1) * self.dw + 1;
        let hi = if self.iw + self.pw >= reach {
            ((self.iw + self.pw - reach) / self.sw + 1).min(self.ow)
        } else {
            0
        };
        (lo, hi.max(lo))
    }
}

/// One output row segment (`ow0..ow1` of row `oh`) of a group-1 blocked convolution for one
/// output block (`w1`, `b1`, `y1` empty) or two: `w*` hold a block's weights as
/// [cin][kh][kw][16], `b*` its 16 biases, `y*` receive the segment as [position][16].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn nchwc_conv_seg<V: VF32>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    oh: usize,
    ow0: usize,
    ow1: usize,
    y: (&mut [f32], &mut [f32]),
) {
    let two = !w.1.is_empty();
    let n = (ow1 - ow0) * NCHWC;
    let wlen = g.cin * g.kh * g.kw * NCHWC;
    assert!(
        g.xbs > 0 && g.cin > 0 && g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0,
        "nchwc_conv_seg: empty geometry"
    );
    assert!(
        oh < g.oh && ow0 <= ow1 && ow1 <= g.ow,
        "nchwc_conv_seg: segment outside the output"
    );
    assert!(
        w.0.len() >= wlen && b.0.len() >= NCHWC && y.0.len() >= n,
        "nchwc_conv_seg: short operands"
    );
    assert!(
        !two || (w.1.len() >= wlen && b.1.len() >= NCHWC && y.1.len() >= n),
        "nchwc_conv_seg: short second block"
    );
    let need = (g.cin - 1) / g.xbs * g.x_blk
        + (g.ih * g.iw - 1) * g.x_pos
        + ((g.cin - 1) % g.xbs) * g.x_lane
        + 1;
    assert!(
        g.ih * g.iw > 0 && x.len() >= need,
        "nchwc_conv_seg: the input is shorter than its geometry"
    );
    let vpb = NCHWC / V::LANES;
    if two && few_regs_narrow::<V>() {
        // a pair is eight vectors of sums here: one block at a time in two-position tiles
        // keeps sums, weights and the input in the registers
        let (y0, y1) = y;
        conv_seg_nv::<V, 4>(g, x, (w.0, &[]), (b.0, &[]), oh, ow0, ow1, (y0, &mut []));
        conv_seg_nv::<V, 4>(g, x, (w.1, &[]), (b.1, &[]), oh, ow0, ow1, (y1, &mut []));
        return;
    }
    match (if two { 2 } else { 1 }) * vpb {
        1 => conv_seg_nv::<V, 1>(g, x, w, b, oh, ow0, ow1, y),
        2 => conv_seg_nv::<V, 2>(g, x, w, b, oh, ow0, ow1, y),
        4 => conv_seg_nv::<V, 4>(g, x, w, b, oh, ow0, ow1, y),
        _ => conv_seg_nv::<V, 8>(g, x, w, b, oh, ow0, ow1, y),
    }
}

/// Whether this ISA has 32 vector registers (AVX-512, NEON) rather than 16.
#[inline(always)]
fn many_regs<V: VF32>() -> bool {
    V::LANES == 16 || V::GEMM_MR >= 8
}

/// Four-lane vectors and 16 registers (SIMD128; V8 keeps one of them as its scratch): a block
/// is four vectors of sums.
#[inline(always)]
fn few_regs_narrow<V: VF32>() -> bool {
    V::LANES == 4 && !many_regs::<V>()
}

/// Bytes of weights one pass over a row segment keeps in use: the input channels are taken in
/// chunks whose weights (for every tap and the one or two output blocks) stay in the L1 cache
/// while every position of the segment reads them; later chunks add to what the segment holds.
const W_CHUNK_BYTES: usize = 32 * 1024;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_seg_nv<V: VF32, const NV: usize>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    oh: usize,
    ow0: usize,
    ow1: usize,
    mut y: (&mut [f32], &mut [f32]),
) {
    let (ilo, ihi) = g.interior();
    let lo = ilo.clamp(ow0, ow1);
    let hi = ihi.clamp(ow0, ow1).max(lo);
    let ks = g.rows_in(oh);
    // input channels per chunk: whole blocks of the input where a block's weights fit
    let per_ch = g.kh * g.kw * NV * V::LANES * 4;
    let mut chunk = (W_CHUNK_BYTES / per_ch).max(1);
    if chunk >= g.xbs {
        chunk -= chunk % g.xbs;
    }
    // interior tiles of blocked input at stride 1 read their positions at a constant step (one
    // address register for the whole tile)
    let step = g.sw * g.x_pos;
    let mut c0 = 0;
    while c0 < g.cin {
        let cs = (c0, (c0 + chunk).min(g.cin));
        let add = c0 > 0;
        for o in ow0..lo {
            conv_point::<V, NV, true>(g, x, w, b, ks, cs, add, oh, o, o - ow0, &mut y);
        }
        if lo < hi {
            let span = (lo, hi);
            match step {
                NCHWC => {
                    conv_tiles_nv::<V, NV, NCHWC>(g, x, w, b, ks, cs, add, oh, span, ow0, &mut y)
                }
                1 => conv_tiles_nv::<V, NV, 1>(g, x, w, b, ks, cs, add, oh, span, ow0, &mut y),
                _ => conv_tiles_nv::<V, NV, 0>(g, x, w, b, ks, cs, add, oh, span, ow0, &mut y),
            }
        }
        for o in hi..ow1 {
            conv_point::<V, NV, true>(g, x, w, b, ks, cs, add, oh, o, o - ow0, &mut y);
        }
        c0 = cs.1;
    }
}

/// The register tile for `NV` vectors of output channels: about 24 accumulators with 32
/// registers, 12 with 16.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_tiles_nv<V: VF32, const NV: usize, const STEP: usize>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    ks: (usize, usize),
    cs: (usize, usize),
    add: bool,
    oh: usize,
    span: (usize, usize),
    ow0: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    match (NV, many_regs::<V>()) {
        (1, _) | (2, true) => {
            conv_tiles::<V, NV, 11, STEP>(g, x, w, b, ks, cs, add, oh, span, ow0, y)
        }
        (2, false) | (4, true) => {
            conv_tiles::<V, NV, 6, STEP>(g, x, w, b, ks, cs, add, oh, span, ow0, y)
        }
        (4, false) if few_regs_narrow::<V>() => {
            conv_tiles::<V, NV, 2, STEP>(g, x, w, b, ks, cs, add, oh, span, ow0, y)
        }
        (4, false) | (8, true) => {
            conv_tiles::<V, NV, 3, STEP>(g, x, w, b, ks, cs, add, oh, span, ow0, y)
        }
        _ => conv_tiles::<V, NV, 1, STEP>(g, x, w, b, ks, cs, add, oh, span, ow0, y),
    }
}

/// Interior positions `lo..hi` in as few tiles of at most `R` as cover them, of sizes that
/// differ by one at most (54 positions at `R` = 12: 11, 11, 11, 11, 10), each position once.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_tiles<V: VF32, const NV: usize, const R: usize, const STEP: usize>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    ks: (usize, usize),
    cs: (usize, usize),
    add: bool,
    oh: usize,
    (lo, hi): (usize, usize),
    ow0: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    let span = hi - lo;
    if span < R {
        // narrow spans: tiles of 4, then single positions
        let mut o = lo;
        if R > 4 {
            while o + 4 <= hi {
                conv_tile::<V, NV, 4, false, STEP>(g, x, w, b, ks, cs, add, oh, o, o - ow0, y);
                o += 4;
            }
        }
        for o in o..hi {
            conv_point::<V, NV, false>(g, x, w, b, ks, cs, add, oh, o, o - ow0, y);
        }
        return;
    }
    let tiles = span.div_ceil(R);
    let (base, extra) = (span / tiles, span % tiles);
    let mut o = lo;
    for t in 0..tiles {
        let r = base + usize::from(t < extra);
        conv_tile_r::<V, NV, R, STEP>(r, g, x, w, b, ks, cs, add, oh, o, o - ow0, y);
        o += r;
    }
}

/// [`conv_tile`] of `r` positions (`R/2..=R`, a size chosen at run time).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_tile_r<V: VF32, const NV: usize, const R: usize, const STEP: usize>(
    r: usize,
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    ks: (usize, usize),
    cs: (usize, usize),
    add: bool,
    oh: usize,
    o: usize,
    s: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    // (the bound lets the compiler drop the sizes above R)
    // (a tile of at least R/2 positions; the guards drop the sizes above R)
    match r {
        12 if R >= 12 => conv_tile::<V, NV, 12, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        11 if R >= 11 => conv_tile::<V, NV, 11, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        10 if R >= 10 => conv_tile::<V, NV, 10, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        9 if R >= 9 => conv_tile::<V, NV, 9, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        8 if R >= 8 => conv_tile::<V, NV, 8, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        7 if R >= 7 => conv_tile::<V, NV, 7, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        6 if R >= 6 => conv_tile::<V, NV, 6, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        5 if R >= 5 => conv_tile::<V, NV, 5, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        4 if R >= 4 => conv_tile::<V, NV, 4, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        3 if R >= 3 => conv_tile::<V, NV, 3, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        2 if R >= 2 => conv_tile::<V, NV, 2, false, STEP>(g, x, w, b, ks, cs, add, oh, o, s, y),
        _ => conv_point::<V, NV, false>(g, x, w, b, ks, cs, add, oh, o, s, y),
    }
}

/// The sums of segment position `s` before a chunk's products: the bias, or (`add`) what the
/// segment holds from the chunks before.
#[inline(always)]
fn start_sums<V: VF32, const NV: usize>(
    add: bool,
    b: (&[f32], &[f32]),
    y: &(&mut [f32], &mut [f32]),
    s: usize,
) -> [V; NV] {
    let l = V::LANES;
    let vpb = NCHWC / l;
    let mut a = [V::splat(0.0); NV];
    for (v, av) in a.iter_mut().enumerate() {
        *av = if add {
            let d = if v < vpb { &*y.0 } else { &*y.1 };
            V::load(&d[s * NCHWC + (v % vpb) * l..])
        } else {
            let bb = if v < vpb { b.0 } else { b.1 };
            V::load(&bb[(v % vpb) * l..])
        };
    }
    a
}

/// `R` positions from output column `o` (stored at segment position `s`), `NV` vectors of
/// output channels each, accumulated in registers over the input channels `c0..c1` and every
/// tap, starting from the bias or (`add`) from what `y` holds. `CHECK`: skip the taps whose
/// column falls in the padding (border positions); otherwise every tap is inside the input (the
/// caller chose interior positions). `STEP`: the distance between the positions' inputs when
/// it is known here (0: `sw * x_pos`).
///
/// On wasm a tile (and [`conv_point`]) is a function of its own: inlined into the one function
/// of every tile variant, V8's register allocator kept sums, weights and loop bounds on the
/// stack (36 of 140 instructions of the inner loop); alone, the loop keeps them in registers
/// (oww_embedding_model 6.7 -> 4.9 ms in Node, 1 thread).
#[cfg_attr(target_arch = "wasm32", inline(never))]
#[cfg_attr(not(target_arch = "wasm32"), inline(always))]
#[allow(clippy::too_many_arguments)]
fn conv_tile<V: VF32, const NV: usize, const R: usize, const CHECK: bool, const STEP: usize>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    (k0, k1): (usize, usize),
    (c0, c1): (usize, usize),
    add: bool,
    oh: usize,
    o: usize,
    s: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    let l = V::LANES;
    let vpb = NCHWC / l;
    // (no closures here: a closure is compiled without the caller's target features)
    let mut acc: [[V; NV]; R] = [[V::splat(0.0); NV]; R];
    for (r, a) in acc.iter_mut().enumerate() {
        *a = start_sums::<V, NV>(add, b, y, s + r);
    }
    let (xbs, x_pos, x_lane) = (g.xbs, g.x_pos, g.x_lane);
    let step = if STEP > 0 { STEP } else { g.sw * x_pos };
    let w_lane = g.kh * g.kw * NCHWC;
    // input channels by pieces inside one input block; in a piece, the taps outside and the
    // piece's channels innermost (one running input address and weight offset)
    let mut c = c0;
    while c < c1 {
        let (cb, lane0) = (c / xbs, c % xbs);
        let lanes = (xbs - lane0).min(c1 - c);
        for ki in k0..k1 {
            let xr = cb * g.x_blk + (oh * g.sh + ki * g.dh - g.ph) * g.iw * x_pos + lane0 * x_lane;
            for kj in 0..g.kw {
                let col = o * g.sw + kj * g.dw;
                if CHECK && (col < g.pw || col - g.pw >= g.iw) {
                    continue;
                }
                let mut wo = ((c * g.kh + ki) * g.kw + kj) * NCHWC;
                let mut x0 = xr + (col - g.pw) * x_pos;
                for _ in 0..lanes {
                    let mut ws = [V::splat(0.0); NV];
                    for (v, wr) in ws.iter_mut().enumerate() {
                        let blk = if v < vpb { w.0 } else { w.1 };
                        // SAFETY: wo + NCHWC <= cin*kh*kw*16 <= each block's length (asserted)
                        *wr = V::load(unsafe { blk.get_unchecked(wo + (v % vpb) * l..wo + NCHWC) });
                    }
                    if STEP > 0 {
                        // a constant step: the positions are displacements from one address
                        // SAFETY: as below
                        let xp = unsafe { x.as_ptr().add(x0) };
                        for (r, a) in acc.iter_mut().enumerate() {
                            // SAFETY: the tap's row and column lie inside the input (rows_in
                            // and interior columns), so the address is below the asserted need
                            let xv = V::splat(unsafe { *xp.add(r * STEP) });
                            for v in 0..NV {
                                a[v] = xv.fma(ws[v], a[v]);
                            }
                        }
                    } else {
                        // one running address (an index per position lets LLVM build the
                        // addresses in vector registers and extract them one by one)
                        let mut xi = x0;
                        for a in acc.iter_mut() {
                            // SAFETY: the tap's row and column lie inside the input (rows_in,
                            // and interior or checked columns), so the address is below the
                            // asserted need
                            let xv = V::splat(unsafe { *x.get_unchecked(xi) });
                            xi += step;
                            for v in 0..NV {
                                a[v] = xv.fma(ws[v], a[v]);
                            }
                        }
                    }
                    wo += w_lane;
                    x0 += x_lane;
                }
            }
        }
        c += lanes;
    }
    // (always a clamp, the identity where there is none: a branch at the stores would keep
    // the sums on the stack)
    let k = stored_clamp(g, c1);
    for (r, a) in acc.iter().enumerate() {
        for v in 0..NV {
            let d = if v < vpb { &mut *y.0 } else { &mut *y.1 };
            k.then(a[v])
                .store(&mut d[(s + r) * NCHWC + (v % vpb) * l..]);
        }
    }
}

/// One position (column `o`, segment position `s`) as [`conv_tile`] computes it, with the input
/// channels split over up to four partial sums: a single position's sums are one chain of
/// dependent multiply-adds otherwise, waiting on each other's latency.
#[cfg_attr(target_arch = "wasm32", inline(never))]
#[cfg_attr(not(target_arch = "wasm32"), inline(always))]
#[allow(clippy::too_many_arguments)]
fn conv_point<V: VF32, const NV: usize, const CHECK: bool>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    (k0, k1): (usize, usize),
    (c0, c1): (usize, usize),
    add: bool,
    oh: usize,
    o: usize,
    s: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    let l = V::LANES;
    let vpb = NCHWC / l;
    // partial sums: as many as keep the registers (4 * NV accumulators at most 8)
    let parts = if NV <= 2 {
        4
    } else if NV <= 4 {
        2
    } else {
        1
    };
    let mut acc = [[V::splat(0.0); NV]; 4];
    acc[0] = start_sums::<V, NV>(add, b, y, s);
    let (xbs, x_pos, x_lane) = (g.xbs, g.x_pos, g.x_lane);
    let w_lane = g.kh * g.kw * NCHWC;
    let mut c = c0;
    while c < c1 {
        let (cb, lane0) = (c / xbs, c % xbs);
        let lanes = (xbs - lane0).min(c1 - c);
        for ki in k0..k1 {
            let xr = cb * g.x_blk + (oh * g.sh + ki * g.dh - g.ph) * g.iw * x_pos + lane0 * x_lane;
            for kj in 0..g.kw {
                let col = o * g.sw + kj * g.dw;
                if CHECK && (col < g.pw || col - g.pw >= g.iw) {
                    continue;
                }
                let mut wo = ((c * g.kh + ki) * g.kw + kj) * NCHWC;
                let mut x0 = xr + (col - g.pw) * x_pos;
                let mut k = 0;
                while k + parts <= lanes {
                    for (j, a) in acc.iter_mut().enumerate().take(parts) {
                        point_fma::<V, NV>(x, w, wo + j * w_lane, x0 + j * x_lane, a);
                    }
                    wo += parts * w_lane;
                    x0 += parts * x_lane;
                    k += parts;
                }
                while k < lanes {
                    point_fma::<V, NV>(x, w, wo, x0, &mut acc[0]);
                    wo += w_lane;
                    x0 += x_lane;
                    k += 1;
                }
            }
        }
        c += lanes;
    }
    let k = stored_clamp(g, c1);
    for v in 0..NV {
        let sum = k.then(acc[0][v].add(acc[1][v]).add(acc[2][v].add(acc[3][v])));
        let d = if v < vpb { &mut *y.0 } else { &mut *y.1 };
        sum.store(&mut d[s * NCHWC + (v % vpb) * l..]);
    }
}

/// The clamp of sums stored after input channels `..c1`: the geometry's after the last ones,
/// else the identity (partial sums are stored as they are).
#[inline(always)]
fn stored_clamp(g: &NcGeom, c1: usize) -> Clamp {
    match g.clamp {
        Some(k) if c1 == g.cin => k,
        _ => Clamp::IDENTITY,
    }
}

/// `a += x[xo] * w[wo..wo + 16]` for the one or two output blocks of `w`.
#[inline(always)]
fn point_fma<V: VF32, const NV: usize>(
    x: &[f32],
    w: (&[f32], &[f32]),
    wo: usize,
    xo: usize,
    a: &mut [V; NV],
) {
    let l = V::LANES;
    let vpb = NCHWC / l;
    // SAFETY (both reads): the callers pass a tap inside the input and an input lane below
    // the piece's, so xo is below the asserted need, and wo + NCHWC <= cin*kh*kw*16
    let xv = V::splat(unsafe { *x.get_unchecked(xo) });
    for (v, av) in a.iter_mut().enumerate() {
        let blk = if v < vpb { w.0 } else { w.1 };
        let wv = V::load(unsafe { blk.get_unchecked(wo + (v % vpb) * l..wo + NCHWC) });
        *av = xv.fma(wv, *av);
    }
}

/// One output row segment (`ow0..ow1` of row `oh`) of a depthwise blocked convolution for one
/// channel block: `x` is the block's input plane ([ih][iw][16]), `w` its weights
/// ([kh][kw][16]), `b` its 16 biases, `y` receives the segment ([position][16]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn nchwc_dw_seg<V: VF32>(
    g: &NcGeom,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    oh: usize,
    ow0: usize,
    ow1: usize,
    y: &mut [f32],
) {
    assert!(
        g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0,
        "nchwc_dw_seg: empty geometry"
    );
    assert!(
        oh < g.oh && ow0 <= ow1 && ow1 <= g.ow,
        "nchwc_dw_seg: segment outside the output"
    );
    assert!(
        x.len() >= g.ih * g.iw * NCHWC
            && w.len() >= g.kh * g.kw * NCHWC
            && b.len() >= NCHWC
            && y.len() >= (ow1 - ow0) * NCHWC,
        "nchwc_dw_seg: short operands"
    );
    match NCHWC / V::LANES {
        1 => dw_seg_nv::<V, 1, 8>(g, x, w, b, oh, ow0, ow1, y),
        2 => dw_seg_nv::<V, 2, 4>(g, x, w, b, oh, ow0, ow1, y),
        _ => dw_seg_nv::<V, 4, 2>(g, x, w, b, oh, ow0, ow1, y),
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dw_seg_nv<V: VF32, const NV: usize, const R: usize>(
    g: &NcGeom,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    oh: usize,
    ow0: usize,
    ow1: usize,
    y: &mut [f32],
) {
    let (ilo, ihi) = g.interior();
    let lo = ilo.clamp(ow0, ow1);
    let hi = ihi.clamp(ow0, ow1).max(lo);
    let ks = g.rows_in(oh);
    for o in ow0..lo {
        dw_tile::<V, NV, 1, true>(g, x, w, b, ks, oh, o, o - ow0, y);
    }
    let mut o = lo;
    while o + R <= hi {
        dw_tile::<V, NV, R, false>(g, x, w, b, ks, oh, o, o - ow0, y);
        o += R;
    }
    if o < hi && hi - lo >= R {
        dw_tile::<V, NV, R, false>(g, x, w, b, ks, oh, hi - R, hi - R - ow0, y);
    } else {
        for o in o..hi {
            dw_tile::<V, NV, 1, false>(g, x, w, b, ks, oh, o, o - ow0, y);
        }
    }
    for o in hi..ow1 {
        dw_tile::<V, NV, 1, true>(g, x, w, b, ks, oh, o, o - ow0, y);
    }
}

/// `R` depthwise positions from output column `o` (segment position `s`); `CHECK` as in
/// [`conv_tile`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dw_tile<V: VF32, const NV: usize, const R: usize, const CHECK: bool>(
    g: &NcGeom,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    (k0, k1): (usize, usize),
    oh: usize,
    o: usize,
    s: usize,
    y: &mut [f32],
) {
    let l = V::LANES;
    let mut init = [V::splat(0.0); NV];
    for (v, a) in init.iter_mut().enumerate() {
        *a = V::load(&b[v * l..]);
    }
    let mut acc: [[V; NV]; R] = [init; R];
    let step = g.sw * NCHWC;
    for ki in k0..k1 {
        let xr = (oh * g.sh + ki * g.dh - g.ph) * g.iw;
        for kj in 0..g.kw {
            let col = o * g.sw + kj * g.dw;
            if CHECK && (col < g.pw || col - g.pw >= g.iw) {
                continue;
            }
            let wo = (ki * g.kw + kj) * NCHWC;
            let mut ws = [V::splat(0.0); NV];
            for (v, wr) in ws.iter_mut().enumerate() {
                *wr = V::load(&w[wo + v * l..wo + NCHWC]);
            }
            let xo = (xr + col - g.pw) * NCHWC;
            for (r, a) in acc.iter_mut().enumerate() {
                let at = xo + r * step;
                // SAFETY: the tap's row and column lie inside the plane (rows_in, and interior
                // or checked columns), and the plane's length was asserted
                let xs = unsafe { x.get_unchecked(at..at + NCHWC) };
                for v in 0..NV {
                    a[v] = V::load(&xs[v * l..]).fma(ws[v], a[v]);
                }
            }
        }
    }
    let k = g.clamp.unwrap_or(Clamp::IDENTITY);
    for (r, a) in acc.iter().enumerate() {
        for v in 0..NV {
            k.then(a[v]).store(&mut y[(s + r) * NCHWC + v * l..]);
        }
    }
}
