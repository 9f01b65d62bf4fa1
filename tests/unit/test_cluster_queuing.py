"""The queue side of the cluster backplane (cluster/queuing.py), driven through the real Broker:
receipts held until stored, credits from prefetch, ack/nack/auto-ack to JetStream, redelivered
flag, dead letters, de-duplication, packs. JetStream is a small in-memory stand-in with its
semantics (work queue, shared consumer, delivery count, Nats-Msg-Id de-duplication), behind the
bridge's own packing and settling (cluster/packs.py: Packer, Ledger)."""

from __future__ import annotations

from collections import deque

import orjson

from stompbroker.broker import queues as Q
from stompbroker.cluster.backplane import Backplane
from stompbroker.cluster import packs, shards
from stompbroker.cluster.queuing import pack, unpack

from broker_harness import Rig


class FakeJetStream:
    """One JetStream shared by the rigs (nodes) joined to it."""

    def __init__(self):
        self.nodes = []
        self.stream: dict[str, deque] = {}   # subject -> [payload, delivered]
        self.ids = set()
        self.out: dict[int, tuple] = {}      # ref -> (node, subject, entry): delivered, not settled
        self.refs = 0
        self.fail = False
        self.silent = False
        self.log = []
        self.commands = []

    def join(self, **settings) -> Rig:
        rig = Rig(cluster="nats://127.0.0.1:4222", node_id=f"n{len(self.nodes)}", **settings)
        rig.broker.backplane = Backplane(rig.config)
        rig.want = {}      # key -> credit
        rig.binds = {}     # key -> subject
        self.nodes.append(rig)
        return rig

    def run(self) -> None:
        """Rounds until quiet: every node refills, the bridge runs its commands, answers go back."""
        for _ in range(100):
            busy = False
            for rig in self.nodes:
                cq = rig.broker.backplane.queues
                cq.refill(rig.broker, Q)
                for command in cq.commands():   # (a round's, packed)
                    busy = True
                    self.command(rig, unpack(pack(command)))
            busy |= self.deliver()
            if not busy:
                return
        raise AssertionError("never quiet")

    def command(self, rig, command) -> None:
        self.log.append(command[0])
        self.commands.append(command)
        kind = command[0]
        if kind == "publish":
            _, tokens, subject, msg_id, payload, _ = command
            self.store(rig, subject, msg_id, payload, tokens)
        elif kind == "bind":
            b = rig.broker
            _, key, stream_kind, _, pattern, _, _ = command
            layout = (b.config.cluster_streams, b.backplane.queues.pack)
            rig.binds[key] = [f for _, filters in shards.reads(b.config.cluster_name, stream_kind, pattern,
                                                                [layout]) for f in filters]
            rig.want.setdefault(command[1], 0)
        elif kind == "credit":
            rig.want[command[1]] = rig.want.get(command[1], 0) + command[2]
        elif kind == "unbind":
            rig.binds.pop(command[1], None)
            rig.want.pop(command[1], None)
        elif kind in ("ack", "term"):
            self.out.pop(command[1])
        elif kind == "nak":
            _, subject, entry = self.out.pop(command[1])
            self.stream[subject].appendleft(entry)

    def store(self, rig, subject: str, msg_id: str, payload: bytes, tokens) -> None:
        b = rig.broker
        answer = lambda *event: b.backplane.queues.event(b, unpack(pack(event)), Q)  # noqa: E731
        if self.silent:
            return
        for token in tokens:
            if self.fail:
                answer("failed", token, "test says no")
        if self.fail:
            return
        if msg_id not in self.ids:
            self.ids.add(msg_id)
            self.stream.setdefault(subject, deque()).append([payload, 0])
        for token in tokens:
            answer("stored", token)

    def deliver(self) -> bool:
        moved = False
        for rig in self.nodes:
            for key, filters in list(rig.binds.items()):
                for subject, waiting in self.stream.items():
                    if any(subject == f or (f.endswith(".>") and subject.startswith(f[:-1])) for f in filters):
                        moved |= self.take(rig, key, subject, waiting)
        return moved

    def take(self, rig, key, subject, waiting) -> bool:
        moved = False
        while waiting and rig.want.get(key, 0) > 0:
            entry = waiting.popleft()
            entry[1] += 1
            self.refs += 1
            self.out[self.refs] = (rig, subject, entry)
            rig.want[key] -= packs.count(entry[0])
            b = rig.broker
            b.backplane.queues.event(b, ("message", key, self.refs, entry[1], entry[0]), Q)
            moved = True
        return moved

    def depth(self) -> int:
        """Messages stored (a pack's members each)."""
        entries = [e for d in self.stream.values() for e in d] + [e for _, _, e in self.out.values()]
        return sum(packs.count(e[0]) for e in entries)


