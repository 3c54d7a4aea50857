// The wasm runtime shared by nxrt's entry points (`nxrt`, `nxrt/genai`): loading the module
// once, settings, and errors. Not part of the public API (the package's exports map leaves it
// out).

import init, * as wasm from '../wasm/nxrt_wasm.js';

export { wasm };

let loading = null;
let exportsObj = null;

export const isNode =
  typeof process !== 'undefined' && process.versions != null && process.versions.node != null;

/**
 * Settings, shaped like onnxruntime-web's `ort.env`. `wasm.wasmPaths`: a folder URL to fetch
 * the wasm files from (before first use). `wasm.numThreads`: this build runs on one
 * thread; asking for more is reported once on the console and in `runtimeInfo()`, never
 * silently dropped. `wasm.relaxedSimd`: `false` keeps to the SIMD128 build even where the
 * engine has relaxed-SIMD (by default the relaxed build, `nxrt_wasm_bg.relaxed.wasm`, is
 * loaded where `WebAssembly.validate` accepts relaxed-SIMD code and the file is there).
 */
export const env = { wasm: { wasmPaths: undefined, numThreads: 1, relaxedSimd: undefined } };

// The smallest module that uses relaxed-SIMD: one function returning
// f32x4.relaxed_madd(0, 0, 0). It validates exactly where the engine has relaxed-SIMD.
const RELAXED_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, // types: () -> v128
  0x03, 0x02, 0x01, 0x00, // one function of type 0
  0x0a, 0x3d, 0x01, 0x3b, 0x00, // code: one body of 59 bytes, no locals
  ...[0, 1, 2].flatMap(() => [0xfd, 0x0c, ...new Array(16).fill(0)]), // v128.const 0, three times
  0xfd, 0x85, 0x02, // f32x4.relaxed_madd (0xfd 0x105)
  0x0b, // end
]);

/** Whether this engine runs relaxed-SIMD wasm (checked by validation, never by failing). */
export function relaxedSimdSupported() {
  try {
    return typeof WebAssembly === 'object' && WebAssembly.validate(RELAXED_PROBE);
  } catch {
    return false;
  }
}

// why the relaxed-SIMD build was not loaded where the engine has relaxed-SIMD (runtimeInfo)
let relaxedFallback = null;

export function threadNote() {
  const n = env.wasm.numThreads;
  if (n === undefined || n === 0 || n === 1) return null;
  return `env.wasm.numThreads = ${n} requested, but nxrt's wasm build runs on 1 thread`;
}

export async function ensureWasm() {
  if (!loading) {
    loading = (async () => {
      // each URL written out whole, so that bundlers see the files (new URL(literal, import.meta.url))
      const at = (file) =>
        env.wasm.wasmPaths
          ? new URL(file, env.wasm.wasmPaths)
          : file === 'nxrt_wasm_bg.wasm'
            ? new URL('../wasm/nxrt_wasm_bg.wasm', import.meta.url)
            : new URL('../wasm/nxrt_wasm_bg.relaxed.wasm', import.meta.url);
      const load = async (url) => {
        if (isNode && url.protocol === 'file:') {
          const { readFile } = await import('node:fs/promises');
          return readFile(url);
        }
        return url;
      };
      const base = at('nxrt_wasm_bg.wasm');
      let done = false;
      if (env.wasm.relaxedSimd !== false && relaxedSimdSupported()) {
        // the relaxed build where the engine has relaxed-SIMD; a package or server without
        // the file falls back to the SIMD128 build
        try {
          exportsObj = await init({ module_or_path: await load(at('nxrt_wasm_bg.relaxed.wasm')) });
          done = true;
        } catch (e) {
          relaxedFallback = `relaxed-SIMD build not loaded (${e?.message ?? e}); running the SIMD128 build`;
        }
      }
      if (!done) exportsObj = await init({ module_or_path: await load(base) });
    })().catch((e) => {
      loading = null;
      throw e;
    });
  }
  return loading;
}

/** Bytes of wasm linear memory in use by the runtime (grows, never shrinks; for leak tests). */
export function wasmMemoryBytes() {
  return exportsObj ? exportsObj.memory.buffer.byteLength : 0;
}

/**
 * Runtime facts: version, the SIMD instruction set the kernels use (`simd128+relaxed` for the
 * relaxed-SIMD build), and `relaxedFallback`: why the relaxed build was not loaded where the
 * engine has relaxed-SIMD (null when it was, or when the engine lacks it).
 */
export async function runtimeInfo() {
  await ensureWasm();
  return { version: wasm.version(), simd: wasm.simdIsa(), threads: 1, note: threadNote(), relaxedFallback };
}

/**
 * The small CNN built into nxrt, as ONNX bytes (input `image` float32 [batch,1,16,16], output
 * `probs` float32 [batch,10]): something to try the API on without downloading a model.
 */
export async function embeddedModel() {
  await ensureWasm();
  return wasm.embeddedModel();
}

export function asError(e) {
  if (e instanceof WebAssembly.RuntimeError) {
    const p = wasm.lastPanic();
    return new Error(`nxrt internal error: ${p ?? e.message} (please report it)`);
  }
  if (e instanceof Error) return e;
  return new Error(String(e));
}

let warnedThreads = false;

/** Says once on the console that more threads were asked for than the build runs. */
export function warnThreadsOnce() {
  const note = threadNote();
  if (note && !warnedThreads) {
    warnedThreads = true;
    console.warn(`nxrt: ${note}`);
  }
}

/** A URL for `src` (a URL, or a path: in Node relative to the working folder). */
export function toUrl(src) {
  if (src instanceof URL) return src;
  return new URL(src, isNode ? `file://${process.cwd()}/` : location.href);
}

/** The bytes at a URL (a file URL read from disk in Node). */
export async function fetchBytes(u, what) {
  if (isNode && u.protocol === 'file:') {
    const { readFile } = await import('node:fs/promises');
    try {
      return new Uint8Array(await readFile(u));
    } catch (e) {
      throw new Error(`cannot read ${what} ${u.pathname}: ${e.message}`);
    }
  }
  const r = await fetch(u);
  if (!r.ok) throw new Error(`cannot fetch ${what} ${u}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

/** `Uint8Array` view of bytes given as an ArrayBuffer or a typed array, else null. */
export function asBytes(data) {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return null;
}

/**
 * The external-data files of a model (`externalData`, as onnxruntime-web takes it: `[{path,
 * data}]`, data bytes or a URL), with every other file the model names fetched relative to
 * `base` (the model's URL; none when the model came as bytes). Returns `[names, buffers]`.
 */
export async function externalFiles(modelBytes, externalData, base) {
  const names = [];
  const bufs = [];
  for (const e of externalData ?? []) {
    if (e === null || typeof e !== 'object' || typeof e.path !== 'string') {
      throw new TypeError('externalData holds {path, data} objects');
    }
    const b = asBytes(e.data) ?? (await fetchBytes(toUrl(e.data), 'external data'));
    names.push(e.path.replace(/^\.\//, ''));
    bufs.push(b);
  }
  let wanted;
  try {
    wanted = wasm.externalLocations(modelBytes);
  } catch (err) {
    throw asError(err);
  }
  for (const loc of wanted) {
    if (names.includes(loc.replace(/^\.\//, ''))) continue;
    if (!base) {
      throw new Error(
        `the model references external file '${loc}': give it in externalData ([{path, data}]) or load the model from a URL or path`,
      );
    }
    names.push(loc);
    bufs.push(await fetchBytes(new URL(loc, base), 'external data'));
  }
  return [names, bufs];
}
