"""Consumer options in the pure broker: exclusive consumers, consumer priority, message groups and
the activemq.prefetchSize alias (choosing.py)."""

from __future__ import annotations

from broker_harness import Rig


def rig_with(*consumers, **settings) -> Rig:
    """Producer 1; consumer n+2 subscribes to /queue/q with the n-th dict of headers."""
    rig = Rig(**settings)
    rig.connect(1)
    for i, headers in enumerate(consumers):
        rig.connect(i + 2)
        rig.subscribe(i + 2, "/queue/q", sub_id=f"s{i}", **headers)
    return rig


def send(rig: Rig, n: int, **headers) -> None:
    for i in range(n):
        rig.send(1, "/queue/q", body=str(i).encode(), **headers)


def counts(rig: Rig, conns) -> list[int]:
    return [len(rig.bodies(c)) for c in conns]


def test_an_exclusive_consumer_gets_everything_then_the_next_takes_over():
    rig = rig_with({}, {"activemq.exclusive": "true"}, {"activemq.exclusive": "true"})
    send(rig, 6)
    assert counts(rig, (2, 3, 4)) == [0, 6, 0]
    rig.broker.on_closed(3)
    send(rig, 3)
    assert counts(rig, (2, 4)) == [0, 3]  # failover to the next exclusive one, the oldest


def test_an_exclusive_consumers_unacknowledged_messages_go_to_its_successor():
    rig = rig_with({"activemq.exclusive": "true", "ack": "client-individual"}, {})
    send(rig, 3)
    assert len(rig.bodies(2)) == 3 and rig.bodies(3) == []
    rig.broker.on_closed(2)  # the exclusive one goes with all three unacknowledged
    assert rig.bodies(3) == [b"0", b"1", b"2"]


def test_a_full_exclusive_consumer_holds_the_queue():
    rig = rig_with({"activemq.exclusive": "true", "ack": "client-individual", "prefetch_count": "1"}, {})
    send(rig, 3)
    (first,) = rig.messages(2)
    assert rig.bodies(3) == []  # the others get nothing while it lives, even when it is full
    rig.frame(2, "ACK", id=first["ack"])
    assert rig.bodies(2) == [b"1"]


def test_consumer_priority_first_then_lower_ones_when_the_higher_are_full():
    rig = rig_with({"x-priority": "1", "ack": "client-individual", "prefetch_count": "2"},
                   {"activemq.priority": "5", "ack": "client-individual", "prefetch_count": "2"},
                   {"activemq.priority": "5", "ack": "client-individual", "prefetch_count": "2"})
    send(rig, 7)
    assert counts(rig, (2, 3, 4)) == [2, 2, 2]  # the two at 5 take two each, then the one at 1
    rig2 = rig_with({"x-priority": "1"}, {"activemq.priority": "5"}, {"activemq.priority": "5"})
    send(rig2, 6)
    got = counts(rig2, (2, 3, 4))
    assert got == [0, 3, 3]  # round-robin among the highest


def test_bad_consumer_options_are_errors():
    for headers, message in (({"x-priority": "high"}, "invalid consumer priority"),
                             ({"activemq.exclusive": "yes"}, "invalid activemq.exclusive")):
        rig = Rig()
        rig.connect(2)
        rig.subscribe(2, "/queue/q", receipt="r", **headers)
        error = rig.error(2)
        assert error["message"] == message and error["receipt-id"] == "r"
    rig = Rig()
    rig.connect(2)
    rig.subscribe(2, "/queue/a*", receipt="w", **{"activemq.exclusive": "true"})
    assert rig.error(2)["message"] == "exclusive consumers need one queue"
    rig.connect(2)
    rig.subscribe(2, "/temp-queue/t", receipt="t", **{"x-priority": "2"})
    assert rig.error(2)["message"] == "consumer priority needs one queue"


