"""Latency histograms: quarter-octave buckets of microseconds, cheap to add to and to merge."""

from __future__ import annotations

import math

BUCKETS = 128  # 2**(128/4) us is about 71 minutes: more than any latency worth telling apart


def bucket(microseconds: int) -> int:
    if microseconds < 1:
        return 0
    return min(int(math.log2(microseconds) * 4), BUCKETS - 1)


def upper_ms(index: int) -> float:
    """The upper edge of a bucket, in milliseconds."""
    return 2 ** ((index + 1) / 4) / 1000


def summary(counts) -> dict:
    """count, p50/p90/p99/p99.9 and max in ms (each a bucket's upper edge, so at most 19% high)."""
    total = int(sum(counts))
    result = {"count": total, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0, "max_ms": 0.0}
    if not total:
        return result
    targets = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99, "p999_ms": 0.999}
    seen = 0
    for index, n in enumerate(counts):
        if not n:
            continue
        seen += n
        for name, q in targets.items():
            if not result[name] and seen >= q * total:
                result[name] = round(upper_ms(index), 3)
        result["max_ms"] = round(upper_ms(index), 3)
    return result
