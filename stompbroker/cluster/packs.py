"""Packs: several queue messages of one destination in one JetStream message. Pure (sans-IO).

JetStream's work per message (store, replicate, deliver to a pull, take its ack) is most of what a
cross-node queue message costs, and nearly the same for one message of 150 bytes as for 16 of
them. So under load the messages one round of the dispatcher has for one queue subject go to
JetStream as one message; a quiet node sends each message at once (a pack of one): nothing waits
for company. Per-destination order holds: one subject is one destination, packs go out in order
and keep their members' order.

Layout (big-endian), in streams of a packed layout only (``cluster/shards.py``)::

    pack   = "SBp1" | n: u16 | len(destination): u32 | destination (UTF-8) | member * n
    member = size: u32 (bytes after this field) | before: u32 | expires: u64 | len(id): u16 | id (UTF-8)
             | len(headers): u32 | headers (JSON object) | body

``before``: deliveries of this message before this copy (a member put back by itself after its
pack was delivered, ``cluster/queuing.py``), so the broker's delivery count and ``redelivered`` go
on across copies. ``expires``: wall-clock ms, 0 = never. The messages of an unpacked layout keep
their own format, one message each (``single``: "SBq1", then the length of a JSON object of id,
destination, headers, expiry and deliveries before, then the body); ``unpack`` reads both.

Packing and settling are the dispatcher's (``cluster/queuing.py``), the bridge sends and acks whole
JetStream messages: ``Packer`` makes a round's packs, one record each; the broker settles each
member of a pulled pack (ack, term, nak), and ``Ledger`` settles the JetStream message once every
member is: ack, or term when every member was termed, or nak when any was (the broker naks
members only when all of its pack go back, save for one failure case it documents: then the
members already settled come again, marked ``redelivered``).
"""

from __future__ import annotations

import struct

import orjson

from .records import decode_headers

MAGIC = b"SBp1"
SINGLE_MAGIC = b"SBq1"        # one message per JetStream message (unpacked layouts)
_HEAD = struct.Struct(">4sHI")
_MEMBER = struct.Struct(">IIQH")
_LEN = struct.Struct(">I")
MAX_MEMBERS = 0xFFFF
# A packed queue holds at least this many JetStream messages: packs are made smaller (or not at
# all) when max_queue_messages is under MIN_PACKS x cluster_pack_max, so that a queue fed one
# message at a time is not refused as full far below max_queue_messages.
MIN_PACKS = 1000


class Member:
    """One message of a pack, as decoded."""

    __slots__ = ("id", "destination", "headers", "body", "expires_ms", "before")

    def __init__(self, message_id: str, destination: str, headers: dict, body: bytes, expires_ms: int,
                 before: int = 0):
        self.id = message_id
        self.destination = destination
        self.headers = headers
        self.body = body
        self.expires_ms = expires_ms   # wall clock, 0 = never
        self.before = before           # deliveries before this copy

    def __eq__(self, other) -> bool:
        return isinstance(other, Member) and all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self) -> str:
        return f"Member({self.id!r}, {self.destination!r}, {self.headers!r}, {self.body!r}, {self.expires_ms}, " \
               f"{self.before})"


