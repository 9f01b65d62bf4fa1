"""stompica's DIAG frame and stompserver's /queue/monitor status messages."""

from __future__ import annotations

from ..diag.stats import QUERIES
from ..ipc import records as R
from ..protocol.stomp import ProtocolError
from . import queues, replies, vhosts
from .model import Message, Session
from .names import MONITOR


def diag(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    """stompica's DIAG frame: the body names a query, the reply is a DIAG frame `<query>:<value>`."""
    receipt = headers.get("receipt")
    query = body.decode(errors="replace").strip()
    if b.diag is None or query not in QUERIES:
        raise ProtocolError("unknown DIAG query", f"DIAG queries: {', '.join(QUERIES)}", receipt)
    if b.config.diag_admin_only and not (session.connected and b.auth is not None
                                         and b.auth.is_admin(session.login)):
        raise ProtocolError("permission denied for DIAG", "diagnostics are for admin users", receipt)
    value, more = b.diag.text(query, offset(headers, receipt), scope(b, session, headers, receipt))
    lines = "".join(f"{name}:{text}\n" for name, text in more.items())
    reply = b"DIAG\ncontent-type:text/plain\n" + f"{query}:{value}\n{lines}".encode() + b"\n\0"
    session.outbox.add(R.DATA, session.conn, reply)
    replies.send_receipt(b, session, receipt)


def scope(b, session: Session, headers: dict, receipt) -> str | None:
    """The virtual host a DIAG answers for (its queues, subscriptions and connections): the asker's
    own; a ``vhost`` header names another (admins only, when logins are checked), ``*`` every one
    (names shown ``VHOST:destination``). None with one vhost: the answers are the broker's."""
    if not b.vhosts_on:
        return None
    own = session.vhost or vhosts.DEFAULT
    asked = headers.get("vhost", own)
    if asked == own:
        return own
    if b.auth is not None and not (session.connected and b.auth.is_admin(session.login)):
        raise ProtocolError("permission denied for DIAG", "only admin users may ask about another vhost", receipt)
    if asked == "*":
        return None
    if asked not in b.config.vhosts:
        raise ProtocolError("unknown vhost", f"vhosts: {', '.join(b.config.vhosts)} (or * for every one)", receipt)
    return asked


def offset(headers: dict, receipt) -> int:
    """Where a list answer continues (the ``next-offset`` of the part before); 0 = from the start."""
    text = headers.get("offset")
    if text is None:
        return 0
    if len(text) > 12 or not (text.isascii() and text.isdigit()):
        raise ProtocolError("invalid offset", "offset must be a whole number from 0 (a DIAG answer's next-offset)",
                            receipt)
    return int(text)


def monitor(b, now: float) -> None:
    """Every subscriber of /queue/monitor gets a status message each monitor_interval."""
    b.next_monitor = now + b.config.monitor_interval / 1000
    status = Message(f"{b.token}-{next(b.message_ids)}", MONITOR, {"content-type": "text/plain"},
                     b.diag.monitor_body())
    monitor_rest(b, status, tuple(b.index.exact[MONITOR]))


def monitor_rest(b, status: Message, subs: tuple) -> None:
    """Deliver the status to ``subs``, stopping (resumably) over an outbox's limit, as a fan-out does."""
    for i, sub in enumerate(subs):
        if queues.deliver(b, sub, status, None) and i + 1 < len(subs):
            b.unfinished.append((monitor_rest, (status, subs[i + 1:])))
            return
