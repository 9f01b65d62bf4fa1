"""The broker's cluster side (stompbroker/cluster/backplane.py), driven through Broker with a Rig:
records to the bridge decoded, records from it fed in, no NATS."""

from __future__ import annotations

import orjson

from stompbroker.broker.model import Message
from stompbroker.cluster import records as C
from stompbroker.cluster import shards
from stompbroker.cluster.backplane import Backplane

from broker_harness import Rig


def rig(**settings) -> Rig:
    r = Rig(cluster="nats://127.0.0.1:4222", node_id="n1", cluster_name="c", **settings)
    r.broker.backplane = Backplane(r.config)
    return r


def to_bridge(r: Rig) -> list[tuple]:
    """Records the backplane made for the bridge since the last call, the dispatcher's round ended:
    (kind name, conn, aux, payload)."""
    r.broker.backplane.close_run()
    buf, _ = r.broker.backplane.out.take()
    return [(C.Kind(kind).name, conn, aux, bytes(payload)) for kind, conn, aux, _, payload in C.iter_records(bytes(buf))]


def feed(r: Rig, *records: bytes) -> None:
    r.broker.backplane.on_records(r.broker, b"".join(records), r.now)


def status(connected: bool) -> bytes:
    return C.record(C.STATUS, 0, orjson.dumps({"connected": connected, "server": "nats://x:1"}))


def remote(pattern: str, count: int = 1) -> bytes:
    return C.record(C.REMOTE, 0, pattern.encode(), count)


def messages_of(message: bytes) -> list[tuple[str, bytes]]:
    """(destination, body) of each message a topic message to NATS carries (a pack, or one alone)."""
    if message.startswith(C.TOPIC_PACK):
        destination, members = C.unpack_topic(message)
        return [(destination, body) for _, _, body, _ in members]
    _, destination, _, body, _ = C.unpack_message(message)
    return [(destination, body)]


def published(records) -> list[tuple]:
    out = []
    for name, conn, aux, payload in records:
        if name == "PUBLISH":
            subject, message = C.unpack_publish(payload)
            for destination, body in messages_of(message):
                out.append((subject, destination, body, conn, aux))
    return out


def test_interest_counts_topic_and_worker_subscriptions_only():
    r = rig()
    r.connect(1)
    r.subscribe(1, "/topic/a", "s1")
    r.subscribe(1, "/topic/a", "s2")
    r.subscribe(1, "/queue/q", "s3")
    r.subscribe(1, "#jobs", "s4")
    r.subscribe(1, "/topic/*", "s5")
    assert to_bridge(r) == [("INTEREST", 0, 1, b"/topic/a"), ("INTEREST", 0, 2, b"/topic/a"),
                            ("INTEREST", 0, 1, b"#jobs"), ("INTEREST", 0, 1, b"/topic/*")]
    r.frame(1, "UNSUBSCRIBE", id="s1")
    r.frame(1, "UNSUBSCRIBE", id="s3")
    assert to_bridge(r) == [("INTEREST", 0, 1, b"/topic/a")]
    r.frame(1, "DISCONNECT")
    r.broker.on_closed(1)
    assert sorted(to_bridge(r)) == [("INTEREST", 0, 0, b"#jobs"), ("INTEREST", 0, 0, b"/topic/*"),
                                    ("INTEREST", 0, 0, b"/topic/a")]


def test_a_message_goes_to_nats_only_when_another_node_wants_it():
    r = rig()
    r.connect(1)
    r.subscribe(1, "/topic/a")
    to_bridge(r)
    feed(r, status(True))
    r.send(1, "/topic/a", b"local only")
    assert r.bodies(1) == [b"local only"]
    assert published(to_bridge(r)) == []
    feed(r, remote("/topic/*"))
    r.send(1, "/topic/a", b"both", receipt="r1", colour="red")
    # the local delivery and the receipt are out at once; the message goes to the bridge
    assert r.commands(1) == ["MESSAGE", "RECEIPT"]
    assert published(to_bridge(r)) == [("c.t.topic.a", "/topic/a", b"both", 0, 0)]
    feed(r, remote("/topic/*", 0))
    r.send(1, "/topic/a", b"gone")
    assert published(to_bridge(r)) == []


def test_headers_and_expiry_travel_the_broker_ones_do_not():
    r = rig()
    r.connect(1)
    feed(r, status(True), remote("/topic/a"))
    r.send(1, "/topic/a", b"x", receipt="r1", colour="red", expiration="5000")
    ((_, _, _, payload),) = [x for x in to_bridge(r) if x[0] == "PUBLISH"]
    _, message = C.unpack_publish(payload)
    destination, ((mid, head, body, expires_ms),) = C.unpack_topic(message)
    assert orjson.loads(head) == {"colour": "red", "expiration": "5000"}
    assert 4990 <= expires_ms <= 5000
    assert mid.endswith("-1")


