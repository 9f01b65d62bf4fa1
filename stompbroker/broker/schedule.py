"""Scheduled and delayed delivery: the SEND headers (ActiveMQ's ``AMQ_SCHEDULED_DELAY``, ``_TIME``,
``_PERIOD``, ``_REPEAT``, ``_CRON``; RabbitMQ's ``x-delay``), cron expressions, and the jobs
waiting for their time in one heap.

Times are wall-clock epoch milliseconds (what the headers say, what the store keeps); the heap
orders jobs by them, and the broker wakes once for the earliest (``Jobs.next_due``), never once per
job. A cancelled job stays in the heap until it comes up (or the heap is rebuilt when they are
more than half of it).
"""

from __future__ import annotations

import heapq
import itertools
from datetime import datetime, timedelta, timezone

from ..protocol.stomp import ProtocolError

DELAY, TIME, PERIOD, REPEAT, CRON, X_DELAY = ("AMQ_SCHEDULED_DELAY", "AMQ_SCHEDULED_TIME", "AMQ_SCHEDULED_PERIOD",
                                              "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON", "x-delay")
NAMES = (DELAY, TIME, PERIOD, REPEAT, CRON, X_DELAY)
JOB_ID = "scheduled-job-id"
CLASSIC_JOB_ID = "scheduledJobId"  # on SEND: a copy of a job sent on by a client; delivered at once (Classic)
MAX_MS = 10 * 365 * 86_400_000     # no delay or period of more than ten years
MAX_EPOCH_MS = 10 ** 13            # AMQ_SCHEDULED_TIME: epoch ms, up to the year 2286


# -- cron ---------------------------------------------------------------------------------------------
class Cron:
    """A five-field cron expression (minute hour day-of-month month day-of-week), in UTC: numbers,
    ``*``, ranges ``a-b``, steps ``/n`` and lists ``a,b``; day-of-week 0-7 (0 and 7 are Sunday).
    When both day fields are restricted, a day matching either one matches (as cron does)."""

    BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))

    def __init__(self, text: str):
        fields = text.split()
        if len(fields) != 5:
            raise ValueError("a cron expression has five fields: minute hour day-of-month month day-of-week")
        sets = [self._field(f, lo, hi) for f, (lo, hi) in zip(fields, self.BOUNDS)]
        self.minutes, self.hours, self.days, self.months, weekdays = sets
        self.weekdays = {d % 7 for d in weekdays}
        self.any_day, self.any_weekday = fields[2] == "*", fields[4] == "*"
        self.text = text
        self.next_after(0)  # one that never matches (February 30th) is refused now

    @staticmethod
    def _field(text: str, lo: int, hi: int) -> set:
        values = set()
        for part in text.split(","):
            span, _, step = part.partition("/")
            every = int(step) if step else 1
            if span == "*":
                first, last = lo, hi
            elif "-" in span:
                a, b = span.split("-", 1)
                first, last = int(a), int(b)
            else:
                first = last = int(span)
                if step:
                    last = hi
            if not (lo <= first <= last <= hi) or every < 1:
                raise ValueError(f"{part!r} is out of {lo}-{hi}")
            values.update(range(first, last + 1, every))
        return values

    def _day(self, t: datetime) -> bool:
        dom, dow = t.day in self.days, (t.weekday() + 1) % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def next_after(self, ms: float) -> float:
        """The first matching minute after ``ms`` (epoch ms), in epoch ms."""
        t = datetime.fromtimestamp(ms / 1000, timezone.utc).replace(second=0, microsecond=0) + timedelta(minutes=1)
        end = t + timedelta(days=366 * 5)
        while t < end:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                return t.timestamp() * 1000
        raise ValueError("it matches no time in the next five years")


# -- the headers --------------------------------------------------------------------------------------
def _millis(headers: dict, name: str, receipt, high: int = MAX_MS) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        number = int(value.strip())
        if not 0 <= number <= high:
            raise ValueError
    except ValueError:
        raise ProtocolError(f"invalid {name}", f"{name} must be an integer from 0 to {high} "
                            f"(milliseconds), not {value[:40]!r}", receipt) from None
    return number


class Spec:
    """What a SEND's scheduling headers ask for."""

    __slots__ = ("delay", "at", "period", "repeat", "cron")

    def __init__(self, delay: int, at: int, period: int, repeat: int, cron: Cron | None):
        self.delay, self.at, self.period, self.repeat, self.cron = delay, at, period, repeat, cron


def spec(headers: dict, max_repeat: int, receipt) -> Spec | None:
    """The schedule a SEND asks for, or None for a message to deliver now (no such header, only
    zeros, or a ``scheduledJobId``: a delivered copy sent on, which ActiveMQ delivers at once). A
    bad value is an ERROR naming the header."""
    if CLASSIC_JOB_ID in headers:
        return None
    delay = _millis(headers, DELAY, receipt)
    if delay is None:
        delay = _millis(headers, X_DELAY, receipt)
    at = _millis(headers, TIME, receipt, MAX_EPOCH_MS)
    period = _millis(headers, PERIOD, receipt) or 0
    repeat_text = headers.get(REPEAT)
    repeat = 0
    if repeat_text is not None:
        try:
            repeat = int(repeat_text.strip())
            if repeat < 0:
                raise ValueError
        except ValueError:
            raise ProtocolError(f"invalid {REPEAT}", f"{REPEAT} must be a non-negative integer, "
                                f"not {repeat_text[:40]!r}", receipt) from None
        if repeat > max_repeat:
            raise ProtocolError(f"invalid {REPEAT}", f"{REPEAT} may be at most {max_repeat} "
                                "(max_scheduled_repeat)", receipt)
    cron = None
    text = headers.get(CRON)
    if text is not None and text.strip():
        try:
            cron = Cron(text.strip())
        except ValueError as exc:
            raise ProtocolError(f"invalid {CRON}", f"{text[:80]!r}: {exc}", receipt) from None
    if not (delay or at or period or repeat or cron):
        return None
    return Spec(delay or 0, at or 0, period, repeat, cron)


