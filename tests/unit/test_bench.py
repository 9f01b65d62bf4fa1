"""The load generator (stompbroker.bench): its pure parts (a run against a real broker:
tests/integration/test_bench_smoke.py)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from stompbroker.bench import cli, compare, flowctl, options, profile, report, scenarios, stats
from stompbroker.bench import runner as runner_mod
from stompbroker.bench.stats import percentiles
from stompbroker.bench.wire import (TOKEN, Link, StompReader, Target, TokenCounter, TsScanner, count_nul, make_body,
                                    mask, parse_ws_frame, stomp_frame, ws_frame)


def message(i: int, size: int = 117, ts: int | None = None) -> bytes:
    headers = [("subscription", "0"), ("message-id", f"abc-{i}"), ("destination", "/topic/x")]
    if ts is not None:
        headers.append(("bench-ts", str(ts)))
    return stomp_frame("MESSAGE", headers, make_body(size))


# -- frame counting ----------------------------------------------------------------------------
def test_body_has_token_and_no_nul():
    body = make_body(117)
    assert len(body) == 117 and body.startswith(TOKEN) and b"\0" not in body
    with pytest.raises(ValueError):
        make_body(3)


def test_count_nul_counts_complete_frames_only():
    stream = b"".join(message(i) for i in range(10)) + b"\n\n"  # heart-beats are not frames
    buf = bytearray(stream + message(10)[:-1])                  # the last frame is incomplete
    assert count_nul(buf, len(buf)) == 10


@pytest.mark.parametrize("ws", [False, True])
def test_token_counter_with_recv_into_every_split(ws):
    frames = [message(i, size=20 + i) for i in range(30)]
    stream = b"".join(ws_frame(f, masked=False) if ws else f for f in frames)
    for chunk in (1, 2, 3, 5, 7, 8, 64, len(stream)):
        counter = TokenCounter()
        k = counter.carry_len
        buf = bytearray(k + chunk)
        total = 0
        for pos in range(0, len(stream), chunk):
            part = stream[pos:pos + chunk]
            counter.prepare(buf)
            buf[k:k + len(part)] = part
            total += counter.count(buf, len(part))
        assert total == 30, chunk


def test_token_counter_feed():
    counter = TokenCounter()
    data = (b"ab" + TOKEN + b"cd") * 7
    assert sum(counter.feed(data[i:i + 3]) for i in range(0, len(data), 3)) == 7


def test_ts_scanner_across_chunks():
    stamps = [1000 + 7 * i for i in range(50)]
    stream = b"".join(ws_frame(message(i, ts=t), masked=False) for i, t in enumerate(stamps))
    for chunk in (1, 4, 9, 100, len(stream)):
        scanner = TsScanner()
        got = []
        for pos in range(0, len(stream), chunk):
            got += scanner.feed(stream[pos:pos + chunk])
        assert got == stamps, chunk


# -- wire ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 5, 125, 126, 300, 65535, 65536, 70000])
def test_ws_frame_round_trip(size):
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    for masked in (True, False):
        frame = ws_frame(payload, masked=masked)
        assert parse_ws_frame(frame[:-1] if size else frame[:1]) is None
        fin, opcode, got, end = parse_ws_frame(frame)
        assert (fin, opcode, got, end) == (True, 1, payload, len(frame))
    assert mask(mask(payload)) == payload


def test_stomp_reader_splits_frames():
    body = b"a\0b"  # a NUL inside a body with content-length
    stream = b"\n\r\n" + stomp_frame("MESSAGE", [("destination", "/q")], body) + b"RECEIPT\nreceipt-id:7\n\n\0"
    reader = StompReader()
    (command, headers, got), (command2, headers2, _) = reader.feed(stream)
    assert (command, headers["destination"], got) == ("MESSAGE", "/q", body)
    assert (command2, headers2["receipt-id"], reader.partial()) == ("RECEIPT", "7", b"")
    reader = StompReader()
    assert reader.feed(b"MESSAGE\nx:y\n") == [] and reader.partial() == b"MESSAGE\nx:y\n"
    for chunk in (1, 3, 7):  # fed in pieces: the same frames
        reader = StompReader()
        frames = [f for i in range(0, len(stream), chunk) for f in reader.feed(stream[i:i + chunk])]
        assert [(c, b) for c, _, b in frames] == [("MESSAGE", body), ("RECEIPT", b"")]


def test_stomp_reader_takes_a_frame_without_its_blank_line():
    """stompica's RECEIPT and ERROR end with NUL right after the headers: headers only, no body."""
    stream = (b"RECEIPT\ncontent-type:text/plain\nreceipt-id:sub-0\n\0"
              + stomp_frame("MESSAGE", [("destination", "#q")], b"hi") + b"RECEIPT\r\nreceipt-id:2\r\n\0")
    for chunk in (1, 2, len(stream)):
        reader = StompReader()
        frames = [f for i in range(0, len(stream), chunk) for f in reader.feed(stream[i:i + chunk])]
        assert [(c, h.get("receipt-id"), b) for c, h, b in frames] == [
            ("RECEIPT", "sub-0", b""), ("MESSAGE", None, b"hi"), ("RECEIPT", "2", b"")]
        assert reader.partial() == b""


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_link_hands_unread_input_to_the_hot_loop(transport):
    """Frames that arrive with the one set-up waits for stay countable by the consumer's NUL/token count."""
    link = Link(Target(port=1, ws_url="ws://127.0.0.1:1/ws"), transport)
    wire = (lambda f: ws_frame(f, masked=False)) if transport == "ws" else (lambda f: f)
    receipt = stomp_frame("RECEIPT", [("receipt-id", "sub-0")])
    early = [message(i) for i in range(3)]
    link.raw += b"".join(wire(f) for f in [receipt, *early]) + wire(message(3))[:40]
    assert link._take_frame() == ("RECEIPT", {"receipt-id": "sub-0"}, b"")
    unread = link.unread()
    assert unread.count(TOKEN) == 3   # what the WebSocket consumer counts
    assert transport == "ws" or unread.count(b"\0") == 3   # and the TCP one
    assert unread.endswith(wire(message(3))[:40])


