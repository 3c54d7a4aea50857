//! float16 in the WebGPU data-movement kernels (views, Transpose, Slice, Gather, Concat, Split,
//! Expand) and Cast between float32 and float16, on both f16 stores (f16 words where the
//! adapter has `shader-f16`, f32 words otherwise). Sizes and offsets are odd on purpose: 2-byte
//! elements at odd positions cannot be moved by buffer copies (4-byte granularity), so those
//! parts must take the copy shader. Copies and casts are exact, so most comparisons are too.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use std::sync::Arc;

use nxrt_core::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};
use nxrt_core::provider::ExecutionProvider;
use nxrt_core::{loader, DataType, Session, SessionOptions, Tensor, Value};
use prost::Message;

fn ints(v: &[i64]) -> Option<Tensor> {
    Some(it(&[v.len()], v.to_vec()))
}

/// The f16 providers this adapter offers: (f16 storage?, provider).
fn half_gpus() -> Vec<(bool, Arc<dyn ExecutionProvider>)> {
    [false, true]
        .into_iter()
        .filter_map(|f| half_gpu(f).map(|g| (f, g as Arc<dyn ExecutionProvider>)))
        .collect()
}

/// Runs `case` as it is (no conversion) on `providers`: the session and its outputs, with
/// their element types.
fn run_typed(case: &Case, providers: Vec<Arc<dyn ExecutionProvider>>) -> (Session, Vec<Tensor>) {
    let m = loader::load_model(&case.model(), &loader::NoExternalData).unwrap();
    let s = Session::new(m, providers, &SessionOptions::default()).unwrap();
    let feeds = case
        .feeds
        .iter()
        .enumerate()
        .map(|(k, t)| (format!("x{k}"), Value::Tensor(t.clone())))
        .collect();
    let out = pollster::block_on(s.run_async(feeds)).unwrap();
    let outs = out
        .into_iter()
        .map(|(_, v)| match v {
            Value::Tensor(t) => t,
            _ => panic!("a tensor"),
        })
        .collect();
    (s, outs)
}

/// Bit patterns of a float tensor (float16 as f16 bits, float32 as f32 bits), NaNs as one.
fn bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DataType::Float16 => t
            .as_slice::<half::f16>()
            .unwrap()
            .iter()
            .map(|v| {
                if v.is_nan() {
                    u32::MAX
                } else {
                    v.to_bits() as u32
                }
            })
            .collect(),
        DataType::Float => t
            .to_f32_vec()
            .unwrap()
            .iter()
            .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
            .collect(),
        dt => panic!("not a float tensor: {dt}"),
    }
}

/// Runs `case` unconverted on each f16 store and on the CPU: the node must run on WebGPU and
/// every output agree bit for bit, element type included.
#[track_caller]
fn check_exact_typed(case: Case) {
    let (_, want) = run_typed(&case, vec![cpu()]);
    for (f16_storage, g) in half_gpus() {
        let (s, got) = run_typed(&case, vec![g, cpu()]);
        assert_eq!(
            s.partition().assignments[0].2,
            "webgpu",
            "{} (f16 storage: {f16_storage}) did not run on WebGPU: {:?}",
            case.op,
            s.partition().fallbacks
        );
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let what = format!("{} (f16 storage: {f16_storage}) output {k}", case.op);
            assert_eq!(g.dtype(), w.dtype(), "{what}: element type");
            assert_eq!(g.shape(), w.shape(), "{what}: shape");
            let (gb, wb) = (bits(g), bits(w));
            for (i, (a, b)) in gb.iter().zip(&wb).enumerate() {
                assert_eq!(
                    a,
                    b,
                    "{what}: element {i}: webgpu {:?} vs cpu {:?}",
                    g.to_f32_vec().unwrap()[i],
                    w.to_f32_vec().unwrap()[i]
                );
            }
        }
    }
}

/// `case` with its float inputs as float16: exactly (copies are exact, on both stores), then
/// through the harness's float16 check.
#[track_caller]
fn both(case: Case) {
    check_exact_typed(case.halved());
    case.check_half();
}

