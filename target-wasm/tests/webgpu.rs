//! The WebGPU provider's kernels, natively on whatever adapter wgpu finds (CI: Mesa's lavapipe
//! through Vulkan). Each case runs one node on [webgpu, cpu] and on the CPU alone and compares;
//! sizes are odd on purpose (1, primes, non-multiples of the workgroup and of the MatMul tile),
//! with broadcasting, and one tensor spans more workgroups than one dispatch dimension allows.
//! Without an adapter every test prints why and returns.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use nxrt_core::kernels::broadcast_shapes;
use nxrt_core::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};
use nxrt_core::provider::ExecutionProvider;
use nxrt_core::{loader, DataType, Session, SessionOptions, Tensor, Value};
use prost::Message;

#[test]
fn binary_ops_broadcast_over_odd_shapes() {
    let shapes: &[(&[usize], &[usize])] = &[
        (&[1], &[1]),
        (&[7, 13], &[7, 13]),
        (&[3, 1, 5], &[4, 1]),
        (&[2, 3, 4, 5], &[5]),
        (&[257], &[]),
        (&[1, 1031], &[3, 1]),
    ];
    for op in ["Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu"] {
        for (k, (a, b)) in shapes.iter().enumerate() {
            // PRelu's slope broadcasts one way only
            if op == "PRelu" && broadcast_shapes(a, b).unwrap() != a.to_vec() {
                continue;
            }
            Case::new(op, vec![ft(a, k as u32), ft(b, 100 + k as u32)]).check();
        }
        // float16 (a broadcast and an odd length)
        if op != "PRelu" {
            Case::new(op, vec![ft(&[3, 1, 5], 1), ft(&[3, 4, 1], 2)]).check_half();
        }
        Case::new(op, vec![ft(&[1031], 3), ft(&[1031], 4)]).check_half();
    }
    // Pow: non-negative bases with real exponents, negative bases with integral ones
    let base = Tensor::from_vec(&[2, 3], vec![-2.0f32, -1.5, 0.5, 3.0, -0.25, 2.0]).unwrap();
    let exp = Tensor::from_vec(&[3], vec![2.0f32, 3.0, -1.0]).unwrap();
    Case::new("Pow", vec![base, exp]).check();
}

#[test]
fn unary_ops_match_the_cpu() {
    let x = ft(&[3, 67], 7);
    for op in [
        "Relu",
        "Sigmoid",
        "Tanh",
        "Exp",
        "Neg",
        "Abs",
        "Floor",
        "Ceil",
        "Sin",
        "Cos",
        "Erf",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Celu",
        "HardSigmoid",
        "HardSwish",
        "Softplus",
        "Softsign",
        "Gelu",
        "Round",
        "Sign",
        "Mish",
    ] {
        Case::new(op, vec![x.clone()]).opset(20).check();
        Case::new(op, vec![x.clone()]).opset(20).check_half();
    }
    let pos =
        Tensor::from_vec(&[131], vals(131, 3).iter().map(|v| v.abs() + 0.1).collect()).unwrap();
    for op in ["Log", "Sqrt", "Reciprocal"] {
        Case::new(op, vec![pos.clone()]).check();
    }
    Case::new("LeakyRelu", vec![x.clone()])
        .attr(af("alpha", 0.3))
        .check();
    Case::new("Clip", vec![x.clone()])
        .consts(vec![
            Some(Tensor::scalar(-0.5f32)),
            Some(Tensor::scalar(0.75f32)),
        ])
        .check();
    Case::new("Clip", vec![x.clone()])
        .consts(vec![None, Some(Tensor::scalar(0.25f32))])
        .check();
    Case::new("Clip", vec![x])
        .consts(vec![
            Some(Tensor::scalar(-0.5f32)),
            Some(Tensor::scalar(0.75f32)),
        ])
        .check_half();
}

