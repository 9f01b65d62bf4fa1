"""Property-based fuzzing of the sans-IO parsers that face the network.

Every byte a client sends goes through ``FrameParser`` (STOMP), ``WsDecoder`` and
``parse_http_request`` (WebSocket) in the reader, and every head through ``parse_head`` in the
dispatcher. The properties here, for arbitrary input in arbitrary chunks:

- nothing but the parser's own protocol error escapes (ProtocolError, WsProtocolError,
  HandshakeError): any other exception would kill the reader or the dispatcher process;
- an error is final (every later feed raises again);
- the outcome does not depend on how the stream is chunked;
- what a parser holds between feeds is bounded by its limits (a hostile client cannot make it
  buffer more).

Inputs are both raw random bytes and streams built from protocol-shaped pieces (which reach the
deep states that random bytes rarely do). The last section fuzzes the broker itself on the durable
store (see there; ``pytest --seconds N`` runs it for N seconds). ``max_examples`` is bounded so the module runs in well
under 20 s on two cores; set ``FUZZ_EXAMPLES`` (a multiplier) for a longer soak.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from stompbroker.protocol.stomp import FrameParser, ProtocolError, escape, parse_head, render_frame, unescape
from stompbroker.protocol.websocket import (OP_BIN, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, HandshakeError,
                                            WsDecoder, WsProtocolError, encode_close, encode_frame,
                                            encode_message, handshake_response, mask_bytes, parse_http_request)

SCALE = max(1, int(os.environ.get("FUZZ_EXAMPLES", "1")))


def fuzz(n: int):
    return settings(max_examples=n * SCALE, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo its length + 1)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for c in points + [len(data)]:
        out.append(data[prev:c])
        prev = c
    return out


cuts_st = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=40)


# --- STOMP --------------------------------------------------------------------------------------

STOMP_PIECES = [
    b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n", b"\0", b":", b"\\", b"\\c", b"\\n", b"\\r", b"\\\\", b"\\t",
    b"SEND", b"CONNECT", b"STOMP", b"SUBSCRIBE", b"MESSAGE", b"DISCONNECT",
    b"destination:/topic/a", b"receipt:", b"receipt:r1", b"content-length:", b"content-length:0",
    b"content-length:5", b"content-length:-1", b"content-length:99999999999999999999999",
    b"content-length: 3", b"accept-version:1.2", b"heart-beat:", b"0", b"7", b"x" * 17, b"\xff", b"\xc3\xa9",
    b"\xed\xa0\x80", b"\xc3", b" ",
]
stomp_stream = st.one_of(
    st.binary(max_size=600),
    st.lists(st.sampled_from(STOMP_PIECES), max_size=120).map(b"".join),
)
limits_st = st.sampled_from([
    {},
    {"max_frame_size": 48, "max_headers": 4, "max_header_line": 16},
    {"max_frame_size": 16, "max_headers": 1, "max_header_line": 64},
    {"max_frame_size": 200, "max_headers": 2, "max_header_line": 8},
])


def stomp_limit(kwargs: dict) -> int:
    """What FrameParser may hold between feeds: an unfinished head and body, each within the frame limit."""
    mfs = kwargs.get("max_frame_size", 4 * 1024 * 1024)
    return 2 * mfs + 4


def run_stomp(kwargs: dict, chunks: list[bytes]):
    """Feed chunks; return (frames, error or None, parser). Checks the invariants on the way."""
    p = FrameParser(**kwargs)
    frames = []
    for chunk in chunks:
        try:
            got = p.feed(chunk)
        except ProtocolError as e:
            assert isinstance(e.message, str) and e.message
            assert e.receipt is None or isinstance(e.receipt, str)
            # The whole frames that came before the bad one in the same feed, if the parser
            # hands them over with the error (see test_valid_frames_before_garbage_are_delivered).
            frames += getattr(e, "frames", None) or []
            return frames, e, p
        for head, body in got:
            assert type(head) is bytes and type(body) is bytes
            assert b"\0" not in head and b"\r" not in head
        frames += got
        assert p.buffered <= stomp_limit(kwargs)
    return frames, None, p


def check_heads(frames):
    for head, _ in frames:
        for flag in (True, False):
            try:
                command, headers = parse_head(head, flag)
            except ProtocolError:
                continue
            assert isinstance(command, str) and all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in headers.items())


def assert_same_verdict(chunked, whole, data):
    """Chunked and whole feeds of ``data`` agree, except that chunks may find an error earlier.

    Limits are checked on the unfinished frame as it grows, with the checks of a finished head in
    a different order, so a stream cut short can fail when fed in pieces and still be pending when
    fed whole; but then the whole feed must be holding that unfinished frame, and must agree on
    every frame before it. Which of several faults is named may differ too.
    """
    frames, error, p = chunked
    whole_frames, whole_error, whole = whole
    assert not (error is None and whole_error is not None), f"accepted in chunks, refused whole: {whole_error!r}"
    if error is None:
        assert frames == whole_frames
        assert (p.heartbeats, p.buffered) == (whole.heartbeats, whole.buffered)
    elif whole_error is None:
        assert whole.buffered > 0, f"refused in chunks ({error!r}), nothing pending whole"
        assert frames == whole_frames
    if error is not None:
        for later in (b"", b"SEND\n\n\0", data):  # the error is final
            with pytest.raises(ProtocolError):
                p.feed(later)


@fuzz(600)
@given(data=stomp_stream, cuts=cuts_st, kwargs=limits_st)
def test_stomp_parser_any_bytes_any_chunks(data, cuts, kwargs):
    chunked = run_stomp(kwargs, split(data, cuts))
    check_heads(chunked[0])
    assert_same_verdict(chunked, run_stomp(kwargs, [data]), data)


@fuzz(300)
@given(data=stomp_stream, kwargs=limits_st)
def test_stomp_parser_one_byte_at_a_time(data, kwargs):
    assert_same_verdict(run_stomp(kwargs, [data[i:i + 1] for i in range(len(data))]), run_stomp(kwargs, [data]), data)


@fuzz(400)
@given(head=st.one_of(st.binary(max_size=300),
                      st.lists(st.sampled_from(STOMP_PIECES), max_size=60).map(b"".join)))
def test_parse_head_any_bytes(head):
    # The dispatcher gets heads from FrameParser, but must not crash on anything.
    for flag in (True, False):
        try:
            command, headers = parse_head(head, flag)
        except ProtocolError as e:
            assert e.message
            continue
        assert isinstance(command, str) and isinstance(headers, dict)


@fuzz(300)
@given(st.text(max_size=60))
def test_escape_roundtrip(text):
    assert unescape(escape(text)) == text
    escaped = escape(text)
    assert "\n" not in escaped and "\r" not in escaped and ":" not in escaped


header_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)


@fuzz(200)
@given(frames=st.lists(st.tuples(st.sampled_from(["SEND", "MESSAGE", "x"]),
                                 st.lists(st.tuples(header_text.filter(lambda n: n and n != "content-length"),
                                                    header_text), max_size=4),
                                 st.binary(max_size=64)), min_size=1, max_size=4),
       garbage=st.binary(max_size=40), cuts=cuts_st)
def test_valid_frames_before_garbage_are_delivered(frames, garbage, cuts):
    """Frames before a bad byte sequence are all delivered, in order, whatever the chunking.

    A client's valid SEND must not be lost, nor its RECEIPT, because the next frame in the same
    TCP segment is malformed. ``feed`` returns nothing when it raises, so the whole frames parsed
    before the error have to travel on the exception (``ProtocolError.frames``, as
    ``WsProtocolError.events`` does for WebSocket) for the reader to forward them.
    """
    wire = b"".join(render_frame(c, h, b) for c, h, b in frames)
    expected = FrameParser().feed(wire)
    got, error, _ = run_stomp({}, split(wire + garbage, cuts))
    assert got[:len(expected)] == expected, f"frames lost before {error!r}"


# --- WebSocket framing --------------------------------------------------------------------------

def client_frame(payload: bytes, opcode: int, fin: bool = True, rsv: int = 0, mask: bytes = b"\x01\x02\x03\x04",
                 masked: bool = True, length_form: int = 0) -> bytes:
    """A client frame; length_form 1/2 forces the 16/64-bit length encodings (non-minimal allowed)."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
    m = 0x80 if masked else 0
    if length_form == 2 or n > 0xFFFF:
        head = struct.pack("!BBQ", b0, m | 127, n)
    elif length_form == 1 or n > 125:
        head = struct.pack("!BBH", b0, m | 126, n)
    else:
        head = struct.pack("!BB", b0, m | n)
    return head + (mask + mask_bytes(payload, mask) if masked else payload)


