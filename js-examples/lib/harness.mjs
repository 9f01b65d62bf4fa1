// Shared helpers for the tests and the example programs: start a broker on a free port, open
// @stomp/stompjs clients over the `ws` package, and wait for things with a time bound.
//
// The broker is `python -m stompbroker port=0 ...`, run from the repository root with the
// interpreter in $STOMPBROKER_PYTHON, or ../.venv/bin/python by default. Once it serves it writes
// one JSON line (host, port, pid...) to its `ready_file`, which startBroker waits for.

import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { Client } from '@stomp/stompjs';
import WebSocket from 'ws';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const SUBPROTOCOLS = ['v12.stomp', 'v11.stomp', 'v10.stomp'];

export function pythonPath() {
  return process.env.STOMPBROKER_PYTHON || path.join(REPO_ROOT, '.venv', 'bin', 'python');
}

export function randomName(prefix = '') {
  return prefix + randomBytes(6).toString('hex');
}

export function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

/** Resolve with `promise`, or reject after `ms` milliseconds with a message saying what was awaited. */
export function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

const running = new Set();
process.on('exit', () => {
  for (const broker of running) {
    try { process.kill(-broker.pid, 'SIGKILL'); } catch { /* gone */ }
  }
});

/**
 * Start a broker: `await startBroker(['TTL=5000'])` -> { host, port, url, output(), stop() }.
 * It runs in its own process group; stop() sends SIGTERM, then SIGKILL after `stopTimeoutMs`.
 */
export async function startBroker(settings = [], { timeoutMs = 20000, stopTimeoutMs = 8000 } = {}) {
  const readyFile = path.join(os.tmpdir(), `stompbroker-js-${process.pid}-${randomName()}.ready`);
  const args = ['-m', 'stompbroker', 'port=0', 'processors=4', 'log_level=WARNING', `ready_file=${readyFile}`,
    ...settings];
  const child = spawn(pythonPath(), args, {
    cwd: REPO_ROOT,
    detached: true, // own process group: stop() reaches the reader, dispatcher and writers too
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const broker = { pid: child.pid, host: '127.0.0.1', port: 0, url: '', exited: false };
  running.add(broker);
  let log = '';
  const exited = new Promise(resolve => child.on('exit', (code, signal) => {
    broker.exited = true;
    running.delete(broker);
    rmSync(readyFile, { force: true }); // left behind if the broker was killed
    resolve({ code, signal });
  }));
  const onData = chunk => { log += chunk; };
  child.stdout.setEncoding('utf8').on('data', onData);
  child.stderr.setEncoding('utf8').on('data', onData);
  const ready = new Promise((resolve, reject) => {
    const poll = setInterval(() => {
      let record;
      try {
        record = JSON.parse(readFileSync(readyFile, 'utf8'));
      } catch {
        return; // not written yet (it is renamed into place whole)
      }
      clearInterval(poll);
      resolve(record);
    }, 20);
    child.on('error', err => { clearInterval(poll); reject(err); });
    exited.then(({ code, signal }) => {
      clearInterval(poll);
      reject(new Error(`broker exited (${code ?? signal}) before it was ready:\n${log}`));
    });
  });
  try {
    const { host, port } = await withTimeout(ready, timeoutMs, 'the broker to start');
    broker.host = host === '0.0.0.0' ? '127.0.0.1' : host;
    broker.port = port;
  } catch (err) {
    try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone */ }
    throw err;
  }
  broker.url = `ws://${broker.host}:${broker.port}/stomp`;
  broker.output = () => log;
  broker.stop = async () => {
    if (broker.exited) return;
    try { process.kill(-child.pid, 'SIGTERM'); } catch { return; }
    let timer;
    const killed = new Promise(resolve => {
      timer = setTimeout(() => {
        try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone */ }
        resolve();
      }, stopTimeoutMs);
    });
    await Promise.race([exited, killed]);
    clearTimeout(timer);
    await exited;
  };
  return broker;
}

