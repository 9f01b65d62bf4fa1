"""The broker side of the Spark source and sink on one node: the replay log read by sequence
(``replay-from-seq``), persistent topic messages kept in it once, and ``dedup-id`` honoured
without a cluster, across a kill -9 too."""

from __future__ import annotations

import signal

import pytest

from stompbroker.tools.client import BrokerError, StompClient


def _replay(client: StompClient, destination: str, sub_id: str, **headers):
    """The replayed messages (seq, body) and the end marker's headers."""
    client.subscribe(destination, sub_id, headers=[(k.replace("_", "-"), v) for k, v in headers.items()])
    rows = []
    while True:
        frame = client.read_frame(5)
        assert frame is not None, "no replay-end marker"
        if frame.headers.get("replay-end") == "true":
            return rows, frame.headers
        if frame.headers.get("replayed") == "true":
            rows.append((int(frame.headers["replay-seq"]), frame.body))


@pytest.fixture
def store_broker(start_broker, tmp_path):
    return lambda *s: start_broker("processors=3", "store=sqlite", f"store_path={tmp_path}/s.sqlite", *s)


def test_replay_by_sequence_reads_a_range_exactly(store_broker):
    b = store_broker()
    c = StompClient.connect(port=b.port)
    for i in range(6):
        c.send(f"/topic/orders/{i % 2}", f"m{i}".encode(), [("persistent", "true")], receipt=True)
    c.send("/topic/orders/0", b"not kept", receipt=True)  # not persistent: not in the log
    r = StompClient.connect(port=b.port)
    rows, end = _replay(r, "/topic/orders/*", "all", replay_from_seq="0")
    assert [body for _, body in rows] == [f"m{i}".encode() for i in range(6)]
    seqs = [seq for seq, _ in rows]
    assert seqs == sorted(seqs) and int(end["replay-next-seq"]) == seqs[-1] + 1
    assert end["replay-first-seq"] == str(seqs[0])
    # a range read twice gives the same messages; an exact destination its own only
    again, _ = _replay(r, "/topic/orders/*", "range", replay_from_seq=str(seqs[1]), replay_to_seq=str(seqs[4]))
    assert again == rows[1:4]
    zero, _ = _replay(r, "/topic/orders/0", "zero", replay_from_seq="0")
    assert [body for _, body in zero] == [b"m0", b"m2", b"m4"]
    # a limit ends the read after that many, and says where the next starts
    some, end = _replay(r, "/topic/orders/*", "limited", replay_from_seq="0", replay_limit="2")
    assert some == rows[:2] and end["replay-next-seq"] == str(seqs[1] + 1)
    # limit 0: where the log ends, nothing read
    none, end = _replay(r, "/topic/orders/*", "probe", replay_from_seq="0", replay_limit="0")
    assert none == [] and end["replay-next-seq"] == str(seqs[-1] + 1)
    with pytest.raises(BrokerError, match="invalid replay-from-seq"):
        _replay(r, "/topic/orders/*", "bad", replay_from_seq="-1")


def test_replay_by_sequence_needs_the_store(start_broker):
    b = start_broker("processors=3")
    c = StompClient.connect(port=b.port)
    with pytest.raises(BrokerError, match="replay unavailable"):
        c.subscribe("/topic/a", "s", headers=[("replay-from-seq", "0")])


def test_a_topic_message_is_logged_once_whatever_the_durables(store_broker):
    b = store_broker()
    d = StompClient.connect(port=b.port)
    d.subscribe("/topic/t", "d1", headers=[("durable", "true")])
    d.subscribe("/topic/t", "d2", headers=[("durable", "true")])
    c = StompClient.connect(port=b.port)
    c.send("/topic/t", b"once", receipt=True)
    rows, _ = _replay(StompClient.connect(port=b.port), "/topic/t", "r", replay_from_seq="0")
    assert [body for _, body in rows] == [b"once"]


def _drain(port: int, destination: str) -> list[bytes]:
    c = StompClient.connect(port=port)
    c.subscribe(destination, "drain")
    bodies = []
    while (frame := c.read_frame(1.0)) is not None:
        bodies.append(frame.body)
    c.disconnect()
    return bodies


def test_dedup_id_on_a_single_node(store_broker):
    b = store_broker()
    c = StompClient.connect(port=b.port)
    for i in range(3):  # every repeat is receipted, one is stored
        c.send("/queue/jobs", f"try{i}".encode(), [("dedup-id", "job-1")], receipt=True)
    c.send("/queue/other", b"same id elsewhere", [("dedup-id", "job-1")], receipt=True)
    c.send("/queue/jobs", b"no id", receipt=True)
    c.send("/queue/jobs", b"no id", receipt=True)
    for i in range(2):
        c.send("/topic/p", f"p{i}".encode(), [("dedup-id", "t"), ("persistent", "true")], receipt=True)
    assert _drain(b.port, "/queue/jobs") == [b"try0", b"no id", b"no id"]
    assert _drain(b.port, "/queue/other") == [b"same id elsewhere"]
    rows, _ = _replay(StompClient.connect(port=b.port), "/topic/p", "r", replay_from_seq="0")
    assert [body for _, body in rows] == [b"p0"]


def test_dedup_and_sequences_survive_kill_9(store_broker):
    b = store_broker()
    c = StompClient.connect(port=b.port)
    c.send("/queue/jobs", b"first", [("dedup-id", "a")], receipt=True)
    c.send("/topic/p", b"kept", [("dedup-id", "b"), ("persistent", "true")], receipt=True)
    _, end = _replay(StompClient.connect(port=b.port), "/topic/p", "r", replay_from_seq="0")
    b.stop(signal.SIGKILL)
    b = store_broker()
    c = StompClient.connect(port=b.port)
    c.send("/queue/jobs", b"retry", [("dedup-id", "a")], receipt=True)
    c.send("/topic/p", b"retry", [("dedup-id", "b"), ("persistent", "true")], receipt=True)
    c.send("/topic/p", b"new", [("persistent", "true")], receipt=True)
    assert _drain(b.port, "/queue/jobs") == [b"first"]
    rows, _ = _replay(StompClient.connect(port=b.port), "/topic/p", "r", replay_from_seq=end["replay-next-seq"])
    assert [body for _, body in rows] == [b"new"]


def test_dedup_window_ends(start_broker):
    b = start_broker("processors=3", "dedup_window=0.3")
    c = StompClient.connect(port=b.port)
    c.send("/queue/w", b"one", [("dedup-id", "x")], receipt=True)
    import time
    time.sleep(0.5)
    c.send("/queue/w", b"two", [("dedup-id", "x")], receipt=True)
    assert _drain(b.port, "/queue/w") == [b"one", b"two"]
