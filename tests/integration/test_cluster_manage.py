"""Management actions over HTTP in cluster mode (docs/admin.md, "Cluster mode"): broker nodes on a
real 3-server NATS JetStream cluster, the actions asked of one node over HTTP with an admin's
login, their effect seen from another node's STOMP clients and in JetStream itself, their audit
lines and /metrics counts."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time

import pytest

from stompbroker.cluster import shards
from stompbroker.security import hash_secret
from tests.integration.test_cluster_queues import Client
from tests.integration.test_cluster_topics import cluster_diag, wait_for
from tests.integration.test_manage_api import Api, q
from tests.natscluster import DEFAULT_PACK, free_ports

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def admin(tmp_path):
    """Settings for logins checked (root/toor, an admin) and the audit log in the test's directory."""
    (tmp_path / "passwd").write_text(f"root:{hash_secret('toor')}:admin\n")
    return ("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", f"audit_log={tmp_path / 'audit.log'}",
            "manage_rate_limit=0")


def audit(tmp_path, action: str) -> list[dict]:
    lines = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    return [line for line in lines if line["action"] == action]


def stored(nats_cluster, cluster_name: str, destination: str, pack: int = DEFAULT_PACK) -> int:
    """JetStream messages stored now for ``destination`` in its shard's stream of the default layout."""
    import nats

    async def main():
        nc = await nats.connect(nats_cluster.urls[1])
        try:
            stream = shards.stream_name(cluster_name, shards.QUEUES, 6, shards.shard_of(destination, 6), pack)
            info = await nc.jetstream(timeout=10).stream_info(
                stream, subjects_filter=shards.queue_subject(cluster_name, 6, destination, pack))
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()
    return asyncio.run(main())


def login(node) -> Client:
    return Client(node, login="root", passcode="toor")


def test_publish_over_http_is_stored_in_jetstream_before_its_answer(start_nodes, nats_cluster, cluster_name,
                                                                   admin, tmp_path):
    nodes = start_nodes(2, *admin)
    api = Api(nodes[0])
    for i in range(3):
        answer = api.ok("POST", "/api/publish", {"destination": "/queue/jobs", "headers": {"n": str(i)},
                                                 "body": f"job{i}"})
        assert answer == {"published": True, "delivered": 0}
        assert stored(nats_cluster, cluster_name, "/queue/jobs") == i + 1  # in JetStream when answered
    consumer = login(nodes[1])  # another node's consumer gets them, as SENDs
    consumer.conn.subscribe("/queue/jobs", id="c", ack="client-individual")
    consumer.wait(lambda c: len(c.messages) >= 3, what="the published messages")
    assert [(m.body, m.headers["n"]) for m in consumer.messages] == [("job0", "0"), ("job1", "1"), ("job2", "2")]
    consumer.close()
    lines = audit(tmp_path, "publish")
    assert [(e["status"], e["destination"], e["delivered"]) for e in lines] == [(200, "/queue/jobs", 0)] * 3
    metrics = api.call("GET", "/metrics")[1].decode()
    assert 'stompbroker_http_actions_total{action="publish",status="200"} 3.0' in metrics


def test_publish_over_http_to_a_full_queue_is_409_and_audited(start_nodes, admin, tmp_path):
    nodes = start_nodes(2, "max_queue_messages=2", *admin)
    for node in nodes:
        assert Api(node).ok("POST", "/api/publish", {"destination": "/queue/capped", "body": "x"})["published"]
    status, value, _ = Api(nodes[1]).call("POST", "/api/publish", {"destination": "/queue/capped", "body": "over"})
    assert status == 409 and value["reason"].startswith("queue full"), (status, value)
    assert [e["status"] for e in audit(tmp_path, "publish")] == [200, 200, 409]
    assert "queue full" in audit(tmp_path, "publish")[-1]["reason"]


def test_publish_over_http_without_jetstream_is_503_after_cluster_timeout_ms(start_broker, admin, tmp_path):
    (dead,) = free_ports(1)
    node = start_broker(f"cluster=nats://127.0.0.1:{dead}", "node_id=lonely", "cluster_timeout_ms=1000", *admin)
    api = Api(node)
    started = time.monotonic()
    status, value, _ = api.call("POST", "/api/publish", {"destination": "/queue/q", "body": "nowhere"})
    assert status == 503 and value["reason"].startswith("cluster unavailable"), (status, value)
    assert 0.9 < time.monotonic() - started < 8
    (line,) = audit(tmp_path, "publish")
    assert line["status"] == 503 and line["destination"] == "/queue/q"
    status, value, _ = api.call("GET", f"/api/queues/%2F/{q('/queue/q')}/messages")
    assert status == 503 and value["reason"].startswith("cluster unavailable"), (status, value)
    metrics = api.call("GET", "/metrics")[1].decode()
    assert 'stompbroker_http_actions_total{action="publish",status="503"} 1.0' in metrics


