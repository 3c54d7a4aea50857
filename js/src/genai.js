// nxrt/genai: text generation with a decoder folder (onnxruntime-genai's layout:
// genai_config.json, the decoder with its external data, tokenizer.json).
//
//   import { TextGenerator } from 'nxrt/genai';
//   const gen = await TextGenerator.create('models/llama/', { executionProviders: ['wasm'] });
//   const { text, tokens, finishReason } = await gen.generate('Once upon a time', { maxNewTokens: 32 });
//   for await (const piece of gen.stream('Hello', { maxNewTokens: 64, stop: ['\n\n'] })) show(piece);
//
// The decode loop is the engine's own (core, in the main wasm module), driven one token per
// call, so the page's event loop runs between tokens. The tokenizer is a separate wasm module
// (wasm/nxrt_tokenizer_bg.wasm) loaded on the first folder that has a tokenizer.json, so
// `nxrt` users who never generate text never download it.

import { wasm, env, ensureWasm, asError, warnThreadsOnce, toUrl, fetchBytes, asBytes, externalFiles } from './runtime.js';

let tokLoading = null;

/** The tokenizer module, loaded once on first use. */
async function tokenizerModule() {
  if (!tokLoading) {
    tokLoading = (async () => {
      const mod = await import('../wasm/nxrt_tokenizer.js');
      // the URL written out whole, so that bundlers see the file
      const url = env.wasm.wasmPaths
        ? new URL('nxrt_tokenizer_bg.wasm', env.wasm.wasmPaths)
        : new URL('../wasm/nxrt_tokenizer_bg.wasm', import.meta.url);
      // a file URL (Node) is read from disk; wasm-bindgen's loader fetches any other
      const src = url.protocol === 'file:' ? await fetchBytes(url, 'tokenizer module') : url;
      await mod.default({ module_or_path: src });
      return mod;
    })().catch((e) => {
      tokLoading = null;
      throw e;
    });
  }
  return tokLoading;
}

/** The bytes of `file` in the folder `base`, or null when it is not there. */
async function optionalFile(base, file) {
  try {
    return await fetchBytes(new URL(file, base), file);
  } catch (e) {
    if (/ENOENT|HTTP 404/.test(e.message)) return null;
    throw e;
  }
}

function folderUrl(src) {
  const u = toUrl(src);
  if (!u.pathname.endsWith('/')) u.pathname += '/';
  return u;
}

/** A file a config names, which must stay inside the folder. */
function inside(base, file) {
  const u = new URL(file, base);
  if (typeof file !== 'string' || file === '' || !u.href.startsWith(base.href)) {
    throw new Error(`genai_config.json: decoder file '${file}' is not inside the folder`);
  }
  return u;
}

/** Decoder files a transformers.js / Optimum folder may hold, in the order they are tried. */
export const HF_DECODER_FILES = [
  'onnx/model.onnx',
  'onnx/decoder_model_merged.onnx',
  'model.onnx',
  'decoder_model_merged.onnx',
  'onnx/decoder_model.onnx',
  'decoder_model.onnx',
];

async function firstDecoder(base) {
  for (const f of HF_DECODER_FILES) {
    const u = new URL(f, base);
    if (u.protocol === 'file:') {
      const { stat } = await import('node:fs/promises');
      if (await stat(u).then((st) => st.isFile(), () => false)) return f;
    } else {
      const r = await fetch(u, { method: 'HEAD' });
      if (r.ok) return f;
    }
  }
  throw new Error(`${base.href}: config.json but no decoder (${HF_DECODER_FILES.join(', ')}); or give options.decoderFile`);
}

/** A tokenizer.json's tokenizer (ids equal HF `tokenizers`'). */
export class Tokenizer {
  #inner;
  #mod;

  constructor(mod, inner) {
    this.#mod = mod;
    this.#inner = inner;
  }

  /** Reads a tokenizer.json from a URL, a path (Node), or its bytes. */
  static async create(src) {
    const mod = await tokenizerModule();
    const bytes = asBytes(src) ?? (await fetchBytes(toUrl(src), 'tokenizer'));
    try {
      return new Tokenizer(mod, new mod.WasmTokenizer(bytes));
    } catch (e) {
      throw asError(e);
    }
  }

  /** `{ids, tokens}` of `text` (special tokens as the post-processor adds them by default). */
  encode(text, { addSpecialTokens = true } = {}) {
    if (typeof text !== 'string') throw new TypeError('encode takes a string');
    return this.#inner.encode(text, addSpecialTokens);
  }

