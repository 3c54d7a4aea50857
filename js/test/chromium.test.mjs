// The npm package in headless Chromium (playwright-core), on a page served from 127.0.0.1:
// every public corpus model gives the native outputs, bad input rejects cleanly, and
// create/release cycles do not grow wasm memory.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { CORPUS, REPO, compareOutput, corpusCases, corpusModels, nativeOutputs } from './corpus.mjs';
import { launchChromium, serve } from './server.mjs';

let server, browser, page;

before(async () => {
  server = await serve({ '/': join(REPO, 'js'), '/corpus/': CORPUS, '/test/': join(REPO, 'js', 'test') });
  browser = await launchChromium();
  page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto(`${server.url}/test/page.html`);
  await page.waitForFunction(() => window.pageReady === true, null, { timeout: 30000 }).catch((e) => {
    throw new Error(`test page did not load: ${errors.join('; ') || e.message}`);
  });
});

after(async () => {
  await browser?.close();
  server?.close();
});

function unplain(v) {
  if (v === null) return null;
  if (v.seq) return v.seq.map(unplain);
  if (v.map) return new Map(v.map.map(([k, x]) => [k, typeof x === 'number' ? x : unplain(x)]));
  return v;
}

test('Chromium: runtime uses the relaxed-SIMD build (Chromium has relaxed-SIMD)', async () => {
  const info = await page.evaluate(() => window.info());
  // every Chromium since 114 validates relaxed-SIMD, so the corpus below runs the relaxed build
  assert.equal(await page.evaluate(() => window.relaxed()), true);
  assert.equal(info.simd, 'simd128+relaxed');
});

for (const model of corpusModels()) {
  test(`Chromium: corpus ${model} matches native`, async () => {
    for (const c of corpusCases(model)) {
      const want = nativeOutputs(model, c);
      const got = await page.evaluate(([m, d, i]) => window.runCase(m, d, i), [model, c.case, c.io.inputs]);
      let worst = 0;
      for (const [name, w] of Object.entries(want)) {
        const g = unplain(got[name]);
        if (g && g.type && (g.type === 'int64' || g.type === 'uint64')) g.data = g.data.map(BigInt);
        worst = Math.max(worst, compareOutput(`${model}/${c.case}/${name}`, g, w).maxAbs);
      }
      console.log(`chromium ${model}/${c.case}: max |wasm - native| = ${worst.toExponential(2)}`);
    }
  });
}

// The same models with executionProviders ['webgpu', 'wasm'] on the page's WebGPU adapter
// (SwiftShader here: CPU emulation, so no timing is meant), to the same tolerance.
for (const model of corpusModels()) {
  test(`Chromium WebGPU: corpus ${model} matches native`, async (t) => {
    const adapter = await page.evaluate(() => window.webgpuAdapter());
    if (adapter.none) {
      t.skip(`no WebGPU adapter: ${adapter.none}`);
      return;
    }
    for (const c of corpusCases(model)) {
      const want = nativeOutputs(model, c);
      const got = await page.evaluate(
        ([m, d, i]) => window.runCase(m, d, i, ['webgpu', 'wasm']),
        [model, c.case, c.io.inputs],
      );
      const part = await page.evaluate(() => window.partitionOf());
      let worst = 0;
      for (const [name, w] of Object.entries(want)) {
        const g = unplain(got[name]);
        if (g && g.type && (g.type === 'int64' || g.type === 'uint64')) g.data = g.data.map(BigInt);
        worst = Math.max(worst, compareOutput(`webgpu ${model}/${c.case}/${name}`, g, w).maxAbs);
      }
      console.log(
        `chromium webgpu ${model}/${c.case}: ${part.webgpu} of ${part.nodes} nodes on webgpu, ` +
          `${part.copies} copies, max |webgpu - native| = ${worst.toExponential(2)}`,
      );
    }
  });
}

test('Chromium: bad input rejects with messages; the session stays usable', async () => {
  const r = await page.evaluate(() => window.badInput('ort_mul_1'));
  assert.equal(r.msgs.length, 3);
  assert.ok(r.msgs.every((m) => typeof m === 'string' && m.length > 0 && m !== 'not an Error'));
  assert.match(r.msgs[1], /nope/);
  assert.match(r.msgs[2], /X/);
  assert.deepEqual(r.ok, [2, 4, 6, 8, 10, 12]);
});

test('Chromium: 50 create/release cycles do not grow wasm memory', async () => {
  const sizes = await page.evaluate(() => window.memoryCycle('mobilenet_v3_small', 50));
  assert.equal(sizes[49], sizes[4], `grew after warm-up: ${sizes.join(',')}`);
});
