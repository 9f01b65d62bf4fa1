"""Matplotlib charts from the small, collected (pandas) tables.

Figures are built with matplotlib.figure.Figure, not pyplot: no global
state, savefig() renders PNG through the Agg canvas without any display, and
the same objects show inline in Jupyter (display(fig)).  The backend is
deliberately not switched here so importing this module in a notebook does not
disturb its inline backend.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

WIDTH = 10


def _xscale(pdf):
    """Seconds, minutes or hours for the x axis, depending on the span."""
    span = float(pdf["t_s"].max()) if len(pdf) else 0.0
    if span > 3 * 3600:
        return 3600.0, "hours"
    if span > 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _series(ax, pdf, y, label, scale, **kw):
    """Plot y over time, one segment per broker run so restarts leave a gap."""
    first = True
    line = None
    for _, seg in pdf.sort_values("ts").groupby("run_seq", sort=True):
        (line,) = ax.plot(seg["t_s"] / scale, seg[y], label=label if first else None, **kw)
        kw.setdefault("color", line.get_color())
        first = False
    return line


def _restarts(ax, pdf, scale):
    if "run_seq" not in pdf or not len(pdf):
        return
    starts = pdf.groupby("run_seq")["t_s"].min().sort_index().iloc[1:]
    for i, t in enumerate(starts):
        ax.axvline(t / scale, color="red", linestyle="--", linewidth=0.8, label="broker restart" if i == 0 else None)


def _finish(fig, axes, pdf, scale, unit, title):
    for ax in axes:
        _restarts(ax, pdf, scale)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel(f"time since first interval ({unit})")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_throughput(tp) -> Figure:
    fig = Figure(figsize=(WIDTH, 6))
    a1, a2 = fig.subplots(2, 1, sharex=True)
    scale, unit = _xscale(tp)
    for c, label in [
        ("frames_in_per_s", "frames in"),
        ("frames_out_per_s", "frames out"),
        ("messages_published_per_s", "messages published"),
        ("messages_delivered_per_s", "messages delivered"),
    ]:
        _series(a1, tp, c, label, scale)
    a1.set_ylabel("per second")
    for c, label in [("bytes_in_per_s", "bytes in"), ("bytes_out_per_s", "bytes out")]:
        tp = tp.assign(**{c + "_mb": tp[c] / 1e6})
        _series(a2, tp, c + "_mb", label, scale)
    a2.set_ylabel("MB per second")
    return _finish(fig, [a1, a2], tp, scale, unit, "Throughput")


def plot_queue_depths(q, top: int = 8) -> Figure:
    fig = Figure(figsize=(WIDTH, 4))
    ax = fig.subplots()
    scale, unit = _xscale(q)
    if len(q):
        worst = q.groupby("destination")["depth"].max().sort_values(ascending=False).head(top).index
        for d in worst:
            _series(ax, q[q["destination"] == d], "depth", d, scale)
    ax.set_ylabel("messages queued")
    return _finish(fig, [ax], q, scale, unit, f"Queue depth (top {top} destinations by max depth)")


def plot_writer_balance(wb) -> Figure:
    fig = Figure(figsize=(WIDTH, 8))
    a1, a2, a3 = fig.subplots(3, 1, sharex=True)
    scale, unit = _xscale(wb)
    for wid in sorted(wb["writer"].dropna().unique()) if len(wb) else []:
        sub = wb[wb["writer"] == wid]
        _series(a1, sub, "share", f"writer {wid}", scale)
        _series(a3, sub, "batch_fill", f"writer {wid}", scale)
    a1.set_ylabel("share of frames")
    per_interval = wb.drop_duplicates(["run_seq", "ts"]) if len(wb) else wb
    if len(per_interval):
        _series(a2, per_interval, "imbalance", "max / mean", scale, color="black")
        a2.axhline(1.0, color="grey", linewidth=0.8)
    a2.set_ylabel("imbalance")
    a3.set_ylabel("batch fill (0..1)")
    a3.set_ylim(0, 1.05)
    return _finish(fig, [a1, a2, a3], wb, scale, unit, "Writer load balance")


def plot_latency(lat) -> Figure:
    fig = Figure(figsize=(WIDTH, 4))
    ax = fig.subplots()
    scale, unit = _xscale(lat)
    for c in ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"]:
        _series(ax, lat, c, c.replace("_ms", ""), scale)
    vals = lat[["p50_ms", "max_ms"]].dropna() if len(lat) else lat
    # Log scale when the tail is far above the median, else the median is a flat line at 0.
    if len(vals) and vals["p50_ms"].min() > 0 and vals["max_ms"].max() > 20 * vals["p50_ms"].min():
        ax.set_yscale("log")
    ax.set_ylabel("latency (ms)")
    return _finish(fig, [ax], lat, scale, unit, "Delivery latency per interval")


def plot_churn(ch) -> Figure:
    fig = Figure(figsize=(WIDTH, 6))
    a1, a2 = fig.subplots(2, 1, sharex=True)
    scale, unit = _xscale(ch)
    _series(a1, ch, "connections_opened_per_s", "opened", scale)
    _series(a1, ch, "connections_closed_per_s", "closed", scale)
    a1.set_ylabel("connections per second")
    for c in ["clients", "websockets", "subscriptions"]:
        _series(a2, ch, c, c, scale)
    a2.set_ylabel("count")
    return _finish(fig, [a1, a2], ch, scale, unit, "Connection churn")


def plot_memory(mem, leaks=None) -> Figure:
    """RSS per process; one colour per role so a role stays recognisable across
    restarts (new pids), suspected leaks drawn thick and marked in the legend."""
    fig = Figure(figsize=(WIDTH, 5))
    ax = fig.subplots()
    scale, unit = _xscale(mem)
    flagged = set()
    if leaks is not None and len(leaks):
        flagged = {(r.run, r.role, r.pid) for r in leaks.itertuples() if r.leak}
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    roles = sorted(mem["role"].dropna().unique()) if len(mem) else []
    for i, role in enumerate(roles):
        sub = mem[mem["role"] == role]
        leaky = any((run, role, pid) in flagged for run, pid in zip(sub["run"], sub["pid"]))
        first = True
        for (run, pid), seg in sub.groupby(["run", "pid"], sort=True):
            leak = (run, role, pid) in flagged
            label = (role + (" (LEAK?)" if leaky else "")) if first else None
            _series(ax, seg, "rss_mb", label, scale, color=colors[i % len(colors)], linewidth=2.5 if leak else 1.0)
            first = False
    ax.set_ylabel("RSS (MiB)")
    return _finish(fig, [ax], mem, scale, unit, "Resident memory per process")
