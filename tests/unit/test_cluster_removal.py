"""Removing a durable subscription in cluster mode (cluster/removal.py, cluster/queuing.py): the
requests and answers between nodes, the verdict on them, and a node's dispatcher answering them,
driven through the real Broker with the in-memory JetStream stand-in of test_cluster_queuing."""

from __future__ import annotations

from stompbroker.broker import manage
from stompbroker.broker.model import Later
from stompbroker.cluster import records as C
from stompbroker.cluster import removal
from stompbroker.cluster.records import DURABLE_MARK

from test_cluster_queuing import FakeJetStream


def test_requests_and_answers_travel_and_garbage_is_not_a_request():
    assert removal.read_request(removal.request(removal.HOLD, "u\x1fd")) == ("hold", "u\x1fd")
    for data in (b"", b"[]", b'{"op":"explode","key":"k"}', b'{"op":"drop"}', b'{"op":"drop","key":3}',
                 removal.request(removal.HOLD, "k" * (removal.MAX_KEY + 1))):
        assert removal.read_request(data) is None, data
    assert removal.read_answer(removal.answer("n1", True, False)) == {"node": "n1", "held": True, "attached": False}
    assert removal.read_answer(b"{}") is None and removal.read_answer(b"nope") is None


def test_the_verdict_needs_every_node_and_no_client_attached():
    yes = {"held": False, "attached": False}
    assert removal.verdict(removal.HOLD, {"a", "b"}, {"a": yes, "b": yes, "c": yes}, 2500) is None
    status, why = removal.verdict(removal.HOLD, {"a", "b"}, {"a": yes}, 2500)
    assert status == 503 and "node b did not answer within 2500 ms" in why and "nothing was removed" in why
    status, why = removal.verdict(removal.DROP, {"a", "b"}, {"a": yes}, 2500)
    assert status == 503 and "dropped their record" in why
    status, why = removal.verdict(removal.HOLD, {"a", "b"}, {"a": yes, "b": {"attached": True}}, 2500)
    assert status == 409 and "attached to a connection on node b" in why   # (before a missing node)
    assert removal.held_anywhere({"a": yes, "b": {"held": True}}) and not removal.held_anywhere({"a": yes})


def detached_durable(js):
    """A node with a detached durable subscription of /topic/t: (rig, its key)."""
    a = js.join()
    a.connect(1, login="u")
    a.subscribe(1, "/topic/t", sub_id="d", durable="true")
    js.run()
    a.broker.on_closed(1)
    js.run()
    (key,) = a.broker.durables
    return a, key


def asked(rig, n: int, op: str, key: str) -> tuple:
    """A removal's request to the node: its answer command."""
    cq = rig.broker.backplane.queues
    cq.event(rig.broker, ("durable_asked", n, op, key), None)
    return [c for c in cq.out if c[0] == "durable_answer"][-1]


def test_a_node_holds_a_detached_durable_then_drops_its_record_and_its_pattern():
    js = FakeJetStream()
    a, key = detached_durable(js)
    bp = a.broker.backplane
    assert asked(a, 1, removal.HOLD, key) == ("durable_answer", 1, True, False)
    a.connect(2, login="u")        # held: no client attaches while it is removed
    a.subscribe(2, "/topic/t", sub_id="d", durable="true", receipt="r")
    (error,) = a.frames(2)
    assert error.command == "ERROR" and error["message"] == "durable subscription being removed"
    bp.out.take()
    assert asked(a, 2, removal.DROP, key) == ("durable_answer", 2, True, False)
    assert key not in a.broker.durables and f"durable:{key}" not in a.broker.queues
    announced = [(kind, payload, aux) for kind, _, aux, _, payload in C.iter_records(bytes(bp.out.take()[0]))]
    assert (C.INTEREST, (DURABLE_MARK + "/topic/t").encode(), 0) in announced   # no node keeps /topic/t for it
    assert asked(a, 3, removal.DROP, key) == ("durable_answer", 3, False, False)   # (again: nothing to drop)
    asked(a, 4, removal.RELEASE, key)
    a.connect(3, login="u")
    a.subscribe(3, "/topic/t", sub_id="d", durable="true", receipt="r")
    js.run()
    assert [o.command for o in a.frames(3)] == ["RECEIPT"]   # afresh


def test_a_node_with_a_client_attached_says_so_and_keeps_it():
    js = FakeJetStream()
    a = js.join()
    a.connect(1, login="u")
    a.subscribe(1, "/topic/t", sub_id="d", durable="true")
    js.run()
    (key,) = a.broker.durables
    assert asked(a, 1, removal.HOLD, key) == ("durable_answer", 1, True, True)
    assert asked(a, 2, removal.DROP, key) == ("durable_answer", 2, True, True)
    assert a.broker.durables[key].sub is not None and not a.broker.backplane.queues.removing


def test_a_hold_ends_by_itself_after_cluster_timeout_ms():
    js = FakeJetStream()
    a, key = detached_durable(js)
    asked(a, 1, removal.HOLD, key)             # (the remover never said drop nor release)
    a.now += a.config.cluster_timeout_ms / 1000 + 0.1
    a.connect(2, login="u")
    a.subscribe(2, "/topic/t", sub_id="d", durable="true", receipt="r")
    js.run()
    assert [o.command for o in a.frames(2)] == ["RECEIPT"]


def test_the_removal_is_the_bridges_answer_and_unknown_is_none_as_on_one_node():
    js = FakeJetStream()
    a, key = detached_durable(js)
    cq = a.broker.backplane.queues
    later = a.broker.manage(manage.remove_durable, key, now=a.now)
    assert isinstance(later, Later) and later.outcome is None
    (command,) = [c for c in cq.commands() if c[0] == "forget"]
    token = command[1]
    assert command[2:4] == (key, "d_u%2Fd")
    cq.event(a.broker, ("forgotten", token, True, 4), None)
    assert later.outcome == (None, 4)
    unknown = a.broker.manage(manage.remove_durable, "u\x1fnone", now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "forget"]
    cq.event(a.broker, ("forgotten", command[1], False, 0), None)
    assert unknown.outcome == (None, None)
    refused = a.broker.manage(manage.remove_durable, key, now=a.now)
    (command,) = [c for c in cq.commands() if c[0] == "forget"]
    cq.event(a.broker, ("refused", command[1], 409, "attached on node n2"), None)
    assert refused.outcome == (409, "attached on node n2")


def test_holds_asked_for_are_bounded_however_many_keys_a_peer_names():
    from stompbroker.cluster.queuing import REMOVALS_HELD
    js = FakeJetStream()
    a, key = detached_durable(js)
    cq = a.broker.backplane.queues
    for i in range(3 * REMOVALS_HELD):
        cq.event(a.broker, ("durable_asked", i + 1, removal.HOLD, f"nobody\x1f{i}"), None)
    cq.out.clear()
    assert len(cq.removing) <= REMOVALS_HELD
    assert asked(a, 10**6, removal.HOLD, key) == ("durable_answer", 10**6, True, False)
    assert key in cq.removing and len(cq.removing) <= REMOVALS_HELD
