"""Per-interval tables computed from load_dumps() output, plus leak flags and a summary.

All functions take and return Spark DataFrames built only from Spark SQL
functions (no Python UDFs), so they run unchanged on a cluster.  Every
per-interval table carries node, run, run_seq, ts (epoch ms), time and t_s
(seconds since the first interval) so tables can be joined and plotted.
"""

from __future__ import annotations

import datetime as _dt
from typing import Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

KEYS = ["node", "run", "run_seq", "ts", "time", "t_s"]

THROUGHPUT_COUNTERS = [
    "frames_in",
    "frames_out",
    "bytes_in",
    "bytes_out",
    "messages_published",
    "messages_delivered",
]
CHURN_COUNTERS = ["connections_opened", "connections_closed"]
LATENCY_FIELDS = ["p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"]

# Leak rule defaults (documented in docs/diag-schema.md).
LEAK_MIN_SAMPLES = 10
LEAK_MIN_SLOPE = 1024.0  # bytes per second of fitted RSS growth (~3.5 MiB/hour)
LEAK_MIN_UP_FRACTION = 0.7  # of the steps where RSS changed, share that went up
LEAK_MIN_R2 = 0.8  # linearity; rejects a single jump (a step mid-run gives r2 <= 0.75)


def _delta(col: str, w: Window, first=None) -> Column:
    """Growth of a cumulative counter since the previous row of window w.

    A decrease can only mean the counter restarted from 0 (process or queue
    re-created), so the delta is then the new value: never negative.  With
    first=None the first row of a partition gets null, otherwise `first`.
    """
    c, prev = F.col(col), F.lag(col).over(w)
    return (
        F.when(prev.isNull(), first if first is not None else F.lit(None))
        .when(c < prev, c)
        .otherwise(c - prev)
    )


def _per_s(delta: Column) -> Column:
    return F.when(F.col("dt_s") > 0, delta / F.col("dt_s"))


def _counter_rates(df: DataFrame, counters, partition) -> DataFrame:
    # Partition windows include the run, so counters are never compared across
    # a broker restart; a run's first line counts from 0 (broker start).
    w = Window.partitionBy(*partition).orderBy("ts")
    for c in counters:
        df = df.withColumn(f"{c}_delta", _delta(c, w, first=F.col(c)).cast("long"))
        df = df.withColumn(f"{c}_per_s", _per_s(F.col(f"{c}_delta")))
    return df.drop(*counters)


def throughput(df: DataFrame) -> DataFrame:
    """Frames, bytes and messages per second for every interval."""
    base = df.select(*KEYS, "dt_s", "restart", *[F.col(f"totals.{c}").alias(c) for c in THROUGHPUT_COUNTERS])
    return _counter_rates(base, THROUGHPUT_COUNTERS, ["run"])


def churn(df: DataFrame) -> DataFrame:
    """Connections opened/closed per second and session gauges."""
    base = df.select(
        *KEYS,
        "dt_s",
        *[F.col(f"totals.{c}").alias(c) for c in CHURN_COUNTERS],
        *[F.col(f"session.{c}").cast("long").alias(c) for c in ("clients", "websockets", "stomp_connected", "subscriptions")],
    )
    return _counter_rates(base, CHURN_COUNTERS, ["run"])


def queue_depths(df: DataFrame) -> DataFrame:
    """One row per destination per interval: depth, unacked, consumers, rates."""
    q = df.select(*KEYS, "dt_s", F.explode("queues").alias("q")).select(
        *KEYS,
        "dt_s",
        F.col("q.destination").alias("destination"),
        F.col("q.depth").cast("long").alias("depth"),
        F.col("q.unacked").cast("long").alias("unacked"),
        F.col("q.consumers").cast("long").alias("consumers"),
        F.col("q.enqueued").alias("enqueued"),
        F.col("q.dequeued").alias("dequeued"),
    )
    return _counter_rates(q, ["enqueued", "dequeued"], ["run", "destination"]).drop("dt_s")


