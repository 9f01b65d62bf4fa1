"""Dispatcher process: the one owner of broker state.

It takes batches of records from the input queue, feeds them to :class:`~stompbroker.broker.core.Broker`,
and hands each writer its records in one batch per round (one ring write and one wake-up per writer).
A writer whose queue is full makes the dispatcher wait, which in turn fills the input queue and makes
the reader stop reading: backpressure all the way to the clients' TCP windows. The wait is here, in
the loop, between events (``drain``): the broker never waits; an event whose output goes over an
outbox's limit stops resumably and is finished here before the next event is fed.
"""

from __future__ import annotations

import heapq
import logging
import os
import select
import signal
import time

import orjson

from ..broker.auth import Authenticator
from ..broker.core import Broker
from ..console import http
from ..security import passwd
from ..diag.stats import Statistics
from ..store.sqlite import Store
from ..ipc import records as R
from ..cluster import records as C
from ..ipc.outbox import Outbox
from ..protocol.handshake import with_header
from ..protocol.stomp import render_frame
from . import common
from . import poison
from .login_checker import LoginChecker, load_users
from .login_checker import log as auth_log

log = logging.getLogger("stompbroker.dispatcher")

READ_BYTES = 256 * 1024   # input taken per round: bounds the latency added by one round
TICK = 0.1                # seconds between timer checks while any connection is open (less for short heart-beats)


