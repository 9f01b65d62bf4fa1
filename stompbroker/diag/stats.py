"""Statistics gathered from every broker process, for DIAG queries, /queue/monitor and dump lines.

The dispatcher owns broker state; the reader and writers publish their counters in shared memory
(``processes.common.SharedStats``, updated once per loop) and writers publish a latency histogram
once per interval (a seqlock, so it is read whole, never torn). Process figures come from psutil.
"""

from __future__ import annotations

import os
import time

import orjson
import psutil

from .. import __version__
from ..titles import process_role
from . import answers, latency, schema

# stompica's queries; the first three answer with JSON objects, the rest with one value.
STOMPICA_QUERIES = ("session", "ws_buffer", "stale", "session-size", "session-encoded-size",
                    "session-connected-size", "pubsub-size", "subs")
QUERIES = STOMPICA_QUERIES + ("writers", "process", "queues", "latency", "totals", "cluster", "connections")
# The queries whose answers grow with the broker's state: cut at Config.answer_bytes, continued from
# an offset (the other answers are a few hundred bytes, bounded by the number of processes).
LISTS = ("queues", "subs", "connections")
# The queries answered for one virtual host when a DIAG names one (the asker's own by default): the
# others are the processes' figures, the same for every vhost.
PER_VHOST = ("queues", "subs", "pubsub-size", "connections", "session-size")


