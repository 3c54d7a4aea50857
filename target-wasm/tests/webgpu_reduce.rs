//! The WebGPU reductions, softmax, normalisations, Split / Expand / Cast and Attention against
//! the CPU kernels. Sizes are odd on purpose (1, primes, rows longer than one 256-wide
//! workgroup) and chosen so that both layouts of the line kernels run: a workgroup per line
//! (long lines, or few of them) and an invocation per line (many short lines). Configurations
//! the kernels decline are checked to land on the CPU, with the CPU's answer.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use nxrt_core::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};
use nxrt_core::{loader, DataType, Session, SessionOptions, Tensor, Value};
use prost::Message;

const REDUCE: [&str; 10] = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
];

/// Inputs that keep each reduction well-conditioned: products of values near 1, logs of
/// positive sums.
fn data_for(op: &str, shape: &[usize], seed: u32) -> Tensor {
    let n = shape.iter().product();
    let v = vals(n, seed);
    let v: Vec<f32> = match op {
        "ReduceProd" => v.iter().map(|x| 1.0 + 0.01 * x).collect(),
        "ReduceLogSum" => v.iter().map(|x| x.abs() + 0.01).collect(),
        _ => v,
    };
    Tensor::from_vec(shape, v).unwrap()
}

/// A reduction at opset 18 (axes as a host input; `None`: no axes input).
fn red(op: &'static str, x: Tensor, axes: Option<&[i64]>, keep: i64) -> Case {
    let c = Case::new(op, vec![x]).attr(ai("keepdims", keep)).atol(1e-4);
    match axes {
        Some(a) => c.consts(vec![Some(it(&[a.len()], a.to_vec()))]),
        None => c,
    }
}

/// Runs `case` with WebGPU available and asserts its node went to the CPU (declined at load)
/// with the CPU's answer.
#[track_caller]
fn falls_back(case: Case) {
    let Some(g) = gpu() else { return };
    let (s, got) = case.run_all(vec![g, cpu()]);
    let placed = &s.partition().assignments;
    assert_eq!(placed[0].2, "cpu", "{} should stay on the CPU", case.op);
    let (_, want) = case.run_all(vec![cpu()]);
    for ((g, gs), (w, ws)) in got.iter().zip(&want) {
        assert_eq!(gs, ws);
        close(case.op, g, w, 1e-5, 1e-6);
    }
}

/// Compares exactly, infinities and NaN included (empty-set identities).
#[track_caller]
fn check_exact(case: Case) {
    let Some(g) = gpu() else { return };
    let (s, got) = case.run_all(vec![g, cpu()]);
    assert_eq!(s.partition().assignments[0].2, "webgpu", "{}", case.op);
    let (_, want) = case.run_all(vec![cpu()]);
    for ((g, gs), (w, ws)) in got.iter().zip(&want) {
        assert_eq!(gs, ws, "{}", case.op);
        for (a, b) in g.iter().zip(w) {
            assert!(
                a == b || (a.is_nan() && b.is_nan()),
                "{}: {g:?} vs {w:?}",
                case.op
            );
        }
    }
}

// ----------------------------------------------------------------------------- reductions

#[test]
fn reductions_over_every_axis_position() {
    let cases: &[(&[usize], &[i64])] = &[
        (&[1], &[0]),
        (&[7, 13], &[1]),
        (&[7, 13], &[0]),
        (&[7, 13], &[-1]),
        (&[2, 3, 5, 7], &[1]),
        (&[2, 3, 5, 7], &[0, 2]),
        (&[2, 3, 5, 7], &[1, 3]),
        (&[2, 3, 5, 7], &[-2, -1]),
        (&[2, 3, 5, 7], &[3, 0, 1]),
        (&[2, 1, 5, 1, 3], &[1, 2, 3]),
        // repeated axes count once (as on the CPU)
        (&[4, 6], &[1, -1]),
    ];
    for op in REDUCE {
        for (k, (shape, axes)) in cases.iter().enumerate() {
            for keep in [0, 1] {
                red(op, data_for(op, shape, k as u32), Some(axes), keep).check();
            }
        }
    }
}

#[test]
fn reductions_over_long_and_many_short_lines() {
    for op in REDUCE {
        // lines longer than a workgroup, contiguous and strided
        red(op, data_for(op, &[3, 1031], 1), Some(&[1]), 0).check();
        red(op, data_for(op, &[1031, 3], 2), Some(&[0]), 1).check();
        red(op, data_for(op, &[2, 257, 3], 3), Some(&[0, 1]), 0).check();
        // many short lines: an invocation each
        red(op, data_for(op, &[300, 5], 4), Some(&[1]), 0).check();
        red(op, data_for(op, &[5, 301], 5), Some(&[0]), 1).check();
        red(op, data_for(op, &[17, 2, 19], 6), Some(&[1]), 0).check();
    }
}

