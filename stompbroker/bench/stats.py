"""Numbers of the load generator: time-series bins, steady rates, percentiles, histograms."""

from __future__ import annotations

import bisect
import statistics

BIN = 0.1              # seconds per time-series bin (workers count into bins of this width)


def merge_bins(bin_lists) -> list[int]:
    out: list[int] = []
    for bins in bin_lists:
        for i, n in enumerate(bins):
            while len(out) <= i:
                out.append(0)
            out[i] += n
    return out


def steady_rate(bins: list[int], bin_s: float = BIN, skip_s: float = 1.0) -> float | None:
    """Median of the 1-second rates, leaving out the first and last `skip_s` (ramp-up, drain)."""
    per = max(int(round(1.0 / bin_s)), 1)
    skip = int(round(skip_s / bin_s))
    inner = bins[skip:len(bins) - skip] if len(bins) > 2 * skip else []
    windows = [sum(inner[i:i + per]) / (per * bin_s) for i in range(0, len(inner) - per + 1, per)]
    return statistics.median(windows) if windows else None


def fmt_num(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}" if x == int(x) else f"{x:.2f}"


def latency_histogram(lat_ms: list[float]) -> dict:
    """Counts per log-spaced bucket (upper bounds in ms), for charts and comparisons."""
    bounds = [0.05 * (2 ** (i / 2)) for i in range(30)]   # 0.05 ms .. ~1.6 s
    counts = [0] * (len(bounds) + 1)
    for x in lat_ms:
        counts[bisect.bisect_left(bounds, x)] += 1
    return {"upper_ms": [round(b, 4) for b in bounds] + [None], "counts": counts}


def percentiles(samples, points=(50, 90, 99, 99.9)) -> dict:
    """Nearest-rank percentiles of a list of numbers: {'p50': .., 'p99.9': .., 'max': .., 'count': ..}."""
    data = sorted(samples)
    out = {"count": len(data)}
    if not data:
        for p in points:
            out[f"p{p:g}"] = None
        out["max"] = None
        return out
    for p in points:
        rank = max(int(-(-p * len(data) // 100)), 1)  # ceil(p/100 * n), at least 1
        out[f"p{p:g}"] = data[min(rank, len(data)) - 1]
    out["max"] = data[-1]
    return out
