#!/usr/bin/env node
// Print the broker's statistics every 500 ms, using DIAG queries.
//
//   node examples/diag-poller.mjs [URL | --url ws://127.0.0.1:61613/stomp] [--interval 500] [--count N]
//
// It subscribes to DIAG/<random> and sends the queries `session`, `ws_buffer` and `stale` as
// SEND bodies to that destination; each answer is a MESSAGE whose headers are the figures.
// Without --url it starts a broker of its own (TTL=5000) and prints a few rounds.
import { randomBytes } from 'node:crypto';

import { connectClient, sleep, withTimeout } from '../lib/harness.mjs';
import { brokerUrl, exampleArgs, onInterrupt } from './common.mjs';

const args = exampleArgs({
  interval: { type: 'string', default: '500' },
  count: { type: 'string' },
});
const interval = Number(args.interval);
const count = args.count ? Number(args.count) : (args.url || process.env.STOMP_URL ? Infinity : 6);

const QUERIES = {
  session: ['clients', 'websockets', 'stomp_connected', 'subscriptions'],
  ws_buffer: ['allocated', 'hits', 'misses'],
  stale: ['input-queue-size', 'output-queue-size', 'stale-queue-size'],
};

const broker = await brokerUrl(args.url, ['TTL=5000']);
const client = await connectClient(broker.url);
const quit = async () => {
  await client.deactivate().catch(() => {});
  await broker.stop();
};
onInterrupt(quit);

const destination = `DIAG/${randomBytes(6).toString('hex')}`;
const answers = [];
let wake = () => {};
client.subscribe(destination, message => { answers.push(message); wake(); });

async function ask(query) {
  client.publish({ destination, body: query });
  if (!answers.length) {
    await withTimeout(new Promise(resolve => { wake = resolve; }), 5000, `the answer to ${query}`);
  }
  const headers = answers.shift().headers;
  const figures = QUERIES[query].filter(name => name in headers).map(name => `${name}=${headers[name]}`);
  return figures.length ? figures.join(' ') : `(no statistics in the answer to ${query}: does this broker support DIAG?)`;
}

for (let round = 0; round < count; round++) {
  const started = Date.now();
  const parts = [];
  for (const query of Object.keys(QUERIES)) parts.push(`${query}: ${await ask(query)}`);
  console.log(`${new Date().toISOString()}  ${parts.join(' | ')}`);
  await sleep(Math.max(0, interval - (Date.now() - started)));
}
await quit();