#[test]
fn reductions_without_axes_and_with_noop() {
    for op in REDUCE {
        // no axes input: everything
        red(op, data_for(op, &[4, 67], 1), None, 0).check();
        red(op, data_for(op, &[4, 67], 2), None, 1).check();
        // an empty axes input: everything, or nothing with noop_with_empty_axes
        red(op, data_for(op, &[3, 5], 3), Some(&[]), 1).check();
        red(op, data_for(op, &[3, 5], 4), Some(&[]), 1)
            .attr(ai("noop_with_empty_axes", 1))
            .check();
        red(op, data_for(op, &[3, 5], 5), None, 0)
            .attr(ai("noop_with_empty_axes", 1))
            .check();
        // a scalar
        red(op, data_for(op, &[], 6), None, 0).check();
    }
}

#[test]
fn reductions_with_the_axes_attribute_of_older_opsets() {
    let x = || ft(&[3, 4, 5], 8);
    for (op, opset) in [("ReduceSum", 11), ("ReduceMean", 13), ("ReduceMax", 13)] {
        for axes in [&[1][..], &[0, 2], &[-1]] {
            for keep in [0, 1] {
                Case::new(op, vec![x()])
                    .opset(opset)
                    .attr(ais("axes", axes))
                    .attr(ai("keepdims", keep))
                    .atol(1e-4)
                    .check();
            }
        }
        Case::new(op, vec![x()]).opset(opset).check();
    }
    // ReduceSum takes its axes as an input from opset 13
    Case::new("ReduceSum", vec![x()])
        .opset(13)
        .consts(vec![Some(it(&[1], vec![-2]))])
        .attr(ai("keepdims", 0))
        .check();
}

#[test]
fn reductions_of_empty_sets_give_the_cpu_identities() {
    for op in REDUCE {
        check_exact(red(op, ft(&[2, 0, 3], 1), Some(&[1]), 0));
        check_exact(red(op, ft(&[2, 0, 3], 1), None, 1));
        // nothing to reduce into
        check_exact(red(op, ft(&[0, 3], 1), Some(&[1]), 0));
    }
}

#[test]
fn reductions_pass_infinities_through_as_the_cpu() {
    let inf = f32::INFINITY;
    // rows: all -inf, +inf with a finite value, -inf with a finite value
    let x = || Tensor::from_vec(&[3, 2], vec![-inf, -inf, inf, 1.0, -inf, 0.0]).unwrap();
    for op in ["ReduceLogSumExp", "ReduceMax", "ReduceMin", "ReduceSum"] {
        check_exact(red(op, x(), Some(&[1]), 0));
    }
    // the same along a strided axis
    let xt = Tensor::from_vec(&[2, 3], vec![-inf, inf, -inf, -inf, 1.0, 0.0]).unwrap();
    check_exact(red("ReduceLogSumExp", xt, Some(&[0]), 1));
}

#[test]
fn reductions_fold_more_rows_than_one_grid_dimension() {
    let Some(g) = gpu() else { return };
    let rows = g.gpu().summary().max_compute_workgroups_per_dimension as usize + 7;
    // a workgroup per row (rows of 64), more rows than one dimension of workgroups holds
    red("ReduceSum", ft(&[rows, 64], 3), Some(&[1]), 0).check();
}

#[test]
fn reductions_in_float16() {
    // (shape, axes, keepdims)
    type RedCase = (&'static [usize], Option<&'static [i64]>, i64);
    let cases: &[RedCase] = &[
        (&[7, 13], Some(&[1]), 0),
        (&[7, 13], Some(&[0]), 1),
        (&[2, 3, 5, 7], Some(&[0, 2]), 1),
        (&[2, 3, 5, 7], Some(&[-2, -1]), 0),
        (&[2, 1, 5, 1, 3], Some(&[1, 2, 3]), 1),
        // a workgroup per line, contiguous and strided
        (&[3, 1031], Some(&[1]), 0),
        (&[1031, 3], Some(&[0]), 1),
        // an invocation per line
        (&[300, 5], Some(&[1]), 0),
        (&[5, 301], Some(&[0]), 1),
        // everything
        (&[4, 67], None, 0),
        (&[], None, 1),
    ];
    for op in REDUCE {
        for (k, &(shape, axes, keep)) in cases.iter().enumerate() {
            red(op, data_for(op, shape, k as u32), axes, keep).check_half();
        }
        // noop_with_empty_axes: the input as it is
        red(op, data_for(op, &[3, 5], 4), Some(&[]), 1)
            .attr(ai("noop_with_empty_axes", 1))
            .check_half();
    }
    // the axes attribute of older opsets
    for (op, opset) in [("ReduceSum", 11), ("ReduceMean", 13), ("ReduceMax", 13)] {
        Case::new(op, vec![ft(&[3, 4, 5], 8)])
            .opset(opset)
            .attr(ais("axes", &[0, 2]))
            .attr(ai("keepdims", 0))
            .check_half();
    }
}

