//! The dispatched kernels (AVX2 here on most x86 machines, SIMD128 under wasm) against plain
//! scalar arithmetic, and the portable instantiation against the same, at sizes that exercise
//! full vectors, tails and every GEMM blocking edge.

use super::gemm::reference_sgemm;
use super::kernels;
use super::*;
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
    // below the normal range: exactly zero, never a subnormal (softmax over masked scores
    // feeds a product, where subnormals cost some CPUs an assist per operation)
    let lows = [-87.5f32, -90.0, -103.0, -1.0e4, f32::NEG_INFINITY, f32::MIN];
    let mut z = [1f32; 6];
    exp(&lows, &mut z);
    let mut zp = [1f32; 6];
    kernels::exp::<Portable>(&lows, &mut zp);
    assert_eq!(z, [0.0; 6], "exp below the normal range");
    assert_eq!(zp, [0.0; 6], "portable exp below the normal range");
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
            // ONNX Runtime's rational logistic: absolute error up to 1.2e-7
            assert!(
                close(y[i], w, 0.0, 1.5e-7),
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
        (200, 5, 40),
        (130, 12, 300),
        // more than one band of A's rows (MS) and block of K (KC); several blocks of B's
        // columns (NC) with two blocks of K
        (530, 33, 780),
        (40, 300, 800),
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

/// A 2 x 2 x 2 row-major product (for the bounds checks).
fn two_by_two() -> Gemm {
    Gemm {
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
    }
}

#[test]
fn packed_and_row_operands_give_the_strided_product_on_every_isa() {
    // A packed into row panels, B packed into column panels, and B read from row windows of
    // one buffer (the implicit-GEMM layout: row p of B is data[offs[p]..]), on each ISA this
    // machine has, across the blocking edges (k > KC, m > MC, n not a multiple of a panel)
    for isa in available_isas() {
        let (top, nr) = gemm_tile_on(isa);
        // every A panel height this ISA's micro-kernels take (the widest, and a narrower one
        // for products it would pad)
        let heights = [4usize, 8, 12]
            .into_iter()
            .filter(|&p| gemm_panel_ok_on(isa, p));
        assert!(heights.clone().any(|p| p == top));
        for (mr, &(m, n, k)) in heights.flat_map(|mr| {
            [
                (1usize, 5usize, 3usize),
                (9, 33, 7),
                (70, 100, 300),
                (8, 64, 257),
                // several M blocks whatever the panel height (MC rounds up to whole panels)
                (150, 40, 20),
                // several bands of A (MS), blocks of K (KC) and of B's columns (NC)
                (530, 40, 780),
                (30, 300, 800),
                // narrow C from packed A (the narrow product: blocks of 8, 4, 2 and 1
                // columns, ragged last panels, one step of K)
                (13, 8, 40),
                (40, 16, 5),
                (100, 3, 64),
                (12, 1, 1),
                (30, 15, 2),
                // one to three rows against packed B (the few-row product: streams of
                // panels, the panels past them, K not a multiple of its unroll; the ragged
                // last panel at the end of the last stream)
                (1, 300, 37),
                (1, 250, 20),
                (2, 250, 7),
                // panels of 64 KiB and more (adjacent panels as the streams)
                (1, 300, 2100),
                (2, 70, 2100),
                (2, 70, 9),
                (3, 129, 64),
                (1, 33, 1),
            ]
            .iter()
            .map(move |c| (mr, c))
            .collect::<Vec<_>>()
        }) {
            let a = data(m * k, 11);
            // B's rows as overlapping windows: row p starts at 3 * p, so B has k rows of n
            let offs: Vec<usize> = (0..k).map(|p| 3 * p).collect();
            let reach = 3 * (k - 1) + n.div_ceil(nr) * nr;
            let src = data(reach, 12);
            let b: Vec<f32> = (0..k * n).map(|i| src[offs[i / n] + i % n]).collect();
            for &(alpha, beta) in &[(1.0f32, 0.0f32), (1.0, 1.0), (-0.5, 2.0)] {
                let g = Gemm {
                    m,
                    n,
                    k,
                    a_rs: k as isize,
                    a_cs: 1,
                    b_rs: n as isize,
                    b_cs: 1,
                    ldc: n + 2,
                    alpha,
                    beta,
                };
                let c0 = data(m * (n + 2), 13);
                let mut want = c0.clone();
                reference_sgemm(&g, &a, &b, &mut want);
                let pa = gemm::pack_a(m, k, &a, k as isize, 1, mr);
                let pb = gemm::pack_b(k, n, &b, n as isize, 1, nr);
                let cases = [
                    (
                        "packed A",
                        Operand::Panels {
                            data: &pa,
                            panel: mr,
                        },
                        Operand::Strided(&b),
                    ),
                    (
                        "packed B",
                        Operand::Strided(&a),
                        Operand::Panels {
                            data: &pb,
                            panel: nr,
                        },
                    ),
                    (
                        "both packed",
                        Operand::Panels {
                            data: &pa,
                            panel: mr,
                        },
                        Operand::Panels {
                            data: &pb,
                            panel: nr,
                        },
                    ),
                    (
                        "B rows",
                        Operand::Strided(&a),
                        Operand::Rows {
                            data: &src,
                            offs: &offs,
                        },
                    ),
                ];
                for (what, oa, ob) in cases {
                    let mut got = c0.clone();
                    if alpha == 1.0 {
                        sgemm_ops_unchecked_on(isa, &g, oa, ob, &mut got);
                    } else if gemm_tile().1 == nr && gemm_panel_ok(mr) {
                        // the checked entry (it unpacks a packed A for alpha) runs on the
                        // dispatched ISA, whose panels these are
                        assert!(sgemm_ops_checked(&g, oa, ob, &mut got), "{what}");
                    } else {
                        continue;
                    }
                    let tol = 1e-4 * (k as f32).sqrt() * 10.0;
                    for i in 0..want.len() {
                        assert!(
                            close(got[i], want[i], 1e-4, tol),
                            "{isa:?} {what} {m}x{n}x{k} alpha {alpha} at {i}: {} vs {}",
                            got[i],
                            want[i]
                        );
                    }
                    if alpha != 1.0 {
                        continue;
                    }
                    // the epilogue (a bias per row, then a clamp that cuts on both sides) on
                    // every path: the blocked one (the bias on the first block of K, the
                    // clamp on the last), the narrow, few-row and few-panel ones (a pass)
                    let bias = data(m, 14);
                    let epi = GemmEpi {
                        bias: Some(&bias),
                        clamp: Some(Clamp { lo: -0.3, hi: 0.4 }),
                    };
                    let mut want_e = want.clone();
                    epi.apply(m, n, g.ldc, &mut want_e);
                    let mut got = c0.clone();
                    sgemm_ops_epi_unchecked_on(isa, &g, oa, ob, &mut got, epi);
                    let clamped = want_e.iter().filter(|&&v| v == 0.4 || v == -0.3).count();
                    assert!(clamped > 0 || m * n < 8, "the case clamps nothing");
                    for i in 0..want_e.len() {
                        assert!(
                            close(got[i], want_e[i], 1e-4, tol),
                            "{isa:?} {what} {m}x{n}x{k} epilogue, beta {beta} at {i}: {} vs {}",
                            got[i],
                            want_e[i]
                        );
                    }
                }
            }
        }
        // operands that do not fit are refused, not read past
        let g = two_by_two();
        let mut c = [7f32; 4];
        let short = [1.0f32; 3];
        let a = [1.0f32; 4];
        let rows = Operand::Rows {
            data: &short,
            offs: &[0, 1],
        };
        assert!(!sgemm_ops_checked(&g, Operand::Strided(&a), rows, &mut c));
        let wrong_panel = Operand::Panels {
            data: &[1.0; 64],
            panel: nr + 1,
        };
        assert!(!sgemm_ops_checked(
            &g,
            Operand::Strided(&a),
            wrong_panel,
            &mut c
        ));
        assert_eq!(c, [7.0; 4], "nothing written");
    }
}

#[test]
fn sgemm_checked_refuses_out_of_bounds_operands() {
    let g = two_by_two();
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

/// The f64 form of each activation, the reference the vector code is checked against.
fn act_f64(a: Act, x: f64) -> f64 {
    let sig = |v: f64| 1.0 / (1.0 + libm::exp(-v));
    match a {
        Act::Identity => x,
        Act::Relu => x.max(0.0),
        Act::LeakyRelu(al) => {
            if x < 0.0 {
                al as f64 * x
            } else {
                x
            }
        }
        Act::LeakyReluClip { alpha, lo, hi } => {
            let y = if x < 0.0 { alpha as f64 * x } else { x };
            y.max(lo as f64).min(hi as f64)
        }
        Act::Sigmoid => sig(x),
        Act::Tanh => libm::tanh(x),
        Act::HardSigmoid(al, be) => (al as f64 * x + be as f64).clamp(0.0, 1.0),
        Act::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        Act::Swish(al) => x * sig(al as f64 * x),
        Act::Elu(al) => {
            if x < 0.0 {
                al as f64 * libm::expm1(x)
            } else {
                x
            }
        }
        Act::Gelu => 0.5 * x * libm::erfc(-x / core::f64::consts::SQRT_2),
        Act::GeluTanh => {
            let k = (2.0 / core::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + libm::tanh(k * (x + 0.044715 * x * x * x)))
        }
        Act::Clip(lo, hi) => x.clamp(lo as f64, hi as f64),
        Act::HardSwishParts { shift, lo, hi, div } => {
            x * (x + shift as f64).clamp(lo as f64, hi as f64) / div as f64
        }
        Act::Exp => libm::exp(x),
        Act::Erf => libm::erf(x),
    }
}

#[test]
fn every_isa_is_detected_and_the_portable_one_is_always_there() {
    let isas = available_isas();
    assert_eq!(isas[0], Isa::Portable);
    assert!(isas.contains(&isa()), "{:?} not in {isas:?}", isa());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    assert!(isas.contains(&Isa::Avx2));
    #[cfg(target_arch = "aarch64")]
    assert_eq!(isa(), Isa::Neon);
    for i in &isas {
        assert_eq!(Isa::parse(i.name()), Some(*i));
    }
}

#[test]
fn activations_match_f64_on_every_isa() {
    // dense near 0 (the polynomial branches and their switch at |x| = 0.5), then wide
    let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 / 1000.0).collect();
    xs.extend((-900..=900).map(|i| i as f32 / 10.0));
    xs.extend([
        1e-6, -1e-6, 1e-30, -1e-30, 0.0, -0.0, 0.4999999, 0.5000001, -0.5,
    ]);
    let acts = [
        Act::Identity,
        Act::Relu,
        Act::LeakyRelu(0.1),
        Act::LeakyReluClip {
            alpha: 0.2,
            lo: -0.4,
            hi: 1.5,
        },
        Act::Sigmoid,
        Act::Tanh,
        Act::HardSigmoid(0.2, 0.5),
        Act::HardSwish,
        Act::Swish(1.0),
        Act::Elu(1.0),
        Act::Gelu,
        Act::GeluTanh,
        Act::Clip(-1.5, 2.0),
        Act::HardSwishParts {
            shift: 3.0,
            lo: 0.0,
            hi: 6.0,
            div: 6.0,
        },
        Act::Exp,
        Act::Erf,
    ];
    for isa in available_isas() {
        for &a in &acts {
            let mut y = alloc::vec![0f32; xs.len()];
            unary_on(isa, a, &xs, &mut y);
            let mut z = xs.clone();
            unary_inplace_on(isa, a, &mut z);
            for (i, &x) in xs.iter().enumerate() {
                if a == Act::Exp && x > 88.0 {
                    continue; // saturates (see exp_is_accurate_over_the_range)
                }
                let want = act_f64(a, x as f64);
                // relative error against the f64 value, with an absolute floor (1e-30: sigmoid saturates at e^-88) where the
                // function crosses zero or is computed as a difference (Elu's e^x - 1)
                let atol = match a {
                    Act::Elu(_) => 1.2e-7,
                    // the far negative tail (below 1e-12), where rounding x^2 costs digits
                    Act::Gelu => 1e-12,
                    // 1 + tanh(..) cancels in f32 in every implementation of this formula
                    Act::GeluTanh => 1e-6,
                    // ONNX Runtime's rational logistic (absolute error up to 1.2e-7; 0 from
                    // x = -18 down), times x for Swish
                    Act::Sigmoid => 1.5e-7,
                    Act::Swish(al) => 1.5e-7 * (al * x).abs().max(1.0),
                    _ => 1e-30,
                };
                assert!(
                    close(y[i], want as f32, 2e-6, atol),
                    "{isa:?} {a:?}({x}) = {}, want {want}",
                    y[i]
                );
                assert_eq!(y[i].to_bits(), z[i].to_bits(), "{isa:?} {a:?} in place");
            }
            // NaN propagates through every activation
            let mut n = [0f32; 3];
            unary_on(isa, a, &[f32::NAN, 1.0, f32::NAN], &mut n);
            assert!(n[0].is_nan() && n[2].is_nan(), "{isa:?} {a:?} keeps NaN");
        }
    }
}

#[test]
fn tanh_and_erf_keep_their_odd_symmetry_and_limits() {
    for isa in available_isas() {
        let xs = [0.3f32, 0.5, 0.7, 3.0, 9.0, 40.0, f32::INFINITY];
        let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
        for a in [Act::Tanh, Act::Erf] {
            let (mut p, mut q) = ([0f32; 7], [0f32; 7]);
            unary_on(isa, a, &xs, &mut p);
            unary_on(isa, a, &neg, &mut q);
            for i in 0..7 {
                assert_eq!(p[i], -q[i], "{isa:?} {a:?} odd at {}", xs[i]);
            }
            assert_eq!(p[6], 1.0, "{isa:?} {a:?}(inf)");
        }
    }
}

#[test]
fn kernels_agree_across_isas() {
    let x = data(1000, 21);
    let b = data(40, 22);
    let isas = available_isas();
    for &isa in &isas {
        // the binary ops are exact on every ISA
        for op in [BinOp::Add, BinOp::Mul, BinOp::Max] {
            let mut o1 = alloc::vec![0f32; x.len()];
            let mut o2 = alloc::vec![0f32; x.len()];
            binary_repeat_on(isa, op, &x, &b, &mut o1);
            binary_repeat_on(Isa::Portable, op, &x, &b, &mut o2);
            assert_eq!(o1, o2, "{isa:?} {op:?}");
        }
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((sum_on(isa, &x) as f64 - want).abs() < 1e-3, "{isa:?} sum");
        // direct-convolution taps, at lengths covering the 4-vector, 1-vector and scalar loops,
        // with 4 taps (the general loop) and 9 and 25 (the ones with weights in registers)
        let tap_sets: [(Vec<f32>, Vec<usize>); 3] = [
            (
                alloc::vec![0.5f32, -1.25, 2.0, 0.125],
                alloc::vec![0usize, 3, 17, 40],
            ),
            (
                (0..9).map(|t| 0.25 * t as f32 - 1.0).collect(),
                (0..9).map(|t| (t / 3) * 21 + t % 3).collect(),
            ),
            (
                (0..25).map(|t| 0.5 - 0.0625 * t as f32).collect(),
                (0..25).map(|t| (t / 5) * 13 + t % 5).collect(),
            ),
        ];
        for ((ws, offs), n) in tap_sets
            .iter()
            .flat_map(|t| [1usize, 7, 16, 20, 33, 40, 47, 63, 64, 65, 200, 900].map(|n| (t, n)))
        {
            let mut acc = alloc::vec![f32::NAN; n];
            conv_taps_on(isa, ws, offs, &x, 0.75, &mut acc);
            for (i, &got) in acc.iter().enumerate() {
                let want: f64 = 0.75
                    + ws.iter()
                        .zip(offs)
                        .map(|(&w, &o)| w as f64 * x[o + i] as f64)
                        .sum::<f64>();
                assert!(
                    close(got, want as f32, 1e-5, 1e-4),
                    "{isa:?} taps n={n} at {i}"
                );
            }
        }
        assert_eq!(max_on(isa, &x), max_on(Isa::Portable, &x), "{isa:?} max");
        // stride-2 phases of zero-padded rows: pads 0..3, rows with and without a vector
        // tail, phases shorter and longer than the row covers
        for n in [1usize, 4, 16, 31, 33, 37, 100] {
            for pad in [0isize, 1, 2, 3] {
                for width in [1usize, n / 2, n.div_ceil(2) + 2, n + 5] {
                    let src = &x[..n];
                    let mut ph = [alloc::vec![f32::NAN; width], alloc::vec![f32::NAN; width]];
                    let [p0, p1] = &mut ph;
                    phases2_on(isa, src, pad, p0, p1);
                    for (r, p) in ph.iter().enumerate() {
                        for (q, &got) in p.iter().enumerate() {
                            let j = 2 * q as isize + r as isize - pad;
                            let want = if (0..n as isize).contains(&j) {
                                src[j as usize]
                            } else {
                                0.0
                            };
                            assert_eq!(got, want, "{isa:?} phases2 n={n} pad={pad} r={r} q={q}");
                        }
                    }
                }
            }
        }
        // transposes: whole register blocks, ragged edges, leading dimensions past the width
        for &(rows, cols, lds, ldd) in &[
            (16usize, 16usize, 16usize, 16usize),
            (8, 8, 8, 8),
            (4, 4, 5, 4),
            (16, 37, 40, 19),
            (23, 16, 16, 30),
            (3, 50, 50, 3),
            (33, 30, 30, 33),
        ] {
            let mut got = alloc::vec![f32::NAN; (cols - 1) * ldd + rows];
            transpose_matrix_on(isa, &x, lds, rows, cols, &mut got, ldd);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        got[c * ldd + r],
                        x[r * lds + c],
                        "{isa:?} transpose {rows}x{cols} at ({r}, {c})"
                    );
                }
            }
            // the same into separate rows (one spare row past `cols` stays untouched)
            let mut rows_buf = alloc::vec![f32::NAN; (cols + 1) * (rows + 2)];
            let mut dst: Vec<&mut [f32]> = rows_buf.chunks_mut(rows + 2).collect();
            transpose_to_rows_on(isa, &x, lds, rows, cols, &mut dst);
            for (c, row) in dst.iter().enumerate() {
                for (r, &v) in row.iter().enumerate() {
                    if c < cols && r < rows {
                        assert_eq!(
                            v,
                            x[r * lds + c],
                            "{isa:?} to rows {rows}x{cols} ({r}, {c})"
                        );
                    } else {
                        assert!(v.is_nan(), "{isa:?} to rows {rows}x{cols} wrote ({r}, {c})");
                    }
                }
            }
        }
        // the channel-interleaved depthwise taps: 3 taps over 2 rows of 9 positions
        let (taps, n, pitch) = (3usize, 9 * DW_BLOCK, 10 * DW_BLOCK);
        let w: Vec<f32> = (0..taps * DW_BLOCK)
            .map(|i| 0.01 * i as f32 - 0.2)
            .collect();
        let bias: Vec<f32> = (0..DW_BLOCK).map(|i| i as f32 * 0.5).collect();
        let offs = [0usize, DW_BLOCK, 4 * DW_BLOCK];
        for rows in [1usize, 2] {
            let mut out = alloc::vec![f32::NAN; rows * n];
            dw_rows_on(isa, &w, &bias, &offs, &x, pitch, n, &mut out);
            for r in 0..rows {
                for i in 0..n {
                    let lane = i % DW_BLOCK;
                    let want = bias[lane]
                        + (0..taps)
                            .map(|t| w[t * DW_BLOCK + lane] * x[r * pitch + offs[t] + i])
                            .sum::<f32>();
                    assert!(
                        close(out[r * n + i], want, 1e-5, 1e-4),
                        "{isa:?} dw_rows row {r} at {i}"
                    );
                }
            }
        }
        // SGEMM at a few shapes, against the bounds-checked reference
        for &(m, n, k) in &[
            (1usize, 40usize, 33usize),
            (9, 37, 70),
            (33, 70, 300),
            (257, 8, 512),
        ] {
            let a = data(m * k, 3);
            let bm = data(k * n, 4);
            let g = Gemm::row_major(m, n, k);
            let mut want = alloc::vec![0f32; m * n];
            reference_sgemm(&g, &a, &bm, &mut want);
            let mut got = alloc::vec![1f32; m * n];
            sgemm_unchecked_on(isa, &g, &a, &bm, &mut got);
            for i in 0..want.len() {
                assert!(
                    close(got[i], want[i], 1e-4, 1e-2),
                    "{isa:?} {m}x{n}x{k} at {i}"
                );
            }
        }
    }
}

