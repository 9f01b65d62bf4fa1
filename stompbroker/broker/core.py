"""The dispatcher's state machine, with no I/O: ``Broker`` holds the state and dispatches events.

The dispatcher process feeds it events (a connection opened, a frame arrived, a connection closed,
time passed) and it appends outgoing records to the :class:`Outbox` of the writer that owns each
connection. Tests drive it directly with plain outboxes.

Each behaviour has one home, a module of functions taking the broker (see docs/architecture.md,
"Where does X live"), and each module imports only the ones below it ("Layers"): ``sessions``
(CONNECT, heart-beats, logins, the end of a session), ``transactions``, ``subscribing``,
``routing`` (SEND, publish), ``acks`` (ACK, NACK, dead letters), ``durables``, ``temporary``,
``confirmations`` (writers' sent counts), ``diagnostics``, ``queues`` (delivery, pumping),
``bounds``, ``permissions`` and, at the bottom, ``replies`` (RECEIPT, ERROR and close, held for
the store). Destination kinds are in ``names``.

A close made anywhere below ends the connection's output at once and leaves the session in
``ending``; each event ends those sessions (``sessions.end_closed``) before it returns.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time

from ..ipc import records as R
from ..protocol.stomp import ProtocolError, parse_head_cached
from . import (acks, bounds, confirmations, dedup, diagnostics, durables, permissions, priority, queues, replies,
               routing, scheduling, sessions, subscribing, transactions, vhosts)
from ..ipc.outbox import Outbox
from .model import Message, Queue, Session, Subscription
from .names import CONNECT_COMMANDS, MONITOR, SERVER, TRANSACTIONAL, VERSIONS
from .schedule import Jobs
from .stale import StaleQueue
from .subscriptions import SubscriptionIndex

__all__ = ["Broker", "Outbox", "VERSIONS", "SERVER"]

log = logging.getLogger("stompbroker.broker")

# command -> handler(broker, session, command, headers, body)
HANDLERS = {
    "CONNECT": sessions.connect, "STOMP": sessions.connect, "SEND": routing.send,
    "SUBSCRIBE": subscribing.subscribe, "UNSUBSCRIBE": subscribing.unsubscribe,
    "DISCONNECT": sessions.disconnect, "ACK": acks.ack, "NACK": acks.ack,
    "BEGIN": transactions.begin, "COMMIT": transactions.commit, "ABORT": transactions.abort,
    "DIAG": diagnostics.diag,
}


def in_vhost(session: Session, headers: dict) -> dict:
    """A frame's destination as the broker names it in the session's virtual host (vhosts.py); a
    destination holding the vhosts' mark is refused (no client may reach into another vhost)."""
    destination = headers["destination"]
    if vhosts.MARK in destination:
        raise ProtocolError("invalid destination", "a destination may not hold the character U+001E",
                            headers.get("receipt"))
    if not session.vhost:
        return headers
    return {**headers, "destination": vhosts.inside(session.vhost, destination)}


