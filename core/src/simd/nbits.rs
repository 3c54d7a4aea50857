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

use alloc::vec::Vec;

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

/// 4-bit weights repacked for [`q4_rows`] on a vector type of `lanes` lanes: columns in
/// groups of `lanes` (the last one padded with zero weights), and within a group, per block
/// and per 8 rows of K, `4 * lanes` bytes where byte `4j + t` holds column `j`'s code for
/// row `t` in its low nibble and for row `4 + t` in its high one. One load and two masks
/// then give [`VF32::q_dot`] four rows of every column of the group at once, so that each
/// lane accumulates one column and nothing is summed across lanes.
#[derive(Clone, Debug)]
pub struct Q4Packed {
    pub lanes: usize,
    /// Columns (N).
    pub n: usize,
    pub blocks: usize,
    pub bs: usize,
    pub codes: Vec<u8>,
    /// Per group, block and lane: the scale and the zero point.
    pub scales: Vec<f32>,
    pub zp: Vec<f32>,
}

impl Q4Packed {
    /// Groups of `lanes` columns.
    pub fn groups(&self) -> usize {
        self.n.div_ceil(self.lanes)
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * (self.scales.len() + self.zp.len())
    }
}

/// Repacks 4-bit weights laid out as for [`nbits_rows`] (`g.bits == 4`, `g.bs` a multiple of
/// 8) for a vector type of `lanes` lanes.
pub fn q4_pack(
    lanes: usize,
    g: &NBits,
    b: &[u8],
    scales: &[f32],
    zp: Option<&[f32]>,
    n: usize,
) -> Q4Packed {
    assert!(
        g.bits == 4 && g.bs.is_multiple_of(8),
        "q4_pack: geometry {g:?}"
    );
    let (bs, blocks, blob) = (g.bs, g.blocks(), g.blob());
    let groups = n.div_ceil(lanes);
    let mut codes = alloc::vec![0u8; groups * blocks * bs / 2 * lanes];
    let mut sc = alloc::vec![0f32; groups * blocks * lanes];
    let mut zpv = alloc::vec![0f32; groups * blocks * lanes];
    let code =
        |c: usize, bi: usize, i: usize| (b[(c * blocks + bi) * blob + i / 2] >> (4 * (i % 2))) & 15;
    for gi in 0..groups {
        for bi in 0..blocks {
            let at = (gi * blocks + bi) * lanes;
            for j in 0..lanes.min(n - gi * lanes) {
                let c = gi * lanes + j;
                sc[at + j] = scales[c * blocks + bi];
                zpv[at + j] = zp.map_or(g.zp0, |z| z[c * blocks + bi]);
                for kk in 0..bs / 8 {
                    let dst = (at * bs / 2) + kk * 4 * lanes + 4 * j;
                    for t in 0..4 {
                        let (lo, hi) = (code(c, bi, 8 * kk + t), code(c, bi, 8 * kk + 4 + t));
                        codes[dst + t] = lo | (hi << 4);
                    }
                }
            }
        }
    }
    Q4Packed {
        lanes,
        n,
        blocks,
        bs,
        codes,
        scales: sc,
        zp: zpv,
    }
}

/// Activation rows quantized to int8 per block the way ONNX Runtime's `accuracy_level` 4
/// does (see the module's note): `q` (`rows x blocks * bs` bytes, int8 bit patterns, zero
/// past K), the block scales `sa`, and the block sums of `q` in `sq`.
#[derive(Clone, Debug, Default)]
pub struct Q8Rows {
    pub rows: usize,
    pub kp: usize,
    pub q: Vec<u8>,
    pub sa: Vec<f32>,
    pub sq: Vec<f32>,
}