def test_a_message_from_another_node_reaches_each_matching_subscription_once_and_goes_no_further():
    r = rig(TTL=10_000)
    r.connect(1)
    r.subscribe(1, "/topic/a/b", "exact")
    r.subscribe(1, "/topic/a*", "wild")
    r.subscribe(1, "/topic/a/b", "picky", selector="colour = 'blue'")
    feed(r, status(True), remote("/topic/*"))
    to_bridge(r)
    message = C.pack_message("n2-7", "/topic/a/b", {"colour": "red"}, b"hello")
    feed(r, C.record(C.MESSAGE, 0, message))
    got = r.messages(1)
    assert sorted(m["subscription"] for m in got) == ["exact", "wild"]
    assert {m["message-id"] for m in got} == {"n2-7"}
    assert published(to_bridge(r)) == []          # never sent on, even with remote interest
    feed(r, C.record(C.MESSAGE, 0, C.pack_message("n2-8", "/topic/nobody", {}, b"x")))
    assert len(r.broker.stale) == 0                # nor kept for late subscribers here


def test_a_message_from_another_node_past_a_subscribers_bound_ends_its_session_at_once():
    # The bound's ERROR closes the session from below; the record's handling ends it before returning
    # (its subscriptions gone), not at some later tick.
    r = rig(max_held_bytes=4096)
    r.connect(1)
    r.subscribe(1, "/topic/a", "s", ack="client")
    feed(r, C.record(C.MESSAGE, 0, C.pack_message("n2-1", "/topic/a", {}, b"x" * 8192)))
    assert r.error(1)["message"] == "too many unacknowledged messages"
    session = r.broker.sessions[1]
    assert session.closing and not session.subs and not r.broker.index.match("/topic/a")
    assert not r.broker.ending


def test_stale_messages_go_to_the_first_node_that_announces_interest():
    r = rig(TTL=10_000)
    r.connect(1)
    feed(r, status(True))
    r.send(1, "/topic/late", b"one")
    r.send(1, "/topic/late", b"two")
    r.send(1, "/topic/other", b"three")
    assert len(r.broker.stale) == 3
    feed(r, remote("/topic/la*"))
    assert [(d, b) for _, d, b, _, _ in published(to_bridge(r))] == [("/topic/late", b"one"),
                                                                     ("/topic/late", b"two")]
    assert len(r.broker.stale) == 1
    feed(r, remote("/topic/late/x"))  # a second node's interest finds nothing left for it
    assert published(to_bridge(r)) == []


def test_worker_messages_go_round_the_clusters_subscriptions():
    r = rig()
    r.connect(1)
    r.subscribe(1, "#jobs")
    feed(r, status(True), remote("#jobs", 2))
    to_bridge(r)
    for i in range(6):
        r.send(1, "#jobs", str(i).encode())
    local = r.bodies(1)
    remote_sent = published(to_bridge(r))
    assert local == [b"0", b"3"]
    assert [(s, b, aux) for s, _, b, _, aux in remote_sent] == [
        ("c.w.jobs", b"1", C.PUBLISH_WORKER), ("c.w.jobs", b"2", C.PUBLISH_WORKER),
        ("c.w.jobs", b"4", C.PUBLISH_WORKER), ("c.w.jobs", b"5", C.PUBLISH_WORKER)]
    # one from another node goes to a local subscription
    feed(r, C.record(C.MESSAGE, 0, C.pack_message("n2-1", "#jobs", {}, b"in"), C.PUBLISH_WORKER))
    assert r.bodies(1) == [b"in"]


def test_nats_unreachable_a_send_that_needs_it_waits_then_gets_an_error():
    r = rig(cluster_timeout_ms=1000)
    r.connect(1)
    feed(r, status(True), remote("/topic/a"))
    r.subscribe(1, "/topic/a")
    feed(r, status(False))
    to_bridge(r)
    r.send(1, "/topic/a", b"held", receipt="r1")
    assert r.bodies(1) == [b"held"]       # local delivery at once, no receipt yet
    r.send(1, "/topic/local-only", b"x", receipt="r2")
    assert r.frames(1) == []              # its receipt waits behind r1
    ((_, _, _, token, _),) = published(to_bridge(r))
    assert token
    feed(r, C.record(C.FAILED, token))
    error = r.error(1)
    assert error["message"] == "cluster unavailable" and error["receipt-id"] == "r1"


def test_nats_back_in_time_the_receipts_follow_in_order():
    r = rig()
    r.connect(1)
    feed(r, status(False), remote("/topic/a"))
    r.send(1, "/topic/a", b"1", receipt="r1")
    r.send(1, "/topic/b", b"2", receipt="r2")
    r.send(1, "/topic/a", b"3", receipt="r3")
    tokens = [conn for _, _, _, conn, _ in published(to_bridge(r))]
    assert len(tokens) == 2 and all(tokens)
    assert r.frames(1) == []
    feed(r, C.record(C.PUBLISHED, tokens[0]))
    assert [f["receipt-id"] for f in r.frames(1)] == ["r1", "r2"]
    feed(r, status(True), C.record(C.PUBLISHED, tokens[1]))
    assert [f["receipt-id"] for f in r.frames(1)] == ["r3"]
    r.send(1, "/topic/a", b"4", receipt="r4")
    assert [f["receipt-id"] for f in r.frames(1)] == ["r4"]


