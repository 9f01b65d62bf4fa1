"""Reader process: accepts every connection and reads every socket (one epoll loop).

It tells the protocols apart by the first bytes (``GET `` is HTTP: a WebSocket upgrade or the health
check; anything else is raw STOMP), splits the byte stream into STOMP frames with the sans-IO
parsers, and appends them as records to the shared-memory input queue, one batch and one wake-up
per loop. When the queue is full it stops reading, so TCP pushes back on the clients: no frame is
ever dropped. Every socket is passed to its writer right after accept; the reader never writes to
a client except to refuse a connection over the limit.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import selectors
import socket
import struct
import time

from ..ipc import records as R
from ..protocol import websocket as ws
from ..protocol.stomp import FrameParser, ProtocolError, render_frame
from . import common

log = logging.getLogger("stompbroker.reader")

READ_SIZE = 65536
FLUSH_AT = 256 * 1024       # bytes of records gathered before they are pushed mid-loop
ALIVE_EVERY = 0.25          # seconds between liveness reports for a connection that sends no frames
_CONN_ID = struct.Struct("<Q")
_GET = b"GET "
_OTHER_METHODS = frozenset((b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"PATCH"))

NEW, STOMP, HTTP, WEBSOCKET, DEAD = range(5)


class Conn:
    __slots__ = ("id", "sock", "writer", "mode", "parser", "buf", "ws", "last_alive")

    def __init__(self, conn_id: int, sock: socket.socket, writer: int, parser: FrameParser):
        self.id = conn_id
        self.sock = sock
        self.writer = writer
        self.mode = NEW
        self.parser = parser
        self.buf = b""          # bytes of an HTTP request head not complete yet
        self.ws = None          # WsDecoder once upgraded
        self.last_alive = 0.0


class Reader:
    def __init__(self, config, resources):
        self.config = config
        self.listener = resources.listener
        self.ring = resources.input_ring
        self.fd_socks = [pair[0] for pair in resources.fd_pairs]
        self.control = resources.reader_control[0]
        self.shared = resources.reader_stats
        self.stats = dict.fromkeys(self.shared.names, 0)
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}   # by fd
        self.ids = itertools.count(1)
        self.next_writer = itertools.cycle(range(len(self.fd_socks)))
        self.out = bytearray()
        self.count = 0
        self.pushed = False
        self.running = True
        self.allowed_paths = getattr(config, "ws_paths", None) or None
        self.allowed_origins = getattr(config, "ws_origins", None) or None

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.listener.setblocking(False)
        for sock in self.fd_socks:
            sock.settimeout(2.0)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.control, selectors.EVENT_READ, "control")
        while self.running:
            events = self.sel.select()
            now = time.monotonic()
            for key, _ in events:
                what = key.data
                if what == "accept":
                    self.accept()
                elif what == "control":
                    self.on_control()
                else:
                    self.read(what, now)
                if len(self.out) >= FLUSH_AT:
                    self.push()
            self.push()
            if self.pushed:
                self.ring.notify()
                self.pushed = False
            self.stats["connections"] = len(self.conns)
            self.shared.update(self.stats)
        self.emit(R.SHUTDOWN, 0)
        self.push()
        self.ring.notify()

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
    def accept(self) -> None:
        for _ in range(256):  # then give the open connections a turn
            try:
                sock, addr = self.listener.accept()
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
            try:
                socket.send_fds(self.fd_socks[writer], [_CONN_ID.pack(conn_id)], [sock.fileno()])
            except OSError as exc:
                log.error("cannot hand connection to writer %d: %s", writer, exc)
                sock.close()
                continue
            conn = Conn(conn_id, sock, writer, FrameParser(self.config.max_frame_size, self.config.max_headers,
                                                           self.config.max_header_line))
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self.stats["accepted"] += 1
            self.emit(R.OPEN, conn_id, f"{addr[0]}:{addr[1]}".encode(), writer)

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
        if conn.ws is not None:
            self.stats["websockets"] -= 1
            self.stats["ws_allocated"] -= conn.ws.allocated
        self.sel.unregister(conn.sock)
        del self.conns[conn.sock.fileno()]
        conn.sock.close()
        self.emit(R.CLOSED, conn.id)

    def on_control(self) -> None:
        data = os.read(self.control, 4096)
        for line in data.decode().split():
            if line == "stop":
                self.stop()
            elif line.startswith("writer-restarted:"):
                index = int(line.split(":")[1])
                doomed = [c for c in self.conns.values() if c.writer == index]
                log.warning("writer %d restarted: closing its %d connections", index, len(doomed))
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

    # -- reading -------------------------------------------------------------------------------
    def read(self, conn: Conn, now: float) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(conn)
            return
        self.stats["bytes_in"] += len(data)
        mode = conn.mode
        if mode == NEW:
            mode = conn.mode = self.sniff(conn, data)
        if mode == STOMP:
            self.stomp(conn, data, now)
        elif mode == WEBSOCKET:
            self.websocket(conn, data, now)
        elif mode == HTTP:
            self.http(conn, data, now)
        # DEAD: an ERROR is on its way; read and ignore until the writer hangs up

    @staticmethod
    def sniff(conn: Conn, data: bytes) -> int:
        head = conn.buf + data
        if head.startswith(_GET) or _GET.startswith(head):
            return HTTP
        # Another HTTP method gets an HTTP answer (400, method must be GET) rather than hanging as
        # an unfinished STOMP frame: no STOMP command is followed by a space. CONNECT is left out
        # (it is also a STOMP command), and a method cut before its space is taken for STOMP.
        method, space, _ = head[:8].partition(b" ")
        if space and method in _OTHER_METHODS:
            return HTTP
        return STOMP

    def stomp(self, conn: Conn, data: bytes, now: float) -> None:
        try:
            frames = conn.parser.feed(data)
        except ProtocolError as exc:
            self.bad_frame(conn, exc.message, exc.detail, exc.receipt)
            return
        self.frames(conn, frames, now)

    def frames(self, conn: Conn, frames: list, now: float) -> None:
        if not frames:
            if now - conn.last_alive > ALIVE_EVERY:
                conn.last_alive = now
                self.emit(R.ALIVE, conn.id)
            return
        out, pack, conn_id, stamp = self.out, R.pack_header, conn.id, R.stamp(now)
        for head, body in frames:
            out += pack(R.HEADER_SIZE + len(head) + len(body), R.FRAME, conn_id, len(head), stamp)
            out += head
            out += body
        self.count += len(frames)
        self.stats["frames_in"] += len(frames)
        conn.last_alive = now

    def bad_frame(self, conn: Conn, message: str, detail: str, receipt: str | None) -> None:
        self.stats["bad_frames"] += 1
        conn.mode = DEAD
        payload = "\0".join((message, detail, receipt if receipt is not None else "\x01")).encode()
        self.emit(R.BAD_FRAME, conn.id, payload)

    # -- HTTP and WebSocket --------------------------------------------------------------------
    def http(self, conn: Conn, data: bytes, now: float) -> None:
        conn.buf += data
        try:
            parsed = ws.parse_http_request(conn.buf)
            if parsed is None:
                return
            request, used = parsed
            rest, conn.buf = conn.buf[used:], b""
            headers = request["headers"]
            if (request["path"].split("?")[0] == "/health_check" and request["method"] == "GET"
                    and "upgrade" not in headers):
                conn.mode = DEAD
                self.emit(R.HTTP, conn.id, ws.http_response(200, "OK", b"OK\n"))
                return
            response, _subprotocol = ws.handshake_response(request, self.allowed_paths, self.allowed_origins)
        except ws.HandshakeError as exc:
            conn.mode = DEAD
            conn.buf = b""
            # response() carries the headers the status needs (426: Sec-WebSocket-Version: 13).
            self.emit(R.HTTP, conn.id, exc.response())
            return
        conn.mode = WEBSOCKET
        conn.ws = ws.WsDecoder(self.config.max_frame_size)
        self.stats["websockets"] += 1
        self.emit(R.WS_OPEN, conn.id, response)
        if rest:
            self.websocket(conn, rest, now)

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
        for event in events:
            kind = event[0]
            try:
                if kind == "message":
                    frames += conn.parser.feed(event[1])
                elif kind == "ping":
                    self.emit(R.WS_REPLY, conn.id, ws.encode_frame(event[1], ws.OP_PONG))
                elif kind == "close":
                    self.frames(conn, frames, now)
                    frames = []
                    conn.mode = DEAD
                    self.emit(R.WS_CLOSE, conn.id, ws.encode_close(event[1]))
                    return
            except ProtocolError as exc:
                self.frames(conn, frames, now)
                self.bad_frame(conn, exc.message, exc.detail, exc.receipt)
                return
        self.frames(conn, frames, now)
        if error is not None:
            conn.mode = DEAD
            self.emit(R.WS_CLOSE, conn.id, ws.encode_close(error.code, error.reason))


def run(config, resources) -> None:
    common.become_child("reader", config)
    Reader(config, resources).run()
