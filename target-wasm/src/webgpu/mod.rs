//! The WebGPU execution provider: WGSL compute kernels on `wgpu`, the same code in the browser
//! (the page's WebGPU) and natively (wgpu's Vulkan, Metal or DX12 backend; CI uses Mesa's
//! software Vulkan, lavapipe).
//!
//! - Tensors on the device are [`GpuBuf`]s behind `Buffer::Device`: f32 as f32, and the
//!   integer and bool types the kernels read (indices, masks) as 32-bit words. Every buffer
//!   comes from the provider's pool, goes back to it when its last tensor is dropped, and is
//!   reused by later nodes and runs; `release_cached` (and `Session::release_cached`) frees the
//!   pool, dropping the provider frees everything.
//! - Kernels record their dispatches, copies and small table writes into one shared command
//!   encoder ([`Batch`]); it is submitted every [`BATCH_DISPATCHES`] dispatches, before a
//!   read-back and before a large upload, so a model run costs a handful of submits, not one
//!   per kernel. Kernel parameters live in one staging arena per batch, written with the
//!   submit. Nothing waits on the GPU until a value is read back, which is async (`download`)
//!   so a browser never blocks.
//! - The adapter's limits are read once: a tensor larger than `maxStorageBufferBindingSize` or
//!   a dispatch larger than `maxComputeWorkgroupsPerDimension` in two dimensions is a clear error
//!   before anything is submitted; one-dimensional work over more groups than one dimension
//!   allows is folded into two.
//! - Validation errors and a lost device are caught (never a panic) and returned by the next
//!   call; a lost device stays an error for this provider, and a new provider (a new session)
//!   works again.

mod attention;
mod conv;
mod data;
mod ew;
mod gqa;
mod matmul;
mod nbits;
mod norm;
mod reduce;
mod rotary;
mod shape;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nxrt_core::governor::{Account, Holder, Lease, Tier};
use nxrt_core::ir::Node;
use nxrt_core::provider::{
    BoxFuture, CpuBackend, ExecutionProvider, InputPlacement, Kernel, KernelCx, ReferenceCpu,
    Support,
};
use nxrt_core::tensor::DeviceBuffer;
use nxrt_core::{DataType, Error, Location, Result, Tensor, Value};

/// What a kernel does when it runs: read its inputs, dispatch, return its outputs.
pub(crate) type Exec = Box<dyn Fn(&Gpu, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync>;

/// One WebGPU kernel registration.
pub(crate) struct OpDef {
    pub op: &'static str,
    /// Lowest ai.onnx opset the kernel implements (it covers every later one).
    pub since: i64,
    /// The input whose element type must be f32 (or f16 where `half`).
    pub type_input: usize,
    /// The kernel also runs float16 tensors (stored as [`Store`] says).
    pub half: bool,
    /// Inputs the kernel reads on the host (shapes, axes, indices, scalars).
    pub host: &'static [usize],
    /// Checks attributes and builds the kernel (an error: the node stays on the CPU).
    pub build: fn(&Node) -> Result<Exec>,
}

fn all_ops() -> impl Iterator<Item = &'static OpDef> {
    ew::OPS
        .iter()
        .chain(ew::UNARY)
        .chain(matmul::OPS)
        .chain(data::OPS)
        .chain(conv::OPS)
        .chain(reduce::OPS)
        .chain(norm::OPS)
        .chain(shape::OPS)
        .chain(attention::OPS)
        .chain(rotary::OPS)
}

/// The op names the WebGPU provider has kernels for (docs, `inspect`).
pub fn op_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = all_ops().map(|d| d.op).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// How a float tensor is stored on the device. Kernels compute in f32 whatever the storage:
/// they load through `f32(...)` and store through `st(...)` (see [`Store::header`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    /// float32 tensors.
    F32,
    /// float16 tensors on an adapter without `shader-f16`: f32 words holding values rounded to
    /// f16 precision on every store, so results equal an f16 computation's.
    F16AsF32,
    /// float16 tensors as f16 on an adapter with `shader-f16` (half the memory and bandwidth).
    F16,
}

impl Store {
    /// The WGSL storage type.
    pub fn ty(self) -> &'static str {
        match self {
            Store::F16 => "f16",
            _ => "f32",
        }
    }

    /// A pipeline-cache key part.
    pub fn key(self) -> &'static str {
        match self {
            Store::F32 => "f32",
            Store::F16AsF32 => "h32",
            Store::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Store::F16 => 2,
            _ => 4,
        }
    }

    /// The WGSL that must open a module storing this type: `enable f16;` when needed, `alias T`
    /// (the storage type) and `fn st(v: f32) -> T` (rounds to the stored precision).
    pub fn header(self) -> &'static str {
        match self {
            Store::F32 => "alias T = f32;\nfn st(v: f32) -> T { return v; }\n",
            // pack2x16float is undefined outside f16's range: values that round to infinity
            // in f16 (|v| >= 65520) are made infinite from their sign bits at run time, NaN
            // passes through
            Store::F16AsF32 => {
                "alias T = f32;\nfn st(v: f32) -> T {\n  \
                 let h = unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;\n  \
                 let inf = bitcast<f32>((bitcast<u32>(v) & 0x80000000u) | 0x7f800000u);\n  \
                 return select(select(h, inf, abs(v) >= 65520.0), v, v != v);\n}\n"
            }
            // the conversion rounds to nearest and overflows to infinity on IEEE hardware
            // (WGSL leaves out-of-range conversions to the implementation; a clamp would
            // turn every infinity into 65504)
            Store::F16 => "enable f16;\nalias T = f16;\nfn st(v: f32) -> T { return T(v); }\n",
        }
    }
}

/// The header of a module that reads tensors stored as `reads` and stores `out`: `enable f16;`
/// when any of them is f16 (it must open the module), then `out`'s `alias T` and `st`.
pub(crate) fn module_header(reads: &[Store], out: Store) -> String {
    let enable = if reads.contains(&Store::F16) || out == Store::F16 {
        "enable f16;\n"
    } else {
        ""
    };
    let h = out.header();
    format!("{enable}{}", h.strip_prefix("enable f16;\n").unwrap_or(h))
}

/// What the adapter is and what it allows.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub shader_f16: bool,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

