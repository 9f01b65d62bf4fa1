"""Tests for stompbroker.analysis (PySpark diag dump analysis) on a synthetic dump.

One local[2] SparkSession and one computed set of tables are shared by all tests.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import matplotlib  # noqa: F401  (the analysis extra: ./build.sh installs it)
import pandas  # noqa: F401
import pyspark  # noqa: F401

import diag_dump_fixture as fx  # noqa: E402  (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[2]
try:
    import stompbroker.analysis  # noqa: F401
except ImportError:  # source checkout without an installed package
    sys.path.insert(0, str(ROOT))

from pyspark.sql import SparkSession  # noqa: E402

from stompbroker.analysis import (  # noqa: E402
    collect_for_report,
    compute_tables,
    downsample,
    leak_flags,
    load_dumps,
    main,
    publish_report,
    summary,
    to_pandas,
    write_report,
)
from stompbroker.analysis import report as report_mod  # noqa: E402
from stompbroker.analysis.report import chart_bucket, parse_args  # noqa: E402

RATES = fx.RATES
# Short-lived test JVMs: C1-only JIT spends less CPU compiling code run only a few times.
FAST_JVM = "-XX:TieredStopAtLevel=1"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="session")
def spark():
    s = (
        SparkSession.builder.master("local[2]")
        .appName("stompbroker-analysis-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")  # tiny tables: as the CLI does
        .config("spark.driver.extraJavaOptions", FAST_JVM)
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def dump(tmp_path_factory):
    base = tmp_path_factory.mktemp("diag") / "diag.jsonl"
    fx.write_dump(base)
    return f"{base}*"  # the current file and the rotated one


@pytest.fixture(scope="session")
def loaded(spark, dump):
    df = load_dumps(spark, [dump]).cache()
    yield df
    df.unpersist()


@pytest.fixture(scope="session")
def tables(loaded):
    t = {k: v.cache() for k, v in compute_tables(loaded).items()}
    yield t
    for v in t.values():
        v.unpersist()


@pytest.fixture(scope="session")
def pdfs(tables):
    return {k: to_pandas(v) for k, v in tables.items()}


@pytest.fixture(scope="session")
def summ(tables):
    return summary(tables)


@pytest.fixture(scope="session")
def frames(tables):
    return collect_for_report(tables)


# ---------------------------------------------------------------- loading


def test_load_runs_restart_and_bad_lines(loaded):
    pdf = to_pandas(loaded.select("run", "run_seq", "restart", "first_in_run", "t_s", "dt_s"))
    # 2 x 30 good lines; the truncated last line and nothing else is dropped
    assert len(pdf) == 2 * fx.SAMPLES_PER_RUN
    assert sorted(pdf["run_seq"].unique()) == [0, 1]
    assert pdf.groupby("run_seq").size().tolist() == [fx.SAMPLES_PER_RUN] * 2
    assert pdf["restart"].sum() == 1 and pdf.loc[pdf["restart"], "run_seq"].tolist() == [1]
    assert pdf["first_in_run"].sum() == 2
    assert pdf["t_s"].min() == 0.0
    assert pdf["t_s"].max() == pytest.approx(fx.DURATION_S)
    # first line of a run covers broker start..ts; the others the real spacing, not interval_ms
    assert sorted(pdf["dt_s"].round(3).unique()) == [0.8, 1.0, 1.2]
    assert pdf["dt_s"].sum() == pytest.approx(fx.COVERED_S)


def test_duplicate_inputs_are_counted_once(spark, dump):
    plain = dump.rstrip("*")
    assert load_dumps(spark, [dump, plain, plain + ".1"]).count() == 2 * fx.SAMPLES_PER_RUN


# ---------------------------------------------------------------- per-interval tables


def test_throughput_rates_exact_and_never_negative(pdfs):
    tp = pdfs["throughput"]
    assert len(tp) == 2 * fx.SAMPLES_PER_RUN
    for c in fx.RATES:
        if c.startswith("connections"):
            continue
        assert tp[f"{c}_per_s"].notna().all()
        assert tp[f"{c}_per_s"].to_numpy() == pytest.approx([RATES[c]] * len(tp)), c
        assert (tp[f"{c}_delta"] >= 0).all()
    # the first interval after the restart counts from 0 at the new broker start
    first_b = tp[tp["restart"]].iloc[0]
    assert first_b["frames_in_delta"] == RATES["frames_in"] * 1.2


def test_churn(pdfs):
    ch = pdfs["churn"]
    assert ch["connections_opened_per_s"].to_numpy() == pytest.approx([10.0] * len(ch))
    assert ch["connections_closed_per_s"].to_numpy() == pytest.approx([5.0] * len(ch))
    assert ch["clients"].max() == 5 * fx.SAMPLES_PER_RUN


def test_queue_depths(pdfs):
    q = pdfs["queue_depths"]
    a = q[q["destination"] == "/queue/a"]
    assert a["depth"].max() == fx.MAX_DEPTH
    assert a["enqueued_per_s"].to_numpy() == pytest.approx([fx.QUEUE_IN] * len(a))
    assert a["dequeued_per_s"].to_numpy() == pytest.approx([fx.QUEUE_OUT] * len(a))
    assert (q[q["destination"] == "/queue/b"]["depth"] == 0).all()


def test_writer_balance(pdfs):
    wb = pdfs["writer_balance"]
    assert len(wb) == 3 * 2 * fx.SAMPLES_PER_RUN
    assert wb["imbalance"].to_numpy() == pytest.approx([fx.IMBALANCE] * len(wb))
    for i, share in enumerate(fx.WRITER_SHARES):
        w = wb[wb["writer"] == i]
        assert w["share"].to_numpy() == pytest.approx([share] * len(w))
        assert w["frames_per_s"].to_numpy() == pytest.approx([RATES["frames_out"] * share] * len(w))
        assert w["batch_fill"].to_numpy() == pytest.approx([fx.WRITER_FILL[i]] * len(w))
    assert (wb["frames_delta"] >= 0).all()


def test_latency(pdfs):
    lat = pdfs["latency"]
    assert lat["p99_ms"].max() == 12.0
    assert lat["max_ms"].max() == 20.0
    assert lat["p50_ms"].to_numpy() == pytest.approx([0.4] * len(lat))
    assert (lat["p99_ms"] == 1.5).sum() == len(lat) - 1
    assert lat["count"].sum() == RATES["messages_delivered"] * fx.COVERED_S


def test_memory_and_leak_flags(pdfs):
    mem = pdfs["memory"]
    assert len(mem) == 6 * 2 * fx.SAMPLES_PER_RUN
    assert (mem["cpu_percent"].dropna() >= 0).all()
    lf = pdfs["leak_flags"].set_index(["run_seq", "role"])
    assert len(lf) == 12
    flagged = sorted(lf.index[lf["leak"]].tolist())
    assert flagged == [(0, fx.LEAKING_ROLE), (1, fx.LEAKING_ROLE)]
    d = lf.loc[(0, "dispatcher")]
    assert d["slope_bytes_per_s"] > 40_000 and d["up_fraction"] == 1.0 and d["r2"] > 0.99
    # one jump: positive slope, only upward changes, but not steady -> no leak
    r = lf.loc[(0, "reader")]
    assert r["slope_bytes_per_s"] > 100_000 and r["up_fraction"] == 1.0 and r["r2"] < 0.8 and not r["leak"]
    s = lf.loc[(0, "supervisor")]  # flat, page noise up and down
    assert abs(s["slope_bytes_per_s"]) < 100 and s["up_fraction"] < 0.6 and not s["leak"]
    w = lf.loc[(0, "writer-0")]  # constant: no RSS change at all
    assert w["slope_bytes_per_s"] == 0 and math.isnan(w["up_fraction"]) and not w["leak"]


def test_leak_thresholds_are_parameters(tables):
    strict = to_pandas(leak_flags(tables["memory"], min_slope=100_000.0))
    assert not strict["leak"].any()
    loose = to_pandas(leak_flags(tables["memory"], min_r2=0.5))
    assert sorted(set(loose.loc[loose["leak"], "role"])) == ["dispatcher", "reader"]


def test_summary(summ):
    assert summ["runs"] == 2 and summ["restarts"] == 1
    assert summ["intervals"] == 60
    assert summ["duration_s"] == pytest.approx(fx.DURATION_S)
    assert summ["covered_s"] == pytest.approx(fx.COVERED_S)
    for c in ("frames_in", "frames_out", "bytes_in", "bytes_out", "messages_published", "messages_delivered"):
        assert summ[f"{c}_total"] == RATES[c] * fx.COVERED_S
        assert summ[f"{c}_per_s_mean"] == pytest.approx(RATES[c])
        assert summ[f"{c}_per_s_peak"] == pytest.approx(RATES[c])
    assert summ["connections_opened_total"] == 10 * fx.COVERED_S
    assert summ["queue_depth_max"] == fx.MAX_DEPTH
    assert summ["queue_depth_max_destination"] == "/queue/a"
    assert summ["writer_imbalance_overall"] == pytest.approx(fx.IMBALANCE)
    assert summ["writer_imbalance_max"] == pytest.approx(fx.IMBALANCE)
    assert summ["batch_fill_mean"] == pytest.approx(0.4)
    assert summ["latency_p99_ms_max"] == 12.0 and summ["latency_max_ms"] == 20.0
    assert summ["leaks"] == 2
    assert summ["leaking_processes"] == ["dispatcher (pid 1239, run 0)", "dispatcher (pid 2239, run 1)"]
    assert summ["first"].endswith("Z")


def test_counter_reset_inside_a_run_is_not_negative(spark, tmp_path):
    # A queue deleted and re-created mid-run: its counters drop back to 0.
    lines = []
    for k, enq in enumerate([10, 20, 30, 5, 15], start=1):
        line = fx.line(0, 3 * k)  # dt 3 s
        line["queues"] = [{"destination": "/queue/x", "depth": 0, "enqueued": enq, "dequeued": enq,
                           "unacked": 0, "consumers": 1}]
        lines.append(json.dumps(line))
    p = tmp_path / "reset.jsonl"
    p.write_text("\n".join(lines) + "\n")
    t = compute_tables(load_dumps(spark, str(p)))
    q = to_pandas(t["queue_depths"].orderBy("ts"))
    assert q["enqueued_delta"].tolist() == [10, 10, 10, 5, 10]


def test_sparse_lines_still_give_a_report(spark, tmp_path):
    # Readers must tolerate absent sections and ignore unknown fields.
    p = tmp_path / "sparse.jsonl"
    p.write_text("".join(
        json.dumps({"schema": 1, "ts": 5000.0 + 1000 * k, "interval_ms": 1000, "broker": {"start": 5000.0, "pid": 1},
                    "totals": {"frames_in": 10 * k}, "added_in_v2": {"x": 1}}) + "\n"
        for k in range(1, 13)
    ))
    df = load_dumps(spark, str(p)).cache()  # many small actions follow, as in run()
    t = compute_tables(df)
    s = summary(t)
    assert s["intervals"] == 12 and s["frames_in_per_s_mean"] == pytest.approx(10.0)
    assert s["frames_out_total"] is None and s["leaks"] == 0 and s["writers"] == 0
    text = write_report(tmp_path / "r", s, collect_for_report(t)).read_text()
    assert "| Frames in: total / mean / peak | 120 / 10.0/s / 10.0/s |" in text
    assert "| Frames out: total / mean / peak | n/a / n/a / n/a |" in text
    df.unpersist()


def test_fleet_per_node_and_fleet_wide(spark, tmp_path):
    # Two brokers, one directory each: "a" (two runs) and "b" (broker.node set, twice the rates).
    globs = fx.write_fleet(tmp_path / "fleet")
    df = load_dumps(spark, globs).cache()
    t = {k: v.cache() for k, v in compute_tables(df).items()}  # many small actions follow, as in run()
    s = summary(t)
    per = to_pandas(t["nodes"]).set_index("node")
    assert s["nodes"] == 2 and s["node_names"] == ["a", "b"]
    assert s["runs"] == 3 and s["restarts"] == 1  # b's first run is not a restart
    assert per.loc["a", "runs"] == 2 and per.loc["b", "runs"] == 1
    for c in ("messages_delivered", "frames_in", "bytes_out"):
        assert per.loc["a", f"{c}_per_s_mean"] == pytest.approx(RATES[c])
        assert per.loc["b", f"{c}_per_s_mean"] == pytest.approx(fx.FLEET_FACTOR * RATES[c])
        # the fleet as one broker: the nodes' rates add up, at the mean and at the peak
        assert s[f"{c}_per_s_mean"] == pytest.approx((1 + fx.FLEET_FACTOR) * RATES[c])
        assert s[f"{c}_per_s_peak"] == pytest.approx((1 + fx.FLEET_FACTOR) * RATES[c])
    assert per.loc["a", "latency_p99_ms_max"] == 12.0 and per.loc["b", "latency_p99_ms_max"] == 12.0
    assert s["latency_p99_ms_max"] == 12.0
    # memory: a node's RSS is all its processes; the fleet's peak is both nodes at one time
    assert per.loc["b", "rss_mb_peak"] > 6 * 24 and s["fleet_rss_mb_peak"] > per["rss_mb_peak"].max()
    assert s["leaking_processes"] == ["a: dispatcher (pid 1239, run 0)", "a: dispatcher (pid 2239, run 1)",
                                      "b: dispatcher (pid 1289, run 0)"]
    # run numbering is per node: b's only run is run 0
    runs = to_pandas(df.select("node", "run_seq").distinct()).sort_values(["node", "run_seq"])
    assert runs.values.tolist() == [["a", 0], ["a", 1], ["b", 0]]
    fl = to_pandas(t["fleet"])
    assert set(fl["nodes"]) == {1, 2} and fl["messages_delivered_per_s"].max() == pytest.approx(900.0)
    frames = collect_for_report(t)
    text = write_report(tmp_path / "r", s, frames).read_text()
    assert "## Fleet (2 nodes)" in text and "![fleet](charts/fleet.png)" in text
    assert "| b | 1 | 28.8 s | 200.0 | 600.0 | 600.0 |" in text
    assert "| fleet | 3 |" in text and "| 300.0 | 900.0 | 900.0 |" in text
    assert "| Nodes (brokers) | 2: a, b |" in text
    # writers are per node: b's writer 0 is not a's writer 0
    wt = frames["writer_totals"].set_index(["node", "writer"])
    assert len(wt) == 6 and wt.loc[("b", 0), "frames"] == fx.FLEET_FACTOR * wt.loc[("a", 0), "frames"] / 2
    assert wt["share"].tolist() == pytest.approx(list(fx.WRITER_SHARES) * 2)
    assert s["writer_imbalance_overall"] == pytest.approx(fx.IMBALANCE)
    assert "| b writer 0 |" in text
    assert (tmp_path / "r" / "charts" / "fleet.png").stat().st_size > 1000
    # cluster mode: node b's traffic across nodes (a ran alone: no row)
    cl = to_pandas(t["cluster_nodes"]).set_index("node")
    assert list(cl.index) == ["b"]
    for c, rate in fx.CLUSTER_RATES.items():
        assert cl.loc["b", f"{c}_per_s_mean"] == pytest.approx(rate, rel=0.01)
    assert cl.loc["b", "reconnects_total"] == 1 and cl.loc["b", "stream_messages_peak"] == fx.SAMPLES_PER_RUN
    assert cl.loc["b", "connected_share"] == pytest.approx(1 - 1 / fx.SAMPLES_PER_RUN)
    assert "## Cluster (1 node in cluster mode)" in text and "| b | nats://10.0.0.1:4222 |" in text
    for v in t.values():
        v.unpersist()
    df.unpersist()


def test_missing_local_input_is_reported_before_spark(tmp_path, capsys, monkeypatch):
    # No Spark session may be started for a mistyped path: one line, exit 2, at once.
    monkeypatch.setattr(report_mod, "_session", lambda *a, **k: pytest.fail("Spark was started"))
    monkeypatch.setattr(report_mod.SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "diag.jsonl").write_text("{}\n")
    args = [str(tmp_path / "d" / "diag.jsonl*"), str(tmp_path / "typo" / "diag.jsonl*"), "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stompbroker-diag-report: no such file: {tmp_path / 'typo' / 'diag.jsonl*'}"]
    # remote filesystems are Spark's to check
    assert report_mod.missing_inputs(["hdfs:///x/*", "s3a://b/k", f"file://{tmp_path}/nothing"]) == \
        [f"file://{tmp_path}/nothing"]


def test_downsample_bounds_chart_points(tables):
    tp = tables["throughput"]
    b = chart_bucket(tp, max_points=10)
    assert b == pytest.approx(fx.DURATION_S / 10)
    small = to_pandas(downsample(tp, b, (), ["frames_out_per_s"]))
    assert len(small) <= 2 * 11  # per run, at most one point per bucket
    assert small["frames_out_per_s"].to_numpy() == pytest.approx([300.0] * len(small))
    assert chart_bucket(tp) is None  # 60 intervals: plotted as is


# ---------------------------------------------------------------- report and CLI


def test_write_report_md_and_html(tmp_path, frames, summ):
    md = write_report(tmp_path / "md", summ, frames, fmt="md", inputs=["x"], leak_rule={"min_slope": 2048.0})
    text = md.read_text()
    assert md.name == "report.md"
    assert "![memory](charts/memory.png)" in text
    assert "fitted RSS slope >= 2048 B/s" in text  # the thresholds actually used
    html = write_report(tmp_path / "html", summ, frames, fmt="html", inputs=["x"])
    text = html.read_text()
    assert html.name == "report.html" and text.startswith("<!DOCTYPE html>")
    assert "<img src='charts/memory.png'" in text
    assert "18000 / 300.0/s / 300.0/s" in text and "12.00" in text
    for name in ("throughput", "queue_depths", "writer_balance", "latency", "churn", "memory"):
        assert (tmp_path / "html" / "charts" / f"{name}.png").stat().st_size > 1000
    assert json.loads((tmp_path / "md" / "summary.json").read_text())["leaks"] == 2


def test_report_goes_through_hadoop_for_remote_out(spark, frames, summ, tmp_path, monkeypatch):
    # Local paths and file:// URIs are written directly ...
    assert report_mod._local_dir(spark, str(tmp_path / "a")) == tmp_path / "a"
    assert report_mod._local_dir(spark, f"file://{tmp_path}/b") == tmp_path / "b"
    # ... anything else (hdfs://, s3a://) is rendered locally and copied with Hadoop's
    # FileSystem API; exercised here against the local filesystem.
    monkeypatch.setattr(report_mod, "_local_dir", lambda spark, out: None)
    out = f"file://{tmp_path}/remote"
    assert publish_report(spark, summ, frames, out, "md") == f"{out}/report.md"
    assert "300.0/s" in (tmp_path / "remote" / "report.md").read_text()
    assert (tmp_path / "remote" / "charts" / "memory.png").is_file()
    assert (tmp_path / "remote" / "summary.json").is_file()


def test_cli_arguments():
    a = parse_args(["a", "b*", "--out", "o", "--format", "html", "--conf", "spark.x=1", "--leak-min-r2", "0.5"])
    assert a.dumps == ["a", "b*"] and a.out == "o" and a.format == "html" and a.master is None
    assert a.conf == ["spark.x=1"] and a.leak_min_r2 == 0.5
    with pytest.raises(SystemExit):
        parse_args(["a", "--out", "o", "--conf", "no-equals-sign"])


def test_main_reports_missing_input(tmp_path, capsys, spark):
    assert main([str(tmp_path / "nothing-here.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "stompbroker-diag-report:" in capsys.readouterr().err


@pytest.mark.timeout(300)  # a fresh JVM; slow when the machine is busy
def test_cli_end_to_end(dump, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "stompbroker.analysis", dump, "--out", str(out), "--master", "local[2]",
         "--conf", f"spark.driver.extraJavaOptions={FAST_JVM}", "--conf", "spark.ui.showConsoleProgress=false"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"report: {out / 'report.md'}" in proc.stdout
    for table in ("throughput", "queue_depths", "writer_balance", "latency", "churn", "memory",
                  "leak_flags", "summary"):
        assert list((out / table / "parquet").glob("part-*.parquet")), table
        csvs = list((out / table / "csv").glob("part-*.csv"))
        assert csvs and csvs[0].read_text().count("\n") >= 2, table
    for name in ("throughput", "queue_depths", "writer_balance", "latency", "churn", "memory"):
        assert (out / "charts" / f"{name}.png").is_file()
    report = (out / "report.md").read_text()
    assert "| Frames out: total / mean / peak | 18000 / 300.0/s / 300.0/s |" in report
    assert "| Broker runs | 2 (1 restart(s)) |" in report
    assert "0.40 / 1.68 / 12.00 / 20.00 ms" in report
    assert "dispatcher (pid 1239, run 0), dispatcher (pid 2239, run 1)" in report
    assert "| 1.50 / 1.50 / 1.50 |" in report
    # the CSV tables hold the same figures
    tp_csv = next((out / "throughput" / "csv").glob("part-*.csv")).read_text().splitlines()
    header = tp_csv[0].split(",")
    col = header.index("frames_out_per_s")
    assert {float(r.split(",")[col]) for r in tp_csv[1:]} == {300.0}


@pytest.mark.timeout(300)  # a kernel plus a fresh JVM
def test_notebook_executes(dump, tmp_path, monkeypatch):
    import nbclient
    import nbformat
    nb = nbformat.read(ROOT / "scripts" / "diag_analysis.ipynb", as_version=4)
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    monkeypatch.setenv("STOMPBROKER_DUMP", dump)
    monkeypatch.setenv("STOMPBROKER_SPARK_MASTER", "local[2]")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", FAST_JVM)
    monkeypatch.setenv("STOMPBROKER_REPORT_OUT", str(tmp_path / "nb-out"))
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "scripts")}}
    )
    client.execute()
    text = "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )
    assert "frames in 100.0/s, frames out 300.0/s" in text
    assert "p99 max 12.00 ms" in text
    assert "suspected leaks: dispatcher (pid 1239, run 0), dispatcher (pid 2239, run 1)" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 6
    assert (tmp_path / "nb-out" / "report.md").is_file()
