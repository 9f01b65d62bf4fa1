"""STOMP over WebSocket against the real multi-process broker.

Byte-level tests use a raw socket and the tiny RFC 6455 client below (masked frames, any split, any
opcode, deliberate protocol violations); a few tests go through websocket-client to check that an
ordinary library interoperates. Synchronisation is done with STOMP receipts, not sleeps: the only
sleeps are the short pauses that force a handshake into separate TCP segments and the heart-beat
test, whose point is that time passes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import time

import pytest
import websocket  # websocket-client

from stompbroker.protocol.websocket import encode_client_frame, parse_frame
from stompbroker.tools.client import parse_frames

OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TIMEOUT = 5.0


# -- a minimal WebSocket client over a raw socket ------------------------------------------------
def accept_for(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


def request(path="/ws", key=None, protocols=None, extra=(), drop=(), first_line=None, version="13") -> bytes:
    headers = {
        "Host": "127.0.0.1",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": key or new_key(),
        "Sec-WebSocket-Version": version,
    }
    if protocols is not None:
        headers["Sec-WebSocket-Protocol"] = ", ".join(protocols)
    for name in drop:
        headers.pop(name)
    lines = [first_line or f"GET {path} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def client_frame(payload: bytes, opcode: int = OP_TEXT, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    """One client-to-server frame (masked unless told otherwise)."""
    return encode_client_frame(payload, opcode, fin=fin, rsv=rsv, masked=mask)


def stomp_bytes(command: str, headers: dict | None = None, body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in (headers or {}).items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


def parse_stomp(data: bytes) -> tuple[str, dict, bytes]:
    """Exactly one STOMP frame (the broker sends one per WebSocket message)."""
    frames = parse_frames(data)
    assert len(frames) == 1 and data[:1] not in b"\r\n" and data.endswith(b"\0"), \
        f"not exactly one STOMP frame in the message: {data[:300]!r}"
    return frames[0]


class RawWs:
    """A raw-socket WebSocket client: every byte on the wire is under the test's control."""

    def __init__(self, address, timeout: float = TIMEOUT):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.status = None
        self.headers: dict[str, str] = {}
        self.body = b""

    # handshake
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_http(self) -> tuple[int, dict, bytes]:
        """Read a response head (and a Content-Length body)."""
        deadline = time.monotonic() + TIMEOUT
        while b"\r\n\r\n" not in self.buf:
            self._recv(deadline, "HTTP response head")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        assert version == "HTTP/1.1", lines[0]
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", 0))
        while len(self.buf) < n:
            self._recv(deadline, "HTTP response body")
        body, self.buf = self.buf[:n], self.buf[n:]
        self.status, self.headers, self.body = int(status), headers, body
        return self.status, headers, body

    def handshake(self, **kw) -> "RawWs":
        key = kw.pop("key", None) or new_key()
        self.send(request(key=key, **kw))
        status, headers, _ = self.read_http()
        assert status == 101, (status, headers, self.body)
        assert headers["sec-websocket-accept"] == accept_for(key)
        return self

    # frames
    def _recv(self, deadline: float, what: str) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"waiting for {what}; buffered {self.buf[:200]!r}")
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed by the broker while waiting for {what}; buffered {self.buf[:200]!r}")
        self.buf += chunk

    def frame(self, payload: bytes, opcode: int = OP_TEXT, **kw) -> None:
        self.send(client_frame(payload, opcode, **kw))

    def read_frame(self, timeout: float = TIMEOUT) -> tuple[bool, int, bytes]:
        """Next server frame as (fin, opcode, payload); server frames must be unmasked, RSV clear."""
        deadline = time.monotonic() + timeout
        while len(self.buf) < 2:
            self._recv(deadline, "a WebSocket frame")
        b0, b1 = self.buf[0], self.buf[1]
        assert not b1 & 0x80, "server frames must not be masked"
        assert not b0 & 0x70, "RSV bits set by the server"
        while (parsed := parse_frame(self.buf)) is None:
            self._recv(deadline, "a WebSocket frame")
        fin, opcode, payload, end = parsed
        self.buf = self.buf[end:]
        return fin, opcode, payload

    def read_message(self, timeout: float = TIMEOUT, skip_heartbeats: bool = True) -> tuple[int, bytes]:
        """Next data message (opcode, payload); the broker never fragments, pongs are not expected here."""
        while True:
            fin, op, payload = self.read_frame(timeout)
            assert fin, "the broker sends every message in one frame"
            assert op in (OP_TEXT, OP_BIN), f"expected a data message, got opcode {op:#x} {payload!r}"
            if skip_heartbeats and payload == b"\n":
                continue
            return op, payload

    # STOMP
    def stomp(self, command: str, headers: dict | None = None, body: bytes = b"", opcode: int = OP_TEXT) -> None:
        self.frame(stomp_bytes(command, headers, body), opcode)

    def read_stomp(self, timeout: float = TIMEOUT) -> tuple[str, dict, bytes]:
        _, payload = self.read_message(timeout)
        return parse_stomp(payload)

    def connect(self, **headers) -> dict:
        self.stomp("CONNECT", {"accept-version": "1.2", "host": "localhost", **headers})
        command, headers, body = self.read_stomp()
        assert command == "CONNECTED", (command, headers, body)
        return headers

    def receipt(self, rid: str = "sync") -> None:
        """Round trip: everything the broker sent before answering is now readable."""
        self.stomp("UNSUBSCRIBE", {"id": "no-such-subscription", "receipt": rid})
        command, headers, _ = self.read_stomp()
        assert (command, headers.get("receipt-id")) == ("RECEIPT", rid), (command, headers)

    def expect_close(self, code: int | None, timeout: float = TIMEOUT) -> str:
        """Data messages may come first; then a close frame with ``code``, then end of stream."""
        deadline = time.monotonic() + timeout
        while True:
            fin, op, payload = self.read_frame(max(deadline - time.monotonic(), 0.01))
            if op == OP_CLOSE:
                break
        if code is None:
            assert payload == b"", payload
            reason = ""
        else:
            assert len(payload) >= 2, payload
            assert struct.unpack("!H", payload[:2])[0] == code, payload
            reason = payload[2:].decode()
        self.expect_eof(deadline)
        return reason

    def expect_eof(self, deadline: float | None = None) -> None:
        deadline = deadline or time.monotonic() + TIMEOUT
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the broker did not close the connection"
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return
            if not chunk:
                return
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def ws(broker):
    clients = []

    def make(handshake: bool = True, **kw) -> RawWs:
        c = RawWs(broker.address)
        clients.append(c)
        return c.handshake(**kw) if handshake else c

    yield make
    for c in clients:
        c.close()


