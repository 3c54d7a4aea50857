//! Float16 models on WebGPU: corpus vision models converted to float16 (weights, inputs,
//! outputs, Constant values and Casts to float), run on WebGPU with both float16 stores (f16
//! words where the adapter has `shader-f16`, lavapipe here; f32 words rounded to f16 otherwise,
//! which is what SwiftShader and other adapters without `shader-f16` get) and on the CPU's
//! float16 kernels, on each model's reference inputs. Every node that runs on WebGPU in float32
//! must run there in float16 too, and the
//! outputs agree within a bound scaled to the output (f16 keeps about three decimal digits, and
//! the two targets round at different points: the CPU after each op, WebGPU after each fused
//! kernel). The float16 result's distance to ONNX Runtime's float32 reference is printed.
//!
//! Needs the corpus (`../shared/corpus/fetch_corpus.sh`) and a WebGPU adapter (without one the
//! test prints why and passes).

use std::sync::Arc;

use nxrt_core::kernels::CpuProvider;
use nxrt_core::provider::ExecutionProvider;
use nxrt_core::{loader, npy, DataType, Session, SessionOptions, Tensor, Value};
use nxrt_tests::cache_dir;
use nxrt_wasm::webgpu::WebGpuProvider;
use serde_json::Value as Json;

/// (model, bound on max |webgpu - cpu| / max |cpu| over each output); the float16 form is
/// `nxrt_core::convert::to_float16`'s
const MODELS: &[(&str, f64)] = &[
    ("mobilenet_v3_small", 5e-3),
    ("oww_embedding_model", 5e-3),
    ("ppocr_mobile_v2_cls", 5e-3),
];

fn run(
    model: &[u8],
    providers: Vec<Arc<dyn ExecutionProvider>>,
    feeds: &[(String, Tensor)],
) -> (Session, Vec<(String, Tensor)>) {
    let m = loader::load_model(model, &loader::NoExternalData).expect("load");
    let s = Session::new(m, providers, &SessionOptions::default()).expect("session");
    let f = feeds
        .iter()
        .map(|(n, t)| (n.clone(), Value::Tensor(t.clone())))
        .collect();
    let out = pollster::block_on(s.run_async(f)).expect("run");
    let out = out
        .into_iter()
        .map(|(n, v)| match v {
            Value::Tensor(t) => (n, t),
            _ => panic!("{n}: a tensor output"),
        })
        .collect();
    (s, out)
}

/// max |a - b| / max |b|
fn scaled_err(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-6);
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()));
    worst / scale
}

#[test]
fn f16_models_agree_on_webgpu_and_the_cpu() {
    let corpus = cache_dir().join("corpus");
    for f16_storage in [true, false] {
        let gpu = match pollster::block_on(WebGpuProvider::with_f16(0, f16_storage)) {
            Ok(g) => Arc::new(g),
            Err(e) => {
                eprintln!("skipped: no WebGPU adapter here ({e})");
                return;
            }
        };
        if f16_storage && !gpu.gpu().half() {
            eprintln!("this adapter has no shader-f16: f16 storage untested here");
            continue;
        }
        for (name, bound) in MODELS {
            let dir = corpus.join(name);
            let Ok(bytes) = std::fs::read(dir.join("model.onnx")) else {
                panic!(
                    "{name}: corpus model missing under {} (run ../shared/corpus/fetch_corpus.sh)",
                    corpus.display()
                );
            };
            let model = nxrt_core::convert::to_float16(&bytes).expect("float16 form");
            let case = std::fs::read_dir(dir.join("ref"))
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .min()
                .expect("a reference case");
            let io: Json =
                serde_json::from_slice(&std::fs::read(case.join("io.json")).unwrap()).unwrap();
            let to_half = |t: Tensor| -> Tensor {
                if t.dtype() != DataType::Float {
                    return t;
                }
                let v: Vec<half::f16> = t
                    .to_f32_vec()
                    .unwrap()
                    .into_iter()
                    .map(half::f16::from_f32)
                    .collect();
                Tensor::from_vec(t.shape(), v).unwrap()
            };
            let read = |f: &str| npy::read_npy(&std::fs::read(case.join(f)).unwrap()).unwrap();
            let feeds: Vec<(String, Tensor)> = io["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    let t = read(i["file"].as_str().unwrap());
                    (i["name"].as_str().unwrap().to_string(), to_half(t))
                })
                .collect();
            let cpu = || -> Arc<dyn ExecutionProvider> {
                Arc::new(CpuProvider::new(Arc::new(
                    nxrt::cpu::NativeCpu::new(1).unwrap(),
                )))
            };
            let (_, want) = run(&model, vec![cpu()], &feeds);
            let (s, got) = run(&model, vec![gpu.clone(), cpu()], &feeds);
            // float16 leaves no node on the CPU that float32 runs on WebGPU (ppocr's int64
            // shape arithmetic stays on the CPU in both)
            let on_cpu = |s: &Session| -> Vec<String> {
                s.partition()
                    .assignments
                    .iter()
                    .filter(|(_, _, p)| p != "webgpu")
                    .map(|(n, _, _)| n.clone())
                    .collect()
            };
            let f32_model = loader::load_model(&bytes, &loader::NoExternalData).unwrap();
            let f32_session = Session::new(
                f32_model,
                vec![gpu.clone(), cpu()],
                &SessionOptions::default(),
            )
            .unwrap();
            assert_eq!(
                on_cpu(&s),
                on_cpu(&f32_session),
                "{name}: float16 nodes the CPU runs and float32 ones it does not ({:?})",
                s.partition().fallbacks.first()
            );
            for ((n, g), (_, w)) in got.iter().zip(&want) {
                assert_eq!(g.dtype(), DataType::Float16, "{name}/{n}");
                assert_eq!(g.shape(), w.shape(), "{name}/{n}");
                let e = scaled_err(g, w);
                let ort = io["outputs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|o| o["name"] == n.as_str())
                    .map(|o| scaled_err(g, &read(o["file"].as_str().unwrap())));
                println!(
                    "{name}/{n} (f16 storage: {f16_storage}): max|webgpu - cpu| / max|cpu| = \
                     {e:.2e}; vs ONNX Runtime float32: {}",
                    ort.map_or("-".into(), |v| format!("{v:.2e}"))
                );
                assert!(
                    e <= *bound,
                    "{name}/{n}: webgpu f16 differs from the cpu's by {e:.2e} of its range"
                );
            }
        }
    }
}
