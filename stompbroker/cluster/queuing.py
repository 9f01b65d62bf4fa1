"""Queues and durable subscriptions across the cluster, on JetStream: the dispatcher's side, pure.

The bridge (``cluster/jetstream.py``) stores and pulls; this decides. It is fed broker events
(a queue SEND, an ACK, a delivery written, a pulled message arriving, a PubAck) and appends
commands for the bridge to ``out`` as plain tuples (the backplane turns them into records):

  ("bind", key, kind, consumer, pattern, start_ms, replace)
                                                            pull a shared durable consumer
                                                            (kind "q": a queue, pattern its
                                                            destination; "d": a durable, pattern
                                                            its topic pattern; in the streams that
                                                            hold them: ``cluster/shards.py``;
                                                            replace: delete it first)
  ("unbind", key, delete)                                   stop pulling it (delete: the consumer
                                                            of that name goes too)
  ("credit", key, n)                                        may send ``n`` more (n < 0 takes back)
  ("publish", tokens, subject, msg_id, payload, deadline_ms)
                                                            store it (one message, ``packs.single``,
                                                            or a pack, one token per member);
                                                            answer stored/failed for each token
  ("ack" | "nak" | "term", ref[, nak delay s])               settle a pulled message
  ("replay", token, pattern, since_ms)                      stored topic messages since then
  ("peek", token, destination, want, max_bytes, timeout_ms) an operator's peek: a queue's stored
                                                            JetStream messages, read, not consumed
  ("purge", token, destination, consumer, timeout_ms)       an operator's purge: the queue's messages
                                                            not handed to any node, taken through its
                                                            consumer and terminated
  ("delete", token, destination, consumer, timeout_ms)      an operator's delete: refused while a node
                                                            pulls the queue's consumer or holds its
                                                            messages unacknowledged; else its stored
                                                            messages terminated, its consumer deleted
  ("forget", token, key, consumer, timeout_ms)              an operator's removal of a durable
                                                            subscription: every node asked
                                                            (``cluster/removal.py``), then its
                                                            consumers deleted
  ("durable_answer", n, held, attached)                     this node's answer to removal request ``n``
  ("forget_elsewhere", key)                                 a client ended durable subscription ``key`` here:
                                                            the other nodes drop their detached record of it
  ("take", token, destination, consumer, want, max_bytes, timeout_ms)
                                                            an operator's move: up to ``want`` of them,
                                                            taken and held for the dispatcher, which
                                                            moves or gives back each (``took``)

and takes the bridge's answers (``event``): ("stored", token), ("failed", token, reason, refused)
(refused: False when it may have been stored, True when refused, "full" for a full queue),
("message", key, ref, delivered, payload), ("replayed", token, payload), ("replay_end", token),
("peeked", token, stored, cut, payload) (``records.pack_blobs`` of the JetStream messages read, in
order; ``stored``: JetStream messages stored for the destination; ``cut``: the read stopped at its
bound of bytes or JetStream messages), ("purged", token, n, cut) (``n`` queue messages terminated;
``cut``: it stopped at its time bound with more left), ("deleted", token, found, n) (``found``: the
queue's consumer or messages were there; ``n`` queue messages terminated), ("forgotten", token, found, n)
(``found``: a node held the durable's record or JetStream its consumer; ``n``: its messages waiting
there), ("durable_asked", n, op, key) (a removal's request to this node), ("taken", token, cut, payload)
(``records.pack_taken``: each message taken, its ref and delivery count), ("refused", token, status, reason) (an
operator's action JetStream failed or did not answer in time: an HTTP status and why).
Both travel as one record each, packed by ``pack``/``unpack``. ``out`` holds one publish per
message; ``commands`` hands them over packed.

Rules:
- A node pulls only what its local subscriptions have room for: each subscription's prefetch
  room (``window``: for auto-ack ones and prefetch 0, ``AUTO_WINDOW`` or ``WINDOW_PACKS`` packs,
  whichever is more, less what its connection has not written yet), less what waits locally, less
  credit already given.
- A pulled message is a plain ``Message`` in the local queue of its destination, delivered by the
  broker's usual pump; ``redelivered`` when JetStream delivered it before (to any node).
- It is acknowledged to JetStream when it leaves the node for good: ACK (``client`` cumulative or
  ``client-individual``), or for auto-ack when the writer reports it written, or expiry.
- NACK: ``nak`` (JetStream redelivers it, on any node) unless it has been delivered more than
  ``max_redeliveries`` times: then it is published to the dead-letter queue and, once that is
  stored, ``term``ed. A message this node cannot hand to anyone (its consumers left) is nak'ed.
- Packs (``packs.py``): the queue messages a round publishes to one subject go as one JetStream
  message (``commands``; a message with a dedup-id alone). A pulled JetStream message may hold
  several (members), each settled on its own; the JetStream message is settled when all are
  (``packs.Ledger``: one ack, or one nak, for the bridge). JetStream can only
  redeliver a pack whole, so a member that must go back while others of its pack are (or will be)
  acknowledged is *put back*: published again by itself (its delivery count carried on, so
  ``redelivered`` and max_redeliveries hold), and settled once that copy is stored. A NACKed member
  is put back at once; members given back (their consumers left, no selector takes them) wait
  their delay: if by then every member of the pack came back, the pack goes back whole (nak).
- A SEND's receipt (and every later reply to that connection) waits until JetStream stored its
  message (``Backplane.waiting``); past ``cluster_timeout_ms`` the sender gets an ERROR ``cluster
  unavailable``.
- An operator's action on a queue (``broker/manage.py``) is a command with a token and a ``Later``
  (``asked``) that the bridge's answer finishes; with no answer within ``cluster_timeout_ms`` (and
  a second) it fails 503.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct

import orjson

from ..broker import durables, vhosts
from ..broker.model import Later, Message
from ..broker.names import DIAG_PREFIX, MONITOR, OWNER_SEP, QUEUE_PREFIX, REPLY_PREFIXES, TEMP_PREFIXES, WORKER_PREFIX
from ..protocol.stomp import ProtocolError
from . import packs, removal, shards
from .records import unpack_blobs, unpack_taken

REMOVALS_HELD = 1024   # durable keys a node holds for removals at once (more only from a misbehaving peer)
SETTLE_NAMES = {packs.ACK: "ack", packs.NAK: "nak", packs.TERM: "term"}
AUTO_WINDOW = 64     # messages pulled ahead for an auto-ack subscription (or prefetch 0) ...
WINDOW_PACKS = 4     # ... at least this many full packs: a pull of fewer packs leaves JetStream idle between
PARKED_DELAY = 2.0   # seconds before a message no local selector takes is offered again
# Seconds before a message a node gives back after letting its queue go is offered again: the
# stream's leader may be on another server and learn a little later that this node's pull is gone;
# offered at once it could go to that pull, and nowhere, until ack_wait.
GIVE_BACK_DELAY = 0.25
NEVER_KEPT = (DIAG_PREFIX, WORKER_PREFIX) + TEMP_PREFIXES + REPLY_PREFIXES  # topic-like names no stream keeps


def window(pack: int) -> int:
    """Messages pulled ahead for an auto-ack subscription when JetStream messages hold up to ``pack``."""
    return max(AUTO_WINDOW, WINDOW_PACKS * pack)


# -- names ------------------------------------------------------------------------------------
def escape_token(text: str) -> str:
    """One NATS subject token (also a valid stream consumer name): bytes outside [A-Za-z0-9_-]
    become %XX; an empty text is ``%``."""
    out = []
    for byte in text.encode():
        ch = chr(byte)
        out.append(ch if (ch.isascii() and (ch.isalnum() or ch in "_-")) else f"%{byte:02X}")
    return "".join(out) or "%"


def consumer_name(prefix: str, text: str) -> str:
    """A durable consumer name: readable when short, else a digest (JetStream names are file names)."""
    token = escape_token(text)
    if len(token) > 120:
        token = token[:60] + "_" + hashlib.sha256(text.encode()).hexdigest()[:32]
    return f"{prefix}_{token}"


def durable_consumer(key: str) -> str:
    return consumer_name("d", key.replace(OWNER_SEP, "/"))


# -- commands and events between dispatcher and bridge ------------------------------------------
def pack(item: tuple) -> bytes:
    """A command or event as bytes: its plain fields as JSON, its one bytes field (if any) raw after."""
    raw = b""
    fields = []
    for value in item:
        if isinstance(value, (bytes, bytearray, memoryview)):
            raw = bytes(value)
            fields.append(None)
        else:
            fields.append(value)
    head = orjson.dumps(fields)
    return struct.pack(">I", len(head)) + head + raw


def unpack(blob) -> tuple:
    blob = bytes(blob)
    (n,) = struct.unpack_from(">I", blob, 0)
    fields = orjson.loads(blob[4:4 + n])
    if None in fields:
        fields[fields.index(None)] = blob[4 + n:]
    return tuple(fields)


def peek_result(payload: bytes, stored: int, offset: int, count: int, cut: bool = False) -> tuple:
    """(depth, up to ``count`` messages from ``offset``, cut) of the JetStream messages a peek read
    (``records.pack_blobs``, in order), each pack taken apart into its messages; ``stored``: the
    JetStream messages stored for the queue, of which those not read count one message each;
    ``cut``: the read stopped at a bound before the end. A JetStream message that is not a
    stompbroker message is left out."""
    blobs = unpack_blobs(payload)
    messages = []
    for data in blobs:
        try:
            members = packs.unpack(data)
        except ValueError:
            continue
        for m in members:
            message = Message(m.id, m.destination, m.headers, m.body)
            message.redelivered = m.before > 0
            messages.append(message)
    return len(messages) + max(stored - len(blobs), 0), messages[offset:offset + count], cut


def matches(pattern: str, destination: str) -> bool:
    """A subscription pattern's match (``*``: a prefix match on the text before it)."""
    star = pattern.find("*")
    return destination == pattern if star < 0 else destination.startswith(pattern[:star])