// ----------------------------------------------------------------------------- views

#[test]
fn views_take_float16() {
    both(Case::new("Reshape", vec![ft(&[3, 5, 7], 1)]).consts(vec![ints(&[5, -1])]));
    both(Case::new("Flatten", vec![ft(&[3, 5, 7], 2)]).attr(ai("axis", 2)));
    both(Case::new("Squeeze", vec![ft(&[3, 1, 7, 1], 3)]).consts(vec![ints(&[1, -1])]));
    both(Case::new("Unsqueeze", vec![ft(&[3, 7], 4)]).consts(vec![ints(&[0, 3])]));
}

// ----------------------------------------------------------------------------- Transpose, Slice

#[test]
fn transpose_float16_over_odd_shapes() {
    let cases: &[(&[usize], Option<&[i64]>)] = &[
        (&[3, 5], None),
        (&[7], None),
        (&[2, 3, 5], Some(&[2, 0, 1])),
        (&[1, 7, 3, 5], Some(&[0, 3, 1, 2])),
        (&[3, 1, 5, 7, 3], Some(&[4, 2, 0, 3, 1])),
    ];
    for (k, (shape, perm)) in cases.iter().enumerate() {
        let mut c = Case::new("Transpose", vec![ft(shape, k as u32)]);
        if let Some(p) = perm {
            c = c.attr(ais("perm", p));
        }
        both(c);
    }
}

#[test]
fn slice_float16_with_steps_and_odd_offsets() {
    // (shape, starts, ends, axes, steps)
    type S<'a> = (&'a [usize], &'a [i64], &'a [i64], &'a [i64], &'a [i64]);
    let cases: &[S] = &[
        (&[7, 9], &[1, 0], &[6, 9], &[0, 1], &[2, 3]),
        (&[7, 9], &[1], &[8], &[1], &[1]),
        (&[11], &[9], &[-12], &[0], &[-2]),
        (&[3, 5, 7], &[-1, 1], &[0, 6], &[-1, 1], &[-3, 2]),
        (&[5, 7], &[2], &[2], &[0], &[1]),
    ];
    for (k, (shape, s, e, a, st)) in cases.iter().enumerate() {
        both(Case::new("Slice", vec![ft(shape, k as u32)]).consts(vec![
            ints(s),
            ints(e),
            ints(a),
            ints(st),
        ]));
    }
}

// ----------------------------------------------------------------------------- Gather

#[test]
fn gather_float16_on_several_axes() {
    let cases: Vec<(&[usize], i64, Tensor)> = vec![
        (&[5, 7], 0, it(&[3], vec![3, 0, 4])),
        (&[5, 7], 1, it(&[2, 2], vec![6, 1, 0, -1])),
        (&[3, 5, 7], 2, it(&[3], vec![5, 0, 3])),
        (&[3, 5, 7], -2, it(&[], vec![-1])),
        (&[9], 0, it(&[5], vec![8, 1, 1, 0, 7])),
    ];
    for (k, (shape, axis, idx)) in cases.into_iter().enumerate() {
        both(
            Case::new("Gather", vec![ft(shape, k as u32)])
                .attr(ai("axis", axis))
                .consts(vec![Some(idx)]),
        );
    }
}

// ----------------------------------------------------------------------------- Concat, Split

#[test]
fn concat_float16_at_odd_offsets() {
    let cases: &[(&[&[usize]], i64)] = &[
        // rows: one dispatch per input
        (&[&[3, 5], &[3, 7]], 1),
        // the outermost axis: odd parts at odd offsets (shader), the tail (a rounded copy)
        (&[&[3, 5], &[4, 5]], 0),
        (&[&[1, 3], &[1, 5], &[1, 4]], 1),
        (&[&[2], &[4], &[3]], 0),
        (&[&[5], &[3], &[0], &[6]], 0),
        (&[&[1, 3, 1], &[1, 2, 1], &[1, 3, 1]], -2),
        (&[&[2, 3, 5], &[1, 3, 5], &[3, 3, 5]], 0),
    ];
    for (k, (shapes, axis)) in cases.iter().enumerate() {
        let feeds = shapes
            .iter()
            .enumerate()
            .map(|(j, s)| ft(s, (10 * k + j) as u32))
            .collect();
        both(Case::new("Concat", feeds).attr(ai("axis", *axis)));
    }
}

