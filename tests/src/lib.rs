//! Shared helpers of the cross-crate tests: value comparison with tolerances, the cache paths
//! of the fetched corpora.

use std::path::PathBuf;

pub mod quant;

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

/// Runs `nxrt ARGS` ([`nxrt_bin`]), asserts it succeeded, and parses its last stdout line as
/// JSON (the `--json` contract of `generate` and `tokenize`).
pub fn nxrt_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(nxrt_bin())
        .args(args)
        .output()
        .expect("start nxrt");
    assert!(
        out.status.success(),
        "nxrt {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    let last = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
}

pub use nxrt_core::conformance::{compare, ErrStats};

/// Whether [`nxrt_bin`] finds a WebGPU adapter, probed by running the embedded model on it.
/// Where there is none it prints why (the caller skips); any other failure of the probe (a
/// binary built without the provider, a crash) fails the test.
pub fn webgpu_available() -> bool {
    let probe = std::process::Command::new(nxrt_bin())
        .args(["run", "--provider", "webgpu"])
        .output()
        .expect("nxrt runs");
    if probe.status.success() {
        return true;
    }
    let e = String::from_utf8_lossy(&probe.stderr);
    assert!(
        e.contains("no WebGPU adapter"),
        "the webgpu probe failed for another reason: {e}"
    );
    println!("skipped: {}", e.trim());
    false
}
