//! Elementwise kernels split across threads: every broadcasting form of the f32 binary ops
//! (same shape, a repeating row, a scalar, the repeating operand on either side), in place
//! and not, and a vector activation, on tensors large enough to be split, give at 1, 2 and 3
//! threads exactly what the element-by-element definition gives.

use nxrt::{Session, Tensor};
use nxrt_core::proto::{GraphProto, ModelProto, OperatorSetIdProto};
use prost::Message;

mod common;
use common::{node, vi};

const R: usize = 301; // rows: not a multiple of any chunk
const W: usize = 384;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 16_777_216.0
                - 0.5
        })
        .collect()
}

/// a, c: [R, W]; row: [W]; s: [1].
///   sum = a + c (same shape, a fresh output), prod = (a + c) * row (in place on a dying
///   intermediate), diff = row - a (the repeating operand on the left), quot = a / s (a
///   scalar), sig = Sigmoid(a * c) (in place), lhs = row * (c - a) (in place, repeating lhs),
///   back = (a - (c + c)) / s (a chain of intermediates, each may be written in place)
fn model() -> Vec<u8> {
    let f = 1;
    let (rw, w) = (R.to_string(), W.to_string());
    let full = [rw.as_str(), w.as_str()];
    ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "elementwise".into(),
            node: vec![
                node("Add", &["a", "c"], &["sum"]),
                node("Add", &["a", "c"], &["t"]),
                node("Mul", &["t", "row"], &["prod"]),
                node("Sub", &["row", "a"], &["diff"]),
                node("Div", &["a", "s"], &["quot"]),
                node("Mul", &["a", "c"], &["m"]),
                node("Sigmoid", &["m"], &["sig"]),
                node("Sub", &["c", "a"], &["d"]),
                node("Mul", &["row", "d"], &["lhs"]),
                node("Add", &["c", "c"], &["e"]),
                node("Sub", &["a", "e"], &["f"]),
                node("Div", &["f", "s"], &["back"]),
                node("Mul", &["a", "col"], &["cm"]),
                node("Sub", &["col", "c"], &["cs"]),
            ],
            input: vec![
                vi("a", f, &full),
                vi("c", f, &full),
                vi("row", f, &[w.as_str()]),
                vi("s", f, &["1"]),
                vi("col", f, &[rw.as_str(), "1"]),
            ],
            output: [
                "sum", "prod", "diff", "quot", "sig", "lhs", "back", "cm", "cs",
            ]
            .iter()
            .map(|n| vi(n, f, &full))
            .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn run(threads: usize) -> Vec<Vec<f32>> {
    let s = Session::builder()
        .threads(threads)
        .load_bytes(&model())
        .unwrap();
    let feeds = [
        ("a", Tensor::from_vec(&[R, W], data(R * W, 1)).unwrap()),
        ("c", Tensor::from_vec(&[R, W], data(R * W, 2)).unwrap()),
        ("row", Tensor::from_vec(&[W], data(W, 3)).unwrap()),
        ("s", Tensor::from_vec(&[1], vec![0.37f32]).unwrap()),
        ("col", Tensor::from_vec(&[R, 1], data(R, 4)).unwrap()),
    ];
    let out = s.run(feeds).unwrap();
    [
        "sum", "prod", "diff", "quot", "sig", "lhs", "back", "cm", "cs",
    ]
    .iter()
    .map(|n| out[*n].as_tensor().unwrap().to_f32_vec().unwrap())
    .collect()
}

#[test]
fn split_elementwise_passes_give_the_elementwise_definition() {
    let (a, c, row) = (data(R * W, 1), data(R * W, 2), data(W, 3));
    let s = 0.37f32;
    let want_sum: Vec<f32> = a.iter().zip(&c).map(|(x, y)| x + y).collect();
    let want_prod: Vec<f32> = (0..R * W).map(|i| (a[i] + c[i]) * row[i % W]).collect();
    let want_diff: Vec<f32> = (0..R * W).map(|i| row[i % W] - a[i]).collect();
    let want_quot: Vec<f32> = a.iter().map(|x| x / s).collect();
    let want_lhs: Vec<f32> = (0..R * W).map(|i| row[i % W] * (c[i] - a[i])).collect();
    let want_back: Vec<f32> = (0..R * W).map(|i| (a[i] - (c[i] + c[i])) / s).collect();
    // a [R, 1] column repeating along each row (a middle-dims broadcast), on either side
    let col = data(R, 4);
    let want_cm: Vec<f32> = (0..R * W).map(|i| a[i] * col[i / W]).collect();
    let want_cs: Vec<f32> = (0..R * W).map(|i| col[i / W] - c[i]).collect();
    let one = run(1);
    for threads in [1, 2, 3] {
        let got = if threads == 1 {
            one.clone()
        } else {
            run(threads)
        };
        let exact = [
            ("sum", &got[0], &want_sum),
            ("prod", &got[1], &want_prod),
            ("diff", &got[2], &want_diff),
            ("quot", &got[3], &want_quot),
            ("lhs", &got[5], &want_lhs),
            ("back", &got[6], &want_back),
            ("cm", &got[7], &want_cm),
            ("cs", &got[8], &want_cs),
        ];
        for (name, g, w) in exact {
            assert_eq!(g.len(), w.len());
            for i in 0..w.len() {
                assert_eq!(g[i], w[i], "{name} at {i}, {threads} thread(s)");
            }
        }
        // the activation: the same vector code whatever the split, near the definition
        for i in 0..R * W {
            let want = 1.0 / (1.0 + (-(a[i] as f64 * c[i] as f64)).exp());
            assert!((got[4][i] as f64 - want).abs() < 1e-6, "sig at {i}");
            assert_eq!(got[4][i], one[4][i], "sig at {i}, {threads} thread(s)");
        }
    }
}