def writer_balance(df: DataFrame) -> DataFrame:
    """One row per writer per interval.

    share      -- this writer's fraction of the frames written in the interval
    imbalance  -- max / mean of the writers' frames in the interval (1.0 is
                  perfect balance; null when nothing was written)
    batch_fill -- as reported (average fill of the 10 KB batch buffer)
    """
    w = df.select(*KEYS, "dt_s", F.explode("writers").alias("w")).select(
        *KEYS,
        "dt_s",
        F.col("w.index").cast("int").alias("writer"),
        F.col("w.pid").cast("long").alias("pid"),
        F.col("w.connections").cast("long").alias("connections"),
        F.col("w.frames").alias("frames"),
        F.col("w.bytes").alias("bytes"),
        F.col("w.batches").alias("batches"),
        F.col("w.batch_fill").alias("batch_fill"),
        F.col("w.pending_bytes").cast("long").alias("pending_bytes"),
    )
    w = _counter_rates(w, ["frames", "bytes", "batches"], ["run", "writer"])
    interval = Window.partitionBy("run", "ts")
    total = F.sum("frames_delta").over(interval)
    mean = F.avg("frames_delta").over(interval)
    return (
        w.withColumn("share", F.when(total > 0, F.col("frames_delta") / total))
        .withColumn("imbalance", F.when(mean > 0, F.max("frames_delta").over(interval) / mean))
        .drop("dt_s")
    )


def latency(df: DataFrame) -> DataFrame:
    """Delivery latency percentiles per interval (null when count is 0)."""
    has = F.col("latency.count") > 0
    return df.select(
        *KEYS,
        F.col("latency.count").cast("long").alias("count"),
        *[F.when(has, F.col(f"latency.{c}")).alias(c) for c in LATENCY_FIELDS],
    )


def memory(df: DataFrame) -> DataFrame:
    """RSS, private memory and CPU per process per interval (cpu_percent null on a process's first
    sample). private is anonymous resident memory (RssAnon); dumps older than that field give rss."""
    p = df.select(*KEYS, "dt_s", F.explode("process").alias("p")).select(
        *KEYS,
        "dt_s",
        F.col("p.role").alias("role"),
        F.col("p.pid").cast("long").alias("pid"),
        F.col("p.rss").cast("long").alias("rss"),
        (F.col("p.rss") / 2**20).alias("rss_mb"),
        F.coalesce(F.col("p.private"), F.col("p.rss")).cast("long").alias("private"),
        F.col("p.cpu_seconds").alias("cpu_seconds"),
    )
    # A pid's CPU time since *its* start is unknown relative to the window,
    # hence no value on its first sample (unlike run-level counters).
    w = Window.partitionBy("run", "role", "pid").orderBy("ts")
    return p.withColumn("cpu_percent", _per_s(_delta("cpu_seconds", w)) * 100.0).drop("dt_s")


def leak_flags(
    mem_df: DataFrame,
    min_samples: int = LEAK_MIN_SAMPLES,
    min_slope: float = LEAK_MIN_SLOPE,
    min_up_fraction: float = LEAK_MIN_UP_FRACTION,
    min_r2: float = LEAK_MIN_R2,
) -> DataFrame:
    """One row per process (run, role, pid) with a least-squares slope of its private memory and a
    leak flag. Private (anonymous) memory only: RSS also counts shared-memory ring pages as they are
    first touched, which grows in a healthy process as far as the rings' deepest backlog.
    (The *_rss columns keep their names but hold private memory.)

    leak = samples >= min_samples
           and slope (bytes/s) >= min_slope
           and up_fraction >= min_up_fraction  (increases / steps where RSS changed)
           and r2 >= min_r2                    (the growth is steady, not one jump)
    """
    value = "private" if "private" in mem_df.columns else "rss"
    w = Window.partitionBy("run", "role", "pid").orderBy("ts")
    step = F.signum(F.col(value) - F.lag(value).over(w))
    m = mem_df.withColumn("_step", step)
    g = m.groupBy("node", "run", "run_seq", "role", "pid").agg(
        F.count(value).alias("samples"),
        ((F.max("ts") - F.min("ts")) / 1000.0).alias("span_s"),
        F.min_by(value, "ts").alias("first_rss"),
        F.max_by(value, "ts").alias("last_rss"),
        F.max(value).alias("peak_rss"),
        F.covar_pop("t_s", value).alias("_cov"),
        F.var_pop("t_s").alias("_var"),
        F.corr("t_s", value).alias("_r"),
        F.sum(F.when(F.col("_step") > 0, 1).otherwise(0)).alias("up_steps"),
        F.sum(F.when(F.col("_step") < 0, 1).otherwise(0)).alias("down_steps"),
    )
    changed = F.col("up_steps") + F.col("down_steps")
    # Spark orders NaN above every number, so keep NaN out of the comparisons.
    r = F.when(F.col("_r").isNotNull() & ~F.isnan("_r"), F.col("_r"))
    g = (
        g.withColumn("slope_bytes_per_s", F.when(F.col("_var") > 0, F.col("_cov") / F.col("_var")))
        .withColumn("slope_mib_per_hour", F.col("slope_bytes_per_s") * 3600.0 / 2**20)
        .withColumn("up_fraction", F.when(changed > 0, F.col("up_steps") / changed))
        .withColumn("r2", r * r)
    )
    leak = (
        (F.col("samples") >= min_samples)
        & (F.col("slope_bytes_per_s") >= min_slope)
        & (F.col("up_fraction") >= min_up_fraction)
        & (F.col("r2") >= min_r2)
    )
    return g.withColumn("leak", F.coalesce(leak, F.lit(False))).drop("_cov", "_var", "_r")


