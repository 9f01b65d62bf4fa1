// Scenario 10: the legacy `stompjs` 2.x client (jmesnil/stomp-websocket, still in many web apps)
// connects over a `ws` WebSocket, subscribes, receives, gets receipts and disconnects.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import Stomp from 'stompjs';

import { openWebSocket, randomName, startBroker, withTimeout } from '../lib/harness.mjs';

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

function legacyConnect(url, protocols) {
  const ws = openWebSocket(url, protocols);
  const client = Stomp.over(ws);
  client.debug = null;
  client.heartbeat.outgoing = 0;
  client.heartbeat.incoming = 0;
  const connected = new Promise((resolve, reject) => client.connect({ host: 'localhost' }, resolve,
    error => reject(new Error(`legacy client error: ${typeof error === 'string' ? error : error.headers?.message}`))));
  return { ws, client, connected: withTimeout(connected, 10000, 'the legacy client to connect') };
}

function receiptWatcher(client) {
  const waiting = new Map();
  client.onreceipt = frame => waiting.get(frame.headers['receipt-id'])?.(frame);
  return id => withTimeout(new Promise(resolve => waiting.set(id, resolve)), 5000, `receipt ${id}`);
}

test('legacy stompjs: connect, subscribe, receive, disconnect', { timeout: 20000 }, async () => {
  const { ws, client, connected } = legacyConnect(broker.url, ['v10.stomp', 'v11.stomp']);
  const frame = await connected;
  assert.equal(ws.protocol, 'v11.stomp');
  assert.equal(frame.headers.version, '1.1', 'stompjs 2.x offers 1.1,1.0');
  const receiptFor = receiptWatcher(client);

  const destination = `/topic/${randomName('legacy-')}`;
  const received = [];
  let wake = () => {};
  const subscription = client.subscribe(destination, message => { received.push(message); wake(); });
  assert.ok(subscription.id);

  const sent = receiptFor('after-send');
  for (let i = 0; i < 10; i++) client.send(destination, { 'x-n': `${i}` }, `legacy message ${i}`);
  client.send(`/topic/${randomName()}`, { receipt: 'after-send' }, '');
  await sent;
  await withTimeout(new Promise(resolve => { wake = () => received.length >= 10 && resolve(); wake(); }), 5000, '10 messages');
  assert.deepEqual(received.map(m => m.body), Array.from({ length: 10 }, (_, i) => `legacy message ${i}`));
  assert.deepEqual(received.map(m => m.headers['x-n']), Array.from({ length: 10 }, (_, i) => `${i}`));
  assert.equal(received[0].headers.destination, destination);
  assert.equal(received[0].headers.subscription, subscription.id);

  // Unsubscribe, then nothing more arrives (the receipt comes after any MESSAGE it could have caused).
  subscription.unsubscribe();
  const quiet = receiptFor('after-unsubscribe');
  client.send(destination, { receipt: 'after-unsubscribe' }, 'not delivered');
  await quiet;
  assert.equal(received.length, 10);

  const closed = new Promise(resolve => ws.once('close', code => resolve(code)));
  client.disconnect();
  await withTimeout(closed, 5000, 'the WebSocket to close');
});

test('legacy stompjs: a v10.stomp-only WebSocket and large frames split at 16 KB', { timeout: 20000 }, async () => {
  const { ws, client, connected } = legacyConnect(broker.url, ['v10.stomp']);
  await connected;
  assert.equal(ws.protocol, 'v10.stomp');
  try {
    const destination = `/topic/${randomName('legacy-big-')}`;
    let resolveBig;
    const big = new Promise(resolve => { resolveBig = resolve; });
    client.subscribe(destination, message => resolveBig(message));
    const body = 'L'.repeat(100 * 1024); // the client sends this in 16 KB WebSocket messages
    client.send(destination, {}, body);
    const message = await withTimeout(big, 10000, 'the large message');
    assert.equal(message.body.length, body.length);
    assert.equal(message.body, body);
  } finally {
    client.disconnect();
  }
});
