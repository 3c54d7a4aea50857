export declare function parseNpy(bytes: Uint8Array | ArrayBuffer): {
  type: string;
  data: Float32Array | Float64Array | Int8Array | Uint8Array | Int16Array | Uint16Array | Int32Array | Uint32Array | BigInt64Array | BigUint64Array | string[];
  dims: number[];
};

/** Writes a numeric or bool tensor (`{ type, data, dims }` or a Tensor) as .npy bytes. */
export declare function writeNpy(t: {
  type: string;
  data: ArrayLike<number> | ArrayLike<bigint>;
  dims: readonly number[];
}): Uint8Array;