/// One blocked-layout convolution case: input channels, kernel, stride, dilation, leading pads,
/// input size; `blocked`: the input in the blocked layout (else plain NCHW).
struct NcCase {
    cin: usize,
    k: (usize, usize),
    s: (usize, usize),
    d: (usize, usize),
    p: (usize, usize),
    hw: (usize, usize),
    blocked: bool,
}

impl NcCase {
    fn geom(&self) -> NcGeom {
        let (ih, iw) = self.hw;
        // trailing pads one less than the leading ones (asymmetric), never negative
        let out = |i: usize, k: usize, s: usize, d: usize, p: usize| {
            (i + p + p.saturating_sub(1) - (k - 1) * d - 1) / s + 1
        };
        let (xbs, x_blk, x_pos, x_lane) = if self.blocked {
            (NCHWC, ih * iw * NCHWC, NCHWC, 1)
        } else {
            (self.cin, self.cin * ih * iw, 1, ih * iw)
        };
        NcGeom {
            cin: self.cin,
            xbs,
            x_blk,
            x_pos,
            x_lane,
            ih,
            iw,
            oh: out(ih, self.k.0, self.s.0, self.d.0, self.p.0),
            ow: out(iw, self.k.1, self.s.1, self.d.1, self.p.1),
            kh: self.k.0,
            kw: self.k.1,
            sh: self.s.0,
            sw: self.s.1,
            dh: self.d.0,
            dw: self.d.1,
            ph: self.p.0,
            pw: self.p.1,
            clamp: None,
        }
    }
}

