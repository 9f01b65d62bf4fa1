"""TLS (``ssl_port``), terminated in the reader: an ``ssl`` connection's state cannot be shared
between processes. The writer writes plaintext into one end of a socket pair (``TlsLink.inner``'s
peer); the reader encrypts what comes out of ``inner`` onto the client's socket, and decrypts what
the client sends before framing it like any other connection's bytes."""

from __future__ import annotations

import logging
import selectors
import socket
import ssl

from ..ipc import records as R
from ..protocol import proxy
from . import proxy_before_tls
from .reader_conns import NEW, READ_SIZE, Conn, receive

log = logging.getLogger("stompbroker.reader")

TLS_OUT_LIMIT = 1 << 20  # past this, stop taking the writer's output: its socket fills, backpressure


class TlsLink:
    """TLS for one connection: the writer writes plaintext into ``inner``'s peer, and the reader
    encrypts what comes out of ``inner`` onto the client's socket."""

    __slots__ = ("conn", "sock", "inner", "out", "handshaking", "closing", "deadline", "inner_paused")

    def __init__(self, sock: socket.socket, inner: socket.socket):
        self.conn: Conn | None = None  # set once accepted
        self.sock = sock            # the client's (an SSLSocket once TLS starts: after a PROXY header)
        self.inner = inner
        self.out = bytearray()      # ciphertext-to-be that the client's socket would not take yet
        self.handshaking = True
        self.closing = False        # the writer is done: flush, say goodbye, wait for the client
        self.deadline = 0.0
        self.inner_paused = False


def tls_context(config) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.ssl_cert, config.ssl_key)
    if config.ssl_verify_client != "none":
        context.verify_mode = ssl.CERT_REQUIRED if config.ssl_verify_client == "required" else ssl.CERT_OPTIONAL
        if config.ssl_ca:
            context.load_verify_locations(config.ssl_ca)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context


class TlsEnd:
    """The Reader's TLS steps (a mixin of ``reader.Reader``: its ``sel``, ``tls_context``, ``emit``,
    ``drop``, ``received`` and ``proxy_refused``)."""

    def tls_event(self, conn: Conn, mask: int, now: float) -> None:
        """Readable or writable client socket of a TLS connection."""
        link = conn.tls
        sock = link.sock
        if link.handshaking:
            try:
                sock.do_handshake()
            except ssl.SSLWantReadError:
                self.sel.modify(sock, selectors.EVENT_READ, conn)
                return
            except ssl.SSLWantWriteError:
                self.sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                return
            except (ssl.SSLError, OSError) as exc:
                log.info("TLS handshake with connection %d failed: %s", conn.id, exc)
                self.drop(conn)
                return
            link.handshaking = False
            self.sel.modify(sock, selectors.EVENT_READ, conn)
        if mask & selectors.EVENT_WRITE and link.out:
            self.tls_flush(conn)
            if conn.fd < 0:
                return
        if mask & selectors.EVENT_READ:
            chunks = []
            closed = False
            try:
                while True:  # drain what OpenSSL holds too: epoll cannot see it
                    data = sock.recv(READ_SIZE)
                    if not data:
                        closed = True
                        break
                    chunks.append(data)
                    if not sock.pending():
                        break
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLWantWriteError:
                self.sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            except (ssl.SSLError, OSError):
                closed = True
            if chunks:
                self.received(conn, b"".join(chunks), now)
            if closed and conn.fd >= 0:
                self.drop(conn)

    def tls_proxy_header(self, conn: Conn, now: float) -> None:
        """ssl_port behind a proxy that passes TLS through: its PROXY header, then the handshake."""
        try:
            conn.buf, parsed, closed = proxy_before_tls.read_header(conn.tls.sock, conn.buf)
        except proxy.ProxyError as exc:
            self.proxy_refused(conn, str(exc))
            return
        if closed:
            self.drop(conn)
        elif parsed is not None:
            source, _ = parsed
            link = conn.tls
            link.sock = self.tls_context.wrap_socket(link.sock, server_side=True, do_handshake_on_connect=False)
            conn.mode = NEW
            if source is not None:
                self.emit(R.PEER, conn.id, proxy.peer_text(*source).encode())
            self.tls_event(conn, selectors.EVENT_READ, now)  # its ClientHello may be here already

    def tls_from_writer(self, conn: Conn, now: float, closing: set) -> None:
        """The writer wrote (plaintext) for a TLS connection: encrypt it onto the client's socket."""
        link = conn.tls
        data = receive(link.inner.fileno())
        if data is None:
            return
        if data:
            link.out += data
            if not link.handshaking:
                self.tls_flush(conn)
            if len(link.out) > TLS_OUT_LIMIT:
                self.pause_inner(link)
            return
        # The writer hung up: send what is left, then close_notify and FIN; wait for the client.
        self.pause_inner(link)
        if link.handshaking:  # (or TLS not even begun: a PROXY header first) nothing can be said
            self.drop(conn)
            return
        link.closing = True
        link.deadline = now + 2.0
        closing.add(conn)
        self.tls_flush(conn)

    def pause_inner(self, link: TlsLink) -> None:
        """Stop taking the writer's output for this connection (its socket then pushes back)."""
        if not link.inner_paused:
            self.sel.unregister(link.inner)
            link.inner_paused = True

    def tls_flush(self, conn: Conn) -> None:
        link = conn.tls
        sock = link.sock
        while link.out:
            try:
                sent = sock.send(link.out[:READ_SIZE])
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                self.sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                return
            except (ssl.SSLError, OSError):
                self.drop(conn)
                return
            del link.out[:sent]
        self.sel.modify(sock, selectors.EVENT_READ, conn)
        if link.inner_paused and not link.closing:
            self.sel.register(link.inner, selectors.EVENT_READ, link)
            link.inner_paused = False
        if link.closing:
            try:
                sock.unwrap()
            except (ssl.SSLError, OSError, ValueError):
                pass
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
