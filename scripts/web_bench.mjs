// What the web benchmarks share (compare_web.mjs in Chromium, bench_node.mjs in Node):
// onnxruntime-web's pinned install, the median, the markdown table and the --json figures
// (the form scripts/cross-target-report reads).

import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CACHE } from '../js/test/corpus.mjs';

/** onnxruntime-web's version: ORT_WEB_VERSION, default 1.30.0. */
export const ORT_WEB_VERSION = process.env.ORT_WEB_VERSION ?? '1.30.0';

/** onnxruntime-web's dist folder, installed into $NXRT_CACHE/ortweb on first use. */
export function ortWebDist() {
  const ortDir = join(CACHE, 'ortweb');
  const pinned = join(ortDir, 'node_modules', 'onnxruntime-web', 'package.json');
  if (!existsSync(pinned) || JSON.parse(readFileSync(pinned, 'utf8')).version !== ORT_WEB_VERSION) {
    mkdirSync(ortDir, { recursive: true });
    console.error(`installing onnxruntime-web@${ORT_WEB_VERSION} into ${ortDir}`);
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--prefix', ortDir, `onnxruntime-web@${ORT_WEB_VERSION}`], { stdio: 'inherit' });
  }
  return join(ortDir, 'node_modules', 'onnxruntime-web', 'dist');
}

export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/**
 * Prints the table of `rows` ({model, nxrt: [ms], ort: [ms], err: {nxrt?, ort?}, batch}) and,
 * with `jsonOut`, writes their figures with `info`.
 */
export function report(rows, info, jsonOut) {
  console.log('| model | nxrt ms | ORT-web ms | nxrt/ORT | runs per sample |');
  console.log('|---|---:|---:|---:|---:|');
  for (const r of rows) {
    const a = r.err.nxrt ? null : median(r.nxrt);
    const b = r.err.ort ? null : median(r.ort);
    const cell = (v, w) => (v === null ? `error: ${r.err[w]}` : v.toFixed(3));
    console.log(`| ${r.model} | ${cell(a, 'nxrt')} | ${cell(b, 'ort')} | ${a !== null && b !== null ? (a / b).toFixed(2) : '-'} | ${r.batch} |`);
  }
  if (!jsonOut) return;
  const stat = (xs, f) => (xs.length ? f(xs) : null);
  writeFileSync(jsonOut, JSON.stringify({
    info,
    ortWebVersion: ORT_WEB_VERSION,
    rows: rows.map((r) => ({
      model: r.model,
      batch: r.batch,
      err: r.err,
      median_ms: { nxrt: stat(r.nxrt, median), ort: stat(r.ort, median) },
      min_ms: { nxrt: stat(r.nxrt, (x) => Math.min(...x)), ort: stat(r.ort, (x) => Math.min(...x)) },
    })),
  }, null, 1));
}