#[test]
fn reductions_of_empty_sets_in_float16_give_the_cpu_identities() {
    // an odd number of outputs: the f16 fill writes whole words of two
    for op in REDUCE {
        red(op, ft(&[3, 0, 5], 1), Some(&[1]), 0).check_half();
        red(op, ft(&[3, 0, 5], 1), None, 1).check_half();
        red(op, ft(&[0, 3], 1), Some(&[1]), 0).check_half();
    }
}

// ----------------------------------------------------------------------------- softmax

#[test]
fn softmax_and_log_softmax_along_any_axis() {
    let cases: &[(&[usize], i64)] = &[
        (&[1], 0),
        (&[3, 1031], -1),
        (&[2, 1031, 3], 1),
        (&[300, 7], 1),
        (&[7, 300], 0),
        (&[2, 3, 5, 7], 0),
        (&[2, 3, 5, 7], 1),
        (&[2, 3, 5, 7], 2),
        (&[2, 3, 5, 7], -1),
        (&[2, 3, 5, 7], -3),
        (&[2, 0, 5], 1),
    ];
    for op in ["Softmax", "LogSoftmax"] {
        for (k, (shape, axis)) in cases.iter().enumerate() {
            Case::new(op, vec![ft(shape, k as u32)])
                .attr(ai("axis", *axis))
                .opset(13)
                .check();
        }
        Case::new(op, vec![ft(&[4, 9], 1)]).opset(13).check();
        Case::new(op, vec![ft(&[], 2)]).opset(13).check();
        // large values: the maximum is subtracted first
        let big =
            Tensor::from_vec(&[2, 3], vec![1000.0f32, 999.0, 998.0, -50.0, 80.0, 80.5]).unwrap();
        Case::new(op, vec![big]).opset(13).check();
    }
}

#[test]
fn softmax_before_opset_13_flattens_from_the_axis() {
    for op in ["Softmax", "LogSoftmax"] {
        for axis in [0, 1, 2, -1, 3] {
            Case::new(op, vec![ft(&[2, 3, 43], 5)])
                .attr(ai("axis", axis))
                .opset(11)
                .check();
        }
        Case::new(op, vec![ft(&[3, 4, 5], 6)]).opset(11).check();
    }
}

#[test]
fn softmax_and_log_softmax_in_float16() {
    let cases: &[(&[usize], i64, i64)] = &[
        (&[1], 0, 13),
        (&[3, 1031], -1, 13),
        (&[2, 1031, 3], 1, 13),
        (&[300, 7], 1, 13),
        (&[7, 300], 0, 13),
        (&[2, 3, 5, 7], 1, 13),
        (&[2, 3, 5, 7], -3, 13),
        (&[2, 0, 5], 1, 13),
        (&[], -1, 13),
        // flattened from the axis (before opset 13)
        (&[2, 3, 43], 1, 11),
        (&[2, 3, 43], 0, 11),
    ];
    for op in ["Softmax", "LogSoftmax"] {
        for (k, &(shape, axis, opset)) in cases.iter().enumerate() {
            Case::new(op, vec![ft(shape, k as u32)])
                .attr(ai("axis", axis))
                .opset(opset)
                .check_half();
        }
        let big =
            Tensor::from_vec(&[2, 3], vec![1000.0f32, 999.0, 998.0, -50.0, 80.0, 80.5]).unwrap();
        Case::new(op, vec![big]).opset(13).check_half();
    }
}

// ----------------------------------------------------------------------------- norms

#[test]
fn layer_normalization_axes_scales_and_bias() {
    let x = ft(&[2, 3, 5, 7], 1);
    for axis in [0i64, 1, 2, -1] {
        let norm: Vec<usize> = x.shape()[axis.rem_euclid(4) as usize..].to_vec();
        Case::new("LayerNormalization", vec![x.clone()])
            .consts(vec![Some(ft(&norm, 2)), Some(ft(&norm, 3))])
            .attr(ai("axis", axis))
            .opset(17)
            .check();
        Case::new("LayerNormalization", vec![x.clone()])
            .consts(vec![Some(ft(&norm, 2))])
            .attr(ai("axis", axis))
            .attr(af("epsilon", 0.1))
            .opset(17)
            .check();
    }
    // scale and bias broadcast to the normalised shape
    Case::new("LayerNormalization", vec![x.clone()])
        .consts(vec![Some(ft(&[7], 2)), Some(ft(&[1, 7], 3))])
        .attr(ai("axis", 2))
        .opset(17)
        .check();
    Case::new("LayerNormalization", vec![x])
        .consts(vec![Some(ft(&[5, 1], 2)), Some(ft(&[1], 3))])
        .attr(ai("axis", -2))
        .opset(17)
        .check();
    // long rows, many short rows, one element per row
    for shape in [&[3, 1031][..], &[400, 6], &[5, 1]] {
        let n = shape[1];
        Case::new("LayerNormalization", vec![ft(shape, 4)])
            .consts(vec![Some(ft(&[n], 5)), Some(ft(&[n], 6))])
            .opset(17)
            .atol(1e-4)
            .check();
    }
}

