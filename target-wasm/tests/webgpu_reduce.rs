//! The WebGPU reductions, softmax, normalisations, Split / Expand / Cast and Attention against
//! the CPU kernels. Sizes are odd on purpose (1, primes, rows longer than one 256-wide
//! workgroup) and chosen so that both layouts of the line kernels run: a workgroup per line
//! (long lines, or few of them) and an invocation per line (many short lines). Configurations
//! the kernels decline are checked to land on the CPU, with the CPU's answer.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use nxrt_core::Tensor;

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
fn reductions_fold_more_rows_than_one_grid_dimension() {
    let Some(g) = gpu() else { return };
    let rows = g.gpu().summary().max_compute_workgroups_per_dimension as usize + 7;
    // a workgroup per row (rows of 64), more rows than one dimension of workgroups holds
    red("ReduceSum", ft(&[rows, 64], 3), Some(&[1]), 0).check();
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
