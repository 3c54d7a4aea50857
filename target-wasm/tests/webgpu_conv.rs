//! The WebGPU convolution family against the CPU: Conv (direct and implicit-GEMM paths),
//! ConvTranspose, MaxPool / AveragePool, the global pools, Resize and Pad. Sizes are odd on
//! purpose (1, primes, non-multiples of the workgroup and of the 64x64 GEMM tile); every
//! attribute the kernels claim has a case; configurations they decline are checked to fall
//! back to the CPU with the right answer. Without an adapter every test prints why and returns.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use nxrt_core::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto,
};
use nxrt_core::{loader, DataType, Session, SessionOptions, Tensor, Value};
use prost::Message;

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
    // float16 on both paths, with bias and groups
    for mg in MG {
        conv_case(
            "Conv",
            &[2, 6, 9, 8],
            &[2 * mg, 3, 3, 3],
            Some(2 * mg),
            &[ai("group", 2), ais("pads", &[1, 0, 2, 1])],
            mg as u32,
        )
        .check_half();
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
    // float16: bias and groups with strides, pads and output_padding; depthwise; 1-D, 3-D
    conv_case(
        "ConvTranspose",
        &[2, 6, 5, 7],
        &[6, 5, 3, 2],
        Some(10),
        &[
            ai("group", 2),
            ais("strides", &[2, 3]),
            ais("pads", &[1, 0, 2, 1]),
            ais("output_padding", &[1, 2]),
            ais("dilations", &[2, 1]),
        ],
        11,
    )
    .check_half();
    conv_case(
        "ConvTranspose",
        &[1, 4, 6, 3],
        &[4, 1, 2, 3],
        None,
        &[ai("group", 4), ais("strides", &[3, 1])],
        12,
    )
    .check_half();
    conv_case(
        "ConvTranspose",
        &[2, 3, 11],
        &[3, 2, 4],
        Some(2),
        &[
            ais("strides", &[3]),
            ais("pads", &[1, 2]),
            ais("dilations", &[2]),
        ],
        13,
    )
    .check_half();
    conv_case(
        "ConvTranspose",
        &[1, 2, 3, 4, 3],
        &[2, 2, 2, 3, 2],
        Some(2),
        &[
            ais("strides", &[2, 1, 2]),
            ais("output_padding", &[1, 0, 1]),
        ],
        14,
    )
    .check_half();
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
            .check_half();
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
    // float16: odd sizes, pads, strides, ceil_mode, dilations, auto_pad, 1-D and 3-D
    for op in ["MaxPool", "AveragePool"] {
        pool_case(op, &[1, 3, 7, 9], &[ais("kernel_shape", &[3, 3])], 21).check_half();
        for ceil in [0, 1] {
            pool_case(
                op,
                &[2, 3, 11, 13],
                &[
                    ais("kernel_shape", &[3, 2]),
                    ais("strides", &[2, 3]),
                    ais("pads", &[1, 0, 2, 1]),
                    ai("ceil_mode", ceil),
                ],
                22,
            )
            .check_half();
        }
        pool_case(
            op,
            &[1, 2, 12, 11],
            &[
                ais("kernel_shape", &[2, 3]),
                ais("strides", &[3, 2]),
                ais("dilations", &[2, 2]),
                ai("ceil_mode", 1),
            ],
            23,
        )
        .opset(19)
        .check_half();
        pool_case(
            op,
            &[1, 3, 8, 7],
            &[
                ais("kernel_shape", &[3, 2]),
                ais("strides", &[2, 2]),
                astr("auto_pad", "SAME_LOWER"),
            ],
            24,
        )
        .check_half();
        pool_case(
            op,
            &[2, 3, 31],
            &[
                ais("kernel_shape", &[4]),
                ais("strides", &[3]),
                ais("pads", &[2, 1]),
                ai("ceil_mode", 1),
            ],
            25,
        )
        .check_half();
        pool_case(
            op,
            &[1, 2, 5, 6, 7],
            &[
                ais("kernel_shape", &[2, 3, 2]),
                ais("strides", &[1, 2, 2]),
                ais("pads", &[1, 0, 1, 0, 1, 1]),
            ],
            26,
        )
        .check_half();
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
            Case::new(op, vec![ft(xs, k as u32)]).check_half();
        }
    }
}

