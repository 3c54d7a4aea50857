//! The CPU fusions (`nxrt_core::fuse`, at `OptLevel::Extended` and the default `All`; run
//! at `Extended` here, where the blocked layout leaves the plain kernels in place): Conv +
//! BatchNormalization folding, Conv + residual Add + activation as one `FusedConv`, and the
//! spelled-out erf GELU as one `Gelu`. Each
//! fused graph is run against the same model at `OptLevel::Basic` (no fusions), on every
//! convolution path (depthwise, pointwise, im2col) and at 1 and 2 threads.

use nxrt::{OptLevel, Session, Tensor};
use nxrt_core::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
use prost::Message;

mod common;
use common::{f32s, node, vi};

fn model(graph: GraphProto) -> Vec<u8> {
    common::opset17_model(graph)
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto::ints(name, v)
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto::int(name, v)
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto::float(name, v)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    common::xorshift_data(n, seed)
}

/// One convolution's shape: channels in/out, group, kernel, stride, pad, spatial size.
#[derive(Clone, Copy)]
struct Case {
    c: usize,
    m: usize,
    group: usize,
    k: usize,
    stride: usize,
    pad: usize,
    hw: usize,
}

impl Case {
    fn out_hw(&self) -> usize {
        (self.hw + 2 * self.pad - self.k) / self.stride + 1
    }
}

const CASES: &[Case] = &[
    // depthwise 3x3, stride 2
    Case {
        c: 8,
        m: 8,
        group: 8,
        k: 3,
        stride: 2,
        pad: 1,
        hw: 9,
    },
    // depthwise 3x3, stride 1, rows wide enough for the kernel that reads the input in place
    // (the activation in registers, Z added before it)
    Case {
        c: 3,
        m: 3,
        group: 3,
        k: 3,
        stride: 1,
        pad: 1,
        hw: 100,
    },
    // pointwise
    Case {
        c: 6,
        m: 10,
        group: 1,
        k: 1,
        stride: 1,
        pad: 0,
        hw: 7,
    },
    // im2col 3x3 with padding, grouped
    Case {
        c: 6,
        m: 4,
        group: 2,
        k: 3,
        stride: 1,
        pad: 1,
        hw: 8,
    },
];

/// x -> Conv(W, B) [-> BatchNormalization] [-> Add(r)] [-> act] -> y, with `tap` also reading
/// the Conv output when set (which must block its fusion).
fn conv_chain(cs: Case, bn: bool, residual: bool, act: Option<NodeProto>, tap: bool) -> Vec<u8> {
    let (c, m, k) = (cs.c, cs.m, cs.k);
    let (hw, oh) = (cs.hw.to_string(), cs.out_hw().to_string());
    let mut conv = node("Conv", &["x", "w", "b"], &["t0"]);
    conv.attribute = vec![
        int("group", cs.group as i64),
        ints("kernel_shape", &[k as i64, k as i64]),
        ints("strides", &[cs.stride as i64, cs.stride as i64]),
        ints("pads", &[cs.pad as i64; 4]),
    ];
    let mut nodes = vec![conv];
    let mut init = vec![
        f32s(
            "w",
            &[m as i64, (c / cs.group) as i64, k as i64, k as i64],
            &data(m * c / cs.group * k * k, 1),
        ),
        f32s("b", &[m as i64], &data(m, 2)),
    ];
    let mut cur = "t0".to_string();
    if bn {
        let mut n = node(
            "BatchNormalization",
            &[&cur, "bn_s", "bn_b", "bn_m", "bn_v"],
            &["t1"],
        );
        n.attribute.push(float("epsilon", 1e-3));
        nodes.push(n);
        init.push(f32s("bn_s", &[m as i64], &data(m, 3)));
        init.push(f32s("bn_b", &[m as i64], &data(m, 4)));
        init.push(f32s("bn_m", &[m as i64], &data(m, 5)));
        let var: Vec<f32> = data(m, 6).iter().map(|v| v.abs() + 0.1).collect();
        init.push(f32s("bn_v", &[m as i64], &var));
        cur = "t1".into();
    }
    let mut inputs = vec![vi("x", 1, &["1", &c.to_string(), &hw, &hw])];
    if residual {
        nodes.push(node("Add", &["r", &cur], &["t2"]));
        inputs.push(vi("r", 1, &["1", &m.to_string(), &oh, &oh]));
        cur = "t2".into();
    }
    if let Some(mut a) = act {
        a.input[0] = cur.clone();
        a.output = vec!["t3".into()];
        nodes.push(a);
        cur = "t3".into();
    }
    nodes.push(node("Identity", &[&cur], &["y"]));
    let mut outputs = vec![vi("y", 1, &[])];
    if tap {
        nodes.push(node("Neg", &["t0"], &["tap"]));
        outputs.push(vi("tap", 1, &[]));
    }
    model(GraphProto {
        name: "chain".into(),
        node: nodes,
        initializer: init,
        input: inputs,
        output: outputs,
        ..Default::default()
    })
}