def unique(name: str) -> str:
    return f"/topic/{name}-{os.urandom(4).hex()}"


# -- handshake -----------------------------------------------------------------------------------
def test_upgrade_accept_key_and_headers(ws):
    c = ws(handshake=False)
    key = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455, section 1.3
    c.send(request(key=key))
    status, headers, _ = c.read_http()
    assert status == 101
    assert headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert headers["upgrade"].lower() == "websocket"
    assert "upgrade" in headers["connection"].lower()
    assert "sec-websocket-protocol" not in headers  # nothing offered, nothing chosen
    c.connect()


@pytest.mark.parametrize("raw, status, reason", [
    pytest.param(request(first_line="POST /ws HTTP/1.1"), 400, "GET", id="post"),
    pytest.param(request(first_line="PUT /ws HTTP/1.1"), 400, "GET", id="put"),
    pytest.param(request(first_line="GET /ws HTTP/1.0"), 400, "HTTP/1.1", id="http-1.0"),
    pytest.param(request(first_line="GET /ws"), 400, "request line", id="no-version"),
    pytest.param(request(version="8"), 426, "Version", id="version-8"),
    pytest.param(request(drop=["Sec-WebSocket-Version"]), 426, "Version", id="no-version-header"),
    pytest.param(request(key="c2hvcnQ="), 400, "Key", id="short-key"),
    pytest.param(request(key="not base64 at all!!!!!=="), 400, "Key", id="bad-key"),
    pytest.param(request(drop=["Sec-WebSocket-Key"]), 400, "Key", id="no-key"),
    pytest.param(request(drop=["Upgrade"]), 400, "Upgrade", id="no-upgrade"),
    pytest.param(request(drop=["Connection"]), 400, "Connection", id="no-connection"),
    pytest.param(request(extra=[("Bad Header", "x")]), 400, "header", id="space-in-name"),
    pytest.param(b"GET /ws HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400, "header", id="obs-fold"),
])
def test_bad_handshake_is_refused_with_a_reason_then_closed(ws, raw, status, reason):
    c = ws(handshake=False)
    c.send(raw)
    got, headers, body = c.read_http()
    assert got == status, (got, headers, body)
    assert reason.lower() in body.decode().lower(), body
    assert headers.get("connection", "").lower() == "close"
    if status == 426:
        assert headers.get("sec-websocket-version") == "13", headers  # RFC 6455 4.4
    c.expect_eof()


def test_oversized_request_head_is_refused(ws):
    c = ws(handshake=False)
    c.send(request(extra=[("X-Filler", "a" * 9000)]))
    status, _, _ = c.read_http()
    assert status == 431
    c.expect_eof()


def test_handshake_split_across_tcp_segments(ws):
    c = ws(handshake=False)
    key = new_key()
    raw = request(key=key, protocols=["v12.stomp"])
    connect = client_frame(stomp_bytes("CONNECT", {"accept-version": "1.2", "receipt": "r"}))
    # "G" alone, then the rest of "GET ", a header cut in its name, CR LF CR | LF, and the first
    # WebSocket frame starting in the same segment as the end of the head.
    cuts = [1, 3, 20, 45, len(raw) - 1]
    pieces = [raw[a:b] for a, b in zip([0] + cuts, cuts + [len(raw)])]
    pieces[-1] += connect[:3]
    pieces.append(connect[3:])
    for piece in pieces:
        c.send(piece)
        time.sleep(0.02)  # separate segments (TCP_NODELAY is on)
    status, headers, _ = c.read_http()
    assert status == 101
    assert headers["sec-websocket-accept"] == accept_for(key)
    assert headers["sec-websocket-protocol"] == "v12.stomp"
    assert c.read_stomp()[0] == "CONNECTED"
    assert c.read_stomp()[1]["receipt-id"] == "r"


def test_handshake_and_frames_in_one_segment(ws):
    c = ws(handshake=False)
    c.send(request() + client_frame(stomp_bytes("CONNECT", {"accept-version": "1.2"}))
           + client_frame(stomp_bytes("DISCONNECT", {"receipt": "bye"})))
    assert c.read_http()[0] == 101
    assert c.read_stomp()[0] == "CONNECTED"
    assert c.read_stomp()[1]["receipt-id"] == "bye"
    c.expect_close(1000)


def test_header_names_and_tokens_are_case_insensitive(ws):
    c = ws(handshake=False)
    key = new_key()
    c.send((f"GET /stomp?x=1 HTTP/1.1\r\nhOST: 127.0.0.1\r\nuPGRADE: WebSocket\r\n"
            f"CONNECTION: keep-alive, UPGRADE\r\nsec-websocket-key: {key}\r\n"
            f"SEC-WEBSOCKET-VERSION: 13\r\nSec-Websocket-Protocol: foo, V11.STOMP, v11.stomp\r\n\r\n").encode())
    status, headers, _ = c.read_http()
    assert status == 101
    assert headers["sec-websocket-accept"] == accept_for(key)
    assert headers["sec-websocket-protocol"] == "v11.stomp"
    c.connect()


@pytest.mark.parametrize("offered, chosen", [
    (["v10.stomp", "v11.stomp", "v12.stomp"], "v12.stomp"),
    (["stomp", "v12.stomp"], "v12.stomp"),
    (["v10.stomp", "v11.stomp"], "v11.stomp"),
    (["stomp", "v10.stomp"], "v10.stomp"),
    (["stomp"], "stomp"),
    (["mqtt", "stomp"], "stomp"),
    (["mqtt"], None),
    ([], None),
])
def test_subprotocol_choice(ws, offered, chosen):
    c = ws(handshake=False)
    c.send(request(protocols=offered or None))
    status, headers, _ = c.read_http()
    assert status == 101
    assert headers.get("sec-websocket-protocol") == chosen
    c.connect()  # accepted either way


@pytest.mark.parametrize("path", ["/health_check", "/health_check?probe=1"])
def test_health_check(ws, path):
    c = ws(handshake=False)
    c.send(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, headers, body = c.read_http()
    assert status == 200
    assert headers["connection"].lower() == "close"
    assert body
    c.expect_eof()


def test_health_check_in_pieces(ws):
    c = ws(handshake=False)
    for piece in (b"GE", b"T /health", b"_check HTTP/1.1\r\n", b"Host: x\r\n\r", b"\n"):
        c.send(piece)
        time.sleep(0.02)
    assert c.read_http()[0] == 200
    c.expect_eof()


def test_plain_stomp_still_works_next_to_http(broker):
    sock = socket.create_connection(broker.address, timeout=TIMEOUT)
    try:
        sock.sendall(b"CONNECT\naccept-version:1.2\n\n\0")
        data = b""
        while b"\0" not in data:
            chunk = sock.recv(4096)
            assert chunk
            data += chunk
        assert data.startswith(b"CONNECTED\n")
    finally:
        sock.close()


# -- WebSocket framing ---------------------------------------------------------------------------
def test_text_and_binary_client_messages(ws):
    c = ws()
    c.frame(stomp_bytes("CONNECT", {"accept-version": "1.2"}), OP_BIN)
    assert c.read_stomp()[0] == "CONNECTED"
    dest = unique("tb")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest}, opcode=OP_BIN)
    c.stomp("SEND", {"destination": dest}, b"as text", opcode=OP_TEXT)
    c.stomp("SEND", {"destination": dest}, b"as binary", opcode=OP_BIN)
    assert c.read_stomp()[2] == b"as text"
    assert c.read_stomp()[2] == b"as binary"


