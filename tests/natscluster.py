"""The NATS JetStream cluster of the cluster tests (stompbroker/tools/natscluster.py), and a node killer.

    cluster = NatsCluster(3)        # 3 nats-servers on free loopback ports, JetStream meta leader elected
    cluster.urls, cluster.url_setting, cluster.kill(i), cluster.restart(i), cluster.stop_all(),
    cluster.start_all(), cluster.close()
    stream_leaders(cluster, ["c_QUEUES_6_0", ...])   # stream -> the server leading it now
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from stompbroker.settings import SETTINGS
from stompbroker.tools.natscluster import (NatsCluster, NatsServer, _get_json, free_ports,  # noqa: F401
                                           nats_server_binary)


# the queue streams' pack size when the nodes keep the default cluster_pack_max (their names hold it)
DEFAULT_PACK = next(s.default for s in SETTINGS if s.name == "cluster_pack_max")


def kill_node(broker) -> None:
    """kill -9 a whole broker node (supervisor and every child, as a crashed machine would)."""
    try:
        os.killpg(broker.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    broker.proc.wait(10)


def stream_leaders(cluster, streams: list[str], timeout: float = 15.0) -> dict[str, str]:
    """stream -> the name of the server leading it, waiting (up to ``timeout``) until each has one."""
    import nats

    async def main():
        nc = await nats.connect(servers=[s.url for s in cluster.servers if s.running])
        try:
            js = nc.jetstream(timeout=5)
            out = {}
            deadline = time.monotonic() + timeout
            for stream in streams:
                while True:
                    try:
                        leader = (await js.stream_info(stream)).cluster.leader
                    except Exception:
                        leader = None
                    if leader or time.monotonic() > deadline:
                        out[stream] = leader
                        break
                    await asyncio.sleep(0.1)
            return out
        finally:
            await nc.close()
    return asyncio.run(main())
