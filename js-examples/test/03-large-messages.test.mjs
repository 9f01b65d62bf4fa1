// Scenario 3: a 1 MB message, and a message that the client splits into many WebSocket messages
// (@stomp/stompjs `splitLargeFrames` with `maxWebSocketChunkSize`): the broker joins the pieces
// back into one STOMP frame, and sends it out as one WebSocket message.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { after, before, test } from 'node:test';

import { connectClient, randomName, receipt, startBroker, subscribeInbox } from '../lib/harness.mjs';

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

const sha = data => createHash('sha256').update(data).digest('hex');

test('a 1 MB text message and a 1 MB binary message', { timeout: 30000 }, async () => {
  const frames = [];
  const sender = await connectClient(broker.url);
  const receiver = await connectClient(broker.url, {}, {
    onSocket: ws => ws.on('message', (data, isBinary) => frames.push({ size: data.byteLength, isBinary })), // ArrayBuffer or Buffer
  });
  try {
    const destination = `/topic/${randomName('big-')}`;
    const inbox = subscribeInbox(receiver, destination);
    await receipt(receiver, id => receiver.publish({ destination: `/topic/${randomName()}`, headers: { receipt: id } }));

    const text = randomBytes(512 * 1024).toString('hex'); // 1 MiB of ASCII
    assert.equal(text.length, 1024 * 1024);
    await receipt(sender, id => sender.publish({ destination, body: text, headers: { receipt: id } }), { timeoutMs: 20000 });
    const got = await inbox.next(20000);
    assert.equal(got.body.length, text.length);
    assert.equal(sha(got.body), sha(text));

    const bytes = randomBytes(1024 * 1024);
    sender.publish({ destination, binaryBody: bytes, headers: { 'content-type': 'application/octet-stream' } });
    const gotBinary = await inbox.next(20000);
    assert.equal(gotBinary.binaryBody.length, bytes.length);
    assert.equal(sha(gotBinary.binaryBody), sha(bytes));

    const big = frames.filter(f => f.size > 1024 * 1024);
    assert.equal(big.length, 2, 'each big MESSAGE is one WebSocket message');
    assert.deepEqual(big.map(f => f.isBinary), [false, true], 'text for UTF-8, binary for other bytes');
  } finally {
    await Promise.all([sender.deactivate(), receiver.deactivate()]);
  }
});

test('splitLargeFrames: one STOMP frame in many 4 KB WebSocket messages', { timeout: 30000 }, async () => {
  const sent = [];
  const sender = await connectClient(broker.url, { splitLargeFrames: true, maxWebSocketChunkSize: 4 * 1024 }, {
    onSocket: ws => {
      const send = ws.send.bind(ws);
      ws.send = (data, ...rest) => { sent.push(data.length); return send(data, ...rest); };
    },
  });
  const receiver = await connectClient(broker.url);
  try {
    const destination = `/topic/${randomName('split-')}`;
    const inbox = subscribeInbox(receiver, destination);
    await receipt(receiver, id => receiver.publish({ destination: `/topic/${randomName()}`, headers: { receipt: id } }));

    const body = 'héllo wörld ✓ '.repeat(20000); // ~320 KB, multi-byte characters across chunk edges
    sent.length = 0;
    await receipt(sender, id => sender.publish({ destination, body, headers: { receipt: id } }), { timeoutMs: 20000 });
    assert.ok(sent.length > 50, `the frame went out in ${sent.length} WebSocket messages`);
    assert.ok(Math.max(...sent) <= 4 * 1024);
    const got = await inbox.next(20000);
    assert.equal(got.body.length, body.length);
    assert.equal(sha(got.body), sha(body));

    // Many small frames through the splitting client stay in order.
    for (let i = 0; i < 200; i++) sender.publish({ destination, body: `small-${i}` });
    for (let i = 0; i < 200; i++) assert.equal((await inbox.next(10000)).body, `small-${i}`);
  } finally {
    await Promise.all([sender.deactivate(), receiver.deactivate()]);
  }
});
