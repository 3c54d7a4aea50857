//! The com.microsoft activations of BERT-style encoders on WebGPU (Gelu, FastGelu, BiasGelu,
//! QuickGelu, BiasAdd) against core's CPU kernels: with and without a bias, odd sizes, and
//! chained into the element-wise ops around them (one fused dispatch).
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

fn case(op: &'static str, shape: &[usize], bias: bool, seed: u32) -> Case {
    let c = *shape.last().unwrap();
    // values over the range where the GELU forms differ from the identity and from zero
    let x = nxrt_core::Tensor::from_vec(
        shape,
        vals(shape.iter().product(), seed)
            .iter()
            .map(|v| 4.0 * v)
            .collect(),
    )
    .unwrap();
    let mut feeds = vec![x];
    if bias {
        feeds.push(ft(&[c], seed + 1));
    }
    Case::new(op, feeds).domain("com.microsoft").atol(2e-6)
}

#[test]
fn gelu_family() {
    for (k, shape) in [&[2, 3, 17][..], &[1, 1031], &[5, 8, 64]]
        .iter()
        .enumerate()
    {
        let seed = 10 * k as u32;
        case("Gelu", shape, false, seed).check();
        case("FastGelu", shape, false, seed + 1).check();
        case("FastGelu", shape, true, seed + 2).check();
        case("BiasGelu", shape, true, seed + 3).check();
        case("QuickGelu", shape, false, seed + 4).check();
        case("QuickGelu", shape, false, seed + 5)
            .attr(af("alpha", 1.25))
            .check();
    }
}

#[test]
fn bias_add() {
    for (k, shape) in [&[2, 3, 17][..], &[1, 7, 320]].iter().enumerate() {
        let seed = 10 * k as u32;
        let mut c = case("BiasAdd", shape, true, seed);
        c.feeds.push(ft(shape, seed + 7));
        c.check();
    }
}

#[test]
fn a_bias_that_does_not_fit_the_last_axis_is_an_error_on_both() {
    let Some(g) = gpu() else { return };
    let mut c = case("FastGelu", &[2, 6], false, 1);
    c.feeds.push(ft(&[3], 2));
    for (providers, on) in [(vec![g, cpu()], "webgpu"), (vec![cpu()], "cpu")] {
        let m =
            nxrt_core::loader::load_model(&c.model(), &nxrt_core::loader::NoExternalData).unwrap();
        let s = nxrt_core::Session::new(m, providers, &Default::default()).unwrap();
        assert_eq!(s.partition().assignments[0].2, on);
        let feeds = c
            .feeds
            .iter()
            .enumerate()
            .map(|(k, t)| (format!("x{k}"), nxrt_core::Value::Tensor(t.clone())))
            .collect();
        let err = pollster::block_on(s.run_async(feeds))
            .unwrap_err()
            .to_string();
        assert!(err.contains("bias of shape [3]"), "{err}");
    }
}

/// com.microsoft RotaryEmbedding (X, position_ids, cos_cache, sin_cache): 3-D input with and
/// without `num_heads`, partial rotary, 4-D input, halves and interleaved pairs, position ids
/// per token or one start position.
#[test]
fn rotary_embedding_com_microsoft() {
    let rows = 40;
    type Cfg<'a> = (&'a [usize], usize, usize, bool, bool);
    let cases: [Cfg; 5] = [
        // (x shape, num_heads, rotary_embedding_dim, interleaved, per-token positions)
        (&[2, 3, 4 * 16], 4, 0, false, true),
        (&[2, 3, 4 * 16], 0, 0, true, false),
        (&[1, 5, 3 * 32], 3, 16, false, true),
        (&[2, 3, 5, 16], 0, 0, false, true),
        (&[1, 2, 7, 12], 0, 0, true, false),
    ];
    for (k, (shape, heads, rd, inter, per_token)) in cases.into_iter().enumerate() {
        let seed = 10 * k as u32;
        let head = if shape.len() == 4 {
            shape[3]
        } else {
            shape[2].checked_div(heads).unwrap_or(16)
        };
        let half = if rd > 0 { rd / 2 } else { head / 2 };
        let (b, s) = if shape.len() == 4 {
            (shape[0], shape[2])
        } else {
            (shape[0], shape[1])
        };
        let pos = if per_token {
            it(
                &[b, s],
                (0..b * s).map(|i| ((i * 7 + 3) % rows) as i64).collect(),
            )
        } else {
            it(&[1], vec![11])
        };
        let mut c = Case::new("RotaryEmbedding", vec![ft(shape, seed), pos])
            .domain("com.microsoft")
            .consts(vec![
                Some(ft(&[rows, half], seed + 1)),
                Some(ft(&[rows, half], seed + 2)),
            ])
            .attr(ai("interleaved", inter as i64))
            .atol(1e-5);
        if heads > 0 {
            c = c.attr(ai("num_heads", heads as i64));
        }
        if rd > 0 {
            c = c.attr(ai("rotary_embedding_dim", rd as i64));
        }
        c.check();
    }
}

/// ONNX RotaryEmbedding (opset 23: X, cos_cache, sin_cache, position_ids): 4-D with position
/// ids, 3-D with per-token caches and no position ids, partial rotary.
#[test]
fn rotary_embedding_onnx() {
    let (b, s) = (2, 3);
    Case::new("RotaryEmbedding", vec![ft(&[b, 4, s, 16], 1)])
        .consts(vec![
            Some(ft(&[20, 8], 2)),
            Some(ft(&[20, 8], 3)),
            Some(it(&[b, s], vec![0, 5, 9, 19, 2, 2])),
        ])
        .opset(23)
        .atol(1e-5)
        .check();
    Case::new("RotaryEmbedding", vec![ft(&[b, s, 2 * 32], 4)])
        .consts(vec![Some(ft(&[b, s, 8], 5)), Some(ft(&[b, s, 8], 6))])
        .attr(ai("num_heads", 2))
        .attr(ai("rotary_embedding_dim", 16))
        .attr(ai("interleaved", 1))
        .opset(23)
        .atol(1e-5)
        .check();
}