def test_a_bridge_that_never_answers_fails_on_the_brokers_clock():
    r = rig(cluster_timeout_ms=1000)
    r.connect(1)
    feed(r, status(False), remote("/topic/a"))
    r.send(1, "/topic/a", b"1", receipt="r1")
    assert r.broker.needs_tick()
    r.tick(2.5)
    assert r.frames(1) == []
    r.tick(1.0)
    assert r.error(1)["message"] == "cluster unavailable"


def test_a_new_bridge_is_told_the_whole_interest():
    r = rig()
    r.connect(1)
    r.subscribe(1, "/topic/a", "s1")
    r.subscribe(1, "/topic/a", "s2")
    r.subscribe(1, "/topic/b*", "s3")
    to_bridge(r)
    feed(r, C.record(C.BRIDGE_START))
    assert sorted(to_bridge(r)) == [("INTEREST", 0, 1, b"/topic/b*"), ("INTEREST", 0, 2, b"/topic/a")]


def finish(r: Rig) -> int:
    """Resume the broker's unfinished steps, draining the outboxes, until none is left: how many."""
    stops = 0
    while r.broker.unfinished:
        r._drain()
        r.broker.resume()
        stops += 1
    return stops


def test_a_held_send_behind_a_stopped_fan_out_keeps_its_token_and_its_receipts_order():
    """A COMMIT of two SENDs while NATS is unreachable: the first one's local fan-out stops over an
    outbox's limit, so the rest of the event (the second publish, both receipts) waits its turn;
    each SEND still holds its own token and the receipts follow the bridge's answers, in order."""
    r = rig()
    for conn in range(2, 22):
        r.connect(conn)
        r.subscribe(conn, "/topic/t")
    r.connect(1)
    feed(r, status(False), remote("/topic/t"))
    to_bridge(r)
    for box in r.outboxes:
        box.take()
        box.limit = 700
    r.frame(1, "BEGIN", transaction="tx")
    r.send(1, "/topic/t", b"one", transaction="tx", receipt="s1")
    r.send(1, "/topic/t", b"two", transaction="tx", receipt="s2")
    r.frame(1, "COMMIT", transaction="tx", receipt="c")
    stops = finish(r)
    assert stops > 0
    assert [b for c in range(2, 22) for b in r.bodies(c)] == [b"one", b"two"] * 20
    sent = published(to_bridge(r))
    assert [body for _, _, body, _, _ in sent] == [b"one", b"two"]
    tokens = [token for _, _, _, token, _ in sent]
    assert all(tokens) and len(set(tokens)) == 2
    # the SENDs' receipts came when the transaction took them; the COMMIT's waits for NATS
    assert [f["receipt-id"] for f in r.frames(1)] == ["s1", "s2"]
    feed(r, C.record(C.PUBLISHED, tokens[0]))
    assert r.frames(1) == []
    feed(r, C.record(C.PUBLISHED, tokens[1]))
    assert [f["receipt-id"] for f in r.frames(1)] == ["c"]


def test_a_disconnect_receipt_never_overtakes_a_message_waiting_for_nats():
    r = rig()
    r.connect(1)
    feed(r, status(False), remote("/topic/a"))
    r.send(1, "/topic/a", b"1")
    r.frame(1, "DISCONNECT", receipt="bye")
    assert r.take(1) == []
    ((_, _, _, token, _),) = published(to_bridge(r))
    feed(r, C.record(C.PUBLISHED, token))
    assert [(o.command or o.kind) for o in r.take(1)] == ["RECEIPT", "CLOSE"]


def test_a_failed_message_after_an_error_lets_the_error_and_close_out():
    r = rig(cluster_timeout_ms=1000)
    r.connect(1)
    feed(r, status(False), remote("/topic/a"))
    r.send(1, "/topic/a", b"1")
    r.frame(1, "NONSENSE")                       # an ERROR and a close, held behind the message
    assert r.take(1) == []
    ((_, _, _, token, _),) = published(to_bridge(r))
    feed(r, C.record(C.FAILED, token))
    got = r.take(1)
    assert [(o.command or o.kind) for o in got] == ["ERROR", "CLOSE"]
    assert got[0]["message"] == "unknown command"


def test_message_ids_of_nodes_started_at_the_same_moment_differ():
    """Message ids cross nodes with their messages: two nodes whose brokers started in the same
    millisecond must not number their messages alike (a consumer acking or de-duplicating by id
    would confuse them)."""
    a, b = rig(), Rig(cluster="nats://127.0.0.1:4222", node_id="n2", cluster_name="c")
    assert a.wall == b.wall
    assert a.broker.token != b.broker.token