/// The device, its queue and limits, the buffer pool and the pipeline cache.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) limits: wgpu::Limits,
    summary: AdapterSummary,
    /// float16 tensors are stored as f16 (the device has `shader-f16` and it is allowed).
    half: bool,
    id: u16,
    pool: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// The commands recorded since the last submit.
    batch: Mutex<Batch>,
    /// First uncaptured error since the last check (validation, out of memory).
    error: Arc<Mutex<Option<String>>>,
    /// Set once the device is lost; sticky.
    lost: Arc<Mutex<Option<String>>>,
    /// Bytes of device buffers alive (in tensors or in the pool).
    live_bytes: AtomicU64,
    pooled_bytes: AtomicU64,
    dispatches: AtomicU64,
    uploads: AtomicU64,
    downloads: AtomicU64,
    downloaded_bytes: AtomicU64,
    submits: AtomicU64,
    me: Weak<Gpu>,
    /// The account of the first session this device serves (see `ExecutionProvider::bind_account`).
    account: std::sync::OnceLock<Arc<Account>>,
}

/// Dispatches recorded before the batch is submitted (a real GPU starts on the first ones
/// while later ones are still being recorded).
pub const BATCH_DISPATCHES: u32 = 32;
/// Bytes of the per-batch staging arena (kernel parameters and small table writes).
const ARENA_BYTES: u64 = 256 * 1024;

/// Commands recorded but not submitted yet, and the arena bytes they read.
struct Batch {
    enc: Option<wgpu::CommandEncoder>,
    dispatches: u32,
    /// The arena's contents for this batch (written to `arena` just before the submit; the
    /// queue orders that write after every earlier submit, so one buffer serves every batch).
    staged: Vec<u8>,
    arena: wgpu::Buffer,
}

/// Counters for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Bytes of device buffers that exist (held by tensors or pooled).
    pub live_bytes: u64,
    /// Of those, bytes waiting in the pool.
    pub pooled_bytes: u64,
    /// Compute dispatches since the provider was made.
    pub dispatches: u64,
    /// Host-to-device and device-to-host tensor copies since the provider was made.
    pub uploads: u64,
    pub downloads: u64,
    /// Bytes those read-backs moved.
    pub downloaded_bytes: u64,
    /// Command buffers submitted to the queue.
    pub submits: u64,
}

/// A device buffer: returns to its provider's pool when dropped.
///
/// An element-wise result is computed lazily: its buffer holds a [`ew::Pending`] expression
/// over the tensors it reads until something needs the bytes ([`GpuBuf::raw`]), so a chain of
/// element-wise ops runs as one fused dispatch.
pub struct GpuBuf {
    /// The device buffer, taken from the pool when first needed: a result that is fused into
    /// its reader (a pending chain, a producer) never takes one.
    buf: std::sync::OnceLock<wgpu::Buffer>,
    /// The buffer's size (`bytes` rounded up to 4).
    size: u64,
    /// Bytes in use (the buffer itself may be larger: sizes round up to 4).
    bytes: u64,
    gpu: Weak<Gpu>,
    /// The governor's lease on this tensor's device bytes (returned when it drops).
    _lease: Lease,
    pending: Mutex<Option<ew::Pending>>,
    /// The buffer is the caller's ([`WebGpuProvider::tensor_from_buffer`]): never pooled.
    external: bool,
    /// A kernel (MatMul, Gemm, Conv) whose output this is, not run yet: an element-wise chain
    /// that is its only reader runs it with the chain as its epilogue ([`Producer`]).
    producer: Mutex<Option<Arc<dyn Producer>>>,
}

/// A kernel that computes its output lazily and can apply an element-wise epilogue (bias,
/// activation, residual add: any fused element-wise chain) to each value before it stores
/// it, so `MatMul -> Add -> Gelu` or `Conv -> HardSwish` is one dispatch.
pub(crate) trait Producer: Send + Sync {
    /// Computes the output into `out`, `epi` applied to every element (by flat index).
    fn run(&self, gpu: &Gpu, out: &wgpu::Buffer, epi: Option<&ew::Epilogue>) -> Result<()>;
    /// Storage bindings the kernel takes itself, its parameters included (the epilogue's
    /// come on top, within the adapter's limit).
    fn bindings(&self) -> usize;
}

impl std::fmt::Debug for GpuBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuBuf({} bytes)", self.bytes)
    }
}

impl GpuBuf {
    /// The buffer, its contents computed first when they are still pending (a fused
    /// element-wise chain). A failure there is recorded in the provider's error slot, which the
    /// caller's next dispatch or read-back returns.
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        let buf = self.buf.get_or_init(|| {
            self.gpu
                .upgrade()
                .expect("a device tensor outlives its provider")
                .pooled_or_new(self.size)
        });
        let pending = self.pending.lock().unwrap().take();
        let producer = self.producer.lock().unwrap().take();
        if let Some(gpu) = self.gpu.upgrade() {
            let r = match (pending, producer) {
                (Some(p), _) => ew::materialize(&gpu, buf, p),
                (None, Some(k)) => k.run(&gpu, buf, None),
                (None, None) => Ok(()),
            };
            if let Err(e) = r {
                let mut slot = gpu.error.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(e.to_string());
                }
            }
        }
        buf
    }

    /// The kernel that will compute this buffer, taken: the caller runs it (with an epilogue)
    /// into another buffer, so this one is never computed.
    pub(crate) fn take_producer(&self) -> Option<Arc<dyn Producer>> {
        self.producer.lock().unwrap().take()
    }

    /// The kernel waiting to compute this buffer, if any (left in place).
    pub(crate) fn producer(&self) -> Option<Arc<dyn Producer>> {
        self.producer.lock().unwrap().clone()
    }

    /// The pending expression, if the contents are not computed yet (cloned).
    pub(crate) fn pending(&self) -> Option<ew::Pending> {
        self.pending.lock().unwrap().clone()
    }
}

impl DeviceBuffer for GpuBuf {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn byte_len(&self) -> usize {
        self.bytes as usize
    }
    fn lease(&self) -> Option<&Lease> {
        Some(&self._lease)
    }
}

impl Drop for GpuBuf {
    fn drop(&mut self) {
        if self.external {
            return; // the caller's buffer: it stays theirs
        }
        if let (Some(b), Some(gpu)) = (self.buf.take(), self.gpu.upgrade()) {
            gpu.pooled_bytes.fetch_add(b.size(), Ordering::Relaxed);
            gpu.pool
                .lock()
                .unwrap()
                .entry(b.size())
                .or_default()
                .push(b);
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({:?}, device {})", self.summary.name, self.id)
    }
}

/// The device's buffer pool is the mechanism its tier's memory comes from: it dies with the
/// device, and what it keeps is the pooled free buffers.
impl nxrt_core::mechanism::Mechanism for Gpu {
    fn name(&self) -> String {
        format!("webgpu buffer pool of {}", self.summary.name)
    }
    fn tier(&self) -> Tier {
        Tier::Device(self.id)
    }
    fn failure(&self) -> Option<String> {
        // natively the loss callback runs from a poll (a browser calls it on its own)
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::Poll);
        self.lost
            .lock()
            .unwrap()
            .as_ref()
            .map(|m| format!("device lost ({m})"))
    }
    fn cached_bytes(&self) -> usize {
        usize::try_from(self.pooled_bytes.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }
    fn release_cached(&self) -> usize {
        let before = self.cached_bytes();
        self.trim();
        before
    }
}

fn gpu_err(what: impl std::fmt::Display) -> Error {
    Error::Provider(format!("webgpu: {what}"))
}

impl Gpu {
    /// `e`, or [`Error::DeviceLost`] when the device was lost (a failure that the loss caused
    /// says so).
    fn lost_or(&self, e: Error) -> Error {
        match self.lost.lock().unwrap().clone() {
            Some(m) => Error::DeviceLost {
                provider: "webgpu".into(),
                reason: m,
            },
            None => e,
        }
    }

