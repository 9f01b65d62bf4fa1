"""Analysis of the broker with PySpark: diagnostic dumps offline (diag_dump), and the broker's
messages and live statistics in Structured Streaming.

Typical use (see scripts/diag_analysis.ipynb, docs/diag-schema.md and docs/analysis.md):

    df = load_dumps(spark, ["diag.jsonl*"])
    tables = compute_tables(df)          # or throughput(df), memory(df), ...
    summ = summary(tables)
    write_tables(tables, "out/")
    write_report("out/", summ, collect_for_report(tables))

    register(spark)                      # format "stomp": streaming source and sink
    spark.readStream.format("stomp").option("url", "stomp://127.0.0.1:61613") ...

Needs the optional dependencies pyspark, pandas and matplotlib. Names are imported on first use,
so that Spark's Python workers, which import only the streaming module, never load the report's
pandas and matplotlib.
"""

import importlib

_FROM = {
    "stompbroker.analysis.dumps": ("DUMP_SCHEMA", "SCHEMA_VERSION", "load_dumps"),
    "stompbroker.analysis.metrics": ("churn", "compute_tables", "fleet", "latency", "leak_flags", "memory", "nodes",
                                     "queue_depths", "summary", "throughput", "writer_balance"),
    "stompbroker.analysis.report": ("chart_bucket", "collect_for_report", "downsample", "main", "make_charts",
                                    "publish_report", "run", "summary_frame", "to_pandas", "write_report",
                                    "write_tables"),
    "stompbroker.analysis.streaming": ("register",),
}
_WHERE = {name: module for module, names in _FROM.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'stompbroker.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
