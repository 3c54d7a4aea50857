// The npm package's API in Node: loading, metadata, types, errors, memory. Run with
// `node --test test/` after `bash build.sh` (the README's test command does both).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { InferenceSession, Tensor, relaxedSimdSupported, runtimeInfo, wasmMemoryBytes } from '../src/index.js';
import { CORPUS } from './corpus.mjs';

const MUL = join(CORPUS, 'ort_mul_1', 'model.onnx');
const VAD = join(CORPUS, 'silero_vad', 'model.onnx');

test('runtime reports SIMD128 kernels, relaxed where the engine validates relaxed-SIMD', async () => {
  const info = await runtimeInfo();
  assert.equal(info.simd, relaxedSimdSupported() ? 'simd128+relaxed' : 'simd128');
  assert.match(info.version, /^\d+\.\d+\.\d+/);
});

test('create from a path, bytes and an ArrayBuffer; names and metadata', async () => {
  const bytes = readFileSync(MUL);
  for (const src of [MUL, new Uint8Array(bytes), bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength)]) {
    const s = await InferenceSession.create(src, { executionProviders: ['wasm'] });
    assert.deepEqual([...s.inputNames], ['X']);
    assert.deepEqual([...s.outputNames], ['Y']);
    assert.equal(s.inputMetadata[0].type, 'float32');
    assert.deepEqual(s.inputMetadata[0].shape, [3, 2]);
    assert.match(s.partition, /nodes/);
    await s.release();
  }
});

test('run gives the right numbers, keyed by output name', async () => {
  const s = await InferenceSession.create(MUL);
  const x = new Tensor('float32', Float32Array.from([1, 2, 3, 4, 5, 6]), [3, 2]);
  const out = await s.run({ X: x });
  assert.deepEqual(Object.keys(out), ['Y']);
  assert.equal(out.Y.type, 'float32');
  assert.deepEqual([...out.Y.dims], [3, 2]);
  // ort_mul_1 multiplies by the constant [[1,2],[3,4],[5,6]]
  assert.deepEqual([...out.Y.data], [1, 4, 9, 16, 25, 36]);
  await s.release();
});

test('Tensor types: float16, int64, int32, uint8, int8, bool, string, and inference from data', () => {
  const cases = [
    ['float16', new Uint16Array([0x3c00, 0x4000]), [2]],
    ['int64', new BigInt64Array([1n, -2n]), [2, 1]],
    ['int32', new Int32Array([7]), []],
    ['uint8', new Uint8Array([1, 2, 3, 4]), [2, 2]],
    ['int8', new Int8Array([-1]), [1]],
    ['bool', new Uint8Array([1, 0]), [2]],
    ['string', ['a', 'b'], [2]],
  ];
  for (const [type, data, dims] of cases) {
    const t = new Tensor(type, data, dims);
    assert.equal(t.type, type);
    assert.equal(t.size, data.length);
  }
  assert.equal(new Tensor(new Float32Array(3)).type, 'float32');
  assert.deepEqual([...new Tensor(new BigInt64Array(6), [2, 3]).dims], [2, 3]);
  assert.throws(() => new Tensor('float32', new Float32Array(5), [2, 3]), /5 elements but dims \[2,3\] need 6/);
  assert.throws(() => new Tensor('int64', new Int32Array(2), [2]), /BigInt64Array/);
  assert.throws(() => new Tensor('complex64', new Float32Array(2), [1]), /unsupported tensor type/);
  const t = new Tensor('float32', [1, 2], [2]);
  t.dispose();
  assert.equal(t.location, 'none');
});

test('int64 and float32 feeds together (silero_vad: state, sr)', async () => {
  const s = await InferenceSession.create(VAD);
  const out = await s.run({
    input: new Tensor('float32', new Float32Array(512), [1, 512]),
    state: new Tensor('float32', new Float32Array(256), [2, 1, 128]),
    sr: new Tensor('int64', BigInt64Array.from([16000n]), []),
  });
  assert.deepEqual([...out.output.dims], [1, 1]);
  assert.ok(out.output.data[0] >= 0 && out.output.data[0] <= 1);
  assert.deepEqual([...out.stateN.dims], [2, 1, 128]);
  await s.release();
});

