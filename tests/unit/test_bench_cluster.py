"""stompbroker-bench cluster: the pure parts (placement, the local-cost summary, options)."""

from stompbroker.bench.cluster import SCENARIOS, local_summary, parse_cluster_args, remote_nodes
from stompbroker.bench.report import new_result, validate_result


def test_remote_nodes_spread_connections_over_the_other_nodes():
    assert remote_nodes(3, 5) == [1, 2, 1, 2, 1]
    assert remote_nodes(2, 3) == [1, 1, 1]


def run(mode: str, rate: float, per_cpu: float | None, status: str = "ok") -> dict:
    r = new_result(f"cluster-local-{mode}-tcp", "cluster-local", "tcp", {"mode": mode})
    r["status"], r["rates"], r["deliveries_per_cpu_s"], r["duration_s"] = status, {"deliveries_per_s": rate}, per_cpu, 2.0
    return r


def test_local_summary_compares_medians_and_checks_the_ten_percent_target():
    results = [run("single", 100, 1000), run("cluster", 90, 950), run("single", 120, 1100),
               run("cluster", 80, 900), run("single", 110, 1200), run("cluster", 70, 850, status="error")]
    res = local_summary(results, "tcp")
    assert res["counts"]["single"] == {"deliveries_per_s": 110, "deliveries_per_cpu_s": 1100}
    assert res["counts"]["cluster"] == {"deliveries_per_s": 85, "deliveries_per_cpu_s": 925}  # the error run left out
    assert res["rates"]["cost"]["deliveries_per_cpu_s"] == round(1 - 925 / 1100, 4)
    assert res["headline"]["value"] == 15.9 and res["target"]["met"] is False
    assert validate_result(res) == []
    cheap = local_summary([run("single", 100, 1000), run("cluster", 99, 950)], "tcp")
    assert cheap["headline"]["value"] == 5.0 and cheap["target"]["met"] is True


def test_local_summary_without_runs_is_an_error_not_a_figure():
    res = local_summary([run("single", 100, 1000, status="error")], "tcp")
    assert res["status"] == "error" and res["headline"]["value"] is None


def test_cluster_options_leave_the_bench_options_to_the_bench():
    _, copts, rest = parse_cluster_args(["--scenario", "queue", "--nodes", "2", "--duration", "3", "--fanout", "9"])
    assert (copts.scenario, copts.nodes, copts.nats_servers) == ("queue", 2, 3)
    assert rest == ["--duration", "3", "--fanout", "9"]
    assert set(SCENARIOS) == {"fanout", "queue", "local"}