# -- state ------------------------------------------------------------------------------------
class Pending:
    __slots__ = ("deadline", "then")

    def __init__(self, deadline: float, then: int):
        self.deadline = deadline   # monotonic
        self.then = then           # a JetStream ref to term once stored (the dead letter's original)


class Pack:
    """The members of one pulled JetStream message that holds several (``packs.py``)."""

    __slots__ = ("left", "settled", "back", "due")

    def __init__(self, n: int):
        self.left = n          # members not decided yet
        self.settled = False   # one was acknowledged, termed or put back: the pack will be acked
        self.back: list = []   # (message, pulled) given back, waiting for the pack's fate
        self.due = 0.0         # when the ones given back go back (monotonic)


class Pulled:
    __slots__ = ("ref", "key", "delivered", "pack")

    def __init__(self, ref: int, key: str, delivered: int, pack: Pack | None = None):
        self.ref = ref              # the bridge's handle of its JetStream message (a pack's members share it)
        self.key = key              # the local queue it came for
        self.delivered = delivered  # deliveries so far (JetStream's count, plus earlier copies')
        self.pack = pack            # its pack, when it came with others


class Moving:
    """An operator's move in cluster mode (``ClusterQueues.move``)."""

    __slots__ = ("name", "choose", "elsewhere", "added", "later", "moved", "hold", "want")

    def __init__(self, name: str, choose, elsewhere, added: dict, later: Later):
        self.name = name              # the source queue
        self.choose = choose          # message -> its target, or None: it stays
        self.elsewhere = elsewhere    # (target, headers, body, expires): a copy to a destination not a queue
        self.added = added            # headers added to each copy
        self.later = later
        self.moved = 0
        self.hold = [0, None, False, None]   # its place in the Later's waits (Backplane.waiting) until taken
        self.want = 0                 # the most it moves (the count asked, or the move's bound)


