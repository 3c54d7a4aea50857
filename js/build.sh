#!/usr/bin/env bash
# Builds the wasm runtime into js/wasm/ (wasm-pack, web target, SIMD128, LTO), optimises it
# with binaryen's wasm-opt, and prints its size raw and gzipped.
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
WASM="$HERE/wasm/nxrt_wasm_bg.wasm"
if command -v wasm-opt >/dev/null; then
  wasm-opt -O3 --strip-debug --strip-producers --enable-simd --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue \
    "$WASM" -o "$WASM.opt"
  mv "$WASM.opt" "$WASM"
fi
rm -f "$HERE/wasm/package.json" "$HERE/wasm/README.md" "$HERE/wasm/.gitignore"
RAW=$(stat -c %s "$WASM")
GZ=$(gzip -9 -c "$WASM" | wc -c)
echo "nxrt wasm: $RAW bytes raw, $GZ bytes gzip -9 ($WASM)"