#[test]
fn where_selects_with_a_broadcast_condition() {
    let c = Tensor::from_vec(&[3, 1], vec![true, false, true]).unwrap();
    Case::new("Where", vec![c.clone(), ft(&[3, 5], 1), ft(&[5], 2)]).check();
    Case::new("Where", vec![c, ft(&[3, 5], 1), ft(&[5], 2)]).check_half();
}

#[test]
fn matmul_over_odd_sizes_and_broadcast_batches() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[1, 1], &[1, 1]),
        (&[7, 13], &[13, 5]),
        (&[65, 17], &[17, 131]),
        (&[2, 3, 33, 19], &[19, 70]),
        (&[3, 1, 9, 4], &[2, 4, 11]),
        (&[13], &[13, 6]),
        (&[4, 13], &[13]),
        (&[1, 128, 384], &[384, 96]),
        // up to four rows: the matrix-vector kernel
        (&[2, 37], &[37, 1000]),
        (&[3, 5], &[5, 17]),
        (&[5, 1, 64], &[5, 64, 33]),
        (&[1, 1, 300], &[300, 7]),
    ];
    for (k, (a, b)) in cases.iter().enumerate() {
        Case::new("MatMul", vec![ft(a, k as u32), ft(b, 50 + k as u32)])
            .atol(1e-4)
            .check();
    }
    // float16: the tiled and the matrix-vector kernel, f16 words and f32 words
    for (k, (a, b)) in [(&[65, 17][..], &[17, 131][..]), (&[2, 37], &[37, 100])]
        .iter()
        .enumerate()
    {
        Case::new("MatMul", vec![ft(a, k as u32), ft(b, 50 + k as u32)]).check_half();
    }
}

#[test]
fn gemm_with_transposes_alpha_beta_and_a_broadcast_c() {
    for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let a = if ta == 1 {
            ft(&[11, 7], 1)
        } else {
            ft(&[7, 11], 1)
        };
        let b = if tb == 1 {
            ft(&[67, 11], 2)
        } else {
            ft(&[11, 67], 2)
        };
        for c in [ft(&[67], 3), ft(&[7, 1], 4), ft(&[7, 67], 5)] {
            Case::new("Gemm", vec![a.clone(), b.clone()])
                .consts(vec![Some(c)])
                .attr(ai("transA", ta))
                .attr(ai("transB", tb))
                .attr(af("alpha", 0.75))
                .attr(af("beta", 1.5))
                .check();
        }
    }
    Case::new("Gemm", vec![ft(&[5, 3], 1), ft(&[3, 4], 2)]).check();
    // a classifier head (one row, B transposed, K split over the lanes) and three rows
    for (m, tb) in [(1, 1), (1, 0), (3, 1), (3, 0)] {
        let b = if tb == 1 {
            ft(&[1000, 301], 2)
        } else {
            ft(&[301, 1000], 2)
        };
        Case::new("Gemm", vec![ft(&[m, 301], 1), b])
            .consts(vec![Some(ft(&[1000], 3))])
            .attr(ai("transB", tb))
            .atol(1e-4)
            .check();
    }
}

