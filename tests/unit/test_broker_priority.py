"""Message priority in the pure broker: the SEND header `priority` ranks a queue's waiting messages
(strict, FIFO within a level), is clamped or refused, and survives redelivery."""

from __future__ import annotations

from collections import deque

import pytest

from broker_harness import Rig
from stompbroker.broker.priority import Ranked


def sent(rig: Rig, destination: str, *pairs) -> None:
    for body, level in pairs:
        extra = {} if level is None else {"priority": level}
        rig.send(1, destination, body=body.encode(), **extra)


def test_higher_priority_first_fifo_within_a_level():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    sent(rig, "/queue/p", ("a1", "1"), ("plain", None), ("c9", "9"), ("d9", "9"), ("e0", "0"), ("f4", "4"),
         ("g1", "1"))
    rig.subscribe(2, "/queue/p")
    assert rig.bodies(2) == [b"c9", b"d9", b"plain", b"f4", b"a1", b"g1", b"e0"]


def test_a_queue_without_priorities_stays_a_plain_deque():
    rig = Rig()
    rig.connect(1)
    sent(rig, "/queue/plain", ("a", None), ("b", "4"))
    assert type(rig.broker.queues["/queue/plain"].messages) is deque
    sent(rig, "/queue/plain", ("c", "7"))
    assert type(rig.broker.queues["/queue/plain"].messages) is Ranked


def test_out_of_range_is_clamped_and_the_header_says_so():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    sent(rig, "/queue/p", ("low", "-3"), ("mid", "5"), ("high", "15"))
    rig.subscribe(2, "/queue/p")
    got = rig.messages(2)
    assert [(m.body, m["priority"]) for m in got] == [(b"high", "9"), (b"mid", "5"), (b"low", "0")]


@pytest.mark.parametrize("value", ["high", "", "4.5", "0x9"])
def test_a_non_integer_priority_is_an_error_with_the_receipt_id(value):
    rig = Rig()
    rig.connect(1)
    rig.send(1, "/queue/p", priority=value, receipt="r1")
    error = rig.error(1)
    assert error["message"] == "invalid priority" and error["receipt-id"] == "r1"
    assert "/queue/p" not in rig.broker.queues


def test_client_ack_with_prefetch_one_takes_the_highest_each_time():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    sent(rig, "/queue/p", ("first", "0"))
    rig.subscribe(2, "/queue/p", ack="client-individual", prefetch_count="1")
    (m,) = rig.messages(2)
    sent(rig, "/queue/p", ("low", "2"), ("high", "8"), ("mid", "5"))
    order = [m.body]
    for _ in range(3):
        rig.frame(2, "ACK", id=m["ack"])
        (m,) = rig.messages(2)
        order.append(m.body)
    assert order == [b"first", b"high", b"mid", b"low"]


def test_redelivery_keeps_the_level():
    """A NACKed or abandoned message goes back to the head of its own level, not of the queue."""
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    sent(rig, "/queue/p", ("mid", "5"))
    rig.subscribe(2, "/queue/p", ack="client-individual", prefetch_count="1")
    (m,) = rig.messages(2)
    sent(rig, "/queue/p", ("high", "9"), ("low", "1"))
    rig.frame(2, "NACK", id=m["ack"])
    (again,) = rig.messages(2)
    assert again.body == b"high"
    rig.broker.on_closed(2)  # "high" goes back unacknowledged, "mid" and "low" wait
    rig.connect(3)
    rig.subscribe(3, "/queue/p")
    got = rig.messages(3)
    assert [m.body for m in got] == [b"high", b"mid", b"low"]
    assert got[0]["redelivered"] == "true" and "redelivered" not in got[2].headers


def test_a_durable_subscriptions_pending_messages_are_ranked():
    rig = Rig()
    rig.connect(1)
    rig.connect(2, client_id="c")
    rig.subscribe(2, "/topic/t", sub_id="d", **{"activemq.subscriptionName": "d"})
    rig.broker.on_closed(2)
    sent(rig, "/topic/t", ("low", "1"), ("plain", None), ("high", "9"))
    rig.connect(3, client_id="c")
    rig.subscribe(3, "/topic/t", sub_id="d", **{"activemq.subscriptionName": "d"})
    assert rig.bodies(3) == [b"high", b"plain", b"low"]


