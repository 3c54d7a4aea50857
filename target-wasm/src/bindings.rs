//! The wasm-bindgen exports. Values cross the boundary as plain JS objects
//! (`{name, type, data, dims}` for tensors); `js/` turns them into `Tensor`s.
//!
//! Every entry point returns `Result<_, JsError>`, so a bad model or bad feed rejects with the
//! runtime's message. A panic (a bug, never a bad input) traps the instance; its message is
//! kept by the panic hook and read back by the JS wrapper through `lastPanic()`.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, BigInt64Array, BigUint64Array, Float32Array, Float64Array, Int16Array};
use js_sys::{Int32Array, Int8Array, Map, Object, Reflect, Uint16Array, Uint32Array, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use half::f16;
use nxrt_core::value::MapValue;
use nxrt_core::{DataType, Dim, Error, Tensor, TypeInfo, Value};

use crate::{build_session, check_dims, dtype_from_js, js_type_name, opt_level};

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

#[wasm_bindgen]
extern "C" {
    /// `performance.now()`: milliseconds, monotonic (browsers and Node).
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
}

/// The sessions' clock in nanoseconds (generation timings, the profiler).
pub(crate) fn now_ns() -> u64 {
    (performance_now() * 1e6) as u64
}

#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info.to_string();
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(msg));
    }));
}

/// The message of the last panic (an internal error), if one happened.
#[wasm_bindgen(js_name = lastPanic)]
pub fn last_panic() -> Option<String> {
    LAST_PANIC.with(|p| p.borrow().clone())
}

/// The version of this build.
#[wasm_bindgen(js_name = version)]
pub fn js_version() -> String {
    crate::version().to_string()
}

/// The small CNN built into nxrt (input `image` float[batch,1,16,16], output `probs`
/// float[batch,10]): a model to try the API with, no download needed.
#[wasm_bindgen(js_name = embeddedModel)]
pub fn embedded_model() -> Vec<u8> {
    nxrt_core::embedded::tiny_cnn()
}

/// The SIMD instruction set the kernels run on (`simd128` or `portable`).
/// One ONNX node-test case, checked exactly as the native conformance runner checks it (core's
/// `conformance::check_case`, run twice: the recording run and the planned arena run). `inputs`
/// and `outputs` are the case's `input_N.pb` / `output_N.pb` bytes in order. Resolves to
/// `"pass"`, `"fail: ..."` or `"error: ..."`.
#[wasm_bindgen(js_name = conformanceCase)]
pub fn conformance_case(
    model: &[u8],
    inputs: Vec<Uint8Array>,
    outputs: Vec<Uint8Array>,
    rtol: f64,
    atol: f64,
) -> js_sys::Promise {
    let ins: Vec<Vec<u8>> = inputs.iter().map(|a| a.to_vec()).collect();
    let outs: Vec<Vec<u8>> = outputs.iter().map(|a| a.to_vec()).collect();
    let session = build_session(model, &[], nxrt_core::OptLevel::Basic);
    wasm_bindgen_futures::future_to_promise(async move {
        let outcome = match session {
            Ok(s) => nxrt_core::conformance::check_case(&s, &ins, &outs, rtol, atol, 2).await,
            Err(e) => nxrt_core::conformance::load_error(e),
        };
        Ok(JsValue::from_str(&outcome.record()))
    })
}

#[wasm_bindgen(js_name = simdIsa)]
pub fn simd_isa() -> String {
    nxrt_core::simd::isa_name().to_string()
}

pub(crate) fn js_err(e: Error) -> JsError {
    JsError::new(&e.to_string())
}

fn input_err(msg: String) -> JsError {
    JsError::new(&msg)
}

/// Sets `o[k]`; the key is interned (made into a JS string once per process).
pub(crate) fn set(o: &Object, k: &'static str, v: &JsValue) {
    let _ = Reflect::set(o, &js_name(k), v);
}

/// Reads `o[k]`; the key is interned.
pub(crate) fn get(o: &JsValue, k: &'static str) -> JsValue {
    Reflect::get(o, &js_name(k)).unwrap_or(JsValue::UNDEFINED)
}

/// A JS string for a name from a fixed set (property keys, type names, kinds), made once per
/// process.
fn js_name(s: &'static str) -> JsValue {
    JsValue::from_str(wasm_bindgen::intern(s))
}