def size(config) -> int:
    """The most messages one JetStream message of this node's queue layout holds: ``cluster_pack_max``,
    but no more than ``max_queue_messages // MIN_PACKS`` (at least 1: unpacked)."""
    p = min(max(int(getattr(config, "cluster_pack_max", 1) or 1), 1), MAX_MEMBERS)
    return max(min(p, config.max_queue_messages // MIN_PACKS), 1) if config.max_queue_messages > 0 else p


def queue_limit(config) -> int:
    """JetStream's per-subject limit for this node's queue layout, in JetStream messages: packs of
    at most ``size`` messages, so ``max_queue_messages // size`` of them never hold more than
    max_queue_messages (0: no limit)."""
    return config.max_queue_messages // size(config) if config.max_queue_messages > 0 else 0


# -- encoding ---------------------------------------------------------------------------------
def single(message_id: str, destination: str, headers: dict, body: bytes, expires_ms: int = 0,
           before: int = 0) -> bytes:
    """One message as one JetStream message (the format of unpacked layouts; ``b``, deliveries
    before this copy, only when there were some)."""
    meta = {"id": message_id, "d": destination, "h": headers, "x": expires_ms}
    if before:
        meta["b"] = before
    meta = orjson.dumps(meta)
    return SINGLE_MAGIC + _LEN.pack(len(meta)) + meta + body


def member(message_id: str, headers: dict, body: bytes, expires_ms: int = 0, before: int = 0) -> bytes:
    """One message as a pack member (its destination is the pack's)."""
    mid = message_id.encode()
    head = orjson.dumps(headers)
    size = _MEMBER.size - 4 + len(mid) + 4 + len(head) + len(body)
    return b"".join((_MEMBER.pack(size, before, expires_ms, len(mid)), mid, _LEN.pack(len(head)), head, body))


def pack(destination: str, members) -> bytes:
    """A JetStream message of ``members`` (encoded by ``member``) to ``destination``."""
    members = list(members)
    if not 1 <= len(members) <= MAX_MEMBERS:
        raise ValueError(f"a pack holds 1 to {MAX_MEMBERS} messages, not {len(members)}")
    d = destination.encode()
    return _HEAD.pack(MAGIC, len(members), len(d)) + d + b"".join(members)


def pack_header(destination: bytes, n: int) -> bytes:
    return _HEAD.pack(MAGIC, n, len(destination)) + destination


# -- decoding ---------------------------------------------------------------------------------
def count(data) -> int:
    """How many messages a JetStream message holds: a pack's count, else 1 (a single message, or
    anything unreadable: one thing to settle)."""
    if data[:4] != MAGIC or len(data) < _HEAD.size:
        return 1
    return _HEAD.unpack_from(data)[1] or 1


def unpack(data) -> list[Member]:
    """The messages of a pack, or the one message of the unpacked format; ValueError if neither.
    A member's headers are decoded only when they differ from the member's before it
    (``records.decode_headers``); each member gets its own dict."""
    data = bytes(data)
    if data[:4] == SINGLE_MAGIC:
        return [_single(data)]
    if data[:4] != MAGIC or len(data) < _HEAD.size:
        raise ValueError("not a stompbroker message")
    _, n, dlen = _HEAD.unpack_from(data)
    pos = _HEAD.size
    destination = data[pos:pos + dlen].decode()
    pos += dlen
    out = []
    last = decoded = None
    try:
        for _ in range(n):
            size, before, expires_ms, idlen = _MEMBER.unpack_from(data, pos)
            end = pos + 4 + size
            if end > len(data):
                raise ValueError("a member runs past the end of its pack")
            at = pos + _MEMBER.size
            message_id = data[at:at + idlen].decode()
            at += idlen
            (hlen,) = _LEN.unpack_from(data, at)
            at += 4
            if at + hlen > end:
                raise ValueError("a member's headers run past its end")
            head = data[at:at + hlen]
            if head != last:
                last, decoded = head, decode_headers(head)
            out.append(Member(message_id, destination, decoded.copy(), data[at + hlen:end], expires_ms, before))
            pos = end
    except (struct.error, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"unreadable pack: {exc}") from None
    if pos != len(data):
        raise ValueError("bytes after the last member of a pack")
    return out


def _single(data: bytes) -> Member:
    try:
        (n,) = _LEN.unpack_from(data, 4)
        meta = orjson.loads(data[8:8 + n])
        return Member(meta["id"], meta["d"], meta["h"], data[8 + n:], meta["x"], meta.get("b", 0))
    except (orjson.JSONDecodeError, struct.error, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable message: {exc}") from None


# -- the sending side: what one round has for each subject ------------------------------------
PACK_BYTES = 64 * 1024   # a pack holds at most this many bytes (a bigger message goes alone)


class Pending:
    """A pack being filled: one subject's messages of this round."""

    __slots__ = ("subject", "destination", "members", "tokens", "size")

    def __init__(self, subject: str, destination: str):
        self.subject = subject
        self.destination = destination.encode()
        self.members: list[bytes] = []
        self.tokens: list[int] = []
        self.size = _HEAD.size + len(self.destination)


class Ready:
    """A JetStream message to publish: its subject, Nats-Msg-Id, payload and the senders' tokens."""

    __slots__ = ("subject", "msg_id", "payload", "tokens")

    def __init__(self, subject: str, msg_id: str, payload: bytes, tokens: list[int]):
        self.subject = subject
        self.msg_id = msg_id
        self.payload = payload
        self.tokens = tokens

    def __repr__(self) -> str:
        return f"Ready({self.subject!r}, {self.msg_id!r}, {len(self.tokens)} messages)"


class Packer:
    """Gathers one round's members per subject (``add``); ``take`` hands out the packs, in the order
    each was closed: full (``max_count`` messages, or ``max_bytes``), or at the end of the round in
    the order each subject's first message came. A message with its own Nats-Msg-Id (a
    ``dedup-id``) goes alone, after what its subject had gathered. ``ids``: makes each pack's
    Nats-Msg-Id (unique: a retry of a pack keeps it, so JetStream stores it once)."""

    def __init__(self, max_count: int, ids, max_bytes: int = PACK_BYTES):
        self.max_count = max(1, min(max_count, MAX_MEMBERS))
        self.max_bytes = max_bytes
        self.ids = ids
        self.open: dict[str, Pending] = {}
        self.ready: list[Ready] = []

    def __len__(self) -> int:
        return len(self.open) + len(self.ready)

    def add(self, subject: str, destination: str, data: bytes, token: int, msg_id: str = "") -> None:
        pending = self.open.get(subject)
        if msg_id:   # alone, with its own id (de-duplicated by it), after what came before it
            if pending is not None:
                self._close(pending)
            self.ready.append(Ready(subject, msg_id, pack_header(destination.encode(), 1) + data, [token]))
            return
        if pending is not None and pending.size + len(data) > self.max_bytes:
            self._close(pending)
            pending = None
        if pending is None:
            pending = self.open[subject] = Pending(subject, destination)
        pending.members.append(data)
        pending.tokens.append(token)
        pending.size += len(data)
        if len(pending.members) >= self.max_count:
            self._close(pending)

    def _close(self, pending: Pending) -> None:
        del self.open[pending.subject]
        payload = pack_header(pending.destination, len(pending.members)) + b"".join(pending.members)
        self.ready.append(Ready(pending.subject, self.ids(), payload, pending.tokens))

    def take(self) -> list[Ready]:
        for pending in list(self.open.values()):
            self._close(pending)
        ready, self.ready = self.ready, []
        return ready


# -- the receiving side: settling a JetStream message once all its members are ----------------
ACK, NAK, TERM = 0, 1, 2      # (records.ACK, NAK, TERM)


class Held:
    """A pulled pack whose members are not all settled yet."""

    __slots__ = ("n", "left", "naks", "terms", "delay_ms")

    def __init__(self, n: int):
        self.n = n
        self.left = n              # members not settled yet
        self.naks = 0
        self.terms = 0
        self.delay_ms = 0          # the longest nak delay asked for


class Ledger:
    """The dispatcher's pulled packs, by the bridge's ref of their JetStream message: ``hold`` one
    of ``n`` members, ``settle`` takes one member's settle and answers the JetStream message's own
    (op, delay_ms) once its last member is settled, else None. A ref it does not hold (a message
    alone) is settled at once, as asked."""

    def __init__(self):
        self.packs: dict[int, Held] = {}

    def __len__(self) -> int:
        return len(self.packs)

    def hold(self, ref: int, n: int) -> None:
        if n > 1:
            self.packs[ref] = Held(n)

    def settle(self, ref: int, op: int, delay_ms: int = 0):
        held = self.packs.get(ref)
        if held is None:
            return op, delay_ms
        held.left -= 1
        if op == NAK:
            held.naks += 1
            held.delay_ms = max(held.delay_ms, delay_ms)
        elif op == TERM:
            held.terms += 1
        if held.left > 0:
            return None
        del self.packs[ref]
        if held.naks:
            return NAK, held.delay_ms
        return (TERM if held.terms == held.n else ACK), 0

    def clear(self) -> None:
        self.packs.clear()
