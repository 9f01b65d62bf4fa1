"""The analysis on a real Spark cluster: a standalone master and worker, and a Spark Connect server.

All started from the installed pyspark package's own scripts (its SPARK_HOME), on loopback ports,
once for this module, and always stopped afterwards. The dumps are a two-broker fleet on a path
the executors read themselves (the worker runs on this machine, so the local filesystem is the
shared storage a real cluster would have as NFS, HDFS or S3): no data goes through the driver.
Figures must equal those of an embedded local[*] run on the same dumps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark.find_spark_home import _find_spark_home  # the analysis extra: ./build.sh installs it

import diag_dump_fixture as fx  # (tests/ is on sys.path)
from conftest import ROOT

SPARK_HOME = _find_spark_home()
FAST_JVM = "-XX:TieredStopAtLevel=1"  # short-lived JVMs: less CPU spent compiling
START_TIMEOUT = 90  # seconds for a daemon to come up on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=SPARK_HOME,
        SPARK_LOCAL_IP="127.0.0.1",  # every daemon, UI and executor on loopback
        SPARK_CONF_DIR=str(tmp / "conf"),
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_PID_DIR=str(tmp / "pids"),
        SPARK_DAEMON_MEMORY="256m",
        SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
        JAVA_TOOL_OPTIONS=FAST_JVM,
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p),
        PYSPARK_PYTHON=sys.executable,  # the Python workers of the stomp source and sink need pyarrow and this package
    )
    return env


class Daemon:
    """A JVM started in its own session, its output in a log file; stop() ends the whole group."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path, ready: str):
        self.name, self.log, self.ready = name, log, ready
        self._out = open(log, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self) -> None:
        while time.monotonic() < self.started + START_TIMEOUT:
            if re.search(self.ready, self.log.read_text(errors="replace")):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        pytest.fail(f"{self.name} did not start within {START_TIMEOUT} s:\n"
                    f"{self.log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        self._out.close()


def _start_report(env, dumps, out: Path, *where: str):
    """Start stompbroker-diag-report (its stderr in a file beside out); finish with _finish_report."""
    cmd = [sys.executable, "-m", "stompbroker.analysis", *dumps, "--out", str(out), *where]
    err = open(f"{out}.stderr", "w+")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, text=True)
    return proc, out, time.monotonic(), err


def _finish_report(started) -> tuple[dict, float, str]:
    """Wait for a report: (summary.json, its own elapsed seconds from its last progress line, stderr)."""
    proc, out, start, err = started
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    err.seek(0)
    text = err.read()
    err.close()
    assert proc.returncode == 0, text[-4000:]
    done = re.findall(r"\[\s*([\d.]+) s\] done", text)
    assert done, text[-4000:]
    return json.loads((out / "summary.json").read_text()), float(done[-1]), text


