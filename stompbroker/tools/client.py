"""A small blocking STOMP 1.0-1.2 client over TCP or WebSocket: the one client of the command-line
tools, the tests' raw-socket helper (tests/stompwire.py) and the benchmark.

Frames are split and heads decoded by the broker's own sans-IO parser (``protocol.stomp``'s
FrameParser and parse_head, without its limits: a client takes what the broker sends); the
stomp.py and @stomp/stompjs tests keep an independent parser on the other side of the wire.
One connection, one thread:

    client = StompClient.connect(host="127.0.0.1", port=61613)        # or ws_url="ws://..."
    client.subscribe("/topic/a", "sub-0")                              # waits for the receipt
    frame = client.read_frame(timeout=1.0)                             # None on timeout
    client.send("/topic/b", b"body", receipt=True)                     # waits for the receipt
    client.disconnect()                                                # DISCONNECT + receipt

An ERROR frame from the broker raises :class:`BrokerError` (with its ``message`` header), a
connection that goes away raises :class:`ConnectionClosed`; both are :class:`ClientError`.
"""

from __future__ import annotations

import base64
import collections
import itertools
import os
import re
import select
import socket
import ssl
import struct
import time
from urllib.parse import urlsplit

from ..protocol.stomp import FrameParser, ProtocolError, parse_head
from ..protocol.websocket import (OP_BIN, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, CloseCode, accept_key,
                                  encode_client_frame, parse_frame)

__all__ = ["Frame", "FrameReader", "StompClient", "ClientError", "BrokerError", "ConnectionClosed", "escape",
           "unescape", "parse_frames"]

VERSIONS = "1.0,1.1,1.2"
WS_SUBPROTOCOLS = ["v12.stomp", "v11.stomp", "v10.stomp"]
RECV_SIZE = 1 << 16


class ClientError(Exception):
    """Anything that ends a tool's connection: cannot connect, closed, bad data, refused."""


class ConnectionClosed(ClientError):
    """The broker closed the connection (or it broke) without an ERROR frame."""


class BrokerError(ClientError):
    """The broker sent an ERROR frame (and, as STOMP 1.2 says, closes the connection)."""

    def __init__(self, frame: "Frame"):
        self.frame = frame
        self.message = frame.headers.get("message", "")
        self.detail = frame.body.decode("utf-8", "replace").strip()
        super().__init__(self.message)

    def __str__(self) -> str:
        text = self.message or "ERROR frame without a message header"
        if self.detail and self.detail != self.message:
            detail = self.detail if len(self.detail) <= 500 else self.detail[:500] + "..."
            text += f" ({detail})"
        return text


class Frame:
    __slots__ = ("command", "headers", "body")

    def __init__(self, command: str, headers: dict[str, str], body: bytes = b""):
        self.command = command
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"Frame({self.command!r}, {self.headers!r}, {self.body[:60]!r})"


# --- header escaping (STOMP 1.1+) --------------------------------------------------------------

_ESCAPES = {"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"}
_UNESCAPES = {"\\\\": "\\", "\\r": "\r", "\\n": "\n", "\\c": ":"}
_ESCAPE_RE = re.compile(r"[\\\r\n:]")
_UNESCAPE_RE = re.compile(r"\\.?", re.S)


def escape(value: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], value)


def unescape(value: str) -> str:
    if "\\" not in value:
        return value
    # An undefined escape from the broker is kept as it is: a tool should show, not refuse.
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES.get(m.group(), m.group()), value)


# --- frames in: the broker's own parser, without limits ---------------------------------------------

_NO_LIMIT = 1 << 62


