"""Failures of a cluster under load, counted: three broker nodes on a real 3-server NATS JetStream
cluster, producers and consumers on every node (raw STOMP sockets, one thread each).

- kill -9 of one broker node: its clients reconnect to another node and go on; 0 receipted
  persistent messages lost; the messages it had delivered unacknowledged come back to consumers on
  other nodes with redelivered:true.
- kill -9 of one NATS server: 0 receipted messages lost; the nodes reconnect by themselves.
- the whole backplane down: local topic traffic keeps flowing, a SEND that needs the backplane gets
  an ERROR `cluster unavailable` (not silence, not an endless wait); the node recovers by itself.

Every load loop is bounded in count and in time. The counts go to stdout (pytest -s) and into the
assertion messages: sent, receipted, delivered, lost, duplicated.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict

import pytest

from stompbroker.cluster import shards
from tests.natscluster import DEFAULT_PACK, _get_json, kill_node, stream_leaders
from tests.stompwire import Wire

pytestmark = pytest.mark.timeout(120)

ACK_WAIT_MS = 2000
TIMEOUT_MS = 3000
NODE_SETTINGS = (f"cluster_ack_wait_ms={ACK_WAIT_MS}", f"cluster_timeout_ms={TIMEOUT_MS}")
QUEUE = "/queue/faults"
MAX_PER_PRODUCER = 3000   # bound in count (the load phase also ends after a few seconds)


def connect(node, name: str) -> Wire:
    w = Wire(socket.create_connection(node.address, timeout=5))
    w.connect(login=name)
    return w


class Stats:
    """What every producer and consumer saw, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent: set[str] = set()          # ids offered at least once
        self.receipted: set[str] = set()
        self.deliveries: dict[str, list[tuple[str, bool]]] = defaultdict(list)  # id -> [(node, redelivered)]
        self.errors: list[str] = []           # ERROR messages producers got
        self.reconnects = 0

    def counts(self) -> dict:
        with self.lock:
            delivered = set(self.deliveries)
            return {
                "sent": len(self.sent),
                "receipted": len(self.receipted),
                "delivered": len(delivered),
                "lost": len(self.receipted - delivered),  # a receipt is a promise
                "unreceipted_delivered": len(delivered - self.receipted),
                "duplicated": sum(len(d) - 1 for d in self.deliveries.values()),
                "duplicated_unflagged": sum(1 for d in self.deliveries.values() for _, r in d[1:] if not r),
                "redelivered": sum(1 for d in self.deliveries.values() for _, r in d if r),
                "errors": len(self.errors),
                "reconnects": self.reconnects,
            }


