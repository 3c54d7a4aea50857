// Types for the `nxrt` npm package (an onnxruntime-web-shaped API).

export type TensorType =
  | 'float32' | 'float64' | 'float16' | 'int8' | 'uint8' | 'int16' | 'uint16'
  | 'int32' | 'uint32' | 'int64' | 'uint64' | 'bool' | 'string';

export type TensorData =
  | Float32Array | Float64Array | Int8Array | Uint8Array | Int16Array | Uint16Array
  | Int32Array | Uint32Array | BigInt64Array | BigUint64Array | string[];

/** The WebGPU GPUBuffer (typed loosely so that the package needs no WebGPU type definitions). */
export interface GpuBufferType { readonly size: number; readonly usage: number; readonly label: string }
/** The WebGPU GPUDevice. */
export interface GpuDeviceType { readonly queue: unknown; readonly label: string }

export declare class Tensor {
  /** `float16` data is a Uint16Array of IEEE half bits; `bool` data a Uint8Array of 0/1. */
  constructor(type: TensorType, data: TensorData | readonly number[] | readonly bigint[], dims?: readonly number[]);
  constructor(data: TensorData | readonly number[] | readonly boolean[], dims?: readonly number[]);
  readonly type: TensorType;
  readonly data: TensorData;
  readonly dims: readonly number[];
  readonly size: number;
  /** 'gpu-buffer': an output kept on the GPU (preferredOutputLocation); 'none': disposed. */
  readonly location: 'cpu' | 'gpu-buffer' | 'none';
  /** Throws for a 'gpu-buffer' tensor until getData() has read it back. */
  readonly cpuData: TensorData;
  /** The data on the host; a 'gpu-buffer' tensor is read back (releaseData: free its GPU memory, the tensor becomes 'cpu'). */
  getData(releaseData?: boolean): Promise<TensorData>;
  /** The GPUBuffer of a 'gpu-buffer' tensor (float32, int32, uint8, and float16 with shader-f16); may be longer than the tensor. */
  readonly gpuBuffer: GpuBufferType;
  /** The GPUDevice that gpuBuffer belongs to (undefined for fromGpuBuffer tensors). */
  readonly gpuDevice: GpuDeviceType | undefined;
  /** Drops the data (and a 'gpu-buffer' tensor's GPU memory; for fromGpuBuffer, calls its dispose). */
  dispose(): void;
  /**
   * A tensor over your own GPUBuffer (made on `session.gpuDevice`): fed to a WebGPU session it
   * is copied on the GPU; given in `fetches` as `{output: tensor}` the output is written into
   * it on the GPU. float32, int32, uint8, float16 (with shader-f16); the buffer needs COPY_SRC
   * to feed, COPY_DST to fetch into, and the tensor's bytes rounded up to 4.
   */
  static fromGpuBuffer(buffer: GpuBufferType, options: {
    dataType: 'float32' | 'int32' | 'uint8' | 'float16';
    dims: readonly number[];
    download?: () => Promise<TensorData>;
    dispose?: () => void;
  }): Tensor;
}

/** Where outputs are returned: 'gpu-buffer' keeps what the WebGPU provider computed on the GPU. */
export type DataLocation = 'cpu' | 'gpu-buffer';

export interface ValueMetadata {
  name: string;
  isTensor: boolean;
  type: string;
  /** Numbers for fixed dims, strings for symbolic ones, null where unknown. */
  shape?: (number | string | null)[] | null;
}

/** An output: a Tensor, or for ai.onnx.ml models an array of values or a Map. */
export type OnnxValue = Tensor | OnnxValue[] | Map<number | bigint | string, number | OnnxValue> | null;