fn type_json(ty: &TypeInfo) -> JsValue {
    let o = Object::new();
    match ty {
        TypeInfo::Tensor { dtype, shape } => {
            set(&o, "isTensor", &JsValue::TRUE);
            set(
                &o,
                "type",
                &JsValue::from_str(dtype.map_or("unknown", js_type_name)),
            );
            match shape {
                Some(dims) => {
                    let a = Array::new();
                    for d in dims {
                        a.push(&match d {
                            Dim::Known(n) => JsValue::from_f64(*n as f64),
                            Dim::Sym(s) => JsValue::from_str(s),
                            Dim::Unknown => JsValue::NULL,
                        });
                    }
                    set(&o, "shape", &a);
                }
                None => set(&o, "shape", &JsValue::NULL),
            }
        }
        other => {
            set(&o, "isTensor", &JsValue::FALSE);
            set(&o, "type", &JsValue::from_str(&other.to_string()));
        }
    }
    o.into()
}

/// External-data files the host fetched, by the location the model names: reads copy just the
/// bytes a tensor needs out of the JS buffer, so the file is never copied whole into the wasm
/// heap.
pub(crate) struct JsFiles {
    files: Vec<(String, Uint8Array)>,
}

impl JsFiles {
    pub(crate) fn new(names: Vec<String>, data: Vec<Uint8Array>) -> nxrt_core::Result<JsFiles> {
        if names.len() != data.len() {
            return Err(Error::Input(format!(
                "{} external-data names for {} buffers",
                names.len(),
                data.len()
            )));
        }
        for n in &names {
            nxrt_core::loader::check_external_location(n)?;
        }
        Ok(JsFiles {
            files: names.into_iter().zip(data).collect(),
        })
    }
}

impl nxrt_core::loader::ExternalDataSource for JsFiles {
    fn read(&self, location: &str, offset: u64, length: Option<u64>) -> nxrt_core::Result<Vec<u8>> {
        let norm = |p: &str| p.trim_start_matches("./").replace('\\', "/");
        let want = norm(location);
        let (_, buf) = self
            .files
            .iter()
            .find(|(n, _)| norm(n) == want)
            .ok_or_else(|| {
                Error::ExternalData(format!(
                    "the model references external file '{location}', which was not given \
                     (externalData)"
                ))
            })?;
        let size = buf.length() as u64;
        let end = match length {
            Some(l) => offset.checked_add(l),
            None => Some(size),
        };
        match end {
            Some(end) if offset <= end && end <= size => {
                Ok(buf.subarray(offset as u32, end as u32).to_vec())
            }
            _ => Err(Error::ExternalData(format!(
                "'{location}' holds {size} bytes; a tensor needs offset {offset} length {length:?}"
            ))),
        }
    }
}

/// A loaded model. `run` clones the `Rc` into its future, so a run in flight keeps the session
/// alive even if JS calls `free()` meanwhile.
#[wasm_bindgen]
pub struct WasmSession {
    inner: Rc<nxrt_core::Session>,
    /// Outputs kept on the GPU (`runWith`'s `keep`), by the handle JS holds: each stays
    /// leased and in device memory until JS downloads-and-releases or disposes it, or the
    /// session is freed.
    kept: Rc<RefCell<Kept>>,
}

#[derive(Default)]
struct Kept {
    next: u32,
    tensors: std::collections::HashMap<u32, Tensor>,
}

impl Kept {
    fn get(&self, h: u32) -> Result<Tensor, JsError> {
        self.tensors
            .get(&h)
            .cloned()
            .ok_or_else(|| input_err(format!("GPU tensor {h} was disposed")))
    }
}

impl WasmSession {
    fn wrap(s: nxrt_core::Session) -> WasmSession {
        WasmSession {
            inner: Rc::new(s),
            kept: Rc::default(),
        }
    }
}

#[wasm_bindgen]
impl WasmSession {
    /// Loads a model: `providers` in preference order, `opt` an onnxruntime-web
    /// `graphOptimizationLevel` name.
    #[wasm_bindgen(constructor)]
    pub fn new(bytes: &[u8], providers: Vec<String>, opt: String) -> Result<WasmSession, JsError> {
        let level = opt_level(&opt).map_err(js_err)?;
        let s = build_session(bytes, &providers, level).map_err(js_err)?;
        Ok(WasmSession::wrap(s))
    }

