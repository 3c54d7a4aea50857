//! The WebGPU convolution family against the CPU: Conv (direct and implicit-GEMM paths),
//! ConvTranspose, MaxPool / AveragePool and the global pools. Sizes are odd on purpose (1,
//! primes, non-multiples of the workgroup and of the 64x64 GEMM tile); every attribute the
//! kernels claim has a case; configurations they decline are checked to fall back to the CPU
//! with the right answer. Without an adapter every test prints why and returns.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use nxrt_core::proto::AttributeProto;
use nxrt_core::{loader, Session, SessionOptions};

/// Conv of X `xs` with W `ws` (and a bias of W's first extent when `bias`).
fn conv_case(
    op: &'static str,
    xs: &[usize],
    ws: &[usize],
    bias: Option<usize>,
    attrs: &[AttributeProto],
    seed: u32,
) -> Case {
    let mut feeds = vec![ft(xs, seed), ft(ws, seed + 1)];
    if let Some(m) = bias {
        feeds.push(ft(&[m], seed + 2));
    }
    let mut c = Case::new(op, feeds).atol(1e-4);
    for a in attrs {
        c = c.attr(a.clone());
    }
    c
}

/// Output channels per group that take the direct kernel (< 16) and the GEMM kernel (>= 16).
const MG: [usize; 2] = [3, 17];

#[test]
fn conv_2d_attributes_on_both_paths() {
    for mg in MG {
        for (k, bias) in [false, true].into_iter().enumerate() {
            let seed = 10 * mg as u32 + k as u32;
            let b = bias.then_some(mg);
            // plain 3x3
            conv_case("Conv", &[1, 3, 7, 9], &[mg, 3, 3, 3], b, &[], seed).check();
            // asymmetric pads, strides, dilations, a batch
            conv_case(
                "Conv",
                &[2, 5, 13, 11],
                &[mg, 5, 3, 2],
                b,
                &[
                    ais("pads", &[1, 2, 0, 1]),
                    ais("strides", &[2, 1]),
                    ais("dilations", &[1, 2]),
                    ais("kernel_shape", &[3, 2]),
                ],
                seed + 1,
            )
            .check();
            // auto_pad, with strides and a dilation
            for ap in ["SAME_UPPER", "SAME_LOWER", "VALID"] {
                conv_case(
                    "Conv",
                    &[1, 2, 10, 7],
                    &[mg, 2, 4, 3],
                    b,
                    &[
                        astr("auto_pad", ap),
                        ais("strides", &[3, 2]),
                        ais("dilations", &[1, 2]),
                    ],
                    seed + 2,
                )
                .check();
            }
            // 1x1 (pointwise) and a kernel as large as the padded input
            conv_case("Conv", &[2, 7, 5, 3], &[mg, 7, 1, 1], b, &[], seed + 3).check();
            conv_case(
                "Conv",
                &[1, 2, 3, 3],
                &[mg, 2, 5, 5],
                b,
                &[ais("pads", &[1, 1, 1, 1])],
                seed + 4,
            )
            .check();
            // a 1x1 input and output
            conv_case("Conv", &[1, 1, 1, 1], &[mg, 1, 1, 1], b, &[], seed + 5).check();
        }
    }
}

#[test]
fn conv_groups_and_depthwise() {
    for mg in MG {
        for bias in [false, true] {
            let m = 2 * mg;
            let b = bias.then_some(m);
            conv_case(
                "Conv",
                &[2, 6, 9, 8],
                &[m, 3, 3, 3],
                b,
                &[ai("group", 2), ais("pads", &[1, 0, 2, 1])],
                mg as u32,
            )
            .check();
            // three groups with strides and dilations
            conv_case(
                "Conv",
                &[1, 9, 11, 13],
                &[3 * mg, 3, 2, 3],
                bias.then_some(3 * mg),
                &[
                    ai("group", 3),
                    ais("strides", &[2, 3]),
                    ais("dilations", &[2, 1]),
                    astr("auto_pad", "SAME_UPPER"),
                ],
                mg as u32 + 1,
            )
            .check();
        }
    }
    // depthwise (one filter per channel) and with a channel multiplier of 2 and of 17
    for (mult, bias) in [(1, false), (1, true), (2, true), (17, false)] {
        let c = 5;
        conv_case(
            "Conv",
            &[2, c, 12, 7],
            &[c * mult, 1, 3, 3],
            bias.then_some(c * mult),
            &[
                ai("group", c as i64),
                ais("pads", &[1, 1, 1, 1]),
                ais("strides", &[2, 1]),
            ],
            mult as u32,
        )
        .check();
    }
}

