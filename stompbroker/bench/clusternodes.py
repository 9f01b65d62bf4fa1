"""The pieces of a cluster run (``stompbroker-bench cluster``): a NATS JetStream cluster and broker
nodes on it, measured as one; interest keepers; where connections go."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from ..cluster import packs
from ..settings import BY_LOWER
from .procs import SpawnedBroker
from .wire import BenchError, Target


class Nodes:
    """Several spawned brokers measured as one: CPU per node and process (``n0:dispatcher``...) and
    of the NATS servers (``nats0``...), all in the total: the cluster's whole cost."""

    def __init__(self, brokers: list, nats=None, label: str = "cluster"):
        self.brokers = brokers
        self.nats = nats
        self.label = label

    def cpu(self) -> dict:
        import psutil

        out = {"_total": 0.0}
        for i, b in enumerate(self.brokers):
            for role, seconds in b.cpu().items():
                if role == "_total":
                    out["_total"] += seconds
                else:
                    out[f"n{i}:{role}"] = seconds
        for s in (self.nats.servers if self.nats else []):
            try:
                t = psutil.Process(s.proc.pid).cpu_times()
            except (psutil.Error, AttributeError):
                continue
            out[s.name] = t.user + t.system
            out[s.name + ":sys"] = t.system
            out["_total"] += t.user + t.system
        return out

    def counters(self) -> dict:
        """System calls and context switches per node process (BrokerProcs.counters, prefixed)."""
        return {f"n{i}:{role}": c for i, b in enumerate(self.brokers) for role, c in b.counters().items()}

    def processes(self) -> list:
        return [p for b in self.brokers for p in b.processes()]

    def pss(self):
        """PSS of every node's processes and of the NATS servers (total, by process)."""
        import psutil

        total, by = 0, {}
        for i, b in enumerate(self.brokers):
            node_total, node_by = b.pss()
            total += node_total or 0
            by.update({f"n{i}:{role}": v for role, v in node_by.items()})
        for s in (self.nats.servers if self.nats else []):
            try:
                by[s.name] = psutil.Process(s.proc.pid).memory_full_info().pss
            except (psutil.Error, AttributeError):
                continue
            total += by[s.name]
        return total, by


def setting(node_args: list[str], name: str) -> int:
    """An integer setting as the nodes get it: the last ``name=`` of their arguments, else its default."""
    return next((int(a.split("=", 1)[1]) for a in reversed(node_args) if a.startswith(f"{name}=")),
                BY_LOWER[name].default)


def target_of(broker, o) -> Target:
    return Target("127.0.0.1", broker.port, f"ws://127.0.0.1:{broker.port}/ws", o.login, o.passcode, o.vhost)


class Cluster:
    """A NATS cluster and ``n`` broker nodes on it, for one run."""

    def __init__(self, n: int, nats_servers: int, node_args: list[str], extra_env: dict | None = None,
                 own_server: bool = False, tagged: bool = False):
        """``own_server``: node i is given NATS server i (modulo their number) alone, as a node
        beside its own NATS server would be (it still learns the others for reconnecting).
        ``tagged``: NATS server i carries the tag ``server<i>`` and the nodes place shard i on
        server i mod their number (``cluster_placement_tags``)."""
        from ..tools.natscluster import NatsCluster

        self.nats = NatsCluster(nats_servers, tagged=tagged)
        if tagged:
            node_args = [*node_args, f"cluster_placement_tags={','.join(self.nats.tags)}"]
        self.name = f"bench{os.getpid()}x{time.monotonic_ns() % 10**9}"
        # the nodes' queue layout: shard count and pack size (cluster/shards.py: which stream holds a queue)
        self.streams = setting(node_args, "cluster_streams")
        self.pack = packs.size(SimpleNamespace(cluster_pack_max=setting(node_args, "cluster_pack_max"),
                                               max_queue_messages=setting(node_args, "max_queue_messages")))
        self.nodes = []
        urls = self.nats.urls
        try:
            for i in range(n):
                where = urls[i % len(urls)] if own_server else self.nats.url_setting
                self.nodes.append(SpawnedBroker([f"cluster={where}", f"cluster_name={self.name}",
                                                 f"node_id=n{i}", *node_args], extra_env))
            time.sleep(0.5)  # every process started, every bridge connected
        except BaseException:
            self.close()
            raise

    def stored(self, destinations: list[str]) -> int | None:
        """JetStream messages the streams of these queues ever stored (their last sequence numbers;
        each destination's shard once): with packs, fewer than the messages. None if NATS did not say."""
        import asyncio

        from ..cluster import shards

        names = {shards.stream_name(self.name, shards.QUEUES, self.streams, shards.shard_of(d, self.streams), self.pack)
                 for d in destinations}

        async def main():
            import nats
            nc = await nats.connect(self.nats.urls)
            try:
                js = nc.jetstream(timeout=10)
                return sum([(await js.stream_info(name)).state.last_seq for name in sorted(names)])
            finally:
                await nc.close()
        try:
            return asyncio.run(main())
        except Exception:
            return None

    def close(self) -> None:
        for b in self.nodes:
            b.stop()
        self.nats.close()


