"""The pure broker's routing: topics, queues, `#` worker queues, wildcards, the TTL stale queue, expiry,
selectors and filters, temporary destinations, durable subscriptions."""

from __future__ import annotations

import pytest

from broker_harness import Rig


def two(**settings) -> Rig:
    """A rig with a sender (1) and a receiver (2), both connected."""
    rig = Rig(**settings)
    rig.connect(1)
    rig.connect(2)
    return rig


# -- SEND ------------------------------------------------------------------------------------------
def test_a_message_carries_its_headers_body_and_ids():
    rig = two()
    rig.subscribe(2, "/topic/t", sub_id="sub-1")
    rig.send(1, "/topic/t", body=b"hello\0world", color="red", receipt="r")
    (message,) = rig.messages(2)
    assert message.body == b"hello\0world" and message["content-length"] == "11"
    assert message["destination"] == "/topic/t" and message["subscription"] == "sub-1"
    assert message["color"] == "red" and message["message-id"]
    assert "receipt" not in message.headers   # a SEND's receipt is for the sender only
    assert rig.commands(1) == ["RECEIPT"]


def test_headers_are_escaped_for_1_1_and_up():
    rig = two()
    rig.subscribe(2, "/topic/t")
    rig.frame(1, "SEND", {"destination": "/topic/t", "note": "a\\cb\\nc"})  # a:b, newline, c
    (message,) = rig.frames(2)
    assert message.headers["note"] == "a\\cb\\nc"   # still escaped on the wire


@pytest.mark.parametrize("headers,message", [
    ({}, "missing destination"),
    ({"destination": "/topic/*"}, "wildcard destination"),
    ({"destination": "/queue/q", "expires": "soon"}, "invalid expiry"),
    ({"destination": "/queue/q", "expiration": "-5"}, "invalid expiry"),
])
def test_send_refusals(headers, message):
    rig = two()
    rig.frame(1, "SEND", {**headers, "receipt": "r"})
    error = rig.error(1)
    assert error["message"] == message and error["receipt-id"] == "r"


def test_a_topic_goes_to_every_subscriber_and_is_dropped_without_one():
    rig = two()
    rig.connect(3)
    rig.subscribe(2, "/topic/t")
    rig.subscribe(3, "/topic/t")
    rig.send(1, "/topic/nobody")
    rig.send(1, "/topic/t", body=b"a")
    assert rig.bodies(2) == [b"a"] and rig.bodies(3) == [b"a"]
    assert rig.broker.stats["messages_dropped"] == 1


def test_wildcards_match_by_prefix():
    rig = two()
    rig.connect(3)
    rig.subscribe(2, "/topic/a.*")
    rig.subscribe(3, "*")
    for name in ("/topic/a.b", "/topic/a.b.c", "/topic/b", "/queue/a.x"):
        rig.send(1, name, body=name.encode())
    assert rig.bodies(2) == [b"/topic/a.b", b"/topic/a.b.c"]
    assert rig.bodies(3) == [b"/topic/a.b", b"/topic/a.b.c", b"/topic/b", b"/queue/a.x"]


def test_a_queue_message_goes_to_one_subscriber_round_robin():
    rig = two()
    rig.connect(3)
    rig.subscribe(2, "/queue/q")
    rig.subscribe(3, "/queue/q")
    for i in range(4):
        rig.send(1, "/queue/q", body=str(i).encode())
    assert sorted(rig.bodies(2) + rig.bodies(3)) == [b"0", b"1", b"2", b"3"]
    rig.send(1, "/queue/q", body=b"4")
    rig.send(1, "/queue/q", body=b"5")
    assert len(rig.bodies(2)) == 1 and len(rig.bodies(3)) == 1


def test_a_queue_keeps_messages_until_someone_subscribes():
    rig = two()
    for i in range(3):
        rig.send(1, "/queue/q", body=str(i).encode())
    assert rig.broker.queue_stats()[0]["depth"] == 3
    rig.subscribe(2, "/queue/q")
    assert rig.bodies(2) == [b"0", b"1", b"2"]


def test_a_wildcard_subscription_drains_matching_queues():
    rig = two()
    rig.send(1, "/queue/jobs.a", body=b"a")
    rig.send(1, "/queue/jobs.b", body=b"b")
    rig.send(1, "/queue/other", body=b"o")
    rig.subscribe(2, "/queue/jobs.*")
    assert sorted(rig.bodies(2)) == [b"a", b"b"]


def test_a_full_queue_refuses_a_send():
    rig = two(max_queue_messages=2)
    rig.send(1, "/queue/q")
    rig.send(1, "/queue/q")
    rig.send(1, "/queue/q", receipt="r")
    error = rig.error(1)
    assert error["message"] == "queue full" and error["receipt-id"] == "r"


