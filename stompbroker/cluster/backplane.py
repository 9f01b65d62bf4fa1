"""The broker's side of cluster mode, pure: what goes to the bridge, and what the bridge's records do.

``Broker`` gets one at construction (``None`` in single-node mode). Its hooks are one-line calls:
a topic subscription comes or goes (``subscribed``/``unsubscribed``: the bridge keeps the node's
NATS subscriptions and its entry in the interest bucket), a topic message was published here
(``publish``: it goes to NATS only when another node has matching interest), a ``#`` worker
message picks local or remote (``worker``); a message that waits for NATS holds its sender's
replies behind it (``hold_reply``, asked by replies.emit). Records from the bridge come in through ``on_record``. Local deliveries never wait
for the network: the bridge gets records, sent after the writers' batches.

While the bridge reports NATS unreachable, a message that needs it (remote interest known from
before) goes to the bridge with a token; the bridge publishes it when NATS is back, or after
``cluster_timeout_ms`` answers FAILED and its sender gets an ERROR ``cluster unavailable``. The
sender's replies (its receipts, a DISCONNECT's receipt, an ERROR) wait meanwhile, in order.
"""

from __future__ import annotations

import itertools
import logging

import orjson

from ..broker.model import Later, Message
from ..broker.names import DIAG_PREFIX, QUEUE_PREFIX, TEMP_PREFIXES, REPLY_PREFIXES, WORKER_PREFIX
from ..broker.subscriptions import SubscriptionIndex
from . import records as C
from .records import DURABLE_MARK
from .queuing import ClusterQueues, pack, unpack
from .subjects import topic_subject, worker_subject

log = logging.getLogger("stompbroker.cluster")

UNAVAILABLE = "cluster unavailable"
LOCAL_ONLY = (QUEUE_PREFIX, DIAG_PREFIX) + TEMP_PREFIXES + REPLY_PREFIXES


class Remote:
    """Another node's interest in one pattern: how many subscriptions, summed over the nodes."""

    __slots__ = ("pattern", "count")

    def __init__(self, pattern: str, count: int):
        self.pattern = pattern
        self.count = count


def shared(destination: str) -> bool:
    """Does a subscription pattern or destination take part in cross-node topics and worker queues?"""
    return not destination.startswith(LOCAL_ONLY)


