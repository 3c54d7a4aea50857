//! The wasm crate under wasm-bindgen-test: in Node (`wasm-pack test --node target-wasm`) and,
//! with `--features browser-tests`, in headless Chromium (`wasm-pack test --headless --chrome
//! target-wasm -- --features browser-tests`). They check the SIMD128 kernels against scalar
//! arithmetic inside wasm, and the exported session end to end on the embedded model.
#![cfg(target_arch = "wasm32")]

use js_sys::{Array, Float32Array, Object, Reflect};
use nxrt_core::provider::{reference_sgemm, Gemm};
use nxrt_core::simd;
use nxrt_wasm::WasmSession;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;

#[cfg(feature = "browser-tests")]
wasm_bindgen_test_configure!(run_in_browser);

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

#[wasm_bindgen_test]
fn kernels_run_on_simd128() {
    assert_eq!(simd::isa_name(), "simd128");
}

#[wasm_bindgen_test]
fn simd128_sgemm_matches_the_scalar_loop() {
    for &(m, n, k) in &[
        (1usize, 1usize, 1usize),
        (7, 13, 29),
        (65, 33, 300),
        (3, 70, 5),
    ] {
        let a = data(m * k, 1);
        let b = data(k * n, 2);
        let g = Gemm {
            m,
            n,
            k,
            a_rs: k as isize,
            a_cs: 1,
            b_rs: 1,
            b_cs: k as isize,
            ldc: n,
            alpha: 1.0,
            beta: 0.5,
        };
        let c0 = data(m * n, 3);
        let (mut want, mut got) = (c0.clone(), c0.clone());
        reference_sgemm(&g, &a, &b, &mut want);
        assert!(simd::sgemm_checked(&g, &a, &b, &mut got));
        for (x, y) in got.iter().zip(&want) {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{m}x{n}x{k}: {x} vs {y}"
            );
        }
    }
}

#[wasm_bindgen_test]
fn simd128_softmax_and_sigmoid_match_f64() {
    let x = data(37, 4);
    let mut y = vec![0f32; 37];
    simd::softmax_row(&x, &mut y);
    let m = x.iter().cloned().fold(f32::MIN, f32::max) as f64;
    let z: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
    for (v, o) in x.iter().zip(&y) {
        let w = ((*v as f64 - m).exp() / z) as f32;
        assert!((o - w).abs() <= 1e-6 + 1e-5 * w, "{o} vs {w}");
    }
    simd::sigmoid(&x, &mut y);
    for (v, o) in x.iter().zip(&y) {
        let w = (1.0 / (1.0 + (-(*v as f64)).exp())) as f32;
        assert!((o - w).abs() <= 1e-6, "{o} vs {w}");
    }
}

fn feed(name: &str, data: &[f32], dims: &[u32]) -> JsValue {
    let o = Object::new();
    Reflect::set(&o, &"name".into(), &name.into()).unwrap();
    Reflect::set(&o, &"type".into(), &"float32".into()).unwrap();
    Reflect::set(&o, &"data".into(), &Float32Array::from(data).into()).unwrap();
    let d = Array::new();
    for &x in dims {
        d.push(&JsValue::from(x));
    }
    Reflect::set(&o, &"dims".into(), &d).unwrap();
    o.into()
}

#[wasm_bindgen_test]
async fn the_exported_session_runs_the_embedded_model() {
    let bytes = nxrt_core::embedded::tiny_cnn();
    let s = WasmSession::new(&bytes, vec!["wasm".into()], "all".into())
        .map_err(JsValue::from)
        .unwrap();
    assert_eq!(s.input_names(), vec!["image".to_string()]);
    assert_eq!(s.output_names(), vec!["probs".to_string()]);
    let img: Vec<f32> = (0..2 * 256).map(|i| (i % 17) as f32 / 17.0).collect();
    let feeds = Array::new();
    feeds.push(&feed("image", &img, &[2, 1, 16, 16]));
    let out = JsFuture::from(s.run(feeds).map_err(JsValue::from).unwrap())
        .await
        .unwrap();
    let out: Array = out.dyn_into().unwrap();
    assert_eq!(out.length(), 1);
    let probs = Reflect::get(&out.get(0), &"data".into()).unwrap();
    let probs: Vec<f32> = probs.dyn_into::<Float32Array>().unwrap().to_vec();
    assert_eq!(probs.len(), 20);
    // the same model through core directly (no JS boundary) gives the same numbers
    let core =
        nxrt_wasm::build_session(&bytes, &["wasm".into()], nxrt_core::OptLevel::All).unwrap();
    let t = nxrt_core::Tensor::from_vec(&[2, 1, 16, 16], img).unwrap();
    let want = futures_lite_block(core.run_async(vec![("image".into(), t.into())]));
    let want = want.unwrap()[0]
        .1
        .as_tensor()
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert_eq!(probs, want);
    for row in probs.chunks(10) {
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "softmax rows sum to 1: {s}");
    }
}

