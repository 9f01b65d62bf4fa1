"""Records for one writer, gathered by the dispatcher: the dispatcher-to-writer wire format's producer.

The broker appends its replies and deliveries here (``add``, and ``add2``/``add3`` for a DATA
record made of parts, so a delivery is never joined first; ``add_each`` for one message to several
connections); the dispatcher hands the batch to the
writer's ring (``take``). Records are encoded once, as they are added: tuples encoded later by the
dispatcher would cost the same encoding plus a tuple per record on the fan-out path.

Adding never waits: each ``add`` returns whether the outbox is now over its ``limit``, and code that
can make unbounded output (a fan-out, a queue pump) stops there, resumably (``Broker.unfinished``);
the dispatcher hands the batch to the ring, waiting for space in its own loop, then resumes it.
"""

from __future__ import annotations

from . import records as R


class Outbox:
    """Records for one writer, collected during one dispatcher round."""

    __slots__ = ("index", "buf", "count", "limit", "stamp", "token")

    def __init__(self, index: int = 0, limit: int = 1 << 62):
        self.index = index
        self.buf = bytearray()
        self.count = 0
        self.limit = limit        # past this many bytes the batch should go to the ring before more is added
        # when the frame being handled was read (records.stamp, 0 = not stamped): the dispatcher sets
        # it on every outbox before each input record, and the records it causes carry it
        self.stamp = 0
        self.token = ""           # its broker's: the ids of the sessions it writes for are made of it

    def add(self, kind: int, conn: int, payload: bytes = b"", aux: int = 0) -> bool:
        """Append one record; True when the outbox is now over its limit."""
        self.buf += R.pack_header(R.HEADER_SIZE + len(payload), kind, conn, aux, self.stamp)
        self.buf += payload
        self.count += 1
        return len(self.buf) > self.limit

    def add2(self, conn: int, first: bytes, second: bytes, aux: int = 0) -> bool:
        """A DATA record made of two parts, without joining them first (one delivery)."""
        buf = self.buf
        buf += R.pack_header(R.HEADER_SIZE + len(first) + len(second), R.DATA, conn, aux, self.stamp)
        buf += first
        buf += second
        self.count += 1
        return len(buf) > self.limit

    def add3(self, conn: int, first: bytes, second: bytes, third: bytes, aux: int = 0) -> bool:
        buf = self.buf
        buf += R.pack_header(R.HEADER_SIZE + len(first) + len(second) + len(third), R.DATA, conn, aux,
                             self.stamp)
        buf += first
        buf += second
        buf += third
        self.count += 1
        return len(buf) > self.limit

    def add_each(self, entries: list, part: bytes) -> bool:
        """One DATA_EACH record: each entry (``records.each_entry``: a connection and its prefix) gets
        its prefix and ``part`` (a fan-out of one message; the part is carried once, not once per
        delivery)."""
        data = b"".join(entries)
        buf = self.buf
        buf += R.pack_header(R.HEADER_SIZE + len(data) + len(part), R.DATA_EACH, 0, len(entries), self.stamp)
        buf += data
        buf += part
        self.count += len(entries)
        return len(buf) > self.limit

    def take(self) -> tuple[bytearray, int]:
        buf, count = self.buf, self.count
        self.buf, self.count = bytearray(), 0
        return buf, count
