#!/usr/bin/env node
// The ONNX backend node tests on the wasm build, in Node: every case of
// $NXRT_CACHE/conformance (../shared/conformance/fetch-node-tests.sh) through the wasm module's
// `conformanceCase`, which is core's `conformance::check_case`, the same check the native runner
// makes (two runs: the recording run and the planned arena run; the manifest's tolerances).
//
// usage: node scripts/conformance_wasm.mjs [--wasm js/wasm] [--filter A|B] [--out FILE]
//          [--baseline tests/conformance/wasm.json] [--native tests/conformance/native.json]
//
// --baseline: exit 1 when a case recorded there as passing fails now. --native: list the cases
// whose result differs from the native record. Cases run in a child process; a case that traps
// (a panic aborts the wasm instance) or runs past 60 s is recorded as an error and the child is
// restarted at the next case.

import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const CACHE = process.env.NXRT_CACHE ?? join(homedir(), '.cache', 'nxrt');
const CONF = join(CACHE, 'conformance');
const CASE_TIMEOUT_MS = 60_000;

function args() {
  const a = { wasm: join(REPO, 'js', 'wasm'), filter: [], out: null, baseline: null, native: null, child: false, start: 0 };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i++) {
    switch (v[i]) {
      case '--wasm': a.wasm = resolve(v[++i]); break;
      case '--filter': a.filter = v[++i].split('|'); break;
      case '--out': a.out = resolve(v[++i]); break;
      case '--baseline': a.baseline = resolve(v[++i]); break;
      case '--native': a.native = resolve(v[++i]); break;
      case '--child': a.child = true; break;
      case '--start': a.start = Number(v[++i]); break;
      default: console.error(`unknown argument ${v[i]}`); process.exit(2);
    }
  }
  return a;
}

function cases(a) {
  const mpath = join(CONF, 'node_manifest.json');
  if (!existsSync(mpath)) {
    console.error(`${mpath} missing: run ../shared/conformance/fetch-node-tests.sh ${CONF}`);
    process.exit(2);
  }
  const m = JSON.parse(readFileSync(mpath, 'utf8'));
  return {
    onnx: m.onnx_version,
    list: Object.keys(m.cases).sort()
      .filter((n) => a.filter.length === 0 || a.filter.some((f) => n.includes(f)))
      .map((n) => ({ name: n, rtol: m.cases[n].rtol ?? 1e-3, atol: m.cases[n].atol ?? 1e-7 })),
  };
}

function readSet(dir, prefix) {
  const out = [];
  for (let i = 0; existsSync(join(dir, `${prefix}_${i}.pb`)); i++) {
    out.push(new Uint8Array(readFileSync(join(dir, `${prefix}_${i}.pb`))));
  }
  return out;
}

// Child: run cases from --start, one line per event on stdout.
async function child(a) {
  const glue = await import(pathToFileURL(join(a.wasm, 'nxrt_wasm.js')).href);
  glue.initSync({ module: readFileSync(join(a.wasm, 'nxrt_wasm_bg.wasm')) });
  const { list } = cases(a);
  for (let i = a.start; i < list.length; i++) {
    const c = list[i];
    process.stdout.write(JSON.stringify({ start: i }) + '\n');
    const dir = join(CONF, 'node', c.name);
    let rec;
    try {
      const model = new Uint8Array(readFileSync(join(dir, 'model.onnx')));
      const set = join(dir, 'test_data_set_0');
      rec = await glue.conformanceCase(model, readSet(set, 'input'), readSet(set, 'output'), c.rtol, c.atol);
    } catch (e) {
      rec = `error: ${String(e?.message ?? e)}`;
      const p = glue.lastPanic?.();
      if (p) rec += ` (panic: ${p})`;
      process.stdout.write(JSON.stringify({ i, rec: rec.replace(/\s+/g, ' ').slice(0, 300), trapped: true }) + '\n');
      process.exit(3); // the instance may be unusable after a trap: let the parent restart us
    }
    process.stdout.write(JSON.stringify({ i, rec: String(rec).replace(/\s+/g, ' ').slice(0, 300) }) + '\n');
  }
}