NODE_RATES = ["messages_published", "messages_delivered", "frames_in", "frames_out", "bytes_in", "bytes_out"]


def _node_rss(mem_df: DataFrame) -> DataFrame:
    """Total RSS of all of a node's processes at each interval."""
    return mem_df.groupBy("node", "run", "ts", "t_s").agg(F.sum("rss").alias("rss"))


def nodes(tp: DataFrame, ch: DataFrame, lat: DataFrame, mem_df: DataFrame, leaks: DataFrame) -> DataFrame:
    """One row per node (broker): runs, span, totals, time-weighted mean and peak rates,
    latency, memory (node total RSS = all its processes at one interval) and leak count."""
    t = tp.groupBy("node").agg(
        F.size(F.collect_set("run")).alias("runs"),
        F.count("*").alias("intervals"),
        F.min("ts").alias("first"),
        F.max("ts").alias("last"),
        F.sum("dt_s").alias("covered_s"),
        *[F.sum(f"{c}_delta").alias(f"{c}_total") for c in NODE_RATES],
        *[F.max(f"{c}_per_s").alias(f"{c}_per_s_peak") for c in NODE_RATES],
    )
    for c in NODE_RATES:
        t = t.withColumn(f"{c}_per_s_mean", F.when(F.col("covered_s") > 0, F.col(f"{c}_total") / F.col("covered_s")))
    c = ch.groupBy("node").agg(
        *[F.sum(f"{n}_delta").alias(f"{n}_total") for n in CHURN_COUNTERS],
        F.sum("dt_s").alias("_churn_s"),
        F.max("clients").alias("clients_peak"),
    )
    for n in CHURN_COUNTERS:
        c = c.withColumn(f"{n}_per_s_mean", F.when(F.col("_churn_s") > 0, F.col(f"{n}_total") / F.col("_churn_s")))
    la = lat.groupBy("node").agg(
        F.sum("count").alias("latency_samples"),
        F.avg("p50_ms").alias("latency_p50_ms_mean"),
        F.avg("p99_ms").alias("latency_p99_ms_mean"),
        F.max("p99_ms").alias("latency_p99_ms_max"),
        F.max("max_ms").alias("latency_max_ms"),
    )
    m = _node_rss(mem_df).groupBy("node").agg(
        (F.max("rss") / 2**20).alias("rss_mb_peak"),
        (F.max_by("rss", "ts") / 2**20).alias("rss_mb_last"),
    )
    lk = leaks.groupBy("node").agg(F.sum(F.col("leak").cast("int")).alias("leaks"))
    return (
        t.join(c.drop("_churn_s"), "node", "left")
        .join(la, "node", "left")
        .join(m, "node", "left")
        .join(lk, "node", "left")
        .withColumn("duration_s", (F.col("last") - F.col("first")) / 1000.0)
        .orderBy("node")
    )


