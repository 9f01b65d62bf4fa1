"""How a writer batches one connection's output (processes/batching.py), without sockets."""

from __future__ import annotations

import random

import pytest

from stompbroker.processes import batching
from stompbroker.processes.writer import Conn
from stompbroker.protocol.stomp import render_frame
from stompbroker.protocol.websocket import OP_BIN, OP_TEXT, encode_message

LIMIT = 100


def conn() -> Conn:
    return Conn(7, None)


def frame(n: int, fill: bytes = b"x") -> bytes:
    return fill * n


def sizes(c: Conn) -> list[int]:
    """Closed batches' sizes, then the open one's (if any)."""
    return [len(b) for b, _, _, _ in c.batches] + ([len(c.cur)] if c.cur else [])


def test_frames_share_a_batch_until_the_next_would_overflow():
    c = conn()
    for i in range(3):
        assert batching.add(c, frame(30), i + 1, LIMIT) == 30
    assert (c.batches, bytes(c.cur), c.cur_frames, c.cur_stamp) == ((), frame(90), 3, 1)
    batching.add(c, frame(30), 4, LIMIT)   # 120 > 100: the first three leave as one batch
    assert c.batches == [(bytearray(frame(90)), 1, 3, 0)]
    assert (bytes(c.cur), c.cur_frames, c.cur_stamp) == (frame(30), 1, 4)
    assert c.pending == 120


def test_a_frame_that_exactly_fills_the_batch_joins_it():
    c = conn()
    batching.add(c, frame(60), 0, LIMIT)
    batching.add(c, frame(40), 0, LIMIT)
    assert sizes(c) == [100] and not c.batches
    batching.add(c, frame(1), 0, LIMIT)
    assert sizes(c) == [100, 1]


def test_a_frame_larger_than_the_limit_is_a_batch_of_its_own():
    c = conn()
    batching.add(c, frame(30, b"a"), 1, LIMIT)
    batching.add(c, frame(250, b"b"), 2, LIMIT)
    batching.add(c, frame(10, b"c"), 3, LIMIT)
    assert c.batches == [(bytearray(frame(30, b"a")), 1, 1, 0), (bytearray(frame(250, b"b")), 2, 1, 0)]
    assert (bytes(c.cur), c.cur_stamp) == (frame(10, b"c"), 3)
    d = conn()
    batching.add(d, frame(250), 0, LIMIT)   # into an empty batch: written whole, not split
    assert sizes(d) == [250]
    batching.add(d, frame(250), 0, LIMIT)
    assert sizes(d) == [250, 250]


def test_close_keeps_the_first_frames_stamp_and_the_count():
    c = conn()
    batching.add(c, frame(10), 0, LIMIT)     # unstamped first frame: the batch is unstamped
    batching.add(c, frame(10), 55, LIMIT)
    batching.close(c)
    batching.add(c, frame(10), 66, LIMIT)
    batching.close(c)
    assert [(s, n) for _, s, n, _ in c.batches] == [(0, 2), (66, 1)]
    assert (c.cur, c.cur_frames) == (bytearray(), 0)


@pytest.mark.parametrize("seed", range(20))
def test_greedy_batches_in_order(seed):
    """Random frame sizes: order kept; every batch within the limit or a single frame; a batch was
    closed only because its successor's first frame did not fit."""
    rnd = random.Random(seed)
    frames = [bytes([i % 256]) * rnd.choice([1, 5, 40, 99, 100, 101, 300]) for i in range(200)]
    c = conn()
    for i, f in enumerate(frames):
        batching.add(c, f, i + 1, LIMIT)
    batching.close(c)
    assert b"".join(bytes(b) for b, _, _, _ in c.batches) == b"".join(frames)
    assert sum(n for _, _, n, _ in c.batches) == len(frames)
    assert c.pending == sum(map(len, frames))
    first = 0
    for k, (b, stamp, n, _) in enumerate(c.batches):
        assert stamp == first + 1
        assert len(b) <= LIMIT or n == 1
        if k + 1 < len(c.batches):
            assert len(b) + len(frames[first + n]) > LIMIT
        first += n


def test_websocket_wraps_each_stomp_frame_as_one_message():
    c = conn()
    text = render_frame("MESSAGE", {"destination": "/topic/a", "subscription": "0"}, b"hello")
    binary = render_frame("MESSAGE", {"destination": "/topic/a", "subscription": "0"}, b"\xff\xfe")
    n1 = batching.add(c, text, 0, 1000, ws=True)
    n2 = batching.add(c, binary, 0, 1000, ws=True)
    assert bytes(c.cur) == encode_message(text) + encode_message(binary)
    assert (n1, n2) == (len(text) + 2, len(binary) + 2)          # a 2-byte unmasked header each
    assert c.cur[0] == 0x80 | OP_TEXT and c.cur[n1] == 0x80 | OP_BIN   # FIN set, one frame each
    assert c.cur_frames == 2 and c.pending == n1 + n2


def test_websocket_headers_count_against_the_limit():
    c = conn()
    batching.add(c, frame(49), 0, LIMIT, ws=True)   # 51 bytes on the wire
    batching.add(c, frame(49), 0, LIMIT, ws=True)   # 102 > 100: a new batch
    assert sizes(c) == [51, 51]


def test_marked_frames_are_counted_per_batch():
    """Queue deliveries are marked so the writer can report them once sent: each batch knows how many."""
    c = conn()
    batching.add(c, frame(30), 1, LIMIT, mark=1)
    batching.add(c, frame(30), 2, LIMIT)
    batching.add(c, frame(30), 3, LIMIT, mark=1)
    batching.add(c, frame(30), 4, LIMIT, mark=1)   # 120 > 100: closes the first three
    assert [(n, marks) for _, _, n, marks in c.batches] == [(3, 2)]
    assert (c.cur_frames, c.cur_marks) == (1, 1)
    batching.close(c)
    assert [(n, marks) for _, _, n, marks in c.batches] == [(3, 2), (1, 1)] and c.cur_marks == 0