#[test]
fn conv_1d_and_3d() {
    for mg in MG {
        for bias in [false, true] {
            let b = bias.then_some(mg);
            conv_case(
                "Conv",
                &[2, 3, 29],
                &[mg, 3, 4],
                b,
                &[
                    ais("pads", &[2, 1]),
                    ais("strides", &[3]),
                    ais("dilations", &[2]),
                ],
                1,
            )
            .check();
            conv_case(
                "Conv",
                &[1, 4, 17],
                &[mg, 4, 5],
                b,
                &[astr("auto_pad", "SAME_LOWER"), ais("strides", &[2])],
                2,
            )
            .check();
            conv_case(
                "Conv",
                &[1, 2, 5, 6, 7],
                &[mg, 2, 2, 3, 2],
                b,
                &[
                    ais("pads", &[1, 0, 1, 0, 2, 1]),
                    ais("strides", &[1, 2, 2]),
                    ais("dilations", &[2, 1, 1]),
                ],
                3,
            )
            .check();
        }
    }
    // 3-D depthwise with auto_pad
    conv_case(
        "Conv",
        &[1, 3, 4, 5, 6],
        &[3, 1, 3, 3, 3],
        Some(3),
        &[ai("group", 3), astr("auto_pad", "SAME_UPPER")],
        4,
    )
    .check();
}

#[test]
fn conv_gemm_spans_many_tiles_and_k_steps() {
    // K = 19*3*3 = 171 (11 K steps), N*P = 2*13*13 = 338 columns (6 tiles), M = 70 (2 row tiles)
    conv_case(
        "Conv",
        &[2, 19, 13, 13],
        &[70, 19, 3, 3],
        Some(70),
        &[ais("pads", &[1, 1, 1, 1])],
        7,
    )
    .check();
    // Conv at opset 1 and 11 (the same semantics)
    for opset in [1, 11] {
        conv_case("Conv", &[1, 3, 6, 5], &[16, 3, 2, 2], Some(16), &[], 8)
            .opset(opset)
            .check();
    }
}

#[test]
fn conv_transpose_attributes() {
    for bias in [false, true] {
        let b = |m: usize| bias.then_some(m);
        // plain
        conv_case("ConvTranspose", &[1, 3, 5, 4], &[3, 2, 3, 3], b(2), &[], 1).check();
        // strides, pads, output_padding, dilations
        conv_case(
            "ConvTranspose",
            &[2, 3, 5, 7],
            &[3, 4, 3, 2],
            b(4),
            &[
                ais("strides", &[2, 3]),
                ais("pads", &[1, 0, 2, 1]),
                ais("output_padding", &[1, 2]),
                ais("dilations", &[2, 1]),
            ],
            2,
        )
        .check();
        // groups (2 groups of 3 input channels, 5 outputs each)
        conv_case(
            "ConvTranspose",
            &[1, 6, 4, 5],
            &[6, 5, 3, 3],
            b(10),
            &[
                ai("group", 2),
                ais("strides", &[2, 2]),
                ais("pads", &[1, 1, 0, 0]),
            ],
            3,
        )
        .check();
        // depthwise
        conv_case(
            "ConvTranspose",
            &[1, 4, 6, 3],
            &[4, 1, 2, 3],
            b(4),
            &[ai("group", 4), ais("strides", &[3, 1])],
            4,
        )
        .check();
        // output_shape: exact, and up to stride-1 beyond the natural extent
        for os in [&[9i64, 11][..], &[10, 12], &[1, 2, 10, 12]] {
            conv_case(
                "ConvTranspose",
                &[1, 2, 4, 5],
                &[2, 3, 3, 3],
                b(3),
                &[ais("strides", &[2, 2]), ais("output_shape", os)],
                5,
            )
            .check();
        }
        // auto_pad SAME_UPPER / SAME_LOWER
        for ap in ["SAME_UPPER", "SAME_LOWER"] {
            conv_case(
                "ConvTranspose",
                &[1, 2, 5, 4],
                &[2, 3, 4, 3],
                b(3),
                &[astr("auto_pad", ap), ais("strides", &[2, 3])],
                6,
            )
            .check();
        }
        // 1-D and 3-D
        conv_case(
            "ConvTranspose",
            &[2, 3, 11],
            &[3, 2, 4],
            b(2),
            &[
                ais("strides", &[3]),
                ais("pads", &[1, 2]),
                ais("dilations", &[2]),
            ],
            7,
        )
        .check();
        conv_case(
            "ConvTranspose",
            &[1, 2, 3, 4, 3],
            &[2, 2, 2, 3, 2],
            b(2),
            &[
                ais("strides", &[2, 1, 2]),
                ais("output_padding", &[1, 0, 1]),
            ],
            8,
        )
        .check();
    }
}

fn pool_case(op: &'static str, xs: &[usize], attrs: &[AttributeProto], seed: u32) -> Case {
    let mut c = Case::new(op, vec![ft(xs, seed)]);
    for a in attrs {
        c = c.attr(a.clone());
    }
    c
}

