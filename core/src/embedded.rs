//! The small model built into the `nxrt` binary (what `nxrt run` without a model runs): a
//! digit-sized CNN (Conv -> Relu -> MaxPool -> Conv -> Relu -> GlobalAveragePool -> Flatten ->
//! Gemm -> Softmax) with fixed pseudo-random weights, encoded as a real ONNX protobuf. It lives in
//! core so that every target (the native CLI, the wasm crate's tests, the npm package) runs the
//! same bytes.

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::proto::{
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

/// Deterministic weights in [-0.5, 0.5).
fn weights(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn init(name: &str, dims: &[i64], seed: u64) -> TensorProto {
    let n = dims.iter().product::<i64>() as usize;
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: weights(seed, n),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto::ints(name, v)
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto::int(name, v)
}

fn node(op: &str, name: &str, i: &[&str], o: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: i.iter().map(|s| s.to_string()).collect(),
        output: o.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn value(name: &str, dims: &[&str]) -> ValueInfoProto {
    use crate::proto::tensor_shape_proto::{dimension::Value as D, Dimension};
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d.parse::<i64>() {
                                Ok(n) => D::DimValue(n),
                                Err(_) => D::DimParam(d.to_string()),
                            }),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The embedded model as ONNX bytes: input `image` [batch,1,16,16], output `probs` [batch,10].
pub fn tiny_cnn() -> Vec<u8> {
    let graph = GraphProto {
        name: "tiny_cnn".into(),
        node: vec![
            node(
                "Conv",
                "conv1",
                &["image", "w1", "b1"],
                &["c1"],
                vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
            ),
            node("Relu", "relu1", &["c1"], &["r1"], vec![]),
            node(
                "MaxPool",
                "pool1",
                &["r1"],
                &["p1"],
                vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
            ),
            node(
                "Conv",
                "conv2",
                &["p1", "w2", "b2"],
                &["c2"],
                vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
            ),
            node("Relu", "relu2", &["c2"], &["r2"], vec![]),
            node("GlobalAveragePool", "gap", &["r2"], &["g"], vec![]),
            node("Flatten", "flatten", &["g"], &["f"], vec![int("axis", 1)]),
            node(
                "Gemm",
                "fc",
                &["f", "w3", "b3"],
                &["logits"],
                vec![int("transB", 1)],
            ),
            node(
                "Softmax",
                "softmax",
                &["logits"],
                &["probs"],
                vec![int("axis", 1)],
            ),
        ],
        initializer: vec![
            init("w1", &[8, 1, 3, 3], 1),
            init("b1", &[8], 2),
            init("w2", &[16, 8, 3, 3], 3),
            init("b2", &[16], 4),
            init("w3", &[10, 16], 5),
            init("b3", &[10], 6),
        ],
        input: vec![value("image", &["batch", "1", "16", "16"])],
        output: vec![value("probs", &["batch", "10"])],
        ..Default::default()
    };
    let model = ModelProto {
        ir_version: 8,
        producer_name: "nxrt-embedded".into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    };
    model.encode_to_vec()
}
