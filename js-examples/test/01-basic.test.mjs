// Scenario 1: connect / subscribe / send / receive / receipt / disconnect over ws://.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { connectClient, openWebSocket, randomName, receipt, startBroker, subscribeInbox, withTimeout } from '../lib/harness.mjs';

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

test('connect, subscribe, send, receive, receipt, disconnect', { timeout: 20000 }, async () => {
  let socket;
  const client = await connectClient(broker.url, {}, { onSocket: ws => { socket = ws; } });
  assert.equal(socket.protocol, 'v12.stomp', 'the broker picks the best STOMP subprotocol offered');
  assert.equal(client.connectedVersion, '1.2');

  const destination = `/topic/${randomName()}`;
  const inbox = subscribeInbox(client, destination, { receipt: 'sub-1' });
  // The SUBSCRIBE had its own receipt header; wait for it through a second, explicit one.
  await receipt(client, id => client.publish({ destination, body: 'hello, broker', headers: { receipt: id, 'x-custom': 'a:b' } }));
  const message = await inbox.next();
  assert.equal(message.body, 'hello, broker');
  assert.equal(message.headers.destination, destination);
  assert.equal(message.headers['x-custom'], 'a:b', 'custom headers (with escaped colons) are forwarded');
  assert.ok(message.headers['message-id']);
  assert.equal(message.headers.subscription, inbox.subscription.id);

  // A UTF-8 body and a binary body.
  client.publish({ destination, body: 'héllo € ✓' });
  assert.equal((await inbox.next()).body, 'héllo € ✓');
  const bytes = Uint8Array.from([0, 255, 254, 1, 128]);
  client.publish({ destination, binaryBody: bytes, headers: { 'content-type': 'application/octet-stream' } });
  const binary = await inbox.next();
  assert.deepEqual(Array.from(binary.binaryBody), Array.from(bytes));

  // Unsubscribe: nothing more arrives. A MESSAGE would come before the RECEIPT of the SEND that
  // caused it (one connection's frames stay in order), so once the receipt is in, the inbox is final.
  inbox.subscription.unsubscribe();
  await receipt(client, id => client.publish({ destination, body: 'after unsubscribe', headers: { receipt: id } }));
  assert.equal(inbox.pending, 0, 'no message after UNSUBSCRIBE');

  // DISCONNECT with a receipt (stompjs asks for one and waits for it), then the WebSocket closes.
  const closed = new Promise(resolve => socket.once('close', code => resolve(code)));
  await withTimeout(client.deactivate(), 10000, 'DISCONNECT');
  assert.equal(await withTimeout(closed, 5000, 'the WebSocket to close'), 1000);
});

test('two clients exchange messages both ways', { timeout: 20000 }, async () => {
  const a = await connectClient(broker.url);
  const b = await connectClient(broker.url);
  try {
    const ab = `/topic/${randomName('ab-')}`;
    const ba = `/topic/${randomName('ba-')}`;
    const inA = subscribeInbox(a, ba);
    const inB = subscribeInbox(b, ab);
    await receipt(a, id => a.subscribe(`/topic/${randomName()}`, () => {}, { receipt: id }));
    await receipt(b, id => b.subscribe(`/topic/${randomName()}`, () => {}, { receipt: id }));
    for (let i = 0; i < 20; i++) {
      a.publish({ destination: ab, body: `a${i}` });
      b.publish({ destination: ba, body: `b${i}` });
    }
    for (let i = 0; i < 20; i++) {
      assert.equal((await inB.next()).body, `a${i}`);
      assert.equal((await inA.next()).body, `b${i}`);
    }
  } finally {
    await Promise.all([a.deactivate(), b.deactivate()]);
  }
});

test('wildcard subscription receives every matching destination', { timeout: 20000 }, async () => {
  const client = await connectClient(broker.url);
  try {
    const base = `/topic/${randomName('wild-')}`;
    const inbox = subscribeInbox(client, `${base}/*`);
    await receipt(client, id => client.publish({ destination: `${base}/a`, body: '1', headers: { receipt: id } }));
    client.publish({ destination: `${base}/a/b`, body: '2' });
    client.publish({ destination: `/topic/${randomName('other-')}`, body: 'not for us' });
    client.publish({ destination: `${base}/c`, body: '3' });
    const bodies = [(await inbox.next()).body, (await inbox.next()).body, (await inbox.next()).body];
    assert.deepEqual(bodies, ['1', '2', '3']);
  } finally {
    await client.deactivate();
  }
});

test('a plain WebSocket sees one STOMP frame per message', { timeout: 20000 }, async () => {
  const ws = openWebSocket(broker.url, ['v10.stomp']);
  const messages = [];
  let wake;
  ws.on('message', (data, isBinary) => { messages.push({ text: data.toString(), isBinary }); wake?.(); });
  await withTimeout(new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); }), 5000, 'open');
  assert.equal(ws.protocol, 'v10.stomp');
  const until = async n => withTimeout(new Promise(resolve => {
    wake = () => { if (messages.length >= n) resolve(); };
    wake();
  }), 5000, `${n} messages`);
  const destination = `/topic/${randomName()}`;
  ws.send('CONNECT\naccept-version:1.2\n\n\0');
  await until(1);
  assert.match(messages[0].text, /^CONNECTED\n/);
  // Three frames in one WebSocket message in, three WebSocket messages out.
  ws.send(`SUBSCRIBE\nid:0\ndestination:${destination}\n\n\0SEND\ndestination:${destination}\n\none\0SEND\ndestination:${destination}\nreceipt:r\n\ntwo\0`);
  await until(4);
  assert.match(messages[1].text, /^MESSAGE\n[^]*\n\none\0$/);
  assert.match(messages[2].text, /^MESSAGE\n[^]*\n\ntwo\0$/);
  assert.equal(messages[3].text, 'RECEIPT\nreceipt-id:r\n\n\0');
  assert.ok(messages.every(m => !m.isBinary), 'UTF-8 frames go out as text messages');
  const closed = new Promise(resolve => ws.once('close', code => resolve(code)));
  ws.send('DISCONNECT\n\n\0');
  assert.equal(await withTimeout(closed, 5000, 'close'), 1000);
});
