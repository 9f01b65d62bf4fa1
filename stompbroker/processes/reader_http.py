"""HTTP in the reader: a request head is read whole (408 when it is not in time), then ``route``
says where it goes: the health check and the reader's refusals are answered here, the console, the
API, /metrics and 404s are the dispatcher's (it has the figures; a request with a body, a
management action's JSON, goes once the whole body is here, in the same time), and a WebSocket
upgrade is accepted here (the connection then carries STOMP in WebSocket messages,
reader_framing.py). A bug while routing costs that request a 500, never a STOMP ERROR."""

from __future__ import annotations

import logging

from ..console.http import encode_request, failed
from ..ipc import records as R
from ..protocol import websocket as ws
from ..protocol.hosts import HostPolicy
from .reader_conns import DEAD, WEBSOCKET, Conn

log = logging.getLogger("stompbroker.reader")

HEALTH, DISPATCHER, UPGRADE = "health", "dispatcher", "upgrade"


def route(request: dict, hosts: HostPolicy, paths, origins, same_origin_only: bool,
          body_limit: int) -> tuple[str, bytes, int]:
    """Where a whole request head goes, with what: (HEALTH, the response, 0), (DISPATCHER, the
    request's head as the HTTP_REQUEST record starts, its body's length: at most ``body_limit``) or
    (UPGRADE, the handshake's response, 0). The reader's own refusals raise ``ws.HandshakeError``."""
    headers = request["headers"]
    upgrade = ws.wants_upgrade(headers)
    if not upgrade and request["path"].split("?")[0] == "/health_check" and request["method"] == "GET":
        return HEALTH, ws.http_response(200, "OK", b"OK\n"), 0  # for load balancers and probes, whatever Host
    if not (hosts.allows(headers.get("host")) and hosts.allows(request["authority"])):
        # DNS rebinding (protocol/hosts.py)
        raise ws.HandshakeError(421, "this broker does not answer for that Host (http_hosts)")
    if not upgrade:  # (the record's body comes last: head + body is the whole record)
        return DISPATCHER, encode_request(request), ws.body_length(headers, body_limit)
    response, _subprotocol = ws.handshake_response(request, paths, origins, same_origin_only)
    return UPGRADE, response, 0


class HttpAnswers:
    """The Reader's HTTP steps (a mixin of ``reader.Reader``: its ``http_waiting``, ``http_bodies``,
    host and WebSocket policies, ``stats``, ``emit``, ``release`` and ``websocket``)."""

    def http(self, conn: Conn, data: bytes, now: float) -> None:
        conn.buf += data
        if conn in self.http_bodies:  # the head came: its body is still arriving
            self.http_body(conn)
            return
        request = None
        try:
            parsed = ws.parse_http_request(conn.buf, self.config.max_http_head)
            if parsed is None:
                self.http_waiting.setdefault(conn, now + self.http_head_timeout)
                return
            self.http_waiting.pop(conn, None)
            request, used = parsed
            rest, conn.buf = conn.buf[used:], b""
            where, answer, length = route(request, self.hosts, self.allowed_paths, self.allowed_origins,
                                          self.same_origin_only, self.config.http_body_bytes)
        except ws.HandshakeError as exc:
            # response() carries the headers the status needs (426: Sec-WebSocket-Version: 13).
            self.http_refused(conn, exc.response())
            return
        except Exception as exc:  # an HTTP client gets an HTTP answer; one log line, counted in /metrics
            self.stats["http_errors"] += 1
            method, target = (request.get("method", "?"), request.get("path", "?")) if request else ("?", "?")
            self.http_refused(conn, failed(log, method, target, exc))
            return
        if where is HEALTH:
            conn.mode = DEAD
            self.http_reply(conn, answer)
        elif where is DISPATCHER and length:  # read whole before the dispatcher sees it
            self.http_bodies[conn] = (answer, length)
            self.http_waiting.setdefault(conn, now + self.http_head_timeout)
            conn.buf = rest
            self.http_body(conn)
        elif where is DISPATCHER:
            conn.mode = DEAD
            self.emit(R.HTTP_REQUEST, conn.id, answer)
        else:
            conn.mode = WEBSOCKET
            conn.ws = ws.WsDecoder(self.config.max_frame_size, self.config.ws_max_fragments)
            self.stats["websockets"] += 1
            self.emit(R.WS_OPEN, conn.id, answer)
            if rest:
                self.websocket(conn, rest, now)

    def http_body(self, conn: Conn) -> None:
        """The request goes to the dispatcher once its whole body (Content-Length) is here."""
        head, length = self.http_bodies[conn]
        if len(conn.buf) < length:
            return
        del self.http_bodies[conn]
        self.http_waiting.pop(conn, None)
        body, conn.buf = conn.buf[:length], b""  # (anything after it is not read: one request per connection)
        conn.mode = DEAD
        self.release(conn)
        self.emit(R.HTTP_REQUEST, conn.id, head + body)

    def http_refused(self, conn: Conn, response: bytes) -> None:
        self.http_waiting.pop(conn, None)
        self.http_bodies.pop(conn, None)
        conn.mode = DEAD
        conn.buf = b""
        self.release(conn)
        self.http_reply(conn, response)

    def http_over_budget(self, conn: Conn) -> None:
        """Unfinished requests together hold more than max_partial_bytes: this one gets 503."""
        self.http_refused(conn, ws.HandshakeError(503, "the broker holds too many unfinished requests "
                                                  "(max_partial_bytes); try again later").response())

    def expire_http(self, now: float) -> None:
        """A request head (or its body) not complete in time (half of connect_timeout_ms): 408, then close."""
        for conn in [c for c, deadline in self.http_waiting.items() if now >= deadline]:
            late = "request body" if conn in self.http_bodies else "request head"
            self.http_refused(conn, ws.HandshakeError(408, f"{late} not complete in time").response())

    def http_reply(self, conn: Conn, response: bytes) -> None:
        """An HTTP answer of the reader's own, then close; on the TLS port it carries HSTS."""
        if conn.tls is not None and self.hsts:
            response = ws.with_header(response, "Strict-Transport-Security", self.hsts)
        self.emit(R.HTTP, conn.id, response)