#[test]
fn rms_normalization() {
    let x = ft(&[2, 3, 5, 7], 1);
    for axis in [0i64, 1, -1] {
        let norm: Vec<usize> = x.shape()[axis.rem_euclid(4) as usize..].to_vec();
        Case::new("RMSNormalization", vec![x.clone()])
            .consts(vec![Some(ft(&norm, 2))])
            .attr(ai("axis", axis))
            .opset(23)
            .check();
    }
    Case::new("RMSNormalization", vec![x])
        .consts(vec![Some(ft(&[7], 2))])
        .attr(af("epsilon", 0.5))
        .attr(ai("axis", 2))
        .opset(23)
        .check();
    for shape in [&[3, 1031][..], &[400, 6]] {
        Case::new("RMSNormalization", vec![ft(shape, 4)])
            .consts(vec![Some(ft(&[shape[1]], 5))])
            .opset(23)
            .atol(1e-4)
            .check();
    }
}

#[test]
fn simplified_and_skip_simplified_layer_normalization() {
    // ONNX Runtime's contrib RMS norms as its transformer exporters emit them
    let x = ft(&[2, 3, 64], 1);
    Case::new("SimplifiedLayerNormalization", vec![x.clone()])
        .consts(vec![Some(ft(&[64], 2))])
        .attr(af("epsilon", 1e-6))
        .opset(17)
        .check();
    // skip of the input's shape, with and without bias; output 3 (input + skip + bias) read
    // or not; skip repeated over the batch; a hidden size over one workgroup's lanes
    for (shape, skip, bias, sum) in [
        (&[2, 3, 64][..], &[2, 3, 64][..], true, true),
        (&[2, 3, 64], &[2, 3, 64], false, true),
        (&[2, 3, 64], &[3, 64], true, false),
        (&[1, 5, 1031], &[1, 5, 1031], false, true),
    ] {
        let h = *shape.last().unwrap();
        let mut consts = vec![Some(ft(&[h], 3))];
        if bias {
            consts.push(Some(ft(&[h], 4)));
        }
        let case = Case::new(
            "SkipSimplifiedLayerNormalization",
            vec![ft(shape, 5), ft(skip, 6)],
        )
        .consts(consts)
        .attr(af("epsilon", 1e-6))
        .domain("com.microsoft")
        .atol(1e-4);
        if sum {
            case.outputs(4).unnamed(&[1, 2]).check();
        } else {
            case.check();
        }
    }
}

#[test]
fn skip_layer_normalization() {
    // beta and bias each given or not; output 3 read or not; skip repeated over the batch; a
    // hidden size over one workgroup's lanes; many short rows (an invocation per row)
    for (k, (shape, skip, beta, bias, sum)) in [
        (&[2, 3, 64][..], &[2, 3, 64][..], true, true, true),
        (&[2, 3, 64], &[2, 3, 64], false, true, false),
        (&[2, 3, 64], &[3, 64], true, false, true),
        (&[1, 5, 1031], &[1, 5, 1031], false, false, true),
        (&[40, 30, 12], &[30, 12], true, true, false),
    ]
    .into_iter()
    .enumerate()
    {
        let h = *shape.last().unwrap();
        let seed = 10 * k as u32;
        let consts = vec![
            Some(ft(&[h], seed + 1)),
            beta.then(|| ft(&[h], seed + 2)),
            bias.then(|| ft(&[h], seed + 3)),
        ];
        let case = Case::new(
            "SkipLayerNormalization",
            vec![ft(shape, seed + 4), ft(skip, seed + 5)],
        )
        .consts(consts)
        .attr(af("epsilon", 1e-5))
        .domain("com.microsoft")
        .atol(1e-4);
        if sum {
            case.outputs(4).unnamed(&[1, 2]).check();
        } else {
            case.check();
        }
    }
}

#[test]
fn instance_normalization() {
    for (k, shape) in [&[2, 3, 5, 7][..], &[1, 2, 1031], &[100, 3, 4], &[2, 5, 1]]
        .iter()
        .enumerate()
    {
        let c = shape[1];
        Case::new("InstanceNormalization", vec![ft(shape, k as u32)])
            .consts(vec![Some(ft(&[c], 10)), Some(ft(&[c], 11))])
            .atol(1e-4)
            .check();
    }
    Case::new("InstanceNormalization", vec![ft(&[2, 3, 11], 1)])
        .consts(vec![Some(ft(&[3], 2)), Some(ft(&[3], 3))])
        .attr(af("epsilon", 0.25))
        .check();
}

