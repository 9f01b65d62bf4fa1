"""Operators' actions on the broker's state (the HTTP API's management actions, docs/admin.md):
peek at, purge, delete and move a queue's waiting messages, publish, close a connection, remove a
durable subscription, cancel scheduled messages.

Each runs as one event of the dispatcher (``Broker.manage``), so no consumer sees a queue between
a message leaving it and arriving elsewhere: a moved message is delivered once, never lost, never
twice. Only waiting messages are touched; those delivered and not yet acknowledged stay with their
consumer. What an action writes to the store goes in one commit, and its HTTP answer waits for
that commit (``replies.emit``). ``Refused`` carries the HTTP status of an action that cannot be done.
"""

from __future__ import annotations

from collections import deque
from itertools import chain, islice

from ..protocol.stomp import ProtocolError
from . import durables, priority, replies, routing, scheduling, vhosts
from .model import Later, Message, Queue
from .names import DIAG_PREFIX, MONITOR, QUEUE_PREFIX, TEMP_PREFIXES, short
from .queues import discard, drop_if_idle, get_queue, persist, pump

REDRIVEN_FROM = "redriven-from"            # added to a moved message: the queue it was moved from
ORIGINAL_DESTINATION = "original-destination"  # a dead letter's first destination (acks.dead_letter)
MOVE_MOST = 100_000    # messages one move takes at most in cluster mode when max_queue_messages is 0 (no limit)


class Refused(Exception):
    """An action that cannot be done as asked: ``status`` (HTTP) and ``reason``."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def check_target(b, destination: str) -> None:
    """A destination an operator may publish or move messages to."""
    if not destination or len(destination) > b.config.max_destination_length:
        raise Refused(400, f"a destination of 1 to {b.config.max_destination_length} characters is needed")
    if "*" in destination or destination == MONITOR or destination.startswith(DIAG_PREFIX) \
            or destination.startswith(TEMP_PREFIXES) or "\0" in destination or "\n" in destination:
        raise Refused(400, f"cannot send to {short(destination)!r} (a wildcard, temporary, DIAG or monitor "
                           "destination, or a control character)")


def waiting(queue: Queue):
    """A queue's waiting messages, in the order they are taken (``Queue.pop_oldest``)."""
    return chain(queue.parked, queue.blocked, queue.messages)


def peek(b, name: str, offset: int, count: int) -> tuple[int, list[Message]] | Later:
    """(messages waiting, up to ``count`` of them from ``offset``), nothing consumed. In cluster
    mode a queue's messages stored in JetStream, read there by the bridge: a ``Later`` of the same."""
    if b.backplane is not None:
        if not name.startswith(QUEUE_PREFIX) or name == MONITOR:
            return 0, []  # (only queues live in the cluster's queue streams)
        return b.backplane.queues.peek(b, name, offset, count, b.config.answer_bytes)
    queue = b.queues.get(name)
    if queue is None:
        return 0, []
    return queue.depth(), list(islice(waiting(queue), offset, offset + count))


def purge(b, name: str) -> int | Later:
    """Drop a queue's waiting messages; the number dropped (0 for an unknown queue: a retry is safe).
    In cluster mode the waiting messages are those JetStream has not handed to any node, which the
    bridge takes through the queue's consumer and terminates, and those this node pulled and has
    not delivered (acknowledged to JetStream here): a ``Later`` of (the number, cut short)."""
    if b.backplane is None:
        return _purge_here(b, name)
    if not name.startswith(QUEUE_PREFIX) or name == MONITOR:
        return 0  # (only queues live in the cluster's queue streams)
    return b.backplane.queues.purge(b, name, _purge_here(b, name))


def _purge_here(b, name: str) -> int:
    """Drop the waiting messages of this node's queue ``name`` (in cluster mode: those pulled, not
    delivered, which ``discard`` acknowledges to JetStream)."""
    queue = b.queues.get(name)
    if queue is None:
        return 0
    purged = 0
    for source in (queue.parked, queue.blocked, queue.messages):
        for message in source:
            discard(b, queue, message)
        purged += len(source)
        source.clear()
    b.rescan.discard(queue)
    drop_if_idle(b, queue)
    return purged


