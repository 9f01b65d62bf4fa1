"""Queues: delivery (auto and tracked), pumping waiting messages to consumers with room,
parking and blocking, the scan budget, persistence of queued messages, idle-queue dropping.

``deliver`` and ``deliver_tracked`` return whether the session's outbox is over its limit; a pump
that sees it stops there and leaves itself in ``Broker.unfinished`` (see ``Broker.resume``)."""

from __future__ import annotations

from collections import deque

from ..ipc import records as R
from . import bounds
from .lastvalue import take_over
from .model import Delivery, Message, Queue, Subscription
from .names import REDELIVERED
from .subscriptions import SubscriptionIndex
from .vhosts import reaches


def deliver(b, sub: Subscription, message: Message, queue: Queue | None) -> bool:
    """Append one delivery; True when the outbox is now over its limit."""
    if sub.tracked:
        return deliver_tracked(b, sub, message, queue)
    session = sub.session
    shared = message.shared(session.escape)
    mark = 0
    if queue is not None:  # it leaves the store (or goes back to the queue) once the writer says
        queue.dequeued += 1
        if session.inflight:
            session.inflight.append((message, queue))
        else:
            session.inflight = deque(((message, queue),))
        mark = R.WRITTEN_MARK
    if message.redelivered:
        return session.outbox.add3(session.conn, sub.prefix, REDELIVERED, shared, mark)
    return session.outbox.add2(session.conn, sub.prefix, shared, mark)


def deliver_tracked(b, sub: Subscription, message: Message, queue: Queue | None) -> bool:
    session = sub.session
    if queue is None and (session.closing or not bounds.deliver_unacked(b, session, len(message.body))):
        return False  # (a topic message: nothing holds it back but the connection's bound)
    ack_id = f"{b.token}-a{next(b.ack_ids)}"
    sub.unacked[ack_id] = Delivery(ack_id, message, queue, message.nacks)
    b.acks[ack_id] = sub
    extra = b"ack:" + ack_id.encode() + b"\n"
    if message.redelivered or message.nacks:
        extra += REDELIVERED
    over = session.outbox.add3(session.conn, sub.prefix, extra, message.shared(session.escape))
    if queue is not None:
        queue.unacked += 1
        if message.seq:
            b.store.mark_delivered(message.seq)
    return over


def get_queue(b, name: str) -> Queue:
    queue = b.queues.get(name)
    if queue is None:
        queue = b.queues[name] = Queue(name)
    return queue


def enqueue(b, name: str, message: Message) -> int:
    """A message sent to the queue ``name``: kept (in the store too), then handed on by the pump;
    returns the deliveries made now."""
    queue = b.queues.get(name)
    if queue is None:
        queue = b.queues[name] = Queue(name)
    if queue.last_values is not None:  # a newer message takes the place of its key's (lastvalue.py)
        old = take_over(queue, message)
        if old is not None:
            discard(b, queue, old)
    if b.store is not None:
        persist(b, queue, message)
    return arrive(b, queue, message)


def arrive(b, queue: Queue, message: Message) -> int:
    """A message kept by its queue (``enqueue``'s last step; a plain SEND's short route to a queue
    that holds nothing, ``routing.send_plain``): handed over where nothing waits, else pumped."""
    queue.enqueued += 1
    if not queue.messages and queue.chooser is None and not b.unfinished and hand_over(b, queue, message):
        return 1
    queue.messages.append(message)
    return pump(b, queue)


def hand_over(b, queue: Queue, message: Message) -> bool:
    """A message for a queue where nothing waits, given to the next consumer with room that accepts
    it, as ``pump`` would give it; False (nothing done) when there is none: the pump decides then."""
    sub, queue.rr, _ = next_taker(consumers(b, queue), queue.rr, message.headers, None)
    if sub is None:
        return False
    b.examined += 1
    b.stats["messages_delivered"] += 1
    if deliver(b, sub, message, queue):  # outbox over its limit: drained before what follows
        b.unfinished.append((pump, (queue, False)))
    if not queue.unacked:
        drop_if_idle(b, queue)
    return True


def next_taker(subs: tuple, rr: int, headers: dict, skip) -> tuple:
    """(the first consumer from ``rr`` on, round-robin, with room that accepts a message of
    ``headers`` and is not ``skip``, or None; the round-robin position after it, else ``rr``;
    whether any consumer had room)."""
    n = len(subs)
    room = False
    for i in range(n):
        sub = subs[(rr + i) % n]
        if sub.prefetch and len(sub.unacked) >= sub.prefetch:  # (Subscription.has_room, inlined)
            continue
        room = True
        if sub is not skip and (sub.accepts is None or sub.accepts(headers)):
            return sub, (rr + i + 1) % n, True
    return None, rr, room


def persist(b, queue: Queue, message: Message, log: bool = True) -> None:
    """Write a queued message to the durable store, unless sent with persistent:false; ``log``: and
    to the replay log (a durable subscription's copy is not: its topic message is, once)."""
    if b.store is None or message.headers.get("persistent") == "false":
        return
    expires_ms = (message.expires - b.now + b.clock()) * 1000 if message.expires else 0.0
    message.seq = b.store.insert(queue.name, message.id, message.headers, message.body, expires_ms)
    if log:
        b.store.log(message.destination, message.id, message.headers, message.body)


def discard(b, queue: Queue, message: Message) -> None:
    """A queued message is done with: written to an auto-ack consumer, expired, or pushed out of a
    full queue. It leaves the store, or is settled with JetStream in cluster mode."""
    if message.seq:
        b.store.delete(message.seq)
        message.seq = 0
    if b.backplane is not None:  # a message pulled from JetStream is acknowledged there
        b.backplane.queues.settled(message)