def test_worker_queue_round_robin_keeps_nothing():
    rig = two()
    rig.connect(3)
    rig.send(1, "#work", body=b"lost")           # nobody: not kept
    rig.subscribe(2, "#work")
    rig.subscribe(3, "#work")
    for i in range(4):
        rig.send(1, "#work", body=str(i).encode())
    assert rig.bodies(2) == [b"0", b"2"] and rig.bodies(3) == [b"1", b"3"]


def test_worker_queue_skips_full_consumers():
    rig = two()
    rig.connect(3)
    rig.subscribe(2, "#work", ack="client", prefetch_count="1")
    rig.subscribe(3, "#work")
    for i in range(3):
        rig.send(1, "#work", body=str(i).encode())
    assert rig.bodies(2) == [b"0"] and rig.bodies(3) == [b"1", b"2"]


# -- TTL stale queue and expiry ------------------------------------------------------------------
def test_ttl_keeps_unrouted_topic_messages_for_late_subscribers():
    rig = two(TTL=1000)
    rig.send(1, "/topic/a", body=b"early")
    rig.send(1, "/topic/b", body=b"other")
    rig.tick(0.5)
    rig.subscribe(2, "/topic/a")
    assert rig.bodies(2) == [b"early"]
    rig.subscribe(2, "/topic/*", sub_id="all")
    assert rig.bodies(2) == [b"other"]          # taken once: "early" went to the first one
    rig.connect(3)
    rig.subscribe(3, "/topic/a")
    assert rig.take(3) == []


def test_ttl_messages_expire():
    rig = two(TTL=1000)
    rig.send(1, "/topic/a", body=b"early")
    rig.tick(1.1)
    rig.subscribe(2, "/topic/a")
    assert rig.take(2) == []


def test_ttl_respects_the_late_subscribers_selector():
    rig = two(TTL=1000)
    rig.send(1, "/topic/a", body=b"no", kind="x")
    rig.send(1, "/topic/a", body=b"yes", kind="y")
    rig.subscribe(2, "/topic/a", selector="kind = 'y'")
    assert rig.bodies(2) == [b"yes"]


def test_without_ttl_nothing_is_kept_for_topics():
    rig = two()
    rig.send(1, "/topic/a")
    rig.subscribe(2, "/topic/a")
    assert rig.take(2) == []


def test_expired_queue_messages_are_not_delivered():
    rig = two()
    rig.send(1, "/queue/q", body=b"short", expiration="1000")
    rig.send(1, "/queue/q", body=b"absolute", expires=str(int((rig.wall + 1) * 1000)))
    rig.send(1, "/queue/q", body=b"long", expiration="60000")
    rig.send(1, "/queue/q", body=b"zero means never", expires="0")
    rig.send(1, "/queue/q", body=b"past", expires=str(int((rig.wall - 1) * 1000)))
    rig.tick(2)
    rig.subscribe(2, "/queue/q")
    assert rig.bodies(2) == [b"long", b"zero means never"]


# -- selectors and filters ---------------------------------------------------------------------
def test_selector_and_filter_choose_messages():
    rig = two()
    rig.connect(3)
    rig.subscribe(2, "/topic/t", selector="price > 10 AND kind LIKE 'bo%'")
    rig.subscribe(3, "/topic/t", filter="kind=book")
    rig.send(1, "/topic/t", body=b"1", price="20", kind="book")
    rig.send(1, "/topic/t", body=b"2", price="5", kind="book")
    rig.send(1, "/topic/t", body=b"3", price="50", kind="box")
    rig.send(1, "/topic/t", body=b"4", price="50", kind="pen")
    assert rig.bodies(2) == [b"1", b"3"]
    assert rig.bodies(3) == [b"1", b"2"]


def test_selector_and_filter_together_both_apply():
    rig = two()
    rig.subscribe(2, "/topic/t", selector="n > 1", filter="kind=a")
    rig.send(1, "/topic/t", body=b"1", n="2", kind="a")
    rig.send(1, "/topic/t", body=b"2", n="2", kind="b")
    rig.send(1, "/topic/t", body=b"3", n="0", kind="a")
    assert rig.bodies(2) == [b"1"]


def test_a_queue_message_waits_for_a_consumer_whose_selector_takes_it():
    rig = two()
    rig.subscribe(2, "/queue/q", selector="kind = 'a'")
    rig.send(1, "/queue/q", body=b"for b", kind="b")
    rig.send(1, "/queue/q", body=b"for a", kind="a")
    assert rig.bodies(2) == [b"for a"]
    rig.connect(3)
    rig.subscribe(3, "/queue/q", selector="kind = 'b'")
    assert rig.bodies(3) == [b"for b"]


