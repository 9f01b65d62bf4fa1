// Scenario 5: DIAG queries. A client subscribes to `DIAG/<random>` and sends a query as the body
// of a SEND to that destination; the answer is a MESSAGE on it whose headers are the statistics:
//   session   -> clients, websockets, stomp_connected, subscriptions
//   ws_buffer -> allocated, hits, misses
//   stale     -> input-queue-size, output-queue-size, stale-queue-size
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';

import { connectClient, randomName, receipt, sleep, startBroker, subscribeInbox, withTimeout } from '../lib/harness.mjs';

const WAIT = 3000;
let broker;
before(async () => { broker = await startBroker(['TTL=5000']); });
after(async () => { await broker?.stop(); });

function numeric(headers, names) {
  const values = {};
  for (const name of names) {
    assert.ok(name in headers, `header ${name} in ${JSON.stringify(headers)}`);
    assert.match(headers[name], /^\d+$/, `${name} is a non-negative integer`);
    values[name] = Number(headers[name]);
  }
  return values;
}

async function query(client, inbox, destination, body) {
  client.publish({ destination, body });
  return (await inbox.next(WAIT, `the DIAG answer to ${body}`)).headers;
}

/** A raw TCP STOMP client with one subscription (so websockets < clients). */
async function tcpClient() {
  const socket = net.connect(broker.port, broker.host);
  let data = '';
  socket.setEncoding('utf8').on('data', chunk => { data += chunk; });
  await withTimeout(new Promise((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject); }), 5000, 'TCP connect');
  socket.write(`CONNECT\naccept-version:1.2\n\n\0SUBSCRIBE\nid:0\ndestination:/topic/${randomName()}\nreceipt:sub\n\n\0`);
  await withTimeout(new Promise(resolve => {
    const check = () => (data.includes('receipt-id:sub') ? resolve() : setTimeout(check, 10));
    check();
  }), 5000, 'the TCP client to subscribe');
  return socket;
}

test('DIAG session, ws_buffer and stale', { timeout: 30000 }, async () => {
  const diag = await connectClient(broker.url);
  const other = await connectClient(broker.url);
  const tcp = await tcpClient();
  try {
    const destination = `DIAG/${randomName()}`;
    const inbox = subscribeInbox(diag, destination);

    const session = numeric(await query(diag, inbox, destination, 'session'),
      ['clients', 'websockets', 'stomp_connected', 'subscriptions']);
    assert.deepEqual(session, { clients: 3, websockets: 2, stomp_connected: 3, subscriptions: 2 });

    const ws = numeric(await query(diag, inbox, destination, 'ws_buffer'), ['allocated', 'hits', 'misses']);
    // Two CONNECTs, then at least one read with the SUBSCRIBE and the first query (the client may
    // send both in one read, and the read carrying this query may be counted after it is answered).
    assert.ok(ws.hits >= 3, `WebSocket reads that produced events: ${ws.hits}`);

    // Park four messages in the stale queue (TTL=5000, no subscriber), then ask.
    for (let i = 0; i < 3; i++) other.publish({ destination: `/topic/${randomName('stale-')}`, body: `${i}` });
    await receipt(other, id => other.publish({ destination: `/topic/${randomName('stale-')}`, body: '3', headers: { receipt: id } }));
    const stale = numeric(await query(diag, inbox, destination, 'stale'),
      ['input-queue-size', 'output-queue-size', 'stale-queue-size']);
    assert.ok(stale['stale-queue-size'] >= 4, `stale-queue-size ${stale['stale-queue-size']}`);

    // The counts follow the connections.
    await other.deactivate();
    tcp.destroy();
    const deadline = Date.now() + WAIT;
    let now;
    do {
      if (now) await sleep(50);
      now = numeric(await query(diag, inbox, destination, 'session'), ['clients', 'websockets', 'stomp_connected', 'subscriptions']);
    } while (now.clients !== 1 && Date.now() < deadline);
    assert.deepEqual(now, { clients: 1, websockets: 1, stomp_connected: 1, subscriptions: 1 });
  } finally {
    tcp.destroy();
    await Promise.all([diag.deactivate({ force: true }), other.deactivate({ force: true })]);
  }
});
