"""How a producer limits what it has in flight: the receipt window.

``bursts`` (the default, how real producers wait for confirmation): frames go out in bursts of at
most ``burst_bytes`` on the wire, the last frame of each burst asks for a receipt, and at most
``bursts`` bursts are unreceipted at once. ``window`` (a ceiling, not what clients see): up to
``window`` SEND frames between receipts, one receipt per ~64 KB batch. ``paced``: a fixed offered
rate (latency runs), each SEND with its own receipt.
"""

from __future__ import annotations


def flow_spec(mode: str, bursts: int = 4, burst_bytes: int = 16384, window: int = 20000,
              batch_bytes: int = 65536, rate: float = 0.0) -> dict:
    if mode == "bursts":
        if bursts < 1 or burst_bytes < 1:
            raise ValueError("bursts and burst_bytes must be at least 1")
        return {"mode": "bursts", "bursts": bursts, "burst_bytes": burst_bytes}
    if mode == "window":
        return {"mode": "window", "window": window, "batch_bytes": batch_bytes}
    if mode == "paced":
        return {"mode": "paced", "rate": rate}
    raise ValueError(f"unknown flow control {mode!r}")


def describe(flow: dict) -> str:
    """The flow control in words, printed next to every figure measured with it."""
    if flow["mode"] == "bursts":
        kb = flow["burst_bytes"] / 1024
        size = f"{kb:g} KB" if flow["burst_bytes"] % 1024 == 0 else f"{flow['burst_bytes']} B"
        return f"{flow['bursts']} burst{'s' if flow['bursts'] != 1 else ''} of <= {size} unreceipted"
    if flow["mode"] == "window":
        return f"ceiling: window of {flow['window']:,} SENDs, receipt per {flow['batch_bytes'] // 1024} KB batch"
    return f"open loop at {flow['rate']:g} msg/s, receipt on every SEND"


def burst_frames(plain_len: int, receipt_len: int, burst_bytes: int) -> int:
    """Frames in one burst: as many as fit in burst_bytes, the last one the (longer) frame asking
    for a receipt; at least one, whatever the size."""
    if receipt_len >= burst_bytes:
        return 1
    return 1 + (burst_bytes - receipt_len) // plain_len


class BurstWindow:
    """Bursts sent and not yet receipted; ``room()`` says whether another may go."""

    __slots__ = ("limit", "asked", "confirmed")

    def __init__(self, limit: int):
        self.limit = limit
        self.asked = 0
        self.confirmed = 0

    def room(self) -> bool:
        return self.asked - self.confirmed < self.limit

    def sent(self) -> None:
        self.asked += 1

    def receipted(self, n: int) -> None:
        # Receipts for anything else on the connection (set-up) never open the window further.
        self.confirmed = min(self.confirmed + n, self.asked)

    @property
    def in_flight(self) -> int:
        return self.asked - self.confirmed
