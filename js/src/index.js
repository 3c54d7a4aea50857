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

/** A tensor in host memory: `new Tensor(type, data, dims)` or `new Tensor(data, dims)`. */
export class Tensor {
  constructor(typeOrData, dataOrDims, maybeDims) {
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
    this.data = data;
    this.dims = Object.freeze(dims);
    this.size = size;
    this.location = 'cpu';
  }

  /** The data (already on the host). */
  async getData() {
    this.#check();
    return this.data;
  }

  get cpuData() {
    return this.data;
  }

  /** Drops the tensor's data. Using it afterwards throws. */
  dispose() {
    this.data = undefined;
    this.location = 'none';
  }

  #check() {
    if (this.location === 'none') throw new Error('tensor was disposed');
  }
}

function fromWasm(o) {
  switch (o.kind) {
    case 'tensor':
      return new Tensor(o.type, o.data, o.dims);
    case 'sequence':
      return o.items.map(fromWasm);
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

  constructor(inner) {
    this.#inner = inner;
    this.#inputNames = Object.freeze(inner.inputNames);
    this.#inputSet = new Set(this.#inputNames);
    this.#outputNames = Object.freeze(inner.outputNames);
    this.inputMetadata = inner.inputMetadata;
    this.outputMetadata = inner.outputMetadata;
  }

  /**
   * Loads a model from a URL (or, in Node, a file path), an ArrayBuffer or a Uint8Array.
   * Options: `executionProviders` (default `['wasm']`), `graphOptimizationLevel`
   * (`disabled`, `basic`, `extended`, `all`; default `all`), `externalData` (`[{path, data}]`:
   * the bytes or URL of each external-data file the model names; files not given are fetched
   * beside a model loaded from a URL or path), `memoryLimit` (bytes: the session's host
   * memory budget; its weights, activation memory and outputs are charged to it, and loading
   * or a run over it rejects with an `out of memory` error naming what asked, the session
   * staying usable).
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
    const [extNames, extData] = await externalFiles(bytes, options.externalData, url);
    try {
      // async: 'webgpu' opens the adapter (navigator.gpu.requestAdapter) first
      return new InferenceSession(
        await wasm.WasmSession.create(bytes, providers, level, extNames, extData, limit),
      );
    } catch (e) {
      throw asError(e);
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
   * leases, holders: {weights, arena, outputs, cache, other}}]}` (each holder `{inUse, peak,
   * leases}`; `limit` null when none was set).
   */
  memorySnapshot() {
    return this.#live().memorySnapshot();
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
      if (t.location === 'none') throw new Error(`feed '${name}' was disposed`);
      list.push({ name, type: t.type, data: t.data, dims: t.dims });
    }
    let outs;
    try {
      outs = await inner.run(list);
    } catch (e) {
      throw asError(e);
    }
    const want = fetches ? new Set(Array.isArray(fetches) ? fetches : Object.keys(fetches)) : null;
    const result = {};
    for (const o of outs) {
      if (!want || want.has(o.name)) result[o.name] = fromWasm(o);
    }
    return result;
  }

  /**
   * Frees the model's memory now: its memory plans, its WebGPU buffers and device (the wasm
   * heap keeps the pages for the next session).
   */
  async release() {
    if (this.#inner) {
      this.#inner.releaseCached();
      this.#inner.free();
      this.#inner = null;
    }
  }
}

import { env, runtimeInfo, wasmMemoryBytes, embeddedModel } from './runtime.js';

export default { InferenceSession, Tensor, env, runtimeInfo, wasmMemoryBytes, embeddedModel };