def test_receipt_waits_until_stored_and_later_replies_keep_their_order():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.send(1, "/queue/q", b"one", receipt="r1", persistent="true")
    a.frame(1, "DISCONNECT", receipt="bye")
    assert a.frames(1) == []          # nothing before JetStream stored the message
    js.run()
    assert [(o.command, o.headers.get("receipt-id")) for o in a.frames(1)] == [("RECEIPT", "r1"), ("RECEIPT", "bye")]
    assert js.depth() == 1


def test_a_store_failure_is_an_error_with_the_receipt_id():
    js = FakeJetStream()
    js.fail = True
    a = js.join()
    a.connect(1)
    a.send(1, "/queue/q", receipt="r9")
    js.run()
    error = a.error(1)
    assert error["message"] == "cluster unavailable" and error["receipt-id"] == "r9"


def test_no_answer_from_the_bridge_is_an_error_after_cluster_timeout_ms():
    js = FakeJetStream()
    js.silent = True
    a = js.join(cluster_timeout_ms=2000)
    a.connect(1)
    a.send(1, "/queue/q", receipt="r1")
    js.run()
    a.tick(1.0)
    assert a.frames(1) == []
    a.tick(3.0)
    error = a.error(1)
    assert error["message"] == "cluster unavailable" and error["receipt-id"] == "r1"


def test_competing_nodes_take_each_message_once_and_only_what_prefetch_allows():
    js = FakeJetStream()
    a, b = js.join(cluster_pack_max=1), js.join(cluster_pack_max=1)   # (a pack goes to one node whole)
    a.connect(1)
    b.connect(2)
    a.subscribe(1, "/queue/work", ack="client-individual", prefetch_count="3")
    b.subscribe(2, "/queue/work", ack="client-individual", prefetch_count="2")
    for i in range(10):
        a.send(1, "/queue/work", b"m%d" % i)
    js.run()
    first_a, first_b = a.messages(1), b.messages(2)
    assert (len(first_a), len(first_b)) == (3, 2)   # no more than each prefetch
    seen = [m.body for m in first_a + first_b]
    for _ in range(20):
        for rig, conn, got in ((a, 1, first_a), (b, 2, first_b)):
            for m in got:
                rig.frame(conn, "ACK", id=m["ack"])
        js.run()
        first_a, first_b = a.messages(1), b.messages(2)
        seen += [m.body for m in first_a + first_b]
        if not first_a and not first_b:
            break
    assert sorted(seen) == sorted(b"m%d" % i for i in range(10))   # each once
    assert js.depth() == 0


def test_nack_goes_back_to_jetstream_and_returns_redelivered_then_dead_letters():
    js = FakeJetStream()
    a, b = js.join(max_redeliveries=2), js.join(max_redeliveries=2)
    a.connect(1)
    b.connect(2)
    a.subscribe(1, "/queue/n", ack="client", prefetch_count="1")
    a.send(1, "/queue/n", b"bad", **{"dedup-id": "x1"})
    js.run()
    (m,) = a.messages(1)
    assert "redelivered" not in m.headers
    a.frame(1, "NACK", id=m["ack"])
    a.frame(1, "UNSUBSCRIBE", id="s")
    b.subscribe(2, "/queue/n", ack="client", prefetch_count="1")
    b.subscribe(2, "/queue/DLQ", sub_id="dlq")
    js.run()
    a.tick(0.2)  # (node a lets go of the queue it no longer reads)
    js.run()
    (m2,) = b.messages(2)
    assert m2.body == b"bad" and m2["redelivered"] == "true" and m2["message-id"] == m["message-id"]
    b.frame(2, "NACK", id=m2["ack"])
    js.run()
    (m3,) = b.messages(2)
    b.frame(2, "NACK", id=m3["ack"])   # a third delivery rejected: past max_redeliveries=2
    js.run()
    (dead,) = b.messages(2)
    assert dead["destination"] == "/queue/DLQ" and dead["original-destination"] == "/queue/n"
    assert dead["dead-letter-reason"] == "rejected 3 times" and dead.body == b"bad"
    assert "term" in js.log
    b.broker.on_written(2, 1)
    js.run()
    assert js.depth() == 0