class Statistics:
    def __init__(self, broker, resources, config):
        self.broker = broker   # None until the Broker it reads is made with it (Broker binds it)
        self.resources = resources
        self.config = config
        self.interval = config.diag_interval / 1000
        self.started = time.time() * 1000
        self._procs: dict[int, psutil.Process] = {}
        self._last_writers: list[dict] | None = None
        self.dumps_dropped = 0   # dump lines the dispatcher could not hand to the supervisor

    # -- the queries ---------------------------------------------------------------------------
    def query(self, name: str, vhost: str | None = None):
        """A query's value; of ``vhost`` only, for the PER_VHOST queries, when one is named (None:
        every vhost's, another vhost's names shown ``VHOST:destination``)."""
        if vhost is not None and name in PER_VHOST:
            return self.of_vhost(name, vhost)
        if name == "session":
            return self.broker.session_stats()
        if name == "ws_buffer":
            reader = self.resources.reader_stats.read()
            return {"allocated": int(reader["ws_allocated"]), "hits": int(reader["ws_hits"]),
                    "misses": int(reader["ws_misses"])}
        if name == "stale":
            return {"input-queue-size": self.resources.input_ring.pending_records,
                    "output-queue-size": sum(r.pending_records for r in self.resources.output_rings),
                    "stale-queue-size": len(self.broker.stale) if self.broker.stale is not None else 0}
        if name == "session-size":
            return len(self.broker.sessions)
        if name == "session-encoded-size":
            return self.broker.session_stats()["websockets"]
        if name == "session-connected-size":
            return self.broker.session_stats()["stomp_connected"]
        if name == "pubsub-size":
            return len(self.broker.index)
        if name == "subs":
            return ",".join(self.broker.index.patterns())
        if name == "writers":
            return self.writers()
        if name == "process":
            return self.processes()
        if name == "queues":
            return self.broker.queue_stats()
        if name == "latency":
            return self.latency()
        if name == "totals":
            return self.totals()
        if name == "connections":
            return list(self.broker.connection_stats())
        if name == "cluster":  # cluster mode only: {} on a single node
            return self.broker.backplane.diag() if self.broker.backplane is not None else {}
        raise KeyError(name)

    def of_vhost(self, name: str, vhost: str):
        """A PER_VHOST query's value for ``vhost``, its destinations named as its clients name them."""
        if name == "queues":
            return self.broker.queue_stats(vhost)
        if name in ("subs", "pubsub-size"):
            patterns = self.broker.patterns(vhost)
            return ",".join(patterns) if name == "subs" else len(patterns)
        sessions = self.broker.sessions_of(vhost)
        return list(self.broker.connection_stats(0, sessions)) if name == "connections" else len(sessions)

    def vhost_connections(self) -> dict[str, int]:
        """STOMP sessions by virtual host (/metrics)."""
        return self.broker.vhost_connections()

    def text(self, name: str, offset: int = 0, vhost: str | None = None) -> tuple[str, dict[str, str]]:
        """A query's value as stompica's DIAG frame wrote it (JSON for objects and lists, plain for
        the rest), and the headers that say where a list was cut (``list_part``)."""
        if name in LISTS:
            return self.list_part(name, offset, vhost)
        value = self.query(name, vhost)
        if name == "stale":  # the frame form has the two queue sizes only, named as stompica named them
            value = {"in": value["input-queue-size"], "out": value["output-queue-size"]}
        return _header_value(value), {}

    def headers(self, name: str, offset: int = 0, vhost: str | None = None) -> dict[str, str]:
        """A query's value as MESSAGE headers (the DIAG topic form)."""
        if name in LISTS:
            text, more = self.list_part(name, offset, vhost)
            return {name: text, **more}
        value = self.query(name, vhost)
        if isinstance(value, dict):
            return {k: _header_value(v) for k, v in value.items()}
        return {name: _header_value(value)}

    def list_part(self, name: str, offset: int, vhost: str | None = None) -> tuple[str, dict[str, str]]:
        """The items of a list query from ``offset`` that fit in the answer budget (of ``vhost``
        only, when named), and the headers ``total`` (items in all; when cut or asked from an
        offset) and, when some are left out, ``truncated:true`` and ``next-offset``."""
        budget = self.config.answer_bytes
        if name == "queues":
            items = self.broker.queue_stats(vhost)
            text, end = answers.json_items(items, offset, budget)
            text = text.decode()
        elif name == "connections":  # (made from the offset on, as far as the answer goes)
            items = self.broker.sessions_of(vhost)
            listed, n = answers.json_iter(self.broker.connection_stats(offset, items), budget)
            text, end = listed.decode(), min(offset, len(items)) + n
        else:
            items = self.broker.patterns(vhost)
            text, end = answers.joined(items, offset, budget)
        # stompica's answer, byte for byte, unless cut or asked for from an offset
        more = {"total": str(len(items))} if offset or end < len(items) else {}
        if end < len(items):
            more.update({"truncated": "true", "next-offset": str(end)})
        return text, more

    def writers(self) -> list[dict]:
        out = []
        for index, shared in enumerate(self.resources.writer_stats):
            s = shared.read()
            out.append({"index": index, "connections": int(s["connections"]), "frames": int(s["frames"]),
                        "bytes": int(s["bytes"]), "batches": int(s["batches"]),
                        "batch_fill": round(s["fill"] / s["batches"], 4) if s["batches"] else 0.0,
                        "pending_bytes": int(s["pending_bytes"])})
        return out

    def processes(self) -> list[dict]:
        out = []
        supervisor = os.getppid()
        pids = [(supervisor, "supervisor")]
        try:
            for child in psutil.Process(supervisor).children():
                role = process_role(child)
                if role is not None:
                    pids.append((child.pid, role))
        except psutil.Error:
            pass
        for pid, role in pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                with proc.oneshot():
                    cpu = proc.cpu_times()
                    mem = proc.memory_info()
                    # private: anonymous resident memory (RssAnon = resident - shared). RSS also
                    # counts the shared-memory rings' pages as they are first touched.
                    out.append({"role": role, "pid": pid, "rss": mem.rss, "private": mem.rss - mem.shared,
                                "cpu_seconds": round(cpu.user + cpu.system, 3)})
            except psutil.Error:
                self._procs.pop(pid, None)
        return out

    def totals(self, writers: list[dict] | None = None) -> dict:
        """Cumulative counters since the broker started (the dump line's ``totals``)."""
        reader = self.resources.reader_stats.read()
        writers = self.writers() if writers is None else writers
        stats = self.broker.stats
        return {
            "frames_in": int(reader["frames_in"]),
            "frames_out": sum(w["frames"] for w in writers),
            "bytes_in": int(reader["bytes_in"]),
            "bytes_out": sum(w["bytes"] for w in writers),
            "connections_opened": stats["connections_opened"],
            "connections_closed": stats["connections_closed"],
            "messages_published": stats["messages_published"],
            "messages_delivered": stats["messages_delivered"],
            "messages_dropped": stats["messages_dropped"],
            "messages_expired": stats["messages_expired"],
            "messages_dead_lettered": stats["dead_lettered"],
            "errors": stats["errors"],
            "dump_errors": int(self.resources.supervisor_stats.read()["dump_errors"]),
            "dump_dropped": self.dumps_dropped,
        }

    def latency(self) -> dict:
        now = time.monotonic()
        merged = [0.0] * latency.BUCKETS
        for histogram in self.resources.writer_latency:
            for i, n in enumerate(histogram.read(2 * self.interval, now)):
                merged[i] += n
        return latency.summary(merged)

    # -- /queue/monitor ------------------------------------------------------------------------
    def monitor_body(self) -> bytes:
        """stompserver's status message: one block per queue, as many as fit in the answer budget
        (a last block says how many were left out), then the cluster's block in cluster mode."""
        tail = ""
        if self.broker.backplane is not None:
            c = self.broker.backplane.diag()
            tail = (f"Cluster: {c['node']}\nserver: {c['server'] or '(unreachable)'}\nrtt_ms: {c['rtt_ms']}\n"
                    f"messages_in: {c['messages_in']}\nmessages_out: {c['messages_out']}\n"
                    f"reconnects: {c['reconnects']}\n"
                    + "".join(f"stream {s['name']}: {s['messages']}\n" for s in c["streams"]) + "\n")
        lines = []
        budget = self.config.answer_bytes - len(tail) - 100  # (100: the "Truncated" block)
        queues = self.broker.queue_stats()
        for i, q in enumerate(queues):
            block = (f"Queue: {q['destination']}\nsize: {q['depth']}\nenqueued: {q['enqueued']}\n"
                     f"dequeued: {q['dequeued']}\n\n")
            budget -= len(block.encode())
            if budget < 0 and lines:
                lines.append(f"Truncated: {len(queues) - i} more queues (max_answer_bytes)\n\n")
                break
            lines.append(block)
        lines.append(tail)
        return "".join(lines).encode()

    # -- dump lines ----------------------------------------------------------------------------
    def snapshot(self) -> dict:
        writers = self.writers()
        totals = self.totals(writers)
        processes = self.processes()
        pid_of = {p["role"]: p["pid"] for p in processes}
        last = {w["index"]: w for w in (self._last_writers or [])}
        for w in writers:  # batch fill over this interval, not since start
            prev = last.get(w["index"])
            fill_now = w["batch_fill"] * w["batches"]
            if prev and w["batches"] >= prev["batches"]:
                batches = w["batches"] - prev["batches"]
                fill = fill_now - prev["batch_fill"] * prev["batches"]
                w["batch_fill"] = round(fill / batches, 4) if batches else 0.0
            w["pid"] = pid_of.get(f"writer-{w['index']}", 0)
        self._last_writers = [dict(w, batch_fill=_cumulative_fill(self.resources, w["index"])) for w in writers]
        return {
            "schema": schema.VERSION,
            "ts": round(time.time() * 1000, 1),
            "interval_ms": self.config.diag_interval,
            "settings_id": self.config.settings_id,
            # broker.node only when configured: a default such as the host name would change
            # with every container re-creation and split one broker into several nodes.
            "broker": {"version": __version__, "start": self.started, "pid": os.getppid(),
                       **({"node": self.config.node_id} if self.config.node_id else {})},
            "session": self.query("session"),
            "ws_buffer": self.query("ws_buffer"),
            "stale": self.query("stale"),
            "totals": totals,
            "writers": writers,
            "process": processes,
            "queues": self.broker.queue_stats(),
            "latency": self.latency(),
            **({"cluster": self.query("cluster")} if self.broker.backplane is not None else {}),
        }


def _cumulative_fill(resources, index: int) -> float:
    s = resources.writer_stats[index].read()
    return s["fill"] / s["batches"] if s["batches"] else 0.0


def _header_value(value) -> str:
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value)