def fleet(df: DataFrame, tp: DataFrame, lat: DataFrame, mem_df: DataFrame) -> DataFrame:
    """The fleet as one broker, per time bucket (the longest diag_interval, at least 1 s):
    rates summed over nodes (each node's mean in the bucket), worst p99 and max latency of
    any node, total RSS of all nodes, and how many nodes reported."""
    width = df.agg((F.greatest(F.max("interval_ms"), F.lit(1000.0)) / 1000.0).alias("_w"))

    def bucketed(t):
        return t.crossJoin(F.broadcast(width)).withColumn("_bucket", F.floor(F.col("t_s") / F.col("_w")))

    per_node = bucketed(tp).groupBy("_bucket", "node").agg(
        F.min("ts").alias("ts"), F.first("_w").alias("_w"),
        *[F.avg(f"{c}_per_s").alias(f"{c}_per_s") for c in NODE_RATES],
    )
    rates = per_node.groupBy("_bucket").agg(
        F.min("ts").alias("ts"), F.first("_w").alias("_w"), F.count("node").alias("nodes"),
        *[F.sum(f"{c}_per_s").alias(f"{c}_per_s") for c in NODE_RATES],
    )
    la = bucketed(lat).groupBy("_bucket").agg(
        F.max("p99_ms").alias("p99_ms_max"), F.max("max_ms").alias("max_ms"),
        # count-weighted mean of the nodes' medians: an estimate, percentiles do not add up
        (F.sum(F.col("p50_ms") * F.col("count")) / F.sum(F.when(F.col("p50_ms").isNotNull(), F.col("count"))))
        .alias("p50_ms_mean"),
    )
    rss = (
        bucketed(_node_rss(mem_df)).groupBy("_bucket", "node").agg(F.avg("rss").alias("rss"))
        .groupBy("_bucket").agg((F.sum("rss") / 2**20).alias("rss_mb_total"))
    )
    out = rates.join(la, "_bucket", "left").join(rss, "_bucket", "left")
    return (
        out.withColumn("t_s", F.col("_bucket") * F.col("_w"))
        .withColumn("time", F.expr("timestamp_millis(cast(ts as bigint))"))
        .withColumnRenamed("_w", "bucket_s")
        .drop("_bucket")
    )


def compute_tables(df: DataFrame, **leak_args) -> dict[str, DataFrame]:
    """All per-interval tables, leak flags, and the per-node and fleet tables, keyed by name."""
    mem = memory(df)
    tp, ch, lat = throughput(df), churn(df), latency(df)
    leaks = leak_flags(mem, **leak_args)
    cl = cluster(df)
    return {
        "throughput": tp,
        "queue_depths": queue_depths(df),
        "writer_balance": writer_balance(df),
        "latency": lat,
        "churn": ch,
        "memory": mem,
        "leak_flags": leaks,
        "nodes": nodes(tp, ch, lat, mem, leaks),
        "fleet": fleet(df, tp, lat, mem),
        "cluster": cl,
        "cluster_nodes": cluster_nodes(cl),
    }


CLUSTER_COUNTERS = ["messages_in", "messages_out", "bytes_in", "bytes_out", "reconnects", "failed"]


def cluster(df: DataFrame) -> DataFrame:
    """Cluster mode (lines with a ``cluster`` section): traffic across nodes per interval, the
    NATS server, round trip, and the messages in the cluster's streams."""
    base = df.where(F.col("cluster").isNotNull()).select(
        *KEYS,
        "dt_s",
        F.col("cluster.server").alias("server"),
        F.col("cluster.connected").alias("connected"),
        F.col("cluster.rtt_ms").alias("rtt_ms"),
        F.coalesce(F.aggregate("cluster.streams", F.lit(0.0), lambda total, s: total + s["messages"]),
                   F.lit(0.0)).alias("stream_messages"),
        *[F.col(f"cluster.{c}").alias(c) for c in CLUSTER_COUNTERS],
    )
    return _counter_rates(base, CLUSTER_COUNTERS, ["run"])


