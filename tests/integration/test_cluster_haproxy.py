"""docker/haproxy.cfg in front of three real cluster nodes on loopback (no Docker: the same config
with the servers' addresses and the ports moved): its health checks see the nodes, leastconn spreads
clients over them, and when a node dies its clients are cut and reconnect through haproxy to a live
node, where a queue message sent before the failure still reaches them."""

from __future__ import annotations

import shutil
import socket
import time

import pytest

from tests.haproxy import Haproxy
from tests.natscluster import kill_node
from tests.stompwire import Wire

pytestmark = [pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy not installed (apt-get install haproxy)"),
              pytest.mark.timeout(120)]


def test_haproxy_spreads_clients_and_moves_a_dead_nodes_clients(start_nodes, tmp_path):
    # the nodes believe the PROXY headers haproxy sends (send-proxy-v2) from loopback
    nodes = start_nodes(3, "cluster_ack_wait_ms=2000", "proxy_protocol=true", "proxy_trusted=127.0.0.1")
    lb = Haproxy([node.port for node in nodes], tmp_path)
    port = lb.port
    clients = []
    try:
        lb.wait_up()  # every node UP by its GET /health_check (sent after a PROXY header)

        for i in range(6):  # leastconn: two each
            w = Wire(socket.create_connection(("127.0.0.1", port), timeout=5))
            w.connect(login=f"c{i}")
            w.frame("SUBSCRIBE", {"destination": "/queue/lb", "id": "s", "ack": "client-individual",
                                  "receipt": "sub"})
            assert w.read()[0] == "RECEIPT"
            clients.append(w)
        assert sorted(n for _, n in lb.stats().values()) == [2, 2, 2]

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
        deadline = time.monotonic() + 5
        while (st := lb.stats())["b2"][1]:  # the cut sessions are gone
            assert time.monotonic() < deadline, st
            time.sleep(0.1)
        assert st["b1"][1] + st["b3"][1] == 6, st
        deadline = time.monotonic() + 15
        while not lb.stats()["b2"][0].startswith("DOWN"):
            assert time.monotonic() < deadline, "haproxy never marked the dead node down"
            time.sleep(0.2)
    finally:
        for w in clients:
            w.close()
        lb.close()