export interface SessionOptions {
  /** Providers in preference order: 'webgpu', 'wasm' (alias 'cpu'). Default ['wasm']. With 'webgpu', nodes it has no kernel for run on the CPU with explicit copies (see partitionReport()). */
  executionProviders?: (string | { name: string })[];
  graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /** External-data files the model names, as bytes or URLs (onnxruntime-web's option). Files not given are fetched beside a model loaded from a URL or path. */
  externalData?: { path: string; data: Uint8Array | ArrayBuffer | string | URL }[];
  /** The session's host memory budget in bytes. */
  memoryLimit?: number;
  /** How block-quantized weights (MXFP4, blocked DequantizeLinear before a MatMul, MatMulNBits with float activations) are multiplied: from their codes, from a cached dense copy, or dense weights made at load. Default 'auto': codes for a few rows, the cached copy for more. */
  blockWeights?: 'auto' | 'codes' | 'cached' | 'expanded';
  /** Bytes the session's dense weight copies may hold together (default 256 MiB; null: only memoryLimit bounds them). */
  weightCacheLimit?: number | null;
  /** 'gpu-buffer' (for every output, or per output name): outputs the WebGPU provider computed stay on the GPU; feed them back to this session without a copy. */
  preferredOutputLocation?: DataLocation | Record<string, DataLocation>;
}

export declare class InferenceSession {
  static create(model: string | URL | ArrayBuffer | Uint8Array, options?: SessionOptions): Promise<InferenceSession>;
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
  readonly inputMetadata: readonly ValueMetadata[];
  readonly outputMetadata: readonly ValueMetadata[];
  /** Which provider runs how many nodes, and how many copies the partition needs. */
  readonly partition: string;
  /** Which node runs where, every copy between providers, and why nodes fell back. */
  partitionReport(): {
    nodes: { node: string; op: string; provider: string }[];
    /** once: an initializer uploaded on the first run and kept on the device */
    copies: { value: string; from: string; to: string; node: string; once: boolean }[];
    fallbacks: { node: string; op: string; to: string; reasons: string }[];
    /** What each device provider runs on: the adapter, shader-f16 and the limits it respects. */
    devices: { provider: string; device: string }[];
  };
  /** The dense weight cache's policy, limit (null: none) and figures (bytes and counts). */
  weightCache(): { policy: string; limit: number | null; bytes: number; copies: number; fills: number; hits: number; declined: number; released: number };
  /** What the session holds, in bytes, per tier and holder. */
  memorySnapshot(): {
    name: string;
    tiers: { tier: string; inUse: number; peak: number; limit: number | null; leases: number; holders: Record<string, { inUse: number; peak: number; leases: number }> }[];
  };
  /** How many outputs this session holds on the GPU (not yet disposed). */
  readonly gpuTensors: number;
  /** The GPUDevice of the session's WebGPU provider, or null without one. */
  readonly gpuDevice: GpuDeviceType | null;
  /** `fetches`: output names to return, or `{name: Tensor.fromGpuBuffer(...) | null}` (a GPU tensor there receives that output on the GPU). */
  run(feeds: Record<string, Tensor>, fetches?: readonly string[] | Record<string, Tensor | null>): Promise<Record<string, OnnxValue>>;
  release(): Promise<void>;
}

/** `wasm.relaxedSimd: false` keeps to the SIMD128 build where the engine has relaxed-SIMD. */
export declare const env: { wasm: { wasmPaths?: string | URL; numThreads: number; relaxedSimd?: boolean } };
/**
 * `note` says when a setting could not be honoured (e.g. numThreads > 1); `simd` is
 * `simd128+relaxed` for the relaxed-SIMD build; `relaxedFallback` says why that build was not
 * loaded where the engine has relaxed-SIMD.
 */
export declare function runtimeInfo(): Promise<{
  version: string;
  simd: string;
  threads: number;
  note: string | null;
  relaxedFallback: string | null;
}>;
/** Whether this engine validates relaxed-SIMD wasm (where the relaxed build is loaded). */
export declare function relaxedSimdSupported(): boolean;
export declare function wasmMemoryBytes(): number;
/** The small CNN built into nxrt (input `image` float32 [batch,1,16,16], output `probs` [batch,10]). */
export declare function embeddedModel(): Promise<Uint8Array>;
declare const _default: {
  InferenceSession: typeof InferenceSession;
  Tensor: typeof Tensor;
  env: typeof env;
  runtimeInfo: typeof runtimeInfo;
  wasmMemoryBytes: typeof wasmMemoryBytes;
  embeddedModel: typeof embeddedModel;
};
export default _default;
