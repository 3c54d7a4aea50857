//! Bad input gives a typed error, never a panic, an abort or an unbounded allocation: hostile
//! model bytes, external data that is missing or escapes the model's folder, unknown ops and
//! domains, too-new opsets, wrong feeds, overflowing shapes.

use nxrt::{Error, Session, Tensor};
use nxrt_core::proto::{
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use prost::Message;

fn tensor_type(elem: i32, dims: &[i64]) -> TypeProto {
    use nxrt_core::proto::tensor_shape_proto::{dimension::Value as D, Dimension};
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: elem,
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| Dimension {
                        value: Some(if d < 0 {
                            D::DimParam("n".into())
                        } else {
                            D::DimValue(d)
                        }),
                        ..Default::default()
                    })
                    .collect(),
            }),
        })),
        ..Default::default()
    }
}

fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(tensor_type(elem, dims)),
        ..Default::default()
    }
}

/// y = op(x) with one float input [2,3], under `domain` opset `version`.
fn one_node(op: &str, domain: &str, version: i64) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: domain.into(),
            version,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![NodeProto {
                name: "the_node".into(),
                op_type: op.into(),
                domain: domain.into(),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![vi("x", 1, &[-1, 3])],
            output: vec![vi("y", 1, &[-1, 3])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn load(m: &ModelProto) -> Result<Session, Error> {
    Session::builder().load_bytes(&m.encode_to_vec())
}

#[test]
fn random_and_truncated_bytes_are_decode_errors() {
    let mut s = 0x1234_5678_9abc_def0u64;
    for len in [0usize, 1, 7, 64, 1000, 65536] {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        match Session::builder().load_bytes(&bytes) {
            Err(Error::Decode(_)) | Err(Error::InvalidModel(_)) => {}
            Err(e) => panic!("random bytes ({len}) gave an unexpected error kind: {e}"),
            Ok(_) => panic!("random bytes ({len}) loaded as a model"),
        }
    }
    let good = one_node("Relu", "", 17).encode_to_vec();
    for cut in [1, good.len() / 3, good.len() / 2, good.len() - 1] {
        let r = Session::builder().load_bytes(&good[..cut]);
        assert!(r.is_err(), "a model truncated to {cut} bytes loaded");
    }
}

#[test]
fn unknown_op_names_node_op_domain_and_opset() {
    let err = load(&one_node("NoSuchOp", "", 17))
        .err()
        .expect("must fail");
    let msg = err.to_string();
    assert!(matches!(err, Error::Unsupported { .. }), "{msg}");
    for part in ["the_node", "NoSuchOp", "ai.onnx", "17"] {
        assert!(msg.contains(part), "'{msg}' should name {part}");
    }
}

#[test]
fn unknown_domain_is_unsupported() {
    let err = load(&one_node("Foo", "com.example", 1))
        .err()
        .expect("must fail");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("com.example"), "{err}");
}

#[test]
fn too_new_opset_is_rejected_at_load() {
    let err = load(&one_node("Relu", "", 999)).err().expect("must fail");
    assert!(
        matches!(err, Error::OpsetTooNew { version: 999, .. }),
        "{err}"
    );
}

#[test]
fn wrong_feeds_are_input_errors() {
    let s = load(&one_node("Identity", "", 17)).expect("Identity loads");
    let x = Tensor::from_vec(&[2, 3], vec![0f32; 6]).unwrap();
    let e = s.run([("nope", x.clone())]).expect_err("wrong name");
    assert!(
        matches!(e, Error::Input(_)) && e.to_string().contains("nope"),
        "{e}"
    );
    let xi = Tensor::from_vec(&[2, 3], vec![0i64; 6]).unwrap();
    let e = s.run([("x", xi)]).expect_err("wrong dtype");
    assert!(
        matches!(e, Error::Input(_)) && e.to_string().contains("int64"),
        "{e}"
    );
    let xr = Tensor::from_vec(&[6], vec![0f32; 6]).unwrap();
    let e = s.run([("x", xr)]).expect_err("wrong rank");
    assert!(
        matches!(e, Error::Input(_)) && e.to_string().contains("rank"),
        "{e}"
    );
    let xd = Tensor::from_vec(&[2, 4], vec![0f32; 8]).unwrap();
    let e = s.run([("x", xd)]).expect_err("wrong fixed dim");
    assert!(matches!(e, Error::Input(_)), "{e}");
    let e = s
        .run(Vec::<(String, Tensor)>::new())
        .expect_err("missing input");
    assert!(
        matches!(e, Error::Input(_)) && e.to_string().contains("'x'"),
        "{e}"
    );
    // the session stays usable after failed runs
    let ok = s.run([("x", x)]).expect("a good run after bad ones");
    assert_eq!(ok["y"].as_tensor().unwrap().shape(), &[2, 3]);
}

#[test]
fn overflowing_shapes_do_not_allocate() {
    // an initializer whose declared dims overflow
    let mut m = one_node("Identity", "", 17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "huge".into(),
        dims: vec![1 << 40, 1 << 40, 1 << 40],
        data_type: 1,
        ..Default::default()
    });
    let e = load(&m).err().expect("overflow");
    assert!(matches!(e, Error::Shape(_) | Error::InvalidModel(_)), "{e}");
    // a huge but representable shape with no data: rejected before allocating
    let mut m = one_node("Identity", "", 17);
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "big".into(),
        dims: vec![1 << 20, 1 << 20],
        data_type: 1,
        ..Default::default()
    });
    let e = load(&m).err().expect("no data for a big tensor");
    assert!(matches!(e, Error::InvalidModel(_)), "{e}");
    // a feed whose shape overflows cannot even be built
    assert!(Tensor::zeros(nxrt::DataType::Float, &[usize::MAX / 2, 3]).is_err());
}

