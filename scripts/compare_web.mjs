// nxrt vs onnxruntime-web (wasm execution provider, 1 thread) on the public corpus, in one
// headless Chromium page, interleaved: for each model, R rounds of (nxrt x K runs, ORT x K
// runs) after a warm-up; prints a markdown table of medians and the nxrt/ORT ratio, plus both
// runtimes' wasm sizes (raw and gzip -9).
//
//   node scripts/compare_web.mjs [--rounds R] [--runs K] [--warmup-ms W] [--models a,b,...] [--webgpu] [--no-relaxed] [--json FILE] [--min-warmup-runs N]
//
// --json FILE also writes the figures (per model: each runtime's median and min ms per run, or
// its error; the browser and wasm files) for scripts/cross-target-report.
//
// Warm-up: each runtime runs for at least W ms (default 8000) and 15 runs before any sample, so
// V8's tier-up (Liftoff to TurboFan, compiled in the background on the other core) has finished
// for the hot functions of both modules; samples taken while it is still under way measure the
// compiler, not the kernels (a few hundred ms of warm-up left tiny_llama bimodal from run to run;
// 3 s still left oww_embedding_model slow in some runs while the other core was busy).
//
// nxrt loads its relaxed-SIMD build where Chromium validates relaxed-SIMD (every current one);
// --no-relaxed keeps it to the SIMD128 build (what a browser without relaxed-SIMD runs). The
// table's header names the build that ran.
//
// --webgpu compares the WebGPU providers instead (nxrt ['webgpu', 'wasm'] vs onnxruntime-web's
// webgpu bundle with ['webgpu', 'wasm']). Headless Chromium's adapter is SwiftShader, a CPU
// emulation of a GPU: those times say how much work each runtime sends the GPU and how it is
// organised, not how fast either would be on real hardware; the table is labelled so.
//
// Needs the wasm build (bash js/build.sh), the corpus, and onnxruntime-web from npm
// (installed into $NXRT_CACHE/ortweb on first use; pinned by ORT_WEB_VERSION, default 1.30.0).

import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { CORPUS, REPO, corpusCases, corpusModels } from '../js/test/corpus.mjs';
import { ORT_WEB_VERSION, median, ortWebDist, report } from './web_bench.mjs';
import { launchChromium, serve } from '../js/test/server.mjs';

const args = process.argv.slice(2);
const opt = (n, d) => (args.includes(n) ? args[args.indexOf(n) + 1] : d);
const ROUNDS = Number(opt('--rounds', 5));
const RUNS = Number(opt('--runs', 10));
const WARM_MS = Number(opt('--warmup-ms', 8000));
const WEBGPU = args.includes('--webgpu');
// the fewest warm-up runs (15: see above); the cross-target report lowers it for SwiftShader's
// WebGPU, whose runs of a larger model take seconds and whose figures are not speed claims
const MIN_WARM_RUNS = Number(opt('--min-warmup-runs', 15));

const ortDist = ortWebDist();
const VERSION = ORT_WEB_VERSION;
const NO_RELAXED = process.argv.includes('--no-relaxed');
const nxWasm = join(REPO, 'js', 'wasm', NO_RELAXED ? 'nxrt_wasm_bg.wasm' : 'nxrt_wasm_bg.relaxed.wasm');
if (!existsSync(nxWasm)) throw new Error('no wasm build: run bash js/build.sh');

const size = (f) => {
  const b = readFileSync(f);
  return { raw: b.length, gz: gzipSync(b, { level: 9 }).length };
};
const mb = (n) => (n / 1e6).toFixed(2);

