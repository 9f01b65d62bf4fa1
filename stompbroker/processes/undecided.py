"""Connections whose protocol the reader does not know yet, and their connect timeout.

A connection's first bytes say what it speaks (protocol/sniff.py); until they come (nothing read, a
byte or two that could begin STOMP or HTTP, a proxy's PROXY header still arriving, a TLS handshake
under way) nobody may write anything protocol-specific to it. So the dispatcher's STOMP connect
timeout applies only to connections the reader has said speak STOMP (a STOMP record, or WS_OPEN),
and HTTP heads get their 408 from the reader; the reader ends the others itself when
``connect_timeout_ms`` runs out, with what ``answer`` says. However late a starved reader reads a
request, its client is answered in its own protocol.

``Deadlines`` keeps them in accept order (every deadline is its accept time plus the same timeout,
so the first is the earliest); a connection leaves it when its protocol is known or it closes, so
a decided connection costs nothing here.
"""

from __future__ import annotations


# What a connection still undecided at its deadline gets.
CONNECT_TIMEOUT = "connect timeout"  # nothing came: the port's own protocol, STOMP, says why it closes
CLOSE = "close"                      # bytes that could begin more than one protocol, an unfinished PROXY
                                     # header or TLS handshake: closed without a word


def answer(buffered: bytes, under_way: bool) -> str:
    """``buffered``: the undecided first bytes; ``under_way``: a TLS handshake or a PROXY header."""
    return CLOSE if buffered or under_way else CONNECT_TIMEOUT


class Deadlines:
    """Items due ``timeout`` seconds after they were added, oldest first; ``discard`` takes one out."""

    __slots__ = ("timeout", "items", "next_due")

    def __init__(self, timeout: float):
        self.timeout = timeout   # seconds; 0 = never due (nothing is kept)
        self.items: dict = {}    # item -> deadline, in the order added: the first is due first
        self.next_due = 0.0      # the first deadline when it was last looked at (early if it left since)

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, item, now: float) -> None:
        if self.timeout:
            if not self.items:
                self.next_due = now + self.timeout
            self.items[item] = now + self.timeout

    def discard(self, item) -> None:
        items = self.items
        if items.pop(item, None) is not None and not items:
            # Emptied: a fresh dict, so the table a connect storm grew is not kept for good.
            self.items = {}

    def due(self, now: float) -> list:
        """The items whose deadline has passed, taken out."""
        items = self.items
        out = []
        for item, deadline in items.items():
            if deadline > now:
                self.next_due = deadline
                break
            out.append(item)
        for item in out:
            del items[item]
        if out and not items:
            self.items = {}
        return out
