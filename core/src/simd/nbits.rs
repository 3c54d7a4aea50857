//! Products of f32 rows with block-quantized weights (`com.microsoft:MatMulNBits`, 4 and 8
//! bits), written once against [`VF32`].
//!
//! Each weight column holds `blocks` blocks of `bs` unsigned codes, packed low bits first (two
//! 4-bit codes a byte: element `2i` in the low nibble of byte `i`), with a scale and a zero
//! point per block: weight = (code - zero point) * scale. With `int8_a`, each block of an
//! activation row is first quantized to int8 the way ONNX Runtime's `accuracy_level` 4 does
//! (`amax = max |a|`, scale `amax / 127`, `q = round_ties_even(a * (127 / amax))`, 0 where amax
//! is 0), and a block's sum is the integer dot product `sum q * (code - zp)` times
//! `scale_a * scale_b`. Those integer sums are exact in f32 (at most 256 * 127 * 255 < 2^24),
//! so the vector code below computes them in f32 lanes in any order and gets the integers; only
//! the sum over blocks rounds.

use super::{scratch, VF32};

/// A MatMulNBits product's geometry for [`nbits_rows`].
#[derive(Clone, Copy, Debug)]
pub struct NBits {
    /// The length of an activation row (K).
    pub k: usize,
    /// Codes per block: a power of two, at least 16.
    pub bs: usize,
    /// Bits per code: 4 or 8.
    pub bits: usize,
    /// Quantize each block of the activations to int8 first (see the module's note).
    pub int8_a: bool,
    /// The zero point of every block when the product has no table of them.
    pub zp0: f32,
}

impl NBits {
    /// Blocks per column: `ceil(k / bs)`.
    pub fn blocks(&self) -> usize {
        self.k.div_ceil(self.bs)
    }
    /// Bytes per block.
    pub fn blob(&self) -> usize {
        self.bs * self.bits / 8
    }
}

/// Whether [`nbits_rows`] on this vector type takes the geometry: 4 or 8 bits, and a block
/// that is a whole number of vectors of codes.
#[inline(always)]
pub fn nbits_fits<V: VF32>(g: &NBits) -> bool {
    let per = match g.bits {
        4 => 2 * V::LANES,
        8 => V::LANES,
        _ => return false,
    };
    g.bs >= per && g.bs.is_multiple_of(per)
}

