"""The scenarios: ingest, one2one, fanout, queue, latency, lone, idle, durable.

Each is a generator function of (runner, transport) that yields result objects; docs/performance.md
says what each one measures and how.
"""

from __future__ import annotations

import contextlib
import resource
import shlex
import time

from .flowctl import describe, flow_spec
from .procs import BrokerProcs, broker_has_setting
from .profile import analyse, format_profile, wake_cost_us
from .report import Progress, check_target, new_result, summary_line
from .stats import BIN, latency_histogram, percentiles, steady_rate
from .wire import BenchError
from .workers import Shared, run_worker

SCENARIOS = ("ingest", "one2one", "fanout", "queue", "latency", "lone", "idle", "durable")
ALIASES = {"1to1": "one2one", "1-1": "one2one", "fan-out": "fanout", "footprint": "idle"}


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


def run_scenarios(runners, names: list[str], repeat: int = 1) -> None:
    """Run each scenario on each of its transports, `repeat` times, against each runner's broker in
    turn (interleaved, so a noisy neighbour hits every target alike); each runner saves its
    results.json after every result."""
    for name in names:
        fn = RUNS[name]
        for rep in range(max(repeat, 1)):
            for runner in runners:
                runner.repetition = rep
                transports = runner.transports_for(name) if name not in ("idle",) else ["tcp"]
                if not transports:
                    runner.results.append(runner.skipped(name, None, "no address for the transports asked for"))
                    continue
                for transport in transports:
                    for res in fn(runner, transport):
                        res["repetition"] = rep
                        if runner.last_profile and res["status"] == "ok":
                            res["profile"] = analyse(runner.last_profile, res, runner.spawn_root, wake_cost_us())
                        runner.last_profile = None
                        runner.results.append(res)
                        who = f"{runner.label}: " if len(runners) > 1 else ""
                        print(who + summary_line(res), flush=True)
                        if res.get("profile"):
                            print(format_profile(res) + "\n", flush=True)
                        runner.save()
                    # pause between heavy runs: the machine is shared
                    time.sleep(runner.opts.pause)


# -- the scenarios: each yields result objects -------------------------------------------------
def ingest(runner, transport):
    name = f"ingest-{transport}"
    params = {"producers": 1, "subscribers": 0, "size": runner.opts.size, "duration": runner.opts.duration,
              "flow_control": runner.flow_label}

    def body():
        with runner.broker() as (target, broker):
            dest = f"/topic/bench-{runner.run_id}-ingest"
            p = runner.producer_spec(target, transport, dest)
            flow = runner.flow(name, [p], [], runner.opts.duration, broker, fan=None)
        res = new_result(name, "ingest", transport, params)
        prod = flow.producers[0]
        window = prod["t_done"] - flow.t0
        res["counts"] = {"sent": prod["sent"]}
        res["rates"] = {"sends_per_s": round(prod["sent"] / window),
                        "steady_sends_per_s": steady_rate(prod["bins"]),
                        "bins_per_s": [n / BIN for n in prod["bins"]]}
        res["mb_per_s"] = {"payload": round(prod["sent"] * runner.opts.size / window / 1e6, 2),
                           "wire": round(prod["bytes_sent"] / window / 1e6, 2)}
        runner.fill_common(res, flow, broker, window, prod["sent"])
        res["headline"] = {"metric": "SEND/s", "value": res["rates"]["sends_per_s"], "unit": "1/s"}
        res["target"] = check_target("ingest", res["rates"]["sends_per_s"])
        res["generator_ceiling"] = runner.ceiling("send", transport)
        res["generator"]["stalled_s"] = round(prod.get("stalled_s", 0), 3)
        res["generator"]["frames_per_burst"] = prod.get("frames_per_batch")
        res["notes"].append("deliveries_per_cpu_s here is SENDs processed per broker CPU-second")
        return res
    yield runner.guarded(name, "ingest", transport, params, body)


