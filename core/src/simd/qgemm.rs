//! Integer matrix products for the int8 kernels (QLinearConv, QLinearMatMul, MatMulInteger,
//! ConvInteger, QGemm and the QDQ patterns fused into them), written once against
//! [`VF32`]'s integer register.
//!
//! `C[i][j] = sum_k A[i][k] * B[k][j]` with `A` signed bytes (rows of whole quads, zero past
//! K, read a quad at a time and broadcast; widened to two i16 pairs per quad where the ISA
//! multiplies in i16, [`VF32::Q_PAIRS`]) and `B` unsigned bytes packed in quads: column group
//! `g` (`lanes` columns), quad `q` holds for each column of the group its values at
//! `k = 4q..4q + 4` as four consecutive bytes, the layout of one `vpdpbusd` (AVX-512 VNNI)
//! operand. The products accumulate exactly in i32 lanes on every instruction set
//! ([`VF32::q_dot8`], or [`VF32::q_split`] and [`VF32::q_dot16`] with pairs).
//!
//! Zero points never enter the inner loop: with `a' = a - za` and `b' = b - zb`,
//! `sum a'b' = sum ab - zb sum_k a - za sum_k b + K za zb`, so callers pass the row sums of
//! `A` and the column sums of `B` (from the packers here) as the epilogue's per-row, per-column
//! and cross terms ([`QEpi`]). Operands stored with the other signedness move by 128 (`xor
//! 0x80`) with their zero point, which keeps every sum exact.
//!
//! The epilogue then writes i32 (MatMulInteger, ConvInteger), or scales to f32 and (for
//! quantized outputs) rounds half to even, adds the output's zero point and saturates, the
//! requantization ONNX Runtime's QLinear kernels do.

use super::VF32;

/// A packed `B`: `n` columns of `k` values in groups of `lanes` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QGeom {
    pub lanes: usize,
    /// Whether the rows of `A` hold each quad widened to two i16 pairs ([`qrows_pack`]), the
    /// form of ISAs whose [`VF32::Q_PAIRS`] is set.
    pub pairs: bool,
    pub k: usize,
    pub n: usize,
}

impl QGeom {
    /// Quads per column (`ceil(k / 4)`).
    pub fn kq(&self) -> usize {
        self.k.div_ceil(4)
    }
    /// `k` rounded up to whole quads.
    pub fn kp(&self) -> usize {
        4 * self.kq()
    }
    /// Bytes per row of `A`: 4 per quad, or 8 with [`QGeom::pairs`].
    pub fn ka(&self) -> usize {
        self.kq() * if self.pairs { 8 } else { 4 }
    }
    /// Column groups.
    pub fn groups(&self) -> usize {
        self.n.div_ceil(self.lanes)
    }
    /// Columns including the last group's padding (the length of per-column epilogue
    /// vectors).
    pub fn np(&self) -> usize {
        self.groups() * self.lanes
    }
    /// Bytes of the packed operand.
    pub fn packed_len(&self) -> usize {
        self.groups() * self.kq() * self.lanes * 4
    }
}

