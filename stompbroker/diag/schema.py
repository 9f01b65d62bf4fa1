"""The statistics dump line (``diag_dump``), schema version 1: every field and its type, in one
place. The broker writes it (``diag/stats.py``), the Spark analysis reads it with a schema built
from it (``analysis/dumps.py``) and the tests check lines against it; docs/diag-schema.md says
what each field means. Later versions may add fields; readers ignore the ones they do not know."""

from __future__ import annotations

VERSION = 1

# Types: INT stays an integer when read (a version, a pid); NUMBER is read as a double, so a field
# that later turns from int to float (or is written 1e3) still reads (exact up to 2**53).
INT, NUMBER, STRING = "int", "number", "string"


def _numbers(*names: str) -> dict:
    return dict.fromkeys(names, NUMBER)


# A dict is an object, a one-element list an array of that object.
LINE = {
    "schema": INT,
    "ts": NUMBER,
    "interval_ms": NUMBER,
    "settings_id": STRING,
    "broker": {"version": STRING, "start": NUMBER, "pid": INT, "node": STRING},
    "session": _numbers("clients", "websockets", "stomp_connected", "subscriptions"),
    "ws_buffer": _numbers("allocated", "hits", "misses"),
    "stale": _numbers("input-queue-size", "output-queue-size", "stale-queue-size"),
    "totals": _numbers("frames_in", "frames_out", "bytes_in", "bytes_out", "connections_opened",
                       "connections_closed", "messages_published", "messages_delivered", "messages_dropped",
                       "messages_expired", "messages_dead_lettered", "errors", "dump_errors", "dump_dropped"),
    "writers": [_numbers("index", "pid", "connections", "frames", "bytes", "batches", "batch_fill",
                         "pending_bytes")],
    "process": [{"role": STRING, **_numbers("pid", "rss", "private", "cpu_seconds")}],
    "queues": [{"destination": STRING, **_numbers("depth", "enqueued", "dequeued", "unacked", "consumers")}],
    "latency": _numbers("count", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"),
    # cluster mode only (docs/cluster.md): this node, its NATS server and the traffic across nodes
    "cluster": {"node": STRING, "server": STRING,
                **_numbers("connected", "rtt_ms", "messages_in", "messages_out", "bytes_in", "bytes_out",
                           "reconnects", "subscriptions", "peers", "local_patterns", "remote_patterns", "remote_subscriptions", "held", "failed",
                           "busy", "busy_nodes", "throttled"),
                "streams": [{"name": STRING, "leader": STRING, "shard": STRING,
                             **_numbers("messages", "bytes", "stored", "replicas")}]},
}

# Fields a line written by this broker may leave out: broker.node when the node_id setting is empty,
# cluster on a single node.
OPTIONAL = frozenset({"broker.node", "cluster"})

_PYTHON = {INT: (int,), NUMBER: (int, float), STRING: (str,)}


def problems(line: dict, strict: bool = True) -> list[str]:
    """What is wrong with one parsed dump line: fields of the wrong type, and (``strict``, as for
    a line this broker wrote) missing fields and fields this schema does not declare. Empty if none."""
    out: list[str] = []
    _check(line, LINE, "", strict, out)
    return out


def _check(value, kind, where: str, strict: bool, out: list[str]) -> None:
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            out.append(f"{where or 'line'}: not an object")
            return
        for name, sub in kind.items():
            path = f"{where}.{name}" if where else name
            if name in value:
                _check(value[name], sub, path, strict, out)
            elif strict and path not in OPTIONAL:
                out.append(f"{path}: missing")
        if strict:
            out.extend(f"{where}.{name}: not in the schema" if where else f"{name}: not in the schema"
                       for name in value if name not in kind)
    elif isinstance(kind, list):
        if not isinstance(value, list):
            out.append(f"{where}: not an array")
            return
        for i, item in enumerate(value):
            _check(item, kind[0], f"{where}[{i}]", strict, out)
    elif isinstance(value, bool) or not isinstance(value, _PYTHON[kind]):
        out.append(f"{where}: {type(value).__name__}, not {kind}")