    /// Fails when the device was lost or an earlier command raised an error.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(m) = self.lost.lock().unwrap().clone() {
            return Err(Error::DeviceLost {
                provider: "webgpu".into(),
                reason: m,
            });
        }
        if let Some(m) = self.error.lock().unwrap().take() {
            return Err(gpu_err(m));
        }
        Ok(())
    }

    /// The device (callers make their own buffers on it for
    /// [`WebGpuProvider::tensor_from_buffer`] and [`WebGpuProvider::copy_to_buffer`]).
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The device's queue (the provider submits its commands here, in order with the
    /// caller's).
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    pub fn summary(&self) -> &AdapterSummary {
        &self.summary
    }

    /// Whether float16 tensors are stored (and read by kernels) as f16.
    pub fn half(&self) -> bool {
        self.half
    }

    /// How a float tensor of `dt` is stored.
    pub(crate) fn store(&self, dt: DataType) -> Result<Store> {
        match dt {
            DataType::Float => Ok(Store::F32),
            DataType::Float16 if self.half => Ok(Store::F16),
            DataType::Float16 => Ok(Store::F16AsF32),
            dt => Err(gpu_err(format!("no float storage for {dt}"))),
        }
    }

    /// Bytes per element of `dt` on the device, `None`: not storable.
    fn elem_bytes(&self, dt: DataType) -> Option<u64> {
        match dt {
            DataType::Int32 | DataType::Int64 | DataType::Bool => Some(4),
            // bytes, four to a word (MatMulNBits' codes and zero points)
            DataType::Uint8 => Some(1),
            DataType::Float | DataType::Float16 => self.store(dt).ok().map(Store::bytes),
            _ => None,
        }
    }

    pub fn stats(&self) -> GpuStats {
        GpuStats {
            live_bytes: self.live_bytes.load(Ordering::Relaxed),
            pooled_bytes: self.pooled_bytes.load(Ordering::Relaxed),
            dispatches: self.dispatches.load(Ordering::Relaxed),
            uploads: self.uploads.load(Ordering::Relaxed),
            downloads: self.downloads.load(Ordering::Relaxed),
            downloaded_bytes: self.downloaded_bytes.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
        }
    }

    /// Drops every pooled buffer.
    pub fn trim(&self) {
        // recorded commands may still name a pooled buffer: submit them before destroying it
        let _ = self.flush();
        let mut pool = self.pool.lock().unwrap();
        for (size, bufs) in pool.drain() {
            let n = size * bufs.len() as u64;
            self.pooled_bytes.fetch_sub(n, Ordering::Relaxed);
            self.live_bytes.fetch_sub(n, Ordering::Relaxed);
            for b in bufs {
                b.destroy();
            }
        }
    }

    /// A buffer of at least `bytes` bytes, from the pool when one of that size is free.
    pub fn buffer(&self, bytes: u64, what: &str) -> Result<Arc<GpuBuf>> {
        let size = self.checked_size(bytes, what)?;
        let lease = self.lease(size, &|| what.to_string())?;
        Ok(Arc::new(GpuBuf {
            buf: std::sync::OnceLock::from(self.pooled_or_new(size)),
            size,
            bytes,
            gpu: self.me.clone(),
            _lease: lease,
            pending: Mutex::new(None),
            external: false,
            producer: Mutex::new(None),
        }))
    }

    /// A lease of `size` device bytes from the bound session's account (and the process's
    /// budget of this device): [`Error::OutOfMemory`] before anything is allocated when over.
    /// Free buffers kept in the pool are not charged (a cache `release_cached` gives back).
    fn lease(&self, size: u64, what: &dyn Fn() -> String) -> Result<Lease> {
        Lease::take(
            self.account.get(),
            Tier::Device(self.id),
            Holder::Other,
            usize::try_from(size).unwrap_or(usize::MAX),
            what,
        )
    }

    /// The buffer size for `bytes` (rounded up to 4), an error above the adapter's limits.
    fn checked_size(&self, bytes: u64, what: &str) -> Result<u64> {
        let size = bytes.max(4).div_ceil(4) * 4;
        let lim = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if size > lim {
            return Err(gpu_err(format!(
                "{what} needs {size} bytes, above this adapter's maxStorageBufferBindingSize / \
                 maxBufferSize ({lim} bytes)"
            )));
        }
        Ok(size)
    }

    /// A buffer of exactly `size` bytes: a pooled one when there is one, else a new one.
    fn pooled_or_new(&self, size: u64) -> wgpu::Buffer {
        let pooled = self
            .pool
            .lock()
            .unwrap()
            .get_mut(&size)
            .and_then(|v| v.pop());
        match pooled {
            Some(b) => {
                self.pooled_bytes.fetch_sub(size, Ordering::Relaxed);
                b
            }
            None => {
                self.live_bytes.fetch_add(size, Ordering::Relaxed);
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("nxrt tensor"),
                    size,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }
        }
    }

    /// A device tensor whose contents are `p`, computed when first needed.
    pub(crate) fn alloc_pending(
        &self,
        dt: DataType,
        shape: &[usize],
        p: ew::Pending,
    ) -> Result<Tensor> {
        let (t, b) = self.alloc_lazy(dt, shape)?;
        *b.pending.lock().unwrap() = Some(p);
        Ok(t)
    }

    /// A device float tensor that `k` computes when first needed (or fuses into a reader).
    pub(crate) fn alloc_produced(
        &self,
        dt: DataType,
        shape: &[usize],
        k: Arc<dyn Producer>,
    ) -> Result<Tensor> {
        let (t, b) = self.alloc_lazy(dt, shape)?;
        if !t.is_empty() {
            *b.producer.lock().unwrap() = Some(k);
        }
        Ok(t)
    }

    /// [`Gpu::alloc`] whose buffer is taken only when something needs its bytes.
    fn alloc_lazy(&self, dt: DataType, shape: &[usize]) -> Result<(Tensor, Arc<GpuBuf>)> {
        let (bytes, size) = self.tensor_bytes(dt, shape)?;
        let lease = self.lease(size, &|| nxrt_core::governor::KERNEL.into())?;
        let b = Arc::new(GpuBuf {
            buf: std::sync::OnceLock::new(),
            size,
            bytes,
            gpu: self.me.clone(),
            _lease: lease,
            pending: Mutex::new(None),
            external: false,
            producer: Mutex::new(None),
        });
        let t = Tensor::from_device(dt, shape.to_vec(), self.id, b.clone());
        Ok((t, b))
    }

    /// A tensor's bytes and its buffer's size, checked against the adapter's limits.
    fn tensor_bytes(&self, dt: DataType, shape: &[usize]) -> Result<(u64, u64)> {
        let w = self
            .elem_bytes(dt)
            .ok_or_else(|| gpu_err(format!("no device storage for {dt}")))?;
        let n = nxrt_core::tensor::numel(shape)? as u64;
        let bytes = n
            .checked_mul(w)
            .ok_or_else(|| gpu_err(format!("tensor {shape:?} is too large")))?;
        let size = self.checked_size(bytes, &format!("a {dt} tensor of shape {shape:?}"))?;
        Ok((bytes, size))
    }

    /// A new device tensor of `dt` and `shape` (contents undefined until a kernel writes it).
    pub(crate) fn alloc(&self, dt: DataType, shape: &[usize]) -> Result<(Tensor, Arc<GpuBuf>)> {
        let (t, b) = self.alloc_lazy(dt, shape)?;
        b.raw();
        Ok((t, b))
    }

    /// The compute pipeline for `key`, compiled from `wgsl()` the first time.
    pub(crate) fn pipeline(
        &self,
        key: &str,
        wgsl: impl FnOnce() -> String,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.pipelines.lock().unwrap().get(key) {
            return Ok(p.clone());
        }
        let src = wgsl();
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let p = Arc::new(
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(key),
                    layout: None,
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: None,
                }),
        );
        // a shader that does not compile reports through the error handler
        self.check()
            .map_err(|e| gpu_err(format!("kernel {key} failed to build: {e}")))?;
        self.pipelines
            .lock()
            .unwrap()
            .insert(key.to_string(), p.clone());
        Ok(p)
    }

    /// Runs `pipe` over `count` invocations of `wg`-wide workgroups: binding 0 is `params`
    /// (word 0 is filled in with the row width of a two-dimensional grid), bindings 1.. are
    /// `bufs`. One-dimensional work beyond the per-dimension limit folds into two dimensions.
    pub(crate) fn dispatch(
        &self,
        pipe: &wgpu::ComputePipeline,
        params: &mut [u32],
        bufs: &[&wgpu::Buffer],
        count: u64,
        wg: u32,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let max = self.limits.max_compute_workgroups_per_dimension as u64;
        let groups = count.div_ceil(wg as u64);
        let (x, y) = if groups <= max {
            (groups, 1)
        } else {
            (max, groups.div_ceil(max))
        };
        if y > max {
            return Err(gpu_err(format!(
                "{count} invocations need {groups} workgroups, above this adapter's \
                 maxComputeWorkgroupsPerDimension ({max}) squared"
            )));
        }
        params[0] = (x * wg as u64) as u32;
        self.dispatch_grid(pipe, params, bufs, [x as u32, y as u32, 1])
    }

    /// Runs `pipe` over an explicit grid of workgroups (checked against the limits).
    pub(crate) fn dispatch_grid(
        &self,
        pipe: &wgpu::ComputePipeline,
        params: &[u32],
        bufs: &[&wgpu::Buffer],
        grid: [u32; 3],
    ) -> Result<()> {
        let max = self.limits.max_compute_workgroups_per_dimension;
        if grid.iter().any(|&g| g > max) {
            return Err(gpu_err(format!(
                "a dispatch of {grid:?} workgroups exceeds maxComputeWorkgroupsPerDimension ({max})"
            )));
        }
        if grid.contains(&0) {
            return Ok(());
        }
        if bufs.len() + 1 > self.limits.max_storage_buffers_per_shader_stage as usize {
            return Err(gpu_err(format!(
                "a kernel binding {} buffers exceeds maxStorageBuffersPerShaderStage ({})",
                bufs.len() + 1,
                self.limits.max_storage_buffers_per_shader_stage
            )));
        }
        let layout = pipe.get_bind_group_layout(0);
        let one = [0u32];
        let pbytes: &[u8] = bytemuck::cast_slice(if params.is_empty() { &one } else { params });
        let mut batch = self.batch.lock().unwrap();
        let poff = self.stage(&mut batch, pbytes)?;
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &batch.arena,
                offset: poff,
                size: std::num::NonZeroU64::new(pbytes.len() as u64),
            }),
        }];
        for (i, b) in bufs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        {
            let enc = self.encoder(&mut batch);
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(pipe);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        }
        batch.dispatches += 1;
        self.dispatches.fetch_add(1, Ordering::Relaxed);
        if batch.dispatches >= BATCH_DISPATCHES {
            self.submit(&mut batch);
        }
        drop(batch);
        self.check()
    }

    /// The batch's encoder (a new one after a submit).
    fn encoder<'b>(&self, batch: &'b mut Batch) -> &'b mut wgpu::CommandEncoder {
        batch.enc.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("nxrt batch"),
                })
        })
    }

    /// Appends `bytes` to the batch's arena at an offset every binding accepts, submitting the
    /// batch first when the arena is full; returns the offset.
    fn stage(&self, batch: &mut Batch, bytes: &[u8]) -> Result<u64> {
        let align = (self.limits.min_storage_buffer_offset_alignment as u64).max(4);
        let len = (bytes.len() as u64).div_ceil(4) * 4;
        if len > ARENA_BYTES {
            return Err(gpu_err(format!(
                "{len} bytes of kernel parameters exceed the {ARENA_BYTES}-byte arena"
            )));
        }
        let mut off = (batch.staged.len() as u64).div_ceil(align) * align;
        if off + len > ARENA_BYTES {
            self.submit(batch);
            off = 0;
        }
        batch.staged.resize(off as usize, 0);
        batch.staged.extend_from_slice(bytes);
        batch.staged.resize((off + len) as usize, 0);
        Ok(off)
    }

    /// Submits what the batch recorded (its arena written first).
    fn submit(&self, batch: &mut Batch) {
        if let Some(enc) = batch.enc.take() {
            if !batch.staged.is_empty() {
                self.queue.write_buffer(&batch.arena, 0, &batch.staged);
            }
            self.queue.submit([enc.finish()]);
            self.submits.fetch_add(1, Ordering::Relaxed);
        }
        batch.staged.clear();
        batch.dispatches = 0;
    }

    /// Submits every recorded command now.
    pub fn flush(&self) -> Result<()> {
        self.submit(&mut self.batch.lock().unwrap());
        self.check()
    }

    /// Writes `bytes` (a multiple of 4) into `dst` at `dst_off`, ordered after every command
    /// recorded so far: small writes go through the arena and a recorded copy, large ones
    /// submit the batch and write directly.
    pub(crate) fn write(&self, dst: &wgpu::Buffer, dst_off: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mut batch = self.batch.lock().unwrap();
        if (bytes.len() as u64) * 4 <= ARENA_BYTES {
            let off = self.stage(&mut batch, bytes)?;
            let len = bytes.len() as u64;
            let arena = batch.arena.clone();
            self.encoder(&mut batch)
                .copy_buffer_to_buffer(&arena, off, dst, dst_off, len);
        } else {
            self.submit(&mut batch);
            self.queue.write_buffer(dst, dst_off, bytes);
        }
        drop(batch);
        self.check()
    }

    /// A pooled device buffer holding `bytes` (kernel tables: offsets, indices), written in
    /// order with the recorded commands.
    pub(crate) fn table(&self, bytes: &[u8], what: &str) -> Result<Arc<GpuBuf>> {
        let b = self.buffer(bytes.len() as u64, what)?;
        self.write(b.raw(), 0, bytes)?;
        Ok(b)
    }

    /// Copies `bytes` bytes of `src` into `dst` at `dst_off` (both multiples of 4).
    pub(crate) fn copy(
        &self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut batch = self.batch.lock().unwrap();
        self.encoder(&mut batch)
            .copy_buffer_to_buffer(src, src_off, dst, dst_off, bytes);
        drop(batch);
        self.check()
    }

    /// Uploads a host tensor (f32 as is; f16 as f16 or widened to f32, per [`Store`]; int64
    /// narrowed to int32 with a range check; bool and int32 as 32-bit words).
    pub fn upload_tensor(&self, t: &Tensor) -> Result<Tensor> {
        self.check()?;
        self.uploads.fetch_add(1, Ordering::Relaxed);
        let words: Vec<u32> = match t.dtype() {
            DataType::Float => t.to_f32_vec()?.into_iter().map(f32::to_bits).collect(),
            DataType::Float16 if self.half => {
                let h = t.as_slice::<half::f16>()?;
                h.chunks(2)
                    .map(|c| {
                        let lo = c[0].to_bits() as u32;
                        let hi = c.get(1).map_or(0, |v| v.to_bits() as u32);
                        lo | (hi << 16)
                    })
                    .collect()
            }
            DataType::Float16 => t.to_f32_vec()?.into_iter().map(f32::to_bits).collect(),
            DataType::Int32 | DataType::Int64 | DataType::Bool => t
                .to_i64_vec()?
                .into_iter()
                .map(|v| {
                    i32::try_from(v).map(|v| v as u32).map_err(|_| {
                        gpu_err(format!(
                            "value {v} does not fit the 32-bit words int64 tensors use on the device"
                        ))
                    })
                })
                .collect::<Result<_>>()?,
            DataType::Uint8 => {
                let b = t.as_slice::<u8>()?;
                b.chunks(4)
                    .map(|c| {
                        let mut w = [0u8; 4];
                        w[..c.len()].copy_from_slice(c);
                        u32::from_le_bytes(w)
                    })
                    .collect()
            }
            dt => return Err(gpu_err(format!("{dt} tensors cannot be moved to the device"))),
        };
        let (out, buf) = self.alloc(t.dtype(), t.shape())?;
        self.write(buf.raw(), 0, bytemuck::cast_slice(&words))?;
        Ok(out)
    }

    /// Reads a device tensor back (async: the browser resolves the map when the GPU is done).
    pub async fn download_tensor(&self, t: &Tensor) -> Result<Tensor> {
        self.check()?;
        self.downloads.fetch_add(1, Ordering::Relaxed);
        let b = dev_buf(t)?;
        let n = t.len();
        let half = t.dtype() == DataType::Float16 && self.half;
        let words = match t.dtype() {
            DataType::Uint8 => n.div_ceil(4),
            _ if half => n.div_ceil(2),
            _ => n,
        };
        let bytes = words as u64 * 4;
        self.downloaded_bytes.fetch_add(bytes, Ordering::Relaxed);
        let words: Vec<u32> = if n == 0 {
            Vec::new()
        } else {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("nxrt read-back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let src = b.raw();
            {
                let mut batch = self.batch.lock().unwrap();
                self.encoder(&mut batch)
                    .copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
                self.submit(&mut batch);
            }
            let (tx, rx) = futures_channel::oneshot::channel();
            staging.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            #[cfg(not(target_arch = "wasm32"))]
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| self.lost_or(gpu_err(format!("waiting for the device: {e}"))))?;
            rx.await
                .map_err(|_| self.lost_or(gpu_err("the read-back was cancelled")))?
                .map_err(|e| self.lost_or(gpu_err(format!("read-back failed: {e}"))))?;
            let v = {
                let view = staging
                    .get_mapped_range(..)
                    .map_err(|e| self.lost_or(gpu_err(format!("read-back failed: {e}"))))?;
                bytemuck::cast_slice::<u8, u32>(&view).to_vec()
            };
            staging.unmap();
            v
        };
        self.check()?;
        let shape = t.shape().to_vec();
        match t.dtype() {
            DataType::Float => {
                Tensor::from_vec(&shape, words.into_iter().map(f32::from_bits).collect())
            }
            DataType::Float16 if half => {
                let v: Vec<half::f16> = words
                    .iter()
                    .flat_map(|w| [*w as u16, (*w >> 16) as u16])
                    .take(n)
                    .map(half::f16::from_bits)
                    .collect();
                Tensor::from_vec(&shape, v)
            }
            DataType::Float16 => Tensor::from_vec(
                &shape,
                words
                    .into_iter()
                    .map(|w| half::f16::from_f32(f32::from_bits(w)))
                    .collect(),
            ),
            DataType::Int32 => {
                Tensor::from_vec(&shape, words.into_iter().map(|w| w as i32).collect())
            }
            DataType::Int64 => {
                Tensor::from_vec(&shape, words.into_iter().map(|w| w as i32 as i64).collect())
            }
            DataType::Bool => Tensor::from_vec(&shape, words.into_iter().map(|w| w != 0).collect()),
            DataType::Uint8 => Tensor::from_vec(
                &shape,
                words
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .take(n)
                    .collect::<Vec<u8>>(),
            ),
            dt => Err(gpu_err(format!("no read-back for {dt}"))),
        }
    }
}

