// Scenario 2: ACK and NACK in client and client-individual modes (NACK means redelivery), and
// transactions (BEGIN / COMMIT / ABORT). Deliveries for one connection stay in order, so a RECEIPT
// asked for after a frame proves everything that frame caused has already arrived.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Versions } from '@stomp/stompjs';

import { connectClient, randomName, receipt, startBroker, subscribeInbox, withTimeout } from '../lib/harness.mjs';

const WAIT = 3000; // per expected message: short, so a missing feature fails fast

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

async function withClient(fn, options = {}) {
  const client = await connectClient(broker.url, options);
  try {
    await fn(client);
  } finally {
    await client.deactivate({ force: true });
  }
}

/** Publish bodies, then wait for a receipt: all of their deliveries to `client` are in by then. */
async function publishAll(client, destination, bodies, headers = {}) {
  for (const body of bodies) client.publish({ destination, body, headers });
  await receipt(client, id => client.publish({ destination: `/topic/${randomName('sync-')}`, body: '', headers: { receipt: id } }));
}

async function sync(client) {
  await receipt(client, id => client.publish({ destination: `/topic/${randomName('sync-')}`, body: '', headers: { receipt: id } }));
}

test('client mode: MESSAGE carries an ack header (STOMP 1.2)', { timeout: 15000 }, async () => {
  await withClient(async client => {
    const destination = `/queue/${randomName()}`;
    const inbox = subscribeInbox(client, destination, { ack: 'client' });
    await publishAll(client, destination, ['one']);
    const message = await inbox.next(WAIT);
    assert.ok(message.headers.ack, `MESSAGE for an ack:client subscription needs an ack header: ${JSON.stringify(message.headers)}`);
    await receipt(client, id => client.ack(message.headers.ack, inbox.subscription.id, { receipt: id }));
  });
});

test('client mode: NACK redelivers, a cumulative ACK does not', { timeout: 20000 }, async () => {
  await withClient(async client => {
    const destination = `/queue/${randomName()}`;
    const inbox = subscribeInbox(client, destination, { ack: 'client' });
    await publishAll(client, destination, ['m1', 'm2', 'm3']);
    const [m1, m2, m3] = [await inbox.next(WAIT), await inbox.next(WAIT), await inbox.next(WAIT)];
    assert.deepEqual([m1.body, m2.body, m3.body], ['m1', 'm2', 'm3']);
    assert.ok(m2.headers.ack && m3.headers.ack, 'ack headers on client-mode deliveries');
    // ACK m2: in client mode it acknowledges m1 and m2.
    await receipt(client, id => m2.ack({ receipt: id }));
    // NACK m3: it comes back, and only it.
    await receipt(client, id => m3.nack({ receipt: id }));
    const again = await inbox.next(WAIT, 'the NACKed message to be redelivered');
    assert.equal(again.body, 'm3');
    await receipt(client, id => again.ack({ receipt: id }));
    await sync(client);
    assert.equal(inbox.pending, 0, 'acknowledged messages are not redelivered');
  });
});

test('client-individual mode: ACK and NACK one message each', { timeout: 20000 }, async () => {
  await withClient(async client => {
    const destination = `/queue/${randomName()}`;
    const inbox = subscribeInbox(client, destination, { ack: 'client-individual' });
    await publishAll(client, destination, ['i1', 'i2', 'i3']);
    const [i1, i2, i3] = [await inbox.next(WAIT), await inbox.next(WAIT), await inbox.next(WAIT)];
    assert.ok(i1.headers.ack && i2.headers.ack && i3.headers.ack, 'ack headers on client-individual deliveries');
    await receipt(client, id => i2.ack({ receipt: id }));   // only i2
    await receipt(client, id => i1.nack({ receipt: id }));  // i1 again
    const again = await inbox.next(WAIT, 'the NACKed message to be redelivered');
    assert.equal(again.body, 'i1');
    await receipt(client, id => again.ack({ receipt: id }));
    await receipt(client, id => i3.ack({ receipt: id }));
    await sync(client);
    assert.equal(inbox.pending, 0);
  });
});