fn resize_case(
    xs: &[usize],
    scales: Option<&[f32]>,
    sizes: Option<&[i64]>,
    attrs: &[AttributeProto],
    opset: i64,
) -> Case {
    let scales = scales.map(|s| Tensor::from_vec(&[s.len()], s.to_vec()).unwrap());
    let sizes = sizes.map(|s| it(&[s.len()], s.to_vec()));
    let mut c = Case::new("Resize", vec![ft(xs, xs.iter().sum::<usize>() as u32)])
        .consts(vec![None, scales, sizes])
        .opset(opset);
    for a in attrs {
        c = c.attr(a.clone());
    }
    c
}

#[test]
fn resize_nearest_every_rounding_and_coordinate_mode() {
    let coords = [
        "half_pixel",
        "asymmetric",
        "align_corners",
        "pytorch_half_pixel",
        "half_pixel_symmetric",
        "tf_half_pixel_for_nn",
    ];
    let rounds = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"];
    for coord in coords {
        for round in rounds {
            let attrs = [
                astr("mode", "nearest"),
                astr("coordinate_transformation_mode", coord),
                astr("nearest_mode", round),
            ];
            // enlarge by odd factors, shrink, and by sizes
            resize_case(&[1, 2, 5, 7], Some(&[1.0, 1.0, 2.6, 1.7]), None, &attrs, 19).check();
            resize_case(
                &[2, 3, 11, 9],
                Some(&[1.0, 1.0, 0.5, 0.7]),
                None,
                &attrs,
                19,
            )
            .check();
            resize_case(&[1, 1, 4, 6], None, Some(&[1, 1, 9, 5]), &attrs, 19).check();
            // every axis resized, rank 3
            resize_case(&[3, 4, 5], Some(&[2.0, 0.75, 1.5]), None, &attrs, 19).check();
        }
        // float16 (scales stay float32)
        let attrs = [
            astr("mode", "nearest"),
            astr("coordinate_transformation_mode", coord),
        ];
        resize_case(&[1, 2, 5, 7], Some(&[1.0, 1.0, 2.6, 1.7]), None, &attrs, 19)
            .keep_f32(&[1, 2])
            .check_half();
        resize_case(&[1, 1, 4, 6], None, Some(&[1, 1, 9, 5]), &attrs, 19).check_half();
    }
}

#[test]
fn resize_linear_and_cubic() {
    let coords = [
        "half_pixel",
        "asymmetric",
        "align_corners",
        "pytorch_half_pixel",
        "half_pixel_symmetric",
    ];
    for mode in ["linear", "cubic"] {
        for coord in coords {
            let attrs = [
                astr("mode", mode),
                astr("coordinate_transformation_mode", coord),
            ];
            resize_case(&[1, 2, 5, 7], Some(&[1.0, 1.0, 2.6, 1.7]), None, &attrs, 19).check();
            resize_case(
                &[2, 3, 11, 9],
                Some(&[1.0, 1.0, 0.5, 0.7]),
                None,
                &attrs,
                19,
            )
            .check();
            resize_case(&[1, 1, 4, 6], None, Some(&[1, 1, 9, 1]), &attrs, 19).check();
            // a 1x1 plane enlarged (pytorch_half_pixel's special case at output size 1)
            resize_case(&[1, 2, 1, 1], None, Some(&[1, 2, 3, 1]), &attrs, 19).check();
            // float16 (scales stay float32)
            resize_case(&[1, 2, 5, 7], Some(&[1.0, 1.0, 2.6, 1.7]), None, &attrs, 19)
                .keep_f32(&[1, 2])
                .check_half();
            resize_case(
                &[2, 3, 11, 9],
                Some(&[1.0, 1.0, 0.5, 0.7]),
                None,
                &attrs,
                19,
            )
            .keep_f32(&[1, 2])
            .check_half();
        }
    }
    // linear over three axes and over a leading axis with a scale of 1 elsewhere
    let lin = [astr("mode", "linear")];
    resize_case(&[2, 5, 6, 7], Some(&[1.0, 1.6, 0.5, 2.0]), None, &lin, 19).check();
    resize_case(&[3, 4, 5], Some(&[2.0, 1.0, 1.0]), None, &lin, 19).check();
    // cubic options, antialiasing, opset 11 and 13
    for exclude in [0, 1] {
        resize_case(
            &[1, 2, 6, 5],
            Some(&[1.0, 1.0, 1.7, 2.2]),
            None,
            &[
                astr("mode", "cubic"),
                af("cubic_coeff_a", -0.5),
                ai("exclude_outside", exclude),
            ],
            19,
        )
        .check();
    }
    for mode in ["linear", "cubic"] {
        resize_case(
            &[1, 2, 17, 13],
            Some(&[1.0, 1.0, 0.3, 0.45]),
            None,
            &[astr("mode", mode), ai("antialias", 1)],
            19,
        )
        .check();
        resize_case(
            &[1, 2, 17, 13],
            Some(&[1.0, 1.0, 0.3, 0.45]),
            None,
            &[astr("mode", mode), ai("antialias", 1)],
            19,
        )
        .keep_f32(&[1, 2])
        .check_half();
    }
    for opset in [11, 13] {
        resize_case(
            &[1, 2, 5, 4],
            Some(&[1.0, 1.0, 1.5, 2.5]),
            None,
            &[astr("mode", "linear")],
            opset,
        )
        .consts(vec![
            Some(Tensor::from_vec(&[0], Vec::<f32>::new()).unwrap()),
            Some(Tensor::from_vec(&[4], vec![1.0f32, 1.0, 1.5, 2.5]).unwrap()),
        ])
        .check();
    }
}

