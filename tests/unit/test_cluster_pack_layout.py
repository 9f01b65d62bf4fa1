"""Packs of queue messages in one JetStream message (cluster/packs.py): the layout byte by byte,
what the bridge packs per turn, how a pulled pack is settled, and the queue limit in packs."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import orjson
import pytest

from stompbroker.cluster import packs as P


def test_a_member_byte_by_byte():
    data = P.member("m-1", {"a": "b"}, b"xy", expires_ms=0x0102030405, before=2)
    assert data == (struct.pack(">I", 4 + 8 + 2 + 3 + 4 + 9 + 2)   # size: everything after this field
                    + b"\x00\x00\x00\x02"                          # before
                    + b"\x00\x00\x00\x01\x02\x03\x04\x05"          # expires, wall ms
                    + b"\x00\x03" + b"m-1"                         # id
                    + b"\x00\x00\x00\x09" + b'{"a":"b"}'           # headers, JSON
                    + b"xy")                                       # body


def test_a_pack_byte_by_byte_and_back():
    one, two = P.member("a", {}, b"1"), P.member("b", {"k": "v"}, b"", 7, 1)
    data = P.pack("/queue/é", [one, two])
    assert data[:4] == b"SBp1" and data[4:6] == b"\x00\x02"                  # magic, 2 members
    assert data[6:10] == b"\x00\x00\x00\x09" and data[10:19] == "/queue/é".encode()  # destination, once
    assert data[19:] == one + two
    assert P.count(data) == 2
    assert P.unpack(data) == [P.Member("a", "/queue/é", {}, b"1", 0, 0), P.Member("b", "/queue/é", {"k": "v"}, b"", 7, 1)]
    assert P.pack_header("/queue/é".encode(), 2) == data[:19]


def test_the_unpacked_format_is_read_too():
    single = P.single("id", "/queue/q", {"h": "1"}, b"\x00body", 99)
    meta = b'{"id":"id","d":"/queue/q","h":{"h":"1"},"x":99}'
    assert single == b"SBq1" + struct.pack(">I", len(meta)) + meta + b"\x00body"   # as nodes before packs write it
    assert P.count(single) == 1
    assert P.unpack(single) == [P.Member("id", "/queue/q", {"h": "1"}, b"\x00body", 99, 0)]
    again = P.single("id", "/queue/q", {}, b"", 0, before=3)   # a member put back into an unpacked layout
    assert P.unpack(again)[0].before == 3


@pytest.mark.parametrize("data", [
    b"", b"junk", b"SBp1", b"SBq1\x00\x00\x00\x05{bad", b"SBq1\x00\x00\x00\x02{}",
    P.pack("/q", [P.member("a", {}, b"x")])[:-3] + b"\x00\x00\x00\xff",          # a member runs past the end
    P.pack("/q", [P.member("a", {}, b"x")]) + b"tail",                            # bytes after the last member
    P.pack_header(b"/q", 2) + P.member("a", {}, b"x"),                            # fewer members than it says
    P.pack_header(b"/q", 1) + struct.pack(">IIQH", 4 + 8 + 2 + 4 + 2, 0, 0, 0) + b"\x00\x00\x00\x02[]",  # headers not an object
])
def test_anything_unreadable_is_a_value_error(data):
    with pytest.raises(ValueError):
        P.unpack(data)


def test_a_members_headers_are_decoded_only_when_they_differ_from_the_one_before(monkeypatch):
    """failed before: each member's headers were decoded (orjson.loads) one by one."""
    colours = ["red", "red", "red", "blue", "red", "red"]
    data = P.pack("/queue/h", [P.member(f"m-{i}", {"colour": c}, b"x") for i, c in enumerate(colours)])
    real, decoded = orjson.loads, []
    monkeypatch.setattr(orjson, "loads", lambda raw: decoded.append(bytes(raw)) or real(raw))
    members = P.unpack(data)
    assert [m.headers for m in members] == [{"colour": c} for c in colours]
    assert decoded == [b'{"colour":"red"}', b'{"colour":"blue"}', b'{"colour":"red"}']
    members[0].headers["colour"] = "blue"     # each member's headers are its own
    del members[1].headers["colour"]
    assert [m.headers for m in members[2:]] == [{"colour": c} for c in colours[2:]]


def test_count_of_anything_else_is_one():
    assert P.count(b"") == 1 and P.count(b"SBp1") == 1 and P.count(b"SBq1....") == 1


def test_a_pack_holds_one_to_65535():
    with pytest.raises(ValueError):
        P.pack("/q", [])
    with pytest.raises(ValueError):
        P.pack("/q", [b""] * 65536)


