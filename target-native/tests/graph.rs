//! Graph-level behaviour through the public API: constant folding of exporter shape arithmetic,
//! symbolic shapes of inputs/outputs, views for Reshape, model-local functions, If subgraphs
//! that capture outer values.

use nxrt::{OptLevel, Session, Tensor};
use nxrt_core::proto::{
    attr_type, AttributeProto, FunctionProto, GraphProto, ModelProto, OperatorSetIdProto,
    TensorProto,
};
use prost::Message;

mod common;
use common::{i64s, node, vi};

fn model(graph: GraphProto, functions: Vec<FunctionProto>) -> Vec<u8> {
    ModelProto {
        ir_version: 9,
        opset_import: vec![
            OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            },
            OperatorSetIdProto {
                domain: "local".into(),
                version: 1,
            },
        ],
        graph: Some(graph),
        functions,
        ..Default::default()
    }
    .encode_to_vec()
}

/// x[B,3,4] -> Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape(x): y[B,12].
fn shape_chain(batch: &str) -> Vec<u8> {
    model(
        GraphProto {
            name: "chain".into(),
            node: vec![
                node("Shape", &["x"], &["s"]),
                node("Gather", &["s", "zero"], &["b"]),
                node("Unsqueeze", &["b", "axes0"], &["b1"]),
                node("Concat", &["b1", "minus1"], &["target"]),
                node("Reshape", &["x", "target"], &["y"]),
            ],
            initializer: vec![
                TensorProto {
                    name: "zero".into(),
                    data_type: 7,
                    int64_data: vec![0],
                    ..Default::default()
                },
                i64s("axes0", &[0]),
                i64s("minus1", &[-1]),
            ],
            input: vec![vi("x", 1, &[batch, "3", "4"])],
            output: vec![vi("y", 1, &[])],
            ..Default::default()
        },
        vec![],
    )
}

#[test]
fn shape_arithmetic_folds_to_a_constant_when_shapes_are_known() {
    // Concat needs an axis attribute
    let mut bytes = shape_chain("2");
    let mut m = ModelProto::decode(bytes.as_slice()).unwrap();
    for n in &mut m.graph.as_mut().unwrap().node {
        if n.op_type == "Concat" {
            n.attribute.push(AttributeProto {
                name: "axis".into(),
                r#type: attr_type::INT,
                i: 0,
                ..Default::default()
            });
        }
    }
    bytes = m.encode_to_vec();
    let folded = Session::builder().load_bytes(&bytes).unwrap();
    let ops: Vec<&str> = folded
        .core()
        .graph()
        .nodes
        .iter()
        .map(|n| n.op_type.as_str())
        .collect();
    assert_eq!(ops, ["Reshape"], "the shape chain should fold away");
    let plain = Session::builder()
        .optimization(OptLevel::None)
        .load_bytes(&bytes)
        .unwrap();
    assert_eq!(plain.core().graph().nodes.len(), 5);
    // both give the same answer, and Reshape is a view of the input
    let x = Tensor::from_vec(&[2, 3, 4], (0..24).map(|i| i as f32).collect()).unwrap();
    for s in [&folded, &plain] {
        let out = s.run([("x", x.clone())]).unwrap();
        let y = out["y"].as_tensor().unwrap();
        assert_eq!(y.shape(), &[2, 12]);
        assert_eq!(y.as_slice::<f32>().unwrap()[13], 13.0);
        assert!(y.shares_storage(&x), "Reshape must not copy");
    }
    // with a symbolic batch the chain stays and still computes per run
    let mut m = ModelProto::decode(shape_chain("batch").as_slice()).unwrap();
    for n in &mut m.graph.as_mut().unwrap().node {
        if n.op_type == "Concat" {
            n.attribute.push(AttributeProto {
                name: "axis".into(),
                r#type: attr_type::INT,
                i: 0,
                ..Default::default()
            });
        }
    }
    let dynamic = Session::builder().load_bytes(&m.encode_to_vec()).unwrap();
    assert_eq!(dynamic.inputs()[0].ty.to_string(), "float[batch,3,4]");
    let x5 = Tensor::from_vec(&[5, 3, 4], vec![1f32; 60]).unwrap();
    let out = dynamic.run([("x", x5)]).unwrap();
    assert_eq!(out["y"].as_tensor().unwrap().shape(), &[5, 12]);
}

#[test]
fn model_local_functions_are_inlined() {
    // local.AddRelu(a, b) = Relu(Add(a, b))
    let f = FunctionProto {
        name: "AddRelu".into(),
        domain: "local".into(),
        input: vec!["a".into(), "b".into()],
        output: vec!["c".into()],
        node: vec![
            node("Add", &["a", "b"], &["t"]),
            node("Relu", &["t"], &["c"]),
        ],
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        ..Default::default()
    };
    let mut call = node("AddRelu", &["x", "y"], &["z"]);
    call.domain = "local".into();
    let bytes = model(
        GraphProto {
            name: "f".into(),
            node: vec![call],
            input: vec![vi("x", 1, &["3"]), vi("y", 1, &["3"])],
            output: vec![vi("z", 1, &["3"])],
            ..Default::default()
        },
        vec![f],
    );
    let s = Session::builder().load_bytes(&bytes).unwrap();
    let x = Tensor::from_vec(&[3], vec![1f32, -5.0, 2.0]).unwrap();
    let y = Tensor::from_vec(&[3], vec![1f32, 1.0, -3.0]).unwrap();
    let out = s.run([("x", x), ("y", y)]).unwrap();
    assert_eq!(
        &*out["z"].as_tensor().unwrap().as_slice::<f32>().unwrap(),
        &[2.0, 0.0, 0.0]
    );
}