#[test]
fn resize_axes_policies_and_crop() {
    // opset 18: axes, keep_aspect_ratio_policy
    for policy in ["stretch", "not_larger", "not_smaller"] {
        resize_case(
            &[1, 3, 7, 5],
            None,
            Some(&[11, 4]),
            &[
                astr("mode", "linear"),
                ais("axes", &[2, -1]),
                astr("keep_aspect_ratio_policy", policy),
            ],
            18,
        )
        .check();
    }
    resize_case(
        &[2, 3, 4, 5],
        Some(&[2.5]),
        None,
        &[astr("mode", "nearest"), ais("axes", &[3])],
        18,
    )
    .check();
    // tf_crop_and_resize with an extrapolation value
    for mode in ["nearest", "linear"] {
        let roi = Tensor::from_vec(&[8], vec![0.0f32, 0.0, -0.2, 0.1, 1.0, 1.0, 0.8, 1.3]).unwrap();
        Case::new("Resize", vec![ft(&[1, 2, 6, 7], 3)])
            .consts(vec![Some(roi), None, Some(it(&[4], vec![1, 2, 5, 9]))])
            .attr(astr("mode", mode))
            .attr(astr("coordinate_transformation_mode", "tf_crop_and_resize"))
            .attr(af("extrapolation_value", 7.5))
            .check();
        // float16, roi float32; an extrapolation value f16 rounds (7.3 -> 7.3008)
        let roi = Tensor::from_vec(&[8], vec![0.0f32, 0.0, -0.2, 0.1, 1.0, 1.0, 0.8, 1.3]).unwrap();
        Case::new("Resize", vec![ft(&[1, 2, 6, 7], 3)])
            .consts(vec![Some(roi), None, Some(it(&[4], vec![1, 2, 5, 9]))])
            .attr(astr("mode", mode))
            .attr(astr("coordinate_transformation_mode", "tf_crop_and_resize"))
            .attr(af("extrapolation_value", 7.3))
            .keep_f32(&[1])
            .check_half();
    }
}

fn pad_case(
    xs: &[usize],
    pads: &[i64],
    mode: &str,
    value: Option<f32>,
    axes: Option<&[i64]>,
) -> Case {
    let value = value.map(|v| Tensor::from_vec(&[], vec![v]).unwrap());
    let axes = axes.map(|a| it(&[a.len()], a.to_vec()));
    Case::new("Pad", vec![ft(xs, pads.len() as u32)])
        .consts(vec![Some(it(&[pads.len()], pads.to_vec())), value, axes])
        .attr(astr("mode", mode))
}

