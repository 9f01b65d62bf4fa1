"""Delivery confirmations: the writers' counts of sent queue deliveries let messages leave the
store; what a writer never sent goes back to the head of its queue, marked redelivered."""

from __future__ import annotations

from collections import deque
from itertools import repeat, starmap

from . import queues
from .model import Queue, Session


_consume = deque(maxlen=0).extend  # runs an iterator to its end in C


def written(b, conn: int, total: int, final: bool = False) -> None:
    """The writer has sent ``total`` marked deliveries of this connection: they leave the store.
    ``final``: it will send no more (closing or gone); what is left goes back to its queue."""
    session = b.sessions.get(conn)
    ended = None
    if session is None:
        ended = b.unconfirmed.pop(conn, None) if final else b.unconfirmed.get(conn)
        if ended is None:
            return
        session = ended[0]
    if total > session.written:
        n = total - session.written
        session.written = total
        inflight = session.inflight
        store = b.store
        if not inflight:
            pass
        elif store is None and b.backplane is None and n >= len(inflight):
            inflight.clear()  # (the usual report: everything handed over so far is sent)
        elif store is None and b.backplane is None:
            _consume(starmap(inflight.popleft, repeat((), n)))
        else:  # each one leaves the store, or is acknowledged to JetStream
            for _ in range(min(n, len(inflight))):
                message, queue = inflight.popleft()
                queues.discard(b, queue, message)
        if not inflight:
            session.inflight = ()  # an empty deque is 760 bytes
    if final:
        session.written_final = True
        if ended is not None:
            return_unwritten(b, session)


def writer_restarted(b, index: int) -> None:
    """A writer died: nothing more of what it held will be sent."""
    for conn, (session, _) in list(b.unconfirmed.items()):
        if session.outbox.index == index:
            del b.unconfirmed[conn]
            return_unwritten(b, session)
    for session in b.sessions.values():
        if session.outbox.index == index:
            session.written_final = True


def expire_unconfirmed(b, now: float) -> None:
    for conn, (session, deadline) in list(b.unconfirmed.items()):
        if now >= deadline:
            del b.unconfirmed[conn]
            return_unwritten(b, session)


def return_unwritten(b, session: Session) -> None:
    """Deliveries the writer never sent go back to the head of their queues, marked redelivered."""
    if not session.inflight:
        return
    returned: dict[Queue, list] = {}
    for message, queue in session.inflight:
        queue.dequeued -= 1
        current = b.queues.get(queue.name)
        if current is None and queue.owner is None:
            current = queues.get_queue(b, queue.name)
        if current is None:  # its durable subscription was dropped meanwhile
            queues.discard(b, queue, message)
            continue
        message.redelivered = True
        returned.setdefault(current, []).append(message)
    session.inflight = ()
    for queue, messages in returned.items():
        queue.messages.extendleft(reversed(messages))
        queues.pump(b, queue)
