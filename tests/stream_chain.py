"""A Spark driver process for tests/integration/test_streaming.py, so that a test can kill a running
query with SIGKILL: the chain /queue/jobs -> /topic/orders -> /queue/copied as two ``stomp`` queries
(a: queue source, sink de-duplicating by message id; b: topic source by sequence, sink with
per-row dedup-ids) in one local[2] session, checkpointed under CHECKPOINT/a and CHECKPOINT/b.

    python tests/stream_chain.py URL CHECKPOINT BATCH IDLE

Prints a JSON line per batch with input ({"query", "batch", "rows"}); exits 0 once both queries
have been idle for IDLE seconds after reading something. A query that fails (its broker gone) is
started again from its checkpoint, as a supervisor would, until it reads again.
"""

from __future__ import annotations

import json
import os
import sys
import time

START_TIMEOUT = 240.0  # seconds for the first rows on a loaded machine
MAX_RESTARTS = 30  # queries started again after a failure (the broker restarting)


def start(spark, url: str, source: str, sink: str, checkpoint: str, batch: int):
    df = (spark.readStream.format("stomp").option("url", url).option("destination", source)
          .option("maxMessagesPerTrigger", batch).option("startingOffsets", "earliest").load())
    writer = df.writeStream.format("stomp").option("url", url).option("destination", sink)
    if source.startswith("/queue/"):
        writer = writer.option("dedupIdColumn", "message_id")
    return writer.option("checkpointLocation", checkpoint).start()


def main(url: str, checkpoint: str, batch: int, idle: float) -> int:
    from pyspark.sql import SparkSession

    from stompbroker.analysis import streaming
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("test-stream-chain")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    streaming.register(spark)
    def start_all():
        return {"a": start(spark, url, "/queue/jobs", "/topic/orders", f"{checkpoint}/a", batch),
                "b": start(spark, url, "/topic/orders", "/queue/copied", f"{checkpoint}/b", batch)}

    queries = start_all()
    seen, last_input, began, restarts = set(), None, time.monotonic(), 0
    while True:
        time.sleep(0.2)
        failed = [name for name, query in queries.items() if query.exception() is not None]
        if failed:  # (the broker went away: start again from the checkpoints, as a supervisor would)
            print(json.dumps({"failed": failed, "error": str(queries[failed[0]].exception()).splitlines()[0]}),
                  flush=True)
            restarts += 1
            if restarts > MAX_RESTARTS:
                return 1
            for query in queries.values():
                query.stop()
            time.sleep(1.0)
            queries, last_input, began = start_all(), None, time.monotonic()
            continue
        for name, query in queries.items():
            for p in query.recentProgress:
                if (query.runId, p["batchId"]) not in seen and p["numInputRows"]:
                    seen.add((query.runId, p["batchId"]))
                    last_input = time.monotonic()
                    print(json.dumps({"query": name, "batch": p["batchId"], "rows": p["numInputRows"]}), flush=True)
        busy = any(q.status["isDataAvailable"] for q in queries.values())  # a batch with data under way
        if last_input is not None and not busy and time.monotonic() - last_input > idle:
            break
        if last_input is None and time.monotonic() - began > START_TIMEOUT:
            print(json.dumps({"error": "no input"}), flush=True)
            return 1
    for query in queries.values():
        query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