/// Quantizes `rows` rows of `k` activations in blocks of `bs` (see [`Q8Rows`]).
pub fn q8_rows(a: &[f32], rows: usize, k: usize, bs: usize) -> Q8Rows {
    let blocks = k.div_ceil(bs);
    let kp = blocks * bs;
    let mut out = Q8Rows {
        rows,
        kp,
        q: alloc::vec![0u8; rows * kp],
        sa: alloc::vec![0f32; rows * blocks],
        sq: alloc::vec![0f32; rows * blocks],
    };
    for r in 0..rows {
        let row = &a[r * k..(r + 1) * k];
        for (bi, blk) in row.chunks(bs).enumerate() {
            let amax = blk.iter().fold(0f32, |m, x| x.abs().max(m));
            let s = amax / 127.0;
            let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut sum = 0i32;
            let dst = &mut out.q[r * kp + bi * bs..];
            for (d, &x) in dst.iter_mut().zip(blk) {
                // round to nearest, ties to even: |x * inv| <= 127 leaves no fraction bits
                // after adding 1.5 * 2^23
                let v = ((x * inv + 12_582_912.0) - 12_582_912.0) as i32;
                sum += v;
                *d = v as i8 as u8;
            }
            out.sa[r * blocks + bi] = s;
            out.sq[r * blocks + bi] = sum as f32;
        }
    }
    out
}

/// Rows `r0..r0 + R` of `a` times column group `gi` of `p`: per block, the int8 dot products
/// of every column in the group's lanes less `zp * sum(q)` (integers below 2^24: exact in
/// f32), times `scale_a * scale_b`, added in f32.
#[inline(always)]
fn q4_tile<V: VF32, const R: usize>(p: &Q4Packed, a: &Q8Rows, r0: usize, gi: usize) -> [V; R] {
    let (l, bs, blocks) = (V::LANES, p.bs, p.blocks);
    let mut acc = [V::splat(0.0); R];
    for bi in 0..blocks {
        let at = (gi * blocks + bi) * l;
        let codes = &p.codes[at * bs / 2..(at + l) * bs / 2];
        let mut d = [V::q_zero(); R];
        for (kk, c) in codes.chunks_exact(4 * l).enumerate() {
            let (lo, hi) = V::q_nibbles(c);
            for (r, dr) in d.iter_mut().enumerate() {
                let o = (r0 + r) * a.kp + bi * bs + 8 * kk;
                let q = &a.q[o..o + 8];
                let q0 = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
                let q1 = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
                *dr = V::q_dot(V::q_dot(*dr, lo, q0), hi, q1);
            }
        }
        let (s, z) = (V::load(&p.scales[at..]), V::load(&p.zp[at..]));
        for r in 0..R {
            let i = (r0 + r) * blocks + bi;
            let dot = z.fma(V::splat(-a.sq[i]), V::q_f32(d[r]));
            acc[r] = dot.fma(s.mul(V::splat(a.sa[i])), acc[r]);
        }
    }
    acc
}

/// Where each of a block's four partial sums goes among the sixteen accumulators of a group
/// of four blocks, by the block's place in the group (see [`q4_tile32`]).
const SLOT32: [[usize; 4]; 4] = [[0, 1, 4, 5], [8, 9, 12, 13], [2, 3, 6, 7], [10, 11, 14, 15]];

/// [`q4_tile`] for blocks of 32, rounded as ONNX Runtime's MLAS kernel for them (AVX-512
/// VNNI, blocks of 32 at accuracy level 4) rounds, fitted to its outputs bit for bit (every
/// element of M = 1, 2 and 8 products of 768 columns): per column, each block's 32 products
/// with the unsigned codes as four integer partial sums of 8 (elements 0-3 and 8-11, 4-7 and
/// 12-15, 16-19 and 24-27, 20-23 and 28-31), each times `scale_a * scale_b` fused into one of
/// 16 f32 sums (four blocks share the 16), those folded pairwise (sum i plus sum i + 8); the
/// blocks past the last four whole groups as eight partial sums of 4 into the 8; the 8 added
/// as `((s0 + s1) + s2) + s3` plus the same of s4..s7; then the zero points' share
/// `sum_b (scale_a * sum q) * (-zp * scale_b)` (fused, in block order, from 0) added last.
/// Order-dependent roundings of a few ulp, but an int4 decoder's greedy tokens at accuracy
/// level 4 change with them (the next quantization turns a last bit into a whole int8 step).
#[inline(always)]
fn q4_tile32<V: VF32, const R: usize, const TAIL: bool>(
    p: &Q4Packed,
    a: &Q8Rows,
    r0: usize,
    gi: usize,
    bias: V,
) -> [V; R] {
    let blocks = p.blocks;
    debug_assert_eq!(p.bs, 32);
    let z = V::splat(0.0);
    let mut acc16 = [[z; 16]; R];
    let mut zps = [z; R];
    let whole = blocks / 4 * 4;
    // four blocks at a time, each through its own constant slots (a run-time slot index
    // would keep the sums in memory)
    for b4 in (0..whole).step_by(4) {
        q4_block32::<V, R, 0>(p, a, (r0, gi, b4), &mut acc16, &mut zps);
        q4_block32::<V, R, 1>(p, a, (r0, gi, b4 + 1), &mut acc16, &mut zps);
        q4_block32::<V, R, 2>(p, a, (r0, gi, b4 + 2), &mut acc16, &mut zps);
        q4_block32::<V, R, 3>(p, a, (r0, gi, b4 + 3), &mut acc16, &mut zps);
    }
    let mut acc8 = [[z; 8]; R];
    for r in 0..R {
        for j in 0..8 {
            acc8[r][j] = acc16[r][j].add(acc16[r][j + 8]);
        }
    }
    for bi in whole..blocks {
        q4_block32_rest::<V, R>(p, a, (r0, gi, bi), &mut acc8, &mut zps);
    }
    let mut out = [z; R];
    for r in 0..R {
        let s = &acc8[r];
        let dot = if TAIL {
            // the last N % 4 columns: ONNX Runtime's one-column kernel folds its 8 sums as
            // ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))
            let lo = s[0].add(s[4]).add(s[2].add(s[6]));
            let hi = s[1].add(s[5]).add(s[3].add(s[7]));
            lo.add(hi)
        } else {
            let lo = s[0].add(s[1]).add(s[2]).add(s[3]);
            let hi = s[4].add(s[5]).add(s[6]).add(s[7]);
            lo.add(hi)
        };
        // the bias before the zero points' share, as ONNX Runtime adds them
        out[r] = dot.add(bias).add(zps[r]);
    }
    out
}