def test_fragmented_message_with_a_ping_in_between(ws):
    c = ws()
    c.connect()
    dest = unique("frag")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    frame = stomp_bytes("SEND", {"destination": dest, "receipt": "r"}, b"fragmented body")
    c.send(client_frame(frame[:7], OP_TEXT, fin=False)
           + client_frame(frame[7:20], OP_CONT, fin=False)
           + client_frame(b"in-between", OP_PING)
           + client_frame(frame[20:], OP_CONT, fin=True))
    fin, op, payload = c.read_frame()
    assert (fin, op, payload) == (True, OP_PONG, b"in-between")
    assert c.read_stomp()[2] == b"fragmented body"
    assert c.read_stomp()[1]["receipt-id"] == "r"


def test_fragmented_binary_message_sent_in_separate_segments(ws):
    c = ws()
    c.connect()
    dest = unique("frag2")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    body = bytes(range(256)) * 40
    frame = stomp_bytes("SEND", {"destination": dest, "content-length": len(body)}, body)
    parts = [frame[i:i + 1000] for i in range(0, len(frame), 1000)]
    for i, part in enumerate(parts):
        c.frame(part, OP_BIN if i == 0 else OP_CONT, fin=i == len(parts) - 1)
    op, payload = c.read_message()
    assert op == OP_BIN  # the body is not UTF-8
    assert parse_stomp(payload)[2] == body


