"""Dispatcher process: the one owner of broker state.

It takes batches of records from the input queue, feeds them to :class:`~stompbroker.broker.core.Broker`,
and hands each writer its records in one batch per round (one ring write and one wake-up per writer).
A writer whose queue is full makes the dispatcher wait, which in turn fills the input queue and makes
the reader stop reading: backpressure all the way to the clients' TCP windows.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time

import orjson

from ..broker.auth import Authenticator
from ..broker.core import Broker, Outbox
from ..diag.stats import Statistics
from ..store.sqlite import Store
from ..ipc import records as R
from . import common

log = logging.getLogger("stompbroker.dispatcher")

READ_BYTES = 256 * 1024   # input taken per round: bounds the latency added by one round
TICK = 0.1                # seconds between timer checks while any connection is open


class Dispatcher:
    def __init__(self, config, resources):
        self.config = config
        self.ring = resources.input_ring
        self.rings = resources.output_rings
        self.stamp = [0]
        self.outboxes = [Outbox(i, stamp=self.stamp) for i in range(len(self.rings))]
        limit = min(ring.capacity for ring in self.rings) // 2
        for box in self.outboxes:
            box.limit = limit
            box.on_full = self.flush_one
        self.broker = Broker(config, self.outboxes, clock=time.time)
        self.broker.diag = self.statistics = Statistics(self.broker, resources, config)
        self.next_tick = 0.0
        self.written = resources.written_channel[0]  # writers' reports: deliveries sent
        self.written.setblocking(False)
        self.wait_fds = [self.ring.data_fd, self.written]
        self.writers_done: set[int] = set()
        self.auth = None
        if config.auth != "off" or config.secret or config.acl_file:
            self.broker.auth = self.auth = Authenticator(config)
            self.wait_fds.append(self.auth.done_fd)
        # SIGHUP (relayed by the supervisor) re-reads the passwd file
        self.signal_r, signal_w = os.pipe()
        os.set_blocking(signal_w, False)
        os.set_blocking(self.signal_r, False)
        signal.set_wakeup_fd(signal_w)
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
        self.wait_fds.append(self.signal_r)
        self.store = None
        if config.store == "sqlite":
            self.store = Store(config.store_path, config.checkpoint, config.replay_retention)
            recovered = self.broker.recover(self.store, time.monotonic())
            self.wait_fds.append(self.store.done_fd)
            log.info("store %s: recovered %d queued messages and %d durable subscriptions",
                     config.store_path, recovered, len(self.broker.durables))
        os.write(resources.dispatcher_ready[1], b"R")  # the supervisor starts the reader after this
        self.dump_channel = resources.diag_channel[0] if config.diag_dump else None
        self.next_dump = time.monotonic() + config.diag_interval / 1000
        self.dumps_dropped = 0

    def run(self) -> None:
        ring = self.ring
        running = True
        while running:
            deadlines = []
            if self.broker.needs_tick():
                deadlines.append(self.next_tick)
            if self.dump_channel is not None:
                deadlines.append(self.next_dump)
            timeout = max(min(deadlines) - time.monotonic(), 0) if deadlines else None
            if not ring.used_bytes:
                select.select(self.wait_fds, [], [], timeout)
            ring.clear_wakeup()
            self.progress()
            if self.store is not None:
                self.broker.release(self.store.finished())
                self.commit()  # deletes of messages the writers have sent
            if self.auth is not None:
                now = time.monotonic()
                for conn, user in self.auth.results():
                    self.broker.on_auth(conn, user, now)
                self.commit()
            self.flush()  # receipts released by the store, replies to checked logins: out now
            self.signals()
            while running:
                blob = ring.read(READ_BYTES)
                if not blob:
                    break
                running = self.handle(blob, time.monotonic())
                self.commit()
                self.flush()
            now = time.monotonic()
            if now >= self.next_tick:
                self.next_tick = now + TICK
                self.broker.on_tick(now)
                self.commit()
                self.flush()
            if self.dump_channel is not None and now >= self.next_dump:
                self.next_dump = now + self.config.diag_interval / 1000
                self.dump()
        timeout = self.config.shutdown_timeout_ms / 1000
        if self.store is not None:
            self.commit()
            self.store.sync(timeout)  # everything on disk, then the last receipts go out
            self.broker.release(self.store.finished())
        for box in self.outboxes:
            box.add(R.STOP, 0)
        self.flush()
        if self.store is not None:
            # What the writers manage to send before their deadline leaves the store; the rest stays
            # there and is delivered after the restart.
            deadline = time.monotonic() + timeout + 1
            while len(self.writers_done) < len(self.rings) and time.monotonic() < deadline:
                select.select([self.written], [], [], max(deadline - time.monotonic(), 0))
                self.progress()
            self.commit()
            self.store.close(timeout)

    def progress(self) -> None:
        """Take the writers' reports of sent deliveries (each a cumulative count per connection)."""
        head, pair = R.WRITTEN_HEAD, R.WRITTEN_PAIR
        on_written = self.broker.on_written
        while True:
            try:
                report = self.written.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            if len(report) < head.size:
                return
            writer, flags = head.unpack_from(report)
            if flags & R.WRITTEN_STARTED:
                self.broker.on_writer_restart(writer)
            for conn, total in pair.iter_unpack(memoryview(report)[head.size:]):
                on_written(conn, total & ~R.WRITTEN_FINAL, bool(total & R.WRITTEN_FINAL))
            if flags & R.WRITTEN_LAST:
                self.writers_done.add(writer)

    def handle(self, blob: bytes, now: float) -> bool:
        broker = self.broker
        unpack = R.unpack_header
        pos, end = 0, len(blob)
        while pos < end:
            length, kind, conn, aux, stamp = unpack(blob, pos)
            start = pos + R.HEADER_SIZE
            stop = pos + length
            pos = stop
            self.stamp[0] = stamp
            try:
                if kind == R.FRAME:
                    split = start + aux
                    broker.on_frame(conn, blob[start:split], blob[split:stop], now)
                elif kind == R.OPEN:
                    broker.on_open(conn, aux, blob[start:stop].decode(), now)
                elif kind == R.CLOSED:
                    broker.now = now  # unwritten deliveries are timed from here
                    broker.on_closed(conn)
                elif kind == R.ALIVE:
                    broker.on_alive(conn, now)
                elif kind == R.BAD_FRAME:
                    message, detail, receipt = blob[start:stop].decode(errors="replace").split("\0")
                    broker.on_bad_frame(conn, message, detail, None if receipt == "\x01" else receipt)
                elif kind in (R.HTTP, R.WS_OPEN, R.WS_REPLY, R.WS_CLOSE):
                    self.transport(kind, conn, blob[start:stop])
                elif kind == R.SHUTDOWN:
                    return False
                elif kind == R.READER_START:
                    broker.now = now
                    broker.on_reader_start(R.CONN_ID.unpack_from(blob, start)[0])
            except Exception:
                # A bug must cost one connection, not every client's session (a dispatcher restart).
                log.exception("internal error on connection %d; closing it", conn)
                broker.on_internal_error(conn)
        self.stamp[0] = 0  # records made by timers are not stamped
        return True

    def transport(self, kind: int, conn: int, payload: bytes) -> None:
        """HTTP and WebSocket control traffic: written raw by the connection's writer."""
        session = self.broker.sessions.get(conn)
        if session is None:
            return
        box = session.outbox
        if kind == R.WS_OPEN:
            box.add(R.WS_ON, conn, payload)
            self.broker.on_websocket(conn)
        elif kind == R.WS_REPLY:
            box.add(R.RAW, conn, payload)
        else:  # HTTP reply or WebSocket close: write it, then hang up
            box.add(R.RAW, conn, payload)
            self.broker.hang_up(session)

    def signals(self) -> None:
        try:
            received = os.read(self.signal_r, 64)
        except BlockingIOError:
            return
        if signal.SIGHUP in received and self.auth is not None:
            self.auth.reload()

    def commit(self) -> None:
        """End of a round: hand the store what the round wrote (group commit), without waiting."""
        if self.store is not None and (self.store.pending() or self.broker.need_commit):
            self.store.submit()
            self.broker.need_commit = False

    def dump(self) -> None:
        """Hand one statistics line to the supervisor, which writes the file: never wait for a disk."""
        snapshot = self.statistics.snapshot()
        snapshot["totals"]["dump_dropped"] = self.dumps_dropped
        try:
            self.dump_channel.send(orjson.dumps(snapshot))
        except (BlockingIOError, OSError) as exc:
            self.dumps_dropped += 1
            if self.dumps_dropped in (1, 10, 100) or self.dumps_dropped % 1000 == 0:
                log.warning("statistics line dropped (%s); %d so far", exc, self.dumps_dropped)

    def flush(self) -> None:
        for box in self.outboxes:
            if box.count:
                self.flush_one(box)

    def flush_one(self, box: Outbox) -> None:
        buf, count = box.take()
        ring = self.rings[box.index]
        while not ring.try_write(buf, count):
            ring.notify()
            ring.wait_for_space(0.05)
        ring.notify()


def run(config, resources) -> None:
    common.become_child("dispatcher", config)
    resources.diag_channel[0].setblocking(False)
    Dispatcher(config, resources).run()
