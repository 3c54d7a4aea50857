//! The native CPU backend: SGEMM from the `gemm` crate (runtime ISA dispatch: AVX2/FMA,
//! AVX-512, NEON) and rayon threads for `parallel_for`.

use nxrt_core::provider::{gemm_fits, reference_sgemm, CpuBackend, Gemm};
use nxrt_core::{Error, Result};
use rayon::prelude::*;

/// Threaded, SIMD-dispatched CPU primitives.
pub struct NativeCpu {
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

impl NativeCpu {
    /// A backend with `threads` workers (1 = run on the caller's thread).
    pub fn new(threads: usize) -> Result<NativeCpu> {
        let threads = threads.max(1);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("nxrt-cpu-{i}"))
                    .build()
                    .map_err(|e| Error::Provider(format!("cannot start {threads} threads: {e}")))?,
            )
        } else {
            None
        };
        Ok(NativeCpu { threads, pool })
    }

    fn isa() -> &'static str {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return "avx512f";
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return "avx2+fma";
            }
            "sse2"
        }
        #[cfg(target_arch = "aarch64")]
        {
            "neon"
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            "scalar"
        }
    }
}

impl CpuBackend for NativeCpu {
    fn name(&self) -> String {
        format!("{} x{}", Self::isa(), self.threads)
    }

    fn sgemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        let (m, n, k) = (g.m, g.n, g.k);
        if m == 0 || n == 0 {
            return;
        }
        if !gemm_fits(g, a.len(), b.len(), c.len()) || k == 0 {
            // Negative strides or an empty reduction: the portable path handles them (and
            // bounds-checks every access).
            return reference_sgemm(g, a, b, c);
        }
        let par = if self.threads > 1 && (m * n * k) >= 64 * 64 * 64 {
            gemm::Parallelism::Rayon(self.threads)
        } else {
            gemm::Parallelism::None
        };
        let mut run = || unsafe {
            // SAFETY: the index ranges of A, B and C were checked against the slices above;
            // C is exclusively borrowed.
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
        };
        match (&self.pool, par) {
            (Some(pool), gemm::Parallelism::Rayon(_)) => pool.install(run),
            _ => run(),
        }
    }

    fn parallel_for(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        match &self.pool {
            Some(pool) if n > 1 => pool.install(|| (0..n).into_par_iter().for_each(f)),
            _ => (0..n).for_each(f),
        }
    }

    fn threads(&self) -> usize {
        self.threads
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
}
