"""Reader process: accepts every connection and reads every socket (one epoll loop).

It tells the protocols apart by the first bytes (reader_first_bytes.py), answers HTTP requests of
its own or passes them to the dispatcher (reader_http.py), splits the byte stream into STOMP frames
with the sans-IO parsers (reader_framing.py), and appends them as records to the shared-memory
input queue, one batch and one wake-up per loop. When the queue is full it stops reading, so TCP
pushes back on the clients: no frame is ever dropped. Every socket is passed to its writer right
after accept (reader_accept.py); the reader writes to a client only to refuse a connection over the
limit and, on TLS connections, to encrypt what their writer wrote into the connection's socket pair
(reader_tls.py).

This file is the process shell: the state, the loop, events to steps, the ring, the supervisor's
control messages. The steps are methods of mixins, so the per-frame path costs no more lookups than
in one class.
"""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import time

from ..ipc import control, records as R
from ..ipc.control import Control
from ..protocol import proxy
from ..protocol.hosts import HostPolicy
from . import common, undecided
from .poller import Poller
from .reader_accept import Accepting
from .reader_conns import PROXY, Conn
from .reader_first_bytes import FirstBytes
from .reader_framing import Framing
from .reader_http import HttpAnswers
from .reader_tls import TlsEnd, TlsLink, tls_context

log = logging.getLogger("stompbroker.reader")

FLUSH_AT = 256 * 1024       # bytes of records gathered before they are pushed mid-loop


class Reader(Accepting, TlsEnd, FirstBytes, HttpAnswers, Framing):
    """The reader process's state and its loop; the steps are the mixins' (one file per concern)."""

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
        self.next_writer = itertools.cycle(range(len(self.fd_socks)))  # (in step with ids: writer_of)
        # Connections whose answer and close are on their way -> bytes read and dropped since;
        # those no longer read at all (Poller.quiet) are in ``quieted``.
        self.dropping: dict[Conn, int] = {}
        self.quieted: set[Conn] = set()
        self.out = bytearray()
        self.count = 0
        self.pushed = False
        self.running = True
        self.allowed_paths = getattr(config, "ws_paths", None) or None
        self.allowed_origins = getattr(config, "ws_origins", None) or None
        # without ws_origins, a broker that checks logins opens WebSockets to its own pages only
        self.same_origin_only = config.auth_required
        self.hosts = HostPolicy.from_config(config)
        self.hsts = f"max-age={config.hsts_max_age}" if config.hsts_max_age else ""
        self.tls_listener = resources.tls_listener
        self.tls_context = tls_context(config) if self.tls_listener is not None else None
        self.alive_every = R.alive_every(config)
        self.proxies = proxy.TrustedProxies(config.proxy_trusted) if config.proxy_protocol else None
        # connections whose HTTP request (head, then body) is incomplete -> deadline: answered 408 at
        # half of connect_timeout_ms
        self.http_waiting: dict[Conn, float] = {}
        # connections whose request head came and whose body (Content-Length) is still arriving:
        # the head as its record starts, and the body's length
        self.http_bodies: dict[Conn, tuple[bytes, int]] = {}
        self.http_head_timeout = config.connect_timeout_ms / 2000
        # connections whose protocol is not known yet: the reader ends them at connect_timeout_ms
        # (the dispatcher's connect timeout is for those the reader said speak STOMP; undecided.py)
        self.undecided = undecided.Deadlines(config.connect_timeout_ms / 1000)
        self.partial = 0         # bytes of unfinished frames held for all connections
        self.trim_due = False    # big buffers were freed: give the memory back to the system
        self.closing_tls: set = set()  # TLS connections closing: dropped at their deadline
        self.next_trim = 0.0
        self.idle_trim = common.IdleTrim()

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
        self.ring.resume_producer()
        self.emit(R.READER_START, 0, R.CONN_ID.pack(self.first_id))  # ends whatever a dead reader left
        self.push()
        self.ring.notify()
        os.write(self.ready_fd, b"R")  # the supervisor announces the broker after this
        while self.running:
            self.round()
        self.emit(R.SHUTDOWN, 0)
        self.push()
        self.ring.notify()

    def round(self) -> None:
        """One wait and what follows it."""
        closing_tls = self.closing_tls
        undecided = self.undecided
        timeout = 0.25 if closing_tls or self.http_waiting else None
        if undecided.items:  # (its dict: no __bool__ call; made anew once empty, so read each time)
            timeout = max(min(timeout or 1.0, undecided.next_due - time.monotonic()), 0)
        if self.trim_due:
            timeout = max(min(timeout or 1.0, self.next_trim - time.monotonic()), 0)
        if self.idle_trim.due:
            trim = self.idle_trim.wait(time.monotonic())
            timeout = trim if timeout is None else min(timeout, trim)
        events = self.sel.select(timeout)
        now = time.monotonic()
        if events:
            self.idle_trim.busy(now)
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
        if undecided.items:
            self.expire_undecided(now)
        if closing_tls:
            for conn in [c for c in closing_tls if now > c.tls.deadline or c.fd < 0]:
                closing_tls.discard(conn)
                if conn.fd >= 0:
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
        self.idle_trim.check(now)

    def serve(self, what, mask: int, now: float, closing_tls: set) -> None:
        """One connection's event: bytes from its client, or (TLS) from its writer."""
        # A selector key's data is the Conn of a client socket, or the TlsLink of a TLS connection's
        # socket pair, whose readable side carries plaintext from the writer, to encrypt.
        from_writer = type(what) is TlsLink
        conn = what.conn if from_writer else what
        if conn.fd < 0:
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

    def on_control(self) -> None:
        for kind, argument in control.decode(os.read(self.control, control.READ_SIZE)):
            if kind is Control.STOP:
                self.stop()
            elif kind is Control.WRITER_RESTARTED:
                self.drop_writers_connections(argument)

    def stop(self) -> None:
        """Graceful shutdown: accept nothing more, read nothing more, tell the dispatcher."""
        self.running = False
        self.sel.unregister(self.listener)
        self.listener.close()


def run(config, resources) -> None:
    common.become_child("reader", config)
    common.tune_malloc_for_reader()
    Reader(config, resources).run()
