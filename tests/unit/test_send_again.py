"""A SEND with the head of the session's plain SEND before it (Broker.send_again): decoded once,
routed as the first was, each message with headers of its own, and everything that may change
between two SENDs checked again."""

from broker_harness import Rig

from stompbroker.broker import core

HEAD = b"SEND\ndestination:/topic/a\ncontent-length:1"


def test_repeated_heads_are_decoded_once_and_every_message_is_delivered_with_its_own_headers(monkeypatch):
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/a")
    rig.take(2)
    decoded = []
    real = core.parse_head_cached
    monkeypatch.setattr(core, "parse_head_cached", lambda head, unescape: decoded.append(head) or real(head, unescape))
    for body in (b"1", b"2", b"3"):
        rig.broker.on_frame(1, HEAD, body, rig.now)
    assert decoded == [HEAD]
    got = rig.messages(2)
    assert [m.body for m in got] == [b"1", b"2", b"3"]
    assert len({m["message-id"] for m in got}) == 3
    assert rig.broker.stats["frames_in"] >= 3 and rig.broker.stats["messages_published"] == 3


def test_the_messages_of_repeated_heads_share_no_headers_dict():
    rig = Rig(TTL=60_000)  # nobody subscribes: the stale queue keeps them
    rig.connect(1)
    for body in (b"1", b"2"):
        rig.broker.on_frame(1, HEAD, body, rig.now)
    first, second = rig.broker.stale.take("/topic/a", None, rig.now, lambda headers: True)
    assert first.headers == second.headers and first.headers is not second.headers


def test_a_queue_filled_by_repeated_heads_refuses_the_one_over_its_limit():
    rig = Rig(max_queue_messages=2)
    rig.connect(1)
    head = b"SEND\ndestination:/queue/q\ncontent-length:1"
    for body in (b"1", b"2", b"3"):
        rig.broker.on_frame(1, head, body, rig.now)
    assert rig.error(1)["message"] == "queue full"
    assert rig.broker.queues["/queue/q"].depth() == 2


class Revocable:
    def __init__(self):
        self.required = False  # (no login check to wait for while connecting)
        self.writable = True

    def can_write(self, login, destination):
        return self.writable

    can_read = can_write

    def is_admin(self, login):
        return False


def test_permissions_are_checked_for_every_repeated_head():
    auth = Revocable()
    rig = Rig(auth=auth)
    rig.connect(1)
    auth.required = True
    rig.broker.on_frame(1, HEAD, b"1", rig.now)
    assert rig.commands(1) == []
    auth.writable = False  # revoked (a permissions file reloaded) between two SENDs of one read
    rig.broker.on_frame(1, HEAD, b"2", rig.now)
    assert rig.error(1)["message"] == "permission denied for /topic/a"


def test_the_same_head_from_another_session_or_after_another_frame_takes_the_whole_route(monkeypatch):
    rig = Rig()
    rig.connect(1)
    rig.connect(3)
    decoded = []
    real = core.parse_head_cached
    monkeypatch.setattr(core, "parse_head_cached", lambda head, unescape: decoded.append(head) or real(head, unescape))
    rig.broker.on_frame(1, HEAD, b"1", rig.now)
    rig.broker.on_frame(3, HEAD, b"2", rig.now)   # another session
    rig.broker.on_frame(3, HEAD, b"3", rig.now)   # the same again: repeated
    rig.broker.on_frame(3, b"SUBSCRIBE\ndestination:/topic/b\nid:1", b"", rig.now)
    rig.broker.on_frame(3, HEAD, b"4", rig.now)   # after another frame
    assert decoded == [HEAD, HEAD, b"SUBSCRIBE\ndestination:/topic/b\nid:1", HEAD]


