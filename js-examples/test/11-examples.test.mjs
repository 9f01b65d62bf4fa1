// The example programs run and finish (each starts its own broker when given no --url).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

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
