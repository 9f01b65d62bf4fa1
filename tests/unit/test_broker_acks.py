"""The pure broker's acknowledgements: ack modes, prefetch, ACK/NACK, redelivery, the dead-letter queue,
transactions, UNSUBSCRIBE and close returning unacked messages, writer confirmation of deliveries."""

from __future__ import annotations

import pytest

from broker_harness import Rig


def rig_with(n: int, ack: str, version: str = "1.2", prefetch: str | None = None, **settings) -> Rig:
    """Sender 1 puts ``n`` messages on /queue/q; consumer 2 subscribes with ``ack``."""
    rig = Rig(**settings)
    rig.connect(1)
    rig.connect(2, version=version)
    for i in range(n):
        rig.send(1, "/queue/q", body=str(i).encode())
    extra = {} if prefetch is None else {"prefetch_count": prefetch}
    rig.subscribe(2, "/queue/q", ack=ack, **extra)
    return rig


def unacked(rig: Rig, conn: int = 2) -> list[bytes]:
    """What ``conn`` holds unacknowledged, seen from outside: it goes, and the queue hands those back."""
    rig.broker.on_closed(conn)
    rig.take(conn)
    rig.connect(99)
    rig.subscribe(99, "/queue/q", sub_id="probe")
    return rig.bodies(99)


def depth(rig: Rig, name: str = "/queue/q") -> int:
    return sum(q["depth"] for q in rig.broker.queue_stats() if q["destination"] == name)


