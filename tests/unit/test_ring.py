"""The shared-memory ring (ipc/ring.py): batches, limits, wrap-around, and whole reads under a concurrent writer."""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
import time
import zlib

import pytest

from stompbroker.ipc import records as R
from stompbroker.ipc import ring as ring_mod
from stompbroker.ipc.ring import Ring, RingFull

HEAD = 8  # bytes of a batch header (blob length, record count)


@pytest.fixture
def make_ring():
    rings = []

    def make(capacity, max_records=1 << 62, rewind_at=ring_mod.REWIND_AT):
        r = Ring(capacity, max_records, rewind_at)
        rings.append(r)
        return r

    yield make
    for r in rings:
        r.close()


def blob(n: int, fill: int) -> bytes:
    return bytes([fill % 251]) * n


# -- single process ------------------------------------------------------------------------------
def test_empty_ring_reads_nothing(make_ring):
    r = make_ring(64)
    assert r.read() == b""
    assert (r.used_bytes, r.pending_records) == (0, 0)
    assert r.try_write(b"abc", 1)
    assert r.read() == b"abc"
    assert r.read() == b""  # read once, gone
    assert (r.used_bytes, r.pending_records) == (0, 0)


def test_batches_come_out_whole_and_in_order(make_ring):
    r = make_ring(1024)
    for i in range(5):
        assert r.try_write(blob(10 + i, i), 2)
    assert r.pending_records == 10
    assert r.used_bytes == sum(10 + i + HEAD for i in range(5))
    assert r.read() == b"".join(blob(10 + i, i) for i in range(5))
    assert r.pending_records == 0


def test_read_stops_at_max_bytes_but_takes_at_least_one_batch(make_ring):
    r = make_ring(1024)
    for i in range(3):
        assert r.try_write(blob(100, i), 1)
    assert r.read(max_bytes=10) == blob(100, 0)          # one batch even though it is larger
    assert r.read(max_bytes=250) == blob(100, 1) + blob(100, 2)
    assert r.read() == b""


def test_full_by_bytes(make_ring):
    r = make_ring(64)
    assert r.try_write(blob(64 - HEAD - 20, 1), 1)        # 20 bytes left
    assert not r.try_write(blob(20 - HEAD + 1, 2), 1)     # one byte too many: refused, nothing written
    assert r.try_write(blob(20 - HEAD, 3), 1)             # exactly the space left
    assert r.used_bytes == 64
    assert not r.try_write(b"", 1)                        # even an empty batch needs its header
    assert r.read() == blob(36, 1) + blob(12, 3)
    assert r.try_write(blob(64 - HEAD, 4), 1)             # all the space is back
    assert r.read() == blob(56, 4)


def test_batch_larger_than_the_ring_raises(make_ring):
    r = make_ring(64)
    with pytest.raises(RingFull):
        r.try_write(blob(64 - HEAD + 1, 0), 1)
    assert r.used_bytes == 0


def test_full_by_record_count(make_ring):
    r = make_ring(4096, max_records=5)
    assert r.try_write(b"a", 3)
    assert r.try_write(b"b", 2)                           # exactly the limit
    assert not r.try_write(b"c", 1)
    assert r.pending_records == 5
    assert r.read(max_bytes=1) == b"a"                    # frees 3 records
    assert not r.try_write(b"d", 4)
    assert r.try_write(b"d", 3)
    assert r.read() == b"bd"
    assert r.pending_records == 0


def test_one_batch_over_the_record_limit_passes_when_the_ring_is_empty(make_ring):
    # Otherwise a batch of more than max_records records could never be written at all.
    r = make_ring(4096, max_records=5)
    assert r.try_write(b"big", 8)
    assert not r.try_write(b"x", 1)
    assert r.read() == b"big"
    assert r.try_write(b"x", 1)


@pytest.mark.parametrize("split", range(0, HEAD + 3))
def test_wrap_around_at_every_offset(make_ring, split):
    """A batch whose header or body straddles the end of the data area comes out intact."""
    cap = 64
    r = make_ring(cap)
    first = cap - split                    # the second batch starts `split` bytes before the end
    assert r.try_write(blob(first - HEAD, 7), 1)
    assert r.read() == blob(first - HEAD, 7)
    data = bytes(range(40))
    assert r.try_write(data, 1)
    assert r.used_bytes == len(data) + HEAD
    assert r.read() == data
    assert r.used_bytes == 0


