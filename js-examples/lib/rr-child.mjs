// A child process of the round-robin test: `node lib/rr-child.mjs URL DESTINATION`, started with
// an IPC channel (child_process.fork). It subscribes, reports {ready}, and on {sync} makes a
// receipt round trip (so everything routed to it has arrived) and reports {bodies}.
import { connectClient, receipt } from './harness.mjs';

const [url, destination] = process.argv.slice(2);
const bodies = [];
const lifetime = setTimeout(() => process.exit(3), 60000); // never outlive a stuck test
lifetime.unref();

const client = await connectClient(url);
await receipt(client, id => client.subscribe(destination, message => bodies.push(message.body), { receipt: id }));
process.send({ ready: true, pid: process.pid });

process.on('message', async command => {
  if (command === 'sync') {
    await receipt(client, id => client.publish({ destination: '/topic/rr-sync', headers: { receipt: id } }));
    process.send({ bodies });
  } else if (command === 'exit') {
    await client.deactivate({ force: true });
    process.exit(0);
  }
});
process.on('disconnect', () => process.exit(0));
