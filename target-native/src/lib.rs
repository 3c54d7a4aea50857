//! nxrt: run ONNX models natively. A thin, std-aware layer over `nxrt-core`: file loading with
//! confined external data, a threaded SIMD CPU backend, and a small synchronous API.
//!
//! ```no_run
//! use nxrt::{Session, Tensor};
//! let session = Session::builder().threads(2).load("model.onnx")?;
//! for i in session.inputs() {
//!     println!("{}: {}", i.name, i.ty);
//! }
//! let x = Tensor::from_vec(&[1, 3], vec![1.0f32, 2.0, 3.0])?;
//! let outputs = session.run([("x", x)])?;
//! let y = outputs["y"].as_tensor()?.as_slice::<f32>()?;
//! # Ok::<(), nxrt::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use alloc::LargePages;
pub use binding::{BindingStats, IoBinding};
pub use nxrt_core::governor;
pub use nxrt_core::mechanism;
pub use nxrt_core::planner::MemoryPlanStats;
pub use nxrt_core::profile::{
    activation_memory_plan_enabled, disable_activation_memory_plan_for_process,
    disable_exec_phase_profile_for_process, enable_activation_memory_plan_for_process,
    enable_exec_phase_profile_for_process, exec_phase_profile_enabled, GateGuard, Phase,
    PhaseProfile,
};
pub use nxrt_core::session::{ExecMode, IoInfo, PartitionReport};
pub use nxrt_core::weight_cache;
pub use nxrt_core::weight_cache::{BlockWeights, WeightCacheStats};
pub use nxrt_core::{npy, DataType, Dim, Error, OptLevel, Result, Tensor, TypeInfo, Value};

pub mod alloc;
pub mod binding;
/// Chat templates (shared with the browser's tokenizer module).
#[cfg(feature = "tokenizers")]
pub use nxrt_wasm_tokenizer::chat;
pub mod cpu;
pub mod embedded;
pub mod genai;
#[cfg(feature = "guidance")]
pub mod guidance;
pub mod pool;
#[cfg(feature = "tokenizers")]
pub mod tokenizer;

use nxrt_core::kernels::CpuProvider;
use nxrt_core::loader::{self, ExternalDataSource};
use nxrt_core::provider::ExecutionProvider;
use nxrt_core::session::SessionOptions;

/// Provider names this build knows.
#[cfg(feature = "webgpu")]
pub const PROVIDERS: &[&str] = &["cpu", "webgpu"];
#[cfg(not(feature = "webgpu"))]
pub const PROVIDERS: &[&str] = &["cpu"];

/// Nanoseconds since the first call (the clock the phase profiler reads).
pub fn now_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Reads the profiling environment once per process: `NXRT_EXEC_PHASE_PROFILE=1` turns on the
/// phase profiler and the planner's diagnostics, `NXRT_ACTIVATION_MEMORY_PLAN=1` the planner's
/// diagnostics only. Recorded as the environment path, apart from the API path. Also reads
/// `NXRT_SIMD` (`avx512f`, `avx2`, `neon`, `portable`): the most capable instruction set the
/// SIMD layer may pick, for base-vs-change measurements on one machine.
pub fn read_profiling_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(isa) = std::env::var("NXRT_SIMD")
            .ok()
            .and_then(|v| nxrt_core::simd::Isa::parse(&v))
        {
            nxrt_core::simd::set_max_isa(isa);
        }
        let on = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0");
        nxrt_core::profile::apply_environment(
            on("NXRT_EXEC_PHASE_PROFILE"),
            on("NXRT_ACTIVATION_MEMORY_PLAN"),
        );
    });
}