def test_sends_with_a_receipt_or_in_a_transaction_are_never_repeated():
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/a")
    rig.take(2)
    with_receipt = HEAD + b"\nreceipt:r"
    for body in (b"1", b"2"):
        rig.broker.on_frame(1, with_receipt, body, rig.now)
    assert rig.commands(1) == ["RECEIPT", "RECEIPT"]
    rig.frame(1, "BEGIN", transaction="t")
    held = HEAD + b"\ntransaction:t"
    for body in (b"3", b"4"):
        rig.broker.on_frame(1, held, body, rig.now)
    assert rig.bodies(2) == [b"1", b"2"]  # the transaction's wait for its COMMIT
    rig.frame(1, "COMMIT", transaction="t")
    assert rig.bodies(2) == [b"3", b"4"]


def counting_messages(monkeypatch) -> list:
    from stompbroker.broker import routing
    made = []

    class Counted(routing.Message):
        __slots__ = ()

        def __init__(self, *args):
            made.append(args[1])
            super().__init__(*args)

    monkeypatch.setattr(routing, "Message", Counted)
    return made


def test_a_repeated_head_to_a_topic_nobody_hears_is_counted_and_dropped_without_a_message(monkeypatch):
    rig = Rig()
    rig.connect(1)
    made = counting_messages(monkeypatch)
    for body in (b"1", b"2", b"3"):
        rig.broker.on_frame(1, HEAD, body, rig.now)
    assert made == []  # the first SEND of the head as well
    stats = rig.broker.stats
    assert stats["messages_published"] == 3 and stats["messages_dropped"] == 3
    assert rig.commands(1) == []


def test_a_repeated_head_to_a_topic_that_someone_would_keep_or_hear_is_published(monkeypatch):
    rig = Rig()
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/a", sub_id="d", durable="true")   # a durable subscription, detached below
    rig.frame(2, "DISCONNECT")
    rig.broker.on_closed(2)
    rig.broker.on_frame(1, HEAD, b"1", rig.now)
    rig.broker.on_frame(1, HEAD, b"2", rig.now)
    (durable,) = rig.broker.durables.values()
    assert [m.body for m in durable.queue.messages] == [b"1", b"2"]
    rig.connect(3)
    run = rig.broker.again
    rig.subscribe(3, "/topic/a", sub_id="t")
    rig.broker.again = run  # (a subscription made without a frame of the run between: as an operator's action would)
    rig.take(3)
    rig.broker.on_frame(1, HEAD, b"3", rig.now)
    assert rig.bodies(3) == [b"3"]


def test_a_persistent_or_deduplicated_topic_send_or_a_queue_send_never_takes_the_dropping_path():
    from stompbroker.broker import routing
    route = routing.plain_route
    assert route("/topic/a", {"destination": "/topic/a"}) == routing.TOPIC
    assert route("/topic/a", {"persistent": "false"}) == routing.TOPIC
    assert route("/topic/a", {"persistent": "true"}) == routing.ANY  # the store logs it for replay
    assert route("/topic/a", {routing.dedup.HEADER: "x"}) == routing.ANY
    for destination in ("#work", "DIAG", "/reply-queue/x"):
        assert route(destination, {}) == routing.ANY
    assert route("/queue/a", {"persistent": "true"}) == routing.QUEUE
    assert route("/queue/a", {routing.dedup.HEADER: "x"}) == routing.ANY  # de-duplicated in publish


def test_a_plain_topic_send_where_nothing_keeps_messages_is_published_without_publishs_checks(monkeypatch):
    """No store, no durable subscription, no unfinished step: a plain topic SEND goes by
    ``publish_topic`` (the checks its head passed are not made again), with the same deliveries,
    ids and stale queue as ``publish``."""
    from stompbroker.broker import routing
    published = []
    real = routing.publish
    monkeypatch.setattr(routing, "publish", lambda b, destination, *args, **kw: published.append(destination)
                        or real(b, destination, *args, **kw))
    rig = Rig(TTL=5000)
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/a", sub_id="s1")
    rig.subscribe(2, "/topic/a", sub_id="s2")
    for body in (b"1", b"2"):
        rig.broker.on_frame(1, HEAD, body, rig.now)
    got = rig.messages(2)
    assert [(m["subscription"], m.body) for m in got] == [("s1", b"1"), ("s2", b"1"), ("s1", b"2"), ("s2", b"2")]
    assert got[0]["message-id"] == got[1]["message-id"] != got[2]["message-id"]
    rig.frame(2, "UNSUBSCRIBE", id="s1")
    rig.frame(2, "UNSUBSCRIBE", id="s2")
    rig.broker.on_frame(1, HEAD, b"3", rig.now)   # heard by nobody: the stale queue keeps it for a late one
    rig.subscribe(2, "/topic/a", sub_id="late")
    assert rig.bodies(2) == [b"3"]
    assert published == []
    assert rig.broker.stats["messages_published"] == 3


