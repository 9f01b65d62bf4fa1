// The example programs run and finish (each starts its own broker when given no --url).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { startBroker } from '../lib/harness.mjs';

const ROOT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');

function run(script, args, input) {
  return new Promise((resolve, reject) => {
    const child = execFile(process.execPath, [path.join(ROOT, 'examples', script), ...args],
      { cwd: ROOT, timeout: 30000, env: { ...process.env, STOMP_URL: '' } },
      (error, stdout, stderr) => (error ? reject(new Error(`${script}: ${error.message}\n${stderr}`)) : resolve(stdout)));
    child.stdin.end(input ?? '');
  });
}

test('chat: piped lines are sent and echoed back', { timeout: 40000 }, async () => {
  const out = await run('chat.mjs', ['--name', 'tester', '--room', 'ci'], 'hello\nworld\n');
  assert.match(out, /me: \(tester joined ci\)/);
  assert.match(out, /me: hello\n.*me: world\n/s);
});

test('latency probe prints percentiles', { timeout: 40000 }, async () => {
  const out = await run('latency-probe.mjs', ['--count', '50', '--interval', '2']);
  assert.match(out, /latency ms: min [\d.]+ +median [\d.]+ +p90 [\d.]+ +p99 [\d.]+ +max [\d.]+/);
});

test('DIAG poller prints one line per round', { timeout: 40000 }, async () => {
  const out = await run('diag-poller.mjs', ['--count', '2', '--interval', '100']);
  const lines = out.trim().split('\n');
  assert.equal(lines.length, 2);
  assert.match(lines[0], /session: .*\| ws_buffer: .*\| stale: /);
});

function runStatus(script, args) {
  return new Promise(resolve => {
    execFile(process.execPath, [path.join(ROOT, 'examples', script), ...args],
      { cwd: ROOT, timeout: 30000, env: { ...process.env, STOMP_URL: '' } },
      (error, stdout, stderr) => resolve({ code: error ? error.code : 0, stdout, stderr }));
  });
}

async function closedPort() {
  const server = net.createServer();
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise(resolve => server.close(resolve));
  return port;
}

test('DIAG poller takes the URL alone, as README shows', { timeout: 40000 }, async () => {
  const broker = await startBroker();
  try {
    const out = await run('diag-poller.mjs', [broker.url, '--count', '1', '--interval', '100']);
    assert.match(out.trim(), /^\S+ +session: .*\| ws_buffer: .*\| stale: /);
  } finally {
    await broker.stop();
  }
});

for (const script of ['diag-poller.mjs', 'latency-probe.mjs', 'chat.mjs']) {
  test(`${script} pointed at a port with no broker: one line and status 1`, { timeout: 40000 }, async () => {
    const url = `ws://127.0.0.1:${await closedPort()}/stomp`;
    const { code, stdout, stderr } = await runStatus(script, [url]);
    assert.equal(code, 1, stderr);
    assert.equal(stdout, '');
    assert.equal(stderr.trim().split('\n').length, 1, stderr);
    assert.match(stderr, new RegExp(`^${script}: .*${url}.*is a broker listening there\\?`));
  });
}

test('a bad option is one line and status 2', { timeout: 40000 }, async () => {
  const { code, stderr } = await runStatus('diag-poller.mjs', ['--bogus']);
  assert.equal(code, 2);
  assert.equal(stderr.trim().split('\n').length, 1, stderr);
  assert.match(stderr, /Unknown option '--bogus'/);
});

test('the browser page loads stompjs from beside it, not from the internet', () => {
  const html = fs.readFileSync(path.join(ROOT, 'examples', 'browser-chat.html'), 'utf8');
  const sources = [...html.matchAll(/<script[^>]*\ssrc="([^"]+)"/g)].map(m => m[1]);
  assert.deepEqual(sources, ['vendor/stomp.umd.min.js']);
  const vendored = fs.readFileSync(path.join(ROOT, 'examples', 'vendor', 'stomp.umd.min.js'));
  const installed = fs.readFileSync(path.join(ROOT, 'node_modules', '@stomp', 'stompjs', 'bundles', 'stomp.umd.min.js'));
  assert.ok(vendored.equals(installed), 'copy node_modules/@stomp/stompjs/bundles/stomp.umd.min.js to examples/vendor/');
  assert.ok(fs.existsSync(path.join(ROOT, 'examples', 'vendor', 'stompjs-LICENSE')));
});
