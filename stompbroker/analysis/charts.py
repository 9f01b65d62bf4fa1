"""Matplotlib charts from the small, collected (pandas) tables.

Figures are built with matplotlib.figure.Figure, not pyplot: no global
state, savefig() renders PNG through the Agg canvas without any display, and
the same objects show inline in Jupyter (display(fig)).  The backend is
deliberately not switched here so importing this module in a notebook does not
disturb its inline backend.
"""

from __future__ import annotations

import matplotlib
import matplotlib.dates as mdates
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

WIDTH = 10
# 20 distinct colours: processes (and nodes) each get their own, in a fixed order.
PALETTE = list(matplotlib.colormaps["tab20"].colors[0::2]) + list(matplotlib.colormaps["tab20"].colors[1::2])
RATE = EngFormatter(unit="/s", sep=" ")  # 1.5 k/s, 12 /s
BYTE_RATE = EngFormatter(unit="B/s", sep=" ")  # 40 kB/s, 1.2 MB/s


def _when(pdf):
    """Wall-clock x values (UTC) from epoch-ms ts: independent of the session time zone."""
    return pd.to_datetime(pdf["ts"], unit="ms", utc=True)


def _segments(pdf):
    """One segment per broker run (node and restart), so a restart or another node leaves a gap."""
    key = "run" if "run" in pdf else "run_seq"
    return pdf.sort_values("ts").groupby(key, sort=True) if key in pdf else [(None, pdf.sort_values("ts"))]


def _series(ax, pdf, y, label, **kw):
    """Plot y over wall-clock time; every run of the series in one colour and one legend entry."""
    first = True
    line = None
    for _, seg in _segments(pdf):
        (line,) = ax.plot(_when(seg), seg[y], label=label if first else None, **kw)
        kw.setdefault("color", line.get_color())
        first = False
    return line


def _restarts(ax, pdf):
    if "run_seq" not in pdf or not len(pdf):
        return
    keys = ["node", "run_seq"] if "node" in pdf else ["run_seq"]
    starts = pdf.groupby(keys)["ts"].min()
    starts = starts[starts.index.get_level_values("run_seq") > 0] if "node" in pdf else starts.sort_index().iloc[1:]
    for i, t in enumerate(sorted(starts)):
        ax.axvline(pd.to_datetime(t, unit="ms", utc=True), color="red", linestyle="--", linewidth=0.8,
                   label="broker restart" if i == 0 else None)


def _finish(fig, axes, pdf, title):
    for ax in axes:
        _restarts(ax, pdf)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    locator = mdates.AutoDateLocator()
    axes[-1].xaxis.set_major_locator(locator)
    axes[-1].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz="UTC"))
    axes[-1].set_xlabel("time (UTC)")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_throughput(tp) -> Figure:
    fig = Figure(figsize=(WIDTH, 6))
    a1, a2 = fig.subplots(2, 1, sharex=True)
    for i, (c, label) in enumerate([
        ("frames_in_per_s", "frames in"),
        ("frames_out_per_s", "frames out"),
        ("messages_published_per_s", "messages published"),
        ("messages_delivered_per_s", "messages delivered"),
    ]):
        _series(a1, tp, c, label, color=PALETTE[i])
    a1.set_ylabel("rate")
    a1.yaxis.set_major_formatter(RATE)
    for i, (c, label) in enumerate([("bytes_in_per_s", "bytes in"), ("bytes_out_per_s", "bytes out")]):
        _series(a2, tp, c, label, color=PALETTE[4 + i])
    a2.set_ylabel("bytes")
    a2.yaxis.set_major_formatter(BYTE_RATE)
    return _finish(fig, [a1, a2], tp, "Throughput" + _nodes_note(tp))


def _nodes_note(pdf) -> str:
    n = pdf["node"].nunique() if "node" in pdf and len(pdf) else 1
    return f" ({n} nodes overlaid; see the Fleet chart per node)" if n > 1 else ""


def plot_queue_depths(q, top: int = 8) -> Figure:
    fig = Figure(figsize=(WIDTH, 4))
    ax = fig.subplots()
    if len(q):
        worst = q.groupby("destination")["depth"].max().sort_values(ascending=False).head(top).index
        for i, d in enumerate(worst):
            _series(ax, q[q["destination"] == d], "depth", d, color=PALETTE[i % len(PALETTE)])
    ax.set_ylabel("messages queued")
    ax.yaxis.set_major_formatter(EngFormatter(sep=" "))
    return _finish(fig, [ax], q, f"Queue depth (top {top} destinations by max depth)")


def plot_writer_balance(wb) -> Figure:
    fig = Figure(figsize=(WIDTH, 8))
    a1, a2, a3 = fig.subplots(3, 1, sharex=True)
    for i, wid in enumerate(sorted(wb["writer"].dropna().unique()) if len(wb) else []):
        sub = wb[wb["writer"] == wid]
        _series(a1, sub, "share", f"writer {wid}", color=PALETTE[i % len(PALETTE)])
        _series(a3, sub, "batch_fill", f"writer {wid}", color=PALETTE[i % len(PALETTE)])
    a1.set_ylabel("share of frames")
    per_interval = wb.drop_duplicates(["run", "ts"]) if len(wb) else wb
    if len(per_interval):
        _series(a2, per_interval, "imbalance", "max / mean", color="black")
        a2.axhline(1.0, color="grey", linewidth=0.8)
    a2.set_ylabel("imbalance")
    a3.set_ylabel("batch fill (0..1)")
    a3.set_ylim(0, 1.05)
    return _finish(fig, [a1, a2, a3], wb, "Writer load balance" + _nodes_note(wb))


