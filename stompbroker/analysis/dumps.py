"""Reading broker diagnostic dumps (JSON lines, schema 1) into a Spark DataFrame.

See docs/diag-schema.md for the format.  Everything here is plain Spark SQL
(no Python UDFs), so executors need neither this package nor pandas.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from stompbroker.diag import schema

SCHEMA_VERSION = schema.VERSION

_SPARK_TYPES = {schema.INT: LongType(), schema.NUMBER: DoubleType(), schema.STRING: StringType()}


def spark_type(kind):
    """The Spark type of a field of ``stompbroker.diag.schema.LINE`` (an object, array or scalar)."""
    if isinstance(kind, dict):
        return StructType([StructField(name, spark_type(sub)) for name, sub in kind.items()])
    if isinstance(kind, list):
        return ArrayType(spark_type(kind[0]))
    return _SPARK_TYPES[kind]


# Numbers are read as double (schema.NUMBER): a later broker switching an int field to a float
# (or writing 1e3) would otherwise turn the whole record into nulls.  An explicit schema also
# means unknown (newer) fields are ignored, as the format requires.
DUMP_SCHEMA = spark_type(schema.LINE)


def quiet_glob_warning(spark: SparkSession) -> None:
    """Spark logs a WARN plus stack trace for every glob path while probing it for a
    streaming-sink metadata directory; it is harmless, so raise that one logger to ERROR."""
    try:
        jvm = spark.sparkContext._jvm
        for name in (
            "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",  # Spark 4
            "org.apache.spark.sql.execution.streaming.FileStreamSink",  # Spark 3.5
        ):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.toLevel("ERROR")
            )
    except Exception:  # noqa: BLE001 -- cosmetic only (e.g. Spark Connect has no JVM here)
        pass


def load_dumps(spark: SparkSession, paths) -> DataFrame:
    """Read dump files (paths, globs or directories on any Hadoop filesystem).

    Returns one row per interval with the raw fields plus derived columns:
      node       -- the broker: broker.node of the line (the broker's node_id
                    setting), else the name of the directory holding the file,
                    so dumps laid out one directory per broker form a fleet
      run        -- "<node>/<broker pid>@<broker start ms>", one per broker run
      run_seq    -- per node: 0 for the earliest run, 1 after the first restart, ...
      restart    -- true on the first interval of every run after the first
      first_in_run -- true on the first interval seen for a run
      time       -- ts as a timestamp
      t_s        -- seconds since the first interval of the whole data set (all nodes)
      dt_s       -- seconds covered by this interval's counter deltas (see
                    docs/diag-schema.md: since the previous line of the same
                    run, or since broker start for the first line of a run)
    Rotated files are separate paths: pass "diag.jsonl*" to get them all.
    """
    if isinstance(paths, str):
        paths = [paths]
    quiet_glob_warning(spark)
    raw = spark.read.schema(DUMP_SCHEMA).json(list(paths))
    # Corrupt or truncated lines (e.g. the broker was killed mid-write) parse
    # as all-null rows; drop them together with lines of unknown shape.
    df = raw.where(
        (F.col("schema") >= SCHEMA_VERSION) & F.col("ts").isNotNull() & F.col("broker.start").isNotNull()
    )
    directory = F.regexp_extract(F.col("_metadata.file_path"), r"([^/]+)/[^/]*$", 1)
    df = df.withColumn("node", F.coalesce(F.col("broker.node"), F.when(directory != "", directory), F.lit("?")))
    df = df.withColumn(
        "run",
        F.concat(F.col("node"), F.lit("/"), F.coalesce(F.col("broker.pid").cast("string"), F.lit("?")),
                 F.lit("@"), F.format_string("%.3f", F.col("broker.start"))),
    )
    # Overlapping inputs (a file given twice, or both "x" and "x*") must not
    # double-count intervals.
    df = df.dropDuplicates(["run", "ts"])

    # Run numbering from a tiny per-run table (a self-join counting earlier
    # runs) rather than an unpartitioned window, which would pull everything
    # into one partition.
    runs = df.groupBy("node", "run").agg(
        F.min("ts").alias("_run_first_ts"), F.first("broker.start").alias("_start")
    )
    def key(alias):
        return F.struct(*(F.col(f"{alias}.{c}") for c in ("_start", "_run_first_ts", "run")))

    seq = (
        runs.alias("a")
        .join(runs.alias("b"), (F.col("a.node") == F.col("b.node")) & (key("b") < key("a")), "left")
        .groupBy(F.col("a.run").alias("run"))
        .agg(F.count(F.col("b.run")).alias("run_seq"))
    )
    t0 = runs.agg(F.min("_run_first_ts").alias("_t0"))
    runs = runs.join(seq, "run").crossJoin(t0).select("run", "run_seq", "_run_first_ts", "_t0")
    df = df.join(F.broadcast(runs), "run")

    w = Window.partitionBy("run").orderBy("ts")
    prev_ts = F.lag("ts").over(w)
    # First line of a run: counters started at 0 at broker start, so the
    # deltas cover [start, ts].  Fall back to interval_ms if clocks disagree.
    dt_ms = F.when(prev_ts.isNull(), F.col("ts") - F.col("broker.start")).otherwise(F.col("ts") - prev_ts)
    dt_ms = F.when(dt_ms > 0, dt_ms).otherwise(F.col("interval_ms"))
    first = F.col("ts") == F.col("_run_first_ts")
    return (
        df.withColumn("first_in_run", first)
        .withColumn("restart", first & (F.col("run_seq") > 0))
        .withColumn("time", F.expr("timestamp_millis(cast(ts as bigint))"))
        .withColumn("t_s", (F.col("ts") - F.col("_t0")) / 1000.0)
        .withColumn("dt_s", dt_ms / 1000.0)
        .drop("_run_first_ts", "_t0")
    )
