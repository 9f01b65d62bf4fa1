// Scenario 9: load. 1,000 WebSocket connections each subscribe to a topic of their own and send to
// it; every one receives its own message, within the time bound.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { closeAll, connectMany, receipt, startBroker, subscribeInbox } from '../lib/harness.mjs';

const CONNECTIONS = 1000;
const BOUND_MS = 45000; // connect + subscribe + send + receive, on a small shared machine
let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

test(`${CONNECTIONS} WebSocket connections, each subscribes to its own topic and sends to it`, { timeout: BOUND_MS + 15000 }, async t => {
  const run = Math.random().toString(36).slice(2, 8);
  const started = Date.now();
  const clients = await connectMany(broker.url, CONNECTIONS);
  try {
    const connectedAt = Date.now();
    const inboxes = clients.map((client, i) => subscribeInbox(client, `/topic/${run}-${i}`));
    // The SUBSCRIBE goes first on each connection, so a receipted SEND after it is routed to it.
    await Promise.all(clients.map((client, i) => receipt(client,
      id => client.publish({ destination: `/topic/${run}-${i}`, body: `to ${i}`, headers: { receipt: id } }),
      { timeoutMs: BOUND_MS })));
    const got = await Promise.all(inboxes.map((inbox, i) => inbox.next(BOUND_MS, `connection ${i}'s message`)));
    const done = Date.now();
    got.forEach((message, i) => assert.equal(message.body, `to ${i}`));
    inboxes.forEach((inbox, i) => assert.equal(inbox.pending, 0, `connection ${i} got someone else's message`));
    assert.ok(done - started < BOUND_MS, `took ${done - started} ms`);
    t.diagnostic(`${CONNECTIONS} connections: connect ${connectedAt - started} ms, ` +
      `subscribe + send + receive ${done - connectedAt} ms`);
  } finally {
    await closeAll(clients);
  }
});
