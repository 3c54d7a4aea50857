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

use super::VF32;

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
    for o in ow0..lo {
        conv_tile::<V, NV, 1, true>(g, x, w, b, ks, oh, o, o - ow0, &mut y);
    }
    if lo < hi {
        let span = (lo, hi);
        // the register tile: about 24 accumulators with 32 registers, 12 with 16
        match (NV, many_regs::<V>()) {
            (1, _) => conv_tiles::<V, NV, 12>(g, x, w, b, ks, oh, span, ow0, &mut y),
            (2, true) => conv_tiles::<V, NV, 12>(g, x, w, b, ks, oh, span, ow0, &mut y),
            (2, false) | (4, true) => conv_tiles::<V, NV, 6>(g, x, w, b, ks, oh, span, ow0, &mut y),
            (4, false) | (8, true) => conv_tiles::<V, NV, 3>(g, x, w, b, ks, oh, span, ow0, &mut y),
            _ => conv_tiles::<V, NV, 1>(g, x, w, b, ks, oh, span, ow0, &mut y),
        }
    }
    for o in hi..ow1 {
        conv_tile::<V, NV, 1, true>(g, x, w, b, ks, oh, o, o - ow0, &mut y);
    }
}

/// Interior positions `lo..hi` in tiles of `R` (the last one overlapping the one before when
/// the span is not a multiple: it rewrites the same values), narrower spans in tiles of 4 and 1.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_tiles<V: VF32, const NV: usize, const R: usize>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    ks: (usize, usize),
    oh: usize,
    (lo, hi): (usize, usize),
    ow0: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    let span = hi - lo;
    if span >= R {
        let mut o = lo;
        while o + R <= hi {
            conv_tile::<V, NV, R, false>(g, x, w, b, ks, oh, o, o - ow0, y);
            o += R;
        }
        if o < hi {
            conv_tile::<V, NV, R, false>(g, x, w, b, ks, oh, hi - R, hi - R - ow0, y);
        }
    } else if R > 4 && span >= 4 {
        let mut o = lo;
        while o + 4 <= hi {
            conv_tile::<V, NV, 4, false>(g, x, w, b, ks, oh, o, o - ow0, y);
            o += 4;
        }
        if o < hi {
            conv_tile::<V, NV, 4, false>(g, x, w, b, ks, oh, hi - 4, hi - 4 - ow0, y);
        }
    } else {
        for o in lo..hi {
            conv_tile::<V, NV, 1, false>(g, x, w, b, ks, oh, o, o - ow0, y);
        }
    }
}

/// `R` positions from output column `o` (stored at segment position `s`), `NV` vectors of
/// output channels each, all accumulated in registers over every input channel and tap.
/// `CHECK`: skip the taps whose column falls in the padding (border positions); otherwise
/// every tap is inside the input (the caller chose interior positions).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_tile<V: VF32, const NV: usize, const R: usize, const CHECK: bool>(
    g: &NcGeom,
    x: &[f32],
    w: (&[f32], &[f32]),
    b: (&[f32], &[f32]),
    (k0, k1): (usize, usize),
    oh: usize,
    o: usize,
    s: usize,
    y: &mut (&mut [f32], &mut [f32]),
) {
    let l = V::LANES;
    let vpb = NCHWC / l;
    // (no closures here: a closure is compiled without the caller's target features)
    let mut init = [V::splat(0.0); NV];
    for (v, a) in init.iter_mut().enumerate() {
        let bb = if v < vpb { b.0 } else { b.1 };
        *a = V::load(&bb[(v % vpb) * l..]);
    }
    let mut acc: [[V; NV]; R] = [init; R];
    let (xbs, x_pos, x_lane) = (g.xbs, g.x_pos, g.x_lane);
    let step = g.sw * x_pos;
    let w_lane = g.kh * g.kw * NCHWC;
    // input channels block by block; in a block, the taps outside and the block's channels
    // innermost (one running input address and weight offset)
    for (cb, ic0) in (0..g.cin).step_by(xbs).enumerate() {
        let lanes = xbs.min(g.cin - ic0);
        for ki in k0..k1 {
            let xr = cb * g.x_blk + (oh * g.sh + ki * g.dh - g.ph) * g.iw * x_pos;
            for kj in 0..g.kw {
                let col = o * g.sw + kj * g.dw;
                if CHECK && (col < g.pw || col - g.pw >= g.iw) {
                    continue;
                }
                let mut wo = ((ic0 * g.kh + ki) * g.kw + kj) * NCHWC;
                let mut x0 = xr + (col - g.pw) * x_pos;
                for _ in 0..lanes {
                    let mut ws = [V::splat(0.0); NV];
                    for (v, wr) in ws.iter_mut().enumerate() {
                        let blk = if v < vpb { w.0 } else { w.1 };
                        // SAFETY: wo + NCHWC <= cin*kh*kw*16 <= each block's length (asserted)
                        *wr = V::load(unsafe { blk.get_unchecked(wo + (v % vpb) * l..wo + NCHWC) });
                    }
                    // one running address (an index per position lets LLVM build the
                    // addresses in vector registers and extract them one by one)
                    let mut xi = x0;
                    for a in acc.iter_mut() {
                        // SAFETY: the tap's row and column lie inside the input (rows_in, and
                        // interior or checked columns), so the address is below the asserted need
                        let xv = V::splat(unsafe { *x.get_unchecked(xi) });
                        xi += step;
                        for v in 0..NV {
                            a[v] = xv.fma(ws[v], a[v]);
                        }
                    }
                    wo += w_lane;
                    x0 += x_lane;
                }
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        for v in 0..NV {
            let d = if v < vpb { &mut *y.0 } else { &mut *y.1 };
            a[v].store(&mut d[(s + r) * NCHWC + (v % vpb) * l..]);
        }
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
    for (r, a) in acc.iter().enumerate() {
        for v in 0..NV {
            a[v].store(&mut y[(s + r) * NCHWC + v * l..]);
        }
    }
}
