// The quantized set (../shared/quant, fetched into $NXRT_CACHE/quant) as test cases: each
// model's reference case, and the judge. Outputs are written as .npy files and judged by the
// native `quant_judge` binary (tests/src/quant.rs), so the wasm builds are held to exactly the
// rule, and the code, that judges the native build against ONNX Runtime's outputs.

import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { writeNpy } from '../src/npy.js';
import { CACHE, REPO } from './corpus.mjs';

export const QUANT = join(CACHE, 'quant');

/** Models of the quantized set, sorted. */
export function quantModels() {
  if (!existsSync(join(QUANT, 'manifest.json'))) {
    throw new Error(`no quantized set at ${QUANT}: run ../shared/quant/fetch_quant.sh`);
  }
  return readdirSync(QUANT)
    .filter((m) => existsSync(join(QUANT, m, 'model.onnx')))
    .sort();
}

/** The reference case's io.json: { inputs: [{name, file}], outputs: [{name, file}] }. */
export function quantIo(model) {
  return JSON.parse(readFileSync(join(QUANT, model, 'ref', 'default', 'io.json'), 'utf8'));
}

function judgeBin() {
  const beside = process.env.NXRT_BIN ? join(dirname(process.env.NXRT_BIN), 'quant_judge') : null;
  const bin = process.env.NXRT_QUANT_JUDGE ?? beside ?? join(REPO, 'target', 'release', 'quant_judge');
  if (!existsSync(bin)) throw new Error(`quant_judge not found at ${bin} (cargo build --release -p nxrt-tests)`);
  return bin;
}

const safe = (name) => name.replace(/[^A-Za-z0-9._-]/g, '_');

/**
 * Writes `outputs` ({ name: {type, data, dims} }) as .npy files and judges them against ONNX
 * Runtime's reference by the set's rule. Returns the judge's report; throws on a violation.
 */
export function judge(model, outputs) {
  const dir = mkdtempSync(join(tmpdir(), 'nxrt-quant-js-'));
  try {
    for (const [name, t] of Object.entries(outputs)) writeFileSync(join(dir, `${safe(name)}.npy`), writeNpy(t));
    try {
      return execFileSync(judgeBin(), [join(QUANT, model), dir], { encoding: 'utf8' }).trim();
    } catch (e) {
      throw new Error(`${model}: ${String(e.stdout ?? '').trim() || e.message}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