/// A block of 32 codes for one group of columns: (lo, hi) codes per 8 elements, the
/// `scale_b` lanes and the `-zp * scale_b` lanes.
type Block32<V> = ([(<V as VF32>::Q, <V as VF32>::Q); 4], V, V);

/// Block `bi`'s codes for column group `gi` (see [`Block32`]).
#[inline(always)]
fn q4_block32_codes<V: VF32>(p: &Q4Packed, gi: usize, bi: usize) -> Block32<V> {
    let l = V::LANES;
    let at = (gi * p.blocks + bi) * l;
    let codes = &p.codes[at * 16..(at + l) * 16];
    let nib = [
        V::q_nibbles(codes),
        V::q_nibbles(&codes[4 * l..]),
        V::q_nibbles(&codes[8 * l..]),
        V::q_nibbles(&codes[12 * l..]),
    ];
    let s = V::load(&p.scales[at..]);
    (nib, s, V::splat(0.0).sub(V::load(&p.zp[at..])).mul(s))
}

/// Row `row`'s int8 activations of block `bi` as eight words of four, and its `scale_a *
/// scale_b` lanes; the block's zero-point share `(scale_a sum q) (-zp scale_b)` is fused into
/// `zp`.
#[inline(always)]
fn q4_row32<V: VF32>(
    p: &Q4Packed,
    a: &Q8Rows,
    (row, bi): (usize, usize),
    (s, nzs): (V, V),
    zp: &mut V,
) -> ([u32; 8], V) {
    let i = row * p.blocks + bi;
    let o = row * a.kp + bi * 32;
    let q = &a.q[o..o + 32];
    let mut w = [0u32; 8];
    for (e, wd) in w.iter_mut().enumerate() {
        *wd = u32::from_le_bytes([q[4 * e], q[4 * e + 1], q[4 * e + 2], q[4 * e + 3]]);
    }
    *zp = V::splat(a.sa[i] * a.sq[i]).fma(nzs, *zp);
    (w, s.mul(V::splat(a.sa[i])))
}