@pytest.mark.parametrize("payload", [b"", b"hello", b"\x00\xff\xfe binary", b"x" * 125])
def test_ping_is_answered_with_the_same_payload(ws, payload):
    c = ws()
    c.frame(payload, OP_PING)
    assert c.read_frame() == (True, OP_PONG, payload)
    c.connect()  # and the connection is still usable


def test_unsolicited_pong_is_ignored(ws):
    c = ws()
    c.frame(b"unsolicited", OP_PONG)
    c.connect()
    c.receipt()


@pytest.mark.parametrize("code, reason", [(1000, "bye"), (1001, ""), (4000, "application code")])
def test_close_is_echoed(ws, code, reason):
    c = ws()
    c.connect()
    c.frame(struct.pack("!H", code) + reason.encode(), OP_CLOSE)
    c.expect_close(code)


def test_close_without_status_gets_empty_close(ws):
    c = ws()
    c.connect()
    c.frame(b"", OP_CLOSE)
    c.expect_close(None)


def test_close_before_stomp_connect(ws):
    c = ws()
    c.frame(struct.pack("!H", 1000), OP_CLOSE)
    c.expect_close(1000)


def test_frames_before_a_close_are_processed(ws):
    c = ws()
    c.connect()
    dest = unique("close")
    c.send(client_frame(stomp_bytes("SUBSCRIBE", {"id": "s", "destination": dest}))
           + client_frame(stomp_bytes("SEND", {"destination": dest, "receipt": "r"}, b"last words"))
           + client_frame(struct.pack("!H", 1000), OP_CLOSE))
    assert c.read_stomp()[2] == b"last words"
    assert c.read_stomp()[1]["receipt-id"] == "r"
    c.expect_close(1000)


