"""Side by side: the same rows measured on several brokers, medians and ratios.

A target on the command line (``--compare T1 T2 ...``) is one of:

- ``NAME=HOST:PORT[,ws=URL][,pid=PID][,login=L][,passcode=P]``: any STOMP broker already listening
  (``pid`` adds its CPU and memory: the process and its children);
- ``NAME=git:REF``: this project's broker at a git commit, branch or tag, extracted with
  ``git archive`` into ``OUT/NAME/tree`` (the repository is not touched), its C modules compiled in
  place, and spawned with
  ``--spawn`` ARGS, a fresh one per run;
- ``NAME=.``: this checkout's broker, spawned the same way;
- either of the last two with ``,env=NAME=VALUE`` (repeatable): extra environment for that broker
  only (a ``PYTHONPATH`` given so goes before the broker's tree);
- a ``results.json`` file or its directory from an earlier run (figures only, nothing is run).

Any of the first three may override, for that target only, options every target otherwise shares
(``TARGET_OPTIONS``): ``bursts=N`` and ``burst-bytes=N`` (the producers' flow control, e.g.
``bursts=1,burst-bytes=16000`` for stompica, which corrupts frames with more in flight) and
``queue-prefix=P`` (the queue scenario's destination is P + name, e.g. ``#`` for stompica's
round-robin ``#name``). Each result records the flow control it ran with; the table says it per
target when targets differ.

``NAME=`` may be left out: a path that exists is a results file, ``HOST:PORT`` a running broker,
anything else a git ref. The first target is the base of the ratio columns.

Runs are interleaved (for each scenario, for each repetition, each target in turn) so that the
neighbours' load on a shared machine falls on every target alike.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile

from .stats import fmt_num

# (row label, result name, value path in the result, unit, higher is better)
ROWS = [
    ("ingest, topic with no subscriber, SEND/s", "ingest-tcp", ("rates", "sends_per_s"), "1/s", True),
    ("ingest, SEND per broker CPU-second", "ingest-tcp", ("deliveries_per_cpu_s",), "1/CPU-s", True),
    ("1 -> 1 topic, deliveries/s", "one2one-tcp", ("rates", "deliveries_per_s"), "1/s", True),
    ("1 -> 1, deliveries per CPU-second", "one2one-tcp", ("deliveries_per_cpu_s",), "1/CPU-s", True),
    ("WebSocket 1 -> 1 topic, deliveries/s", "one2one-ws", ("rates", "deliveries_per_s"), "1/s", True),
    ("WebSocket 1 -> 1, deliveries per CPU-second", "one2one-ws", ("deliveries_per_cpu_s",), "1/CPU-s", True),
    ("queue 1 -> 4 competing consumers, deliveries/s", "queue-tcp", ("rates", "deliveries_per_s"), "1/s", True),
    ("queue 1 -> 4, deliveries per CPU-second", "queue-tcp", ("deliveries_per_cpu_s",), "1/CPU-s", True),
    ("fan-out 1 -> 75 subscriptions on one connection", "fanout-subs-tcp", ("rates", "deliveries_per_s"), "1/s", True),
    ("fan-out 1 -> 75 subscriptions, deliveries per CPU-second", "fanout-subs-tcp", ("deliveries_per_cpu_s",),
     "1/CPU-s", True),
    ("fan-out 1 -> 75 connections", "fanout-conns-tcp", ("rates", "deliveries_per_s"), "1/s", True),
    ("fan-out 1 -> 75 connections, deliveries per CPU-second", "fanout-conns-tcp", ("deliveries_per_cpu_s",),
     "1/CPU-s", True),
    ("WebSocket 1 -> 75 subscriptions on one connection", "fanout-subs-ws", ("rates", "deliveries_per_s"), "1/s", True),
    ("WebSocket 1 -> 75 subscriptions, deliveries per CPU-second", "fanout-subs-ws", ("deliveries_per_cpu_s",),
     "1/CPU-s", True),
    ("WebSocket 1 -> 75 connections", "fanout-conns-ws", ("rates", "deliveries_per_s"), "1/s", True),
    ("WebSocket 1 -> 75 connections, deliveries per CPU-second", "fanout-conns-ws", ("deliveries_per_cpu_s",),
     "1/CPU-s", True),
    ("latency at RATE msg/s, delivery p50, ms", "latency-tcp", ("latency_ms", "p50"), "ms", False),
    ("latency at RATE msg/s, delivery p99, ms", "latency-tcp", ("latency_ms", "p99"), "ms", False),
    ("latency at RATE msg/s, receipt p50, ms", "latency-tcp", ("receipt_latency_ms", "p50"), "ms", False),
    ("latency at RATE msg/s, receipt p99, ms", "latency-tcp", ("receipt_latency_ms", "p99"), "ms", False),
    ("latency at RATE msg/s, deliveries per broker CPU-second", "latency-tcp", ("deliveries_per_cpu_s",), "1/CPU-s",
     True),
    ("lone receipted SEND (one in flight), broker CPU µs per SEND", "lone-tcp", ("lone", "cpu_us_per_send"), "µs",
     False),
    ("lone SEND: reader µs", "lone-tcp", ("lone", "cpu_us_by_process", "reader"), "µs", False),
    ("lone SEND: dispatcher µs", "lone-tcp", ("lone", "cpu_us_by_process", "dispatcher"), "µs", False),
    ("lone SEND: writer µs", "lone-tcp", ("lone", "cpu_us_by_process", "writer-0"), "µs", False),
    ("lone SEND: supervisor µs", "lone-tcp", ("lone", "cpu_us_by_process", "supervisor"), "µs", False),
    ("memory per idle connection (PSS), bytes", "idle", ("broker", "pss_bytes_per_connection"), "B", False),
    ("memory per idle connection (USS), bytes", "idle", ("broker", "uss_bytes_per_connection"), "B", False),
    ("of the PSS: ring pages first touched (shared memory), bytes", "idle",
     ("broker", "shm_pss_bytes_per_connection"), "B", False),
]


# -- targets -------------------------------------------------------------------------------------
# Options a target may set for itself: spec key -> (options attribute, type).
TARGET_OPTIONS = {"bursts": ("bursts", int), "burst-bytes": ("burst_bytes", int), "queue-prefix": ("queue_prefix", str)}


def parse_target(text: str) -> dict:
    """One ``--compare`` word -> {"name", "kind": results|address|git|checkout, ...}; per-target
    overrides of shared options (TARGET_OPTIONS) go into "options"."""
    name, sep, spec = text.partition("=")
    if not sep or "/" in name or ":" in name:
        name, spec = "", text
    parts = spec.split(",")
    if parts[0] == "." or parts[0].startswith("git:"):
        out = ({"name": name or "this checkout", "kind": "checkout"} if parts[0] == "."
               else {"name": name or parts[0][4:], "kind": "git", "ref": parts[0][4:]})
        own = {"env": str}
    else:
        m = re.fullmatch(r"\[?([\w.:-]+?)\]?:(\d+)", parts[0])
        if not m or os.path.exists(spec):
            if os.path.exists(spec):
                return {"name": name or spec.rstrip("/"), "kind": "results", "path": spec}
            return {"name": name or spec, "kind": "git", "ref": spec}
        out = {"name": name or parts[0], "kind": "address", "host": m.group(1), "port": int(m.group(2))}
        own = {"ws": str, "pid": int, "login": str, "passcode": str}
    for opt in parts[1:]:
        key, eq, value = opt.partition("=")
        try:
            if not eq or (key not in own and key not in TARGET_OPTIONS) or (key == "env" and "=" not in value):
                raise ValueError
            if key == "env":
                out.setdefault("env", []).append(value)
            elif key in own:
                out[key] = own[key](value)
            else:
                attr, kind = TARGET_OPTIONS[key]
                out.setdefault("options", {})[attr] = kind(value)
        except ValueError:
            known = ", ".join([*(f"{k}=NAME=VALUE" if k == "env" else f"{k}=" for k in own), *(f"{k}=" for k in TARGET_OPTIONS)])
            raise ValueError(f"{text!r}: unknown or bad option {opt!r} ({known})") from None
    return out


def extract_ref(ref: str, repo: str, where: str | None = None) -> tuple[str, str]:
    """``git archive REF`` of the package into `where` (a new temporary directory if None);
    returns (directory, full commit)."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout.strip()
    if where is None:
        where = tempfile.mkdtemp(prefix=f"bench-{commit[:9]}-")
    else:
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
    archive = subprocess.Popen(["git", "archive", "--format=tar", commit, "stompbroker"], cwd=repo,
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", where], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    build_c(where)
    return where, commit


def build_c(tree: str) -> list[str]:
    """Compile a tree's C modules in place, as the install does, so a commit runs as it would
    installed; returns the modules built (one that does not compile leaves that part pure Python)."""
    include = sysconfig.get_paths()["include"]
    built = []
    for source in sorted(glob.glob(os.path.join(tree, "stompbroker", "**", "*.c"), recursive=True)):
        module = source[:-2] + sysconfig.get_config_var("EXT_SUFFIX")
        done = subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{include}", source, "-o", module],
                              capture_output=True, text=True)
        if done.returncode == 0:
            built.append(module)
        else:
            print(f"bench: {source} did not compile; that tree parses in pure Python:\n{done.stderr}", file=sys.stderr)
    return built


