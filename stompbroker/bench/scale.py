"""Scale-out under equal CPU: ``stompbroker-bench cluster --scale 1,2,4``.

Each node (its broker processes and its own NATS server) runs in a cgroup with the same CPU quota
(``--cpu-quota`` cores, ``cgroups.py``), so N nodes have N times the CPU of one, as N machines
would. For each N: N NATS servers and N nodes (``cluster_replicas=1``, and 3 where N >= 3 with
``--r3``); node i has ``--scale-destinations`` destinations (default 1), each with its own producer
on node i and its consumers on node i+1 (mod N): every message crosses nodes (with one node it
cannot). At R1 the NATS servers are tagged and the nodes place shard i on server i mod N
(``cluster_placement_tags``, ``--no-placement-tags`` to leave it to JetStream), with a shard count
made a multiple of N. Two kinds of traffic, one run each per round (``--repeat`` rounds; each
setup's row has the median):

- ``queue``: persistent SENDs with receipts (the bench's flow control) to ``/queue/scale-i``,
  ``--scale-consumers`` consumers each: aggregate receipted and delivered msg/s.
- ``topic``: SENDs with receipts to ``/topic/scale-i``, ``--scale-consumers`` subscribers each:
  aggregate deliveries/s across nodes.

Against one standalone node (``store=sqlite``, no NATS) in one cgroup with the same quota and the
same producer and consumers. The summary has the table (docs/performance.md) and ``scale.png``; its
last column, the busiest producer's messages over the least busy one's, shows whether the nodes'
producers were served alike (one node's fan-out can starve another node's producer: docs/cluster.md,
Busy nodes).
"""

from __future__ import annotations

import os
import statistics
import time

from .cgroups import CgroupError, CpuGroup
from .clusternodes import Cluster, Keepers, Nodes, setting, target_of
from .procs import SpawnedBroker
from .report import new_result
from .wire import BenchError

SCALE_VS_STANDALONE_TARGET = 3.0
SCALE_VS_ONE_NODE_TARGET = 3.5
KINDS = ("queue", "topic")


def groups_for(n: int, cores: float, tag: str, period_us: int) -> list[CpuGroup]:
    groups = []
    try:
        for i in range(n):
            groups.append(CpuGroup(f"stompbroker-bench-{tag}-{os.getpid()}-n{i}", cores, period_us))
    except BaseException:
        for g in groups:
            g.close()
        raise
    return groups


def destinations(runner, kind: str, i: int, d: int) -> list[str]:
    """Node i's ``d`` destinations."""
    base = f"/{kind}/bench-{runner.run_id}-scale-{i}"
    return [base] if d == 1 else [f"{base}-{j}" for j in range(d)]


def load(runner, kind: str, nodes: list, k: int, d: int, transport: str) -> tuple[list, list, int]:
    """Producer specs, consumer specs and deliveries per SEND: node i has ``d`` destinations, each
    with its own producer on node i and ``k`` consumers on node i+1 (mod the node count)."""
    o = runner.opts
    n = len(nodes)
    producers, consumers = [], []
    for i in range(n):
        there = target_of(nodes[(i + 1) % n], o)
        for dest in destinations(runner, kind, i, d):
            consumers += runner.consumer_specs(there, transport, [[(dest, "0", [])] for _ in range(k)], 1)
            headers = [("persistent", "true")] if kind == "queue" else []
            producers.append(runner.producer_spec(target_of(nodes[i], o), transport, dest,
                                                  fan=1 if kind == "queue" else k,
                                                  max_inflight=runner.inflight_cap(k), headers=headers))
    return producers, consumers, 1 if kind == "queue" else k