def plot_latency(lat) -> Figure:
    fig = Figure(figsize=(WIDTH, 4))
    ax = fig.subplots()
    for i, c in enumerate(["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"]):
        _series(ax, lat, c, c.replace("_ms", ""), color=PALETTE[i])
    vals = lat[["p50_ms", "max_ms"]].dropna() if len(lat) else lat
    # Log scale when the tail is far above the median, else the median is a flat line at 0.
    if len(vals) and vals["p50_ms"].min() > 0 and vals["max_ms"].max() > 20 * vals["p50_ms"].min():
        ax.set_yscale("log")
    ax.set_ylabel("latency (ms)")
    return _finish(fig, [ax], lat, "Delivery latency per interval" + _nodes_note(lat))


def plot_churn(ch) -> Figure:
    fig = Figure(figsize=(WIDTH, 6))
    a1, a2 = fig.subplots(2, 1, sharex=True)
    _series(a1, ch, "connections_opened_per_s", "opened", color=PALETTE[0])
    _series(a1, ch, "connections_closed_per_s", "closed", color=PALETTE[1])
    a1.set_ylabel("connections")
    a1.yaxis.set_major_formatter(RATE)
    for i, c in enumerate(["clients", "websockets", "subscriptions"]):
        _series(a2, ch, c, c, color=PALETTE[2 + i])
    a2.set_ylabel("count")
    a2.yaxis.set_major_formatter(EngFormatter(sep=" "))
    return _finish(fig, [a1, a2], ch, "Connection churn" + _nodes_note(ch))


def plot_memory(mem, leaks=None) -> Figure:
    """RSS per process: a distinct colour per process (node and role), kept across restarts
    (new pids) so a role stays recognisable; suspected leaks drawn thick and marked."""
    fig = Figure(figsize=(WIDTH, 5))
    ax = fig.subplots()
    flagged = set()
    if leaks is not None and len(leaks):
        flagged = {(r.run, r.role, r.pid) for r in leaks.itertuples() if r.leak}
    fleet = "node" in mem and len(mem) and mem["node"].nunique() > 1
    keys = ["node", "role"] if fleet else ["role"]
    procs = sorted(mem.groupby(keys).groups) if len(mem) else []
    for i, proc in enumerate(procs):
        proc = proc if isinstance(proc, tuple) else (proc,)
        sub = mem[(mem[keys] == pd.Series(proc, index=keys)).all(axis=1)]
        role = proc[-1]
        leaky = any((run, role, pid) in flagged for run, pid in zip(sub["run"], sub["pid"]))
        name = " ".join(proc) + (" (LEAK?)" if leaky else "")
        # past 20 processes colours repeat, so the line style changes with them
        style = ("-", "--", ":", "-.")[(i // len(PALETTE)) % 4]
        first = True
        for (run, pid), seg in sub.groupby(["run", "pid"], sort=True):
            leak = (run, role, pid) in flagged
            _series(ax, seg, "rss", name if first else None, color=PALETTE[i % len(PALETTE)], linestyle=style,
                    linewidth=2.5 if leak else 1.2)
            first = False
    ax.set_ylabel("resident memory")
    ax.yaxis.set_major_formatter(EngFormatter(unit="B", sep=" "))
    fig = _finish(fig, [ax], mem, "Resident memory per process")
    if len(procs) > 8:  # _finish placed a legend inside; keep it outside the plot
        ax.legend(fontsize="x-small", ncol=1 + len(procs) // 20, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
    return fig


def plot_fleet(tp, lat, mem) -> Figure:
    """Per node: messages delivered per second, p99 latency and total RSS (all its processes)."""
    fig = Figure(figsize=(WIDTH, 9))
    a1, a2, a3 = fig.subplots(3, 1, sharex=True)
    names = sorted(set(tp["node"]) | set(lat["node"]) | set(mem["node"])) if len(tp) else []
    per_ts = mem.groupby(["node", "run", "ts"], as_index=False)["rss"].sum() if len(mem) else mem
    for i, n in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        _series(a1, tp[tp["node"] == n], "messages_delivered_per_s", n, color=color)
        _series(a2, lat[lat["node"] == n], "p99_ms", n, color=color)
        if len(per_ts):
            _series(a3, per_ts[per_ts["node"] == n], "rss", n, color=color)
    a1.set_ylabel("messages delivered")
    a1.yaxis.set_major_formatter(RATE)
    a2.set_ylabel("p99 latency (ms)")
    a3.set_ylabel("RSS, all processes")
    a3.yaxis.set_major_formatter(EngFormatter(unit="B", sep=" "))
    return _finish(fig, [a1, a2, a3], tp, f"Fleet: {len(names)} nodes")
