"""Supervisor: starts the reader, the dispatcher and the writers, watches them, and restarts them.

Signals are handled here only (children ignore SIGINT and SIGTERM):
- SIGTERM: graceful. The reader stops accepting and reading and tells the dispatcher, which passes
  everything on and tells the writers to flush; the supervisor waits for them, then exits 0.
- SIGINT: fast. Children are killed at once.
A writer that dies is restarted alone (its connections are closed; clients reconnect), and so is the
reader: the new one tells the dispatcher, which ends every session of the dead one (their unwritten
and unacknowledged queue messages go back to their queues) and has the writers cut those sockets;
queues, durable subscriptions and the memory store are kept. The dispatcher holds all broker state,
so if it dies the whole set is restarted (with store=memory its queued messages are lost; with
store=sqlite everything receipted is recovered); the listening socket, held here, keeps queueing
new connections meanwhile.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import ssl
import time
from multiprocessing.connection import wait

from setproctitle import setproctitle

from .. import __version__
from . import dispatcher, reader, writer
from ..diag.dump import DumpWriter
from ..store import sqlite as store
from .common import Resources, tune_malloc

log = logging.getLogger("stompbroker.supervisor")

RESTART_WINDOW = 10.0   # seconds
RESTART_LIMIT = 10      # restarts within the window before the supervisor gives up


def open_listener(config, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, port))
    sock.listen(min(max(config.max_connections, 128), 65535))
    return sock


class Supervisor:
    def __init__(self, config):
        self.config = config
        tune_malloc()
        if config.store == "sqlite":  # refuse to start on a damaged store rather than lose messages
            count = store.check(config.store_path)
            log.info("store %s holds %d queued messages", config.store_path, count)
        self.ctx = multiprocessing.get_context("fork")
        self.listener = open_listener(config, config.port)
        self.port = self.listener.getsockname()[1]
        self.tls_listener = None
        if config.ssl_port:
            reader.tls_context(config)  # a bad certificate or key stops the start here, clearly
            self.tls_listener = open_listener(config, config.ssl_port)
        self.resources = Resources(config, self.listener, self.tls_listener)
        self.children: dict[str, multiprocessing.Process] = {}
        self.restarts: list[float] = []
        self.stats = {"dump_lines": 0, "dump_errors": 0, "dump_dropped": 0, "restarts": 0}
        self.signal_r, self.signal_w = os.pipe()
        self.stopping = None  # None, "graceful" or "fast"
        self.dump = DumpWriter(config.diag_dump, config.diag_dump_max_bytes, config.diag_dump_backups) \
            if config.diag_dump else None
        self.diag_in = self.resources.diag_channel[1]
        self.diag_in.setblocking(False)

    # -- children ------------------------------------------------------------------------------
    def spawn(self, role: str) -> None:
        if role == "reader":
            self.resources.reader_generation += 1  # the child sees it: connection ids never repeat
            target, args = reader.run, (self.config, self.resources)
        elif role == "dispatcher":
            target, args = dispatcher.run, (self.config, self.resources)
        else:
            index = int(role.split("-")[1])
            target, args = writer.run, (index, self.config, self.resources)
        proc = self.ctx.Process(target=target, args=args, name=role, daemon=False)
        proc.start()
        self.children[role] = proc
        log.info("started %s (pid %d)", role, proc.pid)

    def roles(self) -> list[str]:
        return ["dispatcher"] + [f"writer-{i}" for i in range(self.config.writers)] + ["reader"]

    def start_all(self) -> None:
        for role in self.roles():
            if role == "reader":
                self.wait_for_dispatcher()
            self.spawn(role)

    def wait_for_dispatcher(self) -> None:
        """No connection is read before the dispatcher has loaded its state (the durable store)."""
        ready = self.resources.dispatcher_ready[0]
        dispatcher = self.children["dispatcher"]
        while True:
            readable = wait([ready, dispatcher.sentinel], timeout=60)
            if ready in readable:
                os.read(ready, 16)
                return
            if dispatcher.sentinel in readable or not readable:
                raise SystemExit("the dispatcher did not start (see the log above)")

    def kill_all(self) -> None:
        for proc in self.children.values():
            if proc.is_alive():
                proc.kill()
        for proc in self.children.values():
            proc.join(5)
        self.children.clear()

    def on_death(self, role: str, proc) -> None:
        code = proc.exitcode
        why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        log.error("%s (pid %d) %s", role, proc.pid, why)
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW] + [now]
        self.stats["restarts"] += 1
        self.resources.supervisor_stats.update(self.stats)
        if len(self.restarts) > RESTART_LIMIT:
            log.critical("%d restarts within %.0f s: giving up", len(self.restarts), RESTART_WINDOW)
            self.stopping = "fast"
            return
        if role.startswith("writer-"):
            # The new writer takes over the same ring and fd channel (the reader and dispatcher
            # hold the other ends); records and fds meant for the dead one are for connections the
            # reader now closes, and are dropped as those closes come through.
            self.spawn(role)
            os.write(self.resources.reader_control[1], f"writer-restarted:{role.split('-')[1]}\n".encode())
        elif role == "reader" and self.children["dispatcher"].is_alive():
            # The input ring stays: its published batches are whole (the tail moves after the bytes),
            # the new reader appends after them and announces itself, so the dispatcher ends the
            # dead reader's sessions in order. Everything the dispatcher holds is kept.
            log.warning("restarting the reader; its connections are closed, queued messages are kept")
            self.resources.reader_stats.reset()
            control = self.resources.reader_control[0]
            os.set_blocking(control, False)
            try:  # what the dead reader did not read is about its connections, all closed now
                os.read(control, 1 << 16)
            except BlockingIOError:
                pass
            os.set_blocking(control, True)
            self.spawn("reader")
        else:
            log.error("restarting every process (the %s holds shared state); open connections are closed", role)
            self.kill_all()
            self.resources.reset()
            self.start_all()

    # -- signals -------------------------------------------------------------------------------
    def install_signals(self) -> None:
        os.set_blocking(self.signal_w, False)
        signal.set_wakeup_fd(self.signal_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, self._note_signal)

    def _note_signal(self, signum, frame) -> None:
        if signum == signal.SIGTERM and self.stopping is None:
            self.stopping = "graceful"
        elif signum == signal.SIGINT:
            self.stopping = "fast"
        elif signum == signal.SIGHUP:  # reload: the dispatcher re-reads the passwd file
            dispatcher = self.children.get("dispatcher")
            if dispatcher is not None and dispatcher.pid:
                os.kill(dispatcher.pid, signal.SIGHUP)

    # -- main loop -----------------------------------------------------------------------------
    def run(self) -> int:
        setproctitle(f"stompbroker: supervisor port={self.port}")
        self.install_signals()
        log.info("stompbroker %s listening on %s:%d with %d writer(s)", __version__, self.config.host,
                 self.port, self.config.writers)
        log.info("settings: %s", self.config.describe())
        self.start_all()
        if self.tls_listener is not None:
            log.info("TLS (STOMP and wss) on %s:%d", self.config.host, self.tls_listener.getsockname()[1])
        print(f"stompbroker listening on {self.config.host}:{self.port}", flush=True)
        while self.stopping is None:
            sentinels = {proc.sentinel: role for role, proc in self.children.items()}
            ready = wait(list(sentinels) + [self.signal_r, self.diag_in])
            if self.signal_r in ready:
                os.read(self.signal_r, 512)
            if self.diag_in in ready:
                self.write_dump()
            for fd in ready:
                role = sentinels.get(fd)
                if role is not None and self.stopping is None:
                    proc = self.children[role]
                    proc.join()
                    self.on_death(role, proc)
        if self.stopping == "graceful":
            self.graceful()
        else:
            log.info("fast shutdown")
            self.kill_all()
        self.listener.close()
        self.write_dump()
        if self.dump is not None:
            self.dump.close()
        self.resources.close()
        log.info("stopped")
        return 0

    def write_dump(self) -> None:
        while True:
            try:
                line = self.diag_in.recv(1 << 22)
            except (BlockingIOError, InterruptedError):
                break
            if self.dump is not None and line:
                self.dump.write(line)
        if self.dump is not None:
            self.stats["dump_lines"], self.stats["dump_errors"] = self.dump.lines, self.dump.errors
            self.resources.supervisor_stats.update(self.stats)

    def graceful(self) -> None:
        log.info("graceful shutdown: no new connections, flushing writers")
        os.write(self.resources.reader_control[1], b"stop\n")
        deadline = time.monotonic() + self.config.shutdown_timeout_ms / 1000 + 5
        for role in self.roles()[::-1]:  # reader first, then dispatcher, then writers
            proc = self.children[role]
            proc.join(max(deadline - time.monotonic(), 0.1))
            if proc.is_alive():
                log.warning("%s did not stop in time, killing it", role)
                proc.kill()
                proc.join(1)


def run(config) -> int:
    try:
        supervisor = Supervisor(config)
    except store.StoreError as exc:
        log.critical("%s; not starting. 'stompbroker-store check|export|repair %s' can help.", exc,
                     config.store_path)
        return 2
    except (ssl.SSLError, OSError) as exc:
        log.critical("cannot start: %s", exc)
        return 2
    return supervisor.run()
