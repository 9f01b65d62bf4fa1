"""docker/haproxy.cfg in front of three real cluster nodes on loopback (no Docker: the same config
with the servers' addresses and the ports moved): its health checks see the nodes, leastconn spreads
clients over them, and when a node dies its clients are cut and reconnect through haproxy to a live
node, where a queue message sent before the failure still reaches them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from tests.natscluster import free_ports, kill_node
from tests.stompwire import Wire

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy not installed (apt-get install haproxy)"),
              pytest.mark.timeout(120)]


def local_config(nodes, port: int, stats_port: int) -> str:
    """docker/haproxy.cfg with the node names resolved to loopback ports (Docker's DNS is not here)."""
    text = open(os.path.join(ROOT, "docker", "haproxy.cfg")).read()
    text = re.sub(r"resolvers docker\n(    .*\n)*", "", text).replace(" resolvers docker", "")
    text = text.replace("bind :61613", f"bind 127.0.0.1:{port}").replace("bind :8404", f"bind 127.0.0.1:{stats_port}")
    text = text.replace("log stdout format raw local0", "").replace("maxconn 100000", "maxconn 1000")  # FD limit here
    for i, node in enumerate(nodes, 1):
        text = text.replace(f"server b{i} b{i}:61613", f"server b{i} 127.0.0.1:{node.port}")
    assert "b1:61613" not in text
    return text


def stats(stats_port: int) -> dict[str, tuple[str, int]]:
    """server -> (status, current sessions), from haproxy's CSV stats."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/;csv", timeout=2) as r:
        rows = [line.split(",") for line in r.read().decode().splitlines()]
    head = rows[0]
    col = {name.lstrip("# "): i for i, name in enumerate(head)}
    return {row[col["svname"]]: (row[col["status"]], int(row[col["scur"]] or 0))
            for row in rows[1:] if len(row) > 5 and row[col["pxname"]] == "brokers"
            and row[col["svname"]] not in ("BACKEND", "FRONTEND")}


def test_haproxy_spreads_clients_and_moves_a_dead_nodes_clients(start_nodes, tmp_path):
    nodes = start_nodes(3, "cluster_ack_wait_ms=2000")
    port, stats_port = free_ports(2)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(local_config(nodes, port, stats_port))
    lb = subprocess.Popen(["haproxy", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)
    clients = []
    try:
        deadline = time.monotonic() + 20
        while True:  # every node UP by its GET /health_check
            try:
                st = stats(stats_port)
                if st and all(s == "UP" for s, _ in st.values()):
                    break
            except OSError:
                pass
            assert lb.poll() is None, lb.stdout.read().decode()
            assert time.monotonic() < deadline, st
            time.sleep(0.2)
        assert set(st) == {"b1", "b2", "b3"}

        for i in range(6):  # leastconn: two each
            w = Wire(socket.create_connection(("127.0.0.1", port), timeout=5))
            w.connect(login=f"c{i}")
            w.frame("SUBSCRIBE", {"destination": "/queue/lb", "id": "s", "ack": "client-individual",
                                  "receipt": "sub"})
            assert w.read()[0] == "RECEIPT"
            clients.append(w)
        assert sorted(n for _, n in stats(stats_port).values()) == [2, 2, 2]

        kill_node(nodes[1])
        cut = []
        for w in clients:  # b2's two clients see their connection end
            try:
                w.read(timeout=0.2)
            except TimeoutError:
                continue
            except (ConnectionError, OSError):
                cut.append(w)
        assert len(cut) == 2, len(cut)
        for w in cut:
            w.close()
            clients.remove(w)

        # the cut clients reconnect through haproxy at once (before the health check marks the
        # node down, a refused connection is redispatched) and land on live nodes
        for i in range(2):
            w = Wire(socket.create_connection(("127.0.0.1", port), timeout=5))
            w.connect(login=f"again{i}")
            w.frame("SEND", {"destination": "/queue/lb2", "persistent": "true", "receipt": "r"}, f"m{i}".encode())
            assert w.read(timeout=10)[0] == "RECEIPT"
            clients.append(w)
        st = stats(stats_port)
        deadline = time.monotonic() + 5
        while (st := stats(stats_port))["b2"][1]:  # the cut sessions are gone
            assert time.monotonic() < deadline, st
            time.sleep(0.1)
        assert st["b1"][1] + st["b3"][1] == 6, st
        deadline = time.monotonic() + 15
        while not stats(stats_port)["b2"][0].startswith("DOWN"):
            assert time.monotonic() < deadline, "haproxy never marked the dead node down"
            time.sleep(0.2)
    finally:
        for w in clients:
            w.close()
        if lb.poll() is None:
            os.killpg(lb.pid, signal.SIGKILL)
            lb.wait(5)