@pytest.mark.parametrize("bad, code", [
    pytest.param(client_frame(b"SEND", mask=False), 1002, id="unmasked"),
    pytest.param(client_frame(b"x", rsv=4), 1002, id="rsv1-without-extension"),
    pytest.param(client_frame(b"x", 0x3), 1002, id="reserved-opcode"),
    pytest.param(client_frame(b"x", OP_CONT), 1002, id="continuation-first"),
    pytest.param(client_frame(b"x", OP_PING, fin=False), 1002, id="fragmented-ping"),
    pytest.param(client_frame(b"x" * 126, OP_PING), 1002, id="ping-over-125"),
    pytest.param(client_frame(b"\x03\xe8" + b"\xff", OP_CLOSE), 1002, id="close-reason-not-utf8"),
    pytest.param(client_frame(b"\x03\xed", OP_CLOSE), 1002, id="close-code-1005"),
    pytest.param(client_frame(b"a", OP_TEXT, fin=False) + client_frame(b"b", OP_TEXT), 1002,
                 id="new-message-inside-fragmented"),
    pytest.param(client_frame(b"CONNECT\n\xc3\x28\n\n\0"), 1007, id="text-not-utf8"),
    pytest.param(client_frame(b"\xe2\x82", OP_TEXT, fin=False) + client_frame(b"\x28", OP_CONT), 1007,
                 id="fragmented-text-not-utf8"),
])
def test_protocol_violation_closes_with_code(ws, bad, code):
    c = ws()
    c.connect()
    c.send(bad)
    c.expect_close(code)


def test_text_split_inside_a_utf8_character_is_fine(ws):
    c = ws()
    c.connect()
    dest = unique("utf8")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    frame = stomp_bytes("SEND", {"destination": dest}, "héllo €".encode())
    cut = frame.index("€".encode()) + 1
    c.send(client_frame(frame[:cut], OP_TEXT, fin=False) + client_frame(frame[cut:], OP_CONT))
    op, payload = c.read_message()
    assert op == OP_TEXT
    assert parse_stomp(payload)[2] == "héllo €".encode()


def test_what_came_before_a_protocol_violation_is_processed(ws):
    c = ws()
    c.connect()
    c.send(client_frame(b"before", OP_PING)
           + client_frame(stomp_bytes("UNSUBSCRIBE", {"id": "none", "receipt": "before-bad"}))
           + client_frame(b"SEND", mask=False))
    assert c.read_frame() == (True, OP_PONG, b"before")
    assert c.read_stomp()[1]["receipt-id"] == "before-bad"
    c.expect_close(1002)


def test_message_over_max_frame_size_closes_1009(start_broker):
    b = start_broker("processors=3", "max_frame_size=1024")
    c = RawWs(b.address).handshake()
    try:
        c.connect()
        c.frame(b"x" * 2000)
        assert "1024" in c.expect_close(1009)
    finally:
        c.close()


def test_fragmented_message_over_max_frame_size_closes_1009(start_broker):
    b = start_broker("processors=3", "max_frame_size=1024")
    c = RawWs(b.address).handshake()
    try:
        c.connect()
        for _ in range(3):
            c.frame(b"y" * 500, OP_BIN if _ == 0 else OP_CONT, fin=False)
        c.expect_close(1009)
    finally:
        c.close()


def test_stomp_frame_over_max_frame_size_across_messages_gets_error(start_broker):
    # Every WebSocket message is small; the STOMP frame they make together is not.
    b = start_broker("processors=3", "max_frame_size=1024")
    c = RawWs(b.address).handshake()
    try:
        c.connect()
        c.stomp("SEND", {"destination": "/big", "receipt": "r"}, b"")  # fine
        assert c.read_stomp()[0] == "RECEIPT"
        c.frame(b"SEND\ndestination:/big\n\n")
        for _ in range(5):
            c.frame(b"z" * 500)
        command, headers, _ = c.read_stomp()
        assert command == "ERROR"
        assert "too large" in headers["message"]
        c.expect_close(1000)
    finally:
        c.close()