ws_frame_st = st.builds(
    client_frame,
    payload=st.one_of(st.binary(max_size=140), st.text(max_size=40).map(lambda t: t.encode()),
                      st.sampled_from([b"\x03\xe8", b"\x03\xe8bye", b"\x0f\xa0", b"\x03", b"\x03\xe8\xff",
                                       b"CONNECT\naccept-version:1.2\n\n\0", b"SEND\n\n\xff\0"])),
    opcode=st.sampled_from([OP_TEXT, OP_BIN, OP_CONT, OP_PING, OP_PONG, OP_CLOSE, 0x3, 0xB]),
    fin=st.booleans(),
    rsv=st.sampled_from([0, 0, 0, 1, 4]),
    mask=st.binary(min_size=4, max_size=4),
    masked=st.sampled_from([True, True, True, False]),
    length_form=st.sampled_from([0, 0, 1, 2]),
)
ws_stream = st.one_of(
    st.binary(max_size=600),
    st.lists(ws_frame_st, max_size=8).map(b"".join),
    st.tuples(st.lists(ws_frame_st, max_size=6).map(b"".join), st.binary(max_size=30)).map(lambda t: t[0] + t[1]),
)
ws_limit_st = st.sampled_from([4 * 1024 * 1024, 200, 16])


def run_ws(max_size: int, chunks: list[bytes]):
    dec = WsDecoder(max_message_size=max_size)
    events = []
    for chunk in chunks:
        try:
            got = dec.feed(chunk)
        except WsProtocolError as e:
            assert e.code in (1002, 1007, 1008, 1009) and e.reason
            events += e.events
            return events, e, dec
        events += got
        assert dec.allocated <= max_size + 14 + 131
    return events, None, dec