# -- statistics and results ------------------------------------------------------------------------
def test_percentiles_nearest_rank():
    p = percentiles(list(range(1, 1001)))
    assert (p["p50"], p["p99"], p["p99.9"], p["max"], p["count"]) == (500, 990, 999, 1000, 1000)
    assert percentiles([])["p99"] is None


def test_bins_and_steady_rate():
    assert stats.merge_bins([[1, 2], [3, 4, 5]]) == [4, 6, 5]
    bins = [100] * 10 + [1000] * 30 + [100] * 10   # 0.1 s bins: ramp, 3 s at 10,000/s, drain
    assert stats.steady_rate(bins) == pytest.approx(10_000)
    assert stats.steady_rate([5, 5]) is None


def test_result_schema():
    res = report.new_result("one2one-tcp", "one2one", "tcp", {"size": 117})
    assert "an ok result needs a headline {metric, value, unit}" in report.validate_result(res)
    res["duration_s"] = 1.0
    res["headline"] = {"metric": "deliveries/s", "value": 10, "unit": "1/s"}
    res["latency_ms"] = {"p50": 0.1, "p99": 0.2, "p99.9": 0.3}
    res["target"] = report.check_target("one2one", 10)
    assert res["target"]["met"] is False
    assert report.validate_result(res) == []
    assert set(report.RESULT_KEYS) <= set(res)
    del res["rates"]
    assert report.validate_result(res) == ["missing key 'rates'"]
    skipped = report.new_result("durable-tcp", "durable", "tcp", {})
    skipped["status"] = "skipped"
    assert report.validate_result(skipped) == []


def test_the_latency_target_is_half_a_millisecond_at_5000_msg_per_s_and_one_above():
    assert report.check_target("latency", 0.83, 5_000)["met"] is False   # (was held to 1 ms at every rate)
    assert report.check_target("latency", 0.45, 5_000)["goal"] == 0.5
    assert report.check_target("latency", 0.83, 50_000)["met"] is True
    assert report.check_target("latency", 0.83)["goal"] == 1.0


def test_scenario_names():
    assert scenarios.scenario_names("all") == list(scenarios.SCENARIOS)
    assert scenarios.scenario_names("1to1,ingest,1to1") == ["one2one", "ingest"]
    with pytest.raises(SystemExit):
        scenarios.scenario_names("nope")


# -- flow control ------------------------------------------------------------------------------------
def test_burst_frames_fill_the_burst_with_the_receipt_frame_last():
    assert flowctl.burst_frames(175, 186, 16384) == 1 + (16384 - 186) // 175   # 93 frames
    n = flowctl.burst_frames(175, 186, 16384)
    assert (n - 1) * 175 + 186 <= 16384 < n * 175 + 186
    assert flowctl.burst_frames(175, 186, 186) == 1      # exactly one receipted frame
    assert flowctl.burst_frames(5000, 5011, 4096) == 1   # a frame bigger than a burst still goes


