"""What the load generator reports: the result schema and targets, summary lines, the progress
line, the chart (matplotlib, the ``bench`` extra) and the side-by-side comparison of result files."""

from __future__ import annotations

import json
import math
import os
import sys
import time

from .stats import fmt_num

# Targets on the 2-core reference machine (docs/performance.md).
TARGETS = {
    "ingest": ("sends_per_s", ">=", 220_000, "SEND/s"),
    "one2one": ("deliveries_per_s", ">=", 100_000, "deliveries/s"),
    "queue": ("deliveries_per_s", ">=", 100_000, "deliveries/s"),
    "fanout": ("deliveries_per_s", ">=", 450_000, "deliveries/s (one connection, TCP)"),
    "fanout_ws": ("deliveries_per_s", ">=", 400_000, "deliveries/s (one connection, WebSocket)"),
    "fanout_conns": ("deliveries_per_s", ">=", 300_000, "deliveries/s (75 connections)"),
    "latency": ("p99_ms", "<=", 1.0, "ms (p99 at the offered load, quiet machine; 0.5 at 5,000 msg/s or less)"),
    "lone": ("cpu_us_per_send", "<=", 40, "µs of broker CPU per lone receipted SEND (one in flight)"),
    "idle_memory": ("bytes_per_connection", "<=", 1024, "bytes of broker PSS per idle connection"),
    "idle_cpu": ("cpu_fraction", "<=", 0.005, "CPU-seconds per second with the connections idle"),
}

RESULT_KEYS = ("name", "scenario", "transport", "status", "parameters", "duration_s", "counts", "rates",
               "mb_per_s", "latency_ms", "broker", "deliveries_per_cpu_s", "generator", "generator_ceiling",
               "headline", "target", "notes")


# -- results -----------------------------------------------------------------------------------
def new_result(name: str, scenario: str, transport: str | None, parameters: dict) -> dict:
    """An empty result object with every key of the schema."""
    return {
        "name": name, "scenario": scenario, "transport": transport, "status": "ok", "parameters": parameters,
        "duration_s": None, "counts": {}, "rates": {}, "mb_per_s": {}, "latency_ms": None,
        "broker": {"label": None, "cpu_s": None, "cpu_by_process": {}, "pss_bytes": None},
        "deliveries_per_cpu_s": None, "generator": {}, "generator_ceiling": None,
        "headline": None, "target": None, "notes": [],
    }


def validate_result(obj: dict) -> list[str]:
    """Problems with one result object (empty list: it fits the schema)."""
    problems = [f"missing key {k!r}" for k in RESULT_KEYS if k not in obj]
    if problems:
        return problems
    if obj["status"] not in ("ok", "skipped", "error"):
        problems.append(f"bad status {obj['status']!r}")
    for key in ("parameters", "counts", "rates", "mb_per_s", "broker", "generator"):
        if not isinstance(obj[key], dict):
            problems.append(f"{key} must be an object")
    if not isinstance(obj["notes"], list):
        problems.append("notes must be a list")
    if obj["status"] == "ok":
        h = obj["headline"]
        if not (isinstance(h, dict) and {"metric", "value", "unit"} <= set(h)):
            problems.append("an ok result needs a headline {metric, value, unit}")
        if obj["duration_s"] is None:
            problems.append("an ok result needs duration_s")
    lat = obj["latency_ms"]
    if lat is not None and not {"p50", "p99", "p99.9"} <= set(lat):
        problems.append("latency_ms needs p50, p99 and p99.9")
    t = obj["target"]
    if t is not None and not {"metric", "op", "goal", "value", "met"} <= set(t):
        problems.append("target needs metric, op, goal, value, met")
    try:
        json.dumps(obj)
    except (TypeError, ValueError) as exc:
        problems.append(f"not JSON-serialisable: {exc}")
    return problems


# p99 at up to this offered rate (msg/s) is held to LATENCY_LOW_GOAL ms; above it, to TARGETS' 1 ms
LATENCY_LOW_RATE, LATENCY_LOW_GOAL = 5_000, 0.5


def check_target(key: str, value, rate: float | None = None) -> dict | None:
    """The target of ``key`` and whether ``value`` meets it (``rate``: the latency run's offered msg/s)."""
    if key not in TARGETS or value is None:
        return None
    metric, op, goal, unit = TARGETS[key]
    if key == "latency" and rate is not None and rate <= LATENCY_LOW_RATE:
        goal = LATENCY_LOW_GOAL
    met = value >= goal if op == ">=" else value <= goal
    return {"metric": metric, "op": op, "goal": goal, "unit": unit, "value": value, "met": bool(met)}


