"""The ``stompbroker-bench`` command line (also ``python -m stompbroker.bench``)."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import resource
import shlex
import sys
import time

from .compare import extract_ref, parse_target, table
from .options import parse_args
from .procs import ROOT
from .profile import compare_profiles, reanalyse
from .report import compare, load_results, make_chart
from .runner import Runner
from .scenarios import run_scenarios, scenario_names


def raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = hard if hard != resource.RLIM_INFINITY else max(soft, want)
    if new > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cluster"]:  # the cluster scenarios (NATS JetStream, several nodes): bench/cluster.py
        from .cluster import main as cluster_main
        return cluster_main(argv[1:])
    opts = parse_args(argv)
    targets = [parse_target(t) for t in opts.compare] if opts.compare else None
    if targets and all(t["kind"] == "results" for t in targets):
        columns = [(t["name"], load_results(t["path"])["results"]) for t in targets]
        for _, results in columns:
            reanalyse(results)
        text = table(columns, opts.rate)
        profiles = compare_profiles(columns)
        text += ("\n\n" + profiles if profiles else "") + "\n\nAll runs:\n\n" + compare([t["path"] for t in targets])
        print(text)
        if opts.out:
            os.makedirs(opts.out, exist_ok=True)
            with open(os.path.join(opts.out, "compare.md"), "w") as f:
                f.write(text + "\n")
        return 0
    if not targets and opts.spawn is None and not (opts.port or opts.ws):
        raise SystemExit("give --spawn [ARGS], or the broker's --port and/or --ws URL, or --compare TARGETS")
    names = scenario_names(opts.scenario)
    limit = raise_fd_limit(opts.idle_connections + 1024)
    if "idle" in names:
        need = opts.idle_connections + 256
        print(f"file descriptors: this process may open {limit}; the broker needs about {need} "
              f"(start it with `ulimit -n {need * 2}` or more, and max_connections >= {opts.idle_connections})",
              file=sys.stderr)
    opts.out = opts.out or os.path.join("out", time.strftime("bench-%Y%m%d-%H%M%S"))
    if targets:
        columns, runners = [], []
        for t in targets:
            if t["kind"] == "results":
                columns.append((t["name"], load_results(t["path"])["results"]))
                continue
            runner = Runner(target_opts(opts, t))
            runners.append(runner)
            columns.append((t["name"], runner.results))
    else:
        runners = [Runner(opts)]
        columns = [(runners[0].label, runners[0].results)]
    if opts.profile and not any(r.spawn_args is not None for r in runners):
        print("--profile: no broker here is spawned by the benchmark (--spawn, git:REF or .); nothing is profiled",
              file=sys.stderr)
    for r in runners:
        print(f"bench: {r.label}; scenarios {', '.join(names)}; {r.flow_label}; results in {r.opts.out}",
              flush=True)
    try:
        run_scenarios(runners, names, opts.repeat)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        for r in runners:
            r.save()
            try:
                make_chart(load_results(r.opts.out), os.path.join(r.opts.out, "bench.png"))
            except Exception as exc:  # a chart problem must not lose the results
                print(f"chart not written: {exc!r}", file=sys.stderr)
    text = table(columns, opts.rate)
    profiles = compare_profiles(columns)
    if profiles:
        text += "\n\n" + profiles
    print("\n" + text)
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "table.md"), "w") as f:
        f.write(f"Command: {' '.join(sys.argv)}\n\n{text}\n")
    print(f"wrote {opts.out}/table.md and, per target, results.json and bench.png")
    return 0 if all(res["status"] != "error" for r in runners for res in r.results) else 1


def target_opts(opts, target: dict):
    """A copy of the options that points one Runner at one --compare target."""
    o = copy.copy(opts)
    o.out = os.path.join(opts.out, re.sub(r"[^\w.-]+", "_", target["name"]))
    o.label = target["name"]
    for attr, value in target.get("options", {}).items():
        setattr(o, attr, value)
    if target["kind"] == "address":
        o.spawn = None
        o.host, o.port, o.ws = target["host"], target["port"], target.get("ws")
        o.pid = target.get("pid")
        o.login = target.get("login", opts.login)
        o.passcode = target.get("passcode", opts.passcode)
    else:
        o.spawn = opts.spawn if opts.spawn is not None else ""
        if target.get("env"):
            o.spawn_env = " ".join([opts.spawn_env or "", *(shlex.quote(e) for e in target["env"])]).strip()
        if target["kind"] == "git":
            # The tree stays with the results: profiles name its source lines.
            where, commit = extract_ref(target["ref"], ROOT, os.path.join(o.out, "tree"))
            o.spawn_root = where
            o.label = f"{target['name']} ({commit[:9]})"
    return o

if __name__ == "__main__":
    sys.exit(main())
