"""The NATS cluster fixture itself: three real nats-server processes with JetStream, one killed and
restarted, JetStream answering throughout (R3 stream, publish with PubAck, read back)."""

import asyncio
import socket
import time

import nats
import nats.js.errors
import pytest

from tests.natscluster import NatsCluster


async def _retry(op, deadline: float):
    """A stream whose leader was just lost answers again after an election: retry until deadline."""
    while True:
        try:
            return await op()
        except (nats.errors.Error, asyncio.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _roundtrip(servers: list[str], stream: str, payloads: list[bytes], expect: int, timeout: float = 20):
    """Store payloads in an R3 stream (each publish waits for its PubAck; a retry carries the same
    Nats-Msg-Id, so it cannot duplicate) and read the whole stream back: ``expect`` messages."""
    deadline = time.monotonic() + timeout
    nc = await nats.connect(servers=servers, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream(timeout=2)

        async def add():
            try:
                await js.add_stream(name=stream, subjects=[f"{stream}.>"], num_replicas=3)
            except nats.js.errors.BadRequestError:
                await js.stream_info(stream)  # exists (a later round); else this raises and it is asked again
        await _retry(add, deadline)
        for p in payloads:
            ack = await _retry(lambda: js.publish(f"{stream}.x", p, headers={"Nats-Msg-Id": p.decode()}), deadline)
            assert ack.stream == stream
        sub = await _retry(lambda: js.pull_subscribe(f"{stream}.>", durable=None), deadline)
        got = []
        while len(got) < expect and time.monotonic() < deadline:
            try:
                got += [m.data for m in await sub.fetch(expect - len(got), timeout=1)]
            except nats.errors.TimeoutError:
                pass
            except nats.js.errors.ServiceUnavailableError:
                await asyncio.sleep(0.2)  # (the consumer's own leader is not elected yet)
        try:  # nothing beyond what was expected
            got += [m.data for m in await sub.fetch(1, timeout=0.3)]
        except nats.errors.TimeoutError:
            pass
        return got
    finally:
        await nc.close()


def test_cluster_starts_with_meta_leader_and_jetstream(nats_cluster):
    assert len(nats_cluster.urls) == 3
    assert nats_cluster.url_setting == ",".join(nats_cluster.urls)
    assert nats_cluster.meta_leader() in {s.name for s in nats_cluster.servers}
    got = asyncio.run(_roundtrip(nats_cluster.urls, "FIXTURE1", [b"a", b"b"], expect=2))
    assert got == [b"a", b"b"]


def test_kill_one_server_jetstream_still_answers_then_restart(nats_cluster):
    asyncio.run(_roundtrip(nats_cluster.urls, "FIXTURE2", [b"before"], expect=1))
    leader = nats_cluster.meta_leader()
    victim = next(s.index for s in nats_cluster.servers if s.name == leader)  # the hardest one to lose
    nats_cluster.kill(victim)
    try:
        assert nats_cluster.running() == [i for i in range(3) if i != victim]
        nats_cluster.wait_ready()  # the other two elect a new meta leader
        assert nats_cluster.meta_leader() not in (None, leader)
        live = [u for i, u in enumerate(nats_cluster.urls) if i != victim]
        got = asyncio.run(_roundtrip(live, "FIXTURE2", [b"during"], expect=2))
        assert got == [b"before", b"during"]  # the R3 stream kept its copies and took a new one
    finally:
        nats_cluster.restart(victim)
    assert nats_cluster.running() == [0, 1, 2]
    got = asyncio.run(_roundtrip([nats_cluster.urls[victim]], "FIXTURE2", [b"after"], expect=3))
    assert got == [b"before", b"during", b"after"]  # reached through the restarted server


def test_whole_cluster_down_and_back_keeps_stored_messages():
    with NatsCluster(3) as cluster:
        asyncio.run(_roundtrip(cluster.urls, "FIXTURE3", [b"kept"], expect=1))
        cluster.stop_all()
        assert cluster.running() == []
        for s in cluster.servers:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", s.client_port), timeout=1).close()
        cluster.start_all()
        got = asyncio.run(_roundtrip(cluster.urls, "FIXTURE3", [], expect=1))
        assert got == [b"kept"]  # same store dirs


def test_the_natscluster_tool_prints_the_cluster_setting_and_stops_cleanly(tmp_path):
    """`python -m stompbroker.tools.natscluster` (README, "Running a cluster")."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "stompbroker.tools.natscluster", "--port", "0",
                             "--dir", str(tmp_path / "data")], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        lines = []
        deadline = time.monotonic() + 40
        while not (lines and lines[-1].startswith("broker nodes:")) and time.monotonic() < deadline:
            lines.append(proc.stdout.readline())
        setting = lines[-1].split()[3]
        assert setting.startswith("cluster=nats://127.0.0.1:") and setting.count("nats://") == 3, lines
        port = int(setting.split(",")[0].rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        with pytest.raises(ConnectionRefusedError):  # its servers went with it
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert sorted(os.listdir(tmp_path / "data")) == ["nats0", "nats1", "nats2"]  # --dir: kept
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
