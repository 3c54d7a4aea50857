//! The blocked channel layout (`nxrt_core::fuse::block_convolutions`, on at the default
//! `OptLevel::All`): a MobileNet-like chain (a stem on plain input, a depthwise convolution,
//! a squeeze-and-excitation block, pointwise convolutions with a residual Add) is run blocked
//! and against the same model at `OptLevel::Basic` (plain NCHW kernels), at 1 to 3 threads,
//! with channel counts that fill one, two and three blocks partly, and a value read both by
//! blocked nodes and by a plain one (a `ReorderOutput` mid-graph) as well as graph outputs.

use nxrt::{OptLevel, Session, Tensor};
use nxrt_core::proto::{AttributeProto, GraphProto};

mod common;
use common::{f32s, node, opset17_model, vi, xorshift_data as data};

struct Net {
    c: usize,
    m: usize,
    hw: (usize, usize),
    dw_k: usize,
    dw_dil: usize,
}

#[allow(clippy::too_many_arguments)]
fn conv(
    inp: &str,
    w: &str,
    b: Option<&str>,
    out: &str,
    k: usize,
    s: usize,
    pads: [i64; 4],
    group: usize,
    dil: usize,
) -> nxrt_core::proto::NodeProto {
    let mut i = vec![inp, w];
    i.extend(b);
    let mut n = node("Conv", &i, &[out]);
    n.attribute = vec![
        AttributeProto::int("group", group as i64),
        AttributeProto::ints("kernel_shape", &[k as i64, k as i64]),
        AttributeProto::ints("strides", &[s as i64, s as i64]),
        AttributeProto::ints("dilations", &[dil as i64, dil as i64]),
        AttributeProto::ints("pads", &pads),
    ];
    n
}

/// x -> stem (3x3, stride 2, asymmetric pads) -> HardSwish -> depthwise -> Relu -> times a
/// constant, from a constant (`Mul(a, .)`, `Sub(o, .)`) = d;
/// SE: GlobalAveragePool(d) -> 1x1 -> Relu -> 1x1 -> HardSigmoid -> Mul(d) = e;
/// pointwise(e) = p; pointwise(p) + p -> Relu = y; `tap` = Neg(d) reads d plain.
fn model(n: &Net) -> Vec<u8> {
    let (c, m, k) = (n.c, n.m, n.dw_k);
    let sq = (m / 4).max(1);
    let p = (k - 1) * n.dw_dil / 2;
    let pp = p as i64;
    let nodes = vec![
        conv("x", "w0", Some("b0"), "t0", 3, 2, [1, 0, 1, 1], 1, 1),
        node("HardSwish", &["t0"], &["t1"]),
        conv("t1", "w1", Some("b1"), "t2", k, 1, [pp; 4], m, n.dw_dil),
        node("Relu", &["t2"], &["t3"]),
        // one-element constants as the first operand (the blocked value second)
        node("Mul", &["a", "t3"], &["t4"]),
        node("Sub", &["o", "t4"], &["d"]),
        node("GlobalAveragePool", &["d"], &["g"]),
        conv("g", "w2", Some("b2"), "g1", 1, 1, [0; 4], 1, 1),
        node("Relu", &["g1"], &["g2"]),
        conv("g2", "w3", Some("b3"), "g3", 1, 1, [0; 4], 1, 1),
        node("HardSigmoid", &["g3"], &["s"]),
        node("Mul", &["d", "s"], &["e"]),
        conv("e", "w4", None, "p", 1, 1, [0; 4], 1, 1),
        conv("p", "w5", Some("b5"), "q", 1, 1, [0; 4], 1, 1),
        node("Add", &["q", "p"], &["r"]),
        node("Relu", &["r"], &["y"]),
        node("Neg", &["d"], &["tap"]),
    ];
    let (mi, ci, si) = (m as i64, c as i64, sq as i64);
    let ki = k as i64;
    let init = vec![
        f32s("w0", &[mi, ci, 3, 3], &data(m * c * 9, 1)),
        f32s("b0", &[mi], &data(m, 2)),
        f32s("w1", &[mi, 1, ki, ki], &data(m * k * k, 3)),
        f32s("b1", &[mi], &data(m, 4)),
        f32s("w2", &[si, mi, 1, 1], &data(sq * m, 5)),
        f32s("b2", &[si], &data(sq, 6)),
        f32s("w3", &[mi, si, 1, 1], &data(m * sq, 7)),
        f32s("b3", &[mi], &data(m, 8)),
        f32s("w4", &[mi, mi, 1, 1], &data(m * m, 9)),
        f32s("w5", &[mi, mi, 1, 1], &data(m * m, 10)),
        f32s("b5", &[mi], &data(m, 11)),
        f32s("a", &[1, 1, 1, 1], &[0.75]),
        f32s("o", &[], &[0.25]),
    ];
    let (h, w) = (n.hw.0.to_string(), n.hw.1.to_string());
    opset17_model(GraphProto {
        name: "blocked".into(),
        node: nodes,
        initializer: init,
        input: vec![vi("x", 1, &["2", &c.to_string(), &h, &w])],
        output: vec![vi("y", 1, &[]), vi("tap", 1, &[])],
        ..Default::default()
    })
}