test('STOMP 1.1: ACK and NACK by message-id and subscription', { timeout: 20000 }, async () => {
  await withClient(async client => {
    assert.equal(client.connectedVersion, '1.1');
    const destination = `/queue/${randomName()}`;
    const inbox = subscribeInbox(client, destination, { ack: 'client-individual' });
    await publishAll(client, destination, ['v11']);
    const message = await inbox.next(WAIT);
    await receipt(client, id => message.nack({ receipt: id }));
    const again = await inbox.next(WAIT, 'redelivery after a 1.1 NACK');
    assert.equal(again.body, 'v11');
    await receipt(client, id => again.ack({ receipt: id }));
  }, { stompVersions: new Versions(['1.1']) });
});

test('auto mode needs no ACK, and is not redelivered', { timeout: 15000 }, async () => {
  await withClient(async client => {
    const destination = `/queue/${randomName()}`;
    const inbox = subscribeInbox(client, destination);
    await publishAll(client, destination, ['a1', 'a2']);
    assert.equal((await inbox.next(WAIT)).body, 'a1');
    assert.equal((await inbox.next(WAIT)).body, 'a2');
    await sync(client);
    assert.equal(inbox.pending, 0);
  });
});

test('transaction: sends are held until COMMIT, in order', { timeout: 15000 }, async () => {
  await withClient(async client => {
    const destination = `/topic/${randomName()}`;
    const inbox = subscribeInbox(client, destination);
    const tx = client.begin(randomName('tx-'));
    client.publish({ destination, body: 'tx-1', headers: { transaction: tx.id } });
    client.publish({ destination, body: 'tx-2', headers: { transaction: tx.id } });
    await publishAll(client, destination, ['outside']);
    assert.equal((await inbox.next(WAIT)).body, 'outside');
    assert.equal(inbox.pending, 0, 'transactional sends are not delivered before COMMIT');
    tx.commit();
    await sync(client);
    assert.deepEqual([(await inbox.next(WAIT)).body, (await inbox.next(WAIT)).body], ['tx-1', 'tx-2']);
  });
});

test('transaction: ABORT discards the sends', { timeout: 15000 }, async () => {
  await withClient(async client => {
    const destination = `/topic/${randomName()}`;
    const inbox = subscribeInbox(client, destination);
    const tx = client.begin(randomName('tx-'));
    client.publish({ destination, body: 'aborted', headers: { transaction: tx.id } });
    tx.abort();
    await publishAll(client, destination, ['after abort']);
    assert.equal((await inbox.next(WAIT)).body, 'after abort');
    assert.equal(inbox.pending, 0, 'an aborted send is never delivered');
  });
});

test('transaction: ACK inside a transaction, NACK after ABORT redelivers', { timeout: 20000 }, async () => {
  await withClient(async client => {
    const destination = `/queue/${randomName()}`;
    const inbox = subscribeInbox(client, destination, { ack: 'client-individual' });
    await publishAll(client, destination, ['t1', 't2']);
    const [t1, t2] = [await inbox.next(WAIT), await inbox.next(WAIT)];
    assert.ok(t1.headers.ack && t2.headers.ack, 'ack headers on client-individual deliveries');
    const committed = client.begin(randomName('tx-'));
    t1.ack({ transaction: committed.id });
    committed.commit();
    const aborted = client.begin(randomName('tx-'));
    t2.ack({ transaction: aborted.id });
    aborted.abort(); // the ACK of t2 is undone: t2 is still unacknowledged
    await receipt(client, id => t2.nack({ receipt: id }));
    assert.equal((await inbox.next(WAIT, 'redelivery of t2')).body, 't2');
    await sync(client);
    assert.equal(inbox.pending, 0, 't1 was acknowledged by the committed transaction');
  });
});

test('transaction errors: COMMIT of an unknown transaction, BEGIN twice', { timeout: 15000 }, async () => {
  for (const frames of [
    client => client.commit(randomName('nope-')),
    client => { const id = randomName('dup-'); client.begin(id); client.begin(id); },
  ]) {
    const client = await connectClient(broker.url);
    try {
      const error = new Promise(resolve => { client.onStompError = resolve; });
      frames(client);
      const frame = await withTimeout(error, WAIT, 'an ERROR frame');
      assert.ok(frame.headers.message);
    } finally {
      await client.deactivate({ force: true });
    }
  }
});