fn activations() -> Vec<(&'static str, NodeProto)> {
    let mut leaky = node("LeakyRelu", &["_"], &["_"]);
    leaky.attribute.push(float("alpha", 0.3));
    let mut hsig = node("HardSigmoid", &["_"], &["_"]);
    hsig.attribute.push(float("alpha", 0.25));
    vec![
        ("Relu", node("Relu", &["_"], &["_"])),
        ("HardSwish", node("HardSwish", &["_"], &["_"])),
        ("Sigmoid", node("Sigmoid", &["_"], &["_"])),
        ("LeakyRelu", leaky),
        ("HardSigmoid", hsig),
        ("Clip", node("Clip", &["_", "lo", "hi"], &["_"])),
    ]
}

/// Adds Clip's bounds as initializers when the model has a Clip.
fn with_clip_bounds(bytes: Vec<u8>) -> Vec<u8> {
    let mut m = ModelProto::decode(bytes.as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    if g.node.iter().any(|n| n.op_type == "Clip") {
        let scalar = |name: &str, v: f32| TensorProto {
            name: name.into(),
            data_type: 1,
            float_data: vec![v],
            ..Default::default()
        };
        g.initializer.push(scalar("lo", -0.25));
        g.initializer.push(scalar("hi", 0.5));
    }
    m.encode_to_vec()
}

fn run(bytes: &[u8], level: OptLevel, threads: usize, cs: Case) -> (Vec<Tensor>, Vec<String>) {
    let s = Session::builder()
        .optimization(level)
        .threads(threads)
        .load_bytes(bytes)
        .unwrap();
    let x = Tensor::from_vec(&[1, cs.c, cs.hw, cs.hw], data(cs.c * cs.hw * cs.hw, 7)).unwrap();
    let oh = cs.out_hw();
    let r = Tensor::from_vec(&[1, cs.m, oh, oh], data(cs.m * oh * oh, 8)).unwrap();
    let names: Vec<String> = s.inputs().iter().map(|i| i.name.clone()).collect();
    let feeds: Vec<(&str, Tensor)> = names
        .iter()
        .map(|n| (n.as_str(), if n == "x" { x.clone() } else { r.clone() }))
        .collect();
    let out = s.run(feeds).unwrap();
    let mut tensors = vec![out["y"].as_tensor().unwrap().clone()];
    if let Some(t) = out.get("tap") {
        tensors.push(t.as_tensor().unwrap().clone());
    }
    (tensors, op_types(&s))
}

/// The op of each node of the session's optimised graph, in order.
fn op_types(s: &Session) -> Vec<String> {
    s.core()
        .graph()
        .nodes
        .iter()
        .map(|n| n.op_type.clone())
        .collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn conv_add_and_activation_fuse_into_one_node_with_identical_results() {
    for &cs in CASES {
        for (name, act) in activations() {
            for residual in [false, true] {
                let bytes =
                    with_clip_bounds(conv_chain(cs, false, residual, Some(act.clone()), false));
                for threads in [1, 2] {
                    let (want, plain_ops) = run(&bytes, OptLevel::Basic, threads, cs);
                    let (got, ops) = run(&bytes, OptLevel::Extended, threads, cs);
                    assert!(plain_ops.iter().any(|o| o == name), "{plain_ops:?}");
                    assert_eq!(
                        ops,
                        ["FusedConv", "Identity"],
                        "{name} residual {residual}: the chain is one node"
                    );
                    // the same vector activation, applied to the same sums: bit-identical
                    assert_eq!(
                        values(&got[0]),
                        values(&want[0]),
                        "{name} residual {residual} group {} k {} threads {threads}",
                        cs.group,
                        cs.k
                    );
                }
            }
        }
    }
}

#[test]
fn batch_normalization_folds_into_the_convolution() {
    for &cs in CASES {
        for act in [None, Some(node("Relu", &["_"], &["_"]))] {
            let bytes = conv_chain(cs, true, true, act.clone(), false);
            let (want, plain_ops) = run(&bytes, OptLevel::Basic, 1, cs);
            let (got, ops) = run(&bytes, OptLevel::Extended, 1, cs);
            assert!(plain_ops.iter().any(|o| o == "BatchNormalization"));
            assert_eq!(ops, ["FusedConv", "Identity"], "BN, Add and act fold away");
            let (g, w) = (values(&got[0]), values(&want[0]));
            let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                // one rounding of w * s instead of a separate multiply per output
                assert!(
                    (a - b).abs() <= 1e-5 * scale + 1e-6,
                    "group {} act {}: at {i}: {a} vs {b}",
                    cs.group,
                    act.is_some()
                );
            }
            assert_ne!(
                g,
                values(
                    &run(
                        &conv_chain(cs, false, true, act, false),
                        OptLevel::Extended,
                        1,
                        cs
                    )
                    .0[0]
                ),
                "the BN's effect is in the result"
            );
        }
    }
}

#[test]
fn a_convolution_read_twice_or_exposed_is_not_fused() {
    let cs = CASES[2];
    let bytes = conv_chain(cs, true, true, Some(node("Relu", &["_"], &["_"])), true);
    let (want, _) = run(&bytes, OptLevel::Basic, 1, cs);
    let (got, ops) = run(&bytes, OptLevel::Extended, 1, cs);
    // the Conv's output is also read by Neg: nothing may fold into it
    assert!(ops.iter().any(|o| o == "Conv"), "{ops:?}");
    assert!(ops.iter().any(|o| o == "BatchNormalization"), "{ops:?}");
    assert_eq!(values(&got[0]), values(&want[0]));
    assert_eq!(values(&got[1]), values(&want[1]));
}

/// `y = Conv(x); out = Div(Mul(Clip(Add(y, 3), 0, 6), y), 6)`, as PaddlePaddle exports
/// HardSwish (`tap`: the Conv output is also read by another node).
fn spelled_hardswish(cs: Case, tap: bool) -> Vec<u8> {
    let mut m = ModelProto::decode(conv_chain(cs, false, false, None, tap).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.node.retain(|n| n.op_type != "Identity");
    g.node.push(node("Add", &["t0", "three"], &["a"]));
    g.node.push(node("Clip", &["a", "zero", "six"], &["k"]));
    g.node.push(node("Mul", &["k", "t0"], &["mm"]));
    g.node.push(node("Div", &["mm", "six"], &["y"]));
    for (name, v) in [("three", 3.0f32), ("zero", 0.0), ("six", 6.0)] {
        g.initializer.push(TensorProto {
            name: name.into(),
            data_type: 1,
            float_data: vec![v],
            ..Default::default()
        });
    }
    m.encode_to_vec()
}

#[test]
fn hardswish_spelled_out_after_a_convolution_fuses_with_identical_results() {
    for &cs in CASES {
        let bytes = spelled_hardswish(cs, false);
        for threads in [1, 2] {
            let (want, plain_ops) = run(&bytes, OptLevel::Basic, threads, cs);
            let (got, ops) = run(&bytes, OptLevel::Extended, threads, cs);
            assert_eq!(plain_ops, ["Conv", "Add", "Clip", "Mul", "Div"]);
            assert_eq!(ops, ["FusedConv"], "the chain is one node");
            assert_eq!(
                values(&got[0]),
                values(&want[0]),
                "group {} threads {threads}",
                cs.group
            );
        }
    }
    // with the Conv output also read elsewhere the chain stays as it is
    let (_, ops) = run(
        &spelled_hardswish(CASES[0], true),
        OptLevel::Extended,
        1,
        CASES[0],
    );
    assert!(ops.iter().any(|o| o == "Div"), "{ops:?}");
}

#[test]
fn constant_scales_and_shifts_fold_into_the_convolution() {
    // Conv -> Mul(scalar) -> Add(one per channel, [1, M, 1, 1]) -> Mul(one per channel,
    // [M, 1, 1]) -> Relu: the affine steps fold into W and B, the Relu into the epilogue
    // (with and without a bias input: the folds then make one, and the next fold extends it)
    for (&cs, with_bias) in CASES.iter().flat_map(|c| [(c, true), (c, false)]) {
        let mut m =
            ModelProto::decode(conv_chain(cs, false, false, None, false).as_slice()).unwrap();
        let g = m.graph.as_mut().unwrap();
        g.node.retain(|n| n.op_type != "Identity");
        if !with_bias {
            g.node[0].input.truncate(2);
        }
        g.node.push(node("Mul", &["s", "t0"], &["u1"]));
        g.node.push(node("Add", &["u1", "c"], &["u2"]));
        g.node.push(node("Mul", &["u2", "s2"], &["u3"]));
        g.node.push(node("Relu", &["u3"], &["y"]));
        let mm = cs.m as i64;
        g.initializer.push(f32s("s", &[1], &[1.7]));
        g.initializer
            .push(f32s("c", &[1, mm, 1, 1], &data(cs.m, 9)));
        g.initializer.push(f32s("s2", &[mm, 1, 1], &data(cs.m, 10)));
        let bytes = m.encode_to_vec();
        let (want, plain_ops) = run(&bytes, OptLevel::Basic, 1, cs);
        let (got, ops) = run(&bytes, OptLevel::Extended, 1, cs);
        assert_eq!(plain_ops, ["Conv", "Mul", "Add", "Mul", "Relu"]);
        assert_eq!(ops, ["FusedConv"], "the chain is one node");
        let (g, w) = (values(&got[0]), values(&want[0]));
        let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(scale > 0.0);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "group {} bias {with_bias}: at {i}: {a} vs {b}",
                cs.group
            );
        }
    }
}