#[test]
fn normalizations_in_float16() {
    let x = || ft(&[2, 3, 5, 7], 1);
    for axis in [0i64, 1, 2, -1] {
        let norm: Vec<usize> = [2, 3, 5, 7][axis.rem_euclid(4) as usize..].to_vec();
        Case::new("LayerNormalization", vec![x()])
            .consts(vec![Some(ft(&norm, 2)), Some(ft(&norm, 3))])
            .attr(ai("axis", axis))
            .opset(17)
            .check_half();
        Case::new("LayerNormalization", vec![x()])
            .consts(vec![Some(ft(&norm, 2))])
            .attr(ai("axis", axis))
            .attr(af("epsilon", 0.1))
            .opset(17)
            .check_half();
        Case::new("RMSNormalization", vec![x()])
            .consts(vec![Some(ft(&norm, 2))])
            .attr(ai("axis", axis))
            .opset(23)
            .check_half();
    }
    // Scale and B broadcast to the normalised shape (f16 copies of odd lengths)
    Case::new("LayerNormalization", vec![x()])
        .consts(vec![Some(ft(&[7], 2)), Some(ft(&[1, 7], 3))])
        .attr(ai("axis", 2))
        .opset(17)
        .check_half();
    Case::new("LayerNormalization", vec![x()])
        .consts(vec![Some(ft(&[5, 1], 2)), Some(ft(&[1], 3))])
        .attr(ai("axis", -2))
        .opset(17)
        .check_half();
    Case::new("RMSNormalization", vec![x()])
        .consts(vec![Some(ft(&[7], 2))])
        .attr(af("epsilon", 0.5))
        .attr(ai("axis", 2))
        .opset(23)
        .check_half();
    // float16 X with float32 Scale and B
    Case::new("LayerNormalization", vec![x()])
        .consts(vec![Some(ft(&[5, 7], 2)), Some(ft(&[7], 3))])
        .attr(ai("axis", 2))
        .opset(17)
        .keep_f32(&[1, 2])
        .check_half();
    Case::new("RMSNormalization", vec![x()])
        .consts(vec![Some(ft(&[7], 2))])
        .opset(23)
        .keep_f32(&[1])
        .check_half();
    // long rows, many short rows, one element per row
    for shape in [&[3, 1031][..], &[400, 6], &[5, 1]] {
        let n = shape[1];
        Case::new("LayerNormalization", vec![ft(shape, 4)])
            .consts(vec![Some(ft(&[n], 5)), Some(ft(&[n], 6))])
            .opset(17)
            .check_half();
        Case::new("RMSNormalization", vec![ft(shape, 4)])
            .consts(vec![Some(ft(&[n], 5))])
            .opset(23)
            .check_half();
    }
    // InstanceNormalization: a workgroup per plane, an invocation per plane, planes of 1
    for (k, shape) in [&[2, 3, 5, 7][..], &[1, 2, 1031], &[100, 3, 4], &[2, 5, 1]]
        .iter()
        .enumerate()
    {
        let c = shape[1];
        Case::new("InstanceNormalization", vec![ft(shape, k as u32)])
            .consts(vec![Some(ft(&[c], 10)), Some(ft(&[c], 11))])
            .check_half();
    }
    Case::new("InstanceNormalization", vec![ft(&[2, 3, 11], 1)])
        .consts(vec![Some(ft(&[3], 2)), Some(ft(&[3], 3))])
        .attr(af("epsilon", 0.25))
        .keep_f32(&[1, 2])
        .check_half();
}

fn bn_consts(c: usize) -> Vec<Option<Tensor>> {
    let var = Tensor::from_vec(&[c], vals(c, 4).iter().map(|v| v.abs() + 0.1).collect()).unwrap();
    vec![
        Some(ft(&[c], 1)),
        Some(ft(&[c], 2)),
        Some(ft(&[c], 3)),
        Some(var),
    ]
}

#[test]
fn batch_normalization_inference() {
    for opset in [9, 15] {
        for shape in [&[2, 3, 5, 7][..], &[4, 3], &[1, 13, 257]] {
            Case::new("BatchNormalization", vec![ft(shape, 5)])
                .consts(bn_consts(shape[1]))
                .opset(opset)
                .check();
        }
    }
    Case::new("BatchNormalization", vec![ft(&[2, 3, 4], 5)])
        .consts(bn_consts(3))
        .attr(af("epsilon", 0.3))
        .attr(ai("training_mode", 0))
        .opset(15)
        .check();
}

#[test]
fn batch_normalization_in_float16() {
    for opset in [9, 15] {
        for shape in [&[2, 3, 5, 7][..], &[4, 3], &[1, 13, 257]] {
            Case::new("BatchNormalization", vec![ft(shape, 5)])
                .consts(bn_consts(shape[1]))
                .opset(opset)
                .check_half();
        }
    }
    // float16 X and scale / B with float32 statistics (T, T1, T2 of opset 15)
    Case::new("BatchNormalization", vec![ft(&[2, 3, 9], 5)])
        .consts(bn_consts(3))
        .attr(af("epsilon", 0.3))
        .opset(15)
        .keep_f32(&[3, 4])
        .check_half();
}

