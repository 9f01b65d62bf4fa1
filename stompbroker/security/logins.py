"""Which login check runs next: fair across client addresses, one at a time per address.

A password check costs a deliberate ~20 ms of scrypt. Taken first come first served, 300 parallel
guesses from one address put every honest login behind them, and parallel guessing went as fast as
the checker allowed. This queue (pure: no threads, no clock of its own) hands out checks
round-robin over addresses, never two at once for one address, and after a refusal keeps that
address waiting for its back-off (``backoff`` seconds, doubling per consecutive refusal up to
``max_backoff``) before its next check. So guessing in parallel from one address is no faster than
guessing one after another, and a login from another address waits for at most one check per
address that has work, not for the flood.
"""

from __future__ import annotations

import heapq
from collections import deque

MAX_ADDRESSES = 100_000  # remembered refusal counts; forgotten all at once past this


class LoginQueue:
    def __init__(self, backoff: float, max_backoff: float = 10.0):
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.waiting: dict[str, deque] = {}     # address -> jobs not started, in arrival order
        self.ready: deque[str] = deque()        # addresses whose next job may start now, in turn
        self.busy: set[str] = set()             # addresses with a check in flight
        self.resting: dict[str, float] = {}     # address -> when its back-off ends
        self._rest_heap: list[tuple[float, str]] = []
        self.failures: dict[str, int] = {}      # consecutive refusals per address

    def __len__(self) -> int:
        return sum(map(len, self.waiting.values()))

    def add(self, address: str, job) -> None:
        jobs = self.waiting.get(address)
        if jobs is None:
            jobs = self.waiting[address] = deque()
            if address not in self.busy and address not in self.resting:
                self.ready.append(address)
        jobs.append(job)

    def take(self, now: float):
        """(address, job) to check now, or None; see :meth:`next_due` for when to ask again."""
        heap = self._rest_heap
        while heap and heap[0][0] <= now:
            _, address = heapq.heappop(heap)
            if self.resting.get(address, now + 1) <= now:
                del self.resting[address]
                if address in self.waiting and address not in self.busy:
                    self.ready.append(address)
        if not self.ready:
            return None
        address = self.ready.popleft()
        jobs = self.waiting[address]
        job = jobs.popleft()
        if not jobs:
            del self.waiting[address]
        self.busy.add(address)
        return address, job

    def next_due(self) -> float | None:
        """When a resting address may go again (None: nothing is resting)."""
        return self._rest_heap[0][0] if self._rest_heap else None

    def release(self, address: str) -> None:
        """The job taken was not checked (its connection went): the address's turn passes on."""
        self.busy.discard(address)
        if address in self.waiting and address not in self.resting:
            self.ready.append(address)

    def done(self, address: str, accepted: bool, now: float) -> None:
        self.busy.discard(address)
        if accepted:
            self.failures.pop(address, None)
        else:
            if len(self.failures) >= MAX_ADDRESSES:
                self.failures.clear()
            failures = self.failures[address] = self.failures.get(address, 0) + 1
            until = now + min(self.backoff * 2 ** min(failures - 1, 30), self.max_backoff)
            self.resting[address] = until
            heapq.heappush(self._rest_heap, (until, address))
            return
        if address in self.waiting:
            self.ready.append(address)
