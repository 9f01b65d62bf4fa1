"""Which login check runs next, and how long a refused one backs off (pure: no threads, no clock).

A password check costs a deliberate ~20 ms of scrypt. Taken first come first served, 300 parallel
guesses from one address put every honest login behind them, and parallel guessing went as fast as
the checker allowed. This queue hands out checks

- round-robin over client addresses, never two at once for one address, so a login from another
  address waits for at most one check per address that has work, not for a flood;
- within one address, round-robin over the logins waiting there, so guesses at one login do not
  queue in front of another user's login from the same address (a NAT, an office);

and after a refusal of login L from address A it holds back

- further checks of **(A, L)** for ``backoff`` seconds, doubling per consecutive refusal of that
  pair up to ``max_backoff``; only a success *of that pair* ends it, so logging in as someone else
  in between does not speed up guessing at L;
- further checks of **any login from A** once more than one login is failing there (password
  spraying: one guess at each of many logins): for ``backoff`` seconds doubling per further login
  refused from A within the last ``window`` seconds, up to ``max_backoff``. A success at
  one login takes only that login off A's list: other failing logins keep counting.

So guessing in parallel is no faster than guessing one after another, and one misconfigured client
retrying a wrong passcode slows only its own login. The refusal itself is answered after the same
back-off (:meth:`done` returns it), so a client that waits for its answer cannot tell it from a
check that took that long.

Jobs are named by an id (the connection) so a connection that goes takes its check with it
(:meth:`cancel`). Memory is bounded: at most ``max_records`` refusal records, the oldest forgotten.
The four figures are settings (auth_fail_delay_ms, auth_fail_delay_max_ms, auth_fail_window_ms,
auth_fail_records).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict


class LoginQueue:
    def __init__(self, backoff: float, max_backoff: float, window: float, max_records: int):
        """Seconds: the first back-off, the longest, and how long a refusal counts towards its
        address's; ``max_records``: (address, login) refusal records kept, the least recent goes first."""
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.window = window
        self.max_records = max_records
        # address -> login -> job id -> job: checks not started, logins in turn, jobs in arrival order
        self.waiting: dict[str, OrderedDict[str, dict]] = {}
        self.where: dict[object, tuple[str, str]] = {}    # job id -> (address, login), while waiting
        self.ready: OrderedDict[str, None] = OrderedDict()  # addresses to look at now, in turn
        self.busy: set[str] = set()                         # addresses with a check in flight
        self.wakeups: list[tuple[float, str]] = []          # (when, address): a back-off ends then
        # (address, login) -> [consecutive refusals, time of the last], least recent first
        self.pairs: OrderedDict[tuple[str, str], list] = OrderedDict()
        # address -> login -> time of its last refusal there (the logins failing at that address)
        self.failing: dict[str, OrderedDict[str, float]] = {}
        self.address_rest: dict[str, float] = {}            # address -> when its back-off ends

    def __len__(self) -> int:
        return len(self.where)

    # -- jobs ------------------------------------------------------------------------------------
    def add(self, address: str, login: str, job_id, job) -> None:
        logins = self.waiting.get(address)
        if logins is None:
            logins = self.waiting[address] = OrderedDict()
        logins.setdefault(login, {})[job_id] = job
        self.where[job_id] = (address, login)
        if address not in self.busy:
            self.ready[address] = None

    def cancel(self, job_id) -> tuple[str, str] | None:
        """Drop a check that has not started (its connection went); its (address, login), or None
        when it is not waiting (started, done or never added)."""
        place = self.where.pop(job_id, None)
        if place is None:
            return None
        address, login = place
        logins = self.waiting[address]
        jobs = logins[login]
        del jobs[job_id]
        if not jobs:
            del logins[login]
            if not logins:
                del self.waiting[address]
        return place

    def take(self, now: float):
        """``(address, login, job id, job)`` to check now, or None: see :meth:`next_due`."""
        heap = self.wakeups
        while heap and heap[0][0] <= now:
            _, address = heapq.heappop(heap)
            if address in self.waiting and address not in self.busy:
                self.ready[address] = None
        while self.ready:
            address, _ = self.ready.popitem(last=False)
            logins = self.waiting.get(address)
            if logins is None or address in self.busy:
                continue
            wait = self.address_rest.get(address, 0.0)
            if wait > now:
                heapq.heappush(heap, (wait, address))
                continue
            self.address_rest.pop(address, None)
            login = next((name for name in logins if self.rest(address, name) <= now), None)
            if login is None:  # every login waiting here backs off: look again when the first may go
                heapq.heappush(heap, (min(self.rest(address, name) for name in logins), address))
                continue
            jobs = logins[login]
            job_id = next(iter(jobs))
            job = jobs.pop(job_id)
            del self.where[job_id]
            if jobs:
                logins.move_to_end(login)  # the next check from this address is another login's
            else:
                del logins[login]
                if not logins:
                    del self.waiting[address]
            self.busy.add(address)
            return address, login, job_id, job
        return None

    def next_due(self) -> float | None:
        """When a back-off that holds a waiting check ends (None: nothing is backing off)."""
        return self.wakeups[0][0] if self.wakeups else None

    # -- verdicts ----------------------------------------------------------------------------------
    def done(self, address: str, login: str, accepted: bool, now: float) -> float:
        """A check finished; returns the seconds its refusal waits before it is told (0: accepted)."""
        self.busy.discard(address)
        if address in self.waiting:
            self.ready[address] = None
        key = (address, login)
        if accepted:
            self.pairs.pop(key, None)
            self._stop_failing(address, login)
            return 0.0
        pair = self.pairs.pop(key, None) or [0, now]
        pair[0] += 1
        pair[1] = now
        self.pairs[key] = pair  # (the most recent last)
        while len(self.pairs) > self.max_records:
            (old_address, old_login), _ = self.pairs.popitem(last=False)
            self._stop_failing(old_address, old_login)
        failing = self.failing.setdefault(address, OrderedDict())
        failing.pop(login, None)
        failing[login] = now
        while failing and next(iter(failing.values())) < now - self.window:
            failing.popitem(last=False)
        if len(self.address_rest) > self.max_records:
            self.address_rest = {a: until for a, until in self.address_rest.items() if until > now}
        own = self._delay(pair[0])
        shared = self._delay(len(failing) - 1)  # from the second failing login on
        if shared:
            self.address_rest[address] = now + shared
            heapq.heappush(self.wakeups, (now + shared, address))
        heapq.heappush(self.wakeups, (now + own, address))
        return max(own, shared)

    def rest(self, address: str, login: str) -> float:
        """When (address, login) may be checked again, by its own refusals (0.0: now)."""
        pair = self.pairs.get((address, login))
        return pair[1] + self._delay(pair[0]) if pair is not None else 0.0

    def retry_at(self, address: str, login: str) -> float:
        """When a check of (address, login) may start at the earliest, by both back-offs."""
        return max(self.rest(address, login), self.address_rest.get(address, 0.0))

    def _delay(self, refusals: int) -> float:
        if refusals <= 0:
            return 0.0
        return min(self.backoff * 2 ** min(refusals - 1, 30), self.max_backoff)

    def _stop_failing(self, address: str, login: str) -> None:
        failing = self.failing.get(address)
        if failing is not None:
            failing.pop(login, None)
            if not failing:
                del self.failing[address]