// ----------------------------------------------------------------------------- Split, Expand, Cast

#[test]
fn split_by_attribute_input_and_num_outputs() {
    let x = ft(&[6, 10], 1);
    // even split, opset 11
    Case::new("Split", vec![x.clone()])
        .opset(11)
        .outputs(3)
        .check();
    Case::new("Split", vec![x.clone()])
        .opset(11)
        .attr(ais("split", &[2, 4]))
        .outputs(2)
        .check();
    Case::new("Split", vec![x.clone()])
        .opset(11)
        .attr(ai("axis", 1))
        .attr(ais("split", &[3, 0, 7]))
        .outputs(3)
        .check();
    // sizes as an input
    Case::new("Split", vec![ft(&[2, 10, 3], 2)])
        .opset(13)
        .attr(ai("axis", 1))
        .consts(vec![Some(it(&[3], vec![3, 1, 6]))])
        .outputs(3)
        .check();
    Case::new("Split", vec![ft(&[2, 3, 7], 3)])
        .opset(13)
        .attr(ai("axis", -1))
        .consts(vec![Some(it(&[2], vec![5, 2]))])
        .outputs(2)
        .check();
    // num_outputs: the last part is the short one
    Case::new("Split", vec![x.clone()])
        .opset(18)
        .attr(ai("axis", 1))
        .attr(ai("num_outputs", 3))
        .outputs(3)
        .check();
    Case::new("Split", vec![ft(&[7, 2, 3], 4)])
        .opset(18)
        .attr(ai("num_outputs", 2))
        .outputs(2)
        .check();
    Case::new("Split", vec![ft(&[1031], 5)])
        .opset(18)
        .attr(ai("num_outputs", 4))
        .outputs(4)
        .check();
}

#[test]
fn expand_broadcasts_on_the_device() {
    let cases: &[(&[usize], &[i64])] = &[
        (&[3, 1], &[2, 3, 4]),
        (&[1], &[5]),
        (&[4], &[1, 1]),
        (&[2, 1, 3], &[2, 5, 3]),
        (&[2, 1, 3], &[1, 3]),
        (&[1, 7, 1], &[3, 1, 7, 259]),
        (&[3, 4], &[2, 1, 1]),
        (&[2, 3], &[0, 2, 3]),
    ];
    for (k, (shape, target)) in cases.iter().enumerate() {
        Case::new("Expand", vec![ft(shape, k as u32)])
            .consts(vec![Some(it(&[target.len()], target.to_vec()))])
            .check();
    }
}

#[test]
fn cast_float_to_float_is_a_view() {
    Case::new("Cast", vec![ft(&[3, 5], 1)])
        .attr(ai("to", 1))
        .opset(19)
        .check();
    Case::new("Cast", vec![ft(&[7], 2)])
        .attr(ai("to", 1))
        .opset(13)
        .check();
}

// ----------------------------------------------------------------------------- Attention

fn attn(q: &[usize], k: &[usize], v: &[usize], seed: u32) -> Case {
    Case::new(
        "Attention",
        vec![ft(q, seed), ft(k, seed + 1), ft(v, seed + 2)],
    )
    .opset(23)
    .atol(1e-4)
}

fn bools(shape: &[usize], seed: u32) -> Tensor {
    let n = shape.iter().product();
    // about a quarter masked out
    Tensor::from_vec(shape, vals(n, seed).iter().map(|&x| x > -1.0).collect()).unwrap()
}

fn with_mask(c: Case, m: Tensor) -> Case {
    let mut c = c;
    c.feeds.push(m);
    c
}

#[test]
fn attention_4d_3d_and_grouped_heads() {
    // 4-D, value head size differing from the key's
    attn(&[2, 4, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 6], 1).check();
    // grouped-query heads: 6 query heads over 2 key/value heads
    attn(&[1, 6, 5, 8], &[1, 2, 9, 8], &[1, 2, 9, 8], 2).check();
    // 3-D with head counts
    attn(&[2, 5, 32], &[2, 7, 16], &[2, 7, 12], 3)
        .attr(ai("q_num_heads", 4))
        .attr(ai("kv_num_heads", 2))
        .check();
    attn(&[1, 3, 13], &[1, 11, 13], &[1, 11, 3], 4)
        .attr(ai("q_num_heads", 1))
        .attr(ai("kv_num_heads", 1))
        .check();
    // keys longer than a workgroup, one query
    attn(&[1, 2, 1, 16], &[1, 2, 300, 16], &[1, 2, 300, 5], 5).check();
    // head size 1
    attn(&[2, 1, 3, 1], &[2, 1, 4, 1], &[2, 1, 4, 1], 6).check();
}