def test_durable_patterns_are_announced_and_plain_topic_messages_matching_any_are_kept():
    r = rig()
    bp = r.broker.backplane
    r.connect(1)
    r.subscribe(1, "/topic/d", "d1", durable="true")
    assert to_bridge(r) == [("INTEREST", 0, 1, b"\x00/topic/d")]   # announced, marked durable
    feed(r, remote("\x00/topic/r*"))                                 # another node's durable
    assert bp.durable_wants(r.broker, "/topic/rx") and bp.durable_wants(r.broker, "/topic/d")
    assert not bp.durable_wants(r.broker, "/topic/other") and not bp.remote_by  # (no live interest)
    bp.queues.out.clear()
    r.send(1, "/topic/rx", b"kept")
    r.send(1, "/topic/other", b"not kept")
    r.send(1, "/topic/d", b"kept too")
    kept = [(c[2], c[4]) for c in bp.queues.out if c[0] == "publish"]
    assert [subject for subject, _ in kept] == [shards.topic_subject("c", 6, d) for d in ("/topic/rx", "/topic/d")]
    r.frame(1, "UNSUBSCRIBE", id="d1")
    assert ("INTEREST", 0, 0, b"\x00/topic/d") in to_bridge(r)
    feed(r, remote("\x00/topic/r*", 0))
    assert not bp.durable_wants(r.broker, "/topic/rx")


def test_the_queue_hot_path_records_round_trip():
    payload = C.pack_queue_publish("c.q.queue.a", "/queue/a id-1", b"\x00body", [7])
    assert C.unpack_queue_publish(payload) == (b"c.q.queue.a", "/queue/a id-1", (7,), b"\x00body")
    packed = C.pack_queue_publish("c.q6_1p16.queue.é", "run-p1", b"SBp1...", [1, 2 ** 40, 3])
    assert C.unpack_queue_publish(packed) == ("c.q6_1p16.queue.é".encode(), "run-p1", (1, 2 ** 40, 3), b"SBp1...")
    settles = C.pack_settle(7, C.ACK) + C.pack_settle(2 ** 40, C.NAK, 250) + C.pack_settle(9, C.TERM)
    assert list(C.iter_settles(settles)) == [(7, C.ACK, 0), (2 ** 40, C.NAK, 250), (9, C.TERM, 0)]
    assert C.unpack_tokens(C.pack_tokens([1, 5, 2 ** 50])) == (1, 5, 2 ** 50)
    assert C.unpack_pulled(C.pack_pulled("/queue/é".encode(), b"data")) == ("/queue/é", b"data")


def test_a_rounds_settles_travel_as_one_record_in_order_with_the_other_commands():
    """The queues' commands of one dispatcher round: publishes binary, consecutive acks/naks/terms
    as one record, anything else (credit, bind) JSON, all in the order they were decided."""
    from stompbroker.cluster import packs
    from stompbroker.cluster.queuing import unpack

    r = rig()
    bp = r.broker.backplane
    cq = bp.queues
    one, two = packs.member("m1", {}, b"1"), packs.member("m2", {}, b"2")
    cq.out += [("ack", 1), ("nak", 2, 0.25), ("publish", 10, "c.q6_0p16.queue.b", "", one, 10000, "/queue/b"),
               ("credit", "/queue/a", 5), ("term", 3), ("publish", 9, "c.q.queue.a", "id", b"m", 10000, ""),
               ("publish", 11, "c.q6_0p16.queue.b", "", two, 10000, "/queue/b")]
    bp.round_out(r.broker)
    records = [(kind, conn, aux, bytes(payload)) for kind, conn, aux, _, payload in C.iter_records(bp.out.buf)]
    assert [r[0] for r in records] == [C.QUEUE_SETTLE, C.QUEUE_CMD, C.QUEUE_SETTLE, C.QUEUE_PUBLISH, C.QUEUE_PUBLISH]
    assert list(C.iter_settles(records[0][3])) == [(1, C.ACK, 0), (2, C.NAK, 250)]
    assert unpack(records[1][3]) == ("credit", "/queue/a", 5)
    assert list(C.iter_settles(records[2][3])) == [(3, C.TERM, 0)]
    assert records[3][1:3] == (1, 10000) and C.unpack_queue_publish(records[3][3]) == (b"c.q.queue.a", "id", (9,), b"m")
    subject, msg_id, tokens, data = C.unpack_queue_publish(records[4][3])   # the round's members: one pack, last
    assert (records[4][1], subject, tokens, data) == (2, b"c.q6_0p16.queue.b", (10, 11), packs.pack("/queue/b", [one, two]))
    assert msg_id.startswith(cq.run)
    assert cq.out == []


