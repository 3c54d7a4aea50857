#!/usr/bin/env bash
# The full test run (the README's second command; CI's .ci/run calls it). On a fresh Debian
# machine it installs what it needs (toolchain targets, Chromium, lavapipe, wasm-bindgen-cli via
# ../shared/toolchain/setup.sh), fetches the real-model corpus and the ONNX node tests into
# $NXRT_CACHE (default ~/.cache/nxrt, never the repo) with the generation references and the quantized set, then checks formatting and lints, builds
# core for wasm32v1-none (proof that core has no std), runs core's SIMD tests on wasm SIMD128 (Node's WASI) and on aarch64 (NEON,
# under qemu-user), runs every test, and runs the node-test
# conformance suite against the committed baseline (a case that passed and now fails is an error),
# checks docs/operators.md is current, then builds the wasm package (js/build.sh), runs the node
# tests on it in Node against tests/conformance/wasm.json, and runs its tests: wasm-bindgen tests in Node and
# headless Chromium, and the npm package's tests (Node, Chromium via playwright-core, the
# example page, npm pack), and a two-model quick cross-target report (its structure checked).
#
#   scripts/test.sh            everything
#   SKIP_SETUP=1 scripts/test.sh   skip the toolchain/corpus set-up (already done)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${NXRT_SHARED:-$ROOT/../shared}"
export NXRT_CACHE="${NXRT_CACHE:-$HOME/.cache/nxrt}"
export PATH="$HOME/.cargo/bin:$PATH"
cd "$ROOT"
T0=$(date +%s)
# each step's header says the disk space left: a full disk was a CI failure once (stop 53)
step() { echo; echo "=== [$(( $(date +%s) - T0 ))s, $(df -Ph "$ROOT" | awk 'NR==2 {print $4}') free] $*"; }
# NXRT_FREE_DISK=1 (CI's .ci/run sets it): remove a step's own target dir once the step passed
free_disk() { if [ "${NXRT_FREE_DISK:-0}" = 1 ]; then rm -rf "$@"; fi; }

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  step "toolchain ($SHARED/toolchain/setup.sh)"
  bash "$SHARED/toolchain/setup.sh"
  step "real-model corpus -> $NXRT_CACHE/corpus"
  BENCH=0 bash "$SHARED/corpus/fetch_corpus.sh"
  step "quantized set -> $NXRT_CACHE/quant (int8 QDQ/QOperator, dynamic int8, MatMulNBits, MXFP4, MoE; ORT references)"
  # it exits 1 when a model's cosine against its float twin falls under its sanity floor (seen
  # on a fresh machine for the int8 MobileNetV3 and PP-OCR builds) as well as when one fails to
  # build: the set is still complete, and quant_parity below fails on any model missing
  BENCH=0 bash "$SHARED/quant/fetch_quant.sh" \
    || echo "note: fetch_quant.sh exited non-zero (see its last line); quant_parity checks that all models are there"
  step "generation references -> $NXRT_CACHE/genai (tokenizers, decode models, onnxruntime-genai tokens)"
  BENCH=0 bash "$SHARED/genai/fetch_genai.sh"
  step "ONNX node tests -> $NXRT_CACHE/conformance"
  bash "$SHARED/conformance/fetch-node-tests.sh" "$NXRT_CACHE/conformance"
  step "aarch64 cross linker and qemu-user (the NEON SIMD tests)"
  if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    apt-get install -y gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user \
      || { apt-get update && apt-get install -y gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; }
  fi
fi
[ -f /opt/nxrt-tools/env.sh ] && source /opt/nxrt-tools/env.sh
# the Vulkan loader (lavapipe, for the WebGPU tests) wants a runtime dir
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt
for t in wasm32v1-none wasm32-unknown-unknown wasm32-wasip1 aarch64-unknown-linux-gnu; do
  rustup target list --installed | grep -qx "$t" || rustup target add "$t"
done

step "cargo fmt --check"
cargo fmt --all -- --check

step "core builds for wasm32v1-none (no std anywhere)"
cargo build -p nxrt-core --target wasm32v1-none --release

step "core's SIMD layer on aarch64: the NEON instantiation under qemu-user"
cargo test --release -p nxrt-core --lib --target aarch64-unknown-linux-gnu simd

step "core's SIMD layer on wasm SIMD128: the V128 instantiation under Node's WASI"
# its own target folder: other RUSTFLAGS would rebuild the native one's every time
WASI_TEST=$(CARGO_TARGET_DIR="$ROOT/target/wasi" RUSTFLAGS="-C target-feature=+simd128" \
  cargo test --release -p nxrt-core --lib --target wasm32-wasip1 --no-run --message-format=json \
  | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{for(const l of s.split("\n")){try{const j=JSON.parse(l);if(j.executable)console.log(j.executable)}catch{}}})')
node --no-warnings scripts/wasi_run.mjs "$WASI_TEST" simd --nocapture --test-threads 1

