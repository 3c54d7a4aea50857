// Every public corpus model that the native build runs gives the native outputs in Node
// (floats within rtol 1e-3 + atol 1e-4, everything else exactly).

import { test } from 'node:test';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { InferenceSession, Tensor } from '../src/index.js';
import { CORPUS, caseInputs, compareOutput, corpusCases, corpusModels, nativeOutputs } from './corpus.mjs';

for (const model of corpusModels()) {
  test(`corpus ${model} matches native`, async () => {
    const s = await InferenceSession.create(readFileSync(join(CORPUS, model, 'model.onnx')));
    try {
      for (const c of corpusCases(model)) {
        const want = nativeOutputs(model, c);
        const feeds = {};
        for (const [k, v] of Object.entries(caseInputs(c))) feeds[k] = new Tensor(v.type, v.data, v.dims);
        const got = await s.run(feeds);
        let worst = 0;
        for (const [name, w] of Object.entries(want)) {
          worst = Math.max(worst, compareOutput(`${model}/${c.case}/${name}`, got[name], w).maxAbs);
        }
        console.log(`${model}/${c.case}: max |wasm - native| = ${worst.toExponential(2)}`);
      }
    } finally {
      await s.release();
    }
  });
}
