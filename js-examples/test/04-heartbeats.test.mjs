// Scenario 4: heart-beats negotiated and kept. With 1 s heart-beats both ways the connection stays
// up for 5 s of silence, the broker's beats arrive (each an EOL in a WebSocket message of its own),
// and a client that stops beating is disconnected.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { connectClient, openWebSocket, randomName, receipt, sleep, startBroker, withTimeout } from '../lib/harness.mjs';

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

test('1 s heart-beats keep a silent connection up for 5 s', { timeout: 20000 }, async () => {
  let connected;
  let closed = null;
  const beatsIn = [];
  let beatsOut = 0;
  const client = await connectClient(broker.url, {
    heartbeatIncoming: 1000,
    heartbeatOutgoing: 1000,
    onConnect: frame => { connected = frame; },
    onWebSocketClose: event => { closed = event; },
  }, {
    onSocket: ws => {
      ws.on('message', data => {
        const bytes = new Uint8Array(data instanceof ArrayBuffer ? data : data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength));
        if (bytes.length === 1 && bytes[0] === 0x0a) beatsIn.push(Date.now());
      });
      const send = ws.send.bind(ws);
      ws.send = (data, ...rest) => { if (data === '\n') beatsOut += 1; return send(data, ...rest); };
    },
  });
  try {
    assert.ok(connected, 'CONNECTED seen');
    const [sx, sy] = connected.headers['heart-beat'].split(',').map(Number);
    assert.ok(sx > 0 && sx <= 1000, `broker offers to beat at least every second: heart-beat:${sx},${sy}`);
    assert.ok(sy >= 1000, `broker expects our beats no more often than we offered: heart-beat:${sx},${sy}`);

    const start = Date.now();
    await sleep(5000); // the point of the test: time passes with no frames, only heart-beats
    assert.equal(closed, null, 'the connection stayed up');
    assert.ok(client.connected);
    const during = beatsIn.filter(t => t >= start);
    assert.ok(during.length >= 3, `broker heart-beats in 5 s: ${during.length}`);
    const gaps = during.slice(1).map((t, i) => t - during[i]);
    assert.ok(Math.max(...gaps) < 2000, `gaps between broker beats: ${gaps.join(', ')} ms`);
    assert.ok(beatsOut >= 3, `client heart-beats sent: ${beatsOut}`);
    await receipt(client, id => client.publish({ destination: `/topic/${randomName()}`, body: 'still here', headers: { receipt: id } }));
  } finally {
    await client.deactivate();
  }
});

test('no heart-beats when none are asked for', { timeout: 10000 }, async () => {
  let connected;
  const client = await connectClient(broker.url, { onConnect: frame => { connected = frame; } });
  try {
    assert.equal(connected.headers['heart-beat'], '0,0');
  } finally {
    await client.deactivate();
  }
});

test('a client that promises heart-beats and goes silent gets an ERROR and is closed', { timeout: 15000 }, async () => {
  const ws = openWebSocket(broker.url);
  const messages = [];
  ws.on('message', data => messages.push(data.toString()));
  const closed = new Promise(resolve => ws.once('close', code => resolve(code)));
  await withTimeout(new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); }), 5000, 'open');
  ws.send('CONNECT\naccept-version:1.2\nheart-beat:500,0\n\n\0');
  const started = Date.now();
  const code = await withTimeout(closed, 8000, 'the broker to close the silent connection');
  const elapsed = Date.now() - started;
  assert.match(messages[0], /^CONNECTED\n/);
  assert.ok(messages.some(m => /^ERROR\n/.test(m) && /heart-beat/.test(m)), `an ERROR about heart-beats: ${JSON.stringify(messages)}`);
  assert.equal(code, 1000);
  assert.ok(elapsed >= 400, `closed only after the promised interval (${elapsed} ms)`);
});
