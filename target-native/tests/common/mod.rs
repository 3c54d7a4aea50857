//! Model-building helpers shared by the integration tests (each test file includes this module).
#![allow(dead_code)]

use nxrt_core::proto::{
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

/// Deterministic values in about [-1, 1) (an xorshift sequence from `seed`).
pub fn xorshift_data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// The bytes of a model of `graph` under ai.onnx opset 17 (IR version 9).
pub fn opset17_model(graph: GraphProto) -> Vec<u8> {
    ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A tensor value-info: element type code and dims (numbers are fixed, names symbolic).
pub fn vi(name: &str, elem: i32, dims: &[&str]) -> ValueInfoProto {
    use nxrt_core::proto::tensor_shape_proto::{dimension::Value as D, Dimension};
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
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

/// A node named `<op>_<first output>`.
pub fn node(op: &str, i: &[&str], o: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: format!("{op}_{}", o[0]),
        input: i.iter().map(|s| s.to_string()).collect(),
        output: o.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A 1-D int64 initializer.
pub fn i64s(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

/// A float initializer.
pub fn f32s(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        float_data: v.to_vec(),
        ..Default::default()
    }
}

/// `z = Sigmoid(Relu(x))`, `x` float `[n]`: its intermediate `y` lives in the arena.
pub fn chain_model() -> Vec<u8> {
    opset17_model(GraphProto {
        name: "chain".into(),
        node: vec![
            node("Relu", &["x"], &["y"]),
            node("Sigmoid", &["y"], &["z"]),
        ],
        input: vec![vi("x", 1, &["n"])],
        output: vec![vi("z", 1, &["n"])],
        ..Default::default()
    })
}

/// A session of [`chain_model`] in `pool`, its arenas from the pool's arena cache, and a run
/// of `n` elements.
pub fn pool_chain_session(pool: &std::sync::Arc<nxrt::governor::MemoryPool>) -> nxrt::Session {
    let cache: std::sync::Arc<dyn nxrt::mechanism::HostMechanism> = pool.arena_cache().clone();
    nxrt::Session::builder()
        .pool(pool)
        .host_mechanism(cache)
        .load_bytes(&chain_model())
        .unwrap()
}

/// Runs [`chain_model`] on `n` elements.
pub fn run_chain(s: &nxrt::Session, n: usize) -> nxrt::Result<()> {
    let x = nxrt::Tensor::from_vec(&[n], xorshift_data(n, 6)).unwrap();
    s.run([("x", x)]).map(|_| ())
}
