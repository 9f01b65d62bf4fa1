"""Operators' actions (broker/manage.py) on a Broker driven directly: peek, purge, delete, move and
redrive, publish, close a connection, remove a durable subscription."""

from __future__ import annotations

import pytest

from stompbroker.broker import manage
from stompbroker.broker.selector import compile_selector

from broker_harness import Rig


def act(rig: Rig, action, *args):
    return rig.broker.manage(action, *args, now=rig.now)


def filled(n: int = 5, destination: str = "/queue/a", **settings) -> Rig:
    rig = Rig(**settings)
    rig.connect(1)
    for i in range(n):
        rig.send(1, destination, f"m{i}".encode(), k=str(i))
    rig.take(1)
    return rig


def test_peek_shows_waiting_messages_in_order_and_consumes_nothing():
    rig = filled(5)
    depth, messages = act(rig, manage.peek, "/queue/a", 1, 3)
    assert depth == 5 and [m.body for m in messages] == [b"m1", b"m2", b"m3"]
    assert act(rig, manage.peek, "/queue/none", 0, 3) == (0, [])
    rig.connect(2)
    rig.subscribe(2, "/queue/a")
    assert rig.bodies(2) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_purge_drops_waiting_messages_only_and_is_safe_to_repeat():
    rig = filled(5)
    rig.connect(2)
    rig.subscribe(2, "/queue/a", ack="client-individual", prefetch_count="2")
    first, second = rig.messages(2)
    assert (first.body, second.body) == (b"m0", b"m1")
    assert act(rig, manage.purge, "/queue/a") == 3
    assert act(rig, manage.purge, "/queue/a") == 0
    assert act(rig, manage.purge, "/queue/unknown") == 0
    rig.send(1, "/queue/a", b"after")
    rig.frame(2, "NACK", id=first["ack"])
    rig.frame(2, "ACK", id=second["ack"])
    # the NACKed message comes again, then the new one: purge left the delivered ones alone
    assert rig.bodies(2) == [b"m0", b"after"]


def test_delete_refuses_a_queue_in_use_and_forgets_an_idle_one():
    rig = filled(3)
    rig.connect(2)
    rig.subscribe(2, "/queue/b", ack="client")
    rig.send(1, "/queue/b", b"held")
    with pytest.raises(manage.Refused) as refused:
        act(rig, manage.delete, "/queue/b")
    assert refused.value.status == 409
    assert act(rig, manage.delete, "/queue/a") == 3
    assert "/queue/a" not in rig.broker.queues
    assert act(rig, manage.delete, "/queue/a") is None


def test_move_keeps_order_and_headers_adds_redriven_from_and_delivers_once():
    rig = filled(6)
    rig.connect(2)
    rig.subscribe(2, "/queue/b")
    moved = act(rig, manage.move, "/queue/a", "/queue/b", 3, compile_selector("k <> 1"))
    assert moved == (3, 3)
    got = rig.messages(2)
    assert [o.body for o in got] == [b"m0", b"m2", b"m3"]
    assert all(o["redriven-from"] == "/queue/a" and o["destination"] == "/queue/b" for o in got)
    assert [o["k"] for o in got] == ["0", "2", "3"]
    assert [m.body for m in act(rig, manage.peek, "/queue/a", 0, 10)[1]] == [b"m1", b"m4", b"m5"]
    assert act(rig, manage.move, "/queue/a", "/queue/b", None, None) == (3, 0)
    assert rig.bodies(2) == [b"m1", b"m4", b"m5"]
    assert "/queue/a" not in rig.broker.queues  # emptied and unsubscribed: forgotten


def test_move_to_a_topic_publishes_and_to_itself_or_a_wildcard_is_refused():
    rig = filled(2)
    rig.connect(2)
    rig.subscribe(2, "/topic/t")
    assert act(rig, manage.move, "/queue/a", "/topic/t", None, None) == (2, 0)
    assert rig.bodies(2) == [b"m0", b"m1"]
    for bad in ("/queue/a", "/queue/*", "/temp-queue/x", "/queue/monitor", "DIAG"):
        with pytest.raises(manage.Refused):
            act(rig, manage.move, "/queue/a", bad, None, None)


def test_move_takes_no_more_than_the_target_has_room_for():
    rig = filled(4, max_queue_messages=5)
    for i in range(3):
        rig.send(1, "/queue/b", b"b")
    assert act(rig, manage.move, "/queue/a", "/queue/b", None, None) == (2, 2)
    assert rig.broker.queues["/queue/b"].depth() == 5


