"""Durable topic subscriptions (each a hidden queue `durable:NAME` fed on every topic publish),
their keys, replacement, recovery from the store, and replay-from."""

from __future__ import annotations

from ..protocol.stomp import ProtocolError
from . import queues
from .model import Durable, Message, Session, Subscription
from .names import OWNER_SEP, QUEUE_PREFIX, millis, short
from .subscriptions import SubscriptionIndex
from .vhosts import MARK, split


def durable_key(b, session: Session, headers: dict, sub_id: str, destination: str, receipt) -> str | None:
    """The key of the durable subscription a SUBSCRIBE asks for, or None for a plain subscription.

    Named by RabbitMQ's `durable:true` (the subscription id) or ActiveMQ's
    `activemq.subscriptionName` (with the CONNECT's client-id), and keyed by the login too, so
    another user's subscription of the same name is another subscription. An existing name
    keeps its destination unless the SUBSCRIBE says `replace-durable:true` (its backlog is
    dropped then). Keys stored before logins were part of them have no OWNER_SEP and are found
    by their bare name.
    """
    name = headers.get("activemq.subscriptionName")
    if name is not None:
        name = f"{session.client_id}/{name}"
    elif headers.get("durable") == "true" or headers.get("persistent") == "true":
        name = sub_id
    else:
        return None
    if destination.startswith(QUEUE_PREFIX):
        raise ProtocolError("durable queue subscription", "queues keep their messages already; "
                            "durable subscriptions are for topics", receipt)
    key = f"{session.login}{OWNER_SEP}{name}"
    if session.vhost:  # each virtual host has its own (vhosts.py)
        key = MARK + session.vhost + MARK + key
    durable = b.durables.get(key)
    if durable is None and name in b.durables and not session.vhost:
        key, durable = name, b.durables[name]
    if durable is None and len(b.durables) >= b.config.max_durables:
        raise ProtocolError("too many durable subscriptions", f"the broker keeps at most {b.config.max_durables} "
                            "durable subscriptions (max_durables); an UNSUBSCRIBE ends one", receipt)
    if durable is not None:
        if durable.sub is not None:
            raise ProtocolError("durable subscription in use", f"durable subscription {short(name)!r} is "
                                "attached to another connection", receipt)
        if durable.pattern != destination and headers.get("replace-durable") != "true":
            raise ProtocolError("durable subscription exists", f"durable subscription {short(name)!r} is for "
                                f"{short(durable.pattern)}; subscribe with replace-durable:true to drop it "
                                f"and its waiting messages and subscribe to {short(destination)}", receipt)
    return key


def attach(b, sub: Subscription, name: str) -> None:
    durable = b.durables.get(name)
    if durable is None or durable.pattern != sub.destination:
        if durable is not None:  # replace-durable:true: start afresh on the new topic
            drop(b, durable)
        durable = b.durables[name] = Durable(name, sub.destination)
        b.queues[durable.queue.name] = durable.queue
        b.durable_index.add(sub.destination, durable)
        if b.store is not None:
            b.store.add_durable(name, sub.destination)
    durable.sub = sub
    sub.durable = durable


def drop(b, durable: Durable) -> None:
    for source in (durable.queue.messages, durable.queue.blocked):
        for message in source:
            queues.discard(b, durable.queue, message)
        source.clear()
    b.durable_index.remove(durable.pattern, durable)
    b.queues.pop(durable.queue.name, None)
    del b.durables[durable.name]
    if b.store is not None:
        b.store.remove_durable(durable.name)


def replay_from(b, headers: dict, receipt) -> float | None:
    value = headers.get("replay-from")
    if value is None:
        return None
    if b.store is None and b.backplane is None:
        raise ProtocolError("replay unavailable", "replay-from needs the durable store (store=sqlite)", receipt)
    try:
        return float(millis(value))
    except ValueError:
        raise ProtocolError("invalid replay-from", f"replay-from must be epoch milliseconds: {short(value)!r}",
                            receipt) from None


def replay(b, sub: Subscription, since_ms: float) -> None:
    """Deliver stored messages sent since ``since_ms`` to one subscription, as copies."""
    prefix = SubscriptionIndex.wildcard_prefix(sub.destination)
    exact = sub.destination if prefix is None else None
    replay_rest(b, sub, b.store.replay(exact, prefix, since_ms))


def replay_rest(b, sub: Subscription, rows) -> None:
    """Deliver from the store's rows until an outbox is over its limit; the rest is unfinished."""
    for destination, message_id, headers, body in rows:
        if b.vhosts_on and MARK in destination and split(destination)[0] != split(sub.destination)[0]:
            continue  # another virtual host's, under a wildcard of the default one
        if sub.accepts is None or sub.accepts(headers):
            message = Message(message_id, destination, {**headers, "replayed": "true"}, body)
            if queues.deliver(b, sub, message, None):
                b.unfinished.append((replay_rest, (sub, rows)))
                return


def load(b, store) -> None:
    """The durable subscriptions kept in the store, before their messages are loaded."""
    for name, pattern in store.load_durables():
        durable = b.durables[name] = Durable(name, pattern)
        b.queues[durable.queue.name] = durable.queue
        b.durable_index.add(pattern, durable)
