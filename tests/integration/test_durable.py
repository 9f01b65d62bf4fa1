"""Durable queues (store=sqlite): crashes, restarts, acks, transactions, durable subscriptions, replay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from stompwire import Wire, drain


def wire(broker) -> Wire:
    w = Wire(broker.connect(timeout=20))
    w.connect()
    return w


def kill_group(broker) -> None:
    """kill -9 the whole process group: supervisor, reader, dispatcher, writers."""
    os.killpg(broker.proc.pid, signal.SIGKILL)
    broker.proc.wait(10)


@pytest.fixture
def store_path(tmp_path):
    return str(tmp_path / "store.sqlite")


def durable(start_broker, store_path, *settings):
    return start_broker("store=sqlite", f"store_path={store_path}", *settings)


def test_receipted_messages_survive_kill_9_exactly_once_in_order(start_broker, store_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    n = 10_000
    pub.send(b"".join(b"SEND\ndestination:/queue/crash\nreceipt:%d\n\n%d\0" % (i, i) for i in range(n)))
    receipts = [pub.read(timeout=30) for _ in range(n)]
    assert [r[1]["receipt-id"] for r in receipts] == [str(i) for i in range(n)]
    kill_group(b)
    b2 = durable(start_broker, store_path)
    assert "recovered 10000 queued messages" in b2.log()
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/crash"})
    bodies = [int(sub.read(timeout=30)[2]) for _ in range(n)]
    assert bodies == list(range(n))
    assert drain(sub, 0.5) == []


def test_acked_do_not_come_back_unacked_do_with_redelivered(start_broker, store_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    for i in range(6):
        pub.frame("SEND", {"destination": "/queue/acks", "receipt": str(i)}, str(i).encode())
        pub.read()
    sub = wire(b)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/acks", "ack": "client-individual",
                            "prefetch-count": "2"})
    pending = [sub.read(), sub.read()]  # 0 and 1
    for _ in range(2):  # ack 0, then 1: each frees room for the next message
        frame = pending.pop(0)
        sub.frame("ACK", {"id": frame[1]["ack"], "receipt": "a" + frame[2].decode()})
        while True:  # the ACK is on disk once its receipt arrives
            reply = sub.read()
            if reply[0] == "RECEIPT":
                break
            pending.append(reply)
    assert [f[2] for f in pending] == [b"2", b"3"]  # delivered, not acknowledged
    kill_group(b)
    b2 = durable(start_broker, store_path)
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/acks"})
    frames = [sub.read() for _ in range(4)]
    assert [f[2] for f in frames] == [b"2", b"3", b"4", b"5"]
    assert [f[1].get("redelivered") for f in frames] == ["true", "true", None, None]
    assert drain(sub, 0.5) == []


def test_transaction_cut_by_kill_is_all_or_nothing(start_broker, store_path):
    for attempt in range(3):
        b = durable(start_broker, store_path)
        pub = wire(b)
        pub.frame("BEGIN", {"transaction": "t"})
        for i in range(200):
            pub.frame("SEND", {"destination": f"/queue/tx{attempt}", "transaction": "t"}, str(i).encode())
        pub.frame("COMMIT", {"transaction": "t"})
        time.sleep(0.002 * attempt)  # kill at different moments of the commit
        kill_group(b)
        b2 = durable(start_broker, store_path)
        sub = wire(b2)
        sub.frame("SUBSCRIBE", {"id": "1", "destination": f"/queue/tx{attempt}"})
        got = drain(sub, 0.7)
        assert len(got) in (0, 200), len(got)
        if got:
            assert [f[2] for f in got] == [str(i).encode() for i in range(200)]
        b2.stop()


def test_receipted_commit_survives(start_broker, store_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    pub.frame("BEGIN", {"transaction": "t"})
    for i in range(50):
        pub.frame("SEND", {"destination": "/queue/txok", "transaction": "t"}, str(i).encode())
    pub.frame("COMMIT", {"transaction": "t", "receipt": "c"})
    assert pub.read()[:2] == ("RECEIPT", {"receipt-id": "c"})
    kill_group(b)
    b2 = durable(start_broker, store_path)
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/txok"})
    assert [sub.read()[2] for _ in range(50)] == [str(i).encode() for i in range(50)]


def test_persistent_false_stays_in_memory(start_broker, store_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    pub.frame("SEND", {"destination": "/queue/mixed", "persistent": "false", "receipt": "1"}, b"volatile")
    pub.read()
    pub.frame("SEND", {"destination": "/queue/mixed", "receipt": "2"}, b"kept")
    pub.read()
    kill_group(b)
    b2 = durable(start_broker, store_path)
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/mixed"})
    assert [f[2] for f in drain(sub, 0.7)] == [b"kept"]


def test_sigterm_keeps_queued_messages(start_broker, store_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    for i in range(100):
        pub.frame("SEND", {"destination": "/queue/graceful"}, str(i).encode())
    pub.frame("DISCONNECT", {"receipt": "bye"})
    assert pub.read()[0] == "RECEIPT"
    assert b.stop(signal.SIGTERM) == 0
    b2 = durable(start_broker, store_path)
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/graceful"})
    assert [f[2] for f in drain(sub, 0.7)] == [str(i).encode() for i in range(100)]


def test_checkpoint_mode_commits_later(start_broker, store_path):
    b = durable(start_broker, store_path, "checkpoint=0.2")
    pub = wire(b)
    for i in range(100):
        pub.frame("SEND", {"destination": "/queue/cp", "receipt": str(i)}, str(i).encode())
    assert [pub.read()[0] for _ in range(100)] == ["RECEIPT"] * 100
    time.sleep(0.6)  # past a checkpoint: on disk now
    kill_group(b)
    b2 = durable(start_broker, store_path)
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/cp"})
    assert len(drain(sub, 0.7)) == 100


def test_corrupt_store_refuses_to_start_and_can_be_repaired(tmp_path):
    path = tmp_path / "bad.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    proc = subprocess.run([sys.executable, "-m", "stompbroker", "port=0", "store=sqlite", f"store_path={path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "cannot be used as a store" in proc.stderr and "not starting" in proc.stderr
    check = subprocess.run([sys.executable, "-m", "stompbroker.tools.store", "check", str(path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert check.returncode == 1


def test_export_and_repair_keep_readable_messages(start_broker, store_path, tmp_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    for i in range(20):
        pub.frame("SEND", {"destination": "/queue/exp", "receipt": str(i), "k": "v", "content-length": 2},
                  bytes([0, i]))
        pub.read()
    b.stop()
    out = tmp_path / "export.jsonl"
    subprocess.run([sys.executable, "-m", "stompbroker.tools.store", "export", store_path, "--out", str(out)],
                   cwd=ROOT, check=True, timeout=30)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 20 and rows[0]["queue"] == "/queue/exp" and rows[0]["headers"]["k"] == "v"
    repaired = subprocess.run([sys.executable, "-m", "stompbroker.tools.store", "repair", store_path],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert repaired.returncode == 0 and "nothing to repair" in repaired.stdout  # healthy: left alone
    b2 = durable(start_broker, store_path)
    sub = wire(b2)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/exp"})
    assert [f[2] for f in drain(sub, 0.7)] == [bytes([0, i]) for i in range(20)]


def test_durable_topic_subscription_keeps_messages_while_away(start_broker, store_path):
    b = durable(start_broker, store_path)
    sub = wire(b)
    sub.frame("SUBSCRIBE", {"id": "news-feed", "destination": "/topic/news", "durable": "true", "receipt": "s"})
    assert sub.read()[0] == "RECEIPT"
    pub = wire(b)
    pub.frame("SEND", {"destination": "/topic/news", "receipt": "0"}, b"while here")
    pub.read()
    assert sub.read()[2] == b"while here"
    sub.frame("DISCONNECT", {"receipt": "bye"})
    sub.read()
    for i in range(3):
        pub.frame("SEND", {"destination": "/topic/news", "receipt": str(i)}, f"away {i}".encode())
        pub.read()
    kill_group(b)  # and it survives a crash too
    b2 = durable(start_broker, store_path)
    back = wire(b2)
    back.frame("SUBSCRIBE", {"id": "news-feed", "destination": "/topic/news", "durable": "true"})
    assert [f[2] for f in drain(back, 0.7)] == [b"away 0", b"away 1", b"away 2"]


def test_activemq_durable_subscription_name_with_client_id(start_broker):
    b = start_broker()
    sub = Wire(b.connect())
    sub.connect(**{"client-id": "app1"})
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/amq", "activemq.subscriptionName": "s1",
                            "receipt": "r"})
    sub.read()
    sub.close()
    pub = wire(b)
    pub.frame("SEND", {"destination": "/topic/amq", "receipt": "p"}, b"kept for app1")
    pub.read()
    again = Wire(b.connect())
    again.connect(**{"client-id": "app1"})
    again.frame("SUBSCRIBE", {"id": "9", "destination": "/topic/amq", "activemq.subscriptionName": "s1"})
    assert again.read()[2] == b"kept for app1"
    again.frame("UNSUBSCRIBE", {"id": "9", "receipt": "u"})  # ends the durable subscription
    again.read()
    pub.frame("SEND", {"destination": "/topic/amq", "receipt": "p2"}, b"nobody")
    pub.read()
    third = Wire(b.connect())
    third.connect(**{"client-id": "app1"})
    third.frame("SUBSCRIBE", {"id": "9", "destination": "/topic/amq", "activemq.subscriptionName": "s1"})
    assert drain(third, 0.5) == []


def test_replay_from_time(start_broker, store_path):
    b = durable(start_broker, store_path)
    pub = wire(b)
    pub.frame("SEND", {"destination": "/queue/log", "receipt": "old"}, b"old")
    pub.read()
    time.sleep(0.05)
    since = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(3):
        pub.frame("SEND", {"destination": "/queue/log", "receipt": str(i)}, f"new {i}".encode())
        pub.read()
    consumer = wire(b)  # consume (and acknowledge) everything: the queue is now empty
    consumer.frame("SUBSCRIBE", {"id": "c", "destination": "/queue/log"})
    assert len(drain(consumer, 0.5)) == 4
    replayer = wire(b)
    replayer.frame("SUBSCRIBE", {"id": "r", "destination": "/queue/l*", "replay-from": str(since),
                                 "ack": "client-individual"})
    frames = drain(replayer, 0.7)
    assert [f[2] for f in frames] == [b"new 0", b"new 1", b"new 2"]
    assert all(f[1]["replayed"] == "true" for f in frames)


def test_replay_needs_the_store(broker):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "r", "destination": "/queue/x", "replay-from": "0", "receipt": "r"})
    assert w.read()[1]["message"] == "replay unavailable"
