"""Synthetic diag_dump files with known figures, for the analysis tests.

Two broker runs of 30 intervals each (a restart in between), written like the
broker rotates them: run 0 in <path>.1, run 1 in <path>.  Counters grow at
exactly the RATES below; line spacing jitters (1.2 s, 0.8 s, 1.0 s, ...) while
interval_ms stays 1000, so rates are only exact when computed from ts.
Also: an unknown field (must be ignored), a truncated last line (crash).

    python tests/diag_dump_fixture.py /tmp/diag.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stompbroker.diag import schema

SAMPLES_PER_RUN = 30
RUN_STARTS = (1_763_700_000_000.0, 1_763_700_035_000.0)  # run 1 starts 5 s after run 0's last line
BROKER_PIDS = (1234, 2234)
RATES = {  # per second, for the whole run
    "frames_in": 100,
    "frames_out": 300,
    "bytes_in": 10_000,
    "bytes_out": 40_000,
    "messages_published": 100,
    "messages_delivered": 300,
    "connections_opened": 10,
    "connections_closed": 5,
}
WRITER_SHARES = (0.5, 0.3, 0.2)  # of frames_out / bytes_out -> imbalance 0.5 / (1/3) = 1.5
WRITER_FILL = (0.6, 0.4, 0.2)
QUEUE_IN, QUEUE_OUT = 100, 90  # /queue/a enqueued/dequeued per second -> depth 10/s
LATENCY = {"p50_ms": 0.4, "p90_ms": 0.9, "p99_ms": 1.5, "p999_ms": 2.5, "max_ms": 3.1}
SPIKE = (0, 10, {"p99_ms": 12.0, "p999_ms": 15.0, "max_ms": 20.0})  # run 0, sample 10
LEAK_STEP = 65_536  # dispatcher RSS growth per growing step (3 of every 4 steps)

# Expected results, derived from the above.
COVERED_S = 2 * SAMPLES_PER_RUN  # the samples of a run cover [start, start + 30 s]
DURATION_S = (RUN_STARTS[1] + 30_000 - (RUN_STARTS[0] + 1_200)) / 1000.0  # 63.8
IMBALANCE = max(WRITER_SHARES) / (sum(WRITER_SHARES) / len(WRITER_SHARES))
MAX_DEPTH = (QUEUE_IN - QUEUE_OUT) * SAMPLES_PER_RUN
LEAKING_ROLE = "dispatcher"


def elapsed_ms(k: int) -> int:
    """Sample k (1-based) is taken this long after broker start; multiples of 200 ms
    keep every counter integral."""
    return 1000 * k + (200 if k % 3 == 1 else 0)


def _rss(role: str, k: int) -> int:
    if role == "supervisor":  # flat with page-sized noise, up and down
        return 30_000_000 + (4096 if k % 2 else 0)
    if role == "reader":  # one jump a third of the way in: not steady growth
        return 25_000_000 + (8_000_000 if k > SAMPLES_PER_RUN // 3 else 0)
    if role == "dispatcher":  # steady leak, flat every 4th step
        return 26_000_000 + LEAK_STEP * (k - k // 4)
    return 24_000_000  # writers: constant


def line(run: int, k: int, factor: int = 1, pid_offset: int = 0) -> dict:
    start = RUN_STARTS[run]
    e = elapsed_ms(k)
    sec = e / 1000.0
    c = {name: round(factor * rate * sec) for name, rate in RATES.items()}
    pid = BROKER_PIDS[run] + pid_offset
    lat = dict(LATENCY)
    if (run, k) == SPIKE[:2]:
        lat.update(SPIKE[2])
    writers = [
        {
            "index": i,
            "pid": pid + 6 + i,
            "connections": 3,
            "frames": round(c["frames_out"] * share),
            "bytes": round(c["bytes_out"] * share),
            "batches": round(10 * sec),
            "batch_fill": WRITER_FILL[i],
            "pending_bytes": 0,
        }
        for i, share in enumerate(WRITER_SHARES)
    ]
    roles = [("supervisor", 0), ("reader", 4), ("dispatcher", 5)] + [(f"writer-{i}", 6 + i) for i in range(3)]
    process = [
        {"role": r, "pid": pid + off, "rss": _rss(r.split("-")[0], k), "cpu_seconds": round(0.01 * k * (off + 1), 4)}
        for r, off in roles
    ]
    return {
        "schema": schema.VERSION,
        "ts": start + e,
        "interval_ms": 1000,
        "settings_id": "a1b2c3d4",
        "broker": {"version": "0.1.0", "start": start, "pid": pid},
        "session": {
            "clients": c["connections_opened"] - c["connections_closed"],
            "websockets": 1,
            "stomp_connected": c["connections_opened"] - c["connections_closed"],
            "subscriptions": 5,
        },
        "ws_buffer": {"allocated": 0, "hits": 10 * k, "misses": 2},
        "stale": {"input-queue-size": 0, "output-queue-size": 0, "stale-queue-size": 0},
        "totals": c,
        "writers": writers,
        "process": process,
        "queues": [
            {"destination": "/queue/a", "depth": round((QUEUE_IN - QUEUE_OUT) * sec),
             "enqueued": round(QUEUE_IN * sec), "dequeued": round(QUEUE_OUT * sec), "unacked": 0, "consumers": 1},
            {"destination": "/queue/b", "depth": 0, "enqueued": 0, "dequeued": 0, "unacked": 0, "consumers": 2},
        ],
        "latency": {"count": factor * RATES["messages_delivered"] * (e - (elapsed_ms(k - 1) if k > 1 else 0)) // 1000,
                    **lat},
        # A field from some future schema: readers must ignore it.
        "future": {"something": [1, 2, 3]},
    }


def write_dump(path) -> list[Path]:
    """Write <path>.1 (run 0) and <path> (run 1, ending in a truncated line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    older = Path(f"{path}.1")
    with older.open("w") as f:
        for k in range(1, SAMPLES_PER_RUN + 1):
            f.write(json.dumps(line(0, k)) + "\n")
    with path.open("w") as f:
        for k in range(1, SAMPLES_PER_RUN + 1):
            f.write(json.dumps(line(1, k)) + "\n")
        f.write(json.dumps(line(1, SAMPLES_PER_RUN + 1))[:57])  # killed mid-write
    return [older, path]


FLEET_FACTOR = 2  # node "b" runs at twice the rates of node "a"
CLUSTER_RATES = {"messages_in": 10, "messages_out": 20, "bytes_in": 1000, "bytes_out": 2000}


def cluster_section(k: int) -> dict:
    """Node "b" runs in cluster mode: CLUSTER_RATES across nodes, one reconnect halfway, one
    interval unreachable, k messages in its queue stream."""
    sec = elapsed_ms(k) / 1000.0
    return {"node": "b", "server": "nats://10.0.0.1:4222", "connected": 0 if k == 3 else 1, "rtt_ms": 0.5,
            **{name: round(rate * sec) for name, rate in CLUSTER_RATES.items()},
            "reconnects": 1 if k > SAMPLES_PER_RUN // 2 else 0, "subscriptions": 2, "local_patterns": 2,
            "peers": 1, "remote_patterns": 1, "remote_subscriptions": 1, "held": 0, "failed": 0,
            "busy": 0, "busy_nodes": 0, "throttled": 0,
            "streams": [{"name": "c_QUEUES_6_0", "messages": k, "bytes": 100 * k, "stored": 2 * k, "leader": "nats1",
                         "replicas": 3, "shard": "0/6"}]}


def write_fleet(base) -> list[str]:
    """A fleet of two brokers laid out one directory per node: <base>/a holds write_dump()
    (two runs); <base>/b one run of the same span at FLEET_FACTOR times the rates, other
    pids, and broker.node set to "b" (as the node_id setting writes it).  Returns the globs."""
    base = Path(base)
    write_dump(base / "a" / "diag.jsonl")
    b = base / "b" / "diag.jsonl"
    b.parent.mkdir(parents=True, exist_ok=True)
    with b.open("w") as f:
        for k in range(1, SAMPLES_PER_RUN + 1):
            entry = line(0, k, factor=FLEET_FACTOR, pid_offset=50)
            entry["broker"]["node"] = "b"
            entry["cluster"] = cluster_section(k)
            f.write(json.dumps(entry) + "\n")
    return [f"{base}/a/diag.jsonl*", f"{base}/b/diag.jsonl*"]


if __name__ == "__main__":
    for p in write_dump(sys.argv[1] if len(sys.argv) > 1 else "diag.jsonl"):
        print(p)
