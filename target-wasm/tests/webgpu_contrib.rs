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
    for providers in [vec![g, cpu()], vec![cpu()]] {
        let m =
            nxrt_core::loader::load_model(&c.model(), &nxrt_core::loader::NoExternalData).unwrap();
        let s = nxrt_core::Session::new(m, providers, &Default::default()).unwrap();
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