class FrameReader:
    """Splits the bytes a broker sends into raw ``(head, body)`` frames (EOL heart-beats skipped).
    ``feed`` raises ProtocolError on bytes that are not STOMP frames."""

    def __init__(self, data: bytes = b""):
        self._parser = FrameParser(max_frame_size=_NO_LIMIT, max_headers=_NO_LIMIT, max_header_line=_NO_LIMIT)
        self._frames: collections.deque[tuple[bytes, bytes]] = collections.deque()
        if data:
            self.feed(data)

    def feed(self, data: bytes) -> None:
        self._frames.extend(self._parser.feed(data))

    def next(self) -> tuple[bytes, bytes] | None:
        """The next whole frame, or None until more bytes come."""
        return self._frames.popleft() if self._frames else None

    @property
    def partial(self) -> bool:
        """Part of a frame is held (not only heart-beats)."""
        return self._parser.buffered > 0

    def unread(self) -> bytes:
        """The bytes fed and not yet taken by ``next`` (whole frames as the broker writes them)."""
        return b"".join(head + b"\n\n" + body + b"\0" for head, body in self._frames) + self._parser.unparsed()


def decode(head: bytes, body: bytes, unescaped: bool = False) -> Frame:
    """A raw frame as a Frame; ``unescaped`` undoes STOMP 1.1+ header escaping (leniently)."""
    command, headers = parse_head(head, False)
    if unescaped and b"\\" in head:
        headers = {unescape(name): unescape(value) for name, value in headers.items()}
    return Frame(command, headers, body)


def parse_frames(data: bytes, cut_tail: bool = False) -> list[tuple[str, dict, bytes]]:
    """Strictly split broker output into (command, headers, body) frames (headers as sent);
    ValueError if it is not a sequence of whole frames. ``cut_tail``: the last frame may be
    unfinished (the connection was cut while it was being sent)."""
    reader = FrameReader()
    try:
        reader.feed(data)
        frames = []
        while (raw := reader.next()) is not None:
            frame = decode(*raw)
            frames.append((frame.command, frame.headers, frame.body))
    except ProtocolError as exc:
        raise ValueError(f"not STOMP frames: {exc}") from None
    if reader.partial and not cut_tail:
        raise ValueError(f"unfinished frame at the end: {reader.unread()[:80]!r}")
    return frames


# --- transports ---------------------------------------------------------------------------------

def _close_reason(payload: bytes) -> str:
    """A WebSocket close frame's code and reason, as text."""
    if len(payload) < 2:
        return "WebSocket closed without a status code"
    code = int.from_bytes(payload[:2], "big")
    reason = payload[2:].decode("utf-8", "replace")
    return f"WebSocket close {code}" + (f": {reason}" if reason else "")