#[test]
fn weights_packed_at_load_are_reported_and_can_be_turned_off() {
    // the pointwise and the 3x3 case (depthwise weights are read as they are, never packed)
    for &cs in CASES.iter().filter(|cs| cs.group < cs.c) {
        let bytes = conv_chain(cs, false, false, None, false);
        let x = Tensor::from_vec(&[1, cs.c, cs.hw, cs.hw], data(cs.c * cs.hw * cs.hw, 7)).unwrap();
        let go = |prepack: bool| {
            let s = Session::builder()
                .optimization(OptLevel::Extended)
                .prepack_weights(prepack)
                .load_bytes(&bytes)
                .unwrap();
            let held = s.partition().prepacked_bytes;
            let y = values(
                s.run(vec![("x", x.clone())]).unwrap()["y"]
                    .as_tensor()
                    .unwrap(),
            );
            (held, y)
        };
        let (held, packed) = go(true);
        let (none, plain) = go(false);
        // W is [m, c/group, k, k]: each group's rows padded to whole panels of A
        assert!(
            held >= cs.m * (cs.c / cs.group) * cs.k * cs.k * 4,
            "{held} bytes packed for group {} k {}",
            cs.group,
            cs.k
        );
        assert_eq!(none, 0, "nothing packed when turned off");
        assert_eq!(packed, plain, "group {} k {}", cs.group, cs.k);
    }
}

