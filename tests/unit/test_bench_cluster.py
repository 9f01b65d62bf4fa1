"""stompbroker-bench cluster: the pure parts (placement, the local-cost summary, options)."""

from stompbroker.bench.cluster import SCENARIOS, local_summary, parse_cluster_args, queue_summary, remote_nodes
from types import SimpleNamespace

from stompbroker.bench.scale import destinations, node_args, per_producer, scale_chart, scale_summary, spread, table
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
    assert set(SCENARIOS) == {"fanout", "queue", "local", "packing"}


def queue_run(name: str, rate: float, delivered: int, cpu: dict, status: str = "ok") -> dict:
    r = new_result(name, "x", "tcp", {"flow_control": "4 bursts of <= 16 KB unreceipted"})
    r["status"], r["rates"], r["counts"] = status, {"deliveries_per_s": rate}, {"delivered": delivered}
    r["broker"]["cpu_by_process"], r["broker"]["cpu_s"], r["duration_s"] = cpu, sum(cpu.values()), 5.0
    return r


def test_queue_summary_reads_the_cross_node_rate_against_the_ceiling_and_the_sqlite_node():
    cross = queue_run("cluster-queue-tcp", 6000, 10_000,
                      {"n0:dispatcher": 0.1, "n0:cluster": 0.08, "n1:cluster": 0.05, "n2:cluster": 0.07, "nats0": 0.3})
    ceiling = queue_run("cluster-queue-ceiling-tcp", 10_000, 50_000, {"nats0": 1.0})
    ceiling["headline"] = {"metric": "msg/s", "value": 10_000, "unit": "1/s"}
    sqlite = queue_run("cluster-queue-sqlite-tcp", 12_000, 20_000, {"dispatcher": 0.4})
    res = queue_summary(cross, ceiling, sqlite, "tcp")
    assert res["rates"]["vs_ceiling"] == 0.6 and res["rates"]["vs_sqlite_node"] == 0.5
    cpu = res["counts"]["cpu_us_per_message"]
    assert cpu["bridge_sending_us"] == 8.0 and cpu["bridge_receiving_us"] == 12.0   # n1 + n2: the other side
    assert cpu["nats_us"] == 30.0 and cpu["cluster_us"] == 60.0 and cpu["sqlite_node_us"] == 20.0
    assert cpu["cluster_vs_sqlite_node"] == 3.0
    met = {t["metric"]: t["met"] for t in res["targets"]}
    assert met == {"cross-node queue / NATS ceiling": True, "cross-node queue / standalone sqlite node": False,
                   "sending bridge CPU per message": True, "receiving bridges' CPU per message": False,
                   "cluster CPU per message / standalone sqlite node's": False}
    assert validate_result(res) == []
    failed = queue_summary(queue_run("c", 1, 1, {}, status="error"), None, sqlite, "tcp")
    assert failed["status"] == "error" and failed["rates"]["vs_ceiling"] is None


def scale_run(kind: str, nodes: int, replicas, rate: float, standalone: bool = False) -> dict:
    r = queue_run(f"cluster-scale-{kind}-{nodes}", rate, int(rate * 5), {"dispatcher": rate * 5 * 20e-6})
    r["parameters"].update({"kind": kind, "nodes": nodes, "replicas": replicas, "standalone": standalone})
    return r


def test_scale_summary_rows_ratios_and_the_targets_at_the_largest_node_count():
    runs = [scale_run("queue", 1, None, 10_000, standalone=True), scale_run("queue", 1, 1, 4_000),
            scale_run("queue", 2, 1, 8_000), scale_run("queue", 4, 1, 15_000), scale_run("queue", 4, 3, 9_000),
            scale_run("topic", 1, None, 40_000, standalone=True), scale_run("topic", 1, 1, 40_000),
            scale_run("topic", 4, 1, 150_000)]
    res = scale_summary(runs, "tcp", 0.25)
    rows = {(x["kind"], x["setup"], x["nodes"]): x for x in res["counts"]["rows"]}
    q4 = rows[("queue", "cluster R1", 4)]
    assert (q4["rate"], q4["per_node"], q4["vs_standalone"], q4["vs_one_node"]) == (15_000, 3750, 1.5, 3.75)
    assert rows[("queue", "cluster R3", 4)]["vs_one_node"] is None      # (R1 is the linearity test)
    assert rows[("queue", "cluster R3", 4)]["vs_standalone"] == 0.9
    assert rows[("queue", "cluster R1", 1)]["cpu_us_per_message"] == 20.0
    met = {t["metric"]: (t["value"], t["met"]) for t in res["targets"]}
    assert met["queue: 4 nodes / standalone sqlite node"] == (1.5, False)
    assert met["queue: 4 nodes / one cluster node"] == (3.75, True)
    assert met["topic: 4 nodes / standalone sqlite node"] == (3.75, True)
    assert validate_result(res) == []
    text = table(res)
    assert "| queue | cluster R1 | 4 | 15,000 | 3,750 | 1.5x | 3.75x | 20.0 |  |" in text


