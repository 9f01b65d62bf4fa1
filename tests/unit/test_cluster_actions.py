"""Operators' actions in cluster mode, the dispatcher's side (broker/manage.py, cluster/backplane.py,
cluster/queuing.py): their results come later, from the bridge (a ``Later``), driven through the
real Broker with the in-memory JetStream stand-in of test_cluster_queuing."""

from __future__ import annotations

from stompbroker.broker import manage
from stompbroker.broker.model import Later

from test_cluster_queuing import FakeJetStream


def test_a_later_gives_its_outcome_once_whenever_it_is_asked_for():
    seen = []
    later = Later(value=3)
    later.when_done(lambda *outcome: seen.append(outcome))
    later.finish()
    later.fail(503, "too late")               # (decided already: nothing more)
    assert seen == [(None, 3)]
    early = Later()
    early.fail(409, "full")
    early.when_done(lambda *outcome: seen.append(outcome))
    assert seen[-1] == (409, "full")


def test_a_published_queue_message_is_answered_once_jetstream_stored_it():
    js = FakeJetStream()
    a = js.join()
    later = a.broker.manage(manage.publish, "/queue/q", {"h": "v"}, b"body", now=a.now)
    assert isinstance(later, Later) and later.outcome is None   # nothing before JetStream stored it
    js.run()
    assert later.outcome == (None, 0) and js.depth() == 1
    assert a.broker.backplane.waiting == {}


def test_a_publish_jetstream_cannot_store_fails_503_and_one_it_never_answers_too():
    js = FakeJetStream()
    js.fail = True
    a = js.join(cluster_timeout_ms=2000)
    later = a.broker.manage(manage.publish, "/queue/q", {}, b"x", now=a.now)
    js.run()
    assert later.outcome[0] == 503 and later.outcome[1].startswith("cluster unavailable")
    js.fail, js.silent = False, True
    later = a.broker.manage(manage.publish, "/queue/q", {}, b"x", now=a.now)
    js.run()
    a.tick(1.0)
    assert later.outcome is None
    a.tick(4.0)
    assert later.outcome[0] == 503


def test_a_message_nothing_keeps_is_answered_at_once_and_a_non_persistent_one_too():
    js = FakeJetStream()
    a = js.join()
    assert a.broker.manage(manage.publish, "/topic/news", {}, b"x", now=a.now) == 0   # no durable, no remote interest
    assert a.broker.manage(manage.publish, "/queue/q", {"persistent": "false"}, b"x", now=a.now) == 0


def test_blobs_travel_whole_and_a_cut_payload_is_refused():
    from stompbroker.cluster.records import pack_blobs, unpack_blobs
    blobs = [b"", b"one", b"x" * 70000]
    assert unpack_blobs(pack_blobs(blobs)) == blobs
    for bad in (pack_blobs(blobs)[:-1], b"\x01\x00"):
        try:
            unpack_blobs(bad)
        except ValueError:
            continue
        raise AssertionError("a cut payload was read")


def test_peek_result_takes_packs_apart_in_order_and_counts_what_it_did_not_read():
    from stompbroker.cluster import packs
    from stompbroker.cluster.queuing import peek_result
    from stompbroker.cluster.records import pack_blobs
    first = packs.pack("/queue/q", [packs.member(f"id{i}", {"n": str(i)}, b"b%d" % i) for i in range(3)])
    alone = packs.single("id3", "/queue/q", {"n": "3"}, b"b3", 0, before=2)
    payload = pack_blobs([first, b"not ours", alone])
    depth, shown, cut = peek_result(payload, stored=5, offset=1, count=2)
    assert depth == 4 + 2 and cut is False   # 4 read, 2 JetStream messages not read (one each)
    assert [(m.id, m.headers["n"], m.body, m.redelivered) for m in shown] == \
        [("id1", "1", b"b1", False), ("id2", "2", b"b2", False)]
    depth, shown, _ = peek_result(payload, stored=3, offset=3, count=10)
    assert depth == 4 and [(m.id, m.redelivered) for m in shown] == [("id3", True)]


