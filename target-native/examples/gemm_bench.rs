//! SGEMM throughput at model shapes: nxrt's own SIMD SGEMM (the dispatched ISA) against the
//! `gemm` crate, in GFLOP/s, interleaved rounds, medians.
//!
//! `cargo run --release -p nxrt --example gemm_bench -- [--threads N] [--rounds R]`

use nxrt_core::provider::{CpuBackend, Gemm};
use nxrt_core::simd::gemm::Operand;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A, B (row-major, deterministic values) and a zeroed C for an `m x n x k` product, with
/// its row-major description.
fn operands(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Gemm) {
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let g = Gemm::row_major(m, n, k);
    (a, b, vec![0f32; m * n], g)
}

/// Prints one table row: GFLOP/s of each variant (`run(which)` is one product), interleaved
/// over `rounds`, medians.
fn row(label: &str, rounds: usize, flop: f64, max_reps: usize, run: &mut dyn FnMut(usize)) {
    let reps = ((2e9 / flop) as usize).clamp(3, max_reps);
    let mut t = [vec![], vec![], vec![]];
    for _ in 0..rounds {
        for (which, times) in t.iter_mut().enumerate() {
            let t0 = Instant::now();
            for _ in 0..reps {
                run(which);
            }
            times.push(flop * reps as f64 / t0.elapsed().as_secs_f64() / 1e9);
        }
    }
    let [t0, t1, t2] = t.map(median);
    println!("| {label} | {t0:.1} | {t1:.1} | {t2:.1} |");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, d: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let threads = arg("--threads", 1);
    let rounds = arg("--rounds", 5);
    let cpu = nxrt::cpu::NativeCpu::new(threads).expect("threads");
    println!(
        "isa {} threads {threads}; GFLOP/s, median of {rounds} interleaved rounds",
        nxrt_core::simd::isa_name()
    );
    println!("| M x N x K | gemm crate | nxrt simd | nxrt backend |");
    println!("|---|---:|---:|---:|");
    let shapes = [
        (1usize, 4096usize, 4096usize),
        (4, 1024, 1024),
        (32, 1024, 1024),
        (128, 384, 384),
        (128, 1536, 384),
        (128, 384, 1536),
        (256, 768, 3072),
        (512, 2048, 1280),
        (64, 3136, 576),
    ];
    for &(m, n, k) in &shapes {
        let (a, b, mut c, g) = operands(m, n, k);
        let flop = 2.0 * (m * n * k) as f64;
        row(
            &format!("{m} x {n} x {k}"),
            rounds,
            flop,
            2000,
            &mut |which| match which {
                0 => nxrt::cpu::gemm_crate_sgemm(threads, &g, &a, &b, &mut c),
                1 => nxrt_core::simd::sgemm_unchecked(&g, &a, &b, &mut c),
                _ => cpu.sgemm(&g, &a, &b, &mut c),
            },
        );
    }

    // GEMV-like products (decode steps, recurrent steps): B as stored row-major, stored
    // transposed (a Gemm with transB, an RNN's R), and packed in the SGEMM's panels at load
    println!();
    println!("| M x N x K (few rows) | B row-major | B transposed | B packed panels |");
    println!("|---|---:|---:|---:|");
    let gemv_shapes = [
        (1usize, 512usize, 128usize),
        (1, 512, 256),
        (1, 256, 256),
        (1, 768, 256),
        (1, 4096, 4096),
        (2, 1024, 1024),
        (3, 1024, 1024),
    ];
    let nr = nxrt_core::simd::gemm_tile().1;
    for &(m, n, k) in &gemv_shapes {
        let (a, b, mut c, rowg) = operands(m, n, k);
        let bp = nxrt_core::simd::gemm::pack_b(k, n, &b, n as isize, 1, nr);
        // the same B read through transposed strides (B^T stored row-major)
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        // every operand on a cache line, as packed weights are
        let bt = nxrt_core::simd::AlignedF32::from_slice(&bt);
        let b = nxrt_core::simd::AlignedF32::from_slice(&b);
        let bp = nxrt_core::simd::AlignedF32::from_slice(&bp);
        let tr = Gemm {
            b_rs: 1,
            b_cs: k as isize,
            ..rowg
        };
        let flop = 2.0 * (m * n * k) as f64;
        row(
            &format!("{m} x {n} x {k}"),
            rounds,
            flop,
            20000,
            &mut |which| match which {
                0 => cpu.sgemm(&rowg, &a, &b, &mut c),
                1 => cpu.sgemm(&tr, &a, &bt, &mut c),
                _ => {
                    let panels = Operand::Panels {
                        data: &bp,
                        panel: nr,
                    };
                    cpu.sgemm_ops(&rowg, Operand::Strided(&a), panels, &mut c)
                }
            },
        );
    }
}