#[test]
fn attention_scale_softcap_and_causal() {
    attn(&[2, 4, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 6], 1)
        .attr(af("scale", 0.3))
        .check();
    attn(&[2, 4, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 6], 2)
        .attr(af("softcap", 1.5))
        .check();
    for (sq, skv) in [(5, 5), (5, 7), (7, 3)] {
        attn(&[1, 6, sq, 8], &[1, 3, skv, 8], &[1, 3, skv, 4], 3)
            .attr(ai("is_causal", 1))
            .check();
    }
    attn(&[2, 5, 24], &[2, 5, 8], &[2, 5, 8], 4)
        .attr(ai("q_num_heads", 3))
        .attr(ai("kv_num_heads", 1))
        .attr(ai("is_causal", 1))
        .attr(af("scale", 0.7))
        .attr(af("softcap", 2.0))
        .check();
}

#[test]
fn attention_masks_bool_and_float() {
    let base = || attn(&[2, 4, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 6], 1);
    for shape in [
        &[5, 7][..],
        &[2, 1, 5, 7],
        &[2, 4, 5, 7],
        &[7],
        &[1, 4, 1, 7],
    ] {
        with_mask(base(), bools(shape, 9)).check();
        with_mask(base(), ft(shape, 10)).check();
    }
    // a mask shorter than the keys: the rest is padding
    with_mask(base(), bools(&[5, 4], 11)).check();
    with_mask(base(), ft(&[2, 1, 1, 3], 12)).check();
    // a mask and causality together, grouped heads
    with_mask(
        attn(&[1, 6, 5, 8], &[1, 2, 5, 8], &[1, 2, 5, 8], 2).attr(ai("is_causal", 1)),
        bools(&[1, 1, 5, 5], 13),
    )
    .check();
    // rows with every key masked out give zeros (as on the CPU)
    let mut m = vec![true; 5 * 7];
    m[7..14].fill(false);
    m[28..35].fill(false);
    let m = Tensor::from_vec(&[5, 7], m).unwrap();
    with_mask(base(), m).check();
}

#[test]
fn attention_in_float16() {
    // 4-D with a value head size differing from the key's, grouped-query heads, 3-D with
    // head counts, keys longer than a workgroup, head size 1
    attn(&[2, 4, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 6], 1).check_half();
    attn(&[1, 6, 5, 8], &[1, 2, 9, 8], &[1, 2, 9, 8], 2).check_half();
    attn(&[2, 5, 32], &[2, 7, 16], &[2, 7, 12], 3)
        .attr(ai("q_num_heads", 4))
        .attr(ai("kv_num_heads", 2))
        .check_half();
    attn(&[1, 2, 1, 16], &[1, 2, 300, 16], &[1, 2, 300, 5], 5).check_half();
    attn(&[2, 1, 3, 1], &[2, 1, 4, 1], &[2, 1, 4, 1], 6).check_half();
    // scale, softcap, causality (grouped)
    attn(&[2, 5, 24], &[2, 5, 8], &[2, 5, 8], 4)
        .attr(ai("q_num_heads", 3))
        .attr(ai("kv_num_heads", 1))
        .attr(ai("is_causal", 1))
        .attr(af("scale", 0.7))
        .attr(af("softcap", 2.0))
        .check_half();
    for (sq, skv) in [(5, 7), (7, 3)] {
        attn(&[1, 6, sq, 8], &[1, 3, skv, 8], &[1, 3, skv, 4], 3)
            .attr(ai("is_causal", 1))
            .check_half();
    }
}

#[test]
fn attention_masks_in_float16() {
    let base = || attn(&[2, 4, 5, 8], &[2, 4, 7, 8], &[2, 4, 7, 6], 1);
    // bool masks and float masks of type T (float16), broadcast
    for shape in [&[5, 7][..], &[2, 1, 5, 7], &[7], &[1, 4, 1, 7]] {
        with_mask(base(), bools(shape, 9)).check_half();
        with_mask(base(), ft(shape, 10)).check_half();
    }
    // shorter than the keys: the rest is padding
    with_mask(base(), bools(&[5, 4], 11)).check_half();
    with_mask(base(), ft(&[2, 1, 1, 3], 12)).check_half();
    // a float32 mask with float16 Q, K, V
    with_mask(base(), ft(&[2, 4, 5, 7], 13))
        .keep_f32(&[3])
        .check_half();
    // a mask with causality and grouped heads; rows with every key masked out give zeros
    with_mask(
        attn(&[1, 6, 5, 8], &[1, 2, 5, 8], &[1, 2, 5, 8], 2).attr(ai("is_causal", 1)),
        bools(&[1, 1, 5, 5], 13),
    )
    .check_half();
    let mut m = vec![true; 5 * 7];
    m[7..14].fill(false);
    m[28..35].fill(false);
    with_mask(base(), Tensor::from_vec(&[5, 7], m).unwrap()).check_half();
}

// ----------------------------------------------------------------------------- declines