/// One block of a group of four (place `P`) into [`q4_tile32`]'s 16 sums: its four partial
/// sums of 8 into the sums `SLOT32[P]`, its zero points' share into `zps`.
#[inline(always)]
fn q4_block32<V: VF32, const R: usize, const P: usize>(
    p: &Q4Packed,
    a: &Q8Rows,
    (r0, gi, bi): (usize, usize, usize),
    acc16: &mut [[V; 16]; R],
    zps: &mut [V; R],
) {
    let (nib, s, nzs) = q4_block32_codes::<V>(p, gi, bi);
    let [s0, s1, s2, s3] = SLOT32[P];
    for r in 0..R {
        let (w, sab) = q4_row32(p, a, (r0 + r, bi), (s, nzs), &mut zps[r]);
        let zq = V::q_zero();
        let p0 = V::q_f32(V::q_dot(V::q_dot(zq, nib[0].0, w[0]), nib[1].0, w[2]));
        let p1 = V::q_f32(V::q_dot(V::q_dot(zq, nib[0].1, w[1]), nib[1].1, w[3]));
        let p2 = V::q_f32(V::q_dot(V::q_dot(zq, nib[2].0, w[4]), nib[3].0, w[6]));
        let p3 = V::q_f32(V::q_dot(V::q_dot(zq, nib[2].1, w[5]), nib[3].1, w[7]));
        let acc = &mut acc16[r];
        acc[s0] = p0.fma(sab, acc[s0]);
        acc[s1] = p1.fma(sab, acc[s1]);
        acc[s2] = p2.fma(sab, acc[s2]);
        acc[s3] = p3.fma(sab, acc[s3]);
    }
}

/// A block past the last whole group of four: eight partial sums of 4 into the 8 sums.
#[inline(always)]
fn q4_block32_rest<V: VF32, const R: usize>(
    p: &Q4Packed,
    a: &Q8Rows,
    (r0, gi, bi): (usize, usize, usize),
    acc8: &mut [[V; 8]; R],
    zps: &mut [V; R],
) {
    let (nib, s, nzs) = q4_block32_codes::<V>(p, gi, bi);
    for r in 0..R {
        let (w, sab) = q4_row32(p, a, (r0 + r, bi), (s, nzs), &mut zps[r]);
        for (kk, &(lo, hi)) in nib.iter().enumerate() {
            let pl = V::q_f32(V::q_dot(V::q_zero(), lo, w[2 * kk]));
            let ph = V::q_f32(V::q_dot(V::q_zero(), hi, w[2 * kk + 1]));
            acc8[r][2 * kk] = pl.fma(sab, acc8[r][2 * kk]);
            acc8[r][2 * kk + 1] = ph.fma(sab, acc8[r][2 * kk + 1]);
        }
    }
}

/// Stores a tile of rows `r0..r0 + R` for column group `gi` at group slot `slot` of `y`
/// (columns past N left out).
#[inline(always)]
fn q4_put<V: VF32, const R: usize>(
    p: &Q4Packed,
    tile: [V; R],
    (r0, slot, gi): (usize, usize, usize),
    y: &mut [f32],
    ldy: usize,
) {
    let l = V::LANES;
    let cols = l.min(p.n - gi * l);
    for (i, v) in tile.into_iter().enumerate() {
        let o = (r0 + i) * ldy + slot * l;
        if cols == l {
            v.store(&mut y[o..o + l]);
        } else {
            let mut tmp = [0f32; 16];
            v.store(&mut tmp[..l]);
            y[o..o + cols].copy_from_slice(&tmp[..cols]);
        }
    }
}

/// A tile's rows plus the bias lanes.
#[inline(always)]
fn biased<V: VF32, const R: usize>(mut t: [V; R], b: V) -> [V; R] {
    t.iter_mut().for_each(|v| *v = v.add(b));
    t
}

