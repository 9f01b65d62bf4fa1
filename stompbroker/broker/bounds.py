"""What one connection may make the dispatcher hold, counted in ``Session.kept`` and, for what
exists nowhere else, in ``Broker.kept`` for all connections together.

- Frames sent after CONNECT while the login is being checked: at most ``max_first_frame`` (what a
  client that has not logged in may make the broker hold), released when the verdict comes.
- The frames of its open transactions: ``max_held_bytes`` for the connection (and at most
  ``max_transactions`` of them), ``max_held_bytes_total`` with every other connection's.
- Topic messages delivered to its client-ack subscriptions and not yet acknowledged (a topic keeps
  nothing for later, so its prefetch does not hold them back): within ``max_held_bytes`` too. A
  message may be held by many connections at once, so these are not in the broker's total.

Each frame or delivery counts as its size plus ``OVERHEAD`` for its bookkeeping, so empty ones count
too. Past a bound the connection gets an ERROR (with the frame's receipt-id) and is closed.
"""

from __future__ import annotations

from ..protocol.stomp import ProtocolError
from . import replies
from .model import Delivery, Session

OVERHEAD = 256


def frame_cost(headers: dict, body: bytes) -> int:
    return len(body) + sum(len(name) + len(value) + 2 for name, value in headers.items()) + OVERHEAD


def hold_in_transaction(b, session: Session, cost: int, receipt) -> None:
    """A frame joins a transaction; ProtocolError if it would pass a bound."""
    config = b.config
    if session.kept + cost > config.max_held_bytes:
        raise ProtocolError("transaction too large", f"a connection's open transactions (and unacknowledged topic "
                            f"messages) may hold at most {config.max_held_bytes} bytes (max_held_bytes)", receipt)
    if b.kept + cost > config.max_held_bytes_total:
        raise ProtocolError("broker busy", f"open transactions of all connections hold "
                            f"{config.max_held_bytes_total} bytes (max_held_bytes_total); try again later", receipt)
    session.kept += cost
    b.kept += cost


def hold_before_login(b, session: Session, head: bytes, body: bytes) -> bool:
    """A frame waits for its connection's login verdict; False (after an ERROR) past a bound."""
    cost = len(head) + len(body) + OVERHEAD
    if session.kept + cost > b.config.max_first_frame:
        replies.error(b, session, "too many frames before CONNECTED", f"frames sent before the login is checked "
                       f"may hold at most {b.config.max_first_frame} bytes (max_first_frame)")
        return False
    if b.kept + cost > b.config.max_held_bytes_total:
        replies.error(b, session, "broker busy", f"frames held for all connections reach "
                       f"{b.config.max_held_bytes_total} bytes (max_held_bytes_total); try again later")
        return False
    session.kept += cost
    b.kept += cost
    return True


def release(b, session: Session, cost: int) -> None:
    """Held frames leave (a COMMIT, an ABORT, a login's verdict, the end of the session)."""
    session.kept -= cost
    b.kept -= cost


def deliver_unacked(b, session: Session, size: int) -> bool:
    """A topic message is about to be delivered to a client-ack subscription of ``session``:
    False (after an ERROR) when the connection would hold too much unacknowledged."""
    cost = size + OVERHEAD
    if session.kept + cost > b.config.max_held_bytes:
        replies.error(b, session, "too many unacknowledged messages", f"a connection may hold at most "
                       f"{b.config.max_held_bytes} bytes of unacknowledged topic messages (max_held_bytes): "
                       "acknowledge them as they come")
        return False
    session.kept += cost
    return True


def settled(session: Session, delivery: Delivery) -> None:
    """An unacknowledged delivery is done with (ACK, NACK, its subscription gone)."""
    if delivery.queue is None:
        session.kept -= len(delivery.message.body) + OVERHEAD