def check_events(events, max_size):
    for event in events:
        kind = event[0]
        if kind == "message":
            payload, is_text = event[1], event[2]
            assert len(payload) <= max_size
            if is_text:
                payload.decode("utf-8")
        elif kind in ("ping", "pong"):
            assert len(event[1]) <= 125
        else:
            assert kind == "close"
            code, reason = event[1], event[2]
            assert code is None or 1000 <= code <= 4999
            assert isinstance(reason, str)


@fuzz(600)
@given(data=ws_stream, cuts=cuts_st, max_size=ws_limit_st)
def test_ws_decoder_any_bytes_any_chunks(data, cuts, max_size):
    events, error, dec = run_ws(max_size, split(data, cuts))
    check_events(events, max_size)
    whole_events, whole_error, _ = run_ws(max_size, [data])
    assert events == whole_events
    assert (error is None) == (whole_error is None)
    if error is not None:
        assert (error.code, error.reason) == (whole_error.code, whole_error.reason)
        with pytest.raises(WsProtocolError):
            dec.feed(client_frame(b"x", OP_TEXT))
    if any(e[0] == "close" for e in events):
        assert dec.closed and dec.feed(data) == []  # bytes after a close are ignored


@fuzz(400)
@given(data=ws_stream, cuts=cuts_st, limits=limits_st)
def test_reader_pipeline_ws_then_stomp(data, cuts, limits):
    """What the reader does with a WebSocket connection: decode, answer pings, parse messages as STOMP."""
    dec = WsDecoder(max_message_size=limits.get("max_frame_size", 4 * 1024 * 1024))
    parser = FrameParser(**limits)
    for chunk in split(data, cuts):
        try:
            events = dec.feed(chunk)
            error = None
        except WsProtocolError as e:
            events, error = e.events, e
        try:
            for event in events:
                if event[0] == "message":
                    check_heads(parser.feed(event[1]))
                elif event[0] == "ping":
                    assert encode_frame(event[1], OP_PONG)
                elif event[0] == "close":
                    assert encode_close(event[1])
                    return
        except ProtocolError:
            return
        if error is not None:
            assert encode_close(error.code, error.reason)
            return


@fuzz(200)
@given(frame=st.binary(max_size=300), code=st.one_of(st.none(), st.integers(1000, 4999)), reason=st.text(max_size=200))
def test_encoders_accept_anything_they_may_be_given(frame, code, reason):
    out = encode_message(frame)
    assert out[0] in (0x80 | OP_TEXT, 0x80 | OP_BIN)
    close = encode_close(code, reason)
    assert len(close) <= 2 + 125