def test_scale_summary_of_repeated_runs_takes_each_setups_median():
    runs = [scale_run("queue", 1, None, 10_000, standalone=True), scale_run("queue", 1, 1, 4_000),
            scale_run("queue", 4, 1, 15_000),
            scale_run("queue", 1, None, 14_000, standalone=True), scale_run("queue", 1, 1, 5_000),
            scale_run("queue", 4, 1, 12_000),
            scale_run("queue", 1, None, 12_000, standalone=True), scale_run("queue", 1, 1, 4_500),
            scale_run("queue", 4, 1, 18_000)]
    runs[-1]["status"] = "error"   # (a failed run is left out of the median)
    res = scale_summary(runs, "tcp", 0.25)
    rows = {(x["setup"], x["nodes"]): x for x in res["counts"]["rows"]}
    assert len(rows) == 3 and rows[("standalone sqlite", 1)]["runs"] == 3
    alone = rows[("standalone sqlite", 1)]
    assert (alone["rate"], alone["range"]) == (12_000, [10_000, 14_000])
    q4 = rows[("cluster R1", 4)]
    assert (q4["rate"], q4["range"], q4["vs_standalone"], q4["vs_one_node"]) == (13_500, [12_000, 15_000], 1.12, 3.0)
    assert "| queue | cluster R1 | 4 | 13,500 (12,000-15,000) | 3,375 | 1.12x | 3.0x |" in table(res)
    assert validate_result(res) == []


def test_scale_summary_says_how_evenly_the_producers_were_served():
    # topic, 2 consumers per destination: each gets all its producer's messages
    assert per_producer([50, 50, 200, 200, 100, 100], 2, 2) == [50, 200, 100]
    # queue, 2 consumers per destination share its messages
    assert per_producer([30, 20, 150, 50], 2, 1) == [50, 200]
    assert per_producer([], 2, 2) == [] and per_producer([5], 0, 1) == []
    assert spread([50, 200, 100]) == 4.0 and spread([7]) is None and spread([0, 9]) is None
    runs = [scale_run("topic", 1, None, 40_000, standalone=True), scale_run("topic", 4, 1, 150_000),
            scale_run("topic", 4, 1, 160_000), scale_run("topic", 4, 1, 170_000)]
    for r, counts in zip(runs, ([40], [10, 100, 10, 100], [50, 60, 50, 60], [100, 100, 100, 130])):
        r["counts"]["per_producer"] = counts
    res = scale_summary(runs, "tcp", 0.25)
    rows = {(x["setup"], x["nodes"]): x for x in res["counts"]["rows"]}
    assert rows[("cluster R1", 4)]["producers_spread"] == 1.3      # the median of 10.0, 1.2 and 1.3
    assert rows[("standalone sqlite", 1)]["producers_spread"] is None
    assert "| 1.3x |" in table(res)
    assert validate_result(res) == []
    runs[1]["counts"]["per_producer"], runs[2]["counts"]["per_producer"] = [10, 41], [10, 48]
    # two rounds: the mean of 4.1 and 4.8, to one place (not 4.449999999999999)
    res = scale_summary(runs[:3], "tcp", 0.25)
    rows = {(x["setup"], x["nodes"]): x for x in res["counts"]["rows"]}
    assert rows[("cluster R1", 4)]["producers_spread"] == 4.4 and "| 4.4x |" in table(res)