/// `y = If(cond)` with the two branches.
fn if_node(then_branch: GraphProto, else_branch: GraphProto) -> nxrt_core::proto::NodeProto {
    let mut n = node("If", &["cond"], &["y"]);
    let graph = |name: &str, g: GraphProto| AttributeProto {
        name: name.into(),
        r#type: attr_type::GRAPH,
        g: Some(Box::new(g)),
        ..Default::default()
    };
    n.attribute = vec![
        graph("then_branch", then_branch),
        graph("else_branch", else_branch),
    ];
    n
}

#[test]
fn if_branches_read_outer_values() {
    let branch = |op: &str, name: &str| GraphProto {
        name: name.into(),
        node: vec![node(op, &["x", "x"], &[&format!("{name}_out")])],
        output: vec![vi(&format!("{name}_out"), 1, &["2"])],
        ..Default::default()
    };
    let if_node = if_node(branch("Add", "then"), branch("Mul", "else"));
    let bytes = model(
        GraphProto {
            name: "if".into(),
            node: vec![if_node],
            input: vec![vi("cond", 9, &[]), vi("x", 1, &["2"])],
            output: vec![vi("y", 1, &["2"])],
            ..Default::default()
        },
        vec![],
    );
    let s = Session::builder().load_bytes(&bytes).unwrap();
    let x = Tensor::from_vec(&[2], vec![3f32, 4.0]).unwrap();
    for (c, want) in [(true, [6.0f32, 8.0]), (false, [9.0, 16.0])] {
        let out = s
            .run([("cond", Tensor::scalar(c)), ("x", x.clone())])
            .unwrap();
        assert_eq!(
            &*out["y"].as_tensor().unwrap().as_slice::<f32>().unwrap(),
            &want
        );
    }
}

/// If branches run planned, from arenas of their own (as the top level does): the results
/// equal an eager session's exactly, over both branches and a shape change, and the captured
/// outer value (read again after the If) is never overwritten by a branch's in-place writes.
#[test]
fn planned_if_branches_match_eager_and_keep_captured_values() {
    let chain = |name: &str, op: &str| GraphProto {
        name: name.into(),
        node: vec![
            node("Relu", &["x"], &[&format!("{name}_a")]),
            node(op, &[&format!("{name}_a"), "x"], &[&format!("{name}_b")]),
            node("Sigmoid", &[&format!("{name}_b")], &[&format!("{name}_c")]),
            node(
                "Mul",
                &[&format!("{name}_c"), &format!("{name}_b")],
                &[&format!("{name}_out")],
            ),
        ],
        output: vec![vi(&format!("{name}_out"), 1, &["N"])],
        ..Default::default()
    };
    let if_node = if_node(chain("then", "Add"), chain("else", "Sub"));
    let bytes = model(
        GraphProto {
            name: "if".into(),
            node: vec![if_node, node("Neg", &["x"], &["xn"])],
            input: vec![vi("cond", 9, &[]), vi("x", 1, &["N"])],
            output: vec![vi("y", 1, &["N"]), vi("xn", 1, &["N"])],
            ..Default::default()
        },
        vec![],
    );
    let planned = Session::builder()
        .mode(nxrt::ExecMode::Planned)
        .load_bytes(&bytes)
        .unwrap();
    let eager = Session::builder()
        .mode(nxrt::ExecMode::Eager)
        .load_bytes(&bytes)
        .unwrap();
    let run = |s: &Session, c: bool, x: &Tensor| -> Vec<Vec<f32>> {
        let o = s
            .run([("cond", Tensor::scalar(c)), ("x", x.clone())])
            .unwrap();
        ["y", "xn"]
            .iter()
            .map(|n| {
                o[*n]
                    .as_tensor()
                    .unwrap()
                    .as_slice::<f32>()
                    .unwrap()
                    .to_vec()
            })
            .collect()
    };
    for (round, &n) in [5usize, 5, 5, 300, 300, 5].iter().enumerate() {
        let v: Vec<f32> = (0..n).map(|i| (i as f32 - n as f32 / 2.0) * 0.37).collect();
        let x = Tensor::from_vec(&[n], v.clone()).unwrap();
        for c in [true, false] {
            let got = run(&planned, c, &x);
            assert_eq!(got, run(&eager, c, &x), "round {round} n={n} cond={c}");
            let neg: Vec<f32> = v.iter().map(|a| -a).collect();
            assert_eq!(got[1], neg, "the captured x is intact after the If");
        }
    }
    // an output the caller holds is not overwritten by later runs (it is not the arena's)
    let x1 = Tensor::from_vec(&[5], vec![1.0f32, -2.0, 3.0, -4.0, 5.0]).unwrap();
    let kept = planned
        .run([("cond", Tensor::scalar(true)), ("x", x1.clone())])
        .unwrap();
    let before = kept["y"]
        .as_tensor()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec();
    for _ in 0..3 {
        let x2 = Tensor::from_vec(&[5], vec![9.0f32; 5]).unwrap();
        planned
            .run([("cond", Tensor::scalar(true)), ("x", x2)])
            .unwrap();
    }
    let after = kept["y"]
        .as_tensor()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec();
    assert_eq!(before, after, "a held output changed under later runs");
    assert_eq!(before, run(&eager, true, &x1)[0]);
}

