"""The broker as a Spark Structured Streaming source and sink, exactly once, on embedded Spark
(local[2]): N messages produced with receipts, the queries' driver process (tests/stream_chain.py)
killed with SIGKILL in the middle of the stream and the queries restarted from its checkpoints
in this process's session (shared with the live statistics), the broker
killed with SIGKILL in the middle of the stream and restarted on its store, and at the end every
message is in the sink once: none lost, none twice. (--master and --remote: tests/integration/test_analysis_cluster.py.)"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import stream_chain  # (tests/ is on sys.path)
from conftest import ROOT
from stompbroker.analysis import stream, streaming
from stompbroker.tools.client import StompClient

N = 400
BATCH = 40  # maxMessagesPerTrigger: ten batches, so the kills fall in the middle


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    existing = SparkSession.getActiveSession()  # another module's, still in use by its fixtures: left running
    session = existing or stream_chain.session("test-streaming")
    streaming.register(session)
    yield session
    if existing is None:
        session.stop()


def produce(port: int, destination: str, bodies, headers=()) -> int:
    """SEND each with a receipt; return the number receipted, once every receipt has come."""
    client = StompClient.connect(port=port)
    waiting = set()
    for body in bodies:
        receipt = client.next_receipt_id()
        waiting.add(receipt)
        client.send_frame("SEND", [("destination", destination), *headers, ("receipt", receipt)], body.encode(),
                          flush=len(waiting) % 100 == 0)
    client.flush()
    sent = len(waiting)
    streaming.receipts(client, waiting, 0)
    client.disconnect()
    return sent


def drain(port: int, destination: str) -> collections.Counter:
    client = StompClient.connect(port=port)
    client.subscribe(destination, "drain")
    got = collections.Counter()
    while (frame := client.read_frame(2.0)) is not None:
        got[frame.body.decode()] += 1
    client.disconnect()
    return got


class Driver:
    """tests/stream_chain.py in its own process group (its JVM and Python workers with it), its
    JSON lines collected by a thread."""

    def __init__(self, port: int, checkpoint):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "stream_chain.py"), f"stomp://127.0.0.1:{port}",
             str(checkpoint), str(BATCH)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        self.lines = []
        self.killed = 0  # processes killed
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def rows(self, query: str) -> int:
        return sum(line.get("rows", 0) for line in self.lines if line.get("query") == query)

    def wait_rows(self, query: str, timeout: float = 200.0) -> None:
        """Until a batch of ``query`` with input has finished."""
        deadline = time.monotonic() + timeout
        while not self.rows(query):
            assert self.proc.poll() is None, f"the driver ended early: {self.lines}"
            assert time.monotonic() < deadline, f"no batch of {query} within {timeout} s: {self.lines}"
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL to the driver, its JVM and the JVM's Python workers (pyspark's daemon puts those
        in a process group of their own) at once, mid-batch."""
        try:
            family = [self.proc.pid, *(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            family = []
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # (anything the group started meanwhile)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.killed = len(family)


def wait_batches(query, more: int, timeout: float = 150.0) -> None:
    """Until ``more`` batches with input have finished since the call."""
    def done():
        return sum(1 for p in query.recentProgress if p["numInputRows"])
    target = done() + more
    deadline = time.monotonic() + timeout
    while done() < target:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{more} batches did not finish within {timeout} s"
        time.sleep(0.05)


def wait_idle(query, idle: float = 2.0, timeout: float = 120.0) -> None:
    """Until the query, having read something, has had nothing new for ``idle`` s."""
    deadline = time.monotonic() + timeout
    since = None
    while since is None or time.monotonic() - since < idle or query.status["isDataAvailable"]:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the query did not catch up"
        if any(p["numInputRows"] for p in query.recentProgress[-1:]):
            since = time.monotonic()
        elif since is None and any(p["numInputRows"] for p in query.recentProgress):
            since = time.monotonic()
        time.sleep(0.1)


def stopped(query) -> None:
    """Until a query without its broker has failed (its next read or write cannot connect)."""
    deadline = time.monotonic() + 90
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not query.isActive, "the query kept running without its broker"


@pytest.mark.timeout(400)
def test_queue_to_topic_to_queue_exactly_once_through_kill_9(start_broker, tmp_path, request):
    """The chain of tests/stream_chain.py: /queue/jobs -> (queue source, sink de-duplicating by
    message id) -> /topic/orders (persistent) -> (topic source by sequence, sink with per-row
    dedup-ids) -> /queue/copied. N produced with receipts; the chain's own driver process killed
    with SIGKILL in the middle of the stream; the queries started again from its checkpoints in
    this process's session; the broker killed with SIGKILL in the middle of the stream and
    restarted on its store and port; the queries started again (with a larger
    maxMessagesPerTrigger) and left to finish."""
    settings = ("processors=3", "store=sqlite", f"store_path={tmp_path}/store.sqlite")
    broker = start_broker(*settings)
    url, checkpoint = f"stomp://127.0.0.1:{broker.port}", tmp_path / "checkpoints"
    receipted = produce(broker.port, "/queue/jobs", (str(i) for i in range(N)))
    assert receipted == N
    driver = Driver(broker.port, checkpoint)
    try:
        spark = request.getfixturevalue("spark")   # (started while the driver starts)
        driver.wait_rows("b")
    finally:
        driver.kill()                              # the queries killed in the middle of the stream
    first = driver.rows("b")
    assert driver.killed >= 3  # (the driver, its JVM and at least the source's Python runner)
    running = stream_chain.start_chain(spark, url, checkpoint, BATCH)
    wait_batches(running["b"], 1)
    broker.stop(signal.SIGKILL)                    # the broker killed in the middle of the stream
    second = sum(p["numInputRows"] for p in running["b"].recentProgress)
    assert first + second < N, "the stream was over before the kills"
    for query in running.values():
        stopped(query)
    broker = start_broker(*settings, f"port={broker.port}")
    running = stream_chain.start_chain(spark, url, checkpoint, N)  # (the faults are over: catch up in big batches)
    for query in running.values():
        wait_idle(query)
    for query in running.values():
        query.stop()
    check(drain(broker.port, "/queue/copied"), f"queue -> topic -> queue ({driver.killed} processes of the driver killed; {first} and {second} rows through the last "
          "query before the driver's and the broker's kill)")
    # The last batch's messages are acknowledged when the next batch starts (Spark commits a source
    # then): a stopped query leaves at most one batch unacknowledged, for its next run.
    assert len(drain(broker.port, "/queue/jobs")) <= BATCH


def check(got: collections.Counter, what: str) -> None:
    lost = sorted(set(map(str, range(N))) - set(got), key=int)
    duplicated = {k: v for k, v in got.items() if v > 1}
    print(f"\n{what}: {N} produced with receipts, {len(got)} distinct in the sink, {len(lost)} lost, "
          f"{sum(v - 1 for v in duplicated.values())} duplicated")
    assert not lost, lost[:20]
    assert not duplicated, list(duplicated.items())[:20]
    assert sum(got.values()) == N


@pytest.mark.timeout(120)
def test_live_statistics(spark, start_broker):
    broker = start_broker("processors=3", "diag_interval=200")
    query, stop = stream.start_stats(spark, f"stomp://127.0.0.1:{broker.port}", window_s=2, interval=0.25)
    try:
        deadline = time.monotonic() + 60
        rows = []
        while time.monotonic() < deadline:
            produce(broker.port, "/queue/depth", ["x"] * 20)
            rows = stream.latest_stats(spark)
            kinds = {(r["kind"], r["name"]) for r in rows}
            if {("rate", "messages_published"), ("queue", "/queue/depth"), ("rss", "dispatcher")} <= kinds:
                break
            time.sleep(0.5)
        assert query.exception() is None
        figures = {(r["kind"], r["name"]): r["value"] for r in rows}
        assert figures.get(("rate", "messages_published"), 0) > 0, rows
        assert figures[("queue", "/queue/depth")] >= 20
        assert figures[("rss", "dispatcher")] > 1 << 20
        assert ("latency", "p99_ms") in figures
        assert "messages_published" in stream.render(rows)
    finally:
        stop.set()
        query.stop()