test('bad input rejects with a clear message and the session stays usable', async () => {
  await assert.rejects(InferenceSession.create(new Uint8Array([8, 1, 18, 3, 1, 2])), (e) => e instanceof Error && e.message.length > 0);
  await assert.rejects(InferenceSession.create(readFileSync(MUL).subarray(0, 40)), Error);
  await assert.rejects(InferenceSession.create(MUL, { executionProviders: ['webnn'] }), /webnn/);
  const s = await InferenceSession.create(MUL);
  const good = { X: new Tensor('float32', new Float32Array(6), [3, 2]) };
  await assert.rejects(s.run({ Z: good.X }), /'Z' is not an input.*X/);
  await assert.rejects(s.run({ X: new Tensor('int32', new Int32Array(6), [3, 2]) }), /X/);
  await assert.rejects(s.run({ X: new Tensor('float32', new Float32Array(4), [2, 2]) }), /X/);
  await assert.rejects(s.run({}), /X/);
  await assert.rejects(s.run({ X: { type: 'float32', data: new Float32Array(6), dims: [3, 2] } }), /not a Tensor/);
  const out = await s.run(good);
  assert.equal(out.Y.size, 6);
  await s.release();
  await assert.rejects(s.run(good), /released/);
});

test('creating and releasing a session 50 times does not grow wasm memory', async () => {
  const bytes = readFileSync(VAD);
  const feeds = {
    input: new Tensor('float32', new Float32Array(512), [1, 512]),
    state: new Tensor('float32', new Float32Array(256), [2, 1, 128]),
    sr: new Tensor('int64', BigInt64Array.from([16000n]), []),
  };
  const sizes = [];
  for (let i = 0; i < 50; i++) {
    const s = await InferenceSession.create(bytes);
    await s.run(feeds);
    await s.release();
    sizes.push(wasmMemoryBytes());
  }
  assert.ok(sizes[4] > 0);
  assert.equal(sizes[49], sizes[4], `wasm memory grew after warm-up: ${sizes.join(',')}`);
});

test('memoryLimit bounds the session with a clear error; memorySnapshot reports its holders', async () => {
  // silero_vad holds about 2 MB of weights
  await assert.rejects(
    InferenceSession.create(VAD, { memoryLimit: 64 * 1024 }),
    /out of memory: .+ asked for \d+ bytes of host memory of session 'spox_graph'/,
  );
  await assert.rejects(InferenceSession.create(VAD, { memoryLimit: -1 }), TypeError);
  const s = await InferenceSession.create(VAD, { memoryLimit: 64 << 20 });
  const snap = s.memorySnapshot();
  const host = snap.tiers[0];
  assert.equal(host.tier, 'host');
  assert.equal(host.limit, 64 << 20);
  assert.ok(host.holders.weights.inUse > 1 << 20, JSON.stringify(host));
  assert.equal(host.inUse, Object.values(host.holders).reduce((a, h) => a + h.inUse, 0));
  const free = await InferenceSession.create(VAD);
  assert.equal(free.memorySnapshot().tiers[0].limit, null);
  await free.release();
  await s.release();
});

test("preferredOutputLocation: validated; on the CPU provider outputs come back on the CPU", async () => {
  await assert.rejects(
    InferenceSession.create(MUL, { preferredOutputLocation: 'texture' }),
    (e) => e instanceof TypeError && /'texture' is not supported/.test(e.message),
  );
  await assert.rejects(
    InferenceSession.create(MUL, { preferredOutputLocation: { Y: 'somewhere' } }),
    TypeError,
  );
  await assert.rejects(
    InferenceSession.create(MUL, { preferredOutputLocation: { Z: 'gpu-buffer' } }),
    /'Z', which is not an output of this model \(outputs: Y\)/,
  );
  for (const pref of ['gpu-buffer', { Y: 'gpu-buffer' }, 'cpu']) {
    const s = await InferenceSession.create(MUL, { preferredOutputLocation: pref });
    const x = new Tensor('float32', Float32Array.from([1, 2, 3, 4, 5, 6]), [3, 2]);
    const out = await s.run({ X: x });
    // nothing ran on a GPU, so nothing stays there
    assert.equal(out.Y.location, 'cpu');
    assert.deepEqual([...(await out.Y.getData())], [1, 4, 9, 16, 25, 36]);
    assert.equal(s.gpuTensors, 0);
    assert.throws(() => out.Y.gpuBuffer, /not on the GPU \(location cpu\)/);
    await s.release();
  }
});

