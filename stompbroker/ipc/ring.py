"""Single-producer single-consumer byte ring in shared memory, with eventfd wake-ups.

The producer appends *batches* (a blob of records plus their count) and publishes them by moving
the tail; the consumer copies whole batches out and moves the head. Positions only grow (u64), the
index into the data area is ``position % capacity``, so a batch may wrap around the end.

A producer that finds the ring empty, past ``rewind_at`` bytes into the data area, starts again at
the front: it writes a skip header (count SKIP) over the rest of the lap, which the consumer steps
over. So the pages the rings touch (and keep resident) are about as many as their deepest backlog,
not the whole capacity once a few laps' worth of traffic went through (10,000 connections' OPEN,
CONNECT and CONNECTED records touched 2.6 MB of fresh pages).

Why it is safe without locks: there is one writer per control slot (head and records-read belong to
the consumer, tail to the producer) and x86-64 keeps stores in order, so a consumer that sees the new
tail also sees the bytes written before it. Wake-ups go through eventfds, one write per batch rather
than per record; the write() system call is also a full barrier. The dispatcher and the writers wait
for them edge-triggered (``watch``), so a wake-up costs its consumer no read.

The segment is created with ``multiprocessing.shared_memory`` by the supervisor and unlinked at once:
every broker process is forked from the supervisor and inherits the mapping, and nothing is left in
/dev/shm when the process group is killed. For the same reason multiprocessing's resource tracker
(an extra Python process of about 7 MB) is not involved: there is nothing left for it to clean up.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
from multiprocessing import resource_tracker, shared_memory

_BATCH = struct.Struct("<II")  # blob length, record count
_CONTROL_BYTES = 256
SKIP = 0xFFFFFFFF  # a batch header's count: no records, step over its length
REWIND_AT = 64 << 10

# u64 control slots, each written by one side only (consumer: HEAD, READ; producer: TAIL, WAITING).
HEAD, READ = 0, 1          # consumer cache line
TAIL, WAITING, WRITTEN = 8, 9, 10   # producer cache line


@contextlib.contextmanager
def _untracked():
    register, unregister = resource_tracker.register, resource_tracker.unregister
    resource_tracker.register = resource_tracker.unregister = lambda *args: None
    try:
        yield
    finally:
        resource_tracker.register, resource_tracker.unregister = register, unregister


def anonymous_segment(size: int) -> shared_memory.SharedMemory:
    """Shared memory that only this process and its forked children can reach (unlinked at once)."""
    with _untracked():
        shm = shared_memory.SharedMemory(create=True, size=size)
        shm.unlink()
    return shm


class RingFull(Exception):
    """A single batch larger than the ring can ever hold."""


class Ring:
    def __init__(self, capacity: int, max_records: int = 1 << 62, rewind_at: int = REWIND_AT):
        self.capacity = capacity
        self.max_records = max_records
        self.rewind_at = rewind_at
        self._shm = anonymous_segment(_CONTROL_BYTES + capacity)
        self._ctl = self._shm.buf[:_CONTROL_BYTES].cast("Q")
        self._data = self._shm.buf[_CONTROL_BYTES:_CONTROL_BYTES + capacity]
        self.data_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.space_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._written = 0  # producer-private count of records written
        self._held = None  # consumer-private: the head after a read not released yet

    # -- producer side -------------------------------------------------------------------------
    def try_write(self, blob, nrecords: int) -> bool:
        """Append one batch, all or nothing. False when the ring is too full right now."""
        need = len(blob) + _BATCH.size
        if need > self.capacity:
            raise RingFull(f"batch of {need} bytes exceeds ring capacity {self.capacity}")
        ctl = self._ctl
        tail = ctl[TAIL]
        head = ctl[HEAD]
        if self.capacity - (tail - head) < need:
            return False
        if self._written - ctl[READ] + nrecords > self.max_records and self._written != ctl[READ]:
            return False
        if tail == head and tail % self.capacity >= self.rewind_at:
            # Empty (the consumer has taken and released everything): back to the front.
            gap = self.capacity - tail % self.capacity
            if gap >= _BATCH.size and gap + need <= self.capacity:
                self._put(tail, _BATCH.pack(gap - _BATCH.size, SKIP))
                tail += gap
        start = tail % self.capacity
        if start + _BATCH.size <= self.capacity:  # (the batch's head in one piece: packed in place)
            _BATCH.pack_into(self._data, start, len(blob), nrecords)
        else:
            self._put(tail, _BATCH.pack(len(blob), nrecords))
        self._put(tail + _BATCH.size, blob)
        self._written += nrecords
        ctl[TAIL] = tail + need
        ctl[WRITTEN] = self._written
        return True

    def resume_producer(self) -> None:
        """A new producer process takes over a ring whose last producer died: it carries on from the
        published tail (a batch the dead one had not published is simply not there)."""
        self._written = self._ctl[WRITTEN]
        self._ctl[WAITING] = 0

    def notify(self) -> None:
        os.eventfd_write(self.data_fd, 1)

    def wait_for_space(self, timeout: float) -> None:
        """Block until the consumer frees space (or timeout: a lost wake-up costs one timeout)."""
        self._ctl[WAITING] = 1
        select.select([self.space_fd], [], [], timeout)
        try:
            os.eventfd_read(self.space_fd)
        except BlockingIOError:
            pass
        self._ctl[WAITING] = 0

    def reset(self) -> None:
        """Empty the ring; only while neither side runs (the supervisor between generations)."""
        for slot in (HEAD, READ, TAIL, WAITING, WRITTEN):
            self._ctl[slot] = 0
        self._written = 0
        self._held = None
        for fd in (self.data_fd, self.space_fd):
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass

    # -- consumer side -------------------------------------------------------------------------
    def read(self, max_bytes: int = 1 << 20, hold: bool = False) -> bytes:
        """Copy out whole batches, at least one if any, up to about max_bytes; b'' when empty.

        ``hold``: keep their bytes in the ring until ``release()`` (the producer cannot overwrite
        them meanwhile), so another process can ``peek`` at them if this one dies handling them
        (the supervisor does, to name what killed the dispatcher)."""
        blob, head, records = self._copy(max_bytes)
        if blob:
            self._ctl[READ] += records  # (taken: no longer pending, even while its bytes are held)
            if hold:
                self._held = head
            else:
                self._advance(head)
        return blob

    def peek(self, max_bytes: int) -> bytes:
        """What ``read`` would copy out, changing nothing (the batches a dead consumer held)."""
        return self._copy(max_bytes)[0]

    def _copy(self, max_bytes: int) -> tuple[bytes, int, int]:
        ctl = self._ctl
        head = ctl[HEAD]
        tail = ctl[TAIL]
        # One batch waiting, not wrapped (a consumer woken for one message): one slice.
        start = head % self.capacity
        if head < tail and start + (tail - head) <= self.capacity:
            size, count = _BATCH.unpack_from(self._data, start)
            if head + _BATCH.size + size == tail and count != SKIP:  # (a SKIP is never last: a guard)
                return self._data[start + _BATCH.size:start + _BATCH.size + size].tobytes(), tail, count
        parts = []
        total = records = 0
        while head < tail:
            size, count = _BATCH.unpack(self._get(head, _BATCH.size))
            if count == SKIP:  # the producer went back to the front
                head += _BATCH.size + size
                continue
            if parts and total + size > max_bytes:
                break
            parts.append(self._get(head + _BATCH.size, size))
            total += size
            records += count
            head += _BATCH.size + size
        return (parts[0] if len(parts) == 1 else b"".join(parts)), head, records

    def release(self) -> None:
        """Let the producer have the space of what the last ``read(hold=True)`` copied out."""
        head = self._held
        if head is not None:
            self._held = None
            ctl = self._ctl
            ctl[HEAD] = head
            if ctl[WAITING]:
                os.eventfd_write(self.space_fd, 1)

    def _advance(self, head: int) -> None:
        ctl = self._ctl
        ctl[HEAD] = head
        if ctl[WAITING]:
            os.eventfd_write(self.space_fd, 1)

    def watch(self, epoll) -> None:
        """Register the wake-ups with ``epoll`` edge-triggered: each ``notify`` is reported once, and
        nothing need be read to stop it being reported again (``clear_wakeup`` is for the level-
        triggered waits: select, asyncio). The counter keeps growing, by one per batch: it would
        take centuries to reach its 2**64 - 2 limit. A wake-up that comes while the consumer is busy
        makes one more, empty, round before it sleeps: at most one per sleep, not one read per round."""
        epoll.register(self.data_fd, select.EPOLLIN | select.EPOLLET)

    def clear_wakeup(self) -> None:
        try:
            os.eventfd_read(self.data_fd)
        except BlockingIOError:
            pass

    # -- shared ------------------------------------------------------------------------------
    @property
    def used_bytes(self) -> int:
        return self._ctl[TAIL] - self._ctl[HEAD]

    @property
    def pending_records(self) -> int:
        """Records written and not yet read, readable from any process."""
        return max(self._ctl[WRITTEN] - self._ctl[READ], 0)

    def _put(self, pos: int, data) -> None:
        start = pos % self.capacity
        n = len(data)
        first = min(n, self.capacity - start)
        if first == n:
            self._data[start:start + n] = data
        else:
            view = memoryview(data)
            self._data[start:self.capacity] = view[:first]
            self._data[0:n - first] = view[first:]

    def _get(self, pos: int, n: int) -> bytes:
        start = pos % self.capacity
        end = start + n
        if end <= self.capacity:
            return self._data[start:end].tobytes()
        return self._data[start:].tobytes() + self._data[0:end - self.capacity].tobytes()

    def close(self) -> None:
        self._ctl.release()
        self._data.release()
        self._shm.close()
        for fd in (self.data_fd, self.space_fd):
            try:
                os.close(fd)
            except OSError:
                pass
