//! I/O binding: outputs bound to host storage are written into it run after run (no
//! allocation: the storage's address stays), with the same answers as plain runs, in planned
//! and eager modes; storage a caller still shares is never written over; bad bindings are
//! typed errors.

mod common;

use common::{f32s, node, opset17_model, vi, xorshift_data};
use nxrt::{Error, ExecMode, IoBinding, Session, Tensor, Value};
use nxrt_core::proto::GraphProto;
use nxrt_core::tensor::Buffer;

/// Outputs made by different kernel families: `m = MatMul(x, w)`, `s = Sigmoid(m)`,
/// `sm = Softmax(m)`, `c = Conv(xi, wc)`, `t = Transpose(x)`.
fn model() -> Vec<u8> {
    let mut conv = node("Conv", &["xi", "wc"], &["c"]);
    conv.attribute.push(nxrt_core::proto::AttributeProto {
        name: "pads".into(),
        r#type: 7,
        ints: vec![1, 1, 1, 1],
        ..Default::default()
    });
    opset17_model(GraphProto {
        name: "bind".into(),
        node: vec![
            node("MatMul", &["x", "w"], &["m"]),
            node("Sigmoid", &["m"], &["s"]),
            node("Softmax", &["m"], &["sm"]),
            conv,
            node("Transpose", &["x"], &["t"]),
        ],
        input: vec![vi("x", 1, &["4", "64"]), vi("xi", 1, &["1", "2", "8", "8"])],
        output: vec![
            vi("m", 1, &["4", "32"]),
            vi("s", 1, &["4", "32"]),
            vi("sm", 1, &["4", "32"]),
            vi("c", 1, &["1", "3", "8", "8"]),
            vi("t", 1, &["64", "4"]),
        ],
        initializer: vec![
            f32s("w", &[64, 32], &xorshift_data(64 * 32, 3)),
            f32s("wc", &[3, 2, 3, 3], &xorshift_data(54, 5)),
        ],
        ..Default::default()
    })
}

const OUTS: [&str; 5] = ["m", "s", "sm", "c", "t"];