def test_batch_exactly_filling_the_end(make_ring):
    cap = 64
    r = make_ring(cap)
    assert r.try_write(blob(20, 1), 1)
    assert r.read() == blob(20, 1)
    end = cap - (20 + HEAD) - HEAD          # this batch ends exactly at the last byte
    assert r.try_write(blob(end, 2), 1)
    assert r.try_write(blob(10, 3), 1)     # starts at offset 0
    assert r.read() == blob(end, 2) + blob(10, 3)
    assert r.try_write(blob(cap - HEAD, 4), 1)  # and a whole-ring batch from an odd position
    assert r.read() == blob(cap - HEAD, 4)


@pytest.mark.parametrize("rewind_at", [1 << 20, 30])
def test_many_laps_of_a_small_ring(make_ring, rewind_at):
    """Random writes and reads: each read is whole batches, oldest first, at most max_bytes unless one
    (with and without going back to the front when empty)."""
    r = make_ring(100, rewind_at=rewind_at)
    rnd = random.Random(5)
    queued: list[bytes] = []
    for i in range(5000):
        data = bytes([i % 256]) + rnd.randbytes(rnd.randrange(0, 60))
        if r.try_write(data, 1):
            queued.append(data)
        else:
            assert r.used_bytes + len(data) + HEAD > 100
        if rnd.random() < 0.4:
            limit = rnd.randrange(1, 150)
            out = r.read(max_bytes=limit)
            k, taken = 0, b""
            while len(taken) < len(out):
                taken += queued[k]
                k += 1
            assert taken == out and (k == 1 or len(out) <= limit) and (out or not queued)
            del queued[:k]
        assert r.pending_records == len(queued)
    assert r.read() == b"".join(queued)
    assert r.used_bytes == 0 and r.pending_records == 0


def test_an_empty_ring_starts_again_at_the_front(make_ring):
    """Past rewind_at, a write into the empty ring goes to offset 0 (a skip header covers the rest
    of the lap): the pages touched are those of the deepest backlog, not the whole ring."""
    r = make_ring(1024, rewind_at=100)
    assert r.try_write(blob(92, 1), 1) and r.read() == blob(92, 1)     # tail at 100
    assert r.try_write(blob(30, 2), 2)
    assert r._ctl[ring_mod.TAIL] == 1024 + HEAD + 30                   # skipped to the front
    assert r.used_bytes == 1024 - 100 + HEAD + 30 and r.pending_records == 2
    assert r.try_write(blob(10, 3), 1)                                 # not empty: straight on
    assert r.peek(1 << 10) == blob(30, 2) + blob(10, 3)
    assert r.read(30) == blob(30, 2)                                   # the skip is no batch
    assert r.read() == blob(10, 3) and (r.used_bytes, r.pending_records) == (0, 0)
    for i in range(1000):                                              # many batches, few bytes touched
        assert r.try_write(blob(50, i), 1) and r.read() == blob(50, i)
        assert r._ctl[ring_mod.TAIL] % 1024 <= 100 + HEAD + 50


def test_no_rewind_that_would_not_fit(make_ring):
    r = make_ring(256, rewind_at=8)
    assert r.try_write(blob(100, 1), 1) and r.read() == blob(100, 1)    # tail at 108: 148 to the end
    assert r.try_write(blob(200, 2), 1)      # 148 + 208 > 256: written where it is, wrapping
    assert r._ctl[ring_mod.TAIL] == 108 + 208
    assert r.read() == blob(200, 2)
    r = make_ring(256, rewind_at=8)
    assert r.try_write(blob(256 - HEAD - 4, 1), 1) and r.read()        # 4 bytes to the end: no room for a skip
    assert r.try_write(blob(10, 2), 1) and r._ctl[ring_mod.TAIL] == 256 - 4 + HEAD + 10
    assert r.read() == blob(10, 2)


def test_eventfds(make_ring):
    r = make_ring(64)
    r.clear_wakeup()                        # nothing pending: no error
    r.notify()
    assert os.eventfd_read(r.data_fd) == 1
    r.notify()
    r.clear_wakeup()
    with pytest.raises(BlockingIOError):
        os.eventfd_read(r.data_fd)


def test_read_wakes_a_producer_waiting_for_space(make_ring):
    r = make_ring(64)
    assert r.try_write(blob(56, 1), 1)
    waited = []
    t = threading.Thread(target=lambda: (r.wait_for_space(30), waited.append(time.monotonic())))
    t.start()
    deadline = time.monotonic() + 10
    while not r._ctl[ring_mod.WAITING] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert r._ctl[ring_mod.WAITING] == 1
    t_read = time.monotonic()
    assert r.read() == blob(56, 1)
    t.join(10)
    assert waited and waited[0] - t_read < 5   # woken by the read, not by the 30 s timeout
    assert r._ctl[ring_mod.WAITING] == 0