/// The [`GpuBuf`] behind a device tensor.
pub(crate) fn dev_buf(t: &Tensor) -> Result<&GpuBuf> {
    t.device_buffer()
        .and_then(|b| b.as_any().downcast_ref::<GpuBuf>())
        .ok_or_else(|| {
            gpu_err(format!(
                "expected a WebGPU tensor, got one on {:?}",
                t.location()
            ))
        })
}

/// Whether `dt` is stored on the device in its own element layout (so a caller's buffer of
/// its elements can be read, or written, as it is).
fn native_layout(gpu: &Gpu, dt: DataType) -> bool {
    match dt {
        DataType::Float | DataType::Int32 | DataType::Uint8 => true,
        DataType::Float16 => gpu.half,
        _ => false,
    }
}

/// The browser's `GPUBuffer` and `GPUDevice` behind a device tensor (an output kept on the
/// GPU), its contents computed and every recorded command submitted first, so commands the
/// caller submits on that device's queue see the values. Only for types whose device layout is
/// their element layout (float32; float16 where the adapter has shader-f16; int32; uint8):
/// int64 and bool are 32-bit words on the device, and float16 without shader-f16 is float32.
/// The buffer may be larger than the tensor (sizes round up to 4 bytes; pooled buffers).
#[cfg(target_arch = "wasm32")]
pub fn webgpu_handles(t: &Tensor) -> Result<(wasm_bindgen::JsValue, wasm_bindgen::JsValue)> {
    let b = dev_buf(t)?;
    let gpu = b
        .gpu
        .upgrade()
        .ok_or_else(|| gpu_err("the tensor's WebGPU provider was released"))?;
    if !native_layout(&gpu, t.dtype()) {
        return Err(gpu_err(format!(
            "a {} tensor is not stored in its own element layout on the device \
             (32-bit words); read it with getData()",
            t.dtype()
        )));
    }
    let raw = b.raw();
    gpu.flush()?;
    let buf = raw
        .as_webgpu()
        .ok_or_else(|| gpu_err("the tensor is not on the browser's WebGPU backend"))?;
    let dev = gpu
        .device
        .as_webgpu()
        .ok_or_else(|| gpu_err("the device is not the browser's WebGPU backend"))?;
    Ok((buf.clone().into(), dev.clone().into()))
}