def cluster_nodes(cl: DataFrame) -> DataFrame:
    """One row per node in cluster mode: its last NATS server, the share of intervals connected,
    round trip, messages and bytes across nodes (totals and time-weighted means), reconnects,
    ERRORs `cluster unavailable`, and the peak of messages in the cluster's streams."""
    t = cl.groupBy("node").agg(
        F.count("*").alias("intervals"),
        F.max_by("server", "ts").alias("server"),
        F.avg("connected").alias("connected_share"),
        F.avg("rtt_ms").alias("rtt_ms_mean"),
        F.max("rtt_ms").alias("rtt_ms_max"),
        F.sum("dt_s").alias("covered_s"),
        *[F.sum(f"{c}_delta").alias(f"{c}_total") for c in CLUSTER_COUNTERS],
        F.max("stream_messages").alias("stream_messages_peak"),
    )
    for c in CLUSTER_COUNTERS[:4]:
        t = t.withColumn(f"{c}_per_s_mean", F.when(F.col("covered_s") > 0, F.col(f"{c}_total") / F.col("covered_s")))
    return t.orderBy("node")


def _utc(ts_ms):
    """Epoch milliseconds as an ISO-8601 UTC string (independent of the session time zone)."""
    if ts_ms is None:
        return None
    t = _dt.datetime.fromtimestamp(ts_ms / 1000.0, _dt.timezone.utc)
    return t.isoformat(sep=" ", timespec="milliseconds").replace("+00:00", "Z")


def _one(df: DataFrame, *aggs) -> dict:
    # A global aggregate is a single small row: the only thing collected.
    row = df.agg(*aggs).first()
    return row.asDict() if row else {}


