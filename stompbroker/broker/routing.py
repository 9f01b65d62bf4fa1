"""SEND and publishing: destination checks, permissions, expiry, and routing a message to a
queue, temporary destination, durable subscriptions, `#` worker queue or topic subscribers (or the
TTL stale queue when nobody takes it)."""

from __future__ import annotations

import logging

from ..diag.stats import QUERIES
from ..ipc import records as R
from ..protocol.stomp import ProtocolError
from . import dedup, diagnostics, lastvalue, permissions, priority, replies, schedule, scheduling, temporary
from .model import Message, Session
from .names import (DIAG_PREFIX, MAX_MILLIS, MONITOR, QUEUE_PREFIX, REPLY_PREFIXES, TEMP_PREFIXES, WORKER_PREFIX,
                    millis)
from .choosing import GROUP, Chooser
from .queues import arrive, deliver, deliver_tracked, discard, drop_if_idle, enqueue, get_queue, persist, pump

log = logging.getLogger("stompbroker.broker")


# Headers of a SEND that ask for more than a plain publish: one set test finds them all.
SPECIAL = frozenset(("reply-to", "expires", "expiration", "priority", GROUP, *lastvalue.NAMES, *schedule.NAMES,
                     scheduling.ACTION))
SCHEDULED = frozenset(schedule.NAMES)

# A plain SEND's short routes (``plain_route``): none, a topic's subscriptions, an empty queue's consumers.
ANY, TOPIC, QUEUE = 0, 1, 2


def send(b, session: Session, command: str, headers: dict, body: bytes) -> tuple | None:
    """Check and route a SEND. A plain one (no receipt, temporary destination, special header or
    DIAG destination) returns (destination, headers as they were before routing, the short route its
    head allows: ``plain_route``), for the next SEND with the same head (``Broker.send_again``)."""
    # The common SEND (no temporary destination, no permissions, memory store, no special header)
    # costs one test per rule here: each rule's function runs only when it can apply.
    receipt = headers.get("receipt")
    destination = check_send(headers, receipt)
    temp = destination.startswith(TEMP_PREFIXES)
    special = not SPECIAL.isdisjoint(headers)
    if not (temp or special or receipt is not None or destination.startswith(DIAG_PREFIX)):
        # (a message's headers are its own once routed)
        plain = (destination, headers.copy(), plain_route(destination, headers))
        send_plain(b, session, destination, headers, body, route=plain[2])
        return plain
    if (b.auth is not None or b.config.diag_admin_only) and not temp:  # (its own temporaries are its own)
        permissions.allowed(b, session, destination, write=True, receipt=receipt)
    if temp or (special and "reply-to" in headers):
        destination = temporary.temporaries(b, session, headers, destination, receipt)
    if destination.startswith(DIAG_PREFIX) and b.diag is not None:
        query = body.decode(errors="replace").strip()
        if query in QUERIES:
            headers = {**headers, **b.diag.headers(query, diagnostics.offset(headers, receipt),
                                                   diagnostics.scope(b, session, headers, receipt))}
    check_accepts(b, destination, headers, receipt)
    if special:
        send_special(b, session, destination, headers, body, receipt)
    else:
        publish(b, destination, headers, body, sender=session)
    if receipt is not None:
        replies.send_receipt(b, session, receipt)
    return None