/// Drives a future that completes without waiting (the CPU path never waits).
fn futures_lite_block<F: core::future::Future>(f: F) -> F::Output {
    use core::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    fn noop(_: *const ()) {}
    fn clone(p: *const ()) -> RawWaker {
        RawWaker::new(p, &VTABLE)
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    let waker = unsafe { Waker::from_raw(RawWaker::new(core::ptr::null(), &VTABLE)) };
    let mut cx = Context::from_waker(&waker);
    let mut f = Box::pin(f);
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the CPU run path should not wait"),
    }
}

#[wasm_bindgen_test]
async fn bad_models_and_feeds_are_errors_not_traps() {
    assert!(WasmSession::new(&[0xff, 0x01, 0x02], vec![], "all".into()).is_err());
    assert!(WasmSession::new(&[], vec!["webgpu".into()], "all".into()).is_err());
    let bytes = nxrt_core::embedded::tiny_cnn();
    let s = WasmSession::new(&bytes, vec![], "all".into())
        .map_err(JsValue::from)
        .unwrap();
    let feeds = Array::new();
    feeds.push(&feed("image", &[1.0; 10], &[1, 1, 16, 16]));
    assert!(s.run(feeds).is_err(), "10 floats for 256 elements");
    let no_dims = feed("image", &[0.5; 256], &[1, 1, 16, 16]);
    Reflect::delete_property(no_dims.unchecked_ref::<Object>(), &"dims".into()).unwrap();
    let feeds = Array::new();
    feeds.push(&no_dims);
    assert!(s.run(feeds).is_err(), "a feed without dims");
    let feeds = Array::new();
    feeds.push(&feed("image", &[0.5; 256], &[1, 1, 16, 16]));
    let ok = JsFuture::from(s.run(feeds).map_err(JsValue::from).unwrap()).await;
    assert!(ok.is_ok(), "the session is still usable");
}

/// A float16 model on the page's WebGPU (headless Chromium: SwiftShader, no `shader-f16`, so
/// float16 is held in f32 words rounded on every store; the WGSL is Chromium's compiler's, not
/// naga's), against the CPU's float16 run. Without an adapter (Node) it says so and passes.
#[cfg(feature = "webgpu")]
#[wasm_bindgen_test]
async fn float16_runs_on_the_page_webgpu() {
    use nxrt_core::kernels::CpuProvider;
    use nxrt_core::provider::{ExecutionProvider, ReferenceCpu};
    use nxrt_core::{loader, DataType, Session, SessionOptions, Tensor};
    use std::sync::Arc;
    let gpu = match nxrt_wasm::webgpu::WebGpuProvider::new(0).await {
        Ok(g) => Arc::new(g),
        Err(e) => {
            wasm_bindgen_test::console_log!("skipped: no WebGPU adapter here ({e})");
            return;
        }
    };
    let bytes = nxrt_core::convert::to_float16(&nxrt_core::embedded::tiny_cnn()).unwrap();
    let img: Vec<half::f16> = data(2 * 256, 7)
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let feeds = || {
        vec![(
            "image".into(),
            Tensor::from_vec(&[2, 1, 16, 16], img.clone())
                .unwrap()
                .into(),
        )]
    };
    let cpu =
        || -> Arc<dyn ExecutionProvider> { Arc::new(CpuProvider::new(Arc::new(ReferenceCpu))) };
    let load = || loader::load_model(&bytes, &loader::NoExternalData).unwrap();
    let s = Session::new(load(), vec![gpu.clone(), cpu()], &SessionOptions::default()).unwrap();
    let placed = &s.partition().assignments;
    assert!(placed.iter().all(|(_, _, p)| p == "webgpu"), "{placed:?}");
    let got = s.run_async(feeds()).await.unwrap();
    let c = Session::new(load(), vec![cpu()], &SessionOptions::default()).unwrap();
    let want = c.run_async(feeds()).await.unwrap();
    let (g, w) = (
        got[0].1.as_tensor().unwrap(),
        want[0].1.as_tensor().unwrap(),
    );
    assert_eq!(g.dtype(), DataType::Float16);
    assert_eq!(g.shape(), w.shape());
    let (g, w) = (g.to_f32_vec().unwrap(), w.to_f32_vec().unwrap());
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 2e-3 + 2e-3 * b.abs(),
            "element {i}: webgpu {a} vs cpu {b}"
        );
    }
    wasm_bindgen_test::console_log!(
        "float16 on the page's WebGPU (f16 storage: {}): {} outputs agree",
        gpu.gpu().half(),
        g.len()
    );
}