/// Quantizes (`int8_a`) or copies one activation row into `qa` (`blocks * bs` values, the
/// tail past `k` zero) with the block scales in `sa` (1 when not quantizing); for 4 bits each
/// group of `2 * LANES` values is then stored as its even elements followed by its odd ones,
/// the order [`VF32::nibbles`] unpacks codes in.
#[inline(always)]
fn prepare_row<V: VF32>(g: &NBits, a: &[f32], qa: &mut [f32], sa: &mut [f32], sq: &mut [f32]) {
    let (bs, l) = (g.bs, V::LANES);
    qa[..g.k].copy_from_slice(&a[..g.k]);
    qa[g.k..].fill(0.0);
    for ((blk, s), q) in qa
        .chunks_exact_mut(bs)
        .zip(sa.iter_mut())
        .zip(sq.iter_mut())
    {
        *s = 1.0;
        *q = 0.0;
        if g.int8_a {
            let mut m = V::splat(0.0);
            for c in blk.chunks_exact(l) {
                m = V::load(c).abs().max(m);
            }
            let amax = m.hmax();
            *s = amax / 127.0;
            let inv = V::splat(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let mut sum = V::splat(0.0);
            for c in blk.chunks_exact_mut(l) {
                let v = V::load(c).mul(inv).round();
                sum = sum.add(v);
                v.store(c);
            }
            // integers below 2^16: exact in any order
            *q = sum.hsum();
        }
        if g.bits == 4 {
            for c in blk.chunks_exact_mut(2 * l) {
                let (ev, od) = V::load(c).deinterleave(V::load(&c[l..]));
                ev.store(c);
                od.store(&mut c[l..]);
            }
        }
    }
}

/// One in lane 0, zeros after (loaded as a vector of any width up to 16 lanes).
const LANE0: [f32; 16] = [
    1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
];

/// Adds one block's products of the prepared values `q` with the codes of `C` columns (column
/// `c`'s block at `b[offs[c]..]`) to `d`: each code less `z` when `SHIFT`, as it is otherwise.
#[inline(always)]
fn block_dot<V: VF32, const C: usize, const SHIFT: bool>(
    g: &NBits,
    q: &[f32],
    b: &[u8],
    offs: [usize; C],
    z: [V; C],
    d: &mut [V; C],
) {
    let l = V::LANES;
    let code = |v: V, c: usize| if SHIFT { v.sub(z[c]) } else { v };
    if g.bits == 4 {
        for (gi, x) in q.chunks_exact(2 * l).enumerate() {
            let (x0, x1) = (V::load(x), V::load(&x[l..]));
            for c in 0..C {
                let (lo, hi) = V::nibbles(&b[offs[c] + gi * l..]);
                d[c] = x0.fma(code(lo, c), d[c]);
                d[c] = x1.fma(code(hi, c), d[c]);
            }
        }
    } else {
        for (gi, x) in q.chunks_exact(l).enumerate() {
            let x = V::load(x);
            for c in 0..C {
                d[c] = x.fma(code(V::bytes(&b[offs[c] + gi * l..]), c), d[c]);
            }
        }
    }
}

/// The dot products of one prepared row with `C` consecutive columns starting at `j`.
#[inline(always)]
fn dot_cols<V: VF32, const C: usize>(
    g: &NBits,
    (qa, sa, sq): (&[f32], &[f32], &[f32]),
    (b, scales, zp): (&[u8], &[f32], Option<&[f32]>),
    j: usize,
) -> [f32; C] {
    let (bs, blocks, blob) = (g.bs, g.blocks(), g.blob());
    let col = blocks * blob;
    let mut acc = [V::splat(0.0); C];
    for bi in 0..blocks {
        let q = &qa[bi * bs..(bi + 1) * bs];
        let zc = |c: usize| zp.map_or(g.zp0, |zp| zp[(j + c) * blocks + bi]);
        let mut d = [V::splat(0.0); C];
        let offs: [usize; C] = core::array::from_fn(|c| (j + c) * col + bi * blob);
        if g.int8_a {
            // integer sums: the zero point's part, -zp * sum(q), starts lane 0, and the codes
            // enter unshifted (every partial sum stays an integer below 2^24, so exact)
            let lane0 = V::load(&LANE0[..]);
            for (c, dc) in d.iter_mut().enumerate() {
                *dc = lane0.mul(V::splat(-zc(c) * sq[bi]));
            }
            block_dot::<V, C, false>(g, q, b, offs, [V::splat(0.0); C], &mut d);
        } else {
            // float activations: the zero point comes off each code first
            let z: [V; C] = core::array::from_fn(|c| V::splat(zc(c)));
            block_dot::<V, C, true>(g, q, b, offs, z, &mut d);
        }
        for c in 0..C {
            let s = sa[bi] * scales[(j + c) * blocks + bi];
            acc[c] = d[c].fma(V::splat(s), acc[c]);
        }
    }
    core::array::from_fn(|c| acc[c].hsum())
}

/// `y[r * ldy + c] = sum_k a[r * k + k'] * w(k', c)` for `r < rows`, `c < cols`, where column
/// `c`'s codes are `b[c * blocks * blob..]`, its block scales `scales[c * blocks..]` and its
/// zero points `zp[c * blocks..]` (`g.zp0` everywhere without a table). The geometry must
/// satisfy [`nbits_fits`] for this vector type and the slices must hold what they index.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn nbits_rows<V: VF32>(
    g: &NBits,
    a: &[f32],
    rows: usize,
    b: &[u8],
    scales: &[f32],
    zp: Option<&[f32]>,
    cols: usize,
    y: &mut [f32],
    ldy: usize,
) {
    assert!(nbits_fits::<V>(g), "nbits_rows: geometry {g:?}");
    let (blocks, kp) = (g.blocks(), g.blocks() * g.bs);
    // every row prepared first, so that each group of columns is read once for all rows
    let mut qa = scratch::<f32>(rows * kp);
    let mut sa = scratch::<f32>(rows * blocks);
    let mut sq = scratch::<f32>(rows * blocks);
    for r in 0..rows {
        let bl = r * blocks..(r + 1) * blocks;
        prepare_row::<V>(
            g,
            &a[r * g.k..(r + 1) * g.k],
            &mut qa[r * kp..(r + 1) * kp],
            &mut sa[bl.clone()],
            &mut sq[bl],
        );
    }
    let w = (b, scales, zp);
    let row = |r: usize| {
        let bl = r * blocks..(r + 1) * blocks;
        (&qa[r * kp..(r + 1) * kp], &sa[bl.clone()], &sq[bl])
    };
    let mut j = 0;
    while j + 4 <= cols {
        for r in 0..rows {
            let d = dot_cols::<V, 4>(g, row(r), w, j);
            y[r * ldy + j..r * ldy + j + 4].copy_from_slice(&d);
        }
        j += 4;
    }
    while j < cols {
        for r in 0..rows {
            y[r * ldy + j] = dot_cols::<V, 1>(g, row(r), w, j)[0];
        }
        j += 1;
    }
}

