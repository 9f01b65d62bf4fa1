// Message features from @stomp/stompjs over WebSocket: priority orders a queue; browser:true
// copies what waits (with a selector) and ends with the browser:end marker, consuming nothing.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { closeAll, connectClient, randomName, receipt, startBroker, subscribeInbox } from '../lib/harness.mjs';

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

async function sendAll(client, destination, items) {
  for (const [body, headers] of items) client.publish({ destination, body, headers });
  await receipt(client, id => client.publish({ destination: '/topic/sync', headers: { receipt: id } }));
}

test('priority: higher first, first in first out within a level, clamped', { timeout: 20000 }, async () => {
  const producer = await connectClient(broker.url);
  const consumer = await connectClient(broker.url);
  try {
    const queue = `/queue/${randomName('prio-')}`;
    await sendAll(producer, queue, [['low', { priority: '1' }], ['plain', {}], ['high-1', { priority: '9' }],
      ['high-2', { priority: '9' }], ['over', { priority: '42' }], ['mid', { priority: '6' }]]);
    const inbox = subscribeInbox(consumer, queue);
    const got = [];
    for (let i = 0; i < 6; i++) got.push(await inbox.next());
    assert.deepEqual(got.map(m => m.body), ['high-1', 'high-2', 'over', 'mid', 'plain', 'low']);
    assert.equal(got[2].headers.priority, '9', 'an out-of-range level is clamped, and the header says so');
  } finally {
    await closeAll([producer, consumer]);
  }
});

test('browsing: a snapshot with a selector, the end marker, nothing consumed', { timeout: 20000 }, async () => {
  const producer = await connectClient(broker.url);
  const viewer = await connectClient(broker.url);
  const consumer = await connectClient(broker.url);
  try {
    const queue = `/queue/${randomName('browse-')}`;
    await sendAll(producer, queue, [['a', { colour: 'red' }], ['b', { colour: 'blue' }],
      ['c', { colour: 'red', priority: '7' }]]);
    const look = subscribeInbox(viewer, queue, { browser: 'true', selector: "colour = 'red'" });
    const seen = [await look.next(), await look.next(), await look.next()];
    assert.deepEqual(seen.map(m => m.body), ['c', 'a', '']);
    const end = seen[2];
    assert.equal(end.headers.browser, 'end');
    assert.equal(end.headers['message-id'], '0');
    assert.equal(end.headers.destination, queue);
    look.subscription.unsubscribe();
    const inbox = subscribeInbox(consumer, queue);
    const taken = [await inbox.next(), await inbox.next(), await inbox.next()];
    assert.deepEqual(taken.map(m => m.body), ['c', 'a', 'b'], 'the browse consumed nothing');
  } finally {
    await closeAll([producer, viewer, consumer]);
  }
});
