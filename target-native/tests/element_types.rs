//! An element type a kernel does not handle is refused when the session is built, with an error
//! naming the node, op, domain, opset and type, not discovered by the first run (the
//! registrations' declared types, `core/src/kernels/types.rs`).

use nxrt::{Error, Session, Tensor};
use nxrt_core::proto::{
    attr_type, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
};
use prost::Message;

mod common;
use common::vi;

/// One node named `name` over graph inputs of element type `elem` (ONNX code) and `dims`.
fn one_node(
    name: &str,
    op: &str,
    (domain, opset): (&str, i64),
    n_inputs: usize,
    elem: i32,
    dims: &[&str],
    attrs: Vec<AttributeProto>,
) -> Vec<u8> {
    let inputs: Vec<String> = (0..n_inputs).map(|i| format!("x{i}")).collect();
    ModelProto {
        ir_version: 10,
        opset_import: vec![OperatorSetIdProto {
            domain: domain.into(),
            version: opset,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![NodeProto {
                name: name.into(),
                op_type: op.into(),
                domain: domain.into(),
                input: inputs.clone(),
                output: vec!["y".into()],
                attribute: attrs,
                ..Default::default()
            }],
            input: inputs.iter().map(|n| vi(n, elem, dims)).collect(),
            output: vec![vi("y", 0, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Loading must fail with `Unsupported`, and the message must name every part.
fn refused_at_load(bytes: &[u8], parts: &[&str]) {
    let err = Session::builder()
        .load_bytes(bytes)
        .err()
        .expect("the session must not build");
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported { .. }), "{msg}");
    for p in parts {
        assert!(msg.contains(p), "'{msg}' should name {p}");
    }
}

const FLOAT: i32 = 1;
const STRING: i32 = 8;
const INT32: i32 = 6;
const INT4: i32 = 22;

#[test]
fn arithmetic_on_strings_is_refused_at_load() {
    let m = one_node("add_strings", "Add", ("", 17), 2, STRING, &["2"], vec![]);
    refused_at_load(
        &m,
        &[
            "node 'add_strings'",
            "op Add",
            "domain ai.onnx",
            "opset 17",
            "element type string",
        ],
    );
}

#[test]
fn float_only_ops_on_int32_are_refused_at_load() {
    let m = one_node(
        "softmax_ints",
        "Softmax",
        ("", 13),
        1,
        INT32,
        &["2", "3"],
        vec![],
    );
    refused_at_load(
        &m,
        &[
            "node 'softmax_ints'",
            "op Softmax",
            "domain ai.onnx",
            "opset 13",
            "element type int32",
        ],
    );
    let m = one_node(
        "conv_ints",
        "Conv",
        ("", 11),
        2,
        INT32,
        &["1", "1", "2", "2"],
        vec![],
    );
    refused_at_load(&m, &["node 'conv_ints'", "op Conv", "opset 11", "int32"]);
}

#[test]
fn packed_int4_in_a_copying_op_is_refused_at_load() {
    let m = one_node(
        "transpose_int4",
        "Transpose",
        ("", 21),
        1,
        INT4,
        &["2", "3"],
        vec![],
    );
    refused_at_load(
        &m,
        &[
            "node 'transpose_int4'",
            "op Transpose",
            "domain ai.onnx",
            "opset 21",
            "element type int4",
        ],
    );
}

#[test]
fn other_domains_name_their_domain() {
    let threshold = AttributeProto {
        name: "threshold".into(),
        r#type: attr_type::FLOAT,
        f: 0.5,
        ..Default::default()
    };
    let m = one_node(
        "binarize_ints",
        "Binarizer",
        ("ai.onnx.ml", 3),
        1,
        INT32,
        &["2"],
        vec![threshold],
    );
    refused_at_load(
        &m,
        &[
            "node 'binarize_ints'",
            "op Binarizer",
            "domain ai.onnx.ml",
            "opset 3",
            "element type int32",
        ],
    );
}

#[test]
fn declared_types_still_load_and_run() {
    let m = one_node(
        "softmax",
        "Softmax",
        ("", 13),
        1,
        FLOAT,
        &["2", "3"],
        vec![],
    );
    let s = Session::builder()
        .load_bytes(&m)
        .expect("float Softmax loads");
    let x = Tensor::from_vec(&[2, 3], vec![0f32; 6]).unwrap();
    let y = s.run([("x0", x)]).expect("and runs");
    let v = y["y"].as_tensor().unwrap().to_f32_vec().unwrap();
    assert!(v.iter().all(|&p| (p - 1.0 / 3.0).abs() < 1e-6), "{v:?}");
    let m = one_node("add_ints", "Add", ("", 17), 2, INT32, &["2"], vec![]);
    let s = Session::builder().load_bytes(&m).expect("int32 Add loads");
    let a = Tensor::from_vec(&[2], vec![1i32, 2]).unwrap();
    let y = s.run([("x0", a.clone()), ("x1", a)]).expect("and runs");
    assert_eq!(
        &*y["y"].as_tensor().unwrap().as_slice::<i32>().unwrap(),
        &[2, 4]
    );
}
