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
import { copyFileSync, existsSync, linkSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ChatTemplate, TextGenerator, Tokenizer } from '../src/genai.js';
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

test('grammars (regex, JSON schema, Lark) give the native build\'s ids and text that parses', async () => {
  const dir = dirOf('llama_bench_fp32');
  const gen = await TextGenerator.create(dir);
  try {
    const prompt = 'Name:';
    const free = await gen.generate(prompt, { maxNewTokens: 24 });
    const rx = '[A-Z][a-z]{2,7} [A-Z][a-z]{2,9}';
    const full = new RegExp(`^(?:${rx})$`);
    assert.ok(!full.test(free.text), `the free text already matches: ${JSON.stringify(free.text)}`);
    const schema = {
      type: 'array', items: { type: 'integer', minimum: 0, maximum: 99 }, minItems: 2, maxItems: 4,
      'x-guidance': { whitespace_flexible: false },
    };
    const lark = 'start: word "."\nword: "ab" | "ba" | "aab"\n';
    const cases = [
      [{ regex: rx }, ['--regex', rx], (t) => assert.match(t, full)],
      [{ jsonSchema: schema }, ['--json-schema', JSON.stringify(schema)], (t) => {
        const v = JSON.parse(t);
        assert.ok(Array.isArray(v) && v.length >= 2 && v.length <= 4, t);
        assert.ok(v.every((x) => Number.isInteger(x) && x >= 0 && x <= 99), t);
      }],
      [{ grammar: lark }, null, (t) => assert.ok(['ab.', 'ba.', 'aab.'].includes(t), t)],
    ];
    const larkFile = join(mkdtempSync(join(tmpdir(), 'nxrt-lark-')), 'g.lark');
    writeFileSync(larkFile, lark);
    cases[2][1] = ['--grammar', larkFile];
    for (const [opt, flags, check] of cases) {
      const got = await gen.generate(prompt, { maxNewTokens: 40, ...opt });
      check(got.text);
      assert.equal(got.finishReason, 'eos', JSON.stringify(got));
      const nat = nativeJson(['generate', dir, '--prompt', prompt, '--max-new-tokens', '40', ...flags, '--json']);
      assert.deepEqual(got.tokens, nat.tokens, `${Object.keys(opt)[0]}: the native build's ids`);
      assert.equal(got.text, nat.text);
      let streamed = '';
      for await (const piece of gen.stream(prompt, { maxNewTokens: 40, ...opt })) streamed += piece;
      assert.equal(streamed, got.text);
    }
    await assert.rejects(gen.generate(prompt, { regex: '(unclosed' }), /grammar/);
    await assert.rejects(gen.generate(prompt, { regex: 'a', grammar: 'start: "a"' }), /one of jsonSchema, regex and grammar/);
    // the generator still works after the errors
    assert.deepEqual((await gen.generate(prompt, { maxNewTokens: 24 })).tokens, free.tokens);
  } finally {
    await gen.release();
  }
});

