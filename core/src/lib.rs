//! nxrt-core: ONNX loading, graph IR, shape inference, optimisation, the executor, the provider
//! and kernel traits, and portable reference kernels. `#![no_std]` + `alloc`, so the same code
//! runs natively and in wasm (`wasm32v1-none` proves there is no hidden std).
#![no_std]
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

extern crate alloc;

pub mod arena;
pub mod conformance;
pub mod convert;
pub mod dtype;
pub mod embedded;
pub mod error;
pub mod fuse;
pub mod genai;
pub mod governor;
pub mod infer;
pub mod ir;
pub mod kernels;
pub mod loader;
pub mod mechanism;
pub mod npy;
pub mod optimize;
pub mod planner;
pub mod profile;
pub mod proto;
pub mod provider;
pub mod session;
pub mod shapefold;
pub mod simd;
pub mod tensor;
pub mod value;
pub mod weight_cache;

pub use dtype::DataType;
pub use error::{Error, NodeContext, Result};
pub use session::{OptLevel, RunOptions, Session, SessionOptions};
pub use tensor::{Data, Elem, Location, Tensor};
pub use value::{Dim, TypeInfo, Value};