def test_auto_ack_is_acknowledged_only_when_the_writer_wrote_it():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/auto")
    a.send(1, "/queue/auto", b"hello")
    js.run()
    (m,) = a.messages(1)
    assert m.aux  # marked for the writer's count
    assert len(js.out) == 1 and "ack" not in js.log
    a.broker.on_written(1, 1)
    js.run()
    assert js.out == {} and "ack" in js.log


def test_unwritten_and_unacked_messages_of_a_closed_connection_go_back_to_jetstream():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/c", ack="client", prefetch_count="5")
    for i in range(3):
        a.send(1, "/queue/c", b"%d" % i)
    js.run()
    assert len(a.messages(1)) == 3
    a.broker.on_closed(1)
    a.tick(0.2)
    js.run()
    assert js.out == {} and js.depth() == 3 and "nak" in js.log


def test_a_producer_retry_with_the_same_dedup_id_is_stored_once():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.send(1, "/queue/d", b"once", receipt="1", **{"dedup-id": "order-7"})
    a.send(1, "/queue/d", b"once", receipt="2", **{"dedup-id": "order-7"})
    a.send(1, "/queue/other", b"once", receipt="3", **{"dedup-id": "order-7"})  # another queue: its own
    js.run()
    assert [o.headers["receipt-id"] for o in a.frames(1)] == ["1", "2", "3"]
    assert js.depth() == 2


def test_wildcard_queue_subscription_is_refused_in_cluster_mode():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/a*", receipt="s1")
    error = a.error(1)
    assert error["message"] == "wildcard queue subscription" and error["receipt-id"] == "s1"


def test_persistent_topic_message_is_stored_for_durables_and_still_delivered_live():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/topic/t")
    a.send(1, "/topic/t", b"live", persistent="true", receipt="r")
    assert [o.command for o in a.frames(1)] == ["MESSAGE"]   # live delivery does not wait
    js.run()
    assert [o.command for o in a.frames(1)] == ["RECEIPT"]
    assert list(js.stream) == [shards.topic_subject("stompbroker", 6, "/topic/t")]
    a.send(1, "/topic/t", b"not kept")
    js.run()
    assert js.depth() == 1


def test_durable_subscription_reads_its_consumer_and_filters_its_pattern_exactly():
    js = FakeJetStream()
    a = js.join()
    a.connect(1, login="u")
    a.subscribe(1, "/topic/a*", sub_id="d1", durable="true", ack="client-individual")
    js.run()
    key = next(iter(a.binds))
    assert key.startswith("durable:")
    assert a.binds[key] == [f"stompbroker.d6_{i}.t.topic.>" for i in range(6)]  # every shard of the layout
    for dest in ("/topic/ab", "/topic/b"):
        a.send(1, dest, dest.encode(), persistent="true")
    js.run()
    (m,) = a.messages(1)
    assert m.body == b"/topic/ab" and m["destination"] == "/topic/ab"
    assert len(js.out) == 1   # /topic/b, not for the pattern, was acknowledged and dropped


def test_pack_round_trip_and_message_encoding():
    item = ("publish", [3, 4], "s.q.x", "id\x1fz", b"\x00\xffbody", 5000)
    assert unpack(pack(item)) == item
    assert unpack(pack(("ack", 9))) == ("ack", 9)
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.send(1, "/queue/e", b"\x00bin", **{"x-h": "v\\c1\\nnext"})
    js.run()
    ((payload, _),) = js.stream[next(iter(js.stream))]
    (m,) = packs.unpack(payload)
    assert m.destination == "/queue/e" and m.headers["x-h"] == "v:1\nnext" and m.body == b"\x00bin"
    assert m.expires_ms == 0 and m.before == 0


