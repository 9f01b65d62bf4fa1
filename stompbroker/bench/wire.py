"""Wire-level helpers of the load generator: no client library on the hot path.

* frame rendering (STOMP frames, client WebSocket frames with masking), done once per run: the hot
  loops only send pre-rendered batches;
* ``Link``: one connection during set-up (TCP or WebSocket handshake, CONNECT, SUBSCRIBE with a
  receipt), with a small blocking frame reader; after set-up the raw socket is used directly.
  STOMP frames are split and decoded by ``StompReader`` (lenient: a peer's frame without its blank
  line is read too), which only the set-up and the mock's control frames use: the measured loops
  parse nothing; WebSocket frames are built and split by ``protocol/websocket.py``'s client side;
* frame counting with bulk byte operations: ``count_nul`` on raw STOMP streams (the bodies the
  generator sends contain no NUL), ``TokenCounter`` on WebSocket streams (every body starts with
  ``TOKEN``, which no STOMP header and no WebSocket frame header of a realistic size can contain),
  and ``TsScanner`` for the latency header.

Everything here is pure or works on a socket given to it, so tests/unit/test_bench.py can test it.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import struct
import time
from collections import deque
from urllib.parse import urlsplit

from ..protocol.stomp import ProtocolError, parse_head, render_frame
from ..protocol.websocket import encode_client_frame, encode_frame, mask_bytes, parse_frame

TOKEN = b"#BENCH#"          # first bytes of every counted message body
TS_HEADER = "bench-ts"      # scheduled send time (time.monotonic_ns) of a latency message
OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0x1, 0x2, 0x8, 0x9, 0xA
MASK_KEY = b"\x5a\xc3\x17\x8e"   # fixed client masking key: frames are masked once, when pre-rendered


class BenchError(Exception):
    """A broker refused something or broke the connection during a benchmark."""


# -- rendering ---------------------------------------------------------------------------------
def make_body(size: int, token: bytes = TOKEN) -> bytes:
    """A message body of ``size`` bytes that starts with the counting token and contains no NUL."""
    if size < len(token):
        raise ValueError(f"message size must be at least {len(token)} bytes")
    return token + b"x" * (size - len(token))


def stomp_frame(command: str, headers, body: bytes = b"") -> bytes:
    """A STOMP frame; headers is a dict or a list of (name, value) pairs (values must not need escaping)."""
    return render_frame(command, headers, body, escape_headers=False)


def mask(data: bytes, key: bytes = MASK_KEY) -> bytes:
    """XOR data with the 4-byte key repeated (RFC 6455 masking; its own inverse)."""
    return mask_bytes(data, key)


def ws_frame(payload: bytes, opcode: int = OP_TEXT, masked: bool = True, key: bytes = MASK_KEY) -> bytes:
    """One WebSocket frame, FIN set; client frames are masked, server frames (the mock) are not."""
    return encode_client_frame(payload, opcode, key) if masked else encode_frame(payload, opcode)


def parse_ws_frame(buf, pos: int = 0):
    """Decode one frame at ``buf[pos:]``: (fin, opcode, payload, next_pos), or None if incomplete."""
    return parse_frame(buf, pos)


class StompReader:
    """Whole STOMP frames, decoded, from a byte stream fed in pieces (heart-beat EOLs skipped).

    Headers are decoded without STOMP 1.1 unescaping (the generator never needs escaped values).
    Lenient where a peer broker is: a frame that ends (NUL) before its blank line is a frame with
    headers only (stompica's RECEIPT is ``RECEIPT\\nreceipt-id:r\\n\\0``).
    """

    __slots__ = ("_buf",)

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data) -> list[tuple[str, dict, bytes]]:
        """(command, headers, body) for each frame ``data`` completes."""
        buf = self._buf
        buf += data
        frames = []
        while True:
            i = 0
            while i < len(buf) and buf[i] in b"\r\n":
                i += 1
            del buf[:i]
            nul = buf.find(b"\0")
            m = _BLANK.search(buf)
            if m and (nul < 0 or m.start() < nul):
                head, start = bytes(buf[:m.start()]), m.end()
                command, headers = _head(head)
                length = headers.get("content-length")
                if length is not None and length.isdigit():
                    end = start + int(length)
                    if len(buf) <= end:
                        break
                    if buf[end] != 0:
                        raise BenchError(f"unreadable STOMP from the broker: no NUL after the body of {head[:100]!r}")
                else:
                    end = buf.find(b"\0", start)
                    if end < 0:
                        break
                body = bytes(buf[start:end])
            elif nul >= 0:
                command, headers = _head(bytes(buf[:nul]).rstrip(b"\r\n"))
                end, body = nul, b""
            else:
                break
            frames.append((command, headers, body))
            del buf[:end + 1]
        return frames

    def partial(self) -> bytes:
        """Bytes of a frame that has not finished arriving."""
        return bytes(self._buf)


_BLANK = re.compile(rb"\r?\n\r?\n")


def _head(head: bytes) -> tuple[str, dict]:
    try:
        return parse_head(head.replace(b"\r\n", b"\n"), False)
    except ProtocolError as exc:
        raise BenchError(f"unreadable STOMP from the broker: {exc}") from None


# -- counting ----------------------------------------------------------------------------------
def count_nul(buf, n: int) -> int:
    """Frames completed in ``buf[:n]`` of a raw STOMP stream (heart-beats are EOLs, not NULs)."""
    return buf.count(b"\0", 0, n)


class TokenCounter:
    """Counts a token in a byte stream read in chunks, matches split across chunks included.

    Zero-copy use with ``recv_into``: the caller reads into ``buf[carry_len:]`` after
    ``prepare(buf)`` wrote the carried tail at ``buf[:carry_len]``, then calls ``count(buf, n)``.
    """

    __slots__ = ("token", "carry_len", "carry")

    def __init__(self, token: bytes = TOKEN):
        self.token = token
        self.carry_len = len(token) - 1
        self.carry = b"\0" * self.carry_len

    def prepare(self, buf: bytearray) -> None:
        buf[:self.carry_len] = self.carry

    def count(self, buf: bytearray, n: int) -> int:
        """Matches in buf[:carry_len + n], where n bytes were just read after the carried tail."""
        end = self.carry_len + n
        self.carry = bytes(buf[end - self.carry_len:end])
        return buf.count(self.token, 0, end)

    def feed(self, data: bytes) -> int:
        """Convenience (tests, slow paths): count matches completed by ``data``."""
        buf = bytearray(self.carry) + data
        end = len(buf)
        found = buf.count(self.token)
        self.carry = bytes(buf[end - self.carry_len:]) if end >= self.carry_len else \
            (b"\0" * (self.carry_len - end) + bytes(buf))
        return found


_TS_RE = re.compile(rb"\n" + TS_HEADER.encode() + rb":(\d+)")


class TsScanner:
    """Extracts ``bench-ts`` header values (or another header's, e.g. ``receipt-id``, holding a
    time stamp) from a stream read in chunks (STOMP or WebSocket)."""

    __slots__ = ("tail", "regex")

    def __init__(self, header: str = TS_HEADER):
        self.tail = b""
        self.regex = _TS_RE if header == TS_HEADER else re.compile(rb"\n" + header.encode() + rb":(\d+)")

    def feed(self, data) -> list[int]:
        buf = self.tail + bytes(data)
        cut = buf.rfind(b"\n")
        if cut < 0:
            self.tail = buf[-4096:]
            return []
        # Everything up to the last EOL is complete; the tail keeps that EOL so a header line
        # that is still arriving is matched on the next chunk, and never twice.
        found = [int(m.group(1)) for m in self.regex.finditer(buf, 0, cut + 1) if m.end() <= cut]
        self.tail = buf[cut:]
        return found


# -- connections -------------------------------------------------------------------------------
class Target:
    """Where a broker listens: TCP host/port and/or a WebSocket URL, plus credentials."""

    def __init__(self, host="127.0.0.1", port=None, ws_url=None, login=None, passcode=None, vhost=None):
        self.host = host
        self.port = port
        self.ws_url = ws_url
        self.login = login
        self.passcode = passcode
        self.vhost = vhost

    def transports(self) -> list[str]:
        out = []
        if self.port:
            out.append("tcp")
        if self.ws_url:
            out.append("ws")
        return out

    def address(self, transport: str) -> tuple[str, int, str]:
        """(host, port, path) to connect to for a transport."""
        if transport == "tcp":
            if not self.port:
                raise BenchError("no TCP address (give --port)")
            return self.host, int(self.port), ""
        if not self.ws_url:
            raise BenchError("no WebSocket URL (give --ws)")
        url = urlsplit(self.ws_url)
        if url.scheme != "ws":
            raise BenchError(f"only ws:// URLs are supported, not {self.ws_url}")
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        return url.hostname, url.port or 80, path

    def connect_headers(self) -> list[tuple[str, str]]:
        headers = [("accept-version", "1.0,1.1,1.2"), ("host", self.vhost or "/"), ("heart-beat", "0,0")]
        if self.login is not None:
            headers.append(("login", self.login))
        if self.passcode is not None:
            headers.append(("passcode", self.passcode))
        return headers

    def as_dict(self) -> dict:
        return {"host": self.host, "port": self.port, "ws_url": self.ws_url, "login": self.login,
                "vhost": self.vhost}


class Link:
    """One STOMP connection over TCP or WebSocket, for set-up and for slow paths."""

    def __init__(self, target: Target, transport: str, timeout: float = 10.0):
        self.target = target
        self.transport = transport
        self.ws = transport == "ws"
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.raw = bytearray()      # wire bytes read and not yet given to the STOMP reader
        self.stomp = StompReader()
        self.frames: deque = deque()  # frames read and not consumed yet
        self.version = "1.0"

    # -- wire ------------------------------------------------------------------------------
    def wrap(self, frame: bytes) -> bytes:
        """Bytes on the wire for one STOMP frame."""
        return ws_frame(frame) if self.ws else frame

    def send_frame(self, frame: bytes) -> None:
        self.sock.sendall(self.wrap(frame))

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BenchError("timed out waiting for the broker")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise BenchError("timed out waiting for the broker") from None
        if not data:
            raise BenchError("the broker closed the connection" +
                             (f" after {self.unread()[-300:]!r}" if self.raw or self.stomp.partial() else ""))
        self.raw += data

    def read_frame(self, timeout: float | None = None):
        """Next STOMP frame (command, headers, body); raises BenchError on ERROR frames."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self._take_frame()
            if frame is not None:
                if frame[0] == "ERROR":
                    raise BenchError(f"ERROR from broker: {frame[1].get('message', '')} {frame[2][:300]!r}")
                return frame
            self._fill(deadline)

    def _take_frame(self):
        if not self.ws:
            if self.raw:
                self.frames.extend(self.stomp.feed(bytes(self.raw)))
                self.raw.clear()
            return self.frames.popleft() if self.frames else None
        while not self.frames:
            parsed = parse_ws_frame(self.raw)
            if parsed is None:
                break
            fin, opcode, payload, pos = parsed
            del self.raw[:pos]
            if opcode == OP_PING:
                self.sock.sendall(ws_frame(payload, OP_PONG))
                continue
            if opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                raise BenchError(f"WebSocket closed by the broker ({code}, {payload[2:]!r})")
            if opcode in (OP_TEXT, OP_BIN, 0):
                self.frames.extend(self.stomp.feed(payload))
        return self.frames.popleft() if self.frames else None

    def unread(self) -> bytes:
        """What arrived and was not consumed as a frame (normally nothing once set-up is done), as
        bytes the hot loops can count: queued frames re-rendered, then the unfinished rest."""
        return b"".join(stomp_frame(*f) for f in self.frames) + self.stomp.partial() + bytes(self.raw)

    # -- set-up ----------------------------------------------------------------------------
    def open(self) -> "Link":
        host, port, path = self.target.address(self.transport)
        self.sock = socket.create_connection((host, port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ws:
            self._handshake(host, port, path)
        return self

    def _handshake(self, host: str, port: int, path: str) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Protocol: v12.stomp, v11.stomp, v10.stomp\r\n\r\n")
        self.sock.sendall(request.encode())
        deadline = time.monotonic() + self.timeout
        while b"\r\n\r\n" not in self.raw:
            self._fill(deadline)
        end = self.raw.find(b"\r\n\r\n") + 4
        head = bytes(self.raw[:end]).decode("latin-1")
        del self.raw[:end]
        if not head.startswith("HTTP/1.1 101"):
            raise BenchError(f"WebSocket upgrade refused: {head.splitlines()[0] if head else head!r}")

    def stomp_connect(self) -> dict:
        self.send_frame(stomp_frame("CONNECT", self.target.connect_headers()))
        command, headers, _ = self.read_frame()
        if command != "CONNECTED":
            raise BenchError(f"expected CONNECTED, got {command}")
        self.version = headers.get("version", "1.0")
        return headers

    def subscribe(self, destination: str, sub_id: str, extra=(), receipt: str | None = None) -> None:
        headers = [("destination", destination), ("id", sub_id), ("ack", "auto"), *extra]
        if receipt:
            headers.append(("receipt", receipt))
        self.send_frame(stomp_frame("SUBSCRIBE", headers))

    def wait_receipt(self, receipt: str, timeout: float | None = None) -> None:
        while True:
            command, headers, _ = self.read_frame(timeout)
            if command == "RECEIPT" and headers.get("receipt-id") == receipt:
                return
            if command == "MESSAGE":
                raise BenchError("a MESSAGE arrived before the subscription receipt (stale queue?)")

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

