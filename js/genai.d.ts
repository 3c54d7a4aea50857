// Types for `nxrt/genai`: text generation with an onnxruntime-genai model folder.

export interface GeneratorOptions {
  /** Providers in preference order: 'webgpu', 'wasm' (alias 'cpu'). Default ['wasm']. */
  executionProviders?: (string | { name: string })[];
  graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /** External-data files of the decoder given directly (others are fetched beside it). */
  externalData?: { path: string; data: Uint8Array | ArrayBuffer | string | URL }[];
  /** A transformers.js / Optimum folder's decoder file (default: the first of HF_DECODER_FILES it holds). */
  decoderFile?: string;
}

/** Decoder files a transformers.js / Optimum folder may hold, in the order they are tried. */
export declare const HF_DECODER_FILES: readonly string[];

export interface GenerationOptions {
  /** New tokens at most (default 128). */
  maxNewTokens?: number;
  /** End-of-sequence ids are ignored until this many new tokens exist. */
  minNewTokens?: number;
  /** Sample with the options below; greedy (ties to the lowest id) otherwise. */
  doSample?: boolean;
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  /** HF's repetition penalty. */
  repetitionPenalty?: number;
  /** OpenAI's frequency and presence penalties. */
  frequencyPenalty?: number;
  presencePenalty?: number;
  /** Never repeat an n-gram of this size (HF's no_repeat_ngram_size). */
  noRepeatNgramSize?: number;
  /** The same seed gives the same ids on every target. */
  seed?: number;
  /** Stop strings: the generation ends at the first one, which the text does not include. */
  stop?: string | string[];
  /** Prompt tokens per prefill run (default 512; 0: the whole prompt in one run). */
  prefillChunk?: number;
  /** Constrained decoding (one of the three): the output is one JSON value valid against this schema. */
  jsonSchema?: object | string;
  /** Constrained decoding: the whole output matches this regular expression. */
  regex?: string;
  /** Constrained decoding: the output follows this Lark grammar (llguidance's dialect). */
  grammar?: string;
  /**
   * Run at every step after the built-in penalties and the grammar, in order: change `logits`
   * in place (-Infinity bans an id); `ids` is every id so far. A throw ends the generation.
   */
  logitsProcessors?: LogitsProcessor | LogitsProcessor[];
}

export type LogitsProcessor = (logits: Float32Array, ids: number[]) => void;

export interface ChatMessage {
  role: string;
  content: string;
}

/** A chat template, rendered as HF transformers' apply_chat_template renders it. */
export declare class ChatTemplate {
  /** From a tokenizer_config.json (text or object) and/or a chat_template.jinja text; null without a template. */
  static fromConfig(tokenizerConfig?: string | object | null, jinja?: string | null): Promise<ChatTemplate | null>;
  /** A model folder's template (URL or path); null without one. */
  static fromFolder(folder: string | URL): Promise<ChatTemplate | null>;
  render(messages: readonly ChatMessage[], options?: { addGenerationPrompt?: boolean }): string;
}

export interface GenerationResult {
  promptIds: number[];
  /** The generated ids only. */
  tokens: number[];
  /** The generated text (special tokens skipped; '' without a tokenizer.json). */
  text: string;
  finishReason: 'length' | 'eos' | 'stop';
  prefillMs: number;
  decodeMs: number;
  decodeTokensPerS: number;
  prefillTokensPerS: number;
  kvBytes: number;
}

export type GenerationInput =
  | string
  | { promptIds: readonly number[] | Int32Array | Uint32Array }
  /** Rendered by the folder's chat template with the assistant's turn opened. */
  | { messages: readonly ChatMessage[] };

export interface DecoderInfo {
  modelType: string;
  vocabSize: number;
  contextLength: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headSize: number;
  bosTokenId: number | null;
  eosTokenIds: number[];
  padTokenId: number | null;
  search: {
    maxLength: number | null; minLength: number; doSample: boolean; temperature: number;
    topK: number; topP: number; repetitionPenalty: number;
  };
}

/** A tokenizer.json's tokenizer (ids equal HF tokenizers'). */
export declare class Tokenizer {
  static create(src: string | URL | Uint8Array | ArrayBuffer): Promise<Tokenizer>;
  encode(text: string, options?: { addSpecialTokens?: boolean }): { ids: number[]; tokens: string[] };
  decode(ids: readonly number[] | Uint32Array, options?: { skipSpecialTokens?: boolean }): string;
  readonly vocabSize: number;
}

/** A decoder folder ready to generate text. */
export declare class TextGenerator {
  /** Loads a folder (URL or path): genai_config.json (onnxruntime-genai) or config.json (transformers.js / Optimum), the decoder with its external data, tokenizer.json. */
  static create(folder: string | URL, options?: GeneratorOptions): Promise<TextGenerator>;
  readonly config: DecoderInfo;
  readonly loadMs: number;
  readonly tokenizer: Tokenizer | null;
  /** The folder's chat template (null without one). */
  readonly chatTemplate: ChatTemplate | null;
  /** Generates after the input (each call starts a new sequence). */
  generate(input: GenerationInput, options?: GenerationOptions): Promise<GenerationResult>;
  /** The generated text as it is decoded. */
  stream(input: GenerationInput, options?: GenerationOptions): AsyncGenerator<string, void, unknown>;
  /** Step level: feed ids, read the logits after the last one, rewind, reset. */
  appendTokens(ids: readonly number[] | Int32Array | Uint32Array): Promise<void>;
  logits(): Float32Array;
  readonly ids: number[];
  rewindTo(n: number): Promise<void>;
  reset(): void;
  readonly kvBytes: number;
  release(): Promise<void>;
}

declare const _default: {
  TextGenerator: typeof TextGenerator; Tokenizer: typeof Tokenizer; ChatTemplate: typeof ChatTemplate;
  HF_DECODER_FILES: readonly string[];
};
export default _default;
