//! Shared helpers of the cross-crate tests: value comparison with tolerances, the cache paths
//! of the fetched corpora.

use std::path::PathBuf;

/// `$NXRT_CACHE`, default `~/.cache/nxrt`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("NXRT_CACHE") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".cache/nxrt")
        }
    }
}

/// The `nxrt` binary a CLI test runs: `$NXRT_BIN`, else the one beside the test's target
/// dir (`target/<profile>/deps/test-xxxx` -> `target/<profile>/nxrt`).
pub fn nxrt_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NXRT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test exe");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("nxrt")
}

pub use nxrt_core::conformance::{compare, ErrStats};