def summary(tables: Mapping[str, DataFrame]) -> dict:
    """Run-level figures from the tables of compute_tables() (missing tables are skipped).

    Mean rates are time-weighted: total delta / seconds covered, per node; for
    a fleet (several nodes) the fleet's mean rate is the sum of its nodes' mean
    rates and its peak the highest bucket of the fleet table.  Returns a plain
    dict (numbers, strings and a list of leaking processes).
    """
    out: dict = {}
    nd = tables.get("nodes")
    per_node = nd.collect() if nd is not None else []
    out["nodes"] = len(per_node) if nd is not None else None
    out["node_names"] = [r["node"] for r in per_node]

    def fleet_mean(total_col, covered_col):
        """Sum of the nodes' time-weighted means (None when no node has the counter)."""
        means = [r[total_col] / r[covered_col] for r in per_node
                 if r[total_col] is not None and r[covered_col]]
        return sum(means) if means else None

    fl = tables.get("fleet")
    fleet_peaks = {}
    if fl is not None and len(per_node) > 1:
        fleet_peaks = _one(fl, *[F.max(f"{c}_per_s").alias(c) for c in THROUGHPUT_COUNTERS],
                           F.max("rss_mb_total").alias("rss"))
        out["fleet_rss_mb_peak"] = fleet_peaks.pop("rss")
    tp = tables.get("throughput")
    if tp is not None:
        s = _one(
            tp,
            # size(collect_set) rather than countDistinct: one shuffle, not two
            F.size(F.collect_set("run")).alias("runs"),
            F.count("*").alias("intervals"),
            F.min("ts").alias("first"),
            F.max("ts").alias("last"),
            ((F.max("ts") - F.min("ts")) / 1000.0).alias("duration_s"),
            F.sum("dt_s").alias("covered_s"),
            *[F.sum(f"{c}_delta").alias(f"{c}_total") for c in THROUGHPUT_COUNTERS],
            *[F.max(f"{c}_per_s").alias(f"{c}_per_s_peak") for c in THROUGHPUT_COUNTERS],
        )
        runs = s.get("runs") or 0
        out.update(
            runs=runs,
            restarts=max(runs - max(len(per_node), 1), 0),  # every node's first run is no restart
            intervals=s.get("intervals") or 0,
            first=_utc(s.get("first")),
            last=_utc(s.get("last")),
            duration_s=s.get("duration_s"),
            covered_s=s.get("covered_s"),
        )
        covered = s.get("covered_s") or 0.0
        for c in THROUGHPUT_COUNTERS:
            total = s.get(f"{c}_total")
            out[f"{c}_total"] = total
            if per_node:
                out[f"{c}_per_s_mean"] = fleet_mean(f"{c}_total", "covered_s")
            else:
                out[f"{c}_per_s_mean"] = total / covered if total is not None and covered > 0 else None
            out[f"{c}_per_s_peak"] = fleet_peaks.get(c) if fleet_peaks else s.get(f"{c}_per_s_peak")

    ch = tables.get("churn")
    if ch is not None:
        s = _one(
            ch,
            F.sum("dt_s").alias("covered"),
            *[F.sum(f"{c}_delta").alias(f"{c}_total") for c in CHURN_COUNTERS],
            *[F.max(f"{c}_per_s").alias(f"{c}_per_s_peak") for c in CHURN_COUNTERS],
            F.max("clients").alias("clients_peak"),
        )
        for c in CHURN_COUNTERS:
            total, cov = s.get(f"{c}_total"), s.get("covered") or 0.0
            out[f"{c}_total"] = total
            if per_node:
                means = [r[f"{c}_per_s_mean"] for r in per_node if r[f"{c}_per_s_mean"] is not None]
                out[f"{c}_per_s_mean"] = sum(means) if means else None
            else:
                out[f"{c}_per_s_mean"] = total / cov if total is not None and cov > 0 else None
            out[f"{c}_per_s_peak"] = s.get(f"{c}_per_s_peak")
        out["clients_peak"] = s.get("clients_peak")

    q = tables.get("queue_depths")
    if q is not None:
        s = _one(q, F.max_by("destination", "depth").alias("dest"), F.max("depth").alias("depth"))
        out["queue_depth_max"] = s.get("depth")
        out["queue_depth_max_destination"] = s.get("dest")

    wb = tables.get("writer_balance")
    if wb is not None:
        s = _one(
            wb,
            F.size(F.collect_set("writer")).alias("writers"),
            F.avg("imbalance").alias("imb_mean"),
            F.max("imbalance").alias("imb_max"),
            F.avg("batch_fill").alias("fill_mean"),
        )
        # Whole-run balance: max/mean of each writer's total frames.
        # Whole-run balance per node (a fleet's nodes carry different loads): the worst node.
        per = wb.groupBy("node", "writer").agg(F.sum("frames_delta").alias("f"))
        per_node_balance = per.groupBy("node").agg((F.max("f") / F.avg("f")).alias("imb"))
        o = _one(per_node_balance, F.max("imb").alias("imb"))
        out.update(
            writers=s.get("writers"),
            writer_imbalance_mean=s.get("imb_mean"),
            writer_imbalance_max=s.get("imb_max"),
            writer_imbalance_overall=o.get("imb"),
            batch_fill_mean=s.get("fill_mean"),
        )

    lat = tables.get("latency")
    if lat is not None:
        s = _one(
            lat,
            F.sum("count").alias("n"),
            F.avg("p50_ms").alias("p50"),
            F.avg("p99_ms").alias("p99m"),
            F.max("p99_ms").alias("p99"),
            F.max("max_ms").alias("mx"),
        )
        out.update(
            latency_samples=s.get("n"),
            latency_p50_ms_mean=s.get("p50"),
            latency_p99_ms_mean=s.get("p99m"),
            latency_p99_ms_max=s.get("p99"),
            latency_max_ms=s.get("mx"),
        )

    mem = tables.get("memory")
    if mem is not None:
        s = _one(mem, F.max("rss_mb").alias("peak"), F.size(F.collect_set(F.struct("run", "role", "pid"))).alias("n"))
        out["processes"] = s.get("n")
        out["rss_mb_peak"] = s.get("peak")

    lf = tables.get("leak_flags")
    if lf is not None:
        rows = lf.where("leak").orderBy("node", "run_seq", "role", "pid").select("node", "role", "pid", "run_seq").collect()
        out["leaks"] = len(rows)
        fleet_names = len(per_node) > 1
        out["leaking_processes"] = [(f"{r.node}: " if fleet_names else "") + f"{r.role} (pid {r.pid}, run {r.run_seq})"
                                    for r in rows]
    return out
