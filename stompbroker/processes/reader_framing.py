"""The reader's hot path: a plain socket read, its bytes split into STOMP frames (raw or inside
WebSocket messages) by the sans-IO parsers, and the frames of one read appended as one record; the
limits on unfinished frames (``max_first_frame``, ``max_partial_bytes``); what a client still sends
once its ERROR or close is on its way."""

from __future__ import annotations

import socket

from ..ipc import records as R
from ..protocol import websocket as ws
from ..protocol.stomp import FrameParser, ProtocolError
from ..protocol.websocket import WsEvent
from .common import socket_of
from .reader_conns import DEAD, HTTP, NEW, PROXY, RESET, STOMP, WEBSOCKET, Conn, receive

TRIM_AFTER = 1 << 20     # freeing a buffer this big asks the allocator to give memory back (once a second)
WS_MESSAGE = WsEvent.MESSAGE  # tested per WebSocket message: a global, not an enum attribute lookup


class Framing:
    """The Reader's reading and framing steps (a mixin of ``reader.Reader``: its ``config``,
    ``stats``, ``out``, ``count``, ``spare`` parser, ``partial`` budget, ``sel``, ``emit``, ``drop``,
    ``first_bytes`` and ``http``)."""

    def read(self, conn: Conn, now: float) -> None:
        if self.quieted and conn in self.quieted:
            # No longer read, so this is a hang-up (the client's, or the writer's after its linger).
            # Reset, not FIN: a client blocked writing into the closed window is told at once
            # instead of probing it until the kernel gives up on the orphaned socket.
            with socket_of(conn.fd) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            self.drop(conn)
            return
        data = receive(conn.fd)
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
        dropped = self.dropping.get(conn, 0) + size
        if dropped > self.config.close_read_limit and conn.tls is None and conn.fd >= 0:
            self.quieted.add(conn)
            self.sel.quiet(conn.fd)
        self.dropping[conn] = dropped

    def received(self, conn: Conn, data: bytes, now: float) -> None:
        self.stats["bytes_in"] += len(data)
        mode = conn.mode
        if mode == NEW or mode == PROXY:
            data = self.first_bytes(conn, data)  # reader_first_bytes.py
            if data is None:
                return
            mode = conn.mode
        if mode == STOMP:
            self.stomp(conn, data, now)
        elif mode == WEBSOCKET:
            self.websocket(conn, data, now)
        elif mode == HTTP:
            self.http(conn, data, now)  # reader_http.py
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
        if conn.mode == HTTP:  # a request head or body (bounded by max_http_head, max_http_body) on its way
            if self.partial > config.max_partial_bytes:
                self.http_over_budget(conn)  # reader_http.py
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