# -- STOMP over WebSocket ------------------------------------------------------------------------
def test_several_stomp_frames_in_one_message(ws):
    c = ws()
    c.connect()
    dest = unique("many")
    c.frame(stomp_bytes("SUBSCRIBE", {"id": "s", "destination": dest})
            + b"".join(stomp_bytes("SEND", {"destination": dest}, f"m{i}".encode()) for i in range(5))
            + b"\n\n"  # heart-beat EOLs between frames
            + stomp_bytes("UNSUBSCRIBE", {"id": "s", "receipt": "r"}))
    bodies = [c.read_stomp()[2] for _ in range(5)]
    assert bodies == [f"m{i}".encode() for i in range(5)]
    assert c.read_stomp()[1]["receipt-id"] == "r"


def test_one_stomp_frame_over_several_messages(ws):
    c = ws()
    c.connect()
    dest = unique("spread")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    frame = stomp_bytes("SEND", {"destination": dest, "receipt": "r"}, b"spread over messages")
    for piece in (frame[:3], frame[3:10], frame[10:30], frame[30:-1], frame[-1:]):
        c.frame(piece, OP_TEXT)
    assert c.read_stomp()[2] == b"spread over messages"
    assert c.read_stomp()[1]["receipt-id"] == "r"


def test_one_stomp_frame_over_text_and_binary_messages(ws):
    c = ws()
    c.connect()
    dest = unique("mixed")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    frame = stomp_bytes("SEND", {"destination": dest, "receipt": "r"}, b"mixed")
    c.frame(frame[:12], OP_TEXT)
    c.frame(frame[12:], OP_BIN)
    assert c.read_stomp()[2] == b"mixed"
    assert c.read_stomp()[1]["receipt-id"] == "r"


def test_outgoing_one_message_per_stomp_frame(ws):
    c = ws()
    c.connect()
    dest = unique("one-per")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    n = 50
    c.frame(b"".join(stomp_bytes("SEND", {"destination": dest}, f"{i}".encode() * 30) for i in range(n))
            + stomp_bytes("UNSUBSCRIBE", {"id": "s", "receipt": "r"}))
    for i in range(n):
        op, payload = c.read_message()
        assert op == OP_TEXT
        command, headers, body = parse_stomp(payload)  # asserts exactly one frame
        assert (command, body) == ("MESSAGE", f"{i}".encode() * 30)
    assert parse_stomp(c.read_message()[1])[1]["receipt-id"] == "r"


def test_binary_body_arrives_as_binary_message(ws):
    c = ws()
    c.connect()
    dest = unique("bin")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    body = b"\x00\xff\xfe\x80 not utf-8"
    c.stomp("SEND", {"destination": dest, "content-length": len(body)}, body, opcode=OP_BIN)
    c.stomp("SEND", {"destination": dest}, "utf-8 ✓".encode(), opcode=OP_BIN)
    op, payload = c.read_message()
    assert op == OP_BIN
    assert parse_stomp(payload)[2] == body
    op, payload = c.read_message()
    assert op == OP_TEXT  # valid UTF-8 goes out as text, whatever the client sent it as
    assert parse_stomp(payload)[2] == "utf-8 ✓".encode()


def test_large_message_round_trip(ws):
    c = ws()
    c.connect()
    dest = unique("large")
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest})
    body = os.urandom(600_000).hex().encode()[:1_000_000]
    c.stomp("SEND", {"destination": dest}, body)
    op, payload = c.read_message(timeout=15)
    assert parse_stomp(payload)[2] == body


def test_heart_beats_are_their_own_messages(ws):
    c = ws()
    headers = c.connect(**{"heart-beat": "300,200"})
    sx, sy = map(int, headers["heart-beat"].split(","))
    assert sx and sy
    # The broker beats: each beat is a WebSocket message holding one EOL.
    seen = 0
    deadline = time.monotonic() + 1.6  # past 300 ms + heartbeat_grace_ms (1 s): silence would be fatal
    while time.monotonic() < deadline:
        c.frame(b"\n")  # our own beat, a message of its own
        try:
            op, payload = c.read_message(timeout=0.25, skip_heartbeats=False)
        except (TimeoutError, socket.timeout):
            continue
        assert (op, payload) == (OP_TEXT, b"\n")
        seen += 1
    assert seen >= 3, seen
    c.receipt()  # still connected


