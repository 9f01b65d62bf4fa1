"""The NATS servers of docker/compose.cluster.yaml, run with their exact flags by the pip nats-server
(host names and ports moved to free loopback ports): the flags are accepted and the three servers form
one JetStream cluster with a meta leader."""

import os
import signal
import subprocess
import time

from tests.natscluster import _get_json, free_ports, nats_server_binary
from tests.unit.test_cluster_deploy import flag, nats_servers


def test_compose_nats_commands_form_a_jetstream_cluster(tmp_path):
    nats = nats_servers()
    names = sorted(nats)
    ports = dict(zip(names, (tuple(free_ports(3)) for _ in names)))  # client, route, monitor
    procs = []
    try:
        for name in names:
            client, route, monitor = ports[name]
            cmd = list(nats[name]["command"])
            cmd[cmd.index("--store_dir") + 1] = str(tmp_path / name)
            cmd[cmd.index("--http_port") + 1] = str(monitor)
            cmd[cmd.index("--cluster") + 1] = f"nats://127.0.0.1:{route}"
            routes = flag(cmd, "--routes")
            for other in names:
                routes = routes.replace(f"{other}:6222", f"127.0.0.1:{ports[other][1]}")
            cmd[cmd.index("--routes") + 1] = routes
            log = open(tmp_path / f"{name}.log", "wb")
            procs.append(subprocess.Popen([nats_server_binary(), *cmd, "--addr", "127.0.0.1", "--port", str(client)],
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 30
        while True:
            leaders = set()
            for name in names:
                try:
                    status, _ = _get_json(f"http://127.0.0.1:{ports[name][2]}/healthz")
                    _, jsz = _get_json(f"http://127.0.0.1:{ports[name][2]}/jsz")
                except OSError:
                    status, jsz = 0, {}
                leaders.add((jsz.get("meta_cluster") or {}).get("leader") if status == 200 else None)
            if leaders <= set(names) and len(leaders) == 1:
                break
            assert all(p.poll() is None for p in procs), [(tmp_path / f"{n}.log").read_text() for n in names]
            assert time.monotonic() < deadline, (leaders, [(tmp_path / f"{n}.log").read_text()[-1500:] for n in names])
            time.sleep(0.2)
        _, jsz = _get_json(f"http://127.0.0.1:{ports[names[0]][2]}/jsz")
        assert jsz["meta_cluster"]["cluster_size"] == 3
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
