"""SUBSCRIBE and UNSUBSCRIBE: ids, ack modes, prefetch, filters and selectors, permissions, and
what a new subscription takes (parked queue messages, the stale queue, replay)."""

from __future__ import annotations

from ..protocol.stomp import ProtocolError
from . import bounds, browsing, choosing, durables, permissions, queues, replayseq, replies, temporary
from .model import NO_ENTRIES, Queue, Session, Subscription, Temp
from .names import ACK_MODES, QUEUE_PREFIX, REPLY_PREFIXES, TEMP_PREFIXES, short
from .selector import SelectorError, compile_selector
from .subscriptions import SubscriptionIndex


def subscribe(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    receipt = headers.get("receipt")
    destination = headers.get("destination")
    if not destination:
        raise ProtocolError("missing destination", "SUBSCRIBE needs a destination header", receipt)
    sub_id = headers.get("id")
    if sub_id is None:
        if session.version != "1.0":
            raise ProtocolError("missing id", "SUBSCRIBE needs an id header", receipt)
        sub_id = destination  # STOMP 1.0 made the id optional
    if sub_id in session.subs:
        raise ProtocolError("duplicate subscription", f"subscription id {sub_id!r} is already in use", receipt)
    ack = headers.get("ack", "auto")
    if ack not in ACK_MODES:
        raise ProtocolError("invalid ack mode", f"ack must be one of {', '.join(ACK_MODES)}, not {ack!r}",
                            receipt)
    temp = None
    if headers.get("browser") == "true":  # (a copy of what waits, then nothing: no subscription is kept)
        if destination.startswith(TEMP_PREFIXES + REPLY_PREFIXES):
            raise ProtocolError("cannot browse a temporary destination", f"{destination} cannot be browsed",
                                receipt)
        permissions.allowed(b, session, destination, write=False, receipt=receipt)
        browsing.browse(b, session, sub_id, destination, make_filter(b, headers, receipt), receipt)
        return
    if destination.startswith(TEMP_PREFIXES):
        temp = temp_for_subscribe(b, session, destination, receipt)
    elif destination.startswith(REPLY_PREFIXES):
        raise ProtocolError(f"permission denied for {destination}", "a reply destination is read only by the "
                            "connection that made it, by its /temp-queue/ or /temp-topic/ name", receipt)
    else:
        permissions.allowed(b, session, destination, write=False, receipt=receipt)
    if len(session.subs) >= b.config.max_subscriptions:
        raise ProtocolError("too many subscriptions",
                            f"at most {b.config.max_subscriptions} subscriptions per connection", receipt)
    prefetch = parse_prefetch(b, headers, ack, receipt)
    accepts = make_filter(b, headers, receipt)
    replay_from = durables.replay_from(b, headers, receipt)
    replay_seq = replayseq.parse(b, headers, receipt)
    sub = Subscription(session, sub_id, destination, ack, prefetch, accepts)
    if "activemq.exclusive" in headers or "activemq.priority" in headers or "x-priority" in headers:
        consumer_options(b, sub, headers, temp, receipt)
    durable_name = None if temp is not None else durables.durable_key(b, session, headers, sub_id, destination,
                                                                      receipt)
    if b.backplane is not None:
        b.backplane.queues.subscribing(b, sub, durable_name, receipt)
    if not session.subs:
        session.subs = {}
    session.subs[sub_id] = sub
    if temp is not None:
        temp.sub, sub.temp = sub, temp
    elif durable_name is not None:
        durables.attach(b, sub, durable_name)
    else:
        b.index.add(destination, sub)
        if b.backplane is not None:
            b.backplane.subscribed(destination)
    replies.send_receipt(b, session, receipt)
    if replay_from is not None:
        if b.backplane is not None:
            b.backplane.queues.replay(b, sub, replay_from)
        else:
            durables.replay(b, sub, replay_from)
    if replay_seq is not None:
        replayseq.replay(b, sub, replay_seq)
    take_waiting(b, sub)


def consumer_options(b, sub: Subscription, headers: dict, temp, receipt) -> None:
    """Exclusive consumer and consumer priority (choosing.py), for one named queue. On a topic every
    subscription gets every message: the options change nothing there and are accepted."""
    options = choosing.options(headers, next(b.sub_seq), receipt)
    destination = sub.destination
    temp_queue = temp is not None and temp.queue is not None
    if options is None or not (destination.startswith(QUEUE_PREFIX) or temp_queue):
        return
    feature = "exclusive consumers" if options.exclusive else "consumer priority"
    if SubscriptionIndex.wildcard_prefix(destination) is not None or temp_queue:
        raise ProtocolError(f"{feature} {'need' if options.exclusive else 'needs'} one queue",
                            "activemq.exclusive, activemq.priority and x-priority apply to a subscription to "
                            "one named queue", receipt)
    if b.backplane is not None:
        raise ProtocolError(f"{feature} not supported in cluster mode", "a cluster's queue is read by every "
                            "node's consumers, each node choosing among its own", receipt)
    sub.options = options
    queue = queues.get_queue(b, destination)
    if queue.chooser is None:
        queue.chooser = choosing.Chooser(b.config.max_message_groups)


def temp_for_subscribe(b, session: Session, destination: str, receipt) -> Temp:
    """The owner subscribes to its temporary destination: the broker's own subscription gives way;
    a second explicit one is refused (one subscription per temporary destination)."""
    temp = temporary.get_temp(b, session, destination, receipt)
    if temp.sub is not None:
        if not temp.auto:
            raise ProtocolError("already subscribed", f"{destination} already has subscription "
                                f"{temp.sub.id!r}", receipt)
        remove_subscription(b, session, temp.sub)
    temp.auto = False
    return temp


def take_waiting(b, sub: Subscription) -> None:
    """A new subscription takes what waits for it: parked and blocked queue messages, and topic
    messages in the TTL stale queue. After a replay that stopped over an outbox's limit, it waits
    its turn in ``Broker.unfinished``."""
    if b.unfinished:
        b.unfinished.append((take_waiting, (sub,)))
        return
    if sub.durable is not None or sub.temp is not None:
        for queue in queues.sub_queues(b, sub):  # (a durable subscription's queue parks nothing: see queues.scan)
            queues.unpark(b, queue)
            queues.pump(b, queue, room=True)
        return
    destination = sub.destination
    for queue in queues.queues_for(b, destination):
        queues.unpark(b, queue)
        queues.pump(b, queue, room=True)
    if b.stale is not None and not destination.startswith(QUEUE_PREFIX):
        prefix = SubscriptionIndex.wildcard_prefix(destination)
        late = b.stale.take(destination if prefix is None else None, prefix, b.now,
                            sub.accepts or (lambda headers: True))
        for message in late:
            queues.deliver(b, sub, message, None)
        b.stats["messages_delivered"] += len(late)


def parse_prefetch(b, headers: dict, ack: str, receipt) -> int:
    value = headers.get("prefetch-count", headers.get("activemq.prefetchSize"))
    if value is None:
        return 0 if ack == "auto" else b.config.client_prefetch
    try:
        prefetch = int(value)
        if prefetch < 0:
            raise ValueError
    except ValueError:
        raise ProtocolError("invalid prefetch", f"prefetch-count must be a non-negative integer: {value!r}",
                            receipt) from None
    return 0 if ack == "auto" else prefetch


def make_filter(b, headers: dict, receipt):
    """xtomp's `filter:<name>=<value>` and ActiveMQ's `selector`, combined with AND."""
    tests = []
    spec = headers.get("filter")
    if spec is not None:
        name, eq, value = spec.partition("=")
        if not eq or not name:
            raise ProtocolError("invalid filter", f"filter must be <header>=<value>: {spec!r}", receipt)
        tests.append(lambda h, name=name, value=value: h.get(name) == value)
    text = headers.get("selector")
    if text is not None:
        if len(text) > b.config.max_selector_length:
            raise ProtocolError("selector too long", f"a selector may have at most "
                                f"{b.config.max_selector_length} characters, not {len(text)}", receipt)
        try:
            tests.append(compile_selector(text))
        except SelectorError as exc:
            raise ProtocolError("invalid selector", f"{exc} in selector {short(text)!r}", receipt) from None
    if not tests:
        return None
    if len(tests) == 1:
        return tests[0]
    first, second = tests
    return lambda h: first(h) and second(h)


def unsubscribe(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    receipt = headers.get("receipt")
    sub_id = headers.get("id")
    if sub_id is None:
        destination = headers.get("destination")
        if session.version != "1.0" or destination is None:
            raise ProtocolError("missing id", "UNSUBSCRIBE needs an id header", receipt)
        doomed = [s for s in session.subs.values() if s.destination == destination]
    else:
        doomed = [session.subs[sub_id]] if sub_id in session.subs else []
    for sub in doomed:
        durable = sub.durable
        remove_subscription(b, session, sub)
        if durable is not None:  # an explicit UNSUBSCRIBE ends a durable subscription
            durables.drop(b, durable)
            if b.backplane is not None:
                b.backplane.queues.drop_durable(b, durable)
    replies.send_receipt(b, session, receipt)


def remove_subscription(b, session: Session, sub: Subscription) -> None:
    """Forget a subscription; its unacknowledged queue messages go back to the head of their queue."""
    session.subs.pop(sub.id, None)
    if not session.subs:
        session.subs = NO_ENTRIES
    b.index.remove(sub.destination, sub)
    if b.backplane is not None and sub.durable is None and sub.temp is None:
        b.backplane.unsubscribed(sub.destination)
    if b.backplane is not None:  # a queue (or durable) nobody here reads any more stops being pulled
        b.backplane.queues.left(sub)
    if sub.durable is not None:  # detach: its messages wait for the client to come back
        sub.durable.sub = None
    if sub.temp is not None and sub.temp.sub is sub:  # a temporary queue's messages wait too
        sub.temp.sub = None
    returned: dict[Queue, list] = {}
    for delivery in sub.unacked.values():
        b.acks.pop(delivery.ack_id, None)
        bounds.settled(session, delivery)
        if delivery.queue is not None:
            delivery.queue.unacked -= 1
            delivery.message.redelivered = True
            returned.setdefault(delivery.queue, []).append(delivery.message)
    sub.unacked.clear()
    for queue, messages in returned.items():
        queue.messages.extendleft(reversed(messages))
        queues.pump(b, queue)
    if sub.durable is None and sub.destination.startswith(QUEUE_PREFIX):
        queue = b.queues.get(sub.destination)
        if queue is not None:
            queues.drop_if_idle(b, queue)