fn run(bytes: &[u8], level: OptLevel, threads: usize, n: &Net) -> (Vec<Vec<f32>>, Vec<String>) {
    let s = Session::builder()
        .optimization(level)
        .threads(threads)
        .load_bytes(bytes)
        .unwrap();
    let (h, w) = n.hw;
    let x = Tensor::from_vec(&[2, n.c, h, w], data(2 * n.c * h * w, 99)).unwrap();
    let out = s.run(vec![("x", x)]).unwrap();
    let vals = ["y", "tap"]
        .iter()
        .map(|k| {
            out[*k]
                .as_tensor()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec()
        })
        .collect();
    let ops = s
        .core()
        .graph()
        .nodes
        .iter()
        .map(|n| {
            let out = n.outputs.first().copied().flatten();
            let name = out.map_or("", |v| s.core().graph().values[v].name.as_str());
            format!("{}:{}->{name}", n.domain, n.op_type)
        })
        .collect();
    (vals, ops)
}

#[test]
fn a_convolution_chain_runs_blocked_with_the_plain_kernels_results() {
    let nets = [
        // one partly filled block, a 3-channel stem input
        Net {
            c: 3,
            m: 12,
            hw: (13, 13),
            dw_k: 3,
            dw_dil: 1,
        },
        // two blocks (the second partly), dilated 5x5 depthwise, a non-square plane
        Net {
            c: 20,
            m: 24,
            hw: (12, 17),
            dw_k: 5,
            dw_dil: 2,
        },
        // three blocks: a pair and a single one
        Net {
            c: 8,
            m: 40,
            hw: (9, 30),
            dw_k: 3,
            dw_dil: 1,
        },
    ];
    for n in &nets {
        let bytes = model(n);
        let (want, plain_ops) = run(&bytes, OptLevel::Basic, 1, n);
        assert!(
            plain_ops.iter().all(|o| !o.starts_with("nxrt:")),
            "{plain_ops:?}"
        );
        for threads in [1, 2, 3] {
            let (got, ops) = run(&bytes, OptLevel::All, threads, n);
            let blocked = ops.iter().filter(|o| o.starts_with("nxrt:Conv->")).count();
            assert_eq!(blocked, 6, "every convolution runs blocked: {ops:?}");
            assert!(
                ops.iter()
                    .any(|o| o.starts_with("nxrt:GlobalAveragePool->")),
                "{ops:?}"
            );
            // y, which no blocked node reads, is written plain by its convolution (with the
            // residual and the Relu); d comes back to the plain layout for Neg, nothing else
            assert!(ops.iter().any(|o| o == "nxrt:Conv->y"), "{ops:?}");
            let back: Vec<_> = ops
                .iter()
                .filter(|o| o.starts_with("nxrt:ReorderOutput->"))
                .collect();
            assert_eq!(back, ["nxrt:ReorderOutput->d"], "{ops:?}");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.len(), w.len());
                let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
                assert!(scale > 0.0);
                for (i, (a, b)) in g.iter().zip(w).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale + 1e-6,
                        "m {} threads {threads} output {k} at {i}: {a} vs {b}",
                        n.m
                    );
                }
            }
        }
    }
}

/// A convolution alone over fewer than 16 input channels (a stem) runs blocked too, reading
/// the plain input and writing the plain output itself (no reorder node), with the plain
/// kernels' results; a lone one over 16 or more channels stays plain.
#[test]
fn a_lone_stem_convolution_runs_blocked_with_plain_input_and_output() {
    for (c, m, blocked) in [(3, 20, true), (7, 33, true), (16, 8, false)] {
        let nodes = vec![conv("x", "w", Some("b"), "y", 3, 1, [1; 4], 1, 1)];
        let (ci, mi) = (c as i64, m as i64);
        let bytes = opset17_model(GraphProto {
            name: "stem".into(),
            node: nodes,
            initializer: vec![
                f32s("w", &[mi, ci, 3, 3], &data(m * c * 9, 21)),
                f32s("b", &[mi], &data(m, 22)),
            ],
            input: vec![vi("x", 1, &["1", &c.to_string(), "9", "23"])],
            output: vec![vi("y", 1, &[])],
            ..Default::default()
        });
        let x = || Tensor::from_vec(&[1, c, 9, 23], data(c * 9 * 23, 23)).unwrap();
        let mut results = Vec::new();
        for level in [OptLevel::Basic, OptLevel::All] {
            let s = Session::builder()
                .optimization(level)
                .threads(2)
                .load_bytes(&bytes)
                .unwrap();
            let out = s.run(vec![("x", x())]).unwrap();
            let y = out["y"].as_tensor().unwrap();
            assert_eq!(y.shape(), &[1, m, 9, 23]);
            results.push(y.as_slice::<f32>().unwrap().to_vec());
            let ops: Vec<String> = s
                .core()
                .graph()
                .nodes
                .iter()
                .map(|n| format!("{}:{}", n.domain, n.op_type))
                .collect();
            let want = if level == OptLevel::All && blocked {
                "nxrt:Conv"
            } else {
                ":Conv"
            };
            assert_eq!(ops, [want], "{c} channels at {level:?}");
        }
        let scale = results[0].iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(scale > 0.0);
        for (i, (a, b)) in results[1].iter().zip(&results[0]).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{c} channels at {i}: {a} vs {b}"
            );
        }
    }
}
