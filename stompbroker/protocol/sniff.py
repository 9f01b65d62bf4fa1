"""What a connection speaks, from its first bytes (sans-IO): an HTTP request (the console, the API,
a WebSocket upgrade), raw STOMP, or, where the broker reads PROXY headers, a PROXY header from a
peer whose headers are not believed.

``sniff(head, proxy_protocol)`` returns ``"http"``, ``"stomp"``, ``"proxy"``, or None while the
bytes so far could still begin more than one of them: an HTTP method and a STOMP command share a
first letter (``D``: DELETE, DIAG, DISCONNECT), or the start of a PROXY header's signature has come.
The verdict is taken on the shortest prefix that settles it, so it never depends on how the bytes
were cut into reads; the caller keeps the undecided bytes (at most 12, the v2 signature) and asks
again with more.
"""

from __future__ import annotations

from .proxy import V1_PREFIX, V2_SIGNATURE

# Methods that get an HTTP answer. CONNECT is left out: it is a STOMP command too.
HTTP_METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"PATCH")
# What a STOMP client may send first (STOMP 1.2's client frames, and stompica's DIAG).
STOMP_COMMANDS = (b"CONNECT", b"STOMP", b"SEND", b"SUBSCRIBE", b"UNSUBSCRIBE", b"ACK", b"NACK", b"BEGIN",
                  b"COMMIT", b"ABORT", b"DISCONNECT", b"DIAG")


def sniff(head: bytes, proxy_protocol: bool = False) -> str | None:
    if proxy_protocol:
        for signature in (V1_PREFIX, V2_SIGNATURE):
            n = min(len(head), len(signature))
            if head[:n] == signature[:n]:
                return "proxy" if n == len(signature) else None
    for n in range(1, len(head) + 1):
        prefix = head[:n]
        if not any(m.startswith(prefix) for m in HTTP_METHODS):
            return "stomp"  # (anything else, heart-beat EOLs first included, is STOMP's to refuse)
        if not any(c.startswith(prefix) for c in STOMP_COMMANDS):
            return "http"   # a request line, or what only one could begin with: HTTP's to refuse
    return None
