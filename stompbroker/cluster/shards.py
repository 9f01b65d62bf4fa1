"""Which JetStream stream holds a destination, and which servers should lead the streams. Pure.

Queues and kept topic messages (durable subscriptions, replay-from) are spread over
``cluster_streams`` shards of each kind: a destination lives in shard ``crc32(destination) % n``
(the same on every node and run, so one destination's messages stay in one stream, in order).
The shard count ``n`` is the node's *layout*; each layout has its own streams and subjects, so
two layouts never share a stream:

| layout | stream | subjects |
|---|---|---|
| 1 | ``<cluster>_QUEUES`` / ``<cluster>_TOPICS`` | ``<cluster>.q.<tokens>`` / ``<cluster>.d.<topic tokens>`` |
| n > 1, shard i | ``<cluster>_QUEUES_<n>_<i>`` / ``<cluster>_TOPICS_<n>_<i>`` | ``<cluster>.q<n>_<i>.<tokens>`` / ``<cluster>.d<n>_<i>.<topic tokens>`` |

A node publishes into its own layout only, and reads every layout whose streams exist: after the
shard count changes, the old layout's streams drain as their messages are consumed (``reads``).

Leaders: each stream of a replicated layout has a Raft leader, which does that shard's work.
``moves`` plans the fewest leader moves (JetStream's stepdown with a preferred server) that leave
every server leading as many shards of a kind as any other, give or take one.
"""

from __future__ import annotations

import functools
import re
import zlib

from . import subjects

QUEUES, TOPICS = "q", "d"
_STREAM = {QUEUES: "QUEUES", TOPICS: "TOPICS"}
_KIND = {v: k for k, v in _STREAM.items()}


def shard_of(destination: str, n: int) -> int:
    """The shard of a destination among ``n``: stable across nodes, runs and versions."""
    return zlib.crc32(destination.encode()) % n if n > 1 else 0


def stream_name(cluster: str, kind: str, n: int, i: int) -> str:
    base = f"{cluster}_{_STREAM[kind]}"
    return base if n <= 1 else f"{base}_{n}_{i}"


def subject_root(cluster: str, kind: str, n: int, i: int) -> str:
    """The first tokens of every subject of shard ``i`` of layout ``n`` (the stream takes ``root.>``)."""
    return f"{cluster}.{kind}" if n <= 1 else f"{cluster}.{kind}{n}_{i}"


def parse_stream(cluster: str, name: str) -> tuple[str, int, int] | None:
    """(kind, n, i) of one of this cluster's queue or topic streams, else None."""
    m = re.fullmatch(rf"{re.escape(cluster)}_(QUEUES|TOPICS)(?:_(\d+)_(\d+))?", name)
    if m is None:
        return None
    if m.group(2) is None:
        return _KIND[m.group(1)], 1, 0
    n, i = int(m.group(2)), int(m.group(3))
    return (_KIND[m.group(1)], n, i) if n > 1 and i < n else None


def _tail(cluster: str, subject: str) -> str:
    """A subject without its ``<cluster>.`` prefix."""
    return subject[len(cluster) + 1:]


@functools.lru_cache(maxsize=4096)   # (once per destination, not per message)
def queue_subject(cluster: str, n: int, destination: str) -> str:
    """Where a queue message to ``destination`` is published in layout ``n``."""
    tail = _tail(cluster, subjects.queue_subject(cluster, destination))[2:]  # (after "q.")
    return f"{subject_root(cluster, QUEUES, n, shard_of(destination, n))}.{tail}"


@functools.lru_cache(maxsize=4096)
def topic_subject(cluster: str, n: int, destination: str) -> str:
    """Where a topic message kept for durables and replay is published in layout ``n``: the
    topic's own subject (``cluster/subjects.py``) under its shard's root."""
    tail = _tail(cluster, subjects.topic_subject(cluster, destination))
    return f"{subject_root(cluster, TOPICS, n, shard_of(destination, n))}.{tail}"


def reads(cluster: str, kind: str, pattern: str, layouts) -> list[tuple[str, list[str]]]:
    """(stream, subject filters) to read for a queue (``kind`` QUEUES, ``pattern`` its destination)
    or a durable subscription / replay (``kind`` TOPICS, ``pattern`` a topic pattern, ``*`` a
    prefix match), in each layout of ``layouts``: the one shard of a destination, or every shard
    for a wildcard (its filters are a superset; the broker filters exactly)."""
    out = []
    for n in sorted(set(layouts)):
        if kind == QUEUES:
            out.append((stream_name(cluster, kind, n, shard_of(pattern, n)), [queue_subject(cluster, n, pattern)]))
            continue
        if "*" not in pattern:
            out.append((stream_name(cluster, kind, n, shard_of(pattern, n)), [topic_subject(cluster, n, pattern)]))
            continue
        tails = [_tail(cluster, f) for f in subjects.pattern_filters(cluster, pattern)]
        for i in range(n):
            root = subject_root(cluster, kind, n, i)
            out.append((stream_name(cluster, kind, n, i), [f"{root}.{t}" for t in tails]))
    return out


def layouts(cluster: str, names, kind: str) -> dict[int, set[int]]:
    """layout n -> the shards of ``kind`` whose streams are among ``names``."""
    out: dict[int, set[int]] = {}
    for name in names:
        parsed = parse_stream(cluster, name)
        if parsed is not None and parsed[0] == kind:
            out.setdefault(parsed[1], set()).add(parsed[2])
    return out


def moves(streams: dict[str, tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """Leader moves that spread ``streams`` (name -> (leader, servers that could lead it: its
    current replicas, leader included)) over the servers: [(stream, new leader)].

    A server should lead at most one more stream than any other, as far as the replicas allow.
    Each step finds a chain from a server leading the most to one leading at least two fewer:
    ``A`` leads a stream ``B`` holds a copy of, ``B`` leads one ``C`` holds a copy of, ... (with
    3 copies over 5 servers the two ends may share no stream), and moves each stream of the chain
    one server on: ``A`` leads one fewer, the end one more, the others as many. Streams with one
    replica, or whose leader is unknown (an election), stay where they are."""
    count: dict[str, int] = {}
    for leader, peers in streams.values():
        for server in peers:
            count.setdefault(server, 0)
        if leader:
            count[leader] = count.get(leader, 0) + 1
    led = {name: leader for name, (leader, _) in streams.items() if leader}
    for _ in range(2 * len(streams)):   # each step evens the counts a little: few steps
        for start in sorted(count, key=lambda s: (-count[s], s)):
            chain = _chain(start, count, led, streams)
            if chain:
                for name, server in chain:
                    led[name] = server
                count[start] -= 1
                count[chain[-1][1]] += 1
                break
        else:
            break
    return [(name, led[name]) for name in sorted(led) if led[name] != streams[name][0]]


def _chain(start: str, count: dict, led: dict, streams: dict) -> list[tuple[str, str]]:
    """[(stream, its next leader)] from ``start`` to a server leading at least two fewer, or []."""
    by_leader: dict[str, list[str]] = {}
    for name in sorted(led):
        by_leader.setdefault(led[name], []).append(name)
    came: dict[str, tuple[str, str]] = {start: ("", "")}   # server -> (the server before it, the stream)
    todo = [start]
    while todo:
        server = todo.pop(0)
        for name in by_leader.get(server, ()):
            for peer in sorted(streams[name][1]):
                if peer in came:
                    continue
                came[peer] = (server, name)
                if count[peer] <= count[start] - 2:
                    chain = []
                    while peer != start:
                        before, via = came[peer]
                        chain.append((via, peer))
                        peer = before
                    return chain[::-1]
                todo.append(peer)
    return []