def test_committed_sends_are_ranked_and_aborted_ones_gone():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.frame(1, "BEGIN", transaction="t")
    rig.send(1, "/queue/p", body=b"bad", priority="x", transaction="t", receipt="bad")
    assert rig.error(1)["message"] == "invalid priority"  # refused when held, not at COMMIT
    rig.connect(1)
    rig.frame(1, "BEGIN", transaction="t")
    sent_in_tx = [("low", "1"), ("high", "9")]
    for body, level in sent_in_tx:
        rig.send(1, "/queue/p", body=body.encode(), priority=level, transaction="t")
    rig.frame(1, "COMMIT", transaction="t")
    rig.frame(1, "BEGIN", transaction="u")
    rig.send(1, "/queue/p", body=b"aborted", priority="9", transaction="u")
    rig.frame(1, "ABORT", transaction="u")
    rig.subscribe(2, "/queue/p")
    assert rig.bodies(2) == [b"high", b"low"]


def test_selectors_see_the_priority_header():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    sent(rig, "/queue/p", ("a", "3"), ("b", "8"), ("c", "6"))
    rig.subscribe(2, "/queue/p", selector="priority > 5")
    assert rig.bodies(2) == [b"b", b"c"]


def test_expired_high_priority_messages_are_dropped_not_delivered():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.send(1, "/queue/p", body=b"old", priority="9", expiration="1000")
    sent(rig, "/queue/p", ("low", "1"))
    rig.tick(2)
    rig.subscribe(2, "/queue/p")
    assert rig.bodies(2) == [b"low"]


def test_ranked_deque_operations():
    class M:
        def __init__(self, name, level):
            self.name, self.headers = name, ({} if level is None else {"priority": level})

    a, b, c, d = M("a", "1"), M("b", None), M("c", "9"), M("d", "4")
    r = Ranked([a, b, c])
    assert len(r) == 3 and r[0] is c and r[-1] is a and [m.name for m in r] == ["c", "b", "a"]
    assert [m.name for m in reversed(r)] == ["a", "b", "c"]
    r.appendleft(d)
    assert [m.name for m in r] == ["c", "d", "b", "a"]
    r.extendleft(reversed([b, a]))  # (as a consumer's unacknowledged messages go back)
    assert r.popleft() is c and r.popleft() is b and r.popleft() is d
    r.remove(a)
    assert [m.name for m in r] == ["b", "a"]
    r.clear()
    assert not r and len(r) == 0
    with pytest.raises(IndexError):
        r.popleft()


def cluster_rig() -> Rig:
    from stompbroker.cluster.backplane import Backplane
    rig = Rig(cluster="nats://127.0.0.1:4222", node_id="n0")
    rig.broker.backplane = Backplane(rig.config)
    return rig


def test_cluster_mode_refuses_a_priority_it_cannot_keep_and_accepts_the_default():
    rig = cluster_rig()
    rig.connect(1)
    rig.send(1, "/topic/t", priority="4", receipt="ok")
    assert [o.command for o in rig.frames(1)] == ["RECEIPT"]
    rig.send(1, "/queue/q", priority="9", receipt="r9")
    error = rig.error(1)
    assert error["message"] == "priority not supported in cluster mode" and error["receipt-id"] == "r9"


def test_the_dead_letter_queue_and_a_temporary_queue_are_ranked_too():
    rig = Rig(max_redeliveries=0)
    rig.connect(1)
    rig.connect(2)
    sent(rig, "/queue/p", ("low", "1"), ("high", "9"))
    rig.subscribe(2, "/queue/p", ack="client-individual")
    for m in reversed(rig.messages(2)):  # low first
        rig.frame(2, "NACK", id=m["ack"])  # each straight to the dead-letter queue
    rig.connect(3)
    rig.subscribe(3, "/queue/DLQ")
    assert rig.bodies(3) == [b"high", b"low"]
    rig.subscribe(1, "/temp-queue/t", sub_id="t", ack="client-individual", prefetch_count="1")
    for body, level in (("a", "2"), ("c", "5"), ("b", "8")):
        rig.send(1, "/temp-queue/t", body=body.encode(), priority=level)
    first = rig.messages(1)
    rig.frame(1, "ACK", id=first[0]["ack"])
    second = rig.messages(1)
    rig.frame(1, "ACK", id=second[0]["ack"])
    assert [m.body for m in first + second + rig.messages(1)] == [b"a", b"b", b"c"]
