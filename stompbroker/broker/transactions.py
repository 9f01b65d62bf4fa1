"""BEGIN, COMMIT, ABORT: a transaction is the list of frames held until COMMIT, checked when held
and applied all or nothing."""

from __future__ import annotations

from ..protocol.stomp import ProtocolError
from . import acks, bounds, permissions, replies, routing, temporary
from .model import NO_ENTRIES, Session
from .names import QUEUE_PREFIX, TEMP_PREFIXES


def hold(b, session: Session, transaction: str, command: str, headers: dict, body: bytes) -> None:
    receipt = headers.get("receipt")
    frames = session.transactions.get(transaction)
    if frames is None:
        raise ProtocolError("unknown transaction", f"no transaction {transaction!r} was begun", receipt)
    if len(frames) >= b.config.max_transaction_frames:
        raise ProtocolError("transaction too large",
                            f"at most {b.config.max_transaction_frames} frames per transaction", receipt)
    expires = 0.0
    if command == "SEND":
        destination = routing.check_send(headers, receipt)
        if not destination.startswith(TEMP_PREFIXES):  # a connection's own temporary ones are always its own
            permissions.allowed(b, session, destination, write=True, receipt=receipt)
        temporary.temporaries(b, session, headers, destination, receipt)
        expires = routing.expiry(b, headers, receipt)
        if not routing.SPECIAL.isdisjoint(headers):  # (a bad priority or schedule is refused now)
            routing.check_special(b, session, destination, headers, receipt)
    else:
        acks.find_delivery(b, session, command, headers, receipt)  # an id not held is refused now
    cost = bounds.frame_cost(headers, body)
    bounds.hold_in_transaction(b, session, cost, receipt)
    frames.append((command, headers, body, expires, cost))
    replies.send_receipt(b, session, receipt)  # accepted now, applied at COMMIT


def transaction_id(b, session: Session, command: str, headers: dict, must_exist: bool) -> str:
    receipt = headers.get("receipt")
    transaction = headers.get("transaction")
    if transaction is None:
        raise ProtocolError("missing transaction", f"{command} needs a transaction header", receipt)
    if must_exist and transaction not in session.transactions:
        raise ProtocolError("unknown transaction", f"no transaction {transaction!r} was begun", receipt)
    if not must_exist and transaction in session.transactions:
        raise ProtocolError("duplicate transaction", f"transaction {transaction!r} is already open", receipt)
    return transaction


def begin(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    transaction = transaction_id(b, session, command, headers, must_exist=False)
    if len(session.transactions) >= b.config.max_transactions:
        raise ProtocolError("too many transactions", f"a connection may have at most {b.config.max_transactions} "
                            "transactions open (max_transactions)", headers.get("receipt"))
    if not session.transactions:
        session.transactions = {}
    session.transactions[transaction] = []
    replies.send_receipt(b, session, headers.get("receipt"))


def commit(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    receipt = headers.get("receipt")
    frames = session.transactions[transaction_id(b, session, command, headers, must_exist=True)]
    # All or nothing: refuse the whole commit if a queue could not take its messages, or if a
    # permission was withdrawn (passwd re-read) since a SEND was accepted.
    adding: dict[str, int] = {}
    for cmd, h, _, _, _ in frames:
        if cmd == "SEND":
            permissions.allowed(b, session, h["destination"], write=True, receipt=receipt)
        if cmd == "SEND" and h["destination"].startswith(QUEUE_PREFIX):
            adding[h["destination"]] = adding.get(h["destination"], 0) + 1
    for name, n in adding.items():
        queue = b.queues.get(name)
        if queue is not None and queue.depth() + n > b.config.max_queue_messages:
            raise ProtocolError("queue full", f"committing would put more than max_queue_messages in {name}",
                                receipt)
    scheduled = sum(1 for cmd, h, *_ in frames if cmd == "SEND" and not routing.SCHEDULED.isdisjoint(h))
    if scheduled and len(b.jobs) + scheduled > b.config.max_scheduled_messages:
        raise ProtocolError("too many scheduled messages", "committing would pass max_scheduled_messages", receipt)
    end(b, session, headers["transaction"])
    for cmd, h, frame_body, expires, _ in frames:
        h.pop("receipt", None)  # already answered when the frame was accepted
        if cmd == "SEND":
            routing.publish_held(b, session, h, frame_body, expires)
        else:
            acks.ack(b, session, cmd, h, frame_body, committed=True)
    replies.send_receipt(b, session, receipt)


def abort(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    end(b, session, transaction_id(b, session, command, headers, must_exist=True))
    replies.send_receipt(b, session, headers.get("receipt"))


def end(b, session: Session, transaction: str) -> None:
    bounds.release(b, session, sum(frame[4] for frame in session.transactions.pop(transaction)))
    if not session.transactions:
        session.transactions = NO_ENTRIES  # the shared empty one: an idle session keeps no dict


def forget(b, session: Session) -> None:
    """The session ends: its open transactions are dropped."""
    for transaction in list(session.transactions):
        end(b, session, transaction)

