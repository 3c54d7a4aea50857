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