/// Packs `k` rows of `n` bytes (row `r` at `src[r * ld..]`), each byte `xor flip`, into the
/// quad layout of [`QGeom`] in `out` (`g.packed_len()` bytes; K padding and the last group's
/// spare columns are zero). With `sums` (at least `g.n` values), also writes each column's
/// sum of the packed values.
pub fn qcols_pack(
    g: &QGeom,
    src: &[u8],
    ld: usize,
    flip: u8,
    out: &mut [u8],
    sums: Option<&mut [i32]>,
) {
    let (k, n, lanes, kq) = (g.k, g.n, g.lanes, g.kq());
    assert!(
        out.len() >= g.packed_len() && (k == 0 || src.len() >= (k - 1) * ld + n),
        "qcols_pack: {g:?}"
    );
    for q in 0..kq {
        let row = |t: usize| {
            let r = 4 * q + t;
            (r < k).then(|| &src[r * ld..r * ld + n])
        };
        let rows = [row(0), row(1), row(2), row(3)];
        for gi in 0..g.groups() {
            let c0 = gi * lanes;
            let w = lanes.min(n - c0);
            let dst = &mut out[(gi * kq + q) * lanes * 4..][..lanes * 4];
            if let ([Some(r0), Some(r1), Some(r2), Some(r3)], true) = (rows, w <= 16) {
                // whole words: vectorises (zero-extend, shift, or)
                let (r0, r1, r2, r3) = (
                    &r0[c0..c0 + w],
                    &r1[c0..c0 + w],
                    &r2[c0..c0 + w],
                    &r3[c0..c0 + w],
                );
                let mut t = [0u32; 16];
                let f = u32::from_le_bytes([flip; 4]);
                for j in 0..w {
                    t[j] = (r0[j] as u32
                        | (r1[j] as u32) << 8
                        | (r2[j] as u32) << 16
                        | (r3[j] as u32) << 24)
                        ^ f;
                }
                if w == 16 {
                    // a constant length: inline moves rather than a `memcpy` call per quad
                    let d: &mut [u8; 64] = (&mut dst[..64]).try_into().expect("64 bytes");
                    *d = bytemuck::cast(t.map(u32::to_le));
                } else {
                    for (d, v) in dst.chunks_exact_mut(4).zip(&t[..w]) {
                        d.copy_from_slice(&v.to_le_bytes());
                    }
                }
            } else {
                for (j, d) in dst.chunks_exact_mut(4).take(w).enumerate() {
                    for (t, r) in rows.iter().enumerate() {
                        d[t] = r.map_or(0, |r| r[c0 + j] ^ flip);
                    }
                }
            }
            dst[4 * w..].fill(0);
        }
    }
    if let Some(sums) = sums {
        let sums = &mut sums[..n];
        sums.fill(0);
        for r in 0..k {
            for (s, &v) in sums.iter_mut().zip(&src[r * ld..r * ld + n]) {
                *s += (v ^ flip) as i32;
            }
        }
    }
}

/// Copies `m` rows of `g.k` bytes (row `i` at `src[i * ld..]`), each `xor flip`, into rows
/// of `g.ka()` bytes in `out` (zero past `k`), and each row's sum of the copied values (read
/// as int8) into `sums`. With `g.pairs`, each quad `v0..v3` is stored as the i16 values
/// `v0, v2, v1, v3` (little-endian): the pairs that multiply a column quad's even and odd
/// bytes ([`VF32::q_pairs16`], four quads at a time).
#[inline(always)]
pub fn qrows_pack<V: VF32>(
    g: &QGeom,
    src: &[u8],
    m: usize,
    ld: usize,
    flip: u8,
    out: &mut [u8],
    sums: &mut [i32],
) {
    let (k, ka) = (g.k, g.ka());
    assert!(
        g.pairs == V::Q_PAIRS
            && out.len() >= m * ka
            && sums.len() >= m
            && (m == 0 || src.len() >= (m - 1) * ld + k),
        "qrows_pack"
    );
    let qb = if g.pairs { 8 } else { 4 };
    for i in 0..m {
        let s = &src[i * ld..i * ld + k];
        let d = &mut out[i * ka..(i + 1) * ka];
        sums[i] = s.iter().map(|&b| (b ^ flip) as i8 as i32).sum();
        // whole quads (sixteen bytes at a time with pairs), then the rest a quad at a time
        let mut q = 0;
        if g.pairs {
            while 4 * q + 16 <= k {
                V::q_pairs16(&s[4 * q..], flip, &mut d[8 * q..]);
                q += 4;
            }
        } else {
            let w = k - k % 4;
            for (dd, &b) in d[..w].iter_mut().zip(&s[..w]) {
                *dd = b ^ flip;
            }
            q = w / 4;
        }
        while q < g.kq() {
            let v = |t: usize| s.get(4 * q + t).map_or(0, |&b| (b ^ flip) as i8);
            let quad = [v(0), v(1), v(2), v(3)];
            let dq = &mut d[q * qb..(q + 1) * qb];
            if g.pairs {
                for (dd, t) in dq.chunks_exact_mut(2).zip([0, 2, 1, 3]) {
                    dd.copy_from_slice(&(quad[t] as i16).to_le_bytes());
                }
            } else {
                for (dd, x) in dq.iter_mut().zip(quad) {
                    *dd = x as u8;
                }
            }
            q += 1;
        }
    }
}

/// A product: `m` rows of `A` (`m * g.ka()` bytes, [`qrows_pack`]) times the packed `B` of
/// `g`.
#[derive(Clone, Copy, Debug)]
pub struct QGemm<'a> {
    pub m: usize,
    pub g: QGeom,
    pub a: &'a [u8],
    pub b: &'a [u8],
}

