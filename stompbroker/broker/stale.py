"""stompica's TTL stale queue, on the monotonic clock, with an index by destination.

A message that reached no subscriber waits here for at most ``ttl`` seconds. A new subscription
takes every waiting message whose destination it matches, in send order, and removes it, so a
second late subscriber does not get it again. When the queue is full the oldest message is dropped
(and counted). Expired messages go at the next sweep or lookup.
"""

from __future__ import annotations

from collections import deque

from .vhosts import reaches


class StaleQueue:
    def __init__(self, ttl: float, max_size: int, vhosts: bool = False):
        self.ttl = ttl
        self.vhosts = vhosts  # several virtual hosts: a wildcard takes only its own vhost's (vhosts.py)
        self.max_size = max_size
        self._order: deque = deque()                 # [deadline, seq, message, alive] in send order
        self._by_destination: dict[str, deque] = {}  # the same entries, per destination
        self._seq = 0
        self.size = 0
        self.dropped = 0    # pushed out by a full queue
        self.expired = 0
        self.delivered = 0

    def __len__(self) -> int:
        return self.size

    def add(self, message, now: float) -> None:
        if self.size >= self.max_size:
            self._drop_oldest()
        self._seq += 1
        entry = [now + self.ttl, self._seq, message, True]
        self._order.append(entry)
        self._by_destination.setdefault(message.destination, deque()).append(entry)
        self.size += 1

    def take(self, exact: str | None, prefix: str | None, now: float, accept) -> list:
        """Remove and return the live messages a new subscription takes, in send order.

        ``exact``: a destination name, or ``prefix``: a wildcard subscription's prefix (every
        destination starting with it); ``accept(headers)``: the subscription's filter. Messages it
        does not accept stay for someone else.
        """
        self.sweep(now)
        if exact is not None:
            names = [exact] if exact in self._by_destination else []
        else:
            names = [d for d in self._by_destination
                     if d.startswith(prefix) and (not self.vhosts or reaches(prefix, d))]
        taken = []
        for name in names:
            keep = deque()
            for entry in self._by_destination[name]:
                if entry[3]:
                    (taken if accept(entry[2].headers) else keep).append(entry)
            if keep:
                self._by_destination[name] = keep
            else:
                del self._by_destination[name]
        taken.sort(key=lambda e: e[1])
        for entry in taken:
            entry[3] = False
        self.size -= len(taken)
        if len(self._order) > 2 * self.size + 1024:  # taken entries linger in _order: compact it
            self._order = deque(e for e in self._order if e[3])
        live = [e[2] for e in taken if e[0] > now and not e[2].expired(now)]
        self.delivered += len(live)
        self.expired += len(taken) - len(live)
        return live

    def sweep(self, now: float) -> None:
        """Drop expired messages from the front (they expire in send order)."""
        order = self._order
        while order and (not order[0][3] or order[0][0] <= now):
            entry = order.popleft()
            if entry[3]:
                entry[3] = False
                self.size -= 1
                self.expired += 1
                self._forget(entry)

    def _drop_oldest(self) -> None:
        while self._order:
            entry = self._order.popleft()
            if entry[3]:
                entry[3] = False
                self.size -= 1
                self.dropped += 1
                self._forget(entry)
                return

    def _forget(self, entry) -> None:
        name = entry[2].destination
        queue = self._by_destination.get(name)
        if queue is not None:
            while queue and not queue[0][3]:
                queue.popleft()
            if not queue:
                del self._by_destination[name]
