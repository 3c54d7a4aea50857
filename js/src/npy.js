// Reading and writing NumPy .npy files (format versions 1-3, little-endian, C order), as
// nxrt Tensors' plain parts: { type, data, dims }. Used by the tests, the browser example and
// the benchmark page; exported as `nxrt/npy`.

const DESCR = {
  '<f4': ['float32', Float32Array],
  '<f8': ['float64', Float64Array],
  '<f2': ['float16', Uint16Array],
  '|i1': ['int8', Int8Array],
  '|u1': ['uint8', Uint8Array],
  '<i2': ['int16', Int16Array],
  '<u2': ['uint16', Uint16Array],
  '<i4': ['int32', Int32Array],
  '<u4': ['uint32', Uint32Array],
  '<i8': ['int64', BigInt64Array],
  '<u8': ['uint64', BigUint64Array],
  '|b1': ['bool', Uint8Array],
};

/** Parses .npy bytes into `{ type, data, dims }`; throws on anything it cannot read exactly. */
export function parseNpy(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const magic = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
  if (u8.length < 10 || magic.some((b, i) => u8[i] !== b)) throw new Error('not a .npy file');
  const major = u8[6];
  const dv = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
  let hlen, start;
  if (major === 1) {
    hlen = dv.getUint16(8, true);
    start = 10;
  } else if (major === 2 || major === 3) {
    hlen = dv.getUint32(8, true);
    start = 12;
  } else {
    throw new Error(`unsupported .npy version ${major}`);
  }
  const header = new TextDecoder().decode(u8.subarray(start, start + hlen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*(True|False)/.exec(header)?.[1];
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (!descr || !fortran || shapeText === undefined) throw new Error(`bad .npy header: ${header}`);
  if (fortran === 'True') throw new Error('Fortran-order .npy files are not supported');
  const dims = shapeText.split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const size = dims.reduce((a, b) => a * b, 1);
  const off = start + hlen;
  if (descr.startsWith('<U')) {
    const width = Number(descr.slice(2));
    const data = [];
    for (let i = 0; i < size; i++) {
      let s = '';
      for (let c = 0; c < width; c++) {
        const cp = dv.getUint32(off + (i * width + c) * 4, true);
        if (cp === 0) break;
        s += String.fromCodePoint(cp);
      }
      data.push(s);
    }
    return { type: 'string', data, dims };
  }
  const entry = DESCR[descr];
  if (!entry) throw new Error(`unsupported .npy dtype ${descr}`);
  const [type, Arr] = entry;
  const nbytes = size * Arr.BYTES_PER_ELEMENT;
  if (u8.length < off + nbytes) throw new Error('truncated .npy file');
  // an aligned copy (Node's Buffer.slice would return a view into its shared pool)
  const copy = new Uint8Array(nbytes);
  copy.set(u8.subarray(off, off + nbytes));
  return { type, data: new Arr(copy.buffer, 0, size), dims };
}

/**
 * Writes `{ type, data, dims }` (a plain tensor or an nxrt Tensor) as .npy bytes (format 1.0,
 * little-endian, C order), the inverse of `parseNpy` for every numeric and bool type.
 */
export function writeNpy(t) {
  const entry = Object.entries(DESCR).find(([, [type]]) => type === t.type);
  if (!entry) throw new Error(`cannot write a ${t.type} tensor as .npy`);
  const [descr, [, Arr]] = entry;
  const dims = [...t.dims].map(Number);
  const size = dims.reduce((a, b) => a * b, 1);
  if (t.data.length !== size) throw new Error(`${t.data.length} elements for dims [${dims}]`);
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  // magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64
  header += ' '.repeat((64 - ((10 + header.length + 1) % 64)) % 64) + '\n';
  const body = t.data instanceof Arr ? t.data : Arr.from(t.data);
  const out = new Uint8Array(10 + header.length + body.byteLength);
  out.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 1, 0]);
  new DataView(out.buffer).setUint16(8, header.length, true);
  out.set(new TextEncoder().encode(header), 10);
  out.set(new Uint8Array(body.buffer, body.byteOffset, body.byteLength), 10 + header.length);
  return out;
}