/// The process's peak resident memory in bytes (`None` where the OS does not say).
pub fn peak_rss_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let s = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
    #[cfg(all(unix, not(target_os = "linux")))]
    {
        // SAFETY: getrusage fills the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return None;
        }
        // bytes on macOS
        Some(ru.ru_maxrss as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Reads external-data files, confined to the model's folder (symlinks resolved).
pub struct FolderData {
    root: PathBuf,
}

impl FolderData {
    pub fn new(dir: &Path) -> Result<FolderData> {
        let root = dir
            .canonicalize()
            .map_err(|e| Error::Io(format!("model folder {}: {e}", dir.display())))?;
        Ok(FolderData { root })
    }
}

impl ExternalDataSource for FolderData {
    fn read(&self, location: &str, offset: u64, length: Option<u64>) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        loader::check_external_location(location)?;
        let path = self.root.join(location);
        let real = path.canonicalize().map_err(|e| {
            Error::ExternalData(format!("cannot open '{location}' next to the model: {e}"))
        })?;
        if !real.starts_with(&self.root) {
            return Err(Error::ExternalData(format!(
                "'{location}' resolves outside the model's folder"
            )));
        }
        let mut f = std::fs::File::open(&real)
            .map_err(|e| Error::ExternalData(format!("cannot open '{location}': {e}")))?;
        let size = f
            .metadata()
            .map_err(|e| Error::ExternalData(format!("'{location}': {e}")))?
            .len();
        let len = length.unwrap_or(size.saturating_sub(offset));
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::ExternalData(format!(
                "'{location}' has {size} bytes; the model asks for {len} at offset {offset}"
            )));
        }
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| Error::ExternalData(format!("'{location}': {e}")))?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact(&mut buf)
            .map_err(|e| Error::ExternalData(format!("'{location}': {e}")))?;
        Ok(buf)
    }
}

/// A model file mapped into memory: decoded without copying its weights, and each
/// initializer's pages handed back to the OS once copied into its tensor, so loading holds the
/// weights once (plus the largest single tensor), not the file and the weights side by side.
struct MappedModel<'a> {
    folder: &'a FolderData,
    /// Address range of the mapping.
    start: usize,
    end: usize,
}

impl ExternalDataSource for MappedModel<'_> {
    fn read(&self, location: &str, offset: u64, length: Option<u64>) -> Result<Vec<u8>> {
        self.folder.read(location, offset, length)
    }

    fn release(&self, bytes: &[u8]) {
        #[cfg(unix)]
        {
            let page = 4096usize;
            let (a, b) = (
                bytes.as_ptr() as usize,
                bytes.as_ptr() as usize + bytes.len(),
            );
            if a < self.start || b > self.end {
                return;
            }
            // whole pages inside the range only: a neighbour's bytes stay resident
            let lo = a.div_ceil(page) * page;
            let hi = b / page * page;
            if hi > lo {
                // SAFETY: [lo, hi) lies inside our private read-only file mapping; dropping its
                // pages loses nothing (they read back from the file if touched again).
                unsafe {
                    libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED);
                }
            }
        }
        #[cfg(not(unix))]
        let _ = bytes;
    }
}

/// Tunes glibc's allocator, once per process, to keep freed memory for reuse: by default
/// glibc maps every block above 128 KiB afresh and returns freed memory above 128 KiB at the
/// top of its heap to the kernel, so the temporaries of a kernel that runs every few
/// microseconds cost system calls and page faults on every run (asr_nemo128: 1.13 -> 0.74 ms).
/// With this, blocks up to 32 MiB come from the heap and up to 256 MiB of freed memory stays
/// in it, which is what an arena allocator (ONNX Runtime's, for one) does. The session's own
/// activations already live in its planned arena. Elsewhere than glibc this does nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| unsafe {
            // SAFETY: mallopt only sets allocator parameters; both values are in range
            // (32 MiB is glibc's largest mmap threshold on 64-bit targets).
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        });
    }
}

/// Configures and loads a [`Session`].
#[derive(Clone, Debug)]
pub struct SessionBuilder {
    threads: usize,
    providers: Vec<String>,
    optimization: OptLevel,
    mode: ExecMode,
    phase_profile: bool,
    keep_freed_memory: bool,
    prepack_weights: bool,
    memory_limit: Option<usize>,
    pool: Option<Arc<governor::MemoryPool>>,
    keep_arena_limit: Option<usize>,
    host_mechanism: Option<Arc<dyn mechanism::HostMechanism>>,
    weight_cache: weight_cache::WeightCacheOptions,
}

impl Default for SessionBuilder {
    fn default() -> Self {
        SessionBuilder {
            threads: 1,
            providers: vec!["cpu".into()],
            optimization: OptLevel::All,
            mode: ExecMode::Planned,
            phase_profile: false,
            keep_freed_memory: true,
            prepack_weights: true,
            memory_limit: None,
            pool: None,
            keep_arena_limit: None,
            host_mechanism: None,
            weight_cache: Default::default(),
        }
    }
}