class _TcpTransport:
    close_reason = ""

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        self.name = f"{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
            if tls is not None:
                self.sock = tls.wrap_socket(self.sock, server_hostname=host)
        except socket.gaierror as exc:
            raise ClientError(f"cannot resolve {host!r}: {exc.strerror or exc}") from None
        except TimeoutError:
            raise ClientError(f"cannot connect to {self.name}: timed out after {timeout:g} s") from None
        except OSError as exc:
            raise ClientError(f"cannot connect to {self.name}: {exc.strerror or exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, frames: list[bytes]) -> None:
        self.sock.settimeout(None)
        self.sock.sendall(b"".join(frames) if len(frames) > 1 else frames[0])

    def recv(self, timeout: float | None) -> bytes | None:
        """Bytes, b"" at end of stream, None when nothing came within timeout."""
        if timeout is not None and timeout <= 0:
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return None
            timeout = None  # readable: recv will not block
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(RECV_SIZE)
        except TimeoutError:
            return None
        except ConnectionError:
            return b""

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _WsTransport:
    """STOMP over WebSocket on a plain (or TLS) socket: the opening handshake here, frames built and
    split by ``protocol/websocket.py``'s client side. Pings are answered; one STOMP frame per message."""

    def __init__(self, url: str, timeout: float, tls: ssl.SSLContext | None = None):
        self.name = url
        self.close_reason = ""
        self._buf = bytearray()
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as exc:  # a malformed URL
            raise ClientError(f"cannot connect to {url!r}: {exc}") from None
        host = parts.hostname
        if parts.scheme not in ("ws", "wss") or not host:
            raise ClientError(f"cannot connect to {url!r}: not a ws:// or wss:// URL")
        tls = parts.scheme == "wss"
        port = port or (443 if tls else 80)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            if tls:
                sock = (tls or ssl.create_default_context()).wrap_socket(sock, server_hostname=host)
        except socket.gaierror as exc:
            raise ClientError(f"cannot resolve the host of {url}: {exc.strerror or exc}") from None
        except TimeoutError:
            raise ClientError(f"cannot connect to {url}: timed out after {timeout:g} s") from None
        except OSError as exc:  # ssl.SSLError included
            raise ClientError(f"cannot connect to {url}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        try:
            self._handshake(host, port, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), timeout)
        except BaseException:
            self.close()
            raise

    def _handshake(self, host: str, port: int, path: str, timeout: float) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Protocol: {', '.join(WS_SUBPROTOCOLS)}\r\n\r\n")
        deadline = time.monotonic() + timeout
        try:
            self.sock.sendall(request.encode("latin-1"))
            while (end := self._buf.find(b"\r\n\r\n")) < 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self.sock.settimeout(remaining)
                data = self.sock.recv(RECV_SIZE)
                if not data:
                    raise ClientError(f"cannot connect to {self.name}: closed during the WebSocket handshake")
                self._buf += data
        except TimeoutError:
            raise ClientError(f"cannot connect to {self.name}: timed out after {timeout:g} s") from None
        except OSError as exc:
            raise ClientError(f"cannot connect to {self.name}: {exc.strerror or exc}") from None
        lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
        del self._buf[:end + 4]  # what follows is WebSocket frames
        status = lines[0].split(" ", 2)
        if len(status) < 2 or status[1] != "101":
            code = status[1] if len(status) > 1 else lines[0][:40]
            raise ClientError(f"cannot connect to {self.name}: WebSocket handshake refused (HTTP {code})")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if headers.get("sec-websocket-accept") != accept_key(key):
            raise ClientError(f"cannot connect to {self.name}: bad Sec-WebSocket-Accept in the handshake")

    def send(self, frames: list[bytes]) -> None:
        # one STOMP frame per WebSocket message, text when it is UTF-8, as STOMP-over-WebSocket clients do
        self.sock.settimeout(None)
        self.sock.sendall(b"".join(encode_client_frame(f, OP_TEXT if _utf8(f) else OP_BIN) for f in frames))

    def _take(self) -> bytes | None:
        """The STOMP bytes of every whole message buffered; b"" after a close frame; None if none."""
        out = []
        while (parsed := parse_frame(self._buf)) is not None:
            _fin, opcode, payload, end = parsed
            del self._buf[:end]
            if opcode == OP_PING:
                self.sock.sendall(encode_client_frame(payload, OP_PONG))
            elif opcode == OP_CLOSE:
                self.close_reason = _close_reason(payload)
                return b"".join(out) or b""
            elif opcode in (OP_TEXT, OP_BIN, OP_CONT):
                out.append(payload)
        data = b"".join(out)
        return data or None

    def recv(self, timeout: float | None) -> bytes | None:
        """Bytes of STOMP, b"" at end of stream, None when nothing came within timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                data = self._take()
            except OSError:
                return b""
            if data is not None:
                return data
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                pending = getattr(self.sock, "pending", None)  # TLS may hold bytes select cannot see
                if not (pending and pending()) and not select.select([self.sock], [], [], 0)[0]:
                    return None
                remaining = 1.0  # readable: the rest of a WebSocket frame follows at once
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(RECV_SIZE)
            except TimeoutError:
                return None  # a partly read frame stays buffered for the next call
            except OSError:
                return b""
            if not chunk:
                return b""
            self._buf += chunk

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.settimeout(0.5)
            self.sock.sendall(encode_client_frame(struct.pack("!H", CloseCode.NORMAL), OP_CLOSE))
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- the client ---------------------------------------------------------------------------------

class StompClient:
    """One STOMP connection; not thread-safe."""

    def __init__(self, transport):
        self.transport = transport
        self.name = transport.name
        self.version = "1.0"
        self.server = ""
        self.session = ""
        self._reader = FrameReader()
        self._out: list[bytes] = []
        self._pending: collections.deque[Frame] = collections.deque()
        self._receipt_ids = itertools.count(1)
        self._closed = False

    # -- connection ------------------------------------------------------------------------------
    @classmethod
    def connect(cls, host: str = "127.0.0.1", port: int = 61613, ws_url: str | None = None,
                login: str | None = None, passcode: str | None = None, timeout: float = 5.0,
                vhost: str | None = None, tls: ssl.SSLContext | None = None) -> "StompClient":
        """Open the transport, send CONNECT and wait for CONNECTED (an ERROR raises BrokerError).
        ``tls``: TLS over TCP with this context (for wss:// URLs: the context instead of the default)."""
        if ws_url:
            transport = _WsTransport(ws_url, timeout, tls)
            vhost = vhost or urlsplit(ws_url).hostname or "localhost"
        else:
            transport = _TcpTransport(host, port, timeout, tls)
            vhost = vhost or host
        client = cls(transport)
        try:
            client._handshake(vhost, login, passcode, timeout)
        except BaseException:
            client.close()
            raise
        return client

    def _handshake(self, vhost, login, passcode, timeout) -> None:
        headers = [("accept-version", VERSIONS), ("host", vhost), ("heart-beat", "0,0")]
        if login is not None:
            headers.append(("login", login))
        if passcode is not None:
            headers.append(("passcode", passcode))
        self.send_frame("CONNECT", headers)
        frame = self.read_frame(timeout)
        if frame is None:
            raise ClientError(f"no answer to CONNECT from {self.name} within {timeout:g} s "
                              f"(see --connect-timeout)")
        if frame.command != "CONNECTED":
            raise ClientError(f"expected CONNECTED from {self.name}, got {frame.command!r}")
        self.version = frame.headers.get("version", "1.0")
        self.server = frame.headers.get("server", "")
        self.session = frame.headers.get("session", "")

    def fileno(self) -> int:
        """The socket's descriptor, to select() on together with other input (-1 once closed)."""
        if self._closed:
            return -1
        return self.transport.fileno()

    def close(self) -> None:
        """Drop the connection at once (the broker cleans up as for any closed connection)."""
        if not self._closed:
            self._closed = True
            self.transport.close()

    def disconnect(self, timeout: float = 5.0) -> None:
        """DISCONNECT with a receipt and wait for it: every frame sent before has been processed."""
        try:
            receipt = self.next_receipt_id()
            self.send_frame("DISCONNECT", [("receipt", receipt)])
            self.wait_receipt(receipt, timeout)
        finally:
            self.close()

    # -- frames out ------------------------------------------------------------------------------
    def next_receipt_id(self) -> str:
        return f"r-{next(self._receipt_ids)}"

    def render(self, command: str, headers, body: bytes = b"") -> bytes:
        escaped = self.version != "1.0" and command not in ("CONNECT", "STOMP")
        lines = [command]
        for name, value in headers:
            value = str(value)
            if escaped:
                name, value = escape(name), escape(value)
            elif ":" in name or any(c in name or c in value for c in "\r\n"):
                raise ClientError(f"header {name!r} cannot be sent: a line break (or a colon in the name) "
                                  f"needs STOMP 1.1 or later")
            lines.append(f"{name}:{value}")
        if body or command == "SEND":
            lines.append(f"content-length:{len(body)}")  # always: bodies may hold NULs
        return ("\n".join(lines) + "\n\n").encode("utf-8") + bytes(body) + b"\0"

    def send_frame(self, command: str, headers=(), body: bytes = b"", flush: bool = True) -> None:
        """Queue a frame; ``flush`` (default) writes everything queued."""
        self._out.append(self.render(command, headers, body))
        if flush:
            self.flush()

    def flush(self) -> None:
        if not self._out:
            return
        if self._closed:
            raise ConnectionClosed(f"connection to {self.name} already closed")
        frames, self._out = self._out, []
        try:
            self.transport.send(frames)
        except OSError as exc:  # EPIPE, ECONNRESET: look for the ERROR that explains it
            self._closed_while_sending(exc)

    def _closed_while_sending(self, exc: OSError):
        deadline = time.monotonic() + 1.0
        try:
            while time.monotonic() < deadline:
                frame = self._read_new(max(deadline - time.monotonic(), 0.0))
                if frame is None:
                    break
                self._pending.append(frame)
        except ClientError:
            raise  # the BrokerError (or ConnectionClosed) we were looking for
        raise ConnectionClosed(f"connection to {self.name} lost: {exc.strerror or exc}")

    def send(self, destination: str, body: bytes, headers=(), receipt: bool = False,
             timeout: float = 10.0, flush: bool = True) -> None:
        """SEND; with ``receipt`` wait for the RECEIPT (an ERROR raises BrokerError)."""
        frame_headers = [("destination", destination)] + list(headers)
        receipt_id = None
        if receipt:
            receipt_id = self.next_receipt_id()
            frame_headers.append(("receipt", receipt_id))
        self.send_frame("SEND", frame_headers, body, flush=flush or receipt)
        if receipt_id:
            self.wait_receipt(receipt_id, timeout)

    def subscribe(self, destination: str, sub_id: str, ack: str = "auto", headers=(),
                  receipt: bool = True, timeout: float = 10.0) -> None:
        frame_headers = [("destination", destination), ("id", sub_id), ("ack", ack)] + list(headers)
        receipt_id = None
        if receipt:
            receipt_id = self.next_receipt_id()
            frame_headers.append(("receipt", receipt_id))
        self.send_frame("SUBSCRIBE", frame_headers)
        if receipt_id:
            self.wait_receipt(receipt_id, timeout)

    def ack(self, message: Frame, flush: bool = True) -> None:
        """ACK a MESSAGE received on a client or client-individual subscription."""
        h = message.headers
        if self.version == "1.2":
            headers = [("id", h.get("ack") or h.get("message-id", ""))]
        else:
            headers = [("message-id", h.get("message-id", ""))]
            if "subscription" in h:
                headers.append(("subscription", h["subscription"]))
        self.send_frame("ACK", headers, flush=flush)

    # -- frames in -------------------------------------------------------------------------------
    def read_frame(self, timeout: float | None = None) -> Frame | None:
        """The next MESSAGE/RECEIPT/...; None when none came within ``timeout`` (None: wait forever).

        An ERROR raises BrokerError, the end of the connection ConnectionClosed.
        """
        if self._pending:
            return self._pending.popleft()
        return self._read_new(timeout)

    def _read_new(self, timeout: float | None) -> Frame | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frame = self._parse()
            if frame is not None:
                if frame.command == "ERROR":
                    self.close()
                    raise BrokerError(frame)
                return frame
            if self._closed:
                raise ConnectionClosed(f"connection to {self.name} closed")
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            data = self.transport.recv(remaining)
            if data is None:
                return None
            if not data:
                self.close()
                why = self.transport.close_reason
                what = "closed in the middle of a frame" if self._reader.partial else "closed by the broker"
                raise ConnectionClosed(f"connection to {self.name} {what}" + (f" ({why})" if why else ""))
            try:
                self._reader.feed(data)
            except ProtocolError as exc:
                self.close()
                raise ClientError(f"malformed frame from {self.name}: {exc}") from None

    def poll(self) -> None:
        """Read whatever already arrived without waiting: raises on an ERROR or a closed connection.

        MESSAGE and RECEIPT frames read here are kept for read_frame.
        """
        while True:
            frame = self._read_new(0)
            if frame is None:
                return
            self._pending.append(frame)

    def wait_receipt(self, receipt_id: str, timeout: float = 10.0) -> None:
        """Wait for RECEIPT receipt-id; frames that come first are kept for read_frame."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            frame = self._read_new(remaining) if remaining > 0 else None
            if frame is None:
                raise ClientError(f"no receipt from {self.name} within {timeout:g} s")
            if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == receipt_id:
                return
            self._pending.append(frame)

    def _parse(self) -> Frame | None:
        raw = self._reader.next()
        if raw is None:
            return None
        try:
            # the version is known once CONNECTED (never escaped) has been read
            return decode(*raw, unescaped=self.version != "1.0" and not raw[0].startswith(b"CONNECTED"))
        except (ProtocolError, UnicodeDecodeError) as exc:
            self.close()
            raise ClientError(f"malformed frame from {self.name}: {exc}") from None
