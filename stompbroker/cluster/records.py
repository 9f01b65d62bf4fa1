"""The dispatcher <-> bridge records, and the payload of a topic message on NATS. Defined once,
used by both sides (``cluster/backplane.py`` in the dispatcher, ``processes/cluster.py`` and its
parts in the bridge).

A record is the rings' usual one (``ipc/records.py``: a 24-byte header of length, kind, conn, aux,
stamp, then the payload); ``conn`` carries a token where a reply is expected, ``aux`` a count or
flags. New kinds go in :class:`Kind` (dispatcher -> bridge 100-139, bridge -> dispatcher 140-179),
with what they carry, and get a handler on the side that reads them.
"""

from __future__ import annotations

import enum
import struct

import orjson

from ..ipc.records import HEADER_SIZE, iter_records, pack_header, unpack_header

__all__ = ["Kind", "record", "iter_records", "unpack_header", "HEADER_SIZE", "Records", "pack_publish",
           "unpack_publish", "pack_message", "unpack_message", "wire", "unwire", "pack_queue_publish",
           "unpack_queue_publish", "pack_settle", "iter_settles", "pack_tokens", "unpack_tokens", "pack_pulled",
           "unpack_pulled", "pack_blobs", "unpack_blobs",
           "pack_taken", "unpack_taken", "pack_topic", "topic_member", "unpack_topic", "topic_count"]


class Kind(enum.IntEnum):
    # dispatcher -> bridge
    INTEREST = 100     # payload: a topic pattern or #worker name; aux: local subscriptions for it now (0 = gone)
    PUBLISH = 101      # payload: pack_publish(subject, message); conn: token (0 = none) the bridge answers with
                       # PUBLISHED/FAILED; aux: PUBLISH_WORKER for a worker queue's subject (a queue group)
    STOP = 102         # the dispatcher is stopping: leave the cluster cleanly and exit
    BUSY = 103         # aux: 1 = this node is behind with its deliveries (its writers' or its own queue is deep),
                       # 0 = caught up: the other nodes slow the producers that feed it (backplane.py)
    QUEUE_CMD = 110    # payload: a queuing.pack()ed command for JetStream (queues, durables, replay; cluster/queuing.py)
    # The queue hot path, binary (no JSON per message):
    QUEUE_PUBLISH = 111  # conn: how many messages; aux: cluster_timeout_ms; payload: pack_queue_publish(subject,
                         # msg_id, message, tokens): one JetStream message (one message, or a pack), its senders' tokens
    QUEUE_SETTLE = 112   # payload: one or more pack_settle(ref, op, delay_ms): a round's acks, naks, terms
    # bridge -> dispatcher
    BRIDGE_START = 140  # a bridge (re)started: tell it the whole local interest again
    STATUS = 141       # payload: JSON of the bridge's figures (connected, server, rtt_ms, ...); at least every second
    REMOTE = 142       # payload: a pattern other nodes subscribe; aux: their subscriptions for it (0 = none left)
    MESSAGE = 143      # payload: a message from another node (pack_message); aux: PUBLISH_WORKER if for a worker
    PUBLISHED = 144    # conn: the token of a PUBLISH held while NATS was unreachable: it went out now
    FAILED = 145       # conn: that token: NATS stayed unreachable for cluster_timeout_ms, it was not published
    REMOTE_RESET = 146  # forget every remote pattern (the bridge lost the interest bucket's view; REMOTEs follow)
    REMOTE_BUSY = 147  # payload: a pattern other nodes subscribe; aux: how many of those nodes are behind (0 = none)
    QUEUE_EVENT = 150  # payload: a queuing.pack()ed answer from JetStream (stored, failed, message, replayed...)
    QUEUE_STORED = 151   # payload: the tokens (u64 each) of publishes JetStream stored (PubAcks of one turn)
    QUEUE_MESSAGE = 152  # conn: ref; aux: JetStream's delivery count; payload: pack_pulled(key, data)


INTEREST, PUBLISH, STOP = Kind.INTEREST.value, Kind.PUBLISH.value, Kind.STOP.value
BRIDGE_START, STATUS, REMOTE, MESSAGE = (Kind.BRIDGE_START.value, Kind.STATUS.value, Kind.REMOTE.value,
                                          Kind.MESSAGE.value)
PUBLISHED, FAILED, REMOTE_RESET = Kind.PUBLISHED.value, Kind.FAILED.value, Kind.REMOTE_RESET.value
BUSY, REMOTE_BUSY = Kind.BUSY.value, Kind.REMOTE_BUSY.value
QUEUE_CMD, QUEUE_EVENT = Kind.QUEUE_CMD.value, Kind.QUEUE_EVENT.value
QUEUE_PUBLISH, QUEUE_SETTLE = Kind.QUEUE_PUBLISH.value, Kind.QUEUE_SETTLE.value
QUEUE_STORED, QUEUE_MESSAGE = Kind.QUEUE_STORED.value, Kind.QUEUE_MESSAGE.value
PUBLISH_WORKER = 1
# Starts an INTEREST/REMOTE pattern that is a durable subscription's (announced in the interest
# bucket; every node keeps the topic messages it matches in JetStream). NUL starts no destination.
DURABLE_MARK = "\x00"