def drain(consumer: Client, expected: int, timeout: float = 30) -> list[str]:
    """Acknowledge what comes (client-individual) until ``expected`` messages came; their bodies."""
    deadline = time.monotonic() + timeout
    acked = 0
    while time.monotonic() < deadline:
        with consumer.cond:
            fresh = consumer.messages[acked:]
        for frame in fresh:
            consumer.conn.ack(frame.headers["ack"])
        acked += len(fresh)
        if acked >= expected:
            break
        time.sleep(0.02)
    time.sleep(0.3)  # anything extra (a duplicate) would come now
    return [m.body for m in consumer.messages]


def test_peek_shows_a_queues_stored_messages_from_any_node_and_consumes_nothing(start_nodes, admin, tmp_path):
    nodes = start_nodes(3, *admin)
    producer = login(nodes[0])
    sent = [f"m{i:02d}" for i in range(40)]
    for body in sent:  # (pipelined: stored in packs of several)
        producer.conn.send("/queue/browse", body, headers={"n": body, "receipt": body})
    producer.wait(lambda c: len(c.receipts) == len(sent), what="receipts")
    api = Api(nodes[2])
    path = f"/api/queues/%2F/{q('/queue/browse')}/messages"
    page = api.ok("GET", path + "?count=500")
    assert [m["payload"] for m in page["messages"]] == sent and page["depth"] == 40, page
    first = page["messages"][0]
    assert first["headers"]["n"] == "m00" and first["size"] == 3 and first["destination"] == "/queue/browse"
    assert not first["redelivered"] and page["truncated"] is False
    assert [m["payload"] for m in api.ok("GET", path + "?count=5&offset=10")["messages"]] == sent[10:15]
    assert api.ok("GET", f"/api/queues/%2F/{q('/queue/none')}/messages")["messages"] == []

    consumer = login(nodes[1])  # holds two, unacknowledged: still stored, still shown
    consumer.conn.subscribe("/queue/browse", id="c", ack="client-individual", headers={"prefetch-count": "2"})
    consumer.wait(lambda c: len(c.messages) >= 2, what="two deliveries")
    assert [m["payload"] for m in api.ok("GET", path + "?count=500")["messages"]] == sent
    delivered = drain(consumer, len(sent))
    assert sorted(delivered) == sent  # the peeks took none of them
    assert api.ok("GET", path)["messages"] == []
    assert [e["status"] for e in audit(tmp_path, "peek")] == [200] * 5
    producer.close()
    consumer.close()


def test_purge_from_any_node_drops_what_waits_in_jetstream_and_is_retry_safe(start_nodes, admin, tmp_path):
    nodes = start_nodes(3, *admin)
    producer = login(nodes[0])
    sent = [f"p{i:03d}" for i in range(100)]
    for body in sent:  # (pipelined: packs)
        producer.conn.send("/queue/purged", body, headers={"receipt": body})
    producer.wait(lambda c: len(c.receipts) == len(sent), what="receipts")
    consumer = login(nodes[1])  # holds two, unacknowledged: a purge leaves them to it
    consumer.conn.subscribe("/queue/purged", id="c", ack="client-individual", headers={"prefetch-count": "2"})
    consumer.wait(lambda c: len(c.messages) >= 2, what="two deliveries")
    api = Api(nodes[2])
    path = f"/api/queues/%2F/{q('/queue/purged')}/messages"
    purged = api.ok("DELETE", path)["purged"]
    assert api.ok("DELETE", path) == {"purged": 0}                       # a retry is safe
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/never')}/messages") == {"purged": 0}
    delivered = drain(consumer, len(sent) - purged, timeout=10)
    result = {"sent": len(sent), "purged": purged, "delivered": len(delivered),
              "duplicated": len(delivered) - len(set(delivered))}
    print("purge with a consumer holding messages:", result)
    assert 0 < purged < len(sent) and purged + len(delivered) == len(sent) and result["duplicated"] == 0, result
    assert not set(delivered) - set(sent)
    assert api.ok("GET", path)["messages"] == []
    assert [(e["status"], e["purged"]) for e in audit(tmp_path, "purge")] == [(200, purged), (200, 0), (200, 0)]
    producer.close()
    consumer.close()


def purge(api: Api, destination: str) -> int:
    """The messages one purge took: its answer's count, or, when JetStream left it unanswered past
    cluster_timeout_ms (503), the count its reason gives of those purged before it stopped."""
    status, value, _ = api.call("DELETE", f"/api/queues/%2F/{q(destination)}/messages")
    if status == 200:
        return value["purged"]
    found = re.search(r"; (\d+) messages were purged before it stopped", value.get("reason", ""))
    assert status == 503 and found, (status, value)
    return int(found.group(1))


