//! nxrt-wasm: the browser target. wasm-bindgen exports over the core session, run on core's
//! kernels (SIMD128 through core's portable SIMD layer when built with `+simd128`).
//!
//! The JS package in `js/` wraps these exports in an onnxruntime-web-shaped API
//! (`InferenceSession`, `Tensor`); nothing here is meant to be called directly by users.
//!
//! Natively this crate builds as a plain rlib (its conversion helpers are tested there); the
//! wasm-bindgen glue only exists on `wasm32`.

use std::sync::Arc;

use nxrt_core::kernels::CpuProvider;
use nxrt_core::provider::{ExecutionProvider, ReferenceCpu};
use nxrt_core::{loader, Error, OptLevel, Result, Session, SessionOptions};

pub use nxrt_core as core_api;

/// Version string of this build.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Provider names the browser build knows (`cpu` is an alias of `wasm`).
#[cfg(feature = "webgpu")]
pub const PROVIDERS: &[&str] = &["webgpu", "wasm", "cpu"];
#[cfg(not(feature = "webgpu"))]
pub const PROVIDERS: &[&str] = &["wasm", "cpu"];

/// Parses onnxruntime-web's `graphOptimizationLevel` names.
pub fn opt_level(name: &str) -> Result<OptLevel> {
    Ok(match name {
        "disabled" => OptLevel::None,
        "basic" => OptLevel::Basic,
        "extended" => OptLevel::Extended,
        "all" | "layout" => OptLevel::All,
        other => {
            return Err(Error::Input(format!(
                "graphOptimizationLevel '{other}' is not one of disabled, basic, extended, all"
            )))
        }
    })
}

fn check_providers(providers: &[String]) -> Result<()> {
    for p in providers {
        if !PROVIDERS.contains(&p.as_str()) {
            return Err(Error::Provider(format!(
                "execution provider '{p}' is not available in this build (available: {})",
                PROVIDERS.join(", ")
            )));
        }
    }
    Ok(())
}

fn session_with(
    bytes: &[u8],
    mut list: Vec<Arc<dyn ExecutionProvider>>,
    opt: OptLevel,
    ext: &dyn loader::ExternalDataSource,
    memory: Memory,
) -> Result<Session> {
    let model = loader::load_model(bytes, ext)?;
    list.push(Arc::new(CpuProvider::new(Arc::new(ReferenceCpu))));
    Session::new(
        model,
        list,
        &SessionOptions {
            optimization: opt,
            #[cfg(target_arch = "wasm32")]
            clock: Some(bindings::now_ns),
            memory_limit: memory.limit,
            weight_cache: memory.weight_cache,
            ..Default::default()
        },
    )
}

/// A session's memory settings: its host budget in bytes (none by default) and its dense
/// weight cache's policy and limit (see `nxrt_core::weight_cache`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    pub limit: Option<usize>,
    pub weight_cache: nxrt_core::weight_cache::WeightCacheOptions,
}

/// Builds a session from model bytes for the named CPU providers (`webgpu` needs
/// [`build_session_async`]: opening an adapter is async in a browser).
pub fn build_session(bytes: &[u8], providers: &[String], opt: OptLevel) -> Result<Session> {
    check_providers(providers)?;
    if providers.iter().any(|p| p == "webgpu") {
        return Err(Error::Provider(
            "the webgpu provider is opened asynchronously: use build_session_async".into(),
        ));
    }
    session_with(
        bytes,
        Vec::new(),
        opt,
        &loader::NoExternalData,
        Memory::default(),
    )
}

/// Builds a session for the named providers in preference order; `webgpu` opens the
/// platform's WebGPU adapter first (the CPU always runs what it declines, with explicit copies).
pub async fn build_session_async(
    bytes: &[u8],
    providers: &[String],
    opt: OptLevel,
    ext: &dyn loader::ExternalDataSource,
) -> Result<Session> {
    build_session_limited(bytes, providers, opt, ext, Memory::default()).await
}

/// [`build_session_async`] with the session's memory settings: a host budget (see
/// `nxrt_core::governor`: over it, loading or a run is `Error::OutOfMemory`) and the dense
/// weight cache's policy and limit.
pub async fn build_session_limited(
    bytes: &[u8],
    providers: &[String],
    opt: OptLevel,
    ext: &dyn loader::ExternalDataSource,
    memory: Memory,
) -> Result<Session> {
    check_providers(providers)?;
    let mut list: Vec<Arc<dyn ExecutionProvider>> = Vec::new();
    #[cfg(feature = "webgpu")]
    if providers.iter().any(|p| p == "webgpu") {
        list.push(Arc::new(webgpu::WebGpuProvider::new(0).await?));
    }
    session_with(bytes, list, opt, ext, memory)
}

