"""One measured run and what every scenario shares: the broker under test, forking the workers,
starting them together, watching progress, deciding when a run is over, the generator's own ceiling
against the mock, and results.json."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shlex
import sys
import time
from multiprocessing.connection import wait

from .mock import serve
from .flowctl import describe, flow_spec
from .options import wanted_transports
from .profile import Recorder
from .procs import ROOT, BrokerProcs, SpawnedBroker, machine_info, machine_load, system_busy
from .report import TARGETS, Progress, new_result, validate_result
from .stats import BIN, fmt_num, merge_bins, percentiles, steady_rate
from .wire import BenchError, Target
from .workers import Shared, run_worker


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
        self.counters_before: dict = {}
        self.counters_after: dict = {}
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
        self.spawn_root = getattr(opts, "spawn_root", None) or ROOT
        self.flow_control = flow_spec(opts.flow, opts.bursts, opts.burst_bytes, opts.window, opts.batch_bytes)
        self.flow_label = describe(self.flow_control)
        self.queue_prefix = getattr(opts, "queue_prefix", "/queue/")
        self.repetition = 0
        self.last_profile: dict | None = None   # role -> py-spy raw file of the last run (--profile)
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
            b = SpawnedBroker(self.spawn_args + list(extra_args), env, root=self.spawn_root)
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
        wanted = wanted_transports(self.opts.transports, scenario)
        if wanted:
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
        recorder = None
        self.last_profile = None
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
            flow.counters_before = broker.counters() if broker else {}
            flow.sys_before = system_busy()
            flow.t0 = t0 = time.monotonic() + 0.2
            shared.t0.value = t0
            if getattr(o, "profile", False) and broker is not None and self.spawn_args is not None:
                recorder = Recorder(broker, os.path.join(o.out, "profiles"), f"{label}-{self.repetition}",
                                    duration, o.profile_rate)
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
            flow.counters_after = broker.counters() if broker else {}
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
            if recorder is not None:
                self.last_profile = recorder.wait(duration + 30)
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
                "max_inflight": o.max_inflight, "fan": 0, "grace": 30.0, "headers": list(o.send_header),
                "flow": self.flow_control}
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
            res["broker"]["syscalls_by_process"] = {
                role: {k: after[k] - flow.counters_before.get(role, {}).get(k, 0) for k in after}
                for role, after in flow.counters_after.items()}
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
        res["generator"]["frames_per_burst"] = next((p["frames_per_batch"] for p in flow.producers
                                                     if "frames_per_batch" in p), None)
        if res["counts"]["expected"] is not None and delivered < res["counts"]["expected"]:
            res["notes"].append(f"{res['counts']['expected'] - delivered} deliveries missing")
        closed = [why for c in flow.consumers for why in c.get("closed", [])]
        if closed:
            res["status"] = "error"
            res["notes"].insert(0, f"{len(closed)} consumer connection(s) closed during the run; "
                                   "the figures cover only the part before")
        return res

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
                p = self.producer_spec(target, transport, "/topic/ceiling", window=0, final=False, duration=dur,
                                       flow={"mode": "window"})
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
            "generator": "stompbroker-bench", "run_id": self.run_id, "label": self.label,
            "started": self.started, "command": " ".join(shlex.quote(a) for a in sys.argv),
            "machine": machine_info(), "targets": {k: {"metric": v[0], "op": v[1], "goal": v[2], "unit": v[3]}
                                                   for k, v in TARGETS.items()},
            "flow_control": {**self.flow_control, "text": self.flow_label},
            "queue_prefix": self.queue_prefix,
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
