"""The ``stompbroker-bench`` options, shared by its command line (``cli.py``) and the cluster
scenarios' (``cluster.py``)."""

from __future__ import annotations

import argparse

from . import __doc__ as PACKAGE_DOC
from .scenarios import SCENARIOS


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="stompbroker-bench", description=PACKAGE_DOC.split("\n\n")[0],
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
    g.add_argument("--transports", default=None, type=transports_spec,
                   help="comma list of tcp,ws for every scenario, and/or SCENARIO=T1+T2 for one scenario, e.g. "
                        "one2one=tcp+ws (default: fanout on both, others on the first available)")
    g.add_argument("--duration", type=float, default=10.0, help="seconds of load per run")
    g.add_argument("--size", type=int, default=117, help="message body bytes")
    g.add_argument("--rate", type=float, default=5000.0, help="offered load of the latency scenario, msg/s")
    g.add_argument("--send-header", action="append", default=[], metavar="NAME:VALUE", type=send_header,
                   help="an extra header on every producer SEND (repeatable), e.g. priority:7 or x-delay:1 to "
                        "measure a priority queue or a scheduled SEND against a plain one")
    g.add_argument("--queue-prefix", default="/queue/", metavar="PREFIX",
                   help="the queue scenario's destination is PREFIX + name (e.g. '#' for stompica's round-robin #name)")
    g.add_argument("--fanout", type=int, default=75)
    g.add_argument("--queue-consumers", type=int, default=4)
    g.add_argument("--consumer-procs", type=int, default=2, help="consumer processes for multi-connection runs")
    g.add_argument("--batch-bytes", type=int, default=65536, help="bytes of pre-rendered frames per send call")
    g.add_argument("--flow", choices=("bursts", "window"), default="bursts",
                   help="producer flow control: 'bursts' keeps at most --bursts bursts of at most --burst-bytes "
                        "unreceipted, the last frame of each asking for a receipt (how real producers wait); "
                        "'window' keeps up to --window SENDs in flight (a ceiling, labelled so in the output)")
    g.add_argument("--bursts", type=int, default=4, help="bursts in flight (unreceipted) with --flow bursts")
    g.add_argument("--burst-bytes", type=int, default=16384, help="wire bytes per burst with --flow bursts")
    g.add_argument("--window", type=int, default=20000,
                   help="with --flow window: SEND frames in flight between receipts (0: no receipts until the final one)")
    g.add_argument("--max-inflight", type=int, default=200000,
                   help="deliveries sent but not yet counted by the consumers before the producer waits")
    g.add_argument("--conn-inflight-bytes", type=int, default=8 << 20,
                   help="in-flight limit per consumer connection, in bytes of deliveries")
    g.add_argument("--drain-timeout", type=float, default=20.0, help="seconds allowed for deliveries after the producers stop")
    g.add_argument("--drain-quiet", type=float, default=2.0, help="seconds without deliveries that end a run early")
    g.add_argument("--setup-timeout", type=float, default=60.0)
    g.add_argument("--pause", type=float, default=2.0, help="seconds between runs (the machine is shared)")
    g.add_argument("--repeat", type=int, default=1, help="runs of each scenario (per target); tables show the median")
    g.add_argument("--idle-connections", type=int, default=2000)
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
    g.add_argument("--profile", action="store_true",
                   help="record each broker process (reader, dispatcher, writers) with py-spy during each run and "
                        "report CPU per frame by cost (parse, ring write/read, routing, render, batch, send...); "
                        "spawned brokers only (--spawn or --compare git:REF / .)")
    g.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="directory for results.json and bench.png (default out/bench-TIME)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--compare", nargs="+", metavar="TARGET", default=None,
                   help="run the same scenarios against each target in turn and print a table of medians "
                        "and ratios to the first: NAME=HOST:PORT[,ws=URL][,pid=PID] (any STOMP broker), "
                        "NAME=git:REF (this broker at a git ref, spawned with --spawn ARGS), NAME=. (this "
                        "checkout), or a results.json / its directory from an earlier run; a running broker, "
                        "git:REF or . may add its own bursts=N, burst-bytes=N, queue-prefix=P (e.g. stompica: "
                        "...,bursts=1,burst-bytes=16000,queue-prefix=#)")
    opts = p.parse_args(argv)
    return opts


def transports_spec(text: str) -> str:
    """Checks --transports: ``tcp,ws`` (every scenario) and/or ``SCENARIO=tcp+ws`` items."""
    for item in filter(None, text.split(",")):
        scenario, eq, value = item.rpartition("=")
        if (eq and scenario not in SCENARIOS) or not value or any(t not in ("tcp", "ws") for t in value.split("+")):
            raise argparse.ArgumentTypeError(f"{item!r}: give tcp, ws, or SCENARIO=tcp+ws (scenarios: "
                                             f"{', '.join(SCENARIOS)})")
    return text


def wanted_transports(text: str | None, scenario: str) -> list[str] | None:
    """The transports --transports asks for in one scenario; None: not said (the default applies)."""
    every, per = [], {}
    for item in filter(None, (text or "").split(",")):
        name, eq, value = item.rpartition("=")
        (per.setdefault(name, []) if eq else every).extend(value.split("+"))
    return per.get(scenario) or every or None


def send_header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name:
        raise argparse.ArgumentTypeError(f"a header is NAME:VALUE, not {text!r}")
    return name, value