def send_plain(b, session: Session, destination: str, headers: dict, body: bytes, copy: bool = False,
               route: int = ANY) -> None:
    """A plain SEND: what may change from one SEND to the next (the session's permissions, the
    store's health, the queue's room) is checked, then it is published (``copy``: with a copy of
    ``headers``). ``route`` (``plain_route`` of its head) may let it skip ``publish``:

    - TOPIC, with no durable subscription or unfinished step to change its route: where nothing on
      this node subscribes to the topic and nothing else could keep the message, it is counted as
      published and dropped, as publish would, or in cluster mode packed for the other nodes that
      want it, without making a message; else it goes by ``publish_topic``.
    - QUEUE, on a broker with no store, no cluster and no unfinished step: to a queue that holds
      nothing and picks its consumers by round robin, the message goes by ``queues.arrive`` (an
      empty queue has room, and nothing else ``publish`` or ``enqueue`` looks at applies to it)."""
    if b.auth is not None or b.config.diag_admin_only:
        permissions.allowed(b, session, destination, write=True, receipt=None)
    subs = None
    if route == TOPIC:
        subs = b.index.match(destination)
        if not (b.unfinished or b.durables):
            backplane = b.backplane
            if not subs:
                if backplane is None:
                    if b.stale is None:
                        stats = b.stats
                        stats["messages_published"] += 1
                        stats["messages_dropped"] += 1
                        return
                elif backplane.publish_plain(b, destination, headers, body, session):
                    return  # (only other nodes hear it: no message is made for it here)
            check_accepts(b, destination, headers, None)
            publish_topic(b, session, destination, headers.copy() if copy else headers, body, subs)
            return
    elif route == QUEUE and b.store is None and b.backplane is None and not b.unfinished:
        queue = b.queues.get(destination)
        if (queue is not None and not (queue.messages or queue.parked or queue.blocked)
                and queue.chooser is None and queue.last_values is None):
            b.stats["messages_published"] += 1
            arrive(b, queue, Message(f"{b.token}-{next(b.message_ids)}", destination,
                                     headers.copy() if copy else headers, body))
            return
    check_accepts(b, destination, headers, None)
    publish(b, destination, headers.copy() if copy else headers, body, sender=session, subs=subs)


def publish_topic(b, session: Session, destination: str, headers: dict, body: bytes, subs: tuple) -> None:
    """``publish`` for a plain SEND whose head only topic subscriptions can take (``plain_route`` TOPIC:
    not persistent, so the store never logs it) on a broker with no durable subscription and no
    unfinished step: the same route, without the checks its head has passed."""
    b.stats["messages_published"] += 1
    message = Message(f"{b.token}-{next(b.message_ids)}", destination, headers, body)
    kept = 0
    backplane = b.backplane
    if backplane is not None:
        if backplane.durables_by:  # (another node's durable subscription may want it kept in JetStream)
            backplane.queues.takes(b, message, session)
        if backplane.remote_by and backplane.publish(b, message, session):
            kept = 1
    fan_out(b, message, subs, kept)


# Destinations publish routes elsewhere than to a topic's subscriptions, kept or dropped.
NOT_TOPIC = (QUEUE_PREFIX, WORKER_PREFIX, DIAG_PREFIX, *REPLY_PREFIXES)


def plain_route(destination: str, headers: dict) -> int:
    """The short route a plain SEND of this head may take (``send_plain``): TOPIC where it can only
    reach its topic's subscriptions (or durable subscriptions, the stale queue or other nodes, which
    ``send_plain`` looks at for each): no queue, worker, DIAG or temporary destination, no
    de-duplication id, nothing for the store's log; QUEUE for a /queue/ destination with no
    de-duplication id; else ANY (``publish``)."""
    if dedup.HEADER in headers:
        return ANY
    if destination.startswith(QUEUE_PREFIX):
        return QUEUE
    if destination.startswith(NOT_TOPIC) or headers.get("persistent") == "true":
        return ANY
    return TOPIC


def check_accepts(b, destination: str, headers: dict, receipt) -> None:
    """The store and the queue can take the message, or an ERROR."""
    if b.store is not None and store_refuses(b, destination, headers):
        raise ProtocolError("store unavailable", "the durable store cannot write (see the broker's log); "
                            "the message was not accepted", receipt)
    queue = b.queues.get(destination)
    if queue is None and destination in b.temps:
        queue = b.temps[destination].queue
    if queue is not None and queue.depth() >= b.config.max_queue_messages:
        raise ProtocolError("queue full", f"{destination} holds {queue.depth()} messages, "
                            f"the most allowed (max_queue_messages)", receipt)


