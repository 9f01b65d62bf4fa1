"""A MESSAGE's shared part in Python (where the C renderer is not built: tests/unit/test_headrender.py
compares the two): the header block after message-id is rendered once and reused."""

from __future__ import annotations

import pytest

from stompbroker.broker import model
from stompbroker.broker.model import Message
from stompbroker.protocol.stomp import FrameParser, parse_head, render_frame


@pytest.fixture(autouse=True)
def python_rendering(monkeypatch):
    """Python's renderer, with its tables as a fresh process has them (other tests render too)."""
    monkeypatch.setattr(model, "RENDER_PART", None)
    monkeypatch.setattr(model, "_BLOCKS", ({}, {}))
    monkeypatch.setattr(model, "_LAST", [(None, -1, None, b""), (None, -1, None, b"")])
    monkeypatch.setattr(model, "_MISSES", [0, 0])


def rendered_from_scratch(message: Message, escaped: bool) -> bytes:
    """What the MESSAGE's shared part must be: every forwarded header, escaped per style."""
    fix = (lambda v: v) if escaped else (lambda v: v.replace("\r", " ").replace("\n", " "))
    pairs = [("message-id", fix(message.id)), ("destination", fix(message.destination))]
    pairs += [(fix(n), fix(v)) for n, v in message.headers.items() if n not in model.NOT_FORWARDED]
    pairs.append(("content-length", str(len(message.body))))
    return render_frame("MESSAGE", pairs, message.body, escape_headers=escaped)[len("MESSAGE\n"):]


def test_each_message_gets_its_own_id_and_the_same_block_as_a_fresh_rendering():
    headers = {"destination": "/queue/a", "receipt": "r", "content-length": "3", "x:y": "a\nb\\c",
               "persistent": "true", "priority": "4"}
    for escaped in (True, False):
        for i in range(3):
            for body in (b"abc", b"a\0c", b""):
                message = Message(f"t-{i}", "/queue/a", headers, body)
                part = message.shared(escaped)
                assert part == rendered_from_scratch(message, escaped)
                assert message.shared(escaped) is part
    message = Message("t-9", "/queue/a", headers, b"a\0c")
    ((head, body),) = FrameParser().feed(b"MESSAGE\n" + message.shared(True))
    assert body == b"a\0c"
    assert parse_head(head, True)[1] == {"message-id": "t-9", "destination": "/queue/a", "x:y": "a\nb\\c",
                                         "priority": "4", "content-length": "3"}


def test_a_header_or_destination_that_differs_gets_its_own_block_and_the_table_stays_bounded():
    a = Message("t-1", "/topic/a", {"destination": "/topic/a", "k": "1"}, b"x").shared(True)
    b = Message("t-1", "/topic/b", {"destination": "/topic/a", "k": "1"}, b"x").shared(True)
    c = Message("t-1", "/topic/a", {"destination": "/topic/a", "k": "2"}, b"x").shared(True)
    assert len({a, b, c}) == 3 and b"destination:/topic/b\n" in b and b"\nk:2\n" in c
    for i in range(model.BLOCK_CACHE_ENTRIES * 2):
        assert Message("t", "/topic/a", {"n": str(i)}, b"").shared(False).endswith(f"\nn:{i}\ncontent-length:0\n\n\0".encode())
    assert len(model._BLOCKS[False]) <= model.BLOCK_CACHE_ENTRIES


def test_a_producers_receipts_do_not_defeat_the_block_cache_and_are_never_rendered():
    model._BLOCKS[True].clear()
    parts = [Message(f"m{i}", "/topic/r", {"receipt": f"r{i}", "k": "v"}, b"x").shared(True) for i in range(3)]
    assert len(model._BLOCKS[True]) == 1
    assert parts[2] == b"message-id:m2\ndestination:/topic/r\nk:v\ncontent-length:1\n\nx\0"


def test_a_run_of_equal_headers_reuses_the_last_block_and_any_difference_breaks_the_run():
    headers = {"destination": "/queue/run", "x": "1"}
    first = Message("m-1", "/queue/run", dict(headers), b"body").shared(True)
    model._BLOCKS[1].clear()
    again = Message("m-2", "/queue/run", dict(headers), b"BODY").shared(True)
    assert model._BLOCKS[1] == {}  # the run's block came from the last message, not the table
    assert again == first.replace(b"m-1", b"m-2").replace(b"body", b"BODY")
    for other in (Message("m-3", "/queue/run", {**headers, "x": "2"}, b"body"),      # a value
                  Message("m-4", "/queue/other", dict(headers), b"body"),            # the destination
                  Message("m-5", "/queue/run", dict(headers), b"longer body")):      # the length
        fresh = render_frame("MESSAGE", [("subscription", "s"), ("message-id", other.id),
                                         ("destination", other.destination),
                                         *[(k, v) for k, v in other.headers.items() if k != "destination"]],
                             other.body)
        assert b"MESSAGE\nsubscription:s\n" + other.shared(True) == fresh


def test_a_run_of_headers_of_their_own_skips_the_table_and_a_repeating_producer_finds_it_again():
    for i in range(model.MISS_RUN * 4):     # a timestamp of its own on every message
        message = Message(f"u{i}", "/topic/t", {"destination": "/topic/t", "ts": str(i), "receipt": str(i)}, b"x")
        assert message.shared(True) == rendered_from_scratch(message, True)
    # past the first MISS_RUN misses, one message in MISS_RUN looks in the table (and misses)
    assert len(model._BLOCKS[True]) == model.MISS_RUN + 3
    a, b = {"destination": "/topic/t", "k": "a"}, {"destination": "/topic/t", "k": "b"}
    for i in range(model.MISS_RUN * 6):     # two producers in turn: the table has each after a few looks
        message = Message(f"r{i}", "/topic/t", dict(a if i % 2 else b), b"x")
        assert message.shared(True) == rendered_from_scratch(message, True)
    assert model._MISSES[True] == 0         # found in the table again: every message looks there
    before = dict(model._BLOCKS[True])
    Message("r", "/topic/t", dict(a), b"x").shared(True)
    Message("r", "/topic/t", dict(b), b"x").shared(True)
    assert model._BLOCKS[True] == before