@pytest.fixture(scope="module")
def fleet_dumps(tmp_path_factory):
    return fx.write_fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, fleet_dumps):
    """A standalone master and one worker (3 cores, 1.5 GiB for executors), a Spark Connect
    server on it (the package's sbin/start-connect-server.sh), and the local[*] reference
    report: all started side by side, which saves half a minute of JVM start-up."""
    tmp = tmp_path_factory.mktemp("spark-cluster")
    (tmp / "conf").mkdir()
    # No REST submission server (fixed port 6066) and no web UIs: nothing but the RPC ports.
    (tmp / "conf" / "spark-defaults.conf").write_text(
        "spark.master.rest.enabled false\nspark.ui.enabled false\nspark.ui.showConsoleProgress false\n"
        # three applications at once fit the worker: the Connect server's and two others
        "spark.executor.memory 512m\nspark.cores.max 1\n"
        # a Python worker may take long to start on a loaded machine
        "spark.python.authenticate.socketTimeout 120s\n")
    env = _env(tmp)
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    port, connect_port = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    local = _start_report(env, fleet_dumps, tmp / "local", "--master", "local[*]")
    daemons, runs = [], {}
    try:
        daemons.append(Daemon("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                         "--port", str(port), "--webui-port", str(_free_port())],
                              env, tmp / "master.log", r"Starting Spark master at spark://"))
        daemons.append(Daemon("worker", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                         "--port", str(_free_port()), "--webui-port", str(_free_port()),
                                         "--cores", "3", "--memory", "1536m", "--work-dir", str(tmp / "work"), url],
                              env, tmp / "worker.log", r"Successfully registered with master"))
        daemons.append(Daemon("connect server",
                              [os.path.join(SPARK_HOME, "sbin", "start-connect-server.sh"), "--wait", "--master", url,
                               "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                               "--conf", f"spark.connect.grpc.binding.port={connect_port}",
                               "--conf", f"spark.driver.extraJavaOptions={FAST_JVM}"],
                              # the server is the driver, run through spark-daemon.sh: its heap is the daemon's
                              {**env, "SPARK_DAEMON_MEMORY": "768m"}, tmp / "connect.log",
                              r"Spark Connect server started at"))
        for d in daemons:
            d.wait_ready()
        remote = f"sc://127.0.0.1:{connect_port}"
        # Both reports run on the cluster while the notebook test drives a third application.
        runs["standalone"] = _start_report(env, fleet_dumps, tmp / "standalone", "--master", url)
        runs["connect"] = _start_report(env, fleet_dumps, tmp / "connect", "--remote", remote)
        runs["local"] = local
        yield {"url": url, "remote": remote, "env": env, "tmp": tmp, "work": tmp / "work", "runs": runs}
    finally:
        for proc, *_ in [local, *runs.values()]:  # any a failed test left running
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for d in reversed(daemons):
            d.stop()


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float):
            assert b[k] == pytest.approx(a[k], rel=1e-9), k
        else:
            assert b[k] == a[k], k


@pytest.fixture(scope="module")
def local_run(cluster):
    return _finish_report(cluster["runs"]["local"])


@pytest.mark.timeout(400)
def test_notebook_on_standalone_cluster(cluster, fleet_dumps, request, monkeypatch):
    import nbclient
    import nbformat

    nb = nbformat.read(os.path.join(ROOT, "scripts", "diag_analysis.ipynb"), as_version=4)
    for k, v in cluster["env"].items():
        if k.startswith(("SPARK_", "JAVA_TOOL", "PYTHONPATH")):
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("STOMPBROKER_DUMP", ",".join(fleet_dumps))
    monkeypatch.setenv("STOMPBROKER_SPARK_MASTER", cluster["url"])
    monkeypatch.delenv("STOMPBROKER_REPORT_OUT", raising=False)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(ROOT, "scripts")}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stdout")
    local = request.getfixturevalue("local_run")[0]  # only now: the notebook ran beside it
    assert f"master: {cluster['url']}" in text
    assert "nodes: 2 (a, b)" in text, text
    assert f"messages published {local['messages_published_per_s_mean']:.1f}/s" in text
    assert f"delivered {local['messages_delivered_per_s_mean']:.1f}/s" in text
    assert f"p99 max {local['latency_p99_ms_max']:.2f} ms" in text
    assert "suspected leaks: " + ", ".join(local["leaking_processes"]) in text


@pytest.mark.timeout(400)
def test_report_on_standalone_cluster_equals_local(cluster, fleet_dumps, local_run):
    summ, took, err = _finish_report(cluster["runs"]["standalone"])
    local, local_took, _ = local_run
    print(f"\nlocal[*] {local_took:.1f} s, standalone {took:.1f} s (side by side with other runs)")
    _same(local, summ)
    assert summ["nodes"] == 2 and summ["messages_delivered_per_s_mean"] == pytest.approx(900.0)
    assert "starting Spark (spark://127.0.0.1" in err and "computing tables" in err
    # The executors, not the driver, read the dumps: the worker ran an executor for the
    # report's application, and its tasks read the dump files by path.
    apps = re.findall(r"Asked to launch executor (app-[\d-]+)/\d+ for stompbroker-diag-report\b",
                      (cluster["tmp"] / "worker.log").read_text(errors="replace"))
    assert len(apps) == 1, apps  # the standalone report; the local[*] reference ran off the cluster
    logs = "\n".join(p.read_text(errors="replace") for a in apps for p in cluster["work"].glob(f"{a}/*/stderr"))
    for node in ("a", "b"):
        assert re.search(rf"Reading File path: file:\S*/{node}/diag\.jsonl", logs), logs[-3000:]
    report = (cluster["tmp"] / "standalone" / "report.md").read_text()
    assert "## Fleet (2 nodes)" in report