# --- HTTP handshake -----------------------------------------------------------------------------

HTTP_PIECES = [
    b"GET ", b"GET / HTTP/1.1", b"POST / HTTP/1.1", b"GET /ws HTTP/1.0", b"HTTP/1.1", b"/", b"/ws?x=1", b" ",
    b"\r\n", b"\r\n\r\n", b"\n", b"\r", b"\0", b":", b": ", b"Host: a", b"Upgrade: websocket",
    b"Upgrade: WebSocket, h2c", b"Connection: Upgrade", b"Connection: keep-alive, upgrade",
    b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8", b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    b"Sec-WebSocket-Key: !!", b"Sec-WebSocket-Protocol: v12.stomp, v10.stomp", b"Origin: http://a",
    b"X\x80Y: \xff\xfe", b"\tfolded", b"a" * 50,
]
http_stream = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(HTTP_PIECES), max_size=40).map(b"".join),
    st.lists(st.sampled_from(HTTP_PIECES[2:]), max_size=30).map(lambda parts: b"GET / HTTP/1.1\r\n" + b"".join(parts)),
)


def http_outcome(buf: bytes, max_size: int):
    try:
        return ("ok", parse_http_request(buf, max_size))
    except HandshakeError as e:
        assert e.status in (400, 431)
        assert e.response().startswith(b"HTTP/1.1 %d " % e.status)
        return ("error", e.status)


@fuzz(500)
@given(data=http_stream, cuts=cuts_st, max_size=st.sampled_from([8192, 64, 16]))
def test_http_request_any_bytes_incrementally(data, cuts, max_size):
    """The reader re-parses its growing buffer after every read: the outcome must not depend on the reads."""
    buf = b""
    outcome = ("ok", None)
    for chunk in split(data, cuts):
        buf += chunk
        outcome = http_outcome(buf, max_size)
        if outcome != ("ok", None):
            break
    if outcome == ("ok", None):
        assert http_outcome(data, max_size) == ("ok", None)
        return
    assert http_outcome(data, max_size) == outcome
    if outcome[0] == "ok":
        request, used = outcome[1]
        assert 4 <= used <= min(len(data), max_size)
        assert data[used - 4:used] == b"\r\n\r\n"
        for name, value in request["headers"].items():
            assert name == name.lower() and "\r" not in value and "\n" not in value
        for paths, origins in ((None, None), (["/ws"], ["http://a"])):
            try:
                response, subprotocol = handshake_response(request, paths, origins)
            except HandshakeError as e:
                assert e.status in (400, 403, 404, 426)
                assert e.response()
                continue
            assert response.startswith(b"HTTP/1.1 101 ") and response.endswith(b"\r\n\r\n")
            assert subprotocol in (None, "v12.stomp", "v11.stomp", "v10.stomp", "stomp")


# --- PROXY headers, Host and Origin --------------------------------------------------------------

from stompbroker.protocol.hosts import HostPolicy, same_origin
from stompbroker.protocol.proxy import V2_SIGNATURE, ProxyError, parse_header
from stompbroker.protocol.sniff import sniff

PROXY_PIECES = [b"PROXY ", b"TCP4 ", b"TCP6 ", b"UNKNOWN", b"1.2.3.4 ", b"::1 ", b"65535 ", b"0 ", b"\r\n", b"\n",
                b" ", V2_SIGNATURE, b"\x21", b"\x20", b"\x11", b"\x21\x11", b"\x00\x0c", b"\xff\xff", b"\x00\x00"]
proxy_stream = st.one_of(st.binary(max_size=200), st.lists(st.sampled_from(PROXY_PIECES), max_size=20).map(b"".join))


@fuzz(500)
@given(data=proxy_stream, cuts=cuts_st)
def test_proxy_header_any_bytes_any_reads(data, cuts):
    """The reader re-parses its growing buffer after each read: the verdict does not depend on the reads."""
    def verdict(buf):
        try:
            return ("ok", parse_header(buf))
        except ProxyError as e:
            assert str(e)
            return ("error", None)
    buf, outcome = b"", ("ok", None)
    for chunk in split(data, cuts):
        buf += chunk
        outcome = verdict(buf)
        if outcome != ("ok", None):
            break
    assert verdict(data) == outcome
    assert sniff(data[:12] or b"x", True) in ("http", "stomp", "proxy", None)


