"""Queue browsing in the pure broker: SUBSCRIBE browser:true copies what waits, honours the
selector, ends with the browser:end marker, consumes nothing and leaves no subscription."""

from __future__ import annotations

from broker_harness import Rig


def loaded(*pairs, **settings) -> Rig:
    rig = Rig(**settings)
    rig.connect(1)
    rig.connect(2)
    for body, extra in pairs:
        rig.send(1, "/queue/b", body=body.encode(), **extra)
    return rig


def test_a_browse_copies_what_waits_then_the_end_marker_and_consumes_nothing():
    rig = loaded(("a", {}), ("b", {"kind": "x"}), ("c", {}))
    rig.subscribe(2, "/queue/b", sub_id="br", browser="true", receipt="r")
    got = rig.frames(2)
    assert [o.command for o in got] == ["RECEIPT", "MESSAGE", "MESSAGE", "MESSAGE", "MESSAGE"]
    assert [o.body for o in got[1:4]] == [b"a", b"b", b"c"]
    assert all(o["subscription"] == "br" and "ack" not in o.headers for o in got[1:])
    end = got[4]
    assert end.headers == {"subscription": "br", "message-id": "0", "destination": "/queue/b", "browser": "end"}
    assert end.body == b""
    rig.connect(3)
    rig.subscribe(3, "/queue/b")
    assert rig.bodies(3) == [b"a", b"b", b"c"]  # still there, in order


def test_a_browse_honours_the_selector_and_priority_order():
    rig = loaded(("a", {"kind": "x"}), ("b", {"kind": "y"}), ("c", {"kind": "x", "priority": "8"}))
    rig.subscribe(2, "/queue/b", browser="true", selector="kind = 'x'")
    assert rig.bodies(2) == [b"c", b"a", b""]


def test_an_empty_queue_gets_only_the_end_marker_and_no_subscription_is_kept():
    rig = loaded()
    rig.subscribe(2, "/queue/none", sub_id="br", browser="true", ack="client")
    (end,) = rig.messages(2)
    assert end["browser"] == "end" and end["message-id"] == "0"
    rig.send(1, "/queue/none", body=b"later")
    assert rig.frames(2) == []  # nothing after the snapshot
    rig.frame(2, "UNSUBSCRIBE", id="br", receipt="u")
    assert rig.commands(2) == ["RECEIPT"]
    assert rig.broker.queues["/queue/none"].depth() == 1


def test_a_browse_does_not_take_messages_from_consumers_with_room():
    rig = loaded()
    rig.subscribe(2, "/queue/b", sub_id="c", ack="client-individual", prefetch_count="1")
    for body in (b"1", b"2", b"3"):
        rig.send(1, "/queue/b", body=body)
    assert rig.bodies(2) == [b"1"]
    rig.connect(3)
    rig.subscribe(3, "/queue/b", sub_id="br", browser="true")
    assert rig.bodies(3) == [b"2", b"3", b""]  # the one in flight is not waiting
    assert rig.bodies(2) == []


def test_refused_on_stomp_1_0_topics_and_temporary_destinations():
    for version, destination, message in (("1.0", "/queue/b", "browsing needs STOMP 1.1"),
                                          ("1.2", "/topic/t", "cannot browse a topic"),
                                          ("1.2", "/temp-queue/x", "cannot browse a temporary destination")):
        rig = Rig()
        rig.connect(2, version=version)
        rig.subscribe(2, destination, browser="true", receipt="r")
        error = rig.error(2)
        assert error["message"] == message and error["receipt-id"] == "r"


def test_expired_messages_are_not_browsed_and_the_look_is_bounded():
    rig = loaded(("old", {"expiration": "1000"}), *[(str(i), {}) for i in range(5)], max_browse_messages=4)
    rig.tick(2)
    rig.subscribe(2, "/queue/b", browser="true")
    assert rig.bodies(2) == [b"0", b"1", b"2", b""]  # 4 looked at, the expired one among them


def test_a_large_browse_goes_out_in_order_past_the_outbox_limit():
    rig = loaded(*[(str(i) * 1000, {}) for i in range(300)])
    box = rig.outboxes[0]
    box.limit = 20_000
    rig.subscribe(2, "/queue/b", browser="true")
    got = []
    for _ in range(1000):
        got += rig.bodies(2)
        if not rig.broker.unfinished:
            break
        rig.broker.resume()
    got += rig.bodies(2)
    assert got == [str(i).encode() * 1000 for i in range(300)] + [b""]


def test_cluster_mode_refuses_browsing():
    from stompbroker.cluster.backplane import Backplane
    rig = Rig(cluster="nats://127.0.0.1:4222", node_id="n0")
    rig.broker.backplane = Backplane(rig.config)
    rig.connect(2)
    rig.subscribe(2, "/queue/b", browser="true", receipt="r")
    error = rig.error(2)
    assert error["message"] == "browsing not supported in cluster mode" and error["receipt-id"] == "r"
