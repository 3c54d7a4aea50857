#!/usr/bin/env bash
# Builds nxrt twice (without the profiling code, and as users get it) and runs
# scripts/bench_gates.py on them: the gate-off and profiler-on costs, interleaved.
#   scripts/bench_gates.sh [bench_gates.py args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NXRT_CACHE="${NXRT_CACHE:-$HOME/.cache/nxrt}"
cd "$ROOT"
mkdir -p target/bench
cargo build --release -p nxrt --no-default-features
cp target/release/nxrt target/bench/nxrt-noprof
cargo build --release -p nxrt
exec "$NXRT_CACHE/corpus-venv/bin/python" scripts/bench_gates.py "$@"
