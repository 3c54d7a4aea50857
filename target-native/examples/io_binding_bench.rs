//! What I/O binding saves: `y = Sigmoid(x)` over `n` floats run plainly (each run allocates its
//! output) and through an `IoBinding` (the output written into the previous run's storage),
//! interleaved round by round on one session, 1 thread; medians per run.
//!
//! `cargo run --release -p nxrt --example io_binding_bench -- [--rounds R] [--runs K]`

use std::time::Instant;

use nxrt::{IoBinding, Session, Tensor};
use nxrt_core::proto::{
    tensor_shape_proto::{dimension::Value as D, Dimension},
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use prost::Message;

fn vi(name: &str, n: usize) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(TensorShapeProto {
                    dim: vec![Dimension {
                        value: Some(D::DimValue(n as i64)),
                        ..Default::default()
                    }],
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn model(n: usize) -> Vec<u8> {
    ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "sigmoid".into(),
            node: vec![NodeProto {
                op_type: "Sigmoid".into(),
                name: "s".into(),
                input: vec!["x".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![vi("x", n)],
            output: vec![vi("y", n)],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn arg(args: &[String], flag: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |r| r.parse().expect("a number"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = arg(&args, "--rounds", 7);
    let runs = arg(&args, "--runs", 20);
    println!("Sigmoid over n floats, 1 thread, median of {rounds} rounds x {runs} runs each, interleaved");
    println!(
        "{:>9} {:>12} {:>12} {:>7}  in place",
        "n", "plain ms", "bound ms", "ratio"
    );
    for n in [16 << 10, 256 << 10, 1 << 20, 4 << 20] {
        let s = Session::builder().threads(1).load_bytes(&model(n)).unwrap();
        let x =
            Tensor::from_vec(&[n], (0..n).map(|i| (i % 97) as f32 / 10.0 - 4.0).collect()).unwrap();
        let mut io = IoBinding::new();
        io.bind_input("x", x.clone());
        io.bind_output_to_host("y");
        // warm-up: plans, the first allocation of the bound output
        for _ in 0..3 {
            s.run([("x", x.clone())]).unwrap();
            s.run_binding(&mut io).unwrap();
        }
        let (mut plain, mut bound) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            let time_plain = || {
                let t = Instant::now();
                for _ in 0..runs {
                    let out = s.run([("x", x.clone())]).unwrap();
                    std::hint::black_box(&out);
                }
                t.elapsed().as_secs_f64() * 1e3 / runs as f64
            };
            let p0 = if r % 2 == 0 { Some(time_plain()) } else { None };
            let t = Instant::now();
            for _ in 0..runs {
                s.run_binding(&mut io).unwrap();
                std::hint::black_box(io.output("y"));
            }
            bound.push(t.elapsed().as_secs_f64() * 1e3 / runs as f64);
            plain.push(p0.unwrap_or_else(time_plain));
        }
        // the same answer both ways
        let want = s.run([("x", x.clone())]).unwrap()["y"]
            .as_tensor()
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let got = io
            .output("y")
            .unwrap()
            .as_tensor()
            .unwrap()
            .to_f32_vec()
            .unwrap();
        assert_eq!(want, got);
        let (p, b) = (median(plain), median(bound));
        let st = io.stats();
        println!(
            "{n:>9} {p:>12.4} {b:>12.4} {:>7.2}  {} of {}",
            b / p,
            st.written_in_place,
            st.runs
        );
    }
}
