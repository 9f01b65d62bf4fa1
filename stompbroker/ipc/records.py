"""Records carried in the rings: a 24-byte header (length, kind, connection id, aux, stamp) and raw bytes.

Frames cross process boundaries as bytes, never pickled. ``length`` counts the header too, so a
consumer walks a batch with ``pos += length``. ``stamp`` is the monotonic time in microseconds
(modulo 2**32) at which the reader read the frame that caused this record, carried through the
dispatcher to the writer, which measures input-to-socket latency with it (0 = not stamped).
"""

from __future__ import annotations

import enum
import struct

from ..protocol.websocket import CloseCode

HEADER = struct.Struct("<IBxxxQII")  # total length, kind, connection id, aux, stamp
HEADER_SIZE = HEADER.size
pack_header = HEADER.pack
unpack_header = HEADER.unpack_from


class Kind(enum.IntEnum):
    """What a record is. The one list of kinds, with what each carries."""

    # reader -> dispatcher
    OPEN = 1        # aux: writer index (| OPEN_TLS on the TLS port), payload: peer address text
    FRAME = 2       # aux: length of the head (command and header lines), payload: head + body
    CLOSED = 3      # the socket is gone
    ALIVE = 4       # bytes arrived (heart-beats or part of a frame), at most every alive_every() per connection
    BAD_FRAME = 5   # payload: message NUL detail NUL receipt (a framing error; ERROR and close)
    HTTP = 6        # payload: an HTTP response to write raw, then close (health check, refused handshake;
                    # empty: just close, as for a refused PROXY header)
    WS_OPEN = 7     # payload: the 101 response; the connection speaks WebSocket from now on
    WS_REPLY = 8    # payload: an encoded WebSocket control frame (pong) to write raw
    WS_CLOSE = 9    # payload: an encoded close frame to write raw, then close
    SHUTDOWN = 10   # the reader stopped; drain and stop
    HTTP_REQUEST = 11  # payload: a plain HTTP request (console/http.py encode_request); answer, then close
    READER_START = 12  # a reader (re)started; payload: its first connection id (u64). Older ones are gone
    FRAMES = 13     # the frames of one read: aux: how many (n); payload: n (head length, body length)
                    # pairs (FRAME_SIZES, u32 each), then each head and body in turn. One record per
                    # read instead of one per frame (a lone frame still goes as FRAME); the ring
                    # still counts frames, so max_input_queue_size keeps its meaning
    PEER = 14       # payload: the client's address text from a PROXY header (replaces OPEN's, the proxy's)
    STOMP = 15      # the connection's first bytes are raw STOMP: from now the dispatcher's connect timeout
                    # is for it (before, only the reader, which knows what it speaks, may answer it;
                    # WS_OPEN does the same for STOMP over WebSocket)

    # dispatcher -> writer
    DATA = 20       # payload: one STOMP frame (WebSocket-encoded by the writer where needed);
                    # aux WRITTEN_MARK: a queue delivery the writer counts once sent (see WRITTEN below)
    RAW = 21        # payload: bytes written as they are
    WS_ON = 22      # payload: bytes written raw, then the connection switches to WebSocket framing
    CLOSE = 23      # flush what is queued, then close; payload, if any: a WebSocket close code (WS_CLOSE_CODE)
                    # the writer first sends as a close frame
    HEARTBEAT = 24  # aux: milliseconds between heart-beats the writer sends when the line is idle (0 = off)
    STOP = 25       # flush everything and exit
    RESET = 26      # the reader restarted: payload u64, drop every connection with an id below it
    DATA_EACH = 27  # one topic message to several connections (a fan-out): aux: how many (n); payload:
                    # n entries (EACH_ENTRY: connection id u64, prefix length u32; then the prefix),
                    # then the part they share. Each connection gets prefix + part, as a DATA record's
                    # frame (never marked); the ring counts n records


# The processes' loops compare kinds unpacked from the ring (plain ints) with these names. They are
# plain ints: `int == IntEnum member` is slower than an int comparison in CPython 3.11 (measured: a
# loop that unpacks each record of a batch and tests its kind three ways, 84-86 ns per record with
# ints, 89-92 with members), so Kind serves for naming and decoding.
OPEN = Kind.OPEN.value
FRAME = Kind.FRAME.value
CLOSED = Kind.CLOSED.value
ALIVE = Kind.ALIVE.value
BAD_FRAME = Kind.BAD_FRAME.value
HTTP = Kind.HTTP.value
WS_OPEN = Kind.WS_OPEN.value
WS_REPLY = Kind.WS_REPLY.value
WS_CLOSE = Kind.WS_CLOSE.value
SHUTDOWN = Kind.SHUTDOWN.value
HTTP_REQUEST = Kind.HTTP_REQUEST.value
READER_START = Kind.READER_START.value
FRAMES = Kind.FRAMES.value
PEER = Kind.PEER.value
STOMP = Kind.STOMP.value
DATA = Kind.DATA.value
RAW = Kind.RAW.value
WS_ON = Kind.WS_ON.value
CLOSE = Kind.CLOSE.value
HEARTBEAT = Kind.HEARTBEAT.value
STOP = Kind.STOP.value
RESET = Kind.RESET.value
DATA_EACH = Kind.DATA_EACH.value

