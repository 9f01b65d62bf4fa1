"""Single-node de-duplication: a SEND carrying ``dedup-id`` to a queue, or a persistent topic
message, is stored once per (destination, dedup-id) within ``dedup_window`` seconds.

A producer that retries after a lost receipt, a dropped connection or a broker restart (a Spark
sink retrying a batch) sends the same id again; the repeat is answered (its receipt) and dropped.
The window keeps at most ``max_dedup_ids`` ids, each as a 16-byte digest (the oldest go first), so
its memory is bounded whatever the ids' length. With ``store=sqlite`` it is seeded at start from
the stored messages and the replay log, so a repeat sent after a crash is still recognised. In
cluster mode JetStream de-duplicates instead (docs/cluster.md)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from .names import QUEUE_PREFIX

HEADER = "dedup-id"


def applies(destination: str, headers: dict) -> bool:
    """Kept messages only: queue messages and persistent topic messages."""
    return destination.startswith(QUEUE_PREFIX) or headers.get("persistent") == "true"


def key(destination: str, dedup_id: str) -> bytes:
    return hashlib.blake2b(f"{destination}\n{dedup_id}".encode(), digest_size=16).digest()


class Window:
    def __init__(self, seconds: float, most: int):
        self.seconds = seconds
        self.most = most
        self.ids: OrderedDict[bytes, float] = OrderedDict()  # digest -> monotonic expiry, oldest first
        self.repeats = 0  # repeats dropped so far

    def seen(self, digest: bytes, now: float) -> bool:
        """True when ``digest`` is in the window; otherwise it is added."""
        self.expire(now)
        if digest in self.ids:
            return True
        self.add(digest, now + self.seconds)
        return False

    def add(self, digest: bytes, until: float) -> None:
        self.ids[digest] = until
        self.ids.move_to_end(digest)
        while len(self.ids) > self.most:
            self.ids.popitem(last=False)

    def expire(self, now: float) -> None:
        ids = self.ids
        while ids:
            digest, until = next(iter(ids.items()))
            if until > now:
                return
            del ids[digest]


def make(config) -> Window | None:
    if config.cluster or config.dedup_window <= 0 or config.max_dedup_ids <= 0:
        return None
    return Window(config.dedup_window, config.max_dedup_ids)


def repeated(b, destination: str, headers: dict) -> bool:
    """A SEND's message was stored already within the window: drop it. Its receipt then waits
    for the commit under way, which holds the original when it is not on disk yet."""
    window = b.dedup
    if window is None or not applies(destination, headers):
        return False
    if not window.seen(key(destination, headers[HEADER]), b.now):
        return False
    window.repeats += 1
    if b.store is not None:
        b.store.ops += 1  # (emit() holds a reply while the store has ops this event)
    return True


def seed(b, store, now: float) -> int:
    """The ids of messages kept within the window before a restart; returns how many."""
    window = b.dedup
    if window is None:
        return 0
    wall_ms = b.clock() * 1000
    count = 0
    for destination, dedup_id, ts in store.dedup_ids(wall_ms - window.seconds * 1000):
        window.add(key(destination, dedup_id), now + window.seconds - (wall_ms - ts) / 1000)
        count += 1
    window.expire(now)
    return count