#[test]
fn max_and_average_pool_attributes() {
    for op in ["MaxPool", "AveragePool"] {
        pool_case(op, &[1, 3, 7, 9], &[ais("kernel_shape", &[3, 3])], 1).check();
        pool_case(
            op,
            &[2, 3, 11, 13],
            &[
                ais("kernel_shape", &[3, 2]),
                ais("strides", &[2, 3]),
                ais("pads", &[1, 0, 2, 1]),
            ],
            2,
        )
        .check();
        for ceil in [0, 1] {
            pool_case(
                op,
                &[1, 2, 10, 9],
                &[
                    ais("kernel_shape", &[3, 3]),
                    ais("strides", &[2, 2]),
                    ais("pads", &[1, 1, 1, 1]),
                    ai("ceil_mode", ceil),
                ],
                3,
            )
            .check();
            // dilations (AveragePool has them from opset 19)
            pool_case(
                op,
                &[1, 2, 12, 11],
                &[
                    ais("kernel_shape", &[2, 3]),
                    ais("strides", &[3, 2]),
                    ais("dilations", &[2, 2]),
                    ai("ceil_mode", ceil),
                ],
                4,
            )
            .opset(19)
            .check();
        }
        for ap in ["SAME_UPPER", "SAME_LOWER", "VALID"] {
            pool_case(
                op,
                &[1, 3, 8, 7],
                &[
                    ais("kernel_shape", &[3, 2]),
                    ais("strides", &[2, 2]),
                    astr("auto_pad", ap),
                ],
                5,
            )
            .check();
        }
        // 1-D and 3-D
        pool_case(
            op,
            &[2, 3, 31],
            &[
                ais("kernel_shape", &[4]),
                ais("strides", &[3]),
                ais("pads", &[2, 1]),
                ai("ceil_mode", 1),
            ],
            6,
        )
        .check();
        pool_case(
            op,
            &[1, 2, 5, 6, 7],
            &[
                ais("kernel_shape", &[2, 3, 2]),
                ais("strides", &[1, 2, 2]),
                ais("pads", &[1, 0, 1, 0, 1, 1]),
            ],
            7,
        )
        .check();
        // a window as large as the input, and a 1x1 plane
        pool_case(op, &[3, 2, 5, 4], &[ais("kernel_shape", &[5, 4])], 8).check();
        pool_case(op, &[1, 1, 1, 1], &[ais("kernel_shape", &[1, 1])], 9).check();
    }
    // count_include_pad, with ceil_mode windows that run past the end padding
    for include in [0, 1] {
        for ceil in [0, 1] {
            pool_case(
                "AveragePool",
                &[2, 3, 9, 10],
                &[
                    ais("kernel_shape", &[3, 4]),
                    ais("strides", &[2, 3]),
                    ais("pads", &[1, 2, 0, 1]),
                    ai("count_include_pad", include),
                    ai("ceil_mode", ceil),
                ],
                10,
            )
            .check();
        }
        pool_case(
            "AveragePool",
            &[1, 2, 7, 8],
            &[
                ais("kernel_shape", &[3, 3]),
                ais("strides", &[2, 2]),
                astr("auto_pad", "SAME_LOWER"),
                ai("count_include_pad", include),
            ],
            11,
        )
        .check();
    }
}

#[test]
fn global_pools() {
    for op in ["GlobalAveragePool", "GlobalMaxPool"] {
        for (k, xs) in [
            &[2, 3, 7, 9][..],
            &[1, 1, 1, 1],
            &[2, 5, 300],
            &[3, 4],
            &[1, 2, 3, 4, 5],
            &[1, 1, 1031, 3],
            &[67, 3, 2, 2],
        ]
        .into_iter()
        .enumerate()
        {
            Case::new(op, vec![ft(xs, k as u32)]).atol(1e-5).check();
        }
    }
}

/// Runs `case` on [webgpu, cpu], asserts its node ran on the CPU, and compares with the CPU
/// alone.
#[track_caller]
fn falls_back(case: Case) {
    let Some(g) = gpu() else { return };
    let m = loader::load_model(&case.model(), &loader::NoExternalData).unwrap();
    let s = Session::new(m, vec![g.clone(), cpu()], &SessionOptions::default()).unwrap();
    let placed = &s.partition().assignments;
    assert_eq!(
        placed[0].2, "cpu",
        "{} should fall back: {placed:?}",
        case.op
    );
    assert!(
        s.partition().fallbacks.iter().any(|f| f.op == case.op),
        "{:?}",
        s.partition().fallbacks
    );
    drop(s);
    let (_, got) = case.run_all(vec![g, cpu()]);
    let (_, want) = case.run_all(vec![cpu()]);
    for (k, ((g, gs), (w, ws))) in got.iter().zip(&want).enumerate() {
        assert_eq!(gs, ws);
        close(&format!("{} output {k}", case.op), g, w, 1e-4, 1e-4);
    }
}

#[test]
fn unsupported_configurations_fall_back_to_the_cpu() {
    // four spatial dimensions
    falls_back(conv_case(
        "Conv",
        &[1, 2, 3, 4, 3, 4],
        &[2, 2, 2, 2, 2, 2],
        None,
        &[ais("kernel_shape", &[2, 2, 2, 2])],
        1,
    ));
    // MaxPool's Indices output
    falls_back(pool_case("MaxPool", &[1, 2, 5, 6], &[ais("kernel_shape", &[2, 2])], 3).outputs(2));
}

#[test]
fn ops_are_listed() {
    let names = nxrt_wasm::webgpu::op_names();
    for op in [
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
    ] {
        assert!(names.contains(&op), "{op} missing from {names:?}");
    }
}