class Broker:
    def __init__(self, config, outboxes: list[Outbox], clock=time.time, *, auth=None, logins=None, diag=None,
                 store=None, backplane=None):
        self.config = config
        self.outboxes = outboxes
        self.clock = clock               # wall clock, for the absolute `expires` header
        self.now = 0.0                   # monotonic time of the event being handled
        self.sessions: dict[int, Session] = {}
        self.vhosts_on = len(config.vhosts) > 1  # several virtual hosts: destinations are translated (vhosts.py)
        vhosts.rendering = self.vhosts_on
        self.index = SubscriptionIndex(self.vhosts_on)
        self.queues: dict[str, Queue] = {}
        self.worker_rr: dict[str, int] = {}
        self.stale = (StaleQueue(config.TTL / 1000, config.max_stale_queue_size, self.vhosts_on) if config.TTL > 0
                      else None)
        self.token = format(int(clock() * 1000) % (36 ** 6), "x")  # tells ids of different runs apart
        if config.cluster:  # message ids travel between nodes: the node's name keeps them apart there
            self.token = f"{config.node_id}.{self.token}"
        for box in outboxes:
            box.token = self.token  # (Session.id)
        self.diag = diag                 # the statistics provider (diag.stats.Statistics); it reads the broker
        if diag is not None and getattr(diag, "broker", self) is None:
            diag.broker = self           # (given unbound, as it cannot be made after the broker it reads)
        self.store = store               # the durable store (store.sqlite.Store), or set by recover()
        self.auth = auth                 # the Authenticator (broker/auth.py): who may log in, read, write
        self.logins = logins             # runs login checks elsewhere (submit, cancel); verdicts come as on_auth
        self.backplane = backplane       # cluster mode: the other nodes, through the bridge (cluster/backplane.py)
        self.delayed: list[tuple[float, int]] = []  # refused logins, answered after a delay
        self.kept = 0                    # bytes of frames held in transactions and for logins (bounds.py)
        self.ops_mark = 0                # the store's op count when the current event began
        self.need_commit = False         # a reply waits for the batch being gathered: commit it even if empty
        # sessions with receipts waiting for a store commit -> [(store generation, record kind,
        # payload, receipt)], in order
        self.holding: dict[Session, list] = {}
        self.acks: dict[str, Subscription] = {}  # ack id -> subscription, for ACK/NACK by id (1.2)
        self.unconfirmed: dict[int, tuple] = {}  # ended sessions with deliveries the writer may still send
        self.timed: set[Session] = set()     # sessions with a deadline: not yet CONNECTed, or heart-beating
        self.alive_lag = R.alive_every(config)  # the reader's ALIVE reports trail a connection's bytes by less
        self.durables = {}                   # durable subscriptions by key (durables.py)
        self.dedup = dedup.make(config)      # single-node dedup-id window (dedup.py), or None
        self.rescan: set[Queue] = set()      # queues whose pump stopped at the scan budget: the tick goes on
        # (function, args) steps of the current event stopped because an outbox went over its limit,
        # in order: the dispatcher drains the outboxes and calls resume() until it is empty
        self.unfinished: collections.deque = collections.deque()
        self.ending: list[Session] = []      # closed during the current event, their state still to drop
        # (session, head, destination, headers, plain_route) of the last frame if it was a plain SEND
        # (routing.send): a next frame of that session with the same head takes the same route
        self.again: tuple | None = None
        self.examined = 0                    # messages looked at by queues.scan (a cost measure for tests)
        self.durable_index = SubscriptionIndex(self.vhosts_on)
        self.temps = {}                      # temporary destinations by reply name (temporary.py)
        self.temp_ids = itertools.count(1)
        self.sub_seq = itertools.count(1)    # the age of subscriptions with consumer options (choosing.py)
        self.jobs = Jobs()                   # scheduled messages (schedule.py, scheduling.py)
        self.job_ids = itertools.count(1)
        self.next_monitor = 0.0
        self.message_ids = itertools.count(1)
        self.ack_ids = itertools.count(1)
        self.stats = {"frames_in": 0, "messages_published": 0, "messages_delivered": 0,
                      "messages_dropped": 0, "messages_expired": 0, "dead_lettered": 0,
                      "connections_opened": 0, "connections_closed": 0, "errors": 0}

    # -- events --------------------------------------------------------------------------------
    def on_open(self, conn: int, writer: int, peer: str, now: float, tls: bool = False) -> None:
        session = self.sessions[conn] = Session(conn, self.outboxes[writer], peer, now)
        session.tls = tls
        self.stats["connections_opened"] += 1

    def on_stomp(self, conn: int, protocol: str = "stomp") -> None:
        """The reader saw the connection speak STOMP (raw, or inside WebSocket): the connect timeout
        is ours to answer from now (until then the reader answers it, in the protocol the
        connection's bytes show: an HTTP client must never get a STOMP ERROR, however late the
        reader reads its request)."""
        session = self.sessions.get(conn)
        if session is not None:
            session.protocol = protocol
            if not session.connected and not session.closing:
                self.timed.add(session)

    def on_http(self, conn: int) -> None:
        """The connection sent an HTTP request (the dispatcher answers it, in HTTP)."""
        session = self.sessions.get(conn)
        if session is not None:
            session.protocol = "http"

    def on_peer(self, conn: int, peer: str) -> None:
        """The client's own address, from its proxy's PROXY header: throttling, logs and the API use it."""
        session = self.sessions.get(conn)
        if session is not None:
            session.peer = peer

    def on_closed(self, conn: int, tell_writer: bool = True) -> None:
        sessions.closed(self, conn, tell_writer)

    def on_reader_start(self, first_conn: int) -> None:
        sessions.reader_restarted(self, first_conn)

    def on_written(self, conn: int, total: int, final: bool = False) -> None:
        confirmations.written(self, conn, total, final)

    def on_writer_restart(self, index: int) -> None:
        confirmations.writer_restarted(self, index)

    def on_alive(self, conn: int, now: float) -> None:
        session = self.sessions.get(conn)
        if session is not None:
            session.last_seen = now

    def on_bad_frame(self, conn: int, message: str, detail: str, receipt: str | None) -> None:
        session = self.sessions.get(conn)
        if session is not None and not session.closing:
            replies.error(self, session, message, detail, receipt)
            sessions.end_closed(self)

    def on_internal_error(self, conn: int) -> None:
        session = self.sessions.get(conn)
        if session is not None and not session.closing:
            replies.error(self, session, "internal error", "the broker could not handle this frame (see its log)")
            sessions.end_closed(self)

    def on_websocket(self, conn: int) -> None:
        self.on_stomp(conn, "websocket")

    def on_frame(self, conn: int, head: bytes, body: bytes, now: float) -> None:
        session = self.sessions.get(conn)
        if session is None or session.closing:
            return
        self.now = session.last_seen = now
        self.stats["frames_in"] += 1
        again = self.again
        if again is not None and again[0] is session and again[1] == head:
            self.send_again(session, again[2], again[3], body, again[4])
            return
        self.again = None
        gate = session.gate
        if gate is not None and type(gate) is tuple:  # its CONNECT is being checked: keep the frames until then
            backlog = gate[4]
            if len(backlog) >= 1000:
                replies.error(self, session, "too many frames before CONNECTED")
            elif bounds.hold_before_login(self, session, head, body):
                backlog.append((head, body))
            if self.ending:
                sessions.end_closed(self)
            return
        if self.store is not None:
            self.ops_mark = self.store.ops
        try:
            # CONNECT and STOMP are never escaped; peek at the command before decoding.
            unescape = session.escape and not head.startswith((b"CONNECT", b"STOMP"))
            command, headers = parse_head_cached(head, unescape)
            handler = HANDLERS.get(command)
            if handler is None:
                raise ProtocolError("unknown command", f"{command!r} is not a STOMP command",
                                    headers.get("receipt"))
            if not session.connected and command not in CONNECT_COMMANDS and not (
                    command == "DIAG" and self.config.diag_before_connect):
                raise ProtocolError("not connected", f"{command} before CONNECT", headers.get("receipt"))
            if self.vhosts_on and "destination" in headers:
                headers = in_vhost(session, headers)
            if gate is not None:  # a web console's session (a pending one returned above)
                permissions.console_scope(command, headers)
            transaction = headers.get("transaction")
            if transaction is not None and command in TRANSACTIONAL:
                transactions.hold(self, session, transaction, command, headers, body)
            elif handler is routing.send and gate is None:
                plain = routing.send(self, session, command, headers, body)
                if plain is not None:
                    self.again = (session, head, *plain)
            else:
                handler(self, session, command, headers, body)
        except ProtocolError as exc:
            replies.error(self, session, exc.message, exc.detail, exc.receipt)
        if self.ending:
            sessions.end_closed(self)

    def send_again(self, session: Session, destination: str, headers: dict, body: bytes, route: int) -> None:
        """A SEND with the head of the session's plain SEND before it: what depends only on the head
        (its decoding, the command, the destination's checks) holds; what may have changed since is
        checked again (``routing.send_plain``), with the message's own copy of the headers."""
        if self.store is not None:
            self.ops_mark = self.store.ops
        try:
            routing.send_plain(self, session, destination, headers, body, True, route)
        except ProtocolError as exc:
            replies.error(self, session, exc.message, exc.detail, exc.receipt)
        if self.ending:
            sessions.end_closed(self)

    def on_tick(self, now: float) -> None:
        """Close connections that never sent CONNECT or went silent; expire stale messages."""
        self.now = now
        if self.store is not None:
            self.ops_mark = self.store.ops
        sessions.check_deadlines(self, now)
        if self.stale is not None:
            self.stale.sweep(now)
        if self.holding and self.store is not None and self.store.failing_since:
            replies.store_outage(self, now)
        if self.ending:  # (before the pumps below: nothing goes to a closed session's subscriptions)
            sessions.end_closed(self)
        if self.unconfirmed:
            confirmations.expire_unconfirmed(self, now)
        if self.rescan:
            waiting, self.rescan = self.rescan, set()
            for queue in waiting:
                queues.pump(self, queue)
        if self.delayed:
            sessions.refuse_delayed(self, now)
        if self.backplane is not None:
            self.backplane.tick(self, now)
        if self.diag is not None and now >= self.next_monitor and self.index.exact.get(MONITOR):
            diagnostics.monitor(self, now)
        if self.ending:
            sessions.end_closed(self)

    def resume(self) -> None:
        """Continue the first unfinished step (after the outboxes were drained). What it leaves
        unfinished in turn goes before the later steps, so every connection's frames keep their order."""
        rest = self.unfinished
        self.unfinished = collections.deque()
        step, args = rest.popleft()
        try:
            step(self, *args)
        finally:
            self.unfinished.extend(rest)
        if self.ending:
            sessions.end_closed(self)

    def next_timer(self) -> float | None:
        """Epoch ms of the next scheduled message's time (None without any): the dispatcher sleeps
        until then, and calls ``on_timers``; a broker without scheduled messages never wakes for them."""
        return self.jobs.next_due() if self.jobs.heap else None

    def on_timers(self, now: float) -> int:
        """Deliver the scheduled messages whose time has come; returns how many (the dispatcher
        calls again at once when there may be more)."""
        self.now = now
        if self.store is not None:
            self.ops_mark = self.store.ops
        fired = routing.fire_due(self, self.clock() * 1000)
        if self.ending:
            sessions.end_closed(self)
        return fired

    def needs_tick(self) -> bool:
        return bool(self.timed or self.stale or self.delayed or self.rescan or self.ending
                    or self.index.exact.get(MONITOR)
                    or (self.holding and self.store is not None and self.store.failing_since)
                    or self.unconfirmed or (self.backplane is not None and self.backplane.needs_tick()))

    def on_auth(self, conn: int, user: str | None, now: float, delay: float = 0.0) -> None:
        """A login check finished: CONNECTED and the frames that waited, or a refusal after
        ``delay`` seconds (the login's back-off)."""
        for head, body in sessions.auth_done(self, conn, user, now, delay):
            if self.unfinished:  # a frame's deliveries stopped over an outbox's limit: the next ones wait their turn
                self.unfinished.append((Broker.on_frame, (conn, head, body, now)))
            else:
                self.on_frame(conn, head, body, now)

    def release(self, generation: int) -> None:
        """The store has committed up to ``generation``: send the replies that waited for it."""
        replies.release(self, generation)

    def manage(self, action, *args, now: float):
        """An operator's action (a function of ``broker/manage.py``), as one event: what it writes
        to the store is marked from here, so ``answer_http`` holds the answer until it is on disk."""
        self.now = now
        if self.store is not None:
            self.ops_mark = self.store.ops
        try:
            return action(self, *args)
        finally:
            if self.ending:
                sessions.end_closed(self)

    def answer_http(self, session: Session, response: bytes) -> None:
        """An HTTP answer, then close; after an action (``manage``) it waits for the store's commit of
        what that action wrote, as a receipt does."""
        if not session.closing:
            replies.emit(self, session, R.RAW, response)
            self.hang_up(session)

    def hang_up(self, session: Session) -> None:
        """Close after a transport-level reply (HTTP response, WebSocket close) already written."""
        if not session.closing:
            replies.close(self, session, websocket_close=False)
            sessions.end_closed(self)

    def end_closed(self) -> None:
        """End the sessions closed by work done outside an event of this class (the cluster's records)."""
        sessions.end_closed(self)

    # -- recovery --------------------------------------------------------------------------------
    def recover(self, store, now: float, loading=None) -> tuple[int, list[int]]:
        """Load durable subscriptions and stored queue messages, in send order. Returns the count
        and the messages not loaded because their destination is over max_destination_length
        (the reader refuses such names: nobody could subscribe to them), for quarantine.
        ``loading(seq, body)`` is told each message before it is loaded."""
        durables.load(self, store)
        wall = self.clock()
        count = 0
        too_long = []
        ranked = set()
        limit = self.config.max_destination_length
        for seq, name, message_id, headers, body, expires_ms, delivered in store.load():
            if loading is not None:
                loading(seq, body)
            if len(name) > limit and not name.startswith("durable:") and len(vhosts.rendered(name).encode()) > limit:
                too_long.append(seq)
                continue
            queue = self.queues.get(name) or queues.get_queue(self, name)
            expires = now + (expires_ms / 1000 - wall) if expires_ms else 0.0
            message = Message(message_id, headers.get("destination", name), headers, body, expires or 0.0)
            message.seq = seq
            message.redelivered = delivered  # delivered before the restart, never acknowledged
            queue.messages.append(message)
            queue.enqueued += 1
            count += 1
            if "priority" in headers and priority.level(message) != priority.DEFAULT:
                ranked.add(queue)
        for queue in ranked:  # (sorted by level once all are in: the store keeps send order)
            priority.rank(queue)
        self.store = store
        dedup.seed(self, store, now)
        scheduling.load(self, store)
        return count, too_long

    # -- statistics ----------------------------------------------------------------------------
    def session_stats(self) -> dict:
        all_sessions = self.sessions.values()
        return {
            "clients": len(self.sessions),
            "websockets": sum(1 for s in all_sessions if s.websocket),
            "stomp_connected": sum(1 for s in all_sessions if s.connected and not s.closing),
            "subscriptions": sum(len(s.subs) for s in all_sessions),
        }

    def patterns(self, vhost: str | None = None) -> list[str]:
        """The subscriptions' destinations and patterns (of ``vhost`` only, as its clients name them)."""
        if vhost is None:
            return self.index.patterns()
        return [vhosts.visible(p) for p in self.index.patterns(raw=True) if vhosts.split(p)[0] == vhost]

    def sessions_of(self, vhost: str | None = None) -> list:
        """The sessions (of ``vhost`` only)."""
        if vhost is None:
            return list(self.sessions.values())
        own = "" if vhost == vhosts.DEFAULT else vhost
        return [s for s in self.sessions.values() if s.vhost == own]

    def vhost_connections(self) -> dict[str, int]:
        """STOMP sessions by virtual host."""
        counts: dict[str, int] = {}
        for session in self.sessions.values():
            if session.connected:
                name = session.vhost or vhosts.DEFAULT
                counts[name] = counts.get(name, 0) + 1
        return counts

    def connection_stats(self, start: int = 0, sessions=None):
        """DIAG ``connections`` from the ``start``-th connection on (of ``sessions``, a list; every
        one by default) (an iterator: an answer is cut to its budget, so only what it holds is
        made): id, address (the client's, from a PROXY header behind a proxy), login, protocol,
        tls, subscriptions."""
        return ({"id": s.conn, "address": s.peer, "login": s.login, "protocol": s.protocol, "tls": s.tls,
                 "subscriptions": len(s.subs), **({"vhost": s.vhost} if s.vhost else {})}
                for s in itertools.islice(self.sessions.values() if sessions is None else sessions, start, None))

    def queue_stats(self, vhost: str | None = None) -> list[dict]:
        """Every queue's figures; a virtual host's queues are shown ``VHOST:destination`` and say their
        ``vhost`` (vhosts.py). Of ``vhost`` only when one is named, as its clients name them."""
        stats = [{"destination": q.name, "depth": q.depth(), "enqueued": q.enqueued,
                  "dequeued": q.dequeued, "unacked": q.unacked, "consumers": len(self.index.match(q.name))}
                 for q in self.queues.values() if vhost is None or vhosts.split(q.name)[0] == vhost]
        if vhost is not None:
            for entry in stats:
                entry["destination"] = vhosts.visible(entry["destination"])
            return stats
        if self.vhosts_on:
            for entry in stats:
                if vhosts.MARK in entry["destination"]:
                    entry["vhost"] = vhosts.split(entry["destination"])[0]
                    entry["destination"] = vhosts.shown(entry["destination"])
        return stats
