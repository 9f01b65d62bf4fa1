"""Messaging semantics against the running broker: queues, acks, transactions, wildcards,
round-robin, the TTL stale queue, expiry, filters and selectors."""

from __future__ import annotations

import time

import pytest

from stompwire import Wire, subscribe
from stompwire import connected as wire


def send(w: Wire, dest: str, body: bytes | str = b"", receipt: str | None = None, **headers) -> None:
    h = {"destination": dest, **headers}
    if receipt:
        h["receipt"] = receipt
    w.frame("SEND", h, body.encode() if isinstance(body, str) else body)
    if receipt:
        assert w.read()[:2] == ("RECEIPT", {"receipt-id": receipt})


def sync(w: Wire, tag: str = "sync") -> None:
    """A receipt round trip: everything this connection sent before has been processed."""
    w.frame("SEND", {"destination": "/topic/__sync", "receipt": tag})
    frame = w.read()
    assert frame[:2] == ("RECEIPT", {"receipt-id": tag}), frame


def messages(w: Wire, n: int, timeout: float = 10) -> list:
    out = []
    for _ in range(n):
        frame = w.read(timeout)
        assert frame[0] == "MESSAGE", frame
        out.append(frame)
    return out


def nothing_more(w: Wire, within: float = 0.3) -> None:
    with pytest.raises(TimeoutError):
        w.read(within)


# -- queues ----------------------------------------------------------------------------------------

def test_queue_keeps_messages_until_a_subscriber_comes(broker):
    pub = wire(broker)
    for i in range(5):
        send(pub, "/queue/kept", str(i))
    sync(pub)
    sub = wire(broker)
    subscribe(sub, "/queue/kept")
    assert [m[2] for m in messages(sub, 5)] == [b"0", b"1", b"2", b"3", b"4"]


def test_three_competing_consumers_share_and_each_message_arrives_once(broker):
    consumers = [wire(broker) for _ in range(3)]
    for c in consumers:
        subscribe(c, "/queue/work")
    pub = wire(broker)
    n = 300
    for i in range(n):
        send(pub, "/queue/work", str(i))
    sync(pub)
    got = []
    shares = []
    for c in consumers:
        part = []
        while True:
            try:
                part.append(c.read(1.0)[2])
            except TimeoutError:
                break
        shares.append(len(part))
        got += part
    assert sorted(got, key=int) == [str(i).encode() for i in range(n)]
    assert all(share >= n // 6 for share in shares), shares


def test_queue_limit_refuses_send(start_broker):
    b = start_broker("max_queue_messages=3")
    pub = wire(b)
    for i in range(3):
        send(pub, "/queue/small", str(i), receipt=f"r{i}")
    pub.frame("SEND", {"destination": "/queue/small", "receipt": "over"}, b"x")
    cmd, headers, _ = pub.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "queue full", "over")


def test_worker_queue_hash_round_robin(broker):
    workers = [wire(broker) for _ in range(3)]
    for w in workers:
        subscribe(w, "#jobs/1")
    pub = wire(broker)
    for i in range(30):
        send(pub, "#jobs/1", str(i))
    sync(pub)
    counts = [len(messages(w, 10)) for w in workers]
    assert counts == [10, 10, 10]
    for w in workers:
        nothing_more(w, 0.2)


def test_wildcard_subscription_prefix(broker):
    w = wire(broker)
    subscribe(w, "/topic/wild.*", "a")
    subscribe(w, "*", "all")
    pub = wire(broker)
    send(pub, "/topic/wild.x.y", "1")
    send(pub, "/topic/tame", "2")
    sync(pub)
    got = sorted((m[1]["subscription"], m[2]) for m in messages(w, 3))
    assert got == [("a", b"1"), ("all", b"1"), ("all", b"2")]


def test_10000_wildcard_subscriptions_route_exactly(start_broker):
    # (that matching does not scan every subscription is shown in tests/unit/test_subscriptions.py)
    b = start_broker("max_subscriptions=20000")
    w = wire(b)
    data = b"".join(b"SUBSCRIBE\nid:%d\ndestination:/topic/many/%d/*\n\n\0" % (i, i) for i in range(10_000))
    w.send(data)
    sync(w)
    pub = wire(b)
    for i in range(0, 10_000, 5):
        send(pub, f"/topic/many/{i}/x", str(i))
    sync(pub)
    got = messages(w, 2000, timeout=20)
    assert [(m[1]["subscription"], m[2]) for m in got] == [(str(i), str(i).encode()) for i in range(0, 10_000, 5)]