# -- a concurrent writer process ---------------------------------------------------------------------
CHECK = struct.Struct("<I")


def _produce(r: Ring, total: int, seed: int, deadline: float) -> int:
    """Write `total` records in batches of 1-6, each carrying its sequence number and a CRC."""
    rnd = random.Random(seed)
    seq = 0
    while seq < total and time.monotonic() < deadline:
        n = min(rnd.randrange(1, 7), total - seq)
        parts = []
        for k in range(n):
            payload = rnd.randbytes(rnd.randrange(0, 300))
            parts.append(R.record(R.DATA, seq + k, payload, aux=zlib.crc32(payload), stamp=len(payload)))
        batch = b"".join(parts)
        while not r.try_write(batch, n):
            if time.monotonic() > deadline:
                return 1
            r.wait_for_space(0.01)
        r.notify()
        seq += n
    return 0 if seq == total else 1


@pytest.mark.parametrize("rewind_at", [1 << 20, 1000])
def test_no_torn_reads_under_a_concurrent_writer_process(make_ring, rewind_at):
    """A forked producer fills a small ring as fast as it can (many laps, often full, going back to
    the front when it finds it empty) while this process consumes: every record arrives whole,
    checksummed, exactly once and in order."""
    total = 20_000
    r = make_ring(4096, max_records=50, rewind_at=rewind_at)
    deadline = time.monotonic() + 20
    pid = os.fork()
    if pid == 0:  # the producer: never returns into pytest
        code = 1
        try:
            code = _produce(r, total, 1234, deadline)
        finally:
            os._exit(code)
    try:
        expected = 0
        batches = 0
        while expected < total and time.monotonic() < deadline:
            data = r.read(max_bytes=rng_bytes(batches))
            if not data:
                r.clear_wakeup()
                time.sleep(0)
                continue
            batches += 1
            pos = 0
            while pos < len(data):
                length, kind, seq, crc, size = R.unpack_header(data, pos)
                assert kind == R.DATA and length == R.HEADER_SIZE + size, (pos, length, kind)
                payload = data[pos + R.HEADER_SIZE:pos + length]
                assert seq == expected, "records out of order, lost or repeated"
                assert zlib.crc32(payload) == crc, f"record {seq} torn"
                expected += 1
                pos += length
            assert pos == len(data)
        assert expected == total
        assert r.read() == b"" and r.pending_records == 0
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert batches > 100  # the consumer really ran alongside the producer
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def rng_bytes(i: int) -> int:
    """Vary how much the consumer takes at once (a few batches or many)."""
    return (1 << 20) if i % 3 else 300


def test_a_held_read_stays_in_the_ring_until_released(make_ring):
    """What the dispatcher is handling stays readable (by the supervisor, if it dies) and keeps its
    space from the producer until released."""
    r = make_ring(64)
    assert r.try_write(blob(20, 1), 1) and r.try_write(blob(20, 2), 3)
    assert r.read(20, hold=True) == blob(20, 1)
    assert (r.used_bytes, r.pending_records) == (56, 3)     # (taken, so no longer pending)
    assert not r.try_write(blob(20, 3), 1)                 # its space is still taken
    assert r.peek(20) == blob(20, 1)                       # and it can be read again
    assert r.pending_records == 3
    r.release()
    assert (r.used_bytes, r.pending_records) == (28, 3)
    assert r.try_write(blob(20, 3), 1)
    r.release()                                            # nothing held: nothing happens
    assert r.read(1 << 10) == blob(20, 2) + blob(20, 3)


def test_watched_wake_ups_are_reported_once_each_with_no_read():
    """Ring.watch: the consumer's epoll reports each notify once; nothing is read to clear it."""
    import select
    r = Ring(4096)
    epoll = select.epoll()
    try:
        r.watch(epoll)
        assert epoll.poll(0) == []
        r.notify()
        assert epoll.poll(0) == [(r.data_fd, select.EPOLLIN)]
        assert epoll.poll(0) == []          # reported, not read: not reported again
        r.notify()                          # the counter is not zero, yet the next notify is seen
        r.notify()
        assert epoll.poll(0) == [(r.data_fd, select.EPOLLIN)]
        assert epoll.poll(0) == []
        other = select.epoll()              # a consumer started after notifies (a restart) sees them
        r.watch(other)
        assert other.poll(0) == [(r.data_fd, select.EPOLLIN)]
        other.close()
    finally:
        epoll.close()
        r.close()