/// `y = GELU(x)` spelled out as exporters write it, `variant` choosing the grouping:
/// 0: `(x * (1 + erf(x / sqrt2))) * 0.5`; 1: `(x * 0.5) * (1 + erf(x * 1/sqrt2))`;
/// 2: `x * ((erf(x / sqrt2) + 1) * 0.5)`. With `tap` the Erf output is also a graph output.
fn spelled_gelu(variant: usize, tap: bool, sqrt2: f32) -> Vec<u8> {
    let mut nodes = vec![];
    if variant == 1 {
        nodes.push(node("Mul", &["x", "isq"], &["d"]));
    } else {
        nodes.push(node("Div", &["x", "sq"], &["d"]));
    }
    nodes.push(node("Erf", &["d"], &["e"]));
    match variant {
        0 => {
            nodes.push(node("Add", &["e", "one"], &["a"]));
            nodes.push(node("Mul", &["x", "a"], &["m"]));
            nodes.push(node("Mul", &["m", "half"], &["y"]));
        }
        1 => {
            nodes.push(node("Mul", &["x", "half"], &["h"]));
            nodes.push(node("Add", &["one", "e"], &["a"]));
            nodes.push(node("Mul", &["h", "a"], &["y"]));
        }
        _ => {
            nodes.push(node("Add", &["e", "one"], &["a"]));
            nodes.push(node("Mul", &["half", "a"], &["m"]));
            nodes.push(node("Mul", &["m", "x"], &["y"]));
        }
    }
    let mut outputs = vec![vi("y", 1, &["n", "64"])];
    if tap {
        outputs.push(vi("e", 1, &["n", "64"]));
    }
    model(GraphProto {
        name: "gelu".into(),
        node: nodes,
        input: vec![vi("x", 1, &["n", "64"])],
        output: outputs,
        initializer: vec![
            f32s("sq", &[], &[sqrt2]),
            f32s("isq", &[], &[1.0 / sqrt2]),
            f32s("one", &[], &[1.0]),
            f32s("half", &[], &[0.5]),
        ],
        ..Default::default()
    })
}