def record(kind: int, conn: int = 0, payload: bytes = b"", aux: int = 0) -> bytes:
    return pack_header(HEADER_SIZE + len(payload), kind, conn, aux, 0) + payload


class Records:
    """Records gathered for the other side, handed over in batches (``take``)."""

    __slots__ = ("buf", "count")

    def __init__(self):
        self.buf = bytearray()
        self.count = 0

    def add(self, kind: int, conn: int = 0, payload: bytes = b"", aux: int = 0) -> None:
        self.buf += pack_header(HEADER_SIZE + len(payload), kind, conn, aux, 0)
        self.buf += payload
        self.count += 1

    def take(self) -> tuple[bytearray, int]:
        buf, count = self.buf, self.count
        self.buf, self.count = bytearray(), 0
        return buf, count


_SUBJECT = struct.Struct("<H")


def pack_publish(subject: str, message: bytes) -> bytes:
    s = subject.encode()
    return _SUBJECT.pack(len(s)) + s + message


def unpack_publish(payload) -> tuple[str, bytes]:
    (n,) = _SUBJECT.unpack_from(payload)
    return bytes(payload[2:2 + n]).decode(), bytes(payload[2 + n:])


_QPUB = struct.Struct("<HHI")


def pack_queue_publish(subject: str, msg_id: str, message: bytes, tokens) -> bytes:
    s, i = subject.encode(), msg_id.encode()
    return _QPUB.pack(len(s), len(i), len(tokens)) + s + i + struct.pack(f"<{len(tokens)}Q", *tokens) + message


def unpack_queue_publish(payload) -> tuple[bytes, str, tuple, bytes]:
    """(subject, msg_id, tokens, message); the subject as bytes (the bridge writes it as it is)."""
    n, m, k = _QPUB.unpack_from(payload)
    start = _QPUB.size
    mid = start + n
    end = mid + m + 8 * k
    return (bytes(payload[start:mid]), bytes(payload[mid:mid + m]).decode(),
            struct.unpack_from(f"<{k}Q", payload, mid + m), bytes(payload[end:]))


# Settling a pulled message: its ref, what to do, and a nak's delay (ms; 0 = at once).
SETTLE = struct.Struct("<QBI")
ACK, NAK, TERM = 0, 1, 2
SETTLE_OPS = {"ack": ACK, "nak": NAK, "term": TERM}


def pack_settle(ref: int, op: int, delay_ms: int = 0) -> bytes:
    return SETTLE.pack(ref, op, delay_ms)


def iter_settles(payload):
    """(ref, op, delay_ms) of each settle in a QUEUE_SETTLE payload."""
    return SETTLE.iter_unpack(payload)


def pack_tokens(tokens) -> bytes:
    return struct.pack(f"<{len(tokens)}Q", *tokens)


def unpack_tokens(payload) -> tuple:
    return struct.unpack(f"<{len(payload) // 8}Q", payload)


def pack_pulled(key: bytes, data: bytes) -> bytes:
    return _SUBJECT.pack(len(key)) + key + data


def unpack_pulled(payload) -> tuple[str, bytes]:
    (n,) = _SUBJECT.unpack_from(payload)
    return bytes(payload[2:2 + n]).decode(), bytes(payload[2 + n:])


_BLOB = struct.Struct("<I")


def pack_blobs(blobs) -> bytes:
    """Byte strings as one payload (each after its length): the JetStream messages a peek read."""
    return b"".join(_BLOB.pack(len(blob)) + blob for blob in blobs)


def unpack_blobs(payload) -> list[bytes]:
    """The byte strings of ``pack_blobs``; ValueError for a payload it did not make."""
    payload = bytes(payload)
    out, at = [], 0
    while at < len(payload):
        if at + 4 > len(payload):
            raise ValueError("a blob's length cut short")
        (n,) = _BLOB.unpack_from(payload, at)
        at += 4
        if at + n > len(payload):
            raise ValueError("a blob cut short")
        out.append(payload[at:at + n])
        at += n
    return out


_TAKEN = struct.Struct("<QI")


def pack_taken(taken) -> bytes:
    """(ref, delivery count, data) of each JetStream message an action took, as one payload."""
    return pack_blobs([_TAKEN.pack(ref, min(delivered, 0xFFFFFFFF)) + data for ref, delivered, data in taken])


def unpack_taken(payload) -> list[tuple[int, int, bytes]]:
    """The (ref, delivery count, data) of ``pack_taken``; ValueError for a payload it did not make."""
    out = []
    for blob in unpack_blobs(payload):
        if len(blob) < _TAKEN.size:
            raise ValueError("a taken message cut short")
        ref, delivered = _TAKEN.unpack_from(blob)
        out.append((ref, delivered, blob[_TAKEN.size:]))
    return out