#[test]
fn data_movement_ops() {
    let x = ft(&[2, 3, 5, 7], 9);
    Case::new("Transpose", vec![x.clone()])
        .attr(ais("perm", &[0, 2, 3, 1]))
        .check();
    Case::new("Transpose", vec![x.clone()]).check();
    Case::new("Slice", vec![x.clone()])
        .consts(vec![
            Some(it(&[2], vec![1, -1])),
            Some(it(&[2], vec![4, -100])),
            Some(it(&[2], vec![2, 3])),
            Some(it(&[2], vec![2, -2])),
        ])
        .check();
    Case::new("Slice", vec![x.clone()])
        .consts(vec![Some(it(&[1], vec![1])), Some(it(&[1], vec![3]))])
        .check();
    Case::new("Gather", vec![x.clone()])
        .consts(vec![Some(it(&[2, 2], vec![4, -1, 0, 2]))])
        .attr(ai("axis", 2))
        .check();
    Case::new("Gather", vec![x.clone()])
        .consts(vec![Some(it(&[], vec![1]))])
        .check();
    Case::new(
        "Concat",
        vec![ft(&[3, 5], 1), ft(&[2, 5], 2), ft(&[1, 5], 3)],
    )
    .attr(ai("axis", 0))
    .check();
    Case::new("Concat", vec![ft(&[2, 3, 5], 1), ft(&[2, 1, 5], 2)])
        .attr(ai("axis", -2))
        .check();
    Case::new("Reshape", vec![x.clone()])
        .consts(vec![Some(it(&[3], vec![0, -1, 7]))])
        .check();
    Case::new("Flatten", vec![x.clone()])
        .attr(ai("axis", 2))
        .check();
    Case::new("Unsqueeze", vec![x.clone()])
        .consts(vec![Some(it(&[2], vec![0, -1]))])
        .check();
    Case::new("Squeeze", vec![ft(&[1, 3, 1, 2], 4)])
        .consts(vec![Some(it(&[1], vec![2]))])
        .check();
}

#[test]
fn one_dimension_of_workgroups_is_not_a_limit() {
    let Some(g) = gpu() else { return };
    let max = g.gpu().summary().max_compute_workgroups_per_dimension as usize;
    // more 256-wide workgroups than one dimension holds
    let n = max * 256 + 3;
    let x = Tensor::from_vec(&[n], (0..n).map(|i| (i % 1000) as f32 - 500.0).collect()).unwrap();
    let (_, got, _) = Case::new("Relu", vec![x]).run_on(vec![g, cpu()]);
    assert_eq!(got.len(), n);
    for (i, v) in got.iter().enumerate() {
        let want = ((i % 1000) as f32 - 500.0).max(0.0);
        assert_eq!(*v, want, "element {i}");
    }
}