/// Input `k` as a device tensor and its buffer.
pub(crate) fn dev_in<'a>(
    inputs: &[Option<&'a Value>],
    k: usize,
) -> Result<(&'a Tensor, &'a GpuBuf)> {
    let t = nxrt_core::kernels::tensor_in(inputs, k)?;
    Ok((t, dev_buf(t)?))
}

/// The device tensor for `out` sharing `src`'s buffer (views: Reshape, Squeeze, ...).
pub(crate) fn view_of(src: &Tensor, shape: Vec<usize>) -> Result<Tensor> {
    let Location::Device(p) = src.location() else {
        return Err(gpu_err("a view of a host tensor"));
    };
    let b = src
        .device_buffer()
        .cloned()
        .ok_or_else(|| gpu_err("a view without a device buffer"))?;
    Ok(Tensor::from_device(src.dtype(), shape, p, b))
}

/// A WGSL module with the conventional bindings: `p` (params, binding 0) and `bufs` in
/// order from binding 1, each `(name, "read" | "read_write", element type)`, and a
/// one-dimensional entry point whose flat index is `i` (`body` returns early past the end).
pub(crate) fn shader_1d(bufs: &[(&str, &str, &str)], wg: u32, prelude: &str, body: &str) -> String {
    let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
    for (k, (name, access, ty)) in bufs.iter().enumerate() {
        s.push_str(&format!(
            "@group(0) @binding({}) var<storage, {access}> {name}: array<{ty}>;\n",
            k + 1
        ));
    }
    s.push_str(prelude);
    s.push_str(&format!(
        "\n@compute @workgroup_size({wg})\nfn main(@builtin(global_invocation_id) gid: vec3<u32>) {{\n  let i = gid.x + gid.y * p[0];\n{body}\n}}\n"
    ));
    s
}

