// Shared by the example programs: where the broker is. With --url (or $STOMP_URL) they connect to
// a running broker; without, they start one of their own on a free port (like the tests) and stop
// it when they finish.
import path from 'node:path';
import { parseArgs } from 'node:util';

import { startBroker } from '../lib/harness.mjs';

const SCRIPT = path.basename(process.argv[1] ?? 'example');

// An example that fails says why in one line and exits non-zero, never with a stack trace.
export function fail(message, code = 1) {
  console.error(`${SCRIPT}: ${message}`);
  process.exit(code);
}
process.on('uncaughtException', error => fail(error?.message ?? String(error)));
process.on('unhandledRejection', error => fail(error?.message ?? String(error)));

// The example's options plus --url; the URL may also be given alone (`diag-poller.mjs ws://...`).
export function exampleArgs(options) {
  let parsed;
  try {
    parsed = parseArgs({ options: { url: { type: 'string' }, ...options }, allowPositionals: true });
  } catch (error) {
    fail(`${error.message} (options: ${['--url', ...Object.keys(options).map(o => `--${o}`)].join(', ')})`, 2);
  }
  const { values, positionals } = parsed;
  if (positionals.length > 1 || (positionals.length && values.url)) {
    fail(`one broker URL at most, got ${[values.url, ...positionals].filter(Boolean).join(' ')}`, 2);
  }
  values.url ??= positionals[0];
  if (values.url && !/^wss?:\/\//.test(values.url)) {
    fail(`the broker URL must start with ws:// or wss://, not ${values.url}`, 2);
  }
  return values;
}

export async function brokerUrl(url, settings = []) {
  url = url || process.env.STOMP_URL;
  if (url) return { url, stop: async () => {} };
  const broker = await startBroker(settings);
  console.error(`(started a broker for this example: ${broker.url})`);
  return { url: broker.url, stop: broker.stop };
}

export function onInterrupt(stop) {
  let stopping = false;
  const handler = async () => {
    if (stopping) process.exit(130);
    stopping = true;
    await stop();
    process.exit(0);
  };
  process.on('SIGINT', handler);
  process.on('SIGTERM', handler);
}
