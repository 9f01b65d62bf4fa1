"""Replay by sequence: a SUBSCRIBE with ``replay-from-seq:N`` (and optionally ``replay-to-seq:M``,
excluded, and ``replay-limit:K``) first gets the replay log's messages from sequence N on, each
marked ``replayed:true`` with its ``replay-seq`` and ``replay-ts`` (epoch ms the broker accepted
it), then one empty MESSAGE marked ``replay-end:true`` whose ``replay-next-seq`` is where the
next read starts and ``replay-first-seq`` the oldest sequence still kept (older ones are past
``replay_retention``). Reading a range twice gives the same messages: this is how a stream
processor (the Spark source, stompbroker/analysis/streaming.py) keeps its offsets."""

from __future__ import annotations

from ..protocol.stomp import ProtocolError
from . import queues
from .model import Message, Subscription
from .names import short
from .subscriptions import SubscriptionIndex

HEADERS = ("replay-from-seq", "replay-to-seq", "replay-limit")


def parse(b, headers: dict, receipt) -> tuple | None:
    """(start, stop, limit) when the SUBSCRIBE asks for a replay by sequence, else None."""
    if "replay-from-seq" not in headers:
        return None
    if b.store is None or b.backplane is not None:
        raise ProtocolError("replay unavailable", "replay-from-seq needs the durable store (store=sqlite) "
                            "on a single node", receipt)
    values = []
    for name in HEADERS:
        value = headers.get(name)
        if value is None:
            values.append(None)
            continue
        if not (value.isascii() and value.isdigit() and len(value) < 19):
            raise ProtocolError(f"invalid {name}", f"{name} must be a whole number: {short(value)!r}", receipt)
        values.append(int(value))
    return tuple(values)


def replay(b, sub: Subscription, spec: tuple) -> None:
    start, stop, limit = spec
    prefix = SubscriptionIndex.wildcard_prefix(sub.destination)
    exact = sub.destination if prefix is None else None
    rows, following, first = b.store.replay_seq(exact, prefix, start, stop, limit)
    end = Message(f"{b.token}-{next(b.message_ids)}", sub.destination,
                  {"replay-end": "true", "replay-next-seq": str(following), "replay-first-seq": str(first)}, b"")
    rest(b, sub, iter(rows), end)


def rest(b, sub: Subscription, rows, end: Message) -> None:
    """Deliver until an outbox is over its limit (the rest is unfinished), then the end marker."""
    for seq, ts, destination, message_id, headers, body in rows:
        if sub.accepts is None or sub.accepts(headers):
            message = Message(message_id, destination, {**headers, "replayed": "true", "replay-seq": str(seq),
                                                        "replay-ts": str(int(ts))}, body)
            if queues.deliver(b, sub, message, None):
                b.unfinished.append((rest, (sub, rows, end)))
                return
    subs = sub.session.subs
    if subs and subs.get(sub.id) is sub:  # (still subscribed)
        queues.deliver(b, sub, end, None)
