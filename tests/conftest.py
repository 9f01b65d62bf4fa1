"""Shared fixtures: a real multi-process broker started as a subprocess on a free port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from stompbroker.readiness import NotReady, wait_ready

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every Spark a test starts (driver, block manager, executors) binds to loopback: left alone, Spark
# picks the machine's first non-loopback address when its hostname resolves to 127.0.0.1.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def pytest_addoption(parser):
    parser.addoption("--seconds", type=float, default=0.0,
                     help="run the time-bounded fuzzers for this many seconds (default: their short CI budget)")
    parser.addoption("--fuzz-inputs", type=int, default=0,
                     help="stop the edge fuzzer (tests/integration/test_fuzz_edges.py) after this many inputs")


# Files whose tests measure the broker's latency, memory or reaction time against a bound: CI runs
# them alone, after the rest has run on two workers (./build.sh test), so that another test's load
# on the same two cores cannot be what they measure.
ALONE = {"test_stall.py", "test_partial_frames.py", "test_leak_flag.py", "test_hostile.py",
         "test_ws_limits.py", "test_fuzz_edges.py", "test_idle_memory.py"}


# Files that take minutes (Spark's JVMs, kill -9 and election waits), longest first: two workers
# (./build.sh test, `--no-loadscope-reorder`) start them first, so the many short files fill in
# beside them and none of them is the last to finish. By default xdist orders files by how many
# tests they hold, which put the Spark files, with few tests each, last.
LONG_FIRST = ("test_analysis_cluster.py", "test_analysis.py", "test_streaming.py", "test_cluster_shards.py",
              "test_analysis_notebook.py", "test_cluster_faults.py", "test_cluster_packs.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: measures timing or memory; run without other tests beside it")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: LONG_FIRST.index(item.path.name) if item.path.name in LONG_FIRST else len(LONG_FIRST))
    for item in items:
        if item.path.name in ALONE:
            item.add_marker(pytest.mark.alone)
    seconds = config.getoption("--seconds")
    if seconds:  # a long fuzzing run outlasts the default per-test timeout
        for item in items:
            if "fuzz_seconds" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.timeout(seconds + 120))


@pytest.fixture
def fuzz_seconds(request) -> float:
    return request.config.getoption("--seconds")


class BrokerProcess:
    """A running ``python -m stompbroker``; ``host``/``port`` to connect, ``log()`` for its output.
    ``prefix`` runs it through another command (``ip netns exec NAME``)."""

    def __init__(self, *settings: str, env: dict | None = None, prefix: tuple = ()):
        self.settings = settings
        base = f"/tmp/stompbroker-test-{os.getpid()}-{time.monotonic_ns()}"
        self.log_path = base + ".log"
        # the caller's own ready_file, if it sets one, else ours (the later setting wins)
        self.ready_path = next((s.split("=", 1)[1] for s in reversed(settings) if s.startswith("ready_file=")),
                               base + ".ready")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "stompbroker", "port=0", "log_level=INFO", f"ready_file={base}.ready",
             *settings],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.host = "127.0.0.1"
        self.port = self._wait_for_port()

    def _wait_for_port(self, timeout: float = 15.0) -> int:
        try:
            return wait_ready(self.ready_path, self.proc, timeout)["port"]
        except NotReady as exc:
            raise RuntimeError(f"{exc}:\n{self.log()}") from None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def connect(self, timeout: float = 5.0) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=timeout)
        return sock

    def stop(self, sig=signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def close(self) -> None:
        """Stop it, kill anything left of its process group, delete its log."""
        self.stop()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.unlink(self.log_path)
        if self.ready_path.startswith("/tmp/stompbroker-test-") and os.path.exists(self.ready_path):  # killed
            os.unlink(self.ready_path)


@pytest.fixture
def start_broker():
    """Factory: start_broker("processors=4", "TTL=5000") -> BrokerProcess, stopped after the test."""
    started = []

    def start(*settings: str, env: dict | None = None, prefix: tuple = ()) -> BrokerProcess:
        broker = BrokerProcess(*settings, env=env, prefix=prefix)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.close()


@pytest.fixture(scope="module")
def broker():
    """One broker shared by the tests of a module (default settings, 4 processors)."""
    b = BrokerProcess("processors=4")
    yield b
    b.close()


# --- cluster mode: a real NATS JetStream cluster (tests/natscluster.py) and broker nodes on it ---

@pytest.fixture(scope="module")
def nats_cluster():
    """A 3-server NATS cluster with JetStream shared by a module's tests. A test that kills or stops
    servers brings them back (``nats_cluster.start_all()``) before it ends."""
    from tests.natscluster import NatsCluster

    with NatsCluster(3) as cluster:
        yield cluster


@pytest.fixture
def cluster_name() -> str:
    """A fresh ``cluster_name`` per test, so streams, consumers and KV buckets never collide."""
    return f"t{os.getpid()}x{time.monotonic_ns() % 10**12}"


@pytest.fixture
def start_nodes(start_broker, nats_cluster, cluster_name):
    """Factory: start_nodes(3, "TTL=5000") -> [BrokerProcess] (node_id n0, n1, ...) on ``nats_cluster``
    with this test's ``cluster_name``; started in parallel, stopped after the test. ``nats=`` another
    NatsCluster, ``name=`` another cluster_name (e.g. a second cluster on the same NATS)."""
    from concurrent.futures import ThreadPoolExecutor

    def start(n: int = 3, *settings: str, nats=None, name: str | None = None, first: int = 0,
              env: dict | None = None) -> list[BrokerProcess]:
        url = (nats or nats_cluster).url_setting
        node_settings = [(f"cluster={url}", f"cluster_name={name or cluster_name}", f"node_id=n{i}", *settings)
                         for i in range(first, first + n)]
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda s: start_broker(*s, env=env), node_settings))

    return start