def test_options_on_a_topic_change_nothing():
    rig = Rig()
    rig.connect(1)
    for conn in (2, 3):
        rig.connect(conn)
        rig.subscribe(conn, "/topic/t", **{"activemq.exclusive": "true"})
    rig.send(1, "/topic/t")
    assert counts(rig, (2, 3)) == [1, 1]


def test_a_group_sticks_to_one_consumer_and_moves_when_it_leaves():
    rig = rig_with({"ack": "client-individual"}, {"ack": "client-individual"})
    for i in range(6):  # A A A B B B: the round-robin alone would split both
        group = "AB"[i // 3]
        rig.send(1, "/queue/q", body=f"{group}{i}".encode(), JMSXGroupID=group, JMSXGroupSeq=str(i + 1))
    first, second = rig.messages(2), rig.messages(3)
    groups = {m["JMSXGroupID"] for m in first}, {m["JMSXGroupID"] for m in second}
    assert sorted(map(len, groups)) == [1, 1] and groups[0] != groups[1]  # one group each, all of it
    assert sorted(m["JMSXGroupSeq"] for m in first + second) == ["1", "2", "3", "4", "5", "6"]  # passed through
    rig.broker.on_closed(2)  # its group's three come back and go, with what follows, to the other
    assert [m.headers["JMSXGroupID"] for m in rig.messages(3)] == [first[0]["JMSXGroupID"]] * 3
    rig.send(1, "/queue/q", body=b"late", JMSXGroupID=first[0]["JMSXGroupID"])
    assert rig.bodies(3) == [b"late"]


def test_a_groups_message_waits_for_its_full_consumer_and_others_flow():
    rig = rig_with({"ack": "client-individual", "prefetch_count": "1"}, {"ack": "client-individual"})
    rig.send(1, "/queue/q", body=b"g1", JMSXGroupID="g")
    owner = 2 if rig.frames(2) else 3
    other = 5 - owner
    rig.take(other)
    rig.send(1, "/queue/q", body=b"g2", JMSXGroupID="g")
    rig.send(1, "/queue/q", body=b"plain")
    if owner == 2:  # full (prefetch 1): g2 waits for it, the plain one goes to the other
        assert rig.bodies(2) == [] and rig.bodies(3) == [b"plain"]
    else:
        assert rig.bodies(3) == [b"g2"]


def test_group_seq_minus_one_closes_the_group():
    rig = rig_with({}, {})
    rig.send(1, "/queue/q", body=b"a", JMSXGroupID="g")
    rig.send(1, "/queue/q", body=b"b", JMSXGroupID="g", JMSXGroupSeq="-1")
    chooser = rig.broker.queues["/queue/q"].chooser
    assert chooser.groups == {}


def test_groups_remembered_are_bounded():
    rig = rig_with({}, max_message_groups=3)
    for i in range(10):
        rig.send(1, "/queue/q", JMSXGroupID=f"g{i}")
    assert list(rig.broker.queues["/queue/q"].chooser.groups) == ["g7", "g8", "g9"]


def test_a_queue_without_options_or_groups_has_no_chooser():
    rig = rig_with({"prefetch_count": "3"})
    send(rig, 2, custom="x")
    assert rig.broker.queues["/queue/q"].chooser is None


def test_activemq_prefetch_size_is_prefetch_count():
    rig = rig_with({"ack": "client-individual", "activemq.prefetchSize": "2"})
    send(rig, 5)
    assert rig.bodies(2) == [b"0", b"1"]


def test_cluster_mode_refuses_consumer_options_and_groups():
    from stompbroker.cluster.backplane import Backplane
    rig = Rig(cluster="nats://127.0.0.1:4222", node_id="n0")
    rig.broker.backplane = Backplane(rig.config)
    rig.connect(1)
    rig.send(1, "/queue/q", JMSXGroupID="g", receipt="r")
    error = rig.error(1)
    assert error["message"] == "message groups not supported in cluster mode" and error["receipt-id"] == "r"
    rig.connect(2)
    rig.subscribe(2, "/queue/q", **{"x-priority": "3"})
    assert rig.error(2)["message"] == "consumer priority not supported in cluster mode"
