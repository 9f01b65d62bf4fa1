"""Packs across a cluster (cluster/packs.py): broker nodes on a real 3-server NATS JetStream cluster,
a producer pipelining SENDs (so one turn of the sending bridge has many for one queue, and packs
them), raw STOMP consumers. Counted: sent, receipted, delivered, lost, duplicated, and the
JetStream messages the queue's stream stored (fewer than the messages: packs).

- NACK of one member of a pack: that one comes again (redelivered), the others never;
- kill -9 of the node holding a pack half acknowledged: the whole pack comes back on another node,
  every copy marked redelivered, nothing receipted lost;
- max_queue_messages with packs: never more stored than the limit, ERROR queue full (receipt-id);
- kill -9 of the NATS server leading the queue's shard under packed load: packs retried by their
  Nats-Msg-Id, nothing receipted lost, no duplicate that is not marked redelivered;
- a node writing the unpacked format (cluster_pack_max=1) and one packing share a queue.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter

import pytest

from stompbroker.cluster import shards
from tests.natscluster import DEFAULT_PACK, kill_node, stream_leaders
from tests.stompwire import Wire

pytestmark = pytest.mark.timeout(120)

ACK_WAIT_MS = 2000


def wire(node, login: str = "") -> Wire:
    w = Wire(socket.create_connection(node.address, timeout=5))
    w.connect(**({"login": login} if login else {}))
    return w


def burst(w: Wire, queue: str, bodies: list[str]) -> tuple[set, list]:
    """Every SEND in one write (receipt = body); read until each is answered or an ERROR closes
    the connection: (receipted bodies, ERROR frames' headers)."""
    w.send(b"".join(b"SEND\ndestination:%s\npersistent:true\nreceipt:%s\n\n%s\0" % (queue.encode(), b.encode(),
                                                                                      b.encode()) for b in bodies))
    receipted, errors = set(), []
    while len(receipted) + len(errors) < len(bodies):
        try:
            command, headers, _ = w.read(timeout=15)
        except ConnectionError:
            break
        if command == "RECEIPT":
            receipted.add(headers["receipt-id"])
        elif command == "ERROR":
            errors.append(headers)
            break
    return receipted, errors


def consumer(node, queue: str, prefetch: int = 200) -> Wire:
    w = wire(node)
    w.frame("SUBSCRIBE", {"destination": queue, "id": "c", "ack": "client-individual", "prefetch-count": str(prefetch),
                          "receipt": "sub"})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "sub"})
    return w


def take(w: Wire, n: int, timeout: float = 15.0) -> list[tuple[dict, bytes]]:
    """The next ``n`` MESSAGEs (headers, body)."""
    out, deadline = [], time.monotonic() + timeout
    while len(out) < n:
        command, headers, body = w.read(timeout=max(deadline - time.monotonic(), 0.01))
        if command == "MESSAGE":
            out.append((headers, body))
    return out


def nothing_more(w: Wire, wait: float = 1.0) -> list:
    try:
        return [w.read(timeout=wait)]
    except TimeoutError:
        return []


def stream_state(nats_cluster, name: str) -> tuple[int, int]:
    """(messages in the stream now, JetStream messages it ever stored: its last sequence number).
    Asked again for up to 30 s: a stream whose leader is being elected, or a server slowed by a
    loaded machine, does not answer at once (a CI run saw one request go unanswered for 10 s)."""
    import nats

    async def main():
        nc = await nats.connect(servers=[s.url for s in nats_cluster.servers if s.running])
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    state = (await nc.jetstream(timeout=10).stream_info(name)).state
                    return state.messages, state.last_seq
                except TimeoutError:   # (nats.errors.TimeoutError and asyncio.TimeoutError too)
                    if time.monotonic() > deadline:
                        raise
        finally:
            await nc.close()
    return asyncio.run(main())


def queue_stream(cluster_name: str, queue: str, pack: int = DEFAULT_PACK) -> str:
    return shards.stream_name(cluster_name, shards.QUEUES, 6, shards.shard_of(queue, 6), pack)


