// The browser example page runs a corpus model in headless Chromium without errors and
// leaves a screenshot.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, statSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { CORPUS, REPO } from './corpus.mjs';

test('examples/browser runs mobilenet_v3_small and takes a screenshot', () => {
  const outDir = join(REPO, 'target', 'js-test');
  mkdirSync(outDir, { recursive: true });
  const shot = join(outDir, 'example.png');
  const out = execFileSync(
    process.execPath,
    [join(REPO, 'examples/browser/serve.mjs'), '--models', CORPUS, '--model', 'mobilenet_v3_small/model.onnx', '--screenshot', shot],
    { encoding: 'utf8' },
  );
  assert.match(out, /page status: done: 1 outputs/);
  assert.ok(existsSync(shot) && statSync(shot).size > 10000, 'screenshot written');
});