/// `y[r * ldy + c]` for every row of `a` and the columns of groups `g0..g1` of `p` (`c`
/// counted from group `g0`'s first column; columns past N are not written). `p` must have
/// been packed for this vector type's lanes.
#[inline(always)]
pub fn q4_rows<V: VF32>(
    p: &Q4Packed,
    a: &Q8Rows,
    (g0, g1): (usize, usize),
    y: &mut [f32],
    ldy: usize,
    bias: Option<&[f32]>,
) {
    assert!(
        p.lanes == V::LANES && a.kp == p.blocks * p.bs,
        "q4_rows: packing"
    );
    for gi in g0..g1 {
        let mut r0 = 0;
        // the group's bias lanes (zero past N, or without a bias)
        let bv = {
            let l = V::LANES;
            let mut b = [0f32; 16];
            if let Some(bias) = bias {
                let c0 = gi * l;
                let cols = l.min(p.n.saturating_sub(c0));
                b[..cols].copy_from_slice(&bias[c0..c0 + cols]);
            }
            V::load(&b[..l])
        };
        if p.bs == 32 {
            // ONNX Runtime's rounding for blocks of 32 (16 sums per row: a row at a time,
            // which measured faster than two, whose 32 sums spill)
            let l = V::LANES;
            let tail0 = p.n - p.n % 4;
            let has_tail = !p.n.is_multiple_of(4) && (gi + 1) * l > tail0;
            while r0 < a.rows {
                let mut t = q4_tile32::<V, 1, false>(p, a, r0, gi, bv);
                if has_tail {
                    // ONNX Runtime computes the last N % 4 columns apart, summed otherwise
                    let tt = q4_tile32::<V, 1, true>(p, a, r0, gi, bv);
                    let (mut x, mut w) = ([0f32; 16], [0f32; 16]);
                    t[0].store(&mut x[..l]);
                    tt[0].store(&mut w[..l]);
                    for (lane, xv) in x[..l].iter_mut().enumerate() {
                        if gi * l + lane >= tail0 {
                            *xv = w[lane];
                        }
                    }
                    t = [V::load(&x[..l])];
                }
                q4_put(p, t, (r0, gi - g0, gi), y, ldy);
                r0 += 1;
            }
            continue;
        }
        while r0 < a.rows {
            let r = (a.rows - r0).min(4);
            let at = (r0, gi - g0, gi);
            match r {
                1 => q4_put(p, biased(q4_tile::<V, 1>(p, a, r0, gi), bv), at, y, ldy),
                2 => q4_put(p, biased(q4_tile::<V, 2>(p, a, r0, gi), bv), at, y, ldy),
                3 => q4_put(p, biased(q4_tile::<V, 3>(p, a, r0, gi), bv), at, y, ldy),
                _ => q4_put(p, biased(q4_tile::<V, 4>(p, a, r0, gi), bv), at, y, ldy),
            }
            r0 += r;
        }
    }
}

/// Weights of a MatMulNBits product as int8 `code - zero point` (every such difference in
/// -128..=127: 4-bit codes, 8-bit codes around 128, the MXFP4 values `2v`), for float
/// activations split into two int16 parts (see [`x16_rows`]): the float product to within
/// float rounding, from integer dot products.
///
/// Columns come in groups of `lanes`; a group holds, for each pair of rows `2i, 2i + 1` of
/// K (padded with zeros to `kp`), each column's two weights side by side, so that
/// [`VF32::q_wide`] gives one column a lane; `scales` hold each group's weight-block scales
/// once per activation sub-block (`sub` rows of K, at most 256, within one weight block).
#[derive(Clone, Debug)]
pub struct W8Packed {
    pub lanes: usize,
    /// Columns (N).
    pub n: usize,
    /// K padded to whole weight blocks.
    pub kp: usize,
    /// Rows of K per activation scale.
    pub sub: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

impl W8Packed {
    /// Groups of `lanes` columns.
    pub fn groups(&self) -> usize {
        self.n.div_ceil(self.lanes)
    }
    /// Activation sub-blocks per row.
    pub fn subs(&self) -> usize {
        self.kp / self.sub
    }
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }
}

/// The activation sub-block for weight blocks of `bs` rows: the block, at most 256 rows (so
/// that an int16 x int8 sum over it stays below 2^31).
pub fn w8_sub(bs: usize) -> usize {
    bs.min(256)
}

/// Repacks 4- or 8-bit weights laid out as for [`nbits_rows`] for a vector type of `lanes`
/// lanes, or `None` where a weight's `code - zero point` is not an int8 (or a zero point not
/// an integer).
pub fn w8_pack(
    lanes: usize,
    g: &NBits,
    b: &[u8],
    scales: &[f32],
    zp: Option<&[f32]>,
    n: usize,
) -> Option<W8Packed> {
    if !matches!(g.bits, 4 | 8) {
        return None;
    }
    let (bs, blocks, blob) = (g.bs, g.blocks(), g.blob());
    let kp = blocks * bs;
    let sub = w8_sub(bs);
    let subs = kp / sub;
    let groups = n.div_ceil(lanes);
    if b.len() < n * blocks * blob || scales.len() < n * blocks {
        return None;
    }
    let mut codes = alloc::vec![0u8; groups * kp * lanes];
    let mut sc = alloc::vec![0f32; groups * subs * lanes];
    for c in 0..n {
        let (gi, j) = (c / lanes, c % lanes);
        let col = &b[c * blocks * blob..(c + 1) * blocks * blob];
        for bi in 0..blocks {
            let z = zp.map_or(g.zp0, |z| z[c * blocks + bi]);
            if !(0.0..=255.0).contains(&z) || z as i32 as f32 != z {
                return None;
            }
            let z = z as i32;
            for s in 0..bs / sub {
                sc[(gi * subs + bi * bs / sub + s) * lanes + j] = scales[c * blocks + bi];
            }
            for e in 0..bs {
                let code = if g.bits == 8 {
                    col[bi * blob + e] as i32
                } else {
                    ((col[bi * blob + e / 2] >> (4 * (e % 2))) & 15) as i32
                };
                let kk = bi * bs + e;
                let w = if kk < g.k { code - z } else { 0 };
                if !(-128..=127).contains(&w) {
                    return None;
                }
                codes[((gi * kp / 2 + kk / 2) * lanes + j) * 2 + kk % 2] = w as i8 as u8;
            }
        }
    }
    Some(W8Packed {
        lanes,
        n,
        kp,
        sub,
        codes,
        scales: sc,
    })
}