def one2one(runner, transport):
    name = f"one2one-{transport}"
    params = {"producers": 1, "consumers": 1, "size": runner.opts.size, "duration": runner.opts.duration,
              "flow_control": runner.flow_label, "max_inflight": runner.opts.max_inflight}

    def body():
        with runner.broker() as (target, broker):
            dest = f"/topic/bench-{runner.run_id}-one2one"
            consumers = runner.consumer_specs(target, transport, [[(dest, "0", [])]], 1)
            p = runner.producer_spec(target, transport, dest, fan=1, max_inflight=runner.inflight_cap(1))
            flow = runner.flow(name, [p], consumers, runner.opts.duration, broker, fan=1)
        res = runner.delivery_result(name, "one2one", transport, params, flow, broker, 1)
        res["target"] = check_target("one2one", res["rates"]["deliveries_per_s"])
        res["generator_ceiling"] = runner.min_ceiling([runner.ceiling("send", transport),
                                                       runner.ceiling("recv", transport, 1)])
        return res
    yield runner.guarded(name, "one2one", transport, params, body)


def fanout(runner, transport):
    n = runner.opts.fanout
    for layout in ("conns", "subs"):
        name = f"fanout-{layout}-{transport}"
        params = {"producers": 1, "fanout": n, "layout": ("one connection per subscriber" if layout == "conns"
                  else f"one connection with {n} subscriptions"), "size": runner.opts.size,
                  "duration": runner.opts.duration, "consumer_procs": runner.opts.consumer_procs,
                  "flow_control": runner.flow_label, "max_inflight": runner.opts.max_inflight}

        def body(layout=layout, name=name, params=params):
            with runner.broker() as (target, broker):
                dest = f"/topic/bench-{runner.run_id}-fanout"
                if layout == "conns":
                    links = [[(dest, "0", [])] for _ in range(n)]
                    consumers = runner.consumer_specs(target, transport, links, runner.opts.consumer_procs)
                else:
                    links = [[(dest, str(i), []) for i in range(n)]]
                    consumers = runner.consumer_specs(target, transport, links, 1)
                p = runner.producer_spec(target, transport, dest, fan=n,
                                         max_inflight=runner.inflight_cap(n if layout == "conns" else 1))
                flow = runner.flow(name, [p], consumers, runner.opts.duration, broker, fan=n)
            res = runner.delivery_result(name, "fanout", transport, params, flow, broker, n)
            key = "fanout_conns" if layout == "conns" else "fanout_ws" if transport == "ws" else "fanout"
            res["target"] = check_target(key, res["rates"]["deliveries_per_s"])
            res["generator_ceiling"] = runner.ceiling("recv", transport, n if layout == "conns" else 1)
            return res
        yield runner.guarded(name, "fanout", transport, params, body)
        if layout == "conns":
            time.sleep(runner.opts.pause)


def queue(runner, transport):
    k = runner.opts.queue_consumers
    name = f"queue-{transport}"
    params = {"producers": 1, "consumers": k, "size": runner.opts.size, "duration": runner.opts.duration,
              "flow_control": runner.flow_label, "max_inflight": runner.opts.max_inflight,
              "queue_prefix": runner.queue_prefix}

    def body():
        with runner.broker() as (target, broker):
            dest = f"{runner.queue_prefix}bench-{runner.run_id}-q"
            links = [[(dest, "0", [])] for _ in range(k)]
            consumers = runner.consumer_specs(target, transport, links, min(runner.opts.consumer_procs, k))
            p = runner.producer_spec(target, transport, dest, fan=1, max_inflight=runner.inflight_cap(k))
            flow = runner.flow(name, [p], consumers, runner.opts.duration, broker, fan=1)
        res = runner.delivery_result(name, "queue", transport, params, flow, broker, 1)
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
                                f"treats {runner.queue_prefix} like a topic (no competing consumers)")
        res["target"] = check_target("queue", res["rates"]["deliveries_per_s"])
        res["generator_ceiling"] = runner.ceiling("send", transport)
        return res
    yield runner.guarded(name, "queue", transport, params, body)


