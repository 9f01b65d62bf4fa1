"""Message priority: the SEND header ``priority`` (0-9, default 4) and the order it gives a queue.

A queue starts as plain FIFO deques. The first waiting message with a priority other than 4 turns
its deques (waiting, parked, blocked) into ``Ranked`` ones for as long as the queue lives, so a
queue whose messages carry no priority pays nothing. Order is strict: the oldest message of the
highest level goes first; within a level, first in first out.
"""

from __future__ import annotations

from collections import deque

from ..protocol.stomp import ProtocolError

DEFAULT = 4
LEVELS = {str(n): n for n in range(10)}


def check(headers: dict, receipt) -> int:
    """The SEND's priority level. An integer out of 0-9 is clamped (ActiveMQ Classic's and
    RabbitMQ's way) and the header rewritten, so the consumer sees the level it was ranked by;
    anything else is refused."""
    value = headers["priority"]
    level = LEVELS.get(value)
    if level is not None:
        return level
    try:
        level = min(max(int(value.strip()), 0), 9)
    except ValueError:
        raise ProtocolError("invalid priority", f"priority must be an integer from 0 to 9 (others are clamped), "
                            f"not {value[:40]!r}", receipt) from None
    headers["priority"] = str(level)
    return level


def level(message) -> int:
    return LEVELS.get(message.headers.get("priority"), DEFAULT)


def level_of(headers: dict) -> int:
    return LEVELS.get(headers.get("priority"), DEFAULT)


class Ranked:
    """The deque operations the broker uses on a queue's messages, over ten FIFO levels: the head
    is the oldest message of the highest level. A message going back (``appendleft``: a NACK,
    a consumer leaving) goes to the head of its own level."""

    __slots__ = ("levels", "count")

    def __init__(self, messages=()):
        self.levels: list[deque | None] = [None] * 10  # by level; a deque only once it held one
        self.count = 0
        self.extend(messages)

    def _level(self, message) -> deque:
        n = LEVELS.get(message.headers.get("priority"), DEFAULT)
        d = self.levels[n]
        if d is None:
            d = self.levels[n] = deque()
        return d

    def _top(self) -> deque:
        for d in reversed(self.levels):
            if d:
                return d
        raise IndexError("empty queue")

    def append(self, message) -> None:
        self._level(message).append(message)
        self.count += 1

    def appendleft(self, message) -> None:
        self._level(message).appendleft(message)
        self.count += 1

    def extend(self, messages) -> None:
        for message in messages:
            self.append(message)

    def extendleft(self, messages) -> None:
        for message in messages:
            self.appendleft(message)

    def popleft(self):
        message = self._top().popleft()
        self.count -= 1
        return message

    def remove(self, message) -> None:
        self._level(message).remove(message)
        self.count -= 1

    def clear(self) -> None:
        self.levels = [None] * 10
        self.count = 0

    def __getitem__(self, index: int):
        if index == 0:
            return self._top()[0]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError("index out of range")
        for i, message in enumerate(self):
            if i == index:
                return message

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self):
        for d in reversed(self.levels):
            if d:
                yield from d

    def __reversed__(self):
        for d in self.levels:
            if d:
                yield from reversed(d)


def rank(queue) -> None:
    """Give a queue priority order from now on (its waiting messages sorted by level, stably)."""
    if type(queue.messages) is not Ranked:
        queue.messages = Ranked(queue.messages)
        queue.parked = Ranked(queue.parked)
        queue.blocked = Ranked(queue.blocked)


def rank_destination(b, destination: str) -> None:
    """A message of a level other than 4 was published to ``destination``: the queues it may wait
    in (the queue, a temporary queue, durable subscriptions' queues) rank from now on. Run after
    the publish, so an earlier publish waiting its turn (``Broker.unfinished``) is ranked too."""
    if b.unfinished:
        b.unfinished.append((rank_destination, (destination,)))
        return
    queue = b.queues.get(destination)
    if queue is None and destination in b.temps:
        queue = b.temps[destination].queue
    if queue is not None:
        rank(queue)
    if b.durables:
        for durable in b.durable_index.match(destination):
            rank(durable.queue)