def delete(b, name: str) -> int | None | Later:
    """Forget a queue, its waiting messages and its counters; the messages dropped, None when there
    was no such queue. Refused while a subscription names it or a consumer holds its messages
    unacknowledged (they would come back to a queue nobody lists). In cluster mode the queue is its
    JetStream consumer and messages, shared by every node (``ClusterQueues.delete``): a ``Later`` of
    the same, refused there while a node pulls it or holds its messages unacknowledged."""
    if b.backplane is not None and (not name.startswith(QUEUE_PREFIX) or name == MONITOR):
        return None  # (only queues live in the cluster's queue streams)
    queue = b.queues.get(name)
    if queue is None and b.backplane is None:
        return None
    if queue is not None and queue.owner is not None:
        raise Refused(409, f"{short(name)} is a durable subscription's queue: remove the subscription "
                           "(DELETE /api/subscriptions/...)")
    subscribed = len(b.index.exact.get(name) or ())
    if subscribed or (queue is not None and queue.unacked):
        raise Refused(409, f"{short(name)} is in use ({subscribed} subscriptions, "
                           f"{queue.unacked if queue is not None else 0} messages unacknowledged): purge it, "
                           "or close its consumers first")
    if b.backplane is not None:
        if queue is not None and queue.depth():   # (pulled here, its consumers gone: going back to JetStream)
            raise Refused(409, f"{short(name)} is in use: this node is giving {queue.depth()} of its messages "
                               "back to the cluster; try again in a moment")
        return b.backplane.queues.delete(b, name)
    purged = purge(b, name)
    b.queues.pop(name, None)
    return purged


def move(b, name: str, to: str | None, count: int | None, accepts=None) -> tuple[int, int]:
    """Move up to ``count`` (None: all) waiting messages that ``accepts`` (a selector's predicate
    over headers, or None) to ``to``, in order, keeping their headers and adding ``redriven-from``.
    ``to`` None sends each to its ``original-destination`` (a dead letter's redrive, in the source's
    virtual host; messages without one stay). Names are the broker's (``vhosts.inside``). A queue
    target takes at most what it has room for (max_queue_messages).
    Returns (moved, still waiting in the source). In cluster mode the queue's waiting messages in
    JetStream (``ClusterQueues.move``): a ``Later`` of the same, done once every copy is stored."""
    if to is not None:
        check_target(b, to)
        if to == name:
            raise Refused(400, "a queue's messages cannot be moved to itself")
    if b.backplane is not None:
        return _move_in_cluster(b, name, to, count, accepts)
    queue = b.queues.get(name)
    if queue is None:
        return 0, 0
    vhost, shown = vhosts.split(name) if b.vhosts_on else (vhosts.DEFAULT, name)
    room: dict[str, int] = {}  # target queue -> messages it may still take
    limit = count if count is not None else queue.depth()
    taken: list[tuple[Message, str]] = []
    for source in (queue.parked, queue.blocked, queue.messages):
        if len(taken) >= limit:
            break
        kept = deque()
        for message in source:
            if message.expires and b.now >= message.expires:
                queue.expired += 1
                b.stats["messages_expired"] += 1
                discard(b, queue, message)
                continue
            target = to
            if target is None and ORIGINAL_DESTINATION in message.headers:
                target = vhosts.inside(vhost, message.headers[ORIGINAL_DESTINATION])
            if len(taken) >= limit or target is None or target == name \
                    or (accepts is not None and not accepts(message.headers)) or not _fits(b, target, room):
                kept.append(message)
            else:
                taken.append((message, target))
        source.clear()
        source.extend(kept)
    pumped: dict[str, Queue] = {}
    for message, target in taken:
        if message.seq:  # out of the source's rows; the copy's row is written in the same commit
            b.store.delete(message.seq)
            message.seq = 0
        headers = {**message.headers, REDRIVEN_FROM: shown}
        if target.startswith(QUEUE_PREFIX):
            into = pumped.get(target) or pumped.setdefault(target, get_queue(b, target))
            copy = Message(message.id, target, headers, message.body, message.expires)
            persist(b, into, copy)
            into.messages.append(copy)
            into.enqueued += 1
        else:
            routing.publish(b, target, headers, message.body, message.expires)
    for into in pumped.values():
        pump(b, into)
    left = queue.depth()
    drop_if_idle(b, queue)
    return len(taken), left


