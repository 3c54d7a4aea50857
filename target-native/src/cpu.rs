//! The native CPU backend: core's SIMD SGEMM (runtime ISA dispatch: AVX-512F, AVX2+FMA; NEON
//! on aarch64) split across the session's threads, the `gemm` crate for the narrow shapes where
//! it measures faster (`examples/gemm_bench.rs`), and the session's [`Pool`] for
//! `parallel_for`.

use crate::pool::Pool;
use nxrt_core::provider::{gemm_fits, reference_sgemm, CpuBackend, Gemm, GemmEpi, Operand};
use nxrt_core::{Error, Result};

/// Threaded, SIMD-dispatched CPU primitives.
pub struct NativeCpu {
    threads: usize,
    pool: Pool,
}

impl NativeCpu {
    /// A backend with `threads` workers (1 = run on the caller's thread; more: the caller and
    /// `threads - 1` helper threads of this backend's own).
    pub fn new(threads: usize) -> Result<NativeCpu> {
        let threads = threads.max(1);
        let pool = Pool::new(threads)
            .map_err(|e| Error::Provider(format!("cannot start {threads} threads: {e}")))?;
        Ok(NativeCpu { threads, pool })
    }

    fn isa() -> &'static str {
        // what the SIMD layer dispatches to (NXRT_SIMD may cap it)
        nxrt_core::simd::isa_name()
    }
}

/// Below this many multiply-adds a GEMM runs on one thread: waking a helper costs a few
/// microseconds, a sleeping one tens.
const PAR_MIN_MACS: usize = 1 << 18;

/// Below this much work (in the units of [`CpuBackend::parallel_for_work`]: about one simple
/// operation each) a parallel loop runs on the caller's thread.
const PAR_MIN_WORK: usize = 1 << 15;

/// A raw pointer to C shared by the tasks of one threaded SGEMM, each writing its own rows.
struct CPtr(*mut f32);
// SAFETY: the tasks write disjoint rows (row blocks) or only their own tiles (column blocks);
// the pointer outlives the job (`Pool::run` returns only when every task has finished).
unsafe impl Sync for CPtr {}
impl CPtr {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    fn at(&self, off: usize) -> *mut f32 {
        self.0.wrapping_add(off)
    }
}

/// A single-threaded SGEMM over (possibly packed) operands that fit, with its epilogue.
type Inner = fn(&Gemm, Operand<'_>, Operand<'_>, &mut [f32], GemmEpi<'_>);

/// Core's SIMD SGEMM (the operands were checked).
fn simd_inner(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32], epi: GemmEpi<'_>) {
    nxrt_core::simd::sgemm_ops_epi_unchecked(g, a, b, c, epi)
}

/// The `gemm` crate's SGEMM (strided operands only), then the epilogue as a pass over C.
fn crate_inner(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32], epi: GemmEpi<'_>) {
    match (a, b) {
        (Operand::Strided(a), Operand::Strided(b)) => {
            gemm_crate_one(g, a, b, c);
            epi.apply(g.m, g.n, g.ldc, c);
        }
        _ => simd_inner(g, a, b, c, epi),
    }
}

