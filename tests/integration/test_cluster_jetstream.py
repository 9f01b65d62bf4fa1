"""stompbroker/cluster/jetstream.py against a real 3-server NATS JetStream cluster: streams, shared durable
pull consumers with credits, ack / nak / term, de-duplication, redelivery after ack_wait, replay."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest

from stompbroker.cluster import jetstream as J
from stompbroker.cluster import shards


@pytest.fixture
def nats_url(nats_cluster):
    return nats_cluster.urls


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def connect(urls, i=0):
    nc = await nats.connect(urls[i % len(urls)])
    return nc, nc.jetstream(timeout=15)


async def setup_queue(js, name, ack_wait=30.0):
    stream = shards.stream_name(name, shards.QUEUES, 1, 0)
    replicas = await J.declare_stream(js, stream, [f"{name}.q.>"], 0, work_queue=True)
    await J.declare_consumer(js, stream, "c1", f"{name}.q.a", ack_wait)
    return stream, replicas


async def until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


def test_competing_pullers_take_each_message_once_within_their_credit(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc1, js1 = await connect(nats_url)
        nc2, js2 = await connect(nats_url, 1)
        stream, replicas = await setup_queue(js1, name)
        assert replicas == 3  # three servers: three copies
        await J.declare_consumer(js2, stream, "c1", f"{name}.q.a", 30.0)  # the same again: fine
        got1, got2 = [], []
        p1 = J.Puller(nc1, stream, "c1", got1.append)
        p2 = J.Puller(nc2, stream, "c1", got2.append)
        await p1.start()
        await p2.start()
        deadline = time.monotonic() + 10
        for i in range(40):
            await J.publish(js1, f"{name}.q.a", b"m%d" % i, f"id-{i}", deadline)
        await p1.credit(5)
        await p2.credit(10)
        await until(lambda: len(got1) == 5 and len(got2) == 10)
        await asyncio.sleep(0.2)
        assert (len(got1), len(got2)) == (5, 10)  # never more than the credit
        for msg in got1 + got2:
            await msg.ack()
        await p1.credit(100)
        await until(lambda: len(got1) + len(got2) == 40)
        bodies = sorted(m.data for m in got1 + got2)
        assert bodies == sorted(b"m%d" % i for i in range(40))  # each exactly once
        for msg in got1[5:]:
            await msg.ack()
        await asyncio.sleep(0.2)
        info = await js1.stream_info(stream)
        assert info.state.messages == 0  # work queue: acked messages leave
        await nc1.close()
        await nc2.close()
    run(main())


def test_same_msg_id_is_stored_once(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        stream, _ = await setup_queue(js, name)
        deadline = time.monotonic() + 5
        first = await J.publish(js, f"{name}.q.a", b"x", "dup-1", deadline)
        again = await J.publish(js, f"{name}.q.a", b"x", "dup-1", deadline)
        assert again.duplicate and not first.duplicate
        assert (await js.stream_info(stream)).state.messages == 1
        await nc.close()
    run(main())


def test_nak_redelivers_with_delivery_count_and_term_drops(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        stream, _ = await setup_queue(js, name)
        got = []
        p = J.Puller(nc, stream, "c1", got.append)
        await p.start()
        await J.publish(js, f"{name}.q.a", b"x", "n1", time.monotonic() + 5)
        await p.credit(1)
        await until(lambda: len(got) == 1)
        assert got[0].metadata.num_delivered == 1
        await got[0].nak()
        await p.credit(1)
        await until(lambda: len(got) == 2)
        assert got[1].data == b"x" and got[1].metadata.num_delivered == 2
        await got[1].term()
        await asyncio.sleep(0.2)
        assert (await js.stream_info(stream)).state.messages == 0
        await nc.close()
    run(main())


def test_unacked_message_of_a_closed_connection_comes_back_after_ack_wait(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc1, js1 = await connect(nats_url)
        stream, _ = await setup_queue(js1, name, ack_wait=1.0)
        got1, got2 = [], []
        p1 = J.Puller(nc1, stream, "c1", got1.append)
        await p1.start()
        await J.publish(js1, f"{name}.q.a", b"x", "w1", time.monotonic() + 5)
        await p1.credit(1)
        await until(lambda: len(got1) == 1)
        await nc1.close()  # a node gone with the message unacknowledged
        nc2, _ = await connect(nats_url, 2)
        p2 = J.Puller(nc2, stream, "c1", got2.append)
        await p2.start()
        await p2.credit(1)
        started = time.monotonic()
        await until(lambda: len(got2) == 1, timeout=5)
        assert got2[0].data == b"x" and got2[0].metadata.num_delivered == 2
        assert time.monotonic() - started > 0.3  # not before ack_wait
        await nc2.close()
    run(main())


def test_publish_gives_up_at_its_deadline_without_a_stream(nats_url):
    async def main():
        nc, js = await connect(nats_url)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await J.publish(js, "nostream.q.a", b"x", "z", time.monotonic() + 0.5)
        assert time.monotonic() - started < 3
        await nc.close()
    run(main())


def test_replay_from_a_start_time_and_a_durable_topic_consumer(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        stream = shards.stream_name(name, shards.TOPICS, 1, 0)
        await J.declare_stream(js, stream, [f"{name}.d.>"], 0, work_queue=False, max_age=60)
        for i in range(3):
            await J.publish(js, f"{name}.d.news", b"old%d" % i, f"o{i}", time.monotonic() + 5)
        await asyncio.sleep(0.05)
        since = time.time()
        await asyncio.sleep(0.05)
        await J.declare_consumer(js, stream, "dur1", f"{name}.d.news", 30.0, start_time=since)
        for i in range(3):
            await J.publish(js, f"{name}.d.news", b"new%d" % i, f"n{i}", time.monotonic() + 5)
        await J.publish(js, f"{name}.d.other", b"other", "x1", time.monotonic() + 5)
        replayed = [m.data async for m in J.replay(js, stream, f"{name}.d.news", since)]
        assert replayed == [b"new0", b"new1", b"new2"]
        everything = [m.data async for m in J.replay(js, stream, f"{name}.d.>", 0)]
        assert len(everything) == 7
        got = []
        p = J.Puller(nc, stream, "dur1", got.append)
        await p.start()
        await p.credit(10)
        await until(lambda: len(got) == 3)
        assert [m.data for m in got] == [b"new0", b"new1", b"new2"]
        await nc.close()
    run(main())


def test_a_durable_consumer_declared_for_other_subjects_starts_afresh(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        stream = shards.stream_name(name, shards.TOPICS, 1, 0)
        await J.declare_stream(js, stream, [f"{name}.d.>"], 0, work_queue=False, max_age=60)
        await J.declare_consumer(js, stream, "dur", [f"{name}.d.a"], 30.0, start_time=time.time() - 1)
        await J.publish(js, f"{name}.d.a", b"for a", "a1", time.monotonic() + 5)
        await J.declare_consumer(js, stream, "dur", [f"{name}.d.a"], 30.0, start_time=time.time())  # kept
        assert (await js.consumer_info(stream, "dur")).num_pending == 1
        await J.declare_consumer(js, stream, "dur", [f"{name}.d.b", f"{name}.d.c"], 30.0, start_time=time.time())
        await J.publish(js, f"{name}.d.b", b"for b", "b1", time.monotonic() + 5)
        got = []
        p = J.Puller(nc, stream, "dur", got.append)
        await p.start()
        await p.credit(10)
        await until(lambda: len(got) == 1)
        await asyncio.sleep(0.2)
        assert [m.data for m in got] == [b"for b"]
        await nc.close()
    run(main())