@pytest.mark.timeout(400)
def test_report_through_spark_connect_equals_local(fleet_dumps, cluster, local_run):
    connect = cluster["remote"]
    summ, took, err = _finish_report(cluster["runs"]["connect"])
    local, local_took, _ = local_run
    print(f"\nlocal[*] {local_took:.1f} s, Spark Connect {took:.1f} s (side by side with other runs)")
    _same(local, summ)
    assert f"starting Spark (Spark Connect {connect})" in err
    # the tables were written by the server's executors, the report by the client
    assert list((cluster["tmp"] / "connect" / "nodes" / "parquet").glob("part-*.parquet"))
    assert "## Fleet (2 nodes)" in (cluster["tmp"] / "connect" / "report.md").read_text()


# -- streaming: the stomp source and sink on the cluster and through Spark Connect ----------------
STREAM_N = 100  # (where it runs is the point here; counts through faults: test_streaming.py)


def _stream_copy(cluster, start_broker, tmp_path, *where: str) -> tuple[int, dict]:
    """stompbroker-stream copy from a topic (read by sequence) to a queue, on the cluster; returns
    the rows it says it copied and the queue's contents (body -> count)."""
    import collections

    from stompbroker.tools.client import StompClient
    broker = start_broker("processors=3", "store=sqlite", f"store_path={tmp_path}/s.sqlite")
    client = StompClient.connect(port=broker.port)
    for i in range(STREAM_N):
        client.send("/topic/in", str(i).encode(), [("persistent", "true")], receipt=i == STREAM_N - 1,
                    flush=i % 100 == 99 or i == STREAM_N - 1)
    cmd = [sys.executable, "-m", "stompbroker.analysis.stream", "copy", "--url", f"stomp://127.0.0.1:{broker.port}",
           "--source", "/topic/in", "--sink", "/queue/out", "--checkpoint", str(tmp_path / "checkpoint"),
           "--idle", "2", "-o", "startingOffsets=earliest", "-o", "numPartitions=2", *where]
    done = subprocess.run(cmd, env=cluster["env"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    copied = json.loads(done.stdout.strip().splitlines()[-1])["copied"]
    client.subscribe("/queue/out", "drain")
    got = collections.Counter()
    while (frame := client.read_frame(2.0)) is not None:
        got[frame.body.decode()] += 1
    return copied, got


@pytest.mark.timeout(400)
def test_stream_copy_on_standalone_cluster(cluster, start_broker, tmp_path):
    copied, got = _stream_copy(cluster, start_broker, tmp_path, "--master", cluster["url"])
    assert copied == STREAM_N
    assert got == {str(i): 1 for i in range(STREAM_N)}
    # the executors read the replay log and sent the rows: the worker ran the application's executor
    assert re.search(r"Asked to launch executor app-[\d-]+/\d+ for stompbroker-stream-copy\b",
                     (cluster["tmp"] / "worker.log").read_text(errors="replace"))


@pytest.mark.timeout(400)
def test_stream_copy_through_spark_connect(cluster, start_broker, tmp_path):
    copied, got = _stream_copy(cluster, start_broker, tmp_path, "--remote", cluster["remote"])
    assert copied == STREAM_N
    assert got == {str(i): 1 for i in range(STREAM_N)}
