"""A proxy's PROXY header in front of TLS (ssl_port behind haproxy in TCP mode, ``send-proxy-v2``):
the header is read off the plain socket, and TLS starts after it.

The bytes after the header are the client's TLS handshake, which the ``ssl`` module must read from
the socket itself: so the header is peeked, and only its own bytes are taken. While it is
incomplete every byte so far is header (``proxy.parse_header`` refuses, as soon as it can, bytes
that cannot begin one), so those are taken at once, and a header cut into many reads is read in as
many turns without ever reading past its end.
"""

from __future__ import annotations

import socket

from ..protocol import proxy


def read_header(sock: socket.socket, buf: bytes) -> tuple[bytes, tuple | None, bool]:
    """Take what is there of the header from ``sock`` (``buf``: what earlier turns took).

    Returns ``(buf, parsed, closed)``: the header's bytes taken so far, ``parse_header``'s result
    once the header is whole (None before), and whether the peer closed. Raises ProxyError for a
    bad header."""
    try:
        data = sock.recv(proxy.V2_MAX, socket.MSG_PEEK)
    except (BlockingIOError, InterruptedError):
        return buf, None, False
    except OSError:
        return buf, None, True
    if not data:
        return buf, None, True
    parsed = proxy.parse_header(buf + data)
    take = len(data) if parsed is None else parsed[1] - len(buf)
    taken = sock.recv(take)  # (what was peeked is there: this takes exactly it)
    return (buf + taken if parsed is None else b""), parsed, False