def test_the_fast_paths_fallback_takes_apart_several_commands_in_one_blob():
    """Without nats-py's internals the raw commands go out through Client.publish: each one of a
    blob (a round's acks are written as one), headers and reply included."""
    import asyncio

    from stompbroker.cluster.fastpath import FastPath, header_block, hpub, pub

    class Client:  # what FastPath uses of a nats-py client when its internals are not there
        is_connected = True

        def __init__(self):
            self.sent = []

        async def publish(self, subject, data, reply="", headers=None):
            self.sent.append((subject, data, reply, headers))

    async def main():
        nc = Client()
        fast = FastPath(nc)
        assert not fast.raw_in and not fast.raw_out
        blob = (pub(b"$JS.ACK.s.c.1.2.3", b"", b"") + pub(b"$JS.ACK.s.c.1.3.4", b"", b"-NAK")
                + hpub(b"c.q.a", b"_INBOX.x.1", header_block("Nats-Msg-Id", "id 1"), b"bo\r\ndy")
                + pub(b"s.next", b"_INBOX.y.2", b'{"batch":5}'))
        assert fast.send(blob)
        await asyncio.sleep(0.01)
        return nc.sent

    assert asyncio.run(main()) == [("$JS.ACK.s.c.1.2.3", b"", "", None), ("$JS.ACK.s.c.1.3.4", b"-NAK", "", None),
                                   ("c.q.a", b"bo\r\ndy", "_INBOX.x.1", {"Nats-Msg-Id": "id 1"}),
                                   ("s.next", b'{"batch":5}', "_INBOX.y.2", None)]


def publish_records(records) -> list[tuple[str, int]]:
    """(subject, how many messages) of each PUBLISH record: one NATS message each."""
    out = []
    for name, conn, aux, payload in records:
        if name == "PUBLISH":
            subject, message = C.unpack_publish(payload)
            out.append((subject, C.topic_count(message)))
    return out


def sending(**settings) -> Rig:
    """A node with a client on conn 1, NATS reachable, and /topic/* wanted elsewhere."""
    r = rig(**settings)
    r.connect(1)
    feed(r, status(True), remote("/topic/*"))
    to_bridge(r)
    return r


def test_a_rounds_topic_messages_in_a_row_to_one_subject_go_to_nats_as_one_pack_in_order():
    r = sending()
    for i in range(5):
        r.send(1, "/topic/a", b"a%d" % i)
    r.send(1, "/topic/b", b"b0")
    r.send(1, "/topic/a", b"a5")
    records = to_bridge(r)   # (the round ends)
    assert publish_records(records) == [("c.t.topic.a", 5), ("c.t.topic.b", 1), ("c.t.topic.a", 1)]
    assert [body for _, _, body, _, _ in published(records)] == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0", b"a5"]
    r.send(1, "/topic/a", b"quiet")   # alone in its round: goes at the round's end, waiting for no company
    assert publish_records(to_bridge(r)) == [("c.t.topic.a", 1)]


def test_a_topic_pack_is_bounded_by_count_and_bytes():
    r = sending(cluster_topic_pack_max=3)
    for i in range(7):
        r.send(1, "/topic/a", b"m%d" % i)
    assert [n for _, n in publish_records(to_bridge(r))] == [3, 3, 1]
    r = sending()
    for i in range(4):
        r.send(1, "/topic/a", bytes([65 + i]) * 30_000)
    assert [n for _, n in publish_records(to_bridge(r))] == [2, 2]
    r = sending(cluster_topic_pack_max=1)
    for i in range(3):
        r.send(1, "/topic/a", b"m%d" % i)
    records = to_bridge(r)
    assert [n for _, n in publish_records(records)] == [1, 1, 1]
    assert not any(C.unpack_publish(p)[1].startswith(C.TOPIC_PACK) for name, _, _, p in records if name == "PUBLISH")


def test_worker_messages_and_held_messages_are_never_packed_and_keep_their_place():
    r = rig()
    r.connect(1)
    feed(r, status(True), remote("/topic/*"), remote("#jobs"))
    to_bridge(r)
    r.send(1, "/topic/a", b"t1")
    r.send(1, "/topic/a", b"t2")
    r.send(1, "#jobs", b"w1")
    r.send(1, "#jobs", b"w2")
    r.send(1, "/topic/a", b"t3")
    records = to_bridge(r)
    assert [(body, aux) for _, _, body, _, aux in published(records)] == [
        (b"t1", 0), (b"t2", 0), (b"w1", C.PUBLISH_WORKER), (b"w2", C.PUBLISH_WORKER), (b"t3", 0)]
    assert [n for _, n in publish_records(records)] == [2, 1, 1, 1]
    r.send(1, "/topic/a", b"before")
    feed(r, status(False))             # NATS gone mid-round: what was gathered goes first, then the held one
    r.send(1, "/topic/a", b"held", receipt="r")
    sent = published(to_bridge(r))
    assert [(body, bool(token)) for _, _, body, token, _ in sent] == [(b"before", False), (b"held", True)]


def test_a_pack_from_another_node_is_delivered_in_order_and_resumes_after_an_outboxs_limit():
    r = rig()
    for conn in range(1, 11):
        r.connect(conn)
        r.subscribe(conn, "/topic/p")
    feed(r, status(True))
    to_bridge(r)
    members = [C.topic_member("n2-%d" % i, {"n": str(i % 3)}, b"m%d" % i) for i in range(20)]
    feed(r, C.record(C.MESSAGE, 0, C.pack_topic("/topic/p", members)))
    assert all(r.bodies(c) == [b"m%d" % i for i in range(20)] for c in range(1, 11))
    for box in r.outboxes:
        box.take()
        box.limit = 700
    r.connect(11)
    r.subscribe(11, "/topic/p")
    r.take(11)
    feed(r, C.record(C.MESSAGE, 0, C.pack_topic("/topic/p", members)))
    stops = finish(r)
    assert stops > 1
    assert all(r.bodies(c) == [b"m%d" % i for i in range(20)] for c in range(1, 12))
    assert r.broker.backplane.stats["received"] == 40