class Keepers:
    """One connection per consumer node subscribed to the destination with a selector nothing
    matches: it makes the node announce its interest before the run (runner.flow starts the producer
    as soon as the consumers' SUBSCRIBEs are in, sooner than interest crosses the cluster), costs a
    selector test per message, and receives nothing. A probe on the same connection, subscribed
    after it, tells when node ``source`` (the publishing one) knows: a node's interest entry is
    written whole, in order."""

    def __init__(self, cluster, o, destinations: list[str], nodes: list[int], timeout: float = 20.0, source: int = 0):
        self.socks = []
        try:
            for k in nodes:
                self.socks.append(self._keep(cluster, o, k, destinations, timeout, source))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _connect(t: Target):
        import socket
        s = socket.create_connection((t.host, t.port), timeout=5)
        login = f"login:{t.login}\npasscode:{t.passcode}\n" if t.login else ""
        s.sendall(f"CONNECT\naccept-version:1.2\nhost:{t.vhost or '/'}\n{login}\n\0".encode())
        return s

    def _keep(self, cluster, o, k: int, destinations: list[str], timeout: float, source: int):
        from ..tools.client import FrameReader, decode

        keeper = self._connect(target_of(cluster.nodes[k], o))
        probe = f"/topic/bench-probe-n{k}-{time.monotonic_ns()}"
        keeper.sendall("".join(f"SUBSCRIBE\ndestination:{d}\nid:keep{i}\nselector:1 = 0\n\n\0"
                               for i, d in enumerate(destinations)).encode()
                       + f"SUBSCRIBE\ndestination:{probe}\nid:probe\n\n\0".encode())
        pub = self._connect(target_of(cluster.nodes[source], o))
        reader = FrameReader()
        try:
            deadline = time.monotonic() + timeout
            while True:
                if time.monotonic() > deadline:
                    raise BenchError(f"interest of node {k} did not reach node {source} within {timeout} s")
                pub.sendall(f"SEND\ndestination:{probe}\n\nprobe\0".encode())
                keeper.settimeout(0.3)
                try:
                    data = keeper.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    raise BenchError(f"node {k} closed the keeper connection")
                reader.feed(data)
                if any(decode(*raw).command == "MESSAGE" for raw in iter(reader.next, None)):
                    keeper.sendall(b"UNSUBSCRIBE\nid:probe\n\n\0")
                    return keeper
        finally:
            pub.close()

    def close(self) -> None:
        for s in self.socks:
            s.close()


def remote_nodes(n_nodes: int, count: int) -> list[int]:
    """Node index per connection: ``count`` connections spread over nodes 1..n-1."""
    others = list(range(1, n_nodes)) or [0]
    return [others[i % len(others)] for i in range(count)]


def consumers_on(runner, cluster, transport: str, dest: str, where: list[int]) -> list[dict]:
    specs = []
    per_node_procs = max(runner.opts.consumer_procs // max(len(set(where)), 1), 1)
    for node in sorted(set(where)):
        links = [[(dest, "0", [])] for w in where if w == node]
        specs += runner.consumer_specs(target_of(cluster.nodes[node], runner.opts), transport, links, per_node_procs)
    return specs