    /// Loads a model, opening the WebGPU adapter first when `providers` names `webgpu`
    /// (async, as `requestAdapter` is). `ext_names[i]` is the external-data file whose bytes
    /// are `ext_data[i]` (a location the model names; none when it has no external data).
    /// `memory_limit`: the session's host memory budget in bytes (none when undefined);
    /// `block_weights` (`auto`, `codes`, `cached`, `expanded`; default `auto`) and
    /// `weight_cache_limit` (bytes, default 256 MiB; negative: none): the dense weight cache.
    /// Resolves to a `WasmSession`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        bytes: Vec<u8>,
        providers: Vec<String>,
        opt: String,
        ext_names: Vec<String>,
        ext_data: Vec<Uint8Array>,
        memory_limit: Option<f64>,
        block_weights: Option<String>,
        weight_cache_limit: Option<f64>,
    ) -> js_sys::Promise {
        wasm_bindgen_futures::future_to_promise(async move {
            let level = opt_level(&opt).map_err(js_err)?;
            let ext = JsFiles::new(ext_names, ext_data).map_err(js_err)?;
            let bytes_of = |name: &str, b: f64| {
                if b.is_finite() && b >= 0.0 && b.fract() == 0.0 {
                    Ok(b as usize)
                } else {
                    Err(input_err(format!(
                        "{name} must be a whole number of bytes, not {b}"
                    )))
                }
            };
            let mut memory = crate::Memory {
                limit: memory_limit
                    .map(|b| bytes_of("memoryLimit", b))
                    .transpose()?,
                ..Default::default()
            };
            if let Some(p) = block_weights {
                memory.weight_cache.policy =
                    nxrt_core::weight_cache::BlockWeights::parse(&p).map_err(js_err)?;
            }
            match weight_cache_limit {
                Some(b) if b < 0.0 => memory.weight_cache.limit = None,
                Some(b) => memory.weight_cache.limit = Some(bytes_of("weightCacheLimit", b)?),
                None => {}
            }
            let s = crate::build_session_limited(&bytes, &providers, level, &ext, memory)
                .await
                .map_err(js_err)?;
            Ok(JsValue::from(WasmSession::wrap(s)))
        })
    }

    /// Frees cached memory now: memory plans and the WebGPU buffer pool.
    #[wasm_bindgen(js_name = releaseCached)]
    pub fn release_cached(&self) {
        self.inner.release_cached();
    }

    /// What the session holds: `{name, tiers: [{tier, inUse, peak, limit, leases, holders:
    /// {weights|arena|outputs|cache|dequantized|other: {inUse, peak, leases}}}]}` (bytes;
    /// `limit` null when none).
    /// The dense weight cache's figures: `{policy, limit, bytes, copies, fills, hits,
    /// declined, released}` (bytes; `limit` null when none).
    #[wasm_bindgen(js_name = weightCache)]
    pub fn weight_cache(&self) -> Object {
        let w = self.inner.weight_cache();
        let o = Object::new();
        set(&o, "policy", &JsValue::from_str(&w.policy));
        let limit = w
            .limit
            .map_or(JsValue::NULL, |l| JsValue::from_f64(l as f64));
        set(&o, "limit", &limit);
        for (k, v) in [
            ("bytes", w.bytes),
            ("copies", w.copies),
            ("fills", w.fills),
            ("hits", w.hits),
            ("declined", w.declined),
            ("released", w.released),
        ] {
            set(&o, k, &JsValue::from_f64(v as f64));
        }
        o
    }

    #[wasm_bindgen(js_name = memorySnapshot)]
    pub fn memory_snapshot(&self) -> Object {
        let snap = self.inner.memory_snapshot();
        let o = Object::new();
        set(&o, "name", &JsValue::from_str(&snap.name));
        let tiers = Array::new();
        for t in &snap.tiers {
            let e = Object::new();
            set(&e, "tier", &JsValue::from_str(&t.tier.to_string()));
            set(&e, "inUse", &JsValue::from_f64(t.in_use as f64));
            set(&e, "peak", &JsValue::from_f64(t.peak as f64));
            let limit = t
                .limit
                .map_or(JsValue::NULL, |l| JsValue::from_f64(l as f64));
            set(&e, "limit", &limit);
            set(&e, "leases", &JsValue::from_f64(t.leases as f64));
            let holders = Object::new();
            for h in &t.holders {
                let x = Object::new();
                set(&x, "inUse", &JsValue::from_f64(h.in_use as f64));
                set(&x, "peak", &JsValue::from_f64(h.peak as f64));
                set(&x, "leases", &JsValue::from_f64(h.leases as f64));
                let _ = Reflect::set(&holders, &JsValue::from_str(h.holder.name()), &x);
            }
            set(&e, "holders", &holders);
            tiers.push(&e);
        }
        set(&o, "tiers", &tiers);
        o
    }

    /// The partition as an object: `{nodes: [{node, op, provider}], copies: [{value, from, to,
    /// node, once}], fallbacks: [{node, op, to, reasons}], devices: [{provider, device}]}`.
    #[wasm_bindgen(js_name = partitionReport)]
    pub fn partition_report(&self) -> Object {
        let r = self.inner.partition();
        let o = Object::new();
        let nodes = Array::new();
        for (n, op, p) in &r.assignments {
            let e = Object::new();
            set(&e, "node", &JsValue::from_str(n));
            set(&e, "op", &JsValue::from_str(op));
            set(&e, "provider", &JsValue::from_str(p));
            nodes.push(&e);
        }
        let copies = Array::new();
        for c in &r.copy_list {
            let e = Object::new();
            set(&e, "value", &JsValue::from_str(&c.value));
            set(&e, "from", &JsValue::from_str(&c.from));
            set(&e, "to", &JsValue::from_str(&c.to));
            set(&e, "node", &JsValue::from_str(&c.node));
            set(&e, "once", &JsValue::from_bool(c.once));
            copies.push(&e);
        }
        let fallbacks = Array::new();
        for f in &r.fallbacks {
            let e = Object::new();
            set(&e, "node", &JsValue::from_str(&f.node));
            set(&e, "op", &JsValue::from_str(&f.op));
            set(&e, "to", &JsValue::from_str(&f.to));
            let why: Vec<String> = f
                .declined
                .iter()
                .map(|(p, r)| format!("{p}: {r}"))
                .collect();
            set(&e, "reasons", &JsValue::from_str(&why.join("; ")));
            fallbacks.push(&e);
        }
        let devices = Array::new();
        for (p, d) in &r.devices {
            let e = Object::new();
            set(&e, "provider", &JsValue::from_str(p));
            set(&e, "device", &JsValue::from_str(d));
            devices.push(&e);
        }
        set(&o, "nodes", &nodes);
        set(&o, "copies", &copies);
        set(&o, "fallbacks", &fallbacks);
        set(&o, "devices", &devices);
        o
    }

    #[wasm_bindgen(getter, js_name = inputNames)]
    pub fn input_names(&self) -> Vec<String> {
        self.inner.inputs().into_iter().map(|i| i.name).collect()
    }

    #[wasm_bindgen(getter, js_name = outputNames)]
    pub fn output_names(&self) -> Vec<String> {
        self.inner.outputs().into_iter().map(|i| i.name).collect()
    }

    /// `[{name, isTensor, type, shape}]` for the graph inputs.
    #[wasm_bindgen(getter, js_name = inputMetadata)]
    pub fn input_metadata(&self) -> Array {
        let a = Array::new();
        for io in self.inner.inputs() {
            let o: Object = type_json(&io.ty).unchecked_into();
            set(&o, "name", &JsValue::from_str(&io.name));
            a.push(&o);
        }
        a
    }

    #[wasm_bindgen(getter, js_name = outputMetadata)]
    pub fn output_metadata(&self) -> Array {
        let a = Array::new();
        for io in self.inner.outputs() {
            let o: Object = type_json(&io.ty).unchecked_into();
            set(&o, "name", &JsValue::from_str(&io.name));
            a.push(&o);
        }
        a
    }

    /// Which provider runs how many nodes, and the copies between them.
    #[wasm_bindgen(js_name = partition)]
    pub fn partition(&self) -> String {
        let r = self.inner.partition();
        let mut s = String::new();
        for (p, n) in &r.nodes_per_provider {
            s.push_str(&format!("{p}: {n} nodes; "));
        }
        s.push_str(&format!("{} copies", r.copies));
        s
    }

    /// Runs the model. `feeds` is an array of `{name, type, data, dims}`; resolves to an array
    /// of output objects in graph order.
    pub fn run(&self, feeds: Array) -> Result<js_sys::Promise, JsError> {
        self.run_with(feeds, Vec::new())
    }

    /// [`WasmSession::run`] with outputs kept on the GPU: each output named in `keep` that a
    /// device provider computed stays in device memory and comes back as `{kind: 'tensor',
    /// location: 'gpu-buffer', gpu: handle, type, dims}` (an output the CPU computed comes
    /// back with its data as usual). A feed `{name, gpu: handle}` is such a tensor given back,
    /// read where it lies (no copy when the nodes reading it run on its device).
    #[wasm_bindgen(js_name = runWith)]
    pub fn run_with(&self, feeds: Array, keep: Vec<String>) -> Result<js_sys::Promise, JsError> {
        let mut values = Vec::with_capacity(feeds.length() as usize);
        for f in feeds.iter() {
            let name = get(&f, "name")
                .as_string()
                .ok_or_else(|| input_err("every feed needs a string 'name'".into()))?;
            let h = get(&f, "gpu");
            let t = match h.as_f64() {
                Some(h) => self.kept.borrow().get(h as u32)?,
                None => feed_tensor(&name, &f)?,
            };
            values.push((name, Value::Tensor(t)));
        }
        let inner = self.inner.clone();
        let kept = self.kept.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let opts = nxrt_core::RunOptions {
                keep_on_device: keep,
                ..Default::default()
            };
            let outs = inner
                .run_async_with(values, opts)
                .await
                .map_err(|e| JsValue::from(js_err(e)))?;
            let a = Array::new();
            for (name, v) in outs {
                let o = match v {
                    Value::Tensor(t) if t.location() != nxrt_core::Location::Host => {
                        let o = Object::new();
                        set(&o, "kind", &js_name("tensor"));
                        set(&o, "location", &js_name("gpu-buffer"));
                        set(&o, "type", &js_name(js_type_name(t.dtype())));
                        let dims = Array::new();
                        for &d in t.shape() {
                            dims.push(&JsValue::from_f64(d as f64));
                        }
                        set(&o, "dims", &dims);
                        let mut k = kept.borrow_mut();
                        let h = k.next;
                        k.next = k.next.wrapping_add(1);
                        k.tensors.insert(h, t);
                        set(&o, "gpu", &JsValue::from_f64(h as f64));
                        o
                    }
                    v => value_js(&v).map_err(|e| JsValue::from(js_err(e)))?,
                };
                set(&o, "name", &JsValue::from_str(&name));
                a.push(&o);
            }
            Ok(a.into())
        }))
    }

    /// Reads a kept GPU tensor back: resolves to `{type, dims, data}`. `release`: dispose the
    /// device copy once read.
    #[wasm_bindgen(js_name = downloadGpu)]
    pub fn download_gpu(&self, handle: u32, release: bool) -> Result<js_sys::Promise, JsError> {
        let t = self.kept.borrow().get(handle)?;
        let inner = self.inner.clone();
        let kept = self.kept.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let v = inner
                .download(Value::Tensor(t))
                .await
                .map_err(|e| JsValue::from(js_err(e)))?;
            if release {
                kept.borrow_mut().tensors.remove(&handle);
            }
            let o = value_js(&v).map_err(|e| JsValue::from(js_err(e)))?;
            Ok(o.into())
        }))
    }

    /// Gives a kept GPU tensor's device memory back (to the provider's pool and the session's
    /// budget). False when it was already disposed.
    #[wasm_bindgen(js_name = disposeGpu)]
    pub fn dispose_gpu(&self, handle: u32) -> bool {
        self.kept.borrow_mut().tensors.remove(&handle).is_some()
    }

    /// A new GPU tensor of `type` and `dims` on the session's device provider, contents
    /// unspecified, kept like an output (a handle to feed, read, or dispose). JS copies a
    /// caller's own `GPUBuffer` into it on the device for `Tensor.fromGpuBuffer` feeds.
    #[wasm_bindgen(js_name = allocGpu)]
    pub fn alloc_gpu(&self, ty: String, dims: Vec<f64>) -> Result<u32, JsError> {
        let dt = dtype_from_js(&ty).map_err(js_err)?;
        let mut shape = Vec::with_capacity(dims.len());
        for &d in &dims {
            if !(d >= 0.0 && d.fract() == 0.0 && d <= (1u64 << 40) as f64) {
                return Err(input_err(format!(
                    "dims must be non-negative integers, got {dims:?}"
                )));
            }
            shape.push(d as usize);
        }
        for p in self.inner.providers() {
            if let Some(t) = p.alloc_device(dt, &shape) {
                let t = t.map_err(js_err)?;
                let mut k = self.kept.borrow_mut();
                let h = k.next;
                k.next = k.next.wrapping_add(1);
                k.tensors.insert(h, t);
                return Ok(h);
            }
        }
        Err(input_err(
            "this session has no GPU provider: GPU buffers feed sessions created with \
             executionProviders ['webgpu']"
                .into(),
        ))
    }

    /// How many GPU tensors JS holds (kept and not yet disposed).
    #[wasm_bindgen(getter, js_name = gpuTensors)]
    pub fn gpu_tensors(&self) -> u32 {
        self.kept.borrow().tensors.len() as u32
    }

    /// `[GPUBuffer, GPUDevice]` of a kept GPU tensor (see `webgpu::webgpu_handles`).
    #[wasm_bindgen(js_name = gpuBuffer)]
    pub fn gpu_buffer(&self, handle: u32) -> Result<Array, JsError> {
        let t = self.kept.borrow().get(handle)?;
        #[cfg(feature = "webgpu")]
        {
            let (b, d) = crate::webgpu::webgpu_handles(&t).map_err(js_err)?;
            Ok(Array::of2(&b, &d))
        }
        #[cfg(not(feature = "webgpu"))]
        {
            let _ = t;
            Err(input_err("this build has no WebGPU provider".into()))
        }
    }
}