impl NativeCpu {
    /// An SGEMM (`inner`: core's SIMD one or the `gemm` crate's, single-threaded) split across
    /// the session's threads: by row blocks when there are enough rows, else by column blocks
    /// computed into per-task tiles. The operands must fit (`gemm_fits`, `panels_fit`); a
    /// packed operand is split at its panels' edges.
    fn split_sgemm(
        &self,
        g: &Gemm,
        (a, b): (Operand<'_>, Operand<'_>),
        c: &mut [f32],
        epi: GemmEpi<'_>,
        inner: Inner,
    ) {
        let (m, n, k) = (g.m, g.n, g.k);
        let t = self.threads;
        if t == 1 || m * n * k < PAR_MIN_MACS {
            return inner(g, a, b, c, epi);
        }
        let unit = |o: &Operand<'_>, d: usize| match o {
            Operand::Panels { panel, .. } => d.div_ceil(*panel) * *panel,
            // row operands split at multiples of 32 columns (whole panels on every ISA)
            _ => d,
        };
        if m >= 16 * t {
            // row blocks: disjoint rows of C
            // whole micro-kernel panels per block
            let mr = nxrt_core::simd::gemm_mr_for(m);
            let rows = unit(&a, m.div_ceil(t).div_ceil(mr) * mr);
            let blocks = m.div_ceil(rows);
            let (cp, clen) = (CPtr(c.as_mut_ptr()), c.len());
            self.pool.run_work(blocks, m * n * k, &|q| {
                let i0 = q * rows;
                let h = rows.min(m - i0);
                let start = i0 * g.ldc;
                let len = if i0 + h == m { clen - start } else { h * g.ldc };
                // SAFETY: block q owns rows [i0, i0 + h) of C, i.e. [start, start + len),
                // disjoint from every other block's range and inside C.
                let cs = unsafe { std::slice::from_raw_parts_mut(cp.at(start), len) };
                let sub = Gemm { m: h, ..*g };
                inner(&sub, a.from(i0, k, g.a_rs), b, cs, epi.rows_from(i0));
            });
            return;
        }
        if n < 64 * t {
            return inner(g, a, b, c, epi);
        }
        // column blocks, each computed into its own m x w tile and copied into C by its task
        let cols = unit(&b, n.div_ceil(t).div_ceil(32) * 32);
        let blocks = n.div_ceil(cols);
        let cp = CPtr(c.as_mut_ptr());
        self.pool.run_work(blocks, m * n * k, &|q| {
            let j0 = q * cols;
            let w = cols.min(n - j0);
            let mut tile = nxrt_core::simd::scratch::<f32>(m * w);
            let at = |i: usize| i * g.ldc + j0;
            if g.beta != 0.0 {
                for i in 0..m {
                    // SAFETY: reads this block's own columns of row i (inside C)
                    let src = unsafe { std::slice::from_raw_parts(cp.at(at(i)), w) };
                    tile[i * w..(i + 1) * w].copy_from_slice(src);
                }
            }
            let sub = Gemm { n: w, ldc: w, ..*g };
            inner(&sub, a, b.from(j0, k, g.b_cs), &mut tile, epi);
            for i in 0..m {
                // SAFETY: block q alone writes columns [j0, j0 + w) of each row
                let dst = unsafe { std::slice::from_raw_parts_mut(cp.at(at(i)), w) };
                dst.copy_from_slice(&tile[i * w..(i + 1) * w]);
            }
        });
    }

    /// The strided SGEMM and its epilogue.
    fn sgemm_strided(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32], epi: GemmEpi<'_>) {
        let (m, n, k) = (g.m, g.n, g.k);
        if m == 0 || n == 0 {
            return;
        }
        let ops = (Operand::Strided(a), Operand::Strided(b));
        if !gemm_fits(g, a.len(), b.len(), c.len()) || k == 0 {
            // Negative strides or an empty reduction: the portable path handles them (and
            // bounds-checks every access).
            reference_sgemm(g, a, b, c);
            return epi.apply(m, n, g.ldc, c);
        }
        if n < 16 && m >= 64 {
            // A narrow C (strided 1-D convolutions: oww_melspectrogram's 257 x 8 x 512): the
            // gemm crate's small-N kernels measure faster here than our 2-vector-wide tiles
            return self.split_sgemm(g, ops, c, epi, crate_inner);
        }
        self.split_sgemm(g, ops, c, epi, simd_inner)
    }
}

impl CpuBackend for NativeCpu {
    fn name(&self) -> String {
        format!("{} x{}", Self::isa(), self.threads)
    }

    fn sgemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        self.sgemm_strided(g, a, b, c, GemmEpi::NONE)
    }

    fn sgemm_ops(&self, g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
        self.sgemm_ops_epi(g, a, b, c, GemmEpi::NONE)
    }

    fn sgemm_ops_epi(
        &self,
        g: &Gemm,
        a: Operand<'_>,
        b: Operand<'_>,
        c: &mut [f32],
        epi: GemmEpi<'_>,
    ) {
        if let (Operand::Strided(a), Operand::Strided(b)) = (a, b) {
            return self.sgemm_strided(g, a, b, c, epi);
        }
        let fits = nxrt_core::simd::sgemm_ops_fit(g, &a, &b, c.len());
        if !fits || g.alpha != 1.0 || g.m == 0 || g.n == 0 || g.k == 0 {
            // the checked path handles (or refuses) everything else
            assert!(
                nxrt_core::simd::sgemm_ops_checked(g, a, b, c),
                "sgemm_ops: packed operands do not fit the product"
            );
            return epi.apply(g.m, g.n, g.ldc, c);
        }
        self.split_sgemm(g, (a, b), c, epi, simd_inner)
    }

    fn parallel_for(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.pool.run(n, f)
    }

    fn parallel_for_work(&self, n: usize, work: usize, f: &(dyn Fn(usize) + Sync)) {
        if work < PAR_MIN_WORK {
            (0..n).for_each(f)
        } else {
            self.pool.run_work(n, work, f)
        }
    }

    fn threads(&self) -> usize {
        self.threads
    }
}

