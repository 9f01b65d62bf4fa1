"""Message features with a real client (stomp.py) against a running broker: priority (also across
kill -9 with store=sqlite) and queue browsing."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import stomp


class Collector(stomp.ConnectionListener):
    def __init__(self):
        self.messages = []
        self.errors = []
        self.receipts = []
        self.cond = threading.Condition()

    def _add(self, kind, frame):
        with self.cond:
            getattr(self, kind).append(frame)
            self.cond.notify_all()

    def on_message(self, frame):
        self._add("messages", frame)

    def on_error(self, frame):
        self._add("errors", frame)

    def on_receipt(self, frame):
        self._add("receipts", frame)

    def wait(self, kind: str, n: int, timeout: float = 20.0) -> list:
        with self.cond:
            assert self.cond.wait_for(lambda: len(getattr(self, kind)) >= n, timeout), \
                f"got {len(getattr(self, kind))} of {n} {kind}"
            return list(getattr(self, kind))


def client(broker, version=1.2):
    cls = {1.0: stomp.Connection10, 1.1: stomp.Connection11, 1.2: stomp.Connection12}[version]
    conn = cls([broker.address], heartbeats=(0, 0))
    listener = Collector()
    conn.set_listener("c", listener)
    conn.connect(wait=True)
    return conn, listener


def send_all(conn, listener, destination, items) -> None:
    """(body, priority or None) pairs, each with a receipt; returns when all are receipted."""
    for i, (body, level) in enumerate(items):
        headers = {} if level is None else {"priority": level}
        conn.send(destination, body, receipt=f"r{i}", **headers)
    listener.wait("receipts", len(items))


# -- priority --------------------------------------------------------------------------------------

def test_priority_orders_a_queue_and_is_clamped(broker):
    pub, pl = client(broker)
    send_all(pub, pl, "/queue/prio", [("a1", "1"), ("plain", None), ("b9", "9"), ("c9", "9"), ("d0", "0"),
                                      ("e12", "12")])
    sub, sl = client(broker)
    sub.subscribe("/queue/prio", id="1")
    got = sl.wait("messages", 6)
    assert [m.body for m in got] == ["b9", "c9", "e12", "plain", "a1", "d0"]
    assert got[2].headers["priority"] == "9"
    pub.disconnect()
    sub.disconnect()


def test_a_bad_priority_is_an_error_naming_the_receipt(broker):
    conn, listener = client(broker)
    conn.send("/queue/prio-bad", "x", priority="urgent", receipt="bad-1")
    (error,) = listener.wait("errors", 1)
    assert error.headers["message"] == "invalid priority" and error.headers["receipt-id"] == "bad-1"


def test_priority_order_survives_kill_9_with_the_store(start_broker, tmp_path):
    store = [f"store=sqlite", f"store_path={tmp_path / 'store.sqlite'}"]
    b = start_broker(*store)
    pub, pl = client(b)
    items = [(f"{level}-{i}", level) for i in range(20) for level in ("2", "7", None, "9")]
    send_all(pub, pl, "/queue/prio-kept", items)
    os.killpg(b.proc.pid, signal.SIGKILL)
    b.proc.wait(10)
    b2 = start_broker(*store)
    sub, sl = client(b2)
    sub.subscribe("/queue/prio-kept", id="1", ack="client-individual")
    got = [m.body for m in sl.wait("messages", len(items))]
    by_level = lambda level: [f"{level}-{i}" for i in range(20)]  # noqa: E731
    assert got == by_level("9") + by_level("7") + by_level(None) + by_level("2")
