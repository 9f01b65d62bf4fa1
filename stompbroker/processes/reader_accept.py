"""A connection's life in the reader: accepted (its id, its writer, its socket handed over), refused
over ``max_connections``, dropped at its end."""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import time

from ..ipc import records as R
from ..protocol.stomp import render_frame
from .common import shutdown
from .reader_conns import PROXY, Conn
from .reader_tls import TlsLink

log = logging.getLogger("stompbroker.reader")


class Accepting:
    """The Reader's accept and drop steps (a mixin of ``reader.Reader``: its listeners, ``conns``,
    ``sel``, writers' channels, ``stats``, ``emit`` and ``release``)."""

    def accept(self, listener: socket.socket) -> None:
        for _ in range(256):  # then give the open connections a turn
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.error("cannot accept: %s", exc)
                    return
                raise
            if len(self.conns) >= self.config.max_connections:
                self.refuse(sock, "too many connections",
                            f"the broker accepts at most {self.config.max_connections} connections")
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn_id = next(self.ids)
            writer = next(self.next_writer)
            link = None
            proxied = self.proxies is not None and addr[0] in self.proxies
            if listener is self.tls_listener:
                if not proxied:  # (a proxy's PROXY header comes first: TLS starts after it)
                    sock = self.tls_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                inner, writer_end = socket.socketpair()
                inner.setblocking(False)
                link = TlsLink(sock, inner)
            try:
                handed = writer_end if link is not None else sock
                socket.send_fds(self.fd_socks[writer], [R.CONN_ID.pack(conn_id)], [handed.fileno()])
            except OSError as exc:
                log.error("cannot hand connection to writer %d: %s", writer, exc)
                sock.close()
                continue
            # A plain connection keeps its bare fd, not the socket object (TLS: its TlsLink keeps it).
            fd = sock.fileno() if link is not None else sock.detach()
            conn = Conn(conn_id, fd)
            if proxied:
                conn.mode = PROXY
            self.conns[fd] = conn
            self.sel.register(fd, selectors.EVENT_READ, conn)
            if link is not None:
                writer_end.close()  # the writer has its own copy now
                conn.tls, link.conn = link, conn
                self.sel.register(link.inner, selectors.EVENT_READ, link)
            self.stats["accepted"] += 1
            self.undecided.add(conn, time.monotonic())
            self.emit(R.OPEN, conn_id, f"{addr[0]}:{addr[1]}".encode(), writer | (R.OPEN_TLS if link else 0))

    def refuse(self, sock: socket.socket, message: str, detail: str) -> None:
        self.stats["refused"] += 1
        try:
            sock.setblocking(False)
            sock.send(render_frame("ERROR", {"message": message, "content-type": "text/plain"}, detail.encode()))
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()

    def drop(self, conn: Conn) -> None:
        self.http_waiting.pop(conn, None)
        self.http_bodies.pop(conn, None)
        self.undecided.discard(conn)
        if self.dropping:
            self.dropping.pop(conn, None)
            self.quieted.discard(conn)
        if conn.ws is not None:
            self.stats["websockets"] -= 1
            self.stats["ws_allocated"] -= conn.ws.allocated
        if conn.tls is not None:
            self.pause_inner(conn.tls)
            conn.tls.inner.close()  # the writer sees its socket closed and lets go
        fd, conn.fd = conn.fd, -1
        self.sel.unregister(fd)
        del self.conns[fd]
        if conn.tls is not None:
            conn.tls.sock.close()
        else:
            os.close(fd)
        self.release(conn)
        self.emit(R.CLOSED, conn.id)

    def writer_of(self, conn: Conn) -> int:
        """The writer a connection was handed to: ids and writers are taken in step, round-robin."""
        return (conn.id - self.first_id) % len(self.fd_socks)

    def drop_writers_connections(self, writer: int) -> None:
        """A writer restarted: its connections' sockets died with it (their clients reconnect)."""
        doomed = [c for c in self.conns.values() if self.writer_of(c) == writer]
        log.warning("writer %d restarted: closing its %d connections", writer, len(doomed))
        for conn in doomed:
            shutdown(conn.fd, socket.SHUT_RDWR)
            self.drop(conn)
