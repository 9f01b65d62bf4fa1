"""The dispatcher's state machine: sessions, subscriptions and routing, with no I/O.

The dispatcher process feeds it events (a connection opened, a frame arrived, a connection closed,
time passed) and it appends outgoing records to the :class:`Outbox` of the writer that owns each
connection. Tests drive it directly with plain outboxes.
"""

from __future__ import annotations

import itertools
import logging
import time

from .. import __version__
from ..ipc import records as R
from ..protocol.stomp import ProtocolError, escape, parse_head, render_frame
from ..protocol.websocket import encode_close
from .subscriptions import SubscriptionIndex

log = logging.getLogger("stompbroker.broker")

VERSIONS = ("1.0", "1.1", "1.2")
SERVER = f"stompbroker/{__version__}"
ACK_MODES = ("auto", "client", "client-individual")
CONNECT_COMMANDS = ("CONNECT", "STOMP")
# Headers of a SEND that are meant for the broker, not copied into the MESSAGE.
NOT_FORWARDED = frozenset(("destination", "message-id", "subscription", "content-length", "receipt",
                           "transaction", "ack"))


class Outbox:
    """Records for one writer, collected during one dispatcher round."""

    __slots__ = ("index", "buf", "count", "limit", "on_full")

    def __init__(self, index: int = 0, limit: int = 1 << 62, on_full=None):
        self.index = index
        self.buf = bytearray()
        self.count = 0
        self.limit = limit        # past this many bytes, on_full(outbox) hands the batch over early
        self.on_full = on_full

    def add(self, kind: int, conn: int, payload: bytes = b"", aux: int = 0) -> None:
        self.buf += R.pack_header(R.HEADER_SIZE + len(payload), kind, conn, aux)
        self.buf += payload
        self.count += 1
        if len(self.buf) > self.limit:
            self.on_full(self)

    def add2(self, conn: int, first: bytes, second: bytes) -> None:
        """A DATA record made of two parts, without joining them first (one delivery)."""
        buf = self.buf
        buf += R.pack_header(R.HEADER_SIZE + len(first) + len(second), R.DATA, conn, 0)
        buf += first
        buf += second
        self.count += 1
        if len(buf) > self.limit:
            self.on_full(self)

    def take(self) -> tuple[bytearray, int]:
        buf, count = self.buf, self.count
        self.buf, self.count = bytearray(), 0
        return buf, count


class Session:
    __slots__ = ("conn", "outbox", "peer", "opened", "last_seen", "connected", "version", "escape",
                 "subs", "hb_in", "closing", "websocket", "id", "login")

    def __init__(self, conn: int, outbox: Outbox, peer: str, now: float):
        self.conn = conn
        self.outbox = outbox
        self.peer = peer
        self.opened = now
        self.last_seen = now
        self.connected = False
        self.version = "1.0"
        self.escape = False       # header escaping applies (1.1 and later)
        self.subs: dict[str, Subscription] = {}
        self.hb_in = 0            # ms: the client promised a frame or heart-beat at least this often
        self.closing = False
        self.websocket = False
        self.id = ""
        self.login = ""


class Subscription:
    __slots__ = ("session", "id", "destination", "ack", "prefix")

    def __init__(self, session: Session, sub_id: str, destination: str, ack: str):
        self.session = session
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        # Rendered once: every delivery is this prefix plus the message's shared part.
        sid = escape(sub_id) if session.escape else sub_id
        self.prefix = b"MESSAGE\nsubscription:" + sid.encode() + b"\n"


