// `npm pack` makes a tarball that installs into a fresh project and runs there (ES module
// import by package name, the wasm file found next to the module, the TypeScript types shipped).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO } from './corpus.mjs';

test('npm pack produces an installable package that runs the embedded model', () => {
  const dir = mkdtempSync(join(tmpdir(), 'nxrt-pack-'));
  try {
    const out = execFileSync('npm', ['pack', '--json', '--pack-destination', dir], { cwd: join(REPO, 'js'), encoding: 'utf8' });
    const info = JSON.parse(out)[0];
    const files = info.files.map((f) => f.path);
    for (const f of ['src/index.js', 'src/npy.js', 'src/genai.js', 'src/runtime.js', 'index.d.ts', 'genai.d.ts',
      'wasm/nxrt_wasm.js', 'wasm/nxrt_wasm_bg.wasm', 'wasm/nxrt_wasm_bg.relaxed.wasm',
      'wasm/nxrt_tokenizer.js', 'wasm/nxrt_tokenizer_bg.wasm']) {
      assert.ok(files.includes(f), `${f} is in the tarball (${files.join(', ')})`);
    }
    assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('bench/')), 'tests stay out');
    const app = join(dir, 'app');
    execFileSync('mkdir', ['-p', app]);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', type: 'module', private: true }));
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--offline', join(dir, info.filename)], { cwd: app, stdio: 'ignore' });
    assert.ok(existsSync(join(app, 'node_modules', 'nxrt', 'index.d.ts')));
    writeFileSync(
      join(app, 'main.mjs'),
      `import { InferenceSession, Tensor, embeddedModel } from 'nxrt';
       const s = await InferenceSession.create(await embeddedModel());
       const out = await s.run({ image: new Tensor('float32', new Float32Array(256).fill(0.5), [1, 1, 16, 16]) });
       const p = Array.from(out.probs.data);
       console.log(JSON.stringify({ dims: out.probs.dims, sum: p.reduce((a, b) => a + b, 0) }));
       await s.release();`,
    );
    const r = JSON.parse(execFileSync(process.execPath, ['main.mjs'], { cwd: app, encoding: 'utf8' }));
    assert.deepEqual(r.dims, [1, 10]);
    assert.ok(Math.abs(r.sum - 1) < 1e-5, `softmax output sums to 1: ${r.sum}`);
    // nxrt/genai resolves, and its tokenizer module loads from the installed package
    const vocab = { hello: 0, world: 1, '[UNK]': 2 };
    const tj = { version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
      pre_tokenizer: { type: 'Whitespace' }, post_processor: null, decoder: null,
      model: { type: 'WordLevel', vocab, unk_token: '[UNK]' } };
    writeFileSync(join(app, 'tokenizer.json'), JSON.stringify(tj));
    writeFileSync(
      join(app, 'tok.mjs'),
      `import { Tokenizer } from 'nxrt/genai';
       const t = await Tokenizer.create('tokenizer.json');
       console.log(JSON.stringify(t.encode('hello there world')));`,
    );
    const e = JSON.parse(execFileSync(process.execPath, ['tok.mjs'], { cwd: app, encoding: 'utf8' }));
    assert.deepEqual(e.ids, [0, 2, 1]);
    assert.deepEqual(e.tokens, ['hello', '[UNK]', 'world']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