def until_empty(nats_cluster, stream: str, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while (left := stream_state(nats_cluster, stream)[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def counts(receipted: set, deliveries: list[tuple[dict, bytes]]) -> dict:
    seen = Counter(body.decode() for _, body in deliveries)
    flagged = Counter(body.decode() for h, body in deliveries if h.get("redelivered") == "true")
    return {"receipted": len(receipted), "delivered": len(seen), "lost": len(receipted - set(seen)),
            "duplicated": sum(n - 1 for n in seen.values()),
            "duplicated_unflagged": sum(max(seen[b] - 1 - flagged[b], 0) for b in seen)}


def test_a_nacked_member_of_a_pack_comes_again_alone(start_nodes, nats_cluster, cluster_name):
    queue = "/queue/pack-nack"
    a, b = start_nodes(2, f"cluster_ack_wait_ms={ACK_WAIT_MS}")
    c = consumer(b, queue)
    bodies = [f"m{i:02d}" for i in range(40)]
    receipted, errors = burst(wire(a), queue, bodies)
    assert receipted == set(bodies) and not errors
    stream = queue_stream(cluster_name, queue)
    _, stored = stream_state(nats_cluster, stream)
    assert stored < len(bodies), stored                     # packed: fewer JetStream messages than messages
    got = take(c, 40)
    assert [body.decode() for _, body in got] == bodies     # in order
    nacked = got[5][0]
    for headers, _ in got:
        c.frame("NACK" if headers is nacked else "ACK", {"id": headers["ack"]})
    (again,) = take(c, 1)
    assert again[1] == b"m05" and again[0]["redelivered"] == "true" and again[0]["message-id"] == nacked["message-id"]
    c.frame("ACK", {"id": again[0]["ack"]})
    assert nothing_more(c) == []                            # its pack's other members: acked, never again
    result = counts(receipted, got + [again])
    print("cluster packs, NACK of a member:", result, f"{stored} JetStream messages for {len(bodies)}")
    assert result == {"receipted": 40, "delivered": 40, "lost": 0, "duplicated": 1, "duplicated_unflagged": 0}
    assert until_empty(nats_cluster, stream) == 0


def test_kill_9_of_the_node_holding_a_pack_half_acked_brings_it_back_whole_marked_redelivered(
        start_nodes, nats_cluster, cluster_name):
    queue = "/queue/pack-kill"
    a, b, c = start_nodes(3, f"cluster_ack_wait_ms={ACK_WAIT_MS}")
    first = consumer(b, queue)
    bodies = [f"k{i:02d}" for i in range(32)]
    receipted, errors = burst(wire(a), queue, bodies)
    assert receipted == set(bodies) and not errors
    stream = queue_stream(cluster_name, queue)
    assert stream_state(nats_cluster, stream)[1] < len(bodies)
    got = take(first, 32)
    for headers, _ in got[:8]:                              # half of the first pack acknowledged...
        first.frame("ACK", {"id": headers["ack"]})
    first.frame("DISCONNECT", {"receipt": "acks"})          # (the ACKs were handled: their receipt)
    assert first.read()[:2] == ("RECEIPT", {"receipt-id": "acks"})
    kill_node(b)                                            # ...and the node holding it dies
    second = consumer(c, queue)
    again = take(second, 32, timeout=ACK_WAIT_MS / 1000 + 15)
    for headers, _ in again:
        second.frame("ACK", {"id": headers["ack"]})
    assert nothing_more(second) == []
    assert all(h.get("redelivered") == "true" for h, _ in again), [h for h, _ in again if "redelivered" not in h]
    result = counts(receipted, got + again)
    print("cluster packs, kill -9 with a pack half acked:", result)
    assert result == {"receipted": 32, "delivered": 32, "lost": 0, "duplicated": 32, "duplicated_unflagged": 0}
    assert until_empty(nats_cluster, stream) == 0


def test_max_queue_messages_with_packs_is_never_exceeded(start_nodes, nats_cluster, cluster_name):
    """Packs of 2 (max_queue_messages=2000, cluster_pack_max=2): the queue's stream holds at most
    1000 JetStream messages, so at most 2000 messages; filled by bursts, the SEND that finds it
    full gets ERROR queue full with its receipt-id; every receipted message is delivered."""
    queue = "/queue/pack-full"
    a, b = start_nodes(2, "max_queue_messages=2000", "cluster_pack_max=2")
    receipted, error, sent = set(), None, 0
    w = wire(a)
    for n in range(30):                                     # (bounded: 3000 messages at most)
        bodies = [f"f{n:02d}-{i:03d}" for i in range(100)]
        sent += len(bodies)
        got, errors = burst(w, queue, bodies)
        receipted |= got
        if errors:
            error = errors[0]
            break
    assert error is not None and error["message"] == "queue full", error
    assert error["receipt-id"].startswith("f") and error["receipt-id"] not in receipted
    stream = queue_stream(cluster_name, queue, 2)
    held, _ = stream_state(nats_cluster, stream)
    assert held <= 1000 and len(receipted) > held, (held, len(receipted))   # packs: more messages than held
    c = consumer(b, queue, prefetch=500)
    got = []
    while True:
        batch = []
        try:
            batch = take(c, 1, timeout=2.0)
        except TimeoutError:
            break
        got += batch
        c.frame("ACK", {"id": batch[0][0]["ack"]})
    result = counts(receipted, got)
    print("cluster packs, max_queue_messages=2000 by 2:", result, f"sent {sent}, {held} JetStream messages held",
          f"refused: {error['receipt-id']}")
    assert len(got) <= 2000 and result["lost"] == 0 and result["duplicated"] == 0, result
    assert until_empty(nats_cluster, stream) == 0
    again, errors = burst(wire(a), queue, ["after"])         # room again
    assert again == {"after"} and not errors


def test_a_node_writing_one_message_each_and_a_packing_node_share_a_queue(start_broker, nats_cluster, cluster_name):
    """What holds when the nodes of a cluster differ in packing (a rolling upgrade: the version
    before packs writes one message per JetStream message, in the unpacked layout): each writes its
    own layout's streams, and a packing node reads both."""
    queue = "/queue/pack-mixed"
    old, new = (start_broker(f"cluster={nats_cluster.url_setting}", f"cluster_name={cluster_name}", f"node_id=n{i}",
                             f"cluster_pack_max={p}") for i, p in enumerate((1, 16)))
    c = consumer(new, queue)
    got_old, errors = burst(wire(old), queue, [f"o{i:02d}" for i in range(20)])
    assert len(got_old) == 20 and not errors
    got_new, errors = burst(wire(new), queue, [f"n{i:02d}" for i in range(20)])
    assert len(got_new) == 20 and not errors
    got = take(c, 40)
    for headers, _ in got:
        c.frame("ACK", {"id": headers["ack"]})
    result = counts(got_old | got_new, got)
    print("cluster packs, an unpacked and a packing node:", result)
    assert result == {"receipted": 40, "delivered": 40, "lost": 0, "duplicated": 0, "duplicated_unflagged": 0}
    bodies = [body.decode() for _, body in got]
    for prefix in "on":                                     # each layout's messages in their order
        mine = [x for x in bodies if x[0] == prefix]
        assert mine == sorted(mine)
    assert stream_state(nats_cluster, queue_stream(cluster_name, queue, 1))[1] == 20   # one message each
    assert stream_state(nats_cluster, queue_stream(cluster_name, queue, 16))[1] < 20   # packed


def test_kill_9_of_the_nats_server_leading_a_packed_queue_under_load(start_nodes, nats_cluster, cluster_name):
    """Bursts of 50 pipelined SENDs (packed) from n0, consumers on n1 and n2; the NATS server
    leading the queue's shard is killed mid-run: its packs wait for the election and are sent again
    with the same Nats-Msg-Id (stored once)."""
    queue = "/queue/pack-leader"
    nodes = start_nodes(3, f"cluster_ack_wait_ms={ACK_WAIT_MS}")
    stream = queue_stream(cluster_name, queue)
    deliveries, lock, stop = [], threading.Lock(), threading.Event()

    def consume(node):
        c = consumer(node, queue)
        while not stop.is_set():
            try:
                command, headers, body = c.read(timeout=0.5)
            except TimeoutError:
                continue
            if command == "MESSAGE":
                with lock:
                    deliveries.append((headers, body))
                c.frame("ACK", {"id": headers["ack"]})
        c.close()

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in nodes[1:]]
    for t in threads:
        t.start()
    receipted, errors, sent, killed = set(), [], 0, None
    w = wire(nodes[0])
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 12 and sent < 20_000:
            if killed is None and (time.monotonic() - t0 > 2 or sent >= 5_000):  # (a quiet machine sends 20,000 in 2 s)
                leader = stream_leaders(nats_cluster, [stream])[stream]
                killed = next(s.index for s in nats_cluster.servers if s.name == leader)
                nats_cluster.kill(killed)
            bodies = [f"b{sent + i:05d}" for i in range(50)]
            sent += len(bodies)
            got, errs = burst(w, queue, bodies)
            receipted |= got
            if errs:
                errors += errs
                w = wire(nodes[0])
        deadline = time.monotonic() + ACK_WAIT_MS / 1000 + 20
        while time.monotonic() < deadline:
            with lock:
                seen = {body.decode() for _, body in deliveries}
            if receipted <= seen:
                break
            time.sleep(0.2)
        time.sleep(1.0)   # (a duplicate would come now)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        if killed is not None:
            nats_cluster.restart(killed)
    with lock:
        result = counts(receipted, list(deliveries))
    print(f"cluster packs, kill -9 of the shard's leader (nats{killed}): {result}, sent {sent}, "
          f"errors {[e.get('message') for e in errors]}")
    assert killed is not None and result["receipted"] > 500, result
    assert result["lost"] == 0 and result["duplicated_unflagged"] == 0, result
