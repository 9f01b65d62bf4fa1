// Scenario 12: request/reply (RPC) with @stomp/rx-stomp's RxStompRPC, which sends each request with
// reply-to:/temp-queue/rpc-replies and a correlation-id, and expects the broker to route the answers
// back to its connection (a temporary queue it never subscribes to itself). The responder is a plain
// @stomp/stompjs client answering at whatever reply-to it receives.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { RxStomp, RxStompRPC } from '@stomp/rx-stomp';
import { firstValueFrom, filter, timeout } from 'rxjs';

import { connectClient, openWebSocket, randomName, receipt, startBroker } from '../lib/harness.mjs';

const WAIT = 5000;

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

async function rxClient() {
  const rxStomp = new RxStomp();
  rxStomp.configure({
    webSocketFactory: () => openWebSocket(broker.url),
    reconnectDelay: 0,
    heartbeatIncoming: 0,
    heartbeatOutgoing: 0,
    debug: () => {},
  });
  rxStomp.activate();
  await firstValueFrom(rxStomp.connected$.pipe(timeout(WAIT)));
  return rxStomp;
}

/** A responder on `destination`: answers each request at its reply-to, upper-cased, with its correlation-id. */
async function startResponder(destination) {
  const client = await connectClient(broker.url);
  const seen = [];
  await receipt(client, id => client.subscribe(destination, message => {
    seen.push(message.headers);
    client.publish({
      destination: message.headers['reply-to'],
      body: message.body.toUpperCase(),
      headers: { 'correlation-id': message.headers['correlation-id'] },
    });
  }, { receipt: id }));
  return { client, seen };
}

test('RxStompRPC request/reply over a temporary queue', { timeout: 30000 }, async () => {
  const destination = `/queue/${randomName('rpc-')}`;
  const responder = await startResponder(destination);
  const [alice, bob] = [await rxClient(), await rxClient()];
  try {
    const rpcA = new RxStompRPC(alice);
    const rpcB = new RxStompRPC(bob);
    // Concurrent calls from two connections that use the same temporary queue name: each gets its own answers.
    const calls = [
      ...['a1', 'a2', 'a3'].map(body => [body, rpcA.rpc({ destination, body })]),
      ...['b1', 'b2'].map(body => [body, rpcB.rpc({ destination, body })]),
    ].map(([body, reply$]) => firstValueFrom(reply$.pipe(timeout(WAIT))).then(reply => [body, reply]));
    for (const [body, reply] of await Promise.all(calls)) {
      assert.equal(reply.body, body.toUpperCase());
      assert.equal(reply.headers.destination, '/temp-queue/rpc-replies');
      assert.equal(reply.headers.subscription, '/temp-queue/rpc-replies');
    }
    // The responder saw broker-wide reply names, one per requesting connection, never the private name.
    const replyTo = new Set(responder.seen.map(headers => headers['reply-to']));
    assert.equal(replyTo.size, 2, [...replyTo].join(' '));
    for (const name of replyTo) assert.match(name, /^\/reply-queue\//);
  } finally {
    await Promise.all([alice.deactivate(), bob.deactivate(), responder.client.deactivate({ force: true })]);
  }
});

test('an answer to a requester that has gone is dropped, and its reply name is not reused', { timeout: 30000 }, async () => {
  const destination = `/queue/${randomName('rpc-')}`;
  const responder = await startResponder(destination);
  const first = await rxClient();
  const reply = await firstValueFrom(new RxStompRPC(first).rpc({ destination, body: 'once' }).pipe(timeout(WAIT)));
  assert.equal(reply.body, 'ONCE');
  const goneName = responder.seen[0]['reply-to'];
  await first.deactivate();
  const second = await rxClient();
  try {
    const stray = firstValueFrom(second.unhandledMessage$.pipe(filter(m => m.body === 'too late'), timeout(1000)))
      .then(() => 'delivered', () => 'dropped');
    await receipt(responder.client, id => responder.client.publish({ destination: goneName, body: 'too late', headers: { receipt: id } }));
    assert.equal(await stray, 'dropped');
    const again = await firstValueFrom(new RxStompRPC(second).rpc({ destination, body: 'twice' }).pipe(timeout(WAIT)));
    assert.equal(again.body, 'TWICE');
    assert.notEqual(responder.seen[1]['reply-to'], goneName);
  } finally {
    await Promise.all([second.deactivate(), responder.client.deactivate({ force: true })]);
  }
});
