// Serves the example page on 127.0.0.1 (the npm package under /nxrt/, models from a folder
// under /models/).
//
//   node examples/browser/serve.mjs [--models DIR]                 serve until Ctrl-C
//   node examples/browser/serve.mjs --models DIR --screenshot OUT.png --model REL/PATH.onnx
//        load REL/PATH.onnx from DIR in headless Chromium, run it, save a screenshot, and
//        exit 0 only if the page reports that the model ran without errors.

import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { serve, launchChromium } from '../../js/test/server.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const models = resolve(opt('--models') ?? '.');
const srv = await serve({ '/': HERE, '/nxrt/': join(HERE, '../../js'), '/models/': models });

if (!opt('--screenshot')) {
  console.log(`open ${srv.url}/  (models from ${models} under ${srv.url}/models/)`);
} else {
  const browser = await launchChromium();
  let code = 1;
  try {
    const page = await browser.newPage({ viewport: { width: 1100, height: 800 } });
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    await page.goto(`${srv.url}/?model=/models/${opt('--model')}&autorun=1`);
    await page.waitForFunction(
      () => /^(done|error)/.test(document.getElementById('status').textContent),
      null,
      { timeout: 120000 },
    );
    const status = await page.textContent('#status');
    await page.screenshot({ path: opt('--screenshot'), fullPage: true });
    console.log(`page status: ${status}`);
    if (errors.length) console.log(`page errors: ${errors.join('; ')}`);
    code = status.startsWith('done') && errors.length === 0 ? 0 : 1;
  } finally {
    await browser.close();
    srv.close();
  }
  process.exit(code);
}
