"""Queues, acknowledgements, dead letters, durable subscriptions and replay-from across a cluster:
three broker nodes on a real 3-server NATS JetStream cluster, stomp.py clients (and the raw wire
where a frame's exact headers matter). Fault counts: sent, receipted, delivered, lost, duplicated."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest
import stomp

from stompbroker.cluster import shards
from tests.natscluster import DEFAULT_PACK
from tests.stompwire import Wire, drain

pytestmark = pytest.mark.timeout(120)


class Client(stomp.ConnectionListener):
    def __init__(self, broker, **connect_headers):
        self.messages = []
        self.receipts = set()
        self.errors = []
        self.cond = threading.Condition()
        self.conn = stomp.Connection12([broker.address], heartbeats=(0, 0))
        self.conn.set_listener("c", self)
        self.conn.connect(wait=True, headers=connect_headers)

    def on_message(self, frame):
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame):
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def on_error(self, frame):
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def wait(self, predicate, timeout=20.0, what="condition"):
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), timeout), \
                f"{what}: {len(self.messages)} messages, {len(self.receipts)} receipts, errors {self.errors}"

    def close(self):
        try:
            self.conn.disconnect()
        except Exception:
            pass


def wire(broker) -> Wire:
    w = Wire(broker.connect())
    w.connect()
    return w


def counts(sent: list[str], receipted: set, delivered: list[str]) -> dict:
    seen = Counter(delivered)
    return {"sent": len(sent), "receipted": len(receipted), "delivered": len(seen),
            "lost": sum(1 for s in sent if s not in seen), "duplicated": sum(n - 1 for n in seen.values() if n > 1)}


def test_competing_consumers_on_three_nodes_get_each_message_once_in_order(start_nodes):
    nodes = start_nodes(3)
    consumers = [Client(node) for node in nodes]
    for i, c in enumerate(consumers):
        c.conn.subscribe("/queue/work", id=f"c{i}", ack="client-individual", headers={"prefetch-count": "5"})
    time.sleep(1.0)  # (each node binds the queue's consumer)
    producer = Client(nodes[0])
    sent = [f"m{i:04d}" for i in range(300)]
    for body in sent:
        producer.conn.send("/queue/work", body, headers={"persistent": "true", "receipt": body})
    producer.wait(lambda c: len(c.receipts) == len(sent), what="receipts")
    delivered = []

    def all_in(_):
        return sum(len(c.messages) for c in consumers) >= len(sent)

    deadline = time.monotonic() + 30
    acked = [0, 0, 0]
    while time.monotonic() < deadline and not all_in(None):
        for i, c in enumerate(consumers):  # acknowledge what came, so each node pulls more
            with c.cond:
                fresh = c.messages[acked[i]:]
            for frame in fresh:
                c.conn.ack(frame.headers["ack"])
            acked[i] += len(fresh)
        time.sleep(0.02)
    time.sleep(0.5)  # anything extra (a duplicate) would come now
    per_node = [[f.body for f in c.messages] for c in consumers]
    delivered = [b for bodies in per_node for b in bodies]
    result = counts(sent, producer.receipts, delivered)
    assert result == {"sent": 300, "receipted": 300, "delivered": 300, "lost": 0, "duplicated": 0}, result
    assert sum(1 for p in per_node if p) >= 2, [len(p) for p in per_node]  # shared across nodes
    for bodies in per_node:
        assert bodies == sorted(bodies)                         # one producer: its order, per consumer
    assert not any("redelivered" in f.headers for c in consumers for f in c.messages)
    for c in consumers + [producer]:
        c.close()


def test_receipt_means_stored_and_an_unstorable_message_gets_an_error(start_nodes, nats_cluster, cluster_name,
                                                                      tmp_path):
    import asyncio

    import nats

    (node,) = start_nodes(1, "store=sqlite", f"store_path={tmp_path}/s.sqlite")  # (JetStream is the store)
    w = wire(node)
    w.frame("SEND", {"destination": "/queue/kept", "receipt": "r1", "persistent": "true"}, b"stored")
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "r1"})

    async def depth():
        nc = await nats.connect(nats_cluster.urls[1])
        stream = shards.stream_name(cluster_name, shards.QUEUES, 6, shards.shard_of("/queue/kept", 6), DEFAULT_PACK)
        info = await nc.jetstream(timeout=10).stream_info(stream)  # (the default 6 shards packed by 16: its shard's stream)
        await nc.close()
        return info.state.messages, info.config.num_replicas

    assert asyncio.run(depth()) == (1, 3)  # in JetStream, three copies, when the receipt came
    w.frame("SEND", {"destination": "/queue/kept", "receipt": "big"}, b"x" * (2 << 20))  # over NATS max_payload
    command, headers, body = w.read(10)
    assert (command, headers["message"], headers["receipt-id"]) == ("ERROR", "message not stored", "big"), body
    assert "store=sqlite is not used in cluster mode" in node.log()


def test_no_jetstream_means_error_cluster_unavailable_after_cluster_timeout_ms(start_broker):
    from tests.natscluster import free_ports

    (dead,) = free_ports(1)
    node = start_broker(f"cluster=nats://127.0.0.1:{dead}", "node_id=lonely", "cluster_timeout_ms=1000")
    w = wire(node)
    started = time.monotonic()
    w.frame("SEND", {"destination": "/queue/q", "receipt": "r1"}, b"nowhere")
    command, headers, _ = w.read(10)
    assert (command, headers["message"], headers.get("receipt-id")) == ("ERROR", "cluster unavailable", "r1")
    assert 0.9 < time.monotonic() - started < 8
    w2 = wire(node)  # topics on this node keep working
    w2.frame("SUBSCRIBE", {"destination": "/topic/local", "id": "t"})
    w2.frame("SEND", {"destination": "/topic/local"}, b"here")
    assert w2.read()[2] == b"here"


def test_client_ack_is_cumulative_and_unacked_messages_move_to_another_node(start_nodes):
    nodes = start_nodes(3)
    producer = wire(nodes[0])
    for i in range(6):
        producer.frame("SEND", {"destination": "/queue/cum", "receipt": f"r{i}"}, b"%d" % i)
    # (10 s: the first SENDs of a cluster just started wait for its streams' leaders; CI, with
    # another NATS cluster beside it, once took over 5 s)
    assert [producer.read(10)[1]["receipt-id"] for _ in range(6)] == [f"r{i}" for i in range(6)]
    first = wire(nodes[1])
    first.frame("SUBSCRIBE", {"destination": "/queue/cum", "id": "a", "ack": "client", "prefetch-count": "3"})
    got = [first.read() for _ in range(3)]
    assert [g[2] for g in got] == [b"0", b"1", b"2"]
    assert drain(first, 0.5) == []                   # prefetch 3: no more until an ACK
    first.frame("ACK", {"id": got[2][1]["ack"]})     # cumulative: 0, 1 and 2
    more = [first.read() for _ in range(3)]
    assert [m[2] for m in more] == [b"3", b"4", b"5"]
    first.frame("ACK", {"id": more[0][1]["ack"]})    # 3 only; 4 and 5 stay unacknowledged
    first.frame("DISCONNECT", {"receipt": "bye"})
    assert first.read()[0] == "RECEIPT"
    second = wire(nodes[2])
    second.frame("SUBSCRIBE", {"destination": "/queue/cum", "id": "b", "ack": "client-individual"})
    again = sorted((second.read(10) for _ in range(2)), key=lambda f: f[2])  # (redeliveries: in any order)
    assert [a[2] for a in again] == [b"4", b"5"]
    assert all(a[1].get("redelivered") == "true" for a in again)
    assert again[0][1]["message-id"] == more[1][1]["message-id"]   # the same message, cluster-wide id
    for a in again:
        second.frame("ACK", {"id": a[1]["ack"]})
    assert drain(second, 0.5) == []


def waiting_pulls(nats_cluster, cluster_name: str, queue: str) -> int:
    """Pull requests waiting in JetStream for a queue's consumer (the nodes' credit not yet used)."""
    import asyncio

    import nats

    async def ask():
        nc = await nats.connect(nats_cluster.urls[0])
        try:
            stream = shards.stream_name(cluster_name, shards.QUEUES, 6, shards.shard_of(queue, 6), DEFAULT_PACK)
            consumer = "q_" + queue.replace("/", "%2F")
            return (await nc.jetstream(timeout=10).consumer_info(stream, consumer)).num_waiting
        finally:
            await nc.close()
    return asyncio.run(ask())


def test_nack_redelivers_on_another_node_then_dead_letters(start_nodes, nats_cluster, cluster_name):
    nodes = start_nodes(3, "max_redeliveries=1")
    dlq = wire(nodes[0])
    dlq.frame("SUBSCRIBE", {"destination": "/queue/DLQ", "id": "d", "receipt": "d"})
    assert dlq.read()[0] == "RECEIPT"
    a = wire(nodes[1])
    a.frame("SUBSCRIBE", {"destination": "/queue/poison", "id": "a", "ack": "client-individual", "receipt": "a",
                          "prefetch-count": "1"})   # (its one pull is used up by the first delivery)
    assert a.read()[0] == "RECEIPT"
    time.sleep(0.3)
    dlq.frame("SEND", {"destination": "/queue/poison", "receipt": "s"}, b"bad")
    assert dlq.read()[0] == "RECEIPT"
    first = a.read(10)
    assert first[2] == b"bad" and "redelivered" not in first[1]
    before = waiting_pulls(nats_cluster, cluster_name, "/queue/poison")
    b = wire(nodes[2])
    b.frame("SUBSCRIBE", {"destination": "/queue/poison", "id": "b", "ack": "client-individual", "receipt": "b"})
    assert b.read()[0] == "RECEIPT"
    deadline = time.monotonic() + 10  # node 2's pull request waits in JetStream before node 1's next one
    while waiting_pulls(nats_cluster, cluster_name, "/queue/poison") <= before:
        assert time.monotonic() < deadline, "node 2's pull never reached JetStream"
        time.sleep(0.05)
    a.frame("NACK", {"id": first[1]["ack"]})
    again = b.read(10)                         # JetStream gives it to the other node's waiting pull
    assert again[2] == b"bad" and again[1]["redelivered"] == "true"
    assert again[1]["message-id"] == first[1]["message-id"]
    b.frame("NACK", {"id": again[1]["ack"]})  # delivered twice: past max_redeliveries=1
    dead = dlq.read(10)
    assert dead[2] == b"bad" and dead[1]["original-destination"] == "/queue/poison"
    assert dead[1]["dead-letter-reason"] == "rejected 2 times"
    assert drain(a, 0.5) == [] and drain(b, 0.5) == [] and drain(dlq, 0.2) == []


def test_a_dead_nodes_unacked_messages_come_back_elsewhere_after_ack_wait(start_nodes):
    nodes = start_nodes(2, "cluster_ack_wait_ms=2000")
    doomed = wire(nodes[0])
    doomed.frame("SUBSCRIBE", {"destination": "/queue/lost", "id": "a", "ack": "client-individual",
                               "prefetch-count": "5"})
    time.sleep(0.3)
    producer = Client(nodes[1])
    sent = [f"k{i}" for i in range(5)]
    for body in sent:
        producer.conn.send("/queue/lost", body, headers={"receipt": body})
    producer.wait(lambda c: len(c.receipts) == 5, what="receipts")
    taken = [doomed.read(10)[2] for _ in range(5)]
    assert sorted(taken) == [s.encode() for s in sent]
    os.killpg(nodes[0].proc.pid, signal.SIGKILL)   # the node dies holding five unacked messages
    producer.conn.subscribe("/queue/lost", id="b", ack="client-individual")
    producer.wait(lambda c: len(c.messages) == 5, timeout=15, what="redelivery")
    result = counts(sent, producer.receipts, [f.body for f in producer.messages])
    assert result["lost"] == 0 and result["duplicated"] == 0, result
    assert all(f.headers.get("redelivered") == "true" for f in producer.messages)
    producer.close()


def test_durable_subscription_moves_between_nodes(start_nodes):
    # A message the stream leader sends to the first node's pull just as that node lets the
    # durable go can be lost in transit and come back only after the ack wait (docs/cluster.md,
    # "What is guaranteed"): keep that wait short enough for the test to see it come back.
    nodes = start_nodes(3, "cluster_ack_wait_ms=5000")
    sender = Client(nodes[2])

    def subscribe(node):
        c = Client(node, **{"client-id": "app1"})
        c.conn.subscribe("/topic/news", id="n", ack="client-individual",
                         headers={"activemq.subscriptionName": "feed", "receipt": "sub"})
        c.wait(lambda c: "sub" in c.receipts, what="subscribed")
        return c

    first = subscribe(nodes[0])
    time.sleep(0.3)
    sender.conn.send("/topic/news", "one", headers={"persistent": "true", "receipt": "1"})
    first.wait(lambda c: len(c.messages) == 1, what="first message")
    first.conn.ack(first.messages[0].headers["ack"])
    time.sleep(0.2)
    first.close()                                   # away: messages wait in JetStream
    for body in ("two", "three"):
        sender.conn.send("/topic/news", body, headers={"persistent": "true", "receipt": body})
    sender.wait(lambda c: {"1", "two", "three"} <= c.receipts, what="receipts")
    second = subscribe(nodes[1])                     # back, on another node
    second.wait(lambda c: len(c.messages) == 2, what="waiting messages")
    got = second.messages
    # in order, unless the first node had pulled "two" before it let go (then it comes back
    # later, marked redelivered)
    assert [f.body for f in got] == ["two", "three"] or (
        [f.body for f in got] == ["three", "two"] and got[1].headers.get("redelivered") == "true"), got
    for f in second.messages:
        second.conn.ack(f.headers["ack"])
    time.sleep(0.5)
    assert len(second.messages) == 2
    second.conn.unsubscribe("n", headers={"receipt": "unsub"})   # ends it: its consumer goes
    second.wait(lambda c: "unsub" in c.receipts, what="unsubscribed")
    time.sleep(0.3)
    sender.conn.send("/topic/news", "four", headers={"persistent": "true", "receipt": "four"})
    sender.wait(lambda c: "four" in c.receipts, what="receipt")
    third = subscribe(nodes[0])                      # a new subscription of that name: from now on
    time.sleep(1.0)
    assert third.messages == []
    for c in (sender, second, third):
        c.close()


def test_replay_from_on_another_node(start_nodes):
    nodes = start_nodes(2)
    before = int(time.time() * 1000) - 1
    sender = wire(nodes[0])
    for i in range(3):
        sender.frame("SEND", {"destination": f"/topic/log/{i}", "persistent": "true", "receipt": f"r{i}"}, b"%d" % i)
    sender.frame("SEND", {"destination": "/topic/log/live", "receipt": "x"}, b"not kept")  # not persistent
    sender.frame("SEND", {"destination": "/topic/other", "persistent": "true", "receipt": "y"}, b"other")
    assert len([sender.read() for _ in range(5)]) == 5
    reader = wire(nodes[1])
    reader.frame("SUBSCRIBE", {"destination": "/topic/log/*", "id": "r", "replay-from": str(before)})
    got = [reader.read(10) for _ in range(3)]
    # (three destinations, in three shards: stored at the same moment, in any order)
    assert sorted(g[2] for g in got) == [b"0", b"1", b"2"]
    assert all(g[1]["replayed"] == "true" for g in got)
    assert drain(reader, 0.5) == []


def test_a_producer_retry_with_the_same_dedup_id_is_delivered_once(start_nodes):
    nodes = start_nodes(2)
    producers = [wire(nodes[0]), wire(nodes[1])]
    for i, p in enumerate(producers):  # the retry even goes to another node
        p.frame("SEND", {"destination": "/queue/orders", "dedup-id": "order-42", "receipt": f"r{i}"}, b"pay 42")
        assert p.read()[1]["receipt-id"] == f"r{i}"
    producers[0].frame("SEND", {"destination": "/queue/orders", "dedup-id": "order-43", "receipt": "r3"}, b"pay 43")
    assert producers[0].read()[0] == "RECEIPT"
    consumer = wire(nodes[1])
    consumer.frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "c"})
    got = drain(consumer, 1.5)
    assert [g[2] for g in got] == [b"pay 42", b"pay 43"]


def test_max_queue_messages_holds_across_the_cluster(start_nodes):
    """A queue holds at most max_queue_messages in the whole cluster: SENDs from two nodes fill it,
    the next one (from either) gets ERROR queue full with its receipt-id, as on one node; nothing
    receipted is lost, and once consumed the queue takes messages again."""
    nodes = start_nodes(3, "max_queue_messages=5")
    sent, receipted = [], set()
    for i in range(5):
        w = wire(nodes[i % 2])
        body = f"m{i}"
        w.frame("SEND", {"destination": "/queue/capped", "persistent": "true", "receipt": body}, body.encode())
        command, headers, _ = w.read(timeout=15)
        assert (command, headers.get("receipt-id")) == ("RECEIPT", body), (command, headers)
        sent.append(body)
        receipted.add(body)
        w.close()
    refused = 0
    for node in nodes[:2]:
        w = wire(node)
        w.frame("SEND", {"destination": "/queue/capped", "persistent": "true", "receipt": "over"}, b"over")
        command, headers, body = w.read(timeout=15)
        assert command == "ERROR" and headers.get("message") == "queue full", (command, headers, body)
        assert headers.get("receipt-id") == "over"
        w.expect_closed()
        refused += 1
    consumer = Client(nodes[2])
    consumer.conn.subscribe("/queue/capped", id="c", ack="client-individual")
    consumer.wait(lambda c: len(c.messages) >= 5, what="the kept messages")
    time.sleep(0.5)  # (a 6th stored message would arrive meanwhile)
    delivered = [m.body for m in consumer.messages]
    result = counts(sent, receipted, delivered)
    print("max_queue_messages across nodes:", result, "refused", refused)
    assert result == {"sent": 5, "receipted": 5, "delivered": 5, "lost": 0, "duplicated": 0}
    assert refused == 2 and "over" not in delivered
    for m in consumer.messages:
        consumer.conn.ack(m.headers["ack"])
    deadline = time.monotonic() + 10  # (the acks reach JetStream a little later: room comes back)
    while True:
        w = wire(nodes[1])
        w.frame("SEND", {"destination": "/queue/capped", "persistent": "true", "receipt": "again"}, b"again")
        command, headers, _ = w.read(timeout=15)
        w.close()
        if command == "RECEIPT" or time.monotonic() > deadline:
            break
        assert headers.get("message") == "queue full", headers
        time.sleep(0.2)
    assert (command, headers.get("receipt-id")) == ("RECEIPT", "again"), (command, headers)
    consumer.wait(lambda c: len(c.messages) == 6, what="the message sent after room was made")
    consumer.close()


def test_message_features_cluster_mode_cannot_keep_are_refused_by_name(start_nodes):
    """Each message feature either works across nodes (priority:4, activemq.prefetchSize) or gets an
    ERROR naming it, with the frame's receipt-id (docs/cluster.md, "Message features")."""
    a, b = start_nodes(2)
    refused = [
        ("SEND", {"destination": "/queue/f", "priority": "9"}, "priority not supported in cluster mode"),
        ("SEND", {"destination": "/queue/f", "JMSXGroupID": "g"}, "message groups not supported in cluster mode"),
        ("SEND", {"destination": "/queue/f", "_AMQ_LVQ_NAME": "k"}, "last-value queues not supported in cluster mode"),
        ("SEND", {"destination": "/topic/f", "AMQ_SCHEDULED_DELAY": "1000"},
         "scheduled delivery not supported in cluster mode"),
        ("SUBSCRIBE", {"destination": "/queue/f", "id": "1", "browser": "true"},
         "browsing not supported in cluster mode"),
        ("SUBSCRIBE", {"destination": "/queue/f", "id": "1", "activemq.exclusive": "true"},
         "exclusive consumers not supported in cluster mode"),
        ("SUBSCRIBE", {"destination": "/queue/f", "id": "1", "x-priority": "5"},
         "consumer priority not supported in cluster mode"),
    ]
    for i, (command, headers, message) in enumerate(refused):
        w = wire(a)
        w.frame(command, {**headers, "receipt": f"r{i}"}, b"x")
        kind, got, _ = w.read(timeout=10)
        assert (kind, got.get("message"), got.get("receipt-id")) == ("ERROR", message, f"r{i}")
        w.close()
    consumer = Client(b)
    consumer.conn.subscribe("/queue/works", id="1", ack="client-individual",
                            headers={"activemq.prefetchSize": "1", "receipt": "s"})
    consumer.wait(lambda c: "s" in c.receipts, what="SUBSCRIBE receipt")
    producer = Client(a)
    for i in range(3):
        producer.conn.send("/queue/works", str(i), priority="4", receipt=f"p{i}")
    producer.wait(lambda c: len(c.receipts) == 3, what="SEND receipts")
    consumer.wait(lambda c: len(c.messages) == 1, what="one message (prefetch 1)")
    time.sleep(0.5)
    assert len(consumer.messages) == 1  # the alias of prefetch-count holds across nodes
    consumer.conn.ack(consumer.messages[0].headers["ack"])
    consumer.wait(lambda c: len(c.messages) == 2, what="the next after the ACK")
    producer.close()
    consumer.close()