#[test]
fn pad_every_mode() {
    for mode in ["constant", "reflect", "edge", "wrap"] {
        pad_case(&[3, 5], &[1, 2, 2, 3], mode, None, None).check();
        pad_case(
            &[2, 3, 4, 5],
            &[0, 1, 2, 3, 1, 0, 3, 2],
            mode,
            Some(1.5),
            None,
        )
        .check();
        // negative pads crop
        pad_case(&[1, 2, 7, 6], &[0, 0, -2, 3, 0, 0, 1, -3], mode, None, None).check();
        // wider than the axis (wrap and reflect fold more than once)
        pad_case(&[4, 3], &[0, 7, 0, 5], mode, Some(-2.0), None).check();
        // axes input, and a rank-1 and rank-5 input
        pad_case(
            &[2, 3, 4, 5],
            &[1, 2, 3, 1],
            mode,
            Some(0.25),
            Some(&[-1, 1]),
        )
        .check();
        pad_case(&[1031], &[3, 257], mode, None, None).check();
        pad_case(
            &[2, 1, 3, 2, 3],
            &[1, 0, 2, 1, 1, 0, 1, 0, 1, 2],
            mode,
            None,
            None,
        )
        .check();
        // float16: the constant value is float16 too
        pad_case(
            &[2, 3, 4, 5],
            &[0, 1, 2, 3, 1, 0, 3, 2],
            mode,
            Some(1.3),
            None,
        )
        .check_half();
        pad_case(&[1, 2, 7, 6], &[0, 0, -2, 3, 0, 0, 1, -3], mode, None, None).check_half();
        pad_case(&[4, 3], &[0, 7, 0, 5], mode, Some(-2.7), None).check_half();
        pad_case(&[1031], &[3, 257], mode, None, None).check_half();
    }
    // a one-element axis under reflect
    pad_case(&[2, 1], &[0, 2, 0, 3], "reflect", None, None).check();
    // opset 2 (pads and value attributes)
    for mode in ["constant", "edge", "reflect"] {
        Case::new("Pad", vec![ft(&[3, 4], 1)])
            .attr(astr("mode", mode))
            .attr(ais("pads", &[1, 2, 0, 1]))
            .attr(af("value", 3.0))
            .opset(2)
            .check();
    }
    // opset 2: an f32 value attribute on a float16 tensor (rounded to f16)
    Case::new("Pad", vec![ft(&[3, 4], 1)])
        .attr(astr("mode", "constant"))
        .attr(ais("pads", &[1, 2, 0, 1]))
        .attr(af("value", 3.3))
        .opset(2)
        .check_half();
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
    // Resize-10 (its legacy rounding)
    falls_back(
        Case::new("Resize", vec![ft(&[1, 1, 3, 4], 4)])
            .consts(vec![Some(
                Tensor::from_vec(&[4], vec![1.0f32, 1.0, 2.5, 1.5]).unwrap(),
            )])
            .opset(10),
    );
}

/// Runs `case` as float32 and then as float16 on each f16 store's provider (the same
/// provider, so a pipeline cached for one storage type and reused for the other shows), and
/// asserts both ran on WebGPU, agree with the CPU, and the float16 output is float16 (f32 words
/// holding f16-rounded values would pass `check_half`'s comparison; the element type would not).
#[track_caller]
fn keeps_f16(case: Case) {
    let run = |c: &Case, g| {
        let m = loader::load_model(&c.model(), &loader::NoExternalData).unwrap();
        let s = Session::new(m, vec![g, cpu()], &SessionOptions::default()).unwrap();
        assert_eq!(s.partition().assignments[0].2, "webgpu", "{}", c.op);
        let feeds = c
            .feeds
            .iter()
            .enumerate()
            .map(|(k, t)| (format!("x{k}"), Value::Tensor(t.clone())))
            .collect();
        let out = pollster::block_on(s.run_async(feeds)).unwrap();
        let Value::Tensor(y) = &out[0].1 else {
            panic!("a tensor")
        };
        (y.dtype(), y.to_f32_vec().unwrap())
    };
    let h = case.halved();
    let (_, want32, _) = case.run_on(vec![cpu()]);
    let (_, want16, _) = h.run_on(vec![cpu()]);
    for f16_storage in [false, true] {
        let Some(g) = half_gpu(f16_storage) else {
            continue;
        };
        let what = format!("{} (storage f16: {f16_storage})", h.op);
        let (dt, got) = run(&case, g.clone());
        assert_eq!(dt, DataType::Float, "f32 {what} output type");
        close(&format!("f32 {what}"), &got, &want32, 1e-4, case.atol);
        let (dt, got) = run(&h, g);
        assert_eq!(dt, DataType::Float16, "f16 {what} output type");
        close(
            &format!("f16 {what}"),
            &got,
            &want16,
            2e-3,
            case.atol.max(2e-3),
        );
    }
}