def latency(runner, transport):
    name = f"latency-{transport}"
    o = runner.opts
    params = {"rate": o.rate, "size": o.size, "duration": o.duration, "producers": 1, "consumers": 1,
              "pacing": "open loop: latency measured from each message's scheduled send time",
              "flow_control": describe(flow_spec("paced", rate=o.rate)),
              "latency": "delivery: scheduled send -> MESSAGE read by the consumer; "
                         "receipt: scheduled send -> RECEIPT read by the producer"}

    def body():
        with runner.broker() as (target, broker):
            dest = f"/topic/bench-{runner.run_id}-latency"
            consumers = runner.consumer_specs(target, transport, [[(dest, "0", [])]], 1, mode="latency")
            p = runner.producer_spec(target, transport, dest, mode="paced", fan=1, window=0, receipts=True)
            flow = runner.flow(name, [p], consumers, o.duration, broker, fan=1)
        res = runner.delivery_result(name, "latency", transport, params, flow, broker, 1)
        lat = [x / 1e6 for c in flow.consumers for x in c["latency_ns"]]
        pct = percentiles(lat)
        res["latency_ms"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in pct.items()}
        res["latency_ms"]["histogram"] = latency_histogram(lat)
        rlat = [x / 1e6 for p in flow.producers for x in p.get("receipt_latency_ns", [])]
        res["receipt_latency_ms"] = {k: (round(v, 3) if isinstance(v, float) else v)
                                     for k, v in percentiles(rlat).items()}
        res["rates"]["offered_per_s"] = o.rate
        res["generator"]["max_send_lag_ms"] = round(flow.producers[0].get("max_lag_s", 0) * 1000, 3)
        res["headline"] = {"metric": "p99 latency", "value": res["latency_ms"]["p99"], "unit": "ms"}
        res["target"] = check_target("latency", res["latency_ms"]["p99"], o.rate)
        res["generator_ceiling"] = runner.ceiling("latency", transport)
        return res
    yield runner.guarded(name, "latency", transport, params, body)


LONE_FLOW = ("one SEND in flight: each asks for a receipt (an id of its own); the next goes when its RECEIPT "
             "and MESSAGE are back")


def lone(runner, transport):
    """A lone receipted SEND: one producer, one subscriber on another connection, one SEND in flight.
    Every broker process sleeps between messages, so this is the fixed cost of one message's trip
    (wake-ups, system calls, loop rounds): broker CPU per SEND, per process, and the read/write
    system calls and context switches per SEND that /proc counts."""
    name = f"lone-{transport}"
    o = runner.opts
    params = {"producers": 1, "consumers": 1, "size": o.size, "duration": o.duration, "flow_control": LONE_FLOW}

    def body():
        with runner.broker() as (target, broker):
            dest = f"/topic/bench-{runner.run_id}-lone"
            consumers = runner.consumer_specs(target, transport, [[(dest, "0", [])]], 1)
            p = runner.producer_spec(target, transport, dest, mode="lone", fan=1)
            flow = runner.flow(name, [p], consumers, o.duration, broker, fan=1)
        res = runner.delivery_result(name, "lone", transport, params, flow, broker, 1)
        res["lone"] = lone_figures(res, flow.sent)
        us = res["lone"]["cpu_us_per_send"]
        res["headline"] = ({"metric": "broker CPU per lone SEND", "value": us, "unit": "us"} if us is not None
                           else {"metric": "SEND/s", "value": res["rates"]["sends_per_s"], "unit": "1/s"})
        res["target"] = check_target("lone", us)
        return res
    yield runner.guarded(name, "lone", transport, params, body)


def lone_figures(res: dict, sent: int) -> dict:
    """Per SEND: broker CPU (µs, all processes and each), and the /proc counters of each process."""
    broker = res["broker"]
    total = broker.get("cpu_s")
    if not sent or total is None:
        return {"cpu_us_per_send": None, "cpu_us_by_process": {}, "syscalls_per_send": {}}
    return {
        "cpu_us_per_send": round(total * 1e6 / sent, 1),
        "cpu_us_by_process": {role: round(s * 1e6 / sent, 1) for role, s in broker["cpu_by_process"].items()},
        "kernel_us_by_process": {role: round(s * 1e6 / sent, 1)
                                 for role, s in broker.get("kernel_cpu_by_process", {}).items()},
        "syscalls_per_send": {role: {k: round(v / sent, 2) for k, v in counts.items()}
                              for role, counts in broker.get("syscalls_by_process", {}).items()},
    }