class Message:
    """A published message, rendered once per escaping style (1.0 or 1.1+), shared by every delivery."""

    __slots__ = ("id", "destination", "headers", "body", "_rendered")

    def __init__(self, message_id: str, destination: str, headers: dict, body: bytes):
        self.id = message_id
        self.destination = destination
        self.headers = headers
        self.body = body
        self._rendered = [None, None]

    def shared(self, escaped: bool) -> bytes:
        part = self._rendered[escaped]
        if part is None:
            esc = escape if escaped else _no_newlines
            lines = [f"message-id:{esc(self.id)}", f"destination:{esc(self.destination)}"]
            for name, value in self.headers.items():
                if name not in NOT_FORWARDED:
                    lines.append(f"{esc(name)}:{esc(value)}")
            lines.append(f"content-length:{len(self.body)}")
            part = ("\n".join(lines) + "\n\n").encode() + self.body + b"\0"
            self._rendered[escaped] = part
        return part


def _no_newlines(value: str) -> str:
    # STOMP 1.0 has no escaping: a value with a line break cannot be sent as it is.
    return value.replace("\r", " ").replace("\n", " ") if ("\n" in value or "\r" in value) else value


class Broker:
    def __init__(self, config, outboxes: list[Outbox], clock=time.time):
        self.config = config
        self.outboxes = outboxes
        self.clock = clock
        self.sessions: dict[int, Session] = {}
        self.index = SubscriptionIndex()
        self.token = format(int(clock() * 1000) % (36 ** 6), "x")  # tells ids of different runs apart
        self._message_ids = itertools.count(1)
        self.stats = {"frames_in": 0, "messages_published": 0, "messages_delivered": 0,
                      "messages_dropped": 0, "connections_opened": 0, "connections_closed": 0,
                      "errors": 0}
        self._handlers = {
            "CONNECT": self._connect, "STOMP": self._connect, "SEND": self._send,
            "SUBSCRIBE": self._subscribe, "UNSUBSCRIBE": self._unsubscribe,
            "DISCONNECT": self._disconnect, "ACK": self._ack, "NACK": self._ack,
            "BEGIN": self._transaction, "COMMIT": self._transaction, "ABORT": self._transaction,
        }

    # -- events --------------------------------------------------------------------------------
    def on_open(self, conn: int, writer: int, peer: str, now: float) -> None:
        self.sessions[conn] = Session(conn, self.outboxes[writer], peer, now)
        self.stats["connections_opened"] += 1

    def on_closed(self, conn: int) -> None:
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        self._drop_subscriptions(session)
        self.stats["connections_closed"] += 1
        # The writer still holds its copy of the socket: let it go.
        session.outbox.add(R.CLOSE, conn)

    def on_alive(self, conn: int, now: float) -> None:
        session = self.sessions.get(conn)
        if session is not None:
            session.last_seen = now

    def on_bad_frame(self, conn: int, message: str, detail: str, receipt: str | None) -> None:
        session = self.sessions.get(conn)
        if session is not None and not session.closing:
            self._error(session, message, detail, receipt)

    def on_websocket(self, conn: int) -> None:
        session = self.sessions.get(conn)
        if session is not None:
            session.websocket = True

    def on_frame(self, conn: int, head: bytes, body: bytes, now: float) -> None:
        session = self.sessions.get(conn)
        if session is None or session.closing:
            return
        session.last_seen = now
        self.stats["frames_in"] += 1
        try:
            # CONNECT and STOMP are never escaped; peek at the command before decoding.
            unescape = session.escape and not head.startswith((b"CONNECT", b"STOMP"))
            command, headers = parse_head(head, unescape)
            handler = self._handlers.get(command)
            if handler is None:
                raise ProtocolError("unknown command", f"{command!r} is not a STOMP command",
                                    headers.get("receipt"))
            if not session.connected and command not in CONNECT_COMMANDS:
                raise ProtocolError("not connected", f"{command} before CONNECT", headers.get("receipt"))
            handler(session, command, headers, body)
        except ProtocolError as exc:
            self._error(session, exc.message, exc.detail, exc.receipt)

    def on_tick(self, now: float) -> None:
        """Close connections that never sent CONNECT, or went silent past their heart-beat."""
        connect_timeout = self.config.connect_timeout_ms / 1000
        grace = self.config.heartbeat_grace_ms / 1000
        for session in list(self.sessions.values()):
            if session.closing:
                continue
            if not session.connected:
                if connect_timeout and now - session.opened > connect_timeout:
                    self._error(session, "connect timeout", "no CONNECT frame in time")
            elif session.hb_in and now - session.last_seen > session.hb_in / 1000 + grace:
                self._error(session, "heart-beat timeout",
                            f"nothing received for {now - session.last_seen:.1f} s "
                            f"(heart-beat every {session.hb_in} ms)")

    def needs_tick(self) -> bool:
        return bool(self.sessions)

    # -- commands ------------------------------------------------------------------------------
    def _connect(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        if session.connected:
            raise ProtocolError("already connected", "a second CONNECT on one connection", receipt)
        accepted = headers.get("accept-version")
        if accepted is None:
            version = "1.0"
        else:
            offered = {v.strip() for v in accepted.split(",")}
            common = [v for v in VERSIONS if v in offered]
            if not common:
                self._error(session, "unsupported protocol version",
                            f"Supported protocol versions are {' '.join(VERSIONS)}", receipt,
                            extra={"version": ",".join(VERSIONS)})
                return
            version = common[-1]
        cx, cy = self._heart_beat(headers.get("heart-beat", "0,0") if version != "1.0" else "0,0", receipt)
        hb_min = self.config.heartbeat_min_ms
        if cx and cx > self.config.heartbeat_max_ms:
            raise ProtocolError("heart-beat out of range",
                                f"the client heart-beats every {cx} ms; the broker needs at least every "
                                f"{self.config.heartbeat_max_ms} ms", receipt)
        sx = hb_min if cy else 0           # the broker can send every hb_min ms
        sy = max(cx, hb_min) if cx else 0  # and wants the client's beats at the client's pace
        session.connected = True
        session.version = version
        session.escape = version != "1.0"
        session.id = f"{self.token}-{session.conn}"
        session.login = headers.get("login", "")
        session.hb_in = max(cx, sy) if cx and sy else 0
        out_interval = max(sx, cy) if sx and cy else 0
        reply = {"version": version, "server": SERVER, "session": session.id, "heart-beat": f"{sx},{sy}"}
        session.outbox.add(R.DATA, session.conn, render_frame("CONNECTED", reply, escape_headers=False))
        if out_interval:
            session.outbox.add(R.HEARTBEAT, session.conn, aux=out_interval)
        self._receipt(session, receipt)

    @staticmethod
    def _heart_beat(value: str, receipt) -> tuple[int, int]:
        try:
            cx, cy = (int(part) for part in value.split(","))
            if cx < 0 or cy < 0:
                raise ValueError
        except ValueError:
            raise ProtocolError("invalid heart-beat", f"heart-beat must be two non-negative integers: {value!r}",
                                receipt) from None
        return cx, cy

    def _send(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        destination = headers.get("destination")
        if not destination:
            raise ProtocolError("missing destination", "SEND needs a destination header", receipt)
        if "*" in destination:
            raise ProtocolError("wildcard destination", f"cannot SEND to a wildcard destination: {destination}",
                                receipt)
        self.publish(destination, headers, body)
        self._receipt(session, receipt)

    def publish(self, destination: str, headers: dict, body: bytes) -> int:
        """Deliver to every matching subscription; returns the number of deliveries."""
        self.stats["messages_published"] += 1
        subs = self.index.match(destination)
        if not subs:
            self.stats["messages_dropped"] += 1
            return 0
        message = Message(f"{self.token}-{next(self._message_ids)}", destination, headers, body)
        shared = {}
        for sub in subs:
            session = sub.session
            part = shared.get(session.escape)
            if part is None:
                part = shared[session.escape] = message.shared(session.escape)
            session.outbox.add2(session.conn, sub.prefix, part)
        self.stats["messages_delivered"] += len(subs)
        return len(subs)

    def _subscribe(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        destination = headers.get("destination")
        if not destination:
            raise ProtocolError("missing destination", "SUBSCRIBE needs a destination header", receipt)
        sub_id = headers.get("id")
        if sub_id is None:
            if session.version != "1.0":
                raise ProtocolError("missing id", "SUBSCRIBE needs an id header", receipt)
            sub_id = destination  # STOMP 1.0 made the id optional
        if sub_id in session.subs:
            raise ProtocolError("duplicate subscription", f"subscription id {sub_id!r} is already in use", receipt)
        ack = headers.get("ack", "auto")
        if ack not in ACK_MODES:
            raise ProtocolError("invalid ack mode", f"ack must be one of {', '.join(ACK_MODES)}, not {ack!r}",
                                receipt)
        if len(session.subs) >= self.config.max_subscriptions:
            raise ProtocolError("too many subscriptions",
                                f"at most {self.config.max_subscriptions} subscriptions per connection", receipt)
        sub = Subscription(session, sub_id, destination, ack)
        session.subs[sub_id] = sub
        self.index.add(destination, sub)
        self._receipt(session, receipt)

    def _unsubscribe(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        sub_id = headers.get("id")
        if sub_id is None:
            destination = headers.get("destination")
            if session.version != "1.0" or destination is None:
                raise ProtocolError("missing id", "UNSUBSCRIBE needs an id header", receipt)
            doomed = [s for s in session.subs.values() if s.destination == destination]
        else:
            doomed = [session.subs[sub_id]] if sub_id in session.subs else []
        for sub in doomed:
            del session.subs[sub.id]
            self.index.remove(sub.destination, sub)
        self._receipt(session, receipt)

    def _disconnect(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        self._receipt(session, headers.get("receipt"))
        self._close(session)

    def _ack(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        if "id" not in headers and "message-id" not in headers:
            raise ProtocolError("missing id", f"{command} needs an id header", receipt)
        self._receipt(session, receipt)

    def _transaction(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        if "transaction" not in headers:
            raise ProtocolError("missing transaction", f"{command} needs a transaction header", receipt)
        self._receipt(session, receipt)

    # -- helpers -------------------------------------------------------------------------------
    def _receipt(self, session: Session, receipt: str | None) -> None:
        if receipt is not None:
            session.outbox.add(R.DATA, session.conn,
                               render_frame("RECEIPT", {"receipt-id": receipt}, escape_headers=session.escape))

    def _error(self, session: Session, message: str, detail: str = "", receipt: str | None = None,
               extra: dict | None = None) -> None:
        """Send an ERROR and close the connection, as STOMP 1.2 asks."""
        self.stats["errors"] += 1
        headers = {"message": message}
        if receipt is not None:
            headers["receipt-id"] = receipt
        if extra:
            headers.update(extra)
        headers["content-type"] = "text/plain"
        body = (detail or message).encode()
        session.outbox.add(R.DATA, session.conn, render_frame("ERROR", headers, body, escape_headers=session.escape))
        log.info("connection %s (%s): ERROR %s: %s", session.conn, session.peer, message, detail)
        self._close(session)

    def _close(self, session: Session, websocket_close: bool = True) -> None:
        session.closing = True
        self._drop_subscriptions(session)
        if session.websocket and websocket_close:
            session.outbox.add(R.RAW, session.conn, encode_close(1000))
        session.outbox.add(R.CLOSE, session.conn)

    def hang_up(self, session: Session) -> None:
        """Close after a transport-level reply (HTTP response, WebSocket close) already written."""
        if not session.closing:
            self._close(session, websocket_close=False)

    def _drop_subscriptions(self, session: Session) -> None:
        for sub in session.subs.values():
            self.index.remove(sub.destination, sub)
        session.subs.clear()

    # -- statistics ----------------------------------------------------------------------------
    def session_stats(self) -> dict:
        sessions = self.sessions.values()
        return {
            "clients": len(self.sessions),
            "websockets": sum(1 for s in sessions if s.websocket),
            "stomp_connected": sum(1 for s in sessions if s.connected and not s.closing),
            "subscriptions": sum(len(s.subs) for s in sessions),
        }
