//! nxrt-wasm: the browser target. For now it re-exports the core so that the core's wasm32
//! build is exercised; wasm-bindgen exports, SIMD128 kernels and WebGPU arrive in issues 02/05.
#![no_std]

pub use nxrt_core as core_api;

/// Version string of this build (kept so the cdylib has a symbol to export).
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
