"""Temporary destinations: /temp-queue/ and /temp-topic/ names private to one connection,
their reply names in `reply-to`, the broker's own subscription, and delivery to them."""

from __future__ import annotations

import secrets

from ..protocol.stomp import ProtocolError
from . import queues
from .model import Message, Session, Subscription, Temp
from .names import REPLY_PREFIXES, TEMP_PREFIXES, TEMP_QUEUE


def get_temp(b, session: Session, name: str, receipt) -> Temp:
    """The connection's temporary destination ``name`` (/temp-queue/X or /temp-topic/X), made on first use."""
    temp = session.temps.get(name)
    if temp is None:
        if "*" in name:
            raise ProtocolError("wildcard destination", f"a temporary destination cannot be a wildcard: {name}",
                                receipt)
        if len(session.temps) >= b.config.max_subscriptions:
            raise ProtocolError("too many temporary destinations", f"at most {b.config.max_subscriptions} "
                                "temporary destinations per connection (max_subscriptions)", receipt)
        is_queue = name.startswith(TEMP_QUEUE)
        # Unique in the broker's life (session id, counter) and not guessable (others may write, not read).
        public = (f"{REPLY_PREFIXES[0] if is_queue else REPLY_PREFIXES[1]}{session.id}-{next(b.temp_ids)}"
                  f"-{secrets.token_hex(4)}")
        if not session.temps:
            session.temps = {}
        temp = session.temps[name] = b.temps[public] = Temp(name, public, session, is_queue)
    return temp


def temporaries(b, session: Session, headers: dict, destination: str, receipt) -> str:
    """A SEND naming the connection's temporary destinations: a ``reply-to`` one is rewritten to its
    reply name and the connection is subscribed to it, with the temporary name as the subscription
    id (RabbitMQ's behaviour), unless it already is; a ``destination`` one becomes its reply name,
    which is returned."""
    reply_to = headers.get("reply-to")
    if reply_to is not None and reply_to.startswith(TEMP_PREFIXES):
        temp = get_temp(b, session, reply_to, receipt)
        if temp.sub is None:
            if reply_to in session.subs:
                raise ProtocolError("duplicate subscription", f"subscription id {reply_to!r} is already in use",
                                    receipt)
            if len(session.subs) >= b.config.max_subscriptions:
                raise ProtocolError("too many subscriptions", f"at most {b.config.max_subscriptions} "
                                    "subscriptions per connection", receipt)
            if not session.subs:
                session.subs = {}
            sub = session.subs[reply_to] = Subscription(session, reply_to, reply_to, "auto", 0, None)
            temp.sub, sub.temp, temp.auto = sub, temp, True
            if temp.queue is not None:
                queues.pump(b, temp.queue)
        headers["reply-to"] = temp.public
    if destination.startswith(TEMP_PREFIXES):
        destination = headers["destination"] = get_temp(b, session, destination, receipt).public
    return destination


def publish(b, destination: str, message: Message) -> int:
    temp = b.temps.get(destination)
    if temp is None:  # its connection has gone, and the destination with it
        b.stats["messages_dropped"] += 1
        return 0
    message.destination = temp.private  # its one reader knows it by that name
    queue = temp.queue
    if queue is not None:
        if queue.depth() >= b.config.max_queue_messages:  # (a SEND is refused before this)
            queue.pop_oldest()
            b.stats["messages_dropped"] += 1
        queue.messages.append(message)
        queue.enqueued += 1
        return queues.pump(b, queue)
    sub = temp.sub
    if sub is None or (sub.accepts is not None and not sub.accepts(message.headers)):
        b.stats["messages_dropped"] += 1
        return 0
    queues.deliver(b, sub, message, None)
    b.stats["messages_delivered"] += 1
    return 1


def forget(b, session: Session) -> None:
    """Temporary destinations vanish with their connection, and what waits in them."""
    for temp in session.temps.values():
        del b.temps[temp.public]
        if temp.queue is not None:
            b.stats["messages_dropped"] += temp.queue.depth()
    session.temps.clear()