def test_purge_while_consumers_run_on_other_nodes_loses_nothing_and_delivers_nothing_twice(start_nodes, admin):
    """Producer on n0, two acknowledging consumers on each of n1 and n2, purges asked of n0 and n2
    in turn while the producer sends: every receipted message is either purged or delivered, once."""
    import threading

    from tests.integration.test_manage_api import consumers, drain as drain_all

    nodes = start_nodes(3, *admin)
    workers = consumers(nodes[1], "/queue/busy", 2) + consumers(nodes[2], "/queue/busy", 2)
    producer = login(nodes[0])
    sent = [f"b{i:04d}" for i in range(1500)]
    # one message delivered first: the queue's JetStream consumer is made and has its leader (while
    # it is being elected JetStream may leave a purge unanswered past cluster_timeout_ms: a 503)
    producer.conn.send("/queue/busy", "warm", headers={"receipt": "warm"})
    deadline = time.monotonic() + 30
    while not any(w.bodies for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    sent.append("warm")

    def produce():
        for body in sent[:-1]:
            producer.conn.send("/queue/busy", body, headers={"receipt": body})

    thread = threading.Thread(target=produce)
    thread.start()
    purged, asks = 0, 0
    deadline = time.monotonic() + 60
    while (thread.is_alive() or asks < 3) and time.monotonic() < deadline:
        purged += purge(Api(nodes[2 * (asks % 2)]), "/queue/busy")
        asks += 1
    thread.join(30)
    producer.wait(lambda c: len(c.receipts) == len(sent), timeout=30, what="receipts")
    purged += purge(Api(nodes[0]), "/queue/busy")
    delivered = drain_all(workers, len(sent) - purged)
    unique = set(delivered)
    result = {"sent": len(sent), "receipted": len(producer.receipts), "purges": asks + 1, "purged": purged,
              "delivered": len(delivered), "lost": len(sent) - purged - len(unique),
              "duplicated": len(delivered) - len(unique)}
    print("purge while consumers run:", result)
    assert not unique - set(sent)
    assert result["lost"] == 0 and result["duplicated"] == 0 and purged + len(delivered) == len(sent), result
    producer.close()


def test_publish_over_http_to_a_topic_is_kept_for_a_durable_subscription_away_on_another_node(start_nodes, admin):
    # (as in test_cluster_queues' durable test: a message sent to the first node's pull as it lets
    # the durable go comes back after the ack wait)
    nodes = start_nodes(3, "cluster_ack_wait_ms=5000", *admin)
    api = Api(nodes[0])

    def subscribe(node):
        c = Client(node, login="root", passcode="toor", **{"client-id": "app1"})
        c.conn.subscribe("/topic/news", id="n", ack="client-individual",
                         headers={"activemq.subscriptionName": "feed", "receipt": "sub"})
        c.wait(lambda c: "sub" in c.receipts, what="subscribed")
        return c

    first = subscribe(nodes[1])
    # (a persistent:true header keeps it whatever node 0 knows yet of the durable's interest)
    assert api.ok("POST", "/api/publish", {"destination": "/topic/news", "body": "live",
                                           "headers": {"persistent": "true"}}) == {"published": True, "delivered": 0}
    first.wait(lambda c: len(c.messages) == 1, what="the first message")   # (its consumer is made)
    first.conn.ack(first.messages[0].headers["ack"])
    time.sleep(0.2)
    first.close()                                     # away: its messages wait in JetStream
    answer = api.ok("POST", "/api/publish", {"destination": "/topic/news", "body": "kept",
                                             "headers": {"persistent": "true"}})
    assert answer == {"published": True, "delivered": 0}
    back = subscribe(nodes[2])                        # back, on another node
    back.wait(lambda c: len(c.messages) == 1, what="the kept message")
    assert back.messages[0].body == "kept"
    back.close()


def test_peek_and_purge_read_every_layouts_stream_of_the_queue(start_nodes, admin, tmp_path):
    """n0 stores queue messages one per JetStream message (cluster_pack_max=1), n1 in packs (the
    default): two layouts, two streams holding the queue. A peek asked of either shows both, a
    purge asked of either takes both."""
    (unpacked,) = start_nodes(1, "cluster_pack_max=1", *admin)
    (packed,) = start_nodes(1, *admin, first=1)
    sent = []
    for node, tag in ((unpacked, "u"), (packed, "p")):
        producer = login(node)
        bodies = [f"{tag}{i}" for i in range(20)]
        for body in bodies:
            producer.conn.send("/queue/two", body, headers={"receipt": body})
        producer.wait(lambda c: len(c.receipts) == len(bodies), what="receipts")
        producer.close()
        sent += bodies
    path = f"/api/queues/%2F/{q('/queue/two')}/messages"
    for node in (unpacked, packed):
        page = Api(node).ok("GET", path + "?count=100")
        assert sorted(m["payload"] for m in page["messages"]) == sorted(sent) and page["depth"] == 40, page
    assert Api(unpacked).ok("DELETE", path) == {"purged": 40}
    assert Api(packed).ok("GET", path)["messages"] == [] and Api(packed).ok("DELETE", path) == {"purged": 0}


def test_move_from_any_node_moves_what_the_selector_takes_and_redrives_dead_letters(start_nodes, admin, tmp_path):
    nodes = start_nodes(3, *admin)
    producer = login(nodes[0])
    sent = [(f"m{i:02d}", str(i % 2)) for i in range(20)]
    for body, k in sent:  # (pipelined: packs holding both kinds)
        producer.conn.send("/queue/src", body, headers={"k": k, "receipt": body})
    for i in range(3):    # dead letters, each with the queue it came from
        producer.conn.send("/queue/DLQ", f"dead{i}", headers={"original-destination": "/queue/orig", "receipt": f"d{i}"})
    producer.wait(lambda c: len(c.receipts) == len(sent) + 3, what="receipts")
    api = Api(nodes[2])
    answer = api.ok("POST", f"/api/queues/%2F/{q('/queue/src')}/move", {"to": "/queue/dst", "selector": "k = 1"})
    assert answer == {"moved": 10, "left": None}, answer
    moved = api.ok("GET", f"/api/queues/%2F/{q('/queue/dst')}/messages?count=100")["messages"]
    assert [m["payload"] for m in moved] == [b for b, k in sent if k == "1"]   # in order
    assert all(m["headers"]["redriven-from"] == "/queue/src" and m["headers"]["k"] == "1" for m in moved)
    deadline = time.monotonic() + 10   # (the originals are terminated once their copies are stored: just after)
    while True:
        stayed = sorted(m["payload"] for m in api.ok("GET", f"/api/queues/%2F/{q('/queue/src')}/messages?count=100")
                        ["messages"])
        if stayed == [b for b, k in sent if k == "0"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stayed == [b for b, k in sent if k == "0"], stayed
    assert api.ok("POST", f"/api/queues/%2F/{q('/queue/src')}/move", {"to": "/queue/dst", "count": 2}) == \
        {"moved": 2, "left": None}
    assert api.ok("POST", f"/api/queues/%2F/{q('/queue/DLQ')}/move", {})["moved"] == 3   # the redrive
    consumer = login(nodes[1])
    consumer.conn.subscribe("/queue/orig", id="o", ack="client-individual")
    consumer.wait(lambda c: len(c.messages) == 3, what="the redriven dead letters")
    assert sorted(m.body for m in consumer.messages) == ["dead0", "dead1", "dead2"]
    assert api.ok("POST", f"/api/queues/%2F/{q('/queue/none')}/move", {"to": "/queue/dst"}) == {"moved": 0, "left": None}
    assert [e["status"] for e in audit(tmp_path, "move")] == [200] * 4
    producer.close()
    consumer.close()


def test_move_while_consumers_run_on_other_nodes_delivers_each_message_once(start_nodes, admin):
    """Producer on n0, acknowledging consumers of the source and of the target on n1 and n2,
    moves asked of n0 and n2 in turn while the producer sends: every receipted message is
    delivered once, from the source or, marked redriven-from, from the target."""
    import threading

    from tests.integration.test_manage_api import consumers, drain as drain_all

    nodes = start_nodes(3, *admin)
    dst = consumers(nodes[1], "/queue/mdst", 1) + consumers(nodes[2], "/queue/mdst", 1)
    producer = login(nodes[0])
    sent = [f"v{i:04d}" for i in range(1500)]
    for body in sent[:300]:  # a backlog first, part of it moved before the consumers come
        producer.conn.send("/queue/msrc", body, headers={"receipt": body})
    producer.wait(lambda c: len(c.receipts) == 300, what="the backlog's receipts")
    moved = Api(nodes[0]).ok("POST", f"/api/queues/%2F/{q('/queue/msrc')}/move", {"to": "/queue/mdst", "count": 100})
    assert moved == {"moved": 100, "left": None}, moved
    moved = 100
    src = consumers(nodes[1], "/queue/msrc", 1) + consumers(nodes[2], "/queue/msrc", 1)
    deadline = time.monotonic() + 30

    def produce():
        for body in sent[300:]:
            producer.conn.send("/queue/msrc", body, headers={"receipt": body})

    thread = threading.Thread(target=produce)
    thread.start()
    asks = 1
    while (thread.is_alive() or asks < 4) and time.monotonic() < deadline + 30:
        moved += Api(nodes[2 * (asks % 2)]).ok("POST", f"/api/queues/%2F/{q('/queue/msrc')}/move",
                                               {"to": "/queue/mdst"})["moved"]
        asks += 1
    thread.join(30)
    producer.wait(lambda c: len(c.receipts) == len(sent), timeout=30, what="receipts")
    delivered = drain_all(src + dst, len(sent))
    unique = set(delivered)
    redriven = sum(x.redriven for x in dst)
    result = {"sent": len(sent), "receipted": len(producer.receipts), "moves": asks, "moved": moved,
              "delivered": len(delivered), "from target": sum(len(x.bodies) for x in dst), "redriven": redriven,
              "lost": len(set(sent) - unique), "duplicated": len(delivered) - len(unique)}
    print("move while consumers run:", result)
    assert not unique - set(sent)
    assert result["lost"] == 0 and result["duplicated"] == 0, result
    assert moved > 0 and redriven == moved == result["from target"], result
    producer.close()


def test_a_move_and_a_peek_take_at_most_max_answer_bytes_at_once(start_nodes, admin):
    """max_answer_bytes=8000 and 1 KB messages: each move takes a pack or two (what goes over is
    given back), a peek shows what fits; moved again until done, each message arrives once."""
    nodes = start_nodes(2, "max_answer_bytes=8000", *admin)
    producer = login(nodes[0])
    sent = [f"{i:03d}" + "x" * 1000 for i in range(60)]
    for body in sent:  # (pipelined: packs of several)
        producer.conn.send("/queue/big", body, headers={"receipt": body[:3]})
    producer.wait(lambda c: len(c.receipts) == len(sent), what="receipts")
    api = Api(nodes[1])
    page = api.ok("GET", f"/api/queues/%2F/{q('/queue/big')}/messages?count=100")
    assert page["truncated"] and 0 < len(page["messages"]) < 60, (page["count"], page["truncated"])
    moved, asks = 0, 0
    while moved < 60 and asks < 60:
        answer = api.ok("POST", f"/api/queues/%2F/{q('/queue/big')}/move", {"to": "/queue/small"})
        # (0 only when cut short, and then it says so: the queue's consumer, made by the first move,
        # can have its leader elected for longer than the move's time on a loaded machine)
        assert 0 < answer["moved"] < 60 or (answer["moved"] == 0 and answer.get("truncated")), answer
        moved += answer["moved"]
        asks += 1
    assert moved == 60 and asks > 1, (moved, asks)
    consumer = login(nodes[0])
    consumer.conn.subscribe("/queue/small", id="s", ack="client-individual")
    delivered = drain(consumer, 60, timeout=20)
    assert sorted(delivered) == sent and all(m.headers["redriven-from"] == "/queue/big" for m in consumer.messages)
    producer.close()
    consumer.close()


def delete_when_idle(api: Api, destination: str, timeout: float = 15) -> dict:
    """A queue's delete, asked again while it answers 409 (its last consumer's node is still giving
    its messages back to JetStream): the first other answer."""
    deadline = time.monotonic() + timeout
    while True:
        status, value, _ = api.call("DELETE", f"/api/queues/%2F/{q(destination)}")
        if status != 409 or time.monotonic() > deadline:
            assert status == 200, (status, value)
            return value
        assert "in use" in value["reason"], value
        time.sleep(0.1)


def test_delete_from_any_node_is_refused_while_another_node_uses_the_queue_and_done_once_idle(
        start_nodes, nats_cluster, cluster_name, admin, tmp_path):
    # (a message JetStream sent to a node's pull as the node let it go is delivered nowhere: it
    # counts as delivered and unacknowledged, refusing the delete, until cluster_ack_wait_ms)
    nodes = start_nodes(3, "cluster_ack_wait_ms=3000", *admin)
    api = Api(nodes[2])
    path = f"/api/queues/%2F/{q('/queue/gone')}"
    consumer = login(nodes[1])   # holds one, delivered and unacknowledged (prefetch 1: it pulls no more)
    consumer.conn.subscribe("/queue/gone", id="c", ack="client-individual",
                            headers={"prefetch-count": "1", "receipt": "sub"})
    consumer.wait(lambda c: "sub" in c.receipts, what="subscribed")
    producer = login(nodes[0])
    for i in range(5):
        producer.conn.send("/queue/gone", f"g{i}", headers={"receipt": f"g{i}"})
    producer.wait(lambda c: len(c.receipts) == 5, what="receipts")
    consumer.wait(lambda c: len(c.messages) == 1, what="one delivery")
    status, value, _ = api.call("DELETE", path)
    assert status == 409 and "in use in the cluster" in value["reason"], (status, value)
    assert re.search(r"[1-9]\d* messages delivered to nodes and not acknowledged", value["reason"]), value
    assert stored(nats_cluster, cluster_name, "/queue/gone") >= 1   # nothing taken
    consumer.conn.ack(consumer.messages[0].headers["ack"])
    consumer.close()             # gone: its node gives back what it pulled
    assert delete_when_idle(api, "/queue/gone") == {"deleted": True, "purged": 4}
    assert stored(nats_cluster, cluster_name, "/queue/gone") == 0
    assert api.ok("DELETE", path) == {"deleted": False, "purged": 0}              # a retry is safe
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/never')}") == {"deleted": False, "purged": 0}
    assert api.ok("GET", path + "/messages")["messages"] == []

    idle = login(nodes[1])       # a subscriber with nothing to take: its node's pull waits in JetStream
    idle.conn.subscribe("/queue/gone", id="i", ack="client-individual", headers={"receipt": "sub"})
    idle.wait(lambda c: "sub" in c.receipts, what="subscribed")
    producer.conn.send("/queue/gone", "after", headers={"receipt": "after"})
    idle.wait(lambda c: len(c.messages) == 1, what="a message after the delete")   # (the queue works again)
    idle.conn.ack(idle.messages[0].headers["ack"])
    deadline = time.monotonic() + 10
    while True:   # (refused from then on; once the ack is seen, for its node's pull)
        status, value, _ = api.call("DELETE", path)
        assert status == 409 and "in use in the cluster" in value["reason"], (status, value)
        if re.search(r"[1-9]\d* pull requests of nodes with subscribers on it", value["reason"]) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert re.search(r"[1-9]\d* pull requests of nodes with subscribers on it", value["reason"]), value
    idle.close()
    assert delete_when_idle(api, "/queue/gone") == {"deleted": True, "purged": 0}
    producer.close()
    lines = [(e["status"], e.get("purged")) for e in audit(tmp_path, "delete")]
    assert lines[0] == (409, None) and (200, 4) in lines and lines[-1] == (200, 0), lines
    metrics = api.call("GET", "/metrics")[1].decode()
    assert re.search(r'stompbroker_http_actions_total\{action="delete",status="409"\} [1-9]', metrics)
    assert re.search(r'stompbroker_http_actions_total\{action="delete",status="200"\} [1-9]', metrics)


def test_a_subscriber_whose_queues_consumer_is_deleted_under_it_has_it_made_again(start_nodes, nats_cluster,
                                                                                 cluster_name, admin):
    """The race a delete leaves: a subscriber that arrives on another node after the delete looked
    and before it deleted the queue's consumer. Its node pulls a consumer that is gone; it makes it
    again (the consumer is deleted here by hand, as the delete would), and gets what comes next."""
    import nats

    nodes = start_nodes(2, *admin)
    consumer = login(nodes[1])
    consumer.conn.subscribe("/queue/raced", id="c", ack="client-individual", headers={"receipt": "sub"})
    consumer.wait(lambda c: "sub" in c.receipts, what="subscribed")
    producer = login(nodes[0])
    producer.conn.send("/queue/raced", "before", headers={"receipt": "before"})
    consumer.wait(lambda c: len(c.messages) == 1, what="the first message")   # (its consumer is made)
    consumer.conn.ack(consumer.messages[0].headers["ack"])
    stream = shards.stream_name(cluster_name, shards.QUEUES, 6, shards.shard_of("/queue/raced", 6), DEFAULT_PACK)

    async def delete():
        nc = await nats.connect(nats_cluster.urls[1])
        js = nc.jetstream(timeout=10)
        try:   # (once the ack is in, the node's pull waiting: as the delete finds an idle queue)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                info = await js.consumer_info(stream, "q_%2Fqueue%2Fraced")
                subject = shards.queue_subject(cluster_name, 6, "/queue/raced", DEFAULT_PACK)
                held = await js.stream_info(stream, subjects_filter=subject)
                if not info.num_ack_pending and info.num_waiting and not held.state.subjects:
                    break
                await asyncio.sleep(0.05)
            await js.delete_consumer(stream, "q_%2Fqueue%2Fraced")
        finally:
            await nc.close()
    asyncio.run(delete())
    producer.conn.send("/queue/raced", "after", headers={"receipt": "after"})
    producer.wait(lambda c: "after" in c.receipts, what="stored")
    consumer.wait(lambda c: len(c.messages) >= 2, timeout=10, what="the message after its consumer was deleted")
    assert [m.body for m in consumer.messages] == ["before", "after"]
    consumer.close()
    producer.close()


FEED = "root\x1fapp1/feed"   # the key of client-id app1's subscription "feed" (login root)


def feed(node, **headers) -> Client:
    """A client of the durable subscription ``feed`` of /topic/feed on ``node``."""
    c = Client(node, login="root", passcode="toor", **{"client-id": "app1"})
    c.conn.subscribe("/topic/feed", id="f", ack="client-individual",
                     headers={"activemq.subscriptionName": "feed", "receipt": "sub", **headers})
    c.wait(lambda c: "sub" in c.receipts or c.errors, what="subscribed")
    return c


STREAM_NOT_FOUND = 10059   # (JetStream's err_code; a consumer not found is another)


def jetstream_asked(nats_cluster, ask):
    """``ask(jetstream)``'s answer, asked again while JetStream does not answer or says the stream is
    not found, for at most 30 s: a request that reaches a stream or a consumer while its leader is
    being elected can go unanswered, or be told the stream is not there (the nodes move leaders to
    spread them; in full runs a 10 s request once went unanswered, and a stream the test had used
    was once "not found")."""
    import nats
    import nats.errors
    import nats.js.errors

    async def main():
        nc = await nats.connect(nats_cluster.urls[1])
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    return await ask(nc.jetstream(timeout=3))
                except (nats.errors.TimeoutError, nats.js.errors.NotFoundError) as exc:
                    if isinstance(exc, nats.js.errors.NotFoundError) and exc.err_code != STREAM_NOT_FOUND:
                        raise
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()
    return asyncio.run(main())


def feed_pending(nats_cluster, cluster_name: str) -> int | None:
    """The messages the feed's JetStream consumer has not had acknowledged; None: no consumer."""
    import nats.js.errors

    async def ask(js):
        stream = shards.stream_name(cluster_name, shards.TOPICS, 6, shards.shard_of("/topic/feed", 6))
        try:
            info = await js.consumer_info(stream, "d_root%2Fapp1%2Ffeed")
        except nats.js.errors.NotFoundError:
            return None
        return info.num_pending + info.num_ack_pending
    return jetstream_asked(nats_cluster, ask)


def feed_kept(nats_cluster, cluster_name: str) -> int:
    """The topic messages to /topic/feed JetStream keeps (for durables, replay-from)."""
    async def ask(js):
        stream = shards.stream_name(cluster_name, shards.TOPICS, 6, shards.shard_of("/topic/feed", 6))
        subject = shards.topic_subject(cluster_name, 6, "/topic/feed")
        info = await js.stream_info(stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)
    return jetstream_asked(nats_cluster, ask)


def durables(node) -> list[str]:
    return [s["key"] for s in Api(node).ok("GET", "/api/subscriptions")["items"] if s["durable"]]


def cluster_figures(node) -> dict:
    return cluster_diag(node, login="root", passcode="toor")


def wait_connected(nodes, timeout: float = 15) -> None:
    """Every node's bridge connected to NATS, so it hears what the others publish from now on (a
    node that is not hears nothing of a durable subscription ended elsewhere meanwhile:
    docs/cluster.md, "What is not guaranteed")."""
    for node in nodes:
        wait_for(lambda: cluster_figures(node)["connected"], timeout, f"{node.address} to connect to NATS")


def wait_peers(node, n: int, timeout: float = 15) -> None:
    """``node`` has read ``n`` other nodes' entries in the interest bucket (DIAG ``cluster.peers``):
    the nodes its removal of a durable subscription waits for."""
    wait_for(lambda: cluster_figures(node)["peers"] >= n, timeout, f"{node.address} to read {n} other nodes' entries")


def test_remove_a_durable_from_any_node_drops_every_nodes_record_and_its_messages(start_nodes, admin, tmp_path,
                                                                                  nats_cluster, cluster_name):
    nodes = start_nodes(3, "cluster_ack_wait_ms=5000", *admin)
    wait_connected(nodes)
    api = Api(nodes[1])
    path = f"/api/subscriptions/%2F/{q(FEED)}"
    for node in (nodes[0], nodes[2]):       # attached and left on two nodes: both keep its record
        c = feed(node)
        c.close()
    assert [durables(n) for n in nodes] == [[FEED], [], [FEED]]
    # n1 has read n0's and n2's entries in the interest bucket, so its removal waits for both answers
    # (a node not listed yet is not waited for: docs/cluster.md, "What is not guaranteed"; a full
    # run failed once without this)
    wait_peers(nodes[1], 2)
    sender = login(nodes[1])
    for i in range(3):                      # kept for it while it is away
        sender.conn.send("/topic/feed", f"old{i}", headers={"persistent": "true", "receipt": f"old{i}"})
    sender.wait(lambda c: len(c.receipts) == 3, what="stored")
    # (JetStream counts a consumer's pending messages a moment after storing, and may answer that a
    # durable's consumer made a moment ago is not found yet)
    deadline = time.monotonic() + 30
    while (feed_pending(nats_cluster, cluster_name) or 0) < 3:
        assert time.monotonic() < deadline, "the feed's consumer never counted its 3 messages"
        time.sleep(0.1)
    assert api.ok("DELETE", path) == {"removed": FEED, "dropped": 3}
    assert feed_pending(nats_cluster, cluster_name) is None   # its consumer is gone
    assert [durables(n) for n in nodes] == [[], [], []]
    status, value, _ = api.call("DELETE", path)           # a retry: as for an unknown one, on one node
    assert status == 404 and value["reason"] == "no such durable subscription", (status, value)
    deadline = time.monotonic() + 10       # no node keeps /topic/feed's messages once it heard
    for i in itertools.count():
        kept = feed_kept(nats_cluster, cluster_name)
        sender.conn.send("/topic/feed", "unkept", headers={"receipt": f"u{i}"})
        sender.wait(lambda c: f"u{i}" in c.receipts, what="receipt")   # (a kept one's once stored)
        if feed_kept(nats_cluster, cluster_name) == kept:
            break
        assert time.monotonic() < deadline, "topic messages are still kept for the removed durable"
        time.sleep(0.1)
    again = feed(nodes[2])                  # the same name again: afresh, none of the old messages
    sender.conn.send("/topic/feed", "new", headers={"persistent": "true", "receipt": "new"})
    again.wait(lambda c: len(c.messages) >= 1, what="the new message")
    time.sleep(0.5)
    assert [m.body for m in again.messages] == ["new"]
    again.close()
    sender.close()
    assert [(e["status"], e.get("dropped")) for e in audit(tmp_path, "unsubscribe")] == [(200, 3), (404, None)]
    metrics = api.call("GET", "/metrics")[1].decode()
    assert 'stompbroker_http_actions_total{action="unsubscribe",status="200"} 1.0' in metrics


def test_a_durable_a_client_ends_on_one_node_is_dropped_by_the_nodes_it_was_on_before(start_nodes, admin,
                                                                                      nats_cluster, cluster_name):
    """Made on n0 and left there, taken up on n2 and ended there by its client (UNSUBSCRIBE): n0
    drops its record too, so no node keeps /topic/feed's messages for it any more."""
    nodes = start_nodes(3, *admin)
    wait_connected(nodes)
    away = feed(nodes[0])
    away.close()
    deadline = time.monotonic() + 10   # (n0 has seen its client go: a drop finds it detached)
    while any(s["attached"] for s in Api(nodes[0]).ok("GET", "/api/subscriptions")["items"] if s["durable"]):
        assert time.monotonic() < deadline, "n0 did not see its client of the durable go"
        time.sleep(0.05)
    client = feed(nodes[2])
    assert [durables(n) for n in nodes] == [[FEED], [], [FEED]]
    client.conn.unsubscribe(id="f", headers={"receipt": "gone"})
    client.wait(lambda c: "gone" in c.receipts, what="the UNSUBSCRIBE's receipt")
    deadline = time.monotonic() + 10
    while durables(nodes[0]):
        assert time.monotonic() < deadline, "n0 kept its record of the ended durable subscription"
        time.sleep(0.05)
    assert [durables(n) for n in nodes] == [[], [], []]
    sender = login(nodes[1])
    deadline = time.monotonic() + 10       # no node keeps /topic/feed's messages once it heard
    for i in itertools.count():
        kept = feed_kept(nats_cluster, cluster_name)
        sender.conn.send("/topic/feed", "unkept", headers={"receipt": f"u{i}"})
        sender.wait(lambda c: f"u{i}" in c.receipts, what="receipt")
        if feed_kept(nats_cluster, cluster_name) == kept:
            break
        assert time.monotonic() < deadline, "topic messages are still kept for the ended durable"
        time.sleep(0.1)
    again = feed(nodes[0])                 # the same name on n0 again: no hold left, afresh
    assert not again.errors and "sub" in again.receipts
    again.close()
    client.close()
    sender.close()


def test_remove_a_durable_attached_on_another_node_is_409_and_removes_nothing(start_nodes, admin):
    nodes = start_nodes(3, *admin)
    wait_connected(nodes)
    away = feed(nodes[0])                   # made on n0, left, kept on n0 too
    away.close()
    attached = feed(nodes[2])
    wait_peers(nodes[1], 2)                 # (n1 lists n0 and n2 among the nodes to ask)
    status, value, _ = Api(nodes[1]).call("DELETE", f"/api/subscriptions/%2F/{q(FEED)}")
    assert status == 409 and "attached to a connection on node n2" in value["reason"], (status, value)
    assert "nothing was removed" in value["reason"]
    assert [durables(n) for n in nodes] == [[FEED], [], [FEED]]
    sender = login(nodes[1])
    sender.conn.send("/topic/feed", "still", headers={"persistent": "true", "receipt": "still"})
    attached.wait(lambda c: len(c.messages) == 1, what="a message to the durable kept")
    assert attached.messages[0].body == "still"
    attached.close()
    back = feed(nodes[0])                   # (its hold on n0 was released: it attaches again)
    assert not back.errors and "sub" in back.receipts
    back.close()
    sender.close()


def test_remove_an_unknown_durable_is_404_as_on_one_node(start_nodes, admin):
    nodes = start_nodes(2, *admin)
    status, value, _ = Api(nodes[0]).call("DELETE", f"/api/subscriptions/%2F/{q('root' + chr(31) + 'never')}")
    assert status == 404 and value["reason"] == "no such durable subscription", (status, value)


def test_remove_a_durable_while_a_node_does_not_answer_is_503_and_removes_nothing(start_nodes, admin):
    import os
    import signal

    nodes = start_nodes(3, "cluster_timeout_ms=4000", *admin)
    for node in (nodes[0], nodes[2]):
        feed(node).close()
    wait_peers(nodes[1], 2)   # (n1 lists n0: it waits for its answer)
    os.killpg(nodes[0].proc.pid, signal.SIGKILL)   # its interest stays in the bucket until it expires
    started = time.monotonic()
    status, value, _ = Api(nodes[1]).call("DELETE", f"/api/subscriptions/%2F/{q(FEED)}")
    assert status == 503 and "node n0 did not answer within 1000 ms" in value["reason"], (status, value)
    assert "nothing was removed" in value["reason"] and time.monotonic() - started < 5
    assert durables(nodes[2]) == [FEED]
