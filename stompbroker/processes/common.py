"""What every broker process shares: the resources made by the supervisor, and child start-up."""

from __future__ import annotations

import contextlib
import ctypes
from array import array
import gc
import logging
import os
import signal
import socket
import sys
from setproctitle import setproctitle

from ..diag import latency
from ..ipc.ring import Ring, anonymous_segment
from .poison import Note
from ..titles import title

log = logging.getLogger("stompbroker")

WRITER_STATS = ("connections", "frames", "bytes", "batches", "fill", "slow_consumers", "pending_bytes")
READER_STATS = ("connections", "accepted", "refused", "frames_in", "bytes_in", "bad_frames", "stalls",
                "websockets", "ws_allocated", "ws_hits", "ws_misses", "http_errors")
SUPERVISOR_STATS = ("dump_lines", "dump_errors", "dump_dropped", "restarts")

# Set when the supervisor makes the Resources, before any fork: a child compares its parent with
# it (the supervisor may be PID 1, in a container).
_supervisor_pid = 0


class SharedStats:
    """Named float64 counters in shared memory: one process writes them, any process reads them."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        self._index = {name: i for i, name in enumerate(names)}
        self._shm = anonymous_segment(8 * len(names))
        self._values = self._shm.buf.cast("d")

    def update(self, values: dict) -> None:
        """Write the counters: in one copy when ``values`` has every name (the processes' loops,
        once per round), else name by name."""
        if len(values) == len(self.names):
            try:
                self._values[:] = array("d", map(values.__getitem__, self.names))
                return
            except KeyError:
                pass
        index, store = self._index, self._values
        for name, value in values.items():
            store[index[name]] = value

    def read(self) -> dict:
        return {name: self._values[i] for i, name in enumerate(self.names)}

    def reset(self) -> None:
        for i in range(len(self.names)):
            self._values[i] = 0.0

    def close(self) -> None:
        self._values.release()
        self._shm.close()


class SharedHistogram:
    """A latency histogram one process publishes per interval and others read whole (a seqlock)."""

    def __init__(self, buckets: int):
        self.buckets = buckets
        self._shm = anonymous_segment(8 * (buckets + 2))
        self._values = self._shm.buf.cast("d")  # [sequence, published at (monotonic), counts...]

    def publish(self, counts: list, now: float) -> None:
        values = self._values
        values[0] += 1  # odd: being written
        for i, n in enumerate(counts):
            values[i + 2] = n
        values[1] = now
        values[0] += 1

    def read(self, max_age: float, now: float) -> list:
        """The last published counts, or zeros when they are older than max_age seconds."""
        values = self._values
        for _ in range(100):
            seq = values[0]
            if seq % 2:
                continue
            counts = list(values[2:])
            published = values[1]
            if values[0] == seq:
                return counts if now - published <= max_age else [0.0] * self.buckets
        return [0.0] * self.buckets

    def close(self) -> None:
        self._values.release()
        self._shm.close()


class Resources:
    """Made once by the supervisor before any child is forked, so every child inherits them."""

    def __init__(self, config, listener: socket.socket, tls_listener: socket.socket | None = None):
        global _supervisor_pid
        _supervisor_pid = os.getpid()
        self.listener = listener
        self.tls_listener = tls_listener
        input_bytes, output_bytes = config.ring_bytes  # big enough for a few maximum-size frames in flight
        self.input_ring = Ring(input_bytes, config.max_input_queue_size)
        self.output_rings = [Ring(output_bytes) for _ in range(config.writers)]
        self.fd_pairs = [self._fd_pair() for _ in range(config.writers)]
        self.written_channel = self._written_pair()  # writers -> dispatcher: deliveries sent
        self.reader_generation = 0  # set by the supervisor before each reader start: unique connection ids
        self.reader_control = os.pipe()  # supervisor -> reader: ipc/control.py messages (a writer restarted, stop)
        self.dispatcher_ready = os.pipe()  # dispatcher -> supervisor: state loaded, start reading
        self.reader_ready = os.pipe()  # reader -> supervisor: accepting; the broker serves
        self.reader_stats = SharedStats(READER_STATS)
        self.writer_stats = [SharedStats(WRITER_STATS) for _ in range(config.writers)]
        self.writer_latency = [SharedHistogram(latency.BUCKETS) for _ in range(config.writers)]
        self.supervisor_stats = SharedStats(SUPERVISOR_STATS)
        self.dispatcher_note = Note()  # what the dispatcher is handling, for the supervisor if it dies (poison.py)
        self.quarantine: dict = {}     # inputs that killed it twice, set by the supervisor before forking it
        # cluster mode: dispatcher -> bridge and bridge -> dispatcher (cluster/records.py)
        self.bridge_rings = [Ring(output_bytes) for _ in range(2)] if config.cluster else []
        self.diag_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # dispatcher -> dump file
        for sock in self.diag_channel:  # room for a few large lines (many queues) before one is dropped
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)

    @staticmethod
    def _written_pair():
        pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in pair:  # room for many reports while the dispatcher is busy with a long round
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        return pair

    @staticmethod
    def _fd_pair():
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def close(self) -> None:
        for ring in [self.input_ring, *self.output_rings, *self.bridge_rings]:
            ring.close()
        for stats in [self.reader_stats, *self.writer_stats, *self.writer_latency, self.supervisor_stats,
                      self.dispatcher_note]:
            stats.close()

    def reset(self) -> None:
        self.dispatcher_note.idle()
        self.input_ring.reset()
        for ring in [*self.output_rings, *self.bridge_rings]:
            ring.reset()
        for i, pair in enumerate(self.fd_pairs):  # drop fds queued for the dead generation
            for sock in pair:
                sock.close()
            self.fd_pairs[i] = self._fd_pair()
        for sock in self.written_channel:  # and reports about them
            sock.close()
        self.written_channel = self._written_pair()
        self.reader_stats.reset()
        for stats in self.writer_stats:
            stats.reset()
        for ready in (self.reader_ready[0], self.dispatcher_ready[0]):
            drain(ready)  # a reader restarted alone said "ready" to nobody: not this generation's


@contextlib.contextmanager
def socket_of(fd: int):
    """A socket object over ``fd`` for a rare call (an option, the peer's address, a shutdown); the fd
    stays open and is not the object's."""
    sock = socket.socket(fileno=fd)
    try:
        yield sock
    finally:
        sock.detach()


def shutdown(fd: int, how: int) -> None:
    """shutdown(2) on a connection's bare fd; one closed here already (-1) or by its peer is left be."""
    if fd < 0:
        return
    try:
        with socket_of(fd) as sock:
            sock.shutdown(how)
    except OSError:
        pass


def drain(fd: int) -> None:
    """Read and drop whatever a pipe holds, without blocking."""
    os.set_blocking(fd, False)
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)