  /** The text of `ids` (special tokens skipped by default). */
  decode(ids, { skipSpecialTokens = true } = {}) {
    return this.#inner.decode(Uint32Array.from(ids), skipSpecialTokens);
  }

  /** Ids, added tokens included. */
  get vocabSize() {
    return this.#inner.vocabSize();
  }

  /** @internal a streaming decoder and a stop-string checker */
  _stream(stops) {
    return [this.#inner.stream(true), new this.#mod.WasmStopText(stops)];
  }
}

/**
 * A chat template (a folder's tokenizer_config.json `chat_template`, or chat_template.jinja),
 * rendered as HF transformers' `apply_chat_template` renders it.
 */
export class ChatTemplate {
  #inner;

  constructor(inner) {
    this.#inner = inner;
  }

  /**
   * The template of a tokenizer_config.json (its text or the parsed object: `chat_template`,
   * `bos_token`, `eos_token`...) and/or a chat_template.jinja text; null when neither has one.
   */
  static async fromConfig(tokenizerConfig, jinja) {
    const mod = await tokenizerModule();
    const cfg = tokenizerConfig == null || typeof tokenizerConfig === 'string'
      ? tokenizerConfig ?? undefined
      : JSON.stringify(tokenizerConfig);
    try {
      const inner = mod.WasmChatTemplate.fromConfig(cfg, jinja ?? undefined);
      return inner ? new ChatTemplate(inner) : null;
    } catch (e) {
      throw asError(e);
    }
  }

  /** The template of a model folder (a URL or, in Node, a path); null when it has none. */
  static async fromFolder(src) {
    const base = folderUrl(src);
    const text = (b) => (b ? new TextDecoder().decode(b) : undefined);
    const cfg = text(await optionalFile(base, 'tokenizer_config.json'));
    const jinja = text(await optionalFile(base, 'chat_template.jinja'));
    return ChatTemplate.fromConfig(cfg, jinja);
  }

  /**
   * The text of `messages` (`[{role, content}]`), with the assistant's turn opened unless
   * `addGenerationPrompt` is false. A template's `raise_exception` throws.
   */
  render(messages, { addGenerationPrompt = true } = {}) {
    if (!Array.isArray(messages)) throw new TypeError('messages is an array of {role, content}');
    try {
      return this.#inner.render(messages, addGenerationPrompt);
    } catch (e) {
      throw asError(e);
    }
  }
}

const GRAMMAR_OPTIONS = { jsonSchema: 'json_schema', regex: 'regex', grammar: 'lark' };

const OPTION_NAMES = new Set([
  ...Object.keys(GRAMMAR_OPTIONS), 'logitsProcessors',
  'maxNewTokens', 'minNewTokens', 'doSample', 'temperature', 'topK', 'topP', 'minP',
  'repetitionPenalty', 'frequencyPenalty', 'presencePenalty', 'noRepeatNgramSize', 'seed',
  'stop', 'prefillChunk',
]);

/** A decoder folder ready to generate text. */
export class TextGenerator {
  #inner;
  #tokenizer;
  #tokenizerBytes;
  #chat;
  #guidance = null;
  #busy = false;

  constructor(inner, tokenizer, loadMs, tokenizerBytes = null, chat = null) {
    this.#inner = inner;
    this.#tokenizer = tokenizer;
    this.#tokenizerBytes = tokenizerBytes;
    this.#chat = chat;
    this.config = inner.config();
    this.loadMs = loadMs;
  }

