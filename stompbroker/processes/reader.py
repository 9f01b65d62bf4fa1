"""Reader process: accepts every connection and reads every socket (one epoll loop).

It tells the protocols apart by the first bytes (protocol/sniff.py: an HTTP method is HTTP, a
WebSocket upgrade, the health check, or a request for the console, API or metrics, which the
dispatcher answers; anything else is raw STOMP; a trusted proxy's connection starts with a PROXY
header, protocol/proxy.py), splits the byte stream into STOMP frames with the sans-IO
parsers, and appends them as records to the shared-memory input queue, one batch and one wake-up
per loop. When the queue is full it stops reading, so TCP pushes back on the clients: no frame is
ever dropped. Every socket is passed to its writer right after accept; the reader writes to a
client only to refuse a connection over the limit and, on TLS connections, to encrypt what their
writer wrote into the connection's socket pair.
"""

from __future__ import annotations

import enum
import errno
import itertools
import logging
import os
import selectors
import socket
import ssl
import struct
import time

from ..console.http import encode_request
from ..ipc import control, records as R
from ..ipc.control import Control
from ..protocol import proxy, websocket as ws
from ..protocol.hosts import HostPolicy
from ..protocol.sniff import sniff
from ..protocol.websocket import WsEvent
from ..protocol.stomp import FrameParser, ProtocolError, render_frame
from . import common, proxy_before_tls, undecided
from .poller import Poller

log = logging.getLogger("stompbroker.reader")

READ_SIZE = 65536
FLUSH_AT = 256 * 1024       # bytes of records gathered before they are pushed mid-loop



class Mode(enum.IntEnum):
    """What a connection speaks, decided by its first bytes (a few comparisons per read, not per byte)."""
    NEW = 0        # nothing read yet
    STOMP = 1      # raw STOMP frames
    HTTP = 2       # an HTTP request head is being read (upgrade, health check, console)
    WEBSOCKET = 3  # STOMP inside WebSocket messages
    DEAD = 4       # an ERROR or close is on its way: read and ignore until the writer hangs up
    PROXY = 5      # a trusted proxy's connection: its PROXY header (protocol/proxy.py) is being read


NEW, STOMP, HTTP, WEBSOCKET, DEAD, PROXY = Mode.NEW, Mode.STOMP, Mode.HTTP, Mode.WEBSOCKET, Mode.DEAD, Mode.PROXY
WS_MESSAGE = WsEvent.MESSAGE  # tested per WebSocket message: a global, not an enum attribute lookup


class Conn:
    __slots__ = ("id", "sock", "writer", "mode", "parser", "buf", "ws", "last_alive", "tls", "greeted", "held",
                 "dropped")

    def __init__(self, conn_id: int, sock: socket.socket, writer: int, parser: FrameParser | None = None):
        self.id = conn_id
        self.sock = sock
        self.writer = writer
        self.mode = NEW
        self.parser = parser    # only while it holds an unfinished frame (see Reader.feed)
        self.buf = b""          # bytes of an HTTP request head, a PROXY header or an undecided first word
        self.ws = None          # WsDecoder once upgraded
        self.last_alive = 0.0
        self.tls = None         # TlsLink for connections on ssl_port
        self.greeted = False    # a whole STOMP frame (its CONNECT) came: the full frame size applies
        self.held = 0           # bytes of unfinished frames counted in Reader.partial
        self.dropped = 0        # bytes read and dropped since its answer and close were on their way;
                                # -1 once it is no longer read (Poller.quiet)


class TlsLink:
    """TLS for one connection, terminated here: the writer writes plaintext into ``inner``'s peer,
    and the reader encrypts what comes out of ``inner`` onto the client's socket."""

    __slots__ = ("conn", "inner", "out", "handshaking", "closing", "deadline", "inner_paused")

    def __init__(self, inner: socket.socket):
        self.conn: Conn | None = None  # set once accepted
        self.inner = inner
        self.out = bytearray()      # ciphertext-to-be that the client's socket would not take yet
        self.handshaking = True
        self.closing = False        # the writer is done: flush, say goodbye, wait for the client
        self.deadline = 0.0
        self.inner_paused = False


