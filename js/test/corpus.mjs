// The public corpus (../shared/corpus, fetched into $NXRT_CACHE/corpus) as test cases, with
// the native build's outputs as the reference: `nxrt run --output-dir` writes them once per
// case into $NXRT_CACHE/native-out, keyed by the model file's size and mtime.

import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseNpy } from '../src/npy.js';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const CACHE = process.env.NXRT_CACHE ?? join(homedir(), '.cache', 'nxrt');
export const CORPUS = join(CACHE, 'corpus');
export const RTOL = 1e-3;
export const ATOL = 1e-4;

/** Corpus models issue 01 runs (all but the onnxruntime-genai pair), sorted. */
export function corpusModels() {
  if (!existsSync(join(CORPUS, 'manifest.json'))) {
    throw new Error(`no corpus at ${CORPUS}: run ../shared/corpus/fetch_corpus.sh`);
  }
  return readdirSync(CORPUS)
    .filter((m) => existsSync(join(CORPUS, m, 'model.onnx')) && !m.startsWith('tiny_llama_genai'))
    .sort();
}

/** Reference cases of a model: [{ case, dir, io }]. */
export function corpusCases(model) {
  const refDir = join(CORPUS, model, 'ref');
  return readdirSync(refDir)
    .sort()
    .map((c) => ({ case: c, dir: join(refDir, c), io: JSON.parse(readFileSync(join(refDir, c, 'io.json'), 'utf8')) }));
}

function nxrtBin() {
  const bin = process.env.NXRT_BIN ?? join(REPO, 'target', 'release', 'nxrt');
  if (!existsSync(bin)) throw new Error(`native nxrt not found at ${bin} (cargo build --release, or set NXRT_BIN)`);
  return bin;
}

function safe(name) {
  return name.replace(/[^A-Za-z0-9._-]/g, '_');
}

/**
 * The native build's outputs for one case: { name: {type,data,dims} } for tensor outputs; for
 * non-tensor outputs (ZipMap) the ONNX Runtime JSON reference, which the native parity test
 * checks native against.
 */
export function nativeOutputs(model, c) {
  const st = statSync(join(CORPUS, model, 'model.onnx'));
  const out = join(CACHE, 'native-out', model, c.case);
  const stamp = join(out, 'stamp.json');
  const key = JSON.stringify({ size: st.size, mtime: st.mtimeMs, bin: statSync(nxrtBin()).mtimeMs });
  if (!existsSync(stamp) || readFileSync(stamp, 'utf8') !== key) {
    mkdirSync(out, { recursive: true });
    const args = ['run', join(CORPUS, model, 'model.onnx'), '--output-dir', out];
    for (const i of c.io.inputs) args.push('--input', `${i.name}=${join(c.dir, i.file)}`);
    execFileSync(nxrtBin(), args, { stdio: ['ignore', 'ignore', 'inherit'] });
    writeFileSync(stamp, key);
  }
  const res = {};
  for (const o of c.io.outputs) {
    if (o.file.endsWith('.json')) {
      res[o.name] = { json: JSON.parse(readFileSync(join(c.dir, o.file), 'utf8')) };
    } else {
      res[o.name] = parseNpy(readFileSync(join(out, `${safe(o.name)}.npy`)));
    }
  }
  return res;
}

function half(bits) {
  const s = bits & 0x8000 ? -1 : 1;
  const e = (bits >> 10) & 0x1f;
  const f = bits & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

/**
 * Compares one output (plain `{type, data, dims}` or Tensor-like; or a ZipMap value) against
 * the reference. Returns { maxAbs } or throws with the first mismatch.
 */
export function compareOutput(name, got, want) {
  if (want.json) {
    // ZipMap: an array of Maps (label -> probability) against a list of {label: prob}
    if (!Array.isArray(got) || got.length !== want.json.length) {
      throw new Error(`${name}: expected ${want.json.length} maps, got ${JSON.stringify(got)?.slice(0, 80)}`);
    }
    let maxAbs = 0;
    got.forEach((m, i) => {
      const ref = want.json[i];
      if (!(m instanceof Map) || m.size !== Object.keys(ref).length) throw new Error(`${name}[${i}]: wrong keys`);
      for (const [k, v] of Object.entries(ref)) {
        const g = m.get(Number(k));
        const d = Math.abs(g - v);
        if (!(d <= ATOL + RTOL * Math.abs(v))) throw new Error(`${name}[${i}][${k}]: ${g} vs ${v}`);
        maxAbs = Math.max(maxAbs, d);
      }
    });
    return { maxAbs };
  }
  if (got.type !== want.type) throw new Error(`${name}: type ${got.type}, want ${want.type}`);
  if (JSON.stringify([...got.dims]) !== JSON.stringify([...want.dims])) {
    throw new Error(`${name}: dims [${got.dims}], want [${want.dims}]`);
  }
  const n = want.data.length;
  if (got.data.length !== n) throw new Error(`${name}: ${got.data.length} elements, want ${n}`);
  const float = want.type.startsWith('float');
  let maxAbs = 0;
  for (let i = 0; i < n; i++) {
    let g = got.data[i];
    let w = want.data[i];
    if (want.type === 'float16') [g, w] = [half(g), half(w)];
    if (float) {
      if (Number.isNaN(w) && Number.isNaN(g)) continue;
      if (w === g) continue;
      const d = Math.abs(g - w);
      if (!(d <= ATOL + RTOL * Math.abs(w))) {
        throw new Error(`${name}[${i}]: ${g} vs ${w} (|diff| ${d})`);
      }
      maxAbs = Math.max(maxAbs, d);
    } else if (g !== w) {
      throw new Error(`${name}[${i}]: ${g} vs ${w} (exact)`);
    }
  }
  return { maxAbs };
}

/** The case's inputs as plain `{type, data, dims}` objects keyed by input name. */
export function caseInputs(c) {
  const feeds = {};
  for (const i of c.io.inputs) feeds[i.name] = parseNpy(readFileSync(join(c.dir, i.file)));
  return feeds;
}