macro_rules! typed_in {
    ($arr:ty, $data:expr, $name:expr, $ty:expr) => {
        $data
            .dyn_ref::<$arr>()
            .ok_or_else(|| {
                input_err(format!(
                    "input '{}': type '{}' needs a {} as data",
                    $name,
                    $ty,
                    stringify!($arr)
                ))
            })?
            .to_vec()
    };
}

fn feed_tensor(name: &str, f: &JsValue) -> Result<Tensor, JsError> {
    let ty = get(f, "type")
        .as_string()
        .ok_or_else(|| input_err(format!("input '{name}': missing 'type'")))?;
    let dt = dtype_from_js(&ty).map_err(js_err)?;
    let data = get(f, "data");
    let dims_js = get(f, "dims");
    // checked before Array::from, which would throw a raw TypeError on `undefined`
    if !Array::is_array(&dims_js) {
        return Err(input_err(format!(
            "input '{name}': 'dims' must be an array"
        )));
    }
    let dims: Vec<f64> = Array::from(&dims_js)
        .iter()
        .map(|d| d.as_f64().unwrap_or(f64::NAN))
        .collect();
    fn make<T: nxrt_core::Elem>(name: &str, dims: &[f64], v: Vec<T>) -> Result<Tensor, JsError> {
        let shape = check_dims(name, dims, v.len()).map_err(js_err)?;
        Tensor::from_vec(&shape, v).map_err(js_err)
    }
    match dt {
        DataType::Float => make(name, &dims, typed_in!(Float32Array, data, name, ty)),
        DataType::Double => make(name, &dims, typed_in!(Float64Array, data, name, ty)),
        DataType::Float16 => {
            let bits: Vec<u16> = typed_in!(Uint16Array, data, name, ty);
            make(name, &dims, bits.into_iter().map(f16::from_bits).collect())
        }
        DataType::Int8 => make(name, &dims, typed_in!(Int8Array, data, name, ty)),
        DataType::Uint8 => make(name, &dims, typed_in!(Uint8Array, data, name, ty)),
        DataType::Int16 => make(name, &dims, typed_in!(Int16Array, data, name, ty)),
        DataType::Uint16 => make(name, &dims, typed_in!(Uint16Array, data, name, ty)),
        DataType::Int32 => make(name, &dims, typed_in!(Int32Array, data, name, ty)),
        DataType::Uint32 => make(name, &dims, typed_in!(Uint32Array, data, name, ty)),
        DataType::Int64 => make(name, &dims, typed_in!(BigInt64Array, data, name, ty)),
        DataType::Uint64 => make(name, &dims, typed_in!(BigUint64Array, data, name, ty)),
        DataType::Bool => {
            let v: Vec<u8> = typed_in!(Uint8Array, data, name, ty);
            make(name, &dims, v.into_iter().map(|b| b != 0).collect())
        }
        DataType::String => {
            if !Array::is_array(&data) {
                return Err(input_err(format!(
                    "input '{name}': type 'string' needs an array of strings as data"
                )));
            }
            let mut v = Vec::new();
            for s in Array::from(&data).iter() {
                v.push(s.as_string().ok_or_else(|| {
                    input_err(format!("input '{name}': string tensor holds a non-string"))
                })?);
            }
            make(name, &dims, v)
        }
        other => Err(input_err(format!(
            "input '{name}': type {other} cannot be fed from JS"
        ))),
    }
}