/// Activation rows, each sub-block of `sub` values split as `x = s1 * q1 + s2 * q2 + e`
/// with int16 `q1` (`s1 = max|x| / 32767`), `q2` the rounded remainder in steps of
/// `s2 = s1 / 16384` and `|e| <= s1 / 32768`, below half a float step of `max|x|`: the
/// integer products of `q1` and `q2` rebuild the float product. `hi` and `lo` hold `q1`
/// and `q2` two to a word (rows `2i`, `2i + 1` of K, the first in the low half); `s` holds
/// `s1, s2` per row and sub-block.
#[derive(Clone, Debug, Default)]
pub struct X16Rows {
    pub rows: usize,
    pub kp: usize,
    pub sub: usize,
    pub hi: Vec<u32>,
    pub lo: Vec<u32>,
    pub s: Vec<f32>,
    /// False where a sub-block held a NaN, an infinity or a maximum below 2^-100 (whose
    /// scales overflow): the split does not hold, and the caller computes in float.
    pub exact: bool,
}

/// Splits `rows` rows of `k` activations (padded to `kp` with zeros) in sub-blocks of `sub`
/// (see [`X16Rows`]).
#[inline(always)]
pub fn x16_rows<V: VF32>(a: &[f32], rows: usize, k: usize, kp: usize, sub: usize) -> X16Rows {
    const BIG: f32 = 12_582_912.0;
    let l = V::LANES;
    let subs = kp / sub;
    let mut out = X16Rows {
        rows,
        kp,
        sub,
        hi: alloc::vec![0u32; rows * kp / 2],
        lo: alloc::vec![0u32; rows * kp / 2],
        s: alloc::vec![0f32; rows * subs * 2],
        exact: true,
    };
    let mut x = scratch::<f32>(sub);
    let (mut t1, mut t2) = (scratch::<f32>(sub), scratch::<f32>(sub));
    for r in 0..rows {
        let row = &a[r * k..(r + 1) * k];
        for sb in 0..subs {
            let k0 = sb * sub;
            let have = k.saturating_sub(k0).min(sub);
            if have > 0 {
                x[..have].copy_from_slice(&row[k0..k0 + have]);
            }
            x[have..].fill(0.0);
            // the maximum, and `v - v` summed: NaN from a NaN or an infinity (a horizontal
            // maximum need not keep NaN)
            let (mut m, mut bad) = (V::splat(0.0), V::splat(0.0));
            for c in x.chunks_exact(l) {
                let v = V::load(c);
                m = v.abs().max(m);
                bad = bad.add(v.sub(v));
            }
            let amax = m.hmax();
            if bad.hsum() != 0.0 || (amax != 0.0 && !(amax.is_finite() && amax >= 7.9e-31)) {
                out.exact = false;
                return out;
            }
            let (s1, inv) = if amax == 0.0 {
                (0.0, 0.0)
            } else {
                (amax / 32767.0, 32767.0 / amax)
            };
            let (vinv, vinv2, vneg) = (V::splat(inv), V::splat(inv * 16384.0), V::splat(-s1));
            let big = V::splat(BIG);
            for ((c, d1), d2) in x
                .chunks_exact(l)
                .zip(t1.chunks_exact_mut(l))
                .zip(t2.chunks_exact_mut(l))
            {
                let v = V::load(c);
                // BIG + q: q rounded to nearest (ties to even) in the low mantissa bits
                let b1 = v.fma(vinv, big);
                let q1 = b1.sub(big);
                let rem = q1.fma(vneg, v);
                let b2 = rem.fma(vinv2, big);
                b1.store(d1);
                b2.store(d2);
            }
            let at = (r * kp + k0) / 2;
            for (i, (p1, p2)) in t1.chunks_exact(2).zip(t2.chunks_exact(2)).enumerate() {
                let pair = |p: &[f32]| (p[0].to_bits() & 0xffff) | (p[1].to_bits() << 16);
                out.hi[at + i] = pair(p1);
                out.lo[at + i] = pair(p2);
            }
            out.s[(r * subs + sb) * 2] = s1;
            out.s[(r * subs + sb) * 2 + 1] = s1 / 16384.0;
        }
    }
    out
}