def test_a_restarted_bridge_gets_every_bind_again_as_it_was_and_drops_what_it_pulled():
    from stompbroker.cluster import records as C

    js = FakeJetStream()
    a = js.join()
    a.connect(1, login="u")
    a.subscribe(1, "/queue/q", sub_id="q", ack="client", prefetch_count="1")
    a.subscribe(1, "/topic/t", sub_id="d", durable="true")
    bp = a.broker.backplane
    bp.on_records(a.broker, C.record(C.BRIDGE_START), a.now)   # the first bridge: it had them all
    assert [c[0] for c in bp.queues.out].count("bind") == 2
    js.run()
    first = dict(a.binds)
    for i in range(2):
        a.send(1, "/queue/q", b"%d" % i)
    js.run()
    assert len(a.messages(1)) == 1      # one delivered (prefetch 1), one pulled and waiting here
    a.binds.clear()
    bp.on_records(a.broker, C.record(C.BRIDGE_START), a.now)   # a new bridge: knows nothing
    js.run()
    assert a.binds == first             # the durable is bound to the kept-topics filter again
    assert a.broker.queues["/queue/q"].depth() == 0   # JetStream redelivers it after ack_wait


def test_an_expired_queue_message_is_acknowledged_not_delivered():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.send(1, "/queue/x", b"old", expiration="1000")
    js.run()
    a.tick(2.0)
    a.subscribe(1, "/queue/x")
    js.run()
    assert a.frames(1) == [] and js.depth() == 0 and "ack" in js.log


def test_an_error_and_close_held_behind_an_unstored_message_still_go_when_it_fails():
    js = FakeJetStream()
    js.silent = True
    a = js.join(cluster_timeout_ms=1000)
    a.connect(1)
    a.send(1, "/queue/q", receipt="r1")
    a.frame(1, "BOGUS")                     # an ERROR that must not overtake the receipt
    js.run()
    assert a.take(1) == []
    a.tick(3.0)
    kinds = [o.command or o.kind for o in a.take(1)]
    assert kinds == ["ERROR", "CLOSE"], kinds


def test_a_message_no_local_selector_takes_goes_back_to_jetstream_after_a_delay():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/s", selector="x = 1")
    a.send(1, "/queue/s", b"two", x="2")
    js.run()
    assert a.frames(1) == []
    a.tick(0.2)
    js.run()
    (nak,) = [c for c in js.commands if c[0] == "nak"]
    assert nak[2] > 0 and js.depth() == 1   # offered again later, not hot-looped back to this node


def test_a_transaction_publishes_at_commit_and_its_receipt_waits_for_the_store():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.frame(1, "BEGIN", transaction="t1")
    a.send(1, "/queue/tx", b"in tx", transaction="t1")
    js.run()
    assert js.depth() == 0
    a.frame(1, "COMMIT", transaction="t1", receipt="c1")
    assert a.frames(1) == []
    js.run()
    assert [o.headers["receipt-id"] for o in a.frames(1)] == ["c1"] and js.depth() == 1


def test_a_delivery_the_writer_had_not_sent_when_its_connection_closed_still_goes_back_to_jetstream():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/w")
    a.send(1, "/queue/w", b"unsent")
    js.run()
    assert len(a.messages(1)) == 1       # handed to the writer, not yet reported written
    a.broker.on_closed(1)
    js.run()
    a.tick(0.2)
    js.run()
    assert len(js.out) == 1              # still out: the writer may yet send it
    a.broker.on_written(1, 0, final=True)  # it did not: back to its queue here...
    a.tick(0.2)
    js.run()
    assert js.out == {} and js.depth() == 1   # ...and from there back to JetStream
    assert a.binds == {}