#[test]
fn unsupported_configurations_stay_on_the_cpu() {
    let x = ft(&[2, 3, 5], 1);
    // LayerNormalization whose Mean / InvStdDev outputs are used
    falls_back(
        Case::new("LayerNormalization", vec![x.clone()])
            .consts(vec![Some(ft(&[5], 2)), Some(ft(&[5], 3))])
            .opset(17)
            .outputs(3),
    );
    // BatchNormalization in training mode
    falls_back(
        Case::new("BatchNormalization", vec![x.clone()])
            .consts(bn_consts(3))
            .attr(ai("training_mode", 1))
            .opset(15)
            .outputs(3),
    );
    falls_back(
        Case::new("BatchNormalization", vec![x.clone()])
            .consts(bn_consts(3))
            .attr(ai("training_mode", 1))
            .opset(15),
    );
    // Cast to anything but float
    falls_back(
        Case::new("Cast", vec![x.clone()])
            .attr(ai("to", 7))
            .opset(13),
    );
    falls_back(
        Case::new("Cast", vec![x.clone()])
            .attr(ai("to", 11))
            .opset(13),
    );
    // Attention with the QK output, another qk mode, or a past cache
    let a = || attn(&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 5, 4], 1);
    falls_back(a().outputs(4));
    falls_back(a().attr(ai("qk_matmul_output_mode", 1)));
    falls_back(a().outputs(3));
    let mut past = a().outputs(3);
    past.consts = vec![None, Some(ft(&[1, 2, 2, 4], 7)), Some(ft(&[1, 2, 2, 4], 8))];
    falls_back(past);
}

// ----------------------------------------------------------------------------- in a graph

fn node(
    op: &str,
    ins: &[&str],
    out: &str,
    attrs: Vec<nxrt_core::proto::AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: out.into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        attribute: attrs,
        ..Default::default()
    }
}

/// A lazily computed element-wise chain feeds Softmax, LayerNormalization and Attention;
/// their results feed a ReduceSum and another element-wise chain. Run on `g` (every node
/// there) and on the CPU alone, in `dt` (f32 or f16), compared within `tol`.
fn fused_graph(g: std::sync::Arc<nxrt_wasm::webgpu::WebGpuProvider>, dt: DataType, tol: f32) {
    let cv = |t: Tensor| {
        if dt == DataType::Float16 {
            to_half(&t)
        } else {
            t
        }
    };
    let shape = [2, 3, 5, 8];
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 23,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                node("Sigmoid", &["x0"], "s", vec![]),
                node("Mul", &["x0", "s"], "m", vec![]),
                node("Add", &["m", "x1"], "a", vec![]),
                node("Softmax", &["a"], "sm", vec![ai("axis", 1)]),
                node("LayerNormalization", &["a", "sc", "b"], "ln", vec![]),
                node("ReduceSum", &["ln", "ax"], "r", vec![]),
                node(
                    "Attention",
                    &["a", "a", "m"],
                    "at",
                    vec![ai("is_causal", 1)],
                ),
                node("Exp", &["sm"], "e", vec![]),
                node("Add", &["e", "r"], "er", vec![]),
                node("Add", &["er", "at"], "y", vec![]),
            ],
            initializer: vec![
                init("sc", &cv(ft(&[8], 5))),
                init("b", &cv(ft(&[8], 6))),
                init("ax", &it(&[1], vec![-1])),
            ],
            input: vec![vi("x0", dt, &shape), vi("x1", dt, &[8])],
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let load = || loader::load_model(&m, &loader::NoExternalData).unwrap();
    let feeds = || {
        vec![
            ("x0".to_string(), Value::Tensor(cv(ft(&shape, 1)))),
            ("x1".to_string(), Value::Tensor(cv(ft(&[8], 2)))),
        ]
    };
    let s = Session::new(load(), vec![g, cpu()], &SessionOptions::default()).unwrap();
    let placed = &s.partition().assignments;
    assert!(placed.iter().all(|(_, _, p)| p == "webgpu"), "{placed:?}");
    let got = pollster::block_on(s.run_async(feeds())).unwrap();
    let c = Session::new(load(), vec![cpu()], &SessionOptions::default()).unwrap();
    let want = pollster::block_on(c.run_async(feeds())).unwrap();
    let (Value::Tensor(a), Value::Tensor(b)) = (&got[0].1, &want[0].1) else {
        panic!("tensors")
    };
    assert_eq!(a.shape(), b.shape());
    assert_eq!(a.dtype(), dt);
    close(
        &format!("graph ({dt})"),
        &a.to_f32_vec().unwrap(),
        &b.to_f32_vec().unwrap(),
        tol,
        tol,
    );
}

#[test]
fn kernels_read_fused_element_wise_results_and_feed_them() {
    let Some(g) = fresh_gpu() else { return };
    fused_graph(g, DataType::Float, 1e-4);
}

#[test]
fn kernels_read_fused_float16_results_and_feed_them() {
    // each f16 node rounds its result, the CPU's as the GPU's: a few f16 steps apart at most
    for f16_storage in [false, true] {
        if let Some(g) = half_gpu(f16_storage) {
            fused_graph(g, DataType::Float16, 1e-2);
        }
    }
}