/// `v` clamped one value at a time ([`Clamp`]'s scalar form), or as it is.
fn clamped(mut v: Vec<f32>, c: Option<Clamp>) -> Vec<f32> {
    use kernels::Then;
    if let Some(c) = c {
        v.iter_mut().for_each(|x| *x = c.then1(*x));
    }
    v
}

/// The convolution's definition: output (oh, ow) of lane `l` of a block with weights `w`
/// ([cin][kh][kw][16]) and bias `b`, reading channel `c` of `x` where the geometry says
/// (`depthwise`: channel `l` of the block only, weights [kh][kw][16]).
fn nc_reference(g: &NcGeom, x: &[f32], w: &[f32], b: &[f32], depthwise: bool) -> Vec<f32> {
    let mut y = alloc::vec![0f32; g.oh * g.ow * NCHWC];
    for oh in 0..g.oh {
        for ow in 0..g.ow {
            for l in 0..NCHWC {
                let mut acc = b[l] as f64;
                let chans: Vec<usize> = if depthwise {
                    alloc::vec![l]
                } else {
                    (0..g.cin).collect()
                };
                for c in chans {
                    for ki in 0..g.kh {
                        for kj in 0..g.kw {
                            let (r, q) = (oh * g.sh + ki * g.dh, ow * g.sw + kj * g.dw);
                            if r < g.ph || q < g.pw || r - g.ph >= g.ih || q - g.pw >= g.iw {
                                continue;
                            }
                            let p = (r - g.ph) * g.iw + q - g.pw;
                            let xv = if depthwise {
                                x[p * NCHWC + c]
                            } else {
                                x[(c / g.xbs) * g.x_blk + p * g.x_pos + (c % g.xbs) * g.x_lane]
                            };
                            let wo = if depthwise { 0 } else { c * g.kh * g.kw };
                            acc += xv as f64 * w[(wo + ki * g.kw + kj) * NCHWC + l] as f64;
                        }
                    }
                }
                y[(oh * g.ow + ow) * NCHWC + l] = acc as f32;
            }
        }
    }
    y
}