def test_heart_beat_timeout_closes_the_websocket(start_broker):
    b = start_broker("processors=3", "heartbeat_grace_ms=200")
    c = RawWs(b.address).handshake()
    try:
        c.connect(**{"heart-beat": "200,0"})
        command, headers, _ = c.read_stomp(timeout=3)
        assert command == "ERROR" and "heart-beat" in headers["message"]
        c.expect_close(1000)
    finally:
        c.close()


def test_stomp_error_then_websocket_close(ws):
    c = ws()
    c.connect()
    c.stomp("SEND", {"receipt": "bad"}, b"no destination")
    command, headers, _ = c.read_stomp()
    assert command == "ERROR"
    assert headers["receipt-id"] == "bad"
    c.expect_close(1000)


def test_disconnect_receipt_then_close(ws):
    c = ws()
    c.connect()
    c.stomp("DISCONNECT", {"receipt": "bye"})
    assert c.read_stomp()[1]["receipt-id"] == "bye"
    c.expect_close(1000)
    c.frame(struct.pack("!H", 1000), OP_CLOSE)  # our half of the closing handshake: harmless


def test_websocket_and_tcp_clients_share_destinations(broker, ws):
    from stompwire import Wire  # tests/stompwire.py

    dest = unique("mixed-transport")
    c = ws()
    c.connect()
    c.stomp("SUBSCRIBE", {"id": "s", "destination": dest, "receipt": "sub"})
    assert c.read_stomp()[0] == "RECEIPT"
    tcp = Wire(broker.connect())
    try:
        tcp.connect()
        tcp.frame("SUBSCRIBE", {"id": "t", "destination": dest, "receipt": "sub"})
        assert tcp.read()[0] == "RECEIPT"
        tcp.frame("SEND", {"destination": dest}, b"from tcp")
        c.stomp("SEND", {"destination": dest}, b"from ws")
        assert {c.read_stomp()[2], c.read_stomp()[2]} == {b"from tcp", b"from ws"}
        assert {tcp.read()[2], tcp.read()[2]} == {b"from tcp", b"from ws"}
    finally:
        tcp.close()


# -- with an ordinary client library (websocket-client) -------------------------------------------
def test_websocket_client_library_session(broker):
    url = f"ws://{broker.host}:{broker.port}/stomp"
    conn = websocket.create_connection(url, subprotocols=["v11.stomp", "v12.stomp"], timeout=TIMEOUT)
    try:
        assert conn.subprotocol == "v12.stomp"
        dest = unique("lib")
        conn.send("CONNECT\naccept-version:1.1,1.2\nhost:localhost\n\n\0")
        assert conn.recv().startswith("CONNECTED\n")
        conn.send(f"SUBSCRIBE\nid:0\ndestination:{dest}\n\n\0SEND\ndestination:{dest}\n\nhi\0")
        command, headers, body = parse_stomp(conn.recv().encode())
        assert (command, headers["destination"], body) == ("MESSAGE", dest, b"hi")
        conn.send_binary(f"SEND\ndestination:{dest}\ncontent-length:2\n\n".encode() + b"\xff\xfe\0")
        opcode, data = conn.recv_data()
        assert opcode == websocket.ABNF.OPCODE_BINARY
        assert parse_stomp(data)[2] == b"\xff\xfe"
        conn.ping(b"lib-ping")
        opcode, frame = conn.recv_data_frame(control_frame=True)
        assert (opcode, frame.data) == (websocket.ABNF.OPCODE_PONG, b"lib-ping")
        conn.send("DISCONNECT\nreceipt:bye\n\n\0")
        assert parse_stomp(conn.recv().encode())[1]["receipt-id"] == "bye"
        opcode, data = conn.recv_data(control_frame=True)
        assert opcode == websocket.ABNF.OPCODE_CLOSE
        assert struct.unpack("!H", data[:2])[0] == 1000
    finally:
        conn.close()


