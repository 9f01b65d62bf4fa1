"""queues.hand_over: a message for a queue where nothing waits goes straight to the next consumer
with room that accepts it, as the pump would give it; anything else is left to the pump."""

from broker_harness import Rig

from stompbroker.broker import queues


def counting_pumps(monkeypatch):
    calls = []
    real = queues.pump
    monkeypatch.setattr(queues, "pump", lambda b, queue, room=False: calls.append(queue.name) or real(b, queue, room))
    return calls


def test_messages_to_a_queue_with_room_go_round_robin_without_the_pump(monkeypatch):
    rig = Rig()
    rig.connect(1)
    for conn in (2, 3, 4):
        rig.connect(conn)
        rig.subscribe(conn, "/queue/a")
    pumps = counting_pumps(monkeypatch)
    for i in range(6):
        rig.send(1, "/queue/a", str(i).encode())
    assert pumps == []
    assert [rig.bodies(conn) for conn in (2, 3, 4)] == [[b"0", b"3"], [b"1", b"4"], [b"2", b"5"]]
    assert rig.broker.stats["messages_delivered"] == 6 and rig.broker.queues["/queue/a"].depth() == 0


def test_a_full_or_choosy_consumer_is_passed_over_and_without_any_the_message_waits_for_the_pump(monkeypatch):
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/queue/a", ack="client-individual", prefetch_count="1")
    rig.connect(3)
    rig.subscribe(3, "/queue/a", selector="colour = 'red'")
    pumps = counting_pumps(monkeypatch)
    rig.send(1, "/queue/a", b"1")                 # to 2 (first with room)
    rig.send(1, "/queue/a", b"2")                 # 2 is full, 3 does not accept it: the pump blocks it
    rig.send(1, "/queue/a", b"3", colour="red")   # (a blocked message waits for room, not in line): to 3
    assert rig.bodies(2) == [b"1"] and rig.bodies(3) == [b"3"]
    assert pumps == ["/queue/a"]
    assert rig.broker.queues["/queue/a"].depth() == 1
    [message] = [o for o in rig.seen if o.command == "MESSAGE" and o.body == b"1"]
    rig.frame(2, "ACK", id=message["ack"])        # room again: the waiting one goes
    assert rig.bodies(2) == [b"2"]
