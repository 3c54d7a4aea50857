// nxrt for JavaScript: an onnxruntime-web-shaped API over the nxrt wasm build.
//
//   import { InferenceSession, Tensor } from 'nxrt';
//   const session = await InferenceSession.create(urlOrBytes, { executionProviders: ['wasm'] });
//   const out = await session.run({ input: new Tensor('float32', data, [1, 3, 224, 224]) });
//   await session.release();
//
// Runs single-threaded everywhere (no cross-origin-isolation headers needed). Errors are JS
// `Error`s carrying the runtime's message.


import {
  wasm,
  ensureWasm,
  asError,
  warnThreadsOnce,
  toUrl,
  fetchBytes,
  asBytes,
  externalFiles,
} from './runtime.js';

export { env, relaxedSimdSupported, wasmMemoryBytes, runtimeInfo, embeddedModel } from './runtime.js';

const ARRAY_TYPES = {
  float32: Float32Array,
  float64: Float64Array,
  float16: Uint16Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
};

function inferType(data) {
  if (data instanceof Float32Array) return 'float32';
  if (data instanceof Float64Array) return 'float64';
  if (data instanceof Int8Array) return 'int8';
  if (data instanceof Uint8Array) return 'uint8';
  if (data instanceof Int16Array) return 'int16';
  if (data instanceof Uint16Array) return 'uint16';
  if (data instanceof Int32Array) return 'int32';
  if (data instanceof Uint32Array) return 'uint32';
  if (data instanceof BigInt64Array) return 'int64';
  if (data instanceof BigUint64Array) return 'uint64';
  if (Array.isArray(data) && data.every((v) => typeof v === 'string')) return 'string';
  if (Array.isArray(data) && data.every((v) => typeof v === 'boolean')) return 'bool';
  if (Array.isArray(data)) return 'float32';
  throw new TypeError('cannot infer the tensor type from this data');
}

// The constructor's first argument for a tensor an output left on the GPU (internal).
const ON_GPU = Symbol('nxrt.onGpu');
// ... and for a tensor over a caller's own GPUBuffer (Tensor.fromGpuBuffer).
const EXTERNAL_GPU = Symbol('nxrt.externalGpu');

// Types a GPU buffer holds in their own layout (float16 only where the adapter has shader-f16).
const GPU_BUFFER_TYPES = { float32: 4, int32: 4, uint8: 1, float16: 2 };

/**
 * A tensor: in host memory (`new Tensor(type, data, dims)` or `new Tensor(data, dims)`), or an
 * output a session kept on the GPU (`location: 'gpu-buffer'`, see `preferredOutputLocation`).
 */
export class Tensor {
  #data;
  // for 'gpu-buffer': {owner, handle}; owner is the session's {inner, live} record
  #gpu = null;
  // for Tensor.fromGpuBuffer: {buffer, download, dispose}
  #ext = null;

  constructor(typeOrData, dataOrDims, maybeDims) {
    if (typeOrData === EXTERNAL_GPU) {
      const { type, dims, ext } = dataOrDims;
      this.type = type;
      this.dims = Object.freeze(Array.from(dims));
      this.size = this.dims.reduce((a, b) => a * b, 1);
      this.location = 'gpu-buffer';
      this.#ext = ext;
      return;
    }
    if (typeOrData === ON_GPU) {
      const { type, dims, owner, handle } = dataOrDims;
      this.type = type;
      this.dims = Object.freeze(Array.from(dims));
      this.size = this.dims.reduce((a, b) => a * b, 1);
      this.location = 'gpu-buffer';
      this.#gpu = { owner, handle };
      return;
    }
    let type, data, dims;
    if (typeof typeOrData === 'string') {
      [type, data, dims] = [typeOrData, dataOrDims, maybeDims];
    } else {
      [type, data, dims] = [inferType(typeOrData), typeOrData, dataOrDims];
    }
    if (type === 'string') {
      if (!Array.isArray(data) || !data.every((v) => typeof v === 'string')) {
        throw new TypeError("a 'string' tensor needs an array of strings");
      }
    } else {
      const Arr = ARRAY_TYPES[type];
      if (!Arr) throw new TypeError(`unsupported tensor type '${type}'`);
      if (Array.isArray(data)) {
        data =
          type === 'int64' || type === 'uint64'
            ? Arr.from(data, (v) => BigInt(v))
            : Arr.from(data, (v) => Number(v));
      } else if (!(data instanceof Arr)) {
        throw new TypeError(
          `tensor type '${type}' needs a ${Arr.name} (got ${data?.constructor?.name ?? typeof data})`,
        );
      }
    }
    dims = dims === undefined ? [data.length] : Array.from(dims);
    for (const d of dims) {
      if (!Number.isInteger(d) || d < 0) throw new RangeError(`bad dims [${dims}]`);
    }
    const size = dims.reduce((a, b) => a * b, 1);
    if (size !== data.length) {
      throw new RangeError(
        `tensor data has ${data.length} elements but dims [${dims}] need ${size}`,
      );
    }
    this.type = type;
    this.#data = data;
    this.dims = Object.freeze(dims);
    this.size = size;
    this.location = 'cpu';
  }