/// Whether the JS global offers `navigator.gpu`.
#[cfg(target_arch = "wasm32")]
fn browser_has_webgpu() -> bool {
    let present = |v: &wasm_bindgen::JsValue| !v.is_undefined() && !v.is_null();
    js_sys::Reflect::get(&js_sys::global(), &"navigator".into())
        .ok()
        .filter(present)
        .and_then(|n| js_sys::Reflect::get(&n, &"gpu".into()).ok())
        .is_some_and(|g| present(&g))
}

/// The WebGPU execution provider.
pub struct WebGpuProvider {
    gpu: Arc<Gpu>,
    host: ReferenceCpu,
}

impl WebGpuProvider {
    /// Opens the system's preferred adapter (async: the browser's `requestAdapter`). `id` is
    /// the provider's index in the session's provider list (tensors carry it).
    pub async fn new(id: u16) -> Result<WebGpuProvider> {
        Self::with_f16(id, true).await
    }

    /// [`WebGpuProvider::new`], with f16 storage for float16 tensors only when `allow_f16` (and
    /// the adapter has `shader-f16`); otherwise they are stored as f32 words.
    pub async fn with_f16(id: u16, allow_f16: bool) -> Result<WebGpuProvider> {
        // wgpu panics when the JS global has no navigator.gpu (Node, an old browser): an error
        #[cfg(target_arch = "wasm32")]
        if !browser_has_webgpu() {
            return Err(gpu_err(
                "no WebGPU adapter: this JS environment has no navigator.gpu",
            ));
        }
        // WGPU_BACKEND and friends choose the backend natively when set
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| gpu_err(format!("no WebGPU adapter: {e}")))?;
        let info = adapter.get_info();
        let alimits = adapter.limits();
        let shader_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        // ask for what the adapter has: its real limits, not the portable defaults
        let mut limits = wgpu::Limits::downlevel_defaults();
        limits.max_storage_buffer_binding_size = alimits.max_storage_buffer_binding_size;
        limits.max_buffer_size = alimits.max_buffer_size;
        limits.max_compute_workgroups_per_dimension = alimits.max_compute_workgroups_per_dimension;
        limits.max_storage_buffers_per_shader_stage = alimits.max_storage_buffers_per_shader_stage;
        limits.max_compute_invocations_per_workgroup =
            alimits.max_compute_invocations_per_workgroup;
        limits.max_compute_workgroup_size_x = alimits.max_compute_workgroup_size_x;
        limits.max_compute_workgroup_size_y = alimits.max_compute_workgroup_size_y;
        limits.max_compute_workgroup_storage_size = alimits.max_compute_workgroup_storage_size;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("nxrt"),
                required_features: if shader_f16 && allow_f16 {
                    wgpu::Features::SHADER_F16
                } else {
                    wgpu::Features::empty()
                },
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| gpu_err(format!("requesting a device: {e}")))?;
        let error: Arc<Mutex<Option<String>>> = Arc::default();
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        {
            let error = error.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                let mut slot = error.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(e.to_string());
                }
            }));
            let lost = lost.clone();
            device.set_device_lost_callback(move |reason, msg| {
                *lost.lock().unwrap() = Some(format!("{reason:?}: {msg}"));
            });
        }
        let limits = device.limits();
        let summary = AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            shader_f16,
            max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
            max_buffer_size: limits.max_buffer_size,
            max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
        };
        let arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("nxrt arena"),
            size: ARENA_BYTES,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let batch = Mutex::new(Batch {
            enc: None,
            dispatches: 0,
            staged: Vec::new(),
            arena,
        });
        let gpu = Arc::new_cyclic(|me| Gpu {
            half: shader_f16 && allow_f16,
            batch,
            device,
            queue,
            limits,
            summary,
            id,
            pool: Mutex::default(),
            pipelines: Mutex::default(),
            error,
            lost,
            live_bytes: AtomicU64::new(0),
            pooled_bytes: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
            uploads: AtomicU64::new(0),
            downloads: AtomicU64::new(0),
            downloaded_bytes: AtomicU64::new(0),
            submits: AtomicU64::new(0),
            me: me.clone(),
            account: std::sync::OnceLock::new(),
        });
        Ok(WebGpuProvider {
            gpu,
            host: ReferenceCpu,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// A device tensor of `dt` and `shape` over the caller's own `buffer` (made on this
    /// provider's device, `gpu().device()`): fed to a run it is read where it lies, with no
    /// copy. The buffer needs `STORAGE | COPY_SRC` usage and room for the tensor (its size
    /// rounded up to 4); only types stored in their own layout (float32, int32, uint8, float16
    /// where the device stores it as f16). It is never pooled or destroyed by nxrt and is not
    /// charged to any budget (its memory is the caller's).
    pub fn tensor_from_buffer(
        &self,
        buffer: wgpu::Buffer,
        dt: DataType,
        shape: &[usize],
    ) -> Result<Tensor> {
        let gpu = &self.gpu;
        if !native_layout(gpu, dt) {
            return Err(gpu_err(format!(
                "a {dt} tensor is not stored in its own element layout on the device;                  upload it from the host instead"
            )));
        }
        let (bytes, size) = gpu.tensor_bytes(dt, shape)?;
        let need = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        if !buffer.usage().contains(need) {
            return Err(gpu_err(format!(
                "the buffer's usage {:?} lacks STORAGE | COPY_SRC",
                buffer.usage()
            )));
        }
        if buffer.size() < size {
            return Err(gpu_err(format!(
                "the buffer has {} bytes; a {dt} tensor of shape {shape:?} needs {size}",
                buffer.size()
            )));
        }
        let b = Arc::new(GpuBuf {
            size: buffer.size(),
            buf: std::sync::OnceLock::from(buffer),
            bytes,
            gpu: gpu.me.clone(),
            _lease: Lease::take(None, Tier::Device(gpu.id), Holder::Other, 0, &|| {
                "a caller's buffer".into()
            })?,
            pending: Mutex::new(None),
            external: true,
            producer: Mutex::new(None),
        });
        Ok(Tensor::from_device(dt, shape.to_vec(), gpu.id, b))
    }

    /// Copies device tensor `t` (one of this provider's: an output kept on the device) into
    /// the caller's `dst` on the device (recorded with the provider's commands, in order with
    /// them; nothing goes through the host). `dst` needs `COPY_DST` usage and room for `t`
    /// (its size rounded up to 4); same types as [`WebGpuProvider::tensor_from_buffer`].
    pub fn copy_to_buffer(&self, t: &Tensor, dst: &wgpu::Buffer) -> Result<()> {
        let gpu = &self.gpu;
        let b = dev_buf(t)?;
        if !native_layout(gpu, t.dtype()) {
            return Err(gpu_err(format!(
                "a {} tensor is not stored in its own element layout on the device",
                t.dtype()
            )));
        }
        let len = b.bytes.max(4).div_ceil(4) * 4;
        if !dst.usage().contains(wgpu::BufferUsages::COPY_DST) || dst.size() < len {
            return Err(gpu_err(format!(
                "the destination ({} bytes, usage {:?}) needs COPY_DST and {len} bytes",
                dst.size(),
                dst.usage()
            )));
        }
        let src = b.raw();
        gpu.copy(src, 0, dst, 0, len)
    }

    /// Simulates a lost device (tests): every later call on this provider fails.
    pub fn lose_device_for_test(&self) {
        self.gpu.device.destroy();
    }

    /// A tensor like `t` whose `axis` has `out` entries: entries `start..start + count` of
    /// `t`'s copied to the front, the rest zero; buffer copies on the device (one per index
    /// of the axes before `axis`). `None` when the copies would not move whole words, or `t`
    /// is not a float tensor of this provider.
    fn copy_axis(
        &self,
        t: &Tensor,
        axis: usize,
        start: usize,
        count: usize,
        out: usize,
    ) -> Option<Result<Tensor>> {
        let shape = t.shape();
        if axis >= shape.len()
            || start.checked_add(count)? > shape[axis]
            || count > out
            || dev_buf(t).is_err()
        {
            return None;
        }
        let eb = match t.dtype() {
            DataType::Float | DataType::Float16 => self.gpu.store(t.dtype()).ok()?.bytes(),
            _ => return None,
        };
        let inner: u64 = shape[axis + 1..].iter().product::<usize>() as u64;
        let outer: usize = shape[..axis].iter().product();
        let (chunk, skip, src_stride, dst_stride) = (
            count as u64 * inner * eb,
            start as u64 * inner * eb,
            shape[axis] as u64 * inner * eb,
            out as u64 * inner * eb,
        );
        // buffer copies move whole words
        if [chunk, skip, src_stride, dst_stride]
            .iter()
            .any(|b| b % 4 != 0)
        {
            return None;
        }
        let run = || -> Result<Tensor> {
            let mut to = shape.to_vec();
            to[axis] = out;
            let y = if count < out {
                reduce::fill(&self.gpu, t.dtype(), &to, 0.0)?
            } else {
                self.gpu.alloc(t.dtype(), &to)?.0
            };
            let (src, dst) = (dev_buf(t)?.raw(), dev_buf(&y)?.raw());
            if chunk > 0 {
                for o in 0..outer as u64 {
                    self.gpu
                        .copy(src, o * src_stride + skip, dst, o * dst_stride, chunk)?;
                }
            }
            Ok(y)
        };
        Some(run())
    }

    fn find(&self, node: &Node) -> Option<&'static OpDef> {
        match node.domain.as_str() {
            "" | "ai.onnx" => all_ops().find(|d| d.op == node.op_type && node.opset >= d.since),
            "com.microsoft" => norm::MS_OPS
                .iter()
                .chain(gqa::MS_OPS)
                .chain(ew::MS_OPS)
                .chain(rotary::MS_OPS)
                .chain(nbits::MS_OPS)
                .find(|d| d.op == node.op_type),
            _ => None,
        }
    }
}

