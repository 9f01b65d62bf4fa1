"""Destination -> NATS subject mapping, and the cover set of subscriptions a node holds. Pure.

A destination is split on ``/`` and each segment becomes one NATS token. Bytes of a segment's
UTF-8 outside ``[A-Za-z0-9_-]`` (``.``, ``*``, ``>``, space, ``%``, non-ASCII...) become ``%XX``
(upper-case hex), so every token is valid and the mapping is one to one; an empty segment (two
slashes in a row, or a trailing slash) is the token ``%``, which no escaped segment can be.

| destination | subject |
|---|---|
| ``/topic/a/b`` (starts with ``/``) | ``<cluster>.t.topic.a.b`` |
| ``news.eu`` (does not) | ``<cluster>.r.news%2Eeu`` |
| ``#jobs`` (worker queue) | ``<cluster>.w.jobs`` (a NATS queue group of the same name) |
| ``/queue/q`` | ``<cluster>.q.queue.q`` |

Wildcard subscriptions (``/topic/a*``: every destination starting with ``/topic/a``) subscribe the
subject of their last whole-segment prefix followed by ``>`` (``<cluster>.t.topic.>``): a superset,
which the receiving node's own index narrows to the exact matches.

NATS hands a connection one copy of a message per matching subscription, so a node never holds two
subscriptions that overlap: :func:`cover` reduces the wanted filters to a set with no overlaps.
"""

from __future__ import annotations

import functools

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
EMPTY = "%"          # the token of an empty segment
TOPIC, RELATIVE, WORKER, QUEUE, DURABLE = "t", "r", "w", "q", "d"
BUSY = "busy"        # (a whole token: never one of the kinds above)


def escape_segment(segment: str) -> str:
    if not segment:
        return EMPTY
    data = segment.encode()
    if all(c in _SAFE for c in data):
        return segment
    return "".join(chr(c) if c in _SAFE else f"%{c:02X}" for c in data)


def unescape_segment(token: str) -> str:
    if token == EMPTY:
        return ""
    if "%" not in token:
        return token
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%":
            out.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(ord(token[i]))
            i += 1
    return out.decode()


@functools.lru_cache(maxsize=4096)  # (every message to a destination needs its subject: made once)
def _tokens(path: str) -> str:
    return ".".join(escape_segment(s) for s in path.split("/"))


def topic_subject(cluster: str, destination: str) -> str:
    """The subject a topic message to ``destination`` is published on."""
    if destination.startswith("/"):
        return f"{cluster}.{TOPIC}.{_tokens(destination[1:])}"
    return f"{cluster}.{RELATIVE}.{_tokens(destination)}"


def worker_subject(cluster: str, destination: str) -> str:
    """``#NAME``: the subject (and queue group) of a worker queue."""
    return f"{cluster}.{WORKER}.{_tokens(destination[1:])}"


def queue_subject(cluster: str, destination: str) -> str:
    return f"{cluster}.{QUEUE}.{_tokens(destination.lstrip('/'))}"


def busy_subject(cluster: str) -> str:
    """Where each node says whether it is behind with its deliveries (``cluster/topics.py``)."""
    return f"{cluster}.{BUSY}"


def destination_of(subject: str) -> str:
    """The inverse of topic_subject and worker_subject (for tools and tests)."""
    _, kind, rest = subject.split(".", 2)
    path = "/".join(unescape_segment(t) for t in rest.split("."))
    return {TOPIC: "/" + path, RELATIVE: path, WORKER: "#" + path, QUEUE: "/" + path}[kind]


def pattern_filters(cluster: str, pattern: str) -> list[str]:
    """The NATS filters a topic subscription pattern needs (exact subject, or a prefix + ``>``)."""
    star = pattern.find("*")
    if star < 0:
        return [topic_subject(cluster, pattern)]
    prefix = pattern[:star]
    if prefix == "":  # `*`: every topic
        return [f"{cluster}.{TOPIC}.>", f"{cluster}.{RELATIVE}.>"]
    cut = prefix.rfind("/")
    if prefix.startswith("/"):
        whole = prefix[1:cut] if cut > 0 else None
        base = f"{cluster}.{TOPIC}"
    else:
        whole = prefix[:cut] if cut >= 0 else None
        base = f"{cluster}.{RELATIVE}"
    # `/topic/a*` -> whole-segment prefix "topic" -> base.topic.>; `/a*` or `a*` -> base.>
    return [f"{base}.{_tokens(whole)}.>" if whole is not None else f"{base}.>"]


def covers(wide: str, other: str) -> bool:
    """Does the ``prefix.>`` filter ``wide`` match every subject ``other`` (a filter) matches?"""
    stem = wide[:-1]  # "a.b." from "a.b.>"
    return other.startswith(stem) and other != wide and (len(other) > len(stem))


def cover(filters) -> set[str]:
    """The smallest set of subscriptions that receives what ``filters`` ask for, no two overlapping.

    Filters are exact subjects or ``prefix.>``. Two exact subjects never overlap; ``p.>`` and an
    exact subject overlap only if the subject lies under ``p``; two ``>`` filters overlap when one
    prefix contains the other. So: keep the ``>`` filters no shorter ``>`` filter contains, and the
    exact subjects none of them contains."""
    wide = sorted({f for f in filters if f.endswith(".>")}, key=len)
    kept_wide: list[str] = []
    for f in wide:
        if not any(covers(w, f) for w in kept_wide):
            kept_wide.append(f)
    stems = [w[:-1] for w in kept_wide]
    exact = {f for f in filters if not f.endswith(".>") and not any(f.startswith(s) for s in stems)}
    return set(kept_wide) | exact
