// The relaxed-SIMD build in Node: Node 20's V8 validates relaxed-SIMD only behind a flag, so a
// child process with the flag loads `nxrt_wasm_bg.relaxed.wasm` and runs a corpus model; its
// outputs must match the SIMD128 build's (this process) within the corpus tolerance.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { InferenceSession, Tensor, relaxedSimdSupported, runtimeInfo } from '../src/index.js';
import { CORPUS, REPO } from './corpus.mjs';

const MODEL = join(CORPUS, 'mobilenet_v3_small', 'model.onnx');

// A deterministic image-like input (no randomness: both processes make the same one).
const SCRIPT = `
  import { InferenceSession, Tensor, runtimeInfo, env } from ${JSON.stringify(join(REPO, 'js', 'src', 'index.js'))};
  const relaxed = process.argv.at(-1) === 'relaxed';
  env.wasm.relaxedSimd = relaxed ? undefined : false;
  const s = await InferenceSession.create(${JSON.stringify(MODEL)});
  const name = s.inputNames[0];
  const dims = s.inputMetadata[0].shape.map((d) => (typeof d === 'number' ? d : 1));
  const n = dims.reduce((a, b) => a * b, 1);
  const x = new Float32Array(n).map((_, i) => Math.sin(i * 0.37) * 1.5);
  const out = await s.run({ [name]: new Tensor('float32', x, dims) });
  const y = out[s.outputNames[0]];
  const info = await runtimeInfo();
  console.log(JSON.stringify({ simd: info.simd, fallback: info.relaxedFallback, data: Array.from(y.data) }));
`;

function runChild(flags, variant) {
  const out = execFileSync(process.execPath, [...flags, '--input-type=module', '-e', SCRIPT, variant], {
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  });
  return JSON.parse(out);
}

test('the relaxed-SIMD build loads where relaxed-SIMD validates and matches the SIMD128 build', () => {
  const flag = ['--experimental-wasm-relaxed-simd'];
  const relaxed = runChild(flag, 'relaxed');
  const plain = runChild(flag, 'plain');
  assert.equal(relaxed.simd, 'simd128+relaxed', `the relaxed build loads (${relaxed.fallback})`);
  assert.equal(relaxed.fallback, null);
  assert.equal(plain.simd, 'simd128', 'env.wasm.relaxedSimd = false keeps to the SIMD128 build');
  assert.equal(relaxed.data.length, plain.data.length);
  let worst = 0;
  for (let i = 0; i < plain.data.length; i++) {
    const d = Math.abs(relaxed.data[i] - plain.data[i]) / (1e-3 + Math.abs(plain.data[i]));
    worst = Math.max(worst, d);
  }
  assert.ok(worst < 1e-3, `relaxed vs SIMD128 outputs within 1e-3 relative (worst ${worst})`);
});

test('without relaxed-SIMD in the engine the SIMD128 build loads', async () => {
  // this process runs without the flag: Node 20 does not validate relaxed-SIMD by default
  const info = await runtimeInfo();
  assert.equal(info.simd, relaxedSimdSupported() ? 'simd128+relaxed' : 'simd128');
  const s = await InferenceSession.create(join(CORPUS, 'ort_mul_1', 'model.onnx'));
  const out = await s.run({ X: new Tensor('float32', Float32Array.from([1, 2, 3, 4, 5, 6]), [3, 2]) });
  assert.deepEqual(Array.from(out.Y.data), [1, 4, 9, 16, 25, 36]);
  await s.release();
});