# -- settings that restrict upgrades (ws_paths, ws_origins) ----------------------------------------
def test_ws_paths_and_origins(start_broker):
    b = start_broker("processors=3", "ws_paths=/ws,/stomp", "ws_origins=http://localhost:8080,https://example.com")
    cases = [
        (dict(path="/ws", extra=[("Origin", "http://localhost:8080")]), 101),
        (dict(path="/stomp?token=1", extra=[("Origin", "HTTPS://EXAMPLE.COM")]), 101),
        (dict(path="/other", extra=[("Origin", "http://localhost:8080")]), 404),
        (dict(path="/ws", extra=[("Origin", "http://evil.example")]), 403),
        (dict(path="/ws"), 403),  # no Origin at all
    ]
    for kw, status in cases:
        c = RawWs(b.address)
        try:
            c.send(request(**kw))
            assert c.read_http()[0] == status, kw
            if status == 101:
                c.connect()
            else:
                c.expect_eof()
        finally:
            c.close()
    # The health check is not a WebSocket endpoint: the path list does not apply to it.
    c = RawWs(b.address)
    try:
        c.send(b"GET /health_check HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_http()[0] == 200
    finally:
        c.close()


# -- the broker ends the connection ----------------------------------------------------------------
def test_slow_websocket_consumer_gets_error_and_close(start_broker):
    # The writer gives a slow consumer's ERROR about a second to go out before it cuts the
    # connection, so the client must start reading soon after it stops reading. On a busy machine
    # that can be missed: then the attempt is repeated. Whenever the ERROR arrives, a close frame
    # (1008) must follow it, not a bare end of stream.
    b = start_broker("processors=3", "max_pending_bytes=65536")
    fast = RawWs(b.address).handshake()
    fast.connect()
    outcomes = []
    try:
        for attempt in range(3):
            slow = RawWs(b.address)
            slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # no autotuning: fills up
            try:
                slow.handshake()
                slow.connect()
                dest = unique("slow")
                slow.stomp("SUBSCRIBE", {"id": "s", "destination": dest, "receipt": "sub"})
                assert slow.read_stomp()[0] == "RECEIPT"
                chunk = client_frame(stomp_bytes("SEND", {"destination": dest}, b"p" * 100_000))
                fast.send(chunk * 150)  # 15 MB the slow client does not read (yet)
                try:
                    while True:
                        op, payload = slow.read_message(timeout=10)
                        command = payload.split(b"\n", 1)[0]
                        if command != b"MESSAGE":
                            break
                except ConnectionError:
                    outcomes.append("cut before the ERROR")
                    continue
                assert command == b"ERROR" and b"slow consumer" in payload, payload[:200]
                slow.expect_close(1008)
                outcomes.append("ERROR then close 1008")
                break
            finally:
                slow.close()
        assert outcomes[-1] == "ERROR then close 1008", outcomes
    finally:
        fast.close()


def test_broker_shutdown_closes_websockets_with_1001(start_broker):
    b = start_broker("processors=3")
    c = RawWs(b.address).handshake()
    try:
        c.connect()
        c.receipt()
        b.stop()
        c.expect_close(1001)
    finally:
        c.close()


# -- DIAG ws_buffer: the decoders' figures -------------------------------------------------------
def test_diag_ws_buffer_counts_buffered_bytes(ws):
    diag = ws()
    diag.connect()
    topic = f"DIAG/{os.urandom(4).hex()}"
    diag.stomp("SUBSCRIBE", {"id": "d", "destination": topic})

    def ws_buffer() -> dict:
        diag.stomp("SEND", {"destination": topic}, b"ws_buffer")
        command, headers, _ = diag.read_stomp()
        assert command == "MESSAGE"
        return {k: int(headers[k]) for k in ("allocated", "hits", "misses")}

    first = ws_buffer()
    assert first["hits"] >= 1
    holder = ws()
    holder.connect()
    holder.frame(b"h" * 5000, OP_BIN, fin=False)  # the first fragment of a message: buffered
    holder.frame(b"sync", OP_PING)
    assert holder.read_frame() == (True, OP_PONG, b"sync")  # the reader has taken both
    held = ws_buffer()
    assert held["allocated"] >= 5000, (first, held)
    assert held["hits"] > first["hits"]
    holder.close()  # the connection goes, and its buffer with it
    deadline = time.monotonic() + TIMEOUT
    while (now := ws_buffer())["allocated"] > held["allocated"] - 5000:
        assert time.monotonic() < deadline, (first, now)
        time.sleep(0.05)