def test_a_peek_is_a_command_with_a_token_answered_by_the_bridge_or_refused_after_its_time():
    from stompbroker.cluster import packs
    from stompbroker.cluster.queuing import pack, unpack
    from stompbroker.cluster.records import pack_blobs
    js = FakeJetStream()
    a = js.join(cluster_timeout_ms=2000)
    cq = a.broker.backplane.queues
    later = a.broker.manage(manage.peek, "/queue/q", 0, 10, now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "peek"]
    assert unpack(pack(command)) == ("peek", command[1], "/queue/q", 10, a.broker.config.answer_bytes, 2000)
    blob = packs.single("id", "/queue/q", {}, b"x")
    cq.event(a.broker, unpack(pack(("peeked", command[1], 1, False, pack_blobs([blob])))), None)
    depth, shown, cut = later.outcome[1]
    assert later.outcome[0] is None and depth == 1 and [m.body for m in shown] == [b"x"]
    assert a.broker.manage(manage.peek, "/topic/t", 0, 10, now=a.now) == (0, [])   # (topics: no queue stream)
    silent = a.broker.manage(manage.peek, "/queue/q", 0, 10, now=a.now)
    cq.commands()   # (sent; never answered)
    a.tick(2.5)
    assert silent.outcome is None
    a.tick(1.0)
    assert silent.outcome[0] == 503 and "cluster_timeout_ms" in silent.outcome[1]
    refused = a.broker.manage(manage.peek, "/queue/q", 0, 10, now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "peek"]
    cq.event(a.broker, ("refused", command[1], 503, "cluster unavailable: no"), None)
    assert refused.outcome == (503, "cluster unavailable: no")


def test_a_purge_drops_what_this_node_pulled_and_waits_here_and_asks_the_bridge_for_the_rest():
    from stompbroker.cluster.queuing import consumer_name, pack, unpack
    js = FakeJetStream()
    a = js.join()
    a.connect(1)
    a.subscribe(1, "/queue/q", ack="client-individual", prefetch_count="1")
    js.run()
    for i in range(3):
        a.send(1, "/queue/q", b"m%d" % i)
    js.run()   # one delivered (unacknowledged), two pulled and waiting here
    cq = a.broker.backplane.queues
    later = a.broker.manage(manage.purge, "/queue/q", now=a.now)
    assert a.broker.queues["/queue/q"].depth() == 0 and len(cq.pulled) == 1   # the delivered one stays
    (command,) = [c for c in cq.commands() if c[0] == "purge"]
    assert unpack(pack(command)) == ("purge", command[1], "/queue/q", consumer_name("q", "/queue/q"), 10000)
    cq.event(a.broker, ("purged", command[1], 5, False), None)
    assert later.outcome == (None, (2 + 5, False))
    assert a.broker.manage(manage.purge, "/topic/t", now=a.now) == 0


def test_a_pulled_messages_stream_sequence_comes_from_its_ack_subject():
    from stompbroker.cluster.jetstream import stream_sequence
    assert stream_sequence("$JS.ACK.S.C.1.42.7.1700000000.3") == 42
    assert stream_sequence("$JS.ACK.dom.hash.S.C.2.43.8.1700000000.0.tok") == 43
    assert stream_sequence("nonsense") == 0


