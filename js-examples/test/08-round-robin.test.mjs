// Scenario 8: round-robin destinations. Subscribers of a destination starting with `#` share its
// messages: each message goes to exactly one of them, in turn. Ten child processes subscribe to
// `#<random>`; 100 messages are sent; each is delivered to exactly one child, and every child gets some.
import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { connectClient, randomName, receipt, startBroker, withTimeout } from '../lib/harness.mjs';

const CHILDREN = 10;
const MESSAGES = 100;
const CHILD = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'lib', 'rr-child.mjs');

let broker;
before(async () => { broker = await startBroker(); });
after(async () => { await broker?.stop(); });

function nextMessage(child, what) {
  return withTimeout(new Promise((resolve, reject) => {
    child.once('message', resolve);
    child.once('exit', code => reject(new Error(`child ${child.pid} exited with ${code}`)));
  }), 20000, what);
}

test(`${MESSAGES} messages to #destination shared by ${CHILDREN} child processes`, { timeout: 60000 }, async () => {
  const destination = `#${randomName()}`;
  const children = Array.from({ length: CHILDREN }, () =>
    fork(CHILD, [broker.url, destination], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] }));
  const sender = await connectClient(broker.url);
  try {
    await Promise.all(children.map(child => nextMessage(child, `child ${child.pid} to subscribe`)));
    for (let i = 0; i < MESSAGES; i++) sender.publish({ destination, body: `${i}` });
    await receipt(sender, id => sender.publish({ destination: `/topic/${randomName('sync-')}`, headers: { receipt: id } }));

    const reports = await Promise.all(children.map(child => {
      const report = nextMessage(child, `child ${child.pid} to report`);
      child.send('sync');
      return report;
    }));
    const perChild = reports.map(r => r.bodies);
    const all = perChild.flat();
    const counts = perChild.map(b => b.length);
    assert.equal(all.length, MESSAGES, `deliveries in all (per child: ${counts.join(', ')})`);
    assert.equal(new Set(all).size, MESSAGES, 'every message delivered exactly once');
    assert.ok(counts.every(n => n > 0), `every child got some: ${counts.join(', ')}`);
    for (const bodies of perChild) {
      const numbers = bodies.map(Number);
      assert.deepEqual(numbers, [...numbers].sort((a, b) => a - b), 'each child sees its share in send order');
    }
  } finally {
    await sender.deactivate({ force: true });
    for (const child of children) {
      if (child.exitCode === null && child.connected) child.send('exit');
    }
    await withTimeout(Promise.all(children.map(child => (child.exitCode !== null ? null
      : new Promise(resolve => child.once('exit', resolve))))), 10000, 'children to exit')
      .catch(() => children.forEach(child => child.kill('SIGKILL')));
  }
});