#[test]
fn a_chain_stays_on_the_device_and_is_read_back_once() {
    let Some(g) = fresh_gpu() else { return };
    // x -> MatMul(w) -> Add(b) -> Relu -> Shape-free chain -> y
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "chain".into(),
            node: vec![
                NodeProto {
                    op_type: "MatMul".into(),
                    name: "mm".into(),
                    input: vec!["x".into(), "w".into()],
                    output: vec!["h".into()],
                    ..Default::default()
                },
                NodeProto {
                    op_type: "Add".into(),
                    name: "add".into(),
                    input: vec!["h".into(), "b".into()],
                    output: vec!["a".into()],
                    ..Default::default()
                },
                NodeProto {
                    op_type: "Relu".into(),
                    name: "relu".into(),
                    input: vec!["a".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                },
            ],
            initializer: vec![init("w", &ft(&[9, 4], 1)), init("b", &ft(&[4], 2))],
            input: vec![vi("x", DataType::Float, &[3, 9])],
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let s = Session::new(
        loader::load_model(&m, &loader::NoExternalData).unwrap(),
        vec![g.clone(), cpu()],
        &SessionOptions::default(),
    )
    .unwrap();
    let r = s.partition();
    assert!(
        r.assignments.iter().all(|(_, _, p)| p == "webgpu"),
        "{:?}",
        r.assignments
    );
    // x, w, b up; y down
    assert_eq!(r.copies, 4, "{:?}", r.copy_list);
    let feeds = || vec![("x".to_string(), Value::Tensor(ft(&[3, 9], 3)))];
    let _ = pollster::block_on(s.run_async(feeds())).unwrap();
    let after_one = g.gpu().stats();
    // MatMul with Add and Relu fused into its epilogue: one dispatch
    assert_eq!(after_one.dispatches, 1, "{after_one:?}");
    let _ = pollster::block_on(s.run_async(feeds())).unwrap();
    let after_two = g.gpu().stats();
    // the weights w and b were uploaded by the first run and kept: only x goes up again
    assert_eq!(after_one.uploads, 3);
    assert_eq!(after_two.uploads - after_one.uploads, 1);
    // the second run reuses the first run's buffers: nothing new is allocated
    assert_eq!(after_two.live_bytes, after_one.live_bytes);
    assert!(after_one.live_bytes > 0);
    // release: the pool is emptied and, once the session is gone, nothing is left
    s.release_cached();
    drop(s);
    g.release_cached();
    assert_eq!(g.gpu().stats().live_bytes, 0, "{:?}", g.gpu().stats());
}

#[test]
fn a_lost_device_is_an_error_and_a_new_provider_works() {
    let Some(g) = fresh_gpu() else { return };
    let case = Case::new("Relu", vec![ft(&[17], 1)]);
    let m = loader::load_model(&case.model(), &loader::NoExternalData).unwrap();
    let s = Session::new(m, vec![g.clone(), cpu()], &SessionOptions::default()).unwrap();
    let feeds = || vec![("x0".to_string(), Value::Tensor(ft(&[17], 1)))];
    pollster::block_on(s.run_async(feeds())).unwrap();
    let device_line = |s: &Session| {
        let m = s.mechanisms();
        assert_eq!(m[0].tier, nxrt_core::governor::Tier::Host);
        m.into_iter()
            .find(|r| r.tier == nxrt_core::governor::Tier::Device(0))
            .expect("the device tier's mechanism is reported")
    };
    let before = device_line(&s);
    assert!(
        before.current.starts_with("webgpu buffer pool"),
        "{before:?}"
    );
    assert_eq!(before.failure, None);
    g.lose_device_for_test();
    let after = device_line(&s);
    assert!(
        after
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("device lost")),
        "the dead pool is reported dead: {after:?}"
    );
    let e = pollster::block_on(s.run_async(feeds())).unwrap_err();
    assert_eq!(e.kind(), "device_lost", "{e}");
    assert!(e.to_string().contains("webgpu device was lost"), "{e}");
    // every later call on it fails the same way
    let e = pollster::block_on(s.run_async(feeds())).unwrap_err();
    assert_eq!(e.kind(), "device_lost", "{e}");
    // dropping the session and the provider frees what the old device held
    let old = std::sync::Arc::downgrade(g.gpu());
    drop(s);
    drop(g);
    assert!(
        old.upgrade().is_none(),
        "the lost device's buffers and context are gone"
    );
    // a new provider (a new session) works
    let Some(g2) = fresh_gpu() else { return };
    let m = loader::load_model(&case.model(), &loader::NoExternalData).unwrap();
    let s2 = Session::new(m, vec![g2, cpu()], &SessionOptions::default()).unwrap();
    pollster::block_on(s2.run_async(feeds())).unwrap();
}

#[test]
fn device_memory_is_leased_from_the_session_and_its_budget_binds() {
    use nxrt_core::governor::{Holder, Tier};
    let Some(g) = fresh_gpu() else { return };
    let case = Case::new("Relu", vec![ft(&[1024], 1)]);
    let m = loader::load_model(&case.model(), &loader::NoExternalData).unwrap();
    let s = Session::new(m, vec![g.clone(), cpu()], &SessionOptions::default()).unwrap();
    let feeds = || vec![("x0".to_string(), Value::Tensor(ft(&[1024], 1)))];
    let want = pollster::block_on(s.run_async(feeds())).unwrap();
    let dev = s.memory_account().budget(Tier::Device(0));
    // the input's upload and Relu's output: 4 KiB each, returned when the run ends
    assert!(dev.peak() >= 8192, "device peak {}", dev.peak());
    assert_eq!((dev.in_use(), dev.leases()), (0, 0));
    let snap = s.memory_snapshot();
    assert!(snap
        .tiers
        .iter()
        .any(|t| t.tier == Tier::Device(0) && t.peak >= 8192));
    // under a 6 KiB device budget the second tensor is refused before it is allocated
    dev.set_limit(Some(6 << 10));
    let e = pollster::block_on(s.run_async(feeds())).unwrap_err();
    match &e {
        nxrt_core::Error::OutOfMemory {
            tier, requested, ..
        } => {
            assert!(tier.contains("device 0 memory of session"), "{e}");
            assert_eq!(*requested, 4096);
        }
        _ => panic!("{e}"),
    }
    assert_eq!(dev.in_use(), 0, "a refused run holds nothing");
    let h = s.memory_account().holder(Tier::Device(0), Holder::Other);
    assert_eq!(h.in_use(), 0);
    // with room again, the same answer
    dev.set_limit(None);
    let got = pollster::block_on(s.run_async(feeds())).unwrap();
    let (a, b) = (&want[0].1, &got[0].1);
    assert_eq!(
        a.as_tensor().unwrap().to_f32_vec().unwrap(),
        b.as_tensor().unwrap().to_f32_vec().unwrap()
    );
}