def summary_line(res: dict) -> str:
    if res["status"] != "ok":
        return f"{res['name']:<22} {res['status'].upper()}: {'; '.join(res['notes'])[:300]}"
    h = res["headline"]
    value = h["value"]
    text = (f"{value:.3f} ms" if h["unit"] == "ms" else f"{value:.1f} µs CPU/SEND" if h["unit"] == "us"
            else f"{fmt_num(value)} {h['metric']}")
    extra = []
    if res["broker"].get("cpu_s") is not None:
        extra.append(f"broker CPU {res['broker']['cpu_s']:.2f} s")
    if res["deliveries_per_cpu_s"]:
        extra.append(f"{fmt_num(res['deliveries_per_cpu_s'])}/CPU-s")
    if res["latency_ms"]:
        lat = res["latency_ms"]
        extra.append(f"delivery p50 {lat['p50']} p99 {lat['p99']} p99.9 {lat['p99.9']} ms")
    rlat = res.get("receipt_latency_ms")
    if rlat and rlat.get("count"):
        extra.append(f"receipt p50 {rlat['p50']} p99 {rlat['p99']} ms")
    if res["broker"].get("uss_bytes_per_connection") is not None:
        extra.append(f"USS {res['broker']['uss_bytes_per_connection']} B/conn")
    if res["broker"].get("shm_pss_bytes_per_connection") is not None:
        extra.append(f"of it ring pages {res['broker']['shm_pss_bytes_per_connection']} B/conn")
    if res["mb_per_s"].get("payload"):
        extra.append(f"{res['mb_per_s']['payload']} MB/s payload")
    if res.get("machine"):
        extra.append(f"others used {res['machine']['other_processes_cores']} cores")
    if res["target"]:
        extra.append("target met" if res["target"]["met"] else f"target {res['target']['op']} {res['target']['goal']} NOT met")
    lone = res.get("lone")
    if lone and lone.get("cpu_us_by_process"):
        extra.append("µs per SEND: " + " ".join(f"{k} {v}" for k, v in sorted(lone["cpu_us_by_process"].items())))
    flow = res["parameters"].get("flow_control")
    return f"{res['name']:<22} {text:<24} " + ", ".join(extra) + (f" [flow: {flow}]" if flow else "")


