"""Writer process: owns the sending side of its connections and batches their output.

Each connection belongs to exactly one writer (the reader passes the socket's fd over a unix socket),
so frames for one connection leave in the order the dispatcher produced them. Frames are gathered
per connection into batches of ``write_buffer_size`` bytes (stompica's 10 KB), each written with
one send(); a frame larger than that is a batch of its own. A connection whose unsent output passes
``max_pending_bytes`` and that took nothing for a second (or has four times that unsent: memory stays
bounded) is a slow consumer: it gets an ERROR and is closed, and nobody else waits.

Closing: ``shutdown(SHUT_WR)`` sends what is queued and a FIN; after a short linger the read side is
shut too, which the reader sees as end of file and reports to the dispatcher.

Written progress: queue deliveries come marked (``WRITTEN_MARK``). When a batch is fully sent its
marked frames are added to the connection's count, and once per loop the counts that moved go back
to the dispatcher in one datagram, which then deletes those messages from the store. Whatever was
not sent when a connection ends (slow consumer, close, crash, SIGTERM deadline) is never counted,
so the dispatcher puts it back in its queue and it stays in the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import time

from ..diag import latency
from ..ipc import records as R
from ..protocol.stomp import render_frame
from ..protocol.websocket import CloseCode, encode_close, encode_message
from . import batching, common
from .poller import Poller

log = logging.getLogger("stompbroker.writer")

LINGER = 1.0          # seconds a closed connection may still read before its read side is cut
STALLED = 1.0         # over max_pending_bytes, a connection that took nothing for this long is slow

write = os.write      # on a socket's fd, send() without flags


class Conn:
    # (a closing connection's deadline is its value in Writer.ending, a heart-beat interval its
    # value in Writer.heartbeats: an idle connection keeps neither)
    __slots__ = ("id", "fd", "ws", "batches", "cur", "cur_stamp", "cur_frames", "cur_marks", "pending",
                 "closing", "last_write", "writing", "lingering", "written")

    def __init__(self, conn_id: int, fd: int, now: float = 0.0):
        self.id = conn_id
        # A bare fd (a socket object is 100 bytes more); -1 once discarded, and then its count is final.
        self.fd = fd
        self.ws = False
        # Full batches waiting to be sent, as (bytes, stamp of the first frame, frame count, marked
        # frame count); the first may be part-sent (then its bytes are a memoryview of the rest).
        # (a list while some wait, else the shared (): an idle connection keeps no list, no buffer)
        self.batches: list = ()
        self.cur = b""                  # the batch being filled (a bytearray once it has a frame)
        self.cur_stamp = 0
        self.cur_frames = 0
        self.cur_marks = 0
        self.written = 0                # marked frames sent (cumulative), reported to the dispatcher
        self.pending = 0                # bytes queued, not yet sent
        self.closing = False
        # When it last took bytes, as of the writer's wake-up or ring read (Writer.now: one float
        # for all the connections flushed then, not one each).
        self.last_write = now
        self.writing = False            # registered for EVENT_WRITE
        self.lingering = False


class Writer:
    def __init__(self, index: int, config, ring, fd_sock: socket.socket, shared, latency_shared,
                 report_sock: socket.socket | None = None):
        self.index = index
        self.report_sock = report_sock    # written progress to the dispatcher (None in unit tests)
        self.progress: set[Conn] = set()  # connections whose written count moved since the last report
        self.floor = 0                    # connection ids below this belong to a reader that died
        self.config = config
        self.ring = ring
        self.fd_sock = fd_sock
        self.shared = shared  # statistics other processes read; updated once per loop
        self.stats = dict.fromkeys(shared.names, 0)
        self.latency_shared = latency_shared
        self.latency = [0] * latency.BUCKETS   # this interval's input-to-socket latencies, per frame
        self.latency_pending = False
        self.interval = config.diag_interval / 1000
        self.interval_start = time.monotonic()
        self.batch_size = config.write_buffer_size
        self.max_pending = config.max_pending_bytes
        self.conns: dict[int, Conn] = {}
        # closing or lingering connections -> their deadline: a loop looks at these, not at all
        self.ending: dict[Conn, float] = {}
        self.heartbeats: dict[Conn, float] = {}   # -> seconds between heart-beats when idle
        self.now = time.monotonic()               # as of this loop's wake-up
        self.idle_trim = common.IdleTrim()
        self.sel = Poller({})
        self.stopping = False
        self.stop_deadline = 0.0

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        while self.round():
            pass

    def start(self) -> None:
        self.fd_sock.setblocking(False)
        # The ring's wake-ups are edge-triggered: they only end the wait (drain_ring runs every
        # round), with no read of the eventfd.
        self.ring.watch(self.sel.epoll)
        self.sel.register(self.fd_sock, selectors.EVENT_READ, "fds")
        self.report(R.WRITTEN_STARTED)

    def round(self) -> bool:
        """One wait and what follows it; False once stopped."""
        events = self.sel.select(self._timeout())
        self.now = time.monotonic()
        for what, _ in events:
            if what == "fds":
                self.adopt()
            else:
                self.flush(what)
        if self.drain_ring() or events:  # (the ring's wake-up itself is no event: Ring.watch)
            self.idle_trim.busy(self.now)
        now = time.monotonic()
        if self.heartbeats:
            self.beat(now)
        if self.ending:
            self.expire(now)
        if now - self.interval_start >= self.interval:
            self.latency_shared.publish(self.latency, now)
            self.latency = [0] * latency.BUCKETS
            self.latency_pending = False
            self.interval_start = now
        self.shared.update(self.stats)
        if self.progress:
            self.report()
        self.idle_trim.check(now)
        if self.stopping and (not any(c.pending for c in self.conns.values()) or now > self.stop_deadline):
            self.finish_all()
            self.report(R.WRITTEN_LAST)
            return False
        return True

    def _timeout(self):
        if not (self.heartbeats or self.ending or self.stopping or self.progress or self.idle_trim.due):
            if self.latency_pending:  # wake up to publish this interval's latencies, then sleep
                return max(self.interval_start + self.interval - time.monotonic(), 0)
            return None  # (most rounds)
        waits = [hb / 4 for hb in self.heartbeats.values()]
        if self.idle_trim.due:
            waits.append(self.idle_trim.wait(time.monotonic()))
        if self.latency_pending:  # wake up to publish this interval's latencies, then sleep
            waits.append(max(self.interval_start + self.interval - time.monotonic(), 0))
        if self.ending or self.stopping:
            waits.append(0.1)
        if self.progress:  # a report the dispatcher's channel could not take yet
            waits.append(0.05)
        return min(waits) if waits else None

    # -- input from the dispatcher -------------------------------------------------------------
    def drain_ring(self) -> bool:
        """Batch what the ring holds; True if it held anything."""
        touched = set()
        unpack = R.unpack_header
        conns = self.conns
        # A DATA record, nearly every record, is batched here, not through append: a call and two
        # counter updates less per frame; the counters move once per ring read.
        add, limit, max_pending, DATA, MARK = batching.add, self.batch_size, self.max_pending, R.DATA, R.WRITTEN_MARK
        DATA_EACH = R.DATA_EACH
        frames = queued = 0
        ring = self.ring
        blob = ring.read()
        read = bool(blob)
        while blob:
            self.now = time.monotonic()  # (a long drain must not make last_write stale: STALLED)
            pos, end = 0, len(blob)
            while pos < end:
                length, kind, conn_id, aux, stamp = unpack(blob, pos)
                start = pos + R.HEADER_SIZE
                stop = pos + length
                pos = stop
                if kind == R.RESET:
                    self.reset(R.CONN_ID.unpack_from(blob, start)[0])
                    continue
                if kind == DATA_EACH:  # (its connections are in its entries)
                    frames += self.each(blob, start, stop, aux, stamp, touched)
                    continue
                c = conns.get(conn_id)
                if c is None and kind != R.STOP:
                    self.adopt()
                    c = conns.get(conn_id)
                    if c is None:
                        continue  # the connection is long gone
                if kind == DATA:
                    if not c.closing:
                        queued += add(c, blob[start:stop], stamp, limit, c.ws, aux & MARK)
                        frames += 1
                        if c.pending > max_pending:
                            self.over_limit(c)
                        touched.add(c)
                elif kind == R.RAW or kind == R.WS_ON:
                    if not c.closing:
                        self.append(c, blob[start:stop])
                        touched.add(c)
                        if kind == R.WS_ON:
                            c.ws = True
                elif kind == R.CLOSE:
                    if stop > start and c.ws and not c.closing:  # a WebSocket close frame first
                        self.append(c, encode_close(R.WS_CLOSE_CODE.unpack_from(blob, start)[0]))
                    if c.lingering:
                        self.discard(c)  # the reader has seen the end already
                    elif not c.closing:
                        c.closing = True
                        self.ending[c] = time.monotonic() + self.config.shutdown_timeout_ms / 1000
                        touched.add(c)
                elif kind == R.HEARTBEAT:
                    if aux:
                        self.heartbeats[c] = aux / 1000
                    else:
                        self.heartbeats.pop(c, None)
                elif kind == R.STOP:
                    self.stopping = True
                    self.stop_deadline = time.monotonic() + self.config.shutdown_timeout_ms / 1000
            if frames:
                self.stats["frames"] += frames
                self.stats["pending_bytes"] += queued
                frames = queued = 0
            blob = ring.read() if ring.used_bytes else b""  # (no empty read to find the end)
        for c in touched:
            self.flush(c)
        return read

    def each(self, blob: bytes, start: int, stop: int, n: int, stamp: int, touched: set) -> int:
        """A DATA_EACH record: each of its connections gets its prefix and the shared part; returns
        the frames queued (their bytes are counted here)."""
        entries, part_at = R.each_entries(blob, start, n)
        part = blob[part_at:stop]
        conns, add, limit = self.conns, batching.add, self.batch_size
        frames = queued = 0
        for conn_id, at, end in entries:
            c = conns.get(conn_id)
            if c is None:
                self.adopt()
                c = conns.get(conn_id)
            if c is not None and not c.closing:
                queued += add(c, blob[at:end] + part, stamp, limit, c.ws)
                frames += 1
                if c.pending > self.max_pending:
                    self.over_limit(c)
                touched.add(c)
        self.stats["pending_bytes"] += queued
        return frames

    def adopt(self) -> None:
        """Take the sockets the reader has passed over."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.fd_sock, 64, 1)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            for fd in fds:
                os.set_blocking(fd, False)
                (conn_id,) = R.CONN_ID.unpack(data[:8])
                if conn_id < self.floor:  # passed by a reader that has died since: nobody reads it
                    os.close(fd)
                    continue
                self.conns[conn_id] = Conn(conn_id, fd, self.now)
                self.stats["connections"] = len(self.conns)

    def reset(self, floor: int) -> None:
        """The reader restarted: connections older than its first id have no reader; cut them now."""
        self.floor = max(self.floor, floor)
        for c in [c for c in self.conns.values() if c.id < floor]:
            self.cut(c, "broker restarting", "the broker's reader restarted: reconnect")
            self.flush(c)

    def report(self, flag: int = 0) -> None:
        """Tell the dispatcher how many marked deliveries each connection has sent (a datagram per 4,096)."""
        sock = self.report_sock
        if sock is None:
            self.progress.clear()
            return
        pairs = [R.WRITTEN_PAIR.pack(c.id, c.written | (R.WRITTEN_FINAL if c.lingering or c.fd < 0 else 0))
                 for c in self.progress]
        starts = range(0, max(len(pairs), 1), 4096)
        for i in starts:
            data = R.WRITTEN_HEAD.pack(self.index, flag if i == starts[-1] else 0) + b"".join(pairs[i:i + 4096])
            try:
                sock.send(data)
            except (BlockingIOError, InterruptedError):
                if not flag:
                    return  # counts are cumulative: the next report carries them
                sock.settimeout(1.0)  # the dispatcher waits for this last report: give it a moment
                try:
                    sock.send(data)
                except OSError:
                    pass
                finally:
                    sock.setblocking(False)
            except OSError:
                break
        self.progress.clear()

    # -- batching and sending --------------------------------------------------------------------
    def append(self, c: Conn, frame, stamp: int = 0, ws: bool = False, mark: int = 0) -> None:
        n = batching.add(c, frame, stamp, self.batch_size, ws, mark)
        stats = self.stats
        stats["frames"] += 1
        stats["pending_bytes"] += n
        if c.pending > self.max_pending:
            self.over_limit(c)

    def over_limit(self, c: Conn) -> None:
        """c holds more than max_pending_bytes unsent."""
        self.flush(c)  # a burst bigger than the limit is not slowness: see what the socket takes
        if c.pending > self.max_pending and not c.closing and (
                c.pending > 4 * self.max_pending or time.monotonic() - c.last_write > STALLED):
            self.slow_consumer(c)

    close_batch = staticmethod(batching.close)

    def flush(self, c: Conn) -> None:
        if c.cur:
            self.close_batch(c)
        batches = c.batches
        stats = self.stats
        now = time.monotonic()
        while batches:
            batch, stamp, frames, marks = batches[0]
            try:
                sent = write(c.fd, batch)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.discard(c)
                return
            if sent:
                c.pending -= sent
                c.last_write = self.now
                stats["bytes"] += sent
                stats["pending_bytes"] -= sent
            if sent < len(batch):
                batches[0] = (memoryview(batch)[sent:], stamp, frames, marks)
                if not c.writing:
                    self.sel.register(c.fd, selectors.EVENT_WRITE, c)
                    c.writing = True
                return
            del batches[0]
            if marks:
                c.written += marks
                self.progress.add(c)
            stats["batches"] += 1
            stats["fill"] += min(len(batch) / self.batch_size, 1.0)
            if stamp:  # the batch's oldest frame stands for all of its frames
                self.latency[latency.bucket((R.stamp(now) - stamp) & R.STAMP_MASK)] += frames
                self.latency_pending = True
        c.batches = ()  # all sent: an idle connection keeps no list
        if c.writing:
            with contextlib.suppress(OSError):  # (as selectors did)
                self.sel.unregister(c.fd)
            c.writing = False
        if c.closing and not c.lingering:
            self.hang_up(c)

    def slow_consumer(self, c: Conn) -> None:
        """Too much unsent output: keep what is half-sent, add an ERROR, close."""
        log.warning("writer %d: connection %d is a slow consumer (%d bytes pending), closing",
                    self.index, c.id, c.pending)
        self.stats["slow_consumers"] += 1
        self.cut(c, "slow consumer", f"more than {self.max_pending} bytes waiting to be sent",
                 CloseCode.POLICY_VIOLATION)

    def cut(self, c: Conn, message: str, detail: str, ws_code: int = CloseCode.INTERNAL_ERROR) -> None:
        """Drop the unsent output (the dispatcher requeues its deliveries), add an ERROR, close."""
        if c.lingering:
            return
        keep = []
        if c.batches and isinstance(c.batches[0][0], memoryview):
            keep.append(c.batches[0])  # part-sent: finish it, so the ERROR starts on a frame boundary
        c.batches = keep or ()
        error = render_frame("ERROR", {"message": message, "content-type": "text/plain"}, detail.encode())
        c.cur = bytearray(encode_message(error) if c.ws else error)
        if c.ws:
            c.cur += encode_close(ws_code, message)  # a close frame, not a bare FIN (RFC 6455 7.1.1)
        c.cur_frames, c.cur_stamp, c.cur_marks = 1, 0, 0
        before = c.pending
        c.pending = sum(len(b[0]) for b in keep) + len(c.cur)
        self.stats["pending_bytes"] += c.pending - before
        c.closing = True
        self.ending[c] = time.monotonic() + 1.0

    def hang_up(self, c: Conn) -> None:
        """Everything is sent: send FIN, and let the peer read it before the read side is cut."""
        common.shutdown(c.fd, socket.SHUT_WR)
        c.lingering = True
        self.ending[c] = time.monotonic() + LINGER
        self.progress.add(c)  # all sent: its count is final
        self.heartbeats.pop(c, None)

    def discard(self, c: Conn) -> None:
        """Forget a connection; shutting the read side wakes the reader, which reports the close."""
        # -1 first: a later write must fail (EBADF), never reach whichever connection gets the fd next
        fd, c.fd = c.fd, -1
        common.shutdown(fd, socket.SHUT_RDWR)
        if c.writing:
            with contextlib.suppress(OSError):  # (as selectors did)
                self.sel.unregister(fd)
            c.writing = False
        if fd >= 0:
            os.close(fd)
        self.progress.add(c)  # what was not sent never will be: its count is final
        self.heartbeats.pop(c, None)
        self.stats["pending_bytes"] -= c.pending
        c.pending = 0
        self.conns.pop(c.id, None)
        self.ending.pop(c, None)
        self.stats["connections"] = len(self.conns)

    def expire(self, now: float) -> None:
        for c in [c for c, deadline in self.ending.items() if now > deadline]:
            self.discard(c)

    def beat(self, now: float) -> None:
        for c, hb in list(self.heartbeats.items()):
            if not c.pending and now - c.last_write >= hb * 0.9:
                self.append(c, encode_message(b"\n") if c.ws else b"\n")
                self.flush(c)

    def finish_all(self) -> None:
        for c in list(self.conns.values()):
            if c.ws and not c.closing and not c.lingering:
                self.append(c, encode_close(1001, "broker shutting down"))  # 1001: going away
                self.flush(c)
        for c in list(self.conns.values()):
            if not c.lingering:
                self.hang_up(c)
        time.sleep(0.05)  # let the FINs out before the sockets are cut
        for c in list(self.conns.values()):
            self.discard(c)


def run(index: int, config, resources) -> None:
    common.become_child(f"writer-{index}", config)
    report_sock = resources.written_channel[1]
    report_sock.setblocking(False)
    Writer(index, config, resources.output_rings[index], resources.fd_pairs[index][1],
           resources.writer_stats[index], resources.writer_latency[index], report_sock).run()