/// Rows `r0..r0 + R` of `a` times column groups `gi..gi + C` of `p`.
#[inline(always)]
fn w8_tile<V: VF32, const R: usize, const C: usize>(
    p: &W8Packed,
    a: &X16Rows,
    r0: usize,
    gi: usize,
) -> [[V; C]; R] {
    let (l, half, sub, subs) = (V::LANES, p.kp / 2, p.sub, p.subs());
    let mut acc = [[V::splat(0.0); C]; R];
    for sb in 0..subs {
        let mut s1 = [[V::q_zero(); C]; R];
        let mut s2 = [[V::q_zero(); C]; R];
        for i in sb * sub / 2..(sb + 1) * sub / 2 {
            let mut w = [V::q_zero(); C];
            for (c, wc) in w.iter_mut().enumerate() {
                let at = ((gi + c) * half + i) * 2 * l;
                *wc = V::q_wide(&p.codes[at..at + 2 * l]);
            }
            for r in 0..R {
                let (x1, x2) = (a.hi[(r0 + r) * half + i], a.lo[(r0 + r) * half + i]);
                for c in 0..C {
                    s1[r][c] = V::q_dot16(s1[r][c], w[c], x1);
                    s2[r][c] = V::q_dot16(s2[r][c], w[c], x2);
                }
            }
        }
        for c in 0..C {
            let at = ((gi + c) * subs + sb) * l;
            let sw = V::load(&p.scales[at..at + l]);
            for r in 0..R {
                let at = ((r0 + r) * subs + sb) * 2;
                let f = V::q_f32(s2[r][c]).mul(V::splat(a.s[at + 1]));
                let f = V::q_f32(s1[r][c]).fma(V::splat(a.s[at]), f);
                acc[r][c] = f.fma(sw, acc[r][c]);
            }
        }
    }
    acc
}

/// Stores a tile of rows `r0..` and groups `gi..` at group slot `slot` of `y` (columns past
/// N left out).
#[inline(always)]
fn w8_put<V: VF32, const R: usize, const C: usize>(
    p: &W8Packed,
    tile: [[V; C]; R],
    (r0, slot, gi): (usize, usize, usize),
    y: &mut [f32],
    ldy: usize,
) {
    let l = V::LANES;
    for (i, row) in tile.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            let cols = l.min(p.n - (gi + c) * l);
            let o = (r0 + i) * ldy + (slot + c) * l;
            if cols == l {
                v.store(&mut y[o..o + l]);
            } else {
                let mut tmp = [0f32; 16];
                v.store(&mut tmp[..l]);
                y[o..o + cols].copy_from_slice(&tmp[..cols]);
            }
        }
    }
}