#[test]
fn split_float16_into_odd_pieces() {
    // the outermost axis: even parts by buffer copy, odd ones by the shader, a rounded tail
    both(
        Case::new("Split", vec![ft(&[7, 3], 1)])
            .opset(13)
            .consts(vec![ints(&[2, 1, 4])])
            .outputs(3),
    );
    both(
        Case::new("Split", vec![ft(&[1031], 2)])
            .attr(ai("num_outputs", 4))
            .outputs(4),
    );
    both(
        Case::new("Split", vec![ft(&[13], 3)])
            .opset(13)
            .consts(vec![ints(&[3, 0, 5, 5])])
            .outputs(4),
    );
    // rows
    both(
        Case::new("Split", vec![ft(&[5, 7], 4)])
            .opset(13)
            .attr(ai("axis", 1))
            .consts(vec![ints(&[3, 4])])
            .outputs(2),
    );
    both(
        Case::new("Split", vec![ft(&[2, 9, 3], 5)])
            .opset(11)
            .attr(ai("axis", -2))
            .attr(ais("split", &[3, 1, 5]))
            .outputs(3),
    );
}

// ----------------------------------------------------------------------------- Expand

#[test]
fn expand_float16_broadcasts() {
    let cases: &[(&[usize], &[i64])] = &[
        (&[3, 1], &[2, 3, 5]),
        (&[1], &[7]),
        (&[2, 1, 3], &[2, 5, 3]),
        (&[1, 7, 1], &[3, 1, 7, 9]),
        (&[3, 5], &[3, 5]),
    ];
    for (k, (shape, target)) in cases.iter().enumerate() {
        both(Case::new("Expand", vec![ft(shape, k as u32)]).consts(vec![ints(target)]));
    }
}

// ----------------------------------------------------------------------------- Cast

/// Values that f16 rounds: more precision than f16 holds, halfway cases, subnormals, the edge
/// of the range (65504 is the largest f16, 65520 and up round to infinity), infinities, NaN.
fn cast_values() -> Tensor {
    let mut v = vals(61, 7);
    v.extend(vals(20, 8).iter().map(|x| x * 1e-5)); // subnormal f16
    v.extend([
        1.0 + 1.0 / 2048.0,        // a tie: to even (1.0)
        1.0 + 3.0 / 2048.0,        // a tie: to even (up)
        1.0 + 1.0 / 2048.0 + 1e-7, // just past the tie
        0.1,
        -std::f32::consts::PI,
        2f32.powi(-24), // the smallest subnormal
        2f32.powi(-25), // a tie: to zero
        1.5 * 2f32.powi(-25),
        6.1e-5,
        65504.0,
        -65504.0,
        65519.0, // rounds to 65504
        65520.0, // rounds to infinity
        70000.0,
        -1e9,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        1e-30,
    ]);
    let n = v.len();
    Tensor::from_vec(&[n], v).unwrap()
}

#[test]
fn cast_f32_to_f16_rounds_like_the_cpu() {
    let x = cast_values();
    // the CPU's reference: round to nearest even, infinity past the range
    let (_, want) = run_typed(
        &Case::new("Cast", vec![x.clone()]).attr(ai("to", 10)),
        vec![cpu()],
    );
    let w = want[0].to_f32_vec().unwrap();
    let xv = x.to_f32_vec().unwrap();
    let at = |v: f32| w[xv.iter().position(|&u| u == v).unwrap()];
    assert_eq!(at(65519.0), 65504.0);
    assert_eq!(at(65520.0), f32::INFINITY);
    assert_eq!(at(-1e9), f32::NEG_INFINITY);
    assert_eq!(at(2f32.powi(-25)), 0.0);
    check_exact_typed(
        Case::new("Cast", vec![x.clone()])
            .attr(ai("to", 10))
            .opset(19),
    );
    check_exact_typed(
        Case::new("Cast", vec![ft(&[3, 5, 7], 3)])
            .attr(ai("to", 10))
            .opset(13),
    );
    // the shared provider (f16 storage where the adapter has it), through the harness
    Case::new("Cast", vec![ft(&[257], 4)])
        .attr(ai("to", 10))
        .atol(2e-3)
        .check();
}