def send_special(b, session: Session, destination: str, headers: dict, body: bytes, receipt) -> None:
    """A SEND with an expiry, a priority, a message group, a last-value key, a schedule, or a
    scheduler management action: checked, then applied."""
    expires = expiry(b, headers, receipt) if "expires" in headers or "expiration" in headers else 0.0
    level, spec = check_special(b, session, destination, headers, receipt)
    apply_special(b, session, destination, headers, body, expires, level, spec, receipt)


def check_special(b, session: Session, destination: str, headers: dict, receipt) -> tuple:
    """(priority level, schedule or None) of a SEND with special headers; what is wrong with them,
    or what cluster mode cannot keep, is an ERROR. Also run when a transaction holds the SEND."""
    level = priority.check(headers, receipt) if "priority" in headers else priority.DEFAULT
    if b.backplane is not None:
        cluster_refuses(headers, destination, level, receipt)
    spec = scheduling.accept(b, session, destination, headers, receipt) if not SCHEDULED.isdisjoint(headers) \
        else None
    return level, spec


def apply_special(b, session: Session, destination: str, headers: dict, body: bytes, expires: float, level: int,
                  spec, receipt) -> None:
    """Scheduled (scheduling.py), a scheduler management action, or published (``publish_special``)."""
    if scheduling.ACTION in headers and scheduling.is_management(destination):
        reply_to = headers.get("reply-to")
        if reply_to and (b.auth is not None or b.config.diag_admin_only) \
                and not reply_to.startswith(TEMP_PREFIXES + REPLY_PREFIXES):  # (its own temporaries are its own)
            permissions.allowed(b, session, reply_to, write=True, receipt=receipt)  # the jobs go there
        for reply_to, reply, content in scheduling.manage(b, session, headers, receipt):
            publish(b, reply_to, reply, content)
    elif spec is not None:
        scheduling.add(b, destination, headers, body, spec, scheduling.ttl_of(b, headers, expires))
    else:
        publish_special(b, destination, headers, body, expires, level, session)


def publish_held(b, session: Session, headers: dict, body: bytes, expires: float) -> None:
    """A SEND a transaction held (checked then), at its COMMIT."""
    destination = headers["destination"]
    if SPECIAL.isdisjoint(headers):
        publish(b, destination, headers, body, expires, sender=session)
    else:
        level, spec = check_special(b, session, destination, headers, None)
        apply_special(b, session, destination, headers, body, expires, level, spec, None)


def cluster_refuses(headers: dict, destination: str, level: int, receipt) -> None:
    """The features cluster mode cannot keep get an ERROR naming them (docs/cluster.md)."""
    if level != priority.DEFAULT:
        raise ProtocolError("priority not supported in cluster mode", "a cluster's queues are JetStream "
                            "streams, delivered in stream order: send without priority (or priority:4)", receipt)
    if destination.startswith(QUEUE_PREFIX) and GROUP in headers:
        raise ProtocolError("message groups not supported in cluster mode", "a cluster's queue is read "
                            "by every node's consumers: send without JMSXGroupID", receipt)
    if destination.startswith(QUEUE_PREFIX) and lastvalue.key_of(headers) is not None:
        raise ProtocolError("last-value queues not supported in cluster mode", "a cluster's queue is a "
                            "JetStream stream: send without _AMQ_LVQ_NAME or last-value-key", receipt)


def publish_special(b, destination: str, headers: dict, body: bytes, expires: float, level: int,
                    sender=None) -> None:
    """Publish a message with a priority, a group or a last-value key (or only an expiry). A
    priority other than 4 ranks the queues it may wait in (after the publish); a group gives its
    queue a chooser first, so it goes to the group's consumer; a key gives its queue the
    last-value index first, so it replaces its key's waiting message."""
    made = None
    if destination.startswith(QUEUE_PREFIX):
        if GROUP in headers:
            made = choosing_queue(b, destination)
        if lastvalue.key_of(headers) is not None:
            made = get_queue(b, destination)
            if made.last_values is None:
                made.last_values = lastvalue.index(made)
    publish(b, destination, headers, body, expires, sender=sender)
    if level != priority.DEFAULT:
        priority.rank_destination(b, destination)
    if made is not None and not b.unfinished:
        drop_if_idle(b, made)  # (nothing stayed in it: expired, say)


