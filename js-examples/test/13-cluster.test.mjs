// Scenario 13: cluster mode over WebSocket. Two broker nodes on a 3-server NATS JetStream cluster;
// @stomp/stompjs clients on different nodes: topics (plain and wildcard) cross nodes exactly once
// and in order, a queue's messages go to exactly one consumer in the whole cluster, and the
// unacknowledged messages of a consumer that leaves come back on the other node, redelivered.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startNatsCluster, startNodes } from '../lib/cluster.mjs';
import { closeAll, connectClient, randomName, receipt, sleep, subscribeInbox, withTimeout } from '../lib/harness.mjs';

let nats;
let nodes = [];
before(async () => {
  nats = await startNatsCluster();
  nodes = await startNodes(nats, 2, ['cluster_ack_wait_ms=3000']);
});
after(async () => {
  await Promise.allSettled(nodes.map(node => node.stop()));
  await nats?.stop();
});

/** Until a message published on `pub` reaches `inbox` (the subscription's interest reached pub's node). */
async function untilCrossNode(pub, inbox, destination, ms = 10000) {
  const deadline = Date.now() + ms;
  for (;;) {
    await receipt(pub, id => pub.publish({ destination, body: 'probe', headers: { receipt: id } }));
    try {
      await inbox.next(300);
      break;
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`no cross-node delivery on ${destination} within ${ms} ms`);
    }
  }
  for (;;) { // later probes still on their way
    try { await inbox.next(300); } catch { return; }
  }
}

test('a topic crosses nodes exactly once per subscription, in order, wildcards included', { timeout: 60000 }, async () => {
  const base = `/topic/${randomName('prices-')}`;
  const sub = await connectClient(nodes[1].url);
  const pub = await connectClient(nodes[0].url);
  try {
    const plain = subscribeInbox(sub, `${base}/eu`);
    const wild = subscribeInbox(sub, `${base}/*`);
    await untilCrossNode(pub, plain, `${base}/eu`);
    await sleep(300);
    while (wild.pending) await wild.next(100); // the probes the wildcard also got
    const bodies = Array.from({ length: 100 }, (_, i) => `${i}`);
    for (const body of bodies) pub.publish({ destination: `${base}/eu`, body });
    pub.publish({ destination: `${base}/us`, body: 'us' });
    await receipt(pub, id => pub.publish({ destination: `/topic/${randomName('sync-')}`, headers: { receipt: id } }));
    const got = [];
    for (let i = 0; i < 100; i++) got.push((await plain.next(5000)).body);
    assert.deepEqual(got, bodies, 'the plain subscription: each message once, in send order');
    const gotWild = [];
    for (let i = 0; i < 101; i++) gotWild.push((await wild.next(5000)).body);
    assert.deepEqual(gotWild, [...bodies, 'us'], 'the wildcard subscription: both destinations, once each, in order');
    await assert.rejects(plain.next(500), /timed out/, 'no second copy');
    await assert.rejects(wild.next(200), /timed out/, 'no second copy');
  } finally {
    await closeAll([sub, pub]);
  }
});

test('a queue: each message to exactly one consumer across the nodes', { timeout: 60000 }, async () => {
  const destination = `/queue/${randomName('work-')}`;
  const consumers = await Promise.all(nodes.map(node => connectClient(node.url)));
  const producer = await connectClient(nodes[0].url);
  const seen = [];
  try {
    consumers.forEach((client, i) => client.subscribe(destination, message => {
      seen.push({ node: i, body: message.body });
      message.ack();
    }, { ack: 'client-individual', 'prefetch-count': '10' }));
    // each node binds the queue's consumer: probes until both nodes' consumers took one (a node
    // that binds late would find the other one had taken every message)
    const deadline = Date.now() + 20000;
    let probes = 0;
    while ([0, 1].some(n => !seen.some(s => s.node === n))) {
      assert.ok(Date.now() < deadline, `both nodes' consumers bound (took: ${seen.map(s => s.node).join(', ')})`);
      await receipt(producer, id => producer.publish({ destination, body: `probe${probes++}`,
        headers: { persistent: 'true', receipt: id } }));
      await sleep(100);
    }
    await withTimeout((async () => { while (seen.length < probes) await sleep(20); })(), 10000, 'every probe');
    seen.length = 0;
    const bodies = Array.from({ length: 200 }, (_, i) => `m${i}`);
    await Promise.all(bodies.map(body =>
      receipt(producer, id => producer.publish({ destination, body, headers: { persistent: 'true', receipt: id } }),
        { what: `the receipt for ${body}` })));
    await withTimeout((async () => { while (seen.length < bodies.length) await sleep(50); })(), 20000,
      `all ${bodies.length} messages (got ${seen.length})`);
    await sleep(500);
    assert.equal(seen.length, bodies.length, 'no message delivered twice');
    assert.deepEqual(new Set(seen.map(s => s.body)), new Set(bodies));
    const perNode = [0, 1].map(i => seen.filter(s => s.node === i).length);
    assert.ok(perNode.every(n => n > 0), `both nodes' consumers took some: ${perNode.join(', ')}`);
  } finally {
    await closeAll([...consumers, producer]);
  }
});

test('unacknowledged messages of a consumer that leaves come back on the other node, redelivered', { timeout: 60000 }, async () => {
  const destination = `/queue/${randomName('jobs-')}`;
  const producer = await connectClient(nodes[0].url);
  const leaver = await connectClient(nodes[0].url);
  const held = [];
  leaver.subscribe(destination, message => held.push(message.body), { ack: 'client-individual', 'prefetch-count': '5' });
  await sleep(500);
  const bodies = ['a', 'b', 'c'];
  for (const body of bodies) {
    await receipt(producer, id => producer.publish({ destination, body, headers: { persistent: 'true', receipt: id } }));
  }
  await withTimeout((async () => { while (held.length < 3) await sleep(50); })(), 10000, 'the first consumer to get all three');
  await leaver.deactivate({ force: true }); // gone without acknowledging
  const other = await connectClient(nodes[1].url);
  try {
    const inbox = subscribeInbox(other, destination, { ack: 'client-individual' });
    const again = [];
    for (let i = 0; i < 3; i++) {
      const message = await inbox.next(15000, 'a redelivery on the other node');
      assert.equal(message.headers.redelivered, 'true', JSON.stringify(message.headers));
      again.push(message.body);
      message.ack();
    }
    assert.deepEqual(again.sort(), bodies);
  } finally {
    await closeAll([producer, other]);
  }
});
