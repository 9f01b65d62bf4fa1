"""Output over an outbox's limit: the broker never waits for a writer's ring. An event whose
deliveries take an outbox over its limit stops resumably (``Broker.unfinished``); the test then
does what the dispatcher does (hand each batch over, ``Broker.resume()``) until it is done, and
checks that every delivery arrives once, in order, in batches of at most the limit plus one record,
with receipts after the deliveries they follow and later frames after the whole event."""

from __future__ import annotations

from broker_harness import Rig, decode
from stompbroker.ipc import records as R
from stompbroker.ipc.outbox import Outbox
from stompbroker.processes.dispatcher import batches

LIMIT = 700  # bytes: a few deliveries per batch


def limited(rig: Rig) -> None:
    for box in rig.outboxes:
        box.take()
        box.limit = LIMIT


def last_record_size(buf: bytes) -> int:
    pos = size = 0
    while pos < len(buf):
        size = R.unpack_header(buf, pos)[0]
        pos += size
    return size


def finish(rig: Rig) -> int:
    """Drain and resume until nothing is unfinished, as the dispatcher's loop does; returns the
    number of stops. Every batch handed over holds at most LIMIT bytes plus one record."""
    stops = 0
    while True:
        for box in rig.outboxes:
            buf = bytes(box.buf)
            assert len(buf) - last_record_size(buf) <= LIMIT, (len(buf), LIMIT)
        rig._drain()
        if not rig.broker.unfinished:
            return stops
        rig.broker.resume()
        stops += 1


def order(rig: Rig) -> list[tuple]:
    """(conn, command, body) of every STOMP frame written, in the order written."""
    return [(o.conn, o.command, o.body) for o in rig.seen if o.kind == "DATA"]


def test_a_topic_fan_out_stops_over_the_limit_and_resumes_in_order():
    rig = Rig(writers=2)
    subscribers = range(2, 42)
    rig.connect(1)
    for conn in subscribers:
        rig.connect(conn, writer=conn % 2)
        rig.subscribe(conn, "/topic/t")
    limited(rig)
    rig.seen.clear()
    rig.send(1, "/topic/t", body=b"first", receipt="r1")
    assert rig.broker.unfinished, "the fan-out did not stop over the limit"
    assert finish(rig) >= 3
    rig.send(1, "/topic/t", body=b"second")
    assert finish(rig) >= 3
    for conn in subscribers:
        assert rig.bodies(conn) == [b"first", b"second"]
    frames = order(rig)
    receipt = frames.index((1, "RECEIPT", b""))
    firsts = [i for i, f in enumerate(frames) if f[2] == b"first"]
    seconds = [i for i, f in enumerate(frames) if f[2] == b"second"]
    assert len(firsts) == len(seconds) == len(subscribers)
    assert max(firsts) < receipt < min(seconds)  # the receipt follows the deliveries of its SEND
    assert rig.broker.stats["messages_delivered"] == 2 * len(subscribers)


def test_a_queue_pump_stops_over_the_limit_and_resumes_in_order():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    bodies = [b"m%02d" % i for i in range(30)]
    for body in bodies:
        rig.send(1, "/queue/q", body=body)
    limited(rig)
    rig.subscribe(2, "/queue/q", receipt="sub")  # takes the 30 waiting messages at once
    assert rig.broker.unfinished, "the pump did not stop over the limit"
    assert finish(rig) >= 3
    rig.send(1, "/queue/q", body=b"later", receipt="r")
    finish(rig)
    got = rig.frames(2)
    assert [o.command for o in got] == ["RECEIPT"] + ["MESSAGE"] * 31
    assert [o.body for o in got[1:]] == bodies + [b"later"]
    assert rig.commands(1) == ["RECEIPT"]
    assert rig.broker.queue_stats()[0]["depth"] == 0


def test_a_commit_of_several_sends_keeps_their_order_and_receipts_after_them():
    rig = Rig()
    subscribers = range(2, 22)
    rig.connect(1)
    for conn in subscribers:
        rig.connect(conn)
        rig.subscribe(conn, "/topic/t")
    rig.frame(1, "BEGIN", transaction="tx")
    for body in (b"a", b"b", b"c"):
        rig.send(1, "/topic/t", body=body, transaction="tx")
    rig.send(1, "/queue/q", body=b"queued", transaction="tx")
    limited(rig)
    rig.seen.clear()
    rig.frame(1, "COMMIT", transaction="tx", receipt="commit")
    assert rig.broker.unfinished
    assert finish(rig) >= 3
    rig.send(1, "/topic/t", body=b"after")
    finish(rig)
    for conn in subscribers:
        assert rig.bodies(conn) == [b"a", b"b", b"c", b"after"]
    frames = order(rig)
    receipt = frames.index((1, "RECEIPT", b""))
    committed = [i for i, f in enumerate(frames) if f[2] in (b"a", b"b", b"c")]
    assert len(committed) == 3 * len(subscribers)
    assert max(committed) < receipt < min(i for i, f in enumerate(frames) if f[2] == b"after")
    rig.subscribe(2, "/queue/q", sub_id="q")
    finish(rig)
    assert rig.bodies(2) == [b"queued"]


def test_a_batch_too_big_for_the_ring_is_cut_at_record_boundaries():
    box = Outbox()
    for i in range(100):
        box.add(R.DATA, i, b"x" * (i % 37))
    buf, count = box.take()
    pieces = list(batches(buf, 300, 1000))
    assert b"".join(p for p, _ in pieces) == bytes(buf)
    assert sum(n for _, n in pieces) == count
    for piece, n in pieces:
        assert len(piece) - last_record_size(piece) <= 300
        assert len(decode(piece)) == n


def test_a_record_too_big_for_the_ring_becomes_an_error_to_its_connection_only():
    """The last guard: a record the ring could never hold (every answer is bounded well below it)
    is replaced by an ERROR and a close for its connection; a record over a quarter of the ring
    travels alone; the others go as they came (failed before: RingFull raised in the dispatcher)."""
    box = Outbox()
    box.add(R.DATA, 1, b"MESSAGE\n\nbefore\0")
    box.add(R.DATA, 2, b"DIAG\nqueues:" + b"x" * 5000 + b"\n\n\0")   # too big for a ring of 4000
    box.add(R.RAW, 3, b"HTTP/1.1 200 OK\r\n\r\n" + b"y" * 5000)       # an HTTP answer too big
    box.add(R.DATA, 4, b"MESSAGE\n\n" + b"z" * 2500 + b"\0")            # big, but fits alone
    box.add(R.DATA, 1, b"MESSAGE\n\nafter\0")
    buf, count = box.take()
    replaced = []
    pieces = list(batches(buf, 1000, 4000, replaced))
    assert replaced == [R.DATA, R.RAW]  # (the dispatcher counts the HTTP one in /metrics)
    assert all(len(piece) <= 4000 - 64 for piece, _ in pieces)
    records = [(kind, conn, payload) for piece, n in pieces for kind, conn, _, _, payload in R.iter_records(piece)]
    assert [(kind, conn) for kind, conn, _ in records] == [
        (R.DATA, 1), (R.DATA, 2), (R.CLOSE, 2), (R.RAW, 3), (R.CLOSE, 3), (R.DATA, 4), (R.DATA, 1)]
    assert records[1][2].startswith(b"ERROR\nmessage:answer too large\n")
    assert records[3][2].startswith(b"HTTP/1.1 500 ")
    assert records[5][2] == b"MESSAGE\n\n" + b"z" * 2500 + b"\0"
    assert sum(n for _, n in pieces) == len(records)