def test_burst_window_keeps_at_most_n_bursts_unreceipted():
    w = flowctl.BurstWindow(4)
    for _ in range(4):
        assert w.room()
        w.sent()
    assert not w.room() and w.in_flight == 4
    w.receipted(1)
    assert w.room() and w.in_flight == 3
    w.receipted(10)          # stray receipts never open the window past what was asked
    assert w.in_flight == 0
    for _ in range(4):
        w.sent()
    assert not w.room()


def test_flow_descriptions_name_the_flow_control():
    assert flowctl.describe(flowctl.flow_spec("bursts", 4, 16384)) == "4 bursts of <= 16 KB unreceipted"
    assert flowctl.describe(flowctl.flow_spec("bursts", 1, 1000)) == "1 burst of <= 1000 B unreceipted"
    assert flowctl.describe(flowctl.flow_spec("window", window=20000)).startswith("ceiling: ")
    assert "5000 msg/s" in flowctl.describe(flowctl.flow_spec("paced", rate=5000))
    with pytest.raises(ValueError):
        flowctl.flow_spec("bursts", 0, 16384)
    assert cli.parse_args(["--spawn"]).flow == "bursts"   # the default for every scenario


# -- --compare -----------------------------------------------------------------------------------------
def test_parse_compare_targets(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    assert compare.parse_target("base=127.0.0.1:61613,ws=ws://127.0.0.1:15674/ws,pid=42") == {
        "name": "base", "kind": "address", "host": "127.0.0.1", "port": 61613,
        "ws": "ws://127.0.0.1:15674/ws", "pid": 42}
    assert compare.parse_target("localhost:61613")["kind"] == "address"
    assert compare.parse_target("old=git:b89f1bc") == {"name": "old", "kind": "git", "ref": "b89f1bc"}
    assert compare.parse_target("main") == {"name": "main", "kind": "git", "ref": "main"}
    assert compare.parse_target("now=.") == {"name": "now", "kind": "checkout"}
    assert compare.parse_target(str(tmp_path))["kind"] == "results"
    with pytest.raises(ValueError):
        compare.parse_target("x=127.0.0.1:1,bogus=1")


def test_compare_targets_take_their_own_flow_control_and_queue_prefix():
    t = compare.parse_target("stompica=127.0.0.1:61700,ws=ws://127.0.0.1:61700/,pid=7,bursts=1,"
                             "burst-bytes=16000,queue-prefix=#")
    assert t == {"name": "stompica", "kind": "address", "host": "127.0.0.1", "port": 61700,
                 "ws": "ws://127.0.0.1:61700/", "pid": 7,
                 "options": {"bursts": 1, "burst_bytes": 16000, "queue_prefix": "#"}}
    assert compare.parse_target("this=.,bursts=2,env=A=1") == {
        "name": "this", "kind": "checkout", "env": ["A=1"], "options": {"bursts": 2}}
    assert compare.parse_target("old=git:main,queue-prefix=/q/")["options"] == {"queue_prefix": "/q/"}
    for bad in ("x=127.0.0.1:1,bursts=many", "x=.,ws=ws://a/", "x=127.0.0.1:1,env=A=1", "x=.,bursts"):
        with pytest.raises(ValueError):
            compare.parse_target(bad)
    opts = cli.parse_args(["--spawn", "processors=3", "--duration", "2", "--out", "/tmp/o"])
    peer = cli.target_opts(opts, t)
    assert (peer.bursts, peer.burst_bytes, peer.queue_prefix, peer.pid) == (1, 16000, "#", 7)
    assert (opts.bursts, opts.burst_bytes, opts.queue_prefix) == (4, 16384, "/queue/")   # the others keep theirs
    runner = runner_mod.Runner(peer)
    assert runner.flow_control == {"mode": "bursts", "bursts": 1, "burst_bytes": 16000}
    assert runner.flow_label == "1 burst of <= 16000 B unreceipted"
    assert runner.queue_prefix == "#"


def test_transports_per_scenario():
    assert options.wanted_transports(None, "one2one") is None
    assert options.wanted_transports("tcp,ws", "queue") == ["tcp", "ws"]
    assert options.wanted_transports("one2one=tcp+ws", "one2one") == ["tcp", "ws"]
    assert options.wanted_transports("one2one=tcp+ws", "ingest") is None          # the default applies
    assert options.wanted_transports("tcp,fanout=ws", "fanout") == ["ws"]
    assert options.wanted_transports("tcp,fanout=ws", "queue") == ["tcp"]
    assert cli.parse_args(["--transports", "one2one=tcp+ws"]).transports == "one2one=tcp+ws"
    for bad in ("udp", "one2one=tcp+udp", "nosuch=tcp", "one2one="):
        with pytest.raises(SystemExit):
            cli.parse_args(["--transports", bad])
    runner = runner_mod.Runner(cli.parse_args(["--spawn", "--transports", "one2one=tcp+ws"]))
    assert [runner.transports_for(s) for s in ("one2one", "ingest", "fanout")] == [["tcp", "ws"], ["tcp"], ["tcp", "ws"]]


def test_compare_rows_cover_the_side_by_side_paths():
    names = {(name, path) for _, name, path, _, _ in compare.ROWS}
    for name in ("ingest-tcp", "one2one-tcp", "one2one-ws", "queue-tcp", "fanout-subs-tcp", "fanout-conns-tcp",
                 "fanout-subs-ws", "fanout-conns-ws"):
        assert (name, ("deliveries_per_cpu_s",)) in names, name
        assert (name, ("rates", "sends_per_s" if name.startswith("ingest") else "deliveries_per_s")) in names
    assert ("idle", ("broker", "pss_bytes_per_connection")) in names
    assert len({label for label, *_ in compare.ROWS}) == len(compare.ROWS)


def test_compare_table_says_each_targets_flow_control_and_queue_names():
    def res(name, scenario, flow, **params):
        r = report.new_result(name, scenario, "tcp", {"flow_control": flow, **params})
        r["rates"] = {"deliveries_per_s": 1000}
        return r
    this = [res("queue-tcp", "queue", "4 bursts of <= 16 KB unreceipted", queue_prefix="/queue/")]
    peer = [res("queue-tcp", "queue", "1 burst of <= 16000 B unreceipted", queue_prefix="#"),
            res("one2one-ws", "one2one", "1 burst of <= 16000 B unreceipted")]
    text = compare.table([("this", this), ("stompica", peer)])
    assert ("flow control: this: 4 bursts of <= 16 KB unreceipted; stompica: 1 burst of <= 16000 B unreceipted"
            in text)
    assert "queue destinations: stompica: #name (others /queue/name)" in text
    assert "| WebSocket 1 -> 1 topic, deliveries/s | - | 1.00k | - |" in text
    assert compare.ratio([1880], [-5]) == "-"      # stompica's idle PSS delta is noise around 0


def _res(name, scenario, **fields):
    res = report.new_result(name, scenario, "tcp", {"flow_control": "4 bursts of <= 16 KB unreceipted"})
    res.update(fields)
    return res


def test_compare_table_medians_ranges_and_ratios():
    base = [_res("ingest-tcp", "ingest", rates={"sends_per_s": v}, deliveries_per_cpu_s=2 * v)
            for v in (100_000, 90_000, 300_000)]
    other = [_res("ingest-tcp", "ingest", rates={"sends_per_s": v}) for v in (50_000, 60_000, 40_000)]
    other.append(_res("latency-tcp", "latency", latency_ms={"p50": 0.3, "p99": 2.0, "p99.9": 3.0}))
    failed = _res("ingest-tcp", "ingest", rates={"sends_per_s": 1}, status="error")
    text = compare.table([("a", base), ("b", other + [failed])], rate=5000)
    lines = text.splitlines()
    assert lines[0] == "| path | a | b | b / a |"
    row = next(line for line in lines if line.startswith("| ingest, topic"))
    assert row == "| ingest, topic with no subscriber, SEND/s | 100.00k (90.00k-300.00k) | 50.00k (40.00k-60.00k) | 0.50x |"
    cpu = next(line for line in lines if line.startswith("| ingest, SEND per"))
    assert cpu.endswith("| - | - |")                      # measured on one side only: no ratio
    assert any(line.startswith("| latency at 5,000 msg/s, delivery p99, ms | - | 2 |") for line in lines)
    assert not any(line.startswith("| queue") for line in lines)   # rows nobody measured are left out
    assert "flow control: 4 bursts of <= 16 KB unreceipted" in text
    assert "median of up to 3 runs" in text


# -- profiles ------------------------------------------------------------------------------------------
def _stack(*frames):
    return [profile.parse_frame(f) for f in frames]


def test_profile_classifies_samples_innermost_first(tmp_path):
    (tmp_path / "stompbroker" / "processes").mkdir(parents=True)
    (tmp_path / "stompbroker" / "processes" / "writer.py").write_text(
        "def flush(c):\n    n = c.sock.send(c.buf)\n    c.buf.clear()\n")
    lines = profile.SourceLines(str(tmp_path))
    run = "Dispatcher.run (stompbroker/processes/dispatcher.py:110)"
    handle = "Dispatcher.handle (stompbroker/processes/dispatcher.py:187)"
    assert profile.classify(_stack(run, handle, "Broker.on_frame (stompbroker/broker/core.py:149)",
                                   "parse_head (stompbroker/protocol/stomp.py:309)")) == "parse"
    assert profile.classify(_stack(run, handle, "send (stompbroker/broker/routing.py:35)")) == "routing"
    assert profile.classify(_stack(run, handle, "send (stompbroker/broker/routing.py:35)",
                                   "Outbox.add2 (stompbroker/ipc/outbox.py:43)")) == "render"
    assert profile.classify(_stack(run, "Dispatcher.flush_one (stompbroker/processes/dispatcher.py:326)",
                                   "Ring.notify (stompbroker/ipc/ring.py:93)")) == "wake-up"
    assert profile.classify(_stack(run, "Dispatcher.progress (stompbroker/processes/dispatcher.py:160)",
                                   "written (stompbroker/broker/confirmations.py:26)")) == "written counts"
    assert profile.classify(_stack(run, handle)) == "ring read"
    assert profile.classify(_stack("Writer.run (stompbroker/processes/writer.py:9)",
                                   "EpollSelector.select (selectors.py:468)")) == "wait"
    w = "Writer.flush (stompbroker/processes/writer.py:{})"
    assert profile.classify(_stack(w.format(2)), lines) == "send"    # by its source line
    assert profile.classify(_stack(w.format(3)), lines) == "send"    # by the function
    assert profile.classify(_stack("<module> (x.py:1)")) == "other"
    loop = "Reader.run (stompbroker/processes/reader.py:130)"  # the reader's steps live in reader_*.py
    read = "Framing.read (stompbroker/processes/reader_framing.py:40)"
    received = "Framing.received (stompbroker/processes/reader_framing.py:61)"
    assert profile.classify(_stack(loop, read)) == "recv"
    assert profile.classify(_stack(loop, read, "receive (stompbroker/processes/reader_conns.py:50)")) == "recv"
    stomp = "Framing.stomp (stompbroker/processes/reader_framing.py:125)"
    assert profile.classify(_stack(loop, read, received, stomp)) == "parse"
    frames = "Framing.frames (stompbroker/processes/reader_framing.py:140)"
    assert profile.classify(_stack(loop, read, received, stomp, frames)) == "ring write"
    assert profile.classify(_stack(loop, "Reader.push (stompbroker/processes/reader.py:170)")) == "ring write"


def test_profile_per_frame_costs(tmp_path):
    raw = tmp_path / "d.txt"
    raw.write_text("Dispatcher.run (stompbroker/processes/dispatcher.py:110);"
                   "send (stompbroker/broker/routing.py:35) 3\n"
                   "Dispatcher.run (stompbroker/processes/dispatcher.py:110);"
                   "Ring.notify (stompbroker/ipc/ring.py:93) 1\n")
    samples = profile.read_raw(str(raw))
    share, n = profile.shares(samples)
    assert n == 4 and share["routing"] == 0.75 and share["wake-up"] == 0.25
    # 2 CPU-seconds over 1M frames: 2 µs per frame, shared 3:1; two writers are summed
    out = profile.per_frame({"dispatcher": 2.0, "writer-0": 1.0, "writer-1": 1.0},
                            {"dispatcher": (share, n), "writer-0": ({"send": 1.0}, 5),
                             "writer-1": ({"send": 1.0}, 5)}, 1_000_000)
    assert out["dispatcher"]["routing"] == 1.5 and out["dispatcher"]["wake-up"] == 0.5
    assert out["dispatcher"]["total"] == 2.0
    assert out["writers"]["send"] == 2.0
    tops = profile.top_functions(samples)
    assert tops["inclusive"]["Dispatcher.run (processes/dispatcher.py)"] == 1.0
    assert tops["self"]["send (broker/routing.py:35)"] == 0.75


def test_profile_wake_up_and_wait_capped_by_counted_wake_ups():
    """Samples in Ring.notify and in select are mostly time runnable, not running (preempted by the
    woken process, or waiting for a CPU once woken): with the counts of eventfd writes and sleeps
    and the CPU of one, each costs at most that and the rest of the CPU goes to the other samples."""
    share = {"routing": 0.5, "wake-up": 0.4, "wait": 0.1}
    out = profile.per_frame({"dispatcher": 1.0}, {"dispatcher": (share, 100)}, 100_000,
                            counts={"dispatcher": {"wake-up": 1000, "wait": 400}}, wake_us=5.0)
    d = out["dispatcher"]
    assert d["wake-up"] == pytest.approx(0.05)             # 1,000 x 5 µs over 100,000 frames
    assert d["wait"] == pytest.approx(0.02)
    assert d["routing"] == pytest.approx(9.93)             # the rest of the 10 µs per frame
    assert d["total"] == pytest.approx(10.0)
    # more wake-ups than the samples can hold: the samples' share stands
    out = profile.per_frame({"dispatcher": 1.0}, {"dispatcher": (share, 100)}, 100_000,
                            counts={"dispatcher": {"wake-up": 10 ** 6, "wait": 10 ** 6}}, wake_us=5.0)
    assert out["dispatcher"]["wake-up"] == pytest.approx(4.0)
    assert out["dispatcher"]["routing"] == pytest.approx(5.0)


def test_send_header_goes_on_every_producer_send():
    from stompbroker.bench.runner import Runner
    opts = cli.parse_args(["--spawn", "--send-header", "priority:7", "--send-header", "x-delay:1"])
    assert opts.send_header == [("priority", "7"), ("x-delay", "1")]
    spec = Runner.producer_spec(type("R", (), {"opts": opts, "run_id": "r", "flow_control": None})(), None, "tcp", "/q")
    assert spec["headers"] == [("priority", "7"), ("x-delay", "1")]
    with pytest.raises(SystemExit):
        cli.parse_args(["--send-header", "no-colon"])


def test_lone_figures_are_per_send_and_per_process():
    res = report.new_result("lone-tcp", "lone", "tcp", {})
    res["broker"].update({"cpu_s": 0.5, "cpu_by_process": {"reader": 0.1, "dispatcher": 0.25, "writer-0": 0.15},
                          "kernel_cpu_by_process": {"writer-0": 0.05},
                          "syscalls_by_process": {"writer-0": {"writes": 20_000, "reads": 10_000}}})
    out = scenarios.lone_figures(res, 10_000)
    assert out["cpu_us_per_send"] == 50.0
    assert out["cpu_us_by_process"] == {"reader": 10.0, "dispatcher": 25.0, "writer-0": 15.0}
    assert out["kernel_us_by_process"] == {"writer-0": 5.0}
    assert out["syscalls_per_send"] == {"writer-0": {"writes": 2.0, "reads": 1.0}}
    assert scenarios.lone_figures(res, 0)["cpu_us_per_send"] is None
    res["lone"], res["status"], res["duration_s"] = out, "ok", 5.0
    res["headline"] = {"metric": "broker CPU per lone SEND", "value": 50.0, "unit": "us"}
    assert "one SEND in flight" in scenarios.LONE_FLOW
    table = compare.table([("a", [res])])
    assert "| lone receipted SEND (one in flight), broker CPU µs per SEND | 50.0 |" in table
    assert "| lone SEND: dispatcher µs | 25.0 |" in table
    assert "50.0 µs CPU/SEND" in report.summary_line(res)


def test_compare_table_has_the_latency_run_s_cpu():
    res = report.new_result("latency-tcp", "latency", "tcp", {})
    res.update(status="ok", duration_s=4.0, deliveries_per_cpu_s=8000,
               headline={"metric": "p99 latency", "value": 1.0, "unit": "ms"})
    table = compare.table([("a", [res])], rate=2000)
    assert any(line.startswith("| latency at 2,000 msg/s, deliveries per broker CPU-second | 8") for line in
               table.splitlines()), table


def test_a_commit_extracted_for_compare_gets_its_c_modules_compiled_as_the_install_does(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    where, commit = compare.extract_ref("HEAD", root, str(tmp_path / "tree"))
    sources = glob.glob(os.path.join(where, "stompbroker", "**", "*.c"), recursive=True)
    assert sources and len(commit) == 40
    probe = "import stompbroker.protocol.stomp as s; print(s.__file__, s.FrameParser.split)"
    done = subprocess.run([sys.executable, "-c", probe],
                          env={**os.environ, "PYTHONPATH": where}, cwd=str(tmp_path), capture_output=True, text=True)
    path, split = done.stdout.split(" ", 1)
    assert path.startswith(where) and "built-in function split" in split, done