test('logits processors see every step and steer the choice; a throw ends the generation', async () => {
  const gen = await TextGenerator.create(dirOf('tiny_llama_genai_fp32'));
  try {
    const prompt = [1, 450, 6593];
    const base = await gen.generate({ promptIds: prompt }, { maxNewTokens: 6, minNewTokens: 6 });
    const seen = [];
    const forced = [100, 200, 300, 400, 500, 600];
    const force = (logits, ids) => {
      seen.push(ids.slice());
      const want = forced[ids.length - prompt.length];
      logits.fill(-Infinity);
      logits[want] = 0;
    };
    const got = await gen.generate({ promptIds: prompt }, { maxNewTokens: 6, minNewTokens: 6, logitsProcessors: force });
    assert.deepEqual(got.tokens, forced);
    assert.equal(seen.length, 6);
    seen.forEach((ids, i) => assert.deepEqual(ids, [...prompt, ...forced.slice(0, i)]));
    // a ban only: the runner-up at the first step (compared with the logits directly)
    gen.reset();
    await gen.appendTokens(prompt);
    const logits = gen.logits();
    gen.reset();
    const best = argmax(logits);
    assert.equal(best, base.tokens[0]);
    logits[best] = -Infinity;
    const ban = (l, ids) => { if (ids.length === prompt.length) l[best] = -Infinity; };
    const banned = await gen.generate({ promptIds: prompt }, { maxNewTokens: 1, minNewTokens: 1, logitsProcessors: [ban] });
    assert.deepEqual(banned.tokens, [argmax(logits)]);
    await assert.rejects(
      gen.generate({ promptIds: prompt }, { maxNewTokens: 4, logitsProcessors: () => { throw new Error('no more'); } }),
      /no more/,
    );
    await assert.rejects(gen.generate({ promptIds: prompt }, { logitsProcessors: [42] }), /functions/);
    assert.deepEqual((await gen.generate({ promptIds: prompt }, { maxNewTokens: 6, minNewTokens: 6 })).tokens, base.tokens);
  } finally {
    await gen.release();
  }
});

test('chat templates render as transformers does; {messages} prompts equal the native --chat', async () => {
  const p = join(CACHE, 'genai', 'chat_refs.json');
  if (!existsSync(p)) throw new Error(`no ${p}: run scripts/chat_refs.py (the test command does)`);
  const refsChat = JSON.parse(readFileSync(p, 'utf8'));
  const folder = join(CACHE, refsChat.folder);
  const tok = await Tokenizer.create(join(folder, 'tokenizer.json'));
  const own = await ChatTemplate.fromFolder(folder);
  assert.ok(own, 'the llama3 folder has a template');
  const templates = {};
  for (const [name, src] of Object.entries(refsChat.templates)) {
    templates[name] = await ChatTemplate.fromConfig({ chat_template: src, ...refsChat.tokens });
  }
  let n = 0;
  for (const c of refsChat.cases) {
    const t = templates[c.template] ?? own;
    const opts = { addGenerationPrompt: c.add_generation_prompt };
    if (c.error !== undefined) {
      assert.throws(() => t.render(c.messages, opts), undefined, `${c.template}: HF raises ${c.error}`);
      continue;
    }
    const text = t.render(c.messages, opts);
    assert.equal(text, c.text, `${c.template} ${JSON.stringify(c.messages)}`);
    assert.deepEqual(tok.encode(text, { addSpecialTokens: false }).ids, c.ids);
    n++;
  }
  assert.ok(n >= 30, `${n} cases`);
  assert.equal(await ChatTemplate.fromConfig('{"bos_token": "<s>"}'), null);

  // a decoder folder with a template: {messages} as the prompt, as `nxrt generate --chat`
  // (files linked or copied: a symbolic link to the data would resolve outside the folder)
  const src = dirOf('tiny_llama_genai_fp32');
  const dir = mkdtempSync(join(tmpdir(), 'nxrt-chat-'));
  for (const f of ['genai_config.json', 'model.onnx', 'model.onnx.data', 'tokenizer.json']) {
    try {
      linkSync(join(src, f), join(dir, f));
    } catch {
      copyFileSync(join(src, f), join(dir, f));
    }
  }
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({
    chat_template: refsChat.templates.im_blocks, bos_token: '<s>', eos_token: '</s>',
  }));
  const gen = await TextGenerator.create(dir);
  try {
    assert.ok(gen.chatTemplate);
    const got = await gen.generate({ messages: [{ role: 'user', content: 'Why is the sky blue?' }] }, { maxNewTokens: 12 });
    const nat = nativeJson(['generate', dir, '--chat', 'Why is the sky blue?', '--max-new-tokens', '12', '--json']);
    assert.deepEqual(got.promptIds, nat.prompt_ids);
    assert.deepEqual(got.tokens, nat.tokens);
  } finally {
    await gen.release();
    rmSync(dir, { recursive: true, force: true });
  }
});
