// Shared by the example programs: where the broker is. With --url (or $STOMP_URL) they connect to
// a running broker; without, they start one of their own on a free port (like the tests) and stop
// it when they finish.
import { startBroker } from '../lib/harness.mjs';

export async function brokerUrl(url, settings = []) {
  url = url || process.env.STOMP_URL;
  if (url) return { url, stop: async () => {} };
  const broker = await startBroker(settings);
  console.error(`(started a broker for this example: ${broker.url})`);
  return { url: broker.url, stop: broker.stop };
}

export function onInterrupt(stop) {
  let stopping = false;
  const handler = async () => {
    if (stopping) process.exit(130);
    stopping = true;
    await stop();
    process.exit(0);
  };
  process.on('SIGINT', handler);
  process.on('SIGTERM', handler);
}