def per_producer(per_connection: list, k: int, fan: int) -> list:
    """Each producer's delivered messages: its destination's ``k`` consumers come in a row (``load``),
    each with ``fan`` deliveries per message between them (topic: each gets every message)."""
    return [sum(per_connection[i:i + k]) // fan for i in range(0, len(per_connection) - k + 1, k)] if k else []


def spread(counts: list):
    """The busiest producer's messages over the least busy one's: 1.0 when the nodes' producers
    were served alike (None with one producer, or one that got nothing through)."""
    return round(max(counts) / min(counts), 1) if len(counts) > 1 and min(counts) > 0 else None


def node_args(runner, scopts, n: int, replicas: int) -> tuple[list[str], bool]:
    """The nodes' settings, and whether their NATS servers are tagged: at one copy, with
    ``--placement-tags``, shard i goes to server i mod N, and the shard count is made a multiple of N
    (the next one up) so that every server holds as many."""
    args = list(runner.spawn_args) + [f"cluster_replicas={replicas}"]
    if replicas != 1 or not scopts.placement_tags:
        return args, False
    streams = setting(args, "cluster_streams")
    return args + [f"cluster_streams={-(-streams // n) * n}"], True


def throttling(groups: list[CpuGroup], before: list[dict]) -> list[dict]:
    out = []
    for g, b in zip(groups, before):
        now = g.throttled()
        out.append({k: round(now[k] - b.get(k, 0), 3) for k in now})
    return out


def one_run(runner, scopts, kind: str, n: int, replicas: int, transport: str) -> dict:
    """N cluster nodes (replicas R) under the quota, or n == 0: the standalone sqlite node."""
    o = runner.opts
    k, d = scopts.scale_consumers, scopts.scale_destinations
    standalone = n == 0
    args, tagged = node_args(runner, scopts, n, replicas)
    label = "standalone" if standalone else f"{n}n-R{replicas}"
    name = f"cluster-scale-{kind}-{label}-{transport}"
    params = {"kind": kind, "nodes": max(n, 1), "standalone": standalone, "replicas": None if standalone else replicas,
              "cpu_quota_cores": scopts.cpu_quota, "cpu_period_ms": scopts.cpu_period_ms,
              "destinations_per_node": d, "consumers_per_destination": k,
              "placement_tags": tagged, "cluster_streams": None if standalone else setting(args, "cluster_streams"),
              "size": o.size,
              "duration": o.duration, "flow_control": runner.flow_label, "persistent": kind == "queue",
              "layout": ("one standalone node (store=sqlite): producer and consumers on it" if standalone else
                         f"{n} nodes, each with its own NATS server, in a cgroup of {scopts.cpu_quota} cores "
                         f"(per period of {scopts.cpu_period_ms:g} ms); {d} destination(s) per node, each: a producer "
                         f"on node i -> {k} consumers on node i+1"
                         + (", shards placed one per server by tags" if tagged else ""))}

    def body():
        groups = groups_for(max(n, 1), scopts.cpu_quota, f"{kind}{label}", int(scopts.cpu_period_ms * 1000))
        cluster = broker = keepers = None
        try:
            if standalone:
                broker = SpawnedBroker(list(runner.spawn_args) + ["store=sqlite"])
                groups[0].add_tree(broker.proc.pid)
                nodes, measured = [broker], broker
            else:
                cluster = Cluster(n, n, args, own_server=True, tagged=tagged)
                for i, g in enumerate(groups):
                    g.add_tree(cluster.nodes[i].proc.pid)
                    g.add(cluster.nats.servers[i].proc.pid)
                nodes, measured = cluster.nodes, Nodes(cluster.nodes, cluster.nats)
            time.sleep(0.5)
            producers, consumers, fan = load(runner, kind, nodes, k, d, transport)
            if kind == "topic" and n > 1:  # each producer's node must know its subscribers' interest first
                keepers = [Keepers(cluster, o, destinations(runner, kind, i, d), [(i + 1) % n], source=i)
                           for i in range(n)]
            before = [g.throttled() for g in groups]
            flow = runner.flow(name, producers, consumers, o.duration, measured, fan=fan)
            pss, pss_by = measured.pss()
            res = runner.delivery_result(name, "cluster-scale", transport, params, flow, measured, fan)
            res["counts"]["per_producer"] = per_producer(res["counts"].get("per_connection") or [], k, fan)
            res["broker"]["pss_bytes"], res["broker"]["pss_by_process"] = pss, pss_by
            res["cgroups"] = {"kind": groups[0].kind, "cores_each": scopts.cpu_quota,
                              "throttling": throttling(groups, before)}
            return res
        finally:
            for kp in keepers or []:
                kp.close()
            if broker is not None:
                broker.stop()
            if cluster is not None:
                cluster.close()
            for g in groups:
                g.close()

    try:
        return runner.guarded(name, "cluster-scale", transport, params, body)
    except CgroupError as exc:
        return runner.skipped(name, transport, str(exc))


def cluster_scale(runner, copts, transport: str):
    """Every run (standalone, then each N, R1 and R3 where asked), then the summary."""
    sizes = sorted({int(x) for x in str(copts.scale).split(",") if x.strip()})
    if not sizes or min(sizes) < 1:
        raise BenchError("--scale: node counts of at least 1, e.g. 1,2,4")
    runs = []
    for kind in copts.scale_kinds.split(","):
        plan = [(0, 0)] + [(n, 1) for n in sizes]
        if copts.r3 and kind == "queue":
            plan += [(n, 3) for n in sizes if n >= 3]
        for _ in range(max(runner.opts.repeat, 1)):   # (rounds of the whole plan: the machine's drift hits all alike)
            for n, replicas in plan:
                res = one_run(runner, copts, kind, n, replicas, transport)
                runs.append(res)
                yield res
                time.sleep(runner.opts.pause)
    summary = scale_summary(runs, transport, copts.cpu_quota)
    yield summary
    try:
        scale_chart(summary, os.path.join(runner.opts.out, "scale.png"))
        summary["notes"].append(f"chart: {os.path.join(runner.opts.out, 'scale.png')}")
    except Exception as exc:  # matplotlib missing (the bench extra): the table stays
        summary["notes"].append(f"no chart: {exc!r}")


def rate_of(res: dict) -> float | None:
    if res["status"] != "ok":
        return None
    return res["rates"].get("deliveries_per_s")


def _median(values: list):
    values = sorted(v for v in values if v is not None)
    return statistics.median(values) if values else None


def scale_summary(runs: list[dict], transport: str, cores: float) -> dict:
    """Rows of (kind, nodes, replicas, msg/s, per node, vs standalone, vs one node), and the targets
    at the largest node count. With several runs of a setup (``--repeat``), its row has the medians
    and the range of the rates."""
    res = new_result(f"cluster-scale-summary-{transport}", "cluster-scale-summary", transport,
                     {"cpu_quota_cores": cores,
                      "flow_control": next((r["parameters"].get("flow_control") for r in runs), None)})
    rows, targets = [], []
    for kind in KINDS:
        mine = [r for r in runs if r["parameters"].get("kind") == kind]
        if not mine:
            continue
        setups: dict[tuple, list[dict]] = {}
        for r in mine:
            p = r["parameters"]
            setups.setdefault((p["standalone"], p["nodes"], p["replicas"]), []).append(r)
        base = _median([rate_of(r) for r in setups.get((True, 1, None), [])])
        one = _median([rate_of(r) for r in setups.get((False, 1, 1), [])])
        for (standalone, n, replicas), group in setups.items():
            rates = [rate_of(r) for r in group]
            rate = _median(rates)
            rate = round(rate) if rate is not None else None
            per_message, held, spreads = [], [], []
            for r in group:
                if rate_of(r):
                    spreads.append(spread(r["counts"].get("per_producer") or []))
                cpu = r["broker"].get("cpu_s")
                if cpu and r["counts"].get("delivered"):
                    per_message.append(cpu / r["counts"]["delivered"] * 1e6)
                throttled = [t.get("throttled_s", 0.0) for t in (r.get("cgroups") or {}).get("throttling", [])]
                if throttled and r.get("duration_s"):
                    held.append(100 * max(throttled) / r["duration_s"])
            known = sorted(x for x in rates if x is not None)
            rows.append({"kind": kind, "setup": "standalone sqlite" if standalone else f"cluster R{replicas}",
                         "nodes": n, "replicas": replicas, "rate": rate, "runs": len(group),
                         "range": [round(known[0]), round(known[-1])] if len(known) > 1 else None,
                         "per_node": round(rate / n) if rate else None,
                         "vs_standalone": round(rate / base, 2) if rate and base else None,
                         "vs_one_node": (round(rate / one, 2) if rate and one and not standalone and replicas == 1
                                         else None),
                         "cpu_us_per_message": round(_median(per_message), 1) if per_message else None,
                         "held_pct": round(_median(held)) if held else None,
                         "producers_spread": round(_median(spreads), 1) if any(spreads) else None,
                         "status": "ok" if known else group[-1]["status"]})
        cluster_rows = [x for x in rows if x["kind"] == kind and x["replicas"] == 1]
        if cluster_rows:
            top = max(cluster_rows, key=lambda x: x["nodes"])
            targets.append(_target(f"{kind}: {top['nodes']} nodes / standalone sqlite node", top["vs_standalone"],
                                   SCALE_VS_STANDALONE_TARGET))
            targets.append(_target(f"{kind}: {top['nodes']} nodes / one cluster node", top["vs_one_node"],
                                   SCALE_VS_ONE_NODE_TARGET))
    res["counts"] = {"rows": rows}
    loose = [f"{x['kind']} {x['setup']} x{x['nodes']}" for x in rows if x["held_pct"] is not None and x["held_pct"] < 20]
    if loose:
        res["notes"].append("not held back by its quota (no node throttled 20 % of the time): the machine gave "
                            "less than the quotas, so these rates are not the quota's: " + ", ".join(loose))
    res["targets"] = targets
    res["target"] = targets[0] if targets else None
    first = targets[0]["value"] if targets else None
    res["headline"] = {"metric": targets[0]["metric"] if targets else "scale-out", "value": first, "unit": "x"}
    res["duration_s"] = round(sum(r["duration_s"] or 0 for r in runs), 3)
    if not rows or all(x["rate"] is None for x in rows):
        res["status"] = "error"
        res["notes"].append("no successful run")
    return res


def _target(metric: str, value, goal: float) -> dict:
    return {"metric": metric, "op": ">=", "goal": goal, "unit": "x", "value": value,
            "met": None if value is None else value >= goal}


def table(summary: dict) -> str:
    """The summary's rows as a markdown table (docs/performance.md)."""
    lines = ["| traffic | setup | nodes | msg/s (all nodes) | per node | vs standalone | vs 1 cluster node | "
             "CPU µs per message | busiest node throttled | producers, busiest / least |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for x in summary["counts"]["rows"]:
        f = lambda v, fmt="{:,}": "" if v is None else fmt.format(v)  # noqa: E731
        rate = f(x["rate"]) + (" ({:,}-{:,})".format(*x["range"]) if x.get("range") else "")
        lines.append(f"| {x['kind']} | {x['setup']} | {x['nodes']} | {rate} | {f(x['per_node'])} | "
                     f"{f(x['vs_standalone'], '{}x')} | {f(x['vs_one_node'], '{}x')} | {f(x['cpu_us_per_message'])} | "
                     f"{f(x.get('held_pct'), '{} %')} | {f(x.get('producers_spread'), '{}x')} |")
    return "\n".join(lines)


def scale_chart(summary: dict, path: str) -> None:
    """Aggregate msg/s against nodes, one panel per kind of traffic: R1 (line), R3 (points), the
    standalone node (dashed) and N times one node (dotted)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["counts"]["rows"]
    kinds = [k for k in KINDS if any(x["kind"] == k for x in rows)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 5), squeeze=False)
    fig.suptitle(f"scale-out under equal CPU: each node and its NATS server in a cgroup of "
                 f"{summary['parameters']['cpu_quota_cores']} cores  [flow: {summary['parameters']['flow_control']}]",
                 fontsize=10)
    for ax, kind in zip(axes[0], kinds):
        mine = [x for x in rows if x["kind"] == kind and x["rate"]]
        r1 = sorted((x["nodes"], x["rate"]) for x in mine if x["replicas"] == 1)
        r3 = sorted((x["nodes"], x["rate"]) for x in mine if x["replicas"] == 3)
        base = next((x["rate"] for x in mine if x["setup"].startswith("standalone")), None)
        if r1:
            ax.plot([n for n, _ in r1], [v for _, v in r1], marker="o", color="#4C72B0", label="cluster, R1")
            for n, v in r1:
                ax.annotate(f"{v:,.0f}", (n, v), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
            one = dict(r1).get(1)
            if one:
                xs = [n for n, _ in r1]
                ax.plot(xs, [one * n for n in xs], linestyle=":", color="#8C8C8C", label="N x one cluster node")
        if r3:
            ax.plot([n for n, _ in r3], [v for _, v in r3], marker="s", linestyle="none", color="#C44E52",
                    label="cluster, R3")
        if base:
            ax.axhline(base, linestyle="--", color="#55A868", label=f"one standalone sqlite node ({base:,.0f})")
        ax.set_xticks(sorted({x["nodes"] for x in mine}))
        ax.set_xlabel("nodes (each with its own NATS server and CPU quota)")
        ax.set_ylabel("receipted persistent msg/s delivered" if kind == "queue" else "deliveries/s across nodes")
        ax.set_title(f"{kind}", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
