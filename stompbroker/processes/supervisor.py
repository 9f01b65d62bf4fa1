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
new connections meanwhile. It never gives up: a process dying again and again is restarted after a
back-off (restarts.py), and the others keep serving.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import os
import signal
import socket
import ssl
import time
from multiprocessing.connection import wait

import psutil
from setproctitle import setproctitle

from .. import __version__
from . import cluster, dispatcher, poison, reader, writer
from .restarts import Restarts
from ..diag.dump import DumpWriter
from ..ipc import control
from ..ipc.control import Control
from ..protocol.stomp import why_pure_python
from ..readiness import write_ready
from ..security import exposure, passwd
from ..store import sqlite as store
from .common import Resources, tune_malloc
from ..titles import title

log = logging.getLogger("stompbroker.supervisor")

READER_START_TIMEOUT = 30.0  # seconds; the dispatcher may take longer (it loads the store)


class StartError(Exception):
    """The broker cannot start; the message is one line naming what is wrong."""


def check_files(config) -> None:
    """Read, before forking, every file a child would read at start: a missing or malformed one
    stops the start with its name instead of a child's traceback."""
    wanted = []
    if config.auth == "passwd":
        wanted.append(("passwd_file", config.passwd_file))
    if config.acl_file:
        wanted.append(("acl_file", config.acl_file))
    if config.ssl_port:
        wanted += [("ssl_cert", config.ssl_cert), ("ssl_key", config.ssl_key)]
        if config.ssl_ca:
            wanted.append(("ssl_ca", config.ssl_ca))
    for name, path in wanted:
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise StartError(f"{name} {path}: {exc.strerror}") from None
    if config.auth == "passwd" or config.acl_file:
        try:
            passwd.load(config.passwd_file if config.auth == "passwd" else None, config.acl_file or None)
        except (OSError, ValueError) as exc:
            raise StartError(str(exc)) from None
    if config.ssl_port:
        try:
            reader.tls_context(config)
        except (ssl.SSLError, OSError) as exc:
            raise StartError(f"ssl_cert {config.ssl_cert} / ssl_key {config.ssl_key}: {exc}") from None
    if config.cluster and importlib.util.find_spec("nats") is None:
        raise StartError("cluster mode needs nats-py: pip install 'stompbroker[cluster]'")
    for name in ("ready_file",):
        path = getattr(config, name)
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.access(folder, os.W_OK):
            raise StartError(f"{name} {path}: cannot write in {folder}")


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) how the service is doing; nothing without $NOTIFY_SOCKET."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.warning("cannot notify systemd: %s", exc)


def open_listener(config, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, port))
    except OSError as exc:
        sock.close()
        raise StartError(f"cannot listen on {config.host}:{port}: {exc.strerror}") from None
    sock.listen(min(max(config.max_connections, 128), 65535))
    return sock