/// What a branch computes from its parent's constants is folded at load, through every level
/// of nesting: an If inside an If slices and concatenates an outer initializer (as silero_vad
/// does with its LSTM's weights); after loading no Slice or Concat is left in any branch, and
/// the results equal an unoptimised session's.
#[test]
fn branches_fold_what_they_compute_from_outer_constants() {
    // w[2,3]; rotated = Concat(w[:, 1:], w[:, :1], axis 1); y = rotated + x (then), x (else)
    let slice = |lo: i64, hi: i64, out: &str| {
        node(
            "Slice",
            &["w", &format!("lo{lo}"), &format!("hi{hi}"), "ax1"],
            &[out],
        )
    };
    let inner_then = GraphProto {
        name: "inner_then".into(),
        node: vec![
            slice(1, 3, "tail"),
            slice(0, 1, "head"),
            {
                let mut c = node("Concat", &["tail", "head"], &["rot"]);
                c.attribute = vec![AttributeProto {
                    name: "axis".into(),
                    r#type: attr_type::INT,
                    i: 1,
                    ..Default::default()
                }];
                c
            },
            node("Add", &["rot", "x"], &["inner_y"]),
        ],
        initializer: vec![
            i64s("lo1", &[1]),
            i64s("hi3", &[3]),
            i64s("lo0", &[0]),
            i64s("hi1", &[1]),
            i64s("ax1", &[1]),
        ],
        output: vec![vi("inner_y", 1, &["2", "3"])],
        ..Default::default()
    };
    let pass = |name: &str| GraphProto {
        name: name.into(),
        node: vec![node("Identity", &["x"], &[&format!("{name}_y")])],
        output: vec![vi(&format!("{name}_y"), 1, &["2", "3"])],
        ..Default::default()
    };
    let mut inner = if_node(inner_then, pass("inner_else"));
    inner.output = vec!["outer_y".into()];
    let outer_then = GraphProto {
        name: "outer_then".into(),
        node: vec![inner],
        output: vec![vi("outer_y", 1, &["2", "3"])],
        ..Default::default()
    };
    let w: Vec<f32> = (1..=6).map(|v| v as f32).collect();
    let bytes = model(
        GraphProto {
            name: "nested".into(),
            node: vec![if_node(outer_then, pass("outer_else"))],
            initializer: vec![common::f32s("w", &[2, 3], &w)],
            input: vec![vi("cond", 9, &[]), vi("x", 1, &["2", "3"])],
            output: vec![vi("y", 1, &["2", "3"])],
            ..Default::default()
        },
        vec![],
    );
    let folded = Session::builder().load_bytes(&bytes).unwrap();
    let plain = Session::builder()
        .optimization(OptLevel::None)
        .load_bytes(&bytes)
        .unwrap();
    let mut ops = Vec::new();
    folded
        .core()
        .graph()
        .walk_nodes(&mut |n, _| ops.push(n.op_type.clone()));
    assert_eq!(
        ops,
        ["If", "If", "Add", "Identity", "Identity"],
        "branch constants are folded"
    );
    let mut plain_ops = Vec::new();
    plain
        .core()
        .graph()
        .walk_nodes(&mut |n, _| plain_ops.push(n.op_type.clone()));
    assert!(plain_ops.iter().any(|o| o == "Slice"), "{plain_ops:?}");
    let x: Vec<f32> = (0..6).map(|v| v as f32 * 10.0).collect();
    for c in [true, false] {
        let run = |s: &Session| {
            let x = Tensor::from_vec(&[2, 3], x.clone()).unwrap();
            let o = s.run([("cond", Tensor::scalar(c)), ("x", x)]).unwrap();
            o["y"]
                .as_tensor()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec()
        };
        let want: Vec<f32> = if c {
            // rows [2, 3, 1] and [5, 6, 4] plus x
            [2.0, 3.0, 1.0, 5.0, 6.0, 4.0]
                .iter()
                .zip(&x)
                .map(|(r, x)| r + x)
                .collect()
        } else {
            x.clone()
        };
        assert_eq!(run(&folded), want, "cond {c}");
        assert_eq!(run(&plain), want, "cond {c}, unoptimised");
    }
}
