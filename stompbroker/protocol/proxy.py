"""Sans-IO PROXY protocol, versions 1 (text) and 2 (binary), as haproxy's specification defines
them (https://www.haproxy.org/download/2.8/doc/proxy-protocol.txt): a proxy in front of the broker
(haproxy ``send-proxy``/``send-proxy-v2``, AWS NLB, Traefik...) starts each connection with one
header naming the client's address, so the broker throttles, logs and lists the client rather
than the proxy.

``parse_header(buf)`` is fed the connection's first bytes (all of them so far) and returns None
while the header is incomplete, else ``(source, used)``: the client's ``(address, port)``, or None
when the header says the connection is the proxy's own (v1 ``UNKNOWN``, v2 ``LOCAL`` such as a
health check, or an address family other than TCP over IPv4/IPv6), and how many bytes the header
took. Anything else raises ProxyError, as soon as the bytes so far cannot begin a valid header.
``TrustedProxies`` says which peers may send one (``proxy_trusted``).
"""

from __future__ import annotations

import ipaddress
import struct

V1_PREFIX = b"PROXY "
V1_MAX = 107          # the longest v1 header, CRLF included (the specification's bound)
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_HEAD = 16          # signature, version and command, family and protocol, length
V2_MAX = 4096         # the longest v2 header accepted: addresses plus TLVs (haproxy's own stay far below)

_V2_LENGTH = struct.Struct("!H")
_V2_INET = struct.Struct("!4s4sHH")
_V2_INET6 = struct.Struct("!16s16sHH")
_FAMILY_TCP4, _FAMILY_TCP6 = 0x11, 0x21


class ProxyError(Exception):
    """Not a valid PROXY header: the connection is closed without a word."""


def starts_like_header(data: bytes) -> bool:
    """Do these first bytes of a connection begin a PROXY header (v1 or v2)?"""
    return data.startswith(V1_PREFIX) or data.startswith(V2_SIGNATURE)


def parse_header(buf: bytes) -> tuple[tuple[str, int] | None, int] | None:
    if buf[:1] == V2_SIGNATURE[:1]:
        return _parse_v2(buf)
    if buf[:1] == V1_PREFIX[:1]:
        return _parse_v1(buf)
    if buf:
        raise ProxyError("no PROXY header")
    return None


def _parse_v1(buf: bytes):
    if not buf[:len(V1_PREFIX)] == V1_PREFIX[:len(buf)]:
        raise ProxyError("no PROXY header")
    end = buf.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(buf) >= V1_MAX or b"\n" in buf:
            raise ProxyError(f"v1 header without CRLF in its first {V1_MAX} bytes")
        return None
    words = buf[len(V1_PREFIX):end].split(b" ")
    if words[0] == b"UNKNOWN":  # whatever follows is ignored (the specification says so)
        return None, end + 2
    if len(words) != 5 or words[0] not in (b"TCP4", b"TCP6"):
        raise ProxyError("malformed v1 header")
    family, source, _destination, source_port, destination_port = words
    try:
        address = ipaddress.ip_address(source.decode("ascii"))
        ipaddress.ip_address(_destination.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProxyError("bad address in v1 header") from None
    if address.version != (4 if family == b"TCP4" else 6):
        raise ProxyError("v1 address does not match its family")
    port = _port(source_port)
    _port(destination_port)
    return (_text(address), port), end + 2


def _port(word: bytes) -> int:
    if not word.isdigit() or len(word) > 5 or (len(word) > 1 and word[:1] == b"0") or int(word) > 65535:
        raise ProxyError("bad port in v1 header")
    return int(word)


def _parse_v2(buf: bytes):
    n = min(len(buf), len(V2_SIGNATURE))
    if buf[:n] != V2_SIGNATURE[:n]:
        raise ProxyError("no PROXY header")
    if len(buf) < V2_HEAD:
        return None
    version_command, family = buf[12], buf[13]
    if version_command >> 4 != 2:
        raise ProxyError(f"unsupported PROXY version {version_command >> 4}")
    command = version_command & 0x0F
    if command > 1:
        raise ProxyError(f"unknown v2 command {command}")
    length = _V2_LENGTH.unpack_from(buf, 14)[0]
    if V2_HEAD + length > V2_MAX:
        raise ProxyError(f"v2 header over {V2_MAX} bytes")
    if family & 0x0F == 2:
        raise ProxyError("v2 header for a datagram connection")
    if len(buf) < V2_HEAD + length:
        return None
    used = V2_HEAD + length
    if command == 0:  # LOCAL: the proxy's own connection (a health check); addresses are ignored
        return None, used
    if family == _FAMILY_TCP4:
        layout = _V2_INET
    elif family == _FAMILY_TCP6:
        layout = _V2_INET6
    elif family >> 4 in (0, 3) and family & 0x0F in (0, 1):  # UNSPEC, or a UNIX socket: no client address
        return None, used
    else:
        raise ProxyError(f"unknown v2 address family {family:#04x}")
    if length < layout.size:
        raise ProxyError("v2 addresses cut short")
    source, _destination, port, _destination_port = layout.unpack_from(buf, V2_HEAD)
    return (_text(ipaddress.ip_address(source)), port), used


def _text(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An IPv4 client seen through a dual-stack proxy (::ffff:a.b.c.d) is that IPv4 client: one
    address, one login back-off."""
    if address.version == 6 and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class TrustedProxies:
    """The peers whose PROXY headers are believed: addresses and networks (``10.0.0.0/8``, ``::1``)."""

    def __init__(self, networks: list[str]):
        self.networks = [parse_network(n) for n in networks]

    def __contains__(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:  # a dual-stack listener's IPv4 peer
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.networks)


def parse_network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An address or a network; ValueError says what is wrong."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"not an IP address or network: {text!r}") from None


def peer_text(address: str, port: int) -> str:
    """How the broker writes a peer everywhere (OPEN records, logs, /api/connections): address:port."""
    return f"{address}:{port}"