def _move_in_cluster(b, name: str, to: str | None, count: int | None, accepts) -> tuple[int, int] | Later:
    """``move`` in cluster mode: this decides which messages go where, the cluster's queues
    (``ClusterQueues.move``) take them from JetStream and store the copies (a full target refuses
    its copy there: the answer is then 409, the original stays)."""
    if not name.startswith(QUEUE_PREFIX) or name == MONITOR:
        return 0, 0  # (only queues live in the cluster's queue streams)
    if b.unfinished:  # (a copy to a topic would wait behind them, after the answer)
        raise Refused(503, "the node is busy writing a burst of deliveries; try again")
    vhost, shown = vhosts.split(name) if b.vhosts_on else (vhosts.DEFAULT, name)
    left = [count]
    later = Later()

    def choose(message: Message) -> str | None:
        if left[0] is not None and left[0] <= 0:
            return None
        target = to
        if target is None and ORIGINAL_DESTINATION in message.headers:
            target = vhosts.inside(vhost, message.headers[ORIGINAL_DESTINATION])
        if target is None or target == name or (accepts is not None and not accepts(message.headers)):
            return None
        if left[0] is not None:
            left[0] -= 1
        return target

    def elsewhere(target: str, headers: dict, body: bytes, expires: float) -> None:
        routing.publish(b, target, headers, body, expires, sender=later)

    want = count if count is not None else b.config.max_queue_messages or MOVE_MOST
    return b.backplane.queues.move(b, name, choose, elsewhere, {REDRIVEN_FROM: shown}, later,
                                   b.config.answer_bytes, want)


def _fits(b, target: str, room: dict) -> bool:
    """Whether ``target`` takes one more moved message (counting it when it does)."""
    if not target.startswith(QUEUE_PREFIX):
        return True
    left = room.get(target)
    if left is None:
        into = b.queues.get(target)
        left = b.config.max_queue_messages - (into.depth() if into is not None else 0)
    room[target] = left - 1
    return left > 0


def publish(b, destination: str, headers: dict, body: bytes) -> int | Later:
    """Publish a message as a SEND would (no receipt); the deliveries made now. In cluster mode a
    message JetStream keeps (a queue's, a durable or persistent topic's) goes the SEND's way
    (``ClusterQueues.publish``) and the answer waits as its receipt would: a ``Later``, done
    once JetStream stored it, failed (503, or 409 for a full queue) when it could not."""
    check_target(b, destination)
    if b.backplane is not None:
        try:
            routing.cluster_refuses(headers, destination, priority.DEFAULT, None)
        except ProtocolError as exc:
            raise Refused(400, exc.detail) from None
        if b.unfinished:  # (its publish would wait behind them, after the answer)
            raise Refused(503, "the node is busy writing a burst of deliveries; try again")
    queue = b.queues.get(destination)
    if queue is not None and queue.depth() >= b.config.max_queue_messages:
        raise Refused(409, f"{short(destination)} holds {queue.depth()} messages, the most allowed "
                           "(max_queue_messages)")
    if b.store is not None and routing.store_refuses(b, destination, headers):
        raise Refused(503, "the durable store cannot write (see the broker's log)")
    expires = 0.0
    if "expires" in headers or "expiration" in headers:
        try:
            expires = routing.expiry(b, headers, None)
        except Exception as exc:  # (a ProtocolError: the header's value)
            raise Refused(400, getattr(exc, "detail", "invalid expiry")) from None
    if b.backplane is None:
        return routing.publish(b, destination, headers, body, expires)
    later = Later()
    delivered = routing.publish(b, destination, headers, body, expires, sender=later)
    return b.backplane.answer_later(later, delivered)


def close_connection(b, conn: int, reason: str) -> bool:
    """Send a connection an ERROR with ``reason`` and close it; False when there is no such STOMP
    connection (or it is closing already)."""
    session = b.sessions.get(conn)
    if session is None or session.closing or session.protocol == "http":
        return False
    replies.error(b, session, "closed by an operator", reason)
    return True


def remove_durable(b, key: str) -> int | None | Later:
    """Remove a detached durable subscription and its waiting messages; the messages dropped, or
    None when there is no such subscription. Refused while a client is attached to it. In cluster
    mode every node that held a client of it keeps its record, and its messages wait in JetStream
    (``ClusterQueues.remove_durable``): a ``Later`` of the same, refused while a client is attached
    on any node."""
    if b.backplane is not None:
        return b.backplane.queues.remove_durable(b, key)
    durable = b.durables.get(key)
    if durable is None:
        return None
    if durable.sub is not None:
        raise Refused(409, "the durable subscription is attached to a connection: close that connection "
                           "first, or have its client UNSUBSCRIBE")
    dropped = durable.queue.depth()
    durables.drop(b, durable)
    return dropped


def cancel_scheduled(b, destination: str, job_id: str | None) -> int | None:
    """Cancel the scheduled message ``job_id`` of ``destination`` (None: every one of it); how many
    were cancelled, None when that one is not there (or is another destination's)."""
    if job_id is None:
        jobs = b.jobs.of(destination)
    else:
        job = b.jobs.by_id.get(job_id)
        if job is None or job.destination != destination:
            return None
        jobs = [job]
    for job in jobs:
        scheduling.cancel(b, job)
    return len(jobs)
