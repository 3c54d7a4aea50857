//! The GEMM description every layer shares (it sits at the bottom, with the SIMD layer, so
//! that `simd` needs nothing from `provider`): the strided operand layout, the bounds check an
//! unchecked SGEMM needs, and the portable bounds-checked SGEMM.
use alloc::vec::Vec;

use super::kernels::{Clamp, Then};

/// Strided single-precision GEMM: `C = alpha * A·B + beta * C` with A m×k, B k×n, C m×n
/// (C row-major with row stride `ldc`). A and B are addressed through (row, column) strides so
/// transposed operands need no copy.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_rs: isize,
    pub a_cs: isize,
    pub b_rs: isize,
    pub b_cs: isize,
    pub ldc: usize,
    pub alpha: f32,
    pub beta: f32,
}

impl Gemm {
    /// `C = A·B` with A (m x k), B (k x n) and C (m x n) row-major and contiguous, alpha 1,
    /// beta 0.
    pub fn row_major(m: usize, n: usize, k: usize) -> Gemm {
        Gemm {
            m,
            n,
            k,
            a_rs: k as isize,
            a_cs: 1,
            b_rs: n as isize,
            b_cs: 1,
            ldc: n,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// What an SGEMM does to C as it stores the product, while the tile is in registers: adds a
/// bias per row of C to `alpha*A*B + beta*C`, then clamps (Relu, Clip). A convolution's or a
/// Gemm's bias and bounded activation this way cost no passes over C of their own.
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmEpi<'a> {
    /// One value per row of C (at least `m`).
    pub bias: Option<&'a [f32]>,
    /// Applied after the bias.
    pub clamp: Option<Clamp>,
}

impl<'a> GemmEpi<'a> {
    /// Stores the product as it is.
    pub const NONE: GemmEpi<'static> = GemmEpi {
        bias: None,
        clamp: None,
    };

    pub fn is_none(&self) -> bool {
        self.bias.is_none() && self.clamp.is_none()
    }

    /// The epilogue of C's rows from `i0` on.
    pub fn rows_from(self, i0: usize) -> GemmEpi<'a> {
        GemmEpi {
            bias: self.bias.map(|b| &b[i0..]),
            clamp: self.clamp,
        }
    }

    /// Applies the epilogue to C's `m x n` block (row stride `ldc`) after a product that did
    /// not (the paths without a register tile to apply it in).
    pub fn apply(&self, m: usize, n: usize, ldc: usize, c: &mut [f32]) {
        if self.is_none() {
            return;
        }
        for i in 0..m {
            let row = &mut c[i * ldc..i * ldc + n];
            if let Some(b) = self.bias {
                let bi = b[i];
                row.iter_mut().for_each(|x| *x += bi);
            }
            if let Some(cl) = self.clamp {
                row.iter_mut().for_each(|x| *x = cl.then1(*x));
            }
        }
    }
}

/// Applies `beta` to C's `m x n` block (`beta = 0` overwrites, so NaNs in C do not leak).
pub fn scale_c(g: &Gemm, c: &mut [f32]) {
    for i in 0..g.m {
        let row = &mut c[i * g.ldc..i * g.ldc + g.n];
        if g.beta == 0.0 {
            row.fill(0.0);
        } else if g.beta != 1.0 {
            row.iter_mut().for_each(|x| *x *= g.beta);
        }
    }
}

/// Whether every element a [`Gemm`] touches lies inside slices of these lengths, with
/// non-negative strides (what an unchecked or SIMD SGEMM needs before it starts).
pub fn gemm_fits(g: &Gemm, a_len: usize, b_len: usize, c_len: usize) -> bool {
    fn last(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<usize> {
        if rs < 0 || cs < 0 {
            return None;
        }
        if rows == 0 || cols == 0 {
            return Some(0);
        }
        (rows - 1)
            .checked_mul(rs as usize)?
            .checked_add((cols - 1).checked_mul(cs as usize)?)
    }
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return true;
    }
    let fits = |x: Option<usize>, len: usize| x.is_some_and(|x| k == 0 || x < len);
    fits(last(m, k, g.a_rs, g.a_cs), a_len)
        && fits(last(k, n, g.b_rs, g.b_cs), b_len)
        && g.ldc >= n
        && (m - 1)
            .checked_mul(g.ldc)
            .and_then(|x| x.checked_add(n))
            .is_some_and(|x| x <= c_len)
}