#[test]
fn tensors_beyond_the_binding_limit_are_a_clear_error() {
    let Some(g) = gpu() else { return };
    let lim = g.gpu().summary().max_storage_buffer_binding_size;
    let e = g
        .gpu()
        .buffer(lim + 4, "a test tensor")
        .expect_err("an error above the limit")
        .to_string();
    assert!(e.contains("maxStorageBufferBindingSize"), "{e}");
}

/// A graph of `nodes` (op, inputs, output) over float inputs `x0..` of the given shapes, with
/// output `y`.
fn graph_model(nodes: &[(&str, &[&str], &str)], inputs: &[&[usize]]) -> Vec<u8> {
    ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes
                .iter()
                .enumerate()
                .map(|(k, (op, ins, out))| NodeProto {
                    op_type: op.to_string(),
                    name: format!("n{k}"),
                    input: ins.iter().map(|s| s.to_string()).collect(),
                    output: vec![out.to_string()],
                    ..Default::default()
                })
                .collect(),
            input: inputs
                .iter()
                .enumerate()
                .map(|(k, s)| vi(&format!("x{k}"), DataType::Float, s))
                .collect(),
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Runs `model` on a fresh provider and on the CPU; returns the dispatches of one WebGPU run.
fn fused_run(model: &[u8], inputs: &[&[usize]]) -> Option<u64> {
    let g = fresh_gpu()?;
    let feeds = || -> Vec<(String, Value)> {
        inputs
            .iter()
            .enumerate()
            .map(|(k, s)| (format!("x{k}"), Value::Tensor(ft(s, k as u32 + 1))))
            .collect()
    };
    let load = || loader::load_model(model, &loader::NoExternalData).unwrap();
    let s = Session::new(load(), vec![g.clone(), cpu()], &SessionOptions::default()).unwrap();
    let before = g.gpu().stats().dispatches;
    let got = pollster::block_on(s.run_async(feeds())).unwrap();
    let dispatches = g.gpu().stats().dispatches - before;
    let c = Session::new(load(), vec![cpu()], &SessionOptions::default()).unwrap();
    let want = pollster::block_on(c.run_async(feeds())).unwrap();
    let (Value::Tensor(a), Value::Tensor(b)) = (&got[0].1, &want[0].1) else {
        panic!("tensors")
    };
    assert_eq!(a.shape(), b.shape());
    close(
        "fused chain",
        &a.to_f32_vec().unwrap(),
        &b.to_f32_vec().unwrap(),
        1e-4,
        1e-5,
    );
    Some(dispatches)
}

#[test]
fn matmul_epilogues_fuse_bias_and_activation() {
    // bias and activation in the tiled kernel and in the matrix-vector one
    for rows in [37, 1] {
        let m = graph_model(
            &[
                ("MatMul", &["x0", "x1"], "mm"),
                ("Add", &["mm", "x2"], "a"),
                ("Relu", &["a"], "y"),
            ],
            &[&[rows, 19], &[19, 23], &[23]],
        );
        if let Some(d) = fused_run(&m, &[&[rows, 19], &[19, 23], &[23]]) {
            assert_eq!(d, 1, "MatMul + bias + Relu at {rows} rows");
        }
    }
    // SiLU reads the product twice: still its only reader, still one dispatch
    let m = graph_model(
        &[
            ("MatMul", &["x0", "x1"], "mm"),
            ("Sigmoid", &["mm"], "s"),
            ("Mul", &["mm", "s"], "y"),
        ],
        &[&[2, 6, 9], &[9, 5]],
    );
    if let Some(d) = fused_run(&m, &[&[2, 6, 9], &[9, 5]]) {
        assert_eq!(d, 1);
    }
    // a residual add of two leaves and a broadcast one
    let m = graph_model(
        &[
            ("MatMul", &["x0", "x1"], "mm"),
            ("Add", &["mm", "x2"], "a"),
            ("Mul", &["a", "x3"], "y"),
        ],
        &[&[4, 70, 8], &[8, 3], &[4, 70, 3], &[70, 1]],
    );
    if let Some(d) = fused_run(&m, &[&[4, 70, 8], &[8, 3], &[4, 70, 3], &[70, 1]]) {
        assert_eq!(d, 1);
    }
    // another kernel reads the product too: it is computed once on its own, and the chain
    // reads it
    let m = graph_model(
        &[
            ("MatMul", &["x0", "x1"], "mm"),
            ("Relu", &["mm"], "r"),
            ("Transpose", &["mm"], "t"),
            ("Add", &["r", "t"], "y"),
        ],
        &[&[6, 6], &[6, 6]],
    );
    if let Some(d) = fused_run(&m, &[&[6, 6], &[6, 6]]) {
        assert_eq!(d, 3, "MatMul, Transpose, the chain");
    }
    // two separate chains read the product: neither may take it over (the other would read a
    // buffer nobody computed)
    let m = graph_model(
        &[
            ("MatMul", &["x0", "x1"], "mm"),
            ("Relu", &["mm"], "r"),
            ("Sigmoid", &["mm"], "s"),
            ("MatMul", &["r", "s"], "y"),
        ],
        &[&[7, 7], &[7, 7]],
    );
    if let Some(d) = fused_run(&m, &[&[7, 7], &[7, 7]]) {
        assert_eq!(d, 4, "MatMul, each chain, MatMul");
    }
    // the chain broadcasts the product (it is not read element for element): not fused
    let m = graph_model(
        &[("MatMul", &["x0", "x1"], "mm"), ("Add", &["mm", "x2"], "y")],
        &[&[1, 5], &[5, 4], &[3, 4]],
    );
    if let Some(d) = fused_run(&m, &[&[1, 5], &[5, 4], &[3, 4]]) {
        assert_eq!(d, 2);
    }
}

#[test]
fn fused_results_take_no_buffer() {
    // four element-wise nodes and a MatMul fused into one dispatch: the device holds the two
    // inputs, the output and MatMul's 12-byte batch table, no intermediate
    let Some(g) = fresh_gpu() else { return };
    let m = graph_model(
        &[
            ("MatMul", &["x0", "x1"], "mm"),
            ("Sigmoid", &["mm"], "s"),
            ("Mul", &["mm", "s"], "m"),
            ("Add", &["m", "x0"], "a"),
            ("Tanh", &["a"], "y"),
        ],
        &[&[10, 100], &[100, 100]],
    );
    let s = Session::new(
        loader::load_model(&m, &loader::NoExternalData).unwrap(),
        vec![g.clone(), cpu()],
        &SessionOptions::default(),
    )
    .unwrap();
    let feeds = vec![
        ("x0".to_string(), Value::Tensor(ft(&[10, 100], 1))),
        ("x1".to_string(), Value::Tensor(ft(&[100, 100], 2))),
    ];
    pollster::block_on(s.run_async(feeds)).unwrap();
    let st = g.gpu().stats();
    assert_eq!(st.dispatches, 1, "{st:?}");
    assert_eq!(st.live_bytes, (1000 + 10_000 + 1000) * 4 + 12, "{st:?}");
}

#[test]
fn conv_epilogues_fuse_activation_and_residual() {
    // the direct kernel (4 output channels) and the implicit GEMM (16)
    for m in [4, 16] {
        let shapes: &[&[usize]] = &[&[2, 3, 9, 8], &[m, 3, 3, 3], &[m], &[2, m, 7, 6]];
        let g = graph_model(
            &[
                ("Conv", &["x0", "x1", "x2"], "c"),
                ("HardSwish", &["c"], "h"),
                ("Add", &["h", "x3"], "y"),
            ],
            shapes,
        );
        if let Some(d) = fused_run(&g, shapes) {
            assert_eq!(d, 1, "Conv + HardSwish + residual with {m} channels");
        }
    }
}

#[test]
fn element_wise_chains_run_as_one_dispatch() {
    // SiLU, a broadcast bias, Tanh, a Clip: five nodes, one dispatch
    let m = graph_model(
        &[
            ("Sigmoid", &["x0"], "s"),
            ("Mul", &["x0", "s"], "m"),
            ("Add", &["m", "x1"], "a"),
            ("Tanh", &["a"], "t"),
            ("Relu", &["t"], "y"),
        ],
        &[&[3, 5, 7], &[7]],
    );
    if let Some(d) = fused_run(&m, &[&[3, 5, 7], &[7]]) {
        assert_eq!(d, 1, "the chain should be one dispatch");
    }
    // four leaves are more than one dispatch reads: one operand is computed first
    let m = graph_model(
        &[
            ("Add", &["x0", "x1"], "a"),
            ("Mul", &["x2", "x3"], "b"),
            ("Sub", &["a", "b"], "y"),
        ],
        &[&[4, 6], &[6], &[4, 1], &[1]],
    );
    if let Some(d) = fused_run(&m, &[&[4, 6], &[6], &[4, 1], &[1]]) {
        assert_eq!(d, 2);
    }
    // a view of a pending result (Reshape shares the buffer under another shape) is computed
    // before the next element-wise op reads it
    let m = ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 18,
        }],
        graph: Some(GraphProto {
            name: "view".into(),
            node: vec![
                NodeProto {
                    op_type: "Sigmoid".into(),
                    name: "s".into(),
                    input: vec!["x0".into()],
                    output: vec!["s".into()],
                    ..Default::default()
                },
                NodeProto {
                    op_type: "Unsqueeze".into(),
                    name: "u".into(),
                    input: vec!["s".into(), "axes".into()],
                    output: vec!["u".into()],
                    ..Default::default()
                },
                NodeProto {
                    op_type: "Add".into(),
                    name: "a".into(),
                    input: vec!["u".into(), "x1".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                },
            ],
            initializer: vec![init("axes", &it(&[1], vec![1]))],
            input: vec![
                vi("x0", DataType::Float, &[3, 4]),
                vi("x1", DataType::Float, &[5, 4]),
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
    if let Some(d) = fused_run(&m, &[&[3, 4], &[5, 4]]) {
        assert_eq!(d, 2);
    }
    // a value read by two consumers is recomputed by each, never wrong
    let m = graph_model(
        &[
            ("Exp", &["x0"], "e"),
            ("Neg", &["e"], "n"),
            ("Div", &["e", "n"], "y"),
        ],
        &[&[2, 9]],
    );
    if let Some(d) = fused_run(&m, &[&[2, 9]]) {
        assert_eq!(d, 1);
    }
}

/// Reads `bytes` bytes of a caller's buffer back through a staging buffer.
fn read_buffer(g: &nxrt_wasm::webgpu::WebGpuProvider, src: &wgpu::Buffer, bytes: u64) -> Vec<f32> {
    let dev = g.gpu().device();
    let staging = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test staging"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    g.gpu().flush().unwrap();
    let mut enc = dev.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
    g.gpu().queue().submit([enc.finish()]);
    let slice = staging.slice(..);
    slice.map_async(wgpu::MapMode::Read, |r| r.unwrap());
    dev.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let v = slice.get_mapped_range();
    v.unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn a_callers_buffers_feed_a_run_and_take_its_output_on_the_device() {
    use nxrt_core::RunOptions;
    let Some(g) = fresh_gpu() else { return };
    let n = 1000usize;
    let case = Case::new("Sigmoid", vec![ft(&[n], 1)]);
    let load = |p: Vec<std::sync::Arc<dyn ExecutionProvider>>| {
        let m = loader::load_model(&case.model(), &loader::NoExternalData).unwrap();
        Session::new(m, p, &SessionOptions::default()).unwrap()
    };
    let sg = load(vec![g.clone(), cpu()]);
    let host = ft(&[n], 7);
    // the same session fed from the host: the answer a device feed must give, bit for bit
    let want = pollster::block_on(sg.run_async(vec![("x0".into(), Value::Tensor(host.clone()))]))
        .unwrap()[0]
        .1
        .as_tensor()
        .unwrap()
        .to_f32_vec()
        .unwrap();
    // the caller's input buffer, written by the caller
    let dev = g.gpu().device();
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let mk = |usage| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("caller's"),
            size: 4 * n as u64,
            usage,
            mapped_at_creation: false,
        })
    };
    let input = mk(usage);
    let bytes: Vec<u8> = host
        .to_f32_vec()
        .unwrap()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    g.gpu().queue().write_buffer(&input, 0, &bytes);
    let output = mk(usage);
    let uploads0 = g.gpu().stats().uploads;
    let keep = RunOptions {
        keep_on_device: vec!["y0".into()],
        ..Default::default()
    };
    for round in 0..3 {
        let t = g
            .tensor_from_buffer(input.clone(), DataType::Float, &[n])
            .unwrap();
        let outs = pollster::block_on(
            sg.run_async_with(vec![("x0".into(), Value::Tensor(t))], keep.clone()),
        )
        .unwrap();
        let out = outs[0].1.as_tensor().unwrap();
        assert_ne!(
            out.location(),
            nxrt_core::Location::Host,
            "kept on the device"
        );
        g.copy_to_buffer(out, &output).unwrap();
        drop(outs);
        assert!(
            read_buffer(&g, &output, 4 * n as u64) == want,
            "round {round}: the caller's output buffer holds the answer"
        );
    }
    assert_eq!(
        g.gpu().stats().uploads,
        uploads0,
        "the caller's input was never uploaded"
    );
    // the caller's buffers stay theirs: never pooled, so emptying the pool (which destroys
    // what it holds) leaves them readable
    g.release_cached();
    assert_eq!(
        read_buffer(&g, &input, 4 * n as u64),
        host.to_f32_vec().unwrap()
    );
    assert_eq!(g.gpu().stats().pooled_bytes, 0);
    // wrong usage, too small, a type not stored as itself: clear errors
    let e = g
        .tensor_from_buffer(mk(wgpu::BufferUsages::COPY_SRC), DataType::Float, &[n])
        .unwrap_err();
    assert!(e.to_string().contains("STORAGE | COPY_SRC"), "{e}");
    let e = g
        .tensor_from_buffer(input.clone(), DataType::Float, &[n + 1])
        .unwrap_err();
    assert!(e.to_string().contains("needs 4004"), "{e}");
    let e = g
        .tensor_from_buffer(input.clone(), DataType::Int64, &[n / 2])
        .unwrap_err();
    assert!(e.to_string().contains("own element layout"), "{e}");
    let out = pollster::block_on(
        sg.run_async_with(vec![("x0".into(), Value::Tensor(host))], keep.clone()),
    )
    .unwrap();
    let e = g
        .copy_to_buffer(
            out[0].1.as_tensor().unwrap(),
            &mk(wgpu::BufferUsages::STORAGE),
        )
        .unwrap_err();
    assert!(e.to_string().contains("needs COPY_DST"), "{e}");
}
