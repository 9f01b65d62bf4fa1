"""Queue browsing (ActiveMQ Classic's SUBSCRIBE ``browser:true``): a copy of what waits in a queue,
taken now, without consuming it, then one MESSAGE with ``browser:end``, ``message-id:0`` and an
empty body. Nothing is registered: no consumer, no queue counter, no acknowledgement, so a browse
never takes a message from a consumer nor holds one back."""

from __future__ import annotations

from itertools import chain, islice

from ..protocol.stomp import ProtocolError, escape
from . import priority, queues, replies
from .model import Message, Session, Subscription
from .names import QUEUE_PREFIX, REDELIVERED


def browse(b, session: Session, sub_id: str, destination: str, accepts, receipt) -> None:
    """Checked by the caller already: the SUBSCRIBE's id, ack mode, selector, and read permission."""
    if session.version == "1.0":
        raise ProtocolError("browsing needs STOMP 1.1", "browser:true is for STOMP 1.1 and later", receipt)
    if not destination.startswith(QUEUE_PREFIX):
        raise ProtocolError("cannot browse a topic", f"only queues can be browsed, not {destination}", receipt)
    if b.backplane is not None:
        raise ProtocolError("browsing not supported in cluster mode", "a cluster's queues are JetStream streams: "
                            "a node holds only the part its consumers take", receipt)
    sub = Subscription(session, sub_id, destination, "auto", 0, accepts)  # (only for its rendered prefix)
    snapshot = waiting(b, destination, accepts, b.config.max_browse_messages)
    for job_id, headers, body in b.jobs.flagged(destination, b.config.max_browse_messages):  # (after what waits)
        if accepts is None or accepts(headers):
            snapshot.append(Message(job_id, destination, headers, body))
    replies.send_receipt(b, session, receipt)
    send_snapshot(b, sub, snapshot)


def waiting(b, destination: str, accepts, limit: int) -> list:
    """The messages waiting in the queues ``destination`` names, in delivery order (level, then age),
    that the selector accepts: at most ``limit`` looked at, so a browse costs a bounded amount."""
    found = []
    left = limit
    for queue in queues.queues_for(b, destination):
        looked = list(islice(chain(queue.parked, queue.blocked, queue.messages), left))
        left -= len(looked)
        if type(queue.messages) is priority.Ranked:
            looked.sort(key=lambda m: -priority.level(m))  # (stable: age within a level)
        found += [m for m in looked if not m.expired(b.now) and (accepts is None or accepts(m.headers))]
        if left <= 0:
            break
    return found


def send_snapshot(b, sub: Subscription, messages: list, start: int = 0) -> None:
    """The copies, then the end marker; stopped over the outbox's limit, the rest waits its turn."""
    if b.unfinished:
        b.unfinished.append((send_snapshot, (sub, messages, start)))
        return
    session = sub.session
    if session.closing:
        return
    outbox, conn, escaped = session.outbox, session.conn, session.escape
    for i in range(start, len(messages)):
        message = messages[i]
        over = (outbox.add3(conn, sub.prefix, REDELIVERED, message.shared(escaped)) if message.redelivered
                else outbox.add2(conn, sub.prefix, message.shared(escaped)))
        if over:
            b.unfinished.append((send_snapshot, (sub, messages, i + 1)))
            return
    name = escape(sub.destination) if escaped else sub.destination
    outbox.add2(conn, sub.prefix, b"message-id:0\ndestination:" + name.encode() + b"\nbrowser:end\n\n\0")
