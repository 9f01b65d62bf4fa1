"""The dispatcher's state machine: sessions, subscriptions, queues and routing, with no I/O.

The dispatcher process feeds it events (a connection opened, a frame arrived, a connection closed,
time passed) and it appends outgoing records to the :class:`Outbox` of the writer that owns each
connection. Tests drive it directly with plain outboxes.

Destination kinds: ``/queue/...`` is a queue (each message to one subscriber, kept while nobody can
take it); a name starting with ``#`` is stompica's worker queue (each message to one subscriber,
round-robin, not kept); ``/temp-queue/NAME`` and ``/temp-topic/NAME`` are temporary destinations,
private to the connection that names them and reached by others through the reply name the broker
writes into ``reply-to`` (``/reply-queue/...``, ``/reply-topic/...``); anything else is a topic
(every matching subscription gets it).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time

from .. import __version__
from ..ipc import records as R
from ..protocol.stomp import ProtocolError, parse_head, render_frame
from ..protocol.websocket import encode_close
from ..diag.stats import QUERIES
from .model import Delivery, Durable, Message, Outbox, Queue, Session, Subscription, Temp
from .selector import SelectorError, compile_selector
from .stale import StaleQueue
from .subscriptions import SubscriptionIndex

__all__ = ["Broker", "Outbox", "VERSIONS", "SERVER"]

log = logging.getLogger("stompbroker.broker")

VERSIONS = ("1.0", "1.1", "1.2")
SERVER = f"stompbroker/{__version__}"
ACK_MODES = ("auto", "client", "client-individual")
CONNECT_COMMANDS = ("CONNECT", "STOMP")
TRANSACTIONAL = ("SEND", "ACK", "NACK")
QUEUE_PREFIX = "/queue/"
MONITOR = "/queue/monitor"   # stompserver's status destination: every subscriber gets each status
DIAG_PREFIX = "DIAG"         # stompica's DIAG topics: a SEND here gets the named statistics as headers
WORKER_PREFIX = "#"
TEMP_QUEUE = "/temp-queue/"  # RabbitMQ's and ActiveMQ's temporary destinations, private to one connection
TEMP_PREFIXES = (TEMP_QUEUE, "/temp-topic/")
REPLY_PREFIXES = ("/reply-queue/", "/reply-topic/")  # their broker-wide names, for others to send to
REDELIVERED = b"redelivered:true\n"
MAX_MILLIS = 10 ** 15          # ms: expires, expiration and replay-from beyond year 33000 are refused
MAX_HEART_BEAT = 2 ** 31 - 1   # ms: a heart-beat interval must fit the records' 32-bit field
OWNER_SEP = "\x1f"              # between the login and the name in a durable subscription's key
LOGGED = 200                   # characters of a client's value kept in logs and ERROR bodies


def _millis(text: str) -> int:
    """A header of milliseconds: an integer from 0 to MAX_MILLIS, else ValueError."""
    text = text.strip()
    if len(text) > 16 or not text.isdigit():  # isdigit refuses signs; the length, 400-digit numbers
        raise ValueError(text)
    value = int(text)
    if value > MAX_MILLIS:
        raise ValueError(text)
    return value


def _short(text: str) -> str:
    return text if len(text) <= LOGGED else f"{text[:LOGGED]}... ({len(text)} characters)"


class Broker:
    def __init__(self, config, outboxes: list[Outbox], clock=time.time):
        self.config = config
        self.outboxes = outboxes
        self.clock = clock               # wall clock, for the absolute `expires` header
        self.now = 0.0                   # monotonic time of the event being handled
        self.sessions: dict[int, Session] = {}
        self.index = SubscriptionIndex()
        self.queues: dict[str, Queue] = {}
        self.worker_rr: dict[str, int] = {}
        self.stale = StaleQueue(config.TTL / 1000, config.max_stale_queue_size) if config.TTL > 0 else None
        self.token = format(int(clock() * 1000) % (36 ** 6), "x")  # tells ids of different runs apart
        self.diag = None                 # the statistics provider (diag.stats.Statistics), set by the dispatcher
        self.store = None                # the durable store (store.sqlite.Store), set by the dispatcher
        self.auth = None                 # the Authenticator (broker/auth.py), set by the dispatcher
        self.failures: dict[str, int] = {}        # failed logins per client address
        self.delayed: list[tuple[float, int]] = []  # refused logins, answered after a delay
        self._ops_mark = 0
        self.need_commit = False         # a reply waits for the batch being gathered: commit it even if empty
        self.holding: set[Session] = set()   # sessions with receipts waiting for a store commit
        self.unconfirmed: dict[int, tuple] = {}  # ended sessions with deliveries the writer may still send
        self.timed: set[Session] = set()     # sessions with a deadline: not yet CONNECTed, or heart-beating
        self.alive_lag = R.alive_every(config)  # the reader's ALIVE reports trail a connection's bytes by less
        self.durables: dict[str, Durable] = {}
        self.rescan: set[Queue] = set()      # queues whose pump stopped at the scan budget: the tick goes on
        self.examined = 0                    # messages looked at by _pump (a cost measure for tests)
        self.durable_index = SubscriptionIndex()
        self.temps: dict[str, Temp] = {}     # temporary destinations by reply name
        self._temp_ids = itertools.count(1)
        self.next_monitor = 0.0
        self._message_ids = itertools.count(1)
        self._ack_ids = itertools.count(1)
        self.stats = {"frames_in": 0, "messages_published": 0, "messages_delivered": 0,
                      "messages_dropped": 0, "messages_expired": 0, "dead_lettered": 0,
                      "connections_opened": 0, "connections_closed": 0, "errors": 0}
        self._handlers = {
            "CONNECT": self._connect, "STOMP": self._connect, "SEND": self._send,
            "SUBSCRIBE": self._subscribe, "UNSUBSCRIBE": self._unsubscribe,
            "DISCONNECT": self._disconnect, "ACK": self._ack, "NACK": self._ack,
            "BEGIN": self._begin, "COMMIT": self._commit, "ABORT": self._abort,
            "DIAG": self._diag,
        }

    # -- events --------------------------------------------------------------------------------
    def on_open(self, conn: int, writer: int, peer: str, now: float) -> None:
        session = self.sessions[conn] = Session(conn, self.outboxes[writer], peer, now)
        self.timed.add(session)  # until CONNECT: the connect timeout applies
        self.stats["connections_opened"] += 1

    def on_closed(self, conn: int, tell_writer: bool = True) -> None:
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        session.held.clear()
        self.holding.discard(session)
        self.timed.discard(session)
        if session.pending is not None and self.auth is not None:
            self.auth.cancel(conn)
        self._end_session(session)
        if session.inflight and not session.written_final:
            # The writer may still be sending them: wait for its last count for this connection.
            self.unconfirmed[conn] = (session, self.now + self.config.shutdown_timeout_ms / 1000 + 2)
        else:
            self._return_unwritten(session)
        self.stats["connections_closed"] += 1
        if tell_writer:  # the writer still holds its copy of the socket: let it go
            session.outbox.add(R.CLOSE, conn)

    def on_reader_start(self, first_conn: int) -> None:
        """A new reader runs: every session belongs to the one that died. End them all (their unacked
        and unwritten queue messages go back to their queues) and have the writers cut the sockets."""
        if self.sessions:
            log.warning("reader restarted: ending its %d sessions; queued messages are kept", len(self.sessions))
        for session in self.sessions.values():  # first nobody takes deliveries: none go to the dead
            for sub in session.subs.values():
                self.index.remove(sub.destination, sub)
                if sub.durable is not None:
                    sub.durable.sub = None
        for conn in list(self.sessions):
            self.on_closed(conn, tell_writer=False)
        floor = R.CONN_ID.pack(first_conn)
        for box in self.outboxes:
            box.add(R.RESET, 0, floor)

    def on_written(self, conn: int, total: int, final: bool = False) -> None:
        """The writer has sent ``total`` marked deliveries of this connection: they leave the store.
        ``final``: it will send no more (closing or gone); what is left goes back to its queue."""
        session = self.sessions.get(conn)
        ended = None
        if session is None:
            ended = self.unconfirmed.pop(conn, None) if final else self.unconfirmed.get(conn)
            if ended is None:
                return
            session = ended[0]
        if total > session.written:
            n = total - session.written
            session.written = total
            inflight = session.inflight
            store = self.store
            for _ in range(min(n, len(inflight))):
                message, _ = inflight.popleft()
                if message.seq:
                    store.delete(message.seq)
                    message.seq = 0
        if final:
            session.written_final = True
            if ended is not None:
                self._return_unwritten(session)

    def on_writer_restart(self, index: int) -> None:
        """A writer died: nothing more of what it held will be sent."""
        for conn, (session, _) in list(self.unconfirmed.items()):
            if session.outbox.index == index:
                del self.unconfirmed[conn]
                self._return_unwritten(session)
        for session in self.sessions.values():
            if session.outbox.index == index:
                session.written_final = True

    def _expire_unconfirmed(self, now: float) -> None:
        for conn, (session, deadline) in list(self.unconfirmed.items()):
            if now >= deadline:
                del self.unconfirmed[conn]
                self._return_unwritten(session)

    def _return_unwritten(self, session: Session) -> None:
        """Deliveries the writer never sent go back to the head of their queues, marked redelivered."""
        if not session.inflight:
            return
        returned: dict[Queue, list] = {}
        for message, queue in session.inflight:
            queue.dequeued -= 1
            current = self.queues.get(queue.name)
            if current is None and queue.owner is None:
                current = self._queue(queue.name)
            if current is None:  # its durable subscription was dropped meanwhile
                self._discard(queue, message)
                continue
            message.redelivered = True
            returned.setdefault(current, []).append(message)
        session.inflight.clear()
        for queue, messages in returned.items():
            queue.messages.extendleft(reversed(messages))
            self._pump(queue)

    def on_alive(self, conn: int, now: float) -> None:
        session = self.sessions.get(conn)
        if session is not None:
            session.last_seen = now

    def on_bad_frame(self, conn: int, message: str, detail: str, receipt: str | None) -> None:
        session = self.sessions.get(conn)
        if session is not None and not session.closing:
            self._error(session, message, detail, receipt)

    def on_internal_error(self, conn: int) -> None:
        session = self.sessions.get(conn)
        if session is not None and not session.closing:
            self._error(session, "internal error", "the broker could not handle this frame (see its log)")

    def on_websocket(self, conn: int) -> None:
        session = self.sessions.get(conn)
        if session is not None:
            session.websocket = True

    def on_frame(self, conn: int, head: bytes, body: bytes, now: float) -> None:
        session = self.sessions.get(conn)
        if session is None or session.closing:
            return
        self.now = session.last_seen = now
        self.stats["frames_in"] += 1
        if session.pending is not None:  # its CONNECT is being checked: keep the frames until then
            if len(session.backlog) >= 1000:
                self._error(session, "too many frames before CONNECTED")
            else:
                session.backlog.append((head, body))
            return
        if self.store is not None:
            self._ops_mark = self.store.ops
        try:
            # CONNECT and STOMP are never escaped; peek at the command before decoding.
            unescape = session.escape and not head.startswith((b"CONNECT", b"STOMP"))
            command, headers = parse_head(head, unescape)
            handler = self._handlers.get(command)
            if handler is None:
                raise ProtocolError("unknown command", f"{command!r} is not a STOMP command",
                                    headers.get("receipt"))
            if not session.connected and command not in CONNECT_COMMANDS and not (
                    command == "DIAG" and self.config.diag_before_connect):
                raise ProtocolError("not connected", f"{command} before CONNECT", headers.get("receipt"))
            transaction = headers.get("transaction")
            if transaction is not None and command in TRANSACTIONAL:
                self._hold(session, transaction, command, headers, body)
            else:
                handler(session, command, headers, body)
        except ProtocolError as exc:
            self._error(session, exc.message, exc.detail, exc.receipt)

    def on_tick(self, now: float) -> None:
        """Close connections that never sent CONNECT or went silent; expire stale messages."""
        self.now = now
        if self.store is not None:
            self._ops_mark = self.store.ops
        connect_timeout = self.config.connect_timeout_ms / 1000
        grace = self.config.heartbeat_grace_ms / 1000
        for session in list(self.timed):
            if session.closing:
                self.timed.discard(session)
                continue
            if not session.connected:
                if connect_timeout and now - session.opened > connect_timeout:
                    self._error(session, "connect timeout", "no CONNECT frame in time")
            elif session.hb_in and now - session.last_seen > session.hb_in / 1000 + grace + self.alive_lag:
                self._error(session, "heart-beat timeout",
                            f"nothing received for {now - session.last_seen:.1f} s "
                            f"(heart-beat every {session.hb_in} ms)")
        if self.stale is not None:
            self.stale.sweep(now)
        if self.holding and self.store is not None and self.store.failing_since:
            self.store_outage(now)
        if self.unconfirmed:
            self._expire_unconfirmed(now)
        if self.rescan:
            queues, self.rescan = self.rescan, set()
            for queue in queues:
                self._pump(queue)
        if self.delayed:
            due = [conn for when, conn in self.delayed if when <= now]
            self.delayed = [(when, conn) for when, conn in self.delayed if when > now]
            for conn in due:
                session = self.sessions.get(conn)
                if session is not None:
                    self._error(session, "access refused", "the login or passcode is not valid")
        if self.diag is not None and now >= self.next_monitor and self.index.exact.get(MONITOR):
            self.next_monitor = now + self.config.monitor_interval / 1000
            status = Message(f"{self.token}-{next(self._message_ids)}", MONITOR, {"content-type": "text/plain"},
                             self.diag.monitor_body())
            for sub in self.index.exact[MONITOR]:
                self._deliver(sub, status, None)

    def needs_tick(self) -> bool:
        return bool(self.timed or self.stale or self.delayed or self.rescan or self.index.exact.get(MONITOR)
                    or (self.holding and self.store is not None and self.store.failing_since)
                    or self.unconfirmed)

    # -- connecting ----------------------------------------------------------------------------
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
        if cx and cx > self.config.heartbeat_max_ms:
            raise ProtocolError("heart-beat out of range",
                                f"the client heart-beats every {cx} ms; the broker needs at least every "
                                f"{self.config.heartbeat_max_ms} ms", receipt)
        if self.auth is not None and self.auth.required:
            session.pending = (version, cx, cy, headers)
            self.auth.submit(session.conn, headers.get("login"), headers.get("passcode"),
                             session.peer.rsplit(":", 1)[0])
            return
        self._connected(session, version, cx, cy, headers, headers.get("login", ""))

    def on_auth(self, conn: int, user: str | None, now: float) -> None:
        """A login check finished: CONNECTED and the frames that waited, or a refusal after a delay."""
        session = self.sessions.get(conn)
        if session is None or session.pending is None:
            return
        version, cx, cy, headers = session.pending
        session.pending = None
        self.now = now
        ip = session.peer.rsplit(":", 1)[0]
        if user is None:
            failures = self.failures[ip] = self.failures.get(ip, 0) + 1
            if len(self.failures) > 100_000:
                self.failures.clear()
            delay = min(self.config.auth_fail_delay_ms * 2 ** min(failures - 1, 10), 10_000) / 1000
            log.warning("login refused for %r from %s (%d failures from there)", headers.get("login"), ip, failures)
            session.closing = True  # nothing more from it is read; the ERROR follows the delay
            session.backlog.clear()
            self.delayed.append((now + delay, conn))
            return
        self.failures.pop(ip, None)
        self._connected(session, version, cx, cy, headers, user)
        backlog, session.backlog = session.backlog, []
        for head, body in backlog:
            self.on_frame(conn, head, body, now)

    def _connected(self, session: Session, version: str, cx: int, cy: int, headers: dict, login: str) -> None:
        receipt = headers.get("receipt")
        hb_min = self.config.heartbeat_min_ms
        sx = hb_min if cy else 0           # the broker can send every hb_min ms
        sy = max(cx, hb_min) if cx else 0  # and wants the client's beats at the client's pace
        session.connected = True
        session.version = version
        session.escape = version != "1.0"
        session.id = f"{self.token}-{session.conn}"
        session.login = login
        session.client_id = headers.get("client-id", session.login)
        session.hb_in = max(cx, sy) if cx and sy else 0
        if not session.hb_in:
            self.timed.discard(session)  # nothing to watch: idle connections cost no timer work
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
            if not (0 <= cx <= MAX_HEART_BEAT and 0 <= cy <= MAX_HEART_BEAT):
                raise ValueError
        except ValueError:
            raise ProtocolError("invalid heart-beat", f"heart-beat must be two integers from 0 to {MAX_HEART_BEAT}: "
                                f"{_short(value)!r}", receipt) from None
        return cx, cy

    # -- publishing ----------------------------------------------------------------------------
    def _send(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        destination = self._check_send(headers, receipt)
        if not destination.startswith(TEMP_PREFIXES):  # a connection's own temporary ones are always its own
            self._allowed(session, destination, write=True, receipt=receipt)
        destination = self._temporaries(session, headers, destination, receipt)
        if destination.startswith(DIAG_PREFIX) and self.diag is not None:
            query = body.decode(errors="replace").strip()
            if query in QUERIES:
                headers = {**headers, **self.diag.headers(query)}
        if self._store_refuses(destination, headers):
            raise ProtocolError("store unavailable", "the durable store cannot write (see the broker's log); "
                                "the message was not accepted", receipt)
        queue = self.queues.get(destination)
        if queue is None and destination in self.temps:
            queue = self.temps[destination].queue
        if queue is not None and queue.depth() >= self.config.max_queue_messages:
            raise ProtocolError("queue full", f"{destination} holds {queue.depth()} messages, "
                                f"the most allowed (max_queue_messages)", receipt)
        self.publish(destination, headers, body, self._expiry(headers, receipt))
        self._receipt(session, receipt)

    @staticmethod
    def _check_send(headers: dict, receipt) -> str:
        destination = headers.get("destination")
        if not destination:
            raise ProtocolError("missing destination", "SEND needs a destination header", receipt)
        if "*" in destination:
            raise ProtocolError("wildcard destination", f"cannot SEND to a wildcard destination: {destination}",
                                receipt)
        if destination == MONITOR:
            raise ProtocolError("reserved destination", f"{MONITOR} is written by the broker only", receipt)
        return destination

    def _expiry(self, headers: dict, receipt) -> float:
        """Monotonic deadline from ActiveMQ's `expires` (epoch ms) or RabbitMQ's `expiration` (ms)."""
        absolute, relative = headers.get("expires"), headers.get("expiration")
        if absolute is None and relative is None:
            return 0.0
        try:
            if absolute is not None and absolute.strip() not in ("", "0"):
                return self.now + (_millis(absolute) / 1000 - self.clock()) or 1e-9
            if relative is not None:
                return self.now + _millis(relative) / 1000 or 1e-9
        except ValueError:
            raise ProtocolError("invalid expiry", "expires and expiration must be integers from 0 to "
                                f"{MAX_MILLIS} (milliseconds)", receipt) from None
        return 0.0

    def publish(self, destination: str, headers: dict, body: bytes, expires: float = 0.0) -> int:
        """Route one message; returns the number of deliveries made now."""
        self.stats["messages_published"] += 1
        message = Message(f"{self.token}-{next(self._message_ids)}", destination, headers, body, expires)
        if expires and message.expired(self.now):
            self.stats["messages_expired"] += 1
            return 0
        if destination.startswith(REPLY_PREFIXES):
            return self._publish_temp(destination, message)
        if destination.startswith(QUEUE_PREFIX):
            queue = self._queue(destination)
            self._persist(queue, message)
            queue.messages.append(message)
            queue.enqueued += 1
            return self._pump(queue)
        kept = 0
        if self.durables:
            for durable in self.durable_index.match(destination):
                copy = Message(message.id, destination, headers, body, expires)
                self._persist(durable.queue, copy)
                durable.queue.messages.append(copy)
                durable.queue.enqueued += 1
                if durable.queue.depth() > self.config.max_queue_messages:
                    self._discard(durable.queue, durable.queue.pop_oldest())  # oldest goes
                self._pump(durable.queue)
                kept += 1
        subs = self.index.match(destination)
        if destination.startswith(WORKER_PREFIX):
            delivered = self._deliver_round_robin(destination, subs, message)
        else:
            delivered = 0
            escaped_part = plain_part = None
            for sub in subs:
                if sub.accepts is not None and not sub.accepts(headers):
                    continue
                session = sub.session
                if sub.tracked:
                    self._deliver_tracked(sub, message, None)
                elif session.escape:
                    if escaped_part is None:
                        escaped_part = message.shared(True)
                    session.outbox.add2(session.conn, sub.prefix, escaped_part)
                else:
                    if plain_part is None:
                        plain_part = message.shared(False)
                    session.outbox.add2(session.conn, sub.prefix, plain_part)
                delivered += 1
        if delivered:
            self.stats["messages_delivered"] += delivered
        elif kept:
            pass
        elif self.stale is not None:
            self.stale.add(message, self.now)
        else:
            self.stats["messages_dropped"] += 1
        return delivered

    def _deliver_round_robin(self, destination: str, subs: tuple, message: Message) -> int:
        n = len(subs)
        start = self.worker_rr.get(destination, 0)
        for i in range(n):
            sub = subs[(start + i) % n]
            if sub.has_room() and (sub.accepts is None or sub.accepts(message.headers)):
                self.worker_rr[destination] = (start + i + 1) % n
                self._deliver(sub, message, None)
                return 1
        return 0

    def _deliver(self, sub: Subscription, message: Message, queue: Queue | None) -> None:
        if sub.tracked:
            self._deliver_tracked(sub, message, queue)
            return
        session = sub.session
        shared = message.shared(session.escape)
        mark = 0
        if queue is not None:  # it leaves the store (or goes back to the queue) once the writer says
            queue.dequeued += 1
            session.inflight.append((message, queue))
            mark = R.WRITTEN_MARK
        if message.redelivered:
            session.outbox.add3(session.conn, sub.prefix, REDELIVERED, shared, mark)
        else:
            session.outbox.add2(session.conn, sub.prefix, shared, mark)

    def _deliver_tracked(self, sub: Subscription, message: Message, queue: Queue | None) -> None:
        session = sub.session
        ack_id = f"{self.token}-a{next(self._ack_ids)}"
        sub.unacked[ack_id] = Delivery(ack_id, message, queue, message.nacks)
        session.acks[ack_id] = sub
        extra = b"ack:" + ack_id.encode() + b"\n"
        if message.redelivered or message.nacks:
            extra += REDELIVERED
        session.outbox.add3(session.conn, sub.prefix, extra, message.shared(session.escape))
        if queue is not None:
            queue.unacked += 1
            if message.seq:
                self.store.mark_delivered(message.seq)

    # -- queues --------------------------------------------------------------------------------
    def _queue(self, name: str) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = Queue(name)
        return queue

    def _persist(self, queue: Queue, message: Message) -> None:
        """Write a queued message to the durable store, unless sent with persistent:false."""
        if self.store is None or message.headers.get("persistent") == "false":
            return
        expires_ms = (message.expires - self.now + self.clock()) * 1000 if message.expires else 0.0
        message.seq = self.store.insert(queue.name, message.id, message.headers, message.body, expires_ms)
        self.store.log(message.destination, message.id, message.headers, message.body)

    def _discard(self, queue: Queue, message: Message) -> None:
        """A queued message leaves without delivery (expired, or pushed out of a full queue)."""
        if message.seq:
            self.store.delete(message.seq)
            message.seq = 0

    def _consumers(self, queue: Queue) -> tuple:
        if queue.owner is not None:
            return (queue.owner.sub,) if queue.owner.sub is not None else ()
        return self.index.match(queue.name)

    def _pump(self, queue: Queue, room: bool = False) -> int:
        """Hand waiting messages to subscribers with room, round-robin; returns deliveries made.

        The work is bounded whatever the selectors. A message is examined when it arrives: no
        consumer's selector accepts it, it is *parked* (looked at again only when a consumer
        subscribes); only full consumers accept it, it is *blocked* (looked at again, oldest first,
        only when ``room`` says a consumer may have room: an ACK, a NACK, a new subscription). One
        call examines at most ``queue_scan_budget`` messages it cannot deliver; a call that stopped
        there while parking is continued by the next tick.
        """
        subs = self._consumers(queue)
        if not subs or not (queue.messages or (room and queue.blocked)):
            self._drop_if_idle(queue)  # (an ACK may have taken its last message)
            return 0
        budget = [self.config.queue_scan_budget]
        delivered = 0
        if room and queue.blocked:
            delivered = self._scan(queue, subs, queue.blocked, budget)
        if budget[0] > 0:
            delivered += self._scan(queue, subs, queue.messages, budget)
        self.stats["messages_delivered"] += delivered
        self._drop_if_idle(queue)
        return delivered

    def _scan(self, queue: Queue, subs: tuple, source, budget: list) -> int:
        n = len(subs)
        still_blocked = []
        delivered = parked = 0
        while source:
            if budget[0] <= 0:
                if parked:
                    self.rescan.add(queue)
                break
            if not any(sub.has_room() for sub in subs):
                break
            message = source.popleft()
            if message.expired(self.now):
                queue.expired += 1
                self.stats["messages_expired"] += 1
                self._discard(queue, message)
                continue
            self.examined += 1
            chosen = None
            # A NACKed message goes to another subscriber if any (one pass when nothing is avoided).
            for allow_avoided in (False, True) if message.avoid is not None else (True,):
                for i in range(n):
                    sub = subs[(queue.rr + i) % n]
                    if (sub.has_room() and (allow_avoided or sub is not message.avoid)
                            and (sub.accepts is None or sub.accepts(message.headers))):
                        chosen = sub
                        queue.rr = (queue.rr + i + 1) % n
                        break
                if chosen is not None:
                    break
            if chosen is not None:
                message.avoid = None
                self._deliver(chosen, message, queue)
                delivered += 1
                continue
            budget[0] -= 1
            if any(not sub.has_room() and (sub.accepts is None or sub.accepts(message.headers)) for sub in subs):
                still_blocked.append(message)  # waits for a full consumer; later messages may still go
            elif queue.owner is not None:
                # A durable subscription's selector is fixed while it is attached: what it rejects
                # is not for it, as if it had been filtered out when published.
                self.stats["messages_dropped"] += 1
                self._discard(queue, message)
            else:
                queue.parked.append(message)
                parked += 1
        if still_blocked:
            if source is queue.blocked:
                source.extendleft(reversed(still_blocked))  # in order, ahead of the younger ones
            else:
                queue.blocked.extend(still_blocked)
        return delivered

    def _drop_if_idle(self, queue: Queue) -> None:
        """Forget a queue that holds nothing and that no subscription names exactly.

        Destination names are chosen by clients: an idle queue must cost nothing, or a client that
        walks through names grows the broker for good. Wildcard subscribers do not keep a queue
        alive (the next message makes it again); its counters go with it.
        """
        if (queue.owner is None and not queue.messages and not queue.parked and not queue.blocked
                and not queue.unacked
                and not self.index.exact.get(queue.name) and self.queues.get(queue.name) is queue):
            del self.queues[queue.name]
            self.rescan.discard(queue)

    def _unpark(self, queue: Queue) -> None:
        """A consumer came: parked messages are candidates again, ahead of the rest (they are older)."""
        if queue.parked:
            queue.messages.extendleft(reversed(queue.parked))
            queue.parked.clear()

    def _queues_for(self, pattern: str) -> list[Queue]:
        prefix = SubscriptionIndex.wildcard_prefix(pattern)
        if prefix is None:
            queue = self.queues.get(pattern)
            return [queue] if queue is not None else []
        return [q for name, q in self.queues.items() if name.startswith(prefix)]

    # -- subscriptions -------------------------------------------------------------------------
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
        temp = None
        if destination.startswith(TEMP_PREFIXES):
            temp = self._temp_to_subscribe(session, destination, receipt)
        elif destination.startswith(REPLY_PREFIXES):
            raise ProtocolError(f"permission denied for {destination}", "a reply destination is read only by the "
                                "connection that made it, by its /temp-queue/ or /temp-topic/ name", receipt)
        else:
            self._allowed(session, destination, write=False, receipt=receipt)
        if len(session.subs) >= self.config.max_subscriptions:
            raise ProtocolError("too many subscriptions",
                                f"at most {self.config.max_subscriptions} subscriptions per connection", receipt)
        prefetch = self._prefetch(headers, ack, receipt)
        accepts = self._filter(headers, receipt)
        replay_from = self._replay_from(headers, receipt)
        sub = Subscription(session, sub_id, destination, ack, prefetch, accepts)
        durable_name = None if temp is not None else self._durable_name(session, headers, sub_id, destination,
                                                                        receipt)
        session.subs[sub_id] = sub
        if temp is not None:
            temp.sub, sub.temp = sub, temp
        elif durable_name is not None:
            self._attach_durable(sub, durable_name)
        else:
            self.index.add(destination, sub)
        self._receipt(session, receipt)
        if replay_from is not None:
            self._replay(sub, replay_from)
        if sub.durable is not None or sub.temp is not None:
            for queue in self._sub_queues(sub):  # (a durable subscription's queue parks nothing: see _pump)
                self._unpark(queue)
                self._pump(queue, room=True)
            return
        for queue in self._queues_for(destination):
            self._unpark(queue)
            self._pump(queue, room=True)
        if self.stale is not None and not destination.startswith(QUEUE_PREFIX):
            prefix = SubscriptionIndex.wildcard_prefix(destination)
            late = self.stale.take(destination if prefix is None else None, prefix, self.now,
                                   accepts or (lambda headers: True))
            for message in late:
                self._deliver(sub, message, None)
            self.stats["messages_delivered"] += len(late)

    def _allowed(self, session: Session, destination: str, write: bool, receipt) -> None:
        """Refuse, with an ERROR naming the destination, what the user's permissions do not allow."""
        if self.config.diag_admin_only and (destination.startswith(DIAG_PREFIX) or destination == MONITOR) \
                and not (self.auth is not None and self.auth.is_admin(session.login)):
            raise ProtocolError(f"permission denied for {destination}", "diagnostics are for admin users", receipt)
        if self.auth is None or not self.auth.required:
            return
        allowed = self.auth.can_write if write else self.auth.can_read
        if not allowed(session.login, destination):
            verb = "write to" if write else "read from"
            raise ProtocolError(f"permission denied for {destination}", f"{session.login!r} may not {verb} "
                                f"{destination}", receipt)

    def _durable_name(self, session: Session, headers: dict, sub_id: str, destination: str, receipt) -> str | None:
        """The key of the durable subscription a SUBSCRIBE asks for, or None for a plain subscription.

        Named by RabbitMQ's `durable:true` (the subscription id) or ActiveMQ's
        `activemq.subscriptionName` (with the CONNECT's client-id), and keyed by the login too, so
        another user's subscription of the same name is another subscription. An existing name
        keeps its destination unless the SUBSCRIBE says `replace-durable:true` (its backlog is
        dropped then). Keys stored before logins were part of them have no OWNER_SEP and are found
        by their bare name.
        """
        name = headers.get("activemq.subscriptionName")
        if name is not None:
            name = f"{session.client_id}/{name}"
        elif headers.get("durable") == "true" or headers.get("persistent") == "true":
            name = sub_id
        else:
            return None
        if destination.startswith(QUEUE_PREFIX):
            raise ProtocolError("durable queue subscription", "queues keep their messages already; "
                                "durable subscriptions are for topics", receipt)
        key = f"{session.login}{OWNER_SEP}{name}"
        durable = self.durables.get(key)
        if durable is None and name in self.durables:
            key, durable = name, self.durables[name]
        if durable is not None:
            if durable.sub is not None:
                raise ProtocolError("durable subscription in use", f"durable subscription {_short(name)!r} is "
                                    "attached to another connection", receipt)
            if durable.pattern != destination and headers.get("replace-durable") != "true":
                raise ProtocolError("durable subscription exists", f"durable subscription {_short(name)!r} is for "
                                    f"{_short(durable.pattern)}; subscribe with replace-durable:true to drop it "
                                    f"and its waiting messages and subscribe to {_short(destination)}", receipt)
        return key

    def _attach_durable(self, sub: Subscription, name: str) -> None:
        durable = self.durables.get(name)
        if durable is None or durable.pattern != sub.destination:
            if durable is not None:  # replace-durable:true: start afresh on the new topic
                self._drop_durable(durable)
            durable = self.durables[name] = Durable(name, sub.destination)
            self.queues[durable.queue.name] = durable.queue
            self.durable_index.add(sub.destination, durable)
            if self.store is not None:
                self.store.add_durable(name, sub.destination)
        durable.sub = sub
        sub.durable = durable

    def _drop_durable(self, durable: Durable) -> None:
        for source in (durable.queue.messages, durable.queue.blocked):
            for message in source:
                self._discard(durable.queue, message)
            source.clear()
        self.durable_index.remove(durable.pattern, durable)
        self.queues.pop(durable.queue.name, None)
        del self.durables[durable.name]
        if self.store is not None:
            self.store.remove_durable(durable.name)

    def _replay_from(self, headers: dict, receipt) -> float | None:
        value = headers.get("replay-from")
        if value is None:
            return None
        if self.store is None:
            raise ProtocolError("replay unavailable", "replay-from needs the durable store (store=sqlite)", receipt)
        try:
            return float(_millis(value))
        except ValueError:
            raise ProtocolError("invalid replay-from", f"replay-from must be epoch milliseconds: {_short(value)!r}",
                                receipt) from None

    def _replay(self, sub: Subscription, since_ms: float) -> None:
        """Deliver stored messages sent since ``since_ms`` to one subscription, as copies."""
        prefix = SubscriptionIndex.wildcard_prefix(sub.destination)
        exact = sub.destination if prefix is None else None
        for destination, message_id, headers, body in self.store.replay(exact, prefix, since_ms):
            if sub.accepts is None or sub.accepts(headers):
                message = Message(message_id, destination, {**headers, "replayed": "true"}, body)
                self._deliver(sub, message, None)

    def _prefetch(self, headers: dict, ack: str, receipt) -> int:
        value = headers.get("prefetch-count", headers.get("activemq.prefetchSize"))
        if value is None:
            return 0 if ack == "auto" else self.config.client_prefetch
        try:
            prefetch = int(value)
            if prefetch < 0:
                raise ValueError
        except ValueError:
            raise ProtocolError("invalid prefetch", f"prefetch-count must be a non-negative integer: {value!r}",
                                receipt) from None
        return 0 if ack == "auto" else prefetch

    def _filter(self, headers: dict, receipt):
        """xtomp's `filter:<name>=<value>` and ActiveMQ's `selector`, combined with AND."""
        tests = []
        spec = headers.get("filter")
        if spec is not None:
            name, eq, value = spec.partition("=")
            if not eq or not name:
                raise ProtocolError("invalid filter", f"filter must be <header>=<value>: {spec!r}", receipt)
            tests.append(lambda h, name=name, value=value: h.get(name) == value)
        text = headers.get("selector")
        if text is not None:
            if len(text) > self.config.max_selector_length:
                raise ProtocolError("selector too long", f"a selector may have at most "
                                    f"{self.config.max_selector_length} characters, not {len(text)}", receipt)
            try:
                tests.append(compile_selector(text))
            except SelectorError as exc:
                raise ProtocolError("invalid selector", f"{exc} in selector {_short(text)!r}", receipt) from None
        if not tests:
            return None
        if len(tests) == 1:
            return tests[0]
        first, second = tests
        return lambda h: first(h) and second(h)

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
            durable = sub.durable
            self._remove_subscription(session, sub)
            if durable is not None:  # an explicit UNSUBSCRIBE ends a durable subscription
                self._drop_durable(durable)
        self._receipt(session, receipt)

    def _remove_subscription(self, session: Session, sub: Subscription) -> None:
        """Forget a subscription; its unacknowledged queue messages go back to the head of their queue."""
        session.subs.pop(sub.id, None)
        self.index.remove(sub.destination, sub)
        if sub.durable is not None:  # detach: its messages wait for the client to come back
            sub.durable.sub = None
        if sub.temp is not None and sub.temp.sub is sub:  # a temporary queue's messages wait too
            sub.temp.sub = None
        returned: dict[Queue, list] = {}
        for delivery in sub.unacked.values():
            session.acks.pop(delivery.ack_id, None)
            if delivery.queue is not None:
                delivery.queue.unacked -= 1
                delivery.message.redelivered = True
                returned.setdefault(delivery.queue, []).append(delivery.message)
        sub.unacked.clear()
        for queue, messages in returned.items():
            queue.messages.extendleft(reversed(messages))
            self._pump(queue)
        if sub.durable is None and sub.destination.startswith(QUEUE_PREFIX):
            queue = self.queues.get(sub.destination)
            if queue is not None:
                self._drop_if_idle(queue)

    # -- temporary destinations ----------------------------------------------------------------
    def _temp(self, session: Session, name: str, receipt) -> Temp:
        """The connection's temporary destination ``name`` (/temp-queue/X or /temp-topic/X), made on first use."""
        temp = session.temps.get(name)
        if temp is None:
            if "*" in name:
                raise ProtocolError("wildcard destination", f"a temporary destination cannot be a wildcard: {name}",
                                    receipt)
            if len(session.temps) >= self.config.max_subscriptions:
                raise ProtocolError("too many temporary destinations", f"at most {self.config.max_subscriptions} "
                                    "temporary destinations per connection (max_subscriptions)", receipt)
            is_queue = name.startswith(TEMP_QUEUE)
            # Unique in the broker's life (session id, counter) and not guessable (others may write, not read).
            public = (f"{REPLY_PREFIXES[0] if is_queue else REPLY_PREFIXES[1]}{session.id}-{next(self._temp_ids)}"
                      f"-{secrets.token_hex(4)}")
            temp = session.temps[name] = self.temps[public] = Temp(name, public, session, is_queue)
        return temp

    def _temporaries(self, session: Session, headers: dict, destination: str, receipt) -> str:
        """A SEND naming the connection's temporary destinations: a ``reply-to`` one is rewritten to its
        reply name and the connection is subscribed to it, with the temporary name as the subscription
        id (RabbitMQ's behaviour), unless it already is; a ``destination`` one becomes its reply name,
        which is returned."""
        reply_to = headers.get("reply-to")
        if reply_to is not None and reply_to.startswith(TEMP_PREFIXES):
            temp = self._temp(session, reply_to, receipt)
            if temp.sub is None:
                if reply_to in session.subs:
                    raise ProtocolError("duplicate subscription", f"subscription id {reply_to!r} is already in use",
                                        receipt)
                if len(session.subs) >= self.config.max_subscriptions:
                    raise ProtocolError("too many subscriptions", f"at most {self.config.max_subscriptions} "
                                        "subscriptions per connection", receipt)
                sub = session.subs[reply_to] = Subscription(session, reply_to, reply_to, "auto", 0, None)
                temp.sub, sub.temp, temp.auto = sub, temp, True
                if temp.queue is not None:
                    self._pump(temp.queue)
            headers["reply-to"] = temp.public
        if destination.startswith(TEMP_PREFIXES):
            destination = headers["destination"] = self._temp(session, destination, receipt).public
        return destination

    def _temp_to_subscribe(self, session: Session, destination: str, receipt) -> Temp:
        """The owner subscribes to its temporary destination: the broker's own subscription gives way;
        a second explicit one is refused (one subscription per temporary destination)."""
        temp = self._temp(session, destination, receipt)
        if temp.sub is not None:
            if not temp.auto:
                raise ProtocolError("already subscribed", f"{destination} already has subscription "
                                    f"{temp.sub.id!r}", receipt)
            self._remove_subscription(session, temp.sub)
        temp.auto = False
        return temp

    def _publish_temp(self, destination: str, message: Message) -> int:
        temp = self.temps.get(destination)
        if temp is None:  # its connection has gone, and the destination with it
            self.stats["messages_dropped"] += 1
            return 0
        message.destination = temp.private  # its one reader knows it by that name
        queue = temp.queue
        if queue is not None:
            if queue.depth() >= self.config.max_queue_messages:  # (a SEND is refused before this)
                queue.pop_oldest()
                self.stats["messages_dropped"] += 1
            queue.messages.append(message)
            queue.enqueued += 1
            return self._pump(queue)
        sub = temp.sub
        if sub is None or (sub.accepts is not None and not sub.accepts(message.headers)):
            self.stats["messages_dropped"] += 1
            return 0
        self._deliver(sub, message, None)
        self.stats["messages_delivered"] += 1
        return 1

    def _sub_queues(self, sub: Subscription) -> list[Queue]:
        """The queues a subscription takes from."""
        if sub.durable is not None:
            return [sub.durable.queue]
        if sub.temp is not None:
            return [sub.temp.queue] if sub.temp.queue is not None else []
        return self._queues_for(sub.destination)

    # -- acknowledgement -----------------------------------------------------------------------
    def _ack(self, session: Session, command: str, headers: dict, body: bytes, committed: bool = False) -> None:
        receipt = headers.get("receipt")
        # A committed ACK was checked when it was held; what went meanwhile (a cumulative ACK) is done.
        sub, ack_id = self._find_delivery(session, command, headers, receipt, strict=not committed)
        if sub is not None:
            if sub.ack == "client":  # cumulative: this one and every earlier one
                ids = []
                for key in sub.unacked:
                    ids.append(key)
                    if key == ack_id:
                        break
            else:
                ids = [ack_id]
            settled = [sub.unacked.pop(key) for key in ids]
            for delivery in settled:
                session.acks.pop(delivery.ack_id, None)
                if delivery.queue is not None:
                    delivery.queue.unacked -= 1
                if command == "ACK":
                    if delivery.queue is not None:
                        delivery.queue.dequeued += 1
                        self._discard(delivery.queue, delivery.message)
                else:
                    self._nacked(sub, delivery)
            for queue in self._sub_queues(sub):
                self._pump(queue, room=True)
        self._receipt(session, receipt)

    def _find_delivery(self, session: Session, command: str, headers: dict, receipt, strict: bool = True):
        """(subscription, ack id) of the delivery an ACK/NACK names by its id within the connection
        (1.2 `id`, before that `message-id`), whatever its `subscription` header says. An id the
        connection does not hold is an ERROR naming it; (None, None) when not ``strict``."""
        wanted = headers.get("id") if session.version == "1.2" else None
        if wanted is None:
            wanted = headers.get("message-id", headers.get("id"))
        if wanted is None:
            raise ProtocolError("missing id", f"{command} needs an id header (message-id before 1.2)", receipt)
        sub = session.acks.get(wanted)
        if sub is not None:
            return sub, wanted
        named = session.subs.get(headers.get("subscription", ""))
        for sub in ([named] if named is not None else []) + [s for s in session.subs.values() if s is not named]:
            for key, delivery in sub.unacked.items():
                if delivery.message.id == wanted:
                    return sub, key
        if not strict:
            return None, None
        raise ProtocolError(f"{command} of unknown id {wanted}",
                            f"this connection holds no unacknowledged message with id {wanted!r}", receipt)

    def _nacked(self, sub: Subscription, delivery: Delivery) -> None:
        message = delivery.message
        message.nacks = delivery.nacks + 1
        if message.nacks > self.config.max_redeliveries:
            self._dead_letter(message, f"rejected {message.nacks} times")
        elif delivery.queue is not None:
            message.avoid = sub
            delivery.queue.messages.appendleft(message)
        else:
            self._deliver(sub, message, None)  # a topic message has nobody else to go to

    def _dead_letter(self, message: Message, reason: str) -> None:
        self.stats["dead_lettered"] += 1
        if message.seq:
            self.store.delete(message.seq)
            message.seq = 0
        dlq = self.config.dead_letter_queue
        if message.destination == dlq:
            self.stats["messages_dropped"] += 1  # never loop in the dead-letter queue itself
            return
        log.info("message %s from %s to %s: %s", message.id, message.destination, dlq, reason)
        headers = dict(message.headers)
        headers["original-destination"] = message.destination
        headers["dead-letter-reason"] = reason
        queue = self._queue(dlq)
        if queue.depth() >= self.config.max_queue_messages:
            self._discard(queue, queue.pop_oldest())
            self.stats["messages_dropped"] += 1
        dead = Message(message.id, dlq, headers, message.body, message.expires)
        self._persist(queue, dead)
        queue.messages.append(dead)
        queue.enqueued += 1
        self._pump(queue)

    # -- transactions --------------------------------------------------------------------------
    def _hold(self, session: Session, transaction: str, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        frames = session.transactions.get(transaction)
        if frames is None:
            raise ProtocolError("unknown transaction", f"no transaction {transaction!r} was begun", receipt)
        if len(frames) >= self.config.max_transaction_frames:
            raise ProtocolError("transaction too large",
                                f"at most {self.config.max_transaction_frames} frames per transaction", receipt)
        expires = 0.0
        if command == "SEND":
            destination = self._check_send(headers, receipt)
            if not destination.startswith(TEMP_PREFIXES):  # a connection's own temporary ones are always its own
                self._allowed(session, destination, write=True, receipt=receipt)
            self._temporaries(session, headers, destination, receipt)
            expires = self._expiry(headers, receipt)
        else:
            self._find_delivery(session, command, headers, receipt)  # an id not held is refused now
        frames.append((command, headers, body, expires))
        self._receipt(session, receipt)  # accepted now, applied at COMMIT

    def _transaction_id(self, session: Session, command: str, headers: dict, must_exist: bool) -> str:
        receipt = headers.get("receipt")
        transaction = headers.get("transaction")
        if transaction is None:
            raise ProtocolError("missing transaction", f"{command} needs a transaction header", receipt)
        if must_exist and transaction not in session.transactions:
            raise ProtocolError("unknown transaction", f"no transaction {transaction!r} was begun", receipt)
        if not must_exist and transaction in session.transactions:
            raise ProtocolError("duplicate transaction", f"transaction {transaction!r} is already open", receipt)
        return transaction

    def _begin(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        session.transactions[self._transaction_id(session, command, headers, must_exist=False)] = []
        self._receipt(session, headers.get("receipt"))

    def _commit(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        receipt = headers.get("receipt")
        frames = session.transactions[self._transaction_id(session, command, headers, must_exist=True)]
        # All or nothing: refuse the whole commit if a queue could not take its messages, or if a
        # permission was withdrawn (passwd re-read) since a SEND was accepted.
        adding: dict[str, int] = {}
        for cmd, h, _, _ in frames:
            if cmd == "SEND":
                self._allowed(session, h["destination"], write=True, receipt=receipt)
            if cmd == "SEND" and h["destination"].startswith(QUEUE_PREFIX):
                adding[h["destination"]] = adding.get(h["destination"], 0) + 1
        for name, n in adding.items():
            queue = self.queues.get(name)
            if queue is not None and queue.depth() + n > self.config.max_queue_messages:
                raise ProtocolError("queue full", f"committing would put more than max_queue_messages in {name}",
                                    receipt)
        del session.transactions[headers["transaction"]]
        for cmd, h, b, expires in frames:
            h.pop("receipt", None)  # already answered when the frame was accepted
            if cmd == "SEND":
                self.publish(h["destination"], h, b, expires)
            else:
                self._ack(session, cmd, h, b, committed=True)
        self._receipt(session, receipt)

    def _abort(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        del session.transactions[self._transaction_id(session, command, headers, must_exist=True)]
        self._receipt(session, headers.get("receipt"))

    # -- diagnostics ---------------------------------------------------------------------------
    def _diag(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        """stompica's DIAG frame: the body names a query, the reply is a DIAG frame `<query>:<value>`."""
        receipt = headers.get("receipt")
        query = body.decode(errors="replace").strip()
        if self.diag is None or query not in QUERIES:
            raise ProtocolError("unknown DIAG query", f"DIAG queries: {', '.join(QUERIES)}", receipt)
        if self.config.diag_admin_only and not (session.connected and self.auth is not None
                                                and self.auth.is_admin(session.login)):
            raise ProtocolError("permission denied for DIAG", "diagnostics are for admin users", receipt)
        reply = b"DIAG\ncontent-type:text/plain\n" + f"{query}:{self.diag.text(query)}".encode() + b"\n\n\0"
        session.outbox.add(R.DATA, session.conn, reply)
        self._receipt(session, receipt)

    # -- closing -------------------------------------------------------------------------------
    def _disconnect(self, session: Session, command: str, headers: dict, body: bytes) -> None:
        self._receipt(session, headers.get("receipt"))
        self._close(session)

    def _receipt(self, session: Session, receipt: str | None) -> None:
        if receipt is not None:
            self._emit(session, R.DATA, render_frame("RECEIPT", {"receipt-id": receipt}, escape_headers=session.escape),
                       receipt)

    def _emit(self, session: Session, kind: int, payload: bytes = b"", receipt: str | None = None) -> None:
        """A reply that must not overtake a receipt waiting for the store (nor go before its data is on disk)."""
        store = self.store
        if store is not None and store.sync_receipts and (session.held or store.ops != self._ops_mark):
            session.held.append((store.generation, kind, payload, receipt))
            self.holding.add(session)
            self.need_commit = True
        else:
            session.outbox.add(kind, session.conn, payload)

    def release(self, generation: int) -> None:
        """The store has committed up to ``generation``: send the replies that waited for it."""
        for session in list(self.holding):
            held = session.held
            done = 0
            for due, kind, payload, _ in held:
                if due > generation:
                    break
                session.outbox.add(kind, session.conn, payload)
                done += 1
            del held[:done]
            if not held:
                self.holding.discard(session)

    def store_outage(self, now: float) -> None:
        """The store has failed to commit for longer than store_error_timeout_ms: every sender still
        waiting for a receipt gets an ERROR naming it (the message may still be written if the store
        recovers, so it may arrive once; it is never receipted unwritten)."""
        since = self.store.failing_since if self.store is not None else 0.0
        if not since or now - since < self.config.store_error_timeout_ms / 1000:
            return
        for session in list(self.holding):
            receipt = next((r for _, kind, _, r in session.held if r is not None), None)
            session.held.clear()
            self.holding.discard(session)
            if session.closing:
                session.outbox.add(R.CLOSE, session.conn)
                continue
            self.stats["errors"] += 1
            session.closing = True
            self._end_session(session)
            headers = {"message": "store unavailable"}
            if receipt is not None:
                headers["receipt-id"] = receipt
            headers["content-type"] = "text/plain"
            body = (f"the durable store has not been able to write for {now - since:.1f} s (see the broker's "
                    "log); this message and the ones after it are not confirmed").encode()
            log.warning("connection %s (%s): ERROR store unavailable (receipt %s)", session.conn, session.peer, receipt)
            session.outbox.add(R.DATA, session.conn, render_frame("ERROR", headers, body, escape_headers=session.escape))
            if session.websocket:
                session.outbox.add(R.RAW, session.conn, encode_close(1011))
            session.outbox.add(R.CLOSE, session.conn)

    def _store_refuses(self, destination: str, headers: dict) -> bool:
        """A persistent SEND while the store has been failing past store_error_timeout_ms."""
        store = self.store
        if store is None or not store.failing_since or headers.get("persistent") == "false":
            return False
        if self.now - store.failing_since < self.config.store_error_timeout_ms / 1000:
            return False
        return destination.startswith(QUEUE_PREFIX) or bool(self.durables and self.durable_index.match(destination))

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
        self._emit(session, R.DATA, render_frame("ERROR", headers, body, escape_headers=session.escape))
        log.info("connection %s (%s): ERROR %s: %s", session.conn, session.peer, _short(message), _short(detail))
        self._close(session)

    def _close(self, session: Session, websocket_close: bool = True) -> None:
        session.closing = True
        self._end_session(session)
        if session.websocket and websocket_close:
            self._emit(session, R.RAW, encode_close(1000))
        self._emit(session, R.CLOSE)

    def hang_up(self, session: Session) -> None:
        """Close after a transport-level reply (HTTP response, WebSocket close) already written."""
        if not session.closing:
            self._close(session, websocket_close=False)

    def _end_session(self, session: Session) -> None:
        """Subscriptions go (unacked queue messages back to their queues); open transactions are dropped."""
        for sub in list(session.subs.values()):
            self._remove_subscription(session, sub)
        session.transactions.clear()
        for temp in session.temps.values():  # temporary destinations vanish with their connection
            del self.temps[temp.public]
            if temp.queue is not None:
                self.stats["messages_dropped"] += temp.queue.depth()
        session.temps.clear()

    # -- recovery --------------------------------------------------------------------------------
    def recover(self, store, now: float) -> int:
        """Load durable subscriptions and stored queue messages, in send order; returns the count."""
        for name, pattern in store.load_durables():
            durable = self.durables[name] = Durable(name, pattern)
            self.queues[durable.queue.name] = durable.queue
            self.durable_index.add(pattern, durable)
        wall = self.clock()
        count = 0
        for seq, name, message_id, headers, body, expires_ms, delivered in store.load():
            queue = self.queues.get(name) or self._queue(name)
            expires = now + (expires_ms / 1000 - wall) if expires_ms else 0.0
            message = Message(message_id, headers.get("destination", name), headers, body, expires or 0.0)
            message.seq = seq
            message.redelivered = delivered  # delivered before the restart, never acknowledged
            queue.messages.append(message)
            queue.enqueued += 1
            count += 1
        self.store = store
        return count

    # -- statistics ----------------------------------------------------------------------------
    def session_stats(self) -> dict:
        sessions = self.sessions.values()
        return {
            "clients": len(self.sessions),
            "websockets": sum(1 for s in sessions if s.websocket),
            "stomp_connected": sum(1 for s in sessions if s.connected and not s.closing),
            "subscriptions": sum(len(s.subs) for s in sessions),
        }

    def queue_stats(self) -> list[dict]:
        return [{"destination": q.name, "depth": q.depth(), "enqueued": q.enqueued,
                 "dequeued": q.dequeued, "unacked": q.unacked, "consumers": len(self.index.match(q.name))}
                for q in self.queues.values()]