const models = opt('--models') ? opt('--models').split(',') : corpusModels();
const srv = await serve({ '/': join(REPO, 'js', 'bench'), '/nxrt/': join(REPO, 'js'), '/ort/': ortDist, '/corpus/': CORPUS });
// NXRT_CHROMIUM_ARGS: extra Chromium switches (e.g. --js-flags=...), for both runtimes alike
const browser = await launchChromium((process.env.NXRT_CHROMIUM_ARGS ?? "").split(" ").filter(Boolean));
const rows = [];
let nxIsa = null;
try {
  for (const model of models) {
    // a fresh page per model, so neither runtime inherits the other's heap
    const page = await browser.newPage();
    page.on('pageerror', (e) => console.error(`${model}: page error ${e.message}`));
    const query = [WEBGPU && 'webgpu', NO_RELAXED && 'norelaxed'].filter(Boolean).join('&');
    await page.goto(`${srv.url}/compare.html${query ? `?${query}` : ''}`);
    await page.waitForFunction(() => window.ready === true, null, { timeout: 60000 });
    const c = corpusCases(model)[0];
    const res = { model, nxrt: [], ort: [], err: {}, batch: 1 };
    let fastest = Infinity;
    for (const which of ['nxrt', 'ort']) {
      try {
        await page.evaluate(([w, m, d, i]) => window.load(w, m, d, i), [which, model, c.case, c.io.inputs]);
        // warm-up: at least 15 runs and WARM_MS of running
        const warm = [];
        const t0 = Date.now();
        while (warm.length < MIN_WARM_RUNS || Date.now() - t0 < WARM_MS) {
          warm.push(...(await page.evaluate(([w]) => window.time(w, 5, 1), [which])));
        }
        fastest = Math.min(fastest, median(warm.slice(-5)));
      } catch (e) {
        res.err[which] = e.message.split('\n')[0].slice(0, 120);
      }
    }
    // runs shorter than ~5 ms are timed in batches (the page's timer ticks in 0.1 ms)
    res.batch = Number.isFinite(fastest) ? Math.max(1, Math.min(200, Math.ceil(5 / Math.max(fastest, 0.02)))) : 1;
    for (let r = 0; r < ROUNDS; r++) {
      for (const which of ['nxrt', 'ort']) {
        if (res.err[which]) continue;
        res[which].push(...(await page.evaluate(([w, n, b]) => window.time(w, n, b), [which, RUNS, res.batch])));
      }
    }
    if (!nxIsa) nxIsa = (await page.evaluate(() => window.nxInfo())).simd;
    await page.evaluate(() => window.unload());
    await page.close();
    rows.push(res);
    const fmt = (w) => (res.err[w] ? `error` : median(res[w]).toFixed(3));
    console.error(`${model}: nxrt ${fmt('nxrt')} ms, ort-web ${fmt('ort')} ms`);
  }
} finally {
  await browser.close();
  srv.close();
}

const info = execFileSync('chromium', ['--version'], { encoding: 'utf8' }).trim();
if (WEBGPU) {
  console.log(`\nnxrt ['webgpu', 'wasm'] vs onnxruntime-web ${VERSION} webgpu bundle ['webgpu', 'wasm'], ${info}, headless;`);
  console.log('the adapter is SwiftShader (CPU emulation of a GPU): not GPU speed, see the script header;');
} else {
  console.log(`\nnxrt (wasm, ${nxIsa}, 1 thread) vs onnxruntime-web ${VERSION} (wasm EP, 1 thread), ${info}, headless;`);
}
console.log(`median ms per run over ${ROUNDS} interleaved rounds x ${RUNS} samples each (after ${WARM_MS} ms and at least 15 runs of warm-up per runtime; a sample is one run, or the mean of a batch of runs where a run takes under 5 ms), first reference case's inputs.\n`);
report(rows, `${info}, headless${WEBGPU ? ', WebGPU (SwiftShader)' : `, wasm ${nxIsa}`}`, opt('--json'));
const n = size(nxWasm);
const ortWasm = ['ort-wasm-simd-threaded.jsep.wasm', 'ort-wasm-simd-threaded.asyncify.wasm']
  .map((f) => join(ortDist, f))
  .find((f) => WEBGPU && existsSync(f)) ?? join(ortDist, 'ort-wasm-simd-threaded.wasm');
const o = size(ortWasm);
console.log('\n| wasm file | raw MB | gzip -9 MB |');
console.log('|---|---:|---:|');
console.log(`| nxrt \`${nxWasm.split('/').pop()}\` | ${mb(n.raw)} | ${mb(n.gz)} |`);
console.log(`| onnxruntime-web \`${ortWasm.split('/').pop()}\` | ${mb(o.raw)} | ${mb(o.gz)} |`);
console.log(`| ratio nxrt/ORT | ${(n.raw / o.raw).toFixed(2)} | ${(n.gz / o.gz).toFixed(2)} |`);
