"""stompbroker/cluster/jetstream.py, publisher.py and fastpath.py against a real 3-server NATS JetStream
cluster: streams, shared durable pull consumers with credits, ack / nak / term, de-duplication,
redelivery after ack_wait, replay, pipelined publishes (raw and through nats-py's public API)."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import nats.js.errors
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


async def store(js, subject, data, msg_id):
    """One message stored (PubAck awaited), with its Nats-Msg-Id as the broker sends it. A stream just
    made may not be known yet to the server the client is on ("no responders" for a moment, seen
    in CI beside another NATS cluster): published again for up to 10 s, as the bridge's publisher
    does (nothing was stored; the same id would be stored once anyway)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return await js.publish(subject, data, headers={"Nats-Msg-Id": msg_id})
        except nats.js.errors.NoStreamResponseError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


class Pulled:
    """A pulled message as the Puller hands it on (its ack subject and payload), settled the way
    the bridge settles it: a publish to the ack subject."""

    def __init__(self, nc, reply: bytes, data: bytes):
        self.nc, self.reply, self.data = nc, reply.decode(), data
        self.num_delivered = J.delivered_count(reply)

    async def ack(self):
        await self.nc.publish(self.reply, b"")

    async def nak(self):
        await self.nc.publish(self.reply, b"-NAK")

    async def term(self):
        await self.nc.publish(self.reply, b"+TERM")


def keep(nc, got: list):
    return lambda reply, data, n=1: got.append(Pulled(nc, reply, data))


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
        p1 = J.Puller(nc1, stream, "c1", keep(nc1, got1))
        p2 = J.Puller(nc2, stream, "c1", keep(nc2, got2))
        await p1.start()
        await p2.start()
        for i in range(40):
            await store(js1, f"{name}.q.a", b"m%d" % i, f"id-{i}")
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
        first = await store(js, f"{name}.q.a", b"x", "dup-1")
        again = await store(js, f"{name}.q.a", b"x", "dup-1")
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
        p = J.Puller(nc, stream, "c1", keep(nc, got))
        await p.start()
        await store(js, f"{name}.q.a", b"x", "n1")
        await p.credit(1)
        await until(lambda: len(got) == 1)
        assert got[0].num_delivered == 1
        await got[0].nak()
        await p.credit(1)
        await until(lambda: len(got) == 2)
        assert got[1].data == b"x" and got[1].num_delivered == 2
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
        p1 = J.Puller(nc1, stream, "c1", keep(nc1, got1))
        await p1.start()
        await store(js1, f"{name}.q.a", b"x", "w1")
        await p1.credit(1)
        await until(lambda: len(got1) == 1)
        await nc1.close()  # a node gone with the message unacknowledged
        nc2, _ = await connect(nats_url, 2)
        p2 = J.Puller(nc2, stream, "c1", keep(nc2, got2))
        await p2.start()
        await p2.credit(1)
        started = time.monotonic()
        await until(lambda: len(got2) == 1, timeout=5)
        assert got2[0].data == b"x" and got2[0].num_delivered == 2
        assert time.monotonic() - started > 0.3  # not before ack_wait
        await nc2.close()
    run(main())


