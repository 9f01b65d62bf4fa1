"""Telling HTTP, raw STOMP and PROXY headers apart from the first bytes (protocol/sniff.py), byte by
byte: whatever the first read holds, a connection is answered in the protocol it speaks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.protocol.proxy import V2_SIGNATURE
from stompbroker.protocol.sniff import sniff

PROXIED = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"


def first_verdict(stream: bytes, proxy_protocol: bool = False) -> tuple[str | None, int]:
    """The verdict once the stream has arrived one byte at a time, and how many bytes it took."""
    for n in range(1, len(stream) + 1):
        verdict = sniff(stream[:n], proxy_protocol)
        if verdict is not None:
            assert sniff(stream, proxy_protocol) == verdict  # and the same for all of it at once
            return verdict, n
    return None, len(stream)


@pytest.mark.parametrize("stream, verdict", [
    (b"GET / HTTP/1.1\r\n", "http"), (b"HEAD /metrics HTTP/1.1\r\n", "http"), (b"POST / HTTP/1.1\r\n", "http"),
    (b"PUT / HTTP/1.1\r\n", "http"), (b"DELETE / HTTP/1.1\r\n", "http"), (b"OPTIONS * HTTP/1.1\r\n", "http"),
    (b"TRACE / HTTP/1.1\r\n", "http"), (b"PATCH / HTTP/1.1\r\n", "http"),
    (b"CONNECT\naccept-version:1.2\n\n\0", "stomp"), (b"CONNECT example:443 HTTP/1.1\r\n", "stomp"),
    (b"DIAG\n\nsession\0", "stomp"), (b"DISCONNECT\n\n\0", "stomp"), (b"STOMP\n\n\0", "stomp"),
    (b"SEND\n\n\0", "stomp"), (b"\n\nCONNECT\n\n\0", "stomp"), (b"\r\n\r\nCONNECT\n\n\0", "stomp"),
    (b"get / HTTP/1.1\r\n", "stomp"), (b"GETX / HTTP/1.1", "http"), (b"HEADER\n\n\0", "http"),
    (b"\x16\x03\x01", "stomp"), (b"DELETED\n\n\0", "http"), (b"DIAGNOSE / HTTP/1.1", "stomp"),
])
@pytest.mark.parametrize("proxy_protocol", [False, True])
def test_byte_by_byte(stream, verdict, proxy_protocol):
    assert first_verdict(stream, proxy_protocol)[0] == verdict


def test_only_a_shared_prefix_waits():
    assert first_verdict(b"GET / HTTP/1.1")[1] == 1          # G: only an HTTP method begins so
    assert first_verdict(b"OPTIONS / HTTP/1.1")[1] == 1
    assert first_verdict(b"DELETE / HTTP/1.1")[1] == 2       # D: DELETE, DIAG, DISCONNECT
    assert first_verdict(b"DIAG\n\n\0")[1] == 2
    assert first_verdict(b"CONNECT\n\n\0")[1] == 1           # C: no HTTP method here (CONNECT is STOMP's)
    assert sniff(b"D") is None and sniff(b"DE") == "http" and sniff(b"DI") == "stomp"


def test_proxy_headers_where_none_is_believed():
    assert first_verdict(PROXIED + b"GET / HTTP/1.1", True) == ("proxy", 6)
    assert first_verdict(V2_SIGNATURE + b"\x21\x11", True) == ("proxy", 12)
    assert first_verdict(b"PUT / HTTP/1.1", True) == ("http", 2)       # P: PROXY or a method
    assert first_verdict(b"\r\n\r\nCONNECT\n\n\0", True) == ("stomp", 5)  # the signature's start, then not
    assert first_verdict(PROXIED, False) == ("http", 1)  # without proxy_protocol: a bad request (400)


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.booleans())
def test_any_bytes_are_decided_within_12(head, proxy_protocol):
    verdict = sniff(head, proxy_protocol)
    assert verdict in ("http", "stomp", "proxy", None)
    if verdict is None:
        assert len(head) < 12
    else:
        assert sniff(head + b"more bytes", proxy_protocol) == verdict  # more bytes never change it