def idle(runner, transport):
    o = runner.opts
    name = "idle"
    params = {"connections": o.idle_connections, "processes": o.idle_procs, "idle_seconds": o.idle_seconds,
              "base_seconds": o.idle_base_seconds}

    def body():
        res = new_result(name, "idle", "tcp", params)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        per_proc = -(-o.idle_connections // o.idle_procs) + 64
        if soft < per_proc:
            raise BenchError(f"RLIMIT_NOFILE is {soft}; need {per_proc} per process")
        with runner.broker() as (target, broker):
            if broker is None:
                res["notes"].append("no --pid: broker memory and CPU are not measured")
            time.sleep(1.0)
            mem0, mem0_by, uss0 = broker.memory() if broker else (None, {}, None)
            shm0 = broker.shm_pss() if broker else None
            cpu_a = broker.cpu() if broker else {}
            time.sleep(o.idle_base_seconds)
            cpu_b = broker.cpu() if broker else {}
            ctx = runner.ctx
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
                    msg = runner._recv(entry, time.monotonic() + 90)
                    if msg[0] != "ready":
                        raise BenchError(msg[1])
                    infos.append(msg[1])
                opened = sum(i["open"] for i in infos)
                open_s = time.monotonic() - t_open
                time.sleep(2.0)  # let the broker settle
                mem1, mem1_by, uss1 = broker.memory() if broker else (None, {}, None)
                shm1 = broker.shm_pss() if broker else None
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
                        msg = runner._recv(entry, time.monotonic() + 30)
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
        res["broker"]["label"] = runner.label
        if broker is not None:
            base = {k: v for k, v in BrokerProcs.delta(cpu_a, cpu_b).items() if not k.endswith(":sys")}
            idle = {k: v for k, v in BrokerProcs.delta(cpu_c, cpu_d).items() if not k.endswith(":sys")}
            per_conn = (mem1 - mem0) / opened if opened and mem0 is not None and mem1 is not None else None
            uss_conn = (uss1 - uss0) / opened if opened and uss0 is not None and uss1 is not None else None
            # Part of the PSS above, told apart: ring pages the connections' records touched first (a
            # fixed cost, bounded by the rings' size, that any broker which carried traffic has paid).
            shm_conn = (shm1 - shm0) / opened if opened and shm0 is not None and shm1 is not None else None
            res["broker"].update({
                "cpu_s": idle.pop("_total", None), "cpu_by_process": idle,
                "cpu_base_s": base.pop("_total", None), "cpu_base_by_process": base,
                "pss_bytes": mem1, "pss_start_bytes": mem0, "pss_end_bytes": mem2,
                "pss_start_by_process": mem0_by, "pss_with_connections_by_process": mem1_by,
                "pss_bytes_per_connection": round(per_conn) if per_conn is not None else None,
                "uss_bytes_per_connection": round(uss_conn) if uss_conn is not None else None,
                "shm_pss_bytes_per_connection": round(shm_conn) if shm_conn is not None else None,
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
    yield runner.guarded(name, "idle", "tcp", params, body)


def durable(runner, transport):
    o = runner.opts
    name = f"durable-{transport}"
    params = {"producers": 1, "consumers": 1, "size": o.size, "duration": o.duration,
              "receipt_window": o.durable_window, "headers": "persistent:true", "broker_args": o.durable_args,
              "flow_control": f"receipt on every SEND, <= {o.durable_window} unreceipted"}
    if runner.spawn_args is not None:
        if o.durable == "no" or (o.durable == "auto" and not broker_has_setting("store")):
            yield runner.skipped(name, transport, "skipped: this broker has no store setting (store=sqlite) yet")
            return
        extra = shlex.split(o.durable_args)
    else:
        if o.durable == "no":
            yield runner.skipped(name, transport, "skipped (--durable no)")
            return
        extra = []

    def body():
        with runner.broker(extra) as (target, broker):
            dest = f"/queue/bench-{runner.run_id}-durable"
            consumers = runner.consumer_specs(target, transport, [[(dest, "0", [])]], 1)
            p = runner.producer_spec(target, transport, dest, fan=1, receipt_each=True, window=o.durable_window,
                                     headers=[("persistent", "true")])
            flow = runner.flow(name, [p], consumers, o.duration, broker, fan=1)
        res = runner.delivery_result(name, "durable", transport, params, flow, broker, 1)
        res["headline"] = {"metric": "confirmed SEND/s", "value": res["rates"]["sends_per_s"], "unit": "1/s"}
        res["generator_ceiling"] = runner.ceiling("send", transport)
        return res
    yield runner.guarded(name, "durable", transport, params, body)


RUNS = {"ingest": ingest, "one2one": one2one, "fanout": fanout, "queue": queue, "latency": latency,
        "lone": lone, "idle": idle, "durable": durable}