# -- progress ----------------------------------------------------------------------------------
class Progress:
    """One status line on stderr while a run goes (redrawn on a terminal, every 2 s otherwise)."""

    def __init__(self, label: str, duration: float, enabled: bool):
        self.label = label
        self.duration = duration
        self.enabled = enabled
        self.last = 0.0
        self.prev = None
        self.tty = sys.stderr.isatty()

    def update(self, elapsed: float, sent: float, delivered: float, phase: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < (0.25 if self.tty else 2.0):
            return
        rate_s = rate_d = 0.0
        if self.prev:
            dt = now - self.prev[0]
            rate_s = (sent - self.prev[1]) / dt
            rate_d = (delivered - self.prev[2]) / dt
        self.prev = (now, sent, delivered)
        self.last = now
        width = 20
        elapsed = max(elapsed, 0.0)
        frac = min(elapsed / self.duration, 1.0) if self.duration else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        line = (f"{self.label:<26} [{bar}] {elapsed:5.1f}/{self.duration:.0f}s  sent {fmt_num(sent):>7} "
                f"({fmt_num(rate_s):>7}/s)  delivered {fmt_num(delivered):>7} ({fmt_num(rate_d):>7}/s) {phase}")
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# -- chart -------------------------------------------------------------------------------------
def make_chart(doc: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in doc["results"] if r["status"] == "ok"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    fig.suptitle(f"{doc.get('label', '')}  (run {doc.get('run_id', '')}, {doc.get('started', '')})", fontsize=11)

    # 1. throughput per run, with the generator's ceiling and the target
    ax = axes[0][0]
    thr = [r for r in results if r["scenario"] in ("ingest", "one2one", "fanout", "queue", "durable")]
    names = [r["name"] for r in thr]
    values = [(r["rates"].get("sends_per_s") if r["scenario"] in ("ingest", "durable")
               else r["rates"].get("deliveries_per_s")) or 0 for r in thr]
    bars = ax.barh(names, values, color="#4C72B0")
    for i, r in enumerate(thr):
        c = r.get("generator_ceiling") or {}
        if c.get("rate"):
            ax.plot([c["rate"]], [i], marker="|", markersize=18, color="#C44E52")
        t = r.get("target")
        if t and t["op"] == ">=":
            ax.plot([t["goal"]], [i], marker="d", color="#55A868")
    for b, v in zip(bars, values):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + fmt_num(v), va="center", fontsize=8)
    if values and max(values) > 0:
        lo = min(v for v in values if v > 0) if any(v > 0 for v in values) else 1
        ax.set_xscale("log")
        ax.set_xlim(left=10 ** math.floor(math.log10(lo)))
    ax.set_title("throughput (SEND/s for ingest/durable, deliveries/s otherwise)\n"
                 "red |: generator ceiling, green \u2666: target", fontsize=9)
    ax.invert_yaxis()

    # 2. time series
    ax = axes[0][1]
    for r in thr:
        bins = r["rates"].get("bins_per_s") or []
        if bins:
            smooth = [sum(bins[i:i + 5]) / len(bins[i:i + 5]) for i in range(0, len(bins), 5)]
            ax.plot([i * 0.5 for i in range(len(smooth))], smooth, label=r["name"])
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("per second (0.5 s bins)")
    ax.set_title("rate over time", fontsize=9)
    if thr:
        ax.legend(fontsize=7)

    # 3. latency
    ax = axes[1][0]
    lat = [r for r in results if r["latency_ms"]]
    for r in lat:
        h = r["latency_ms"].get("histogram")
        if h:
            total = sum(h["counts"]) or 1
            cum, xs, ys = 0, [], []
            for ub, n in zip(h["upper_ms"], h["counts"]):
                cum += n
                if ub is not None:
                    xs.append(ub)
                    ys.append(cum / total)
            ax.plot(xs, ys, label=f"{r['name']} (p50 {r['latency_ms']['p50']}, p99 {r['latency_ms']['p99']}, "
                                  f"p99.9 {r['latency_ms']['p99.9']} ms)")
        c = r.get("generator_ceiling") or {}
        if c.get("latency_ms"):
            ax.axvline(c["latency_ms"]["p99"], color="#C44E52", linestyle=":", label="generator floor p99")
    if lat:
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no latency run", transform=ax.transAxes, ha="center")
    ax.set_xlabel("latency, ms (from the scheduled send time)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("latency CDF at fixed offered load", fontsize=9)
    if lat:
        ax.legend(fontsize=7)

    # 4. broker CPU per process
    ax = axes[1][1]
    rows = [r for r in results if r["broker"].get("cpu_by_process")]
    roles = sorted({k.split("#")[0] for r in rows for k in r["broker"]["cpu_by_process"]})
    left = [0.0] * len(rows)
    for role in roles:
        vals = [sum(v for k, v in r["broker"]["cpu_by_process"].items() if k.split("#")[0] == role)
                / max(r["duration_s"] or 1, 1e-9) for r in rows]
        ax.barh([r["name"] for r in rows], vals, left=left, label=role)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("broker CPU (cores busy on average over the run)")
    ax.set_title("where the broker spent CPU", fontsize=9)
    ax.invert_yaxis()
    idle = next((r for r in results if r["scenario"] == "idle"), None)
    if idle and idle["broker"].get("pss_bytes_per_connection") is not None:
        b = idle["broker"]
        ax.text(0.98, 0.02, f"idle: {idle['counts']['connections_open']} connections, "
                f"{b['pss_bytes_per_connection']} B PSS each\nCPU {b['cpu_s']} s over {idle['duration_s']} s",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
    if rows:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- comparison --------------------------------------------------------------------------------
def load_results(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        return json.load(f)


def compare(paths: list[str]) -> str:
    docs = [load_results(p) for p in paths]
    names = []
    for d in docs:
        for r in d["results"]:
            if r["name"] not in names:
                names.append(r["name"])
    lines = ["| run | " + " | ".join(d.get("label", p) for d, p in zip(docs, paths)) + " |",
             "|---|" + "---:|" * len(docs)]
    for name in names:
        cells = []
        for d in docs:
            r = next((r for r in d["results"] if r["name"] == name), None)
            if r is None:
                cells.append("")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                h = r["headline"]
                v = h["value"]
                cell = f"{v} ms" if h["unit"] == "ms" else f"{fmt_num(v)} {h['metric']}"
                if r["latency_ms"] and h["unit"] == "ms":
                    cell = f"p50 {r['latency_ms']['p50']} / p99 {r['latency_ms']['p99']} / p99.9 {r['latency_ms']['p99.9']} ms"
                if r.get("deliveries_per_cpu_s"):
                    cell += f" ({fmt_num(r['deliveries_per_cpu_s'])}/CPU-s)"
                if any("missing" in n for n in r["notes"]):
                    cell += " (incomplete: deliveries missing)"
                if r.get("machine"):
                    cell += f" [others {r['machine']['other_processes_cores']} cores]"
                cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
