"""Diagnostic dump report: Spark job entry point, table output and report rendering.

Run as any of:
    python -m stompbroker.analysis DUMPS... --out DIR [--master URL] [--format md|html]
    stompbroker-diag-report DUMPS... --out DIR
    spark-submit stompbroker/analysis/report.py DUMPS... --out DIR

Spark reads the dumps and computes every table; the driver only collects
small aggregated/downsampled tables to draw charts and write the report.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    # Executed as a file (spark-submit .../report.py): make the package importable
    # and keep this directory's module names (metrics, charts...) off the top level.
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if p not in ("", _here) and Path(p).resolve() != Path(_here)]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime as _dt  # noqa: E402
import glob  # noqa: E402
import html  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from urllib.parse import urlparse  # noqa: E402

from pyspark.errors import AnalysisException  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import DoubleType, StringType, StructField, StructType  # noqa: E402

from stompbroker.analysis import charts  # noqa: E402
from stompbroker.analysis.dumps import DUMP_SCHEMA, load_dumps, quiet_glob_warning  # noqa: E402
from stompbroker.analysis.metrics import (  # noqa: E402
    LEAK_MIN_R2,
    LEAK_MIN_SAMPLES,
    LEAK_MIN_SLOPE,
    LEAK_MIN_UP_FRACTION,
    THROUGHPUT_COUNTERS,
    compute_tables,
    summary,
)

CHART_MAX_POINTS = 2000
TOP_QUEUES = 8


# ---------------------------------------------------------------- Spark -> driver

def to_pandas(df: DataFrame):
    """Collect a *small* DataFrame into pandas (plain collect: no Arrow or
    pyspark-pandas version coupling)."""
    import pandas as pd

    rows = df.collect()
    return pd.DataFrame.from_records([r.asDict() for r in rows], columns=df.columns)


def chart_bucket(df: DataFrame, max_points: int = CHART_MAX_POINTS):
    """Seconds per chart point so a one-row-per-interval table (e.g. throughput)
    has at most ~max_points points, or None when it is small enough to plot as is."""
    s = df.agg(F.max("t_s").alias("span"), F.count("*").alias("n")).first()
    if not s or s["n"] is None or s["n"] <= max_points:
        return None
    return max(float(s["span"] or 0.0) / max_points, 1e-9)


def downsample(df: DataFrame, bucket_s, keys=(), peak_cols=()) -> DataFrame:
    """Average a per-interval table over time buckets of bucket_s seconds (per key).

    Done in Spark so a week of 1 s dumps never has to fit in the driver;
    peak_cols keep their maximum instead of the mean so spikes stay visible.
    """
    if not bucket_s:
        return df
    group = [*(c for c in ("node", "run", "run_seq") if c in df.columns), *keys, "_bucket"]
    aggs = []
    for name, kind in df.dtypes:
        if name in group or name in ("ts", "t_s", "time"):
            continue
        if kind in ("double", "float", "bigint", "int", "smallint"):
            aggs.append((F.max(name) if name in peak_cols else F.avg(name)).alias(name))
        else:
            aggs.append(F.first(name).alias(name))
    out = (
        df.withColumn("_bucket", F.floor(F.col("t_s") / bucket_s))
        .groupBy(*group)
        .agg(F.min("ts").alias("ts"), F.min("time").alias("time"), F.min("t_s").alias("t_s"), *aggs)
    )
    return out.drop("_bucket")


def collect_for_report(tables: dict[str, DataFrame], max_points: int = CHART_MAX_POINTS) -> dict:
    """The small pandas frames the charts and report need (queues: top N only)."""
    q = tables["queue_depths"]
    top = (
        q.groupBy("destination")
        .agg(
            F.max("depth").alias("max_depth"),
            F.avg("depth").alias("mean_depth"),
            F.max_by("depth", "ts").alias("last_depth"),
            F.sum("enqueued_delta").alias("enqueued"),
            F.sum("dequeued_delta").alias("dequeued"),
            F.max("consumers").alias("max_consumers"),
        )
        .orderBy(F.desc("max_depth"), "destination")
        .limit(20)
    )
    top_pdf = to_pandas(top)
    chart_dests = list(top_pdf["destination"][:TOP_QUEUES])
    wb = tables["writer_balance"]
    writers = wb.groupBy("node", "writer").agg(
        F.sum("frames_delta").alias("frames"),
        F.sum("bytes_delta").alias("bytes"),
        F.sum("batches_delta").alias("batches"),
        F.avg("batch_fill").alias("mean_batch_fill"),
        F.max("pending_bytes").alias("max_pending_bytes"),
    ).orderBy("node", "writer")
    writers_pdf = to_pandas(writers)
    # share of its own node's frames
    totals = writers_pdf.groupby("node")["frames"].transform("sum") if len(writers_pdf) else 0
    writers_pdf["share"] = (writers_pdf["frames"] / totals).where(totals > 0) if len(writers_pdf) else float("nan")
    b = chart_bucket(tables["throughput"], max_points)
    return {
        "throughput": to_pandas(downsample(tables["throughput"], b, (),
                                           [f"{c}_per_s" for c in THROUGHPUT_COUNTERS])),
        "queue_depths": to_pandas(downsample(q.where(F.col("destination").isin(chart_dests)), b,
                                             ("destination",), ("depth",))),
        "queue_top": top_pdf,
        "writer_balance": to_pandas(downsample(wb, b, ("writer",), ("imbalance",))),
        "writer_totals": writers_pdf,
        "latency": to_pandas(downsample(tables["latency"], b, (), ("p90_ms", "p99_ms", "p999_ms", "max_ms"))),
        "churn": to_pandas(downsample(tables["churn"], b)),
        "nodes": to_pandas(tables["nodes"]) if "nodes" in tables else None,
        "cluster_nodes": to_pandas(tables["cluster_nodes"]) if "cluster_nodes" in tables else None,
        "memory": to_pandas(downsample(tables["memory"], b, ("role", "pid"), ("rss", "rss_mb"))),
        "leak_flags": to_pandas(tables["leak_flags"].orderBy("node", "run_seq", "role", "pid")),
    }


# ---------------------------------------------------------------- table output

def summary_frame(spark: SparkSession, summ: dict) -> DataFrame:
    """The summary dict as a (metric, value, text) table: numbers in value, the rest in text."""
    rows = []
    for k, v in summ.items():
        if isinstance(v, (list, tuple)):
            rows.append((k, float(len(v)), "; ".join(map(str, v))))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            rows.append((k, float(v), None))
        else:
            rows.append((k, None, None if v is None else str(v)))
    schema = StructType(
        [StructField("metric", StringType()), StructField("value", DoubleType()), StructField("text", StringType())]
    )
    return spark.createDataFrame(rows, schema)


def write_tables(tables: dict[str, DataFrame], out: str) -> list[str]:
    """Write each table as <out>/<name>/parquet and <out>/<name>/csv (one part file each:
    the tables are per-interval, i.e. small)."""
    written = []
    for name, df in tables.items():
        # sorted for readable CSVs (the summary keeps its own, meaningful order)
        keys = [c for c in ("run_seq", "ts", "destination", "writer", "role", "pid") if c in df.columns]
        one = df.coalesce(1).sortWithinPartitions(*keys) if keys else df.coalesce(1)
        base = f"{out.rstrip('/')}/{name}"
        one.write.mode("overwrite").parquet(f"{base}/parquet")
        one.write.mode("overwrite").option("header", True).csv(f"{base}/csv")
        written.append(base)
    return written


# ---------------------------------------------------------------- report

def _num(v, digits=1, unit=""):
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and digits == 0):
        return f"{int(v)}{unit}"
    return f"{v:.{digits}f}{unit}"


def _bytes(v):
    if v is None or (isinstance(v, float) and v != v):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.1f} {unit}" if unit != "B" else f"{int(v)} B"
        v /= 1024.0


def _summary_rows(s: dict):
    g = s.get
    rows = [
        *([("Nodes (brokers)", f"{g('nodes')}: {', '.join(g('node_names') or [])}")] if (g("nodes") or 0) > 1 else []),
        ("Broker runs", f"{g('runs', 0)} ({g('restarts', 0)} restart(s))"),
        ("First / last interval", f"{g('first')} / {g('last')}"),
        ("Duration", _num(g("duration_s"), 1, " s")),
        ("Intervals", _num(g("intervals"))),
    ]
    for c in THROUGHPUT_COUNTERS:
        label = c.replace("_", " ")
        rows.append((f"{label.capitalize()}: total / mean / peak",
                     f"{_num(g(c + '_total'), 0)} / {_num(g(c + '_per_s_mean'), 1, '/s')} / {_num(g(c + '_per_s_peak'), 1, '/s')}"))
    rows += [
        ("Connections opened / closed",
         f"{_num(g('connections_opened_total'), 0)} / {_num(g('connections_closed_total'), 0)}"
         f" (mean {_num(g('connections_opened_per_s_mean'), 2, '/s')} / {_num(g('connections_closed_per_s_mean'), 2, '/s')})"),
        ("Peak clients", _num(g("clients_peak"))),
        ("Deepest queue", f"{_num(g('queue_depth_max'))} ({g('queue_depth_max_destination') or 'n/a'})"),
        ("Writers", _num(g("writers"))),
        ("Writer imbalance (max/mean): overall / mean / worst interval",
         f"{_num(g('writer_imbalance_overall'), 2)} / {_num(g('writer_imbalance_mean'), 2)}"
         f" / {_num(g('writer_imbalance_max'), 2)}"),
        ("Mean batch fill", _num(g("batch_fill_mean"), 3)),
        ("Latency p50 mean / p99 mean / p99 max / max",
         f"{_num(g('latency_p50_ms_mean'), 2)} / {_num(g('latency_p99_ms_mean'), 2)}"
         f" / {_num(g('latency_p99_ms_max'), 2)} / {_num(g('latency_max_ms'), 2)} ms"),
        ("Peak RSS (any process)", _num(g("rss_mb_peak"), 1, " MiB")),
        ("Suspected leaks", ", ".join(g("leaking_processes") or []) or "none"),
    ]
    return rows


def _blocks(summ: dict, frames: dict, images: dict, inputs, leak_rule=None) -> list:
    """Report content as (kind, payload) blocks rendered to Markdown or HTML."""
    rule = {"min_samples": LEAK_MIN_SAMPLES, "min_slope": LEAK_MIN_SLOPE,
            "min_up_fraction": LEAK_MIN_UP_FRACTION, "min_r2": LEAK_MIN_R2, **(leak_rule or {})}
    b = [("h1", "stompbroker diagnostics report"),
         ("p", f"Inputs: {', '.join(map(str, inputs)) or 'n/a'}. "
               f"Generated {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} UTC."),
         ("h2", "Summary"),
         ("table", (["Figure", "Value"], _summary_rows(summ)))]

    b += [("h2", "Throughput"), ("img", images["throughput"]),
          ("p", "Rates are deltas of cumulative counters divided by the time between lines of the same "
                "broker run; a restart starts a new run (never a negative rate).")]
    b.append(("table", (["Counter", "Total", "Mean /s", "Peak /s"],
                        [(c, _num(summ.get(c + "_total"), 0), _num(summ.get(c + "_per_s_mean")),
                          _num(summ.get(c + "_per_s_peak"))) for c in THROUGHPUT_COUNTERS])))

    qt = frames["queue_top"]
    b += [("h2", "Queue depth"), ("img", images["queue_depths"])]
    b.append(("table", (["Destination", "Max depth", "Mean depth", "Last depth", "Enqueued", "Dequeued",
                         "Max consumers"],
                        [(r.destination, _num(r.max_depth), _num(r.mean_depth), _num(r.last_depth),
                          _num(r.enqueued), _num(r.dequeued), _num(r.max_consumers))
                         for r in qt.itertuples()])) if len(qt) else ("p", "No queues reported."))

    wt = frames["writer_totals"]
    b += [("h2", "Writer balance"), ("img", images["writer_balance"]),
          ("p", f"Imbalance is max/mean of frames per writer (1.00 = perfect). Overall "
                f"{_num(summ.get('writer_imbalance_overall'), 2)}, mean per interval "
                f"{_num(summ.get('writer_imbalance_mean'), 2)}, worst interval "
                f"{_num(summ.get('writer_imbalance_max'), 2)}.")]
    if len(wt):
        b.append(("table", (["Writer", "Frames", "Share", "Bytes", "Batches", "Mean batch fill", "Max pending"],
                            [((f"{r.node} " if _is_fleet(frames) else "") + f"writer {r.writer}", _num(r.frames), _num(r.share, 3), _bytes(r.bytes),
                              _num(r.batches), _num(r.mean_batch_fill, 3), _bytes(r.max_pending_bytes))
                             for r in wt.itertuples()])))

    b += [("h2", "Latency"), ("img", images["latency"]),
          ("p", f"p50 mean {_num(summ.get('latency_p50_ms_mean'), 2)} ms, p99 mean "
                f"{_num(summ.get('latency_p99_ms_mean'), 2)} ms, p99 max {_num(summ.get('latency_p99_ms_max'), 2)} ms, "
                f"max {_num(summ.get('latency_max_ms'), 2)} ms over {_num(summ.get('latency_samples'))} deliveries.")]

    b += [("h2", "Connection churn"), ("img", images["churn"]),
          ("p", f"Opened {_num(summ.get('connections_opened_total'), 0)} "
                f"(mean {_num(summ.get('connections_opened_per_s_mean'), 2, '/s')}), closed "
                f"{_num(summ.get('connections_closed_total'), 0)} "
                f"(mean {_num(summ.get('connections_closed_per_s_mean'), 2, '/s')}), peak clients "
                f"{_num(summ.get('clients_peak'))}.")]

    if _is_fleet(frames):
        b += _fleet_blocks(summ, frames["nodes"], images["fleet"])
    if frames.get("cluster_nodes") is not None and len(frames["cluster_nodes"]):
        b += _cluster_blocks(frames["cluster_nodes"])

    lf = frames["leak_flags"]
    b += [("h2", "Memory"), ("img", images["memory"]),
          ("p", f"Leak rule: at least {rule['min_samples']} samples, fitted RSS slope >= "
                f"{rule['min_slope']:.0f} B/s, >= {rule['min_up_fraction']:.0%} of RSS changes upwards and "
                f"linear-fit r2 >= {rule['min_r2']} (see docs/diag-schema.md).")]
    if len(lf):
        b.append(("table", (["Node", "Run", "Process", "PID", "Samples", "First RSS", "Last RSS", "Peak RSS",
                             "Slope (MiB/h)", "Up fraction", "r2", "Leak?"],
                            [(r.node, _num(r.run_seq), r.role, _num(r.pid), _num(r.samples), _bytes(r.first_rss),
                              _bytes(r.last_rss), _bytes(r.peak_rss), _num(r.slope_mib_per_hour, 2),
                              _num(r.up_fraction, 2), _num(r.r2, 3), "LEAK?" if r.leak else "no")
                             for r in lf.itertuples()])))
    return b


def _fleet_blocks(summ: dict, nodes, image) -> list:
    """Per-node figures and the fleet as a whole (rates summed, worst latency, summed memory)."""
    head = ["Node", "Runs", "Duration", "Published /s", "Delivered /s", "Peak delivered /s", "Bytes out /s",
            "p50 mean", "p99 max", "Max latency", "Peak RSS (all processes)", "Leaks"]
    rows = [(r.node, _num(r.runs), _num(r.duration_s, 1, " s"), _num(r.messages_published_per_s_mean),
             _num(r.messages_delivered_per_s_mean), _num(r.messages_delivered_per_s_peak),
             _bytes(r.bytes_out_per_s_mean), _num(r.latency_p50_ms_mean, 2, " ms"),
             _num(r.latency_p99_ms_max, 2, " ms"), _num(r.latency_max_ms, 2, " ms"),
             _bytes(None if r.rss_mb_peak != r.rss_mb_peak else r.rss_mb_peak * 2**20), _num(r.leaks))
            for r in nodes.itertuples()]
    g = summ.get
    rows.append(("fleet", _num(g("runs")), _num(g("duration_s"), 1, " s"), _num(g("messages_published_per_s_mean")),
                 _num(g("messages_delivered_per_s_mean")), _num(g("messages_delivered_per_s_peak")),
                 _bytes(g("bytes_out_per_s_mean")), _num(g("latency_p50_ms_mean"), 2, " ms"),
                 _num(g("latency_p99_ms_max"), 2, " ms"), _num(g("latency_max_ms"), 2, " ms"),
                 _bytes(None if g("fleet_rss_mb_peak") is None else g("fleet_rss_mb_peak") * 2**20), _num(g("leaks"))))
    return [("h2", f"Fleet ({len(nodes)} nodes)"), ("img", image),
            ("p", "One row per broker (node), then the fleet as one broker: mean rates are the sum of the "
                  "nodes' time-weighted means, the peak is the highest fleet-wide interval (nodes' rates "
                  "summed per time bucket), latency is the worst of any node, and memory is the highest "
                  "total RSS of all nodes' processes at one time. Bytes are per second."),
            ("table", (head, rows))]


def _cluster_blocks(cl) -> list:
    """Cluster mode, per node: its NATS server and the traffic across nodes (docs/cluster.md)."""
    head = ["Node", "NATS server (last)", "Connected", "RTT mean", "RTT max", "Messages in /s", "Messages out /s",
            "Messages in", "Messages out", "Bytes in /s", "Bytes out /s", "Reconnects", "Unavailable ERRORs",
            "Peak stream messages"]
    rows = [(r.node, r.server or "-", _num(None if r.connected_share != r.connected_share else 100 * r.connected_share,
                                            1, " %"),
             _num(r.rtt_ms_mean, 2, " ms"), _num(r.rtt_ms_max, 2, " ms"), _num(r.messages_in_per_s_mean),
             _num(r.messages_out_per_s_mean), _num(r.messages_in_total, 0), _num(r.messages_out_total, 0),
             _bytes(r.bytes_in_per_s_mean), _bytes(r.bytes_out_per_s_mean), _num(r.reconnects_total, 0),
             _num(r.failed_total, 0), _num(r.stream_messages_peak, 0))
            for r in cl.itertuples()]
    return [("h2", f"Cluster ({len(cl)} node{'s' if len(cl) != 1 else ''} in cluster mode)"),
            ("p", "Traffic between the nodes through NATS, per node: messages a node received from others "
                  "(in) and published for them (out), its round trip to its NATS server, the share of "
                  "intervals it could reach NATS, and the most messages the cluster's JetStream streams "
                  "held at once as this node saw them."),
            ("table", (head, rows))]


def _md(blocks) -> str:
    out = []
    for kind, p in blocks:
        if kind == "h1":
            out.append(f"# {p}\n")
        elif kind == "h2":
            out.append(f"## {p}\n")
        elif kind == "p":
            out.append(f"{p}\n")
        elif kind == "img":
            out.append(f"![{Path(p).stem}]({p})\n")
        elif kind == "table":
            head, rows = p
            cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
            lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _html(blocks) -> str:
    e = html.escape
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>stompbroker diagnostics report</title>",
           "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}img{max-width:100%}</style>",
           "</head><body>"]
    for kind, p in blocks:
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{e(p)}</{kind}>")
        elif kind == "img":
            out.append(f"<img src='{e(p)}' alt='{e(Path(p).stem)}'>")
        elif kind == "table":
            head, rows = p
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in rows]
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def make_charts(frames: dict) -> dict:
    """name -> matplotlib Figure, from the frames of collect_for_report()."""
    return {
        "throughput": charts.plot_throughput(frames["throughput"]),
        "queue_depths": charts.plot_queue_depths(frames["queue_depths"], TOP_QUEUES),
        "writer_balance": charts.plot_writer_balance(frames["writer_balance"]),
        "latency": charts.plot_latency(frames["latency"]),
        "churn": charts.plot_churn(frames["churn"]),
        "memory": charts.plot_memory(frames["memory"], frames["leak_flags"]),
        **({"fleet": charts.plot_fleet(frames["throughput"], frames["latency"], frames["memory"])}
           if _is_fleet(frames) else {}),
    }


def _is_fleet(frames: dict) -> bool:
    nodes = frames.get("nodes")
    return nodes is not None and len(nodes) > 1


def write_report(out_dir, summ: dict, frames: dict, fmt: str = "md", inputs=(), leak_rule=None) -> Path:
    """Render charts (PNG, charts/*.png), report.md|report.html and summary.json into a
    local directory.  leak_rule: the leak_flags() thresholds used, for the text."""
    out_dir = Path(out_dir)
    (out_dir / "charts").mkdir(parents=True, exist_ok=True)
    images = {}
    for name, fig in make_charts(frames).items():
        rel = f"charts/{name}.png"
        fig.savefig(out_dir / rel, dpi=100)
        images[name] = rel
    blocks = _blocks(summ, frames, images, inputs, leak_rule)
    path = out_dir / ("report.html" if fmt == "html" else "report.md")
    path.write_text(_html(blocks) if fmt == "html" else _md(blocks), encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(summ, indent=2, default=str) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- output location

def _hadoop_fs(spark: SparkSession, out: str):
    """(FileSystem, Path) for out via the JVM, or None if unavailable (e.g. Spark Connect)."""
    try:
        jvm = spark.sparkContext._jvm
        p = jvm.org.apache.hadoop.fs.Path(out)
        return p.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), p
    except Exception:  # noqa: BLE001 -- any failure just means "use the local filesystem"
        return None


def _local_dir(spark: SparkSession, out: str):
    """Local path for out if it lives on the driver's filesystem, else None.

    A path without a scheme resolves against fs.defaultFS (HDFS on most
    clusters), exactly as Spark's own writers resolve it.
    """
    fs = _hadoop_fs(spark, out)
    if fs is not None:
        if fs[0].getUri().getScheme() != "file":
            return None
        return Path(fs[0].makeQualified(fs[1]).toUri().getPath())
    u = urlparse(out)
    return Path(u.path if u.scheme == "file" else out) if u.scheme in ("", "file") else None


def publish_report(spark: SparkSession, summ: dict, frames: dict, out: str, fmt: str = "md", inputs=(),
                   leak_rule=None) -> str:
    """Write the report next to the tables, copying through Hadoop if out is remote."""
    local = _local_dir(spark, out)
    if local is not None:
        return str(write_report(local, summ, frames, fmt, inputs, leak_rule))
    tmp = Path(tempfile.mkdtemp(prefix="stompbroker-report-"))
    try:
        path = write_report(tmp, summ, frames, fmt, inputs, leak_rule)
        fs, base = _hadoop_fs(spark, out)
        jvm = spark.sparkContext._jvm
        for f in [*sorted((tmp / "charts").iterdir()), tmp / "summary.json", path]:
            rel = f.relative_to(tmp).as_posix()
            fs.copyFromLocalFile(False, True, jvm.org.apache.hadoop.fs.Path(str(f)),
                                 jvm.org.apache.hadoop.fs.Path(base, rel))
        return f"{out.rstrip('/')}/{path.name}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- CLI

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="stompbroker-diag-report",
        description="Analyse stompbroker diag_dump files with Spark: tables (Parquet+CSV) and a report.",
    )
    ap.add_argument("dumps", nargs="+", help="dump files, globs or directories (any Spark path; "
                                             "use 'diag.jsonl*' to include rotated files; one directory "
                                             "per broker for a fleet)")
    ap.add_argument("--out", required=True, help="output directory (local, hdfs://, s3a://, ...)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--master", default=None,
                       help="Spark master URL: local[*], spark://HOST:7077, yarn, k8s://... "
                            "(default: spark-submit's --master, else local[*])")
    where.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                       help="run on a Spark Connect server instead (paths are resolved by the server)")
    ap.add_argument("--format", choices=("md", "html"), default="md", help="report format (default md)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", type=_conf_pair,
                    help="extra Spark setting for the session this command creates (repeatable)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--leak-min-slope", type=float, default=LEAK_MIN_SLOPE,
                    help=f"leak rule: minimum RSS slope in bytes/s (default {LEAK_MIN_SLOPE:.0f})")
    ap.add_argument("--leak-min-up-fraction", type=float, default=LEAK_MIN_UP_FRACTION,
                    help=f"leak rule: minimum share of upward RSS changes (default {LEAK_MIN_UP_FRACTION})")
    ap.add_argument("--leak-min-r2", type=float, default=LEAK_MIN_R2,
                    help=f"leak rule: minimum r2 of the linear fit (default {LEAK_MIN_R2})")
    ap.add_argument("--leak-min-samples", type=int, default=LEAK_MIN_SAMPLES,
                    help=f"leak rule: minimum samples per process (default {LEAK_MIN_SAMPLES})")
    return ap.parse_args(argv)


def _conf_pair(text: str) -> str:
    if "=" not in text.strip("="):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _is_local_path(path: str) -> bool:
    """A path this machine can check: file:..., or no scheme while no Hadoop configuration
    could send it to another default filesystem (HDFS)."""
    scheme = urlparse(path).scheme
    if scheme == "file":
        return True
    return scheme == "" and not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR"))


def missing_inputs(dumps) -> list[str]:
    """The local dump paths that match no file (checked before paying for Spark's start-up).

    Remote paths (hdfs://, s3a://...) and Spark-only glob syntax ({a,b}) are left to Spark."""
    missing = []
    for d in dumps:
        if not _is_local_path(d) or "{" in d:
            continue
        local = urlparse(d).path if d.startswith("file:") else d
        if not glob.glob(local):
            missing.append(d)
    return missing


def _progress(enabled: bool):
    start = time.monotonic()

    def say(text: str) -> None:
        if enabled:
            print(f"[{time.monotonic() - start:6.1f} s] {text}", file=sys.stderr, flush=True)
    return say


_LOG4J = Path(__file__).with_name("log4j2.properties")


def _session(master=None, conf=(), remote=None, app="stompbroker-diag-report"):
    builder = SparkSession.builder.appName(app)
    given = {}
    for pair in conf:
        key, value = pair.split("=", 1)
        given[key.strip()] = value.strip()
    if remote:
        builder = builder.remote(remote)
    else:
        # Our progress lines replace Spark's console progress bar and start-up chatter.
        given.setdefault("spark.ui.showConsoleProgress", "false")
        if _LOG4J.is_file() and not os.environ.get("PYSPARK_GATEWAY_PORT"):
            opts = given.get("spark.driver.extraJavaOptions", "")
            given["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={_LOG4J.as_uri()} {opts}".strip()
        if (master or "local").startswith("local") and not os.environ.get("PYSPARK_GATEWAY_PORT"):
            # Embedded Spark needs only loopback (and then need not warn about the host name).
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if master:
            builder = builder.master(master)
        elif not os.environ.get("PYSPARK_GATEWAY_PORT") and "--master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
            # Plain `python -m`: no spark-submit supplied a master.
            builder = builder.master("local[*]")
    for key, value in given.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def is_connect(spark) -> bool:
    """True for a Spark Connect session (no JVM or SparkContext on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


@contextlib.contextmanager
def small_table_settings(spark: SparkSession, dumps, keep=()):
    """Session settings suited to this job, restored afterwards; settings given at
    launch (--conf / spark-defaults; keep: keys the caller set) are left alone.

    The per-interval tables are small (a day at 1 s is 86,400 lines), so:
    * shuffle partitions sized from the number of input splits (a file listing,
      no data read) instead of 200 tiny tasks per window/aggregate stage;
    * adaptive execution off: its per-stage re-planning costs more than it saves
      here, as our joins are explicit broadcasts of tiny tables and the
      partition count is already sized.
    """
    connect = is_connect(spark)
    launch = None if connect else spark.sparkContext.getConf()

    def given(key):
        return key in keep or (launch is not None and launch.contains(key))

    wanted = {}
    if not given("spark.sql.shuffle.partitions"):
        quiet_glob_warning(spark)
        reader = spark.read.schema(DUMP_SCHEMA).json(list(dumps))
        # Connect has no RDD API: one split per file is close enough for dump files.
        splits = len(reader.inputFiles()) if connect else reader.rdd.getNumPartitions()
        wanted["spark.sql.shuffle.partitions"] = str(min(200, max(2, 2 * splits)))
    if not given("spark.sql.adaptive.enabled"):
        wanted["spark.sql.adaptive.enabled"] = "false"
    previous = {k: spark.conf.get(k) for k in wanted}
    for k, v in wanted.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in previous.items():
            spark.conf.set(k, v)


def run(spark: SparkSession, dumps, out: str, fmt: str = "md", progress=None, keep_conf=(),
        **leak_args) -> tuple[dict, str]:
    """The whole job: load, compute, write tables and report.  Returns (summary, report path).

    progress: a callable given one line of text per step (None: silent).
    leak_args are passed to leak_flags() (min_samples, min_slope, ...).
    """
    say = progress or (lambda text: None)
    dumps = [dumps] if isinstance(dumps, str) else list(dumps)
    if is_connect(spark):
        # The server resolves paths: relative ones would be relative to *its* directory.
        dumps = [os.path.abspath(d) if _is_local_path(d) and not d.startswith("file:") else d for d in dumps]
        out = os.path.abspath(out) if _is_local_path(out) and not out.startswith("file:") else out
        if _local_dir(spark, out) is None:
            raise ValueError("with --remote, --out must be a path the client can write too "
                             "(the report is rendered here): a local or shared-storage directory")
    with small_table_settings(spark, dumps, keep_conf):
        say(f"reading {', '.join(dumps)}")
        df = load_dumps(spark, dumps).cache()
        tables = {}
        try:
            counts = df.agg(F.count("*").alias("lines"), F.size(F.collect_set("node")).alias("nodes"),
                            F.size(F.collect_set("run")).alias("runs")).first()
            if not counts or not counts["lines"]:
                raise ValueError(f"no diagnostic lines (schema >= 1) found in {', '.join(dumps)}")
            say(f"{counts['lines']} lines from {counts['nodes']} node(s), {counts['runs']} broker run(s); "
                "computing tables")
            tables = {k: v.cache() for k, v in compute_tables(df, **leak_args).items()}
            summ = summary(tables)
            say(f"writing tables to {out}")
            write_tables({**tables, "summary": summary_frame(spark, summ)}, out)
            say("collecting chart data and rendering the report")
            frames = collect_for_report(tables)
            path = publish_report(spark, summ, frames, out, fmt, dumps, leak_args)
        finally:
            for t in tables.values():
                t.unpersist()
            df.unpersist()
    return summ, path


def _where(args) -> str:
    if args.remote:
        return f"Spark Connect {args.remote}"
    if args.master:
        return args.master
    return "spark-submit's master" if os.environ.get("PYSPARK_GATEWAY_PORT") else "local[*]"


def main(argv=None) -> int:
    args = parse_args(argv)
    # pyspark warns about pandas versions at session start; this job only uses
    # plain pandas on collected rows, never pyspark's pandas conversion.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    # Called in-process (tests, notebook): reuse the caller's session; --master/--conf are then moot.
    existing = SparkSession.getActiveSession()
    if existing is None and not args.remote:
        missing = missing_inputs(args.dumps)
        if missing:
            print(f"stompbroker-diag-report: no such file: {', '.join(missing)}", file=sys.stderr)
            return 2
    say = _progress(not args.quiet)
    if existing is None:
        say(f"starting Spark ({_where(args)})")
    try:
        spark = existing or _session(args.master, args.conf, args.remote)
    except Exception as exc:  # noqa: BLE001 -- no Java, unreachable master or Connect server...
        print(f"stompbroker-diag-report: cannot start Spark ({_where(args)}): "
              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}", file=sys.stderr)
        return 2
    if existing is None and not is_connect(spark):
        spark.sparkContext.setLogLevel("WARN")
    try:
        summ, path = run(
            spark, args.dumps, args.out, args.format, progress=say,
            keep_conf=[p.split("=", 1)[0].strip() for p in args.conf],
            min_samples=args.leak_min_samples, min_slope=args.leak_min_slope,
            min_up_fraction=args.leak_min_up_fraction, min_r2=args.leak_min_r2,
        )
    except (ValueError, AnalysisException) as exc:  # no data, missing path
        print(f"stompbroker-diag-report: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        if existing is None:  # leave a caller's (test, notebook) session running
            spark.stop()
    say("done")
    print(f"report: {path}")
    print(f"tables: {args.out.rstrip('/')}/<table>/{{parquet,csv}}")
    for k in ("nodes", "runs", "duration_s", "frames_out_per_s_mean", "latency_p99_ms_max", "leaking_processes"):
        print(f"  {k}: {summ.get(k)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
