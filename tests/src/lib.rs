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

pub use nxrt_core::conformance::{compare, ErrStats};