fn feeds(seed: u32) -> [(&'static str, Tensor); 2] {
    [
        (
            "x",
            Tensor::from_vec(&[4, 64], xorshift_data(256, seed)).unwrap(),
        ),
        (
            "xi",
            Tensor::from_vec(&[1, 2, 8, 8], xorshift_data(128, seed + 100)).unwrap(),
        ),
    ]
}

fn values(v: &Value) -> Vec<f32> {
    v.as_tensor().unwrap().to_f32_vec().unwrap()
}

fn addr(v: &Value) -> usize {
    match v.as_tensor().unwrap().buffer() {
        Buffer::Host(d, _) => d.as_bytes().unwrap().as_ptr() as usize,
        b => panic!("not host storage: {b:?}"),
    }
}

#[test]
fn bound_outputs_are_written_in_place_with_the_plain_runs_answers() {
    for mode in [ExecMode::Planned, ExecMode::Eager] {
        let s = Session::builder().mode(mode).load_bytes(&model()).unwrap();
        let mut io = IoBinding::new();
        for o in OUTS {
            io.bind_output_to_host(o);
        }
        let mut first: Vec<usize> = Vec::new();
        let runs = 5;
        for r in 0..runs {
            for (n, t) in feeds(r) {
                io.bind_input(n, t);
            }
            s.run_binding(&mut io).unwrap();
            let want = s.run(feeds(r)).unwrap();
            for o in OUTS {
                assert_eq!(
                    values(io.output(o).unwrap()),
                    values(&want[o]),
                    "{mode:?} run {r}: output {o}"
                );
            }
            let now: Vec<usize> = OUTS.iter().map(|o| addr(io.output(o).unwrap())).collect();
            if r == 0 {
                first = now;
            } else {
                assert_eq!(now, first, "{mode:?} run {r}: the bound storage moved");
            }
        }
        let st = io.stats();
        assert_eq!(st.runs, runs as u64);
        assert_eq!(
            st.allocated,
            OUTS.len() as u64,
            "{mode:?}: only the first run allocates"
        );
        assert_eq!(st.written_in_place, (runs as u64 - 1) * OUTS.len() as u64);

        // a caller holding a clone of an output: that run allocates, and the clone keeps the
        // values it had
        let held = io.output("s").unwrap().clone();
        let old = values(&held);
        for (n, t) in feeds(77) {
            io.bind_input(n, t);
        }
        s.run_binding(&mut io).unwrap();
        assert_eq!(
            values(&held),
            old,
            "{mode:?}: a shared output was written over"
        );
        assert_eq!(
            values(io.output("s").unwrap()),
            values(&s.run(feeds(77)).unwrap()["s"])
        );
        assert_eq!(io.stats().allocated, OUTS.len() as u64 + 1);
    }
}

#[test]
fn pre_allocated_outputs_and_bad_bindings() {
    let s = Session::builder().load_bytes(&model()).unwrap();
    let want = s.run(feeds(9)).unwrap();
    // storage of the right type and size: written in place from the first run
    let mut io = IoBinding::new();
    for (n, t) in feeds(9) {
        io.bind_input(n, t);
    }
    let m = Tensor::from_vec(&[4, 32], vec![f32::NAN; 128]).unwrap();
    let before = addr(&Value::Tensor(m.clone()));
    io.bind_output("m", m);
    s.run_binding(&mut io).unwrap();
    assert_eq!(values(io.output("m").unwrap()), values(&want["m"]));
    assert_eq!(addr(io.output("m").unwrap()), before);
    assert_eq!((io.stats().written_in_place, io.stats().allocated), (1, 0));

    // the wrong type or size: a new output, the right answer
    let mut io = IoBinding::new();
    for (n, t) in feeds(9) {
        io.bind_input(n, t);
    }
    io.bind_output("m", Tensor::from_vec(&[4, 32], vec![0i32; 128]).unwrap());
    io.bind_output("s", Tensor::from_vec(&[3], vec![0f32; 3]).unwrap());
    s.run_binding(&mut io).unwrap();
    assert_eq!(values(io.output("m").unwrap()), values(&want["m"]));
    assert_eq!(values(io.output("s").unwrap()), values(&want["s"]));
    assert_eq!((io.stats().written_in_place, io.stats().allocated), (0, 2));
    // only bound outputs are kept
    assert!(io.output("sm").is_none());

    // a name that is not an output
    let mut bad = IoBinding::new();
    for (n, t) in feeds(9) {
        bad.bind_input(n, t);
    }
    bad.bind_output_to_host("nope");
    let e = s.run_binding(&mut bad).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    assert!(
        e.to_string().contains(
            "'nope' is bound as an output but is not one of the model's (outputs: m, s, sm, c, t)"
        ),
        "{e}"
    );
    // no outputs at all
    let mut none = IoBinding::new();
    for (n, t) in feeds(9) {
        none.bind_input(n, t);
    }
    assert!(s.run_binding(&mut none).is_err());
}

/// Outputs bound to the device stay there and, bound as the next run's input, are read where
/// they lie: `y = x * w` chained three times on WebGPU (lavapipe here) equals the same chain
/// on the CPU. Skips, saying so, without a WebGPU adapter.
#[test]
fn device_outputs_feed_the_next_run_in_place() {
    let bytes = opset17_model(GraphProto {
        name: "mul".into(),
        node: vec![node("Mul", &["x", "w"], &["y"])],
        input: vec![vi("x", 1, &["2", "8"])],
        output: vec![vi("y", 1, &["2", "8"])],
        initializer: vec![f32s("w", &[2, 8], &xorshift_data(16, 11))],
        ..Default::default()
    });
    let gpu = match Session::builder()
        .providers(&["webgpu", "cpu"])
        .load_bytes(&bytes)
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: no WebGPU adapter here ({e})");
            return;
        }
    };
    let cpu = Session::builder().load_bytes(&bytes).unwrap();
    let x0 = Tensor::from_vec(&[2, 8], xorshift_data(16, 12)).unwrap();
    let mut io = IoBinding::new();
    io.bind_input("x", x0.clone());
    io.bind_output_to_device("y");
    let mut want = Value::Tensor(x0);
    for step in 0..3 {
        gpu.run_binding(&mut io).unwrap();
        let y = io.take_output("y").unwrap();
        let t = y.as_tensor().unwrap();
        assert!(
            matches!(t.location(), nxrt_core::Location::Device(_)),
            "step {step}: the output was read back ({:?})",
            t.location()
        );
        io.bind_input("x", y);
        want = cpu.run([("x", want)]).unwrap()["y"].clone();
    }
    let (_, last) = io.inputs().find(|(n, _)| *n == "x").unwrap();
    let host = pollster::block_on(gpu.core().download(last.clone())).unwrap();
    let (a, b) = (values(&host), values(&want));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs() / y.abs().max(1e-6)));
    assert!(worst < 1e-5, "webgpu chain {a:?} vs cpu {b:?}");
}
