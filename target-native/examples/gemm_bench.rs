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
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut c = vec![0f32; m * n];
        let g = Gemm {
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
        };
        let flop = 2.0 * (m * n * k) as f64;
        let reps = ((2e9 / flop) as usize).clamp(3, 2000);
        let mut t = [vec![], vec![], vec![]];
        for _ in 0..rounds {
            for (which, times) in t.iter_mut().enumerate() {
                let t0 = Instant::now();
                for _ in 0..reps {
                    match which {
                        0 => nxrt::cpu::gemm_crate_sgemm(threads, &g, &a, &b, &mut c),
                        1 => nxrt_core::simd::sgemm_unchecked(&g, &a, &b, &mut c),
                        _ => cpu.sgemm(&g, &a, &b, &mut c),
                    }
                }
                times.push(flop * reps as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
        }
        println!(
            "| {m} x {n} x {k} | {:.1} | {:.1} | {:.1} |",
            median(t[0].clone()),
            median(t[1].clone()),
            median(t[2].clone())
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
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let bp = nxrt_core::simd::gemm::pack_b(k, n, &b, n as isize, 1, nr);
        let mut c = vec![0f32; m * n];
        let flop = 2.0 * (m * n * k) as f64;
        let reps = ((2e9 / flop) as usize).clamp(3, 20000);
        let row = Gemm {
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
        };
        // the same B read through transposed strides (B^T stored row-major)
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let bt = nxrt_core::simd::AlignedF32::from_slice(&bt);
        let b = nxrt_core::simd::AlignedF32::from_slice(&b);
        let bp = nxrt_core::simd::AlignedF32::from_slice(&bp);
        let tr = Gemm {
            b_rs: 1,
            b_cs: k as isize,
            ..row
        };
        let mut t = [vec![], vec![], vec![]];
        for _ in 0..rounds {
            for (which, times) in t.iter_mut().enumerate() {
                let t0 = Instant::now();
                for _ in 0..reps {
                    match which {
                        0 => cpu.sgemm(&row, &a, &b, &mut c),
                        1 => cpu.sgemm(&tr, &a, &bt, &mut c),
                        _ => cpu.sgemm_ops(
                            &row,
                            Operand::Strided(&a),
                            Operand::Panels {
                                data: &bp,
                                panel: nr,
                            },
                            &mut c,
                        ),
                    }
                }
                times.push(flop * reps as f64 / t0.elapsed().as_secs_f64() / 1e9);
            }
        }
        println!(
            "| {m} x {n} x {k} | {:.1} | {:.1} | {:.1} |",
            median(t[0].clone()),
            median(t[1].clone()),
            median(t[2].clone())
        );
    }
}