#[cfg(feature = "webgpu")]
pub mod webgpu;

#[cfg(target_arch = "wasm32")]
mod bindings;
#[cfg(target_arch = "wasm32")]
mod genai;
#[cfg(target_arch = "wasm32")]
pub use bindings::*;
#[cfg(target_arch = "wasm32")]
pub use genai::*;

/// onnxruntime-web's name for an element type (`float32`, `int64`, ...), where it has one.
pub fn js_type_name(dt: nxrt_core::DataType) -> &'static str {
    use nxrt_core::DataType::*;
    match dt {
        Float => "float32",
        Double => "float64",
        Float16 => "float16",
        Bfloat16 => "bfloat16",
        Int8 => "int8",
        Uint8 => "uint8",
        Int16 => "int16",
        Uint16 => "uint16",
        Int32 => "int32",
        Uint32 => "uint32",
        Int64 => "int64",
        Uint64 => "uint64",
        Bool => "bool",
        String => "string",
        other => other.name(),
    }
}

/// The element type for an onnxruntime-web type name.
pub fn dtype_from_js(name: &str) -> Result<nxrt_core::DataType> {
    use nxrt_core::DataType::*;
    Ok(match name {
        "float32" => Float,
        "float64" => Double,
        "float16" => Float16,
        "int8" => Int8,
        "uint8" => Uint8,
        "int16" => Int16,
        "uint16" => Uint16,
        "int32" => Int32,
        "uint32" => Uint32,
        "int64" => Int64,
        "uint64" => Uint64,
        "bool" => Bool,
        "string" => String,
        other => {
            return Err(Error::Input(format!(
                "tensor type '{other}' is not supported (float32, float64, float16, int8, uint8, \
                 int16, uint16, int32, uint32, int64, uint64, bool, string)"
            )))
        }
    })
}

/// Checks a JS-supplied shape (non-negative integers whose product equals `len`).
pub fn check_dims(name: &str, dims: &[f64], len: usize) -> Result<Vec<usize>> {
    let mut shape = Vec::with_capacity(dims.len());
    for &d in dims {
        if !(d >= 0.0 && d.fract() == 0.0 && d <= (1u64 << 40) as f64) {
            return Err(Error::Input(format!(
                "input '{name}': dims must be non-negative integers, got {dims:?}"
            )));
        }
        shape.push(d as usize);
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::Input(format!("input '{name}': dims {dims:?} overflow")))?;
    if n != len {
        return Err(Error::Input(format!(
            "input '{name}': data has {len} elements but dims {shape:?} need {n}"
        )));
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_round_trip() {
        for n in [
            "float32", "float64", "float16", "int8", "uint8", "int16", "uint16", "int32", "uint32",
            "int64", "uint64", "bool", "string",
        ] {
            assert_eq!(js_type_name(dtype_from_js(n).unwrap()), n);
        }
        let e = dtype_from_js("complex64").unwrap_err().to_string();
        assert!(e.contains("complex64"), "{e}");
    }

    #[test]
    fn dims_are_checked_against_the_data() {
        assert_eq!(check_dims("x", &[2.0, 3.0], 6).unwrap(), vec![2, 3]);
        assert_eq!(check_dims("x", &[], 1).unwrap(), Vec::<usize>::new());
        let e = check_dims("x", &[2.0, 3.0], 5).unwrap_err().to_string();
        assert!(e.contains("'x'") && e.contains("5 elements"), "{e}");
        assert!(check_dims("x", &[-1.0], 0).is_err());
        assert!(check_dims("x", &[1.5], 1).is_err());
        assert!(check_dims("x", &[1e12, 1e12, 1e12], 0).is_err());
    }

    #[test]
    fn unknown_providers_are_refused_by_name() {
        let e = build_session(&[], &["webnn".into()], OptLevel::Basic)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("webnn"), "{e}");
        let e = build_session(&[1, 2, 3], &["wasm".into()], OptLevel::Basic)
            .err()
            .unwrap()
            .to_string();
        assert!(!e.is_empty());
    }
}