WRITTEN_MARK = 1
OPEN_TLS = 1 << 16  # in an OPEN record's aux: the connection came in on ssl_port
# writer -> dispatcher, on its own channel: how many marked DATA records of each connection are sent
# (cumulative), so a queue message leaves the store only once its delivery is written. One datagram
# per writer loop with progress: WRITTEN_HEAD (writer index, flags) + WRITTEN_PAIR* (connection,
# count; WRITTEN_FINAL set when the connection will send nothing more).
WRITTEN_HEAD = struct.Struct("<II")
WRITTEN_PAIR = struct.Struct("<QQ")
WRITTEN_LAST = 1      # head flag: the writer is stopping, this is its last report
WRITTEN_STARTED = 2   # head flag: a writer (re)started; what its predecessor held is not coming
WRITTEN_FINAL = 1 << 63
CONN_ID = struct.Struct("<Q")
FRAME_SIZE = 4  # bytes per length in a FRAMES record's table


def frame_sizes(count: int) -> struct.Struct:
    """The length table of a FRAMES record of ``count`` frames (2 * count u32)."""
    sizes = _SIZES.get(count)
    if sizes is None:
        sizes = struct.Struct(f"<{2 * count}I")
        if len(_SIZES) < 256:
            _SIZES[count] = sizes
    return sizes


_SIZES: dict[int, struct.Struct] = {}


EACH_ENTRY = struct.Struct("<QI")  # a DATA_EACH entry's head: connection id, prefix length


def each_entry(conn: int, prefix: bytes) -> bytes:
    return EACH_ENTRY.pack(conn, len(prefix)) + prefix


def each_entries(data, start: int, count: int) -> tuple[list, int]:
    """The ``count`` entries of a DATA_EACH payload at ``start`` in ``data``, as (connection id, its
    prefix's start, end), and where the shared part starts (it runs to the record's end)."""
    unpack, head = EACH_ENTRY.unpack_from, EACH_ENTRY.size
    entries = []
    pos = start
    for _ in range(count):
        conn_id, size = unpack(data, pos)
        pos += head
        entries.append((conn_id, pos, pos + size))
        pos += size
    return entries, pos


def iter_deliveries(blob: bytes):
    """``iter_records`` of a writer's batch, each DATA_EACH record given as the DATA records it stands
    for (conn, prefix + part), in order (for tests and tools: the writer walks the batch itself)."""
    for kind, conn, aux, ts, payload in iter_records(blob):
        if kind != DATA_EACH:
            yield kind, conn, aux, ts, payload
            continue
        entries, part = each_entries(payload, 0, aux)
        for conn_id, at, end in entries:
            yield DATA, conn_id, 0, ts, payload[at:end] + payload[part:]
# A CLOSE record's WebSocket close code, so the broker asks for a close frame without the codec
# (the writer encodes it, RFC 6455 5.5.1; the codes are protocol/websocket.py's CloseCode).
WS_CLOSE_CODE = struct.Struct("!H")
WS_CLOSE_NORMAL = WS_CLOSE_CODE.pack(CloseCode.NORMAL)
WS_CLOSE_INTERNAL_ERROR = WS_CLOSE_CODE.pack(CloseCode.INTERNAL_ERROR)


STAMP_MASK = 0xFFFFFFFF


def alive_every(config) -> float:
    """Seconds between ALIVE reports for a connection that sends bytes but no complete frame.

    A quarter of the shortest heart-beat deadline the broker can negotiate (heartbeat_min_ms plus
    heartbeat_grace_ms), at most 250 ms. The dispatcher's view of a connection's last byte lags
    by less than this, and it allows for that lag, so it never takes a client that keeps its
    interval for a silent one, and closes a silent one within this (plus its own tick) of the
    deadline. Reports are per read without a frame, never per frame.
    """
    return min(0.25, (config.heartbeat_min_ms + config.heartbeat_grace_ms) / 4000)


def stamp(monotonic_seconds: float) -> int:
    return int(monotonic_seconds * 1_000_000) & STAMP_MASK or 1


def record(kind: int, conn: int, payload: bytes = b"", aux: int = 0, stamp: int = 0) -> bytes:
    return pack_header(HEADER_SIZE + len(payload), kind, conn, aux, stamp) + payload


def iter_records(blob: bytes):
    """Yield (kind, conn, aux, stamp, payload) for each record of a batch (not for the hottest loops)."""
    pos, end = 0, len(blob)
    while pos < end:
        length, kind, conn, aux, ts = unpack_header(blob, pos)
        yield kind, conn, aux, ts, blob[pos + HEADER_SIZE:pos + length]
        pos += length
