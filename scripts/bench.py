#!/usr/bin/env python3
"""Load generator for STOMP brokers: this one (--spawn) or any other (--host/--port, --ws URL).

Examples (from the repository root, with the venv):

    .venv/bin/python scripts/bench.py --spawn "processors=4" --scenario all --out out/bench
    .venv/bin/python scripts/bench.py --host 127.0.0.1 --port 61613 --ws ws://127.0.0.1:15674/ws \
        --login guest --passcode guest --pid $(pgrep -f beam.smp) --scenario ingest,one2one --out out/rabbit
    .venv/bin/python scripts/bench.py --compare out/bench out/rabbit

Scenarios (``--scenario NAME[,NAME...]`` or ``all``): ingest, one2one, fanout, queue, latency, idle,
durable. Each writes one object per run into ``OUT/results.json`` and a chart into ``OUT/bench.png``.
See docs/performance.md for what each one measures and how.

Design (why the generator is much faster than the broker it measures): hand-written STOMP over raw
sockets, frames rendered once and sent in ~64 KB batches with one send call each, frames counted
with one ``bytes.count`` per read (NUL on TCP, a body token on WebSocket), several worker
processes, and a self-measurement (``--ceiling``) against a trivial sink/source on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import wait

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_wire import BenchError, Target, percentiles  # noqa: E402
from bench_workers import BIN, Shared, run_worker  # noqa: E402

SCENARIOS = ("ingest", "one2one", "fanout", "queue", "latency", "idle", "durable")
ALIASES = {"1to1": "one2one", "1-1": "one2one", "fan-out": "fanout", "footprint": "idle"}

# Targets on the 2-core reference machine (docs/performance.md).
TARGETS = {
    "ingest": ("sends_per_s", ">=", 150_000, "SEND/s"),
    "one2one": ("deliveries_per_s", ">=", 100_000, "deliveries/s"),
    "fanout": ("deliveries_per_s", ">=", 500_000, "deliveries/s"),
    "latency": ("p99_ms", "<=", 2.0, "ms (p99 at the offered load)"),
    "idle_memory": ("bytes_per_connection", "<=", 1024, "bytes of broker PSS per idle connection"),
    "idle_cpu": ("cpu_fraction", "<=", 0.005, "CPU-seconds per second with the connections idle"),
}

RESULT_KEYS = ("name", "scenario", "transport", "status", "parameters", "duration_s", "counts", "rates",
               "mb_per_s", "latency_ms", "broker", "deliveries_per_cpu_s", "generator", "generator_ceiling",
               "headline", "target", "notes")


# -- results -----------------------------------------------------------------------------------
def new_result(name: str, scenario: str, transport: str | None, parameters: dict) -> dict:
    """An empty result object with every key of the schema."""
    return {
        "name": name, "scenario": scenario, "transport": transport, "status": "ok", "parameters": parameters,
        "duration_s": None, "counts": {}, "rates": {}, "mb_per_s": {}, "latency_ms": None,
        "broker": {"label": None, "cpu_s": None, "cpu_by_process": {}, "pss_bytes": None},
        "deliveries_per_cpu_s": None, "generator": {}, "generator_ceiling": None,
        "headline": None, "target": None, "notes": [],
    }


def validate_result(obj: dict) -> list[str]:
    """Problems with one result object (empty list: it fits the schema)."""
    problems = [f"missing key {k!r}" for k in RESULT_KEYS if k not in obj]
    if problems:
        return problems
    if obj["status"] not in ("ok", "skipped", "error"):
        problems.append(f"bad status {obj['status']!r}")
    for key in ("parameters", "counts", "rates", "mb_per_s", "broker", "generator"):
        if not isinstance(obj[key], dict):
            problems.append(f"{key} must be an object")
    if not isinstance(obj["notes"], list):
        problems.append("notes must be a list")
    if obj["status"] == "ok":
        h = obj["headline"]
        if not (isinstance(h, dict) and {"metric", "value", "unit"} <= set(h)):
            problems.append("an ok result needs a headline {metric, value, unit}")
        if obj["duration_s"] is None:
            problems.append("an ok result needs duration_s")
    lat = obj["latency_ms"]
    if lat is not None and not {"p50", "p99", "p99.9"} <= set(lat):
        problems.append("latency_ms needs p50, p99 and p99.9")
    t = obj["target"]
    if t is not None and not {"metric", "op", "goal", "value", "met"} <= set(t):
        problems.append("target needs metric, op, goal, value, met")
    try:
        json.dumps(obj)
    except (TypeError, ValueError) as exc:
        problems.append(f"not JSON-serialisable: {exc}")
    return problems


def check_target(key: str, value) -> dict | None:
    if key not in TARGETS or value is None:
        return None
    metric, op, goal, unit = TARGETS[key]
    met = value >= goal if op == ">=" else value <= goal
    return {"metric": metric, "op": op, "goal": goal, "unit": unit, "value": value, "met": bool(met)}


def merge_bins(bin_lists) -> list[int]:
    out: list[int] = []
    for bins in bin_lists:
        for i, n in enumerate(bins):
            while len(out) <= i:
                out.append(0)
            out[i] += n
    return out


def steady_rate(bins: list[int], bin_s: float = BIN, skip_s: float = 1.0) -> float | None:
    """Median of the 1-second rates, leaving out the first and last `skip_s` (ramp-up, drain)."""
    per = max(int(round(1.0 / bin_s)), 1)
    skip = int(round(skip_s / bin_s))
    inner = bins[skip:len(bins) - skip] if len(bins) > 2 * skip else []
    windows = [sum(inner[i:i + per]) / (per * bin_s) for i in range(0, len(inner) - per + 1, per)]
    return statistics.median(windows) if windows else None


def fmt_num(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}" if x == int(x) else f"{x:.2f}"


# -- the broker's processes --------------------------------------------------------------------
def _role(proc) -> str:
    try:
        cmd = " ".join(proc.cmdline()).strip()
    except Exception:
        cmd = ""
    if cmd.startswith("stompbroker: "):
        return cmd[len("stompbroker: "):].split()[0]
    if "resource_tracker" in cmd:
        return "resource_tracker"
    try:
        return proc.name()
    except Exception:
        return "?"


class BrokerProcs:
    """CPU and memory of a process tree (the broker we spawned, or --pid)."""

    def __init__(self, pid: int | None, label: str):
        self.pid = pid
        self.label = label
        self._seen = {}   # pid -> Process (kept so cpu_times work for the same objects)

    def processes(self) -> list:
        if not self.pid:
            return []
        import psutil
        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in procs:
            out.append(self._seen.setdefault(p.pid, p))
        return out

    def cpu(self) -> dict:
        """{role: cpu seconds}, roles numbered if repeated; '<role>:sys' for the kernel part; '_total'."""
        import psutil
        out: dict = {}
        for p in self.processes():
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            role = _role(p)
            key = role if role not in out else f"{role}#{p.pid}"
            out[key] = t.user + t.system
            out[key + ":sys"] = t.system
        out["_total"] = sum(v for k, v in out.items() if not k.endswith(":sys"))
        return out

    def pss(self) -> tuple[int | None, dict]:
        import psutil
        total, by = 0, {}
        procs = self.processes()
        if not procs:
            return None, {}
        for p in procs:
            try:
                pss = p.memory_full_info().pss
            except (psutil.Error, AttributeError):
                continue
            role = _role(p)
            by[role if role not in by else f"{role}#{p.pid}"] = pss
            total += pss
        return total, by

    @staticmethod
    def delta(before: dict, after: dict) -> dict:
        return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


class SpawnedBroker(BrokerProcs):
    """``python -m stompbroker port=0 ARGS`` in a scratch directory (removed at stop), so files the broker
    writes with relative paths (a sqlite store, diagnostics dumps) never land in the source tree."""

    def __init__(self, args: list[str], extra_env: dict | None = None):
        self.workdir = tempfile.mkdtemp(prefix="bench-broker-")
        self.log_path = os.path.join(self.workdir, "broker.log")
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "stompbroker", "port=0", *args], cwd=self.workdir,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        super().__init__(self.proc.pid, "stompbroker " + " ".join(args))
        deadline = time.monotonic() + 30
        self.port = None
        while time.monotonic() < deadline:
            m = re.search(r"stompbroker listening on [^\s]+:(\d+)", self.log())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise BenchError(f"broker exited with {self.proc.returncode}:\n{self.log()[-2000:]}")
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise BenchError("broker did not start within 30 s")

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._log.close()
        import shutil
        shutil.rmtree(self.workdir, ignore_errors=True)


def broker_has_setting(name: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "stompbroker", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    return f"--{name}" in out.stdout


# -- progress ----------------------------------------------------------------------------------
class Progress:
    def __init__(self, label: str, duration: float, enabled: bool):
        self.label = label
        self.duration = duration
        self.enabled = enabled
        self.last = 0.0
        self.prev = None
        self.tty = sys.stderr.isatty()

    def update(self, elapsed: float, sent: float, delivered: float, phase: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < (0.25 if self.tty else 2.0):
            return
        rate_s = rate_d = 0.0
        if self.prev:
            dt = now - self.prev[0]
            rate_s = (sent - self.prev[1]) / dt
            rate_d = (delivered - self.prev[2]) / dt
        self.prev = (now, sent, delivered)
        self.last = now
        width = 20
        elapsed = max(elapsed, 0.0)
        frac = min(elapsed / self.duration, 1.0) if self.duration else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        line = (f"{self.label:<26} [{bar}] {elapsed:5.1f}/{self.duration:.0f}s  sent {fmt_num(sent):>7} "
                f"({fmt_num(rate_s):>7}/s)  delivered {fmt_num(delivered):>7} ({fmt_num(rate_d):>7}/s) {phase}")
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# -- one measured run: workers, start, monitor, stop ------------------------------------------
class Flow:
    """Raw measurements of one run (everything the scenarios turn into a result)."""

    def __init__(self):
        self.t0 = 0.0
        self.producers: list[dict] = []
        self.consumers: list[dict] = []
        self.ready: list[dict] = []
        self.cpu_before: dict = {}
        self.cpu_after: dict = {}
        self.t_stop = 0.0
        self.sys_before = self.sys_after = 0.0
        self.notes: list[str] = []

    @property
    def sent(self) -> int:
        return sum(p.get("sent", 0) for p in self.producers)

    @property
    def delivered(self) -> int:
        return sum(c.get("delivered", 0) for c in self.consumers)

    @property
    def t_last_delivery(self) -> float:
        return max((c["t_last"] for c in self.consumers if c.get("t_last")), default=0.0)

    @property
    def generator_cpu(self) -> float:
        return sum(w.get("cpu_s", 0.0) for w in self.producers + self.consumers)


class Runner:
    def __init__(self, opts):
        self.opts = opts
        self.ctx = mp.get_context("fork")
        self.run_id = format(int(time.time() * 1000) % 36 ** 7, "x")
        self.results: list[dict] = []
        self.ceilings: dict = {}
        self.spawn_args = shlex.split(opts.spawn) if opts.spawn is not None else None
        self.label = opts.label or ("stompbroker " + (opts.spawn or "(defaults)") +
                                    (f" [{opts.spawn_env}]" if opts.spawn_env else "") if self.spawn_args is not None
                                    else f"{opts.host}:{opts.port or ''} {opts.ws or ''}".strip())

    # -- the broker under test ----------------------------------------------------------------
    @contextlib.contextmanager
    def broker(self, extra_args=()):
        """Yields (Target, BrokerProcs or None): a fresh broker when spawning, else the given one."""
        o = self.opts
        if self.spawn_args is not None:
            env = dict(word.split("=", 1) for word in shlex.split(o.spawn_env or ""))
            b = SpawnedBroker(self.spawn_args + list(extra_args), env)
            try:
                target = Target("127.0.0.1", b.port, f"ws://127.0.0.1:{b.port}/ws", o.login, o.passcode, o.vhost)
                time.sleep(0.3)  # let every process finish starting
                yield target, b
            finally:
                b.stop()
        else:
            target = Target(o.host, o.port, o.ws, o.login, o.passcode, o.vhost)
            yield target, (BrokerProcs(o.pid, self.label) if o.pid else None)

    def available_transports(self) -> list[str]:
        if self.spawn_args is not None:
            return ["tcp", "ws"]
        return Target(self.opts.host, self.opts.port, self.opts.ws).transports()

    def transports_for(self, scenario: str) -> list[str]:
        avail = self.available_transports()
        if self.opts.transports:
            wanted = [t for t in self.opts.transports.split(",") if t]
            return [t for t in wanted if t in avail]
        if scenario == "fanout":
            return avail
        return avail[:1]

    # -- running workers ----------------------------------------------------------------------
    def flow(self, label: str, producers: list[dict], consumers: list[dict], duration: float,
             broker: BrokerProcs | None, fan: float | None, shared: Shared | None = None,
             stop_at_duration: bool = False) -> Flow:
        """Start consumers then producers, wait until all are set up, start them together at t0,
        show progress, decide when the run is over (producers done and deliveries complete or
        quiet), stop everyone and collect their results."""
        o = self.opts
        ctx = self.ctx
        nc, np_ = len(consumers), len(producers)
        shared = shared or Shared(ctx, nc + np_)
        workers = []
        for i, spec in enumerate(consumers):
            workers.append(("consumer", spec, i))
        for j, spec in enumerate(producers):
            spec.setdefault("consumer_slots", list(range(nc)))
            workers.append(("producer", spec, nc + j))
        procs = []
        for kind, spec, slot in workers:
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=run_worker, args=(kind, spec, shared, slot, child), daemon=True)
            p.start()
            child.close()
            procs.append([kind, slot, p, parent, None])
        flow = Flow()
        progress = Progress(label, duration, not o.quiet)
        try:
            # set-up
            deadline = time.monotonic() + o.setup_timeout
            for entry in procs:
                msg = self._recv(entry, deadline)
                if msg[0] != "ready":
                    raise BenchError(msg[1])
                flow.ready.append(msg[1])
            flow.cpu_before = broker.cpu() if broker else {}
            flow.sys_before = system_busy()
            flow.t0 = t0 = time.monotonic() + 0.2
            shared.t0.value = t0
            producers_done = None
            last_total, last_change = -1.0, time.monotonic()
            hard = t0 + duration + o.drain_timeout + 60
            pending = {id(e): e for e in procs if e[0] == "producer"}
            while True:
                conns = [e[3] for e in pending.values()]
                ready = wait(conns, timeout=0.1) if conns else (time.sleep(0.1) or [])
                for c in ready:
                    entry = next(e for e in pending.values() if e[3] is c)
                    msg = self._recv(entry, time.monotonic() + 5)
                    if msg[0] != "result":
                        raise BenchError(msg[1])
                    entry[4] = msg[1]
                    del pending[id(entry)]
                now = time.monotonic()
                sent = sum(shared.counts[nc + j] for j in range(np_))
                total = sum(shared.counts[i] for i in range(nc))
                if total != last_total:
                    last_total, last_change = total, now
                if producers_done is None and not pending and (np_ or now >= t0 + duration):
                    producers_done = now
                phase = "" if producers_done is None else "draining"
                progress.update(now - t0, sent, total, phase)
                if producers_done is not None:
                    if not nc or stop_at_duration:
                        break
                    expected = flow_sent(procs) * fan if fan else None
                    quiet = now - last_change
                    if expected is not None and total >= expected and quiet >= 0.3:
                        break
                    if quiet >= o.drain_quiet:
                        if expected is not None and total < expected:
                            flow.notes.append(f"{label}: deliveries stopped at {int(total)} of {int(expected)} "
                                              f"expected ({o.drain_quiet} s without progress)")
                        break
                    if now - producers_done > o.drain_timeout:
                        flow.notes.append(f"{label}: still draining after {o.drain_timeout} s; stopped")
                        break
                if now > hard:
                    raise BenchError("the run did not finish within its time bound")
            flow.t_stop = time.monotonic()
            flow.cpu_after = broker.cpu() if broker else {}
            flow.sys_after = system_busy()
            shared.stop.value = 1
            for entry in procs:
                if entry[0] == "consumer":
                    msg = self._recv(entry, time.monotonic() + 30)
                    if msg[0] != "result":
                        raise BenchError(msg[1])
                    entry[4] = msg[1]
        finally:
            progress.close()
            shared.stop.value = 1
            for entry in procs:
                entry[2].join(5)
                if entry[2].is_alive():
                    entry[2].kill()
                    entry[2].join(2)
        flow.producers = [e[4] for e in procs if e[0] == "producer"]
        flow.consumers = [e[4] for e in procs if e[0] == "consumer"]
        for c in flow.consumers:
            for why in c.get("closed", []):
                flow.notes.append(f"{label}: a consumer connection was {why}")
        return flow

    @staticmethod
    def _recv(entry, deadline: float):
        conn = entry[3]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{entry[0]} {entry[1]} did not answer in time")
            if conn.poll(min(left, 0.5)):
                try:
                    return conn.recv()
                except EOFError:
                    raise BenchError(f"{entry[0]} {entry[1]} died (exit code {entry[2].exitcode})") from None
            if not entry[2].is_alive() and not conn.poll(0):
                raise BenchError(f"{entry[0]} {entry[1]} died (exit code {entry[2].exitcode})")

    # -- specs --------------------------------------------------------------------------------
    def inflight_cap(self, connections: int) -> int:
        """Deliveries in flight allowed: --max-inflight, and --conn-inflight-bytes per consumer connection
        (a broker may close a consumer whose queued output passes a limit, e.g. 16 MB here)."""
        per_conn = self.opts.conn_inflight_bytes // (self.opts.size + 150)
        return max(min(self.opts.max_inflight, connections * per_conn), 1)

    def producer_spec(self, target, transport, destination, **kw) -> dict:
        o = self.opts
        spec = {"target": target, "transport": transport, "destination": destination, "size": o.size,
                "duration": o.duration, "mode": "allout", "rate": o.rate, "batch_bytes": o.batch_bytes,
                "window": o.window, "final": True, "end_destination": f"/topic/bench-{self.run_id}-end",
                "max_inflight": o.max_inflight, "fan": 0, "grace": 30.0, "headers": []}
        spec.update(kw)
        return spec

    def consumer_specs(self, target, transport, links: list, procs: int, mode: str = "count") -> list[dict]:
        """Spread connections (each a list of subscriptions) over `procs` consumer processes."""
        procs = max(min(procs, len(links)), 1)
        groups = [links[i::procs] for i in range(procs)]
        return [{"target": target, "transport": transport, "links": g, "mode": mode} for g in groups if g]

    # -- common result fields -----------------------------------------------------------------
    def fill_common(self, res: dict, flow: Flow, broker, window: float, deliveries: int | None) -> None:
        res["duration_s"] = round(window, 3)
        if broker is not None:
            cpu = BrokerProcs.delta(flow.cpu_before, flow.cpu_after)
            total = cpu.pop("_total", None)
            res["broker"]["cpu_s"] = total
            res["broker"]["cpu_by_process"] = {k: v for k, v in cpu.items() if not k.endswith(":sys")}
            res["broker"]["kernel_cpu_by_process"] = {k[:-4]: v for k, v in cpu.items() if k.endswith(":sys")}
            if deliveries and total:
                res["deliveries_per_cpu_s"] = round(deliveries / total)
        res["broker"]["label"] = self.label
        res["machine"] = machine_load(flow, res["broker"]["cpu_s"])
        res["generator"] = {"cpu_s": round(flow.generator_cpu, 3),
                            "processes": len(flow.producers) + len(flow.consumers)}
        res["notes"] += flow.notes

    def delivery_result(self, name, scenario, transport, params, flow: Flow, broker, fan_expected) -> dict:
        res = new_result(name, scenario, transport, params)
        sent, delivered = flow.sent, flow.delivered
        t_end = flow.t_last_delivery or flow.t_stop
        window = max(t_end - flow.t0, 1e-9)
        bins = merge_bins(c["bins"] for c in flow.consumers)
        nbytes = sum(c["bytes"] for c in flow.consumers)
        prod_window = max(max((p.get("t_done", 0) for p in flow.producers), default=0) - flow.t0, 1e-9)
        res["counts"] = {"sent": sent, "delivered": delivered,
                         "expected": int(sent * fan_expected) if fan_expected else None,
                         "per_connection": [n for c in flow.consumers for n in c["per_link"]]}
        res["rates"] = {"sends_per_s": round(sent / prod_window), "deliveries_per_s": round(delivered / window),
                        "steady_deliveries_per_s": steady_rate(bins), "bins_per_s": [n / BIN for n in bins]}
        res["mb_per_s"] = {"payload": round(delivered * self.opts.size / window / 1e6, 2),
                           "wire": round(nbytes / window / 1e6, 2)}
        self.fill_common(res, flow, broker, window, delivered)
        res["headline"] = {"metric": "deliveries/s", "value": res["rates"]["deliveries_per_s"], "unit": "1/s"}
        res["generator"]["stalled_s"] = round(sum(p.get("stalled_s", 0) for p in flow.producers), 3)
        if res["counts"]["expected"] is not None and delivered < res["counts"]["expected"]:
            res["notes"].append(f"{res['counts']['expected'] - delivered} deliveries missing")
        closed = [why for c in flow.consumers for why in c.get("closed", [])]
        if closed:
            res["status"] = "error"
            res["notes"].insert(0, f"{len(closed)} consumer connection(s) closed during the run; "
                                   "the figures cover only the part before")
        return res

    # -- scenarios ----------------------------------------------------------------------------
    def run_scenarios(self, names: list[str]) -> None:
        for name in names:
            fn = getattr(self, f"sc_{name}")
            transports = self.transports_for(name) if name not in ("idle",) else ["tcp"]
            if not transports:
                self.results.append(self.skipped(name, None, "no address for the transports asked for"))
                continue
            for transport in transports:
                for res in fn(transport):
                    self.results.append(res)
                    print(summary_line(res), flush=True)
                    self.save()
                # pause between heavy runs: the machine is shared
                time.sleep(self.opts.pause)

    def skipped(self, name, transport, why) -> dict:
        res = new_result(name, name, transport, {})
        res["status"] = "skipped"
        res["notes"].append(why)
        return res

    def guarded(self, name, scenario, transport, params, body):
        """Run body(); a BenchError becomes a result with status 'error'."""
        try:
            return body()
        except BenchError as exc:
            res = new_result(name, scenario, transport, params)
            res["status"] = "error"
            res["notes"].append(str(exc))
            return res

    def sc_ingest(self, transport):
        name = f"ingest-{transport}"
        params = {"producers": 1, "subscribers": 0, "size": self.opts.size, "duration": self.opts.duration,
                  "window": self.opts.window, "batch_bytes": self.opts.batch_bytes}

        def body():
            with self.broker() as (target, broker):
                dest = f"/topic/bench-{self.run_id}-ingest"
                p = self.producer_spec(target, transport, dest)
                flow = self.flow(name, [p], [], self.opts.duration, broker, fan=None)
            res = new_result(name, "ingest", transport, params)
            prod = flow.producers[0]
            window = prod["t_done"] - flow.t0
            res["counts"] = {"sent": prod["sent"]}
            res["rates"] = {"sends_per_s": round(prod["sent"] / window),
                            "steady_sends_per_s": steady_rate(prod["bins"]),
                            "bins_per_s": [n / BIN for n in prod["bins"]]}
            res["mb_per_s"] = {"payload": round(prod["sent"] * self.opts.size / window / 1e6, 2),
                               "wire": round(prod["bytes_sent"] / window / 1e6, 2)}
            self.fill_common(res, flow, broker, window, prod["sent"])
            res["headline"] = {"metric": "SEND/s", "value": res["rates"]["sends_per_s"], "unit": "1/s"}
            res["target"] = check_target("ingest", res["rates"]["sends_per_s"])
            res["generator_ceiling"] = self.ceiling("send", transport)
            res["generator"]["stalled_s"] = round(prod.get("stalled_s", 0), 3)
            res["notes"].append("deliveries_per_cpu_s here is SENDs processed per broker CPU-second")
            return res
        yield self.guarded(name, "ingest", transport, params, body)

    def sc_one2one(self, transport):
        name = f"one2one-{transport}"
        params = {"producers": 1, "consumers": 1, "size": self.opts.size, "duration": self.opts.duration,
                  "window": self.opts.window, "max_inflight": self.opts.max_inflight}

        def body():
            with self.broker() as (target, broker):
                dest = f"/topic/bench-{self.run_id}-one2one"
                consumers = self.consumer_specs(target, transport, [[(dest, "0", [])]], 1)
                p = self.producer_spec(target, transport, dest, fan=1, max_inflight=self.inflight_cap(1))
                flow = self.flow(name, [p], consumers, self.opts.duration, broker, fan=1)
            res = self.delivery_result(name, "one2one", transport, params, flow, broker, 1)
            res["target"] = check_target("one2one", res["rates"]["deliveries_per_s"])
            res["generator_ceiling"] = self.min_ceiling([self.ceiling("send", transport),
                                                         self.ceiling("recv", transport, 1)])
            return res
        yield self.guarded(name, "one2one", transport, params, body)

    def sc_fanout(self, transport):
        n = self.opts.fanout
        for layout in ("conns", "subs"):
            name = f"fanout-{layout}-{transport}"
            params = {"producers": 1, "fanout": n, "layout": ("one connection per subscriber" if layout == "conns"
                      else f"one connection with {n} subscriptions"), "size": self.opts.size,
                      "duration": self.opts.duration, "consumer_procs": self.opts.consumer_procs,
                      "window": self.opts.window, "max_inflight": self.opts.max_inflight}

            def body(layout=layout, name=name, params=params):
                with self.broker() as (target, broker):
                    dest = f"/topic/bench-{self.run_id}-fanout"
                    if layout == "conns":
                        links = [[(dest, "0", [])] for _ in range(n)]
                        consumers = self.consumer_specs(target, transport, links, self.opts.consumer_procs)
                    else:
                        links = [[(dest, str(i), []) for i in range(n)]]
                        consumers = self.consumer_specs(target, transport, links, 1)
                    p = self.producer_spec(target, transport, dest, fan=n,
                                           max_inflight=self.inflight_cap(n if layout == "conns" else 1))
                    flow = self.flow(name, [p], consumers, self.opts.duration, broker, fan=n)
                res = self.delivery_result(name, "fanout", transport, params, flow, broker, n)
                res["target"] = check_target("fanout", res["rates"]["deliveries_per_s"])
                res["generator_ceiling"] = self.ceiling("recv", transport, n if layout == "conns" else 1)
                return res
            yield self.guarded(name, "fanout", transport, params, body)
            if layout == "conns":
                time.sleep(self.opts.pause)

    def sc_queue(self, transport):
        k = self.opts.queue_consumers
        name = f"queue-{transport}"
        params = {"producers": 1, "consumers": k, "size": self.opts.size, "duration": self.opts.duration,
                  "window": self.opts.window, "max_inflight": self.opts.max_inflight}

        def body():
            with self.broker() as (target, broker):
                dest = f"/queue/bench-{self.run_id}-q"
                links = [[(dest, "0", [])] for _ in range(k)]
                consumers = self.consumer_specs(target, transport, links, min(self.opts.consumer_procs, k))
                p = self.producer_spec(target, transport, dest, fan=1, max_inflight=self.inflight_cap(k))
                flow = self.flow(name, [p], consumers, self.opts.duration, broker, fan=1)
            res = self.delivery_result(name, "queue", transport, params, flow, broker, 1)
            per = res["counts"]["per_connection"]
            mean = sum(per) / len(per) if per else 0
            copies = flow.delivered / flow.sent if flow.sent else None
            res["counts"]["spread"] = {
                "min": min(per, default=0), "max": max(per, default=0),
                "relative": round((max(per) - min(per)) / mean, 4) if mean else None,
                "copies_per_message": round(copies, 3) if copies is not None else None,
            }
            if copies is not None and copies > 1.05:
                res["notes"].append(f"each message reached {copies:.2f} consumers on average: the broker "
                                    "treats /queue/ like a topic (no competing consumers)")
            res["generator_ceiling"] = self.ceiling("send", transport)
            return res
        yield self.guarded(name, "queue", transport, params, body)

    def sc_latency(self, transport):
        name = f"latency-{transport}"
        o = self.opts
        params = {"rate": o.rate, "size": o.size, "duration": o.duration, "producers": 1, "consumers": 1,
                  "pacing": "open loop: latency measured from each message's scheduled send time"}

        def body():
            with self.broker() as (target, broker):
                dest = f"/topic/bench-{self.run_id}-latency"
                consumers = self.consumer_specs(target, transport, [[(dest, "0", [])]], 1, mode="latency")
                p = self.producer_spec(target, transport, dest, mode="paced", fan=1, window=0)
                flow = self.flow(name, [p], consumers, o.duration, broker, fan=1)
            res = self.delivery_result(name, "latency", transport, params, flow, broker, 1)
            lat = [x / 1e6 for c in flow.consumers for x in c["latency_ns"]]
            pct = percentiles(lat)
            res["latency_ms"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in pct.items()}
            res["latency_ms"]["histogram"] = latency_histogram(lat)
            res["rates"]["offered_per_s"] = o.rate
            res["generator"]["max_send_lag_ms"] = round(flow.producers[0].get("max_lag_s", 0) * 1000, 3)
            res["headline"] = {"metric": "p99 latency", "value": res["latency_ms"]["p99"], "unit": "ms"}
            res["target"] = check_target("latency", res["latency_ms"]["p99"])
            res["generator_ceiling"] = self.ceiling("latency", transport)
            return res
        yield self.guarded(name, "latency", transport, params, body)

    def sc_idle(self, transport):
        o = self.opts
        name = "idle"
        params = {"connections": o.idle_connections, "processes": o.idle_procs, "idle_seconds": o.idle_seconds,
                  "base_seconds": o.idle_base_seconds}

        def body():
            res = new_result(name, "idle", "tcp", params)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            per_proc = -(-o.idle_connections // o.idle_procs) + 64
            if soft < per_proc:
                raise BenchError(f"RLIMIT_NOFILE is {soft}; need {per_proc} per process")
            with self.broker() as (target, broker):
                if broker is None:
                    res["notes"].append("no --pid: broker memory and CPU are not measured")
                time.sleep(1.0)
                mem0, mem0_by = broker.pss() if broker else (None, {})
                cpu_a = broker.cpu() if broker else {}
                time.sleep(o.idle_base_seconds)
                cpu_b = broker.cpu() if broker else {}
                ctx = self.ctx
                shared = Shared(ctx, o.idle_procs)
                procs = []
                n_left = o.idle_connections
                for i in range(o.idle_procs):
                    n = n_left // (o.idle_procs - i)
                    n_left -= n
                    parent, child = ctx.Pipe(duplex=False)
                    spec = {"target": target, "n": n, "in_flight": o.idle_in_flight, "timeout": 60.0}
                    p = ctx.Process(target=run_worker, args=("idle", spec, shared, i, child), daemon=True)
                    p.start()
                    child.close()
                    procs.append(["idle", i, p, parent, None])
                progress = Progress(name, 0, not o.quiet)
                try:
                    t_open = time.monotonic()
                    infos = []
                    for entry in procs:
                        while not entry[3].poll(0.25):
                            progress.update(time.monotonic() - t_open, 0, sum(shared.counts[:]), "connecting")
                            if not entry[2].is_alive():
                                break
                        msg = self._recv(entry, time.monotonic() + 90)
                        if msg[0] != "ready":
                            raise BenchError(msg[1])
                        infos.append(msg[1])
                    opened = sum(i["open"] for i in infos)
                    open_s = time.monotonic() - t_open
                    time.sleep(2.0)  # let the broker settle
                    mem1, mem1_by = broker.pss() if broker else (None, {})
                    cpu_c = broker.cpu() if broker else {}
                    t_c = time.monotonic()
                    while time.monotonic() - t_c < o.idle_seconds:
                        time.sleep(0.25)
                        progress.update(time.monotonic() - t_c, 0, opened, "idle")
                    cpu_d = broker.cpu() if broker else {}
                    mem2, mem2_by = broker.pss() if broker else (None, {})
                    idle_s = time.monotonic() - t_c
                finally:
                    progress.close()
                    shared.stop.value = 1
                    finals = []
                    for entry in procs:
                        with contextlib.suppress(BenchError):
                            msg = self._recv(entry, time.monotonic() + 30)
                            if msg[0] == "result":
                                finals.append(msg[1])
                        entry[2].join(5)
                        if entry[2].is_alive():
                            entry[2].kill()
            failed = sum(i["failed"] for i in infos)
            errors: dict = {}
            for i in infos:
                for k, v in i["errors"].items():
                    errors[k] = errors.get(k, 0) + v
            closed = sum(f.get("closed_by_broker", 0) for f in finals)
            res["counts"] = {"connections_open": opened, "connections_failed": failed, "errors": errors,
                             "closed_by_broker_while_idle": closed}
            res["duration_s"] = round(idle_s, 3)
            res["rates"] = {"connections_opened_per_s": round(opened / open_s) if open_s else None}
            res["broker"]["label"] = self.label
            if broker is not None:
                base = {k: v for k, v in BrokerProcs.delta(cpu_a, cpu_b).items() if not k.endswith(":sys")}
                idle = {k: v for k, v in BrokerProcs.delta(cpu_c, cpu_d).items() if not k.endswith(":sys")}
                per_conn = (mem1 - mem0) / opened if opened and mem0 is not None and mem1 is not None else None
                res["broker"].update({
                    "cpu_s": idle.pop("_total", None), "cpu_by_process": idle,
                    "cpu_base_s": base.pop("_total", None), "cpu_base_by_process": base,
                    "pss_bytes": mem1, "pss_start_bytes": mem0, "pss_end_bytes": mem2,
                    "pss_start_by_process": mem0_by, "pss_with_connections_by_process": mem1_by,
                    "pss_bytes_per_connection": round(per_conn) if per_conn is not None else None,
                })
                frac = res["broker"]["cpu_s"] / idle_s if res["broker"]["cpu_s"] is not None else None
                res["broker"]["cpu_fraction"] = round(frac, 5) if frac is not None else None
                res["headline"] = {"metric": "broker PSS per idle connection",
                                   "value": res["broker"]["pss_bytes_per_connection"], "unit": "bytes"}
                res["target"] = check_target("idle_memory", res["broker"]["pss_bytes_per_connection"])
                res["targets_extra"] = [check_target("idle_cpu", frac)]
            else:
                res["headline"] = {"metric": "connections opened", "value": opened, "unit": "connections"}
            if opened < o.idle_connections:
                res["notes"].append(f"only {opened} of {o.idle_connections} connections opened "
                                    f"(errors: {errors}); start the broker with enough file descriptors "
                                    f"(ulimit -n) and max_connections >= {o.idle_connections}")
            res["generator"] = {"processes": o.idle_procs, "open_seconds": round(open_s, 2)}
            return res
        yield self.guarded(name, "idle", "tcp", params, body)

    def sc_durable(self, transport):
        o = self.opts
        name = f"durable-{transport}"
        params = {"producers": 1, "consumers": 1, "size": o.size, "duration": o.duration,
                  "receipt_window": o.durable_window, "headers": "persistent:true", "broker_args": o.durable_args}
        if self.spawn_args is not None:
            if o.durable == "no" or (o.durable == "auto" and not broker_has_setting("store")):
                yield self.skipped(name, transport, "skipped: this broker has no store setting (store=sqlite) yet")
                return
            extra = shlex.split(o.durable_args)
        else:
            if o.durable == "no":
                yield self.skipped(name, transport, "skipped (--durable no)")
                return
            extra = []

        def body():
            with self.broker(extra) as (target, broker):
                dest = f"/queue/bench-{self.run_id}-durable"
                consumers = self.consumer_specs(target, transport, [[(dest, "0", [])]], 1)
                p = self.producer_spec(target, transport, dest, fan=1, receipt_each=True, window=o.durable_window,
                                       headers=[("persistent", "true")])
                flow = self.flow(name, [p], consumers, o.duration, broker, fan=1)
            res = self.delivery_result(name, "durable", transport, params, flow, broker, 1)
            res["headline"] = {"metric": "confirmed SEND/s", "value": res["rates"]["sends_per_s"], "unit": "1/s"}
            res["generator_ceiling"] = self.ceiling("send", transport)
            return res
        yield self.guarded(name, "durable", transport, params, body)

    # -- the generator's own ceiling ----------------------------------------------------------
    def min_ceiling(self, items):
        items = [c for c in items if c]
        if not items:
            return None
        best = min(items, key=lambda c: c["rate"])
        return {**best, "what": " / ".join(c["what"] for c in items) + " (lowest shown)"}

    def ceiling(self, kind: str, transport: str, links: int = 1):
        """The generator against a trivial sink/source/relay on loopback (cached per run)."""
        if not self.opts.ceiling:
            return None
        key = (kind, transport, links)
        if key in self.ceilings:
            return self.ceilings[key]
        if kind == "latency" and transport != "tcp":
            return None
        o = self.opts
        from bench_mock import serve
        ctx = self.ctx
        mode = {"send": "sink", "recv": "source", "latency": "relay"}[kind]
        dur = o.ceiling_duration
        nconsumer_procs = 0 if kind == "send" else (min(o.consumer_procs, links) if kind == "recv" else 1)
        shared = Shared(ctx, nconsumer_procs + (0 if kind == "recv" else 1))
        parent, child = ctx.Pipe(duplex=False)
        mock = ctx.Process(target=serve, args=(mode, o.size, child, shared.t0, time.monotonic() + dur + 60),
                           daemon=True)
        mock.start()
        child.close()
        try:
            if not parent.poll(10):
                raise BenchError("mock did not start")
            port = parent.recv()
            target = Target("127.0.0.1", port, f"ws://127.0.0.1:{port}/ws")
            label = f"ceiling-{kind}-{transport}" + (f"-x{links}" if kind == "recv" else "")
            if kind == "send":
                p = self.producer_spec(target, transport, "/topic/ceiling", window=0, final=False, duration=dur)
                flow = self.flow(label, [p], [], dur, None, fan=None, shared=shared)
                prod = flow.producers[0]
                rate = prod["sent"] / (prod["t_last_send"] - flow.t0)
                out = {"what": f"one producer process into a trivial sink ({transport})", "rate": round(rate),
                       "unit": "SEND/s", "mb_per_s": round(prod["bytes_sent"] / (prod["t_last_send"] - flow.t0) / 1e6, 1),
                       "generator_cpu_s": round(flow.generator_cpu, 3), "seconds": dur}
            elif kind == "recv":
                links_spec = [[("/topic/ceiling", "0", [])] for _ in range(links)]
                consumers = self.consumer_specs(target, transport, links_spec, o.consumer_procs)
                flow = self.flow(label, [], consumers, dur, None, fan=None, shared=shared, stop_at_duration=True)
                window = (flow.t_last_delivery or flow.t_stop) - flow.t0
                rate = flow.delivered / window
                out = {"what": f"{len(consumers)} consumer process(es), {links} connection(s), reading a source "
                               f"of pre-rendered MESSAGE frames ({transport})", "rate": round(rate),
                       "unit": "deliveries/s", "mb_per_s": round(sum(c["bytes"] for c in flow.consumers) / window / 1e6, 1),
                       "generator_cpu_s": round(flow.generator_cpu, 3), "seconds": dur}
            else:
                consumers = self.consumer_specs(target, transport, [[("/topic/ceiling", "0", [])]], 1, mode="latency")
                p = self.producer_spec(target, transport, "/topic/ceiling", mode="paced", window=0, final=False,
                                       duration=dur)
                flow = self.flow(label, [p], consumers, dur, None, fan=1, shared=shared)
                lat = [x / 1e6 for c in flow.consumers for x in c["latency_ns"]]
                pct = percentiles(lat)
                out = {"what": f"paced producer -> byte relay -> consumer at {o.rate}/s ({transport}): "
                               "the generator's own latency floor", "rate": o.rate, "unit": "msg/s",
                       "latency_ms": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in pct.items()},
                       "seconds": dur}
        except BenchError as exc:
            out = {"what": f"ceiling {kind} {transport} failed: {exc}", "rate": None, "unit": None}
        finally:
            mock.kill()
            mock.join(5)
        self.ceilings[key] = out
        if out.get("rate") is not None:
            print(f"  generator ceiling {kind}/{transport}{'/x' + str(links) if kind == 'recv' else ''}: "
                  f"{fmt_num(out['rate'])} {out['unit']}" +
                  (f", p99 {out['latency_ms']['p99']} ms" if "latency_ms" in out else ""), flush=True)
        return out

    # -- output -------------------------------------------------------------------------------
    def save(self) -> None:
        os.makedirs(self.opts.out, exist_ok=True)
        doc = {
            "generator": "scripts/bench.py", "run_id": self.run_id, "label": self.label,
            "started": self.started, "command": " ".join(shlex.quote(a) for a in sys.argv),
            "machine": machine_info(), "targets": {k: {"metric": v[0], "op": v[1], "goal": v[2], "unit": v[3]}
                                                   for k, v in TARGETS.items()},
            "ceilings": {"/".join(map(str, k)): v for k, v in self.ceilings.items()},
            "results": self.results,
        }
        for res in self.results:
            problems = validate_result(res)
            if problems:
                print(f"warning: result {res['name']} does not fit the schema: {problems}", file=sys.stderr)
        path = os.path.join(self.opts.out, "results.json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def flow_sent(procs) -> float:
    return sum((e[4] or {}).get("sent", 0) for e in procs if e[0] == "producer")


def latency_histogram(lat_ms: list[float]) -> dict:
    """Counts per log-spaced bucket (upper bounds in ms), for charts and comparisons."""
    bounds = [0.05 * (2 ** (i / 2)) for i in range(30)]   # 0.05 ms .. ~1.6 s
    counts = [0] * (len(bounds) + 1)
    import bisect
    for x in lat_ms:
        counts[bisect.bisect_left(bounds, x)] += 1
    return {"upper_ms": [round(b, 4) for b in bounds] + [None], "counts": counts}


def system_busy() -> float:
    """CPU seconds the whole machine has been busy (every process, every core)."""
    import psutil
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def machine_load(flow, broker_cpu) -> dict:
    """How busy the shared machine was during a run, and how much of that was neither the broker nor
    the generator (other people's work: the figures are noisy when this is high)."""
    window = max(flow.t_stop - flow.t0, 1e-9)
    busy = flow.sys_after - flow.sys_before
    others = busy - (broker_cpu or 0.0) - flow.generator_cpu
    return {"cores": os.cpu_count(), "busy_cores": round(busy / window, 2),
            "other_processes_cores": round(max(others, 0.0) / window, 2), "load_avg": os.getloadavg()}


def machine_info() -> dict:
    import platform
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        info["load_avg"] = os.getloadavg()
    except OSError:
        pass
    return info


def summary_line(res: dict) -> str:
    if res["status"] != "ok":
        return f"{res['name']:<22} {res['status'].upper()}: {'; '.join(res['notes'])[:300]}"
    h = res["headline"]
    value = h["value"]
    text = f"{value:.3f} ms" if h["unit"] == "ms" else f"{fmt_num(value)} {h['metric']}"
    extra = []
    if res["broker"].get("cpu_s") is not None:
        extra.append(f"broker CPU {res['broker']['cpu_s']:.2f} s")
    if res["deliveries_per_cpu_s"]:
        extra.append(f"{fmt_num(res['deliveries_per_cpu_s'])}/CPU-s")
    if res["latency_ms"]:
        lat = res["latency_ms"]
        extra.append(f"p50 {lat['p50']} p99 {lat['p99']} p99.9 {lat['p99.9']} ms")
    if res["mb_per_s"].get("payload"):
        extra.append(f"{res['mb_per_s']['payload']} MB/s payload")
    if res.get("machine"):
        extra.append(f"others used {res['machine']['other_processes_cores']} cores")
    if res["target"]:
        extra.append("target met" if res["target"]["met"] else f"target {res['target']['op']} {res['target']['goal']} NOT met")
    return f"{res['name']:<22} {text:<24} " + ", ".join(extra)


# -- chart -------------------------------------------------------------------------------------
def make_chart(doc: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in doc["results"] if r["status"] == "ok"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    fig.suptitle(f"{doc.get('label', '')}  (run {doc.get('run_id', '')}, {doc.get('started', '')})", fontsize=11)

    # 1. throughput per run, with the generator's ceiling and the target
    ax = axes[0][0]
    thr = [r for r in results if r["scenario"] in ("ingest", "one2one", "fanout", "queue", "durable")]
    names = [r["name"] for r in thr]
    values = [(r["rates"].get("sends_per_s") if r["scenario"] in ("ingest", "durable")
               else r["rates"].get("deliveries_per_s")) or 0 for r in thr]
    bars = ax.barh(names, values, color="#4C72B0")
    for i, r in enumerate(thr):
        c = r.get("generator_ceiling") or {}
        if c.get("rate"):
            ax.plot([c["rate"]], [i], marker="|", markersize=18, color="#C44E52")
        t = r.get("target")
        if t and t["op"] == ">=":
            ax.plot([t["goal"]], [i], marker="d", color="#55A868")
    for b, v in zip(bars, values):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + fmt_num(v), va="center", fontsize=8)
    if values and max(values) > 0:
        import math
        lo = min(v for v in values if v > 0) if any(v > 0 for v in values) else 1
        ax.set_xscale("log")
        ax.set_xlim(left=10 ** math.floor(math.log10(lo)))
    ax.set_title("throughput (SEND/s for ingest/durable, deliveries/s otherwise)\n"
                 "red |: generator ceiling, green \u2666: target", fontsize=9)
    ax.invert_yaxis()

    # 2. time series
    ax = axes[0][1]
    for r in thr:
        bins = r["rates"].get("bins_per_s") or []
        if bins:
            smooth = [sum(bins[i:i + 5]) / len(bins[i:i + 5]) for i in range(0, len(bins), 5)]
            ax.plot([i * 0.5 for i in range(len(smooth))], smooth, label=r["name"])
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("per second (0.5 s bins)")
    ax.set_title("rate over time", fontsize=9)
    if thr:
        ax.legend(fontsize=7)

    # 3. latency
    ax = axes[1][0]
    lat = [r for r in results if r["latency_ms"]]
    for r in lat:
        h = r["latency_ms"].get("histogram")
        if h:
            total = sum(h["counts"]) or 1
            cum, xs, ys = 0, [], []
            for ub, n in zip(h["upper_ms"], h["counts"]):
                cum += n
                if ub is not None:
                    xs.append(ub)
                    ys.append(cum / total)
            ax.plot(xs, ys, label=f"{r['name']} (p50 {r['latency_ms']['p50']}, p99 {r['latency_ms']['p99']}, "
                                  f"p99.9 {r['latency_ms']['p99.9']} ms)")
        c = r.get("generator_ceiling") or {}
        if c.get("latency_ms"):
            ax.axvline(c["latency_ms"]["p99"], color="#C44E52", linestyle=":", label="generator floor p99")
    if lat:
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no latency run", transform=ax.transAxes, ha="center")
    ax.set_xlabel("latency, ms (from the scheduled send time)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("latency CDF at fixed offered load", fontsize=9)
    if lat:
        ax.legend(fontsize=7)

    # 4. broker CPU per process
    ax = axes[1][1]
    rows = [r for r in results if r["broker"].get("cpu_by_process")]
    roles = sorted({k.split("#")[0] for r in rows for k in r["broker"]["cpu_by_process"]})
    left = [0.0] * len(rows)
    for role in roles:
        vals = [sum(v for k, v in r["broker"]["cpu_by_process"].items() if k.split("#")[0] == role)
                / max(r["duration_s"] or 1, 1e-9) for r in rows]
        ax.barh([r["name"] for r in rows], vals, left=left, label=role)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("broker CPU (cores busy on average over the run)")
    ax.set_title("where the broker spent CPU", fontsize=9)
    ax.invert_yaxis()
    idle = next((r for r in results if r["scenario"] == "idle"), None)
    if idle and idle["broker"].get("pss_bytes_per_connection") is not None:
        b = idle["broker"]
        ax.text(0.98, 0.02, f"idle: {idle['counts']['connections_open']} connections, "
                f"{b['pss_bytes_per_connection']} B PSS each\nCPU {b['cpu_s']} s over {idle['duration_s']} s",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
    if rows:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- comparison --------------------------------------------------------------------------------
def load_results(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        return json.load(f)


def compare(paths: list[str]) -> str:
    docs = [load_results(p) for p in paths]
    names = []
    for d in docs:
        for r in d["results"]:
            if r["name"] not in names:
                names.append(r["name"])
    lines = ["| run | " + " | ".join(d.get("label", p) for d, p in zip(docs, paths)) + " |",
             "|---|" + "---:|" * len(docs)]
    for name in names:
        cells = []
        for d in docs:
            r = next((r for r in d["results"] if r["name"] == name), None)
            if r is None:
                cells.append("")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                h = r["headline"]
                v = h["value"]
                cell = f"{v} ms" if h["unit"] == "ms" else f"{fmt_num(v)} {h['metric']}"
                if r["latency_ms"] and h["unit"] == "ms":
                    cell = f"p50 {r['latency_ms']['p50']} / p99 {r['latency_ms']['p99']} / p99.9 {r['latency_ms']['p99.9']} ms"
                if r.get("deliveries_per_cpu_s"):
                    cell += f" ({fmt_num(r['deliveries_per_cpu_s'])}/CPU-s)"
                if any("missing" in n for n in r["notes"]):
                    cell += " (incomplete: deliveries missing)"
                if r.get("machine"):
                    cell += f" [others {r['machine']['other_processes_cores']} cores]"
                cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("broker")
    g.add_argument("--spawn", nargs="?", const="", default=None, metavar="ARGS",
                   help="start this project's broker (python -m stompbroker port=0 ARGS), a fresh one per run")
    g.add_argument("--spawn-env", default=None, metavar="K=V ...",
                   help="environment variables for the spawned broker, e.g. \"MALLOC_MMAP_THRESHOLD_=268435456\"")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=None, help="TCP port of a running broker")
    g.add_argument("--ws", default=None, metavar="URL", help="WebSocket URL of a running broker (ws://host:port/path)")
    g.add_argument("--login", default=None)
    g.add_argument("--passcode", default=None)
    g.add_argument("--vhost", default=None, help="CONNECT host header (default '/')")
    g.add_argument("--pid", type=int, default=None, help="PID of a running broker: measure its process tree")
    g.add_argument("--label", default=None, help="name of the broker in results and comparisons")
    g = p.add_argument_group("runs")
    g.add_argument("--scenario", default="all", help=f"comma list of {', '.join(SCENARIOS)}, or all")
    g.add_argument("--transports", default=None,
                   help="comma list of tcp,ws for every scenario (default: fanout on both, others on the first available)")
    g.add_argument("--duration", type=float, default=10.0, help="seconds of load per run")
    g.add_argument("--size", type=int, default=117, help="message body bytes")
    g.add_argument("--rate", type=float, default=5000.0, help="offered load of the latency scenario, msg/s")
    g.add_argument("--fanout", type=int, default=75)
    g.add_argument("--queue-consumers", type=int, default=4)
    g.add_argument("--consumer-procs", type=int, default=2, help="consumer processes for multi-connection runs")
    g.add_argument("--batch-bytes", type=int, default=65536, help="bytes of pre-rendered frames per send call")
    g.add_argument("--window", type=int, default=20000,
                   help="SEND frames in flight between receipts (0: no receipts until the final one)")
    g.add_argument("--max-inflight", type=int, default=200000,
                   help="deliveries sent but not yet counted by the consumers before the producer waits")
    g.add_argument("--conn-inflight-bytes", type=int, default=8 << 20,
                   help="in-flight limit per consumer connection, in bytes of deliveries")
    g.add_argument("--drain-timeout", type=float, default=20.0, help="seconds allowed for deliveries after the producers stop")
    g.add_argument("--drain-quiet", type=float, default=2.0, help="seconds without deliveries that end a run early")
    g.add_argument("--setup-timeout", type=float, default=60.0)
    g.add_argument("--pause", type=float, default=2.0, help="seconds between runs (the machine is shared)")
    g.add_argument("--idle-connections", type=int, default=10000)
    g.add_argument("--idle-procs", type=int, default=4)
    g.add_argument("--idle-in-flight", type=int, default=200, help="connection attempts at once per process")
    g.add_argument("--idle-seconds", type=float, default=20.0)
    g.add_argument("--idle-base-seconds", type=float, default=5.0, help="idle CPU measured before connecting")
    g.add_argument("--durable", choices=("auto", "yes", "no"), default="auto")
    g.add_argument("--durable-args", default="store=sqlite", help="extra broker args for the durable run (--spawn)")
    g.add_argument("--durable-window", type=int, default=1000, help="SENDs awaiting their receipt at once")
    g.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the generator against a trivial sink/source first")
    g.add_argument("--ceiling-duration", type=float, default=3.0)
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="directory for results.json and bench.png (default out/bench-TIME)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--compare", nargs="+", metavar="RESULTS", default=None,
                   help="print a side-by-side Markdown table of results.json files (or their directories)")
    opts = p.parse_args(argv)
    return opts


def scenario_names(text: str) -> list[str]:
    out = []
    for word in text.split(","):
        word = ALIASES.get(word.strip(), word.strip())
        if not word:
            continue
        if word == "all":
            out += [s for s in SCENARIOS if s not in out]
        elif word in SCENARIOS:
            if word not in out:
                out.append(word)
        else:
            raise SystemExit(f"unknown scenario {word!r} (known: {', '.join(SCENARIOS)}, all)")
    return out


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = hard if hard != resource.RLIM_INFINITY else max(soft, want)
    if new > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv=None) -> int:
    opts = parse_args(argv)
    if opts.compare:
        table = compare(opts.compare)
        print(table)
        if opts.out:
            os.makedirs(opts.out, exist_ok=True)
            with open(os.path.join(opts.out, "compare.md"), "w") as f:
                f.write(table + "\n")
        return 0
    if opts.spawn is None and not (opts.port or opts.ws):
        raise SystemExit("give --spawn [ARGS], or the broker's --port and/or --ws URL")
    names = scenario_names(opts.scenario)
    limit = raise_fd_limit(opts.idle_connections + 1024)
    if "idle" in names:
        need = opts.idle_connections + 256
        print(f"file descriptors: this process may open {limit}; the broker needs about {need} "
              f"(start it with `ulimit -n {need * 2}` or more, and max_connections >= {opts.idle_connections})",
              file=sys.stderr)
    opts.out = opts.out or os.path.join(ROOT, "out", time.strftime("bench-%Y%m%d-%H%M%S"))
    runner = Runner(opts)
    print(f"bench: {runner.label}; scenarios {', '.join(names)}; results in {opts.out}", flush=True)
    try:
        runner.run_scenarios(names)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        runner.save()
        try:
            make_chart(load_results(opts.out), os.path.join(opts.out, "bench.png"))
        except Exception as exc:  # a chart problem must not lose the results
            print(f"chart not written: {exc!r}", file=sys.stderr)
    print(f"wrote {os.path.join(opts.out, 'results.json')} and bench.png")
    return 0 if all(r["status"] != "error" for r in runner.results) else 1


if __name__ == "__main__":
    sys.exit(main())