def test_a_message_pulled_for_a_durable_just_detached_goes_back_to_jetstream():
    js = FakeJetStream()
    a = js.join()
    a.connect(1, login="u")
    a.subscribe(1, "/topic/t", sub_id="d", durable="true")
    js.run()
    (key,) = a.binds
    a.broker.on_closed(1)          # detached: the durable (and its queue) stay on this node
    js.run()
    assert a.binds == {}
    b = a.broker                   # a message JetStream had sent before the unbind reached it
    b.backplane.queues.event(b, ("message", key, 99, 1, packs.single("m1", "/topic/t", {}, b"x")), Q)
    assert b.backplane.queues.out[-1][:2] == ("nak", 99) and not b.queues[key].depth()


# -- packs: several messages in one JetStream message (cluster/packs.py) ------------------------------
def packed_node(js, n, conn=1, **settings):
    """A node whose consumer (client-individual, room for 10) got ``n`` messages sent in one round:
    one pack of ``n`` in JetStream."""
    a = js.join(**settings)
    a.connect(conn)
    a.subscribe(conn, "/queue/p", ack="client-individual", prefetch_count="10")
    for i in range(n):
        a.send(conn, "/queue/p", b"m%d" % i)
    js.run()
    return a


def test_messages_sent_in_one_round_go_to_jetstream_as_one_pack_and_each_is_delivered():
    js = FakeJetStream()
    a = packed_node(js, 3)
    got = a.messages(1)
    assert [m.body for m in got] == [b"m0", b"m1", b"m2"] and len(js.out) == 1   # one JetStream message out
    ((_, _, (payload, _)),) = js.out.values()
    assert packs.count(payload) == 3
    for m in got[:2]:
        a.frame(1, "ACK", id=m["ack"])
    js.run()
    assert len(js.out) == 1                                  # not before its last member is acked
    a.frame(1, "ACK", id=got[2]["ack"])
    js.run()
    assert js.out == {} and js.depth() == 0                 # acked once every member was


def test_a_pulled_packs_same_headers_are_decoded_once_and_each_message_keeps_its_own(monkeypatch):
    """failed before: every member's headers were decoded (orjson.loads)."""
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/h", ack="client-individual", prefetch_count="10")
    js.run()
    head = {"destination": "/queue/h", "colour": "red"}
    real, decoded = orjson.loads, []
    monkeypatch.setattr(orjson, "loads", lambda raw: decoded.append(bytes(raw)) or real(raw))
    b = a.broker
    for ref in (1, 2):
        payload = packs.pack("/queue/h", [packs.member(f"n9-{ref}-{i}", head, b"m%d" % i) for i in range(3)])
        b.backplane.queues.event(b, ("message", "/queue/h", ref, 1, payload), Q)
    assert decoded.count(orjson.dumps(head)) == 2                # once per pack
    assert [m["colour"] for m in a.messages(1)] == ["red"] * 6
    messages = list(b.backplane.queues.pulled)
    messages[0].headers["colour"] = "blue"
    assert [m.headers["colour"] for m in messages[1:]] == ["red"] * 5


def test_a_nacked_member_is_put_back_alone_and_its_pack_acked_once_that_is_stored():
    """failed before: a NACK of one member nak'ed the whole pack (the others, acknowledged, came again)."""
    js = FakeJetStream()
    a = packed_node(js, 3)
    first = a.messages(1)
    a.frame(1, "ACK", id=first[0]["ack"])
    a.frame(1, "NACK", id=first[1]["ack"])
    a.frame(1, "ACK", id=first[2]["ack"])
    before = len(js.commands)
    js.run()
    publishes = [c for c in js.commands[before:] if c[0] == "publish"]
    assert len(publishes) == 1 and len(publishes[0][1]) == 1  # the member alone, with a fresh Nats-Msg-Id:
    assert publishes[0][3] not in {c[3] for c in js.commands[:before] if c[0] == "publish"}
    (again,) = a.messages(1)
    assert again.body == b"m1" and again["redelivered"] == "true" and again["message-id"] == first[1]["message-id"]
    assert not [c for c in js.commands[before:] if c[0] == "nak"]
    a.frame(1, "ACK", id=again["ack"])
    js.run()
    assert js.out == {} and js.depth() == 0 and a.messages(1) == []   # m0 and m2 never again