fn tensor_js(t: &Tensor) -> nxrt_core::Result<Object> {
    let o = Object::new();
    set(&o, "type", &js_name(js_type_name(t.dtype())));
    let dims = Array::new();
    for &d in t.shape() {
        dims.push(&JsValue::from_f64(d as f64));
    }
    set(&o, "dims", &dims);
    let data: JsValue = match t.dtype() {
        DataType::Float => Float32Array::from(&t.as_slice::<f32>()?[..]).into(),
        DataType::Double => Float64Array::from(&t.as_slice::<f64>()?[..]).into(),
        DataType::Float16 => {
            let v: Vec<u16> = t.as_slice::<f16>()?.iter().map(|x| x.to_bits()).collect();
            Uint16Array::from(&v[..]).into()
        }
        DataType::Bfloat16 => {
            // bfloat16 has no JS array type: hand out float32 values, labelled as such
            set(&o, "type", &js_name("float32"));
            Float32Array::from(&t.to_f32_vec()?[..]).into()
        }
        DataType::Int8 => Int8Array::from(&t.as_slice::<i8>()?[..]).into(),
        DataType::Uint8 => Uint8Array::from(&t.as_slice::<u8>()?[..]).into(),
        DataType::Int16 => Int16Array::from(&t.as_slice::<i16>()?[..]).into(),
        DataType::Uint16 => Uint16Array::from(&t.as_slice::<u16>()?[..]).into(),
        DataType::Int32 => Int32Array::from(&t.as_slice::<i32>()?[..]).into(),
        DataType::Uint32 => Uint32Array::from(&t.as_slice::<u32>()?[..]).into(),
        DataType::Int64 => BigInt64Array::from(&t.as_slice::<i64>()?[..]).into(),
        DataType::Uint64 => BigUint64Array::from(&t.as_slice::<u64>()?[..]).into(),
        DataType::Bool => {
            let v: Vec<u8> = t.as_slice::<bool>()?.iter().map(|&b| b as u8).collect();
            Uint8Array::from(&v[..]).into()
        }
        DataType::String => {
            let a = Array::new();
            for s in t.as_slice::<String>()?.iter() {
                a.push(&JsValue::from_str(s));
            }
            a.into()
        }
        other => {
            return Err(Error::Unsupported {
                ctx: Default::default(),
                detail: format!("output of type {other} cannot be handed to JS"),
            })
        }
    };
    set(&o, "data", &data);
    Ok(o)
}