# -- the table -----------------------------------------------------------------------------------
def pick(result: dict, path: tuple):
    value = result
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row_values(results: list[dict], name: str, path: tuple) -> list:
    """The value of one row in every ok result of that name (one per repetition)."""
    return [v for r in results if r.get("name") == name and r.get("status") == "ok"
            for v in [pick(r, path)] if v is not None]


def cell(values: list, unit: str) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if unit == "µs":
        text = f"{med:.1f}"
    else:
        text = f"{med:.3g}" if unit == "ms" else fmt_num(round(med))
    if len(values) > 1:
        lo, hi = min(values), max(values)
        text += (f" ({lo:.1f}-{hi:.1f})" if unit == "µs" else f" ({lo:.3g}-{hi:.3g})" if unit == "ms"
                 else f" ({fmt_num(round(lo))}-{fmt_num(round(hi))})")
    return text


def ratio(values: list, base: list) -> str:
    if not values or not base:
        return "-"
    b = statistics.median(base)
    return f"{statistics.median(values) / b:.2f}x" if b > 0 else "-"   # a base of 0 or less (noise) has none


def table(columns: list[tuple[str, list[dict]]], rate: float | None = None, flow: str | None = None) -> str:
    """Markdown: one line per row that any column measured; each cell the median of its results
    (the range when there were several), then each column's ratio to the first."""
    names = [c[0] for c in columns]
    head = ["path"] + names + [f"{n} / {names[0]}" for n in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for label, name, path, unit, _higher in ROWS:
        per = [row_values(results, name, path) for _, results in columns]
        if not any(per):
            continue
        label = label.replace("RATE", f"{rate:,.0f}" if rate else "the offered")
        cells = [cell(v, unit) for v in per] + [ratio(v, per[0]) for v in per[1:]]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    notes = []
    flows = {n: flow_controls(results) for n, results in columns}
    if len({tuple(f) for f in flows.values() if f}) > 1:
        notes.append("flow control: " + "; ".join(f"{n}: {', '.join(f)}" for n, f in flows.items() if f))
    elif flow or any(flows.values()):
        notes.append("flow control: " + "; ".join(next((f for f in flows.values() if f), [flow])))
    prefixes = [f"{n}: {p}name" for n, results in columns
                for p in sorted({r["parameters"].get("queue_prefix") for r in results
                                 if r.get("scenario") == "queue"} - {None, "/queue/"})]
    if prefixes:
        notes.append("queue destinations: " + "; ".join(prefixes) + " (others /queue/name)")
    reps = max((len(row_values(results, name, path)) for _, results in columns for _, name, path, _, _ in ROWS),
               default=0)
    if reps > 1:
        notes.append(f"each cell the median of up to {reps} runs (range in brackets)")
    notes.append("latency: delivery = scheduled send to MESSAGE read, receipt = scheduled send to RECEIPT read")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def flow_controls(results: list[dict]) -> list[str]:
    """The flow controls of a target's throughput runs, as the results recorded them."""
    return sorted({r["parameters"].get("flow_control") for r in results
                   if r.get("scenario") in ("ingest", "one2one", "queue", "fanout")
                   and r.get("parameters", {}).get("flow_control")})