def test_scale_chart_draws_a_png(tmp_path):
    runs = [scale_run("queue", 1, None, 10_000, standalone=True), scale_run("queue", 1, 1, 4_000),
            scale_run("queue", 2, 1, 8_000), scale_run("queue", 4, 3, 9_000)]
    path = tmp_path / "scale.png"
    scale_chart(scale_summary(runs, "tcp", 0.25), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cluster_scale_options():
    _, copts, rest = parse_cluster_args(["--scale", "1,2,4", "--cpu-quota", "0.3", "--r3", "--duration", "4"])
    assert (copts.scale, copts.cpu_quota, copts.r3, copts.scale_consumers) == ("1,2,4", 0.3, True, 2)
    assert rest == ["--duration", "4"]
    assert (copts.scale_destinations, copts.placement_tags) == (1, True)
    _, copts, _ = parse_cluster_args(["--scale", "4", "--scale-destinations", "4", "--no-placement-tags"])
    assert (copts.scale_destinations, copts.placement_tags) == (4, False)


def test_scale_runs_place_single_copy_shards_by_tags_over_a_multiple_of_the_node_count():
    runner = SimpleNamespace(spawn_args=["processors=2"], run_id="r1")
    tags = SimpleNamespace(placement_tags=True)
    assert node_args(runner, tags, 4, 1) == (["processors=2", "cluster_replicas=1", "cluster_streams=8"], True)
    assert node_args(runner, tags, 2, 1) == (["processors=2", "cluster_replicas=1", "cluster_streams=6"], True)
    assert node_args(runner, tags, 4, 3) == (["processors=2", "cluster_replicas=3"], False)
    assert node_args(runner, SimpleNamespace(placement_tags=False), 4, 1)[1] is False
    runner.spawn_args = ["cluster_streams=4"]
    assert node_args(runner, tags, 4, 1)[0][-1] == "cluster_streams=4"
    assert destinations(runner, "queue", 2, 1) == ["/queue/bench-r1-scale-2"]
    assert destinations(runner, "topic", 0, 2) == ["/topic/bench-r1-scale-0-0", "/topic/bench-r1-scale-0-1"]


def test_cpu_group_quota_where_cgroups_can_be_written():
    """A real cgroup (root only): a child that needs 0.3 s of CPU takes at least 1 s under a 0.2-core
    quota (0.3 s alone on an idle core), and the group reports throttling."""
    import os
    import time as t

    from stompbroker.bench.cgroups import CpuGroup, flavour

    if flavour() is None:
        import pytest
        pytest.skip("no writable cgroup CPU controller here (not root)")
    group = CpuGroup(f"stompbroker-test-{os.getpid()}", 0.2)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(r, 1)  # (in the group before it starts)
            while t.process_time() < 0.3:
                pass
            os._exit(0)
        group.add(pid)
        started = t.monotonic()
        os.write(w, b"go")
        os.waitpid(pid, 0)
        assert t.monotonic() - started >= 1.0
        assert group.throttled()["throttled_periods"] > 0
    finally:
        group.close()


def test_cpu_group_with_a_shorter_period():
    """--cpu-period-ms: the same share of the CPU, given in shorter turns."""
    import os

    from stompbroker.bench.cgroups import CpuGroup, flavour

    if flavour() is None:
        import pytest
        pytest.skip("no writable cgroup CPU controller here (not root)")
    group = CpuGroup(f"stompbroker-test-{os.getpid()}-p", 0.25, 10_000)
    try:
        if group.kind == "v2":
            written = open(os.path.join(group.path, "cpu.max")).read().split()
        else:
            written = [open(os.path.join(group.path, f"cpu.cfs_{k}_us")).read().strip() for k in ("quota", "period")]
        assert written == ["2500", "10000"]
    finally:
        group.close()


def test_the_packing_table_and_the_size_of_a_message_as_packed():
    from stompbroker.bench.cluster import member_size, packing_table

    assert member_size(117) > 117 + 40          # id, headers and lengths
    row = new_result("cluster-packing-R3-N16-tcp", "cluster-packing", "tcp", {"replicas": 3, "pack": 16})
    row["rates"] = {"deliveries_per_s": 32038}
    row["counts"] = {"nats_us_per_message": 16.9, "nats_us_per_jetstream_message": 270.4,
                     "client_us_per_message": {"publisher": 2.6, "consumer": 3.6}}
    assert packing_table([row]).splitlines()[2] == "| R3 | 16 | 32,038 | 16.9 | 270.4 | 2.6 + 3.6 |"