@pytest.mark.parametrize("headers,message", [
    ({"selector": "a = = 1"}, "invalid selector"),
    ({"filter": "novalue"}, "invalid filter"),
    ({"filter": "=x"}, "invalid filter"),
])
def test_bad_selectors_are_refused_at_subscribe(headers, message):
    rig = two()
    rig.frame(2, "SUBSCRIBE", {"destination": "/topic/t", "id": "s", "receipt": "r", **headers})
    error = rig.error(2)
    assert error["message"] == message and error["receipt-id"] == "r"


# -- SUBSCRIBE refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("headers,message", [
    ({"id": "s"}, "missing destination"),
    ({"destination": "/topic/t"}, "missing id"),
    ({"destination": "/topic/t", "id": "s", "ack": "sometimes"}, "invalid ack mode"),
    ({"destination": "/topic/t", "id": "s", "prefetch-count": "-1"}, "invalid prefetch"),
    ({"destination": "/reply-queue/x", "id": "s"}, "permission denied for /reply-queue/x"),
])
def test_subscribe_refusals(headers, message):
    rig = two()
    rig.frame(2, "SUBSCRIBE", {**headers, "receipt": "r"})
    error = rig.error(2)
    assert error["message"] == message and error["receipt-id"] == "r"


def test_a_duplicate_subscription_id_is_refused():
    rig = two()
    rig.subscribe(2, "/topic/t")
    rig.subscribe(2, "/topic/u")
    assert rig.error(2)["message"] == "duplicate subscription"


def test_too_many_subscriptions_are_refused():
    rig = two(max_subscriptions=2)
    rig.subscribe(2, "/topic/a", sub_id="1")
    rig.subscribe(2, "/topic/b", sub_id="2")
    rig.subscribe(2, "/topic/c", sub_id="3")
    assert rig.error(2)["message"] == "too many subscriptions"


def test_stomp_1_0_subscription_without_id_and_unsubscribe_by_destination():
    rig = Rig()
    rig.connect(1)
    rig.connect(2, version="1.0")
    rig.frame(2, "SUBSCRIBE", destination="/topic/t")
    rig.send(1, "/topic/t", body=b"a")
    (message,) = rig.messages(2)
    assert message["subscription"] == "/topic/t"
    rig.frame(2, "UNSUBSCRIBE", destination="/topic/t", receipt="u")
    assert rig.commands(2) == ["RECEIPT"]
    rig.send(1, "/topic/t")
    assert rig.take(2) == []


def test_unsubscribe_stops_deliveries():
    rig = two()
    rig.subscribe(2, "/topic/t")
    rig.frame(2, "UNSUBSCRIBE", id="s")
    rig.send(1, "/topic/t")
    assert rig.take(2) == []
    rig.frame(2, "UNSUBSCRIBE", receipt="r")   # 1.2 needs the id
    assert rig.error(2)["message"] == "missing id"


# -- temporary destinations ------------------------------------------------------------------------
def test_reply_to_a_temp_queue_is_rewritten_and_answered():
    rig = two()
    rig.subscribe(2, "/queue/service")
    rig.send(1, "/queue/service", body=b"question", reply_to="/temp-queue/answers")
    (request,) = rig.messages(2)
    reply_to = request["reply-to"]
    assert reply_to.startswith("/reply-queue/")
    rig.send(2, reply_to, body=b"answer")
    (answer,) = rig.messages(1)
    assert answer.body == b"answer" and answer["destination"] == "/temp-queue/answers"
    assert answer["subscription"] == "/temp-queue/answers"


def test_a_temp_queue_keeps_replies_until_its_owner_subscribes():
    rig = two()
    rig.subscribe(2, "/queue/service")
    rig.send(1, "/queue/service", reply_to="/temp-queue/a")
    reply_to = rig.messages(2)[0]["reply-to"]
    rig.subscribe(1, "/temp-queue/a", sub_id="mine", ack="client")   # the broker's own one gives way
    rig.send(2, reply_to, body=b"r")
    (answer,) = rig.messages(1)
    assert answer["subscription"] == "mine" and "ack" in answer.headers
    rig.subscribe(1, "/temp-queue/a", sub_id="again")
    assert rig.error(1)["message"] == "already subscribed"


