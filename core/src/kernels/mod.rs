//! Portable reference kernels for every supported op, and the CPU provider that serves them.
//!
//! Each family module exports `pub(crate) const KERNELS: &[KernelDef]`; [`cpu_registry`] joins
//! them. Kernels are written once here and run on every target (native, wasm); targets speed
//! them up through [`CpuBackend`] (GEMM, threads) rather than by copying them.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::Node;
use crate::provider::{
    CpuBackend, ExecutionProvider, Kernel, KernelDef, KernelRegistry, Lookup, Support,
};
use crate::tensor::{Location, Tensor};
use crate::value::Value;

pub mod attention;
pub mod contrib;
pub mod contrib_enc;
pub mod elementwise;
pub mod linalg;
pub mod loss;
pub mod ml;
pub mod nbits;
pub mod nn;
pub mod norm;
pub(crate) mod par;
pub mod qlinear;
pub mod qmatmul;
pub mod quant;
pub mod random;
pub mod reduce;
pub mod rnn;
pub mod sequence;
pub mod shape;
pub mod signal;
#[cfg(test)]
pub(crate) mod test_util;
pub mod text;
pub mod training;
pub mod types;
pub mod vision;

/// Every kernel family's registrations. A family added to `kernels/` is listed here once.
pub fn cpu_registry() -> KernelRegistry {
    let mut r = KernelRegistry::new();
    for fam in [
        elementwise::KERNELS,
        attention::KERNELS,
        contrib::KERNELS,
        contrib_enc::KERNELS,
        nbits::KERNELS,
        shape::KERNELS,
        linalg::KERNELS,
        nn::KERNELS,
        nn::nchwc::KERNELS,
        norm::KERNELS,
        reduce::KERNELS,
        rnn::KERNELS,
        signal::KERNELS,
        ml::KERNELS,
        quant::KERNELS,
        qlinear::KERNELS,
        qmatmul::KERNELS,
        vision::KERNELS,
        loss::KERNELS,
        training::KERNELS,
        random::KERNELS,
        sequence::KERNELS,
        text::KERNELS,
    ] {
        r.extend(fam);
    }
    r
}

/// The CPU execution provider: core's reference kernels over a [`CpuBackend`].
pub struct CpuProvider {
    registry: KernelRegistry,
    backend: Arc<dyn CpuBackend>,
}

impl CpuProvider {
    pub fn new(backend: Arc<dyn CpuBackend>) -> Self {
        CpuProvider {
            registry: cpu_registry(),
            backend,
        }
    }
    pub fn registry(&self) -> &KernelRegistry {
        &self.registry
    }
}

/// Why no kernel matched (the caller adds node, op, domain and opset).
pub fn lookup_detail(lookup: &Lookup<'_>) -> String {
    match lookup {
        Lookup::Found(_) => String::new(),
        Lookup::UnknownOp => String::from("no kernel for this op"),
        Lookup::NoOpsetVersion { have } => alloc::format!(
            "this opset version is not supported (kernels exist for opsets {have:?})"
        ),
        Lookup::NoType {
            dtype,
            input,
            supported,
        } => {
            let list: Vec<&str> = supported.iter().map(|t| t.name()).collect();
            alloc::format!(
                "element type {dtype} (input {input}) is not supported by this op's kernel, \
                 which takes {}",
                list.join(", ")
            )
        }
    }
}

/// The typed error for a failed lookup, naming the node, op, domain, opset and dtype.
pub fn lookup_error(node: &Node, lookup: &Lookup<'_>) -> Error {
    Error::unsupported(&node.ctx(), lookup_detail(lookup))
}

impl ExecutionProvider for CpuProvider {
    fn name(&self) -> &str {
        "cpu"
    }
    fn location(&self) -> Location {
        Location::Host
    }
    fn supports(&self, node: &Node, input_types: &[Option<DataType>]) -> Support {
        match self.registry.lookup(node, input_types) {
            Lookup::Found(_) => Support::Yes,
            l => Support::No(lookup_detail(&l)),
        }
    }
    fn input_placement(&self, node: &Node, k: usize) -> crate::provider::InputPlacement {
        // Shape and Size read only the shape, which a device tensor carries on the host
        if node.domain.is_empty() && k == 0 && matches!(node.op_type.as_str(), "Shape" | "Size") {
            crate::provider::InputPlacement::Any
        } else {
            crate::provider::InputPlacement::Provider
        }
    }
    fn create_kernel(
        &self,
        node: &Node,
        input_types: &[Option<DataType>],
    ) -> Result<Box<dyn Kernel>> {
        match self.registry.lookup(node, input_types) {
            Lookup::Found(def) => (def.build)(node).map_err(|e| e.in_node(&node.ctx())),
            l => Err(lookup_error(node, &l)),
        }
    }
    fn cpu_backend(&self) -> &dyn CpuBackend {
        &*self.backend
    }
}

