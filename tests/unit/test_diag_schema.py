"""The dump line schema (stompbroker/diag/schema.py) against its writer, its Spark reader and the
analysis tests' synthetic dumps."""

from __future__ import annotations

import json

import orjson

import diag_dump_fixture as fx  # (tests/ is on sys.path)
from broker_harness import Rig
from stompbroker.diag import schema
from stompbroker.diag.stats import Statistics
from stompbroker.processes.common import READER_STATS, SUPERVISOR_STATS, WRITER_STATS


class Shared:
    """Stands for a SharedStats / SharedHistogram: fixed figures."""

    def __init__(self, values):
        self.values = values

    def read(self, *_):
        return self.values


class Ring:
    pending_records = 2


class Resources:
    def __init__(self, writers: int):
        self.reader_stats = Shared(dict.fromkeys(READER_STATS, 3.0))
        self.supervisor_stats = Shared(dict.fromkeys(SUPERVISOR_STATS, 0.0))
        self.writer_stats = [Shared(dict.fromkeys(WRITER_STATS, 5.0)) for _ in range(writers)]
        self.writer_latency = [Shared([1.0] * 128) for _ in range(writers)]
        self.input_ring = Ring()
        self.output_rings = [Ring() for _ in range(writers)]


def test_the_line_the_broker_writes_is_exactly_the_schema():
    rig = Rig(writers=2, node_id="edge-1", diag_interval=1000)
    rig.connect(1)
    rig.send(1, "/queue/a", b"kept")
    stats = Statistics(rig.broker, Resources(2), rig.config)
    line = orjson.loads(orjson.dumps(stats.snapshot()))
    assert line["schema"] == schema.VERSION
    assert line["queues"] and line["writers"] and line["process"]  # arrays checked item by item
    assert schema.problems(line) == []


def test_problems_name_wrong_types_missing_and_undeclared_fields():
    line = fx.line(0, 1)
    assert schema.problems(line, strict=False) == []  # the fixture leaves optional figures out
    line["ts"] = "soon"
    line["writers"][1]["frames"] = None
    del line["latency"]
    found = schema.problems(line)
    assert "ts: str, not number" in found
    assert "writers[1].frames: NoneType, not number" in found
    assert "latency: missing" in found
    assert "future: not in the schema" in found  # a field from a later version
    assert "broker.node: missing" not in found   # optional


def test_synthetic_dump_lines_are_schema_lines(tmp_path):
    for path in fx.write_dump(tmp_path / "diag.jsonl"):
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue  # the truncated last line
            assert line["schema"] == schema.VERSION
            assert schema.problems(line, strict=False) == []
