"""stompbroker-bench against a real broker: one short one2one run, end to end (the generator's
parts are unit-tested in tests/unit/test_bench.py)."""

from __future__ import annotations

import json

from stompbroker.bench import cli, report


def test_smoke_one2one_against_broker(start_broker, tmp_path, capsys):
    broker = start_broker("processors=3")
    out = tmp_path / "bench"
    code = cli.main(["--port", str(broker.port), "--pid", str(broker.proc.pid), "--scenario", "one2one",
                     "--duration", "1.5", "--no-ceiling", "--quiet", "--pause", "0", "--out", str(out)])
    assert code == 0, capsys.readouterr()
    doc = json.loads((out / "results.json").read_text())
    (res,) = doc["results"]
    assert report.validate_result(res) == []
    assert res["status"] == "ok", res["notes"]
    assert res["counts"]["delivered"] > 0
    assert res["counts"]["delivered"] == res["counts"]["sent"]
    assert res["broker"]["cpu_s"] is not None and res["broker"]["cpu_s"] > 0
    assert (out / "bench.png").stat().st_size > 0


def test_smoke_lone_send_against_broker(start_broker, tmp_path, capsys):
    """One receipted SEND in flight: broker CPU and /proc counters per SEND, every SEND delivered."""
    broker = start_broker("processors=3")
    out = tmp_path / "bench"
    code = cli.main(["--port", str(broker.port), "--pid", str(broker.proc.pid), "--scenario", "lone",
                     "--duration", "1", "--no-ceiling", "--quiet", "--pause", "0", "--out", str(out)])
    assert code == 0, capsys.readouterr()
    (res,) = json.loads((out / "results.json").read_text())["results"]
    assert report.validate_result(res) == []
    assert res["status"] == "ok", res["notes"]
    assert res["counts"]["sent"] > 10
    assert res["counts"]["delivered"] == res["counts"]["sent"]
    assert res["parameters"]["flow_control"].startswith("one SEND in flight")
    assert res["lone"]["cpu_us_per_send"] > 0
    assert set(res["lone"]["cpu_us_by_process"]) >= {"reader", "dispatcher", "writer-0"}
    # every process sleeps between SENDs: a wake-up each
    assert res["lone"]["syscalls_per_send"]["dispatcher"]["voluntary"] >= 0.5
