"""Last-value queues (Artemis' ``_AMQ_LVQ_NAME``, also ``last-value-key``): a message sent to a queue
with a key replaces the message of that key still waiting there, so a late consumer gets only
the latest value of each key. Messages without a key queue as usual; one already delivered is
never taken back.

A queue gets its index (``Queue.last_values``: key -> the last message sent with it) with its
first keyed message, so other queues pay nothing. The index may name messages that have left the
queue since (delivered, expired); it is rebuilt from what waits when it grows past twice that.
"""

from __future__ import annotations

from itertools import chain

NAMES = ("_AMQ_LVQ_NAME", "last-value-key")


def key_of(headers: dict) -> str | None:
    key = headers.get("_AMQ_LVQ_NAME")
    return key if key is not None else headers.get("last-value-key")


def waiting(queue):
    return chain(queue.parked, queue.blocked, queue.messages)


def index(queue) -> dict:
    """Key -> the newest waiting message of that key (in send order, a queue's last one wins)."""
    found = {}
    for message in waiting(queue):
        key = key_of(message.headers)
        if key is not None:
            found[key] = message
    return found


def take_over(queue, message):
    """``message`` is about to join ``queue``: index it by its key, and take out of the queue the
    waiting message it replaces (returned, for the caller to discard), if any."""
    key = key_of(message.headers)
    if key is None:
        return None
    if len(queue.last_values) > 2 * queue.depth() + 64:
        queue.last_values = index(queue)
    old = queue.last_values.pop(key, None)
    queue.last_values[key] = message
    if old is not None:
        for source in (queue.messages, queue.parked, queue.blocked):
            try:
                source.remove(old)  # (by identity: a message has no other equality)
                return old
            except ValueError:
                continue
    return None