/// Runs `bytes` on x = 3 rows of 64 values over [-6, 6) (where erf saturates and where it
/// does not): y and the ops left.
fn run_gelu(bytes: &[u8], level: OptLevel, threads: usize) -> (Vec<f32>, Vec<String>) {
    let s = Session::builder()
        .optimization(level)
        .threads(threads)
        .load_bytes(bytes)
        .unwrap();
    let xs: Vec<f32> = data(192, 3).iter().map(|v| v * 6.0).collect();
    let x = Tensor::from_vec(&[3, 64], xs).unwrap();
    let out = s.run(vec![("x", x)]).unwrap();
    let y = values(out["y"].as_tensor().unwrap());
    (y, op_types(&s))
}

#[test]
fn gelu_spelled_out_fuses_into_one_node_within_a_few_ulp() {
    for variant in 0..3 {
        let bytes = spelled_gelu(variant, false, std::f32::consts::SQRT_2);
        for threads in [1, 2] {
            let (want, plain_ops) = run_gelu(&bytes, OptLevel::Basic, threads);
            let (got, ops) = run_gelu(&bytes, OptLevel::Extended, threads);
            assert_eq!(plain_ops.len(), 5, "{plain_ops:?}");
            assert_eq!(ops, ["Gelu"], "variant {variant}: the chain is one node");
            let xs: Vec<f32> = data(192, 3).iter().map(|v| v * 6.0).collect();
            for (i, ((a, b), x)) in got.iter().zip(&want).zip(&xs).enumerate() {
                // the chain's 1 + erf has an absolute error of an ulp of 1 (it cancels near
                // erf = -1), so the chain is exact only to an ulp of x / 2
                let tol = 4.0 * f32::EPSILON * (b.abs() + 0.5 * x.abs());
                assert!(
                    (a - b).abs() <= tol,
                    "variant {variant}: at {i}: {a} vs {b}"
                );
            }
        }
    }
    // an intermediate read outside the chain, or a constant that is not 1/sqrt 2's
    // reciprocal, leaves the chain as it is
    let (_, ops) = run_gelu(
        &spelled_gelu(0, true, std::f32::consts::SQRT_2),
        OptLevel::Extended,
        1,
    );
    assert!(ops.iter().any(|o| o == "Erf"), "{ops:?}");
    let (_, ops) = run_gelu(&spelled_gelu(0, false, 1.5), OptLevel::Extended, 1);
    assert!(ops.iter().any(|o| o == "Erf"), "{ops:?}");
    // a one-element constant of higher rank than x broadcasts the result to its rank: the
    // chain computes a [1, 3, 64] result, which a Gelu of x could not
    let mut m =
        ModelProto::decode(spelled_gelu(0, false, std::f32::consts::SQRT_2).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.initializer
        .iter_mut()
        .find(|t| t.name == "half")
        .unwrap()
        .dims = vec![1, 1, 1];
    g.output[0] = vi("y", 1, &["1", "n", "64"]);
    let bytes = m.encode_to_vec();
    let (want, _) = run_gelu(&bytes, OptLevel::Basic, 1);
    let (got, ops) = run_gelu(&bytes, OptLevel::Extended, 1);
    assert!(ops.iter().any(|o| o == "Erf"), "{ops:?}");
    assert_eq!(got, want);
}

/// The tanh GELU spelled out: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`, the cube
/// as `x * (x * (0.044715 * x))` (jax's spelling) or as `Pow(x, 3) * 0.044715` (PyTorch's),
/// with `coef` in place of 0.044715.
fn spelled_gelu_tanh(pow: bool, coef: f32) -> Vec<u8> {
    let mut nodes = vec![];
    if pow {
        nodes.push(node("Pow", &["x", "three"], &["p3"]));
        nodes.push(node("Mul", &["p3", "c"], &["cube"]));
    } else {
        nodes.push(node("Mul", &["c", "x"], &["c1"]));
        nodes.push(node("Mul", &["x", "c1"], &["c2"]));
        nodes.push(node("Mul", &["x", "c2"], &["cube"]));
    }
    nodes.push(node("Add", &["x", "cube"], &["inner"]));
    nodes.push(node("Mul", &["k", "inner"], &["arg"]));
    nodes.push(node("Tanh", &["arg"], &["t"]));
    nodes.push(node("Add", &["one", "t"], &["a"]));
    nodes.push(node("Mul", &["half", "a"], &["m"]));
    nodes.push(node("Mul", &["x", "m"], &["y"]));
    model(GraphProto {
        name: "gelu_tanh".into(),
        node: nodes,
        input: vec![vi("x", 1, &["n", "64"])],
        output: vec![vi("y", 1, &["n", "64"])],
        initializer: vec![
            f32s("c", &[], &[coef]),
            f32s("three", &[], &[3.0]),
            f32s("k", &[], &[(2.0 / std::f32::consts::PI).sqrt()]),
            f32s("one", &[1, 1], &[1.0]),
            f32s("half", &[], &[0.5]),
        ],
        ..Default::default()
    })
}

#[test]
fn tanh_gelu_spelled_out_fuses_into_one_node() {
    for pow in [false, true] {
        let bytes = spelled_gelu_tanh(pow, 0.044715);
        for threads in [1, 2] {
            let (want, plain_ops) = run_gelu(&bytes, OptLevel::Basic, threads);
            let (got, ops) = run_gelu(&bytes, OptLevel::Extended, threads);
            assert!(plain_ops.iter().any(|o| o == "Tanh"), "{plain_ops:?}");
            assert_eq!(ops, ["Gelu"], "pow {pow}: the chain is one node");
            // the x values run_gelu feeds
            let xs: Vec<f32> = data(192, 3).iter().map(|v| v * 6.0).collect();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                // the chain's 1 + tanh cancels near tanh = -1 (an ulp of 1 times x / 2)
                let tol = 8.0 * f32::EPSILON * (b.abs() + 0.5 * xs[i].abs());
                assert!((a - b).abs() <= tol, "pow {pow}: at {i}: {a} vs {b}");
            }
        }
    }
    // another coefficient is another function: left as it is
    let (_, ops) = run_gelu(&spelled_gelu_tanh(false, 0.05), OptLevel::Extended, 1);
    assert!(ops.iter().any(|o| o == "Tanh"), "{ops:?}");
}