impl SessionBuilder {
    /// Intra-op threads for the CPU provider (default 1; 0 = all cores).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }
    /// Providers in preference order (`cpu` is always added last as the fallback).
    pub fn providers<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.providers = names.iter().map(|s| s.as_ref().to_string()).collect();
        self
    }
    pub fn optimization(mut self, level: OptLevel) -> Self {
        self.optimization = level;
        self
    }
    /// Eager or planned execution (default planned).
    pub fn mode(mut self, mode: ExecMode) -> Self {
        self.mode = mode;
        self
    }
    /// Phase-profile this session (the profiler only; the planner's diagnostics keep their
    /// own gate).
    pub fn phase_profile(mut self, on: bool) -> Self {
        self.phase_profile = on;
        self
    }

    /// Whether loading tunes the C allocator to keep freed memory for reuse (default on; see
    /// [`keep_freed_memory`]). Off leaves the process's allocator as it is.
    pub fn keep_freed_memory(mut self, on: bool) -> Self {
        self.keep_freed_memory = on;
        self
    }

    /// Whether kernels pack constant weights (Conv's W, MatMul's and Gemm's constant B) into
    /// the SGEMM's layout once at load (default on; `Session::partition().prepacked_bytes`
    /// says how much memory that holds). Off saves that memory and runs those ops slower.
    pub fn prepack_weights(mut self, on: bool) -> Self {
        self.prepack_weights = on;
        self
    }

    /// This session's host memory budget in bytes (default none: only the process's, which
    /// [`governor::set_process_limit`] sets). Its weights, activation arenas and heap outputs
    /// are leased from it; over it, loading or a run fails with `Error::OutOfMemory` and the
    /// session stays usable. `Session::memory_snapshot` reports what it holds.
    pub fn memory_limit(mut self, bytes: Option<usize>) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Loads the session into a memory pool shared with other sessions (opt-in, like ONNX
    /// Runtime's `session.use_env_allocators`): the pool's limit binds them together, and an
    /// initializer byte for byte the same as one a live session of the pool holds is held once
    /// (the same model loaded twice holds its weights once). See [`governor::MemoryPool`].
    pub fn pool(mut self, pool: &Arc<governor::MemoryPool>) -> Self {
        self.pool = Some(pool.clone());
        self
    }

    /// Arena shrinking (ONNX Runtime's `memory.enable_memory_arena_shrinkage`, by size): a
    /// memory plan's activation arena larger than `bytes` is given back at the end of each run
    /// that used it, so a run with unusually large inputs does not leave its memory held
    /// (default `None`: plans keep their arenas until `Session::release_cached`).
    pub fn keep_arena_limit(mut self, bytes: Option<usize>) -> Self {
        self.keep_arena_limit = bytes;
        self
    }

    /// Where activation arenas come from (default: the system heap). A pool's arena cache
    /// (`MemoryPool::arena_cache`) shares them among its sessions: an arena one session frees
    /// is kept for the next arena of its size class any of them needs. See [`mechanism`];
    /// `Session::select_host_mechanism` changes it later.
    pub fn host_mechanism(mut self, m: Arc<dyn mechanism::HostMechanism>) -> Self {
        self.host_mechanism = Some(m);
        self
    }

    /// How block-quantized weights (MXFP4, blocked int4/int8 DequantizeLinear before a MatMul,
    /// MatMulNBits with float activations) are multiplied: `Auto` (default) reads their codes
    /// for up to a few rows and keeps a dense copy for more; `Codes` never makes one; `Cached`
    /// always uses one where the cache can hold it; `Expanded` makes dense float weights at
    /// load. See [`weight_cache`].
    pub fn block_weights(mut self, policy: BlockWeights) -> Self {
        self.weight_cache.policy = policy;
        self
    }

    /// Bytes the session's dense weight copies may hold together (default 256 MiB; `None`:
    /// only the session's memory budget bounds them). They are leased as `dequantized` from
    /// the session's account, and given back by `release_cached` or whenever the account
    /// (or its pool's) refuses a lease; a weight the cache cannot hold is computed from its
    /// codes.
    pub fn weight_cache_limit(mut self, bytes: Option<usize>) -> Self {
        self.weight_cache.limit = bytes;
        self
    }

    fn options(&self) -> SessionOptions {
        SessionOptions {
            optimization: self.optimization,
            mode: self.mode,
            phase_profile: self.phase_profile,
            clock: Some(now_ns),
            disable_prepacking: !self.prepack_weights,
            memory_limit: self.memory_limit,
            pool: self.pool.clone(),
            keep_arena_limit: self.keep_arena_limit,
            host_mechanism: self.host_mechanism.clone(),
            weight_cache: self.weight_cache,
        }
    }

    fn provider_list(&self) -> Result<(Vec<Arc<dyn ExecutionProvider>>, usize)> {
        let threads = if self.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.threads
        };
        let mut out: Vec<Arc<dyn ExecutionProvider>> = Vec::new();
        for p in &self.providers {
            match p.as_str() {
                "cpu" => {}
                #[cfg(feature = "webgpu")]
                "webgpu" => {
                    let id = out.len() as u16;
                    let gpu = pollster::block_on(nxrt_wasm::webgpu::WebGpuProvider::new(id))?;
                    out.push(Arc::new(gpu));
                }
                other => {
                    return Err(Error::Provider(format!(
                        "provider '{other}' is not available in this build (available: {})",
                        PROVIDERS.join(", ")
                    )))
                }
            }
        }
        out.push(Arc::new(CpuProvider::new(Arc::new(cpu::NativeCpu::new(
            threads,
        )?))));
        Ok((out, threads))
    }

    /// Loads a model file; external data is read from the model's folder only. The file is
    /// mapped, not read: weights are copied out of it once and its pages released as they are.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<Session> {
        let path = path.as_ref();
        let t0 = Instant::now();
        let t0_ns = now_ns();
        let file = std::fs::File::open(path)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let folder = FolderData::new(dir)?;
        let len = file
            .metadata()
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?
            .len();
        if len == 0 {
            return self.finish(&[], &folder, t0, t0_ns);
        }
        // SAFETY: the mapping is private and read-only; a file truncated under a running load
        // is the caller's race (as with any mapped file).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::Io(format!("cannot map {}: {e}", path.display())))?;
        let (start, end) = (map.as_ptr() as usize, map.as_ptr() as usize + map.len());
        let src = MappedModel {
            folder: &folder,
            start,
            end,
        };
        let bytes = bytes::Bytes::from_owner(map);
        self.finish_with(t0, t0_ns, |ext| loader::load_model_shared(bytes, ext), &src)
    }

    /// Loads a model from bytes (external data is an error).
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<Session> {
        self.finish(bytes, &loader::NoExternalData, Instant::now(), now_ns())
    }

    fn finish(
        &self,
        bytes: &[u8],
        ext: &dyn ExternalDataSource,
        t0: Instant,
        t0_ns: u64,
    ) -> Result<Session> {
        self.finish_with(t0, t0_ns, |ext| loader::load_model(bytes, ext), ext)
    }

    fn finish_with(
        &self,
        t0: Instant,
        t0_ns: u64,
        decode: impl FnOnce(&dyn ExternalDataSource) -> Result<nxrt_core::loader::Model>,
        ext: &dyn ExternalDataSource,
    ) -> Result<Session> {
        read_profiling_env();
        if self.keep_freed_memory {
            keep_freed_memory();
        }
        let (providers, threads) = self.provider_list()?;
        let model = decode(ext)?;
        let t_loaded = now_ns();
        let opts = self.options();
        let inner = nxrt_core::Session::new(model, providers, &opts)?;
        inner.record_phase(Phase::Load, t0_ns, t_loaded.saturating_sub(t0_ns));
        Ok(Session {
            inner: Arc::new(inner),
            load_time: t0.elapsed(),
            threads,
        })
    }

    /// Partitions a model without failing on unsupported nodes (what `nxrt inspect` shows).
    pub fn analyze(&self, path: impl AsRef<Path>) -> Result<PartitionReport> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let ext = FolderData::new(dir)?;
        let (providers, _) = self.provider_list()?;
        let model = loader::load_model(&bytes, &ext)?;
        nxrt_core::Session::analyze(model, providers, &self.options())
    }
}