@fuzz(300)
@given(host=st.one_of(st.none(), st.text(max_size=40)), origin=st.one_of(st.none(), st.text(max_size=40)),
       allowed=st.lists(st.text(max_size=12), max_size=3))
def test_host_and_origin_checks_take_any_text(host, origin, allowed):
    assert HostPolicy(allowed).allows(host) in (True, False)
    assert same_origin(origin, host) in (True, False)


# --- the broker on the durable store ------------------------------------------------------------
#
# Random sessions (connect, send, subscribe with every ack mode and durable topics, ack, nack,
# transactions, disconnects, connection losses, writer reports, store outages, restarts) drive the
# sans-IO Broker on a real SQLite store, the way the dispatcher does (one round per step: submit the
# store batch, release the receipts it allows). Properties:
# - nothing escapes the broker and no step takes more than HANG_SECONDS (a hang);
# - a RECEIPT for a persistent queue SEND leaves only once the message is on disk (or already
#   written to a subscriber), also while the store fails;
# - what the store holds is exactly what the broker holds (queued, unacknowledged and unwritten
#   deliveries), and a restart recovers every receipted message not yet consumed.
# The number of inputs is bounded in CI; `--seconds N` runs it for N seconds instead.

import sqlite3
import tempfile
import time as _time

from stompbroker.broker.core import Broker
from stompbroker.ipc.outbox import Outbox
from stompbroker.ipc import records as R
from stompbroker.settings import make_config
from stompbroker.store.sqlite import Store

HANG_SECONDS = 2.0
STORE_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None  # fsync there is cheap

sends = st.tuples(st.just("send"), st.integers(0, 2),
                  st.sampled_from(["/queue/a", "/queue/a", "/queue/b", "/topic/t", "#w"]),
                  st.sampled_from(["true", None, None, "false"]), st.sampled_from([True, True, False]),
                  st.sampled_from([None, None, None, "tx"]))