def consumers(b, queue: Queue) -> tuple:
    if queue.owner is not None:
        return (queue.owner.sub,) if queue.owner.sub is not None else ()
    return b.index.match(queue.name)


def pump(b, queue: Queue, room: bool = False) -> int:
    """Hand waiting messages to subscribers with room, round-robin; returns deliveries made.

    The work is bounded whatever the selectors. A message is examined when it arrives: no
    consumer's selector accepts it, it is *parked* (looked at again only when a consumer
    subscribes); only full consumers accept it, it is *blocked* (looked at again, oldest first,
    only when ``room`` says a consumer may have room: an ACK, a NACK, a new subscription). One
    call examines at most ``queue_scan_budget`` messages it cannot deliver; a call that stopped
    there while parking is continued by the next tick. A delivery that fills its outbox stops the
    call too; the dispatcher drains the outboxes and calls it again (``Broker.resume``). While
    anything is unfinished the call itself waits its turn there, so deliveries keep their order.
    """
    if b.unfinished:
        b.unfinished.append((pump, (queue, room)))
        return 0
    subs = consumers(b, queue)
    if not subs or not (queue.messages or (room and queue.blocked)):
        drop_if_idle(b, queue)  # (an ACK may have taken its last message)
        return 0
    budget = b.config.queue_scan_budget
    delivered = 0
    if room and queue.blocked:
        delivered, budget = scan(b, queue, subs, queue.blocked, budget, room)
    if budget > 0 and not b.unfinished:
        more, budget = scan(b, queue, subs, queue.messages, budget, room)
        delivered += more
    b.stats["messages_delivered"] += delivered
    if not (queue.messages or queue.unacked):  # (the cheap part of drop_if_idle's test first)
        drop_if_idle(b, queue)
    return delivered


def scan(b, queue: Queue, subs: tuple, source, budget: int, room: bool = False) -> tuple[int, int]:
    """Deliver from ``source`` while some consumer has room; returns (deliveries, budget left)."""
    still_blocked = []
    delivered = parked = 0
    now = b.now
    chooser = queue.chooser
    while source:
        if budget <= 0:
            if parked:
                b.rescan.add(queue)
            break
        message = source[0]
        headers = message.headers
        avoid = message.avoid
        rr = queue.rr
        chosen = None
        any_room = False
        if chooser is not None:  # exclusive consumers, consumer priority, message groups (choosing.py)
            chosen, any_room = chooser.choose(subs, message, avoid)
        # A NACKed message goes to another subscriber if any: a first pass skips the one it avoids.
        for skip in () if chooser is not None else (avoid, None) if avoid is not None else (None,):
            chosen, rr, some_room = next_taker(subs, rr, headers, skip)
            any_room = any_room or some_room
            if chosen is not None:
                break
        if not any_room:
            break  # every consumer is full: the message stays first
        source.popleft()
        if message.expires and now >= message.expires:
            queue.expired += 1
            b.stats["messages_expired"] += 1
            discard(b, queue, message)
            continue
        b.examined += 1
        if chosen is not None:
            queue.rr = rr
            message.avoid = None
            delivered += 1
            if deliver(b, chosen, message, queue):  # outbox over its limit: drained, then resumed
                b.unfinished.append((pump, (queue, room)))
                break
            continue
        budget -= 1
        if any(not sub.has_room() and (sub.accepts is None or sub.accepts(headers)) for sub in subs):
            still_blocked.append(message)  # waits for a full consumer; later messages may still go
        elif queue.owner is not None:
            # A durable subscription's selector is fixed while it is attached: what it rejects
            # is not for it, as if it had been filtered out when published.
            b.stats["messages_dropped"] += 1
            discard(b, queue, message)
        else:
            queue.parked.append(message)
            parked += 1
    if still_blocked:
        if source is queue.blocked:
            source.extendleft(reversed(still_blocked))  # in order, ahead of the younger ones
        else:
            queue.blocked.extend(still_blocked)
    return delivered, budget


def drop_if_idle(b, queue: Queue) -> None:
    """Forget a queue that holds nothing and that no subscription names exactly.

    Destination names are chosen by clients: an idle queue must cost nothing, or a client that
    walks through names grows the broker for good. Wildcard subscribers do not keep a queue
    alive (the next message makes it again); its counters go with it.
    """
    if (queue.owner is None and not queue.unacked and not b.index.exact.get(queue.name)
            and not queue.depth() and b.queues.get(queue.name) is queue):
        del b.queues[queue.name]
        b.rescan.discard(queue)


def unpark(b, queue: Queue) -> None:
    """A consumer came: parked messages are candidates again, ahead of the rest (they are older)."""
    if queue.parked:
        queue.messages.extendleft(reversed(queue.parked))
        queue.parked.clear()


def queues_for(b, pattern: str) -> list[Queue]:
    prefix = SubscriptionIndex.wildcard_prefix(pattern)
    if prefix is None:
        queue = b.queues.get(pattern)
        return [queue] if queue is not None else []
    return [q for name, q in b.queues.items()
            if name.startswith(prefix) and (not b.vhosts_on or reaches(prefix, name))]


def sub_queues(b, sub: Subscription) -> list[Queue]:
    """The queues a subscription takes from."""
    if sub.durable is not None:
        return [sub.durable.queue]
    if sub.temp is not None:
        return [sub.temp.queue] if sub.temp.queue is not None else []
    return queues_for(b, sub.destination)
