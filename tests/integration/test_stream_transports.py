"""The stomp source's connections without Spark: stomp://, stomp+ssl:// (tls.ca) and ws:// read the
same range of the replay log; a certificate from another CA is refused; startingOffsets."""

from __future__ import annotations

import socket

import pytest
import trustme

from stompbroker.analysis import streaming
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