/// A map key as JS: int64 keys become numbers when exact, else BigInt; strings stay strings.
fn map_js(m: &MapValue) -> nxrt_core::Result<Object> {
    let out = Map::new();
    let keys: Vec<JsValue> = match m.keys.dtype() {
        DataType::String => m
            .keys
            .as_slice::<String>()?
            .iter()
            .map(|s| JsValue::from_str(s))
            .collect(),
        _ => m
            .keys
            .to_i64_vec()?
            .into_iter()
            .map(|k| {
                if k.unsigned_abs() < (1u64 << 53) {
                    JsValue::from_f64(k as f64)
                } else {
                    js_sys::BigInt::from(k).into()
                }
            })
            .collect(),
    };
    for (k, v) in keys.iter().zip(&m.values) {
        out.set(k, &value_js(v)?.into());
    }
    let o = Object::new();
    set(&o, "kind", &js_name("map"));
    set(&o, "map", &out);
    Ok(o)
}

fn value_js(v: &Value) -> nxrt_core::Result<Object> {
    Ok(match v {
        Value::Tensor(t) => {
            let o = tensor_js(t)?;
            set(&o, "kind", &js_name("tensor"));
            o
        }
        Value::Sequence { items, .. } => {
            let a = Array::new();
            for it in items {
                a.push(&value_js(it)?.into());
            }
            let o = Object::new();
            set(&o, "kind", &js_name("sequence"));
            set(&o, "items", &a);
            o
        }
        Value::Map(m) => map_js(m)?,
        Value::Optional { value, .. } => match value {
            Some(v) => value_js(v)?,
            None => {
                let o = Object::new();
                set(&o, "kind", &js_name("none"));
                o
            }
        },
    })
}