def test_a_packs_message_that_expires_while_waiting_its_turn_is_not_delivered():
    r = rig()
    r.connect(1)
    r.subscribe(1, "/topic/p")
    feed(r, status(True))
    to_bridge(r)
    r.outboxes[0].limit = 1     # every delivery stops the pack
    members = [C.topic_member("n2-%d" % i, {}, b"m%d" % i, 1000 if i >= 5 else 0) for i in range(10)]
    feed(r, C.record(C.MESSAGE, 0, C.pack_topic("/topic/p", members)))
    assert r.broker.unfinished   # stopped over the outbox's limit, the rest waits
    delivered = len(r.bodies(1))
    assert delivered < 5
    r.broker.now += 2.0          # the ones with 1 s to live are past it when their turn comes
    finish(r)
    assert r.bodies(1) == [b"m%d" % i for i in range(delivered, 5)]
    assert r.broker.stats["messages_expired"] == 5
    assert r.broker.backplane.stats["received"] == 10 and r.broker.backplane.stats["unrouted_remote"] == 5


def test_a_topic_pack_travels_whole_and_one_cut_short_or_with_more_is_refused():
    members = [C.topic_member("n-1", {"a": "1"}, b"body", 5000), C.topic_member("n-2", {}, b"", 0)]
    pack = C.pack_topic("/topic/x", members)
    assert C.unpack_topic(pack) == ("/topic/x", [("n-1", b'{"a":"1"}', b"body", 5000), ("n-2", b"{}", b"", 0)])
    assert C.topic_count(pack) == 2 and C.topic_count(C.pack_message("n-3", "/topic/x", {}, b"")) == 1
    for bad in [pack[:cut] for cut in range(4, len(pack))] + [pack + b"x"]:
        try:
            C.unpack_topic(bad)
        except ValueError:
            continue
        raise AssertionError(f"a pack of {len(bad)} bytes was read")


def test_headers_of_a_pack_are_decoded_when_they_change_and_each_message_gets_its_own(monkeypatch):
    r = rig()
    r.connect(1)
    r.subscribe(1, "/topic/h")
    feed(r, status(True))
    real, decoded = orjson.loads, []
    monkeypatch.setattr(orjson, "loads", lambda raw: decoded.append(bytes(raw)) or real(raw))
    colours = ["red", "red", "blue", "red"]
    members = [C.topic_member("n2-%d" % i, {"colour": c}, b"x") for i, c in enumerate(colours)]
    feed(r, C.record(C.MESSAGE, 0, C.pack_topic("/topic/h", members)))
    got = r.messages(1)
    assert [m["colour"] for m in got] == colours and [m["message-id"] for m in got] == ["n2-0", "n2-1", "n2-2", "n2-3"]
    assert decoded == [b'{"colour":"red"}', b'{"colour":"blue"}', b'{"colour":"red"}']
    bad = C.pack_topic("/topic/h", [C.topic_member("n2-9", {}, b"x")]).replace(b"{}", b"[]")
    feed(r, C.record(C.MESSAGE, 0, bad))   # (logged, not delivered)
    assert r.messages(1) == []


def test_a_producers_headers_are_encoded_once_for_its_packs_and_each_message_travels_with_its_own():
    r = sending()
    for i in range(3):
        r.send(1, "/topic/a", b"m%d" % i, colour="red")
    r.send(1, "/topic/a", b"m3", colour="blue", receipt="r1")   # (a receipt never travels)
    r.send(1, "/topic/a", b"m4", note="n" * 2000)
    (_, _, _, payload), = [rec for rec in to_bridge(r) if rec[0] == "PUBLISH"]
    _, members = C.unpack_topic(C.unpack_publish(payload)[1])
    assert [orjson.loads(head) for _, head, _, _ in members] == [{"colour": "red"}] * 3 + [
        {"colour": "blue"}, {"note": "n" * 2000}]
    kept = r.broker.backplane.sent_json
    assert sorted(kept.values()) == [b'{"colour":"blue"}', b'{"colour":"red"}']   # (a long one is not kept)
    for i in range(600):   # distinct ones: the table is bounded
        r.send(1, "/topic/a", b"x", n=str(i))
    to_bridge(r)
    assert 0 < len(kept) <= 512