class Supervisor:
    def __init__(self, config):
        self.config = config
        tune_malloc()
        check_files(config)
        if config.store == "sqlite":  # refuse to start on a damaged store rather than lose messages
            count = store.check(config.store_path)
            log.info("store %s holds %d queued messages", config.store_path, count)
        self.ctx = multiprocessing.get_context("fork")
        self.listener = open_listener(config, config.port)
        self.port = self.listener.getsockname()[1]
        self.tls_listener = None
        if config.ssl_port:
            self.tls_listener = open_listener(config, config.ssl_port)
        self.resources = Resources(config, self.listener, self.tls_listener)
        self.children: dict[str, multiprocessing.Process] = {}
        # when each dead process is restarted (restarts.py): at once, or after a back-off
        self.restarts = Restarts(config.restart_budget, config.restart_delay_max_ms / 1000)
        self.pending: dict[str, float] = {}  # role -> when it is restarted (monotonic)
        self.deaths = poison.Deaths()  # the dispatcher's deaths per input; what is quarantined
        self.stats = {"dump_lines": 0, "dump_errors": 0, "dump_dropped": 0, "restarts": 0}
        self.signal_r, self.signal_w = os.pipe()
        self.stopping = None  # None, "graceful" or "fast"
        self.exit_code = 0  # 2: a child could not start
        self.ready_written = False
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
            self.resources.quarantine = dict(self.deaths.quarantine)  # (it inherits it at the fork)
            target, args = dispatcher.run, (self.config, self.resources)
        elif role == "cluster":
            target, args = cluster.run, (self.config, self.resources)
        else:
            index = int(role.split("-")[1])
            target, args = writer.run, (index, self.config, self.resources)
        proc = self.ctx.Process(target=target, args=args, name=role, daemon=False)
        proc.start()
        self.children[role] = proc
        log.info("started %s (pid %d)", role, proc.pid)

    def roles(self) -> list[str]:
        return (["dispatcher"] + [f"writer-{i}" for i in range(self.config.writers)]
                + (["cluster"] if self.config.cluster else []) + ["reader"])

    def start_all(self) -> bool:
        """Start every child; True once the reader accepts, False when a signal stopped the start.
        Raises StartError when a child dies or hangs while starting."""
        for role in self.roles():
            if role == "reader":
                # No connection is read before the dispatcher has loaded its state (the store).
                while True:
                    try:
                        if not self.wait_ready("dispatcher", self.resources.dispatcher_ready[0], None):
                            return False
                        break
                    except StartError:
                        if not self.died_loading():
                            raise
                        self.spawn("dispatcher")
            self.spawn(role)
        return self.wait_ready("reader", self.resources.reader_ready[0], READER_START_TIMEOUT)

    def died_loading(self) -> bool:
        """The dispatcher died while starting: True (start another) when it died loading a stored
        message, which goes to quarantine once it has killed two (so the start gets further each
        time), after the restart back-off."""
        if self.resources.dispatcher_note.slots[poison.WHAT] != poison.LOADING:
            return False
        self.deaths.died(self.resources.dispatcher_note, self.resources.input_ring)
        delay = self.restarts.died("dispatcher", time.monotonic())
        if delay:
            log.warning("the dispatcher died %d times in a row: starting it again in %.1f s",
                        self.restarts.streak("dispatcher"), delay)
            wait([self.signal_r], timeout=delay)  # (a signal ends the wait: the start loop sees it)
        return True

    def wait_ready(self, role: str, ready: int, timeout: float | None) -> bool:
        proc = self.children[role]
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.stopping is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise StartError(f"the {role} did not start within {timeout:.0f} s")
            readable = wait([ready, proc.sentinel, self.signal_r], timeout=left)
            if ready in readable:
                os.read(ready, 16)
                return True
            if proc.sentinel in readable:
                proc.join()
                raise StartError(f"the {role} exited with status {proc.exitcode} while starting (see the log above)")
            if self.signal_r in readable:
                os.read(self.signal_r, 512)
        return False

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
        self.stats["restarts"] += 1
        self.resources.supervisor_stats.update(self.stats)
        if role == "dispatcher":  # what was it handling? An input that killed it twice is quarantined
            self.deaths.died(self.resources.dispatcher_note, self.resources.input_ring)
            log.error("restarting every process (the dispatcher holds shared state); open connections are closed")
            self.kill_all()  # (at once: clients learn now, not after the back-off)
            self.pending.clear()  # (every process starts with it)
        else:
            del self.children[role]
        delay = self.restarts.died(role, time.monotonic())
        if delay:
            log.warning("%s died %d times in a row, each within %.0f s of its restart: restarting it in %.1f s "
                        "(the others keep serving)", role, self.restarts.streak(role), self.restarts.window, delay)
            self.pending[role] = time.monotonic() + delay
        else:
            self.restart(role)

    def restart(self, role: str) -> None:
        if role == "cluster":
            # The bridge holds no broker state: a new one re-reads the interest bucket, takes the
            # dispatcher's records where the dead one stopped, and the dispatcher re-declares its interest.
            self.spawn(role)
        elif role.startswith("writer-"):
            # The new writer takes over the same ring and fd channel (the reader and dispatcher
            # hold the other ends); records and fds meant for the dead one are for connections the
            # reader now closes, and are dropped as those closes come through.
            self.spawn(role)
            index = int(role.split("-")[1])
            os.write(self.resources.reader_control[1], control.encode(Control.WRITER_RESTARTED, index))
        elif role == "reader":
            # The input ring stays: its published batches are whole (the tail moves after the bytes),
            # the new reader appends after them and announces itself, so the dispatcher ends the
            # dead reader's sessions in order. Everything the dispatcher holds is kept.
            log.warning("restarting the reader; its connections are closed, queued messages are kept")
            self.resources.reader_stats.reset()
            pipe = self.resources.reader_control[0]
            os.set_blocking(pipe, False)
            try:  # what the dead reader did not read is about its connections, all closed now
                os.read(pipe, control.READ_SIZE * 128)
            except BlockingIOError:
                pass
            os.set_blocking(pipe, True)
            self.spawn("reader")
        else:  # the dispatcher (the others were killed when it died)
            self.resources.reset()
            if not self.start_all():
                self.stopping = self.stopping or "fast"

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
        setproctitle(title("supervisor", f"port={self.port}"))
        self.install_signals()
        log.info("stompbroker %s starting on %s:%d with %d writer(s)", __version__, self.config.host,
                 self.port, self.config.writers)
        log.info("settings: %s", self.config.describe())
        why = why_pure_python()
        if why is not None:
            log.warning("STOMP frames are split, heads decoded and messages rendered in pure Python, up to half "
                        "more CPU per SEND: %s", why)
        log.debug("all settings: %s", self.config.describe(every=True))
        for warning in exposure.warnings(self.config, self.port):
            log.warning(warning)
        try:
            if self.start_all():
                self.announce()
            else:
                self.stopping = "fast"  # a signal during the start: nothing to flush yet
            while self.stopping is None:
                self.watch()
        except StartError as exc:
            log.critical("cannot start: %s", exc)
            self.stopping = "fast"
            self.exit_code = 2
        return self.stop()

    def announce(self) -> None:
        """The broker serves: say so (the log line tools scrape, the ready file, systemd)."""
        host, port = self.config.host, self.port
        tls_port = self.tls_listener.getsockname()[1] if self.tls_listener is not None else 0
        if tls_port:
            log.info("TLS (STOMP and wss) on %s:%d", host, tls_port)
        line = f"stompbroker listening on {host}:{port}"
        if self.config.log_format == "json":
            log.info(line)
        else:
            print(line, flush=True)
        if self.config.ready_file:
            record = {"host": host, "port": port, "ssl_port": tls_port, "pid": os.getpid(),
                      "version": __version__, "ts": round(time.time(), 3)}
            try:
                write_ready(self.config.ready_file, record)
                self.ready_written = True
            except OSError as exc:  # the broker serves all the same; say why the file is missing
                log.error("cannot write ready_file %s: %s", self.config.ready_file, exc)
        sd_notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=listening on {host}:{port}")

    def watch(self) -> None:
        """One wait: a signal, a statistics line to write, or a child that died."""
        sentinels = {proc.sentinel: role for role, proc in self.children.items()}
        timeout = max(min(self.pending.values()) - time.monotonic(), 0.0) if self.pending else None
        ready = wait(list(sentinels) + [self.signal_r, self.diag_in], timeout=timeout)
        if self.signal_r in ready:
            os.read(self.signal_r, 512)
            if os.getpid() == 1:
                self.reap_orphans()
        if self.diag_in in ready:
            self.write_dump()
        for fd in ready:
            role = sentinels.get(fd)
            if role is not None and self.stopping is None:
                proc = self.children.get(role)
                if proc is None or proc.sentinel != fd:  # (killed with the dispatcher, which died too)
                    continue
                proc.join()
                self.on_death(role, proc)
        now = time.monotonic()
        for role in [r for r, when in self.pending.items() if when <= now]:
            del self.pending[role]
            if self.stopping is None:
                self.restart(role)

    def reap_orphans(self) -> None:
        """As PID 1 (a container) every orphan of the namespace becomes our child: reap the ones
        that are not ours, so they do not stay zombies (ours are joined by multiprocessing)."""
        ours = {proc.pid for proc in self.children.values()}
        for child in psutil.Process().children():
            try:
                if child.pid not in ours and child.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(child.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError):
                pass

    def stop(self) -> int:
        sd_notify("STOPPING=1")
        if self.ready_written:
            try:
                os.unlink(self.config.ready_file)
            except OSError:
                pass
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
        return self.exit_code

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
        os.write(self.resources.reader_control[1], control.encode(Control.STOP))
        deadline = time.monotonic() + self.config.shutdown_timeout_ms / 1000 + 5
        for role in self.roles()[::-1]:  # reader first, then dispatcher, then writers
            proc = self.children.get(role)
            if proc is None:  # dead, its restart still waiting
                continue
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
    except StartError as exc:
        log.critical("cannot start: %s", exc)
        return 2
    except (ssl.SSLError, OSError) as exc:
        log.critical("cannot start: %s", exc)
        return 2
    return supervisor.run()
