"""The stomp source and sink's pure parts: options, rows, ranges, dedup-ids (no Spark session)."""

from __future__ import annotations

import datetime

import pytest

from stompbroker.analysis import streaming


def test_options_defaults_env_and_errors():
    opts = streaming.parse_options({"destination": "/queue/a"}, env={"STOMPBROKER_LOGIN": "u",
                                                                     "STOMPBROKER_PASSCODE": "p"})
    assert (opts.url, opts.starting, opts.login, opts.passcode, opts.queue) == \
        ("stomp://127.0.0.1:61613", "latest", "u", "p", True)
    opts = streaming.parse_options({"URL": "ws://h:1/stomp", "MaxMessagesPerTrigger": "5", "login": "x"}, env={})
    assert opts.url == "ws://h:1/stomp" and opts.max_per_trigger == 5 and opts.login == "x"
    for bad, word in [({"url": "http://h"}, "url"), ({"startingOffsets": "middle"}, "startingOffsets"),
                      ({"maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger"), ({"mode": "fast"}, "mode"),
                      ({"numPartitions": "x"}, "numPartitions")]:
        with pytest.raises(ValueError, match=word):
            streaming.parse_options(bad, env={})


def test_a_message_as_a_row():
    headers = {"destination": "/topic/a", "message-id": "m-1", "subscription": "replay", "replayed": "true",
               "replay-seq": "7", "replay-ts": "1700000000000", "content-length": "3", "k": "v"}
    row = streaming.to_row(headers, b"\xffab", 7)
    assert row[:5] == ("/topic/a", "m-1", {"destination": "/topic/a", "message-id": "m-1", "k": "v"}, b"\xffab",
                       "\ufffdab")
    assert row[5] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc)
    assert row[6] == 7
    assert len(row) == len(streaming.SCHEMA.fields)


def test_ranges_cover_a_batch_exactly():
    assert streaming.split(5, 5, 3) == []
    assert streaming.split(0, 10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert streaming.split(3, 5, 4) == [(3, 4), (4, 5)]


def test_sink_frames_carry_a_deterministic_dedup_id():
    import pyarrow as pa
    writer = streaming.StompWriter(streaming.parse_options({"destination": "/topic/out"}, env={}),
                                   ["body", "headers"])
    batch = pa.record_batch({"body": ["hi"], "headers": [[("destination", "/topic/in"), ("message-id", "x"),
                                                          ("k", "v")]]},
                            schema=pa.schema([("body", pa.string()), ("headers", pa.map_(pa.string(), pa.string()))]))
    row, = streaming.as_dicts([batch])
    destination, body, headers = writer.frame(row, "q", "3", 1, 42)
    assert destination == "/topic/out" and body == b"hi"
    assert dict(headers) == {"k": "v", "persistent": "true", "dedup-id": "q:3:1:42"}
    by_column = streaming.StompWriter(streaming.parse_options({"dedupIdColumn": "message_id"}, env={}),
                                      ["destination", "body", "message_id"])
    destination, _, headers = by_column.frame({"destination": "/queue/x", "body": b"b", "message_id": "m-9"}, "q", 1, 0, 0)
    assert destination == "/queue/x" and dict(headers) == {"dedup-id": "m-9"}
    with pytest.raises(ValueError, match="body"):
        streaming.StompWriter(streaming.parse_options({"destination": "/queue/a"}, env={}), ["x"])
