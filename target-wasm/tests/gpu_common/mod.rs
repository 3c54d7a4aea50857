//! The harness of the WebGPU kernel tests: a one-node model run on [webgpu, cpu] and on the
//! CPU alone, compared element by element. Each test file includes it (`mod gpu_common;`).
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use nxrt_core::kernels::CpuProvider;
use nxrt_core::proto::{
    attr_type, type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use nxrt_core::provider::{ExecutionProvider, ReferenceCpu};
use nxrt_core::{loader, DataType, Session, SessionOptions, Tensor, Value};
use nxrt_wasm::webgpu::WebGpuProvider;
use prost::Message;

/// The shared provider (kernel tests), or `None` with the reason printed.
pub fn gpu() -> Option<Arc<WebGpuProvider>> {
    static P: OnceLock<Result<Arc<WebGpuProvider>, String>> = OnceLock::new();
    match P.get_or_init(|| {
        pollster::block_on(WebGpuProvider::new(0))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }) {
        Ok(p) => Some(p.clone()),
        Err(e) => {
            eprintln!("skipped: no WebGPU adapter here ({e})");
            None
        }
    }
}

pub fn fresh_gpu() -> Option<Arc<WebGpuProvider>> {
    match pollster::block_on(WebGpuProvider::new(0)) {
        Ok(p) => Some(Arc::new(p)),
        Err(e) => {
            eprintln!("skipped: no WebGPU adapter here ({e})");
            None
        }
    }
}

/// The shared providers for float16 cases: f16 storage (`true`: needs `shader-f16`, `None`
/// with the reason printed when the adapter lacks it) and f16 held in f32 words (`false`).
pub fn half_gpu(f16_storage: bool) -> Option<Arc<WebGpuProvider>> {
    static P: [OnceLock<Result<Arc<WebGpuProvider>, String>>; 2] =
        [OnceLock::new(), OnceLock::new()];
    match P[usize::from(f16_storage)].get_or_init(|| {
        pollster::block_on(WebGpuProvider::with_f16(0, f16_storage))
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }) {
        Ok(p) if p.gpu().half() == f16_storage => Some(p.clone()),
        Ok(_) => {
            eprintln!("skipped: this adapter has no shader-f16 (f16 storage untested here)");
            None
        }
        Err(e) => {
            eprintln!("skipped: no WebGPU adapter here ({e})");
            None
        }
    }
}

/// `t` as float16 (other types unchanged).
pub fn to_half(t: &Tensor) -> Tensor {
    if t.dtype() != DataType::Float {
        return t.clone();
    }
    let v: Vec<half::f16> = t
        .to_f32_vec()
        .unwrap()
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    Tensor::from_vec(t.shape(), v).unwrap()
}

pub fn cpu() -> Arc<dyn ExecutionProvider> {
    Arc::new(CpuProvider::new(Arc::new(ReferenceCpu)))
}

/// Deterministic values in about [-2, 2).
pub fn vals(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

pub fn ft(shape: &[usize], seed: u32) -> Tensor {
    Tensor::from_vec(shape, vals(shape.iter().product(), seed)).unwrap()
}

pub fn it(shape: &[usize], v: Vec<i64>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

pub fn vi(name: &str, dt: DataType, shape: &[usize]) -> ValueInfoProto {
    use nxrt_core::proto::tensor_shape_proto::{dimension::Value as D, Dimension};
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: dt.code(),
                shape: Some(TensorShapeProto {
                    dim: shape
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(D::DimValue(d as i64)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn init(name: &str, t: &Tensor) -> TensorProto {
    let mut p = TensorProto {
        name: name.into(),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: t.dtype().code(),
        ..Default::default()
    };
    match t.dtype() {
        DataType::Float => p.float_data = t.to_f32_vec().unwrap(),
        DataType::Float16 => {
            let h = t.as_slice::<half::f16>().unwrap();
            let b: Vec<u8> = h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            p.raw_data = b.into();
        }
        DataType::Uint8 => p.raw_data = t.as_slice::<u8>().unwrap().to_vec().into(),
        DataType::Int32 => {
            p.int32_data = t.to_i64_vec().unwrap().iter().map(|&v| v as i32).collect()
        }
        _ => p.int64_data = t.to_i64_vec().unwrap(),
    }
    p
}

pub fn ai(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INT,
        i: v,
        ..Default::default()
    }
}

pub fn af(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::FLOAT,
        f: v,
        ..Default::default()
    }
}

pub fn astr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub fn afs(name: &str, v: &[f32]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::FLOATS,
        floats: v.to_vec(),
        ..Default::default()
    }
}

pub fn ais(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attr_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// One output: its values as f32 and its shape.
pub type Output = (Vec<f32>, Vec<usize>);

/// One node: `feeds` are graph inputs, `consts` initializers (in input order after the
/// feeds; an empty name leaves that input out).
pub struct Case {
    pub op: &'static str,
    pub opset: i64,
    pub attrs: Vec<AttributeProto>,
    pub feeds: Vec<Tensor>,
    pub consts: Vec<Option<Tensor>>,
    /// absolute tolerance (relative is 1e-4)
    pub atol: f32,
    /// outputs the node has (all compared; f32 ones as floats, others exactly)
    pub outputs: usize,
    /// inputs (feeds, then consts) that stay float32 in `check_half` (Resize's scales, ...)
    pub keep_f32: Vec<usize>,
    /// the node's domain ("" for ai.onnx; its opset is 1 when another)
    pub domain: &'static str,
    /// outputs left unnamed (optional outputs the graph does not read)
    pub unnamed: Vec<usize>,
}

impl Case {
    pub fn new(op: &'static str, feeds: Vec<Tensor>) -> Case {
        Case {
            op,
            opset: 18,
            attrs: vec![],
            feeds,
            consts: vec![],
            atol: 1e-5,
            outputs: 1,
            keep_f32: vec![],
            domain: "",
            unnamed: vec![],
        }
    }
    /// The node in another domain (opset 1 of it).
    pub fn domain(mut self, d: &'static str) -> Self {
        self.domain = d;
        self
    }
    /// Outputs `k` left unnamed.
    pub fn unnamed(mut self, k: &[usize]) -> Self {
        self.unnamed = k.to_vec();
        self
    }
    /// Inputs (numbered over feeds, then consts) that `check_half` leaves float32.
    pub fn keep_f32(mut self, k: &[usize]) -> Self {
        self.keep_f32 = k.to_vec();
        self
    }
    pub fn outputs(mut self, n: usize) -> Self {
        self.outputs = n;
        self
    }
    /// Long dot products sum in another order than the CPU's.
    pub fn atol(mut self, v: f32) -> Self {
        self.atol = v;
        self
    }
    pub fn attr(mut self, a: AttributeProto) -> Self {
        self.attrs.push(a);
        self
    }
    pub fn consts(mut self, c: Vec<Option<Tensor>>) -> Self {
        self.consts = c;
        self
    }
    pub fn opset(mut self, v: i64) -> Self {
        self.opset = v;
        self
    }

    pub fn model(&self) -> Vec<u8> {
        let mut inputs = Vec::new();
        let mut names = Vec::new();
        for (k, t) in self.feeds.iter().enumerate() {
            let n = format!("x{k}");
            inputs.push(vi(&n, t.dtype(), t.shape()));
            names.push(n);
        }
        let mut inits = Vec::new();
        for (k, c) in self.consts.iter().enumerate() {
            match c {
                Some(t) => {
                    let n = format!("c{k}");
                    inits.push(init(&n, t));
                    names.push(n);
                }
                None => names.push(String::new()),
            }
        }
        ModelProto {
            ir_version: 9,
            opset_import: core::iter::once(OperatorSetIdProto {
                domain: String::new(),
                version: self.opset,
            })
            .chain((!self.domain.is_empty()).then(|| OperatorSetIdProto {
                domain: self.domain.into(),
                version: 1,
            }))
            .collect(),
            graph: Some(GraphProto {
                name: "one".into(),
                node: vec![NodeProto {
                    op_type: self.op.into(),
                    domain: self.domain.into(),
                    name: "n0".into(),
                    input: names,
                    output: (0..self.outputs)
                        .map(|k| {
                            if self.unnamed.contains(&k) {
                                String::new()
                            } else {
                                format!("y{k}")
                            }
                        })
                        .collect(),
                    attribute: self.attrs.clone(),
                    ..Default::default()
                }],
                initializer: inits,
                input: inputs,
                output: (0..self.outputs)
                    .filter(|k| !self.unnamed.contains(k))
                    .map(|k| ValueInfoProto {
                        name: format!("y{k}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    pub fn run_on(
        &self,
        providers: Vec<Arc<dyn ExecutionProvider>>,
    ) -> (Session, Vec<f32>, Vec<usize>) {
        let (s, mut outs) = self.run_all(providers);
        let (v, shape) = outs.swap_remove(0);
        (s, v, shape)
    }

    /// Every output as (values as f32, shape).
    pub fn run_all(&self, providers: Vec<Arc<dyn ExecutionProvider>>) -> (Session, Vec<Output>) {
        let m = loader::load_model(&self.model(), &loader::NoExternalData).unwrap();
        let s = Session::new(m, providers, &SessionOptions::default()).unwrap();
        let feeds = self
            .feeds
            .iter()
            .enumerate()
            .map(|(k, t)| (format!("x{k}"), Value::Tensor(t.clone())))
            .collect();
        let out = pollster::block_on(s.run_async(feeds)).unwrap();
        let outs = out
            .iter()
            .map(|(_, v)| {
                let Value::Tensor(y) = v else {
                    panic!("a tensor")
                };
                assert_eq!(y.location(), nxrt_core::Location::Host);
                let vals = match y.dtype() {
                    DataType::Float | DataType::Float16 => y.to_f32_vec().unwrap(),
                    _ => y
                        .to_i64_vec()
                        .unwrap()
                        .into_iter()
                        .map(|v| v as f32)
                        .collect(),
                };
                (vals, y.shape().to_vec())
            })
            .collect();
        (s, outs)
    }

    /// Runs on WebGPU (asserting the node ran there) and on the CPU; compares.
    #[track_caller]
    pub fn check(self) {
        let Some(g) = gpu() else { return };
        let (s, got) = self.run_all(vec![g, cpu()]);
        let placed = &s.partition().assignments;
        assert_eq!(
            placed[0].2,
            "webgpu",
            "{} did not run on WebGPU: {:?}",
            self.op,
            s.partition().fallbacks
        );
        let (_, want) = self.run_all(vec![cpu()]);
        for (k, ((g, gs), (w, ws))) in got.iter().zip(&want).enumerate() {
            assert_eq!(gs, ws, "{} output {k}: shapes", self.op);
            close(&format!("{} output {k}", self.op), g, w, 1e-4, self.atol);
        }
    }
}

impl Case {
    /// The case with its float inputs as float16 (but `keep_f32`'s).
    pub fn halved(&self) -> Case {
        let nf = self.feeds.len();
        let conv = |k: usize, t: &Tensor| {
            if self.keep_f32.contains(&k) {
                t.clone()
            } else {
                to_half(t)
            }
        };
        Case {
            op: self.op,
            opset: self.opset,
            attrs: self.attrs.clone(),
            feeds: self
                .feeds
                .iter()
                .enumerate()
                .map(|(k, t)| conv(k, t))
                .collect(),
            consts: self
                .consts
                .iter()
                .enumerate()
                .map(|(k, c)| c.as_ref().map(|t| conv(nf + k, t)))
                .collect(),
            atol: self.atol,
            outputs: self.outputs,
            domain: self.domain,
            unnamed: self.unnamed.clone(),
            keep_f32: self.keep_f32.clone(),
        }
    }

    /// The float16 form of the case on both f16 stores (f16 words where the adapter has
    /// `shader-f16`, f32 words otherwise), against the CPU's float16 run: the node must run on
    /// WebGPU and agree within f16's precision (a rounding step either way).
    #[track_caller]
    pub fn check_half(self) {
        let h = self.halved();
        let (_, want) = h.run_all(vec![cpu()]);
        for f16_storage in [false, true] {
            let Some(g) = half_gpu(f16_storage) else {
                continue;
            };
            let (s, got) = h.run_all(vec![g, cpu()]);
            let placed = &s.partition().assignments;
            assert_eq!(
                placed[0].2,
                "webgpu",
                "f16 {} did not run on WebGPU: {:?}",
                self.op,
                s.partition().fallbacks
            );
            for (k, ((g, gs), (w, ws))) in got.iter().zip(&want).enumerate() {
                assert_eq!(gs, ws, "f16 {} output {k}: shapes", self.op);
                close(
                    &format!("f16 (storage f16: {f16_storage}) {} output {k}", self.op),
                    g,
                    w,
                    2e-3,
                    self.atol.max(2e-3),
                );
            }
        }
    }
}

#[track_caller]
pub fn close(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // an infinite reference needs the same infinity (the relative bound would take any
        // finite value)
        let ok = (g.is_nan() && w.is_nan())
            || g == w
            || (w.is_finite() && (g - w).abs() <= atol + rtol * w.abs());
        assert!(ok, "{what}: element {i}: webgpu {g} vs cpu {w}");
    }
}
