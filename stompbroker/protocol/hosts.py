"""Which ``Host`` and ``Origin`` headers the broker's HTTP and WebSocket port answers (sans-IO).

DNS rebinding: a page on a name its author controls (``evil.example``) re-points that name at the
broker's address, and the browser then reads the broker's answers as the page's own (same name,
same origin). The one thing the browser cannot hide is the name: it sends ``Host: evil.example``.
So a request naming a host the broker does not know is refused (``HostPolicy``). A Host that is an
IP address cannot be the result of rebinding (no name was resolved), so it always passes; a request
without Host does not come from a browser.

Cross-site WebSocket: a page anywhere may open a WebSocket to the broker, and the browser sends the
page's ``Origin``; ``same_origin`` says whether that page was served by the broker itself.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost",)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6]:port`` -> (lower-case name or address without a final dot, port), or None."""
    value = value.strip().lower()
    port: str | None = None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest:
            if not rest.startswith(":"):
                return None
            port = rest[1:]
    else:
        host, colon, port = value.rpartition(":")
        if not colon:
            host, port = value, None
        elif ":" in host:  # a bare IPv6 address, not valid in Host but unambiguous
            host, port = value, None
    if port is not None:
        if not (port.isascii() and port.isdigit()) or len(port) > 5:  # ("²".isdigit() is true)
            return None
        port_number: int | None = int(port)
    else:
        port_number = None
    host = host.rstrip(".")
    return (host, port_number) if host else None


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class HostPolicy:
    """``allowed`` names (``.example.com`` also allows every name under it); ``["*"]`` allows any."""

    def __init__(self, allowed: list[str]):
        self.any = "*" in allowed
        names = [name.strip().lower().rstrip(".") for name in allowed]
        self.exact = frozenset(n for n in names if n and not n.startswith("."))
        self.suffixes = tuple(n for n in names if n.startswith(".") and len(n) > 1)

    @classmethod
    def from_config(cls, config) -> "HostPolicy":
        """``http_hosts``, or by default the loopback names and ``host`` when it is a name."""
        if config.http_hosts:
            return cls(config.http_hosts)
        return cls([*LOOPBACK_NAMES, config.host])

    def allows(self, host_header: str | None) -> bool:
        if self.any or host_header is None:
            return True
        parsed = split_host(host_header)
        if parsed is None:
            return False
        host = parsed[0]
        return (host in self.exact or is_address(host) or host.endswith(self.suffixes)
                or any(host == s[1:] for s in self.suffixes))


def same_origin(origin: str | None, host_header: str | None) -> bool:
    """Was the page that sends ``Origin`` served from the host and port this request was sent to?
    No Origin (not a browser) passes; ``null`` (a sandboxed or file page) does not. The scheme is not
    compared: behind a proxy that ends TLS, the broker sees plain connections for https pages."""
    if origin is None:
        return True
    if host_header is None:
        return False
    try:
        parts = urlsplit(origin.strip().lower())
        origin_port = parts.port
    except ValueError:
        return False
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path or parts.query:
        return False
    target = split_host(host_header)
    if target is None:
        return False
    default = _DEFAULT_PORTS[parts.scheme]
    return (parts.hostname.rstrip("."), origin_port or default) == (target[0], target[1] or default)