#[test]
fn blocked_convolutions_match_the_definition_on_every_isa() {
    let cases = [
        // pointwise-like, plain input with 3 channels (a stem), wide rows
        NcCase {
            cin: 3,
            k: (3, 3),
            s: (2, 2),
            d: (1, 1),
            p: (1, 1),
            hw: (9, 31),
            blocked: false,
        },
        NcCase {
            cin: 20,
            k: (1, 1),
            s: (1, 1),
            d: (1, 1),
            p: (0, 0),
            hw: (5, 7),
            blocked: true,
        },
        NcCase {
            cin: 37,
            k: (1, 1),
            s: (1, 1),
            d: (1, 1),
            p: (0, 0),
            hw: (3, 40),
            blocked: false,
        },
        // padding wider than the kernel reach on a narrow plane, dilation, uneven strides
        NcCase {
            cin: 17,
            k: (3, 5),
            s: (1, 2),
            d: (2, 1),
            p: (2, 2),
            hw: (6, 5),
            blocked: true,
        },
        NcCase {
            cin: 5,
            k: (5, 5),
            s: (1, 1),
            d: (1, 1),
            p: (2, 2),
            hw: (7, 7),
            blocked: true,
        },
        NcCase {
            cin: 16,
            k: (3, 3),
            s: (2, 2),
            d: (1, 1),
            p: (1, 1),
            hw: (14, 29),
            blocked: true,
        },
        // input channels over several chunks (their weights past the L1 share), at stride 1
        // (the constant-step tiles) over rows split in tiles of unequal sizes, blocked and plain
        NcCase {
            cin: 40,
            k: (3, 3),
            s: (1, 1),
            d: (1, 1),
            p: (1, 1),
            hw: (4, 61),
            blocked: true,
        },
        NcCase {
            cin: 40,
            k: (3, 3),
            s: (1, 1),
            d: (1, 1),
            p: (1, 1),
            hw: (3, 27),
            blocked: false,
        },
    ];
    // Relu-like bounds that cut both ends of the sums, applied in registers as they are stored
    let bounds = Clamp { lo: -0.2, hi: 0.3 };
    for isa in available_isas() {
        for (ci, (cs, clamp)) in cases
            .iter()
            .flat_map(|c| [(c, None), (c, Some(bounds))])
            .enumerate()
        {
            let g = NcGeom { clamp, ..cs.geom() };
            let xlen = if cs.blocked {
                cs.cin.div_ceil(NCHWC) * g.x_blk
            } else {
                g.x_blk
            };
            let x = data(xlen, 11 + ci as u32);
            let wl = cs.cin * g.kh * g.kw * NCHWC;
            let (w0, w1) = (data(wl, 12), data(wl, 13));
            let (b0, b1) = (data(NCHWC, 14), data(NCHWC, 15));
            let want0 = clamped(nc_reference(&g, &x, &w0, &b0, false), clamp);
            let want1 = clamped(nc_reference(&g, &x, &w1, &b1, false), clamp);
            let n = g.oh * g.ow * NCHWC;
            // two blocks at once and one, each row in two segments
            for two in [true, false] {
                let (mut y0, mut y1) = (alloc::vec![f32::NAN; n], alloc::vec![f32::NAN; n]);
                for oh in 0..g.oh {
                    let mid = g.ow / 2;
                    for (a, b) in [(0, mid), (mid, g.ow)] {
                        let r = (oh * g.ow + a) * NCHWC..(oh * g.ow + b) * NCHWC;
                        let (wb, bb, yb): (&[f32], &[f32], &mut [f32]) = if two {
                            (&w1, &b1, &mut y1[r.clone()])
                        } else {
                            (&[], &[], &mut [])
                        };
                        nchwc_conv_seg_on(
                            isa,
                            &g,
                            &x,
                            (&w0, wb),
                            (&b0, bb),
                            oh,
                            a,
                            b,
                            (&mut y0[r], yb),
                        );
                    }
                }
                for (i, (&got, &want)) in y0.iter().zip(&want0).enumerate() {
                    assert!(
                        close(got, want, 1e-4, 1e-3),
                        "{isa:?} case {ci} block 0 at {i}: {got} vs {want}"
                    );
                }
                if two {
                    for (i, (&got, &want)) in y1.iter().zip(&want1).enumerate() {
                        assert!(
                            close(got, want, 1e-4, 1e-3),
                            "{isa:?} case {ci} block 1 at {i}: {got} vs {want}"
                        );
                    }
                }
            }
            // depthwise over one block of the same geometry (blocked input of 16 channels)
            let g = NcGeom {
                cin: NCHWC,
                xbs: NCHWC,
                x_blk: g.ih * g.iw * NCHWC,
                x_pos: NCHWC,
                x_lane: 1,
                ..g
            };
            let x = data(g.x_blk, 21 + ci as u32);
            let w = data(g.kh * g.kw * NCHWC, 22);
            let want = clamped(nc_reference(&g, &x, &w, &b0, true), clamp);
            let mut y = alloc::vec![f32::NAN; n];
            for oh in 0..g.oh {
                let r = oh * g.ow * NCHWC..(oh + 1) * g.ow * NCHWC;
                nchwc_dw_seg_on(isa, &g, &x, &w, &b0, oh, 0, g.ow, &mut y[r]);
            }
            for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                assert!(
                    close(got, want, 1e-5, 1e-4),
                    "{isa:?} depthwise case {ci} at {i}: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn pair_max_folds_like_max_pooling_on_every_isa() {
    let mut src: Vec<f32> = (0..2 * 37).map(|i| ((i * 29) % 23) as f32 - 11.0).collect();
    for i in (0..src.len()).step_by(5) {
        src[i] = f32::NAN;
    }
    src[6] = f32::NAN;
    src[7] = f32::NAN;
    src[9] = f32::NEG_INFINITY;
    for isa in available_isas() {
        for n in [0, 1, 16, 37] {
            let mut out = alloc::vec![0f32; n];
            pair_max_on(isa, &src[..2 * n], &mut out);
            for (j, &o) in out.iter().enumerate() {
                let mut acc = f32::NEG_INFINITY;
                for &v in &src[2 * j..2 * j + 2] {
                    if v > acc {
                        acc = v;
                    }
                }
                assert_eq!(o.to_bits(), acc.to_bits(), "{isa:?} n {n} at {j}");
            }
        }
    }
}

#[test]
fn moments_match_f64_two_pass_on_every_isa() {
    // lengths around the lane widths and the f32 block edge, and rows far from zero (a large
    // mean next to a small spread is where accumulating in f32 would go wrong)
    for isa in available_isas() {
        for &n in &[1usize, 7, 16, 33, 511, 512, 513, 768, 5000, 100_003] {
            for &offset in &[0f32, 1000.0, -30000.0] {
                let x: Vec<f32> = data(n, n as u32)
                    .iter()
                    .map(|v| v * 0.01 + offset)
                    .collect();
                let nf = n as f64;
                let mean = x.iter().map(|&v| v as f64).sum::<f64>() / nf;
                let var = x
                    .iter()
                    .map(|&v| (v as f64 - mean) * (v as f64 - mean))
                    .sum::<f64>()
                    / nf;
                let (m, v) = moments_on(isa, &x);
                assert!(
                    (m - mean).abs() <= 1e-6 * mean.abs().max(1.0),
                    "{isa:?} n={n} offset={offset}: mean {m} vs {mean}"
                );
                assert!(
                    (v - var).abs() <= 1e-4 * var + 1e-9,
                    "{isa:?} n={n} offset={offset}: variance {v} vs {var}"
                );
            }
        }
        // a NaN or an infinity in the row makes both statistics NaN, as f64 sums would
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = data(100, 3);
            x[37] = bad;
            let (m, v) = moments_on(isa, &x);
            assert!(
                v.is_nan() && (m.is_nan() || m.is_infinite()),
                "{isa:?} {bad}: {m} {v}"
            );
        }
    }
}

/// A depthwise plane as plain sums over the taps inside the plane, in f64, then clamped.
fn dw_plane_naive(g: &DwPlane, x: &[f32], w: &[f32], bias: f32, clamp: Option<Clamp>) -> Vec<f32> {
    let mut y = Vec::with_capacity(g.oh * g.ow);
    for i in 0..g.oh {
        for j in 0..g.ow {
            let mut s = bias as f64;
            for ki in 0..g.kh {
                for kj in 0..g.kw {
                    let r = (i * g.sh + ki * g.dh) as isize - g.ph;
                    let c = (j + kj * g.dw) as isize - g.pw;
                    if r >= 0 && c >= 0 && (r as usize) < g.ih && (c as usize) < g.iw {
                        s += w[ki * g.kw + kj] as f64 * x[r as usize * g.iw + c as usize] as f64;
                    }
                }
            }
            let v = s as f32;
            y.push(clamp.map_or(v, |c| kernels::Then::then1(c, v)));
        }
    }
    y
}

#[test]
fn dw_plane_rows_match_naive_sums_on_every_isa() {
    // (kh, kw, dh, dw, sh, ph, pw, ih, iw): 3x3 and 5x5 (taps in registers), 7x7, 1x7 and 3x1
    // (any number), dilation, row stride 2, pads wider than the kernel reach, no pads
    // (nothing at the edges), rows with no vector inside and rows of several vectors
    let geoms = [
        (3, 3, 1, 1, 1, 1, 1, 9, 112),
        (3, 3, 1, 1, 1, 1, 1, 6, 20),
        (3, 3, 1, 1, 2, 1, 1, 9, 47),
        (5, 5, 1, 1, 1, 2, 2, 7, 40),
        (5, 5, 1, 1, 1, 2, 2, 3, 33),
        (3, 3, 2, 2, 1, 2, 2, 8, 70),
        (7, 7, 1, 1, 1, 3, 3, 9, 65),
        (1, 7, 1, 1, 1, 0, 3, 4, 90),
        (3, 1, 1, 1, 1, 1, 0, 6, 48),
        (3, 3, 1, 1, 1, 0, 0, 7, 50),
        (3, 3, 1, 1, 1, 4, 3, 5, 24),
        (3, 3, 1, 1, 1, 1, 1, 4, 10),
        // two rows per pass (3x3, vertical stride and dilation 1): horizontal dilation, an
        // even number of rows, a last block overlapping the one before it
        (3, 3, 1, 2, 1, 1, 2, 8, 150),
        (3, 3, 1, 1, 1, 1, 1, 10, 200),
    ];
    let clamps = [None, Clamp::of(Act::Relu), Clamp::of(Act::Clip(-1.5, 2.0))];
    for isa in available_isas() {
        for (gi, &(kh, kw, dh, dw, sh, ph, pw, ih, iw)) in geoms.iter().enumerate() {
            let oh = (ih + 2 * ph - (kh - 1) * dh - 1) / sh + 1;
            let ow = iw + 2 * pw - (kw - 1) * dw;
            let g = DwPlane {
                ih,
                iw,
                oh,
                ow,
                kh,
                kw,
                sh,
                dh,
                dw,
                ph: ph as isize,
                pw: pw as isize,
            };
            let x = data(ih * iw, gi as u32 + 3);
            let w: Vec<f32> = data(kh * kw, gi as u32 + 90)
                .iter()
                .map(|v| v / 10.0)
                .collect();
            for &clamp in &clamps {
                let want = dw_plane_naive(&g, &x, &w, 0.25, clamp);
                // the whole plane, then the rows in two calls from r0 = 0 and r0 = oh / 2
                let mut got = alloc::vec![f32::NAN; oh * ow];
                dw_plane_rows_on(isa, &g, &x, &w, 0.25, clamp, 0, &mut got);
                let half = oh / 2;
                let mut parts = alloc::vec![f32::NAN; oh * ow];
                let (a, b) = parts.split_at_mut(half * ow);
                dw_plane_rows_on(isa, &g, &x, &w, 0.25, clamp, 0, a);
                dw_plane_rows_on(isa, &g, &x, &w, 0.25, clamp, half, b);
                for (k, ((&gv, &pv), &wv)) in got.iter().zip(&parts).zip(&want).enumerate() {
                    assert!(
                        close(gv, wv, 1e-5, 1e-4) && close(pv, wv, 1e-5, 1e-4),
                        "{isa:?} geometry {gi} clamp {clamp:?} at ({}, {}): {gv} / {pv}, want {wv}",
                        k / ow,
                        k % ow
                    );
                }
            }
        }
    }
}

/// The int4 / int8 weight products on every vector type against a direct f64 computation
/// (on aarch64 under qemu this covers NEON's `nibbles` and `bytes`).
#[test]
fn nbits_products_match_the_dequantized_sum_on_every_isa() {
    let (k, cols, rows) = (200usize, 7usize, 3usize);
    let a = data(rows * k, 9);
    for (bits, bs) in [(4usize, 32usize), (4, 64), (8, 32)] {
        let blocks = k.div_ceil(bs);
        let blob = bs * bits / 8;
        let raw = data(cols * blocks * blob, 3 + bits as u32);
        let b: Vec<u8> = raw.iter().map(|x| (x.to_bits() >> 7) as u8).collect();
        let scales: Vec<f32> = data(cols * blocks, 4)
            .iter()
            .map(|x| x.abs() * 0.01 + 0.001)
            .collect();
        let zp: Vec<f32> = (0..cols * blocks)
            .map(|i| (i % (1 << bits)) as f32)
            .collect();
        let code = |c: usize, kk: usize| -> f64 {
            let (bi, e) = (kk / bs, kk % bs);
            let byte = b[(c * blocks + bi) * blob + e * bits / 8];
            (if bits == 4 {
                (byte >> ((e % 2) * 4)) & 15
            } else {
                byte
            }) as f64
        };
        for int8_a in [false, true] {
            let g = NBits {
                k,
                bs,
                bits,
                int8_a,
                zp0: 0.0,
            };
            let mut want = alloc::vec![0f64; rows * cols];
            for r in 0..rows {
                for bi in 0..blocks {
                    let blk = &a[r * k + bi * bs..r * k + ((bi + 1) * bs).min(k)];
                    let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let inv = 127.0 / amax;
                    for c in 0..cols {
                        let mut s = 0f64;
                        for (e, &x) in blk.iter().enumerate() {
                            let v = if int8_a {
                                libm::rintf(x * inv) as f64
                            } else {
                                x as f64
                            };
                            s += v * (code(c, bi * bs + e) - zp[c * blocks + bi] as f64);
                        }
                        let sa = if int8_a { (amax / 127.0) as f64 } else { 1.0 };
                        want[r * cols + c] += s * sa * scales[c * blocks + bi] as f64;
                    }
                }
            }
            for isa in available_isas() {
                if !nbits_fits_on(isa, &g) {
                    continue;
                }
                let mut y = alloc::vec![0f32; rows * cols];
                nbits_rows_on(
                    isa,
                    &g,
                    &a,
                    rows,
                    &b,
                    &scales,
                    Some(&zp),
                    cols,
                    &mut y,
                    cols,
                );
                for (i, (&got, &w)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        close(got, w as f32, 1e-5, 1e-4),
                        "{isa:?} bits {bits} bs {bs} int8 {int8_a} [{i}]: {got} vs {w}"
                    );
                }
            }
            if !(int8_a && bits == 4) {
                continue;
            }
            // the integer kernel over weights packed for each vector type's lanes
            let a8 = q8_rows(&a, rows, k, bs);
            for isa in available_isas() {
                if !q4_runs_on(isa) {
                    continue;
                }
                let lanes = isa_lanes(isa);
                let p = q4_pack(lanes, &g, &b, &scales, Some(&zp), cols);
                let ld = p.groups() * lanes;
                let mut y = alloc::vec![f32::NAN; rows * ld];
                q4_rows_on(isa, &p, &a8, (0, p.groups()), &mut y, ld, None);
                for r in 0..rows {
                    for c in 0..cols {
                        let (got, w) = (y[r * ld + c], want[r * cols + c]);
                        assert!(
                            close(got, w as f32, 1e-5, 1e-4),
                            "int8 kernel on {isa:?} bs {bs} [{r}, {c}]: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn attention_rows_match_direct_sums_on_every_isa() {
    // query-key dots and the weighted sum of value rows, at head sizes with and without a
    // vector tail, over row strides wider than the rows
    for (h, ld, rows) in [
        (64usize, 64usize, 37usize),
        (20, 24, 5),
        (3, 3, 9),
        (80, 96, 1),
    ] {
        let m = data(rows * ld, 21);
        let x = data(h, 22);
        let p = data(rows, 23);
        let base = data(h, 24);
        for isa in available_isas() {
            let mut dots = alloc::vec![f32::NAN; rows];
            dot_rows_on(isa, &m, ld, &x, &mut dots);
            for (r, &d) in dots.iter().enumerate() {
                let want: f64 = (0..h).map(|e| m[r * ld + e] as f64 * x[e] as f64).sum();
                assert!(
                    close(d, want as f32, 1e-5, 1e-5),
                    "{isa:?} dot row {r}: {d} vs {want}"
                );
            }
            let mut out = base.clone();
            axpy_rows_on(isa, &p, &m, ld, &mut out);
            for (e, &o) in out.iter().enumerate() {
                let want = base[e] as f64
                    + (0..rows)
                        .map(|t| p[t] as f64 * m[t * ld + e] as f64)
                        .sum::<f64>();
                assert!(
                    close(o, want as f32, 1e-5, 1e-5),
                    "{isa:?} axpy [{e}]: {o} vs {want}"
                );
            }
        }
    }
}

/// Pseudo-random bytes.
fn bytes_of(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 7) as u8
        })
        .collect()
}

#[test]
fn integer_products_are_exact_with_zero_points_on_every_isa() {
    // sum (a - za)(b - zb) over the full byte ranges (no saturation anywhere), K not a whole
    // number of quads, N not a whole number of groups, row counts around the tile height
    for &(m, k, n) in &[
        (1, 1, 1),
        (5, 7, 19),
        (4, 64, 32),
        (9, 130, 45),
        (3, 300, 17),
    ] {
        let a = bytes_of(m * k, 1 + m as u32); // int8 bit patterns
        let b = bytes_of(k * n, 7 + k as u32); // uint8
                                               // zero points per row of A with one for B (a convolution's weights and input), and one
                                               // for A with one per column of B (a matrix product's activations and weights)
        let za_rows: Vec<i32> = (0..m).map(|i| (i as i32 * 37) % 255 - 127).collect();
        let zb_cols: Vec<i32> = (0..n).map(|j| (j as i32 * 53) % 256).collect();
        let (za1, zb1) = (-77i32, 201i32);
        let exact = |za: &dyn Fn(usize) -> i32, zb: &dyn Fn(usize) -> i32| -> Vec<i32> {
            (0..m * n)
                .map(|x| {
                    let (i, j) = (x / n, x % n);
                    (0..k)
                        .map(|kk| {
                            (a[i * k + kk] as i8 as i64 - za(i) as i64)
                                * (b[kk * n + j] as i64 - zb(j) as i64)
                        })
                        .sum::<i64>() as i32
                })
                .collect()
        };
        let want_rows = exact(&|i| za_rows[i], &|_| zb1);
        let want_cols = exact(&|_| za1, &|j| zb_cols[j]);
        for isa in available_isas() {
            if !q4_runs_on(isa) {
                continue;
            }
            let g = qgeom(isa, k, n);
            let mut bp = alloc::vec![0u8; g.packed_len()];
            let mut colsum = alloc::vec![0i32; g.np()];
            qcols_pack(&g, &b, n, 0, &mut bp, Some(&mut colsum));
            let mut ap = alloc::vec![0u8; m * g.ka()];
            let mut rowsum = alloc::vec![0i32; m];
            qrows_pack_on(isa, &g, &a, m, k, 0, &mut ap, &mut rowsum);
            let p = QGemm {
                m,
                g,
                a: &ap,
                b: &bp,
            };
            let kk = k as i32;
            // per-row za, one zb: -zb rowsum[i] + K za[i] zb as the row term, -za[i] colsum[j]
            // as the cross term
            let row_add: Vec<i32> = (0..m)
                .map(|i| -zb1 * rowsum[i] + kk * za_rows[i] * zb1)
                .collect();
            let nza: Vec<i32> = za_rows.iter().map(|z| -z).collect();
            let e_rows = QEpi {
                row_add: Some(&row_add),
                cross: Some((&colsum, &nza)),
                ..Default::default()
            };
            let mut y = alloc::vec![0i32; m * n];
            qgemm_rows_on(isa, &p, &e_rows, 0, m, QOut::I32(&mut y), n);
            assert_eq!(y, want_rows, "{isa:?} {m}x{k}x{n}, zero points per row");
            // one za, per-column zb: -za colsum[j] + K za zb[j] as the column term,
            // -zb[j] rowsum[i] as the cross term
            let mut col_add: Vec<i32> = (0..n)
                .map(|j| -za1 * colsum[j] + kk * za1 * zb_cols[j])
                .collect();
            col_add.resize(g.np(), 0);
            let mut nzb: Vec<i32> = zb_cols.iter().map(|z| -z).collect();
            nzb.resize(g.np(), 0);
            let e1 = QEpi {
                col_add: Some(&col_add),
                cross: Some((&nzb, &rowsum)),
                ..Default::default()
            };
            let mut y1 = alloc::vec![0i32; m * n];
            qgemm_rows_on(isa, &p, &e1, 0, m, QOut::I32(&mut y1), n);
            assert_eq!(y1, want_cols, "{isa:?} {m}x{k}x{n}, zero points per column");
            // a split into row ranges writes the same rows
            if m > 2 {
                let mut y2 = alloc::vec![0i32; m * n];
                qgemm_rows_on(isa, &p, &e1, 0, 2, QOut::I32(&mut y2[..2 * n]), n);
                qgemm_rows_on(isa, &p, &e1, 2, m, QOut::I32(&mut y2[2 * n..]), n);
                assert_eq!(y1, y2, "{isa:?} split");
            }
            // requantized: round half to even of sum * scale + bias, plus zero point, clamped
            let scale: Vec<f32> = (0..m).map(|i| 0.013 + i as f32 * 1e-3).collect();
            let e2 = QEpi {
                scale: Some(QVec::Row(&scale)),
                ..Default::default()
            };
            let mut yi = alloc::vec![0i32; m * n];
            qgemm_rows_on(isa, &p, &QEpi::default(), 0, m, QOut::I32(&mut yi), n);
            let mut yq = alloc::vec![0u8; m * n];
            qgemm_rows_on(
                isa,
                &p,
                &e2,
                0,
                m,
                QOut::Q8 {
                    y: &mut yq,
                    zp: -3.0,
                    lo: -128.0,
                    hi: 127.0,
                },
                n,
            );
            for (x, (&q, &s)) in yq.iter().zip(&yi).enumerate() {
                let f = s as f32 * scale[x / n];
                let r = (libm::rintf(f) - 3.0).clamp(-128.0, 127.0) as i32 as i8;
                assert_eq!(q as i8, r, "{isa:?} requantized {x}");
            }
        }
    }
}

#[test]
fn int16_pair_products_are_exact_on_every_isa() {
    // every int8 weight against i16 pairs at the ends of the range and in between
    let w: Vec<u8> = (0..32u32).map(|i| (i * 37 + 128) as u8).collect();
    let pairs = [
        (32767i16, -32768i16),
        (-32768, -32768),
        (1, -1),
        (-12345, 23456),
        (0, 7),
    ];
    for isa in available_isas() {
        if !q4_runs_on(isa) {
            continue;
        }
        let l = isa_lanes(isa);
        for &(x0, x1) in &pairs {
            let x2 = x0 as u16 as u32 | ((x1 as u16 as u32) << 16);
            let want: Vec<i32> = (0..l)
                .map(|j| {
                    5 - 3 * j as i32
                        + w[2 * j] as i8 as i32 * x0 as i32
                        + w[2 * j + 1] as i8 as i32 * x1 as i32
                })
                .collect();
            let acc: Vec<i32> = (0..l).map(|j| 5 - 3 * j as i32).collect();
            let got = q16_on(isa, &w, &acc, x2);
            assert_eq!(got, want, "{isa:?} pair ({x0}, {x1})");
        }
    }
}

/// `acc + q_dot16(q_wide(w), x2)` on `isa`'s vector type.
fn q16_on(isa: Isa, w: &[u8], acc: &[i32], x2: u32) -> Vec<i32> {
    fn one<V: VF32>(w: &[u8], acc: &[i32], x2: u32) -> Vec<i32> {
        let mut out = alloc::vec![0i32; V::LANES];
        V::q_store_i32(V::q_dot16(V::q_load_i32(acc), V::q_wide(w), x2), &mut out);
        out
    }
    let mut out = Vec::new();
    let o = &mut out;
    // under the same target features as the integer kernels
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
            unsafe fn wide(w: &[u8], acc: &[i32], x2: u32) -> Vec<i32> {
                one::<avx512::Avx512>(w, acc, x2)
            }
            // SAFETY: q4_runs_on checked AVX-512F, BW and VNNI.
            *o = unsafe { wide(w, acc, x2) };
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn wide(w: &[u8], acc: &[i32], x2: u32) -> Vec<i32> {
                one::<x86::Avx2>(w, acc, x2)
            }
            // SAFETY: the CPU reported AVX2 and FMA.
            *o = unsafe { wide(w, acc, x2) };
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => *o = one::<neon::Neon>(w, acc, x2),
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Isa::Simd128 => *o = one::<wasm::V128>(w, acc, x2),
        _ => *o = one::<Portable>(w, acc, x2),
    }
    out
}

#[test]
fn split_activation_products_match_f64_on_every_isa() {
    // weights int8 (code - zero point) in blocks of 16 to 512 (sub-blocks of 256), K not a
    // whole number of blocks, N not a whole number of groups, rows around the tile heights;
    // activations over six decades, a zero block and one huge value: the products must be
    // the f64 sums to within float rounding of sum |x w|
    for &(m, k, n, bits, bs) in &[
        (1usize, 40usize, 19usize, 8usize, 16usize),
        (3, 64, 33, 4, 32),
        (5, 100, 70, 8, 32),
        (9, 700, 17, 4, 512),
        (2, 33, 64, 8, 64),
    ] {
        let g = NBits {
            k,
            bs,
            bits,
            int8_a: false,
            zp0: if bits == 8 { 128.0 } else { 8.0 },
        };
        let (blocks, blob) = (g.blocks(), g.blob());
        // 8-bit codes within 100 of 128 (their zero points are 125..=131)
        let b: Vec<u8> = bytes_of(n * blocks * blob, 3 + k as u32)
            .into_iter()
            .map(|v| if bits == 8 { 28 + v % 201 } else { v })
            .collect();
        let scales: Vec<f32> = data(n * blocks, 9).iter().map(|s| 0.01 + s.abs()).collect();
        // zero points near the middle (8-bit codes 0..=255 less 100..=155 stay int8)
        let zp: Vec<f32> = (0..n * blocks)
            .map(|i| g.zp0 + (i % 7) as f32 - 3.0)
            .collect();
        let mut a = data(m * k, 11 + m as u32);
        for (i, x) in a.iter_mut().enumerate() {
            *x *= 10f32.powi((i % 7) as i32 - 3);
        }
        a[..k.min(16)].fill(0.0);
        a[m * k - 1] = 3.0e7;
        let code = |c: usize, kk: usize| -> f64 {
            let (bi, e) = (kk / bs, kk % bs);
            let byte = b[(c * blocks + bi) * blob + e * bits / 8];
            let v = if bits == 8 {
                byte
            } else {
                (byte >> (4 * (e % 2))) & 15
            };
            (v as f64 - zp[c * blocks + bi] as f64) * scales[c * blocks + bi] as f64
        };
        for isa in available_isas() {
            if !q4_runs_on(isa) {
                continue;
            }
            let p = w8_pack(isa_lanes(isa), &g, &b, &scales, Some(&zp), n).expect("int8 weights");
            let x = x16_rows_on(isa, &a, m, k, p.kp, p.sub);
            assert!(x.exact);
            let mut y = alloc::vec![f32::NAN; m * n];
            w8_rows_on(isa, &p, &x, (0, p.groups()), &mut y, n);
            for r in 0..m {
                for c in 0..n {
                    // float rounding of sum |x w|, plus the split's own bound: per sub-block,
                    // max |x| / 2^31 times sum |w| (below float rounding unless the block's
                    // largest value is over 2^7 times its typical one, as the 3e7 here)
                    let (mut want, mut mag, mut split) = (0f64, 0f64, 0f64);
                    for k0 in (0..k).step_by(p.sub) {
                        let k1 = (k0 + p.sub).min(k);
                        let amax = a[r * k + k0..r * k + k1]
                            .iter()
                            .fold(0f64, |m, x| m.max(x.abs() as f64));
                        for kk in k0..k1 {
                            let t = a[r * k + kk] as f64 * code(c, kk);
                            want += t;
                            mag += t.abs();
                            split += amax * code(c, kk).abs() / 2f64.powi(31);
                        }
                    }
                    let got = y[r * n + c] as f64;
                    assert!(
                        (got - want).abs() <= 4e-7 * mag + split + 1e-30,
                        "{isa:?} {m}x{k}x{n} {bits}-bit bs {bs}: y[{r}][{c}] {got} vs {want} (sum |xw| {mag})"
                    );
                }
            }
        }
    }
    // weights that are not int8 are declined
    let g = NBits {
        k: 16,
        bs: 16,
        bits: 8,
        int8_a: false,
        zp0: 128.0,
    };
    let scales = [1.0f32; 2];
    let mut b = [128u8; 32];
    b[17] = 0; // 0 - 128
    b[18] = 255; // 255 - 128
    assert!(w8_pack(16, &g, &b, &scales, None, 2).is_some());
    assert!(w8_pack(16, &g, &b, &scales, Some(&[127.0, 128.0]), 2).is_some());
    b[3] = 255; // 255 - 127
    assert!(w8_pack(16, &g, &b, &scales, Some(&[127.0, 128.0]), 2).is_none());
    assert!(w8_pack(16, &g, &b, &scales, Some(&[128.0, 127.5]), 2).is_none());
    // what the split does not take is reported, not computed
    let a = [1.0f32, f32::NAN, 2.0, 3.0];
    assert!(!x16_rows(&a, 1, 4, 16, 16).exact);
    let a = [1.0f32, f32::INFINITY, 2.0, 3.0];
    assert!(!x16_rows(&a, 1, 4, 16, 16).exact);
    let a = [1e-35f32, 0.0, 0.0, 0.0];
    assert!(!x16_rows(&a, 1, 4, 16, 16).exact);
}