class ClusterQueues:
    def __init__(self, config, backplane):
        self.config = config
        self.backplane = backplane        # its tokens, and its queue of replies held behind a sender's messages
        self.name = config.cluster_name
        self.shards = config.cluster_streams   # this node's layout: it publishes into these shards
        self.pack = packs.size(config)         # ... of queue messages packed by up to this many
        self.window = window(self.pack)
        self.out: list = []
        self.run = os.urandom(6).hex()    # Nats-Msg-Id prefix: unique per node and start
        self.tokens = 0
        self.pending: dict[int, Pending] = {}               # publishes waiting for their PubAck
        self.pulled: dict[Message, Pulled] = {}             # messages pulled and not settled
        self.bound: dict[str, int] = {}                     # local queue name -> credit given
        self.binds: dict[str, tuple] = {}                   # local queue name -> its bind command
        self.dirty: set[str] = set()                        # queues whose credit may have to change
        self.leaving: set[str] = set()                      # queues whose last subscription here may have gone
        self.held: dict[str, int] = {}                      # local queue name -> its pulled messages not settled
        self.replays: dict[int, object] = {}                # replay token -> the subscription
        self.returning: dict[Pack, None] = {}               # packs with members given back, in order
        self.ledger = packs.Ledger()                        # pulled packs whose members are not all settled
        self.asked: dict[int, tuple] = {}                   # operators' actions: token -> (Later, deadline, shape)
        self.removing: dict[str, float] = {}                # durable key -> until when its removal holds it
        pack_ids = itertools.count(1)
        self.packer = packs.Packer(self.pack, lambda: f"{self.run}-p{next(pack_ids)}")

    # -- sending -------------------------------------------------------------------------------
    def publish(self, b, message: Message, session=None, subject: str | None = None, then: int = 0,
                before: int = 0, fresh: bool = False) -> int:
        """Hand a message to JetStream: a queue's (``subject`` None) to its shard, in a packed layout
        packed with the round's others (``commands``); a kept topic message to ``subject``, alone. ``session``:
        its sender, whose replies (its receipt first) wait until it is stored, and who gets an ERROR
        if it cannot be (the backplane's queue of held replies, shared with topic messages waiting
        for NATS). ``then``: a pulled message's ref, termed once this is stored (a dead letter's
        original, a put-back member's first copy). ``before``: its deliveries so far (a put-back
        member). ``fresh``: never its dedup-id as Nats-Msg-Id (a copy JetStream must not drop)."""
        bp = self.backplane
        token = next(bp.tokens)
        dedup = None if fresh else message.headers.get("dedup-id")
        wall_ms = int((message.expires - b.now + b.clock()) * 1000) if message.expires else 0
        deadline = b.now + self.config.cluster_timeout_ms / 1000
        self.pending[token] = Pending(deadline, then)
        if session is not None:
            bp.owners[token] = (session, deadline + 2)
            bp.waiting.setdefault(session, []).append([token, None, False, message.headers.get("receipt")])
        timeout_ms = int(self.config.cluster_timeout_ms)
        if subject is None and self.pack > 1:   # a member: packed with the round's others, unless it has its own id
            msg_id = f"{message.destination} {dedup}".replace("\r", " ").replace("\n", " ") if dedup else ""
            self.out.append(("publish", token, shards.queue_subject(self.name, self.shards, message.destination,
                                                                     self.pack), msg_id,
                             packs.member(message.id, message.headers, message.body, wall_ms, before), timeout_ms,
                             message.destination))
            return token
        msg_id = f"{message.destination} {dedup}" if dedup else f"{self.run}-{token}"
        subject = subject or shards.queue_subject(self.name, self.shards, message.destination)
        self.out.append(("publish", token, subject, msg_id.replace("\r", " ").replace("\n", " "),
                         packs.single(message.id, message.destination, message.headers, message.body, wall_ms,
                                      before), timeout_ms, ""))
        return token

    def stored(self, b, token: int) -> None:
        pending = self.pending.pop(token, None)
        if pending is None:
            return
        if pending.then:
            self._settle(pending.then, packs.TERM)
        self.backplane._published(b, token)

    def failed_publish(self, b, token: int, reason: str, refused: bool | str = False) -> None:
        """JetStream could not store it in time, or refused it (``"full"``: the queue holds
        max_queue_messages in the stream): its sender gets an ERROR (with the receipt it waits
        for); a dead letter that could not be stored stays where it was (nak)."""
        pending = self.pending.pop(token, None)
        if pending is None:
            return
        if pending.then:
            self._settle(pending.then, packs.NAK)
        if refused == "full":
            packed = (f", counted in JetStream messages of up to {self.pack} messages: at most "
                      f"{packs.queue_limit(self.config)} of them" if self.pack > 1 else "")
            self.backplane._failed(b, token, "queue full", "the queue holds as many messages as it may across the "
                                   f"cluster (max_queue_messages {self.config.max_queue_messages}{packed}); the "
                                   "message was not stored")
        elif refused:
            self.backplane._failed(b, token, "message not stored", f"the cluster refused this message: {reason}")
        else:
            self.backplane._failed(b, token, "cluster unavailable", f"the cluster could not store this message "
                                   f"within cluster_timeout_ms ({reason}); it may still have been stored: a "
                                   "retry with the same dedup-id header is not stored twice")

    def expire(self, b, now: float) -> None:
        """Publishes past their deadline (the bridge is gone or stuck) fail here."""
        late = [t for t, p in self.pending.items() if now > p.deadline + 1.0]
        for token in late:
            self.failed_publish(b, token, "no answer from the cluster bridge")

    # -- broker hooks --------------------------------------------------------------------------
    def takes(self, b, message: Message, session) -> bool:
        """A SEND being published: a queue message goes to JetStream only (True); a topic message
        sent with persistent:true, or matching a durable subscription anywhere in the cluster, is
        also kept in the topic stream for durable subscriptions and replay-from, and goes on to
        live subscribers (False). (Durable subscriptions read only that stream, never live.)"""
        destination = message.destination
        persistent = message.headers.get("persistent")
        if destination.startswith(QUEUE_PREFIX):
            if destination == MONITOR:
                return False
            self.publish(b, message, session if persistent != "false" else None)
            return True
        if (persistent == "true" or self.backplane.durable_wants(b, destination)) and \
                not destination.startswith(NEVER_KEPT):
            self.publish(b, message, session, subject=shards.topic_subject(self.name, self.shards, destination))
        return False

    def subscribing(self, b, sub, durable_key: str | None, receipt) -> None:
        """A SUBSCRIBE about to be registered: pull the queue's (or the durable's) consumer."""
        destination = sub.destination
        if destination.startswith(TEMP_PREFIXES):
            return
        if durable_key is not None:
            self._not_removing(b, durable_key, receipt)
            existing = b.durables.get(durable_key)
            if existing is None or existing.pattern != destination:  # (durables.attach makes it anew)
                if existing is not None:
                    self.backplane.durable(existing.pattern, -1)
                self.backplane.durable(destination, +1)
            self.bind(b, f"durable:{durable_key}", "d", durable_consumer(durable_key), destination,
                      int(b.clock() * 1000),
                      replace=existing is not None and existing.pattern != destination)
        elif destination.startswith(QUEUE_PREFIX) and destination != MONITOR:
            if "*" in destination:
                raise ProtocolError("wildcard queue subscription", "in cluster mode a queue subscription names "
                                    "one queue (queues live in JetStream, one consumer each)", receipt)
            self.bind(b, destination)

    def _not_removing(self, b, key: str, receipt) -> None:
        """A durable an operator is removing (held by ``durable_asked``) takes no client meanwhile."""
        until = self.removing.get(key)
        if until is None:
            return
        if until > b.now:
            raise ProtocolError("durable subscription being removed", "an operator is removing this durable "
                                "subscription; subscribe again in a moment", receipt)
        del self.removing[key]

    def drop_durable(self, b, durable) -> None:
        """An UNSUBSCRIBE ended a durable subscription: its consumer goes, on every node."""
        self.backplane.durable(durable.pattern, -1)
        self.bound.pop(durable.queue.name, None)
        self.binds.pop(durable.queue.name, None)
        self.out.append(("unbind", durable.queue.name, durable_consumer(durable.name)))
        self.out.append(("forget_elsewhere", durable.name))   # other nodes that held a client of it drop theirs

    def replay(self, b, sub, since_ms: float) -> None:
        self.tokens += 1
        self.replays[self.tokens] = sub
        self.out.append(("replay", self.tokens, sub.destination, since_ms))

    def replayed(self, b, token: int, payload: bytes, queues) -> None:
        sub = self.replays.get(token)
        if sub is None or sub.session.subs.get(sub.id) is not sub:
            return
        try:
            members = packs.unpack(payload)
        except ValueError:
            return
        for m in members:
            if matches(sub.destination, m.destination) and (sub.accepts is None or sub.accepts(m.headers)):
                queues.deliver(b, sub, Message(m.id, m.destination, {**m.headers, "replayed": "true"}, m.body), None)

    def replay_end(self, token: int) -> None:
        self.replays.pop(token, None)

    # -- operators' actions (broker/manage.py) ---------------------------------------------------
    def ask(self, b, command: str, *args, shape=None, later: Later | None = None) -> Later:
        """An operator's action for the bridge: ``(command, token, *args, timeout_ms)``; its
        ``Later`` (a new one unless given) is finished by the bridge's answer (made its result by
        ``shape``), or fails 503 without one in time."""
        token = next(self.backplane.tokens)
        later = later or Later()
        timeout_ms = int(self.config.cluster_timeout_ms)
        self.asked[token] = (later, b.now + timeout_ms / 1000 + 1.0, shape)
        self.out.append((command, token, *args, timeout_ms))
        return later

    def peek(self, b, name: str, offset: int, count: int, max_bytes: int) -> Later:
        """Up to ``count`` of a queue's stored messages from ``offset``, read from JetStream, not
        consumed: a Later of (depth, messages), as ``manage.peek`` gives."""
        return self.ask(b, "peek", name, offset + count, max_bytes,
                        shape=lambda stored, cut, payload: peek_result(payload, stored, offset, count, cut))

    def purge(self, b, name: str, here: int) -> Later:
        """Purge a queue's messages JetStream has not handed to any node (the bridge takes them
        through the queue's consumer and terminates them): a Later of (``here`` plus those, cut)."""
        return self.ask(b, "purge", name, consumer_name("q", name), shape=lambda n, cut: (here + n, cut))

    def delete(self, b, name: str) -> Later:
        """Delete a queue across the cluster (this node checked it has no subscription on it and
        holds none of its messages): the bridge refuses it (409) while the queue's JetStream consumer
        has a pull request waiting (a node with subscribers on it) or a message delivered and not
        acknowledged, else terminates its stored messages and deletes the consumer. A Later of the
        messages dropped, None when there was nothing (no consumer, no message)."""
        return self.ask(b, "delete", name, consumer_name("q", name),
                        shape=lambda found, n: n if found else None)

    def remove_durable(self, b, key: str) -> Later:
        """Remove a durable subscription across the cluster: the bridge asks every node
        (``cluster/removal.py``: refused, 409, while a client is attached anywhere; 503 when a node
        does not answer), then deletes its consumers. A Later of the messages that waited for it in
        JetStream, None when no node and no stream knew it."""
        return self.ask(b, "forget", key, durable_consumer(key), shape=lambda found, n: n if found else None)

    def durable_asked(self, b, n: int, op: str, key: str) -> None:
        """A removal asks this node (``cluster/removal.py``): held (no SUBSCRIBE of the key until
        released) unless a client is attached here, its record dropped on ``drop``."""
        durable = b.durables.get(key)
        attached = durable is not None and durable.sub is not None
        if op == removal.RELEASE:
            self.removing.pop(key, None)
        elif not attached:
            if key not in self.removing and len(self.removing) >= REMOVALS_HELD:
                self._prune_removing(b.now)
            self.removing[key] = b.now + self.config.cluster_timeout_ms / 1000
            if op == removal.DROP and durable is not None:
                self._forget(b, durable)
        self.out.append(("durable_answer", n, durable is not None, attached))

    def _prune_removing(self, now: float) -> None:
        """Past REMOVALS_HELD keys held (requests from a broken or hostile peer): the ended holds go,
        then the oldest, so the table stays bounded."""
        for key in [k for k, until in self.removing.items() if until <= now]:
            del self.removing[key]
        while len(self.removing) >= REMOVALS_HELD:
            del self.removing[next(iter(self.removing))]

    def _forget(self, b, durable) -> None:
        """Drop a detached durable's record here. What this node pulled for it goes back to JetStream
        (not acknowledged: the remover counts it there, then deletes the consumer with it)."""
        queue = durable.queue
        if self.bound.pop(queue.name, None) is not None:   # (the unbind before the naks: see sweep)
            self.binds.pop(queue.name, None)
            self.dirty.discard(queue.name)
            self.out.append(("unbind", queue.name, ""))
        for source in (queue.messages, queue.parked, queue.blocked):
            for message in source:
                self.give_back(b, message)
            source.clear()
        durables.drop(b, durable)
        self.backplane.durable(durable.pattern, -1)

    def move(self, b, name: str, choose, elsewhere, added: dict, later: Later, max_bytes: int,
             want: int) -> Later:
        """Move a queue's waiting messages (``manage.move`` decides which, and where: ``choose``):
        those this node pulled and has not delivered, then up to ``want`` the bridge takes through
        the queue's consumer (``took``). Each moved message is a copy stored in its target (``added``
        to its headers) the way a dead letter is, its original terminated once the copy is stored;
        one not moved goes back to JetStream. ``later`` is finished with (moved, None: what is left
        is not counted, it would take reading the queue) once every copy is stored (its sender:
        ``Backplane.waiting``), failed when one cannot be."""
        state = Moving(name, choose, elsewhere, added, later)
        state.want = want
        self.backplane.waiting.setdefault(later, []).append(state.hold)   # (until the bridge has answered)
        queue = b.queues.get(name)
        if queue is not None:
            for source in (queue.parked, queue.blocked, queue.messages):
                kept = []
                for message in source:
                    target = choose(message) if message in self.pulled else None
                    if target is None:
                        kept.append(message)
                    else:
                        self._move_one(b, state, message, target)
                source.clear()
                source.extend(kept)
        return self.ask(b, "take", name, consumer_name("q", name), max(want - state.moved, 0), max_bytes,
                        shape=state, later=later)

    def _move_one(self, b, state: Moving, message: Message, target: str) -> None:
        pulled = self._unpull(message)
        self.dirty.add(pulled.key)
        if pulled.pack is not None:   # (decided: settled once its copy is stored)
            pulled.pack.left -= 1
            pulled.pack.settled = True
        headers = {**message.headers, **state.added}
        if target.startswith(QUEUE_PREFIX) and target != MONITOR:
            copy = Message(message.id, target, headers, message.body, message.expires)
            self.publish(b, copy, state.later, then=pulled.ref, fresh=True)   # (fresh: never dropped as a repeat)
        else:  # routed as a publish (a topic's at most once across nodes, as a SEND's)
            state.elsewhere(target, headers, message.body, message.expires)
            self._settle(pulled.ref, packs.ACK)
        state.moved += 1

    def took(self, b, token: int, cut: bool, payload) -> None:
        """The bridge's answer to a move's take: each message it took moved or given back."""
        entry = self.asked.pop(token, None)
        try:
            items = unpack_taken(payload)
        except ValueError:
            items = []
        state = entry[2] if entry is not None else None
        if not isinstance(state, Moving):
            for ref, _, _ in items:   # (its move gave up waiting: all of them back)
                self.out.append(("nak", ref))
            return
        later = state.later
        split = []   # packs some of whose messages moved: the others are put back by themselves now
        for ref, delivered, data in items:
            try:
                members = packs.unpack(data)
            except ValueError:
                self.out.append(("term", ref))   # not a stompbroker message: nobody could read it
                continue
            pack = None
            if len(members) > 1:
                pack = Pack(len(members))
                self.ledger.hold(ref, len(members))
            clock = b.clock() if any(m.expires_ms for m in members) else 0.0
            for m in members:
                expires = (b.now + (m.expires_ms / 1000 - clock) or 1e-9) if m.expires_ms else 0.0
                message = Message(m.id, m.destination, m.headers, m.body, expires)
                count = delivered + m.before
                message.redelivered = count > 1
                self.pulled[message] = Pulled(ref, state.name, count, pack)
                self.held[state.name] = self.held.get(state.name, 0) + 1
                target = state.choose(message) if later.outcome is None else None
                if target is None:
                    self.give_back(b, message)
                else:
                    self._move_one(b, state, message, target)
            if pack is not None and pack.back and pack in self.returning:
                split.append(pack)
        for pack in split:   # (the answer waits for them too: the source holds them when it comes)
            self._return(b, pack, b.now, later if later.outcome is None else None)
        # truncated: the bridge stopped (its time, max_answer_bytes) before the move had its count
        later.value = (state.moved, None, cut and state.moved < state.want)
        state.hold[2] = True
        self.backplane._release(b, later)

    def answered(self, token: int, *answer) -> None:
        entry = self.asked.pop(token, None)
        if entry is None:
            return
        later, _, shape = entry
        try:
            later.finish(shape(*answer) if shape is not None else answer[0])
        except Exception as exc:  # (an answer it cannot read: the bridge's bug, this action's 503)
            later.fail(503, f"the cluster bridge's answer could not be read: {exc}")

    def refused(self, token: int, status: int, reason: str) -> None:
        entry = self.asked.pop(token, None)
        if entry is None:
            return
        if isinstance(entry[2], Moving):   # (its copies still settle their originals when answered)
            for wait in self.backplane.waiting.pop(entry[0], ()):
                self.backplane.owners.pop(wait[0], None)
            if entry[2].moved:
                reason += f"; {entry[2].moved} messages were moved before it stopped"
        entry[0].fail(status, reason)

    def expire_asked(self, now: float) -> None:
        for token in [t for t, entry in self.asked.items() if now > entry[1]]:
            self.refused(token, 503, "no answer from the cluster bridge within cluster_timeout_ms "
                                     f"({self.config.cluster_timeout_ms} ms)")

    def on_tick(self, b, now: float, queues) -> None:
        if self.asked:
            self.expire_asked(now)
        if self.pending:
            self.expire(b, now)
        if self.bound:
            self.sweep(b, queues)
        if self.returning:
            for pack in [p for p in self.returning if p.due <= now]:
                self._return(b, pack, now)

    def event(self, b, item: tuple, queues) -> None:
        """One answer from the bridge."""
        kind = item[0]
        if kind == "message":
            self.arrived(b, item[1], item[2], item[3], item[4], queues)
        elif kind == "stored":
            self.stored(b, item[1])
        elif kind == "failed":
            self.failed_publish(b, item[1], item[2], item[3] if len(item) > 3 else False)
        elif kind == "replayed":
            self.replayed(b, item[1], item[2], queues)
        elif kind == "replay_end":
            self.replay_end(item[1])
        elif kind == "peeked":
            self.answered(item[1], item[2], item[3], item[4])
        elif kind == "purged":
            self.answered(item[1], item[2], item[3])
        elif kind == "deleted" or kind == "forgotten":
            self.answered(item[1], item[2], item[3])
        elif kind == "durable_asked":
            self.durable_asked(b, item[1], item[2], item[3])
        elif kind == "taken":
            self.took(b, item[1], item[2], item[3])
        elif kind == "refused":
            self.refused(item[1], item[2], item[3])

    # -- pulling -------------------------------------------------------------------------------
    def bind(self, b, key: str, kind: str = "q", consumer: str = "", pattern: str = "",
             start_ms: int = 0, replace: bool = False) -> None:
        """A local subscription reads this queue (or durable): pull its shared consumer."""
        self.dirty.add(key)
        if key in self.bound and not replace:
            return
        self.bound[key] = 0
        command = ("bind", key, kind, consumer or consumer_name("q", key), pattern or key, start_ms, replace)
        self.binds[key] = command[:-1] + (False,)
        self.out.append(command)

    def arrived(self, b, key: str, ref: int, delivered: int, payload: bytes, queues) -> None:
        """A pulled JetStream message (the bridge's ``ref``): its message, or each member of its pack,
        into the local queue, delivered by the usual pump."""
        try:
            members = packs.unpack(payload)
        except ValueError:
            self.out.append(("term", ref))   # not a stompbroker message: nobody could read it
            if key in self.bound:
                self.bound[key] -= packs.count(payload)
            return
        n = len(members)
        pack = None
        if n > 1:
            pack = Pack(n)
            self.ledger.hold(ref, n)
        if key in self.bound:
            self.bound[key] -= n
        self.held[key] = self.held.get(key, 0) + n   # (each member's share goes when it is settled: _unpull)
        queue = b.queues.get(key)
        bound = key in self.bound and not (queue is None and key.startswith("durable:"))
        owner = queue.owner if queue is not None else None
        clock = b.clock() if any(m.expires_ms for m in members) else 0.0
        pulled = self.pulled
        for m in members:
            expires = (b.now + (m.expires_ms / 1000 - clock) or 1e-9) if m.expires_ms else 0.0
            message = Message(m.id, m.destination, m.headers, m.body, expires)
            count = delivered + m.before
            message.redelivered = count > 1
            pulled[message] = Pulled(ref, key, count, pack)
            if owner is not None and not matches(owner.pattern, m.destination):
                self.settled(message)  # the durable's stream filter is wider than its pattern
                continue
            if not bound:
                # pulled before this node let the queue go: nobody here reads it, another node may
                self.give_back(b, message, GIVE_BACK_DELAY)
                continue
            if queue is None:
                queue = queues.get_queue(b, key)
            queue.messages.append(message)
            queue.enqueued += 1
        if bound and queue is not None:
            self.dirty.add(key)
            queues.pump(b, queue)

    def _unpull(self, message: Message):
        pulled = self.pulled.pop(message, None)
        if pulled is not None:
            n = self.held[pulled.key] - 1
            if n:
                self.held[pulled.key] = n
            else:
                del self.held[pulled.key]
        return pulled

    def settled(self, message: Message) -> None:
        """The message left this node for good (acknowledged, written auto-ack, expired)."""
        pulled = self._unpull(message)
        if pulled is not None:
            self._settle(pulled.ref, packs.ACK)
            self.dirty.add(pulled.key)
            if pulled.pack is not None:
                pulled.pack.left -= 1
                pulled.pack.settled = True

    def nacked(self, b, message: Message) -> bool:
        """A NACK of a pulled message: redelivered by JetStream, or dead-lettered past
        max_redeliveries. False for a message that is not a cluster one."""
        pulled = self._unpull(message)
        if pulled is None:
            return False
        self.dirty.add(pulled.key)
        if pulled.pack is not None:   # (decided: settled once its copy, a dead letter or put back, is stored)
            pulled.pack.left -= 1
            pulled.pack.settled = True
        if pulled.delivered > self.config.max_redeliveries:
            vhost, visible = vhosts.split(message.destination) if b.vhosts_on else (vhosts.DEFAULT, message.destination)
            dlq = vhosts.inside(vhost, self.config.dead_letter_queue)  # each virtual host has its own
            b.stats["dead_lettered"] += 1
            if message.destination == dlq:
                b.stats["messages_dropped"] += 1   # never loop in the dead-letter queue itself
                self._settle(pulled.ref, packs.TERM)
                return True
            headers = dict(message.headers)
            headers["original-destination"] = visible
            headers["dead-letter-reason"] = f"rejected {pulled.delivered} times"
            headers.pop("dedup-id", None)
            dead = Message(message.id, dlq, headers, message.body, message.expires)
            self.publish(b, dead, None, then=pulled.ref)   # the original goes once the copy is stored
        elif pulled.pack is not None:
            self._put_back(b, message, pulled)
        else:
            self._settle(pulled.ref, packs.NAK)
        return True

    def _settle(self, ref: int, op: int, delay: float = 0.0) -> None:
        """Settle one message pulled as ``ref`` (a pack's member: its JetStream message once all are)."""
        # (no int() for the usual delay 0: it was a sixth of a settle's cost)
        done = self.ledger.settle(ref, op, int(delay * 1000) if delay else 0)
        if done is not None:
            op, delay_ms = done
            self.out.append((SETTLE_NAMES[op], ref, delay_ms / 1000) if delay_ms else (SETTLE_NAMES[op], ref))

    def commands(self) -> list:
        """The round's commands, ``out`` emptied: its queue messages packed per subject (as
        ("publish", tokens, subject, msg_id, payload, timeout_ms)), after the other commands."""
        out, self.out = self.out, []
        if not any(c[0] == "publish" for c in out):
            return out
        packer, commands = self.packer, []
        for command in out:
            if command[0] != "publish":
                commands.append(command)
                continue
            _, token, subject, msg_id, payload, timeout_ms, destination = command
            if destination:
                packer.add(subject, destination, payload, token, msg_id)
            else:
                commands.append(("publish", (token,), subject, msg_id, payload, timeout_ms))
        timeout_ms = int(self.config.cluster_timeout_ms)
        commands += [("publish", r.tokens, r.subject, r.msg_id, r.payload, timeout_ms) for r in packer.take()]
        return commands

    def _put_back(self, b, message: Message, pulled: Pulled, sender=None) -> None:
        """A pack member goes back by itself: published again (a fresh Nats-Msg-Id: JetStream must
        not take it for its first copy), its deliveries carried on; its first copy is settled once
        this one is stored (if it cannot be, the member is nak'ed: the bridge then naks the whole
        pack, and its members already settled come again, marked redelivered)."""
        self.publish(b, message, sender, then=pulled.ref, before=pulled.delivered, fresh=True)

    def give_back(self, b, message: Message, delay: float = 0.0) -> None:
        """This node cannot hand it to anyone: JetStream offers it again, after ``delay`` seconds."""
        pulled = self._unpull(message)
        if pulled is None:
            return
        pack = pulled.pack
        if pack is None:
            self._settle(pulled.ref, packs.NAK, delay)
            return
        pack.left -= 1
        pack.back.append((message, pulled, delay))
        pack.due = max(pack.due, b.now + delay)
        self.returning[pack] = None
        if pack.left == 0 and not pack.settled:
            self._return(b, pack, b.now)

    def _return(self, b, pack: Pack, now: float, sender=None) -> None:
        """A pack's members given back: the whole pack goes back (nak) when all came back and none
        was settled; else, once their delay is over, each is put back by itself (``sender``: whose
        replies wait until they are stored)."""
        if pack.left == 0 and not pack.settled:
            for _, pulled, delay in pack.back:
                self._settle(pulled.ref, packs.NAK, delay)
        elif now >= pack.due:
            pack.settled = True
            for message, pulled, _ in pack.back:
                self._put_back(b, message, pulled, sender)
        else:
            return
        pack.back.clear()
        self.returning.pop(pack, None)

    def is_pulled(self, message: Message) -> bool:
        return message in self.pulled

    def room(self, b, queue_name: str, consumers: tuple) -> int:
        room = 0
        for sub in consumers:
            if sub.session.closing:
                continue
            if sub.tracked and sub.prefetch:
                room += max(sub.prefetch - len(sub.unacked), 0)
            else:
                room += max(self.window - len(sub.session.inflight) - len(sub.unacked), 0)
        return room

    def refill(self, b, queues) -> None:
        """Once per dispatcher round: queues whose last local subscription went stop being pulled;
        the dirty queues' consumers get the credit they have room for."""
        if self.leaving:
            leaving, self.leaving = self.leaving, set()
            self.sweep(b, queues, leaving)
        if not self.dirty:
            return
        dirty, self.dirty = self.dirty, set()
        for name in dirty:
            given = self.bound.get(name)
            if given is None:
                continue
            queue = b.queues.get(name)
            consumers = queues.consumers(b, queue) if queue is not None else b.index.match(name)
            want = self.room(b, name, consumers) - (queue.depth() if queue is not None else 0)
            want = max(want, 0)
            # More credit goes in steps of at least a quarter of the room (or when none is left):
            # one command per few messages, not one per delivery; a consumer that left takes its
            # share back at once.
            if (want > given and (given <= 0 or want - given >= max(want >> 2, 1))) or (want == 0 and given > 0):
                self.out.append(("credit", name, want - given))
                self.bound[name] = want

    def left(self, sub) -> None:
        """A subscription went: if it was the last one here, its queue stops being pulled at the end
        of this round (``refill``), not a tick later, so fewer messages come here meanwhile."""
        key = f"durable:{sub.durable.name}" if sub.durable is not None else sub.destination
        if key in self.bound:
            self.leaving.add(key)

    def sweep(self, b, queues, names=None) -> None:
        """A bound queue nobody here reads any more stops being pulled and gives its waiting
        messages back; parked messages (no local selector takes them) go back too (on the tick).
        The unbind goes first: JetStream then redelivers them to a pull still waiting, never to one
        of this node's it has not dropped yet."""
        for name in list(self.bound if names is None else names):
            if name not in self.bound:
                continue
            queue = b.queues.get(name)
            consumers = queues.consumers(b, queue) if queue is not None else b.index.match(name)
            self.dirty.add(name)  # (credit for consumers that left is taken back by the next refill)
            if consumers:
                if names is None and queue is not None and queue.parked:
                    for message in queue.parked:  # (not back at once: this node may take it again)
                        self.give_back(b, message, PARKED_DELAY)
                    queue.parked.clear()
                continue
            waiting = queue.depth() if queue is not None else 0
            if self.held.get(name, 0) > waiting:
                # deliveries still out (unacknowledged, or not yet written): they may come back
                # here; pull nothing more (refill takes the credit back) and look again next tick
                if queue is not None:
                    for source in (queue.messages, queue.parked, queue.blocked):
                        for message in source:
                            self.give_back(b, message, GIVE_BACK_DELAY)
                        source.clear()
                continue
            del self.bound[name]
            del self.binds[name]
            self.dirty.discard(name)
            self.out.append(("unbind", name, ""))
            if queue is not None:
                for source in (queue.messages, queue.parked, queue.blocked):
                    for message in source:
                        self.give_back(b, message, GIVE_BACK_DELAY)
                    source.clear()
                queues.drop_if_idle(b, queue)

    def bridge_started(self, b, first: bool) -> None:
        """A new bridge knows no consumer, credit or pulled message: bind again from scratch.
        What was pulled comes back from JetStream after ack_wait (at least once): the pulled
        messages still waiting here go. The first bridge got every command sent so far already."""
        if first:
            return
        for name in self.bound:
            queue = b.queues.get(name)
            if queue is not None:
                for source in (queue.messages, queue.parked, queue.blocked):
                    kept = [m for m in source if m not in self.pulled]
                    source.clear()
                    source.extend(kept)
        self.pulled.clear()
        self.held.clear()
        self.returning.clear()
        self.ledger.clear()
        for name in self.bound:
            self.bound[name] = 0
            self.dirty.add(name)
            self.out.append(self.binds[name])