def fire_due(b, now_ms: float) -> int:
    """Publish the scheduled messages due by ``now_ms`` (at most ``scheduled_batch`` at a time:
    the dispatcher comes back for the rest); returns how many fired. Not while an earlier step
    is unfinished: a firing and its job's next state go to the store together."""
    if b.unfinished:
        return 0
    jobs = b.jobs.due(now_ms, b.config.scheduled_batch)
    for i, job in enumerate(jobs):
        if b.unfinished:  # a delivery filled an outbox: the rest wait for the next round, still due
            for later in jobs[i:]:
                b.jobs.again(later)
            return i
        try:
            headers, expires = scheduling.firing(b, job)
            publish_special(b, job.destination, headers, job.body, expires, priority.level_of(headers))
        except Exception:  # a bug costs this job, never the dispatcher (nor a crash at every start after)
            log.exception("scheduled message %s to %s dropped: delivering it failed", job.id, job.destination)
            scheduling.cancel(b, job)
            continue
        scheduling.fired(b, job)
    return len(jobs)


def choosing_queue(b, name: str):
    """The queue ``name``, made if need be, with a chooser (choosing.py)."""
    queue = get_queue(b, name)
    if queue.chooser is None:
        queue.chooser = Chooser(b.config.max_message_groups)
    return queue


def check_send(headers: dict, receipt) -> str:
    destination = headers.get("destination")
    if not destination:
        raise ProtocolError("missing destination", "SEND needs a destination header", receipt)
    if "*" in destination:
        raise ProtocolError("wildcard destination", f"cannot SEND to a wildcard destination: {destination}",
                            receipt)
    if destination == MONITOR:
        raise ProtocolError("reserved destination", f"{MONITOR} is written by the broker only", receipt)
    return destination


def expiry(b, headers: dict, receipt) -> float:
    """Monotonic deadline from ActiveMQ's `expires` (epoch ms) or RabbitMQ's `expiration` (ms)."""
    absolute, relative = headers.get("expires"), headers.get("expiration")
    if absolute is None and relative is None:
        return 0.0
    try:
        if absolute is not None and absolute.strip() not in ("", "0"):
            return b.now + (millis(absolute) / 1000 - b.clock()) or 1e-9
        if relative is not None:
            return b.now + millis(relative) / 1000 or 1e-9
    except ValueError:
        raise ProtocolError("invalid expiry", "expires and expiration must be integers from 0 to "
                            f"{MAX_MILLIS} (milliseconds)", receipt) from None
    return 0.0


def store_refuses(b, destination: str, headers: dict) -> bool:
    """A persistent SEND while the store has been failing past store_error_timeout_ms."""
    store = b.store
    if store is None or not store.failing_since or headers.get("persistent") == "false":
        return False
    if b.now - store.failing_since < b.config.store_error_timeout_ms / 1000:
        return False
    return destination.startswith(QUEUE_PREFIX) or headers.get("persistent") == "true" \
        or bool(b.durables and b.durable_index.match(destination))