struct GpuKernel {
    gpu: Arc<Gpu>,
    exec: Exec,
}

impl Kernel for GpuKernel {
    fn compute(&self, _cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        self.gpu.check()?;
        (self.exec)(&self.gpu, inputs)
    }
}

impl ExecutionProvider for WebGpuProvider {
    fn name(&self) -> &str {
        "webgpu"
    }
    fn location(&self) -> Location {
        Location::Device(self.gpu.id)
    }
    fn supports(&self, node: &Node, input_types: &[Option<DataType>]) -> Support {
        let Some(d) = self.find(node) else {
            return Support::No(format!("no WebGPU kernel for {}", node.op_type));
        };
        match input_types.get(d.type_input).copied().flatten() {
            Some(DataType::Float) => {}
            Some(DataType::Float16) if d.half => {}
            Some(dt) => {
                let runs = if d.half { "f32 and f16" } else { "f32" };
                return Support::No(format!("the WebGPU kernel runs {runs}, not {dt}"));
            }
            None => return Support::No("input type unknown at load".into()),
        }
        match (d.build)(node) {
            Ok(_) => Support::Yes,
            Err(e) => Support::No(e.to_string()),
        }
    }
    fn input_placement(&self, node: &Node, k: usize) -> InputPlacement {
        match self.find(node) {
            Some(d) if d.host.contains(&k) => InputPlacement::Host,
            _ => InputPlacement::Provider,
        }
    }
    fn create_kernel(&self, node: &Node, _types: &[Option<DataType>]) -> Result<Box<dyn Kernel>> {
        let d = self
            .find(node)
            .ok_or_else(|| gpu_err(format!("no WebGPU kernel for {}", node.op_type)))?;
        if node.domain == "com.microsoft" && node.op_type == "GroupQueryAttention" {
            // a kernel of its own: it can write the present into the past's buffer
            return gqa::kernel(self.gpu.clone(), node);
        }
        Ok(Box::new(GpuKernel {
            gpu: self.gpu.clone(),
            exec: (d.build)(node)?,
        }))
    }
    fn cpu_backend(&self) -> &dyn CpuBackend {
        &self.host
    }
    fn release_cached(&self) {
        self.gpu.trim();
    }
    fn bind_account(&self, account: &Arc<Account>) {
        let _ = self.gpu.account.set(account.clone());
    }
    fn alloc_device(&self, dt: DataType, shape: &[usize]) -> Option<Result<Tensor>> {
        Some(self.gpu.alloc(dt, shape).map(|(t, _)| t))
    }
    fn mechanism(&self) -> Option<Arc<dyn nxrt_core::mechanism::Mechanism>> {
        Some(self.gpu.clone())
    }
    fn describe(&self) -> String {
        let a = &self.gpu.summary;
        let f16 = match (a.shader_f16, self.gpu.half) {
            (true, true) => "shader-f16 (float16 stored as f16)",
            (true, false) => "shader-f16 unused (float16 stored as f32)",
            (false, _) => "no shader-f16 (float16 stored as f32)",
        };
        format!(
            "{} ({}, {}); {f16}; maxStorageBufferBindingSize {}, maxBufferSize {}, \
             maxComputeWorkgroupsPerDimension {}, maxStorageBuffersPerShaderStage {}",
            a.name,
            a.backend,
            a.device_type,
            a.max_storage_buffer_binding_size,
            a.max_buffer_size,
            a.max_compute_workgroups_per_dimension,
            a.max_storage_buffers_per_shader_stage
        )
    }
    fn resize_axis(
        &self,
        t: &Tensor,
        axis: usize,
        keep: usize,
        len: usize,
    ) -> Option<Result<Tensor>> {
        self.copy_axis(t, axis, 0, keep, len)
    }
    fn slice_axis(
        &self,
        t: &Tensor,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Option<Result<Tensor>> {
        self.copy_axis(t, axis, start, len, len)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.gpu.stats();
        vec![
            ("dispatches", s.dispatches),
            ("uploads", s.uploads),
            ("downloads", s.downloads),
            ("downloaded_bytes", s.downloaded_bytes),
            ("submits", s.submits),
            ("device_bytes", s.live_bytes),
            ("pooled_bytes", s.pooled_bytes),
        ]
    }
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        self.gpu.upload_tensor(t)
    }
    fn download<'a>(&'a self, t: &'a Tensor) -> BoxFuture<'a, Result<Tensor>> {
        Box::pin(self.gpu.download_tensor(t))
    }
}

/// Host tensor input `k` as i64 values (shape operands), `None` when omitted.
pub(crate) fn host_i64s(inputs: &[Option<&Value>], k: usize) -> Result<Option<Vec<i64>>> {
    match nxrt_core::kernels::opt_tensor_in(inputs, k)? {
        Some(t) if t.location() == Location::Host => Ok(Some(t.to_i64_vec()?)),
        Some(_) => Err(gpu_err(format!("input {k} should be on the host"))),
        None => Ok(None),
    }
}

/// Host tensor input `k` as one f32 (Clip's bounds), `None` when omitted.
pub(crate) fn host_f32(inputs: &[Option<&Value>], k: usize) -> Result<Option<f32>> {
    match nxrt_core::kernels::opt_tensor_in(inputs, k)? {
        Some(t) if t.location() == Location::Host => Ok(t.to_f32_vec()?.first().copied()),
        Some(_) => Err(gpu_err(format!("input {k} should be on the host"))),
        None => Ok(None),
    }
}

/// One output.
pub(crate) fn out1(t: Tensor) -> Result<Vec<Value>> {
    Ok(vec![Value::Tensor(t)])
}
