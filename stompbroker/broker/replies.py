"""Replies to a client, the bottom of the broker: every RECEIPT, ERROR and close leaves through
``emit`` into the session's outbox, or waits there for the durable store (receipt holding by store
generation, release after a commit, the store-outage ERROR) so that none overtakes a held receipt.

A close ends the connection's output here; the session's state (subscriptions, transactions,
temporary destinations) is dropped by ``sessions.end_closed``, above, at the end of the event:
closed sessions wait in ``Broker.ending``."""

from __future__ import annotations

import logging

from ..ipc import records as R
from ..protocol.stomp import escape, render_frame
from .model import Session
from .names import short

log = logging.getLogger("stompbroker.broker")


def send_receipt(b, session: Session, receipt: str | None) -> None:
    if receipt is not None:
        value = escape(receipt) if session.escape else receipt  # (render_frame's output, without its loop)
        emit(b, session, R.DATA, b"RECEIPT\nreceipt-id:" + value.encode() + b"\n\n\0", receipt)


def emit(b, session: Session, kind: int, payload: bytes = b"", receipt: str | None = None) -> None:
    """A reply that must not overtake a receipt waiting for the store (nor go before its data is on disk),
    nor deliveries of its event still unfinished (stopped over an outbox's limit)."""
    if b.unfinished:
        b.unfinished.append((emit, (session, kind, payload, receipt)))
        return
    if b.backplane is not None and b.backplane.hold_reply(session, kind, payload):
        return  # behind a message of this session's that waits for NATS (cluster/backplane.py)
    store = b.store
    if store is not None and store.sync_receipts and (session in b.holding or store.ops != b.ops_mark):
        held = b.holding.get(session)
        if held is None:
            held = b.holding[session] = []
        held.append((store.generation, kind, payload, receipt))
        b.need_commit = True
    else:
        session.outbox.add(kind, session.conn, payload)


def release(b, generation: int) -> None:
    """The store has committed up to ``generation``: send the replies that waited for it."""
    for session, held in list(b.holding.items()):
        done = 0
        for due, kind, payload, _ in held:
            if due > generation:
                break
            session.outbox.add(kind, session.conn, payload)
            done += 1
        del held[:done]
        if not held:
            del b.holding[session]


def store_outage(b, now: float) -> None:
    """The store has failed to commit for longer than store_error_timeout_ms: every sender still
    waiting for a receipt gets an ERROR naming it (the message may still be written if the store
    recovers, so it may arrive once; it is never receipted unwritten)."""
    since = b.store.failing_since if b.store is not None else 0.0
    if not since or now - since < b.config.store_error_timeout_ms / 1000:
        return
    for session, held in list(b.holding.items()):
        receipt = next((r for _, kind, _, r in held if r is not None), None)
        del b.holding[session]
        if session.closing:
            session.outbox.add(R.CLOSE, session.conn)
            continue
        b.stats["errors"] += 1
        session.closing = True
        b.ending.append(session)
        headers = {"message": "store unavailable"}
        if receipt is not None:
            headers["receipt-id"] = receipt
        headers["content-type"] = "text/plain"
        body = (f"the durable store has not been able to write for {now - since:.1f} s (see the broker's "
                "log); this message and the ones after it are not confirmed").encode()
        log.warning("connection %s (%s): ERROR store unavailable (receipt %s)", session.conn, session.peer, receipt)
        session.outbox.add(R.DATA, session.conn, render_frame("ERROR", headers, body, escape_headers=session.escape))
        session.outbox.add(R.CLOSE, session.conn, R.WS_CLOSE_INTERNAL_ERROR if session.websocket else b"")


def error(b, session: Session, message: str, detail: str = "", receipt: str | None = None,
          extra: dict | None = None) -> None:
    """Send an ERROR and close the connection, as STOMP 1.2 asks."""
    b.stats["errors"] += 1
    headers = {"message": message}
    if receipt is not None:
        headers["receipt-id"] = receipt
    if extra:
        headers.update(extra)
    headers["content-type"] = "text/plain"
    body = (detail or message).encode()
    emit(b, session, R.DATA, render_frame("ERROR", headers, body, escape_headers=session.escape))
    log.info("connection %s (%s): ERROR %s: %s", session.conn, session.peer, short(message), short(detail))
    close(b, session)


def close(b, session: Session, websocket_close: bool = True) -> None:
    """Nothing more is read from the connection, and nothing more is sent after what was emitted."""
    session.closing = True
    b.ending.append(session)
    emit(b, session, R.CLOSE, R.WS_CLOSE_NORMAL if session.websocket and websocket_close else b"")
