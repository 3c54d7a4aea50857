// Runs a wasm32-wasip1 test binary (cargo's test harness) under Node's WASI:
//   node scripts/wasi_run.mjs FILE.wasm [test-filter and harness args...]
// The exit status is the harness's. Used to run core's SIMD tests on the SIMD128
// instantiation (see scripts/test.sh).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';

const [file, ...args] = process.argv.slice(2);
if (!file) {
  console.error('usage: node scripts/wasi_run.mjs FILE.wasm [args...]');
  process.exit(2);
}
const wasi = new WASI({ version: 'preview1', args: [file, ...args], env: {}, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exit(wasi.start(instance));
