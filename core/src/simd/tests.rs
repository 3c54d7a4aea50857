//! The dispatched kernels (AVX2 here on most x86 machines, SIMD128 under wasm) against plain
//! scalar arithmetic, and the portable instantiation against the same, at sizes that exercise
//! full vectors, tails and every GEMM blocking edge.

use super::kernels;
use super::*;
use crate::provider::reference_sgemm;
use alloc::vec::Vec;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20001) as f32 / 1000.0 - 10.0
        })
        .collect()
}

fn close(a: f32, b: f32, rtol: f32, atol: f32) -> bool {
    (a.is_nan() && b.is_nan()) || (a - b).abs() <= atol + rtol * b.abs()
}

#[test]
fn exp_is_accurate_over_the_range() {
    let xs: Vec<f32> = (-8700..=8800).map(|i| i as f32 / 100.0).collect();
    let mut fast = alloc::vec![0f32; xs.len()];
    let mut port = alloc::vec![0f32; xs.len()];
    exp(&xs, &mut fast);
    kernels::exp::<Portable>(&xs, &mut port);
    for ((&x, &f), &p) in xs.iter().zip(&fast).zip(&port) {
        let want = libm::exp(x as f64) as f32;
        assert!(close(f, want, 4e-7, 0.0), "exp({x}) = {f}, want {want}");
        assert!(
            close(p, want, 4e-7, 0.0),
            "portable exp({x}) = {p}, want {want}"
        );
    }
    let mut y = [0f32; 3];
    exp(&[f32::NAN, 100.0, f32::NEG_INFINITY], &mut y);
    assert!(y[0].is_nan());
    assert!(y[1] > 3.0e38, "saturates: {}", y[1]);
    assert!(y[2] < 1.0e-37);
}

#[test]
fn binary_ops_match_scalar_with_repeats_and_tails() {
    let ops = [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::Div,
        BinOp::Max,
        BinOp::Min,
    ];
    for &(outer, inner) in &[(1usize, 1usize), (3, 1), (1, 7), (5, 13), (2, 64), (3, 33)] {
        let a = data(outer * inner, 1);
        let b = data(inner, 2);
        for &op in &ops {
            let f = |x: f32, y: f32| match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                BinOp::Div => x / y,
                BinOp::Max => x.max(y),
                BinOp::Min => x.min(y),
            };
            let mut o1 = alloc::vec![0f32; a.len()];
            let mut o2 = alloc::vec![0f32; a.len()];
            let mut o3 = alloc::vec![0f32; a.len()];
            binary_repeat(op, &a, &b, &mut o1);
            binary_repeat_lhs(op, &b, &a, &mut o2);
            kernels::binary_repeat::<Portable>(op, &a, &b, &mut o3);
            for i in 0..a.len() {
                let (x, y) = (a[i], b[i % inner]);
                assert_eq!(o1[i], f(x, y), "{op:?} {outer}x{inner} at {i}");
                assert_eq!(o2[i], f(y, x), "{op:?} lhs {outer}x{inner} at {i}");
                assert_eq!(o3[i], f(x, y), "{op:?} portable at {i}");
            }
        }
    }
}

#[test]
fn relu_and_max_keep_nan() {
    let x = [1.0, -2.0, f32::NAN, 0.5, -0.0, 3.0, -7.0, 2.0, f32::NAN];
    let mut y = [0f32; 9];
    relu(&x, &mut y);
    for (a, b) in x.iter().zip(&y) {
        assert!(close(*b, a.max(0.0), 0.0, 0.0) || (a.is_nan() && b.is_nan()));
    }
    assert!(y[2].is_nan() && y[8].is_nan());
    assert!(max(&x).is_nan());
    assert_eq!(max(&x[..2]), 1.0);
    let long = data(37, 9);
    let want = long.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    assert_eq!(max(&long), want);
}

