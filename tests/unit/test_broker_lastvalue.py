"""Last-value queues in the pure broker: a keyed message replaces its key's waiting message."""

from __future__ import annotations

from broker_harness import Rig


def send(r: Rig, body: bytes, key: str | None = None, name: str = "_AMQ_LVQ_NAME", **more) -> None:
    """(the harness turns _ into - in keyword headers: the key's header goes as a dict)"""
    r.frame(1, "SEND", {name: key} if key is not None else {}, destination="/queue/lv", body=body, **more)


def rig() -> Rig:
    r = Rig()
    r.connect(1)
    r.connect(2)
    return r


def test_a_newer_message_replaces_the_waiting_one_with_its_key():
    r = rig()
    for i in range(100):
        send(r, f"a{i}".encode(), "a")
    send(r, b"plain")
    send(r, b"plain2")
    send(r, b"b1", "b", "last-value-key")
    send(r, b"b2", "b", "last-value-key")
    assert r.broker.queues["/queue/lv"].depth() == 4
    r.subscribe(2, "/queue/lv")
    assert r.bodies(2) == [b"a99", b"plain", b"plain2", b"b2"]  # each replacement goes to the tail


def test_a_delivered_message_is_not_replaced_only_the_waiting_one():
    """Artemis' own test: a consumer holding message 1 while 100 are sent gets 1 and 100."""
    r = rig()
    r.subscribe(2, "/queue/lv", ack="client-individual", prefetch_count="1")
    send(r, b"1", "test")
    (first,) = r.messages(2)
    for i in range(2, 101):
        send(r, str(i).encode(), "test")
    r.frame(2, "ACK", id=first["ack"])
    assert r.bodies(2) == [b"100"]


def test_a_queue_without_keys_has_no_index_and_the_index_stays_bounded():
    r = rig()
    r.send(1, "/queue/plain")
    assert r.broker.queues["/queue/plain"].last_values is None
    r.subscribe(2, "/queue/lv")
    for i in range(1000):  # each delivered at once: the index must not keep them all
        send(r, b"x", f"k{i}")
    assert len(r.bodies(2)) == 1000
    assert len(r.broker.queues["/queue/lv"].last_values) <= 65


def test_last_value_with_priority_and_selectors():
    r = rig()
    send(r, b"old", "k", priority="9")
    send(r, b"other", priority="5")
    send(r, b"new", "k", priority="1")
    r.subscribe(2, "/queue/lv")
    assert r.bodies(2) == [b"other", b"new"]


def test_cluster_mode_refuses_last_value_keys():
    from stompbroker.cluster.backplane import Backplane
    r = Rig(cluster="nats://127.0.0.1:4222", node_id="n0")
    r.broker.backplane = Backplane(r.config)
    r.connect(1)
    send(r, b"x", "k", receipt="r")
    error = r.error(1)
    assert error["message"] == "last-value queues not supported in cluster mode" and error["receipt-id"] == "r"