def test_a_move_copies_what_it_chooses_the_dead_letters_way_and_gives_the_rest_back():
    from stompbroker.broker.selector import compile_selector
    from stompbroker.cluster import packs
    from stompbroker.cluster.queuing import pack, unpack
    from stompbroker.cluster.records import pack_taken
    js = FakeJetStream()
    a = js.join()
    cq = a.broker.backplane.queues
    later = a.broker.manage(manage.move, "/queue/src", "/queue/dst", None, compile_selector("k = 1"), now=a.now)
    (take,) = [c for c in cq.commands() if c[0] == "take"]
    assert unpack(pack(take))[:5] == ("take", take[1], "/queue/src", "q_%2Fqueue%2Fsrc", 100000)
    both = packs.pack("/queue/src", [packs.member(f"id{i}", {"k": str(i % 2)}, b"b%d" % i) for i in range(4)])
    stays = packs.single("id9", "/queue/src", {"k": "0"}, b"b9")
    cq.event(a.broker, ("taken", take[1], False, pack_taken([(11, 1, both), (12, 1, stays)])), None)
    assert later.outcome is None                       # the copies are not stored yet
    out = cq.commands()
    copies = [c for c in out if c[0] == "publish"]
    assert ("nak", 12) in out                           # none of it moves: back whole, at once
    assert sorted(m.body for c in copies for m in packs.unpack(c[4])) == [b"b0", b"b1", b"b2", b"b3"]
    moved = [m for c in copies if "dst" in c[2] for m in packs.unpack(c[4])]
    assert sorted(m.body for m in moved) == [b"b1", b"b3"] and all(m.headers["redriven-from"] == "/queue/src"
                                                                  for m in moved)
    for c in copies:                                    # (the others put back by themselves: a copy each)
        for token in c[1]:
            cq.event(a.broker, ("stored", token), None)
    assert later.outcome == (None, (2, None, False))
    assert ("term", 11) in cq.commands()               # the pack, once every copy of it is stored
    late = a.broker.manage(manage.move, "/queue/src", "/queue/dst", 1, None, now=a.now)
    (take,) = [c for c in cq.commands() if c[0] == "take"]
    cq.event(a.broker, ("refused", take[1], 503, "cluster unavailable: no"), None)
    assert late.outcome == (503, "cluster unavailable: no") and late not in a.broker.backplane.waiting
    cq.event(a.broker, ("taken", take[1], False, pack_taken([(13, 1, stays)])), None)   # too late: back
    assert ("nak", 13) in cq.commands()


def test_a_move_the_bridge_cut_short_says_so():
    """The bridge stops taking at half of cluster_timeout_ms (a consumer's leader being elected can
    take that long): the answer says truncated, so that 0 moved is not read as an empty queue."""
    from stompbroker.cluster.records import pack_taken
    js = FakeJetStream()
    a = js.join()
    cq = a.broker.backplane.queues
    later = a.broker.manage(manage.move, "/queue/src", "/queue/dst", None, None, now=a.now)
    (take,) = [c for c in cq.commands() if c[0] == "take"]
    cq.event(a.broker, ("taken", take[1], True, pack_taken([])), None)
    assert later.outcome == (None, (0, None, True))


def test_a_delete_is_refused_here_while_this_node_uses_the_queue_else_asked_of_the_bridge():
    import pytest
    from stompbroker.cluster.queuing import consumer_name, pack, unpack
    js = FakeJetStream()
    a = js.join()
    cq = a.broker.backplane.queues
    a.connect(1)
    a.subscribe(1, "/queue/q", ack="client-individual", prefetch_count="1")
    js.run()
    with pytest.raises(manage.Refused) as refused:   # a subscription here: nothing asked of the bridge
        a.broker.manage(manage.delete, "/queue/q", now=a.now)
    assert refused.value.status == 409 and "in use" in refused.value.reason
    assert not [c for c in cq.commands() if c[0] == "delete"]
    assert a.broker.manage(manage.delete, "/topic/t", now=a.now) is None   # (only queues live in JetStream)
    later = a.broker.manage(manage.delete, "/queue/other", now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "delete"]
    assert unpack(pack(command)) == ("delete", command[1], "/queue/other", consumer_name("q", "/queue/other"),
                                     10000)
    cq.event(a.broker, ("deleted", command[1], True, 7), None)
    assert later.outcome == (None, 7)
    nothing = a.broker.manage(manage.delete, "/queue/none", now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "delete"]
    cq.event(a.broker, ("deleted", command[1], False, 0), None)
    assert nothing.outcome == (None, None)                    # (answered {"deleted": false, "purged": 0})
    busy = a.broker.manage(manage.delete, "/queue/busy", now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "delete"]
    cq.event(a.broker, ("refused", command[1], 409, "the queue is in use in the cluster: ..."), None)
    assert busy.outcome == (409, "the queue is in use in the cluster: ...")
