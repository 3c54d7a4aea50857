// Every model of the quantized set (int8 QDQ and QOperator, dynamic int8, MatMulNBits, MXFP4,
// mixture of experts) in Node's wasm build gives ONNX Runtime's outputs within the set's rule,
// judged by the same code as the native build (quant.mjs -> quant_judge).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { InferenceSession, Tensor } from '../src/index.js';
import { parseNpy } from '../src/npy.js';
import { QUANT, judge, quantIo, quantModels } from './quant.mjs';

test('the quantized set is there (11 models or more)', () => {
  assert.ok(quantModels().length >= 11, `found ${quantModels().join(', ')}`);
});

for (const model of quantModels()) {
  test(`quant ${model} matches ONNX Runtime within the rule (wasm, Node)`, async () => {
    const s = await InferenceSession.create(readFileSync(join(QUANT, model, 'model.onnx')));
    try {
      const io = quantIo(model);
      const feeds = {};
      for (const i of io.inputs) {
        const t = parseNpy(readFileSync(join(QUANT, model, 'ref', 'default', i.file)));
        feeds[i.name] = new Tensor(t.type, t.data, t.dims);
      }
      const got = await s.run(feeds);
      const outs = {};
      for (const o of io.outputs) outs[o.name] = got[o.name];
      console.log(`wasm ${model}: ${judge(model, outs)}`);
    } finally {
      await s.release();
    }
  });
}

test('blockWeights and weightCacheLimit: the cached dense arm keeps its copy and gives the codes arm\'s bits', async () => {
  const model = 'mxfp4_matmul_32x1024x1024';
  const bytes = readFileSync(join(QUANT, model, 'model.onnx'));
  await assert.rejects(InferenceSession.create(bytes, { blockWeights: 'dense' }), TypeError);
  await assert.rejects(InferenceSession.create(bytes, { weightCacheLimit: -5 }), TypeError);
  const io = quantIo(model);
  const feeds = {};
  for (const i of io.inputs) {
    const t = parseNpy(readFileSync(join(QUANT, model, 'ref', 'default', i.file)));
    feeds[i.name] = new Tensor(t.type, t.data, t.dims);
  }
  const outputs = {};
  const caches = {};
  for (const [policy, limit] of [['codes', undefined], ['auto', undefined], ['auto', 1024], ['expanded', null]]) {
    const s = await InferenceSession.create(bytes, { blockWeights: policy, weightCacheLimit: limit });
    try {
      await s.run(feeds);
      const got = await s.run(feeds);
      const name = io.outputs[0].name;
      const key = `${policy}/${limit}`;
      outputs[key] = got[name].data;
      caches[key] = s.weightCache();
      judge(model, { [name]: got[name] });
      const held = s.memorySnapshot().tiers[0].holders.dequantized.inUse;
      assert.equal(held, caches[key].bytes, key);
    } finally {
      await s.release();
    }
  }
  assert.equal(caches['codes/undefined'].fills, 0);
  assert.deepEqual([caches['auto/undefined'].fills, caches['auto/undefined'].hits], [1, 1]);
  assert.ok(caches['auto/undefined'].bytes >= 4 * 1024 * 1024, JSON.stringify(caches));
  assert.equal(caches['auto/undefined'].limit, 256 * 1024 * 1024);
  assert.deepEqual([caches['auto/1024'].fills, caches['auto/1024'].bytes], [0, 0]);
  assert.ok(caches['auto/1024'].declined >= 1);
  assert.equal(caches['expanded/null'].limit, null);
  assert.deepEqual(outputs['auto/undefined'], outputs['codes/undefined'], 'the copy gives the codes arm\'s bits');
  assert.deepEqual(outputs['auto/1024'], outputs['codes/undefined']);
});
