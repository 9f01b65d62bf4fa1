"""The broker as a Spark Structured Streaming source and sink, exactly once, on embedded Spark
(local[2], one session for the module): N messages produced with receipts, the query stopped in the
middle of the stream and restarted from its checkpoint, the broker killed with SIGKILL in the
middle of the stream and restarted on its store, and at the end every message is in the sink
once: none lost, none twice. (--master and --remote: tests/integration/test_analysis_cluster.py.)"""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest

from stompbroker.analysis import stream, streaming
from stompbroker.tools.client import StompClient

N = 1000
BATCH = 150  # maxMessagesPerTrigger: a dozen batches, so the faults fall in the middle


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    existing = SparkSession.getActiveSession()  # another module's, still in use by its fixtures: left running
    session = existing or (SparkSession.builder.master("local[2]").appName("test-streaming")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               # a Python worker may take long to start on a loaded test machine
               .config("spark.python.authenticate.socketTimeout", "120s")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    streaming.register(session)
    yield session
    if existing is None:
        session.stop()


def produce(port: int, destination: str, bodies, headers=()) -> None:
    """SEND each with a receipt; return once every receipt has come."""
    client = StompClient.connect(port=port)
    waiting = set()
    for body in bodies:
        receipt = client.next_receipt_id()
        waiting.add(receipt)
        client.send_frame("SEND", [("destination", destination), *headers, ("receipt", receipt)], body.encode(),
                          flush=len(waiting) % 100 == 0)
    client.flush()
    streaming.receipts(client, waiting, 0)
    client.disconnect()


def drain(port: int, destination: str) -> collections.Counter:
    client = StompClient.connect(port=port)
    client.subscribe(destination, "drain")
    got = collections.Counter()
    while (frame := client.read_frame(2.0)) is not None:
        got[frame.body.decode()] += 1
    client.disconnect()
    return got


def start(spark, port: int, source: str, sink: str, checkpoint, **options):
    url = f"stomp://127.0.0.1:{port}"
    df = (spark.readStream.format("stomp").option("url", url).option("destination", source)
          .option("maxMessagesPerTrigger", BATCH).options(**options).load())
    writer = df.writeStream.format("stomp").option("url", url).option("destination", sink)
    if source.startswith("/queue/"):
        writer = writer.option("dedupIdColumn", "message_id")
    return writer.option("checkpointLocation", str(checkpoint)).start()


def wait_batches(query, more: int, timeout: float = 150.0) -> None:
    """Until ``more`` batches with input have finished since the call."""
    def done():
        return sum(1 for p in query.recentProgress if p["numInputRows"])
    target = done() + more
    deadline = time.monotonic() + timeout
    while done() < target:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{more} batches did not finish within {timeout} s"
        time.sleep(0.1)


def wait_idle(query, idle: float = 3.0, timeout: float = 120.0) -> None:
    """Until the query, having read something, has had nothing new for ``idle`` s."""
    deadline = time.monotonic() + timeout
    since = None
    while since is None or time.monotonic() - since < idle:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the query did not catch up"
        if any(p["numInputRows"] for p in query.recentProgress[-1:]):
            since = time.monotonic()
        elif since is None and any(p["numInputRows"] for p in query.recentProgress):
            since = time.monotonic()
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_queue_to_topic_to_queue_exactly_once_through_faults(spark, start_broker, tmp_path):
    """Two queries in a chain, so both sources and both kinds of sink destination are exercised:
    /queue/jobs -> (queue source, sink de-duplicating by message id) -> /topic/orders (persistent)
    -> (topic source by sequence, sink with per-row dedup-ids) -> /queue/copied. N produced with
    receipts, half before and half after the broker's kill -9; both queries stopped mid-stream and
    restarted from their checkpoints, then failed by the kill and restarted again."""
    settings = ("processors=3", "store=sqlite", f"store_path={tmp_path}/store.sqlite")
    broker = start_broker(*settings)

    def queries(port, **first):
        return [start(spark, port, "/queue/jobs", "/topic/orders", tmp_path / "a"),
                start(spark, port, "/topic/orders", "/queue/copied", tmp_path / "b", **first)]

    produce(broker.port, "/queue/jobs", (str(i) for i in range(N // 2)))
    running = queries(broker.port, startingOffsets="earliest")
    wait_batches(running[1], 2)
    for query in running:
        query.stop()                               # stopped in the middle of the stream
    running = queries(broker.port)
    wait_batches(running[1], 1)
    broker.stop(signal.SIGKILL)                    # the broker killed in the middle of the stream
    for query in running:
        stopped(query)
    broker = start_broker(*settings)
    produce(broker.port, "/queue/jobs", (str(i) for i in range(N // 2, N)))
    running = queries(broker.port)
    for query in running:
        wait_idle(query)
    for query in running:
        query.stop()
    check(drain(broker.port, "/queue/copied"), "queue -> topic -> queue")
    # The last batch's messages are acknowledged when the next batch starts (Spark commits a source
    # then): a stopped query leaves at most one batch unacknowledged, for its next run.
    assert len(drain(broker.port, "/queue/jobs")) <= BATCH


def stopped(query) -> None:
    """Until a query without its broker has failed (its next read or write cannot connect)."""
    deadline = time.monotonic() + 90
    while query.isActive and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not query.isActive, "the query kept running without its broker"


def check(got: collections.Counter, what: str) -> None:
    lost = sorted(set(map(str, range(N))) - set(got), key=int)
    duplicated = {k: v for k, v in got.items() if v > 1}
    print(f"\n{what}: {N} produced, {len(got)} distinct in the sink, {len(lost)} lost, "
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