/// The `gemm` crate's SGEMM on `threads` threads (its own rayon parallelism when more than
/// one); for benchmarks that compare it with nxrt's own (`examples/gemm_bench.rs`). The
/// operands must fit (see `gemm_fits`).
pub fn gemm_crate_sgemm(threads: usize, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(gemm_fits(g, a.len(), b.len(), c.len()));
    let par = if threads > 1 && (g.m * g.n * g.k) >= 64 * 64 * 64 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    gemm_crate_run(par, g, a, b, c)
}

/// The `gemm` crate's SGEMM on the calling thread (the session splits it across its threads).
fn gemm_crate_one(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    gemm_crate_run(gemm::Parallelism::None, g, a, b, c)
}

fn gemm_crate_run(par: gemm::Parallelism, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 || k == 0 {
        return reference_sgemm(g, a, b, c);
    }
    unsafe {
        // SAFETY: the callers checked the index ranges of A, B and C against the slices
        // (gemm_fits); C is exclusively borrowed.
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            g.ldc as isize,
            g.beta != 0.0,
            a.as_ptr(),
            g.a_cs,
            g.a_rs,
            b.as_ptr(),
            g.b_cs,
            g.b_rs,
            g.beta,
            g.alpha,
            false,
            false,
            false,
            par,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    #[test]
    fn sgemm_matches_naive_with_transposed_b() {
        let (m, n, k) = (7, 13, 29);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
        // B stored transposed (n×k) and addressed with swapped strides
        let mut bt = vec![0f32; n * k];
        for p in 0..k {
            for j in 0..n {
                bt[j * k + p] = b[p * n + j];
            }
        }
        let want = naive(m, n, k, &a, &b);
        for threads in [1, 2] {
            let cpu = NativeCpu::new(threads).unwrap();
            // C starts non-zero: beta = 0 must overwrite it, not add to it
            let mut c = vec![1f32; m * n];
            let g = Gemm {
                m,
                n,
                k,
                a_rs: k as isize,
                a_cs: 1,
                b_rs: 1,
                b_cs: k as isize,
                ldc: n,
                alpha: 1.0,
                beta: 0.0,
            };
            cpu.sgemm(&g, &a, &bt, &mut c);
            assert_eq!(c, want);
            // beta = 1 accumulates into C
            let acc = Gemm { beta: 1.0, ..g };
            cpu.sgemm(&acc, &a, &bt, &mut c);
            let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
            assert_eq!(c, twice);
        }
    }

    #[test]
    fn threaded_sgemm_splits_rows_and_columns_like_one_thread() {
        // (m, n, k): row blocks (m >= 16 per thread), column tiles (few rows), and a GEMV
        for &(m, n, k) in &[(70usize, 150usize, 120usize), (5, 700, 400), (1, 3000, 400)] {
            for &(tb, beta) in &[(false, 0.0f32), (true, 0.5)] {
                let a: Vec<f32> = (0..m * k)
                    .map(|i| ((i * 7) % 13) as f32 * 0.25 - 1.0)
                    .collect();
                let b: Vec<f32> = (0..k * n)
                    .map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.0)
                    .collect();
                let ldc = n + 5;
                let g = Gemm {
                    m,
                    n,
                    k,
                    a_rs: k as isize,
                    a_cs: 1,
                    b_rs: if tb { 1 } else { n as isize },
                    b_cs: if tb { k as isize } else { 1 },
                    ldc,
                    alpha: 1.5,
                    beta,
                };
                let c0: Vec<f32> = (0..m * ldc).map(|i| (i % 3) as f32).collect();
                let mut want = c0.clone();
                reference_sgemm(&g, &a, &b, &mut want);
                for threads in [1, 2, 3] {
                    let cpu = NativeCpu::new(threads).unwrap();
                    let mut c = c0.clone();
                    cpu.sgemm(&g, &a, &b, &mut c);
                    for i in 0..m {
                        for j in 0..ldc {
                            let (x, y) = (c[i * ldc + j], want[i * ldc + j]);
                            assert!(
                                (x - y).abs() <= 1e-3 * (1.0 + y.abs()),
                                "{m}x{n}x{k} tb={tb} threads={threads} at ({i},{j}): {x} vs {y}"
                            );
                        }
                    }
                }
            }
        }
    }
}