function runChild(a, start, results) {
  return new Promise((done) => {
    const argv = [fileURLToPath(import.meta.url), '--child', '--start', String(start), '--wasm', a.wasm];
    if (a.filter.length) argv.push('--filter', a.filter.join('|'));
    const p = spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    let buf = '';
    let current = start;
    let stderr = '';
    let timer = null;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => { results.set(current, 'error: timeout after 60 s'); p.kill('SIGKILL'); }, CASE_TIMEOUT_MS);
    };
    arm();
    p.stdout.on('data', (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        const ev = JSON.parse(line);
        if ('start' in ev) { current = ev.start; arm(); } else results.set(ev.i, ev.rec);
      }
    });
    p.stderr.on('data', (d) => { stderr = (stderr + d).slice(-2000); });
    p.on('exit', () => {
      clearTimeout(timer);
      if (!results.has(current)) {
        results.set(current, `error: wasm instance died: ${stderr.replace(/\s+/g, ' ').slice(-200)}`);
      }
      done(current + 1);
    });
  });
}

async function main() {
  const a = args();
  if (a.child) return child(a);
  if (!existsSync(join(a.wasm, 'nxrt_wasm_bg.wasm'))) {
    console.error(`no wasm build in ${a.wasm}: run js/build.sh`);
    process.exit(2);
  }
  const { onnx, list } = cases(a);
  const t0 = Date.now();
  const results = new Map();
  let next = 0;
  while (next < list.length) {
    next = await runChild(a, next, results);
    while (next < list.length && results.has(next)) next++;
  }
  const recs = new Map(list.map((c, i) => [c.name, results.get(i) ?? 'error: not run']));
  const passing = [...recs].filter(([, r]) => r === 'pass').map(([n]) => n);
  const failing = Object.fromEntries([...recs].filter(([, r]) => r !== 'pass'));
  const nFail = Object.values(failing).filter((r) => r.startsWith('fail')).length;
  console.log(`${passing.length} passed, ${list.length - passing.length} failed (${nFail} wrong or mismatched, ` +
    `${list.length - passing.length - nFail} errors) of ${list.length} cases in ${((Date.now() - t0) / 1000).toFixed(1)} s (wasm, Node ${process.version})`);
  if (a.out) {
    const j = {
      failed: list.length - passing.length, failing_cases: failing, onnx_version: onnx, passed: passing.length,
      passing_cases: passing, suite: 'onnx backend node tests', target: 'wasm-node', total: list.length,
    };
    writeFileSync(a.out, JSON.stringify(j, null, 2) + '\n');
    console.log(`wrote ${a.out}`);
  }
  if (a.native) {
    const nat = JSON.parse(readFileSync(a.native, 'utf8'));
    const natPass = new Set(nat.passing_cases);
    const onlyNative = list.filter((c) => natPass.has(c.name) && recs.get(c.name) !== 'pass');
    const onlyWasm = list.filter((c) => !natPass.has(c.name) && recs.get(c.name) === 'pass');
    console.log(`vs ${a.native}: ${onlyNative.length} pass natively but not in wasm, ${onlyWasm.length} pass in wasm but not natively`);
    for (const c of onlyNative) console.log(`  native only: ${c.name}: ${recs.get(c.name)}`);
    for (const c of onlyWasm) console.log(`  wasm only: ${c.name}`);
  }
  if (a.baseline) {
    const base = JSON.parse(readFileSync(a.baseline, 'utf8'));
    const lost = base.passing_cases.filter((n) => recs.has(n) && recs.get(n) !== 'pass');
    if (lost.length) {
      console.log(`REGRESSION: ${lost.length} case(s) that passed in ${a.baseline} now fail:`);
      for (const n of lost) console.log(`  ${n}: ${recs.get(n)}`);
      process.exit(1);
    }
    console.log(`no regressions against ${a.baseline}`);
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