step "build (release)"
cargo build --release -p nxrt -p nxrt-tests

step "clippy -D warnings"
cargo clippy --release -p nxrt-core -p nxrt -p nxrt-tests -p nxrt-wasm --all-targets -- -D warnings
cargo clippy -p nxrt-wasm -p nxrt-wasm-tokenizer --target wasm32-unknown-unknown --all-targets -- -D warnings

step "chat-template references from HF transformers -> \$NXRT_CACHE/genai/chat_refs.json"
"$NXRT_CACHE/corpus-venv/bin/python" scripts/chat_refs.py "$NXRT_CACHE/genai/chat_refs.json"

step "com.microsoft encoder/decoder op references from ONNX Runtime -> \$NXRT_CACHE/contrib_refs"
"$NXRT_CACHE/corpus-venv/bin/python" scripts/contrib_refs.py "$NXRT_CACHE/contrib_refs"

step "ONNX Runtime's uint8-weight twins of the int8 quantized models -> \$NXRT_CACHE/quant_refs"
"$NXRT_CACHE/corpus-venv/bin/python" scripts/quant_refs.py "$NXRT_CACHE/quant" "$NXRT_CACHE/quant_refs"

step "unit, API and real-model parity tests"
NXRT_BIN="$ROOT/target/release/nxrt" cargo test --release -p nxrt-core -p nxrt -p nxrt-tests -p nxrt-wasm -p nxrt-wasm-tokenizer -- --nocapture

step "LeakSanitizer over the memory tests (stable rustc's -Zsanitizer=leak via RUSTC_BOOTSTRAP; debug, own target dir)"
# the governor's unit tests, the memory API/CLI tests, the counting-allocator leak check and
# the 8x4x200 stress test, built with LeakSanitizer: any leaked allocation fails the step.
# allocator_may_return_null: hostile sizes must reach nxrt's fallible allocation as a null,
# not stop the sanitizer's allocator.
LSAN_OPTIONS=allocator_may_return_null=1 RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=leak" \
  NXRT_BIN="$ROOT/target/release/nxrt" \
  cargo test -p nxrt --target x86_64-unknown-linux-gnu --target-dir target/lsan \
  --test memory --test memory_stress --test leaks
free_disk target/lsan

step "benchmark suite, quick (cargo bench -p nxrt --bench suite; every scenario briefly)"
# proves every scenario builds and runs; the figures of a quick run are not for comparison
cargo bench -p nxrt --bench suite -- --quick --warm-up-time 0.2 --measurement-time 0.3 --noplot

step "README's first command: the embedded model"
./target/release/nxrt

step "ONNX backend node tests (native CPU) against tests/conformance/native.json"
./target/release/conformance --out "$ROOT/target/conformance-native.json" --baseline tests/conformance/native.json

step "docs/operators.md is current (cargo run -p nxrt-tests --bin operators)"
./target/release/operators --check

step "wasm package (js/build.sh: wasm-pack, SIMD128 and relaxed-SIMD builds, wasm-opt)"
bash js/build.sh

step "ONNX backend node tests (wasm in Node) against tests/conformance/wasm.json"
node scripts/conformance_wasm.mjs --out "$ROOT/target/conformance-wasm.json" \
  --baseline tests/conformance/wasm.json --native tests/conformance/native.json

step "wasm-bindgen tests in Node and headless Chromium (target-wasm/tests/web.rs)"
wasm-pack test --node --mode no-install target-wasm
wasm-pack test --headless --chrome --mode no-install target-wasm --features browser-tests
free_disk target/wasm32-unknown-unknown/debug

step "npm package: Node, headless Chromium (corpus vs native), example page, npm pack"
(cd js && NXRT_BIN="$ROOT/target/release/nxrt" node --test test/)

step "cross-target report, quick, two models (scripts/cross-target-report; its structure checked)"
# every target present here (native CPU 1/N threads with ONNX Runtime in-process, WebGPU on
# lavapipe, wasm in Node and Chromium, WebGPU in Chromium, onnxruntime-web): report.json,
# report.md, SVG charts and index.html; quick figures are not for comparison
rm -rf "$ROOT/target/cross-target-quick"
"$NXRT_CACHE/corpus-venv/bin/python" scripts/cross-target-report --quick --models ort_mul_1,silero_vad \
  --out "$ROOT/target/cross-target-quick"
"$NXRT_CACHE/corpus-venv/bin/python" scripts/check_cross_target_report.py "$ROOT/target/cross-target-quick" \
  --expect-models ort_mul_1,silero_vad \
  --expect-measured nxrt-cpu-1t,ort-cpu-1t,nxrt-webgpu-native,nxrt-wasm-node,ortweb-wasm-node,nxrt-wasm-chromium,ortweb-wasm-chromium,nxrt-webgpu-chromium

step "all green in $(( $(date +%s) - T0 ))s"