/// A loaded model, ready to run.
pub struct Session {
    inner: Arc<nxrt_core::Session>,
    load_time: Duration,
    threads: usize,
}

/// Named outputs in graph order.
#[derive(Clone, Debug)]
pub struct Outputs(pub Vec<(String, Value)>);

impl Outputs {
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v))
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Index<&str> for Outputs {
    type Output = Value;
    fn index(&self, name: &str) -> &Value {
        self.get(name)
            .unwrap_or_else(|| panic!("no output named '{name}'"))
    }
}

impl Session {
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }
    /// Loads with default options (1 thread, CPU, basic optimisation).
    pub fn load(path: impl AsRef<Path>) -> Result<Session> {
        SessionBuilder::default().load(path)
    }
    pub fn inputs(&self) -> Vec<IoInfo> {
        self.inner.inputs()
    }
    pub fn outputs(&self) -> Vec<IoInfo> {
        self.inner.outputs()
    }
    pub fn load_time(&self) -> Duration {
        self.load_time
    }
    pub fn threads(&self) -> usize {
        self.threads
    }
    pub fn partition(&self) -> &PartitionReport {
        self.inner.partition()
    }
    pub fn core(&self) -> &nxrt_core::Session {
        &self.inner
    }

    /// The core session, shared (what a [`genai::Generator`] keeps).
    pub fn core_shared(&self) -> Arc<nxrt_core::Session> {
        self.inner.clone()
    }
    /// The phase profile so far (`None` when profiling was never on for this session).
    pub fn phase_profile(&self) -> Option<PhaseProfile> {
        self.inner.phase_profile()
    }
    pub fn reset_phase_profile(&self) {
        self.inner.reset_phase_profile()
    }
    /// Figures of the latest activation memory plan (see [`nxrt_core::Session`]).
    pub fn activation_memory_plan_stats(&self) -> Option<MemoryPlanStats> {
        self.inner.activation_memory_plan_stats()
    }
    /// Memory plans built so far (planned-mode shape misses plus eager diagnostic re-plans).
    pub fn memory_plans_built(&self) -> usize {
        self.inner.memory_plans_built()
    }
    /// What this session holds by tier and holder (weights, arenas, outputs), with peaks and
    /// its limit (see [`governor`]).
    pub fn memory_snapshot(&self) -> governor::MemorySnapshot {
        self.inner.memory_snapshot()
    }
    /// Selects the host mechanism later arenas come from; arenas already held go back to the
    /// one that made them (see [`mechanism`]). A dead one is refused, and one that dies while
    /// selected is replaced by the one selected before it.
    pub fn select_host_mechanism(&self, m: Arc<dyn mechanism::HostMechanism>) -> Result<()> {
        self.inner.select_host_mechanism(m)
    }
    /// The mechanism each tier allocates from now (host arenas, each device provider's
    /// buffer pool), what it keeps, and the dead ones dropped.
    pub fn mechanisms(&self) -> Vec<mechanism::MechanismReport> {
        self.inner.mechanisms()
    }
    /// The dense weight cache's figures: its policy and limit, what it holds, its fills, hits
    /// and declines (see [`weight_cache`]).
    pub fn weight_cache(&self) -> WeightCacheStats {
        self.inner.weight_cache()
    }
    /// Frees what the session caches between runs (its dense weight copies, its memory plans'
    /// arenas, providers' pooled buffers) now; the next run allocates again.
    pub fn release_cached(&self) {
        self.inner.release_cached()
    }
    pub fn mode(&self) -> ExecMode {
        self.inner.mode()
    }

    /// Runs with named inputs (tensors, or any [`Value`]).
    pub fn run<N, V, I>(&self, feeds: I) -> Result<Outputs>
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<String>,
        V: Into<Value>,
    {
        pollster::block_on(self.run_async(feeds))
    }

    /// The async run path (the same one the browser target uses).
    pub async fn run_async<N, V, I>(&self, feeds: I) -> Result<Outputs>
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<String>,
        V: Into<Value>,
    {
        let feeds: Vec<(String, Value)> = feeds
            .into_iter()
            .map(|(n, v)| (n.into(), v.into()))
            .collect();
        Ok(Outputs(self.inner.run_async(feeds).await?))
    }
}