# -- acknowledgement -------------------------------------------------------------------------------

def test_client_individual_ack_and_message_ack_header(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/ack1", ack="client-individual")
    pub = wire(broker)
    send(pub, "/queue/ack1", "a")
    send(pub, "/queue/ack1", "b")
    first, second = messages(sub, 2)
    assert first[1]["ack"] and first[1]["message-id"]
    sub.frame("ACK", {"id": second[1]["ack"], "receipt": "acked"})
    assert sub.read()[0] == "RECEIPT"
    sub.close()  # "a" was never acked: it goes back to the queue
    again = wire(broker)
    subscribe(again, "/queue/ack1")
    (m,) = messages(again, 1)
    assert m[2] == b"a" and m[1]["redelivered"] == "true"
    nothing_more(again)


def test_client_ack_is_cumulative(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/cumul", ack="client")
    pub = wire(broker)
    for i in range(5):
        send(pub, "/queue/cumul", str(i))
    got = messages(sub, 5)
    sub.frame("ACK", {"id": got[3][1]["ack"], "receipt": "r"})
    sub.read()
    sub.frame("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    sub.read()
    again = wire(broker)
    subscribe(again, "/queue/cumul")
    (m,) = messages(again, 1)
    assert m[2] == b"4"
    nothing_more(again)


def test_disconnected_client_ack_subscriber_unacked_go_to_another(broker):
    a, b = wire(broker), wire(broker)
    subscribe(a, "/queue/handover", ack="client", **{"prefetch-count": "2"})
    pub = wire(broker)
    for i in range(2):
        send(pub, "/queue/handover", str(i))
    sync(pub)
    assert [m[2] for m in messages(a, 2)] == [b"0", b"1"]
    subscribe(b, "/queue/handover", ack="client")
    nothing_more(b)  # a holds them, unacknowledged
    a.close()
    got = messages(b, 2)
    assert [m[2] for m in got] == [b"0", b"1"]
    assert all(m[1]["redelivered"] == "true" for m in got)


def test_prefetch_limits_unacked_and_ack_releases_more(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/prefetch", ack="client-individual", **{"prefetch-count": "2"})
    pub = wire(broker)
    for i in range(5):
        send(pub, "/queue/prefetch", str(i))
    sync(pub)
    first = messages(sub, 2)
    nothing_more(sub)
    sub.frame("ACK", {"id": first[0][1]["ack"]})
    assert messages(sub, 1)[0][2] == b"2"
    nothing_more(sub)


def test_activemq_prefetch_header_accepted(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/amq", ack="client", **{"activemq.prefetchSize": "1"})
    pub = wire(broker)
    send(pub, "/queue/amq", "x")
    send(pub, "/queue/amq", "y")
    sync(pub)
    messages(sub, 1)
    nothing_more(sub)


def test_nack_redelivers_to_another_subscriber(broker):
    a = wire(broker)
    subscribe(a, "/queue/nack", ack="client-individual")
    pub = wire(broker)
    send(pub, "/queue/nack", "n", receipt="r")
    (m,) = messages(a, 1)
    b = wire(broker)
    subscribe(b, "/queue/nack", ack="client-individual")
    a.frame("NACK", {"id": m[1]["ack"]})
    (again,) = messages(b, 1)
    assert again[2] == b"n" and again[1]["redelivered"] == "true"


def test_nack_to_dlq_after_max_redeliveries(start_broker):
    b = start_broker("max_redeliveries=2")
    sub = wire(b)
    subscribe(sub, "/queue/poison", ack="client-individual")
    pub = wire(b)
    send(pub, "/queue/poison", "bad", receipt="r")
    for attempt in range(3):
        (m,) = messages(sub, 1)
        sub.frame("NACK", {"id": m[1]["ack"]})
    nothing_more(sub)
    dlq = wire(b)
    subscribe(dlq, "/queue/DLQ")
    (dead,) = messages(dlq, 1)
    assert dead[2] == b"bad"
    assert dead[1]["original-destination"] == "/queue/poison"


def test_ack_by_message_id_and_subscription_in_1_1(broker):
    sub = wire(broker, "1.1")
    subscribe(sub, "/queue/eleven", ack="client-individual")
    pub = wire(broker)
    send(pub, "/queue/eleven", "x")
    (m,) = messages(sub, 1)
    sub.frame("ACK", {"message-id": m[1]["message-id"], "subscription": "s", "receipt": "a"})
    assert sub.read()[0] == "RECEIPT"
    sub.close()
    again = wire(broker)
    subscribe(again, "/queue/eleven")
    nothing_more(again)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_ack_and_nack_by_message_id_whatever_the_subscription_header(broker, version):
    """RabbitMQ's own tests NACK with a message-id and another subscription's id: the message id
    alone, within the connection, says which delivery is meant."""
    sub = wire(broker, version)
    subscribe(sub, f"/queue/byid{version}", "s", ack="client-individual")
    subscribe(sub, "/topic/byid-other", "other", ack="client-individual")
    pub = wire(broker)
    send(pub, f"/queue/byid{version}", "nacked", receipt="r1")
    (m,) = messages(sub, 1)
    sub.frame("NACK", {"message-id": m[1]["message-id"], "subscription": "other", "receipt": "n"})
    again = [sub.read(), sub.read()]  # the redelivery and the RECEIPT
    assert ("RECEIPT", {"receipt-id": "n"}) in [f[:2] for f in again]
    (m,) = [f for f in again if f[0] == "MESSAGE"]
    assert m[2] == b"nacked" and m[1]["redelivered"] == "true"
    sub.frame("ACK", {"message-id": m[1]["message-id"], "subscription": "no-such-sub", "receipt": "a"})
    assert sub.read()[:2] == ("RECEIPT", {"receipt-id": "a"})
    sub.close()
    after = wire(broker)
    subscribe(after, f"/queue/byid{version}")
    nothing_more(after)  # acknowledged: not redelivered


@pytest.mark.parametrize("version,command,headers", [
    ("1.2", "ACK", {"id": "never-delivered"}),
    ("1.2", "NACK", {"id": "never-delivered", "subscription": "s"}),
    ("1.1", "ACK", {"message-id": "never-delivered", "subscription": "s"}),
    ("1.0", "NACK", {"message-id": "never-delivered"}),
])
def test_ack_or_nack_of_an_id_not_held_is_an_error_naming_it(broker, version, command, headers):
    w = wire(broker, version)
    subscribe(w, "/queue/notheld", ack="client")
    w.frame(command, {**headers, "receipt": "r"})
    frame = w.read()
    assert frame[0] == "ERROR" and frame[1]["receipt-id"] == "r", frame
    assert "never-delivered" in frame[1]["message"], frame
    w.expect_closed()


def test_ack_of_an_id_already_acknowledged_is_an_error(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/twice", ack="client-individual")
    pub = wire(broker)
    send(pub, "/queue/twice", "x", receipt="r")
    (m,) = messages(sub, 1)
    sub.frame("ACK", {"id": m[1]["ack"], "receipt": "first"})
    assert sub.read()[:2] == ("RECEIPT", {"receipt-id": "first"})
    sub.frame("ACK", {"id": m[1]["ack"], "receipt": "second"})
    frame = sub.read()
    assert frame[0] == "ERROR" and frame[1]["receipt-id"] == "second" and m[1]["ack"] in frame[1]["message"]


def test_transactional_ack_of_an_id_not_held_is_refused_when_held(broker):
    w = wire(broker)
    subscribe(w, "/queue/txnotheld", ack="client")
    w.frame("BEGIN", {"transaction": "t"})
    w.frame("ACK", {"id": "never-delivered", "transaction": "t", "receipt": "r"})
    frame = w.read()
    assert frame[0] == "ERROR" and frame[1]["receipt-id"] == "r" and "never-delivered" in frame[1]["message"]


def test_commit_of_acks_that_a_cumulative_ack_settled_first(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/txcumul", ack="client")
    pub = wire(broker)
    for i in range(3):
        send(pub, "/queue/txcumul", str(i))
    got = messages(sub, 3)
    sub.frame("BEGIN", {"transaction": "t"})
    sub.frame("ACK", {"id": got[2][1]["ack"], "transaction": "t"})  # settles all three
    sub.frame("ACK", {"id": got[0][1]["ack"], "transaction": "t"})  # held while it was still pending
    sub.frame("COMMIT", {"transaction": "t", "receipt": "c"})
    assert sub.read()[:2] == ("RECEIPT", {"receipt-id": "c"})
    sub.close()
    again = wire(broker)
    subscribe(again, "/queue/txcumul")
    nothing_more(again)


# -- transactions ----------------------------------------------------------------------------------

def test_transaction_invisible_until_commit(broker):
    sub = wire(broker)
    subscribe(sub, "/topic/tx")
    pub = wire(broker)
    pub.frame("BEGIN", {"transaction": "t1"})
    send(pub, "/topic/tx", "one", receipt="r1", transaction="t1")  # receipt when accepted
    send(pub, "/topic/tx", "two", transaction="t1")
    nothing_more(sub)
    pub.frame("COMMIT", {"transaction": "t1", "receipt": "c"})
    assert pub.read()[:2] == ("RECEIPT", {"receipt-id": "c"})
    got = messages(sub, 2)
    assert [m[2] for m in got] == [b"one", b"two"]
    assert all("transaction" not in m[1] for m in got)


def test_abort_discards(broker):
    sub = wire(broker)
    subscribe(sub, "/topic/abort")
    pub = wire(broker)
    pub.frame("BEGIN", {"transaction": "t"})
    send(pub, "/topic/abort", "gone", transaction="t")
    pub.frame("ABORT", {"transaction": "t", "receipt": "a"})
    assert pub.read()[0] == "RECEIPT"
    nothing_more(sub)


def test_transaction_discarded_on_disconnect(broker):
    sub = wire(broker)
    subscribe(sub, "/topic/txdrop")
    pub = wire(broker)
    pub.frame("BEGIN", {"transaction": "t"})
    send(pub, "/topic/txdrop", "gone", transaction="t", receipt="held")
    pub.frame("DISCONNECT", {"receipt": "bye"})
    pub.read()
    nothing_more(sub)


def test_transactional_ack(broker):
    sub = wire(broker)
    subscribe(sub, "/queue/txack", ack="client-individual")
    pub = wire(broker)
    send(pub, "/queue/txack", "x", receipt="r")
    (m,) = messages(sub, 1)
    sub.frame("BEGIN", {"transaction": "a"})
    sub.frame("ACK", {"id": m[1]["ack"], "transaction": "a"})
    sub.frame("ABORT", {"transaction": "a", "receipt": "ab"})
    sub.read()
    sub.close()  # the ACK was aborted: the message is redelivered
    again = wire(broker)
    subscribe(again, "/queue/txack")
    assert messages(again, 1)[0][2] == b"x"


@pytest.mark.parametrize("frames,message", [
    ([("COMMIT", {"transaction": "nope"})], "unknown transaction"),
    ([("ABORT", {"transaction": "nope"})], "unknown transaction"),
    ([("BEGIN", {"transaction": "d"}), ("BEGIN", {"transaction": "d"})], "duplicate transaction"),
    ([("SEND", {"destination": "/topic/x", "transaction": "never"})], "unknown transaction"),
    ([("BEGIN", {})], "missing transaction"),
])
def test_transaction_errors(broker, frames, message):
    w = wire(broker)
    for command, headers in frames[:-1]:
        w.frame(command, headers)
    command, headers = frames[-1]
    w.frame(command, {**headers, "receipt": "x"})
    cmd, h, _ = w.read()
    assert (cmd, h["message"], h["receipt-id"]) == ("ERROR", message, "x")


# -- TTL stale queue -------------------------------------------------------------------------------

def test_late_subscriber_gets_stale_messages_once_in_order(start_broker):
    b = start_broker("TTL=5000")
    pub = wire(b)
    for i in range(100):
        send(pub, "/topic/late", str(i))
    sync(pub)
    first = wire(b)
    subscribe(first, "/topic/late")
    assert [m[2] for m in messages(first, 100)] == [str(i).encode() for i in range(100)]
    second = wire(b)
    subscribe(second, "/topic/late")
    nothing_more(second)


def test_stale_messages_match_wildcards(start_broker):
    b = start_broker("TTL=5000")
    pub = wire(b)
    send(pub, "/topic/stale/a", "a")
    send(pub, "/topic/stale/b", "b")
    send(pub, "/topic/other", "o")
    sync(pub)
    sub = wire(b)
    subscribe(sub, "/topic/stale/*")
    assert [m[2] for m in messages(sub, 2)] == [b"a", b"b"]
    nothing_more(sub)


def test_stale_messages_expire_after_ttl(start_broker):
    b = start_broker("TTL=300")
    pub = wire(b)
    send(pub, "/topic/old", "x", receipt="r")
    time.sleep(0.6)
    sub = wire(b)
    subscribe(sub, "/topic/old")
    nothing_more(sub)


def test_stale_queue_bound_drops_oldest(start_broker):
    b = start_broker("TTL=5000", "max_stale_queue_size=3")
    pub = wire(b)
    for i in range(5):  # a receipt, not sync(): a sync message would take a place in the stale queue
        send(pub, "/topic/bounded", str(i), receipt="r" if i == 4 else None)
    sub = wire(b)
    subscribe(sub, "/topic/bounded")
    assert [m[2] for m in messages(sub, 3)] == [b"2", b"3", b"4"]


def test_without_ttl_unrouted_topic_messages_are_dropped(broker):
    pub = wire(broker)
    send(pub, "/topic/void", "x", receipt="r")
    sub = wire(broker)
    subscribe(sub, "/topic/void")
    nothing_more(sub)


# -- expiry ----------------------------------------------------------------------------------------

def test_expired_message_is_not_delivered_from_a_queue(broker):
    pub = wire(broker)
    send(pub, "/queue/exp", "old", expiration="100")
    send(pub, "/queue/exp", "dead", expires=str(int(time.time() * 1000) - 1000))
    send(pub, "/queue/exp", "fresh", expiration="60000")
    send(pub, "/queue/exp", "forever", expires="0", receipt="r")
    time.sleep(0.3)
    sub = wire(broker)
    subscribe(sub, "/queue/exp")
    assert [m[2] for m in messages(sub, 2)] == [b"fresh", b"forever"]
    nothing_more(sub)


def test_expired_message_is_not_delivered_from_the_stale_queue(start_broker):
    b = start_broker("TTL=5000")
    pub = wire(b)
    send(pub, "/topic/exp", "short", expiration="100")
    send(pub, "/topic/exp", "long", receipt="r")
    time.sleep(0.3)
    sub = wire(b)
    subscribe(sub, "/topic/exp")
    assert [m[2] for m in messages(sub, 1)] == [b"long"]
    nothing_more(sub)


def test_invalid_expiry_is_an_error(broker):
    w = wire(broker)
    w.frame("SEND", {"destination": "/queue/x", "expiration": "soon", "receipt": "e"})
    assert w.read()[1]["message"] == "invalid expiry"


# -- filters and selectors -------------------------------------------------------------------------

def test_xtomp_filter(broker):
    red, blue = wire(broker), wire(broker)
    subscribe(red, "/topic/cars", filter="colour=red")
    subscribe(blue, "/topic/cars", filter="colour=blue")
    pub = wire(broker)
    for i, colour in enumerate(["red", "blue", "red", "green"]):
        send(pub, "/topic/cars", str(i), colour=colour)
    sync(pub)
    assert [m[2] for m in messages(red, 2)] == [b"0", b"2"]
    assert [m[2] for m in messages(blue, 1)] == [b"1"]
    nothing_more(red)
    nothing_more(blue)


def test_selector(broker):
    big = wire(broker)
    subscribe(big, "/topic/orders", selector="type = 'order' AND price > 100")
    pub = wire(broker)
    send(pub, "/topic/orders", "a", type="order", price="150")
    send(pub, "/topic/orders", "b", type="order", price="50")
    send(pub, "/topic/orders", "c", type="quote", price="500")
    send(pub, "/topic/orders", "d", type="order")
    sync(pub)
    assert [m[2] for m in messages(big, 1)] == [b"a"]
    nothing_more(big)


def test_selector_on_queue_consumers(broker):
    eu, us = wire(broker), wire(broker)
    subscribe(eu, "/queue/regions", selector="region IN ('eu', 'uk')")
    subscribe(us, "/queue/regions", selector="region = 'us'")
    pub = wire(broker)
    for i, region in enumerate(["us", "eu", "uk", "us"]):
        send(pub, "/queue/regions", str(i), region=region)
    sync(pub)
    assert sorted(m[2] for m in messages(eu, 2)) == [b"1", b"2"]
    assert sorted(m[2] for m in messages(us, 2)) == [b"0", b"3"]


@pytest.mark.parametrize("headers,message", [
    ({"selector": "price >"}, "invalid selector"),
    ({"selector": "a = 'unterminated"}, "invalid selector"),
    ({"filter": "nonsense"}, "invalid filter"),
    ({"prefetch-count": "-1", "ack": "client"}, "invalid prefetch"),
])
def test_bad_subscription_options(broker, headers, message):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "x", "destination": "/topic/x", "receipt": "r", **headers})
    cmd, h, body = w.read()
    assert (cmd, h["message"], h["receipt-id"]) == ("ERROR", message, "r")
    assert body
