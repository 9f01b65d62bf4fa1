"""The HTTP, WebSocket and PROXY protocol fuzzer (tests/fuzz_edges.py) against a real broker:
0 crashes (no process restarted), 0 hangs, 0 internal errors (no `internal error` or traceback in
the log, no HTTP 500), only well-formed answers, and the broker's memory bounded.

CI runs it for 8 s with auth=off and 6 s with auth=passwd (HTTP Basic and STOMP logins, the
console's passcodes); longer on demand (the figures in docs/reliability.md):

    python -m pytest tests/integration/test_fuzz_edges.py -s --seconds 1800 --fuzz-inputs 1000000
    python -m pytest "tests/integration/test_fuzz_edges.py::test_fuzz_http_websocket_and_proxy_headers[passwd]" -s ...
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from stompbroker.titles import process_role
from stompbroker.security import hash_secret
from tests.fuzz_edges import PASSWD, Fuzzer

MB = 1 << 20
CI_SECONDS = {"off": 8.0, "passwd": 6.0}
MEMORY_LIMIT = 512 * MB  # all broker processes together: ~90 MiB at rest plus the rings they touch


def broker_processes(broker) -> dict[str, psutil.Process]:
    main = psutil.Process(broker.proc.pid)
    return {"supervisor": main, **{process_role(p): p for p in main.children()}}


def private(processes: dict) -> dict[str, int]:
    """Each process's private memory (RSS less shared pages: the rings are shared): what a leak grows."""
    out = {}
    for role, p in processes.items():
        info = p.memory_info()
        out[role] = info.rss - info.shared
    return out


@pytest.mark.parametrize("auth", ["off", "passwd"])
def test_fuzz_http_websocket_and_proxy_headers(start_broker, fuzz_seconds, request, auth, tmp_path):
    seconds = fuzz_seconds or CI_SECONDS[auth]
    max_inputs = request.config.getoption("--fuzz-inputs")
    # connect_timeout_ms bounds how long an input that does not log in may live (hang_after waits
    # 3 s more; with logins, a refusal is told after its back-off, at most 10 s); 300 connections in
    # flight keep the broker busy (one connection per input)
    settings = ["processors=3", "connect_timeout_ms=1000", "proxy_protocol=true", "proxy_trusted=127.0.0.1"]
    if auth == "passwd":
        path = tmp_path / "passwd"
        # root's secret in plain text (checked at once: the console's passcodes flow), bob's an
        # scrypt hash (the checker's real cost: many logins wait their turn, and some run out of time)
        path.write_text("".join(f"{user}:{secret if user == 'root' else hash_secret(secret)}:{perms}\n"
                                for user, (secret, perms) in PASSWD.items()))
        path.chmod(0o600)
        settings += ["auth=passwd", f"passwd_file={path}", "auth_fail_delay_ms=50"]
    b = start_broker(*settings)
    processes = broker_processes(b)
    pids = {role: p.pid for role, p in processes.items()}
    peak = {"total": 0}
    shown = [0]
    start_rss = sum(p.memory_info().rss for p in processes.values())
    start_private = private(processes)

    def tick(report):
        rss = {role: p.memory_info().rss for role, p in processes.items()}
        peak["total"] = max(peak["total"], sum(rss.values()))
        for role, value in rss.items():
            peak[role] = max(peak.get(role, 0), value)
        if fuzz_seconds:
            print(f"{report.inputs} inputs, {len(report.hangs)} hangs, {len(report.bad_answers)} bad, "
                  f"broker {sum(rss.values()) / MB:.0f} MiB", flush=True)
            for finding in (report.hangs + report.bad_answers)[shown[0]:]:
                print("FOUND", repr(finding), flush=True)
            shown[0] = len(report.hangs) + len(report.bad_answers)

    fuzzer = Fuzzer(b.port, seed=int(os.environ.get("FUZZ_SEED", time.time_ns() % 2**32)), concurrency=300,
                    hang_after=4.0 if auth == "off" else 13.0, connect_timeout=1.0, auth=auth == "passwd")
    report = fuzzer.run(seconds, max_inputs, tick)
    tick(report)
    end_rss = sum(p.memory_info().rss for p in processes.values())
    end_private = private(processes)
    print(f"\nedge fuzzing, auth={auth} (seed {fuzzer.seed}): {report.summary()}\n"
          f"broker RSS {start_rss / MB:.0f} MiB at start, peak {peak['total'] / MB:.0f} MiB, "
          f"{end_rss / MB:.0f} MiB at the end; peaks: "
          + ", ".join(f"{role} {v / MB:.0f}" for role, v in peak.items() if role != "total")
          + "; private memory start -> end: "
          + ", ".join(f"{role} {start_private[role] / MB:.0f} -> {end_private[role] / MB:.0f}" for role in start_private))
    log = b.log()
    assert report.inputs > 100
    assert {role: p.pid for role, p in broker_processes(b).items()} == pids, "a broker process was restarted"
    assert "internal error" not in log and "Traceback" not in log, log[-5000:]
    assert not report.hangs, report.hangs[:5]
    assert not report.bad_answers, report.bad_answers[:5]
    assert report.answered > report.inputs / 4 and report.connected > 0
    assert peak["total"] < MEMORY_LIMIT, f"{peak['total'] / MB:.0f} MiB"
