"""Cluster scenarios: ``stompbroker-bench cluster [--scenario ...] [bench options]``.

Each run starts a local NATS JetStream cluster (``stompbroker.tools.natscluster``, the pip
``nats-server``) and broker nodes on it (``python -m stompbroker cluster=... node_id=nI ARGS``, ARGS
from ``--spawn``), drives them with the bench's producers and consumers, and stops everything.

- ``fanout``: one producer on node 0, ``--fanout`` subscriber connections spread over the other
  nodes: every message crosses NATS once per remote node, then fans out there.
- ``queue``: one producer on node 0 sending persistent SENDs with receipts to a queue,
  ``--queue-consumers`` consumers on the other nodes: every message is stored in JetStream
  (``cluster_replicas`` copies) before its receipt and pulled by one remote node.
- ``packing``: what JetStream itself spends per message when N messages go in one JetStream message
  (N = 1, 4, 16, 64; ``cluster/packs.py``): on a bare NATS cluster, no broker, a nats-py pair per N
  (``natsceiling.py``: publish, pull, ack) on a work-queue stream like the broker's, at R1 and R3
  (``--replicas`` for one), the same messages in flight for every N: NATS servers' CPU per message
  and per JetStream message.
- ``local``: the cost of cluster mode for traffic whose subscribers are all local: the same
  fan-out (producer and ``--fanout`` subscribers on one node) against a single-node broker and
  against node 0 of a cluster whose other nodes subscribe other topics (so node 0 checks each
  message against remote interest), ``--rounds`` times each, interleaved; compares deliveries/s and
  deliveries per broker CPU-second (the steadier figure on a shared machine). Target: < 10 % cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from .clusternodes import Cluster, Keepers, Nodes, consumers_on, remote_nodes, target_of
from .procs import SpawnedBroker, system_busy
from .report import new_result, summary_line
from .scale import cluster_scale
from .scale import table as scale_table

SCENARIOS = ("fanout", "queue", "local", "packing")
PACKINGS = (1, 4, 16, 64)
PACKING_IN_FLIGHT = 256   # messages in flight in every packing run (PubAcks outstanding: this / N)
LOCAL_COST_TARGET = 0.10


def cluster_fanout(runner, copts, transport: str) -> dict:
    o = runner.opts
    n = o.fanout
    name = f"cluster-fanout-{transport}"
    params = {"nodes": copts.nodes, "nats_servers": copts.nats_servers, "fanout": n, "size": o.size,
              "duration": o.duration, "flow_control": runner.flow_label,
              "layout": f"producer on n0, {n} subscriber connections over n1..n{copts.nodes - 1}"}

    def body():
        cluster = Cluster(copts.nodes, copts.nats_servers, runner.spawn_args)
        keepers = None
        try:
            dest = f"/topic/bench-{runner.run_id}-xfan"
            where = remote_nodes(copts.nodes, n)
            keepers = Keepers(cluster, o, [dest], sorted(set(where)))
            consumers = consumers_on(runner, cluster, transport, dest, where)
            p = runner.producer_spec(target_of(cluster.nodes[0], o), transport, dest, fan=n,
                                     max_inflight=runner.inflight_cap(n))
            nodes = Nodes(cluster.nodes, cluster.nats)
            flow = runner.flow(name, [p], consumers, o.duration, nodes, fan=n)
            return runner.delivery_result(name, "cluster-fanout", transport, params, flow, nodes, n)
        finally:
            if keepers:
                keepers.close()
            cluster.close()

    return runner.guarded(name, "cluster-fanout", transport, params, body)


def cluster_queue(runner, copts, transport: str):
    """The cross-node queue, then in the same run what it is read against: the ceiling (a plain
    nats-py pair on the same stream, while that cluster is still up: one message per JetStream
    message, and, when the nodes pack, as many per JetStream message as they may) and one
    standalone node with store=sqlite (same producer, same consumers, same flow control); then the
    summary."""
    o = runner.opts
    k = o.queue_consumers
    name = f"cluster-queue-{transport}"
    replicas = copts.replicas or (3 if copts.nats_servers >= 3 else 1)
    params = {"nodes": copts.nodes, "nats_servers": copts.nats_servers, "consumers": k, "size": o.size,
              "duration": o.duration, "flow_control": runner.flow_label, "persistent": True, "replicas": replicas,
              "cluster_streams": None, "cluster_pack_max": None,
              "layout": f"producer on n0 (persistent SENDs, receipts), {k} consumers over n1..n{copts.nodes - 1}"}
    ceiling = {}

    def body():
        cluster = Cluster(copts.nodes, copts.nats_servers, runner.spawn_args + [f"cluster_replicas={replicas}"])
        params["cluster_streams"], params["cluster_pack_max"] = cluster.streams, cluster.pack
        try:
            dest = f"/queue/bench-{runner.run_id}-xq"
            consumers = consumers_on(runner, cluster, transport, dest, remote_nodes(copts.nodes, k))
            p = runner.producer_spec(target_of(cluster.nodes[0], o), transport, dest, fan=1,
                                     max_inflight=runner.inflight_cap(k), headers=[("persistent", "true")])
            nodes = Nodes(cluster.nodes, cluster.nats)
            flow = runner.flow(name, [p], consumers, o.duration, nodes, fan=1)
            pss, pss_by = nodes.pss()
            res = runner.delivery_result(name, "cluster-queue", transport, params, flow, nodes, 1)
            res["broker"]["pss_bytes"], res["broker"]["pss_by_process"] = pss, pss_by
            res["notes"].append(f"every message stored in JetStream (R{replicas}) before its receipt")
            stored = cluster.stored([dest])
            if stored:
                res["counts"]["jetstream_messages"] = stored
                res["counts"]["messages_per_jetstream_message"] = round(res["counts"]["delivered"] / stored, 2)
                res["notes"].append(f"{stored} JetStream messages stored (up to {cluster.pack} messages in one): "
                                    f"{res['counts']['messages_per_jetstream_message']} messages each")
            if copts.baselines:
                ceiling["result"] = nats_ceiling(runner, copts, cluster, nodes, transport, replicas)
                if cluster.pack > 1:
                    ceiling["packed"] = nats_ceiling(runner, copts, cluster, nodes, transport, replicas, cluster.pack)
            return res
        finally:
            cluster.close()

    cross = runner.guarded(name, "cluster-queue", transport, params, body)
    yield cross
    if not copts.baselines:
        return
    yield ceiling.get("result") or runner.skipped(f"cluster-queue-ceiling-{transport}", transport,
                                                  "not measured: the cross-node run failed")
    if ceiling.get("packed"):
        yield ceiling["packed"]
    time.sleep(o.pause)
    sqlite = sqlite_queue(runner, transport)
    yield sqlite
    yield queue_summary(cross, ceiling.get("result"), sqlite, transport, ceiling.get("packed"))


def nats_ceiling(runner, copts, cluster, nodes, transport: str, replicas: int, pack: int = 1) -> dict:
    """The plain nats-py pair on the stream the broker's queues use (publisher on the first NATS
    server, consumer on the second): msg/s stored and consumed, and the CPU it took. ``pack``:
    messages per JetStream message (the nodes' pack size: what JetStream carries for a broker that
    packs as much)."""
    from ..cluster.shards import queue_subject
    from .natsceiling import measure

    o = runner.opts
    name = f"cluster-queue-ceiling{'-packed' if pack > 1 else ''}-{transport}"
    urls = cluster.nats.urls
    pending = copts.nats_pending
    params = {"nats_servers": len(urls), "replicas": replicas, "size": o.size, "duration": o.duration, "pack": pack,
              "flow_control": f"publish_async, at most {pending} PubAcks outstanding; fetch batches of 256, each "
                              "acked" + (f"; {pack} messages per JetStream message" if pack > 1 else ""),
              "layout": "nats-py publisher on nats0, consumer on nats1, the broker's queue stream"}

    def body():
        before, busy0 = nodes.cpu(), system_busy()
        t0 = time.monotonic()
        m = measure(urls[0], urls[1 % len(urls)], queue_subject(cluster.name, cluster.streams,
                                                               f"/queue/bench-{runner.run_id}-ceiling{pack}",
                                                               cluster.pack),
                    o.size, o.duration, pending=pending, pack=pack)
        wall = time.monotonic() - t0
        after, busy = nodes.cpu(), system_busy() - busy0
        res = new_result(name, "cluster-queue-ceiling", transport, params)
        res["duration_s"] = m["seconds"]
        res["counts"] = {"sent": m["acked"], "delivered": m["consumed"], "failed": m["failed"], "stream": m["stream"]}
        rate = min(m["stored_per_s"], m["consumed_per_s"])
        res["rates"] = {"sends_per_s": m["stored_per_s"], "deliveries_per_s": m["consumed_per_s"]}
        nats_cpu = {k: round(after[k] - before.get(k, 0.0), 3) for k in after
                    if k.startswith("nats") and not k.endswith(":sys")}
        res["broker"]["label"] = "NATS JetStream alone (nats-py clients)"
        res["broker"]["cpu_s"] = round(sum(nats_cpu.values()) + sum(m["client_cpu_s"].values()), 3)
        res["broker"]["cpu_by_process"] = {**nats_cpu, **{f"client:{k}": v for k, v in m["client_cpu_s"].items()}}
        if m["consumed"] and res["broker"]["cpu_s"]:
            res["deliveries_per_cpu_s"] = round(m["consumed"] / res["broker"]["cpu_s"])
        res["machine"] = {"cores": os.cpu_count(), "busy_cores": round(busy / wall, 2), "load_avg": os.getloadavg(),
                          "other_processes_cores": round(max(busy - res["broker"]["cpu_s"], 0.0) / wall, 2)}
        res["headline"] = {"metric": "msg/s stored and consumed", "value": rate, "unit": "1/s"}
        return res

    try:
        return runner.guarded(name, "cluster-queue-ceiling", transport, params, body)
    except Exception as exc:  # nats-py errors: reported, not fatal to the run
        res = new_result(name, "cluster-queue-ceiling", transport, params)
        res["status"] = "error"
        res["notes"].append(repr(exc))
        return res


def sqlite_queue(runner, transport: str, extra_args=("store=sqlite",), label: str = "sqlite") -> dict:
    """One standalone node (store=sqlite): the same producer (persistent SENDs, receipts) and the
    same consumers, all on that node."""
    o = runner.opts
    k = o.queue_consumers
    name = f"cluster-queue-{label}-{transport}"
    params = {"nodes": 1, "consumers": k, "size": o.size, "duration": o.duration, "flow_control": runner.flow_label,
              "persistent": True, "layout": f"one standalone node ({' '.join(extra_args)}): producer and {k} "
                                            "consumers on it"}

    def body():
        broker = SpawnedBroker(list(runner.spawn_args) + list(extra_args))
        try:
            time.sleep(0.3)
            t = target_of(broker, o)
            dest = f"/queue/bench-{runner.run_id}-{label}"
            consumers = runner.consumer_specs(t, transport, [[(dest, "0", [])] for _ in range(k)],
                                              min(o.consumer_procs, k))
            p = runner.producer_spec(t, transport, dest, fan=1, max_inflight=runner.inflight_cap(k),
                                     headers=[("persistent", "true")])
            flow = runner.flow(name, [p], consumers, o.duration, broker, fan=1)
            return runner.delivery_result(name, "cluster-queue-baseline", transport, params, flow, broker, 1)
        finally:
            broker.stop()

    return runner.guarded(name, "cluster-queue-baseline", transport, params, body)


QUEUE_VS_CEILING_TARGET = 0.5
QUEUE_VS_SQLITE_TARGET = 1.0
BRIDGE_US_TARGET = 10.0
NODE_CPU_RATIO_TARGET = 1.5


def queue_summary(cross: dict, ceiling: dict | None, sqlite: dict, transport: str,
                  packed: dict | None = None) -> dict:
    """The cross-node queue as a ratio of the NATS ceiling (and of the packed one, where the nodes
    pack) and of the standalone sqlite node, and its CPU per message (the bridges' on each side;
    the whole cluster's against the sqlite node's)."""
    res = new_result(f"cluster-queue-summary-{transport}", "cluster-queue-summary", transport,
                     {"flow_control": cross["parameters"].get("flow_control")})
    ok = lambda r: r is not None and r["status"] == "ok"  # noqa: E731
    rate = cross["rates"].get("deliveries_per_s") if ok(cross) else None
    ceiling_rate = ceiling["headline"]["value"] if ok(ceiling) else None
    sqlite_rate = sqlite["rates"].get("deliveries_per_s") if ok(sqlite) else None
    ratio = lambda a, b: round(a / b, 3) if a and b else None  # noqa: E731
    packed_rate = packed["headline"]["value"] if ok(packed) else None
    res["rates"] = {"cross_node_per_s": rate, "ceiling_per_s": ceiling_rate, "sqlite_node_per_s": sqlite_rate,
                    "vs_ceiling": ratio(rate, ceiling_rate), "vs_sqlite_node": ratio(rate, sqlite_rate)}
    if packed is not None:
        res["rates"]["packed_ceiling_per_s"] = packed_rate
        res["rates"]["vs_packed_ceiling"] = ratio(rate, packed_rate)
    cpu = {}
    if ok(cross) and cross["counts"].get("delivered"):
        n = cross["counts"]["delivered"]
        by = cross["broker"]["cpu_by_process"]
        us = lambda keys: round(sum(by.get(k, 0.0) for k in keys) / n * 1e6, 1)  # noqa: E731
        cpu["bridge_sending_us"] = us([k for k in by if k == "n0:cluster"])
        cpu["bridge_receiving_us"] = us([k for k in by if k.endswith(":cluster") and k != "n0:cluster"])
        cpu["nats_us"] = us([k for k in by if k.startswith("nats")])
        cpu["brokers_us"] = us([k for k in by if not k.startswith("nats")])
        cpu["cluster_us"] = round(cross["broker"]["cpu_s"] / n * 1e6, 1)
    if ok(sqlite) and sqlite["counts"].get("delivered") and sqlite["broker"]["cpu_s"]:
        cpu["sqlite_node_us"] = round(sqlite["broker"]["cpu_s"] / sqlite["counts"]["delivered"] * 1e6, 1)
    if cpu.get("cluster_us") and cpu.get("sqlite_node_us"):
        cpu["cluster_vs_sqlite_node"] = round(cpu["cluster_us"] / cpu["sqlite_node_us"], 2)
        cpu["brokers_vs_sqlite_node"] = round(cpu["brokers_us"] / cpu["sqlite_node_us"], 2)
    res["counts"] = {"cpu_us_per_message": cpu}
    res["duration_s"] = cross["duration_s"]
    value = res["rates"]["vs_ceiling"]
    res["headline"] = {"metric": "cross-node queue / NATS ceiling", "value": value, "unit": "x"}
    res["target"] = {"metric": "cross-node queue / NATS ceiling", "op": ">=", "goal": QUEUE_VS_CEILING_TARGET,
                     "unit": "x", "value": value, "met": None if value is None else value >= QUEUE_VS_CEILING_TARGET}
    res["targets"] = [
        res["target"],
        _target("cross-node queue / standalone sqlite node", res["rates"]["vs_sqlite_node"], ">=",
                QUEUE_VS_SQLITE_TARGET, "x"),
        _target("sending bridge CPU per message", cpu.get("bridge_sending_us"), "<=", BRIDGE_US_TARGET, "us"),
        _target("receiving bridges' CPU per message", cpu.get("bridge_receiving_us"), "<=", BRIDGE_US_TARGET, "us"),
        _target("cluster CPU per message / standalone sqlite node's", cpu.get("cluster_vs_sqlite_node"), "<=",
                NODE_CPU_RATIO_TARGET, "x"),
    ]
    if packed is not None:
        res["targets"].insert(1, _target("cross-node queue / NATS ceiling at the nodes' pack size",
                                         res["rates"].get("vs_packed_ceiling"), ">=", QUEUE_VS_CEILING_TARGET, "x"))
    if value is None and res["rates"]["vs_sqlite_node"] is None:
        res["status"] = "error"
        res["notes"].append("not enough successful runs to compare")
    return res


def _target(metric: str, value, op: str, goal: float, unit: str) -> dict:
    met = None if value is None else (value >= goal if op == ">=" else value <= goal)
    return {"metric": metric, "op": op, "goal": goal, "unit": unit, "value": value, "met": met}


def _local_fanout(runner, broker, name: str, transport: str, params: dict) -> dict:
    o = runner.opts
    n = o.fanout
    t = target_of(broker, o)
    dest = f"/topic/bench-{runner.run_id}-local"
    consumers = runner.consumer_specs(t, transport, [[(dest, "0", [])] for _ in range(n)], o.consumer_procs)
    p = runner.producer_spec(t, transport, dest, fan=n, max_inflight=runner.inflight_cap(n))
    flow = runner.flow(name, [p], consumers, o.duration, broker, fan=n)
    return runner.delivery_result(name, "cluster-local", transport, params, flow, broker, n)


def cluster_local(runner, copts, transport: str) -> list[dict]:
    """Single node and cluster node 0, alternately, --rounds times; then a summary result."""
    o = runner.opts
    n = o.fanout
    out = []
    for r in range(copts.rounds):
        for mode in ("single", "cluster"):
            name = f"cluster-local-{mode}-{transport}"
            params = {"mode": mode, "round": r, "fanout": n, "size": o.size, "duration": o.duration,
                      "flow_control": runner.flow_label,
                      "layout": f"producer and {n} subscriber connections on one node"
                                + (f" of {copts.nodes} (NATS: {copts.nats_servers} servers; the other nodes "
                                   "subscribe 21 other topic patterns)" if mode == "cluster" else "")}

            def body(mode=mode, name=name, params=params):
                if mode == "single":
                    broker = SpawnedBroker(list(runner.spawn_args))
                    try:
                        time.sleep(0.3)
                        return _local_fanout(runner, broker, name, transport, params)
                    finally:
                        broker.stop()
                cluster = Cluster(copts.nodes, copts.nats_servers, runner.spawn_args)
                keepers = None
                try:
                    # the other nodes want other topics: node 0 checks every message against their interest
                    keepers = Keepers(cluster, o, [f"/topic/bench-{runner.run_id}-elsewhere-{i}" for i in range(20)]
                                      + [f"/topic/bench-{runner.run_id}-other*"], list(range(1, copts.nodes)))
                    return _local_fanout(runner, cluster.nodes[0], name, transport, params)
                finally:
                    if keepers:
                        keepers.close()
                    cluster.close()

            res = runner.guarded(name, "cluster-local", transport, params, body)
            out.append(res)
            yield res
            time.sleep(o.pause)
    yield local_summary(out, transport)


def local_summary(results: list[dict], transport: str) -> dict:
    """Median deliveries/s and deliveries per broker CPU-second, cluster node against single node."""
    res = new_result(f"cluster-local-cost-{transport}", "cluster-local", transport, {"rounds": len(results) // 2})

    def med(mode, key):
        vals = [r[key] if key == "deliveries_per_cpu_s" else r["rates"]["deliveries_per_s"]
                for r in results if r["status"] == "ok" and r["parameters"]["mode"] == mode and
                (key != "deliveries_per_cpu_s" or r.get(key))]
        return statistics.median(vals) if vals else None

    figures = {mode: {"deliveries_per_s": med(mode, "rate"), "deliveries_per_cpu_s": med(mode, "deliveries_per_cpu_s")}
               for mode in ("single", "cluster")}
    res["counts"] = figures
    cost = {}
    for key in ("deliveries_per_s", "deliveries_per_cpu_s"):
        single, cluster = figures["single"][key], figures["cluster"][key]
        cost[key] = round(1 - cluster / single, 4) if single and cluster else None
    res["rates"] = {"cost": cost}
    value = cost["deliveries_per_cpu_s"]
    pct = None if value is None else round(100 * value, 1)
    res["headline"] = {"metric": "% cluster cost (broker CPU per delivery)", "value": pct, "unit": "%"}
    res["target"] = {"metric": "cluster cost (broker CPU per delivery)", "op": "<=", "goal": 100 * LOCAL_COST_TARGET,
                     "unit": "%", "value": pct, "met": None if pct is None else pct <= 100 * LOCAL_COST_TARGET}
    res["duration_s"] = round(sum(r["duration_s"] or 0 for r in results), 3)
    if value is None:
        res["status"] = "error"
        res["notes"].append("not enough successful runs to compare")
    return res


def member_size(size: int) -> int:
    """Bytes of one queue message as a pack holds it: a ``size``-byte body with its id and the
    headers of the bench's persistent SEND."""
    from ..cluster import packs
    return len(packs.member("0123456789ab-n0-000001", {"destination": "/queue/bench-0000-xq", "persistent": "true",
                                                       "content-length": str(size)}, b"x" * size))


