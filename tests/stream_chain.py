"""The chain /queue/jobs -> /topic/orders -> /queue/copied as two ``stomp`` queries (a: queue source,
sink de-duplicating by message id; b: topic source by sequence, sink with per-row dedup-ids),
checkpointed under CHECKPOINT/a and CHECKPOINT/b; tests/integration/test_streaming.py runs it in a
process of its own to kill it with SIGKILL, then goes on from the same checkpoints in its session.

    python tests/stream_chain.py URL CHECKPOINT BATCH

Prints a JSON line per batch with input ({"query", "batch", "rows"}) until killed, or until a query
fails or RUN_LIMIT seconds pass (exit status 1).
"""

from __future__ import annotations

import json
import os
import sys
import time

RUN_LIMIT = 300.0  # seconds: never outlive a test that forgot it


def session(app: str):
    from pyspark.sql import SparkSession

    from stompbroker.analysis import streaming
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             # a Python worker may take long to start on a loaded test machine
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    streaming.register(spark)
    return spark


def start(spark, url: str, source: str, sink: str, checkpoint: str, batch: int):
    df = (spark.readStream.format("stomp").option("url", url).option("destination", source)
          .option("maxMessagesPerTrigger", batch).option("startingOffsets", "earliest").load())
    writer = df.writeStream.format("stomp").option("url", url).option("destination", sink)
    if source.startswith("/queue/"):
        writer = writer.option("dedupIdColumn", "message_id")  # a queue may give a message back in another batch
    return writer.option("checkpointLocation", checkpoint).start()


def start_chain(spark, url: str, checkpoint, batch: int) -> dict:
    """a, then b once a has run its first batch (or found nothing to read): two queries of one
    session starting their stomp source at the same moment can fail their first task with
    java.io.OptionalDataException (docs/analysis.md, "Where it runs")."""
    a = start(spark, url, "/queue/jobs", "/topic/orders", f"{checkpoint}/a", batch)
    deadline = time.monotonic() + 120
    while not a.recentProgress and a.status["message"] != "Waiting for data to arrive" and a.exception() is None \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"a": a, "b": start(spark, url, "/topic/orders", "/queue/copied", f"{checkpoint}/b", batch)}


def main(url: str, checkpoint: str, batch: int) -> int:
    queries = start_chain(session("test-stream-chain"), url, checkpoint, batch)
    seen, began = set(), time.monotonic()
    while time.monotonic() - began < RUN_LIMIT:
        time.sleep(0.05)
        for name, query in queries.items():
            if query.exception() is not None:
                print(json.dumps({"query": name, "error": str(query.exception()).splitlines()[0]}), flush=True)
                return 1
            for p in query.recentProgress:
                if (name, p["batchId"]) not in seen and p["numInputRows"]:
                    seen.add((name, p["batchId"]))
                    print(json.dumps({"query": name, "batch": p["batchId"], "rows": p["numInputRows"]}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