// ----------------------------------------------------------------------------- helpers

/// Registration shorthand (ai.onnx); declare the element types with `.types(..)` or
/// `.types_at(input, ..)` (see [`types`]).
pub(crate) const fn def(
    op: &'static str,
    since: i64,
    until: i64,
    build: crate::provider::KernelFactory,
) -> KernelDef {
    KernelDef {
        domain: "",
        op,
        since,
        until,
        type_input: 0,
        types: &[],
        build,
    }
}

/// Registration shorthand for another domain.
pub(crate) const fn def_in(
    domain: &'static str,
    op: &'static str,
    since: i64,
    until: i64,
    build: crate::provider::KernelFactory,
) -> KernelDef {
    KernelDef {
        domain,
        op,
        since,
        until,
        type_input: 0,
        types: &[],
        build,
    }
}

/// Newest opset a kernel registered "up to now" covers.
pub(crate) const LATEST: i64 = 28;

/// The newest ai.onnx opset the registry knows (a registration up to it covers "and later").
pub const LATEST_OPSET: i64 = LATEST;

/// Input `i` as a tensor (error when missing or not a tensor).
pub fn tensor_in<'a>(inputs: &[Option<&'a Value>], i: usize) -> Result<&'a Tensor> {
    match inputs.get(i).copied().flatten() {
        Some(Value::Tensor(t)) => Ok(t),
        Some(v) => Err(Error::Other(alloc::format!(
            "input {i} should be a tensor, is a {}",
            v.kind_name()
        ))),
        None => Err(Error::Other(alloc::format!(
            "required input {i} is missing"
        ))),
    }
}

/// Optional input `i` as a tensor (`None` when omitted).
pub fn opt_tensor_in<'a>(inputs: &[Option<&'a Value>], i: usize) -> Result<Option<&'a Tensor>> {
    match inputs.get(i).copied().flatten() {
        Some(Value::Tensor(t)) => Ok(Some(t)),
        Some(v) => Err(Error::Other(alloc::format!(
            "input {i} should be a tensor, is a {}",
            v.kind_name()
        ))),
        None => Ok(None),
    }
}

/// One tensor output.
pub fn out1(t: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::Tensor(t)])
}

/// Numpy-style broadcast of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::Shape(alloc::format!(
                "shapes {a:?} and {b:?} do not broadcast"
            )));
        };
    }
    Ok(out)
}

/// Resolves a possibly negative axis against a rank.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) {
        return Err(Error::Other(alloc::format!(
            "axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(a as usize)
}

/// Reads a 1-D integer tensor (shape, axes, pads, ...) as i64s.
pub fn ints_of(t: &Tensor) -> Result<Vec<i64>> {
    t.to_i64_vec()
}

/// Converts i64 dims to usize, rejecting negatives.
pub fn dims_of(v: &[i64]) -> Result<Vec<usize>> {
    v.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| Error::Other(alloc::format!("negative dimension {d}")))
        })
        .collect()
}

/// Calls `$body` with `$T` bound to the Rust type of a numeric tensor's element type, for the
/// listed [`crate::tensor::Data`] variants.
#[macro_export]
macro_rules! dispatch_numeric {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        use $crate::dtype::DataType as __D;
        match $dt {
            __D::Float => {
                type $T = f32;
                $body
            }
            __D::Double => {
                type $T = f64;
                $body
            }
            __D::Int32 => {
                type $T = i32;
                $body
            }
            __D::Int64 => {
                type $T = i64;
                $body
            }
            __D::Int8 => {
                type $T = i8;
                $body
            }
            __D::Int16 => {
                type $T = i16;
                $body
            }
            __D::Uint8 => {
                type $T = u8;
                $body
            }
            __D::Uint16 => {
                type $T = u16;
                $body
            }
            __D::Uint32 => {
                type $T = u32;
                $body
            }
            __D::Uint64 => {
                type $T = u64;
                $body
            }
            _ => $other,
        }
    }};
}

/// Like [`dispatch_numeric`] but for every element type with a Rust representation
/// (numeric, f16, bf16, bool, string); packed types go to `$other`.
#[macro_export]
macro_rules! dispatch_any {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        use $crate::dtype::DataType as __D;
        match $dt {
            __D::Float => {
                type $T = f32;
                $body
            }
            __D::Double => {
                type $T = f64;
                $body
            }
            __D::Float16 => {
                type $T = half::f16;
                $body
            }
            __D::Bfloat16 => {
                type $T = half::bf16;
                $body
            }
            __D::Int32 => {
                type $T = i32;
                $body
            }
            __D::Int64 => {
                type $T = i64;
                $body
            }
            __D::Int8 => {
                type $T = i8;
                $body
            }
            __D::Int16 => {
                type $T = i16;
                $body
            }
            __D::Uint8 => {
                type $T = u8;
                $body
            }
            __D::Uint16 => {
                type $T = u16;
                $body
            }
            __D::Uint32 => {
                type $T = u32;
                $body
            }
            __D::Uint64 => {
                type $T = u64;
                $body
            }
            __D::Bool => {
                type $T = bool;
                $body
            }
            __D::String => {
                type $T = alloc::string::String;
                $body
            }
            _ => $other,
        }
    }};
}

