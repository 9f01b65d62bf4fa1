"""The NATS JetStream cluster of the cluster tests (stompbroker/tools/natscluster.py), and a node killer.

    cluster = NatsCluster(3)        # 3 nats-servers on free loopback ports, JetStream meta leader elected
    cluster.urls, cluster.url_setting, cluster.kill(i), cluster.restart(i), cluster.stop_all(),
    cluster.start_all(), cluster.close()
"""

from __future__ import annotations

import os
import signal

from stompbroker.tools.natscluster import (NatsCluster, NatsServer, _get_json, free_ports,  # noqa: F401
                                           nats_server_binary)


def kill_node(broker) -> None:
    """kill -9 a whole broker node (supervisor and every child, as a crashed machine would)."""
    try:
        os.killpg(broker.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    broker.proc.wait(10)