#[test]
fn cast_f16_to_f32_is_exact() {
    // every f16 value class: normal, subnormal, the largest, infinities, NaN (halved: exact)
    check_exact_typed(
        Case::new("Cast", vec![cast_values()])
            .attr(ai("to", 1))
            .halved(),
    );
    Case::new("Cast", vec![ft(&[3, 5, 7], 5)])
        .attr(ai("to", 1))
        .check_half();
    // to its own type: a view
    both(Case::new("Cast", vec![ft(&[3, 7], 6)]).attr(ai("to", 10)));
}

#[test]
fn cast_to_other_types_stays_on_the_cpu() {
    for to in [6, 7, 9, 11, 16] {
        let c = Case::new("Cast", vec![ft(&[3, 5], 1)])
            .attr(ai("to", to))
            .halved();
        let (_, want) = run_typed(&c, vec![cpu()]);
        for (_, g) in half_gpus() {
            let (s, got) = run_typed(&c, vec![g, cpu()]);
            assert_eq!(s.partition().assignments[0].2, "cpu", "Cast to {to}");
            assert_eq!(got[0].dtype(), want[0].dtype());
            assert_eq!(got[0].to_f32_vec().unwrap(), want[0].to_f32_vec().unwrap());
        }
    }
}

// ----------------------------------------------------------------------------- in a graph

fn node(
    op: &str,
    ins: &[&str],
    outs: &[&str],
    attrs: Vec<nxrt_core::proto::AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: outs[0].into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// f32 in, cast to f16 on the device, moved around by every data kernel there, cast back:
/// every node on WebGPU, the result bit for bit the CPU's (values past f16's range included,
/// which must read as infinity after the f16 round trip on both stores).
#[test]
fn float16_stays_on_the_device_through_the_data_kernels() {
    let shape = [3, 5, 7];
    let mut x = vals(105, 9);
    x[4] = 70000.0;
    x[17] = -65520.0;
    x[50] = 65519.0;
    x[33] = 1e-6;
    let x = Tensor::from_vec(&shape, x).unwrap();
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                node("Cast", &["x"], &["h"], vec![ai("to", 10)]),
                node("Transpose", &["h"], &["t"], vec![ais("perm", &[2, 0, 1])]),
                node("Slice", &["t", "s0", "s1", "s2", "s3"], &["sl"], vec![]),
                node("Concat", &["t", "sl"], &["c"], vec![ai("axis", 0)]),
                node("Gather", &["c", "gi"], &["g"], vec![ai("axis", 2)]),
                node(
                    "Split",
                    &["g"],
                    &["p0", "p1"],
                    vec![ai("axis", 0), ai("num_outputs", 2)],
                ),
                node("Expand", &["p1", "es"], &["e"], vec![]),
                node("Reshape", &["e", "rs"], &["r"], vec![]),
                node("Concat", &["r", "p0"], &["cc"], vec![ai("axis", 0)]),
                node("Cast", &["cc"], &["y"], vec![ai("to", 1)]),
            ],
            initializer: vec![
                init("s0", &it(&[1], vec![1])),
                init("s1", &it(&[1], vec![6])),
                init("s2", &it(&[1], vec![0])),
                init("s3", &it(&[1], vec![2])),
                init("gi", &it(&[4], vec![4, 0, 2, 4])),
                init("es", &it(&[4], vec![2, 5, 3, 4])),
                init("rs", &it(&[3], vec![-1, 3, 4])),
            ],
            input: vec![vi("x", DataType::Float, &shape)],
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
    let feeds = || vec![("x".to_string(), Value::Tensor(x.clone()))];
    let c = Session::new(load(), vec![cpu()], &SessionOptions::default()).unwrap();
    let want = pollster::block_on(c.run_async(feeds())).unwrap();
    let Value::Tensor(want) = &want[0].1 else {
        panic!("a tensor")
    };
    assert!(want.to_f32_vec().unwrap().iter().any(|v| v.is_infinite()));
    for (f16_storage, g) in half_gpus() {
        let s = Session::new(load(), vec![g, cpu()], &SessionOptions::default()).unwrap();
        let placed = &s.partition().assignments;
        assert!(
            placed.iter().all(|(_, _, p)| p == "webgpu"),
            "f16 storage {f16_storage}: {placed:?}"
        );
        let got = pollster::block_on(s.run_async(feeds())).unwrap();
        let Value::Tensor(got) = &got[0].1 else {
            panic!("a tensor")
        };
        assert_eq!(got.dtype(), DataType::Float);
        assert_eq!(got.shape(), want.shape());
        assert_eq!(bits(got), bits(want), "f16 storage {f16_storage}");
    }
}

