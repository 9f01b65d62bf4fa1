"""stompbroker-bench cluster end to end, briefly: a cross-node fan-out against a real NATS cluster
and three nodes delivers every message to every remote subscriber, and the result fits the schema."""

import json
import subprocess
import sys

from stompbroker.bench.report import validate_result


def test_cluster_fanout_scenario_runs_and_counts(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "stompbroker.bench", "cluster", "--scenario", "fanout",
                           "--duration", "1", "--fanout", "4", "--consumer-procs", "2", "--quiet", "--no-ceiling",
                           "--pause", "0", "--out", str(out)], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (res,) = json.loads((out / "results.json").read_text())["results"]
    assert validate_result(res) == [] and res["status"] == "ok", res["notes"]
    assert res["counts"]["sent"] > 0 and res["counts"]["delivered"] == res["counts"]["expected"] == 4 * res["counts"]["sent"]
    assert any(k.startswith("n1:") for k in res["broker"]["cpu_by_process"]) and "nats0" in res["broker"]["cpu_by_process"]