fn external(location: &str, length: Option<usize>) -> ModelProto {
    let mut m = one_node("Identity", "", 17);
    let mut ext = vec![StringStringEntryProto {
        key: "location".into(),
        value: location.into(),
    }];
    if let Some(l) = length {
        ext.push(StringStringEntryProto {
            key: "length".into(),
            value: l.to_string(),
        });
    }
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![4],
        data_type: 1,
        data_location: 1,
        external_data: ext,
        ..Default::default()
    });
    m
}

#[test]
fn external_data_is_confined_to_the_model_folder() {
    let root = std::env::temp_dir().join(format!("nxrt-ext-{}", std::process::id()));
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(root.join("secret.bin"), [0u8; 16]).unwrap();
    std::fs::write(dir.join("w.bin"), [0u8; 16]).unwrap();
    std::fs::write(dir.join("short.bin"), [0u8; 8]).unwrap();
    let write = |name: &str, m: &ModelProto| {
        let p = dir.join(name);
        std::fs::write(&p, m.encode_to_vec()).unwrap();
        p
    };
    // good: a file next to the model
    let ok = Session::builder().load(write("ok.onnx", &external("w.bin", Some(16))));
    assert!(ok.is_ok(), "{:?}", ok.err());
    // missing file
    let e = Session::builder()
        .load(write("missing.onnx", &external("nope.bin", None)))
        .err()
        .unwrap();
    assert!(matches!(e, Error::ExternalData(_)), "{e}");
    // `..` escape, absolute path
    for loc in ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"] {
        let e = Session::builder()
            .load(write("escape.onnx", &external(loc, None)))
            .err()
            .unwrap();
        assert!(matches!(e, Error::ExternalData(_)), "{loc}: {e}");
    }
    // a symlink that points outside
    #[cfg(unix)]
    {
        let link = dir.join("link.bin");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(root.join("secret.bin"), &link).unwrap();
        let e = Session::builder()
            .load(write("link.onnx", &external("link.bin", None)))
            .err()
            .unwrap();
        assert!(matches!(e, Error::ExternalData(_)), "symlink: {e}");
    }
    // file shorter than the tensor
    let e = Session::builder()
        .load(write("short.onnx", &external("short.bin", None)))
        .err()
        .unwrap();
    assert!(matches!(e, Error::ExternalData(_)), "{e}");
    // from bytes, external data has no folder
    let e = Session::builder()
        .load_bytes(&external("w.bin", None).encode_to_vec())
        .err()
        .unwrap();
    assert!(matches!(e, Error::ExternalData(_)), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
