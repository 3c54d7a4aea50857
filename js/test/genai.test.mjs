// nxrt/genai in Node against references nobody here wrote:
// - greedy ids equal onnxruntime-genai 0.18's ($NXRT_CACHE/genai/refs.json) on every fp32
//   reference model and prompt; int4 prompts are teacher-forced (the reference id within
//   INT4_SLACK of the best logit at every step; see tests/tests/genai_refs.rs for why int4
//   free-running generations may take the other branch at a narrow step);
// - the tokenizer module's ids, tokens and decoded text equal HF tokenizers' on every reference
//   tokenizer and text ($NXRT_CACHE/genai/tokenizers/refs.json);
// and against the native build: the same seed samples the same ids in wasm as natively.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TextGenerator, Tokenizer } from '../src/genai.js';
import { InferenceSession } from '../src/index.js';
import { CACHE, REPO } from './corpus.mjs';

const INT4_SLACK = 5e-2;

function refs() {
  const p = join(CACHE, 'genai', 'refs.json');
  if (!existsSync(p)) throw new Error(`no ${p}: run ../shared/genai/fetch_genai.sh`);
  return JSON.parse(readFileSync(p, 'utf8'));
}

function argmax(a) {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

function nxrtBin() {
  const bin = process.env.NXRT_BIN ?? join(REPO, 'target', 'release', 'nxrt');
  if (!existsSync(bin)) throw new Error(`native nxrt not found at ${bin}`);
  return bin;
}

function nativeJson(args) {
  const out = execFileSync(nxrtBin(), args, { encoding: 'utf8', maxBuffer: 1 << 26 });
  const lines = out.trim().split('\n');
  return JSON.parse(lines[lines.length - 1]);
}

const r = refs();
const dirOf = (name) => join(CACHE, r.models[name].dir);

for (const [name, m] of Object.entries(r.models)) {
  test(`${name}: greedy ids equal onnxruntime-genai's (wasm)`, async () => {
    const gen = await TextGenerator.create(dirOf(name));
    try {
      let exact = 0;
      for (const c of m.cases) {
        const n = c.tokens.length;
        const got = await gen.generate({ promptIds: c.prompt_ids }, { maxNewTokens: n, minNewTokens: n });
        assert.deepEqual(got.promptIds, c.prompt_ids);
        assert.equal(got.finishReason, 'length');
        if (JSON.stringify(got.tokens) === JSON.stringify(c.tokens)) exact++;
        else if (m.precision !== 'int4') assert.deepEqual(got.tokens, c.tokens, `prompt of ${c.prompt_ids.length} ids`);
      }
      if (m.precision === 'int4') {
        // teacher-forced: per-step logits through the low-level API
        for (const c of m.cases) {
          gen.reset();
          await gen.appendTokens(c.prompt_ids);
          for (const [i, want] of c.tokens.entries()) {
            const logits = gen.logits();
            const best = logits[argmax(logits)];
            assert.ok(best - logits[want] <= INT4_SLACK,
              `${name} prompt of ${c.prompt_ids.length}: step ${i}: reference ${want} is ${best - logits[want]} below the best`);
            await gen.appendTokens([want]);
          }
        }
      }
      console.log(`${name}: ${exact} of ${m.cases.length} prompts give exactly onnxruntime-genai's ids`);
    } finally {
      await gen.release();
    }
  });
}

test('tokenizer module: ids, tokens and text equal HF tokenizers on every reference', async () => {
  const dir = join(CACHE, 'genai', 'tokenizers');
  const t = JSON.parse(readFileSync(join(dir, 'refs.json'), 'utf8'));
  const texts = new Map(t.texts.map((x) => [x.name, x.text]));
  let n = 0;
  for (const [name, tk] of Object.entries(t.tokenizers)) {
    let path = join(CACHE, 'genai', tk.path);
    if (!path.endsWith('.json')) path = join(path, 'tokenizer.json');
    const tok = await Tokenizer.create(path);
    for (const c of tk.cases) {
      const e = tok.encode(texts.get(c.name));
      assert.deepEqual(e.ids, c.ids, `${name}/${c.name}: ids`);
      assert.deepEqual(e.tokens, c.tokens, `${name}/${c.name}: tokens`);
      assert.equal(tok.decode(c.ids), c.decoded, `${name}/${c.name}: decoded`);
      n++;
    }
  }
  assert.ok(n >= 160, `${n} cases`);
  console.log(`${n} texts encoded and decoded as HF tokenizers does`);
});

test('text generation: streamed pieces, stop strings, seeded sampling equal to native', async () => {
  const dir = dirOf('tiny_llama_genai_fp32');
  const gen = await TextGenerator.create(dir);
  try {
    assert.ok(gen.tokenizer, 'the folder has a tokenizer.json');
    const prompt = 'The meaning of life is';
    const full = await gen.generate(prompt, { maxNewTokens: 24, minNewTokens: 24 });
    assert.deepEqual(full.promptIds, gen.tokenizer.encode(prompt).ids);
    assert.equal(full.text, gen.tokenizer.decode(full.tokens));
    assert.ok(full.text.length > 8, `text ${JSON.stringify(full.text)}`);
    // native greedy on the same text prompt: same ids, same text
    const nat = nativeJson(['generate', dir, '--prompt', prompt, '--max-new-tokens', '24', '--min-new-tokens', '24', '--json']);
    assert.deepEqual(full.tokens, nat.tokens);
    assert.equal(full.text, nat.text);

    let joined = '';
    for await (const piece of gen.stream(prompt, { maxNewTokens: 24, minNewTokens: 24 })) joined += piece;
    assert.equal(joined, full.text);

    // a stop string from the middle of the text: cut before it, finish 'stop', stream agrees
    const stop = full.text.slice(6, 10);
    const cut = full.text.slice(0, full.text.indexOf(stop));
    const stopped = await gen.generate(prompt, { maxNewTokens: 24, stop: [stop] });
    assert.equal(stopped.finishReason, 'stop');
    assert.equal(stopped.text, cut);
    assert.ok(stopped.tokens.length < 24);
    let shown = '';
    for await (const piece of gen.stream(prompt, { maxNewTokens: 24, stop })) shown += piece;
    assert.equal(shown, cut);

    // seeded sampling: same seed, same ids; the native build draws the same ones
    const opts = { maxNewTokens: 20, minNewTokens: 20, doSample: true, temperature: 0.9, topK: 50, topP: 0.95, seed: 7 };
    const a = await gen.generate({ promptIds: [1, 450, 6593] }, opts);
    const b = await gen.generate({ promptIds: [1, 450, 6593] }, opts);
    assert.deepEqual(a.tokens, b.tokens);
    const c = await gen.generate({ promptIds: [1, 450, 6593] }, { ...opts, seed: 8 });
    assert.notDeepEqual(a.tokens, c.tokens);
    const ns = nativeJson(['generate', dir, '--prompt-ids', '1,450,6593', '--max-new-tokens', '20', '--min-new-tokens', '20',
      '--sample', '--temperature', '0.9', '--top-k', '50', '--top-p', '0.95', '--seed', '7', '--json']);
    assert.deepEqual(a.tokens, ns.tokens);

    for (const k of ['prefillMs', 'decodeMs', 'decodeTokensPerS', 'prefillTokensPerS', 'kvBytes']) {
      assert.ok(typeof full[k] === 'number' && full[k] >= 0, `${k}: ${full[k]}`);
    }
    assert.ok(full.kvBytes > 0 && full.decodeTokensPerS > 0 && full.prefillMs > 0, 'timings are measured');

    await assert.rejects(gen.generate(prompt, { maxNewToken: 3 }), /unknown generation option 'maxNewToken'/);
    await assert.rejects(gen.generate({ promptIds: [1, 99999999] }, { maxNewTokens: 2 }), /outside the vocabulary/);
    await assert.rejects(gen.generate(prompt, { temperature: -1, doSample: true }), /temperature/);
    // the generator still works after the errors
    const again = await gen.generate(prompt, { maxNewTokens: 24, minNewTokens: 24 });
    assert.deepEqual(again.tokens, full.tokens);
  } finally {
    await gen.release();
  }
});

test('a folder without tokenizer.json takes ids only; external data is required', async () => {
  const src = dirOf('tiny_llama_genai_fp32');
  const dir = mkdtempSync(join(tmpdir(), 'nxrt-genai-'));
  try {
    for (const f of ['genai_config.json', 'model.onnx', 'model.onnx.data']) symlinkSync(join(src, f), join(dir, f));
    const gen = await TextGenerator.create(dir);
    assert.equal(gen.tokenizer, null);
    await assert.rejects(gen.generate('hi'), /tokenizer\.json/);
    const g = await gen.generate({ promptIds: [1, 2, 3] }, { maxNewTokens: 3 });
    assert.equal(g.text, '');
    assert.equal(g.tokens.length, 3);
    await gen.release();
    // the decoder from bytes names its external file: an error unless it is given
    const model = readFileSync(join(src, 'model.onnx'));
    await assert.rejects(InferenceSession.create(model), /model\.onnx\.data.*externalData/);
    const s = await InferenceSession.create(model, {
      externalData: [{ path: 'model.onnx.data', data: readFileSync(join(src, 'model.onnx.data')) }],
    });
    assert.ok(s.inputNames.includes('input_ids'));
    await s.release();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a transformers.js / Optimum folder (config.json, onnx/model.onnx) gives onnxruntime-genai\'s ids for the same weights', async () => {
  // the corpus's torch export of the seeded tiny Llama that tiny_llama_genai_fp32 was built from
  const src = join(CACHE, 'corpus', 'tiny_llama');
  const meta = JSON.parse(readFileSync(join(src, 'tiny_llama_meta.json'), 'utf8'));
  const m = r.models.tiny_llama_genai_fp32;
  const dir = mkdtempSync(join(tmpdir(), 'nxrt-optimum-'));
  try {
    mkdirSync(join(dir, 'onnx'));
    writeFileSync(join(dir, 'config.json'), JSON.stringify({
      ...meta.config, model_type: 'llama', bos_token_id: m.bos_token_id, eos_token_id: m.eos_token_id,
    }));
    symlinkSync(join(src, 'model.onnx'), join(dir, 'onnx', 'model.onnx'));
    const gen = await TextGenerator.create(dir);
    try {
      assert.equal(gen.config.modelType, 'llama');
      assert.deepEqual(gen.config.eosTokenIds, [].concat(m.eos_token_id));
      for (const c of m.cases) {
        const n = c.tokens.length;
        const got = await gen.generate({ promptIds: c.prompt_ids }, { maxNewTokens: n, minNewTokens: n });
        assert.deepEqual(got.tokens, c.tokens, `prompt of ${c.prompt_ids.length} ids`);
      }
    } finally {
      await gen.release();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