  /**
   * Loads a model folder from a URL (or, in Node, a path): onnxruntime-genai's
   * (genai_config.json and the decoder it names) or transformers.js / Optimum's (config.json,
   * generation_config.json, the first of `HF_DECODER_FILES`, or `decoderFile`), the decoder's
   * external data, and tokenizer.json when there is one. Options: `executionProviders`
   * (default `['wasm']`; `'webgpu'` too), `graphOptimizationLevel`, `externalData`,
   * `decoderFile`.
   */
  static async create(src, options = {}) {
    const t0 = performance.now();
    await ensureWasm();
    warnThreadsOnce();
    const base = folderUrl(src);
    const providers = (options.executionProviders ?? ['wasm']).map((p) => (typeof p === 'string' ? p : p?.name));
    const level = options.graphOptimizationLevel ?? 'all';
    const load = async (filename) => {
      const modelUrl = inside(base, filename);
      const model = await fetchBytes(modelUrl, 'decoder');
      const [extNames, extData] = await externalFiles(model, options.externalData, modelUrl);
      return [model, extNames, extData];
    };
    let inner;
    const cfgBytes = await optionalFile(base, 'genai_config.json');
    if (cfgBytes) {
      // onnxruntime-genai's folder
      const cfgText = new TextDecoder().decode(cfgBytes);
      let filename;
      try {
        filename = JSON.parse(cfgText)?.model?.decoder?.filename;
      } catch (e) {
        throw new Error(`genai_config.json: ${e.message}`);
      }
      const [model, extNames, extData] = await load(filename);
      try {
        inner = await wasm.WasmGenerator.create(cfgText, model, extNames, extData, providers, level);
      } catch (e) {
        throw asError(e);
      }
    } else {
      // transformers.js / Optimum: config.json, generation_config.json, the decoder file
      const hf = await optionalFile(base, 'config.json');
      if (!hf) {
        throw new Error(`${base.href}: no genai_config.json (onnxruntime-genai) or config.json (transformers.js / Optimum)`);
      }
      const gen = await optionalFile(base, 'generation_config.json');
      const filename = options.decoderFile ?? (await firstDecoder(base));
      const [model, extNames, extData] = await load(filename);
      const text = (b) => (b ? new TextDecoder().decode(b) : undefined);
      try {
        inner = await wasm.WasmGenerator.createHf(
          text(hf), text(gen), filename, model, extNames, extData, providers, level,
        );
      } catch (e) {
        throw asError(e);
      }
    }
    const tokBytes = await optionalFile(base, 'tokenizer.json');
    const tokenizer = tokBytes ? await Tokenizer.create(tokBytes) : null;
    const chat = tokBytes ? await ChatTemplate.fromFolder(base) : null;
    return new TextGenerator(inner, tokenizer, performance.now() - t0, tokBytes, chat);
  }

  /** The folder's tokenizer (null without a tokenizer.json). */
  get tokenizer() {
    return this.#tokenizer;
  }

  /** The folder's chat template (null without one): `{messages}` inputs are rendered by it. */
  get chatTemplate() {
    return this.#chat;
  }

  /** The grammar a generation's options ask for, as a processor (null without one). */
  async #grammar(options) {
    const given = Object.keys(GRAMMAR_OPTIONS).filter((k) => options[k] !== undefined);
    if (given.length === 0) return null;
    if (given.length > 1) throw new Error(`give one of jsonSchema, regex and grammar, not ${given.join(' and ')}`);
    if (!this.#tokenizerBytes) throw new Error(`${given[0]} needs the folder's tokenizer.json`);
    let text = options[given[0]];
    if (given[0] === 'jsonSchema' && typeof text !== 'string') text = JSON.stringify(text);
    if (typeof text !== 'string') throw new TypeError(`option ${given[0]} must be a string`);
    if (!this.#guidance) {
      const mod = await tokenizerModule();
      if (!mod.WasmGuidance) throw new Error('this build of nxrt has no grammar support');
      try {
        this.#guidance = new mod.WasmGuidance(this.#tokenizerBytes, this.config.eosTokenIds);
      } catch (e) {
        throw asError(e);
      }
    }
    try {
      return this.#guidance.grammar(GRAMMAR_OPTIONS[given[0]], text);
    } catch (e) {
      throw asError(e);
    }
  }

  #live() {
    if (!this.#inner) throw new Error('generator was released');
    return this.#inner;
  }

