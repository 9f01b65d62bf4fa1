// Scenario 6: the TTL stale queue, many messages to one late subscriber. With TTL=5000 a message
// sent to a destination nobody subscribes to is kept, and delivered (once) to the first later
// subscriber whose destination matches.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { connectClient, randomName, receipt, sleep, startBroker, subscribeInbox } from '../lib/harness.mjs';

const COUNT = 1000;
let broker;
before(async () => { broker = await startBroker(['TTL=5000']); });
after(async () => { await broker?.stop(); });

test(`${COUNT} messages to /topic/1 with no subscriber reach a late subscriber, in order, once`, { timeout: 30000 }, async () => {
  const sender = await connectClient(broker.url);
  const late = await connectClient(broker.url);
  const later = await connectClient(broker.url);
  try {
    for (let i = 0; i < COUNT; i++) sender.publish({ destination: '/topic/1', body: `message ${i}` });
    await receipt(sender, id => sender.publish({ destination: `/topic/${randomName('sync-')}`, headers: { receipt: id } }));

    const inbox = subscribeInbox(late, '/topic/1');
    const bodies = [];
    for (let i = 0; i < COUNT; i++) bodies.push((await inbox.next(i === 0 ? 5000 : 2000, `stale message ${i}`)).body);
    assert.deepEqual(bodies, Array.from({ length: COUNT }, (_, i) => `message ${i}`));
    await receipt(late, id => late.publish({ destination: `/topic/${randomName('sync-')}`, headers: { receipt: id } }));
    assert.equal(inbox.pending, 0, 'each stale message is delivered once');

    // Delivered once: the next subscriber gets only what is sent from now on.
    const second = subscribeInbox(later, '/topic/1');
    await receipt(later, id => later.publish({ destination: '/topic/1', body: 'fresh', headers: { receipt: id } }));
    assert.equal((await second.next(2000)).body, 'fresh');
    assert.equal(second.pending, 0);
    assert.equal((await inbox.next(2000)).body, 'fresh', 'live traffic goes to every subscriber as usual');
  } finally {
    await Promise.all([sender, late, later].map(c => c.deactivate({ force: true })));
  }
});

test('a stale message goes to a matching wildcard subscriber, not to others', { timeout: 20000 }, async () => {
  const sender = await connectClient(broker.url);
  const other = await connectClient(broker.url);
  const wild = await connectClient(broker.url);
  try {
    const base = `/topic/${randomName('ttl-')}`;
    await receipt(sender, id => sender.publish({ destination: `${base}/a`, body: 'kept', headers: { receipt: id } }));
    const otherInbox = subscribeInbox(other, `${base}/b`);
    await receipt(other, id => other.publish({ destination: `/topic/${randomName('sync-')}`, headers: { receipt: id } }));
    assert.equal(otherInbox.pending, 0, 'a subscriber to another destination does not get it');
    const wildInbox = subscribeInbox(wild, `${base}/*`);
    assert.equal((await wildInbox.next(3000, 'the stale message')).body, 'kept');
  } finally {
    await Promise.all([sender, other, wild].map(c => c.deactivate({ force: true })));
  }
});

test('a stale message expires after TTL', { timeout: 20000 }, async () => {
  const short = await startBroker(['TTL=300']);
  try {
    const sender = await connectClient(short.url);
    const late = await connectClient(short.url);
    try {
      const destination = `/topic/${randomName('expire-')}`;
      await receipt(sender, id => sender.publish({ destination, body: 'expired', headers: { receipt: id } }));
      await sleep(800); // past the TTL
      const inbox = subscribeInbox(late, destination);
      await receipt(late, id => late.publish({ destination: `/topic/${randomName('sync-')}`, headers: { receipt: id } }));
      assert.equal(inbox.pending, 0, 'nothing older than TTL is delivered');
      // And the feature is on in this broker: a fresh one is kept.
      await receipt(sender, id => sender.publish({ destination: `${destination}-2`, body: 'fresh', headers: { receipt: id } }));
      const inbox2 = subscribeInbox(late, `${destination}-2`);
      assert.equal((await inbox2.next(3000, 'a message younger than TTL')).body, 'fresh');
    } finally {
      await Promise.all([sender, late].map(c => c.deactivate({ force: true })));
    }
  } finally {
    await short.stop();
  }
});