def test_a_plain_send_only_other_nodes_hear_is_packed_without_a_message(monkeypatch):
    """The sending node's cross-node SEND: with no subscription of its own to deliver to, it goes
    into the round's pack as ``publish`` would put it (id, headers, order, counts) but no message is
    made for it. One that a local subscription, a durable subscription anywhere or a receipt
    concerns takes the whole route, and keeps its place in the pack."""
    from stompbroker.broker import routing
    made = []
    monkeypatch.setattr(routing, "Message", lambda *args: made.append(args[1]) or Message(*args))
    r = sending()
    bp = r.broker.backplane
    for i in range(4):
        r.send(1, "/topic/a", b"m%d" % i, colour="red")
    assert made == []
    r.send(1, "/topic/a", b"m4", colour="red", receipt="r1")   # a receipt: the whole route
    r.subscribe(1, "/topic/a", "local")
    r.send(1, "/topic/a", b"m5", colour="red")                   # delivered here too
    r.frame(1, "UNSUBSCRIBE", id="local")
    feed(r, remote("\x00/topic/a"))                              # a durable elsewhere: JetStream keeps it
    bp.queues.out.clear()
    r.send(1, "/topic/a", b"m6", colour="red")
    assert made == ["/topic/a"] * 3
    assert [c[2] for c in bp.queues.out if c[0] == "publish"] == [shards.topic_subject("c", 6, "/topic/a")]
    (_, _, _, payload), = [rec for rec in to_bridge(r) if rec[0] == "PUBLISH"]
    _, members = C.unpack_topic(C.unpack_publish(payload)[1])
    assert [body for _, _, body, _ in members] == [b"m%d" % i for i in range(7)]
    assert [mid.rsplit("-", 1)[1] for mid, _, _, _ in members] == [str(i) for i in range(1, 8)]
    assert {head for _, head, _, _ in members} == {b'{"colour":"red"}'}
    assert r.broker.stats["messages_published"] == 7 and bp.stats["published"] == 7
    assert [(o.command, o.body) for o in r.frames(1)] == [("RECEIPT", b""), ("MESSAGE", b"m5")]


def test_a_topic_send_heard_on_its_own_node_asks_the_cluster_only_what_could_concern_it(monkeypatch):
    """Local traffic costs little more than on a single node: with no other node's interest and no
    durable subscription anywhere, a plain topic SEND asks neither the remote index nor JetStream."""
    r = rig()
    bp = r.broker.backplane
    r.connect(1)
    r.subscribe(1, "/topic/a", "local")
    feed(r, status(True))
    asked = []
    for name in ("publish", "durable_wants"):
        real = getattr(bp, name)
        monkeypatch.setattr(bp, name, lambda *args, real=real, name=name: asked.append(name) or real(*args))
    r.send(1, "/topic/a", b"m1")
    r.send(1, "/topic/a", b"m2")
    assert asked == [] and r.bodies(1) == [b"m1", b"m2"]
    feed(r, remote("/topic/b"))                     # another node's interest, elsewhere
    r.send(1, "/topic/a", b"m3")
    assert asked == ["publish"] and published(to_bridge(r)) == []
    feed(r, remote("\x00/topic/a"))                 # a durable elsewhere: JetStream keeps it
    bp.queues.out.clear()
    r.send(1, "/topic/a", b"m4")
    assert [c[2] for c in bp.queues.out if c[0] == "publish"] == [shards.topic_subject("c", 6, "/topic/a")]
    assert r.bodies(1) == [b"m3", b"m4"]


def test_a_pack_from_another_node_looks_up_its_topics_subscriptions_once(monkeypatch):
    r = rig()
    r.connect(1)
    r.subscribe(1, "/topic/p", "a")
    r.subscribe(1, "/topic/*", "b", selector="n = '1'")
    feed(r, status(True))
    index = r.broker.index
    looked = []
    real = index.match
    monkeypatch.setattr(index, "match", lambda destination: looked.append(destination) or real(destination))
    members = [C.topic_member("n2-%d" % i, {"n": str(i % 2)}, b"m%d" % i, 5000 * (i == 3)) for i in range(6)]
    feed(r, C.record(C.MESSAGE, 0, C.pack_topic("/topic/p", members)))
    assert looked == ["/topic/p"]
    got = r.messages(1)
    assert [(m["subscription"], m.body) for m in got] == [
        ("a", b"m0"), ("a", b"m1"), ("b", b"m1"), ("a", b"m2"), ("a", b"m3"), ("b", b"m3"), ("a", b"m4"),
        ("a", b"m5"), ("b", b"m5")]
    assert [m["message-id"] for m in got if m["subscription"] == "a"] == ["n2-%d" % i for i in range(6)]
    assert [m["n"] for m in got if m["subscription"] == "a"] == ["0", "1"] * 3
    assert r.broker.backplane.stats["received"] == 6 and r.broker.backplane.stats["unrouted_remote"] == 0
    feed(r, C.record(C.MESSAGE, 0, C.pack_topic("/news/nobody", members)))
    assert r.broker.backplane.stats["received"] == 12 and r.broker.backplane.stats["unrouted_remote"] == 6
    assert r.messages(1) == []


def test_a_topic_pack_takes_any_destination_the_settings_allow():
    long = "/topic/" + "d" * 70_000
    pack = C.pack_topic(long, [C.topic_member("n-1", {}, b"x")])
    assert C.unpack_topic(pack) == (long, [("n-1", b"{}", b"x", 0)])


def busy(pattern: str, count: int = 1) -> bytes:
    return C.record(C.REMOTE_BUSY, 0, pattern.encode(), count)


