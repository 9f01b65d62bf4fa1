#!/usr/bin/env node
// Measure publish-to-delivery latency through the broker over WebSocket.
//
//   node examples/latency-probe.mjs [URL | --url ws://127.0.0.1:61613/stomp] [--count 500] [--interval 5] [--size 100]
//
// A publisher sends `count` messages of `size` bytes, one every `interval` ms, to a topic a second
// connection subscribes to; each carries its send time (process.hrtime) in a header. It prints
// min / median / p90 / p99 / max. Without --url it starts a broker of its own.
import { randomBytes } from 'node:crypto';

import { connectClient, receipt, sleep, withTimeout } from '../lib/harness.mjs';
import { brokerUrl, exampleArgs, onInterrupt } from './common.mjs';

const args = exampleArgs({
  count: { type: 'string', default: '500' },
  interval: { type: 'string', default: '5' },
  size: { type: 'string', default: '100' },
});
const count = Number(args.count);
const interval = Number(args.interval);
const body = 'x'.repeat(Number(args.size));

const broker = await brokerUrl(args.url);
const publisher = await connectClient(broker.url);
const subscriber = await connectClient(broker.url);
const quit = async () => {
  await Promise.all([publisher.deactivate(), subscriber.deactivate()]).catch(() => {});
  await broker.stop();
};
onInterrupt(quit);

const destination = `/topic/latency-${randomBytes(4).toString('hex')}`;
const samples = [];
let done;
const finished = new Promise(resolve => { done = resolve; });
subscriber.subscribe(destination, message => {
  samples.push(Number(process.hrtime.bigint() - BigInt(message.headers.t)) / 1e6);
  if (samples.length === count) done();
});
await receipt(subscriber, id => subscriber.publish({ destination: `${destination}-sync`, headers: { receipt: id } }));

for (let i = 0; i < count; i++) {
  publisher.publish({ destination, body, headers: { t: `${process.hrtime.bigint()}` } });
  if (interval) await sleep(interval);
}
await withTimeout(finished, 30000, `${count} messages`);

samples.sort((a, b) => a - b);
const at = q => samples[Math.min(samples.length - 1, Math.floor(q * samples.length))].toFixed(2);
console.log(`${count} messages of ${body.length} bytes, one every ${interval} ms`);
console.log(`latency ms: min ${at(0)}  median ${at(0.5)}  p90 ${at(0.9)}  p99 ${at(0.99)}  max ${samples.at(-1).toFixed(2)}`);
await quit();
