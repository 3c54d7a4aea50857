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

pub use nxrt_core::session::{IoInfo, PartitionReport};
pub use nxrt_core::{npy, DataType, Dim, Error, OptLevel, Result, Tensor, TypeInfo, Value};

pub mod cpu;
pub mod embedded;

use nxrt_core::kernels::CpuProvider;
use nxrt_core::loader::{self, ExternalDataSource};
use nxrt_core::provider::ExecutionProvider;
use nxrt_core::session::SessionOptions;

/// Provider names this build knows.
pub const PROVIDERS: &[&str] = &["cpu"];

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

/// Configures and loads a [`Session`].
#[derive(Clone, Debug)]
pub struct SessionBuilder {
    threads: usize,
    providers: Vec<String>,
    optimization: OptLevel,
}

impl Default for SessionBuilder {
    fn default() -> Self {
        SessionBuilder {
            threads: 1,
            providers: vec!["cpu".into()],
            optimization: OptLevel::Basic,
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

    /// Loads a model file; external data is read from the model's folder only.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<Session> {
        let path = path.as_ref();
        let t0 = Instant::now();
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let ext = FolderData::new(dir)?;
        self.finish(&bytes, &ext, t0)
    }

    /// Loads a model from bytes (external data is an error).
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<Session> {
        self.finish(bytes, &loader::NoExternalData, Instant::now())
    }

    fn finish(&self, bytes: &[u8], ext: &dyn ExternalDataSource, t0: Instant) -> Result<Session> {
        let (providers, threads) = self.provider_list()?;
        let model = loader::load_model(bytes, ext)?;
        let opts = SessionOptions {
            optimization: self.optimization,
        };
        let inner = nxrt_core::Session::new(model, providers, &opts)?;
        Ok(Session {
            inner,
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
        nxrt_core::Session::analyze(
            model,
            providers,
            &SessionOptions {
                optimization: self.optimization,
            },
        )
    }
}

/// A loaded model, ready to run.
pub struct Session {
    inner: nxrt_core::Session,
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
