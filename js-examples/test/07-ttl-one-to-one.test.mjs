// Scenario 7: the TTL stale queue, one to one. 800 connections each send one message to a topic of
// their own while nobody subscribes; then each subscribes and gets exactly its own message.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { closeAll, connectMany, receipt, startBroker, subscribeInbox } from '../lib/harness.mjs';

const CONNECTIONS = 800;
let broker;
before(async () => { broker = await startBroker(['TTL=5000']); });
after(async () => { await broker?.stop(); });

test(`${CONNECTIONS} connections, each gets back exactly its own stale message`, { timeout: 60000 }, async t => {
  const run = Math.random().toString(36).slice(2, 8);
  const topic = i => `/topic/${run}-${i}`;
  const started = Date.now();
  const clients = await connectMany(broker.url, CONNECTIONS);
  try {
    const connectedAt = Date.now();
    await Promise.all(clients.map((client, i) =>
      receipt(client, id => client.publish({ destination: topic(i), body: `for ${i}`, headers: { receipt: id } }), { timeoutMs: 20000 })));
    const sentAt = Date.now();
    const inboxes = clients.map((client, i) => subscribeInbox(client, topic(i)));
    const got = await Promise.all(inboxes.map((inbox, i) => inbox.next(10000, `the stale message of connection ${i}`)));
    got.forEach((message, i) => assert.equal(message.body, `for ${i}`));
    // Exactly one each: a receipt after the SUBSCRIBE comes after any further delivery.
    await Promise.all(clients.map(client =>
      receipt(client, id => client.publish({ destination: `/topic/${run}-sync`, headers: { receipt: id } }), { timeoutMs: 20000 })));
    inboxes.forEach((inbox, i) => assert.equal(inbox.pending, 0, `connection ${i} got more than its own message`));
    t.diagnostic(`${CONNECTIONS} connections: connect ${connectedAt - started} ms, send ${sentAt - connectedAt} ms, ` +
      `subscribe and receive ${Date.now() - sentAt} ms`);
  } finally {
    await closeAll(clients);
  }
});