class Backplane:
    def __init__(self, config):
        self.config = config
        self.cluster = config.cluster_name
        self.out = C.Records()           # records for the bridge, handed over by the dispatcher each round
        self.local: dict[str, int] = {}  # pattern -> local subscriptions (topics and #workers)
        self.remote = SubscriptionIndex()  # other nodes' patterns (Remote entries)
        self.remote_by: dict[str, Remote] = {}
        self.durables = SubscriptionIndex()  # the other nodes' durable subscription patterns (Remote entries)
        self.durables_by: dict[str, Remote] = {}
        self.connected = False           # the bridge's last word: NATS reachable
        self.status: dict = {}           # the bridge's last STATUS
        self.tokens = itertools.count(1)
        self.owners: dict[int, tuple] = {}   # token -> (session, deadline)
        self.waiting: dict = {}          # session -> [[token, receipt, done], ...] in SEND order
        self.worker_pos: dict[str, int] = {}
        self.timeout = config.cluster_timeout_ms / 1000
        self.stats = {"published": 0, "received": 0, "held": 0, "failed": 0, "unrouted_remote": 0,
                      "stale_sent": 0, "bridge_starts": 0, "throttled": 0}
        self.queues = ClusterQueues(config, self)  # queues, durables and replay-from on JetStream (cluster/queuing.py)
        # this round's topic messages published in a row to one subject: one NATS message (records.pack_topic)
        self.run_subject = self.run_destination = ""
        self.run: list[bytes] = []
        self.run_bytes = 0
        self.run_max = max(int(getattr(config, "cluster_topic_pack_max", 1) or 1), 1)
        self.subjects: dict[str, str] = {}   # destination -> its topic subject (made once, not per message)
        self.sent_json: dict[tuple, bytes] = {}    # this node's headers (as items) -> their JSON in a pack
        # Nodes behind with their deliveries (the bridge's REMOTE_BUSY): a session publishing to them
        # has its replies (its receipts) held, so a producer that waits for receipts slows down.
        self.busy = SubscriptionIndex()      # patterns some busy node subscribes (their pattern as entry)
        self.busy_patterns: set[str] = set()
        self.throttled: dict = {}            # session -> [token, destination, until when at most]
        self.busy_hold = config.cluster_busy_hold_ms / 1000
        self.busy_bytes = config.cluster_busy_bytes
        self.is_busy = False                 # this node, as last told to the bridge (behind)
        self.fed = float("-inf")             # when another node's topic message last reached this one

    # -- interest --------------------------------------------------------------------------------
    def subscribed(self, pattern: str) -> None:
        if shared(pattern):
            n = self.local[pattern] = self.local.get(pattern, 0) + 1
            self.out.add(C.INTEREST, 0, pattern.encode(), n)

    def unsubscribed(self, pattern: str) -> None:
        n = self.local.get(pattern)
        if n is None:
            return
        if n > 1:
            self.local[pattern] = n - 1
        else:
            del self.local[pattern]
        self.out.add(C.INTEREST, 0, pattern.encode(), n - 1)

    def durable(self, pattern: str, delta: int) -> None:
        """A durable subscription to ``pattern`` was made (+1) or ended (-1) on this node: announced
        with the node's interest, so every node keeps the topic messages it matches."""
        key = DURABLE_MARK + pattern
        n = self.local.get(key, 0) + delta
        if n > 0:
            self.local[key] = n
        else:
            self.local.pop(key, None)
        self.out.add(C.INTEREST, 0, key.encode(), max(n, 0))

    def durable_wants(self, b, destination: str) -> bool:
        """Does a durable subscription anywhere in the cluster match this topic destination?"""
        return bool((b.durables and b.durable_index.match(destination))
                    or (self.durables_by and self.durables.match(destination)))

    def remote_count(self, destination: str) -> int:
        return sum(r.count for r in self.remote.match(destination))

    # -- publishing ------------------------------------------------------------------------------
    def publish(self, b, message, sender=None) -> bool:
        """A topic message published on this node: to NATS if another node wants it. True if sent."""
        destination = message.destination
        if not self.remote.match(destination) or destination.startswith(LOCAL_ONLY):  # (shared(), inlined)
            return False
        subject = self.subjects.get(destination)
        if subject is None:
            if len(self.subjects) >= SUBJECTS_KEPT:
                self.subjects.clear()
            subject = self.subjects[destination] = topic_subject(self.cluster, destination)
        self._send(b, subject, message, 0, sender)
        if self.busy_patterns and sender is not None and self.busy.match(destination):
            self._throttle(b, sender, destination)
        return True

    def publish_plain(self, b, destination: str, headers: dict, body: bytes, sender) -> bool:
        """A plain SEND to a topic no subscription of this node hears (``routing.send_plain``): put
        in this round's pack for NATS without making a message, as ``publish`` and ``_send`` would
        (True). False where it needs more (no other node wants it, a durable subscription does, NATS
        unreachable, packs off): the caller publishes it the whole way."""
        if not self.connected or self.run_max <= 1 or not self.remote.match(destination) \
                or destination.startswith(LOCAL_ONLY) or self.durable_wants(b, destination):
            return False
        b.stats["messages_published"] += 1
        self.stats["published"] += 1
        subject = self.subjects.get(destination)
        if subject is None:
            if len(self.subjects) >= SUBJECTS_KEPT:
                self.subjects.clear()
            subject = self.subjects[destination] = topic_subject(self.cluster, destination)
        self._pack(subject, destination, C.topic_member_json(f"{b.token}-{next(b.message_ids)}",
                                                             self.headers_json(headers), body, 0))
        if self.busy_patterns and self.busy.match(destination):
            self._throttle(b, sender, destination)
        return True

    def behind(self, deepest: int, now: float) -> None:
        """Once per dispatcher round, the deepest of this node's delivery queues (its writers' and the
        bridge's to the dispatcher), in bytes: past cluster_busy_bytes the node says it is busy, and
        that it caught up under a quarter of that. The other nodes slow the producers that feed it,
        so it says so only while other nodes' messages reach it (within FED_WITHIN): a node kept busy
        by its own producers alone (a one-node cluster) says nothing, as no other node could help."""
        if self.is_busy:
            if deepest < self.busy_bytes // 4:
                self.is_busy = False
                self.out.add(C.BUSY, 0, b"", 0)
        elif deepest > self.busy_bytes and self.busy_bytes and now - self.fed < FED_WITHIN:
            self.is_busy = True
            self.out.add(C.BUSY, 0, b"", 1)

    def _throttle(self, b, session, destination: str) -> None:
        """A message to a busy node: its sender's replies from now on wait (at most busy_hold)."""
        if session in self.throttled or type(session) is Later or not self.busy_hold or session.closing:
            return
        token = next(self.tokens)
        self.stats["throttled"] += 1
        self.throttled[session] = [token, destination, b.now + self.busy_hold]
        self.waiting.setdefault(session, []).append([token, None, False, None])

    def _unthrottle(self, b, now: float, every: bool = False) -> None:
        """Release the held replies of the sessions whose destination has no busy node now."""
        for session, (token, destination, until) in list(self.throttled.items()):
            if every or now >= until or not self.busy.match(destination):
                del self.throttled[session]
                for entry in self.waiting.get(session, ()):
                    if entry[0] == token:
                        entry[2] = True
                        break
                self._release(b, session)

    def _remote_busy(self, b, pattern: str, count: int) -> None:
        if count > 0:
            if pattern not in self.busy_patterns:
                self.busy_patterns.add(pattern)
                self.busy.add(pattern, pattern)
            return
        if pattern in self.busy_patterns:
            self.busy_patterns.discard(pattern)
            self.busy.remove(pattern, pattern)
            self._unthrottle(b, b.now)

    def _busy_reset(self, b) -> None:
        self.busy, self.busy_patterns = SubscriptionIndex(), set()
        self._unthrottle(b, b.now, every=True)

    def worker(self, b, message, subs: tuple, sender=None) -> bool:
        """A ``#`` worker message: True if it goes to another node (NATS picks one of its queue group),
        False if a local subscription takes it. Round-robin over the cluster's subscriptions: local
        ones by count, remote ones by the counts their nodes announce."""
        destination = message.destination
        remote = self.remote_by.get(destination)
        if remote is None or not remote.count:
            return False
        local = len(subs)
        if local:
            pos = self.worker_pos.get(destination, 0)
            self.worker_pos[destination] = (pos + 1) % (local + remote.count)
            if pos < local:
                return False
        self._send(b, worker_subject(self.cluster, destination), message, C.PUBLISH_WORKER, sender)
        return True

    def _send(self, b, subject: str, message, flags: int, sender=None) -> None:
        expires_ms = max(int((message.expires - b.now) * 1000), 1) if message.expires else 0
        self.stats["published"] += 1
        if self.connected and not flags and self.run_max > 1:  # (a worker message goes alone: NATS picks its node)
            self._pack(subject, message.destination, C.topic_member_json(
                message.id, self.headers_json(message.headers), message.body, expires_ms))
            return
        self.close_run()
        headers = {k: v for k, v in message.headers.items() if k not in NOT_SENT}
        payload = C.pack_publish(subject, C.pack_message(message.id, message.destination, headers, message.body,
                                                         expires_ms))
        token = 0
        if not self.connected:  # the bridge answers for it: its sender's replies wait, and it hears if it failed
            token = next(self.tokens)
            self.owners[token] = (sender, b.now + self.timeout + 2)
            if sender is not None:
                self.waiting.setdefault(sender, []).append([token, None, False, message.headers.get("receipt")])
            self.stats["held"] += 1
        self.out.add(C.PUBLISH, token, payload, flags)

    def _pack(self, subject: str, destination: str, member: bytes) -> None:
        """A topic message joins this round's run to ``subject`` (a new run past its limits)."""
        if self.run and (subject != self.run_subject or len(self.run) >= self.run_max
                         or self.run_bytes + len(member) > TOPIC_PACK_BYTES):
            self.close_run()
        self.run_subject, self.run_destination = subject, destination
        self.run.append(member)
        self.run_bytes += len(member)

    def headers_json(self, headers: dict) -> bytes:
        """A message's headers as they travel in a topic pack (JSON, without NOT_SENT), made once per
        distinct set: a producer's messages mostly carry the same ones (at most HEADERS_KEPT kept,
        each at most HEADERS_KEPT_BYTES as JSON)."""
        key = tuple(headers.items())
        made = self.sent_json.get(key)
        if made is None:
            made = orjson.dumps({k: v for k, v in headers.items() if k not in NOT_SENT})
            if len(made) <= HEADERS_KEPT_BYTES:
                if len(self.sent_json) >= HEADERS_KEPT:
                    self.sent_json.clear()
                self.sent_json[key] = made
        return made

    def close_run(self) -> None:
        """The topic messages gathered in a row go to the bridge as one pack."""
        if self.run:
            self.out.add(C.PUBLISH, 0, C.pack_publish(self.run_subject, C.pack_topic(self.run_destination, self.run)))
            self.run, self.run_bytes = [], 0

    def hold_reply(self, session, kind: int, payload: bytes) -> bool:
        """Any reply to a session with a message waiting for NATS (receipts of later frames, an
        ERROR) waits behind it: True if held. (replies.emit asks.)"""
        queue = self.waiting.get(session)
        if not queue:
            return False
        queue.append([0, (kind, payload), True, None])
        return True

    def answer_later(self, later: Later, result):
        """An operator's publish (``broker/manage.py``) made with ``later`` as its sender: ``later``,
        done with ``result`` once every message it handed to the cluster is stored, when there is
        one; else ``result`` at once (nothing waits for the cluster)."""
        if not self.waiting.get(later):
            return result
        later.value = result
        return later

    def _release(self, b, session) -> None:
        queue = self.waiting.get(session)
        if type(session) is Later:  # (an operator's publish: no replies wait behind it)
            while queue and queue[0][2]:
                queue.pop(0)
            if not queue:
                self.waiting.pop(session, None)
                session.finish()
            return
        while queue and queue[0][2]:
            reply = queue.pop(0)[1]
            if reply is not None:
                session.outbox.add(reply[0], session.conn, reply[1])
        if not queue:
            self.waiting.pop(session, None)

    def _published(self, b, token: int) -> None:
        owner = self.owners.pop(token, None)
        if owner is None or owner[0] is None:
            return
        session = owner[0]
        for entry in self.waiting.get(session, ()):
            if entry[0] == token:  # (tokens are unique; PubAcks mostly come in order: near the front)
                entry[2] = True
                break
        self._release(b, session)

    def _failed(self, b, token: int, message: str = UNAVAILABLE, detail: str = "") -> None:
        from ..broker import replies
        owner = self.owners.pop(token, None)
        self.stats["failed"] += 1
        if owner is None or owner[0] is None:
            return
        session = owner[0]
        queue = self.waiting.pop(session, [])
        receipt = next((e[3] for e in queue if e[0] == token), None)
        for entry in queue:
            self.owners.pop(entry[0], None)
        if type(session) is Later:  # an operator's publish: its HTTP answer says why
            session.fail(409 if message == "queue full" else 503, f"{message}: " + (detail or (
                f"the cluster's NATS servers were unreachable for {self.config.cluster_timeout_ms} ms "
                "(cluster_timeout_ms)")))
        elif session.closing:  # an ERROR and its close wait in the queue: they go now, not the receipts
            for entry in queue:
                if entry[1] is not None and not entry[1][1].startswith(b"RECEIPT"):
                    session.outbox.add(entry[1][0], session.conn, entry[1][1])
        else:
            replies.error(b, session, message, detail or f"the cluster's NATS servers were unreachable for "
                           f"{self.config.cluster_timeout_ms} ms (cluster_timeout_ms); the message was "
                           f"delivered on this node only, not to the other nodes", receipt)

    # -- timers ----------------------------------------------------------------------------------
    def needs_tick(self) -> bool:
        return bool(self.owners or self.throttled or self.queues.pending or self.queues.bound or self.queues.returning
                    or self.queues.asked)

    def tick(self, b, now: float) -> None:
        """A held message the bridge never answered for (it died holding it) fails on the broker's clock."""
        from ..broker import queues
        for token, (session, deadline) in list(self.owners.items()):
            if now >= deadline:
                self._failed(b, token)
        if self.throttled:
            self._unthrottle(b, now)
        self.queues.on_tick(b, now, queues)

    def round_out(self, b) -> None:
        """Once per dispatcher round: its topic messages, the queues' credits, and their commands as
        records for the bridge."""
        self.close_run()
        queues = (_BROKER or _broker_modules())[0]
        cq = self.queues
        cq.refill(b, queues)
        if cq.out:
            out = self.out
            settles = bytearray()   # consecutive acks, naks and terms go as one record
            for command in cq.commands():
                kind = command[0]
                op = C.SETTLE_OPS.get(kind)
                if op is not None:
                    settles += C.pack_settle(command[1], op, int((command[2] if len(command) > 2 else 0) * 1000))
                    continue
                if settles:
                    out.add(C.QUEUE_SETTLE, 0, settles)
                    settles = bytearray()
                if kind == "publish":
                    _, tokens, subject, msg_id, payload, timeout_ms = command
                    out.add(C.QUEUE_PUBLISH, len(tokens), C.pack_queue_publish(subject, msg_id, payload, tokens),
                            timeout_ms)
                else:
                    out.add(C.QUEUE_CMD, 0, pack(command))
            if settles:
                out.add(C.QUEUE_SETTLE, 0, settles)

    def session_ended(self, session) -> None:
        self.throttled.pop(session, None)
        for entry in self.waiting.pop(session, ()):
            self.owners.pop(entry[0], None)

    # -- records from the bridge -------------------------------------------------------------------
    def on_records(self, b, blob: bytes, now: float) -> None:
        for kind, conn, aux, _, payload in C.iter_records(blob):
            self.on_record(b, kind, conn, aux, payload, now)

    def on_record(self, b, kind: int, conn: int, aux: int, payload, now: float) -> None:
        queues, routing = _BROKER or _broker_modules()
        b.now = now
        try:
            if kind == C.MESSAGE:
                self.fed = now
                self.arrived(b, payload, now)
            elif kind == C.REMOTE:
                self._remote(b, payload.decode(), aux)
            elif kind == C.REMOTE_RESET:
                self.remote, self.remote_by = SubscriptionIndex(), {}
                self.durables, self.durables_by = SubscriptionIndex(), {}
                self._busy_reset(b)
            elif kind == C.REMOTE_BUSY:
                self._remote_busy(b, payload.decode(), aux)
            elif kind == C.STATUS:
                self.status = orjson.loads(payload)
                connected = bool(self.status.get("connected"))
                if connected != self.connected:
                    if connected:
                        log.info("cluster: NATS connected (%s)", self.status.get("server"))
                    else:
                        log.warning("cluster: NATS unreachable: topics keep flowing on this node")
                        self._busy_reset(b)
                self.connected = connected
            elif kind == C.PUBLISHED:
                self._published(b, conn)
            elif kind == C.FAILED:
                self._failed(b, conn)
            elif kind == C.QUEUE_MESSAGE:
                key, data = C.unpack_pulled(payload)
                self.queues.arrived(b, key, conn, aux, data, queues)
            elif kind == C.QUEUE_STORED:
                stored = self.queues.stored
                for token in C.unpack_tokens(payload):
                    stored(b, token)
            elif kind == C.QUEUE_EVENT:
                self.queues.event(b, unpack(payload), queues)
            elif kind == C.BRIDGE_START:
                self.stats["bridge_starts"] += 1
                self.queues.bridge_started(b, first=self.stats["bridge_starts"] == 1)
                for pattern, n in self.local.items():
                    self.out.add(C.INTEREST, 0, pattern.encode(), n)
            else:
                extra = EXTRA_HANDLERS.get(kind)
                if extra is not None:
                    extra(self, b, conn, aux, payload)
        except Exception:
            log.exception("cluster record %s could not be handled", kind)
        if b.ending:  # sessions it closed (an ERROR for a failed publish, a bound passed by a delivery)
            b.end_closed()

    def arrived(self, b, payload, now: float) -> None:
        """A topic message from another node (``records.pack_message``), or a pack of them."""
        if bytes(payload[:4]) == C.TOPIC_PACK:
            destination, members = C.unpack_topic(payload)
            self._publish_members(b, destination, members, 0, now)
            return
        message_id, destination, headers, body, expires_ms = C.unpack_message(payload)
        self._publish_remote(b, destination, headers, body, expires_ms, message_id, now)

    def _publish_members(self, b, destination: str, members: list, start: int, now: float) -> None:
        """A pack's messages, published in order. A fan-out stopped over an outbox's limit leaves
        the rest as the broker's next unfinished step."""
        if b.unfinished:  # (an earlier step goes first)
            self._members_later(b, destination, members, start, now)
            return
        routing = (_BROKER or _broker_modules())[1]
        if not destination.startswith(routing.NOT_TOPIC):
            self._fan_out_members(b, routing, destination, members, start, now)
            return
        last = decoded = None
        for i in range(start, len(members)):
            message_id, head, body, expires_ms = members[i]
            if head != last:   # (decoded only when they differ from the message's before)
                last, decoded = head, C.decode_headers(head)
            self._publish_remote(b, destination, decoded.copy(), body, expires_ms, message_id, now)
            if b.unfinished and i + 1 < len(members):
                self._members_later(b, destination, members, i + 1, now)
                return

    def _fan_out_members(self, b, routing, destination: str, members: list, start: int, now: float) -> None:
        """``_publish_members`` for a topic: what ``routing.publish`` does with another node's
        message (deliver it here or nowhere; a cluster node has no store to log it in), with the
        destination's subscriptions looked up once for the pack."""
        subs = b.index.match(destination)
        stats = self.stats
        fan_out = routing.fan_out
        last = decoded = None
        for i in range(start, len(members)):
            message_id, head, body, expires_ms = members[i]
            stats["received"] += 1
            expires = now + expires_ms / 1000 if expires_ms else 0.0
            if expires and b.now >= expires:  # (ms left to live on arrival: only after waiting its turn)
                b.stats["messages_expired"] += 1
                stats["unrouted_remote"] += 1
                continue
            if not subs:
                stats["unrouted_remote"] += 1
                continue
            if head != last:
                last, decoded = head, C.decode_headers(head)
            message = Message(message_id, destination, decoded.copy(), body, expires)
            if not fan_out(b, message, subs, 1):
                stats["unrouted_remote"] += 1
            if b.unfinished and i + 1 < len(members):
                self._members_later(b, destination, members, i + 1, now)
                return

    def _members_later(self, b, destination: str, members: list, start: int, now: float) -> None:
        """The pack's messages from ``start`` on wait their turn as the broker's last unfinished step."""
        b.unfinished.append((lambda broker, rest: self._publish_members(broker, destination, members, rest, now),
                             (start,)))

    def _publish_remote(self, b, destination: str, headers: dict, body: bytes, expires_ms: int, message_id: str,
                        now: float) -> None:
        self.stats["received"] += 1
        if not (_BROKER or _broker_modules())[1].publish(b, destination, headers, body,
                                                         now + expires_ms / 1000 if expires_ms else 0.0,
                                                         origin=message_id):
            self.stats["unrouted_remote"] += 1

    def _remote(self, b, pattern: str, count: int) -> None:
        if pattern.startswith(DURABLE_MARK):
            self._remote_in(self.durables, self.durables_by, pattern[1:], count)
            return
        if self._remote_in(self.remote, self.remote_by, pattern, count) and b.stale is not None and shared(pattern):
            self._stale_to(b, pattern)

    @staticmethod
    def _remote_in(index, by: dict, pattern: str, count: int) -> bool:
        """Another node's count for a pattern; True if the pattern is new."""
        entry = by.get(pattern)
        if count <= 0:
            if entry is not None:
                del by[pattern]
                index.remove(pattern, entry)
            return False
        if entry is not None:
            entry.count = count
            return False
        entry = by[pattern] = Remote(pattern, count)
        index.add(pattern, entry)
        return True

    def _stale_to(self, b, pattern: str) -> None:
        """Another node has a new subscription: it takes this node's stale messages it matches."""
        prefix = SubscriptionIndex.wildcard_prefix(pattern)
        for message in b.stale.take(pattern if prefix is None else None, prefix, b.now, lambda headers: True):
            if message.destination.startswith(WORKER_PREFIX):
                self._send(b, worker_subject(self.cluster, message.destination), message, C.PUBLISH_WORKER)
            else:
                self._send(b, topic_subject(self.cluster, message.destination), message, 0)
            self.stats["stale_sent"] += 1

    # -- diagnostics -----------------------------------------------------------------------------
    def diag(self) -> dict:
        """The ``cluster`` section of DIAG, /queue/monitor and the dump line."""
        s = self.status
        return {
            "node": self.config.node_id,
            "server": s.get("server", ""),
            "connected": 1 if self.connected else 0,
            "rtt_ms": s.get("rtt_ms", 0.0),
            "messages_in": s.get("messages_in", 0),
            "messages_out": s.get("messages_out", 0),
            "bytes_in": s.get("bytes_in", 0),
            "bytes_out": s.get("bytes_out", 0),
            "reconnects": s.get("reconnects", 0),
            "subscriptions": s.get("subscriptions", 0),
            "peers": s.get("peers", 0),
            "local_patterns": sum(1 for p in self.local if not p.startswith(DURABLE_MARK)),
            "remote_patterns": len(self.remote_by),
            "remote_subscriptions": sum(r.count for r in self.remote_by.values()),
            "held": len(self.owners),
            "failed": self.stats["failed"],
            "busy": 1 if self.is_busy else 0,
            "busy_nodes": len(s.get("busy_nodes", ())),
            "throttled": self.stats["throttled"],
            "streams": s.get("streams", []),
        }


_BROKER: tuple = ()


def _broker_modules() -> tuple:
    """(broker.queues, broker.routing), imported on first use (the broker imports this module's
    package at construction) and kept: an import statement per record costs as much as the record."""
    global _BROKER
    from ..broker import queues, routing
    _BROKER = (queues, routing)
    return _BROKER


SUBJECTS_KEPT = 10_000        # topic subjects remembered (past it they are made again)
HEADERS_KEPT = 512            # distinct headers of this node's topic messages kept encoded
HEADERS_KEPT_BYTES = 1024     # ... each at most this long as JSON
FED_WITHIN = 1.0              # seconds after another node's last message that this node may say it is busy
TOPIC_PACK_BYTES = 64 * 1024  # a topic pack holds at most this many bytes (a bigger message goes alone)

# Headers that stay on this node (the broker's own, or meaningless elsewhere).
NOT_SENT = frozenset(("receipt", "transaction", "content-length", "destination"))

# record kind -> handler(backplane, broker, conn, aux, payload), for kinds other parts add
EXTRA_HANDLERS: dict = {}