def publish(b, destination: str, headers: dict, body: bytes, expires: float = 0.0, origin: str | None = None,
            sender=None, subs: tuple | None = None) -> int:
    """Route one message; returns the number of deliveries made now. ``origin``: the id of a message
    another node of the cluster published (delivered here only, never kept or sent on). ``sender``:
    its sender's session, whose replies wait while the message waits for the cluster (cluster mode).
    ``subs``: the destination's subscriptions, where the caller has just looked them up.

    While an earlier part of the event is unfinished (stopped over an outbox's limit), the whole
    publish waits its turn in ``Broker.unfinished``, so no delivery overtakes an earlier one.
    """
    if b.unfinished:
        b.unfinished.append((publish, (destination, headers, body, expires, origin, sender)))
        return 0
    if origin is None:
        if dedup.HEADER in headers and dedup.repeated(b, destination, headers):
            return 0  # stored once already within dedup_window (cluster mode: JetStream de-duplicates)
        b.stats["messages_published"] += 1
    message = Message(origin or f"{b.token}-{next(b.message_ids)}", destination, headers, body, expires)
    if expires and message.expired(b.now):
        b.stats["messages_expired"] += 1
        return 0
    if destination.startswith(REPLY_PREFIXES):
        return temporary.publish(b, destination, message)
    if b.config.diag_admin_only and destination.startswith(DIAG_PREFIX):
        return diag_answer(b, message)
    if b.backplane is not None and origin is None and b.backplane.queues.takes(b, message, sender):
        return 0  # a queue message: JetStream has it now, and the node with room will deliver it
    if destination.startswith(QUEUE_PREFIX):
        return enqueue(b, destination, message)
    kept = 0
    persistent = headers.get("persistent")
    if b.store is not None and (persistent == "true" or (persistent != "false" and b.durables
                                                         and b.durable_index.match(destination))):
        b.store.log(destination, message.id, headers, body)  # once, for replay-from and replay-from-seq
    if b.durables and b.backplane is None:  # (in cluster mode durables read JetStream)
        for durable in b.durable_index.match(destination):
            copy = Message(message.id, destination, headers, body, expires)
            persist(b, durable.queue, copy, log=False)
            durable.queue.messages.append(copy)
            durable.queue.enqueued += 1
            if durable.queue.depth() > b.config.max_queue_messages:
                discard(b, durable.queue, durable.queue.pop_oldest())  # oldest goes
            pump(b, durable.queue)
            kept += 1
    if subs is None:
        subs = b.index.match(destination)
    if origin is not None:
        kept += 1  # from another node: delivered here or nowhere, never kept nor sent on
    elif b.backplane is not None:
        # other nodes' share, as a record for the bridge (local deliveries never wait for it)
        if destination.startswith(WORKER_PREFIX):
            if b.backplane.worker(b, message, subs, sender):
                return 0  # another node's subscription takes it
        elif b.backplane.publish(b, message, sender):
            kept += 1  # it reached someone elsewhere: not for the stale queue
    if b.unfinished:  # a durable subscription's pump stopped over an outbox's limit: the rest follows it
        b.unfinished.append((fan_out, (message, subs, kept, False)))
        return 0
    if destination.startswith(WORKER_PREFIX):
        delivered = deliver_round_robin(b, destination, subs, message)
        b.stats["messages_delivered"] += delivered
        if not (delivered or kept):
            unclaimed(b, message)
        return delivered
    return fan_out(b, message, subs, kept)


def diag_answer(b, message: Message) -> int:
    """A message to a DIAG destination carries statistics (``send`` added them): with
    diag_admin_only it goes to the admins subscribed now and nowhere else (not to a user's
    wildcard subscription, not kept for later, not to other nodes)."""
    auth = b.auth
    subs = tuple(sub for sub in b.index.match(message.destination)
                 if auth is not None and auth.is_admin(sub.session.login))
    return fan_out(b, message, subs, 1)


def fan_out(b, message: Message, subs: tuple, kept: int, some: bool = False) -> int:
    """Deliver a topic message to ``subs``, in order; returns the deliveries made.

    A delivery that takes its outbox over the limit stops the loop: the subscriptions not yet
    served wait in ``Broker.unfinished`` (``some``: deliveries were made before the stop). Plain
    deliveries in a row to one outbox go as one record (``Outbox.add_each``; from EACH_FROM
    subscriptions), which is when the limit is looked at.
    """
    if message.destination.startswith(WORKER_PREFIX):  # (when the round-robin waited its turn)
        delivered = deliver_round_robin(b, message.destination, subs, message)
        b.stats["messages_delivered"] += delivered
        if not (delivered or kept):
            unclaimed(b, message)
        return delivered
    if len(subs) < EACH_FROM:  # a few (most fan-outs): a record each
        headers = message.headers
        delivered = 0
        stop = None
        for sub in subs:
            if sub.accepts is not None and not sub.accepts(headers):
                continue
            delivered += 1
            session = sub.session
            if sub.tracked:
                over = deliver_tracked(b, sub, message, None)
            else:
                over = session.outbox.add2(session.conn, sub.prefix, message.shared(session.escape))
            if over:
                stop = subs.index(sub) + 1  # (found only when stopping: nothing per delivery)
                break
    else:
        delivered, stop = _gathering(b, message, subs)
    if stop is not None:
        # (with no subscription left, the empty step still stops the caller: the outbox goes to
        # the ring before anything more is added)
        b.stats["messages_delivered"] += delivered
        b.unfinished.append((fan_out, (message, subs[stop:], kept, True)))
        return delivered
    if delivered:
        b.stats["messages_delivered"] += delivered
    elif not (some or kept):
        unclaimed(b, message)
    return delivered