def fed(r: Rig) -> None:
    """Another node's topic message reaches this one (at r.now)."""
    feed(r, C.record(C.MESSAGE, 0, C.pack_message("n2-1", "/topic/nobody", {}, b"x")))


def test_a_node_says_it_is_busy_past_cluster_busy_bytes_and_caught_up_under_a_quarter_of_it():
    r = rig(cluster_busy_bytes=1000)
    fed(r)
    behind = r.broker.backplane.behind
    said = []
    for deepest in (0, 1000, 1001, 50_000, 250, 249, 900, 1001):
        behind(deepest, r.now)
        said.append([aux for name, _, aux, _ in to_bridge(r) if name == "BUSY"])
    assert said == [[], [], [1], [], [], [0], [], [1]]
    r = rig(cluster_busy_bytes=0)
    fed(r)
    r.broker.backplane.behind(1 << 30, r.now)
    assert to_bridge(r) == []


def test_a_node_that_no_other_node_feeds_never_says_it_is_busy():
    """Its depth is its own producers' doing: no other node could slow down for it (and a one-node
    cluster would publish words nobody reads)."""
    r = rig(cluster_busy_bytes=1000)
    behind = r.broker.backplane.behind
    behind(50_000, r.now)
    assert to_bridge(r) == []
    fed(r)
    behind(50_000, r.now + 1.5)   # (the last message from another node came 1.5 s ago)
    assert to_bridge(r) == []
    behind(50_000, r.now + 0.5)
    assert [aux for name, _, aux, _ in to_bridge(r) if name == "BUSY"] == [1]


def test_a_session_publishing_to_a_busy_node_has_its_replies_held_until_that_node_catches_up():
    r = rig()
    r.connect(1)
    r.connect(2)
    feed(r, status(True), remote("/topic/a"), remote("/topic/c"), busy("/topic/*"))
    to_bridge(r)
    r.send(1, "/topic/a", b"1", receipt="r1")
    assert [(d, body) for _, d, body, _, _ in published(to_bridge(r))] == [("/topic/a", b"1")]  # sent at once
    r.send(1, "/topic/local", b"2", receipt="r2")
    r.send(1, "/topic/a", b"3", receipt="r3")
    assert r.frames(1) == []                    # r1 held, and what follows it in order
    r.send(2, "/topic/local", b"x", receipt="q1")
    assert [f["receipt-id"] for f in r.frames(2)] == ["q1"]  # another session, nothing sent to the busy node
    assert r.broker.backplane.stats["throttled"] == 1
    feed(r, busy("/topic/*", 0))
    assert [f["receipt-id"] for f in r.frames(1)] == ["r1", "r2", "r3"]
    r.send(1, "/topic/a", b"4", receipt="r4")
    assert [f["receipt-id"] for f in r.frames(1)] == ["r4"]
    feed(r, busy("/topic/a"))                   # a node subscribing /topic/a only is busy
    r.send(1, "/topic/c", b"5", receipt="r5")
    assert [f["receipt-id"] for f in r.frames(1)] == ["r5"]
    r.send(1, "/topic/a", b"6", receipt="r6")
    assert r.frames(1) == []


def test_held_replies_go_after_cluster_busy_hold_ms_when_nats_goes_or_the_bridge_starts_again():
    r = rig(cluster_busy_hold_ms=500)
    r.connect(1)
    feed(r, status(True), remote("/topic/a"), busy("/topic/a"))
    r.send(1, "/topic/a", b"1", receipt="r1")
    assert r.broker.needs_tick()
    r.tick(0.3)
    assert r.frames(1) == []
    r.tick(0.3)
    assert [f["receipt-id"] for f in r.frames(1)] == ["r1"]  # the node is still busy: at most 0.5 s
    assert not r.broker.backplane.throttled
    r.send(1, "/topic/a", b"2", receipt="r2")
    assert r.frames(1) == []
    feed(r, status(False))                      # what the bridge said of the others no longer holds
    assert [f["receipt-id"] for f in r.frames(1)] == ["r2"]
    feed(r, status(True), busy("/topic/a"))
    r.send(1, "/topic/a", b"3", receipt="r3")
    assert r.frames(1) == []
    feed(r, C.record(C.REMOTE_RESET))
    assert [f["receipt-id"] for f in r.frames(1)] == ["r3"]
    r = rig(cluster_busy_hold_ms=0)
    r.connect(1)
    feed(r, status(True), remote("/topic/a"), busy("/topic/a"))
    r.send(1, "/topic/a", b"1", receipt="r1")
    assert [f["receipt-id"] for f in r.frames(1)] == ["r1"]


def test_a_held_session_that_ends_is_forgotten():
    r = rig()
    r.connect(1)
    feed(r, status(True), remote("/topic/a"), busy("/topic/a"))
    r.send(1, "/topic/a", b"1", receipt="r1")
    assert r.broker.backplane.throttled
    r.frame(1, "DISCONNECT", receipt="bye")
    r.broker.on_closed(1)
    assert not r.broker.backplane.throttled and not r.broker.backplane.waiting
    feed(r, busy("/topic/a", 0))                # (nothing left to release)