#[test]
fn float16_nodes_produce_float16() {
    keeps_f16(conv_case(
        "ConvTranspose",
        &[1, 6, 4, 5],
        &[6, 5, 3, 3],
        Some(10),
        &[ai("group", 2), ais("strides", &[2, 2])],
        1,
    ));
    for op in ["MaxPool", "AveragePool"] {
        keeps_f16(pool_case(
            op,
            &[1, 3, 7, 9],
            &[ais("kernel_shape", &[3, 3])],
            2,
        ));
    }
    for op in ["GlobalAveragePool", "GlobalMaxPool"] {
        keeps_f16(Case::new(op, vec![ft(&[2, 3, 7, 9], 3)]));
    }
    keeps_f16(
        resize_case(
            &[1, 2, 5, 7],
            Some(&[1.0, 1.0, 2.6, 1.7]),
            None,
            &[astr("mode", "linear")],
            19,
        )
        .keep_f32(&[1, 2]),
    );
    keeps_f16(pad_case(&[3, 5], &[1, 2, 2, 3], "reflect", None, None));
}

#[test]
fn a_vision_chain_stays_on_the_device() {
    let Some(g) = gpu() else { return };
    vision_chain(g, false);
}

/// The same chain in float16 on both f16 stores: every kernel takes the one before's float16
/// output (Resize's scales stay float32).
#[test]
fn a_float16_vision_chain_stays_on_the_device() {
    for f16_storage in [false, true] {
        if let Some(g) = half_gpu(f16_storage) {
            vision_chain(g, true);
        }
    }
}

fn vision_chain(g: std::sync::Arc<nxrt_wasm::webgpu::WebGpuProvider>, half: bool) {
    let (dt, ty) = if half {
        (DataType::Float16, to_half as fn(&Tensor) -> Tensor)
    } else {
        (DataType::Float, Tensor::clone as fn(&Tensor) -> Tensor)
    };
    // x -> Conv(w, b) -> Relu -> MaxPool -> Resize(scales) -> Pad -> GlobalAveragePool -> y
    let node = |op: &str, ins: &[&str], out: &str, attribute: Vec<AttributeProto>| NodeProto {
        op_type: op.into(),
        name: out.into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        attribute,
        ..Default::default()
    };
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "vision".into(),
            node: vec![
                node(
                    "Conv",
                    &["x", "w", "b"],
                    "c",
                    vec![ais("pads", &[1, 1, 1, 1]), ais("strides", &[2, 2])],
                ),
                node("Relu", &["c"], "r", vec![]),
                node("MaxPool", &["r"], "m", vec![ais("kernel_shape", &[2, 2])]),
                node(
                    "Resize",
                    &["m", "", "scales"],
                    "z",
                    vec![astr("mode", "linear")],
                ),
                node("Pad", &["z", "pads"], "p", vec![astr("mode", "reflect")]),
                node("GlobalAveragePool", &["p"], "y", vec![]),
            ],
            initializer: vec![
                init("w", &ty(&ft(&[20, 3, 3, 3], 1))),
                init("b", &ty(&ft(&[20], 2))),
                init(
                    "scales",
                    &Tensor::from_vec(&[4], vec![1.0f32, 1.0, 1.5, 2.0]).unwrap(),
                ),
                init("pads", &it(&[8], vec![0, 0, 1, 2, 0, 0, 2, 1])),
            ],
            input: vec![vi("x", dt, &[2, 3, 17, 15])],
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let run = |providers| {
        let s = Session::new(
            loader::load_model(&m, &loader::NoExternalData).unwrap(),
            providers,
            &SessionOptions::default(),
        )
        .unwrap();
        let feeds = vec![("x".to_string(), Value::Tensor(ty(&ft(&[2, 3, 17, 15], 3))))];
        let out = pollster::block_on(s.run_async(feeds)).unwrap();
        let Value::Tensor(y) = &out[0].1 else {
            panic!("a tensor")
        };
        assert_eq!(y.dtype(), dt);
        (
            s.partition().assignments.clone(),
            y.to_f32_vec().unwrap(),
            y.shape().to_vec(),
        )
    };
    let (r, got, gs) = run(vec![g, cpu()]);
    assert!(r.iter().all(|(_, _, p)| p == "webgpu"), "{r:?}");
    let (_, want, ws) = run(vec![cpu()]);
    assert_eq!(gs, ws);
    assert_eq!(gs, vec![2, 20, 1, 1]);
    let tol = if half { 2e-3 } else { 1e-4 };
    close(&format!("the {dt} chain"), &got, &want, tol, tol);
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
        "Resize",
        "Pad",
    ] {
        assert!(names.contains(&op), "{op} missing from {names:?}");
    }
}