def test_temporary_destinations_vanish_with_their_connection():
    rig = two()
    rig.subscribe(2, "/queue/service")
    rig.send(1, "/queue/service", reply_to="/temp-topic/t")
    reply_to = rig.messages(2)[0]["reply-to"]
    assert reply_to.startswith("/reply-topic/")
    rig.broker.on_closed(1)
    dropped = rig.broker.stats["messages_dropped"]
    rig.send(2, reply_to, receipt="r")
    assert rig.commands(2) == ["RECEIPT"] and rig.broker.stats["messages_dropped"] == dropped + 1


def test_a_temp_destination_cannot_be_a_wildcard():
    rig = two()
    rig.send(1, "/queue/x", reply_to="/temp-queue/*")
    assert rig.error(1)["message"] == "wildcard destination"


def test_temp_names_are_private_to_each_connection():
    rig = two()
    rig.subscribe(2, "/temp-queue/same", sub_id="t")
    rig.subscribe(1, "/queue/service")
    rig.send(2, "/queue/service", reply_to="/temp-queue/same")
    reply_to = rig.messages(1)[0]["reply-to"]
    rig.send(1, "/temp-queue/same", body=b"own")   # 1's own temp queue, not 2's
    rig.send(1, reply_to, body=b"to 2")
    assert rig.bodies(2) == [b"to 2"]


# -- durable subscriptions ---------------------------------------------------------------------
def test_a_durable_subscription_keeps_messages_while_its_client_is_away():
    rig = two()
    rig.connect(3, client_id="c1")
    rig.subscribe(3, "/topic/news", sub_id="d", **{"activemq.subscriptionName": "n"})
    rig.send(1, "/topic/news", body=b"live")
    assert rig.bodies(3) == [b"live"]
    rig.broker.on_closed(3)
    rig.send(1, "/topic/news", body=b"while away")
    rig.connect(4, client_id="c1")
    rig.subscribe(4, "/topic/news", sub_id="d", **{"activemq.subscriptionName": "n"})
    assert rig.bodies(4) == [b"while away"]


def test_rabbitmq_durable_header_and_explicit_unsubscribe_ends_it():
    rig = two()
    rig.subscribe(2, "/topic/news", sub_id="keep", durable="true")
    rig.frame(2, "UNSUBSCRIBE", id="keep")
    rig.send(1, "/topic/news", body=b"after")
    rig.subscribe(2, "/topic/news", sub_id="keep", durable="true")
    assert rig.take(2) == []   # a new, empty durable subscription
    rig.broker.on_closed(2)
    rig.send(1, "/topic/news", body=b"kept")
    rig.connect(3)
    rig.subscribe(3, "/topic/news", sub_id="keep", durable="true")
    assert rig.bodies(3) == [b"kept"]   # without UNSUBSCRIBE it lives on


def test_a_durable_subscription_in_use_elsewhere_is_refused():
    rig = two()
    rig.connect(3, client_id="c1")
    rig.connect(4, client_id="c1")
    rig.subscribe(3, "/topic/news", **{"activemq.subscriptionName": "n"})
    rig.subscribe(4, "/topic/news", **{"activemq.subscriptionName": "n"})
    assert rig.error(4)["message"] == "durable subscription in use"


def test_a_durable_subscription_keeps_its_topic_unless_replaced():
    rig = two()
    rig.subscribe(2, "/topic/a", sub_id="d", durable="true")
    rig.broker.on_closed(2)
    rig.send(1, "/topic/a", body=b"old")
    rig.connect(3)
    rig.subscribe(3, "/topic/b", sub_id="d", durable="true")
    assert rig.error(3)["message"] == "durable subscription exists"
    rig.connect(4)
    rig.subscribe(4, "/topic/b", sub_id="d", durable="true", replace_durable="true")
    rig.send(1, "/topic/b", body=b"new")
    assert rig.bodies(4) == [b"new"]


def test_a_durable_queue_subscription_is_refused():
    rig = two()
    rig.subscribe(2, "/queue/q", durable="true")
    assert rig.error(2)["message"] == "durable queue subscription"


def test_replay_needs_the_store():
    rig = two()
    rig.subscribe(2, "/topic/t", durable="true", replay_from="0")
    assert rig.error(2)["message"] == "replay unavailable"


def test_the_tick_sweeps_expired_stale_messages():
    rig = two(TTL=1000)
    rig.send(1, "/topic/a")
    assert rig.broker.needs_tick()
    rig.tick(1.5)
    assert not rig.broker.needs_tick()   # swept: nothing left to time


def test_an_idle_queue_is_forgotten():
    rig = two()
    rig.subscribe(2, "/queue/q")
    rig.send(1, "/queue/q")
    rig.frame(2, "UNSUBSCRIBE", id="s")
    assert rig.broker.queue_stats() == []
