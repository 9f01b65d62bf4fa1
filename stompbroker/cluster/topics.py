"""The bridge's topics part: the node's NATS subscriptions, its interest in the bucket, and topic
and ``#`` worker messages in and out (runs in ``processes/cluster.py``; imports nats through it).

- Interest: the dispatcher says how many local subscriptions each pattern has (INTEREST). The
  bridge subscribes the cover set of their subjects (``subjects.cover``: never two overlapping
  subscriptions, so NATS sends each message once), and then writes the node's patterns to the
  key-value bucket ``<cluster>_interest`` (key = node id). Subscribing first means a node that
  learns of the interest can publish at once. Every node watches the bucket and tells its
  dispatcher the other nodes' patterns (REMOTE), so it publishes only what someone elsewhere wants.
- Entries are rewritten every REFRESH seconds; the bucket keeps them TTL seconds, and a node not
  heard of for that long (killed) is forgotten.
- Out: PUBLISH records go to NATS in order; while NATS is unreachable they wait here, in order,
  for at most cluster_timeout_ms (then FAILED for the ones the dispatcher holds a sender for).
- In: messages are handled as the connection reads them, in wire order across subscriptions, raw
  (``fastpath.py``: no nats-py message object, no task per subscription), and a second copy (two
  subscriptions matched while the cover was changing) is dropped by its sequence number.
- Out: written as ready protocol commands (``fastpath.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import orjson

from . import records as C
from .fastpath import FastPath, pub
from .records import DURABLE_MARK
from .subjects import busy_subject, cover, pattern_filters, worker_subject

log = logging.getLogger("stompbroker.cluster")

REFRESH = 10.0   # seconds between rewrites of this node's interest entry
RETIRE = 2.0     # seconds a NATS subscription no longer wanted is kept (see resubscribe)
TTL = 30.0       # seconds the bucket keeps an entry; a node silent this long is forgotten
BUSY_EVERY = 0.5  # seconds between a busy node's repeats of its word (and its word that it caught up)
BUSY_TTL = 2.0    # seconds another node's busy word holds unless repeated (a killed node's ends)


class Topics:
    def __init__(self, bridge):
        self.bridge = bridge
        self.cluster = bridge.cluster
        self.handlers = {C.INTEREST: self.interest, C.PUBLISH: self.publish, C.BUSY: self.busy}
        self.local: dict[str, int] = {}       # pattern -> local subscriptions
        self.subs: dict[str, object] = {}     # subject -> nats subscription (the cover)
        self.retiring: dict[str, tuple] = {}  # subject -> (subscription, when it goes): no longer wanted
        self.held: deque = deque()            # (deadline, subject, message, token) while NATS is unreachable
        self.seq = 0
        self.last: dict[bytes, int] = {}      # origin -> last sequence number received
        self.nodes: dict[str, dict] = {}      # other node -> {pattern: count}
        self.heard: dict[str, float] = {}     # other node -> when its entry was last written (monotonic)
        self.totals: dict[str, int] = {}      # pattern -> subscriptions on other nodes
        self.kv = None
        self.started = False                  # the first complete view of the bucket went to the dispatcher
        self.watch_task = None
        self.watch_seen = 0.0                 # when the watch last delivered an entry (this node's own included)
        self.setup_due: float | None = 0.0    # when to (re)open the bucket and its watch; None: done
        self.changed = asyncio.Event()        # the local interest changed: write the entry
        self.put_task = None
        self.fast = FastPath(bridge.nc)
        self.busy_here = False                # this node's dispatcher says it is behind
        self.busy_said = 0.0                  # when this node last said so (or that it caught up)
        self.busy_sub = None
        self.busy_nodes: dict[str, float] = {}  # other node -> until when its busy word holds
        self.busy_sent: dict[str, int] = {}   # pattern -> busy nodes holding it, as told to the dispatcher
        self.stats = {"messages_in": 0, "messages_out": 0, "bytes_in": 0, "bytes_out": 0, "duplicates": 0,
                      "unpublished": 0, "publish_errors": 0}

    # -- interest --------------------------------------------------------------------------------
    async def interest(self, conn: int, aux: int, payload: bytes) -> None:
        pattern = payload.decode()
        if aux > 0:
            self.local[pattern] = aux
        else:
            self.local.pop(pattern, None)
        if self.bridge.connected:
            await self.resubscribe()
        self.changed.set()

    def wanted(self) -> dict[str, str]:
        """subject -> queue group ("" for topics) the local interest needs."""
        filters = []
        workers = {}
        for pattern in self.local:
            if pattern.startswith(DURABLE_MARK):  # (announced only: its messages go to JetStream)
                continue
            if pattern.startswith("#"):
                if "*" not in pattern:  # worker wildcards stay local
                    subject = worker_subject(self.cluster, pattern)
                    workers[subject] = subject
            else:
                filters.extend(pattern_filters(self.cluster, pattern))
        return {**{s: "" for s in cover(filters)}, **workers}

    async def resubscribe(self) -> None:
        nc = self.bridge.nc
        if self.busy_sub is None:
            self.busy_sub = await nc.subscribe(busy_subject(self.cluster), pending_bytes_limit=0,
                                               pending_msgs_limit=0)
            self.fast.route(self.busy_sub, self.received_busy)
        wanted = self.wanted()
        for subject, group in wanted.items():
            if subject in self.subs:
                continue
            retired = self.retiring.pop(subject, None)
            if retired is not None:  # wanted again before it went
                self.subs[subject] = retired[0]
                continue
            sub = await nc.subscribe(subject, queue=group, pending_bytes_limit=0, pending_msgs_limit=0)
            self.fast.route(sub, self.received_worker if group else self.received_topic)
            self.subs[subject] = sub
        # A subscription no longer wanted goes RETIRE seconds later: nats-py drops what arrives for a
        # subscription it no longer has, and the server may still be sending messages it matched to
        # it alone just before the new ones were in place. Meanwhile both may match: the second
        # copy is dropped by its sequence number.
        deadline = time.monotonic() + RETIRE
        for subject in [s for s in self.subs if s not in wanted]:
            self.retiring[subject] = (self.subs.pop(subject), deadline)

    async def retire(self, now: float) -> None:
        for subject, (sub, deadline) in list(self.retiring.items()):
            if now >= deadline:
                del self.retiring[subject]
                try:
                    await sub.unsubscribe()
                except Exception as exc:
                    log.debug("cluster: unsubscribe %s: %r", subject, exc)
                self.fast.unroute(sub)

    async def writer(self) -> None:
        """Write this node's entry when its interest changes (after its subscriptions reached the
        server), and every REFRESH seconds."""
        while True:
            try:
                await asyncio.wait_for(self.changed.wait(), REFRESH)
            except asyncio.TimeoutError:
                pass
            self.changed.clear()
            if not self.bridge.connected or self.kv is None:
                continue
            try:
                await self.bridge.nc.flush(timeout=2)
                await self.kv.put(self.bridge.node, orjson.dumps(self.local))
            except Exception as exc:
                log.warning("cluster: cannot write this node's interest (%r); retrying", exc)
                await asyncio.sleep(0.5)
                self.changed.set()

    async def open_bucket(self) -> None:
        js = self.bridge.js
        bucket = f"{self.cluster}_interest"
        try:
            self.kv = await js.key_value(bucket)
        except Exception:
            self.kv = await js.create_key_value(bucket=bucket, history=1, ttl=TTL,
                                                replicas=self.bridge.replicas(),
                                                description="stompbroker: each node's topic interest")

    async def watch(self) -> None:
        """Every entry of the bucket, then each change: the other nodes' interest. Started again on
        each connection; what it knew before stays until the new view is complete, so an outage
        never makes the node forget who wanted what."""
        while True:  # just after NATS (re)starts JetStream may not answer yet: keep trying
            try:
                watcher = await self.kv.watchall()
                break
            except Exception as exc:
                log.warning("cluster: cannot watch the other nodes' interest (%r); retrying", exc)
                await asyncio.sleep(0.5)
        seen: set[str] | None = set()   # nodes in the initial view, until it is complete
        try:
            async for entry in watcher:
                if entry is None:  # the end of what was there already: nodes not in it are gone
                    if seen is not None:
                        for node in [n for n in self.nodes if n not in seen]:
                            self.node_interest(node, {})
                        if not self.started:  # a new bridge: the dispatcher's view is its predecessor's
                            self.started = True
                            self.bridge.emit(C.REMOTE_RESET)
                            for pattern, total in self.totals.items():
                                self.bridge.emit(C.REMOTE, 0, pattern.encode(), total)
                        seen = None
                    self.bridge.flush()
                    continue
                node = entry.key
                self.watch_seen = time.monotonic()
                if node == self.bridge.node:
                    continue
                if seen is not None:
                    seen.add(node)
                if entry.operation in ("DEL", "PURGE") or not entry.value:
                    self.node_interest(node, {})
                else:
                    self.node_interest(node, orjson.loads(entry.value), announce=seen is None or self.started)
                    self.heard[node] = time.monotonic()
                if seen is None:
                    self.bridge.flush()
        finally:
            try:
                await watcher.stop()
            except Exception:
                pass

    def node_interest(self, node: str, patterns: dict, announce: bool = True) -> None:
        old = self.nodes.pop(node, {})
        if patterns:
            self.nodes[node] = patterns
        else:
            self.heard.pop(node, None)
        for pattern in old.keys() | patterns.keys():
            delta = patterns.get(pattern, 0) - old.get(pattern, 0)
            if delta:
                total = self.totals.get(pattern, 0) + delta
                if total > 0:
                    self.totals[pattern] = total
                else:
                    self.totals.pop(pattern, None)
                if announce:
                    self.bridge.emit(C.REMOTE, 0, pattern.encode(), max(total, 0))
        if node in self.busy_nodes:
            self.busy_changed()

    # -- the connection's life -------------------------------------------------------------------
    async def connected(self) -> None:
        await self.resubscribe()
        await self.drain()
        # The bucket's watch is started again on each connection: what changed meanwhile comes
        # whole. JetStream may not answer yet (electing a leader): tick() retries.
        self.setup_due = 0.0
        await self.setup()

    async def setup(self) -> None:
        now = time.monotonic()
        if not self.bridge.connected or now < self.setup_due:
            return
        self.setup_due = now + 1.0
        try:
            if self.kv is None:
                await self.open_bucket()
            if self.watch_task is not None:
                self.watch_task.cancel()
            self.watch_seen = now
            self.watch_task = asyncio.create_task(self.watch())
        except Exception as exc:
            log.warning("cluster: the interest bucket does not answer yet (%r); retrying", exc)
            return
        self.setup_due = None
        if self.put_task is None:
            self.put_task = asyncio.create_task(self.writer())
        self.changed.set()

    async def tick(self) -> None:
        now = time.monotonic()
        if self.retiring:
            await self.retire(now)
        if self.setup_due is not None:
            await self.setup()
        elif self.bridge.connected and (self.watch_task.done() or now - self.watch_seen > 2.5 * REFRESH):
            # the watch ended (its consumer lost) or stalled: this node's own entry, rewritten every
            # REFRESH seconds, has not come back through it
            log.warning("cluster: the interest bucket's watch %s; starting it again",
                        "ended" if self.watch_task.done() else "stalled")
            self.setup_due = 0.0
            await self.setup()
        if self.busy_here and now - self.busy_said >= BUSY_EVERY:
            self.say_busy(now)
        if self.busy_nodes:
            self.expire_busy(now)
        held = self.held
        while held and held[0][0] <= now:
            _, _, _, token = held.popleft()
            self.stats["unpublished"] += 1
            if token:
                self.bridge.emit(C.FAILED, token)
        if held and self.bridge.connected:
            await self.drain()
        watching = now - self.watch_seen < 2 * REFRESH  # (else silence says nothing about the others)
        for node, when in list(self.heard.items()):
            if watching and now - when > TTL + REFRESH:  # it stopped writing: killed, or cut off
                log.warning("cluster: node %s has not renewed its interest for %.0f s; forgetting it", node,
                            now - when)
                self.node_interest(node, {})

    async def stop(self) -> None:
        if self.kv is not None and self.bridge.connected:
            await self.kv.delete(self.bridge.node)  # the others stop sending at once

    def status(self) -> dict:
        return {**self.stats, "subscriptions": len(self.subs), "remote_nodes": len(self.nodes),
                "peers": len(self.heard),  # (the nodes an operator's removal waits for: jetstream.py, forget)
                "held": len(self.held), "busy": self.busy_here, "busy_nodes": sorted(self.busy_nodes)}

    # -- busy nodes --------------------------------------------------------------------------------
    async def busy(self, conn: int, aux: int, payload: bytes) -> None:
        self.busy_here = bool(aux)
        self.say_busy(time.monotonic())

    def say_busy(self, now: float) -> None:
        if self.bridge.connected:
            self.fast.send(pub(busy_subject(self.cluster).encode(), b"",
                               b"%s %d" % (self.bridge.node.encode(), self.busy_here)))
        self.busy_said = now

    def received_busy(self, subject: bytes, reply: bytes, data: bytes, status: str) -> None:
        """Another node's word ("<node id> 1" or "... 0"). Only a node whose interest is known counts
        (nobody sends to the others), so what anyone publishes there cannot grow the table."""
        if len(data) > 256:
            return
        node, _, flag = bytes(data).decode(errors="replace").rpartition(" ")
        if node not in self.nodes:
            return
        was = node in self.busy_nodes
        if flag == "1":
            self.busy_nodes[node] = time.monotonic() + BUSY_TTL
            if was:
                return
        elif was:
            del self.busy_nodes[node]
        else:
            return
        self.busy_changed()

    def expire_busy(self, now: float) -> None:
        """A busy word not repeated within BUSY_TTL ends (its node was killed, or cut off)."""
        gone = [node for node, until in self.busy_nodes.items() if now >= until]
        if gone:
            for node in gone:
                del self.busy_nodes[node]
            self.busy_changed()

    def busy_changed(self) -> None:
        """Tell the dispatcher, per pattern, how many of the nodes that subscribe it are behind."""
        counts: dict[str, int] = {}
        for node in self.busy_nodes:
            for pattern in self.nodes.get(node, ()):
                if not pattern.startswith(DURABLE_MARK):
                    counts[pattern] = counts.get(pattern, 0) + 1
        for pattern in self.busy_sent.keys() | counts.keys():
            n = counts.get(pattern, 0)
            if n != self.busy_sent.get(pattern, 0):
                self.bridge.emit(C.REMOTE_BUSY, 0, pattern.encode(), n)
        self.busy_sent = counts
        self.bridge.flush()

    # -- messages out ----------------------------------------------------------------------------
    async def publish(self, token: int, aux: int, payload: bytes) -> None:
        subject, message = C.unpack_publish(payload)
        if self.held or not self.bridge.connected:
            self.held.append((time.monotonic() + self.bridge.config.cluster_timeout_ms / 1000, subject, message,
                              token))
            return
        await self.send(subject, message, token)

    async def send(self, subject: str, message: bytes, token: int, deadline: float = 0.0) -> bool:
        """Out to NATS; False when the connection just went (the message waits, first in line)."""
        data = C.wire(self.bridge.origin, self.seq + 1, message)
        if len(data) > self.bridge.nc.max_payload:
            self.stats["publish_errors"] += 1
            log.warning("cluster: cannot publish to %s: %d bytes, over the NATS server's max_payload", subject,
                        len(data))
            if token:
                self.bridge.emit(C.FAILED, token)
            return True
        if not self.fast.send(pub(subject.encode(), b"", data)):
            self.held.appendleft((deadline or time.monotonic() + self.bridge.config.cluster_timeout_ms / 1000,
                                  subject, message, token))
            return False
        self.seq += 1
        self.stats["messages_out"] += C.topic_count(message)
        self.stats["bytes_out"] += len(data)
        if token:
            self.bridge.emit(C.PUBLISHED, token)
        return True

    async def drain(self) -> None:
        """NATS is back: what waited goes out first, in order (new PUBLISHes queue behind it)."""
        held = self.held
        while held and self.bridge.connected:
            deadline, subject, message, token = held.popleft()
            if not await self.send(subject, message, token, deadline):
                return

    # -- messages in -----------------------------------------------------------------------------
    def received_topic(self, subject: bytes, reply: bytes, data: bytes, status: str) -> None:
        self.received(data, False)

    def received_worker(self, subject: bytes, reply: bytes, data: bytes, status: str) -> None:
        self.received(data, True)

    def received(self, data: bytes, worker: bool) -> None:
        origin, seq, message = C.unwire(data)
        if not worker:
            if seq <= self.last.get(origin, 0):
                self.stats["duplicates"] += 1
                return
            if len(self.last) > 10_000:
                self.last.clear()
            self.last[origin] = seq
        self.stats["messages_in"] += C.topic_count(message)
        self.stats["bytes_in"] += len(data)
        self.bridge.emit(C.MESSAGE, 0, message, C.PUBLISH_WORKER if worker else 0)