/// A cache-blocked portable SGEMM (packs B panels row-major, inner loop over contiguous C rows
/// so the compiler vectorises it).
pub fn reference_sgemm(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return;
    }
    scale_c(g, c);
    if k == 0 {
        return;
    }
    const KC: usize = 256;
    const NC: usize = 512;
    let mut bp = alloc::vec![0f32; KC.min(k) * NC.min(n)];
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        let mut n0 = 0;
        while n0 < n {
            let nc = NC.min(n - n0);
            // pack B[k0..k0+kc, n0..n0+nc] row-major
            for kk in 0..kc {
                let dst = &mut bp[kk * nc..kk * nc + nc];
                let base = (k0 + kk) as isize * g.b_rs + n0 as isize * g.b_cs;
                if g.b_cs == 1 {
                    dst.copy_from_slice(&b[base as usize..base as usize + nc]);
                } else {
                    for (j, d) in dst.iter_mut().enumerate() {
                        *d = b[(base + j as isize * g.b_cs) as usize];
                    }
                }
            }
            for i in 0..m {
                let crow = &mut c[i * g.ldc + n0..i * g.ldc + n0 + nc];
                let abase = i as isize * g.a_rs + k0 as isize * g.a_cs;
                for kk in 0..kc {
                    let av = g.alpha * a[(abase + kk as isize * g.a_cs) as usize];
                    let brow = &bp[kk * nc..kk * nc + nc];
                    for (cv, bv) in crow.iter_mut().zip(brow) {
                        *cv += av * bv;
                    }
                }
            }
            n0 += nc;
        }
        k0 += kc;
    }
}

/// One SGEMM operand: addressed through the [`Gemm`]'s strides, or already packed in the
/// micro-kernel's panels (weights packed once at load, convolution patches written straight
/// into panels), so the SGEMM skips its own packing of that side.
///
/// Panel layout, `panel` wide and the whole reduction `k` deep, zero-padded past the last row
/// (A) or column (B): element (i, p) of A lies at `(i / panel) * k * panel + p * panel +
/// i % panel`, element (p, j) of B at `(j / panel) * k * panel + p * panel + j % panel`. A's
/// panel must be [`gemm_tile`](super::gemm_tile)'s rows, B's its columns.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    Strided(&'a [f32]),
    Panels {
        data: &'a [f32],
        panel: usize,
    },
    /// B only: row `p` of B is `data[offs[p]..]` (column j at `offs[p] + j`), read in place
    /// without packing (an implicit GEMM: the rows of a convolution's patch matrix are
    /// windows of its padded input). `data` must hold `offs[p] + n` rounded up to the
    /// micro-kernel's panel width, for every p (the columns past n are read, not used).
    Rows {
        data: &'a [f32],
        offs: &'a [usize],
    },
}

impl<'a> Operand<'a> {
    /// The operand from row (A) or column (B) `at` on: `at` must be a multiple of the panel
    /// for packed operands; `stride` is A's row stride or B's column stride.
    pub fn from(self, at: usize, k: usize, stride: isize) -> Operand<'a> {
        match self {
            Operand::Strided(d) => Operand::Strided(&d[at * stride as usize..]),
            Operand::Panels { data, panel } => {
                debug_assert_eq!(at % panel, 0);
                Operand::Panels {
                    data: &data[at / panel * k * panel..],
                    panel,
                }
            }
            Operand::Rows { data, offs } => Operand::Rows {
                data: &data[at..],
                offs,
            },
        }
    }

    /// Whether a packed operand holds `ceil(len / panel)` panels of depth `k`, with the panel
    /// size `want`, or a row operand `k` rows of `len` columns rounded up to `want` (a strided
    /// one is checked by [`gemm_fits`]).
    pub fn panels_fit(&self, len: usize, k: usize, want: usize) -> bool {
        match *self {
            Operand::Strided(_) => true,
            Operand::Rows { data, offs } => {
                let need = len.div_ceil(want) * want;
                offs.len() == k
                    && offs
                        .iter()
                        .all(|&o| o.checked_add(need).is_some_and(|e| e <= data.len()))
            }
            Operand::Panels { data, panel } => {
                panel == want
                    && len
                        .div_ceil(panel)
                        .checked_mul(k)
                        .and_then(|x| x.checked_mul(panel))
                        .is_some_and(|x| x <= data.len())
            }
        }
    }
}

/// Packs rows `0..m` of A (m x k, through the strides) into panels of `panel` rows (the layout
/// of [`Operand::Panels`]).
pub fn pack_a(m: usize, k: usize, a: &[f32], rs: isize, cs: isize, panel: usize) -> Vec<f32> {
    let mut out = alloc::vec![0f32; m.div_ceil(panel) * k * panel];
    pack_a_into(m, k, a, rs, cs, panel, &mut out);
    out
}

/// [`pack_a`] into `out` (at least `ceil(m / panel) * k * panel` floats, contents
/// unspecified: every element up to there is written, the padding rows as zeros).
pub fn pack_a_into(
    m: usize,
    k: usize,
    a: &[f32],
    rs: isize,
    cs: isize,
    panel: usize,
    out: &mut [f32],
) {
    let out = &mut out[..m.div_ceil(panel) * k * panel];
    for (pi, dst) in out.chunks_exact_mut(k * panel).enumerate() {
        let rows = panel.min(m - pi * panel);
        for ii in 0..panel {
            let i = pi * panel + ii;
            for p in 0..k {
                dst[p * panel + ii] = if ii < rows {
                    a[(i as isize * rs + p as isize * cs) as usize]
                } else {
                    0.0
                };
            }
        }
    }
}

/// Packs B (k x n, through the strides) into panels of `panel` columns (the layout of
/// [`Operand::Panels`]).
pub fn pack_b(k: usize, n: usize, b: &[f32], rs: isize, cs: isize, panel: usize) -> Vec<f32> {
    // B's column panels are the row panels of B^T
    pack_a(n, k, b, cs, rs, panel)
}
