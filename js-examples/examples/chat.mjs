#!/usr/bin/env node
// A terminal chat over STOMP over WebSocket.
//
//   node examples/chat.mjs --name alice [--room lobby] [URL | --url ws://127.0.0.1:61613/stomp]
//
// Lines typed on stdin go to /topic/chat.<room>; everyone's lines are printed. Run it in two
// terminals against one broker (./build.sh run port=61613) to talk. With stdin from a pipe it sends
// each line, waits for the broker's receipt, and exits at the end of input. Without --url it
// starts a broker of its own (handy to try it out alone).
import readline from 'node:readline';

import { connectClient, receipt } from '../lib/harness.mjs';
import { brokerUrl, exampleArgs, onInterrupt } from './common.mjs';

const args = exampleArgs({
  room: { type: 'string', default: 'lobby' },
  name: { type: 'string', default: `user-${process.pid}` },
});

const broker = await brokerUrl(args.url);
const client = await connectClient(broker.url, { heartbeatIncoming: 10000, heartbeatOutgoing: 10000 });
const destination = `/topic/chat.${args.room}`;
const quit = async () => {
  await client.deactivate().catch(() => {});
  await broker.stop();
};
onInterrupt(quit);

client.subscribe(destination, message => {
  const from = message.headers.from || '?';
  const time = new Date(Number(message.headers.sent) || Date.now()).toLocaleTimeString();
  console.log(`[${time}] ${from === args.name ? 'me' : from}: ${message.body}`);
});
await receipt(client, id => client.publish({
  destination, body: `(${args.name} joined ${args.room})`, headers: { from: args.name, sent: `${Date.now()}`, receipt: id },
}));

const lines = readline.createInterface({ input: process.stdin, terminal: process.stdin.isTTY });
for await (const line of lines) {
  if (!line.trim()) continue;
  await receipt(client, id => client.publish({
    destination, body: line, headers: { from: args.name, sent: `${Date.now()}`, receipt: id },
  }));
}
await receipt(client, id => client.publish({
  destination, body: `(${args.name} left)`, headers: { from: args.name, sent: `${Date.now()}`, receipt: id },
}));
await quit();