def test_replay_from_a_start_time_and_a_durable_topic_consumer(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        stream = shards.stream_name(name, shards.TOPICS, 1, 0)
        await J.declare_stream(js, stream, [f"{name}.d.>"], 0, work_queue=False, max_age=60)
        for i in range(3):
            await store(js, f"{name}.d.news", b"old%d" % i, f"o{i}")
        await asyncio.sleep(0.05)
        since = time.time()
        await asyncio.sleep(0.05)
        await J.declare_consumer(js, stream, "dur1", f"{name}.d.news", 30.0, start_time=since)
        for i in range(3):
            await store(js, f"{name}.d.news", b"new%d" % i, f"n{i}")
        await store(js, f"{name}.d.other", b"other", "x1")
        replayed = [m.data async for m in J.replay(js, stream, f"{name}.d.news", since)]
        assert replayed == [b"new0", b"new1", b"new2"]
        everything = [m.data async for m in J.replay(js, stream, f"{name}.d.>", 0)]
        assert len(everything) == 7
        got = []
        p = J.Puller(nc, stream, "dur1", keep(nc, got))
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
        await store(js, f"{name}.d.a", b"for a", "a1")
        await J.declare_consumer(js, stream, "dur", [f"{name}.d.a"], 30.0, start_time=time.time())  # kept
        assert (await js.consumer_info(stream, "dur")).num_pending == 1
        await J.declare_consumer(js, stream, "dur", [f"{name}.d.b", f"{name}.d.c"], 30.0, start_time=time.time())
        await store(js, f"{name}.d.b", b"for b", "b1")
        got = []
        p = J.Puller(nc, stream, "dur", keep(nc, got))
        await p.start()
        await p.credit(10)
        await until(lambda: len(got) == 1)
        await asyncio.sleep(0.2)
        assert [m.data for m in got] == [b"for b"]
        await nc.close()
    run(main())


async def publisher(nc, fast=None):
    from stompbroker.cluster.fastpath import FastPath
    from stompbroker.cluster.publisher import Publisher
    stored, failed = [], []
    p = Publisher(nc, fast or FastPath(nc), stored.append, lambda token, why, refused: failed.append((token, refused)))
    await p.start()
    p.ready = True

    async def ticks():  # as the bridge's timer does: retries go out, deadlines pass
        while True:
            await asyncio.sleep(0.1)
            p.tick(time.monotonic())
    p.ticker = asyncio.get_running_loop().create_task(ticks())
    return p, stored, failed


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "public-api"])
def test_pipelined_publishes_are_each_answered_and_stored_once(nats_url, raw):
    """Many publishes in flight on one connection, every PubAck matched to its token; a second
    publish of a Nats-Msg-Id (sent while the first is being stored: JetStream answers 10158 "in
    process" then) is answered stored without a second copy. ``public-api``: the
    same through nats-py's public calls, as on a nats-py without the internals fastpath uses."""
    from stompbroker.cluster.fastpath import FastPath

    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        stream, _ = await setup_queue(js, name)
        fast = FastPath(nc)
        if not raw:
            fast.raw_in = fast.raw_out = False
        p, stored, failed = await publisher(nc, fast)
        deadline = time.monotonic() + 10
        for i in range(500):
            p.publish((i + 1,), f"{name}.q.a".encode(), f"m{i}", b"body %d" % i, deadline)
            if i % 10 == 0:  # sent again at once: often "duplicate message id is in process", retried
                p.publish((1000 + i,), f"{name}.q.a".encode(), f"m{i}", b"again", deadline)
        assert p.pending() == 550  # all out before any PubAck came back
        await until(lambda: len(stored) + len(failed) == 550)
        assert sorted(stored) == list(range(1, 501)) + list(range(1000, 1500, 10)) and not failed
        assert (await js.stream_info(stream)).state.messages == 500
        got = []
        puller = J.Puller(nc, stream, "c1", keep(nc, got), fast)
        await puller.start()
        await puller.credit(600)
        await until(lambda: len(got) == 500)
        assert [m.data for m in got[:3]] == [b"body 0", b"body 1", b"body 2"]  # stream order
        await nc.close()
    run(main())


def test_a_publish_without_a_stream_is_retried_until_its_deadline_then_fails(nats_url):
    async def main():
        nc, _ = await connect(nats_url)
        p, stored, failed = await publisher(nc)
        started = time.monotonic()
        p.publish((1,), b"nostream.q.a", "z", b"x", time.monotonic() + 0.6)
        await until(lambda: failed)
        assert failed == [(1, False)] and not stored  # "may have been stored": the sender may retry
        assert p.stats["retried"] >= 2 and time.monotonic() - started < 2
        await nc.close()
    run(main())


def test_a_full_destination_is_refused_as_full(nats_url):
    async def main():
        name = "t" + uuid.uuid4().hex[:8]
        nc, js = await connect(nats_url)
        await J.declare_stream(js, shards.stream_name(name, shards.QUEUES, 1, 0), [f"{name}.q.>"], 0, work_queue=True, per_subject=2)
        p, stored, failed = await publisher(nc)
        for i in range(3):
            p.publish((i + 1,), f"{name}.q.a".encode(), f"f{i}", b"x", time.monotonic() + 5)
        await until(lambda: len(stored) + len(failed) == 3)
        assert stored == [1, 2] and failed == [(3, "full")]
        await nc.close()
    run(main())
