"""HTTP in the reader: a request head is read whole (408 when it is not in time), then ``route``
says where it goes: the health check and the reader's refusals are answered here, the console, the
API, /metrics and 404s are the dispatcher's (it has the figures), and a WebSocket upgrade is
accepted here (the connection then carries STOMP in WebSocket messages, reader_framing.py). A bug
while routing costs that request a 500, never a STOMP ERROR."""

from __future__ import annotations

import logging

from ..console.http import encode_request, failed
from ..ipc import records as R
from ..protocol import websocket as ws
from ..protocol.hosts import HostPolicy
from .reader_conns import DEAD, WEBSOCKET, Conn

log = logging.getLogger("stompbroker.reader")

HEALTH, DISPATCHER, UPGRADE = "health", "dispatcher", "upgrade"


def route(request: dict, hosts: HostPolicy, paths, origins, same_origin_only: bool) -> tuple[str, bytes]:
    """Where a whole request head goes, with what: (HEALTH, the response), (DISPATCHER, the request
    as the HTTP_REQUEST record carries it) or (UPGRADE, the handshake's response). The reader's own
    refusals raise ``ws.HandshakeError``."""
    headers = request["headers"]
    upgrade = ws.wants_upgrade(headers)
    if not upgrade and request["path"].split("?")[0] == "/health_check" and request["method"] == "GET":
        return HEALTH, ws.http_response(200, "OK", b"OK\n")  # for load balancers and probes, whatever Host
    if not (hosts.allows(headers.get("host")) and hosts.allows(request["authority"])):
        # DNS rebinding (protocol/hosts.py)
        raise ws.HandshakeError(421, "this broker does not answer for that Host (http_hosts)")
    if not upgrade:
        return DISPATCHER, encode_request(request)
    response, _subprotocol = ws.handshake_response(request, paths, origins, same_origin_only)
    return UPGRADE, response


class HttpAnswers:
    """The Reader's HTTP steps (a mixin of ``reader.Reader``: its ``http_waiting``, host and
    WebSocket policies, ``stats``, ``emit`` and ``websocket``)."""

    def http(self, conn: Conn, data: bytes, now: float) -> None:
        conn.buf += data
        request = None
        try:
            parsed = ws.parse_http_request(conn.buf, self.config.max_http_head)
            if parsed is None:
                self.http_waiting.setdefault(conn, now + self.http_head_timeout)
                return
            self.http_waiting.pop(conn, None)
            request, used = parsed
            rest, conn.buf = conn.buf[used:], b""
            where, answer = route(request, self.hosts, self.allowed_paths, self.allowed_origins,
                                  self.same_origin_only)
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

    def http_refused(self, conn: Conn, response: bytes) -> None:
        self.http_waiting.pop(conn, None)
        conn.mode = DEAD
        conn.buf = b""
        self.http_reply(conn, response)

    def expire_http(self, now: float) -> None:
        """A request head not complete in time (half of connect_timeout_ms): 408, then close."""
        for conn in [c for c, deadline in self.http_waiting.items() if now >= deadline]:
            self.http_refused(conn, ws.HandshakeError(408, "request head not complete in time").response())

    def http_reply(self, conn: Conn, response: bytes) -> None:
        """An HTTP answer of the reader's own, then close; on the TLS port it carries HSTS."""
        if conn.tls is not None and self.hsts:
            response = ws.with_header(response, "Strict-Transport-Security", self.hsts)
        self.emit(R.HTTP, conn.id, response)