#[test]
fn sum_softmax_sigmoid_and_normalize_match_f64() {
    for n in [1usize, 3, 4, 8, 15, 17, 64, 100, 1000] {
        let x = data(n, n as u32);
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!(
            (sum(&x) as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
            "sum n={n}"
        );

        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = x.iter().map(|&v| libm::exp(v as f64 - m)).sum();
        let mut y = alloc::vec![0f32; n];
        softmax_row(&x, &mut y);
        for i in 0..n {
            let w = (libm::exp(x[i] as f64 - m) / z) as f32;
            assert!(
                close(y[i], w, 1e-5, 1e-9),
                "softmax n={n} i={i}: {} vs {w}",
                y[i]
            );
        }

        sigmoid(&x, &mut y);
        for i in 0..n {
            let w = (1.0 / (1.0 + libm::exp(-(x[i] as f64)))) as f32;
            assert!(
                close(y[i], w, 1e-6, 1e-9),
                "sigmoid({}) = {} vs {w}",
                x[i],
                y[i]
            );
        }

        let scale = data(n, 7);
        let bias = data(n, 8);
        normalize_row(&x, 0.25, 1.5, &scale, Some(&bias), &mut y);
        for i in 0..n {
            let w = (x[i] - 0.25) * 1.5 * scale[i] + bias[i];
            assert!(close(y[i], w, 1e-6, 1e-6), "normalize n={n} i={i}");
        }
        normalize_row(&x, 0.25, 1.5, &scale, None, &mut y);
        for i in 0..n {
            let w = (x[i] - 0.25) * 1.5 * scale[i];
            assert!(
                close(y[i], w, 1e-6, 1e-6),
                "normalize (no bias) n={n} i={i}"
            );
        }
    }
}

#[test]
fn sgemm_matches_reference_across_blocking_edges() {
    let shapes = [
        (1usize, 1usize, 1usize),
        (1, 17, 5),
        (7, 13, 29),
        (4, 16, 8),
        (65, 33, 300),
        (3, 2100, 7),
        (2, 70, 300),
        (70, 9, 1),
    ];
    for &(m, n, k) in &shapes {
        for &(ta, tb, alpha, beta) in &[
            (false, false, 1.0f32, 0.0f32),
            (true, false, 0.5, 1.0),
            (false, true, 1.0, 2.0),
            (true, true, -1.5, 0.0),
        ] {
            let a = data(m * k, 3);
            let b = data(k * n, 4);
            let g = Gemm {
                m,
                n,
                k,
                a_rs: if ta { 1 } else { k as isize },
                a_cs: if ta { m as isize } else { 1 },
                b_rs: if tb { 1 } else { n as isize },
                b_cs: if tb { k as isize } else { 1 },
                ldc: n + 3,
                alpha,
                beta,
            };
            let c0 = data(m * (n + 3), 5);
            let mut want = c0.clone();
            reference_sgemm(&g, &a, &b, &mut want);
            let mut got = c0.clone();
            assert!(sgemm_checked(&g, &a, &b, &mut got));
            let mut port = c0.clone();
            kernels::sgemm::<Portable>(&g, &a, &b, &mut port);
            for i in 0..want.len() {
                let tol = 1e-4 * (k as f32).sqrt() * 10.0;
                assert!(
                    close(got[i], want[i], 1e-4, tol),
                    "{m}x{n}x{k} {ta} {tb} at {i}: {} vs {}",
                    got[i],
                    want[i]
                );
                assert!(
                    close(port[i], want[i], 1e-4, tol),
                    "portable {m}x{n}x{k} at {i}"
                );
            }
            // the padding columns between rows (ldc > n) are untouched
            for i in 0..m {
                for j in n..n + 3 {
                    assert_eq!(got[i * (n + 3) + j], c0[i * (n + 3) + j]);
                }
            }
        }
    }
}

#[test]
fn sgemm_checked_refuses_out_of_bounds_operands() {
    let g = Gemm {
        m: 2,
        n: 2,
        k: 2,
        a_rs: 2,
        a_cs: 1,
        b_rs: 2,
        b_cs: 1,
        ldc: 2,
        alpha: 1.0,
        beta: 0.0,
    };
    let mut c = [7f32; 4];
    assert!(!sgemm_checked(&g, &[1.0; 3], &[1.0; 4], &mut c));
    assert_eq!(c, [7.0; 4], "nothing written");
    let neg = Gemm { a_rs: -2, ..g };
    assert!(!sgemm_checked(&neg, &[1.0; 4], &[1.0; 4], &mut c));
    assert!(sgemm_checked(&g, &[1.0; 4], &[1.0; 4], &mut c));
    assert_eq!(c, [2.0; 4]);
}

#[test]
fn softmax_of_a_row_with_nan_is_all_nan() {
    for n in [3usize, 9, 40] {
        for pos in [0, n / 2, n - 1] {
            let mut x = data(n, 11);
            x[pos] = f32::NAN;
            let mut y = alloc::vec![0f32; n];
            softmax_row(&x, &mut y);
            assert!(y.iter().all(|v| v.is_nan()), "n={n} NaN at {pos}: {y:?}");
        }
    }
}
