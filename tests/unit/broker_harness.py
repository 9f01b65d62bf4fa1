"""Drive the sans-IO `Broker` directly: events in, outbox records decoded back into frames.

Only the `Broker` facade's public API is used (constructor, ``on_*`` events, ``outboxes``), so
these tests do not depend on how the broker is split into modules. Time is a number the test
moves (``tick``); nothing sleeps.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

from stompbroker.broker.core import Broker
from stompbroker.ipc.outbox import Outbox
from stompbroker.ipc import records as R
from stompbroker.protocol.stomp import parse_head
from stompbroker.settings import make_config


class Out(NamedTuple):
    """One record the broker wrote for a writer, decoded."""
    kind: str               # DATA, CLOSE, HEARTBEAT, RAW, RESET...
    conn: int
    command: str | None     # the STOMP command of a DATA record
    headers: dict
    body: bytes
    aux: int

    def __getitem__(self, key):  # out["message"]: a header of the frame
        return self.headers[key] if isinstance(key, str) else tuple.__getitem__(self, key)


def decode(blob: bytes) -> list[Out]:
    out = []
    for kind, conn, aux, _stamp, payload in R.iter_deliveries(bytes(blob)):
        name = R.Kind(kind).name
        if kind == R.DATA:
            head, _, rest = bytes(payload).partition(b"\n\n")
            command, headers = parse_head(head, False)
            out.append(Out(name, conn, command, headers, rest[:-1] if rest.endswith(b"\0") else rest, aux))
        else:
            out.append(Out(name, conn, None, {}, bytes(payload), aux))
    return out


class Rig:
    """A broker with ``writers`` plain outboxes and a clock the test moves."""

    def __init__(self, writers: int = 1, diag=None, auth=None, **settings):
        self.config = make_config(**settings)
        self.outboxes = [Outbox(i) for i in range(writers)]
        self.wall = 1_800_000_000.0   # the wall clock (for `expires`), seconds
        self.now = 100.0              # the monotonic clock, seconds
        # Collaborators go to the constructor where it takes them, else are set as attributes.
        # A fake authenticator that takes login checks (submit, cancel) stands for the checker too.
        logins = auth if hasattr(auth, "submit") else None
        given = {name: value for name, value in (("diag", diag), ("auth", auth), ("logins", logins))
                 if value is not None}
        accepted = inspect.signature(Broker).parameters
        self.broker = Broker(self.config, self.outboxes, clock=lambda: self.wall,
                             **{k: v for k, v in given.items() if k in accepted})
        for name, value in given.items():
            if name not in accepted:
                setattr(self.broker, name, value)
        self.seen: list[Out] = []     # every record, in order
        self._unread: dict[int, list[Out]] = {}

    # -- events --------------------------------------------------------------------------------
    def open(self, conn: int, writer: int = 0, peer: str = "127.0.0.1:40000", stomp: bool = True) -> None:
        """A connection opens (``stomp``: and its first bytes say STOMP, as the reader tells)."""
        self.broker.on_open(conn, writer, peer, self.now)
        if stomp:
            self.broker.on_stomp(conn)

    def frame(self, conn: int, command: str, headers: dict | None = None, body: bytes = b"", **more) -> None:
        """Send one frame; keyword headers use _ for - (heart_beat=...)."""
        headers = {**(headers or {}), **{k.replace("_", "-"): v for k, v in more.items()}}
        head = "\n".join([command] + [f"{k}:{v}" for k, v in headers.items()]).encode()
        self.broker.on_frame(conn, head, body, self.now)

    def connect(self, conn: int, version: str = "1.2", writer: int = 0, **headers) -> Out:
        """Open and CONNECT; returns the CONNECTED frame."""
        self.open(conn, writer)
        if version:
            headers.setdefault("accept_version", version)
        self.frame(conn, "CONNECT", host="/", **headers)
        (reply,) = [o for o in self.take(conn) if o.kind == "DATA"]
        assert reply.command == "CONNECTED", reply
        return reply

    def subscribe(self, conn: int, destination: str, sub_id: str = "s", **headers) -> None:
        self.frame(conn, "SUBSCRIBE", destination=destination, id=sub_id, **headers)

    def send(self, conn: int, destination: str, body: bytes = b"x", **headers) -> None:
        self.frame(conn, "SEND", destination=destination, body=body, **headers)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds
        self.broker.on_tick(self.now)

    # -- what came out -------------------------------------------------------------------------
    def _drain(self) -> None:
        for box in self.outboxes:
            buf, _ = box.take()
            for out in decode(buf):
                self.seen.append(out)
                self._unread.setdefault(out.conn, []).append(out)

    def take(self, conn: int) -> list[Out]:
        """Records for ``conn`` since the last take."""
        self._drain()
        return self._unread.pop(conn, [])

    def frames(self, conn: int) -> list[Out]:
        """STOMP frames (DATA records) for ``conn`` since the last take."""
        return [o for o in self.take(conn) if o.kind == "DATA"]

    def commands(self, conn: int) -> list[str]:
        return [o.command for o in self.frames(conn)]

    def messages(self, conn: int) -> list[Out]:
        got = self.frames(conn)
        assert all(o.command == "MESSAGE" for o in got), [o.command for o in got]
        return got

    def bodies(self, conn: int) -> list[bytes]:
        return [o.body for o in self.messages(conn)]

    def error(self, conn: int) -> Out:
        """The ERROR a connection got, checked to be followed by a CLOSE."""
        got = self.take(conn)
        kinds = [o.command or o.kind for o in got]
        assert kinds[-2:] == ["ERROR", "CLOSE"], kinds
        return got[-2]