test('asking for threads is reported, not silently dropped', async () => {
  const { env } = await import('../src/index.js');
  const warnings = [];
  const orig = console.warn;
  console.warn = (m) => warnings.push(String(m));
  env.wasm.numThreads = 4;
  try {
    const s = await InferenceSession.create(MUL);
    await s.release();
    assert.match((await runtimeInfo()).note, /numThreads = 4.*1 thread/);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /numThreads = 4/);
  } finally {
    console.warn = orig;
    env.wasm.numThreads = 1;
  }
  assert.equal((await runtimeInfo()).note, null);
});

test('writeNpy writes what NumPy writes, and parseNpy reads it back', async () => {
  const { parseNpy, writeNpy } = await import('../src/npy.js');
  const { readdirSync } = await import('node:fs');
  // NumPy-written reference files of several types and ranks, rewritten byte for byte
  let checked = 0;
  for (const model of ['silero_vad', 'mobilenet_v3_small', 'ort_mul_1']) {
    const dir = join(CORPUS, model, 'ref', readdirSync(join(CORPUS, model, 'ref'))[0]);
    for (const f of readdirSync(dir).filter((f) => f.endsWith('.npy'))) {
      const bytes = readFileSync(join(dir, f));
      const t = parseNpy(bytes);
      assert.deepEqual(Buffer.from(writeNpy(t)), bytes, `${model}/${f}`);
      checked++;
    }
  }
  assert.ok(checked >= 4, `only ${checked} files`);
  for (const [type, data, dims] of [
    ['int8', [-1, 2, -128], [3]],
    ['uint16', [1, 65535], [2, 1]],
    ['int64', [1n, -2n], [1, 2]],
    ['bool', [1, 0, 1, 1], [2, 2]],
    ['float64', [0.5], []],
  ]) {
    const back = parseNpy(writeNpy({ type, data, dims }));
    assert.equal(back.type, type);
    assert.deepEqual(back.dims, dims);
    assert.deepEqual(Array.from(back.data), data);
  }
  assert.throws(() => writeNpy({ type: 'float32', data: [1, 2], dims: [3] }), /2 elements/);
  assert.throws(() => writeNpy({ type: 'string', data: ['a'], dims: [1] }), /cannot write/);
});

test('Tensor.fromGpuBuffer: validated; a session without WebGPU refuses it and has no gpuDevice', async () => {
  const fake = { size: 24, usage: 0x4 | 0x8 | 0x80, label: '' }; // COPY_SRC | COPY_DST | STORAGE
  const t = Tensor.fromGpuBuffer(fake, { dataType: 'float32', dims: [3, 2] });
  assert.equal(t.location, 'gpu-buffer');
  assert.equal(t.gpuBuffer, fake);
  assert.throws(() => t.data, /getData/);
  await assert.rejects(t.getData(), /download/);
  assert.throws(() => Tensor.fromGpuBuffer(fake, { dataType: 'int64', dims: [3] }), TypeError);
  assert.throws(() => Tensor.fromGpuBuffer(fake, { dataType: 'float32', dims: [7] }), /needs 28/);
  assert.throws(() => Tensor.fromGpuBuffer(fake, { dataType: 'float32', dims: [-1] }), RangeError);
  assert.throws(() => Tensor.fromGpuBuffer(null, { dataType: 'float32', dims: [1] }), TypeError);
  // uint8: 5 bytes round up to 8
  assert.throws(() => Tensor.fromGpuBuffer({ size: 5, usage: 0x4 }, { dataType: 'uint8', dims: [5] }), /needs 8/);
  const s = await InferenceSession.create(MUL);
  try {
    assert.equal(s.gpuDevice, null);
    await assert.rejects(s.run({ X: t }), /no GPU provider/);
    await assert.rejects(s.run({ X: new Tensor('float32', new Float32Array(6), [3, 2]) }, { Z: t }), /not an output/);
    assert.equal(s.gpuTensors, 0);
  } finally {
    await s.release();
  }
  let gone = 0;
  Tensor.fromGpuBuffer(fake, { dataType: 'float32', dims: [6], dispose: () => (gone += 1) }).dispose();
  assert.equal(gone, 1);
});
