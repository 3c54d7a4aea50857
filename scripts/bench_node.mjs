// nxrt's npm package (wasm, 1 thread) vs onnxruntime-web's wasm execution provider (1 thread),
// both in this Node process, on the public corpus, interleaved: for each model, R rounds of
// (nxrt x K samples, ORT x K samples; the order alternating by round) after a warm-up of at
// least W ms and 15 runs per runtime (V8 tiers the hot functions up in that time; see
// compare_web.mjs). A sample is one run, or the mean of a batch where a run takes under 5 ms.
//
//   node scripts/bench_node.mjs [--rounds R] [--runs K] [--warmup-ms W] [--models a,b,...] [--json FILE]
//
// Prints a markdown table of medians and the ratio; --json FILE writes the figures in
// compare_web.mjs's form (scripts/cross-target-report reads both). Needs the wasm build (bash
// js/build.sh), the corpus, and onnxruntime-web (installed into $NXRT_CACHE/ortweb by
// compare_web.mjs's rule: pinned by ORT_WEB_VERSION, default 1.30.0).

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { CORPUS, REPO, corpusCases, corpusModels } from '../js/test/corpus.mjs';
import { ORT_WEB_VERSION, median, ortWebDist, report } from './web_bench.mjs';

const args = process.argv.slice(2);
const opt = (n, d) => (args.includes(n) ? args[args.indexOf(n) + 1] : d);
const ROUNDS = Number(opt('--rounds', 5));
const RUNS = Number(opt('--runs', 10));
const WARM_MS = Number(opt('--warmup-ms', 8000));

const ortDist = ortWebDist();
const VERSION = ORT_WEB_VERSION;
const nx = await import(pathToFileURL(join(REPO, 'js', 'src', 'index.js')).href);
const { parseNpy } = await import(pathToFileURL(join(REPO, 'js', 'src', 'npy.js')).href);
const ort = await import(pathToFileURL(join(ortDist, 'ort.wasm.min.mjs')).href);
ort.env.wasm.numThreads = 1;
ort.env.wasm.proxy = false;
ort.env.wasm.wasmPaths = pathToFileURL(ortDist + '/').href;
ort.env.logLevel = 'error';

const models = opt('--models') ? opt('--models').split(',') : corpusModels();
const rows = [];
for (const model of models) {
  const c = corpusCases(model)[0];
  const bytes = new Uint8Array(readFileSync(join(CORPUS, model, 'model.onnx')));
  const raw = c.io.inputs.map((i) => [i.name, parseNpy(new Uint8Array(readFileSync(join(CORPUS, model, 'ref', c.case, i.file))))]);
  const res = { model, nxrt: [], ort: [], err: {}, batch: 1 };
  const run = {};
  for (const which of ['nxrt', 'ort']) {
    try {
      if (which === 'nxrt') {
        const s = await nx.InferenceSession.create(bytes, { executionProviders: ['wasm'] });
        const feeds = Object.fromEntries(raw.map(([n, t]) => [n, new nx.Tensor(t.type, t.data, t.dims)]));
        run.nxrt = { s, go: () => s.run(feeds) };
      } else {
        const s = await ort.InferenceSession.create(bytes, { executionProviders: ['wasm'], graphOptimizationLevel: 'all' });
        const feeds = Object.fromEntries(raw.map(([n, t]) => [n, new ort.Tensor(t.type, t.data, t.dims)]));
        run.ort = { s, go: () => s.run(feeds) };
      }
    } catch (e) {
      res.err[which] = String(e.message ?? e).split('\n')[0].slice(0, 120);
    }
  }
  // one sample: `batch` runs, mean ms per run
  const sample = async (which, batch) => {
    const t0 = performance.now();
    for (let i = 0; i < batch; i++) await run[which].go();
    return (performance.now() - t0) / batch;
  };
  let fastest = Infinity;
  for (const which of ['nxrt', 'ort']) {
    if (res.err[which]) continue;
    try {
      const warm = [];
      const t0 = performance.now();
      while (warm.length < 15 || performance.now() - t0 < WARM_MS) warm.push(await sample(which, 1));
      fastest = Math.min(fastest, median(warm.slice(-5)));
    } catch (e) {
      res.err[which] = String(e.message ?? e).split('\n')[0].slice(0, 120);
    }
  }
  res.batch = Number.isFinite(fastest) ? Math.max(1, Math.min(200, Math.ceil(5 / Math.max(fastest, 0.02)))) : 1;
  for (let r = 0; r < ROUNDS; r++) {
    for (const which of r % 2 ? ['ort', 'nxrt'] : ['nxrt', 'ort']) {
      if (res.err[which]) continue;
      for (let k = 0; k < RUNS; k++) res[which].push(await sample(which, res.batch));
    }
  }
  for (const w of ['nxrt', 'ort']) await run[w]?.s.release?.();
  rows.push(res);
  const fmt = (w) => (res.err[w] ? 'error' : median(res[w]).toFixed(3));
  console.error(`${model}: nxrt ${fmt('nxrt')} ms, ort-web ${fmt('ort')} ms`);
}

const info = `Node ${process.version}, nxrt wasm ${(await nx.runtimeInfo()).simd}, onnxruntime-web ${VERSION} wasm EP`;
console.log(`\n${info}, 1 thread each; median ms per run over ${ROUNDS} interleaved rounds x ${RUNS} samples (after ${WARM_MS} ms and 15 runs of warm-up per runtime).\n`);
report(rows, info, opt('--json'));
