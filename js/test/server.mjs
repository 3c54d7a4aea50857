// A static file server on 127.0.0.1 for the browser tests, the example page and the
// comparison page: `serve({ '/': dir, '/corpus/': dir2 })` -> { url, close() }.

import { createServer } from 'node:http';
import { createReadStream, statSync } from 'node:fs';
import { extname, join, resolve, sep } from 'node:path';

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript',
  '.mjs': 'text/javascript',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.css': 'text/css',
  '.png': 'image/png',
};

export function serve(routes) {
  const table = Object.entries(routes).sort((a, b) => b[0].length - a[0].length);
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    for (const [prefix, dir] of table) {
      if (!path.startsWith(prefix)) continue;
      const root = resolve(dir);
      let file = resolve(join(root, path.slice(prefix.length)));
      if (file !== root && !file.startsWith(root + sep)) break; // no escaping the folder
      try {
        if (statSync(file).isDirectory()) file = join(file, 'index.html');
        const st = statSync(file);
        res.writeHead(200, {
          'content-type': TYPES[extname(file)] ?? 'application/octet-stream',
          'content-length': st.size,
          'cache-control': 'no-store',
        });
        createReadStream(file).pipe(res);
        return;
      } catch {
        break;
      }
    }
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found');
  });
  return new Promise((ok) => {
    server.listen(0, '127.0.0.1', () => {
      ok({ url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() });
    });
  });
}

/** Starts headless Chromium through playwright-core (from $PLAYWRIGHT_CORE_DIR). */
export async function launchChromium(extraArgs = []) {
  const dir = process.env.PLAYWRIGHT_CORE_DIR ?? '/opt/nxrt-tools/node_modules/playwright-core';
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const { chromium } = require(dir);
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-background-networking', '--enable-unsafe-webgpu', ...extraArgs],
  });
}
