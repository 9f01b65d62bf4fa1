"""Offline analysis of broker diagnostic dumps (diag_dump) with PySpark.

Typical use (see scripts/diag_analysis.ipynb and docs/diag-schema.md):

    df = load_dumps(spark, ["diag.jsonl*"])
    tables = compute_tables(df)          # or throughput(df), memory(df), ...
    summ = summary(tables)
    write_tables(tables, "out/")
    write_report("out/", summ, collect_for_report(tables))

Needs the optional dependencies pyspark, pandas and matplotlib.
"""

from stompbroker.analysis.dumps import DUMP_SCHEMA, SCHEMA_VERSION, load_dumps
from stompbroker.analysis.metrics import (
    churn,
    compute_tables,
    fleet,
    latency,
    leak_flags,
    memory,
    nodes,
    queue_depths,
    summary,
    throughput,
    writer_balance,
)
from stompbroker.analysis.report import (
    chart_bucket,
    collect_for_report,
    downsample,
    main,
    make_charts,
    publish_report,
    run,
    summary_frame,
    to_pandas,
    write_report,
    write_tables,
)

__all__ = [
    "DUMP_SCHEMA",
    "SCHEMA_VERSION",
    "chart_bucket",
    "churn",
    "collect_for_report",
    "compute_tables",
    "downsample",
    "fleet",
    "latency",
    "leak_flags",
    "load_dumps",
    "main",
    "make_charts",
    "memory",
    "nodes",
    "publish_report",
    "queue_depths",
    "run",
    "summary",
    "summary_frame",
    "throughput",
    "to_pandas",
    "write_report",
    "write_tables",
    "writer_balance",
]