_PR_SET_PDEATHSIG = 1
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def tune_malloc() -> None:
    """Keep large buffers on the heap instead of fresh mmaps: the dispatcher and writers build
    multi-megabyte batches every round, and page-faulting new mappings in each time cost ~30%
    of fan-out throughput (measured). Set in the supervisor; forked children inherit it."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 64 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 128 << 20)
        libc.mallopt(_M_TOP_PAD, 16 << 20)
    except (OSError, AttributeError):
        pass


def tune_malloc_for_reader() -> None:
    """The reader holds clients' unfinished frames, which grow a read at a time and vanish when a
    connection goes. Big ones live in their own mappings here: growing one is an mremap, not a copy
    (the heap copied each 4 MB frame ~8 times as it grew), and freeing one gives it back at once."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 8 << 20)
    except (OSError, AttributeError):
        pass


def trim_memory() -> None:
    """Give freed heap memory back to the system (tune_malloc keeps up to 128 MB of it otherwise)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class IdleTrim:
    """Freed heap given back to the system once a process has been idle for ``IDLE`` seconds after
    some work (a connect storm, a burst of messages): tune_malloc keeps up to 128 MB of it, which a
    busy process reuses and an idle one only holds (10,000 connections opened 800 at a time left
    30-70 B per connection in each process). Once per idle spell, never while busy: a loop calls
    ``busy`` when it had something to do, ``check`` at its end, and wakes by ``wait``."""

    __slots__ = ("due",)
    IDLE = 1.0

    def __init__(self):
        self.due = 0.0   # when to trim (0: nothing done since the last trim)

    def busy(self, now: float) -> None:
        self.due = now + self.IDLE

    def wait(self, now: float) -> float | None:
        """Seconds until the trim is due (None: none is)."""
        return max(self.due - now, 0.0) if self.due else None

    def check(self, now: float) -> bool:
        if not self.due or now < self.due:
            return False
        self.due = 0.0
        trim_memory()
        return True


def become_child(role: str, config) -> None:
    """Start-up common to every child: name, signals, die with the supervisor, logging."""
    # What the child inherited from the supervisor is never collected here: a full collection
    # would otherwise walk (write to) every inherited object and copy the pages it shares with
    # the supervisor (megabytes, in each child, as soon as it makes objects: connections).
    gc.freeze()
    setproctitle(title(role))
    # The supervisor handles SIGINT and SIGTERM for everyone and tells each child what to do.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != _supervisor_pid:
        sys.exit(0)  # the supervisor died while this child was starting
    logging.getLogger().setLevel(config.log_level.upper())