store_ops = st.one_of(
    sends, sends,
    st.tuples(st.just("subscribe"), st.integers(0, 2), st.sampled_from(["/queue/a", "/queue/b", "/queue/*", "/topic/t"]),
              st.sampled_from(["auto", "auto", "client", "client-individual"]), st.sampled_from([None, "0", "1", "3"]),
              st.booleans(), st.sampled_from([None, None, "n > 2", "n < 5"])),
    st.tuples(st.just("unsubscribe"), st.integers(0, 2), st.integers(0, 3)),
    st.tuples(st.just("ack"), st.integers(0, 2), st.integers(0, 50), st.sampled_from(["ACK", "ACK", "NACK"]),
              st.booleans()),
    st.tuples(st.just("tx"), st.integers(0, 2), st.sampled_from(["BEGIN", "COMMIT", "ABORT"])),
    st.tuples(st.just("written"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("close"), st.integers(0, 2)),
    st.tuples(st.just("disconnect"), st.integers(0, 2)),
    st.tuples(st.just("garbage"), st.integers(0, 2), st.binary(max_size=40)),
    st.tuples(st.just("tick"), st.sampled_from([0.05, 1.0, 8.0])),
    st.tuples(st.just("outage"), st.booleans()),
    st.tuples(st.just("restart")),
)


class StoreRig:
    """A Broker on a Store, fed like the dispatcher feeds it, with a model of what clients saw."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, "store.sqlite")
        self.fault = os.path.join(directory, "fault")
        self.config = make_config(store="sqlite", store_path=self.path, store_error_timeout_ms=500)
        self.now = _time.monotonic()  # the store times outages on this clock too
        self.conn_ids = [0, 0, 0]
        self.next_conn = 1
        self.receipts: dict[str, str] = {}      # receipt id -> message body of a persistent queue SEND
        self.receipted: set[str] = set()        # bodies whose RECEIPT went out
        self.consumed: set[str] = set()         # bodies written to an auto-ack subscriber or given out to ack
        self.marked: dict[int, list] = {}       # connection -> bodies of marked deliveries, in order
        self.written: dict[int, int] = {}
        self.acks: dict[int, list] = {}         # connection -> ack ids seen
        self.counter = 0
        self.tx_open: set[int] = set()          # connections with a transaction begun
        self.start()

    def start(self):
        self.box = Outbox(0)
        self.store = Store(self.path, 0.0, 0.0)
        self.store._fault = self.fault
        self.store.retry = 0.01
        self.broker = Broker(self.config, [self.box], clock=lambda: 1.7e9 + self.now)
        self.now = max(self.now, _time.monotonic())
        self.broker.recover(self.store, self.now)
        self.disk = sqlite3.connect(self.path)
        self.conn_ids = [0, 0, 0]

    def stop(self):
        if os.path.exists(self.fault):
            os.unlink(self.fault)
        self.store.close(5)
        self.disk.close()

    def failing(self) -> bool:
        return os.path.exists(self.fault)

    def session(self, i: int) -> int:
        old = self.broker.sessions.get(self.conn_ids[i])
        if old is not None and old.closing:  # refused with an ERROR: the client has gone, it comes back
            self.broker.on_closed(old.conn)
        if not self.conn_ids[i] or self.conn_ids[i] not in self.broker.sessions:
            conn = self.conn_ids[i] = self.next_conn
            self.next_conn += 1
            self.broker.on_open(conn, 0, "127.0.0.1:1", self.now)
            self.frame(conn, b"CONNECT\naccept-version:1.2", b"")
        return self.conn_ids[i]

    def frame(self, conn: int, head: bytes, body: bytes = b"") -> None:
        self.broker.on_frame(conn, head, body, self.now)

    def round(self) -> None:
        """End of a dispatcher round: hand the batch over, wait for it unless the store fails."""
        store, broker = self.store, self.broker
        if store.pending() or broker.need_commit:
            store.submit()
            broker.need_commit = False
        if not self.failing():
            store.sync(5)
        broker.release(store.finished())
        self.observe()

    def observe(self) -> None:
        buf, _ = self.box.take()
        for kind, conn, aux, _, payload in R.iter_records(bytes(buf)):
            if kind != R.DATA:
                continue
            command, _, rest = payload.partition(b"\n")
            head = rest.split(b"\n\n", 1)[0].decode(errors="replace")
            headers = dict(line.split(":", 1) for line in head.split("\n") if ":" in line)
            if command == b"RECEIPT":
                body = self.receipts.get(headers.get("receipt-id"))
                if body is not None:
                    self.receipted.add(body)
                    if body not in self.consumed:  # a receipt means on disk
                        rows = self.disk.execute("SELECT count(*) FROM messages WHERE body = ?",
                                                 (body.encode(),)).fetchone()[0]
                        assert rows, f"RECEIPT for {body} before it is on disk"
            elif command == b"MESSAGE":
                body = payload.rsplit(b"\n\n", 1)[-1].rstrip(b"\0").decode(errors="replace")
                if aux & R.WRITTEN_MARK:
                    self.marked.setdefault(conn, []).append(body)
                if "ack" in headers:
                    self.acks.setdefault(conn, []).append(headers["ack"])
                    self.consumed.add(body)  # it may be acknowledged from now on

    def written_report(self, i: int, final: bool) -> None:
        conn = self.conn_ids[i]
        bodies = self.marked.get(conn, [])
        self.consumed.update(bodies)
        self.broker.on_written(conn, len(bodies), final)

    def step(self, op) -> None:
        kind = op[0]
        b = self.broker
        if kind == "send":
            _, i, dest, persistent, receipt, tx = op
            conn = self.session(i)
            tx = tx if conn in self.tx_open else None
            self.counter += 1
            body = f"m{self.counter}"
            head = f"SEND\ndestination:{dest}\nn:{self.counter % 7}"
            if persistent is not None:
                head += f"\npersistent:{persistent}"
            if tx:
                head += f"\ntransaction:{tx}"
            if receipt:
                head += f"\nreceipt:r{self.counter}"
                if dest.startswith("/queue/") and persistent != "false" and not tx:
                    self.receipts[f"r{self.counter}"] = body
            self.frame(conn, head.encode(), body.encode())
        elif kind == "subscribe":
            _, i, dest, ack, prefetch, durable, selector = op
            conn = self.session(i)
            self.counter += 1
            head = f"SUBSCRIBE\nid:s{self.counter % 4}\ndestination:{dest}\nack:{ack}"
            if prefetch is not None:
                head += f"\nprefetch-count:{prefetch}"
            if durable and dest.startswith("/topic/"):
                head += "\ndurable:true"
            if selector:
                head += f"\nselector:{selector}"
            self.frame(conn, head.encode())
        elif kind == "unsubscribe":
            self.frame(self.session(op[1]), f"UNSUBSCRIBE\nid:s{op[2]}".encode())
        elif kind == "ack":
            _, i, pick, command, receipt = op
            conn = self.session(i)
            ids = self.acks.get(conn) or ["none"]
            head = f"{command}\nid:{ids[pick % len(ids)]}" + ("\nreceipt:ack" if receipt else "")
            self.frame(conn, head.encode())
        elif kind == "tx":  # BEGIN when none is open, else COMMIT or ABORT
            conn = self.session(op[1])
            command = "BEGIN" if conn not in self.tx_open else ("ABORT" if op[2] == "ABORT" else "COMMIT")
            (self.tx_open.add if command == "BEGIN" else self.tx_open.discard)(conn)
            self.frame(conn, f"{command}\ntransaction:tx".encode())
        elif kind == "written":
            if self.conn_ids[op[1]]:
                self.written_report(op[1], op[2])
        elif kind == "close":
            conn = self.conn_ids[op[1]]
            if conn:
                b.on_closed(conn)
        elif kind == "disconnect":
            self.frame(self.session(op[1]), b"DISCONNECT\nreceipt:bye")
        elif kind == "garbage":
            self.frame(self.session(op[1]), op[2])
        elif kind == "tick":
            self.now += op[1]
            b.on_tick(self.now)
        elif kind == "outage":
            if op[1]:
                open(self.fault, "w").close()
            elif self.failing():
                os.unlink(self.fault)
        elif kind == "restart":
            self.restart()
        self.round()

    def held_seqs(self) -> list[int]:
        """Every stored message the broker holds: queued, unacknowledged, unwritten."""
        b = self.broker
        seqs = [m.seq for q in b.queues.values() for m in (*q.messages, *q.parked, *q.blocked) if m.seq]
        sessions = list(b.sessions.values()) + [s for s, _ in b.unconfirmed.values()]
        for s in sessions:
            seqs += [m.seq for m, _ in s.inflight if m.seq]
            for sub in s.subs.values():
                seqs += [d.message.seq for d in sub.unacked.values() if d.message.seq and d.queue is not None]
        return sorted(seqs)

    def restart(self) -> None:
        """Everything on disk, then a crash: the store must hold exactly what the broker held."""
        if self.failing():
            os.unlink(self.fault)
        self.round()
        held = self.held_seqs()
        self.store.close(5)
        self.disk.close()
        on_disk = [row[0] for row in sqlite3.connect(self.path).execute("SELECT seq FROM messages ORDER BY seq")]
        assert on_disk == held, f"store {on_disk} != broker {held}"
        self.start()
        recovered = {m.body.decode() for q in self.broker.queues.values() for m in (*q.messages, *q.parked, *q.blocked)}
        missing = {b for b in self.receipted if b not in self.consumed and b not in recovered}
        assert not missing, f"receipted, never consumed, not recovered: {sorted(missing)}"
        self.marked.clear()
        self.acks.clear()


def run_store_program(ops) -> None:
    with tempfile.TemporaryDirectory(dir=STORE_DIR) as directory:
        rig = StoreRig(directory)
        try:
            for op in ops:
                started = _time.monotonic()
                rig.step(op)
                assert _time.monotonic() - started < HANG_SECONDS, f"{op} took {_time.monotonic() - started:.1f} s"
            rig.restart()
        finally:
            rig.stop()


STORE_FUZZ = {"inputs": 0}


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(store_ops, min_size=20, max_size=60))
def _store_program(ops):
    STORE_FUZZ["inputs"] += 1
    run_store_program(ops)


def test_broker_on_the_durable_store(fuzz_seconds):
    """Bounded in CI (a few seconds); ``pytest --seconds N`` fuzzes for N seconds."""
    budget = fuzz_seconds if fuzz_seconds else 6.0 * SCALE
    deadline = _time.monotonic() + budget
    runs = 0
    while _time.monotonic() < deadline:
        _store_program()
        runs += 1
    print(f"\nstore fuzzing: {STORE_FUZZ['inputs']} inputs in {budget:.0f} s, 0 crashes, 0 hangs")
    assert STORE_FUZZ["inputs"] > 0