/// With f16 storage, joins and cuts at even element offsets stay buffer copies (no dispatch),
/// and so does a rounded odd tail; an odd offset takes the copy shader.
#[test]
fn float16_copies_stay_buffer_copies_where_aligned() {
    let Some(p) = pollster::block_on(nxrt_wasm::webgpu::WebGpuProvider::with_f16(0, true)).ok()
    else {
        eprintln!("skipped: no WebGPU adapter here");
        return;
    };
    if !p.gpu().half() {
        eprintln!("skipped: this adapter has no shader-f16");
        return;
    }
    let p = Arc::new(p);
    let dispatches = |case: Case| {
        let before = p.gpu().stats().dispatches;
        let (s, _) = run_typed(&case.halved(), vec![p.clone(), cpu()]);
        assert_eq!(s.partition().assignments[0].2, "webgpu", "{}", case.op);
        p.gpu().stats().dispatches - before
    };
    let concat = |shapes: &[&[usize]]| {
        let feeds = shapes.iter().map(|s| ft(s, 1)).collect();
        Case::new("Concat", feeds).attr(ai("axis", 0))
    };
    assert_eq!(dispatches(concat(&[&[4], &[6], &[3]])), 0);
    assert_eq!(dispatches(concat(&[&[2, 3], &[4, 3]])), 0);
    // odd parts at odd offsets: one dispatch each
    assert_eq!(dispatches(concat(&[&[3], &[5], &[4]])), 2);
    let split = |n: usize, parts: &[i64]| {
        Case::new("Split", vec![ft(&[n], 2)])
            .opset(13)
            .consts(vec![ints(parts)])
            .outputs(parts.len())
    };
    assert_eq!(dispatches(split(13, &[4, 6, 3])), 0);
    assert_eq!(dispatches(split(13, &[3, 5, 5])), 2);
    // Cast to the input's own type: a view
    assert_eq!(
        dispatches(Case::new("Cast", vec![ft(&[5], 3)]).attr(ai("to", 10))),
        0
    );
}

/// An f16 sum past f16's range is infinite, on both stores: the Add's store makes it infinite
/// (f32 words) or converts to an f16 infinity (f16 storage), and the Cast to float32 reads it.
#[test]
fn cast_reads_out_of_range_f16_words_as_infinity() {
    let h = |v: Vec<f32>| to_half(&Tensor::from_vec(&[v.len()], v).unwrap());
    let a = h(vec![60000.0, -60000.0, 30000.0, 65504.0, 1.0]);
    let b = h(vec![60000.0, -60000.0, 30000.0, 16.0, 2.0]);
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                node("Add", &["a", "b"], &["s"], vec![]),
                node("Cast", &["s"], &["y"], vec![ai("to", 1)]),
            ],
            input: vec![
                vi("a", DataType::Float16, &[5]),
                vi("b", DataType::Float16, &[5]),
            ],
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
            ("a".to_string(), Value::Tensor(a.clone())),
            ("b".to_string(), Value::Tensor(b.clone())),
        ]
    };
    let c = Session::new(load(), vec![cpu()], &SessionOptions::default()).unwrap();
    let want = pollster::block_on(c.run_async(feeds())).unwrap();
    let Value::Tensor(want) = &want[0].1 else {
        panic!("a tensor")
    };
    assert_eq!(
        want.to_f32_vec().unwrap(),
        [
            f32::INFINITY,
            f32::NEG_INFINITY,
            60000.0,
            f32::INFINITY,
            3.0
        ]
    );
    for (f16_storage, g) in half_gpus() {
        let s = Session::new(load(), vec![g, cpu()], &SessionOptions::default()).unwrap();
        let placed = &s.partition().assignments;
        assert!(placed.iter().all(|(_, _, p)| p == "webgpu"), "{placed:?}");
        let got = pollster::block_on(s.run_async(feeds())).unwrap();
        let Value::Tensor(got) = &got[0].1 else {
            panic!("a tensor")
        };
        assert_eq!(bits(got), bits(want), "f16 storage: {f16_storage}");
    }
}

