"""The sans-IO PROXY protocol parser (stompbroker/protocol/proxy.py), byte by byte: v1 and v2
headers as haproxy writes them, every way a header can be bad, and the trusted-proxy list."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.protocol.proxy import (V1_MAX, V2_MAX, V2_SIGNATURE, ProxyError, TrustedProxies, parse_header,
                                        starts_like_header)

CLIENT = b"CONNECT\naccept-version:1.2\n\n\x00"


def v2(command: int = 1, family: int = 0x11, addresses: bytes | None = None, tlvs: bytes = b"",
       version: int = 2, length: int | None = None) -> bytes:
    if addresses is None:
        addresses = struct.pack("!4s4sHH", bytes([192, 0, 2, 7]), bytes([10, 0, 0, 1]), 40001, 61613)
    body = addresses + tlvs
    return V2_SIGNATURE + bytes([version << 4 | command, family]) + struct.pack(
        "!H", len(body) if length is None else length) + body


def parse_bytewise(data: bytes):
    """Feed the header one more byte at a time, as a proxy's slowest reads would: None until it is
    whole, then the same answer as for all of it at once."""
    for n in range(len(data) + 1):
        result = parse_header(data[:n])
        if result is not None:
            assert parse_header(data) == result
            return result
    return None


def refused(data: bytes) -> str:
    """The error, found at the first byte that cannot belong to a valid header (and not before)."""
    for n in range(1, len(data) + 1):
        try:
            parse_header(data[:n])
        except ProxyError as exc:
            with pytest.raises(ProxyError):
                parse_header(data)  # and for the whole of it
            return str(exc)
    raise AssertionError(f"accepted: {data!r}")


@pytest.mark.parametrize("line, source", [
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 40001 61613\r\n", ("192.0.2.7", 40001)),
    (b"PROXY TCP6 2001:db8::7 2001:db8::1 40001 61613\r\n", ("2001:db8::7", 40001)),
    (b"PROXY TCP6 ::ffff:192.0.2.7 ::1 0 65535\r\n", ("192.0.2.7", 0)),  # IPv4 through a dual-stack proxy
    (b"PROXY UNKNOWN\r\n", None),
    (b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n", None),
])
def test_v1_headers_byte_by_byte(line, source):
    assert parse_bytewise(line + CLIENT) == (source, len(line))


def test_the_longest_v1_headers_fit_its_107_bytes():
    six = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    line = f"PROXY TCP6 {six} {six} 65535 65535\r\n".encode()
    assert parse_bytewise(line) == ((str(ipaddress.ip_address(six)), 65535), len(line))
    line = f"PROXY UNKNOWN {six} {six} 65535 65535\r\n".encode()
    assert len(line) == V1_MAX
    assert parse_bytewise(line) == (None, V1_MAX)
    with pytest.raises(ProxyError):
        parse_header(line.replace(b"UNKNOWN", b"UNKNOWN_"))


@pytest.mark.parametrize("data, reason", [
    (b"CONNECT\n\n\x00", "no PROXY header"),
    (b"PROXZ TCP4", "no PROXY header"),
    (b"GET / HTTP/1.1\r\n", "no PROXY header"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 40001 61613\n", "v1 header without CRLF"),
    (b"PROXY " + b"x" * 200, "v1 header without CRLF in its first 107 bytes"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 40001\r\n", "malformed v1 header"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 40001 61613 extra\r\n", "malformed v1 header"),
    (b"PROXY TCP4  192.0.2.7 10.0.0.1 40001 61613\r\n", "malformed v1 header"),
    (b"PROXY UDP4 192.0.2.7 10.0.0.1 40001 61613\r\n", "malformed v1 header"),
    (b"PROXY TCP4 192.0.2.777 10.0.0.1 40001 61613\r\n", "bad address in v1 header"),
    (b"PROXY TCP4 2001:db8::7 10.0.0.1 40001 61613\r\n", "v1 address does not match its family"),
    (b"PROXY TCP6 192.0.2.7 ::1 40001 61613\r\n", "v1 address does not match its family"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 65536 61613\r\n", "bad port in v1 header"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 040001 61613\r\n", "bad port in v1 header"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 -1 61613\r\n", "bad port in v1 header"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 40001 6161x\r\n", "bad port in v1 header"),
    (b"PROXY TCP4 \xc3\xa9.0.2.7 10.0.0.1 40001 61613\r\n", "bad address in v1 header"),
])
def test_bad_v1_headers(data, reason):
    assert refused(data).startswith(reason)


def test_v2_ipv4_ipv6_and_tlvs_byte_by_byte():
    header = v2(tlvs=b"\x05\x00\x03abc")  # a PP2_TYPE_UNIQUE_ID TLV: skipped
    assert parse_bytewise(header + CLIENT) == (("192.0.2.7", 40001), len(header))
    six = struct.pack("!16s16sHH", ipaddress.ip_address("2001:db8::7").packed, b"\0" * 15 + b"\1", 5, 61613)
    header = v2(family=0x21, addresses=six)
    assert parse_bytewise(header + CLIENT) == (("2001:db8::7", 5), len(header))


@pytest.mark.parametrize("header", [
    v2(command=0, family=0x00, addresses=b""),          # LOCAL (haproxy's health checks): no address
    v2(command=0, family=0x11),                         # LOCAL with addresses: they are ignored
    v2(command=1, family=0x00, addresses=b""),          # PROXY for an unspecified protocol
    v2(command=1, family=0x31, addresses=b"\0" * 216),  # a UNIX socket client: no IP address
])
def test_v2_headers_that_name_no_client(header):
    assert parse_bytewise(header + CLIENT) == (None, len(header))


@pytest.mark.parametrize("data, reason", [
    (V2_SIGNATURE[:5] + b"X", "no PROXY header"),
    (v2(version=1), "unsupported PROXY version 1"),
    (v2(command=2), "unknown v2 command 2"),
    (v2(family=0x12), "v2 header for a datagram connection"),
    (v2(family=0x41), "unknown v2 address family 0x41"),
    (v2(family=0x10), "unknown v2 address family 0x10"),
    (v2(addresses=b"\0" * 11), "v2 addresses cut short"),
    (v2(family=0x21), "v2 addresses cut short"),
    (v2(length=V2_MAX - 15), f"v2 header over {V2_MAX} bytes"),
])
def test_bad_v2_headers(data, reason):
    assert refused(data) == reason


def test_an_oversized_v2_header_is_refused_from_its_length_field():
    # 16 bytes are enough to refuse it: the broker never waits for (or holds) the rest
    with pytest.raises(ProxyError):
        parse_header(v2(length=0xFFFF)[:16])
    assert parse_header(v2(tlvs=b"t" * (V2_MAX - 16 - 12))) is not None  # the longest accepted


def test_first_bytes_that_begin_a_header():
    assert starts_like_header(b"PROXY TCP4 ...") and starts_like_header(V2_SIGNATURE + b"\x21")
    assert not starts_like_header(b"PROXY") and not starts_like_header(b"CONNECT\n")
    assert not starts_like_header(V2_SIGNATURE[:11]) and not starts_like_header(b"\r\n\r\n")


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.binary(max_size=150).map(lambda b: b"PROXY " + b),
                 st.binary(max_size=150).map(lambda b: V2_SIGNATURE + b)))
def test_any_bytes_are_a_header_a_wait_or_a_proxy_error(data):
    try:
        result = parse_header(data)
    except ProxyError:
        return
    if result is not None:
        source, used = result
        assert 0 < used <= len(data) and used <= V2_MAX
        if source is not None:
            ipaddress.ip_address(source[0])
            assert 0 <= source[1] <= 65535
    else:
        assert len(data) < V2_MAX


def test_trusted_proxies():
    trusted = TrustedProxies(["127.0.0.1", "10.1.0.0/16", "2001:db8::/32", "192.168.1.5/24"])
    for address in ("127.0.0.1", "10.1.255.4", "2001:db8::9", "::ffff:10.1.0.9", "192.168.1.77"):
        assert address in trusted, address
    for address in ("127.0.0.2", "10.2.0.1", "2001:db9::1", "::1", "", "nonsense", "::ffff:10.2.0.1"):
        assert address not in trusted, address
    with pytest.raises(ValueError, match="not an IP address or network: 'example.com'"):
        TrustedProxies(["example.com"])


@pytest.mark.parametrize("header", [b"PROXY TCP4 192.0.2.7 10.0.0.1 40001 61614\r\n", v2()], ids=["v1", "v2"])
def test_a_header_before_tls_is_taken_without_a_byte_of_the_handshake(header):
    # processes/proxy_before_tls.py reads off a real socket: the ClientHello after the header must
    # stay in the socket for the ssl module, however the header is cut into reads.
    import socket

    from stompbroker.processes.proxy_before_tls import read_header

    hello = b"\x16\x03\x01\x02\x00" + bytes(range(40))
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        buf = b""
        for i in range(len(header) - 1):  # one byte per read: incomplete, all of it taken
            theirs.sendall(header[i:i + 1])
            buf, parsed, closed = read_header(ours, buf)
            assert (buf, parsed, closed) == (header[:i + 1], None, False)
        assert read_header(ours, buf) == (buf, None, False)  # nothing new yet
        theirs.sendall(header[-1:] + hello)  # the rest of the header and the handshake in one read
        buf, parsed, closed = read_header(ours, buf)
        assert buf == b"" and parsed == (("192.0.2.7", 40001), len(header)) and not closed
        assert ours.recv(1000) == hello
        with pytest.raises(ProxyError):
            theirs.sendall(hello)
            read_header(ours, b"")
        theirs.close()
        ours.recv(1000)
        assert read_header(ours, b"")[2]  # closed
    finally:
        ours.close()
        theirs.close()
