"""What a connection speaks, told from its first bytes (protocol/sniff.py): an HTTP method is
HTTP (a WebSocket upgrade, the health check, or a request for the console, API or metrics), anything
else raw STOMP; a trusted proxy's connection starts with a PROXY header (protocol/proxy.py). A
connection still undecided at ``connect_timeout_ms`` is ended here (undecided.py)."""

from __future__ import annotations

import logging

from ..ipc import records as R
from ..protocol import proxy
from ..protocol.sniff import sniff
from . import undecided
from .common import socket_of
from .reader_conns import DEAD, HTTP, NEW, PROXY, STOMP, Conn

log = logging.getLogger("stompbroker.reader")


class FirstBytes:
    """The Reader's steps before a connection's protocol is known (a mixin of ``reader.Reader``:
    its ``proxies``, ``undecided``, ``emit``, ``drop`` and ``read``)."""

    def first_bytes(self, conn: Conn, data: bytes) -> bytes | None:
        """Bytes of a connection in mode NEW or PROXY: the bytes to go on with once ``conn.mode``
        says what they are, or None while that is not known (or the connection was refused)."""
        if conn.mode == PROXY:
            data = self.proxy_header(conn, data)
            if not data:
                return None
        head = conn.buf + data if conn.buf else data
        verdict = sniff(head, self.proxies is not None)
        if verdict is None:  # a few bytes that could begin more than one protocol
            conn.buf = head
            return None
        conn.buf = b""
        if verdict == "proxy":
            self.proxy_refused(conn, "a PROXY header where none is believed (the peer is not in "
                                     "proxy_trusted, or its proxy sent one already)")
            return None
        mode = conn.mode = HTTP if verdict == "http" else STOMP
        self.undecided.discard(conn)
        if mode == STOMP:  # from now the dispatcher may answer it in STOMP (its connect timeout)
            self.emit(R.STOMP, conn.id)
        return head

    def proxy_header(self, conn: Conn, data: bytes) -> bytes:
        """A trusted proxy's connection starts with a PROXY header naming the client: the dispatcher
        learns the client's address (a PEER record), and the bytes after the header are the client's."""
        conn.buf += data
        try:
            parsed = proxy.parse_header(conn.buf)
        except proxy.ProxyError as exc:
            self.proxy_refused(conn, str(exc))
            return b""
        if parsed is None:
            return b""
        source, used = parsed
        rest, conn.buf = conn.buf[used:], b""
        conn.mode = NEW
        if source is not None:
            self.emit(R.PEER, conn.id, proxy.peer_text(*source).encode())
        return rest

    def proxy_refused(self, conn: Conn, reason: str) -> None:
        """No PROXY header from a trusted proxy, a bad one, or one from anyone else: close without a word
        (who is behind a broken proxy, or what an untrusted peer speaks, is not known)."""
        try:
            with socket_of(conn.fd) as sock:
                peer = "%s:%s" % sock.getpeername()[:2]
        except OSError:
            peer = "?"
        log.warning("connection %d from %s: %s; closing it", conn.id, peer, reason)
        if conn.tls is not None and conn.mode == PROXY:  # before TLS: nobody to say anything to
            self.drop(conn)
            return
        conn.mode = DEAD
        conn.buf = b""
        self.emit(R.HTTP, conn.id)  # nothing to write, then close

    def expire_undecided(self, now: float) -> None:
        """Connections whose protocol is still unknown at connect_timeout_ms: bytes that came
        meanwhile decide first, else ``undecided.answer`` (a STOMP connect timeout for a connection
        that said nothing, a close without a word for one whose bytes could be more than one thing)."""
        for conn in self.undecided.due(now):
            if conn.mode not in (NEW, PROXY):
                continue  # (refused meanwhile: a PROXY header where none is believed)
            if conn.tls is None:
                self.read(conn, now)
                if conn.fd < 0 or conn.mode not in (NEW, PROXY):
                    continue
            under_way = conn.mode == PROXY or (conn.tls is not None and conn.tls.handshaking)
            answer = undecided.answer(conn.buf, under_way)
            conn.mode = DEAD
            conn.buf = b""
            if answer == undecided.CONNECT_TIMEOUT:
                self.emit(R.BAD_FRAME, conn.id, b"connect timeout\0no CONNECT frame in time\0\x01")
            else:
                self.emit(R.HTTP, conn.id)  # nothing to write, then close