def test_with_a_store_a_plain_topic_send_takes_the_short_route_and_a_persistent_one_is_logged(monkeypatch, tmp_path):
    from stompbroker.broker import routing
    from stompbroker.store.sqlite import Store
    published = []
    real = routing.publish
    monkeypatch.setattr(routing, "publish", lambda b, destination, *args, **kw: published.append(destination)
                        or real(b, destination, *args, **kw))
    rig = Rig(store="sqlite", store_path=str(tmp_path / "s.db"))
    store = Store(rig.config.store_path, 0.0, 0.0)
    logged = []
    monkeypatch.setattr(store, "log", lambda destination, message_id, headers, body: logged.append(body))
    rig.broker.recover(store, rig.now)
    rig.connect(1)
    rig.connect(2)
    rig.subscribe(2, "/topic/a", sub_id="s")
    for body in (b"1", b"2"):
        rig.broker.on_frame(1, HEAD, body, rig.now)
    assert published == [] and logged == []
    rig.send(1, "/topic/a", b"p", persistent="true")   # kept for replay-from: the whole route
    assert published == ["/topic/a"] and logged == [b"p"]
    assert rig.bodies(2) == [b"1", b"2", b"p"]
    store.close()


def test_a_plain_queue_send_to_an_empty_queue_is_handed_over_without_publishs_checks(monkeypatch):
    """No store, no cluster, no unfinished step: a plain SEND to a queue that holds nothing goes
    straight to its next consumer, round robin, with the same ids and counts as ``publish``; a queue
    with messages waiting, one not made yet, and one over its limit take the whole route."""
    from stompbroker.broker import routing
    published = []
    real = routing.publish
    monkeypatch.setattr(routing, "publish", lambda b, destination, *args, **kw: published.append(destination)
                        or real(b, destination, *args, **kw))
    head = b"SEND\ndestination:/queue/q\ncontent-length:1"
    rig = Rig(max_queue_messages=2)
    rig.connect(1)
    rig.broker.on_frame(1, head, b"0", rig.now)   # no queue yet: publish makes it and keeps the message
    assert published == ["/queue/q"]
    rig.connect(2)
    rig.subscribe(2, "/queue/q", sub_id="s1")
    rig.subscribe(2, "/queue/q", sub_id="s2")
    for body in (b"1", b"2", b"3"):
        rig.broker.on_frame(1, head, body, rig.now)
    got = rig.messages(2)
    assert [(m["subscription"], m.body) for m in got] == [("s1", b"0"), ("s1", b"1"), ("s2", b"2"), ("s1", b"3")]
    assert len({m["message-id"] for m in got}) == 4
    assert published == ["/queue/q"]
    queue = rig.broker.queues["/queue/q"]
    assert (queue.enqueued, queue.dequeued) == (4, 4)
    assert rig.broker.stats["messages_published"] == 4 and rig.broker.stats["messages_delivered"] == 4
    rig.frame(2, "UNSUBSCRIBE", id="s1")
    rig.frame(2, "UNSUBSCRIBE", id="s2")
    assert "/queue/q" not in rig.broker.queues   # (idle: forgotten)
    rig.broker.on_frame(1, head, b"4", rig.now)   # made again and kept
    for body in (b"5", b"6"):                    # a message waits: the whole route, and its limit holds
        rig.broker.on_frame(1, head, body, rig.now)
    assert published == ["/queue/q"] * 3   # ("6" is refused before it)
    assert rig.error(1)["message"] == "queue full"
    assert rig.broker.queues["/queue/q"].depth() == 2
