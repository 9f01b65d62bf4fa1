"""ACK and NACK: ack modes (cumulative `client`, `client-individual`), finding a delivery by id,
redelivery after NACK, and the dead-letter queue."""

from __future__ import annotations

import logging

from ..protocol.stomp import ProtocolError
from . import bounds, priority, queues, replies, vhosts
from .model import Delivery, Message, Session, Subscription

log = logging.getLogger("stompbroker.broker")


def ack(b, session: Session, command: str, headers: dict, body: bytes, committed: bool = False) -> None:
    receipt = headers.get("receipt")
    # A committed ACK was checked when it was held; what went meanwhile (a cumulative ACK) is done.
    sub, ack_id = find_delivery(b, session, command, headers, receipt, strict=not committed)
    if sub is not None:
        if sub.ack == "client":  # cumulative: this one and every earlier one
            ids = []
            for key in sub.unacked:
                ids.append(key)
                if key == ack_id:
                    break
        else:
            ids = [ack_id]
        settled = [sub.unacked.pop(key) for key in ids]
        for delivery in settled:
            b.acks.pop(delivery.ack_id, None)
            bounds.settled(session, delivery)
            if delivery.queue is not None:
                delivery.queue.unacked -= 1
            if command == "ACK":
                if delivery.queue is not None:
                    delivery.queue.dequeued += 1
                    queues.discard(b, delivery.queue, delivery.message)
            else:
                nacked(b, sub, delivery)
        for queue in queues.sub_queues(b, sub):
            queues.pump(b, queue, room=True)
    replies.send_receipt(b, session, receipt)


def find_delivery(b, session: Session, command: str, headers: dict, receipt, strict: bool = True):
    """(subscription, ack id) of the delivery an ACK/NACK names by its id within the connection
    (1.2 `id`, before that `message-id`), whatever its `subscription` header says. An id the
    connection does not hold is an ERROR naming it; (None, None) when not ``strict``."""
    wanted = headers.get("id") if session.version == "1.2" else None
    if wanted is None:
        wanted = headers.get("message-id", headers.get("id"))
    if wanted is None:
        raise ProtocolError("missing id", f"{command} needs an id header (message-id before 1.2)", receipt)
    sub = b.acks.get(wanted)
    if sub is not None and sub.session is session:  # (ack ids are the broker's: another's is unknown here)
        return sub, wanted
    named = session.subs.get(headers.get("subscription", ""))
    for sub in ([named] if named is not None else []) + [s for s in session.subs.values() if s is not named]:
        for key, delivery in sub.unacked.items():
            if delivery.message.id == wanted:
                return sub, key
    if not strict:
        return None, None
    raise ProtocolError(f"{command} of unknown id {wanted}",
                        f"this connection holds no unacknowledged message with id {wanted!r}", receipt)


def nacked(b, sub: Subscription, delivery: Delivery) -> None:
    message = delivery.message
    if b.backplane is not None and b.backplane.queues.nacked(b, message):
        return  # JetStream redelivers it, on any node, or it goes to the dead-letter queue
    message.nacks = delivery.nacks + 1
    if message.nacks > b.config.max_redeliveries:
        dead_letter(b, message, f"rejected {message.nacks} times")
    elif delivery.queue is not None:
        message.avoid = sub
        delivery.queue.messages.appendleft(message)
    else:
        queues.deliver(b, sub, message, None)  # a topic message has nobody else to go to


def dead_letter(b, message: Message, reason: str) -> None:
    b.stats["dead_lettered"] += 1
    if message.seq:
        b.store.delete(message.seq)
        message.seq = 0
    vhost, visible = vhosts.split(message.destination) if b.vhosts_on else (vhosts.DEFAULT, message.destination)
    dlq = vhosts.inside(vhost, b.config.dead_letter_queue)  # each virtual host has its own
    if message.destination == dlq:
        b.stats["messages_dropped"] += 1  # never loop in the dead-letter queue itself
        return
    log.info("message %s from %s to %s: %s", message.id, message.destination, dlq, reason)
    headers = dict(message.headers)
    headers["original-destination"] = visible
    headers["dead-letter-reason"] = reason
    queue = queues.get_queue(b, dlq)
    if queue.depth() >= b.config.max_queue_messages:
        queues.discard(b, queue, queue.pop_oldest())
        b.stats["messages_dropped"] += 1
    dead = Message(message.id, dlq, headers, message.body, message.expires)
    queues.persist(b, queue, dead)
    queue.messages.append(dead)
    queue.enqueued += 1
    if priority.level(dead) != priority.DEFAULT:
        priority.rank(queue)
    queues.pump(b, queue)