def _gathering(b, message: Message, subs: tuple) -> tuple[int, int | None]:
    """``fan_out``'s deliveries from EACH_FROM subscriptions: (deliveries, where a delivery took its
    outbox over the limit, or None). Plain deliveries in a row to one outbox with one rendering are
    gathered and go as one record (Outbox.add_each): the writer gets the rendered part once, not
    once per connection."""
    headers = message.headers
    delivered = 0
    escaped_part = plain_part = None
    box = part = first = None
    entries: list = []  # the gathered subscriptions' DATA_EACH entries
    size = 0            # ... their bytes
    for i, sub in enumerate(subs):
        if sub.accepts is not None and not sub.accepts(headers):
            continue
        session = sub.session
        if sub.tracked:
            if entries:
                over = _gathered(box, entries, part, first)
                entries, box = [], None  # (the next plain one starts a record of its own)
                if over:
                    return delivered, i
            delivered += 1
            if deliver_tracked(b, sub, message, None):
                return delivered, i + 1
            continue
        if session.escape:
            if escaped_part is None:
                escaped_part = message.shared(True)
            mine = escaped_part
        else:
            if plain_part is None:
                plain_part = message.shared(False)
            mine = plain_part
        entry = sub.each or _entry(sub)
        size += len(entry)
        if session.outbox is not box or mine is not part or size > EACH_BYTES:
            if entries:
                over = _gathered(box, entries, part, first)
                entries = []
                if over:
                    return delivered, i
            box, part, first, size = session.outbox, mine, sub, len(entry)
        entries.append(entry)
        delivered += 1
    if entries and _gathered(box, entries, part, first):
        return delivered, len(subs)
    return delivered, None


EACH_FROM = 4  # subscriptions from which a fan-out gathers its deliveries into DATA_EACH records
# A DATA_EACH record's entries take at most this many bytes (more start another record): with its
# part (a frame, max_frame_size) it stays within a quarter of a ring like any record.
EACH_BYTES = 64 * 1024


def _gathered(box, entries: list, part: bytes, first) -> bool:
    """Write the deliveries gathered for one outbox (``first``: the first one's subscription) as one
    record; True when the outbox is now over its limit."""
    if len(entries) == 1:
        return box.add2(first.session.conn, first.prefix, part)
    return box.add_each(entries, part)


def _entry(sub) -> bytes:
    sub.each = R.each_entry(sub.session.conn, sub.prefix)
    return sub.each


def unclaimed(b, message: Message) -> None:
    """A topic message nobody took goes to the TTL stale queue, or is counted as dropped."""
    if b.stale is not None:
        b.stale.add(message, b.now)
    else:
        b.stats["messages_dropped"] += 1


def deliver_round_robin(b, destination: str, subs: tuple, message: Message) -> int:
    n = len(subs)
    start = b.worker_rr.get(destination, 0)
    for i in range(n):
        sub = subs[(start + i) % n]
        if sub.has_room() and (sub.accepts is None or sub.accepts(message.headers)):
            b.worker_rr[destination] = (start + i + 1) % n
            deliver(b, sub, message, None)
            return 1
    return 0
