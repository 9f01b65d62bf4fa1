"""stompbroker-stream: streaming jobs on the broker (docs/analysis.md, "Streaming").

    stompbroker-stream stats --url stomp://127.0.0.1:61613 [--window 10] [--seconds 60]
    stompbroker-stream copy --url stomp://... --source /topic/in --sink /queue/out --checkpoint DIR

``stats`` polls the broker's DIAG queries (totals, latency, queues, process) onto a DIAG topic,
reads that topic through the ``stomp`` source (``mode=live``) and keeps windowed aggregates
current in the in-memory table ``stompbroker_stats`` (rates, latency percentiles, queue depths,
per-process CPU and memory), printed every ``--every`` seconds; a notebook queries the same
table. ``copy`` streams one destination into another, exactly once (source offsets in the
checkpoint, dedup-ids on the sink), until ``--idle`` seconds pass with nothing new. Both take
``--master`` or ``--remote`` (Spark Connect) as stompbroker-diag-report does.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import warnings

from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import streaming
from .report import _session, is_connect

DIAG_TOPIC = "DIAG/stompbroker-stream"
QUERIES = ("totals", "latency", "queues", "process")
TABLE = "stompbroker_stats"
START_TIMEOUT = 300.0  # seconds copy waits for its first rows
COUNTERS = ("messages_published", "messages_delivered", "frames_in", "frames_out", "bytes_in", "bytes_out",
            "errors")


def poll_diag(opts: streaming.Options, interval: float, stop: threading.Event) -> None:
    """SEND the DIAG queries to DIAG_TOPIC every ``interval`` s (the broker adds the answers as headers)."""
    client = None
    while not stop.is_set():
        try:
            client = client or streaming.connect(opts)
            for query in QUERIES:
                client.send(DIAG_TOPIC, query.encode(), flush=False)
            client.flush()
        except Exception as exc:  # noqa: BLE001 -- the broker restarting: try again next time
            print(f"stompbroker-stream: DIAG poll failed: {exc}", file=sys.stderr)
            client = None
        stop.wait(interval)
    if client is not None:
        client.close()


def _json_array(schema: T.DataType):
    return T.ArrayType(schema)


QUEUE = T.StructType([T.StructField("destination", T.StringType()), T.StructField("depth", T.LongType())])
PROCESS = T.StructType([T.StructField("role", T.StringType()), T.StructField("rss", T.LongType()),
                        T.StructField("cpu_seconds", T.DoubleType())])


def stats_frame(raw, window_s: int):
    """Windowed aggregates over the DIAG answers read by the source: one row per window and
    name. ``kind`` rate (per second over the window), latency (the worst percentile seen), queue
    (deepest), rss (bytes, highest) and cpu (share of one core over the window)."""
    h = F.col("headers")
    ts = F.col("timestamp")
    query = F.trim(F.col("body_string"))
    counters = raw.where(query == "totals").select(
        ts, F.explode(F.map_filter(h, lambda k, v: k.isin(*COUNTERS))).alias("name", "value"))
    counters = counters.select(ts, F.lit("rate").alias("kind"), "name", F.col("value").cast("double").alias("value"))
    latency = raw.where(query == "latency").select(
        ts, F.explode(F.map_filter(h, lambda k, v: k.endswith("_ms"))).alias("name", "value"))
    latency = latency.select(ts, F.lit("latency").alias("kind"), "name", F.col("value").cast("double").alias("value"))
    queues = raw.where(query == "queues").select(ts, F.explode(F.from_json(h["queues"], _json_array(QUEUE))).alias("q"))
    queues = queues.select(ts, F.lit("queue").alias("kind"), F.col("q.destination").alias("name"),
                           F.col("q.depth").cast("double").alias("value"))
    procs = raw.where(query == "process").select(ts, F.explode(F.from_json(h["process"], _json_array(PROCESS)))
                                                 .alias("p"))
    rss = procs.select(ts, F.lit("rss").alias("kind"), F.col("p.role").alias("name"),
                       F.col("p.rss").cast("double").alias("value"))
    cpu = procs.select(ts, F.lit("cpu").alias("kind"), F.col("p.role").alias("name"),
                       F.col("p.cpu_seconds").alias("value"))
    points = counters.unionByName(latency).unionByName(queues).unionByName(rss).unionByName(cpu)
    grouped = points.withWatermark("timestamp", f"{2 * window_s} seconds").groupBy(
        F.window("timestamp", f"{window_s} seconds"), "kind", "name")
    seconds = (F.max("timestamp").cast("double") - F.min("timestamp").cast("double"))
    growth = (F.max("value") - F.min("value")) / F.when(seconds > 0, seconds)
    return grouped.agg(
        F.when(F.col("kind").isin("rate", "cpu"), growth).otherwise(F.max("value")).alias("value"),
        F.count("*").alias("samples"),
    ).select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
             "kind", "name", "value", "samples")


def start_stats(spark, url: str, window_s: int = 10, interval: float = 1.0, **options):
    """Start the live statistics: the DIAG poller thread and the streaming query writing the
    in-memory table stompbroker_stats. Returns (query, stop event); set the event and stop the
    query to end it."""
    streaming.register(spark)
    opts = streaming.parse_options({"url": url, "destination": DIAG_TOPIC, **options})
    stop = threading.Event()
    threading.Thread(target=poll_diag, args=(opts, interval, stop), daemon=True, name="diag-poll").start()
    raw = (spark.readStream.format("stomp").option("url", url).option("destination", DIAG_TOPIC)
           .option("mode", "live").options(**options).load())
    query = (stats_frame(raw, window_s).writeStream.format("memory").queryName(TABLE).outputMode("complete")
             .trigger(processingTime=f"{max(interval, 0.5)} seconds").start())
    return query, stop


def latest_stats(spark):
    """The figures of the latest window with rates (two samples or more), as rows (kind, name, value)."""
    return spark.sql(f"SELECT kind, name, value, window_start FROM {TABLE} WHERE window_start = "
                     f"(SELECT max(window_start) FROM {TABLE} WHERE kind = 'rate' AND value IS NOT NULL) "
                     "ORDER BY kind, name").collect()


def render(rows) -> str:
    if not rows:
        return "(no complete window yet)"
    lines = [f"window from {rows[0]['window_start']}"]
    units = {"rate": "/s", "latency": " ms", "queue": " messages", "rss": " MiB", "cpu": " cores"}
    for row in rows:
        value = row["value"] if row["value"] is not None else float("nan")
        if row["kind"] == "rss":
            value /= 1 << 20
        lines.append(f"  {row['kind']:8} {row['name']:28} {value:12.2f}{units[row['kind']]}")
    return "\n".join(lines)


def copy(spark, url: str, source: str, sink: str, checkpoint: str, idle: float, **options):
    """Stream ``source`` into ``sink`` until ``idle`` s pass with no new input (or START_TIMEOUT
    with none at all); returns the rows copied."""
    streaming.register(spark)
    df = spark.readStream.format("stomp").option("url", url).option("destination", source).options(**options).load()
    writer = df.writeStream.format("stomp").option("url", url).option("destination", sink)
    if source.startswith("/queue/"):
        writer = writer.option("dedupIdColumn", "message_id")  # a queue re-delivers by message id
    query = writer.option("checkpointLocation", checkpoint).trigger(processingTime="0.5 seconds").start()
    copied, quiet_since = 0, None   # (idle counts from the first rows: starting may take long)
    started = time.monotonic()
    seen = set()
    try:
        while time.monotonic() - (quiet_since or started) < (idle if quiet_since else max(idle, START_TIMEOUT)):
            time.sleep(0.5)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()).splitlines()[0])
            for progress in query.recentProgress:
                if progress["batchId"] not in seen:
                    seen.add(progress["batchId"])
                    rows = input_rows(progress)
                    if rows:
                        copied += rows
                        quiet_since = time.monotonic()
    finally:
        query.stop()
    return copied


def input_rows(progress) -> int:
    """A progress report's input rows (Spark Connect's leave the top-level figure null)."""
    rows = getattr(progress, "numInputRows", None)
    return rows if rows is not None else sum(s["numInputRows"] or 0 for s in progress["sources"])


def parse_args(argv):
    p = argparse.ArgumentParser(prog="stompbroker-stream", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("stats", "copy"):
        c = sub.add_parser(name)
        c.add_argument("--url", default="stomp://127.0.0.1:61613")
        c.add_argument("--option", "-o", action="append", default=[], metavar="NAME=VALUE",
                       help="a stomp source option (login, passcode, tls.ca, maxMessagesPerTrigger, ...)")
        c.add_argument("--master", help="Spark master (default local[*])")
        c.add_argument("--remote", help="Spark Connect server, sc://host:port")
        c.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
        if name == "stats":
            c.add_argument("--window", type=int, default=10, help="seconds per window (default 10)")
            c.add_argument("--interval", type=float, default=1.0, help="seconds between DIAG polls")
            c.add_argument("--every", type=float, default=5.0, help="seconds between printed tables")
            c.add_argument("--seconds", type=float, default=0, help="stop after this long (0 = Ctrl-C)")
        else:
            c.add_argument("--source", required=True)
            c.add_argument("--sink", required=True)
            c.add_argument("--checkpoint", required=True)
            c.add_argument("--idle", type=float, default=10.0, help="stop after this long with nothing new")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    options = dict(pair.split("=", 1) for pair in args.option)
    spark = _session(args.master, args.conf, args.remote, app=f"stompbroker-stream-{args.command}")
    if not is_connect(spark):
        spark.sparkContext.setLogLevel("WARN")
    try:
        if args.command == "copy":
            copied = copy(spark, args.url, args.source, args.sink, args.checkpoint, args.idle, **options)
            print(json.dumps({"copied": copied}))
            return 0
        query, stop = start_stats(spark, args.url, args.window, args.interval, **options)
        started = time.monotonic()
        try:
            while not args.seconds or time.monotonic() - started < args.seconds:
                time.sleep(min(args.every, max(args.seconds - (time.monotonic() - started), 0.1))
                           if args.seconds else args.every)
                if query.exception() is not None:
                    raise RuntimeError(str(query.exception()).splitlines()[0])
                print(render(latest_stats(spark)), flush=True)
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            query.stop()
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