/// `y[r * ldy + c]` for every row of `a` and the columns of groups `g0..g1` of `p` (`c`
/// counted from group `g0`'s first column; columns past N are not written). `p` must have
/// been packed for this vector type's lanes and `a` split for its geometry.
#[inline(always)]
pub fn w8_rows<V: VF32>(
    p: &W8Packed,
    a: &X16Rows,
    (g0, g1): (usize, usize),
    y: &mut [f32],
    ldy: usize,
) {
    assert!(
        p.lanes == V::LANES && a.kp == p.kp && a.sub == p.sub && a.exact,
        "w8_rows: packing"
    );
    let mut gi = g0;
    while gi < g1 {
        let gc = (g1 - gi).min(4);
        let mut r0 = 0;
        while r0 < a.rows {
            let rr = a.rows - r0;
            if rr >= 4 {
                for c in 0..gc {
                    let t = w8_tile::<V, 4, 1>(p, a, r0, gi + c);
                    w8_put(p, t, (r0, gi + c - g0, gi + c), y, ldy);
                }
                r0 += 4;
            } else if rr >= 2 {
                let mut c = 0;
                while c + 2 <= gc {
                    let t = w8_tile::<V, 2, 2>(p, a, r0, gi + c);
                    w8_put(p, t, (r0, gi + c - g0, gi + c), y, ldy);
                    c += 2;
                }
                if c < gc {
                    let t = w8_tile::<V, 2, 1>(p, a, r0, gi + c);
                    w8_put(p, t, (r0, gi + c - g0, gi + c), y, ldy);
                }
                r0 += 2;
            } else {
                if gc == 4 {
                    let t = w8_tile::<V, 1, 4>(p, a, r0, gi);
                    w8_put(p, t, (r0, gi - g0, gi), y, ldy);
                } else {
                    for c in 0..gc {
                        let t = w8_tile::<V, 1, 1>(p, a, r0, gi + c);
                        w8_put(p, t, (r0, gi + c - g0, gi + c), y, ldy);
                    }
                }
                r0 += 1;
            }
        }
        gi += gc;
    }
}

/// Columns `j0..j0 + cols` of the weights `p` as floats `(code - zero point) * scale`, the
/// first `k` rows, in the SGEMM's B panels of `nr` columns ([`super::Operand::Panels`]: element
/// `(r, j)` at `(j / nr) * k * nr + r * nr + j % nr`, columns past N zero): what the float
/// product of many rows reads, dequantized a few panels at a time so that they are still in
/// cache when the SGEMM reads them. `j0` and `nr` are multiples of the packed lanes, which
/// must be this vector type's; `out` holds `ceil(cols / nr) * k * nr` floats.
#[inline(always)]
pub fn w8_panels<V: VF32>(
    p: &W8Packed,
    k: usize,
    (j0, cols): (usize, usize),
    nr: usize,
    out: &mut [f32],
) {
    let l = V::LANES;
    debug_assert!(p.lanes == l && j0.is_multiple_of(l) && nr.is_multiple_of(l) && k <= p.kp);
    let (half, subs, sub) = (p.kp / 2, p.subs(), p.sub);
    let (lo, hi) = (1u32, 1u32 << 16);
    let per = nr / l;
    for (pi, panel) in out
        .chunks_exact_mut(k * nr)
        .take(cols.div_ceil(nr))
        .enumerate()
    {
        for h in 0..per {
            let gi = (j0 + pi * nr) / l + h;
            if gi * l >= p.n {
                for r in 0..k {
                    panel[r * nr + h * l..r * nr + (h + 1) * l].fill(0.0);
                }
                continue;
            }
            let codes = &p.codes[gi * half * 2 * l..(gi + 1) * half * 2 * l];
            for sb in 0..subs {
                let r0 = sb * sub;
                if r0 >= k {
                    break;
                }
                let at = (gi * subs + sb) * l;
                let s = V::load(&p.scales[at..at + l]);
                // rows r0.. in pairs: each load holds a pair's weights for the group's columns
                let pairs = (sub.min(k - r0)) / 2;
                for i in r0 / 2..r0 / 2 + pairs {
                    let w = V::q_wide(&codes[i * 2 * l..(i + 1) * 2 * l]);
                    let even = V::q_f32(V::q_dot16(V::q_zero(), w, lo)).mul(s);
                    let odd = V::q_f32(V::q_dot16(V::q_zero(), w, hi)).mul(s);
                    let o = 2 * i * nr + h * l;
                    even.store(&mut panel[o..o + l]);
                    odd.store(&mut panel[o + nr..o + nr + l]);
                }
                if r0 + 2 * pairs < k && 2 * pairs < sub {
                    // an odd last row of K
                    let i = r0 / 2 + pairs;
                    let w = V::q_wide(&codes[i * 2 * l..(i + 1) * 2 * l]);
                    let even = V::q_f32(V::q_dot16(V::q_zero(), w, lo)).mul(s);
                    let o = 2 * i * nr + h * l;
                    even.store(&mut panel[o..o + l]);
                }
            }
        }
    }
}