def ids():
    n = iter(range(1, 100))
    return lambda: f"p{next(n)}"


def members_of(ready):
    return [m.id for m in P.unpack(ready.payload)]


def test_the_packer_gathers_per_subject_in_order_and_hands_out_full_packs_first():
    packer = P.Packer(3, ids())
    for i in range(4):
        packer.add("s.a", "/queue/a", P.member(f"a{i}", {}, b"x"), token=10 + i)
        packer.add("s.b", "/queue/b", P.member(f"b{i}", {}, b"x"), token=20 + i)
    ready = packer.take()
    assert [(r.subject, r.msg_id, members_of(r), r.tokens) for r in ready] == [
        ("s.a", "p1", ["a0", "a1", "a2"], [10, 11, 12]),   # full at 3: closed at once
        ("s.b", "p2", ["b0", "b1", "b2"], [20, 21, 22]),
        ("s.a", "p3", ["a3"], [13]),                       # the rest at the end of the round
        ("s.b", "p4", ["b3"], [23])]
    assert P.unpack(ready[0].payload)[0].destination == "/queue/a"
    assert packer.take() == [] and len(packer) == 0


def test_a_message_with_its_own_id_goes_alone_after_what_its_subject_gathered():
    packer = P.Packer(16, ids())
    packer.add("s", "/q", P.member("1", {}, b""), 1)
    packer.add("s", "/q", P.member("2", {}, b""), 2, msg_id="/q order-7")
    packer.add("s", "/q", P.member("3", {}, b""), 3)
    ready = packer.take()
    assert [(r.msg_id, members_of(r)) for r in ready] == [("p1", ["1"]), ("/q order-7", ["2"]), ("p2", ["3"])]


def test_a_pack_stays_under_its_byte_limit_and_a_big_message_goes_alone():
    small, big = P.member("s", {}, b"x" * 100), P.member("b", {}, b"x" * 5000)
    packer = P.Packer(100, ids(), max_bytes=1000)
    for i in range(8):
        packer.add("s", "/q", small, i)
    packer.add("s", "/q", big, 99)
    ready = packer.take()
    assert [len(r.tokens) for r in ready] == [7, 1, 1]     # 7 members and a header fit in 1000 bytes
    assert all(len(r.payload) <= 1000 for r in ready[:2]) and ready[2].tokens == [99]


def test_the_ledger_settles_a_message_alone_at_once():
    ledger = P.Ledger()
    assert ledger.settle(7, P.NAK, 250) == (P.NAK, 250) and len(ledger) == 0
    ledger.hold(8, 1)                                        # (a pack of one is a message alone)
    assert ledger.settle(8, P.ACK) == (P.ACK, 0) and len(ledger) == 0


def test_the_ledger_settles_a_pack_once_every_member_is():
    ledger = P.Ledger()
    ledger.hold(1, 3)
    ledger.hold(2, 2)
    assert ledger.settle(1, P.ACK) is None
    assert ledger.settle(1, P.TERM) is None
    assert ledger.settle(2, P.ACK) is None and len(ledger) == 2
    assert ledger.settle(1, P.ACK) == (P.ACK, 0) and len(ledger) == 1
    assert ledger.settle(1, P.ACK) == (P.ACK, 0)            # (settled: a ref it no longer holds goes as asked)


def test_a_pack_is_termed_when_all_were_and_nak_ed_when_any_was():
    ledger = P.Ledger()
    ledger.hold(1, 2)
    ledger.settle(1, P.TERM)
    assert ledger.settle(1, P.TERM) == (P.TERM, 0)
    ledger.hold(2, 3)
    ledger.settle(2, P.NAK, 250)
    ledger.settle(2, P.ACK)
    assert ledger.settle(2, P.NAK, 2000) == (P.NAK, 2000)   # the longest delay asked for


def config(pack_max, max_queue_messages):
    return SimpleNamespace(cluster_pack_max=pack_max, max_queue_messages=max_queue_messages)


@pytest.mark.parametrize("pack_max, limit, size, per_subject", [
    (16, 100_000, 16, 6250), (16, 10_000, 10, 1000), (16, 1_500, 1, 1500), (16, 5, 1, 5), (1, 100_000, 1, 100_000),
    (64, 0, 64, 0), (16, 16_999, 16, 1062)])
def test_a_packed_queue_never_holds_more_than_max_queue_messages(pack_max, limit, size, per_subject):
    c = config(pack_max, limit)
    assert (P.size(c), P.queue_limit(c)) == (size, per_subject)
    assert P.queue_limit(c) * P.size(c) <= limit or limit == 0
    assert P.queue_limit(c) >= min(limit, P.MIN_PACKS)      # fed one at a time, it still holds this many
