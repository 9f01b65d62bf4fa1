"""Sans-IO WebSocket (RFC 6455) opening handshake, and plain HTTP responses: the reader parses a
request whose first bytes are ``GET `` (``parse_http_request``), answers an upgrade
(``handshake_response``) or anything else (``http_response``). ``websocket.py`` re-exports these."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from urllib.parse import urlsplit

from .hosts import same_origin

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# Order of preference when the client offers several.
STOMP_SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")

_REASONS = {
    101: "Switching Protocols", 200: "OK", 400: "Bad Request", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 421: "Misdirected Request",
    411: "Length Required", 413: "Content Too Large", 426: "Upgrade Required",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
    503: "Service Unavailable",
}


# --------------------------------------------------------------------------
# Opening handshake
# --------------------------------------------------------------------------

class HandshakeError(Exception):
    """Handshake rejected: answer with ``http_response(status, ...)`` and close.

    ``headers`` holds extra response headers the status needs (426 carries
    ``Sec-WebSocket-Version: 13``); ``response()`` builds the whole reply.
    """

    def __init__(self, status: int, reason: str, headers: dict | None = None):
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.headers = dict(headers or {})

    def response(self) -> bytes:
        body = (self.reason + "\n").encode("utf-8", "replace")
        headers = {"Content-Type": "text/plain; charset=utf-8", **self.headers}
        return http_response(self.status, _REASONS.get(self.status, "Error"), body, headers)


_TOKEN_RE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_VERSION_RE = re.compile(rb"HTTP/[0-9]\.[0-9]\Z")
_BAD_IN_LINE_RE = re.compile(rb"[\x00\r\n]")


def parse_http_request(buf: bytes, max_size: int) -> tuple[dict, int] | None:
    """Parse an HTTP/1.x request head from the start of ``buf``: method, path (the request target as
    sent), version, headers and, for an absolute-form target, its authority (else None).

    Returns None while the head (through CRLFCRLF) is incomplete, else
    ``(request, consumed)``; bytes after ``consumed`` belong to the caller.
    Raises HandshakeError 431 when the head exceeds ``max_size`` bytes and 400
    when it is malformed.
    """
    # Only look inside the first max_size bytes: a terminator further away
    # means the head is too large anyway.
    end = bytes(buf[:max_size]).find(b"\r\n\r\n")
    if end < 0:
        if len(buf) >= max_size:
            raise HandshakeError(431, "request header too large")
        return None
    consumed = end + 4
    lines = bytes(buf[:end]).split(b"\r\n")

    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN_RE.match(parts[0]) or not parts[1] \
            or not _VERSION_RE.match(parts[2]) or _BAD_IN_LINE_RE.search(parts[1]):
        raise HandshakeError(400, "malformed request line")
    method, target, version = (p.decode("latin-1") for p in parts)
    try:  # what the console's routing will split: refuse here what it could not
        split = urlsplit(target)
        split.port
    except ValueError:
        raise HandshakeError(400, "malformed request target") from None
    # absolute-form (http://host/path): its authority names the host, as Host does
    authority = split.netloc if split.scheme else None

    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        # No obsolete line folding, no whitespace before the colon (RFC 9112).
        if not sep or not _TOKEN_RE.match(name) or _BAD_IN_LINE_RE.search(value):
            raise HandshakeError(400, "malformed header line")
        key = name.decode("latin-1").lower()
        if key not in headers:  # first wins
            headers[key] = value.strip(b" \t").decode("latin-1")
    return {"method": method, "path": target, "version": version, "headers": headers, "authority": authority}, consumed


def body_length(headers: dict, limit: int) -> int:
    """The length of a plain request's body (its Content-Length; 0 without one). A chunked body is
    not read (411), nor one over ``limit`` bytes (413)."""
    if "transfer-encoding" in headers:
        raise HandshakeError(411, "send the body with a Content-Length (chunked bodies are not read)")
    text = headers.get("content-length")
    if text is None:
        return 0
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise HandshakeError(400, "malformed Content-Length")
    length = int(text)
    if length > limit:
        raise HandshakeError(413, f"the body may have at most {limit} bytes (max_http_body)")
    return length


def _tokens(value: str | None) -> list[str]:
    """Comma-separated header list -> stripped, non-empty elements."""
    if not value:
        return []
    return [t.strip(" \t") for t in value.split(",") if t.strip(" \t")]


def accept_key(key: str) -> str:
    """Sec-WebSocket-Accept value for a Sec-WebSocket-Key."""
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + WS_GUID).digest()).decode("ascii")


def handshake_response(request: dict, allowed_paths: list[str] | None = None,
                       allowed_origins: list[str] | None = None,
                       same_origin_only: bool = False) -> tuple[bytes, str | None]:
    """Validate an upgrade request; return (101 response bytes, subprotocol or None).

    ``allowed_origins`` lists the pages that may open a WebSocket; without it, ``same_origin_only``
    lets only the broker's own pages (an Origin naming the host and port of the request's Host) and
    clients that send no Origin (not browsers). Raises HandshakeError with the HTTP status to answer.
    """
    headers = request["headers"]
    if request["method"] != "GET":
        raise HandshakeError(400, "method must be GET")
    if request["version"] != "HTTP/1.1":
        raise HandshakeError(400, "HTTP/1.1 required")
    if allowed_paths is not None:
        path = request["path"].split("?", 1)[0]
        if path not in allowed_paths:
            raise HandshakeError(404, "no WebSocket endpoint at this path")
    if "websocket" not in (t.lower() for t in _tokens(headers.get("upgrade"))):
        raise HandshakeError(400, "missing Upgrade: websocket")
    if "upgrade" not in (t.lower() for t in _tokens(headers.get("connection"))):
        raise HandshakeError(400, "missing Connection: Upgrade")
    if headers.get("sec-websocket-version") != "13":
        raise HandshakeError(426, "unsupported Sec-WebSocket-Version", {"Sec-WebSocket-Version": "13"})
    key = headers.get("sec-websocket-key")
    if not key:
        raise HandshakeError(400, "missing Sec-WebSocket-Key")
    try:
        raw = base64.b64decode(key.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raw = b""
    if len(raw) != 16:
        raise HandshakeError(400, "invalid Sec-WebSocket-Key")
    if allowed_origins is not None:
        origin = headers.get("origin")
        # Scheme and host are case-insensitive; browsers send them lower-case.
        if origin is None or origin.lower() not in {o.lower() for o in allowed_origins}:
            raise HandshakeError(403, "origin not allowed")
    elif same_origin_only and not same_origin(headers.get("origin"), headers.get("host")):
        raise HandshakeError(403, "origin not allowed (only the broker's own pages: ws_origins lists others)")

    offered = _tokens(headers.get("sec-websocket-protocol"))
    subprotocol = next((p for p in STOMP_SUBPROTOCOLS if p in offered), None)

    lines = [
        "HTTP/1.1 101 Switching Protocols",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Accept: " + accept_key(key),
    ]
    if subprotocol is not None:
        lines.append("Sec-WebSocket-Protocol: " + subprotocol)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii"), subprotocol


def wants_upgrade(headers: dict) -> bool:
    """Does a request try to open a WebSocket? Any sign of it gets the handshake's checks and errors;
    a request with none is plain HTTP."""
    return ("upgrade" in headers or "sec-websocket-key" in headers
            or "upgrade" in (t.lower() for t in _tokens(headers.get("connection"))))


def with_header(response: bytes, name: str, value: str) -> bytes:
    """``response`` with one more header line, right after its status line."""
    line = f"{name}: {value}\r\n".encode("latin-1")
    if _BAD_IN_LINE_RE.search(line[:-2]):
        raise ValueError("CR, LF or NUL in HTTP response head")
    end = response.index(b"\r\n") + 2
    return response[:end] + line + response[end:]


def http_response(status: int, reason: str, body: bytes = b"", extra_headers: dict | None = None) -> bytes:
    """A complete HTTP/1.1 response that ends the connection."""
    fields = [("Content-Length", str(len(body))), ("Connection", "close")]
    fields += list((extra_headers or {}).items())
    for name, value in [("", reason)] + fields:
        # Refuse header injection through reason or header values.
        if _BAD_IN_LINE_RE.search(f"{name}{value}".encode("latin-1", "replace")):
            raise ValueError("CR, LF or NUL in HTTP response head")
    head = f"HTTP/1.1 {int(status)} {reason}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in fields) + "\r\n"
    return head.encode("latin-1", "replace") + bytes(body)
