"""The stomp source without Spark (the readers Spark calls, on real connections): stomp://,
stomp+ssl:// (tls.ca) and ws:// read the same range of the replay log; a certificate from another
CA is refused; startingOffsets; selector on a topic and a queue; login and passcode from the
options or the environment against a broker checking logins, and a clear error for a wrong one."""

from __future__ import annotations

import socket
import time

import pytest
import trustme

from stompbroker.analysis import streaming
from stompbroker.security import hash_secret
from stompbroker.tools.client import StompClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_source_reads_the_same_range_over_tcp_tls_and_websocket(start_broker, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "other.pem"))
    tls_port = _free_port()
    b = start_broker("processors=3", "store=sqlite", f"store_path={tmp_path}/s.sqlite", f"ssl_port={tls_port}",
                     f"ssl_cert={tmp_path}/cert.pem", f"ssl_key={tmp_path}/key.pem")
    client = StompClient.connect(port=b.port)
    for i in range(5):
        client.send("/topic/t", f"m{i}".encode(), [("persistent", "true")], receipt=True)
    urls = {"stomp": f"stomp://127.0.0.1:{b.port}", "tls": f"stomp+ssl://127.0.0.1:{tls_port}",
            "ws": f"ws://127.0.0.1:{b.port}/stomp"}
    read = {}
    for name, url in urls.items():
        reader = streaming.TopicReader(streaming.parse_options(
            {"url": url, "destination": "/topic/t", "tls.ca": str(tmp_path / "ca.pem")}, env={}))
        end = reader.latestOffset({"seq": 0}, None)
        rows = list(reader.read(streaming.RangePartition(2, end["seq"])))
        read[name] = [(r[3], r[6]) for r in rows]
    assert read["stomp"] == read["tls"] == read["ws"]
    latest = streaming.TopicReader(streaming.parse_options({"url": urls["stomp"], "destination": "/topic/t"}, env={}))
    earliest = streaming.TopicReader(streaming.parse_options(
        {"url": urls["stomp"], "destination": "/topic/t", "startingOffsets": "earliest"}, env={}))
    assert earliest.initialOffset() == {"seq": 0} and latest.initialOffset() == {"seq": read["stomp"][-1][1] + 1}
    assert [body for body, _ in read["stomp"]] == [b"m1", b"m2", b"m3", b"m4"]
    stranger = streaming.TopicReader(streaming.parse_options(
        {"url": urls["tls"], "destination": "/topic/t", "tls.ca": str(tmp_path / "other.pem")}, env={}))
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        stranger.latestOffset({"seq": 0}, None)


def _topic(url: str, **options) -> list[bytes]:
    """The bodies a topic source reads from the start of the replay log."""
    reader = streaming.TopicReader(streaming.parse_options({"url": url, "destination": "/topic/t", **options}, env={}))
    end = reader.latestOffset({"seq": 0}, None)
    return [row[3] for part in reader.partitions({"seq": 0}, end) for row in reader.read(part)]


def _queue(url: str, want: int, **options) -> list[bytes]:
    """The bodies a queue source takes in one batch of ``want`` (then committed)."""
    reader = streaming.QueueReader(streaming.parse_options({"url": url, "destination": "/queue/q", **options},
                                                           env={}))
    deadline = time.monotonic() + 10
    end = {"taken": 0}
    while end["taken"] < want and time.monotonic() < deadline:
        end = reader.latestOffset({"taken": 0}, None)
    try:
        rows = [row[3] for part in reader.partitions({"taken": 0}, end) for row in reader.read(part)]
        reader.commit(end)
        return rows
    finally:
        reader.stop()


def test_selector_on_a_topic_and_a_queue_source(start_broker, tmp_path):
    b = start_broker("processors=3", "store=sqlite", f"store_path={tmp_path}/s.sqlite")
    url = f"stomp://127.0.0.1:{b.port}"
    client = StompClient.connect(port=b.port)
    for i in range(6):
        kind = [("kind", "a" if i % 2 else "b")]
        client.send("/topic/t", f"t{i}".encode(), [("persistent", "true"), *kind], receipt=True)
        client.send("/queue/q", f"q{i}".encode(), kind, receipt=True)
    assert _topic(url, selector="kind = 'a'") == [b"t1", b"t3", b"t5"]
    assert _topic(url) == [b"t0", b"t1", b"t2", b"t3", b"t4", b"t5"]
    assert _queue(url, 3, selector="kind = 'a'") == [b"q1", b"q3", b"q5"]
    assert _queue(url, 3) == [b"q0", b"q2", b"q4"]  # what the selector left, in the queue still


def test_login_and_passcode_from_the_options_or_the_environment(start_broker, tmp_path, monkeypatch):
    passwd = tmp_path / "passwd"
    passwd.write_text(f"spark:{hash_secret('sesame')}:read=/topic/*,/queue/*;write=/topic/*,/queue/*\n")
    passwd.chmod(0o600)
    b = start_broker("processors=3", "store=sqlite", f"store_path={tmp_path}/s.sqlite", "auth=passwd",
                     f"passwd_file={passwd}", "auth_fail_delay_ms=50")
    url = f"stomp://127.0.0.1:{b.port}"
    client = StompClient.connect(port=b.port, login="spark", passcode="sesame")
    for i in range(2):
        client.send("/topic/t", f"t{i}".encode(), [("persistent", "true")], receipt=True)
        client.send("/queue/q", f"q{i}".encode(), receipt=True)
    assert _topic(url, login="spark", passcode="sesame") == [b"t0", b"t1"]
    assert _queue(url, 2, login="spark", passcode="sesame") == [b"q0", b"q1"]
    monkeypatch.setenv("STOMPBROKER_LOGIN", "spark")  # (read where the reader runs: driver and executors)
    monkeypatch.setenv("STOMPBROKER_PASSCODE", "sesame")
    from_env = streaming.TopicReader(streaming.parse_options({"url": url, "destination": "/topic/t"}))
    assert from_env.latestOffset({"seq": 0}, None)["seq"] > 0
    monkeypatch.setenv("STOMPBROKER_PASSCODE", "wrong")
    assert _topic(url, login="spark", passcode="sesame") == [b"t0", b"t1"]  # the option wins
    for options, who in (({"login": "spark", "passcode": "guess"}, "login 'spark'"), ({}, "no login")):
        reader = streaming.TopicReader(streaming.parse_options({"url": url, "destination": "/topic/t", **options},
                                                               env={}))
        with pytest.raises(PermissionError) as refused:
            reader.latestOffset({"seq": 0}, None)
        message = str(refused.value)
        assert f"{url} refused the connection with {who}: access refused" in message
        assert "passcode" in message and "guess" not in message