/// Float element types computed through f32 (f16/bf16 widen, f64 stays f64 where it matters).
pub trait Float:
    Copy
    + Send
    + Sync
    + 'static
    + core::fmt::Debug
    + PartialOrd
    + crate::tensor::Elem
    + core::ops::Add<Output = Self>
    + core::ops::Sub<Output = Self>
    + core::ops::Mul<Output = Self>
    + core::ops::Div<Output = Self>
{
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Float for f32 {
    #[inline]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}
impl Float for f64 {
    #[inline]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
}
impl Float for half::f16 {
    #[inline]
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
    #[inline]
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}
impl Float for half::bf16 {
    #[inline]
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
    #[inline]
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// Calls `$body` with `$T` bound to a float type (f32, f64, f16, bf16).
#[macro_export]
macro_rules! dispatch_float {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        use $crate::dtype::DataType as __D;
        match $dt {
            __D::Float => {
                type $T = f32;
                $body
            }
            __D::Double => {
                type $T = f64;
                $body
            }
            __D::Float16 => {
                type $T = half::f16;
                $body
            }
            __D::Bfloat16 => {
                type $T = half::bf16;
                $body
            }
            _ => $other,
        }
    }};
}

/// Error for an element type a kernel does not handle.
/// Largest constant weight (elements) packed at load: bigger weights (an LLM's) are read where
/// they are rather than held twice.
pub(crate) const PREPACK_MAX: usize = 1 << 24;

/// f32 weights packed once at load for the SGEMM (a kernel's [`prepare`](Kernel::prepare)),
/// with what identifies the tensor they came from: a kernel uses them only when `compute` is
/// given that very tensor (the same storage and shape), so a fed value is never computed with
/// stale weights.
pub(crate) struct Prepacked {
    /// Address and length of the source tensor's elements.
    key: (usize, usize),
    shape: Vec<usize>,
    data: crate::simd::AlignedF32,
}

impl Prepacked {
    /// Packs an f32 tensor held in its own contiguous storage with `pack` (which sees the
    /// elements and the shape; `None`: nothing worth packing).
    pub fn new(
        w: &Tensor,
        pack: impl FnOnce(&[f32], &[usize]) -> Option<Vec<f32>>,
    ) -> Option<Prepacked> {
        if w.dtype() != DataType::Float {
            return None;
        }
        let v = w.as_slice::<f32>().ok()?;
        let alloc::borrow::Cow::Borrowed(v) = v else {
            return None;
        };
        Some(Prepacked {
            key: (v.as_ptr() as usize, v.len()),
            shape: w.shape().to_vec(),
            data: crate::simd::AlignedF32::from_slice(&pack(v, w.shape())?),
        })
    }

    /// Bytes held by the packed copy.
    pub fn bytes(&self) -> usize {
        self.data.len() * core::mem::size_of::<f32>()
    }

    /// The packed data when `w` is the tensor it was packed from.
    pub fn for_tensor(&self, w: &Tensor) -> Option<&[f32]> {
        if w.dtype() != DataType::Float || w.shape() != self.shape.as_slice() {
            return None;
        }
        match w.as_slice::<f32>().ok()? {
            alloc::borrow::Cow::Borrowed(v) if (v.as_ptr() as usize, v.len()) == self.key => {
                Some(&self.data)
            }
            _ => None,
        }
    }
}

pub fn bad_type(op: &str, dt: DataType) -> Error {
    Error::Unsupported {
        ctx: Default::default(),
        detail: alloc::format!("{op} does not support element type {dt}"),
    }
}

/// f32 math that works without std.
pub mod fmath {
    #[inline]
    pub fn exp(x: f32) -> f32 {
        libm::expf(x)
    }
    #[inline]
    pub fn ln(x: f32) -> f32 {
        libm::logf(x)
    }
    #[inline]
    pub fn sqrt(x: f32) -> f32 {
        libm::sqrtf(x)
    }
    #[inline]
    pub fn tanh(x: f32) -> f32 {
        libm::tanhf(x)
    }
    #[inline]
    pub fn sigmoid(x: f32) -> f32 {
        if x >= 0.0 {
            1.0 / (1.0 + libm::expf(-x))
        } else {
            let e = libm::expf(x);
            e / (1.0 + e)
        }
    }
    #[inline]
    pub fn erf(x: f32) -> f32 {
        libm::erff(x)
    }
    #[inline]
    pub fn pow(x: f32, y: f32) -> f32 {
        libm::powf(x, y)
    }
}