/** A `ws` WebSocket offering the STOMP subprotocols (Node 20 has no global WebSocket). */
export function openWebSocket(url, protocols = SUBPROTOCOLS, options = {}) {
  return new WebSocket(url, protocols, { perMessageDeflate: false, ...options });
}

/**
 * A connected @stomp/stompjs Client (no reconnection, no heart-beats unless asked).
 * `options` go to the Client; `onSocket(ws)` sees the raw WebSocket (to count messages, say).
 */
export function connectClient(url, options = {}, { timeoutMs = 10000, onSocket } = {}) {
  return new Promise((resolve, reject) => {
    const client = new Client({
      webSocketFactory: () => {
        const socket = openWebSocket(url);
        if (onSocket) onSocket(socket);
        return socket;
      },
      reconnectDelay: 0,
      heartbeatIncoming: 0,
      heartbeatOutgoing: 0,
      connectionTimeout: timeoutMs,
      debug: () => {},
      ...options,
    });
    const timer = setTimeout(() => {
      client.deactivate({ force: true }).catch(() => {});
      reject(new Error(`no CONNECTED from ${url} within ${timeoutMs} ms`));
    }, timeoutMs);
    const userConnect = options.onConnect;
    client.onConnect = frame => {
      clearTimeout(timer);
      client.onConnect = userConnect || (() => {});
      if (userConnect) userConnect(frame);
      resolve(client);
    };
    // Fail the connect on an ERROR or a close before CONNECTED; the caller's handlers still run.
    client.onStompError = frame => {
      clearTimeout(timer);
      reject(new Error(`ERROR from the broker: ${frame.headers.message} ${frame.body}`));
      options.onStompError?.(frame);
    };
    client.onWebSocketClose = event => {
      if (!client.connected) {
        clearTimeout(timer);
        reject(new Error(`WebSocket to ${url} closed before CONNECTED (code ${event?.code}): is a broker listening there?`));
      }
      options.onWebSocketClose?.(event);
    };
    client.activate();
  });
}

/** Send a frame that asks for a receipt and wait for it: `await receipt(client, id => client.publish(...))`. */
export function receipt(client, send, { timeoutMs = 10000, what = 'a RECEIPT' } = {}) {
  const id = randomName('r-');
  const got = new Promise(resolve => client.watchForReceipt(id, resolve));
  send(id);
  return withTimeout(got, timeoutMs, what);
}

/** Subscribe and collect messages; `await inbox.next(ms)` takes them in order. */
export function subscribeInbox(client, destination, headers = {}) {
  const messages = [];
  const waiters = [];
  const subscription = client.subscribe(destination, message => {
    const waiter = waiters.shift();
    if (waiter) waiter(message);
    else messages.push(message);
  }, headers);
  return {
    subscription,
    get pending() { return messages.length; },
    next(ms = 5000, what = `a MESSAGE on ${destination}`) {
      if (messages.length) return Promise.resolve(messages.shift());
      let waiter;
      const got = new Promise(resolve => { waiter = resolve; waiters.push(resolve); });
      return withTimeout(got, ms, what).catch(err => {
        const i = waiters.indexOf(waiter);
        if (i >= 0) waiters.splice(i, 1);
        throw err;
      });
    },
  };
}

/** Deactivate every client, bounded in time. */
export async function closeAll(clients, ms = 10000) {
  await withTimeout(Promise.allSettled(clients.map(c => c.deactivate({ force: true }))), ms, 'clients to close')
    .catch(() => {});
}

/** Open `n` connected clients, `batch` handshakes at a time; `options(i)` gives each one's Client options. */
export async function connectMany(url, n, { batch = 100, options = () => ({}), timeoutMs = 20000 } = {}) {
  const clients = [];
  try {
    for (let start = 0; start < n; start += batch) {
      const count = Math.min(batch, n - start);
      const opened = await Promise.all(Array.from({ length: count }, (_, k) =>
        connectClient(url, options(start + k), { timeoutMs })));
      clients.push(...opened);
    }
  } catch (err) {
    await closeAll(clients);
    throw err;
  }
  return clients;
}