def cluster_packing(runner, copts, transport: str):
    """NATS servers' CPU per message, N messages per JetStream message, publish + pull + ack."""
    import asyncio

    import psutil

    from ..tools.natscluster import NatsCluster
    from .natsceiling import measure

    o = runner.opts
    size = member_size(o.size)
    rows = []
    with NatsCluster(copts.nats_servers) as nats:
        procs = {s.name: psutil.Process(s.proc.pid) for s in nats.servers}
        for replicas in ([copts.replicas] if copts.replicas else [1, 3]):
            asyncio.run(_packing_stream(nats.urls[0], f"PACKING_R{replicas}", f"packing{replicas}", replicas))
            for n in PACKINGS:
                pending = max(PACKING_IN_FLIGHT // n, 2)
                name = f"cluster-packing-R{replicas}-N{n}-{transport}"
                params = {"replicas": replicas, "pack": n, "message_bytes": size, "duration": o.duration,
                          "nats_servers": copts.nats_servers,
                          "flow_control": f"publish_async, {PACKING_IN_FLIGHT} messages in flight ({pending} PubAcks "
                                          f"outstanding); fetch batches of {pending}, each acked",
                          "layout": "nats-py publisher on nats0, consumer on nats1; no broker"}

                def body(n=n, pending=pending, name=name, params=params, replicas=replicas):
                    cpu0 = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
                    m = measure(nats.urls[0], nats.urls[1 % len(nats.urls)], f"packing{replicas}.n{n}", size,
                                o.duration, pending=pending, batch=pending, pack=n)
                    by = {k: round(sum(p.cpu_times()[:2]) - cpu0[k], 3) for k, p in procs.items()}
                    res = new_result(name, "cluster-packing", transport, params)
                    res["duration_s"] = m["seconds"]
                    res["counts"] = {"sent": m["acked"], "delivered": m["consumed"], "jetstream_messages": m["acked"] // n}
                    res["rates"] = {"sends_per_s": m["stored_per_s"], "deliveries_per_s": m["consumed_per_s"]}
                    res["broker"]["label"] = "NATS servers"
                    res["broker"]["cpu_s"] = round(sum(by.values()), 3)
                    res["broker"]["cpu_by_process"] = by
                    per = res["broker"]["cpu_s"] / max(m["consumed"], 1) * 1e6
                    res["counts"]["nats_us_per_message"] = round(per, 1)
                    res["counts"]["nats_us_per_jetstream_message"] = round(per * n, 1)
                    res["counts"]["client_us_per_message"] = {k: round(v / max(m["consumed"], 1) * 1e6, 1)
                                                              for k, v in m["client_cpu_s"].items()}
                    res["headline"] = {"metric": "NATS servers' CPU per message", "value": round(per, 1), "unit": "us"}
                    rows.append(res)
                    return res

                try:
                    res = runner.guarded(name, "cluster-packing", transport, params, body)
                except Exception as exc:  # nats-py errors: reported, not fatal to the run
                    res = runner.skipped(name, transport, repr(exc))
                    res["status"] = "error"
                yield res
    summary = new_result(f"cluster-packing-summary-{transport}", "cluster-packing-summary", transport,
                         {"message_bytes": size, "flow_control": f"{PACKING_IN_FLIGHT} messages in flight"})
    summary["counts"] = {"table": packing_table(rows)}
    base = {r["parameters"]["replicas"]: r["counts"]["nats_us_per_message"] for r in rows
            if r["parameters"]["pack"] == 1}
    best = min(rows, key=lambda r: r["counts"]["nats_us_per_message"]) if rows else None
    value = (round(base[best["parameters"]["replicas"]] / best["counts"]["nats_us_per_message"], 2)
             if best and base.get(best["parameters"]["replicas"]) and best["counts"]["nats_us_per_message"] else None)
    summary["headline"] = {"metric": "NATS CPU per message, one per JetStream message / the best packing",
                           "value": value, "unit": "x"}
    summary["duration_s"] = round(sum(r["duration_s"] or 0 for r in rows), 3)
    if not rows:
        summary["status"] = "error"
    yield summary


async def _packing_stream(url: str, name: str, root: str, replicas: int) -> None:
    """A work-queue stream as the broker declares its queue shards (cluster/jetstream.py)."""
    import nats

    from ..cluster.jetstream import declare_stream
    nc = await nats.connect(url)
    try:
        await declare_stream(nc.jetstream(timeout=10), name, [f"{root}.>"], replicas, work_queue=True,
                             per_subject=100_000)
    finally:
        await nc.close()


def packing_table(rows: list[dict]) -> str:
    lines = ["| replicas | messages per JetStream message | msg/s | NATS µs per message | NATS µs per JetStream "
             "message | clients µs per message (publisher + consumer) |", "|---|---|---|---|---|---|"]
    for r in rows:
        c, p = r["counts"], r["parameters"]
        client = c.get("client_us_per_message", {})
        lines.append(f"| R{p['replicas']} | {p['pack']} | {r['rates']['deliveries_per_s']:,} | "
                     f"{c['nats_us_per_message']} | {c['nats_us_per_jetstream_message']} | "
                     f"{client.get('publisher', '')} + {client.get('consumer', '')} |")
    return "\n".join(lines)


RUNS = {"fanout": lambda runner, copts, t: [cluster_fanout(runner, copts, t)],
        "queue": cluster_queue,
        "local": cluster_local,
        "packing": cluster_packing,
        "scale": cluster_scale}


def parse_cluster_args(argv):
    p = argparse.ArgumentParser(prog="stompbroker-bench cluster", add_help=False)
    p.add_argument("--scenario", default="fanout,queue,local",
                   help=f"comma list of {', '.join(SCENARIOS)}")
    p.add_argument("--nodes", type=int, default=3, help="broker nodes")
    p.add_argument("--nats-servers", type=int, default=3, help="NATS servers (JetStream, clustered)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side of the local scenario (medians)")
    p.add_argument("--replicas", type=int, default=0,
                   help="cluster_replicas of the queue scenario (0: 3 with 3 or more NATS servers, else 1); "
                        "packing: only this one (0: R1 and R3)")
    p.add_argument("--no-baselines", dest="baselines", action="store_false",
                   help="queue: skip the NATS ceiling and the standalone sqlite node it is read against")
    p.add_argument("--nats-pending", type=int, default=256,
                   help="queue: PubAcks the NATS ceiling's nats-py publisher keeps outstanding")
    p.add_argument("--scale", default="",
                   help="scale-out under equal CPU instead of --scenario: node counts, e.g. 1,2,4 (bench/scale.py)")
    p.add_argument("--cpu-quota", type=float, default=0.25,
                   help="--scale: cores for each node and its NATS server (a cgroup each)")
    p.add_argument("--cpu-period-ms", type=float, default=100.0,
                   help="--scale: the quota's period (each node runs --cpu-quota x this, then waits for the next)")
    p.add_argument("--scale-consumers", type=int, default=2,
                   help="--scale: consumers (subscribers) of each node's destination, on the next node")
    p.add_argument("--scale-destinations", type=int, default=1,
                   help="--scale: destinations of each node, each with its own producer and consumers (a few "
                        "destinations hash onto the shards unevenly; more spread them)")
    p.add_argument("--placement-tags", action=argparse.BooleanOptionalAction, default=True,
                   help="--scale: at one copy, tag the NATS servers and place shard i on server i mod N "
                        "(cluster_placement_tags); else JetStream places them by free storage")
    p.add_argument("--scale-kinds", default="queue,topic", help="--scale: traffic kinds, queue and/or topic")
    p.add_argument("--r3", action="store_true", help="--scale: also cluster_replicas=3 queue runs where N >= 3")
    p.add_argument("-h", "--help", action="store_true")
    return p, *p.parse_known_args(argv)


def main(argv=None) -> int:
    from .options import parse_args
    from .runner import Runner

    parser, copts, rest = parse_cluster_args(sys.argv[1:] if argv is None else argv)
    if copts.help:
        print(__doc__)
        parser.print_help()
        print("\nand the bench options (stompbroker-bench --help): --spawn ARGS (node settings, default "
              "processors=2), --duration, --size, --fanout, --queue-consumers, --transports, --out ...")
        return 0
    names = [w.strip() for w in copts.scenario.split(",") if w.strip()] if not copts.scale else ["scale"]
    unknown = [w for w in names if w not in RUNS]
    if unknown:
        raise SystemExit(f"unknown cluster scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})")
    if copts.nodes < 2:
        raise SystemExit("--nodes: at least 2")
    if "--spawn" not in " ".join(rest):
        rest += ["--spawn", "processors=2"]
    o = parse_args(rest)
    o.out = o.out or os.path.join("out", time.strftime("bench-cluster-%Y%m%d-%H%M%S"))
    runner = Runner(o)
    runner.label = (f"stompbroker cluster {o.spawn} ({copts.nodes} nodes, {copts.nats_servers} NATS servers)"
                    if not copts.scale else f"stompbroker cluster {o.spawn}, scale-out {copts.scale} nodes, "
                                            f"{copts.cpu_quota} cores each")
    transports = [t for t in (o.transports or "tcp").split(",") if t]
    print(f"bench: {runner.label}; cluster scenarios {', '.join(names)}; results in {o.out}", flush=True)
    try:
        for name in names:
            for transport in transports:
                for res in RUNS[name](runner, copts, transport):
                    runner.results.append(res)
                    print(summary_line(res), flush=True)
                    runner.save()
                    if res["scenario"] == "cluster-scale-summary":
                        with open(os.path.join(o.out, "scale.md"), "w") as f:
                            f.write(scale_table(res) + "\n")
                        print(scale_table(res), flush=True)
                    if res["scenario"] == "cluster-packing-summary":
                        with open(os.path.join(o.out, "packing.md"), "w") as f:
                            f.write(res["counts"]["table"] + "\n")
                        print(res["counts"]["table"], flush=True)
                time.sleep(o.pause)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        runner.save()
    print(f"wrote {os.path.join(o.out, 'results.json')}")
    return 0 if all(r["status"] != "error" for r in runner.results) else 1


if __name__ == "__main__":
    sys.exit(main())
