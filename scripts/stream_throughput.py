"""Throughput of the stomp Spark source and sink against plain stomp.py clients (docs/analysis.md).

    .venv/bin/python scripts/stream_throughput.py [--messages 20000] [--cores 2]

Starts a broker (store=sqlite) and puts N persistent topic messages in its replay log, then times:
a stomp.py consumer reading them (replay-from-seq), the Spark source reading them into Spark's
noop sink, a stomp.py producer sending N queue messages with receipts, and the Spark source
feeding the stomp sink (N rows sent with receipts and dedup-ids). Spark figures are per core of
local[cores] and count only the batches' processing time (not Spark's start-up).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import stomp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

from conftest import BrokerProcess  # noqa: E402

from stompbroker.analysis import streaming  # noqa: E402
from stompbroker.tools.client import StompClient  # noqa: E402

BODY = b"x" * 100


def fill(port: int, destination: str, n: int, headers=()) -> None:
    client = StompClient.connect(port=port)
    waiting = set()
    for i in range(n):
        receipt = client.next_receipt_id()
        waiting.add(receipt)
        client.send_frame("SEND", [("destination", destination), *headers, ("receipt", receipt)], BODY,
                          flush=i % 200 == 199)
        if len(waiting) >= 2000:
            client.flush()
            streaming.receipts(client, waiting, 1000)
    client.flush()
    streaming.receipts(client, waiting, 0)
    client.disconnect()


class Counter(stomp.ConnectionListener):
    def __init__(self, n):
        self.n, self.count, self.done = n, 0, threading.Event()

    def on_message(self, frame):
        if frame.headers.get("replay-end") == "true":
            self.done.set()
        else:
            self.count += 1

    def on_receipt(self, frame):
        self.count += 1
        if self.count >= self.n:
            self.done.set()


def stomppy_read(port: int, n: int) -> float:
    conn = stomp.Connection([("127.0.0.1", port)])
    listener = Counter(n)
    conn.set_listener("", listener)
    conn.connect(wait=True)
    started, cpu = time.monotonic(), time.process_time()
    conn.subscribe("/topic/bench", "r", headers={"replay-from-seq": "0"})
    listener.done.wait(300)
    took, used = time.monotonic() - started, time.process_time() - cpu
    conn.disconnect()
    assert listener.count == n, listener.count
    return n / took, n / used


def stomppy_write(port: int, n: int) -> tuple[float, float]:
    conn = stomp.Connection([("127.0.0.1", port)])
    listener = Counter(n)
    conn.set_listener("", listener)
    conn.connect(wait=True)
    started, cpu = time.monotonic(), time.process_time()
    for i in range(n):
        conn.send("/queue/bench-stomppy", BODY, headers={"receipt": f"r{i}", "dedup-id": f"d{i}"})
    listener.done.wait(300)
    took, used = time.monotonic() - started, time.process_time() - cpu
    conn.disconnect()
    return n / took, n / used


def spark_run(spark, port: int, n: int, cores: int, sink: str | None) -> float:
    """Messages per second of batch processing time, reading the topic (into noop or the stomp sink)."""
    url = f"stomp://127.0.0.1:{port}"
    df = (spark.readStream.format("stomp").option("url", url).option("destination", "/topic/bench")
          .option("startingOffsets", "earliest").option("numPartitions", cores).load())
    if sink is None:
        writer = df.writeStream.format("noop")
    else:
        writer = df.select("body").writeStream.format("stomp").option("url", url).option("destination", sink)
    query = writer.option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True).start()
    query.awaitTermination(600)
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    took = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    assert rows == n, rows
    return n / took


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--cores", type=int, default=2)
    args = p.parse_args()
    from pyspark.sql import SparkSession
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    store = tempfile.mkdtemp()
    broker = BrokerProcess("processors=4", "store=sqlite", f"store_path={store}/s.sqlite")
    spark = None
    try:
        fill(broker.port, "/topic/bench", args.messages, [("persistent", "true")])
        n = args.messages
        read_rate, read_cpu = stomppy_read(broker.port, n)
        write_rate, write_cpu = stomppy_write(broker.port, n)
        spark = (SparkSession.builder.master(f"local[{args.cores}]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        streaming.register(spark)
        spark_run(spark, broker.port, n, args.cores, None)  # warm-up: JVM and Python workers
        source = spark_run(spark, broker.port, n, args.cores, None)
        sink = spark_run(spark, broker.port, n, args.cores, "/queue/bench-spark")
        print(f"messages: {n} of {len(BODY)} bytes, Spark local[{args.cores}], load average {os.getloadavg()[0]:.1f}")
        print(f"stomp.py consumer (replay-from-seq): {read_rate:9.0f} msg/s wall, {read_cpu:9.0f} msg/s per CPU second")
        print(f"stomp.py producer (receipts):        {write_rate:9.0f} msg/s wall, {write_cpu:9.0f} msg/s per CPU second")
        print(f"Spark source -> noop:                {source:9.0f} msg/s, {source / args.cores:9.0f} msg/s per core")
        print(f"Spark source -> stomp sink:          {sink:9.0f} msg/s, {sink / args.cores:9.0f} msg/s per core")
    finally:
        if spark is not None:
            spark.stop()
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