  #promptIds(input) {
    if (typeof input === 'string') {
      if (!this.#tokenizer) throw new Error('a text prompt needs the folder\'s tokenizer.json (give {promptIds})');
      return this.#tokenizer.encode(input).ids;
    }
    if (input && Array.isArray(input.messages)) {
      if (!this.#chat) throw new Error('a {messages} input needs the folder\'s chat template (tokenizer_config.json)');
      // the template writes its special tokens: encoded as written, as transformers does
      return this.#tokenizer.encode(this.#chat.render(input.messages), { addSpecialTokens: false }).ids;
    }
    if (input && Array.isArray(input.promptIds)) return input.promptIds;
    if (input && ArrayBuffer.isView(input.promptIds)) return Array.from(input.promptIds, Number);
    throw new TypeError('input is a string, {promptIds: [...]} or {messages: [{role, content}]}');
  }

  /**
   * The generation as an async iterator: `{id, text}` per token (text: the piece it shows, maybe
   * empty), then a final `{done: result}`.
   */
  async *#run(input, options) {
    for (const k of Object.keys(options)) {
      if (!OPTION_NAMES.has(k)) throw new Error(`unknown generation option '${k}'`);
    }
    const inner = this.#live();
    if (this.#busy) throw new Error('the generator is busy: one generation at a time');
    const stops = options.stop === undefined ? [] : [].concat(options.stop);
    if (stops.some((s) => typeof s !== 'string')) throw new TypeError('stop holds strings');
    if (stops.length && !this.#tokenizer) throw new Error('stop strings need the folder\'s tokenizer.json');
    const user = options.logitsProcessors === undefined ? [] : [].concat(options.logitsProcessors);
    if (user.some((f) => typeof f !== 'function')) throw new TypeError('logitsProcessors holds functions');
    const ids = this.#promptIds(input);
    this.#busy = true;
    let grammar = null;
    let stream = null;
    let stopper = null;
    try {
      grammar = await this.#grammar(options);
      if (this.#tokenizer) [stream, stopper] = this.#tokenizer._stream(stops);
      const processors = grammar ? [(logits, seq) => grammar.process(logits, seq), ...user] : user;
      // each call starts a new sequence (the KV cache is the prompt's own)
      inner.reset();
      await inner.begin(ids, options, processors);
      for (;;) {
        const id = await inner.next();
        if (id === undefined) break;
        let text = '';
        if (stream) {
          const piece = stream.push(id);
          if (piece !== undefined) text = stopper.push(piece);
          if (stopper.stopped()) inner.stop();
        }
        yield { id, text };
      }
      const r = inner.finish();
      if (stopper) {
        if (stopper.stopped()) {
          r.text = stopper.text();
        } else {
          const tail = stopper.finish();
          if (tail) yield { id: undefined, text: tail };
          r.text = this.#tokenizer.decode(r.tokens);
        }
      } else {
        r.text = '';
      }
      yield { done: r };
    } catch (e) {
      throw asError(e);
    } finally {
      stream?.free();
      stopper?.free();
      grammar?.free();
      this.#busy = false;
    }
  }

  /**
   * Generates after `input` (a string, or `{promptIds: [...]}`); resolves to `{promptIds,
   * tokens, text, finishReason, prefillMs, decodeMs, decodeTokensPerS, prefillTokensPerS,
   * kvBytes}`. Options: `maxNewTokens` (128), `minNewTokens`, `doSample` (greedy unless true),
   * `temperature`, `topK`, `topP`, `minP`, `repetitionPenalty`, `frequencyPenalty`,
   * `presencePenalty`, `noRepeatNgramSize`, `seed`, `stop` (strings); constrained decoding by
   * one of `jsonSchema` (an object or its JSON text), `regex` or `grammar` (Lark text); and
   * `logitsProcessors`: functions `(logits: Float32Array, ids: number[]) => void` run at every
   * step after the built-in penalties (and the grammar), changing `logits` in place
   * (`-Infinity` bans an id; a throw ends the generation with that error). `input` may also be
   * `{messages: [{role, content}]}`, rendered by the folder's chat template.
   */
  async generate(input, options = {}) {
    for await (const step of this.#run(input, options)) {
      if (step.done) return step.done;
    }
    throw new Error('generation ended without a result');
  }

  /** The generated text as an async iterator of pieces (options as `generate`'s). */
  async *stream(input, options = {}) {
    for await (const step of this.#run(input, options)) {
      if (step.done) return;
      if (step.text) yield step.text;
    }
  }

  /**
   * Feeds ids after the sequence so far without generating (then `logits()` are those after
   * the last one). With `reset()`, `rewindTo()` and `logits()`, the step-level API.
   */
  async appendTokens(ids) {
    const inner = this.#idle();
    try {
      await inner.appendTokens(Array.from(ids, Number));
    } catch (e) {
      throw asError(e);
    }
  }

  /** The logits after the last id fed (a Float32Array over the vocabulary). */
  logits() {
    return this.#idle().logits();
  }

  /** Every id the KV cache holds (prompt and generated). */
  get ids() {
    return this.#idle().ids();
  }

  /** Keeps the first `n` ids of the sequence and their KV entries. */
  async rewindTo(n) {
    const inner = this.#idle();
    try {
      await inner.rewindTo(n);
    } catch (e) {
      throw asError(e);
    }
  }

  /** Forgets the sequence (an empty KV cache). `generate` and `stream` start from one. */
  reset() {
    this.#idle().reset();
  }

  #idle() {
    const inner = this.#live();
    if (this.#busy) throw new Error('the generator is busy: one generation at a time');
    return inner;
  }

  /** Bytes the KV cache holds now. */
  get kvBytes() {
    return this.#live().kvBytes();
  }

  /** Frees the decoder and its memory now. */
  async release() {
    if (this.#inner) {
      this.#inner.releaseCached();
      this.#inner.free();
      this.#inner = null;
    }
    this.#guidance?.free();
    this.#guidance = null;
    this.#tokenizerBytes = null;
  }
}

export default { TextGenerator, Tokenizer, ChatTemplate, HF_DECODER_FILES };