/// `conv_chain`'s activation output followed by `Max(t3, lo)` and `Min(., hi)` with one-element
/// constants (`lo_shape`: the Max constant's shape), then y.
fn with_bounds(bytes: Vec<u8>, lo_shape: &[i64]) -> Vec<u8> {
    let mut m = ModelProto::decode(bytes.as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let id = g.node.iter().position(|n| n.op_type == "Identity").unwrap();
    g.node[id].input[0] = "t5".into();
    g.node.insert(id, node("Min", &["t4", "mn"], &["t5"]));
    g.node.insert(id, node("Max", &["t3", "mx"], &["t4"]));
    let n: i64 = lo_shape.iter().product();
    let lo: Vec<f32> = (0..n).map(|i| -0.2 - 0.01 * i as f32).collect();
    g.initializer.push(f32s("mx", lo_shape, &lo));
    g.initializer.push(f32s("mn", &[1, 1, 1, 1], &[0.3]));
    m.encode_to_vec()
}

#[test]
fn bounds_after_a_piecewise_linear_activation_fuse_with_identical_results() {
    let piecewise = ["Relu", "LeakyRelu", "Clip"];
    for &cs in CASES {
        for (name, act) in activations() {
            let chain = conv_chain(cs, false, true, Some(act.clone()), false);
            let bytes = with_clip_bounds(with_bounds(chain, &[]));
            let (want, plain_ops) = run(&bytes, OptLevel::Basic, 2, cs);
            assert!(plain_ops.iter().any(|o| o == "Max"), "{plain_ops:?}");
            let (got, ops) = run(&bytes, OptLevel::Extended, 2, cs);
            if piecewise.contains(&name) {
                assert_eq!(ops, ["FusedConv", "Identity"], "{name}: one node");
            } else {
                // a smooth activation keeps its bounds as nodes
                assert_eq!(ops, ["FusedConv", "Max", "Min", "Identity"], "{name}");
            }
            assert_eq!(values(&got[0]), values(&want[0]), "{name} k {}", cs.k);
        }
        // a per-channel bound broadcasts: not a bound of the activation, left as it is
        let (_, leaky) = &activations()[3];
        let chain = conv_chain(cs, false, false, Some(leaky.clone()), false);
        let bytes = with_bounds(chain, &[cs.m as i64, 1, 1]);
        let (want, _) = run(&bytes, OptLevel::Basic, 1, cs);
        let (got, ops) = run(&bytes, OptLevel::Extended, 1, cs);
        assert_eq!(ops, ["FusedConv", "Max", "Min", "Identity"]);
        assert_eq!(values(&got[0]), values(&want[0]));
    }
}