class Producer(threading.Thread):
    """Persistent SENDs with a receipt each, one at a time; a SEND without a receipt (node died,
    ERROR) is sent again with the same dedup-id on the next node of the list, so it is stored once."""

    def __init__(self, name: str, nodes: list, first: int, stats: Stats, stop: threading.Event, queue: str = QUEUE):
        super().__init__(name=name, daemon=True)
        self.tag, self.nodes, self.at, self.stats, self.stop_event = name, nodes, first, stats, stop
        self.queue = queue
        self.failure: BaseException | None = None
        self.receipted_on: dict[int, int] = defaultdict(int)  # node index -> receipts from it
        self.receipt_times: list[float] = []                  # when each receipt came (monotonic)
        self.retried: set[str] = set()                        # ids sent again (no receipt the first time)

    def run(self):
        try:
            self._run()
        except BaseException as exc:  # reported by the test
            self.failure = exc

    def _run(self):
        w = connect(self.nodes[self.at], self.tag)
        seq = 0
        while not self.stop_event.is_set() and seq < MAX_PER_PRODUCER:
            mid = f"{self.tag}-{seq:05d}"
            with self.stats.lock:
                self.stats.sent.add(mid)
            try:
                w.frame("SEND", {"destination": self.queue, "persistent": "true", "receipt": mid, "dedup-id": mid},
                        mid.encode())
                cmd, headers, body = w.read(timeout=TIMEOUT_MS / 1000 + 10)
            except (OSError, ConnectionError, TimeoutError):
                w = self._reconnect(w)
                self.retried.add(mid)
                continue  # the same id again
            if cmd == "RECEIPT" and headers.get("receipt-id") == mid:
                with self.stats.lock:
                    self.stats.receipted.add(mid)
                self.receipted_on[self.at] += 1
                self.receipt_times.append(time.monotonic())
                seq += 1
            elif cmd == "ERROR":
                with self.stats.lock:
                    self.stats.errors.append(headers.get("message", ""))
                w = self._reconnect(w)  # an ERROR closes the connection; the same id again
                self.retried.add(mid)
            else:
                raise AssertionError(f"{self.tag}: unexpected {cmd} {headers}")
        w.close()

    def _reconnect(self, w: Wire) -> Wire:
        w.close()
        with self.stats.lock:
            self.stats.reconnects += 1
        deadline = time.monotonic() + 30
        while True:
            self.at = (self.at + 1) % len(self.nodes)
            try:
                return connect(self.nodes[self.at], self.tag)
            except (OSError, ConnectionError, TimeoutError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class Consumer(threading.Thread):
    """client-individual acks that lag ``hold`` messages behind (so a node always has some of them
    delivered and unacknowledged); on a lost connection it goes to the next node and subscribes again."""

    def __init__(self, name: str, nodes: list, first: int, stats: Stats, stop: threading.Event,
                 draining: threading.Event, hold: int = 5, queue: str = QUEUE):
        super().__init__(name=name, daemon=True)
        self.tag, self.nodes, self.at, self.stats = name, nodes, first, stats
        self.queue = queue
        self.stop_event, self.draining, self.hold = stop, draining, hold
        self.held: list[tuple[str, str]] = []   # (ack id, message id) delivered, not acknowledged yet
        self.held_at_kill: dict[int, list[str]] = {}
        self.got_on: dict[int, int] = defaultdict(int)  # node index -> deliveries from it
        self.failure: BaseException | None = None
        self.subscribed = threading.Event()

    def run(self):
        try:
            self._run()
        except BaseException as exc:
            self.failure = exc

    def _subscribe(self) -> Wire:
        w = connect(self.nodes[self.at], self.tag)
        w.frame("SUBSCRIBE", {"destination": self.queue, "id": "s", "ack": "client-individual",
                              "prefetch-count": "20", "receipt": "sub"})
        assert w.read()[0] == "RECEIPT"
        self.subscribed.set()
        return w

    def _run(self):
        w = self._subscribe()
        while not self.stop_event.is_set():
            try:
                cmd, headers, body = w.read(timeout=0.2)
            except TimeoutError:
                if self.draining.is_set():
                    self._ack_held(w, 0)
                continue
            except (OSError, ConnectionError):
                w = self._reconnect(w)
                continue
            assert cmd == "MESSAGE", (cmd, headers, body)
            mid = body.decode()
            with self.stats.lock:
                self.stats.deliveries[mid].append((self.nodes[self.at].node, headers.get("redelivered") == "true"))
            self.held.append((headers["ack"], mid))
            self.got_on[self.at] += 1
            try:
                self._ack_held(w, 0 if self.draining.is_set() else self.hold)
            except (OSError, ConnectionError):
                w = self._reconnect(w)
        w.close()

    def _ack_held(self, w: Wire, keep: int) -> None:
        while len(self.held) > keep:
            ack_id, _ = self.held.pop(0)
            w.frame("ACK", {"id": ack_id})

    def _reconnect(self, w: Wire) -> Wire:
        w.close()
        self.held_at_kill[self.at] = [mid for _, mid in self.held]  # the dead node must hand these on
        self.held = []
        with self.stats.lock:
            self.stats.reconnects += 1
        deadline = time.monotonic() + 30
        while True:
            self.at = (self.at + 1) % len(self.nodes)
            try:
                return self._subscribe()
            except (OSError, ConnectionError, TimeoutError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def run_load(nodes, during, load_s: float = 6.0, fault_at: float = 2.5, drain_s: float = 25.0,
             fault_when=None, went_on=None):
    """Producers and consumers on every node; ``during()`` at ``fault_at`` s into the load (and,
    given ``fault_when(consumers)``, not before it holds: up to 20 s more); the load goes on until
    ``load_s`` (and, given ``went_on(producers, consumers)``, until it holds: up to 20 s more); then
    the producers stop, the consumers ack everything and the run waits until every receipted
    message was delivered (or ``drain_s``). Returns (stats, producers, consumers)."""
    for i, n in enumerate(nodes):
        n.node = f"n{i}"
    stats, stop_producers, stop_consumers, draining = Stats(), threading.Event(), threading.Event(), threading.Event()
    consumers = [Consumer(f"c{i}", nodes, i, stats, stop_consumers, draining) for i in range(len(nodes))]
    producers = [Producer(f"p{i}", nodes, i, stats, stop_producers) for i in range(len(nodes))]
    for c in consumers:
        c.start()
    for c in consumers:
        assert c.subscribed.wait(10), c.failure
    time.sleep(0.3)  # every node bound the queue's consumer
    for p in producers:
        p.start()
    try:
        time.sleep(fault_at)
        if fault_when is not None:
            deadline = time.monotonic() + 20
            while not fault_when(consumers):
                assert time.monotonic() < deadline, "the fault's condition never held"
                time.sleep(0.05)
        during()
        time.sleep(max(load_s - fault_at, 0))
        deadline = time.monotonic() + 20   # (a loaded machine can take seconds to move a client over)
        while went_on is not None and not went_on(producers, consumers) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop_producers.set()
        for p in producers:
            p.join(TIMEOUT_MS / 1000 + 40)
        draining.set()
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline:
            with stats.lock:
                if stats.receipted <= set(stats.deliveries):
                    break
            time.sleep(0.1)
        time.sleep(0.5)  # anything delivered twice shows up now
        stop_consumers.set()
        for c in consumers:
            c.join(10)
    failures = [t.failure for t in producers + consumers if t.failure]
    assert not failures, failures
    assert not any(t.is_alive() for t in producers + consumers)
    return stats, producers, consumers


def report(name: str, counts: dict) -> str:
    line = f"cluster fault {name}: " + " ".join(f"{k}={v}" for k, v in counts.items())
    print(line)
    return line


def test_kill_9_one_broker_node_of_three_under_load(start_nodes):
    nodes = start_nodes(3, *NODE_SETTINGS)
    victim = 1
    killed_at = []

    def kill():
        killed_at.append(time.monotonic())
        kill_node(nodes[victim])

    def elsewhere(counts: dict) -> int:
        return sum(n for i, n in list(counts.items()) if i != victim)   # (list: taken at once, threads add)

    # a loaded machine can take seconds before the victim's puller delivers: kill it holding some;
    # the load goes on until the victim's clients are served by the other nodes (or 20 s more)
    stats, producers, consumers = run_load(
        nodes, kill, fault_when=lambda cs: len(cs[victim].held) > 0,
        went_on=lambda ps, cs: elsewhere(ps[victim].receipted_on) > 10 and elsewhere(cs[victim].got_on) > 0)
    c = stats.counts()
    line = report("kill -9 broker node", c)
    assert c["sent"] > 100 and c["receipted"] > 100, line  # there was load
    assert c["lost"] == 0, line
    assert c["duplicated_unflagged"] == 0, line  # a second delivery is a redelivery, and says so
    # the queue (a few thousand messages, each alone for its dedup-id) is far from max_queue_messages:
    # never 'queue full' (with cluster_pack_max=64 it was, at 1,562 JetStream messages)
    assert "queue full" not in stats.errors, (sorted(set(stats.errors)), line)
    # the killed node's clients went elsewhere and went on
    assert c["reconnects"] >= 2, line
    moved = {i: n for i, n in producers[victim].receipted_on.items() if i != victim}
    assert sum(moved.values()) > 10, (producers[victim].receipted_on, line)
    moved = {i: n for i, n in consumers[victim].got_on.items() if i != victim}
    assert sum(moved.values()) > 0, (consumers[victim].got_on, line)
    # what the dead node had delivered unacknowledged came back elsewhere, marked redelivered
    held = [mid for c_ in consumers for mid in c_.held_at_kill.get(victim, [])]
    assert held, "the consumer on the killed node held no unacknowledged messages"
    for mid in held:
        again = [(node, r) for node, r in stats.deliveries[mid][1:]]
        assert again and all(node != "n1" and r for node, r in again), (mid, stats.deliveries[mid], line)
    print(f"cluster fault kill -9 broker node: {len(held)} unacked on the dead node, all redelivered elsewhere")


def nats_connections(nats_cluster) -> dict[str, int]:
    """node name -> index of the NATS server its bridge is connected to (from each server's /connz)."""
    out = {}
    for s in nats_cluster.servers:
        if not s.running:
            continue
        try:
            _, connz = _get_json(f"{s.monitor_url}/connz?limit=1000")
        except OSError:
            continue
        for conn in connz.get("connections") or []:
            if conn.get("name"):
                out[conn["name"]] = s.index
    return out


def test_kill_9_one_nats_server_of_three_under_load(start_nodes, nats_cluster, cluster_name):
    nodes = start_nodes(3, *NODE_SETTINGS)
    deadline = time.monotonic() + 10
    while len(where := nats_connections(nats_cluster)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {"n0", "n1", "n2"} <= set(where), where
    # the server leading the queue's shard (a leader election under load)
    stream = shards.stream_name(cluster_name, shards.QUEUES, 6, shards.shard_of(QUEUE, 6), DEFAULT_PACK)
    leader = stream_leaders(nats_cluster, [stream])[stream]
    victim = next(s.index for s in nats_cluster.servers if s.name == leader)
    moved = [n for n, i in where.items() if i == victim and n in ("n0", "n1", "n2")]
    try:
        stats, _, _ = run_load(nodes, lambda: nats_cluster.kill(victim))
        after = nats_connections(nats_cluster)
        c = stats.counts()
        line = report("kill -9 NATS server", c)
        assert c["sent"] > 100 and c["receipted"] > 100, line
        assert c["lost"] == 0, line
        assert c["duplicated_unflagged"] == 0, line
        # the nodes of the dead server reconnected by themselves, to the others
        assert all(after.get(n) not in (None, victim) for n in ("n0", "n1", "n2")), (where, after)
        print(f"cluster fault kill -9 NATS server: it led the queue's stream {stream}; "
              f"nodes {moved} reconnected to servers {[after[n] for n in moved]}")
        assert all(node.proc.poll() is None for node in nodes)
    finally:
        nats_cluster.restart(victim)


def until_cross_node(pub: Wire, sub: Wire, destination: str, timeout: float) -> float:
    """Probe ``destination`` from pub until sub gets one (the interest reached pub's node); drain the
    probes; return how long it took."""
    t0 = time.monotonic()
    i = 0
    while True:
        pub.frame("SEND", {"destination": destination, "receipt": f"probe-{i}"}, f"probe-{i}".encode())
        assert pub.read(timeout=TIMEOUT_MS / 1000 + 10)[0] == "RECEIPT"
        try:
            sub.read(timeout=0.3)
            break
        except TimeoutError:
            assert time.monotonic() - t0 < timeout, f"no cross-node delivery on {destination} in {timeout} s"
        i += 1
    took = time.monotonic() - t0
    while True:  # later probes still on their way
        try:
            sub.read(timeout=0.3)
        except TimeoutError:
            return took


def test_whole_backplane_down_local_topics_flow_queue_send_errors_node_recovers(start_nodes, nats_cluster):
    a, b = start_nodes(2, *NODE_SETTINGS)
    # a cross-node topic works before
    sub_b = connect(b, "sub-b")
    sub_b.frame("SUBSCRIBE", {"destination": "/topic/remote", "id": "r", "receipt": "s"})
    assert sub_b.read()[0] == "RECEIPT"
    pub = connect(a, "pub")
    until_cross_node(pub, sub_b, "/topic/remote", 10)

    local = connect(a, "local")
    local.frame("SUBSCRIBE", {"destination": "/topic/local", "id": "l", "receipt": "s"})
    assert local.read()[0] == "RECEIPT"

    nats_cluster.stop_all()
    try:
        # local topic traffic keeps flowing, without waiting on the network
        t0 = time.monotonic()
        n = 200
        for i in range(n):
            pub.frame("SEND", {"destination": "/topic/local", **({"receipt": "l"} if i == n - 1 else {})},
                      f"local-{i}".encode())
        assert pub.read()[0] == "RECEIPT"
        got = [local.read()[2] for _ in range(n)]
        local_s = time.monotonic() - t0
        assert got == [f"local-{i}".encode() for i in range(n)]
        assert local_s < TIMEOUT_MS / 1000, local_s  # far below: nothing waited for the backplane

        # a queue SEND needs JetStream: an ERROR that says so, after cluster_timeout_ms, not an endless wait
        q = connect(a, "q")
        t0 = time.monotonic()
        q.frame("SEND", {"destination": "/queue/outage", "persistent": "true", "receipt": "q1"}, b"x")
        cmd, headers, _ = q.read(timeout=TIMEOUT_MS / 1000 + 15)
        waited = time.monotonic() - t0
        assert cmd == "ERROR" and "cluster unavailable" in headers.get("message", ""), (cmd, headers)
        assert headers.get("receipt-id") == "q1"
        assert TIMEOUT_MS / 1000 - 0.5 <= waited, waited
        print(f"cluster fault backplane down: {n} local topic messages in {local_s:.3f} s; "
              f"queue SEND -> ERROR {headers['message']!r} after {waited:.1f} s")
    finally:
        restarted = time.monotonic()
        nats_cluster.start_all()  # returns once JetStream has a meta leader again

    # the nodes recover by themselves: queue SENDs are stored again, cross-node topics flow again
    deadline = time.monotonic() + 30
    while True:
        q = connect(a, "q2")
        q.frame("SEND", {"destination": "/queue/outage", "persistent": "true", "receipt": "q2"}, b"after")
        cmd, headers, _ = q.read(timeout=TIMEOUT_MS / 1000 + 15)
        if cmd == "RECEIPT":
            break
        assert time.monotonic() < deadline, ("no recovery", headers)
        time.sleep(0.5)
    recovered_s = time.monotonic() - restarted
    cons = connect(b, "cons")
    cons.frame("SUBSCRIBE", {"destination": "/queue/outage", "id": "q", "ack": "client-individual"})
    cmd, headers, body = cons.read(timeout=15)
    assert (cmd, body) == ("MESSAGE", b"after")  # the refused one was never stored
    cons.frame("ACK", {"id": headers["ack"]})
    until_cross_node(pub, sub_b, "/topic/remote", 60)
    print(f"cluster fault backplane down: NATS restarted; queue SENDs receipted again after {recovered_s:.1f} s, "
          f"cross-node topics flowing again after {time.monotonic() - restarted:.1f} s")