def test_redrive_sends_dead_letters_to_their_original_destinations():
    rig = Rig(max_redeliveries=0)
    rig.connect(1)
    rig.subscribe(1, "/queue/a", sub_id="a", ack="client-individual")
    rig.subscribe(1, "/queue/b", sub_id="b", ack="client-individual")
    rig.send(1, "/queue/a", b"from-a")
    rig.send(1, "/queue/b", b"from-b")
    for out in rig.messages(1):
        rig.frame(1, "NACK", id=out["ack"])
    rig.take(1)
    dlq = rig.config.dead_letter_queue
    assert rig.broker.queues[dlq].depth() == 2
    rig.frame(1, "UNSUBSCRIBE", id="a")
    rig.frame(1, "UNSUBSCRIBE", id="b")
    rig.connect(2)
    rig.subscribe(2, "/queue/a", sub_id="a")
    rig.subscribe(2, "/queue/b", sub_id="b")
    assert act(rig, manage.move, dlq, None, None, None) == (2, 0)
    got = {o.body: o for o in rig.messages(2)}
    assert got[b"from-a"]["destination"] == "/queue/a" and got[b"from-b"]["destination"] == "/queue/b"
    assert got[b"from-a"]["redriven-from"] == dlq and got[b"from-a"]["original-destination"] == "/queue/a"


def test_publish_routes_like_a_send_and_refuses_what_a_send_could_not():
    rig = filled(0, max_queue_messages=1)
    rig.connect(2)
    rig.subscribe(2, "/topic/t")
    assert act(rig, manage.publish, "/topic/t", {"h": "v"}, b"hello") == 1
    (out,) = rig.messages(2)
    assert out.body == b"hello" and out["h"] == "v"
    act(rig, manage.publish, "/queue/full", {}, b"1")
    with pytest.raises(manage.Refused) as refused:
        act(rig, manage.publish, "/queue/full", {}, b"2")
    assert refused.value.status == 409
    with pytest.raises(manage.Refused):
        act(rig, manage.publish, "/topic/*", {}, b"x")


def test_close_connection_sends_an_error_with_the_reason():
    rig = filled(0)
    rig.connect(2)
    rig.subscribe(2, "/queue/q", ack="client-individual")
    rig.send(1, "/queue/q", b"held")
    assert rig.bodies(2) == [b"held"]
    assert act(rig, manage.close_connection, 2, "maintenance") is True
    error = rig.error(2)
    assert error["message"] == "closed by an operator" and error.body == b"maintenance"
    assert 2 not in rig.broker.sessions or rig.broker.sessions[2].closing
    assert rig.broker.queues["/queue/q"].depth() == 1  # its unacknowledged message went back
    assert act(rig, manage.close_connection, 99, "x") is False


def test_remove_durable_refuses_an_attached_one():
    rig = filled(0)
    rig.connect(2, client_id="c")
    rig.subscribe(2, "/topic/d", sub_id="d1", durable="true")
    (key,) = rig.broker.durables
    with pytest.raises(manage.Refused):
        act(rig, manage.remove_durable, key)
    rig.frame(2, "DISCONNECT")
    rig.send(1, "/topic/d", b"kept")
    assert act(rig, manage.remove_durable, key) == 1
    assert not rig.broker.durables and act(rig, manage.remove_durable, key) is None


def test_an_actions_http_answer_waits_for_the_store_to_commit_what_it_wrote(tmp_path):
    from stompbroker.broker.core import Broker
    from stompbroker.ipc import records as R
    from stompbroker.ipc.outbox import Outbox
    from stompbroker.settings import make_config
    from stompbroker.store.sqlite import Store

    config = make_config(store="sqlite", store_path=str(tmp_path / "s.db"))
    store = Store(config.store_path, 0.0, 0.0)
    box = Outbox(0)
    broker = Broker(config, [box], clock=lambda: 1.7e9)
    broker.recover(store, 1.0)
    broker.on_open(1, 0, "127.0.0.1:1", 1.0)
    broker.on_frame(1, b"CONNECT\naccept-version:1.2", b"", 1.0)
    for i in range(3):
        broker.on_frame(1, b"SEND\ndestination:/queue/a", b"m%d" % i, 1.0)
    store.submit()
    store.sync(5)
    broker.release(store.finished())
    box.take()

    def raw_answers() -> list[bytes]:
        buf, _ = box.take()
        return [bytes(p) for kind, conn, _, _, p in R.iter_records(bytes(buf)) if kind == R.RAW and conn == 2]

    broker.on_open(2, 0, "127.0.0.1:2", 1.0)
    broker.on_http(2)
    assert broker.manage(manage.move, "/queue/a", "/queue/b", None, None, now=1.0) == (3, 0)
    broker.answer_http(broker.sessions[2], b"HTTP/1.1 200 OK\r\n\r\n")
    assert raw_answers() == [] and broker.need_commit  # held: the move is not on disk yet
    store.submit()
    store.sync(5)
    broker.release(store.finished())
    assert raw_answers() == [b"HTTP/1.1 200 OK\r\n\r\n"]
    rows = store.db.execute("SELECT queue, count(*) FROM messages GROUP BY queue").fetchall()
    assert rows == [("/queue/b", 3)]
    store.close(5)

    broker.on_open(3, 0, "127.0.0.1:3", 1.0)  # an action that writes nothing is answered at once
    broker.on_http(3)
    broker.manage(manage.purge, "/queue/none", now=1.0)
    broker.answer_http(broker.sessions[3], b"HTTP/1.1 200 OK\r\n\r\n")
    buf, _ = box.take()
    assert [kind for kind, conn, *_ in R.iter_records(bytes(buf)) if conn == 3][0] == R.RAW