class Dispatcher:
    def __init__(self, config, resources):
        self.config = config
        self.ring = resources.input_ring
        self.rings = resources.output_rings
        limit = min(ring.capacity for ring in self.rings) // 2  # a batch is at most this plus one record
        self.outboxes = [Outbox(i, limit) for i in range(len(self.rings))]
        self.idle_trim = common.IdleTrim()
        self.auth = self.logins = None
        if config.auth_required or config.acl_file:
            self.auth = Authenticator(config, load_users(config))
            self.logins = LoginChecker(self.auth, config)
        self.backplane = None
        if config.cluster:  # the bridge process speaks to NATS; this side stays pure (cluster/backplane.py)
            from ..cluster.backplane import Backplane
            self.backplane = Backplane(config)
            self.to_bridge, self.from_bridge = resources.bridge_rings
            self.to_bridge.resume_producer()
            self.bridge_backlog: list[tuple[bytearray, int]] = []  # batches waiting for room in its ring
        self.statistics = Statistics(None, resources, config)  # (it reads the broker, which binds it)
        self.broker = Broker(config, self.outboxes, clock=time.time, auth=self.auth, logins=self.logins,
                             diag=self.statistics, backplane=self.backplane)
        self.site = http.Site(config, self.statistics)
        self.http_pending: dict[int, tuple] = {}              # HTTP requests whose login is being checked
        self.http_deadlines: list[tuple[float, int]] = []     # (when, conn): answered 429/503 if still unchecked
        self.http_delayed: list[tuple[float, int, bytes]] = []  # (heap) refused HTTP logins, answered after a delay
        self.next_tick = 0.0
        self.tick = min(TICK, R.alive_every(config))
        self.written = resources.written_channel[0]  # writers' reports: deliveries sent
        self.written.setblocking(False)
        self.wait_fds = [self.ring.data_fd, self.written]
        self.writers_done: set[int] = set()
        if self.auth is not None:
            self.wait_fds.append(self.logins.done_fd)
        if self.backplane is not None:
            self.wait_fds.append(self.from_bridge.data_fd)
        # SIGHUP (relayed by the supervisor) re-reads the passwd file
        self.signal_r, signal_w = os.pipe()
        os.set_blocking(signal_w, False)
        os.set_blocking(self.signal_r, False)
        signal.set_wakeup_fd(signal_w)
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
        self.wait_fds.append(self.signal_r)
        # What it handles is noted for the supervisor, which quarantines an input that killed it twice.
        self.note = resources.dispatcher_note
        refusals = poison.Refusals(resources.quarantine)
        self.quarantined_rows = refusals.rows
        self.refusals = refusals if refusals.inputs else None  # (None: one test per input)
        marker = poison.fault_marker()
        if marker is not None:
            self.broker.on_frame = poison.die_on(marker, self.broker.on_frame)
            self.http_request = poison.die_on_request(marker, self.http_request)
        self.store = None
        if config.store == "sqlite" and config.cluster:
            log.warning("store=sqlite is not used in cluster mode: JetStream keeps queues and durable subscriptions")
        elif config.store == "sqlite":
            self.store = self.recover(config, marker)
            self.wait_fds.append(self.store.done_fd)
        os.write(resources.dispatcher_ready[1], b"R")  # the supervisor starts the reader after this
        self.dump_channel = resources.diag_channel[0] if config.diag_dump else None
        self.next_dump = time.monotonic() + config.diag_interval / 1000

    def recover(self, config, marker: bytes | None) -> Store:
        """Open the store and load it; first set aside the stored messages that killed a dispatcher
        twice while loading, then those whose names the broker would now refuse."""
        store = Store(config.store_path, config.checkpoint, config.replay_retention)
        if self.quarantined_rows:
            moved = store.quarantine(self.quarantined_rows, "the dispatcher died twice loading it")
            log.error("store %s: quarantined %d stored messages that killed the dispatcher twice while loading "
                      "(seq %s); stompbroker-store export --quarantined shows them", config.store_path, moved,
                      ", ".join(map(str, self.quarantined_rows[:20])))

        def loading(seq: int, body: bytes) -> None:
            self.note.loading(seq)
            if marker is not None and marker in body:
                poison.die()

        recovered, too_long = self.broker.recover(store, time.monotonic(), loading)
        self.note.idle()
        if too_long:
            moved = store.quarantine(too_long, "destination longer than max_destination_length")
            log.warning("store %s: quarantined %d stored messages whose destination is longer than "
                        "max_destination_length (%d bytes); stompbroker-store export --quarantined shows them, "
                        "release puts them back", config.store_path, moved, config.max_destination_length)
        log.info("store %s: recovered %d queued messages, %d durable subscriptions and %d scheduled messages",
                 config.store_path, recovered, len(self.broker.durables), len(self.broker.jobs))
        return store

    def waiting(self):
        """One epoll for the whole run (select() built and polled its fd sets on every wake-up):
        the input ring edge-triggered (Ring.watch), the other channels as before."""
        epoll = select.epoll()
        self.ring.watch(epoll)
        for fd in self.wait_fds[1:]:
            epoll.register(fd, select.EPOLLIN)
        return epoll

    def run(self) -> None:
        ring = self.ring
        note = self.note.slots
        wait = self.waiting().poll
        written = self.written.fileno()
        running = True
        while running:
            # Asleep, it knows which channels woke it and reads only those (an empty non-blocking
            # read raises, which costs more than the rest of a one-message round); busy, it looks
            # at all of them every round, and works out no deadlines. The input ring's wake-up is
            # edge-triggered: never read.
            if ring.used_bytes:
                ready = None
            else:
                deadlines = []
                if self.broker.needs_tick():
                    deadlines.append(self.next_tick)
                if self.dump_channel is not None:
                    deadlines.append(self.next_dump)
                if self.http_delayed:
                    deadlines.append(self.http_delayed[0][0])
                if self.http_deadlines:
                    deadlines.append(self.http_deadlines[0][0])
                timer = self.broker.next_timer()  # (epoch ms of the next scheduled message)
                if timer is not None and not self.broker.unfinished:  # (unfinished: the writers wake it)
                    deadlines.append(time.monotonic() + timer / 1000 - self.broker.clock())
                if self.backplane is not None and self.bridge_backlog:
                    deadlines.append(time.monotonic() + 0.05)  # try the bridge's ring again
                if self.idle_trim.due:
                    deadlines.append(self.idle_trim.due)
                timeout = max(min(deadlines) - time.monotonic(), 0) if deadlines else None
                ready = [fd for fd, _ in wait(-1 if timeout is None else timeout)]
            worked = ready is None or bool(ready)
            if ready is None or written in ready:
                self.progress()
            if self.store is not None:
                self.broker.release(self.store.finished())
                self.commit()  # deletes of messages the writers have sent
            if self.auth is not None:
                now = time.monotonic()
                for conn, user, delay in self.logins.results():
                    if conn in self.http_pending:
                        self.http_checked(conn, user, delay, now)
                    else:
                        self.broker.on_auth(conn, user, now, delay)
                        self.drain()
                self.commit()
            if self.backplane is not None and (self.from_bridge.used_bytes or (
                    ready is not None and self.from_bridge.data_fd in ready)):
                self.from_cluster()  # (else not: an empty eventfd's read raises, a cost per round)
            self.flush()  # receipts released by the store, replies to checked logins: out now
            if ready is None or self.signal_r in ready:
                self.signals()
            while running and ring.used_bytes:  # (no empty read to find the end)
                blob = ring.read(READ_BYTES, hold=True)  # kept in the ring while handled (poison.py)
                note[poison.BLOB] = len(blob)
                note[poison.WHAT] = poison.INPUT
                running = self.handle(blob, time.monotonic())
                note[poison.WHAT] = poison.IDLE
                ring.release()
                if self.backplane is not None and self.from_bridge.used_bytes:
                    self.from_cluster()  # other nodes' messages are not kept waiting by a busy input ring
                self.commit()
                self.flush()
                self.timers()  # (nor scheduled messages: a busy ring would keep them waiting past their time)
            now = time.monotonic()
            if worked:
                self.idle_trim.busy(now)
            if now >= self.next_tick:
                self.next_tick = now + self.tick
                self.broker.on_tick(now)
                self.drain()
                self.commit()
                self.flush()
            self.timers()
            if self.http_delayed and now >= self.http_delayed[0][0]:
                while self.http_delayed and now >= self.http_delayed[0][0]:
                    _, conn, response = heapq.heappop(self.http_delayed)
                    self.http_answer(conn, response)
                self.flush()
            if self.http_deadlines and now >= self.http_deadlines[0][0]:
                self.http_late(now)
                self.flush()
            if self.dump_channel is not None and now >= self.next_dump:
                self.next_dump = now + self.config.diag_interval / 1000
                self.dump()
            self.idle_trim.check(now)
        self.shut_down()

    def shut_down(self) -> None:
        """The last receipts, STOP to the writers, and their last counts before the store closes."""
        timeout = self.config.shutdown_timeout_ms / 1000
        if self.store is not None:
            self.commit()
            self.store.sync(timeout)  # everything on disk, then the last receipts go out
            self.broker.release(self.store.finished())
        for box in self.outboxes:
            box.add(R.STOP, 0)
        if self.backplane is not None:
            self.backplane.close_run()  # (this round's topic messages go before the STOP)
            self.backplane.out.add(C.STOP)
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
                self.drain()
            for conn, total in pair.iter_unpack(memoryview(report)[head.size:]):
                on_written(conn, total & ~R.WRITTEN_FINAL, bool(total & R.WRITTEN_FINAL))
                if self.broker.unfinished:  # (a final count returned deliveries to a queue)
                    self.drain()
            if flags & R.WRITTEN_LAST:
                self.writers_done.add(writer)

    def handle(self, blob: bytes, now: float) -> bool:
        broker = self.broker
        boxes = self.outboxes
        unpack = R.unpack_header
        note, at = self.note.slots, poison.RECORD
        refusals = self.refusals
        pos, end = 0, len(blob)
        current = 0
        while pos < end:
            length, kind, conn, aux, stamp = unpack(blob, pos)
            note[at] = pos
            start = pos + R.HEADER_SIZE
            stop = pos + length
            pos = stop
            if refusals is not None and self.refused(kind, conn, aux, blob, start, stop):
                continue
            if stamp != current:  # the frames of one read share a stamp
                current = stamp
                for box in boxes:
                    box.stamp = stamp
            try:
                if kind == R.FRAME:
                    split = start + aux
                    broker.on_frame(conn, blob[start:split], blob[split:stop], now)
                elif kind == R.FRAMES:
                    self.frames(blob, start, conn, aux, now)
                elif kind == R.OPEN:
                    broker.on_open(conn, aux & ~R.OPEN_TLS, blob[start:stop].decode(), now, bool(aux & R.OPEN_TLS))
                elif kind == R.PEER:
                    broker.on_peer(conn, blob[start:stop].decode())
                elif kind == R.STOMP:
                    broker.on_stomp(conn)
                elif kind == R.CLOSED:
                    broker.now = now  # unwritten deliveries are timed from here
                    if conn in self.http_pending:  # its login check goes with it
                        del self.http_pending[conn]
                        self.logins.cancel(conn)
                    broker.on_closed(conn)
                elif kind == R.ALIVE:
                    broker.on_alive(conn, now)
                elif kind == R.BAD_FRAME:
                    message, detail, receipt = blob[start:stop].decode(errors="replace").split("\0")
                    broker.on_bad_frame(conn, message, detail, None if receipt == "\x01" else receipt)
                elif kind in (R.HTTP, R.WS_OPEN, R.WS_REPLY, R.WS_CLOSE):
                    self.transport(kind, conn, blob[start:stop])
                elif kind == R.HTTP_REQUEST:
                    broker.on_http(conn)
                    self.http_request(conn, blob[start:stop], now)
                elif kind == R.SHUTDOWN:
                    return False
                elif kind == R.READER_START:
                    broker.now = now
                    broker.on_reader_start(R.CONN_ID.unpack_from(blob, start)[0])
            except Exception:
                # A bug must cost one connection, not every client's session (a dispatcher restart).
                log.exception("internal error on connection %d; closing it", conn)
                broker.on_internal_error(conn)
            if broker.unfinished:  # (only deliveries make output without bound, and they stop over the limit)
                self.drain(conn)
        for box in boxes:
            box.stamp = 0  # records made by timers are not stamped
        return True

    def frames(self, blob: bytes, start: int, conn: int, count: int, now: float) -> None:
        """The frames of one read (a FRAMES record), each fed as a FRAME record's would be."""
        broker = self.broker
        on_frame = broker.on_frame
        note, at = self.note.slots, poison.FRAME
        refusals = self.refusals
        sizes = R.frame_sizes(count).unpack_from(blob, start)
        pos = start + R.FRAME_SIZE * 2 * count
        for i in range(0, 2 * count, 2):
            split = pos + sizes[i]
            stop = split + sizes[i + 1]
            note[at] = i  # (twice the frame's index)
            try:
                if refusals is not None and refusals.frame(blob[pos:split], blob[split:stop]):
                    self.refuse(conn, blob[pos:split])
                else:
                    on_frame(conn, blob[pos:split], blob[split:stop], now)
            except Exception:
                log.exception("internal error on connection %d; closing it", conn)
                broker.on_internal_error(conn)
            pos = stop
            if broker.unfinished:
                self.drain(conn)

    def refused(self, kind: int, conn: int, aux: int, blob: bytes, start: int, stop: int) -> bool:
        """A quarantined input (it killed the dispatcher twice) gets its refusal instead of being handled."""
        if kind == R.FRAME:
            head = blob[start:start + aux]
            if self.refusals.frame(head, blob[start + aux:stop]):
                self.refuse(conn, head)
                return True
        elif kind == R.HTTP_REQUEST and self.refusals.request(blob[start:stop]):
            log.warning("refused a quarantined HTTP request on connection %d", conn)
            self.http_answer(conn, http.text_response(500, "Internal Server Error", "this request made the broker "
                                                      "fail twice; it is refused (see the broker's log)"))
            return True
        return False

    def refuse(self, conn: int, head: bytes) -> None:
        log.warning("refused a quarantined frame on connection %d", conn)
        receipt = next((line[8:].decode(errors="replace") for line in head.split(b"\n") if line.startswith(b"receipt:")),
                       None)
        self.broker.on_bad_frame(conn, "refused", "this frame made the broker fail twice; it is quarantined (see the "
                                 "broker's log)", receipt)

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

    # -- the console, API and metrics (console/http.py) ------------------------------------------------
    def http_request(self, conn: int, payload: bytes, now: float) -> None:
        method = target = "?"
        try:
            request = http.decode_request(payload)
            method, target = request.method, request.target
            self.http_route(conn, request, now)
        except Exception as exc:  # an HTTP client gets an HTTP answer, never a STOMP ERROR
            self.http_answer(conn, self.site.failed(method, target, exc))

    def http_route(self, conn: int, request, now: float) -> None:
        route, response = self.site.route(request.method, request.target)
        session = self.broker.sessions.get(conn)
        if session is None:
            return  # (gone already)
        if route == "action":  # refused before any login is checked: actions off, a forged request
            response = self.site.precheck(request, session.peer)
        if response is None and route != "static" and self.auth is not None and self.auth.required:
            credentials = http.basic_credentials(request.authorization)
            if credentials is None:
                response = http.unauthorized()
            else:
                # Checked off this thread in the same queue as CONNECTs (its back-offs, one check in
                # flight per address); the answer comes in http_checked, or http_late says why not.
                self.http_pending[conn] = (request, route)
                timeout = self.config.connect_timeout_ms / 1000
                if timeout:
                    heapq.heappush(self.http_deadlines, (session.opened + timeout, conn))
                self.logins.submit(conn, *credentials, session.address)
                return
        if response is None:
            response = self.site.respond(request.method, request.target, request.accept)
        self.http_answer(conn, response)

    def http_checked(self, conn: int, user: str | None, delay: float, now: float) -> None:
        request, route = self.http_pending.pop(conn)
        method, target = request.method, request.target
        session = self.broker.sessions.get(conn)
        if user is None:  # told after the login's back-off, as a refused CONNECT is
            heapq.heappush(self.http_delayed, (now + delay, conn, http.unauthorized("access refused")))
        elif route == "action":  # admins, or a manage grant (console/manage.py); answered once on disk
            if session is not None and not session.closing:
                response = self.site.act(self.broker, request, user, session.peer, now,
                                         lambda answer: self.http_answer(conn, answer, held=True))
                if response is not None:  # (None: the cluster answers it later, through the lambda)
                    self.http_answer(conn, response, held=True)
        elif not self.auth.is_admin(user):
            self.http_answer(conn, http.forbidden())
        elif route == "token":  # the page's STOMP passcode: the browser keeps Basic credentials to itself
            if session is not None:
                try:
                    passcode = self.auth.console.mint(user, session.address, now)
                    response = http.token_answer(user, passcode, self.auth.console.ttl)
                except Exception as exc:
                    response = self.site.failed(method, target, exc)
                self.http_answer(conn, response)
        else:
            self.http_answer(conn, self.site.respond(method, target, request.accept))

    def http_late(self, now: float) -> None:
        """HTTP logins not checked within connect_timeout_ms: 429 when a back-off held them, 503
        when they only waited their turn (never a STOMP ERROR: the client speaks HTTP)."""
        while self.http_deadlines and now >= self.http_deadlines[0][0]:
            _, conn = heapq.heappop(self.http_deadlines)
            if self.http_pending.pop(conn, None) is None:
                continue  # answered (or gone) meanwhile
            could_start = self.logins.cancel(conn)
            if could_start is not None and could_start > now:
                self.http_answer(conn, http.too_many_requests(could_start - now))
            else:  # (or being checked right now: its verdict is ignored)
                self.http_answer(conn, http.unavailable())

    def http_answer(self, conn: int, response: bytes, held: bool = False) -> None:
        """Every HTTP answer the dispatcher sends (the last guard's 500s aside: flush_one); ``held``:
        an action's, which waits for the store's commit of what it wrote (Broker.answer_http)."""
        session = self.broker.sessions.get(conn)
        if session is not None and not session.closing:
            self.site.answered(int(response[9:12]))
            if session.tls and self.config.hsts_max_age:  # browsers keep to https for this host
                response = with_header(response, "Strict-Transport-Security", f"max-age={self.config.hsts_max_age}")
            if held:
                self.broker.answer_http(session, response)
                return
            session.outbox.add(R.RAW, conn, response)
            self.broker.hang_up(session)

    def signals(self) -> None:
        try:
            received = os.read(self.signal_r, 64)
        except BlockingIOError:
            return
        if signal.SIGHUP in received and self.auth is not None:
            self.reload_users()

    def reload_users(self) -> None:
        """SIGHUP: read the passwd and ACL files again; keep the old ones if the new ones are bad."""
        try:
            users = load_users(self.config)
        except (OSError, passwd.PasswdError) as exc:
            auth_log.error("passwd reload failed, keeping the previous users: %s", exc)
            return
        self.auth.replace_users(users)
        auth_log.info("passwd reloaded: %d users", len(users))

    def timers(self) -> None:
        """Deliver the scheduled messages whose time has come (``Broker.next_timer``), if any."""
        timer = self.broker.next_timer()
        if timer is not None and timer <= self.broker.clock() * 1000 and not self.broker.unfinished:
            self.broker.on_timers(time.monotonic())
            self.drain()
            self.commit()
            self.flush()

    def commit(self) -> None:
        """End of a round: hand the store what the round wrote (group commit), without waiting."""
        if self.store is not None and (self.store.pending() or self.broker.need_commit):
            self.store.submit()
            self.broker.need_commit = False

    def dump(self) -> None:
        """Hand one statistics line to the supervisor, which writes the file: never wait for a disk."""
        try:
            self.dump_channel.send(orjson.dumps(self.statistics.snapshot()))
        except (BlockingIOError, OSError) as exc:
            dropped = self.statistics.dumps_dropped = self.statistics.dumps_dropped + 1
            if dropped in (1, 10, 100) or dropped % 1000 == 0:
                log.warning("statistics line dropped (%s); %d so far", exc, dropped)

    def drain(self, conn: int = 0) -> None:
        """Finish the event just fed: while a step of it is unfinished (stopped over an outbox's
        limit), hand the full outboxes to their rings (waiting for space) and resume it. No other
        event is fed meanwhile, so nothing changes under it and every connection keeps its order."""
        broker = self.broker
        while broker.unfinished:
            for box in self.outboxes:
                if len(box.buf) > box.limit:
                    self.flush_one(box)
            try:
                broker.resume()
            except Exception:
                log.exception("internal error on connection %d; closing it", conn)
                if conn:
                    broker.on_internal_error(conn)

    def flush(self) -> None:
        for box in self.outboxes:
            if box.count:
                self.flush_one(box)
        if self.backplane is not None:
            deepest = self.from_bridge.used_bytes  # (how far behind this node is: Backplane.behind)
            for ring in self.rings:
                if ring.used_bytes > deepest:
                    deepest = ring.used_bytes
            self.backplane.behind(deepest, self.broker.now)
            self.backplane.round_out(self.broker)  # topic packs, pulls the queues' consumers have room for
            if self.backplane.out.count or self.bridge_backlog:
                self.to_cluster()

    # -- cluster mode: the bridge's rings ----------------------------------------------------------
    def from_cluster(self) -> None:
        """Records from the bridge: messages from other nodes, interest, NATS status, answers."""
        ring = self.from_bridge
        ring.clear_wakeup()
        while True:
            blob = ring.read(READ_BYTES)
            if not blob:
                return
            on_record = self.backplane.on_record
            for kind, conn, aux, _, payload in C.iter_records(blob):
                on_record(self.broker, kind, conn, aux, payload, time.monotonic())
                if self.broker.unfinished:  # a fan-out stopped over an outbox's limit: finish it first
                    self.drain()
            self.flush()

    def to_cluster(self) -> None:
        """Hand the bridge its records without ever waiting for it: local traffic must not depend on
        the network. What its ring cannot take now waits here, in order (bounded: past it the
        oldest batches go, and what they held times out as unpublished)."""
        if self.backplane.out.count:
            self.bridge_backlog.append(self.backplane.out.take())
        ring = self.to_bridge
        sent = False
        while self.bridge_backlog:
            buf, count = self.bridge_backlog[0]
            if not ring.try_write(buf, count):
                break
            self.bridge_backlog.pop(0)
            sent = True
        if sent:
            ring.notify()
        if len(self.bridge_backlog) > 1024:
            del self.bridge_backlog[:len(self.bridge_backlog) - 1024]
            log.warning("cluster: the bridge is not taking records; older ones dropped")

    def flush_one(self, box: Outbox) -> None:
        buf, count = box.take()
        # A batch over the limit by one record (a record is at most a quarter of the ring, the limit
        # half of it) fits the ring; more (many replies at once, e.g. receipts released by the
        # store, or one record too big for the ring) is cut first.
        if len(buf) > box.limit + (box.limit >> 1):
            replaced: list[int] = []
            for piece, n in batches(buf, box.limit, self.rings[box.index].capacity, replaced):
                self.write(box.index, piece, n)
            for kind in replaced:
                if kind == R.RAW:  # an HTTP answer became a 500
                    self.site.answered(500)
        else:
            self.write(box.index, buf, count)

    def write(self, index: int, buf, count: int) -> None:
        ring = self.rings[index]
        while not ring.try_write(buf, count):
            ring.notify()
            ring.wait_for_space(0.05)
        ring.notify()