  /** The data on the host. For a 'gpu-buffer' tensor, only after `getData()` downloaded it. */
  get data() {
    if (this.#data === undefined && this.location === 'gpu-buffer') {
      throw new Error(
        'the data is on the GPU (location gpu-buffer): download it with `await tensor.getData()`',
      );
    }
    return this.#data;
  }

  get cpuData() {
    return this.data;
  }

  /**
   * The data on the host. A 'gpu-buffer' tensor is read back (once; later calls return the
   * same array); `releaseData`: give its GPU memory back once read (the tensor becomes a
   * 'cpu' one).
   */
  async getData(releaseData = false) {
    this.#check();
    if (this.#ext) {
      if (this.#data === undefined) {
        if (typeof this.#ext.download !== 'function') {
          throw new Error(
            'this tensor is a GPUBuffer of yours (Tensor.fromGpuBuffer) and no download ' +
              'function was given: read the buffer with your own commands',
          );
        }
        this.#data = await this.#ext.download();
      }
      if (releaseData === true) {
        this.#ext.dispose?.();
        this.#ext = null;
        this.location = 'cpu';
      }
      return this.#data;
    }
    if (this.#gpu) {
      const inner = this.#owner();
      const release = releaseData === true;
      if (this.#data === undefined) {
        try {
          this.#data = (await inner.downloadGpu(this.#gpu.handle, release)).data;
        } catch (e) {
          throw asError(e);
        }
      } else if (release) {
        inner.disposeGpu(this.#gpu.handle); // read back already: only the device copy goes
      }
      if (release) {
        this.#gpu = null;
        this.location = 'cpu';
      }
    }
    return this.#data;
  }

  /**
   * The WebGPU `GPUBuffer` holding a 'gpu-buffer' tensor (its values computed and submitted
   * first), for the caller's own commands on `gpuDevice`. The buffer may be longer than the
   * tensor (rounded up to 4 bytes) and goes back to the session's pool on `dispose()`. Only
   * float32, int32, uint8, and float16 where the adapter has shader-f16: other types are stored
   * as 32-bit words on the GPU and throw here (use `getData()`).
   */
  get gpuBuffer() {
    if (this.#ext) return this.#ext.buffer;
    return this.#handles()[0];
  }

  /** The `GPUDevice` that `gpuBuffer` belongs to (undefined for `fromGpuBuffer` tensors). */
  get gpuDevice() {
    if (this.#ext) return undefined;
    return this.#handles()[1];
  }

  /**
   * A tensor over your own `GPUBuffer` (made on the session's device, `session.gpuDevice`),
   * as onnxruntime-web has it: `{dataType, dims, download?, dispose?}`. Fed to a WebGPU
   * session it is copied on the GPU (one buffer-to-buffer copy, never through the CPU); given
   * in `fetches` as `{output: tensor}` the run writes that output into it on the GPU. The
   * buffer stays yours: `download()` (optional) is what `getData()` calls, `dispose()` calls
   * yours. Types: float32, int32, uint8, and float16 where the adapter has shader-f16; the
   * buffer needs COPY_SRC (to feed) or COPY_DST (to fetch into) and at least the tensor's
   * bytes rounded up to 4.
   */
  static fromGpuBuffer(buffer, options) {
    const { dataType, dims, download, dispose } = options ?? {};
    if (buffer === null || typeof buffer !== 'object' || typeof buffer.size !== 'number') {
      throw new TypeError('fromGpuBuffer needs a GPUBuffer');
    }
    if (!(dataType in GPU_BUFFER_TYPES)) {
      throw new TypeError(
        `fromGpuBuffer: dataType '${dataType}' is not held in its own layout on the GPU ` +
          `(use ${Object.keys(GPU_BUFFER_TYPES).join(', ')})`,
      );
    }
    if (!Array.isArray(dims) || !dims.every((d) => Number.isInteger(d) && d >= 0)) {
      throw new RangeError(`fromGpuBuffer: bad dims [${dims}]`);
    }
    const t = new Tensor(EXTERNAL_GPU, { type: dataType, dims, ext: { buffer, download, dispose } });
    const need = gpuBytes(t);
    if (buffer.size < need) {
      throw new RangeError(
        `fromGpuBuffer: the buffer has ${buffer.size} bytes; a ${dataType} tensor of dims ` +
          `[${dims}] needs ${need}`,
      );
    }
    return t;
  }

  /** The caller's GPUBuffer of a fromGpuBuffer tensor (internal), or null. */
  static external(t) {
    return t.#ext ? t.#ext.buffer : null;
  }

  #handles() {
    this.#check();
    if (!this.#gpu) throw new Error(`the tensor is not on the GPU (location ${this.location})`);
    try {
      return this.#owner().gpuBuffer(this.#gpu.handle);
    } catch (e) {
      throw asError(e);
    }
  }

  #owner() {
    const { owner } = this.#gpu;
    if (!owner.live) {
      throw new Error('the session that kept this tensor on the GPU was released');
    }
    return owner.inner;
  }

  /** Drops the tensor's data (and its GPU memory). Using it afterwards throws. */
  dispose() {
    if (this.#ext) {
      this.#ext.dispose?.();
      this.#ext = null;
    }
    if (this.#gpu) {
      if (this.#gpu.owner.live) this.#gpu.owner.inner.disposeGpu(this.#gpu.handle);
      this.#gpu = null;
    }
    this.#data = undefined;
    this.location = 'none';
  }

  /** The feed object the wasm side takes (internal). */
  static feed(name, t, inner) {
    if (t.location === 'none') throw new Error(`feed '${name}' was disposed`);
    if (t.#ext) return { name, ext: t.#ext.buffer, type: t.type, dims: t.dims };
    const g = t.#gpu;
    if (g) {
      if (g.owner.inner !== inner || !g.owner.live) {
        throw new Error(
          `feed '${name}' is a GPU tensor kept by another session: GPU tensors feed the ` +
            'session that made them (read it with getData() to feed another)',
        );
      }
      return { name, gpu: g.handle };
    }
    return { name, type: t.type, data: t.#data, dims: t.dims };
  }

  #check() {
    if (this.location === 'none') throw new Error('tensor was disposed');
  }
}

/** Bytes a GPU copy of tensor `t` moves: its data rounded up to 4. */
function gpuBytes(t) {
  const n = t.size * GPU_BUFFER_TYPES[t.type];
  return Math.max(4, Math.ceil(n / 4) * 4);
}

/** Copies `size` bytes of GPUBuffer `src` to `dst` on `device` (one submitted command). */
function gpuCopy(device, src, dst, size) {
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(src, 0, dst, 0, size);
  device.queue.submit([enc.finish()]);
}

const COPY_SRC = 0x4;
const COPY_DST = 0x8;

const LOCATIONS = new Set(['cpu', 'gpu-buffer']);

/** The outputs to keep on the GPU for `preferredOutputLocation` (a name or `{output: name}`). */
function keepList(pref, outputNames) {
  if (pref === undefined) return [];
  const check = (loc, what) => {
    if (!LOCATIONS.has(loc)) {
      throw new TypeError(
        `preferredOutputLocation${what}: '${loc}' is not supported (use 'cpu' or 'gpu-buffer')`,
      );
    }
    return loc === 'gpu-buffer';
  };
  if (typeof pref === 'string') return check(pref, '') ? [...(outputNames ?? [])] : [];
  if (pref === null || typeof pref !== 'object') {
    throw new TypeError("preferredOutputLocation must be a location or an {output: location} object");
  }
  const known = outputNames && new Set(outputNames);
  const keep = [];
  for (const [name, loc] of Object.entries(pref)) {
    const gpu = check(loc, `['${name}']`);
    if (known && !known.has(name)) {
      throw new Error(
        `preferredOutputLocation names '${name}', which is not an output of this model ` +
          `(outputs: ${outputNames.join(', ')})`,
      );
    }
    if (gpu) keep.push(name);
  }
  return keep;
}

function fromWasm(o, owner) {
  switch (o.kind) {
    case 'tensor':
      if (o.location === 'gpu-buffer') {
        return new Tensor(ON_GPU, { type: o.type, dims: o.dims, owner, handle: o.gpu });
      }
      return new Tensor(o.type, o.data, o.dims);
    case 'sequence':
      return o.items.map((x) => fromWasm(x, owner));
    case 'map': {
      const m = new Map();
      for (const [k, v] of o.map) {
        m.set(k, v.kind === 'tensor' && v.dims.length === 0 ? v.data[0] : fromWasm(v));
      }
      return m;
    }
    case 'none':
      return null;
    default:
      throw new Error(`unexpected output kind ${o.kind}`);
  }
}

/** The model's bytes and the URL it came from (null for bytes). */
async function modelSource(src) {
  if (typeof src === 'string' || src instanceof URL) {
    const u = toUrl(src);
    return [await fetchBytes(u, 'model'), u];
  }
  const b = asBytes(src);
  if (b) return [b, null];
  throw new TypeError('InferenceSession.create takes a URL, a path, an ArrayBuffer or a Uint8Array');
}

function providerNames(list) {
  const names = (list ?? ['wasm']).map((p) => (typeof p === 'string' ? p : p?.name));
  for (const n of names) {
    if (typeof n !== 'string') throw new TypeError('executionProviders holds a non-name');
  }
  return names;
}

/** A loaded model. */
export class InferenceSession {
  #inner;
  #inputNames;
  #inputSet;
  #outputNames;
  // {inner, live}: what this session's GPU tensors read back through
  #owner;
  #keep;

  constructor(inner, pref) {
    this.#inner = inner;
    this.#owner = { inner, live: true };
    this.#inputNames = Object.freeze(inner.inputNames);
    this.#inputSet = new Set(this.#inputNames);
    this.#outputNames = Object.freeze(inner.outputNames);
    this.inputMetadata = inner.inputMetadata;
    this.outputMetadata = inner.outputMetadata;
    this.#keep = keepList(pref, this.#outputNames);
  }

  /**
   * Loads a model from a URL (or, in Node, a file path), an ArrayBuffer or a Uint8Array.
   * Options: `executionProviders` (default `['wasm']`), `graphOptimizationLevel`
   * (`disabled`, `basic`, `extended`, `all`; default `all`), `externalData` (`[{path, data}]`:
   * the bytes or URL of each external-data file the model names; files not given are fetched
   * beside a model loaded from a URL or path), `memoryLimit` (bytes: the session's host
   * memory budget; its weights, activation memory and outputs are charged to it, and loading
   * or a run over it rejects with an `out of memory` error naming what asked, the session
   * staying usable), `blockWeights` (`'auto'` (default), `'codes'`, `'cached'` or `'expanded'`:
   * how block-quantized weights such as MXFP4 are multiplied, see `weightCache()`),
   * `weightCacheLimit` (bytes the session's dense weight copies may hold; default 256 MiB,
   * `null` for no limit but the memory budget), `preferredOutputLocation` (`'cpu'` (default) or `'gpu-buffer'`, for every
   * output or per output as `{name: location}`: an output the WebGPU provider computed stays
   * on the GPU as a Tensor with `location: 'gpu-buffer'`, read with `await getData()`, fed
   * back to this session without a copy, and freed with `dispose()`; an output the CPU
   * computed comes back on the CPU).
   */
  static async create(src, options = {}) {
    await ensureWasm();
    warnThreadsOnce();
    const [bytes, url] = await modelSource(src);
    const providers = providerNames(options.executionProviders);
    const level = options.graphOptimizationLevel ?? 'all';
    const limit = options.memoryLimit;
    if (limit !== undefined && !(Number.isSafeInteger(limit) && limit >= 0)) {
      throw new TypeError(`memoryLimit must be a whole number of bytes, not ${limit}`);
    }
    const blockWeights = options.blockWeights;
    if (blockWeights !== undefined && !['auto', 'codes', 'cached', 'expanded'].includes(blockWeights)) {
      throw new TypeError(`blockWeights must be 'auto', 'codes', 'cached' or 'expanded', not ${blockWeights}`);
    }
    let cacheLimit = options.weightCacheLimit;
    if (cacheLimit === null) {
      cacheLimit = -1; // no limit of its own
    } else if (cacheLimit !== undefined && !(Number.isSafeInteger(cacheLimit) && cacheLimit >= 0)) {
      throw new TypeError(`weightCacheLimit must be a whole number of bytes or null, not ${cacheLimit}`);
    }
    const pref = options.preferredOutputLocation;
    if (pref !== undefined) keepList(pref, null); // a bad location fails before loading
    const [extNames, extData] = await externalFiles(bytes, options.externalData, url);
    let inner;
    try {
      // async: 'webgpu' opens the adapter (navigator.gpu.requestAdapter) first
      inner = await wasm.WasmSession.create(
        bytes, providers, level, extNames, extData, limit, blockWeights, cacheLimit,
      );
    } catch (e) {
      throw asError(e);
    }
    try {
      return new InferenceSession(inner, pref);
    } catch (e) {
      inner.free();
      throw e;
    }
  }

  get inputNames() {
    return this.#inputNames;
  }

  get outputNames() {
    return this.#outputNames;
  }

  /** Where each node runs, e.g. `wasm: 52 nodes; 0 copies`. */
  get partition() {
    return this.#live().partition();
  }

  /**
   * The partition in full: `{nodes: [{node, op, provider}], copies: [{value, from, to, node}],
   * fallbacks: [{node, op, to, reasons}]}`: which node runs where, every copy between the GPU
   * and the CPU (node '' = a graph output read back), and why a preferred provider declined.
   */
  partitionReport() {
    return this.#live().partitionReport();
  }

  /**
   * What the session holds now, in bytes: `{name, tiers: [{tier: 'host', inUse, peak, limit,
   * leases, holders: {weights, arena, outputs, cache, dequantized, other}}]}` (each holder `{inUse, peak,
   * leases}`; `limit` null when none was set).
   */
  memorySnapshot() {
    return this.#live().memorySnapshot();
  }

  /**
   * The dense weight cache: `{policy, limit, bytes, copies, fills, hits, declined, released}`
   * (bytes; `limit` null when none). Copies of block-quantized weights made for many-row
   * products are kept up to the limit and leased as `dequantized`; `release()` and any
   * refused lease give them back.
   */
  weightCache() {
    return this.#live().weightCache();
  }

  /** How many of this session's outputs are held on the GPU (not yet disposed). */
  get gpuTensors() {
    return this.#live().gpuTensors;
  }

  #live() {
    if (!this.#inner) throw new Error('session was released');
    return this.#inner;
  }

  /**
   * Runs the model. `feeds` maps input names to Tensors; resolves to an object mapping output
   * names to Tensors (sequence outputs are arrays, map outputs `Map`s). `fetches` (an array of
   * output names) limits what is returned.
   */
  async run(feeds, fetches) {
    const inner = this.#live();
    if (feeds === null || typeof feeds !== 'object') throw new TypeError('feeds must be an object');
    const known = this.#inputSet;
    const list = [];
    for (const [name, t] of Object.entries(feeds)) {
      if (!known.has(name)) {
        throw new Error(
          `'${name}' is not an input of this model (inputs: ${[...known].join(', ')})`,
        );
      }
      if (!(t instanceof Tensor)) throw new TypeError(`feed '${name}' is not a Tensor`);
      list.push(Tensor.feed(name, t, inner));
    }
    // outputs to write into the caller's own GPU buffers (fetches {name: fromGpuBuffer tensor})
    const into = new Map();
    if (fetches && !Array.isArray(fetches) && typeof fetches === 'object') {
      for (const [name, t] of Object.entries(fetches)) {
        const buf = t instanceof Tensor ? Tensor.external(t) : null;
        if (!buf) continue;
        if (!this.#outputNames.includes(name)) {
          throw new Error(
            `fetches names '${name}', which is not an output of this model ` +
              `(outputs: ${this.#outputNames.join(', ')})`,
          );
        }
        if (!(buf.usage & COPY_DST)) {
          throw new TypeError(`fetch '${name}': the GPUBuffer needs COPY_DST usage`);
        }
        into.set(name, t);
      }
    }
    const temps = [];
    let outs;
    try {
      for (const f of list) {
        if (f.ext) this.#feedExternal(inner, f, temps);
      }
      const keep = into.size ? [...new Set([...this.#keep, ...into.keys()])] : this.#keep;
      outs = keep.length ? await inner.runWith(list, keep) : await inner.run(list);
    } catch (e) {
      throw asError(e);
    } finally {
      for (const h of temps) inner.disposeGpu(h); // the run holds what it still reads
    }
    const want = fetches ? new Set(Array.isArray(fetches) ? fetches : Object.keys(fetches)) : null;
    const result = {};
    let failed = null;
    for (const o of outs) {
      const dst = into.get(o.name);
      if (dst) {
        try {
          this.#writeInto(inner, o, dst);
          result[o.name] = dst;
        } catch (e) {
          failed ??= e; // the other outputs are still settled, then given back below
        }
      } else if (!want || want.has(o.name)) {
        result[o.name] = fromWasm(o, this.#owner);
      } else if (o.location === 'gpu-buffer') {
        inner.disposeGpu(o.gpu); // kept on the GPU but not fetched
      }
    }
    if (failed) {
      // nothing is returned: GPU outputs made for this run go back now, not at release()
      for (const [name, t] of Object.entries(result)) {
        if (!into.has(name) && t instanceof Tensor) t.dispose();
      }
      throw failed;
    }
    return result;
  }

  /** Turns feed `f` over a caller's GPUBuffer into a GPU tensor of ours (a copy on the GPU). */
  #feedExternal(inner, f, temps) {
    if (!(f.ext.usage & COPY_SRC)) {
      throw new TypeError(`feed '${f.name}': the GPUBuffer needs COPY_SRC usage`);
    }
    const h = inner.allocGpu(f.type, f.dims);
    temps.push(h);
    const [dst, device] = inner.gpuBuffer(h);
    gpuCopy(device, f.ext, dst, Math.min(dst.size, f.ext.size));
    f.gpu = h;
    delete f.ext;
  }

  /** Writes output `o` into the caller's GPU tensor `dst`, on the GPU. */
  #writeInto(inner, o, dst) {
    const buf = Tensor.external(dst);
    if (o.kind !== 'tensor' || o.type !== dst.type || o.dims.join() !== dst.dims.join()) {
      if (o.location === 'gpu-buffer') inner.disposeGpu(o.gpu);
      throw new Error(
        `fetch '${o.name}': the output is ${o.type} [${o.dims}], the given tensor ` +
          `${dst.type} [${dst.dims}]`,
      );
    }
    const size = gpuBytes(dst);
    if (o.location === 'gpu-buffer') {
      try {
        const [src, device] = inner.gpuBuffer(o.gpu);
        gpuCopy(device, src, buf, size);
      } finally {
        inner.disposeGpu(o.gpu);
      }
    } else {
      // computed on the CPU: written from its data
      const device = this.gpuDevice;
      const bytes = new Uint8Array(size);
      bytes.set(new Uint8Array(o.data.buffer, o.data.byteOffset, o.data.byteLength));
      device.queue.writeBuffer(buf, 0, bytes);
    }
  }

  /**
   * The `GPUDevice` of this session's WebGPU provider (make the buffers you give
   * `Tensor.fromGpuBuffer` on it), or null for a session without one.
   */
  get gpuDevice() {
    const inner = this.#live();
    let h;
    try {
      h = inner.allocGpu('uint8', [4]);
    } catch {
      return null;
    }
    try {
      return inner.gpuBuffer(h)[1];
    } finally {
      inner.disposeGpu(h);
    }
  }

  /**
   * Frees the model's memory now: its memory plans, its WebGPU buffers and device (the wasm
   * heap keeps the pages for the next session).
   */
  async release() {
    if (this.#inner) {
      this.#owner.live = false;
      this.#inner.releaseCached();
      this.#inner.free();
      this.#inner = null;
    }
  }
}

import { env, runtimeInfo, wasmMemoryBytes, embeddedModel } from './runtime.js';

export default { InferenceSession, Tensor, env, runtimeInfo, wasmMemoryBytes, embeddedModel };