/// A per-row or per-column f32 vector of the epilogue (per-column ones hold `g.np()` values).
#[derive(Clone, Copy, Debug)]
pub enum QVec<'a> {
    Row(&'a [f32]),
    Col(&'a [f32]),
}

/// What the epilogue adds to each i32 sum (exactly, wrapping) and how it writes it out.
#[derive(Clone, Copy, Debug, Default)]
pub struct QEpi<'a> {
    /// One value per row.
    pub row_add: Option<&'a [i32]>,
    /// One value per column (`g.np()` values).
    pub col_add: Option<&'a [i32]>,
    /// `(c, r)`: adds `c[j] * r[i]` (`c` has `g.np()` values).
    pub cross: Option<(&'a [i32], &'a [i32])>,
    /// For float and quantized outputs: the sum (as f32) times this...
    pub scale: Option<QVec<'a>>,
    /// ...plus this.
    pub bias: Option<QVec<'a>>,
}

/// Where the product goes: row `i`, column `j` at `[i * ld + j]` of the slice, counting
/// rows from the first row computed.
#[derive(Debug)]
pub enum QOut<'a> {
    I32(&'a mut [i32]),
    F32(&'a mut [f32]),
    /// Rounded half to even, plus `zp`, clamped to `lo..=hi` (the quantized type's range,
    /// narrowed by a fused Relu), stored as the low byte (int8 or uint8 bit patterns).
    Q8 {
        y: &'a mut [u8],
        zp: f32,
        lo: f32,
        hi: f32,
    },
}

/// One tile's sums: rows `a[..R * ka]` times the `G` column groups starting at `b`.
#[inline(always)]
fn tile<V: VF32, const R: usize, const G: usize>(
    a: &[u8],
    ka: usize,
    b: &[u8],
    gstride: usize,
    kq: usize,
) -> [[V::Q; G]; R] {
    let l4 = V::LANES * 4;
    let qa = if V::Q_PAIRS { 8 } else { 4 };
    let mut acc = [[V::q_zero(); G]; R];
    let a = &a[..(R - 1) * ka + kq * qa];
    let b = &b[..(G - 1) * gstride + kq * l4];
    // SAFETY (the unchecked reads below): with g < G, r < R and q < kq, every range read,
    // `g * gstride + q * l4 + l4 <= (G - 1) * gstride + kq * l4` bytes of `b` and
    // `r * ka + q * qa + qa <= (R - 1) * ka + kq * qa` bytes of `a`, lies inside the slices
    // just taken (their lengths checked there).
    let word = |o: usize| -> u32 {
        let w: &[u8; 4] = unsafe { a.get_unchecked(o..o + 4) }
            .try_into()
            .unwrap_or(&[0; 4]);
        u32::from_le_bytes(*w)
    };
    for q in 0..kq {
        if V::Q_PAIRS {
            // the codes' even and odd bytes apart, then each row's two i16 pairs
            let mut bv = [(V::q_zero(), V::q_zero()); G];
            for (g, v) in bv.iter_mut().enumerate() {
                let o = g * gstride + q * l4;
                *v = V::q_split(V::q_load(unsafe { b.get_unchecked(o..o + l4) }));
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let o = r * ka + 8 * q;
                let (even, odd) = (word(o), word(o + 4));
                for (g, acc_rg) in acc_r.iter_mut().enumerate() {
                    *acc_rg = V::q_dot16(V::q_dot16(*acc_rg, bv[g].0, even), bv[g].1, odd);
                }
            }
        } else {
            let mut bv = [V::q_zero(); G];
            for (g, v) in bv.iter_mut().enumerate() {
                let o = g * gstride + q * l4;
                *v = V::q_load(unsafe { b.get_unchecked(o..o + l4) });
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let w = word(r * ka + 4 * q);
                for (g, acc_rg) in acc_r.iter_mut().enumerate() {
                    *acc_rg = V::q_dot8(*acc_rg, bv[g], w);
                }
            }
        }
    }
    acc
}

/// Applies the epilogue to the sums of row `i` (absolute), columns `j0..j0 + LANES`, and
/// writes the first `w` of them at `at` of the output.
#[inline(always)]
fn finish<V: VF32>(
    e: &QEpi<'_>,
    acc: V::Q,
    i: usize,
    j0: usize,
    w: usize,
    out: &mut QOut<'_>,
    at: usize,
) {
    let l = V::LANES;
    let mut a = acc;
    if let Some(ra) = e.row_add {
        a = V::q_add(a, V::q_splat(ra[i]));
    }
    if let Some(ca) = e.col_add {
        a = V::q_add(a, V::q_load_i32(&ca[j0..]));
    }
    if let Some((c, r)) = e.cross {
        a = V::q_mul_add(a, V::q_load_i32(&c[j0..]), r[i]);
    }
    // no closures here: they would not inherit the caller's target features
    macro_rules! vec_of {
        ($v:expr) => {
            match $v {
                QVec::Row(r) => V::splat(r[i]),
                QVec::Col(c) => V::load(&c[j0..]),
            }
        };
    }
    macro_rules! float {
        ($a:expr) => {{
            let mut f = V::q_f32($a);
            if let Some(s) = e.scale {
                f = f.mul(vec_of!(s));
            }
            if let Some(b) = e.bias {
                f = f.add(vec_of!(b));
            }
            f
        }};
    }
    match out {
        QOut::I32(y) => {
            if w == l {
                V::q_store_i32(a, &mut y[at..]);
            } else {
                let mut t = [0i32; 16];
                V::q_store_i32(a, &mut t);
                y[at..at + w].copy_from_slice(&t[..w]);
            }
        }
        QOut::F32(y) => {
            let f = float!(a);
            if w == l {
                f.store(&mut y[at..]);
            } else {
                let mut t = [0f32; 16];
                f.store(&mut t);
                y[at..at + w].copy_from_slice(&t[..w]);
            }
        }
        QOut::Q8 { y, zp, lo, hi } => {
            let f = float!(a)
                .round()
                .add(V::splat(*zp))
                .max(V::splat(*lo))
                .min(V::splat(*hi));
            if w == l {
                f.store_bytes(&mut y[at..]);
            } else {
                let mut t = [0u8; 16];
                f.store_bytes(&mut t);
                y[at..at + w].copy_from_slice(&t[..w]);
            }
        }
    }
}

/// Rows `r0..r1` of the product into `out` (row `r0` first), with `ld` its row pitch.
#[inline(always)]
pub fn qgemm_rows<V: VF32>(
    p: &QGemm<'_>,
    e: &QEpi<'_>,
    r0: usize,
    r1: usize,
    mut out: QOut<'_>,
    ld: usize,
) {
    const R: usize = 4;
    let (g, l) = (p.g, V::LANES);
    assert!(
        g.lanes == l
            && g.pairs == V::Q_PAIRS
            && r1 <= p.m
            && p.a.len() >= p.m * g.ka()
            && p.b.len() >= g.packed_len(),
        "qgemm_rows: {g:?} on {l} lanes"
    );
    let (ka, kq, groups) = (g.ka(), g.kq(), g.groups());
    let gstride = kq * l * 4;
    // column blocks whose packed bytes stay in the L2 cache while every row passes over them
    let gb = (QGEMM_BLOCK_BYTES / gstride.max(1)).max(2);
    let mut g0 = 0;
    while g0 < groups {
        let g1 = (g0 + gb).min(groups);
        let mut i = r0;
        while i < r1 {
            let rows = (r1 - i).min(R);
            let mut gi = g0;
            while gi < g1 {
                let two = gi + 1 < g1;
                let b = &p.b[gi * gstride..];
                macro_rules! run {
                    ($R:literal, $G:literal) => {{
                        let acc = tile::<V, $R, $G>(&p.a[i * ka..], ka, b, gstride, kq);
                        for (r, acc_r) in acc.iter().enumerate() {
                            for (gg, a) in acc_r.iter().enumerate() {
                                let j0 = (gi + gg) * l;
                                let w = l.min(g.n - j0);
                                let at = (i + r - r0) * ld + j0;
                                finish::<V>(e, *a, i + r, j0, w, &mut out, at);
                            }
                        }
                    }};
                }
                match (rows, two) {
                    (4, true) => run!(4, 2),
                    (4, false) => run!(4, 1),
                    (3, true) => run!(3, 2),
                    (3, false) => run!(3, 1),
                    (2, true) => run!(2, 2),
                    (2, false) => run!(2, 1),
                    (_, true) => run!(1, 2),
                    (_, false) => run!(1, 1),
                }
                gi += if two { 2 } else { 1 };
            }
            i += rows;
        }
        g0 = g1;
    }
}

/// Packed bytes of `B` per column block of [`qgemm_rows`].
const QGEMM_BLOCK_BYTES: usize = 96 << 10;
