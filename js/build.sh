#!/usr/bin/env bash
# Builds the wasm runtime into js/wasm/ (wasm-pack, web target, LTO) twice: SIMD128
# (nxrt_wasm_bg.wasm) and SIMD128 + relaxed-SIMD (nxrt_wasm_bg.relaxed.wasm); then the
# tokenizer module nxrt/genai loads on first use (nxrt_tokenizer_bg.wasm, its own file so the
# main one does not grow for users who never generate text); optimises them with binaryen's
# wasm-opt and prints their sizes raw and gzipped.
#   bash js/build.sh            release build
#   NXRT_WASM_PROFILE=release bash js/build.sh   faster link, bigger file
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
[ -f /opt/nxrt-tools/env.sh ] && source /opt/nxrt-tools/env.sh
export PATH="$HOME/.cargo/bin:$PATH"
rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
PROFILE="${NXRT_WASM_PROFILE:-wasm-release}"
cd "$ROOT"
# --mode no-install: use the wasm-bindgen on PATH (its version must equal Cargo.lock's);
# --no-opt: we run wasm-opt ourselves with the features the module uses.
wasm-pack build target-wasm --mode no-install --target web --weak-refs --no-pack --no-gitignore \
  --no-opt --profile "$PROFILE" --out-dir ../js/wasm
# The relaxed-SIMD build (the SIMD layer's fma becomes f32x4.relaxed_madd): same sources, its
# own target folder (other RUSTFLAGS would rebuild the first one's every time), same exports,
# so the one JS glue serves both; src/index.js loads it where the engine validates relaxed-SIMD.
RELAXED_OUT="$(mktemp -d)"
trap 'rm -rf "$RELAXED_OUT"' EXIT
CARGO_TARGET_DIR="$ROOT/target/wasm-relaxed" RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
  wasm-pack build target-wasm --mode no-install --target web --weak-refs --no-pack --no-gitignore \
  --no-opt --profile "$PROFILE" --out-dir "$RELAXED_OUT"
if ! cmp -s "$RELAXED_OUT/nxrt_wasm.js" "$HERE/wasm/nxrt_wasm.js"; then
  echo "the relaxed-SIMD build's JS glue differs from the SIMD128 build's: one glue cannot load both" >&2
  exit 1
fi
cp "$RELAXED_OUT/nxrt_wasm_bg.wasm" "$HERE/wasm/nxrt_wasm_bg.relaxed.wasm"
wasm-pack build target-wasm/tokenizer --mode no-install --target web --weak-refs --no-pack --no-gitignore \
  --no-opt --profile "$PROFILE" --out-dir ../../js/wasm --out-name nxrt_tokenizer
for WASM in "$HERE/wasm/nxrt_wasm_bg.wasm" "$HERE/wasm/nxrt_wasm_bg.relaxed.wasm" "$HERE/wasm/nxrt_tokenizer_bg.wasm"; do
  if command -v wasm-opt >/dev/null; then
    # -O1, not -O3: measured on the main module (docs/browser.md), -O3 took 353 s against 37 s
    # and gave no faster runs in Node; its file is 3% smaller raw but 2% larger gzipped.
    wasm-opt -O1 --strip-debug --strip-producers --enable-simd --enable-relaxed-simd --enable-bulk-memory \
      --enable-nontrapping-float-to-int --enable-sign-ext --enable-mutable-globals --enable-reference-types \
      --enable-multivalue "$WASM" -o "$WASM.opt"
    mv "$WASM.opt" "$WASM"
  fi
  RAW=$(stat -c %s "$WASM")
  GZ=$(gzip -9 -c "$WASM" | wc -c)
  echo "nxrt wasm: $RAW bytes raw, $GZ bytes gzip -9 ($WASM)"
done
rm -f "$HERE/wasm/package.json" "$HERE/wasm/README.md" "$HERE/wasm/.gitignore"