/// Reorders one row of K activations (`a.len() == blocks * bs`, zero past K) the way
/// [`nbits_dequant`] lays out weights: for 4 bits, each group of `2 * LANES` as its even
/// elements then its odd ones (8 bits: unchanged).
#[inline(always)]
pub fn nbits_permute<V: VF32>(g: &NBits, a: &mut [f32]) {
    let l = V::LANES;
    if g.bits == 4 {
        for c in a.chunks_exact_mut(2 * l) {
            let (ev, od) = V::load(c).deinterleave(V::load(&c[l..]));
            ev.store(c);
            od.store(&mut c[l..]);
        }
    }
}

/// Dequantizes `cols` weight columns (laid out as for [`nbits_rows`]) into `out`, column `c`
/// at `out[c * blocks * bs..]`, each group of codes in [`nbits_permute`]'s order.
#[inline(always)]
pub fn nbits_dequant<V: VF32>(
    g: &NBits,
    b: &[u8],
    scales: &[f32],
    zp: Option<&[f32]>,
    cols: usize,
    out: &mut [f32],
) {
    assert!(nbits_fits::<V>(g), "nbits_dequant: geometry {g:?}");
    let (bs, l, blocks, blob) = (g.bs, V::LANES, g.blocks(), g.blob());
    for c in 0..cols {
        for bi in 0..blocks {
            let s = V::splat(scales[c * blocks + bi]);
            let z = V::splat(zp.map_or(g.zp0, |zp| zp[c * blocks + bi]));
            let src = &b[(c * blocks + bi) * blob..];
            let dst = &mut out[(c * blocks + bi) * bs..(c * blocks + bi + 1) * bs];
            if g.bits == 4 {
                for (gi, d) in dst.chunks_exact_mut(2 * l).enumerate() {
                    let (lo, hi) = V::nibbles(&src[gi * l..]);
                    lo.sub(z).mul(s).store(d);
                    hi.sub(z).mul(s).store(&mut d[l..]);
                }
            } else {
                for (gi, d) in dst.chunks_exact_mut(l).enumerate() {
                    V::bytes(&src[gi * l..]).sub(z).mul(s).store(d);
                }
            }
        }
    }
}