def test_deliveries_count_across_copies_for_max_redeliveries():
    js = FakeJetStream()
    a = packed_node(js, 2, max_redeliveries=1)
    a.subscribe(1, "/queue/DLQ", sub_id="dlq")
    m0, m1 = a.messages(1)
    a.frame(1, "ACK", id=m0["ack"])
    a.frame(1, "NACK", id=m1["ack"])                          # 1st delivery rejected: put back
    js.run()
    (again,) = a.messages(1)
    a.frame(1, "NACK", id=again["ack"])                       # 2nd: past max_redeliveries=1
    js.run()
    (dead,) = a.messages(1)
    assert dead["destination"] == "/queue/DLQ" and dead["dead-letter-reason"] == "rejected 2 times"
    assert dead.body == b"m1"


def test_a_pack_whose_members_all_come_back_goes_back_whole():
    js = FakeJetStream()
    a = packed_node(js, 3)
    assert len(a.messages(1)) == 3
    before = len(js.commands)
    a.broker.on_closed(1)                                    # three unacked deliveries come back
    a.tick(0.2)
    js.run()
    assert not [c for c in js.commands[before:] if c[0] == "publish"]   # nothing published again
    assert js.out == {} and js.depth() == 3
    assert len([e for d in js.stream.values() for e in d]) == 1   # one JetStream message, as it was
    b = js.join()
    b.connect(2)
    b.subscribe(2, "/queue/p", ack="client-individual", prefetch_count="10")
    js.run()
    assert [(m.body, m["redelivered"]) for m in b.messages(2)] == [(b"m0", "true"), (b"m1", "true"), (b"m2", "true")]


def test_a_member_no_selector_takes_is_put_back_after_its_delay_while_the_others_are_acked():
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/s", ack="client-individual", selector="x = 1", prefetch_count="10")
    a.send(1, "/queue/s", b"one", x="1")
    a.send(1, "/queue/s", b"two", x="2")
    js.run()
    (one,) = a.messages(1)
    a.frame(1, "ACK", id=one["ack"])
    a.tick(0.2)                                              # "two" is given back, with its delay
    js.run()
    assert len([c for c in js.commands if c[0] == "publish"]) == 1      # (the pack of both, no copy yet)
    assert len(js.out) == 1
    a.tick(2.5)
    js.run()
    copies = [c for c in js.commands if c[0] == "publish"][1:]
    assert len(copies) == 1 and [(m.body, m.before) for m in packs.unpack(copies[0][4])] == [(b"two", 1)]
    assert [packs.count(e[0]) for _, _, e in js.out.values()] in ([], [1])   # the pack of two: acked
    assert js.depth() == 1                                   # "two", by itself; "one" gone with its pack


def test_a_member_that_cannot_be_put_back_makes_its_pack_come_back_whole_marked_redelivered():
    js = FakeJetStream()
    a = packed_node(js, 2)
    m0, m1 = a.messages(1)
    a.frame(1, "ACK", id=m0["ack"])
    js.fail = True                                           # the copy is not stored
    a.frame(1, "NACK", id=m1["ack"])
    js.run()
    js.fail = False
    got = a.messages(1)                                      # the pack was nak'ed: both members again
    assert [(m.body, m["redelivered"]) for m in got] == [(b"m0", "true"), (b"m1", "true")]
    assert "nak" in js.log and js.depth() == 2


def test_an_auto_ack_consumer_pulls_ahead_a_few_packs_whatever_the_pack_size():
    """The credit of an auto-ack subscription covers WINDOW_PACKS full packs (at least AUTO_WINDOW
    messages): with packs of 64 a window of 64 messages would be one pack in flight, and JetStream
    idle while it crosses."""
    for pack_max, window in ((1, 64), (16, 64), (64, 256)):
        js = FakeJetStream()
        a = js.join(cluster_pack_max=pack_max)
        a.connect(1)
        a.subscribe(1, "/queue/w")
        js.run()
        assert a.want == {"/queue/w": window}, pack_max