TRIM_AFTER = 1 << 20     # freeing a buffer this big asks the allocator to give memory back (once a second)
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
TLS_OUT_LIMIT = 1 << 20  # past this, stop taking the writer's output: its socket fills, backpressure


class Reader:
    def __init__(self, config, resources):
        self.config = config
        self.listener = resources.listener
        self.ring = resources.input_ring
        self.fd_socks = [pair[0] for pair in resources.fd_pairs]
        self.control = resources.reader_control[0]
        self.ready_fd = resources.reader_ready[1]
        self.shared = resources.reader_stats
        self.stats = dict.fromkeys(self.shared.names, 0)
        self.conns: dict[int, Conn] = {}   # by fd
        self.sel = Poller(self.conns)
        self.spare = self.new_parser()     # parses for every connection that holds no unfinished frame
        # Ids stay unique across reader restarts: the dispatcher and writers tell the dead one's apart.
        self.first_id = (resources.reader_generation << 40) + 1
        self.ids = itertools.count(self.first_id)
        self.next_writer = itertools.cycle(range(len(self.fd_socks)))
        self.out = bytearray()
        self.count = 0
        self.pushed = False
        self.running = True
        self.allowed_paths = getattr(config, "ws_paths", None) or None
        self.allowed_origins = getattr(config, "ws_origins", None) or None
        # without ws_origins, a broker that checks logins opens WebSockets to its own pages only
        self.same_origin_only = config.auth != "off"
        self.hosts = HostPolicy.from_config(config)
        self.hsts = f"max-age={config.hsts_max_age}" if config.hsts_max_age else ""
        self.tls_listener = resources.tls_listener
        self.tls_context = tls_context(config) if self.tls_listener is not None else None
        self.alive_every = R.alive_every(config)
        self.proxies = proxy.TrustedProxies(config.proxy_trusted) if config.proxy_protocol else None
        # connections whose HTTP request (head, then body) is incomplete -> deadline: answered 408 at
        # half of connect_timeout_ms
        self.http_waiting: dict[Conn, float] = {}
        # connections whose request head came and whose body (Content-Length) is still arriving
        self.http_bodies: dict[Conn, tuple[dict, int]] = {}
        self.http_head_timeout = config.connect_timeout_ms / 2000
        # connections whose protocol is not known yet: the reader ends them at connect_timeout_ms
        # (the dispatcher's connect timeout is for those the reader said speak STOMP; undecided.py)
        self.undecided = undecided.Deadlines(config.connect_timeout_ms / 1000)
        self.partial = 0         # bytes of unfinished frames held for all connections
        self.trim_due = False    # big buffers were freed: give the memory back to the system
        self.next_trim = 0.0

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.listener.setblocking(False)
        for sock in self.fd_socks:
            sock.settimeout(2.0)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.control, selectors.EVENT_READ, "control")
        if self.tls_listener is not None:
            self.tls_listener.setblocking(False)
            self.sel.register(self.tls_listener, selectors.EVENT_READ, "accept-tls")
        closing_tls: set = set()
        self.ring.resume_producer()
        self.emit(R.READER_START, 0, R.CONN_ID.pack(self.first_id))  # ends whatever a dead reader left
        self.push()
        self.ring.notify()
        os.write(self.ready_fd, b"R")  # the supervisor announces the broker after this
        while self.running:
            timeout = 0.25 if closing_tls or self.http_waiting else None
            if self.undecided:
                timeout = max(min(timeout or 1.0, self.undecided.next_due - time.monotonic()), 0)
            if self.trim_due:
                timeout = max(min(timeout or 1.0, self.next_trim - time.monotonic()), 0)
            events = self.sel.select(timeout)
            now = time.monotonic()
            for what, mask in events:
                if what == "accept":
                    self.accept(self.listener)
                elif what == "accept-tls":
                    self.accept(self.tls_listener)
                elif what == "control":
                    self.on_control()
                else:
                    self.serve(what, mask, now, closing_tls)
                if len(self.out) >= FLUSH_AT:
                    self.push()
            if self.http_waiting:
                self.expire_http(now)
            if self.undecided:
                self.expire_undecided(now)
            if closing_tls:
                for conn in [c for c in closing_tls if now > c.tls.deadline or c.sock.fileno() < 0]:
                    closing_tls.discard(conn)
                    if conn.sock.fileno() >= 0:
                        self.drop(conn)
            self.push()
            if self.pushed:
                self.ring.notify()
                self.pushed = False
            self.stats["connections"] = len(self.conns)
            self.shared.update(self.stats)
            if self.trim_due and now >= self.next_trim:
                self.trim_due = False
                self.next_trim = now + 1.0
                common.trim_memory()
        self.emit(R.SHUTDOWN, 0)
        self.push()
        self.ring.notify()

    def serve(self, what, mask: int, now: float, closing_tls: set) -> None:
        """One connection's event: bytes from its client, or (TLS) from its writer."""
        # A selector key's data is the Conn of a client socket, or the TlsLink of a TLS connection's
        # socket pair, whose readable side carries plaintext from the writer, to encrypt.
        from_writer = type(what) is TlsLink
        conn = what.conn if from_writer else what
        if conn.sock.fileno() < 0:
            # Dropped by an earlier event of the same batch (a TLS connection has two sockets,
            # so its client's close and its writer's output can arrive together): nothing to do.
            return
        try:
            if from_writer:
                self.tls_from_writer(conn, now, closing_tls)
            elif conn.tls is not None:
                if conn.mode == PROXY:
                    self.tls_proxy_header(conn, now)
                else:
                    self.tls_event(conn, mask, now)
            else:
                self.read(conn, now)
        except Exception:
            # A bug must cost one connection, not every client (a reader restart).
            log.exception("internal error on connection %d; closing it", conn.id)
            self.bad_frame(conn, "internal error", "the broker could not read this connection", None)

    def push(self) -> None:
        """Move gathered records into the ring; wait (not reading anything) while it is full."""
        if not self.count:
            return
        stalled = False
        while not self.ring.try_write(self.out, self.count):
            if not stalled:
                self.stats["stalls"] += 1
                stalled = True
            self.ring.notify()
            self.ring.wait_for_space(0.05)
        self.out = bytearray()
        self.count = 0
        self.pushed = True

    def emit(self, kind: int, conn: int, payload: bytes = b"", aux: int = 0) -> None:
        self.out += R.pack_header(R.HEADER_SIZE + len(payload), kind, conn, aux, 0)
        self.out += payload
        self.count += 1

    # -- connections ---------------------------------------------------------------------------
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
                link = TlsLink(inner)
            try:
                handed = writer_end if link is not None else sock
                socket.send_fds(self.fd_socks[writer], [R.CONN_ID.pack(conn_id)], [handed.fileno()])
            except OSError as exc:
                log.error("cannot hand connection to writer %d: %s", writer, exc)
                sock.close()
                continue
            conn = Conn(conn_id, sock, writer)
            if proxied:
                conn.mode = PROXY
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)
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
        if conn.ws is not None:
            self.stats["websockets"] -= 1
            self.stats["ws_allocated"] -= conn.ws.allocated
        if conn.tls is not None:
            self.pause_inner(conn.tls)
            conn.tls.inner.close()  # the writer sees its socket closed and lets go
        self.sel.unregister(conn.sock)
        del self.conns[conn.sock.fileno()]
        conn.sock.close()
        self.release(conn)
        self.emit(R.CLOSED, conn.id)

    def on_control(self) -> None:
        for kind, argument in control.decode(os.read(self.control, control.READ_SIZE)):
            if kind is Control.STOP:
                self.stop()
            elif kind is Control.WRITER_RESTARTED:
                doomed = [c for c in self.conns.values() if c.writer == argument]
                log.warning("writer %d restarted: closing its %d connections", argument, len(doomed))
                for conn in doomed:
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    self.drop(conn)

    def stop(self) -> None:
        """Graceful shutdown: accept nothing more, read nothing more, tell the dispatcher."""
        self.running = False
        self.sel.unregister(self.listener)
        self.listener.close()

    # -- TLS ---------------------------------------------------------------------------------
    def tls_event(self, conn: Conn, mask: int, now: float) -> None:
        """Readable or writable client socket of a TLS connection."""
        link = conn.tls
        sock = conn.sock
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
            if conn.sock.fileno() < 0:
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
            if closed and sock.fileno() >= 0:
                self.drop(conn)

    def tls_proxy_header(self, conn: Conn, now: float) -> None:
        """ssl_port behind a proxy that passes TLS through: its PROXY header, then the handshake."""
        try:
            conn.buf, parsed, closed = proxy_before_tls.read_header(conn.sock, conn.buf)
        except proxy.ProxyError as exc:
            self.proxy_refused(conn, str(exc))
            return
        if closed:
            self.drop(conn)
        elif parsed is not None:
            source, _ = parsed
            conn.sock = self.tls_context.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
            conn.mode = NEW
            if source is not None:
                self.emit(R.PEER, conn.id, proxy.peer_text(*source).encode())
            self.tls_event(conn, selectors.EVENT_READ, now)  # its ClientHello may be here already

    def tls_from_writer(self, conn: Conn, now: float, closing: set) -> None:
        """The writer wrote (plaintext) for a TLS connection: encrypt it onto the client's socket."""
        link = conn.tls
        data = receive(link.inner)
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
        link, sock = conn.tls, conn.sock
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

    # -- reading -------------------------------------------------------------------------------
    def read(self, conn: Conn, now: float) -> None:
        if conn.dropped < 0:
            # No longer read, so this is a hang-up (the client's, or the writer's after its linger).
            # Reset, not FIN: a client blocked writing into the closed window is told at once
            # instead of probing it until the kernel gives up on the orphaned socket.
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            self.drop(conn)
            return
        data = receive(conn.sock)
        if data is None:
            return
        if not data:
            self.drop(conn)
            return
        if conn.mode == DEAD:
            self.drop_after_close(conn, len(data))
            return
        self.received(conn, data, now)

    def drop_after_close(self, conn: Conn, size: int) -> None:
        """An answer and a close are on their way: what the client still sends is read and dropped up
        to close_read_limit (so a client in the middle of writing a large frame finishes and reads its
        ERROR), then no longer read (its TCP window closes; only a hang-up, its own or the writer's,
        is reported). Read and dropped without end, a flood would cost this loop as much as a live
        connection's until the writer closes. TLS connections are read to their close_notify."""
        self.stats["bytes_in"] += size
        conn.dropped += size
        if conn.dropped > self.config.close_read_limit and conn.tls is None and conn.sock.fileno() >= 0:
            conn.dropped = -1
            self.sel.quiet(conn.sock)

    def received(self, conn: Conn, data: bytes, now: float) -> None:
        self.stats["bytes_in"] += len(data)
        mode = conn.mode
        if mode == PROXY:
            data = self.proxy_header(conn, data)
            if not data:
                return
            mode = conn.mode
        if mode == NEW:
            head = conn.buf + data if conn.buf else data
            verdict = sniff(head, self.proxies is not None)
            if verdict is None:  # a few bytes that could begin more than one protocol
                conn.buf = head
                return
            conn.buf, data = b"", head
            if verdict == "proxy":
                self.proxy_refused(conn, "a PROXY header where none is believed (the peer is not in "
                                         "proxy_trusted, or its proxy sent one already)")
                return
            mode = conn.mode = HTTP if verdict == "http" else STOMP
            self.undecided.discard(conn)
            if mode == STOMP:  # from now the dispatcher may answer it in STOMP (its connect timeout)
                self.emit(R.STOMP, conn.id)
        if mode == STOMP:
            self.stomp(conn, data, now)
        elif mode == WEBSOCKET:
            self.websocket(conn, data, now)
        elif mode == HTTP:
            self.http(conn, data, now)
        # DEAD: an ERROR is on its way; read and ignore until the writer hangs up
        if conn.mode == DEAD:
            if conn.held:
                self.release(conn)
            return
        held = (conn.parser.buffered if conn.parser is not None else 0) + (
            conn.ws.allocated if conn.ws is not None else 0) + (len(conn.buf) if conn.mode == HTTP else 0)
        self.partial += held - conn.held
        conn.held = held
        if not held:
            return
        config = self.config
        if conn.mode == HTTP:  # a request head or body (bounded by max_http_body) on its way
            if self.partial > config.max_partial_bytes:
                self.http_bodies.pop(conn, None)
                self.http_waiting.pop(conn, None)
                conn.mode = DEAD
                conn.buf = b""
                self.release(conn)
                self.http_reply(conn, ws.HandshakeError(503, "the broker holds too many unfinished requests "
                                                        "(max_partial_bytes); try again later").response())
        elif not conn.greeted and held > config.max_first_frame:
            self.bad_frame(conn, "frame too large", f"a frame before CONNECTED may have at most "
                           f"{config.max_first_frame} bytes (max_first_frame)", receipt_of(conn))
            self.release(conn)
        elif self.partial > config.max_partial_bytes:
            self.bad_frame(conn, "broker busy", f"the broker holds at most {config.max_partial_bytes} bytes "
                           "of unfinished frames for all connections (max_partial_bytes); send it again later",
                           receipt_of(conn))
            self.release(conn)

    def release(self, conn: Conn) -> None:
        """Forget a connection's unfinished frame (it is closing): the budget and the memory come back."""
        self.partial -= conn.held
        if conn.held >= TRIM_AFTER:
            self.trim_due = True
        conn.held = 0
        conn.parser = None

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
            peer = "%s:%s" % conn.sock.getpeername()[:2]
        except OSError:
            peer = "?"
        log.warning("connection %d from %s: %s; closing it", conn.id, peer, reason)
        if conn.tls is not None and conn.mode == PROXY:  # before TLS: nobody to say anything to
            self.drop(conn)
            return
        conn.mode = DEAD
        conn.buf = b""
        self.emit(R.HTTP, conn.id)  # nothing to write, then close

    def new_parser(self) -> FrameParser:
        config = self.config
        return FrameParser(config.max_frame_size, config.max_headers, config.max_header_line,
                           config.max_destination_length, config.max_id_length)

    def feed(self, conn: Conn, data: bytes) -> list:
        """The frames ``data`` completes. A connection has a parser of its own only while an
        unfinished frame (or an error) is left in it: an idle connection keeps none."""
        parser = conn.parser
        if parser is None:
            parser = self.spare
        try:
            frames = parser.feed(data)
        except ProtocolError:
            if parser is self.spare:
                conn.parser, self.spare = parser, self.new_parser()  # it keeps the error
            raise
        if parser.buffered:
            if parser is self.spare:
                conn.parser, self.spare = parser, self.new_parser()
        elif parser is not self.spare:
            conn.parser = None
        return frames

    def stomp(self, conn: Conn, data: bytes, now: float) -> None:
        try:
            frames = self.feed(conn, data)
        except ProtocolError as exc:
            self.frames(conn, getattr(exc, "frames", []), now)
            self.bad_frame(conn, exc.message, exc.detail, exc.receipt)
            return
        self.frames(conn, frames, now)

    def frames(self, conn: Conn, frames: list, now: float) -> None:
        if not frames:
            if now - conn.last_alive >= self.alive_every:
                conn.last_alive = now
                self.emit(R.ALIVE, conn.id)
            return
        conn.greeted = True
        out, n = self.out, len(frames)
        if n == 1:
            head, body = frames[0]
            out += R.pack_header(R.HEADER_SIZE + len(head) + len(body), R.FRAME, conn.id, len(head), R.stamp(now))
            out += head
            out += body
        else:
            # One record for the whole read: the dispatcher walks it with the length table.
            parts = [part for frame in frames for part in frame]
            sizes = R.frame_sizes(n).pack(*map(len, parts))
            data = b"".join(parts)
            out += R.pack_header(R.HEADER_SIZE + len(sizes) + len(data), R.FRAMES, conn.id, n, R.stamp(now))
            out += sizes
            out += data
        self.count += n
        self.stats["frames_in"] += len(frames)
        conn.last_alive = now

    def bad_frame(self, conn: Conn, message: str, detail: str, receipt: str | None) -> None:
        self.stats["bad_frames"] += 1
        conn.mode = DEAD
        # NUL separates the fields, and a NUL in an ERROR's receipt-id would end that frame early.
        fields = (message, detail, receipt if receipt is not None else "\x01")
        payload = "\0".join(f.replace("\0", "") for f in fields).encode()
        self.emit(R.BAD_FRAME, conn.id, payload)

    # -- HTTP and WebSocket --------------------------------------------------------------------
    def http(self, conn: Conn, data: bytes, now: float) -> None:
        conn.buf += data
        if conn in self.http_bodies:  # the head came: its body is still arriving
            self.http_body(conn)
            return
        try:
            parsed = ws.parse_http_request(conn.buf)
            if parsed is None:
                self.http_waiting.setdefault(conn, now + self.http_head_timeout)
                return
            self.http_waiting.pop(conn, None)
            request, used = parsed
            rest, conn.buf = conn.buf[used:], b""
            headers = request["headers"]
            upgrade = ws.wants_upgrade(headers)
            if not upgrade and request["path"].split("?")[0] == "/health_check" and request["method"] == "GET":
                conn.mode = DEAD  # for load balancers and probes, whatever Host they name
                self.http_reply(conn, ws.http_response(200, "OK", b"OK\n"))
                return
            if not (self.hosts.allows(headers.get("host")) and self.hosts.allows(request["authority"])):
                # DNS rebinding (protocol/hosts.py)
                raise ws.HandshakeError(421, "this broker does not answer for that Host (http_hosts)")
            if not upgrade:  # the console, the API, /metrics or a 404: the dispatcher has the figures
                length = ws.body_length(headers, self.config.http_body_bytes)
                if length:  # (a management action's JSON) read whole before the dispatcher sees it
                    self.http_bodies[conn] = (request, length)
                    self.http_waiting.setdefault(conn, now + self.http_head_timeout)
                    conn.buf = rest
                    self.http_body(conn)
                    return
                conn.mode = DEAD
                self.emit(R.HTTP_REQUEST, conn.id, encode_request(request))
                return
            response, _subprotocol = ws.handshake_response(request, self.allowed_paths, self.allowed_origins,
                                                           self.same_origin_only)
        except ws.HandshakeError as exc:
            self.http_waiting.pop(conn, None)
            conn.mode = DEAD
            conn.buf = b""
            # response() carries the headers the status needs (426: Sec-WebSocket-Version: 13).
            self.http_reply(conn, exc.response())
            return
        conn.mode = WEBSOCKET
        conn.ws = ws.WsDecoder(self.config.max_frame_size, self.config.ws_max_fragments)
        self.stats["websockets"] += 1
        self.emit(R.WS_OPEN, conn.id, response)
        if rest:
            self.websocket(conn, rest, now)

    def http_body(self, conn: Conn) -> None:
        """The request goes to the dispatcher once its whole body (Content-Length) is here."""
        request, length = self.http_bodies[conn]
        if len(conn.buf) < length:
            return
        del self.http_bodies[conn]
        self.http_waiting.pop(conn, None)
        body, conn.buf = conn.buf[:length], b""  # (anything after it is not read: one request per connection)
        conn.mode = DEAD
        self.release(conn)
        self.emit(R.HTTP_REQUEST, conn.id, encode_request(request, body))

    def expire_http(self, now: float) -> None:
        """A request head (or its body) not complete in time (half of connect_timeout_ms): 408, then close."""
        for conn in [c for c, deadline in self.http_waiting.items() if now >= deadline]:
            del self.http_waiting[conn]
            conn.mode = DEAD
            conn.buf = b""
            self.release(conn)
            late = "request body" if conn in self.http_bodies else "request head"
            self.http_bodies.pop(conn, None)
            self.http_reply(conn, ws.HandshakeError(408, f"{late} not complete in time").response())

    def expire_undecided(self, now: float) -> None:
        """Connections whose protocol is still unknown at connect_timeout_ms: bytes that came
        meanwhile decide first, else ``undecided.answer`` (a STOMP connect timeout for a connection
        that said nothing, a close without a word for one whose bytes could be more than one thing)."""
        for conn in self.undecided.due(now):
            if conn.mode not in (NEW, PROXY):
                continue  # (refused meanwhile: a PROXY header where none is believed)
            if conn.tls is None:
                self.read(conn, now)
                if conn.sock.fileno() < 0 or conn.mode not in (NEW, PROXY):
                    continue
            under_way = conn.mode == PROXY or (conn.tls is not None and conn.tls.handshaking)
            answer = undecided.answer(conn.buf, under_way)
            conn.mode = DEAD
            conn.buf = b""
            if answer == undecided.CONNECT_TIMEOUT:
                self.emit(R.BAD_FRAME, conn.id, b"connect timeout\0no CONNECT frame in time\0\x01")
            else:
                self.emit(R.HTTP, conn.id)  # nothing to write, then close

    def http_reply(self, conn: Conn, response: bytes) -> None:
        """An HTTP answer of the reader's own, then close; on the TLS port it carries HSTS."""
        if conn.tls is not None and self.hsts:
            response = ws.with_header(response, "Strict-Transport-Security", self.hsts)
        self.emit(R.HTTP, conn.id, response)

    def websocket(self, conn: Conn, data: bytes, now: float) -> None:
        decoder = conn.ws
        allocated, hits, misses = decoder.allocated, decoder.hits, decoder.misses
        try:
            events = decoder.feed(data)
            error = None
        except ws.WsProtocolError as exc:
            # What arrived before the bad frame in the same read still counts (pings, frames).
            events, error = exc.events, exc
        stats = self.stats  # DIAG ws_buffer; drop() takes a closed connection's allocated bytes back out
        stats["ws_allocated"] += decoder.allocated - allocated
        stats["ws_hits"] += decoder.hits - hits
        stats["ws_misses"] += decoder.misses - misses
        frames = []
        ping = None
        for event in events:
            kind = event[0]
            try:
                if kind is WS_MESSAGE:
                    frames += self.feed(conn, event[1])
                elif kind is WsEvent.PING:
                    ping = event[1]
                elif kind is WsEvent.CLOSE:
                    self.frames(conn, frames, now)
                    frames = []
                    conn.mode = DEAD
                    self.emit(R.WS_CLOSE, conn.id, ws.encode_close(event[1]))
                    return
            except ProtocolError as exc:
                self.frames(conn, frames + getattr(exc, "frames", []), now)
                self.bad_frame(conn, exc.message, exc.detail, exc.receipt)
                return
        if ping is not None:
            # One pong per read, for its last ping (RFC 6455 5.5.3 allows it): a ping flood costs
            # the dispatcher and the writer one record per read, not one per ping.
            self.emit(R.WS_REPLY, conn.id, ws.encode_frame(ping, ws.OP_PONG))
        self.frames(conn, frames, now)
        if error is not None:
            conn.mode = DEAD
            self.emit(R.WS_CLOSE, conn.id, ws.encode_close(error.code, error.reason))


def receipt_of(conn: Conn) -> str | None:
    """The receipt asked for by the connection's unfinished frame, if it is known yet."""
    return conn.parser.receipt() if conn.parser is not None else None


def receive(sock: socket.socket) -> bytes | None:
    """What one recv() gives: bytes, b"" at the end of the stream (or on an error), None if nothing yet."""
    try:
        return sock.recv(READ_SIZE)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


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


def run(config, resources) -> None:
    common.become_child("reader", config)
    common.tune_malloc_for_reader()
    Reader(config, resources).run()