# -- ack modes and prefetch --------------------------------------------------------------------
def test_auto_ack_delivers_everything_without_ack_headers():
    rig = rig_with(5, "auto")
    got = rig.messages(2)
    assert [m.body for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert all("ack" not in m.headers for m in got)
    assert all(m.aux == 1 for m in got)   # marked: the writer confirms each when sent


def test_client_ack_respects_client_prefetch_by_default():
    rig = rig_with(5, "client", client_prefetch=2)
    assert rig.bodies(2) == [b"0", b"1"]


def test_prefetch_count_limits_unacked_deliveries_and_ack_gives_room():
    rig = rig_with(5, "client-individual", prefetch="2")
    first = rig.messages(2)
    assert [m.body for m in first] == [b"0", b"1"]
    rig.frame(2, "ACK", id=first[1]["ack"])
    assert rig.bodies(2) == [b"2"]


def test_prefetch_zero_means_no_limit():
    rig = rig_with(5, "client", prefetch="0")
    assert len(rig.bodies(2)) == 5


def test_activemq_prefetch_size_header():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    for i in range(3):
        rig.send(1, "/queue/q")
    rig.subscribe(2, "/queue/q", ack="client", **{"activemq.prefetchSize": "1"})
    assert len(rig.bodies(2)) == 1


def test_client_ack_is_cumulative():
    rig = rig_with(4, "client", prefetch="0")
    got = rig.messages(2)
    rig.frame(2, "ACK", id=got[2]["ack"], receipt="r")
    assert rig.commands(2) == ["RECEIPT"]
    assert unacked(rig) == [b"3"]


def test_client_individual_ack_is_one_message():
    rig = rig_with(3, "client-individual", prefetch="0")
    got = rig.messages(2)
    rig.frame(2, "ACK", id=got[1]["ack"])
    assert unacked(rig) == [b"0", b"2"]


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_before_1_2_ack_names_the_message_id(version):
    rig = rig_with(2, "client-individual", version=version, prefetch="0")
    got = rig.messages(2)
    rig.frame(2, "ACK", {"message-id": got[0]["message-id"], "subscription": "s", "receipt": "r"})
    assert rig.commands(2) == ["RECEIPT"]


def test_ack_by_message_id_works_in_1_2_too():
    rig = rig_with(1, "client-individual")
    (message,) = rig.messages(2)
    rig.frame(2, "ACK", id=message["message-id"], receipt="r")
    assert rig.commands(2) == ["RECEIPT"]


def test_ack_of_an_unknown_id_is_an_error_naming_it():
    rig = rig_with(1, "client")
    rig.take(2)
    rig.frame(2, "ACK", id="nope", receipt="r")
    error = rig.error(2)
    assert error["message"] == "ACK of unknown id nope" and error["receipt-id"] == "r"


def test_ack_twice_is_an_error():
    rig = rig_with(1, "client")
    (message,) = rig.messages(2)
    rig.frame(2, "ACK", id=message["ack"])
    rig.frame(2, "ACK", id=message["ack"])
    assert rig.error(2)["message"].startswith("ACK of unknown id")


def test_ack_without_id_is_an_error():
    rig = rig_with(1, "client")
    rig.frame(2, "ACK", receipt="r")
    assert rig.error(2)["message"] == "missing id"


def test_another_connections_ack_id_is_unknown():
    rig = rig_with(1, "client")
    (message,) = rig.messages(2)
    rig.frame(1, "ACK", id=message["ack"])
    assert rig.error(1)["message"].startswith("ACK of unknown id")


# -- NACK, redelivery, dead letters ------------------------------------------------------------
def test_nack_redelivers_to_another_consumer_first():
    rig = rig_with(1, "client-individual")
    (message,) = rig.messages(2)
    rig.connect(3)
    rig.subscribe(3, "/queue/q", ack="client-individual")
    rig.frame(2, "NACK", id=message["ack"])
    (again,) = rig.messages(3)
    assert again.body == b"0" and again["redelivered"] == "true"
    assert rig.take(2) == []


def test_nack_redelivers_to_the_only_consumer():
    rig = rig_with(1, "client-individual")
    (message,) = rig.messages(2)
    rig.frame(2, "NACK", id=message["ack"])
    (again,) = rig.messages(2)
    assert again.body == b"0" and again["redelivered"] == "true" and again["ack"] != message["ack"]


def test_after_max_redeliveries_a_message_goes_to_the_dead_letter_queue():
    rig = rig_with(1, "client-individual", max_redeliveries=2)
    for _ in range(3):
        (message,) = rig.messages(2)
        rig.frame(2, "NACK", id=message["ack"])
    assert rig.take(2) == []
    rig.connect(3)
    rig.subscribe(3, "/queue/DLQ")
    (dead,) = rig.messages(3)
    assert dead.body == b"0" and dead["original-destination"] == "/queue/q"
    assert dead["dead-letter-reason"] == "rejected 3 times"
    assert rig.broker.stats["dead_lettered"] == 1


def test_nack_on_the_dead_letter_queue_drops_the_message():
    rig = Rig(max_redeliveries=0)
    rig.connect(1)
    rig.send(1, "/queue/DLQ", body=b"d")
    rig.subscribe(1, "/queue/DLQ", ack="client-individual")
    (message,) = rig.messages(1)
    rig.frame(1, "NACK", id=message["ack"])
    assert rig.take(1) == [] and rig.broker.stats["messages_dropped"] == 1


def test_a_nacked_topic_message_comes_back_to_its_subscriber():
    rig = Rig()
    rig.connect(1)
    rig.subscribe(1, "/topic/t", ack="client")
    rig.send(1, "/topic/t", body=b"t")
    (message,) = rig.messages(1)
    rig.frame(1, "NACK", id=message["ack"])
    (again,) = rig.messages(1)
    assert again.body == b"t" and again["redelivered"] == "true"


def test_nack_of_an_unknown_id_is_an_error():
    rig = rig_with(0, "client")
    rig.frame(2, "NACK", id="x", receipt="r")
    error = rig.error(2)
    assert error["message"] == "NACK of unknown id x" and error["receipt-id"] == "r"


# -- returning unacked messages ----------------------------------------------------------------
def test_unsubscribe_returns_unacked_messages_to_the_queue_head():
    rig = rig_with(3, "client", prefetch="2")
    assert rig.bodies(2) == [b"0", b"1"]
    rig.frame(2, "UNSUBSCRIBE", id="s")
    rig.connect(3)
    rig.subscribe(3, "/queue/q")
    got = rig.messages(3)
    assert [m.body for m in got] == [b"0", b"1", b"2"]
    assert [m.headers.get("redelivered") for m in got] == ["true", "true", None]


def test_closing_returns_unacked_messages():
    rig = rig_with(2, "client-individual")
    rig.take(2)
    rig.broker.on_closed(2)
    rig.connect(3)
    rig.subscribe(3, "/queue/q", ack="client")
    got = rig.messages(3)
    assert [m.body for m in got] == [b"0", b"1"] and all(m["redelivered"] == "true" for m in got)


def test_auto_ack_deliveries_the_writer_never_sent_go_back():
    rig = rig_with(3, "auto")
    assert len(rig.messages(2)) == 3
    rig.broker.on_written(2, 1)             # the writer sent the first one only
    rig.broker.on_closed(2)
    assert depth(rig) == 0   # until the writer's last count arrives
    rig.broker.on_written(2, 1, final=True)
    rig.connect(3)
    rig.subscribe(3, "/queue/q")
    got = rig.messages(3)
    assert [m.body for m in got] == [b"1", b"2"] and got[0]["redelivered"] == "true"


def test_unconfirmed_deliveries_go_back_after_the_shutdown_timeout():
    rig = rig_with(1, "auto", shutdown_timeout_ms=1000)
    rig.take(2)
    rig.broker.on_closed(2)
    assert rig.broker.needs_tick()
    rig.tick(2.5)
    assert depth(rig) == 0
    rig.tick(1)
    assert depth(rig) == 1


def test_a_writer_restart_returns_what_it_held():
    rig = rig_with(2, "auto")
    rig.take(2)
    rig.broker.on_closed(2)
    rig.broker.on_writer_restart(0)
    assert depth(rig) == 2


# -- transactions ------------------------------------------------------------------------------
def test_sends_in_a_transaction_wait_for_commit():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/t")
    rig.frame(1, "BEGIN", transaction="tx")
    rig.send(1, "/topic/t", body=b"a", transaction="tx", receipt="r")
    rig.send(1, "/topic/t", body=b"b", transaction="tx")
    assert rig.commands(1) == ["RECEIPT"] and rig.take(2) == []   # accepted now, applied at COMMIT
    rig.frame(1, "COMMIT", transaction="tx", receipt="c")
    assert rig.bodies(2) == [b"a", b"b"]
    (receipt,) = rig.frames(1)
    assert receipt["receipt-id"] == "c"


def test_abort_drops_the_transaction():
    rig = Rig()
    rig.connect(1)
    rig.subscribe(1, "/topic/t")
    rig.frame(1, "BEGIN", transaction="tx")
    rig.send(1, "/topic/t", transaction="tx")
    rig.frame(1, "ABORT", transaction="tx")
    assert rig.take(1) == []
    rig.frame(1, "COMMIT", transaction="tx", receipt="r")
    error = rig.error(1)
    assert error["message"] == "unknown transaction" and error["receipt-id"] == "r"


def test_ack_in_a_transaction_applies_at_commit():
    rig = rig_with(2, "client-individual")
    first, second = rig.messages(2)
    rig.frame(2, "BEGIN", transaction="tx")
    rig.frame(2, "ACK", id=first["ack"], transaction="tx", receipt="a")
    assert [o["receipt-id"] for o in rig.frames(2)] == ["a"]   # accepted now...
    rig.frame(2, "COMMIT", transaction="tx", receipt="c")
    assert [o["receipt-id"] for o in rig.frames(2)] == ["c"]   # not answered twice
    assert unacked(rig) == [b"1"]   # ...applied at COMMIT


def test_ack_in_a_transaction_waits_for_commit():
    rig = rig_with(2, "client-individual")
    first, second = rig.messages(2)
    rig.frame(2, "BEGIN", transaction="tx")
    rig.frame(2, "ACK", id=first["ack"], transaction="tx")
    assert unacked(rig) == [b"0", b"1"]   # never committed: both come back


def test_ack_in_an_aborted_transaction_leaves_the_message_unacked():
    rig = rig_with(1, "client-individual")
    (message,) = rig.messages(2)
    rig.frame(2, "BEGIN", transaction="tx")
    rig.frame(2, "NACK", id=message["ack"], transaction="tx")
    rig.frame(2, "ABORT", transaction="tx")
    rig.frame(2, "ACK", id=message["ack"], receipt="r")
    assert rig.commands(2) == ["RECEIPT"]


def test_a_transactional_ack_of_an_unknown_id_is_refused_at_once():
    rig = rig_with(0, "client")
    rig.frame(2, "BEGIN", transaction="tx")
    rig.frame(2, "ACK", id="nope", transaction="tx")
    assert rig.error(2)["message"] == "ACK of unknown id nope"


@pytest.mark.parametrize("frames,message", [
    ([("SEND", {"destination": "/queue/q", "transaction": "nope"})], "unknown transaction"),
    ([("BEGIN", {})], "missing transaction"),
    ([("COMMIT", {})], "missing transaction"),
    ([("BEGIN", {"transaction": "t"}), ("BEGIN", {"transaction": "t"})], "duplicate transaction"),
    ([("ABORT", {"transaction": "t"})], "unknown transaction"),
])
def test_transaction_refusals(frames, message):
    rig = Rig()
    rig.connect(1)
    for command, headers in frames:
        rig.frame(1, command, headers)
    assert rig.error(1)["message"] == message


def test_a_transaction_is_bounded():
    rig = Rig(max_transaction_frames=2)
    rig.connect(1)
    rig.frame(1, "BEGIN", transaction="t")
    for _ in range(3):
        rig.send(1, "/queue/q", transaction="t")
    assert rig.error(1)["message"] == "transaction too large"


def test_a_commit_that_would_overfill_a_queue_is_refused_whole():
    rig = Rig(max_queue_messages=3)
    rig.connect(1)
    rig.send(1, "/queue/q")
    rig.frame(1, "BEGIN", transaction="t")
    for _ in range(3):
        rig.send(1, "/queue/q", transaction="t")
    rig.frame(1, "COMMIT", transaction="t")
    assert rig.error(1)["message"] == "queue full"
    assert depth(rig) == 1


def test_open_transactions_are_dropped_at_disconnect():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/t")
    rig.frame(1, "BEGIN", transaction="t")
    rig.send(1, "/topic/t", transaction="t")
    rig.frame(1, "DISCONNECT")
    assert rig.take(2) == []
