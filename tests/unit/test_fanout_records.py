"""A topic message to several connections of one writer is one DATA_EACH record (the rendered part
once, with each subscription's prefix), and the writer makes each connection's frame of it."""

from __future__ import annotations

import socket

from broker_harness import Rig
from inprocess import resources  # noqa: F401 (a fixture)
from stompbroker.ipc import records as R
from stompbroker.protocol.websocket import encode_message
from test_writer_bare_fds import adopt, make_writer


def records(r: Rig) -> list[tuple[int, int, int]]:
    """(kind, conn, aux) of each record in the outbox."""
    return [(kind, conn, aux) for kind, conn, aux, _, _ in R.iter_records(bytes(r.outboxes[0].buf))]


def test_a_fan_out_to_one_writer_is_one_record_and_each_subscriber_gets_its_frame():
    r = Rig()
    r.connect(1)
    for conn in (2, 3, 4):
        r.connect(conn)
        r.subscribe(conn, "/topic/t", sub_id=f"s{conn}")
    r.subscribe(4, "/topic/t", sub_id="again")   # two subscriptions of one connection: two frames, in order
    r.outboxes[0].take()
    r.send(1, "/topic/t", b"hello", colour="red")
    assert records(r) == [(R.DATA_EACH, 0, 4)]
    payload = bytes(r.outboxes[0].buf)[R.HEADER_SIZE:]
    assert payload.count(b"hello") == 1 and payload.count(b"colour:red") == 1   # the part, once
    for conn, ids in ((2, ["s2"]), (3, ["s3"]), (4, ["s4", "again"])):
        got = r.messages(conn)
        assert [m["subscription"] for m in got] == ids and {m.body for m in got} == {b"hello"}
        assert len({m["message-id"] for m in got}) == 1


def test_a_tracked_or_differently_rendered_delivery_splits_the_record_and_order_is_kept():
    r = Rig()
    r.connect(1)
    r.connect(2)
    r.connect(3, version="1.0")   # (1.0: its headers are rendered unescaped: another part)
    r.subscribe(2, "/topic/t", sub_id="a")
    r.subscribe(2, "/topic/t", sub_id="b", ack="client")
    r.subscribe(2, "/topic/t", sub_id="c")
    r.subscribe(3, "/topic/t", sub_id="d")
    r.outboxes[0].take()
    r.send(1, "/topic/t", b"x")
    assert [(kind, conn) for kind, conn, _ in records(r)] == [(R.DATA, 2), (R.DATA, 2), (R.DATA, 2), (R.DATA, 3)]
    r.subscribe(2, "/topic/t", sub_id="e")   # five: gathered, in the same places
    r.outboxes[0].take()
    r.send(1, "/topic/t", b"x")
    assert [(kind, conn) for kind, conn, _ in records(r)] == [(R.DATA, 2), (R.DATA, 2), (R.DATA, 2), (R.DATA, 3),
                                                               (R.DATA, 2)]
    assert [m["subscription"] for m in r.messages(2)] == ["a", "b", "c", "e"]
    for sub_id in ("f", "g"):   # three plain ones in a row at the end: one record
        r.subscribe(2, "/topic/t", sub_id=sub_id)
    r.outboxes[0].take()
    r.send(1, "/topic/t", b"x")
    assert [(kind, aux) for kind, _, aux in records(r)][4:] == [(R.DATA_EACH, 3)]
    assert [m["subscription"] for m in r.messages(2)] == ["a", "b", "c", "e", "f", "g"]


def test_a_fan_out_stops_once_its_outbox_is_over_the_limit_even_at_its_last_delivery():
    for subscribers, steps in ((4, 1), (2, 2)):   # gathered in one record; delivery by delivery
        r = Rig()
        r.connect(1)
        for conn in range(2, 2 + subscribers):
            r.connect(conn)
            r.subscribe(conn, "/topic/t")
        r.outboxes[0].take()
        r.outboxes[0].limit = 100
        r.send(1, "/topic/t", b"y" * 200)
        for _ in range(steps):
            assert r.broker.unfinished   # the caller stops; the outbox goes to the ring before more is added
            r.outboxes[0].take()
            r.broker.resume()
        assert not r.broker.unfinished and records(r) == []


def test_the_writer_makes_each_connections_frame_of_one_record(resources):
    config, res = resources
    w = make_writer(res, config)
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        conns = [adopt(w, res, 10 + i, theirs) for i, (_, theirs) in enumerate(pairs)]
        conns[2].ws = True
        part = b"message-id:m-1\ndestination:/topic/t\ncontent-length:2\n\nhi\0"
        prefixes = [b"MESSAGE\nsubscription:%d\n" % i for i in range(3)]
        payload = b"".join(R.each_entry(10 + i, prefix) for i, prefix in enumerate(prefixes)) + part
        blob = R.record(R.DATA_EACH, 0, payload, 3) + R.record(R.DATA, 10, b"RECEIPT\nreceipt-id:r\n\n\0")
        assert res.output_rings[0].try_write(blob, 4)
        w.drain_ring()
        expected = [prefixes[0] + part + b"RECEIPT\nreceipt-id:r\n\n\0", prefixes[1] + part,
                    encode_message(prefixes[2] + part)]
        for (ours, _), want in zip(pairs, expected):
            ours.settimeout(1.0)
            assert ours.recv(4096) == want
        assert w.stats["frames"] == 4
    finally:
        for c in list(w.conns.values()):
            w.discard(c)
        for pair in pairs:
            for s in pair:
                s.close()


def test_a_records_entries_are_bounded_in_bytes():
    r = Rig()
    r.connect(1)
    r.connect(2)
    for i in range(100):
        r.subscribe(2, "/topic/t", sub_id=f"{i:04d}" + "i" * 1000)   # ~1 KB entries: 100 KB in all
    r.outboxes[0].take()
    r.send(1, "/topic/t", b"z")
    got = records(r)
    assert [kind for kind, _, _ in got] == [R.DATA_EACH, R.DATA_EACH] and sum(aux for _, _, aux in got) == 100
    assert all(length <= R.HEADER_SIZE + 64 * 1024 + 200 for length in
               [R.unpack_header(bytes(r.outboxes[0].buf), 0)[0]])
    assert [m["subscription"][:4] for m in r.messages(2)] == [f"{i:04d}" for i in range(100)]