def batches(buf: bytearray, limit: int, capacity: int, replaced: list | None = None):
    """Cut a batch of records into batches of at most ``limit`` bytes plus one record, so each fits
    the ring (whose capacity is at least twice the limit). A record that could never fit the ring
    (every answer is bounded to a quarter of it: this is the last guard, not the rule) is replaced
    by an error to its connection and a close: it costs that requester its answer, never the
    dispatcher (an exception here would restart every process). The kind of each record replaced
    is appended to ``replaced``."""
    view = memoryview(buf)
    start = pos = count = 0
    end = len(buf)
    most = capacity - 64  # the ring's batch header, with room to spare
    while pos < end:
        length, kind, conn, _, stamp = R.unpack_header(buf, pos)
        if count and pos - start + length > most:  # (a record bigger than the usual quarter of the ring)
            yield bytes(view[start:pos]), count
            start, count = pos, 0
        if length > most:
            if replaced is not None:
                replaced.append(kind)
            yield too_large(kind, conn, length, stamp, most), 2
            pos += length
            start = pos
            continue
        pos += length
        count += 1
        if pos - start > limit or pos == end:
            yield bytes(view[start:pos]), count
            start, count = pos, 0


def too_large(kind: int, conn: int, size: int, stamp: int, most: int) -> bytes:
    """The records that stand for one too big for the ring: a STOMP ERROR (an HTTP 500 for a raw
    HTTP answer), then a close."""
    log.error("an answer of %d bytes for connection %d is larger than its output queue takes (%d): the "
              "connection gets an error instead", size, conn, most)
    if kind == R.RAW:
        reply = http.text_response(500, "Internal Server Error", "the answer is too large (see the broker's log)")
    else:
        reply = render_frame("ERROR", {"message": "answer too large", "content-type": "text/plain"},
                             f"the broker's answer of {size} bytes is larger than it can send at once".encode())
    return R.record(R.RAW if kind == R.RAW else R.DATA, conn, reply, 0, stamp) + R.record(R.CLOSE, conn)


def run(config, resources) -> None:
    common.become_child("dispatcher", config)
    resources.diag_channel[0].setblocking(False)
    Dispatcher(config, resources).run()