def delivered_headers(headers: dict, job_id: str) -> dict:
    """A firing's headers: the scheduling ones gone, the job's id added (both spellings)."""
    out = {k: v for k, v in headers.items() if k not in NAMES}
    out[JOB_ID] = out[CLASSIC_JOB_ID] = job_id
    return out


# -- jobs ---------------------------------------------------------------------------------------------
class Job:
    """One scheduled message. ``due``: its next firing (epoch ms); ``left``: firings left in the
    current run (a cron's run starts at ``base``, each cron time); ``ttl``: ms a firing lives
    (its expiry counts from its delivery), 0 = for ever."""

    __slots__ = ("id", "destination", "headers", "body", "spec", "due", "left", "base", "ttl", "stored",
                 "cancelled")

    def __init__(self, job_id: str, destination: str, headers: dict, body: bytes, spec: Spec, ttl: float,
                 stored: bool):
        self.id = job_id
        self.destination = destination
        self.headers = headers
        self.body = body
        self.spec = spec
        self.ttl = ttl
        self.stored = stored
        self.cancelled = False
        self.left = 0
        self.base = 0.0
        self.due = 0.0

    def start(self, now_ms: float) -> None:
        """The first firing: at AMQ_SCHEDULED_TIME, else after the delay (or after one period,
        for a repeat without a delay, as ActiveMQ); a cron's first run at its first time."""
        spec = self.spec
        self.left = spec.repeat + 1
        if spec.cron is not None:
            self.base = spec.cron.next_after(now_ms)
            self.due = self.base + spec.delay
        elif spec.at:  # (AMQ_SCHEDULED_TIME wins over a delay, as in Artemis)
            self.due = spec.at
        else:
            self.due = now_ms + (spec.delay or spec.period)

    def advance(self) -> bool:
        """After a firing: the next one; False when there is none."""
        spec = self.spec
        self.left -= 1
        if self.left > 0:
            self.due += spec.period
            return True
        if spec.cron is None:
            return False
        try:
            self.base = spec.cron.next_after(self.base)
        except ValueError:  # (no time in the next five years: the job is over)
            return False
        self.left = spec.repeat + 1
        self.due = self.base + spec.delay
        return True

    def state(self) -> dict:
        return {"due": self.due, "left": self.left, "base": self.base, "ttl": self.ttl}

    def info(self) -> dict:
        """As browsing and the API show it."""
        spec = self.spec
        return {"id": self.id, "destination": self.destination, "next": self.due, "left": self.left,
                "period": spec.period, "repeat": spec.repeat, "cron": spec.cron.text if spec.cron else "",
                "delay": spec.delay, "bytes": len(self.body)}


class Jobs:
    """The scheduled jobs: by id, counted per destination, and a heap by time."""

    def __init__(self):
        self.by_id: dict[str, Job] = {}
        self.per_destination: dict[str, int] = {}
        self.heap: list = []
        self.cancelled = 0
        self.order = itertools.count()

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, job: Job) -> None:
        self.by_id[job.id] = job
        self.per_destination[job.destination] = self.per_destination.get(job.destination, 0) + 1
        heapq.heappush(self.heap, (job.due, next(self.order), job))

    def again(self, job: Job) -> None:
        """A job fired and has a next time."""
        heapq.heappush(self.heap, (job.due, next(self.order), job))

    def remove(self, job: Job) -> None:
        """A job is done or cancelled (if it is still in the heap, it is skipped when it comes up)."""
        if self.by_id.pop(job.id, None) is None:
            return
        n = self.per_destination[job.destination] - 1
        if n:
            self.per_destination[job.destination] = n
        else:
            del self.per_destination[job.destination]

    def cancel(self, job: Job) -> None:
        self.remove(job)
        job.cancelled = True
        self.cancelled += 1
        if self.cancelled > 64 and self.cancelled > len(self.heap) // 2:
            self.heap = [entry for entry in self.heap if not entry[2].cancelled]
            heapq.heapify(self.heap)
            self.cancelled = 0

    def next_due(self) -> float | None:
        """Epoch ms of the earliest live job (cancelled ones at the top are dropped on the way)."""
        heap = self.heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
            self.cancelled -= 1
        return heap[0][0] if heap else None

    def due(self, now_ms: float, limit: int):
        """Pop up to ``limit`` jobs due by ``now_ms``, earliest first."""
        out = []
        heap = self.heap
        while heap and len(out) < limit:
            due, _, job = heap[0]
            if job.cancelled:
                heapq.heappop(heap)
                self.cancelled -= 1
                continue
            if due > now_ms:
                break
            heapq.heappop(heap)
            out.append(job)
        return out

    def of(self, destination: str | None = None) -> list[Job]:
        """The live jobs (of one destination), by time."""
        jobs = [j for j in self.by_id.values() if destination is None or j.destination == destination]
        jobs.sort(key=lambda j: j.due)
        return jobs

    def flagged(self, destination: str, limit: int) -> list:
        """A queue's jobs for a browse of it (at most ``limit``): (job id, its next firing's headers
        marked ``scheduled:true`` with ``scheduled-time``, body), by time."""
        if not self.per_destination.get(destination):
            return []
        out = []
        for job in self.of(destination)[:limit]:
            headers = delivered_headers(job.headers, job.id)
            headers["scheduled"] = "true"
            headers["scheduled-time"] = str(int(job.due))
            out.append((job.id, headers, job.body))
        return out