/// A fused float16 chain rounds after every op, as the CPU does: `(a + b) - a` where `a + b`
/// is not an f16 value gives the rounded sum's difference, and a MatMul's product is rounded
/// before the Add fused into it. Bit for bit on both stores.
#[test]
fn fused_float16_chains_round_after_every_op() {
    let h = |s: &[usize], v: Vec<f32>| to_half(&Tensor::from_vec(s, v).unwrap());
    let a = h(&[4], vec![1.0, 3.0, 1000.0, 2048.0]);
    let b = h(&[4], vec![3.0 / 4096.0, 0.0009, 0.3, 1.0]);
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                node("Add", &["a", "b"], &["s"], vec![]),
                node("Sub", &["s", "a"], &["d"], vec![]),
                node("MatMul", &["a2", "b2"], &["mm"], vec![]),
                node("Sub", &["mm", "c"], &["e"], vec![]),
            ],
            input: vec![
                vi("a", DataType::Float16, &[4]),
                vi("b", DataType::Float16, &[4]),
                vi("a2", DataType::Float16, &[1, 2]),
                vi("b2", DataType::Float16, &[2, 1]),
                vi("c", DataType::Float16, &[1, 1]),
            ],
            output: vec![
                ValueInfoProto {
                    name: "d".into(),
                    ..Default::default()
                },
                ValueInfoProto {
                    name: "e".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    // 1 * 1 + 1 * 3/4096 = 1.000732 is not an f16: rounded to 1 + 2^-10 before c is taken away
    let feeds = || {
        vec![
            ("a".to_string(), Value::Tensor(a.clone())),
            ("b".to_string(), Value::Tensor(b.clone())),
            ("a2".to_string(), Value::Tensor(h(&[1, 2], vec![1.0, 1.0]))),
            (
                "b2".to_string(),
                Value::Tensor(h(&[2, 1], vec![1.0, 3.0 / 4096.0])),
            ),
            ("c".to_string(), Value::Tensor(h(&[1, 1], vec![1.0]))),
        ]
    };
    let load = || loader::load_model(&m, &loader::NoExternalData).unwrap();
    let c = Session::new(load(), vec![cpu()], &SessionOptions::default()).unwrap();
    let want = pollster::block_on(c.run_async(feeds())).unwrap();
    let Value::Tensor(d0) = &want[0].1 else {
        panic!("a tensor")
    };
    assert_eq!(
        d0.to_f32_vec().unwrap()[0],
        1.0 / 1024.0,
        "the CPU rounds the sum"
    );
    for (f16_storage, g) in half_gpus() {
        let s = Session::new(load(), vec![g, cpu()], &SessionOptions::default()).unwrap();
        let placed = &s.partition().assignments;
        assert!(placed.iter().all(|(_, _, p)| p == "webgpu"), "{placed:?}");
        let got = pollster::block_on(s.run_async(feeds())).unwrap();
        for ((n, gv), (_, wv)) in got.iter().zip(&want) {
            let (Value::Tensor(gt), Value::Tensor(wt)) = (gv, wv) else {
                panic!("tensors")
            };
            assert_eq!(bits(gt), bits(wt), "{n}, f16 storage: {f16_storage}");
        }
    }
}