def pack_message(message_id: str, destination: str, headers: dict, body: bytes, expires_ms: int = 0) -> bytes:
    """A topic message as it travels: one JSON line (id, destination, headers, ms left to live), the body."""
    meta = {"i": message_id, "d": destination, "h": headers}
    if expires_ms:
        meta["e"] = expires_ms
    return orjson.dumps(meta) + b"\n" + body


def unpack_message(data) -> tuple[str, str, dict, bytes, int]:
    data = bytes(data)
    cut = data.index(b"\n")
    meta = orjson.loads(data[:cut])
    return meta["i"], meta["d"], meta["h"], data[cut + 1:], meta.get("e", 0)


# Under load the topic messages one round of the dispatcher publishes in a row to one subject go
# to NATS as one message (``Backplane``): NATS's and both bridges' work is per NATS message, nearly
# the same for 64 of them as for one. Layout (little-endian):
#   TOPIC_PACK | n: u32 | len(destination): u32 | destination | member * n
#   member = len(id): u32 | len(headers): u32 | len(body): u32 | ms left to live: u64 (0 = none)
#            | id | headers (JSON object) | body
# A pack_message (one message alone) starts with "{", so a receiver tells the two apart by the
# first bytes. The headers stay JSON bytes until the receiver decodes them: only when they differ
# from the message's before (a producer's messages mostly carry the same headers).
TOPIC_PACK = b"SBt1"
_PACK = struct.Struct("<II")
_MEMBER = struct.Struct("<IIIQ")
_COUNT = struct.Struct("<I")


def topic_member(message_id: str, headers: dict, body: bytes, expires_ms: int = 0) -> bytes:
    return topic_member_json(message_id, orjson.dumps(headers), body, expires_ms)


def topic_member_json(message_id: str, head: bytes, body: bytes, expires_ms: int = 0) -> bytes:
    """``topic_member`` with the headers given as JSON already."""
    mid = message_id.encode()
    return b"".join((_MEMBER.pack(len(mid), len(head), len(body), expires_ms), mid, head, body))


def pack_topic(destination: str, members: list) -> bytes:
    """A topic pack of ``members`` (made by ``topic_member``) to ``destination``."""
    d = destination.encode()
    return TOPIC_PACK + _PACK.pack(len(members), len(d)) + d + b"".join(members)


def topic_count(data) -> int:
    """How many messages a topic message from NATS carries (a pack's count, read unchecked)."""
    return _COUNT.unpack_from(data, 4)[0] if data[:4] == TOPIC_PACK and len(data) >= 8 else 1


def unpack_topic(data) -> tuple[str, list]:
    """A topic pack: (destination, [(message id, headers as JSON bytes, body, ms left to live)]).
    ValueError for a pack cut short or unreadable."""
    data = bytes(data)
    end = len(data)
    try:
        n, dlen = _PACK.unpack_from(data, 4)
        pos = 4 + _PACK.size + dlen
        destination = data[4 + _PACK.size:pos].decode()
        members = []
        for _ in range(n):
            idlen, hlen, blen, expires_ms = _MEMBER.unpack_from(data, pos)
            at = pos + _MEMBER.size
            pos = at + idlen + hlen + blen
            if pos > end:
                raise ValueError("a topic pack cut short")
            members.append((data[at:at + idlen].decode(), data[at + idlen:at + idlen + hlen],
                            data[at + idlen + hlen:pos], expires_ms))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable topic pack: {exc}") from None
    if pos != end:
        raise ValueError("a topic pack cut short")
    return destination, members


def decode_headers(head: bytes) -> dict:
    """A pack member's headers (JSON of an object, in a topic pack or a queue pack) as a dict;
    ValueError for anything else. Callers decode a member's headers only when they differ from
    the member's before it (a producer's messages mostly carry the same ones, packed in a row)
    and hand each message a copy. (A table of every distinct JSON, kept across packs, saved
    little more and cost messages whose headers all differ, an id or a time in them, a decoding
    plus its upkeep.)"""
    headers = orjson.loads(head)
    if not isinstance(headers, dict):
        raise ValueError("a pack member's headers are not an object")
    return headers


# On NATS every message the bridge publishes starts with its origin (node and bridge run) and a
# sequence number, so a receiving bridge drops a second copy (two of its subscriptions matched it
# while it was changing them) without ever dropping a first one.
_SEQ = struct.Struct("<BQ")


def wire(origin: bytes, seq: int, message: bytes) -> bytes:
    return _SEQ.pack(len(origin), seq) + origin + message


def unwire(data: bytes) -> tuple[bytes, int, bytes]:
    n, seq = _SEQ.unpack_from(data)
    start = _SEQ.size
    return data[start:start + n], seq, data[start + n:]
