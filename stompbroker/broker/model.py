"""Plain data of the dispatcher: sessions, subscriptions, messages, queues, deliveries."""

from __future__ import annotations

from collections import deque

from ..ipc.outbox import Outbox
from ..protocol.stomp import RENDER_PART, escape
from . import vhosts

# Headers of a SEND meant for the broker, not copied into the MESSAGE.
NOT_FORWARDED = frozenset(("destination", "message-id", "subscription", "content-length", "receipt",
                           "transaction", "ack", "redelivered", "persistent"))


class _NoEntries(dict):
    """The one empty dict shared by every session that has not needed one of its own (an idle
    connection costs no dicts): reading works, adding is a bug (give the session its own first)."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("shared empty dict: the session needs a dict of its own first")

    __setitem__ = setdefault = update = __ior__ = _refuse


NO_ENTRIES = _NoEntries()


class _InMore:
    """A Session attribute few sessions set, kept in its ``more`` (SessionMore): the default while
    it has none, and setting the default makes none."""

    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, session, owner=None):
        if session is None:
            return self
        more = session.more
        return self.default if more is None else getattr(more, self.name)

    def __set__(self, session, value) -> None:
        if value or session.more is not None:
            setattr(session._more(), self.name, value)


class Session:
    # Per-session state an idle connection needs is a slot; what few sessions use and no frame or
    # delivery reads is in ``more`` (SessionMore, made when first set), read through properties.
    # (its deliveries' ack ids are in Broker.acks, its receipts waiting for the store in
    # Broker.holding, its id's token is its outbox's: an idle connection keeps no slot for them)
    __slots__ = ("conn", "outbox", "_peer", "opened", "last_seen", "connected", "version", "escape",
                 "subs", "transactions", "closing", "protocol", "login",
                 "gate", "temps", "inflight", "written",
                 "kept", "vhost", "more")

    def __init__(self, conn: int, outbox: Outbox, peer: str, now: float):
        self.conn = conn
        self.outbox = outbox
        self._peer = pack_peer(peer)
        self.opened = now
        self.last_seen = now
        self.connected = False
        self.version = "1.0"
        self.escape = False       # header escaping applies (1.1 and later)
        # Containers an idle connection does not use are shared empty ones (NO_ENTRIES, ()) until
        # needed: whatever adds the first entry gives the session its own.
        self.subs: dict[str, Subscription] = NO_ENTRIES
        self.transactions: dict[str, list] = NO_ENTRIES   # transaction id -> frames held until COMMIT
        self.closing = False
        self.protocol = ""        # what the reader saw it speak: "stomp", "websocket", "http" ("" = not yet)
        self.login = ""
        # What each of its frames passes first (one slot, read once per frame): None; a CONNECT
        # waiting for its login check, (version, cx, cy, headers, frames that arrived meanwhile):
        # ``pending``; or the monotonic time a web console's read-only session (console passcode)
        # ends: ``console_until``.
        self.gate = None
        self.temps: dict[str, Temp] = NO_ENTRIES  # its temporary destinations, by their private name
        # Auto-ack queue deliveries handed to the writer and not yet sent, in order, as (message,
        # queue): they leave the store when the writer reports them written, and go back to their
        # queue if the connection ends first. ``written``: the writer's last cumulative count.
        # (a deque only while it holds some: an empty deque is 760 bytes)
        self.inflight: deque = ()
        self.written = 0
        # Bytes held for it (bounds.py): frames waiting for its login's verdict, then the frames
        # of its open transactions and its unacknowledged topic deliveries.
        self.kept = 0
        self.vhost = ""              # its virtual host, when not the default one (CONNECT's host: vhosts.py)
        self.more = None             # SessionMore, once one of its fields is set

    @property
    def peer(self) -> str:
        """The client's address and port, as the reader (or a PROXY header) told it."""
        peer = self._peer
        return peer if type(peer) is str else peer_text(peer)

    @peer.setter
    def peer(self, peer: str) -> None:
        self._peer = pack_peer(peer)

    @property
    def pending(self) -> tuple | None:
        gate = self.gate
        return gate if type(gate) is tuple else None

    @pending.setter
    def pending(self, value: tuple | None) -> None:
        if value is not None or type(self.gate) is tuple:
            self.gate = value

    @property
    def console_until(self) -> float:
        gate = self.gate
        return gate if type(gate) is float else 0.0

    @console_until.setter
    def console_until(self, value: float) -> None:
        if value or type(self.gate) is float:
            self.gate = float(value) if value else None

    def _more(self) -> SessionMore:
        more = self.more
        if more is None:
            more = self.more = SessionMore()
        return more

    @property
    def client_id(self) -> str:
        """CONNECT's client-id, else its login (durable subscription names are made of it)."""
        more = self.more
        return self.login if more is None or more.client_id is None else more.client_id

    @client_id.setter
    def client_id(self, value: str) -> None:
        if value is not self.login or self.more is not None:
            self._more().client_id = value

    # In its SessionMore, made when first set to something other than the default:
    hb_in = _InMore(0)                 # ms: the client promised a frame or heart-beat this often (0: none)
    written_final = _InMore(False)     # the writer said it will send nothing more
    tls = _InMore(False)               # it came in on ssl_port

    @property
    def websocket(self) -> bool:
        return self.protocol == "websocket"

    @property
    def address(self) -> str:
        """The client's address, without its port: what login back-offs are kept by."""
        return self.peer.rsplit(":", 1)[0]

    @property
    def id(self) -> str:
        """The session id told in CONNECTED ("" before): made when asked, not kept per connection."""
        return f"{self.outbox.token}-{self.conn}" if self.connected else ""


class SessionMore:
    """What few sessions need (a session's ``more``): no frame or delivery reads it."""

    __slots__ = ("client_id", "hb_in", "written_final", "tls")

    def __init__(self):
        self.client_id = None        # CONNECT's client-id, when not the login
        self.hb_in = 0
        self.written_final = False
        self.tls = False


def pack_peer(text: str) -> int | str:
    """An IPv4 peer "a.b.c.d:port" as one int (32 bytes; the text is 64), anything else as it is.
    ``peer_text`` makes the same text again (a text it would not make stays text)."""
    host, _, port = text.rpartition(":")
    parts = host.split(".")
    if len(parts) != 4 or not port.isdigit():
        return text
    try:
        packed = 0
        for part in parts:
            packed = packed << 8 | int(part)
        packed = packed << 16 | int(port)
    except ValueError:
        return text
    return packed if peer_text(packed) == text else text


def peer_text(packed: int) -> str:
    return f"{packed >> 40 & 255}.{packed >> 32 & 255}.{packed >> 24 & 255}.{packed >> 16 & 255}:{packed & 0xFFFF}"


class Subscription:
    __slots__ = ("session", "id", "destination", "ack", "tracked", "prefetch", "accepts", "unacked", "prefix",
                 "durable", "temp", "options", "each")

    def __init__(self, session: Session, sub_id: str, destination: str, ack: str, prefetch: int, accepts):
        self.session = session
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.tracked = ack != "auto"        # deliveries wait for ACK/NACK
        self.prefetch = prefetch            # most unacknowledged deliveries (0 = no limit)
        self.accepts = accepts              # filter/selector predicate over headers, or None
        self.unacked: dict[str, Delivery] = {}  # ack id -> delivery, in delivery order
        self.durable = None                 # the Durable it is attached to, if any
        self.temp = None                    # the Temp it reads, if any (never in the subscription index)
        self.options = None                 # consumer options (choosing.Options): exclusive, priority
        # Rendered once: every delivery is this prefix plus the message's shared part.
        sid = escape(sub_id) if session.escape else sub_id
        self.prefix = b"MESSAGE\nsubscription:" + sid.encode() + b"\n"
        self.each = b""  # its entry in a fan-out's DATA_EACH record (records.each_entry), made at its first

    def has_room(self) -> bool:
        return not self.prefetch or len(self.unacked) < self.prefetch


class Message:
    """A published message, rendered once per escaping style (1.0 or 1.1+) and shared by deliveries."""

    __slots__ = ("id", "destination", "headers", "body", "expires", "redelivered", "nacks", "avoid", "seq",
                 "_plain", "_escaped")

    def __init__(self, message_id: str, destination: str, headers: dict, body: bytes, expires: float = 0.0):
        self.id = message_id
        self.destination = destination
        self.headers = headers
        self.body = body
        self.expires = expires      # monotonic deadline; 0 = never
        self.redelivered = False    # went back to its queue unacknowledged
        self.nacks = 0
        self.avoid = None           # the subscription that NACKed it last (tried last next time)
        self.seq = 0                # its row in the durable store (0 = memory only)
        self._plain = self._escaped = None  # rendered for 1.0 sessions, for 1.1+ (two slots: no list per message)

    def expired(self, now: float) -> bool:
        return bool(self.expires) and now >= self.expires

    def shared(self, escaped: bool) -> bytes:
        part = self._escaped if escaped else self._plain
        if part is None:
            if RENDER_PART is not None:  # (in C: 0.4-0.8 µs, never more than the Python below, a repeat included)
                part = RENDER_PART(self.id, vhosts.rendered(self.destination), self.headers, NOT_FORWARDED,
                                   self.body, escaped)
            if part is None:
                part = self._shared(escaped)
            if escaped:
                self._escaped = part
            else:
                self._plain = part
        return part

    def _shared(self, escaped: bool) -> bytes:
        """``shared`` in Python: where the C module is not built, or declines (a header that is not a str)."""
        body = self.body
        # Everything after the message-id line repeats from one message of a producer to the
        # next: it is rendered once and the message-id spliced in front of it.
        headers = self.headers
        last = _LAST[escaped]
        # A run of one producer's messages: comparing with the last one's headers costs half
        # of making and hashing a key.
        if headers == last[0] and len(body) == last[1] and self.destination == last[2]:
            block = last[3]
        elif _MISSES[escaped] >= MISS_RUN and _MISSES[escaped] % MISS_RUN:
            # A run of headers the table never holds (a header of its own on every message: a
            # timestamp, an id): making, hashing and keeping their keys is wasted. One message
            # in MISS_RUN still looks, to see the run end.
            _MISSES[escaped] += 1
            block = _header_block(self.destination, headers, len(body), escaped)
        else:
            if "receipt" in headers:  # (never rendered: a producer's receipts differ, its blocks need not)
                key = (self.destination, len(body), *[h for h in headers.items() if h[0] != "receipt"])
            else:
                key = (self.destination, len(body), *headers.items())
            blocks = _BLOCKS[escaped]
            block = blocks.get(key)
            if block is None:
                _MISSES[escaped] += 1
                block = _header_block(self.destination, self.headers, len(body), escaped)
                if len(blocks) >= BLOCK_CACHE_ENTRIES:
                    blocks.clear()  # unique headers: the table is dropped whole, no bookkeeping per hit
                blocks[key] = block
            else:
                _MISSES[escaped] = 0
            _LAST[escaped] = (dict(headers), len(body), self.destination, block)  # (a copy: never changed after)
        mid = escape(self.id) if escaped else _no_newlines(self.id)
        return b"".join((b"message-id:", mid.encode(), b"\n", block, body, b"\0"))


BLOCK_CACHE_ENTRIES = 512
_BLOCKS: tuple[dict, dict] = ({}, {})  # per escaping style: (destination, body length, *headers) -> block
_LAST = [(None, -1, None, b""), (None, -1, None, b"")]  # per escaping style: (headers, body length, destination, block)
MISS_RUN = 16
_MISSES = [0, 0]  # per escaping style: blocks not found in the table since the last found there


def _header_block(destination: str, headers: dict, length: int, escaped: bool) -> bytes:
    """A MESSAGE's header lines after message-id, through the blank line."""
    esc = escape if escaped else _no_newlines
    lines = [f"destination:{esc(vhosts.rendered(destination))}"]  # (as the clients of its vhost name it)
    for name, value in headers.items():
        if name not in NOT_FORWARDED:
            lines.append(f"{esc(name)}:{esc(value)}")
    lines.append(f"content-length:{length}\n\n")
    return "\n".join(lines).encode()


def _no_newlines(value: str) -> str:
    # STOMP 1.0 has no escaping: a value with a line break cannot be sent as it is.
    return value.replace("\r", " ").replace("\n", " ") if ("\n" in value or "\r" in value) else value


class Queue:
    """A /queue/ destination: messages wait here until one subscriber with room takes each."""

    __slots__ = ("name", "messages", "parked", "blocked", "rr", "enqueued", "dequeued", "unacked", "expired",
                 "owner", "chooser", "last_values")

    def __init__(self, name: str, owner=None):
        self.name = name
        self.messages: deque[Message] = deque()
        # Messages no current consumer's selector accepts: looked at again only when a consumer comes.
        self.parked: deque[Message] = deque()
        # Messages only full consumers accept: looked at again when a consumer gets room.
        self.blocked: deque[Message] = deque()
        self.rr = 0            # round-robin position among the matching subscriptions
        self.enqueued = 0
        self.dequeued = 0      # acknowledged (or delivered, for auto-ack subscriptions)
        self.unacked = 0
        self.expired = 0
        self.owner = owner     # a Durable: its one consumer is the durable's attached subscription
        self.chooser = None    # picks consumers instead of the round-robin (choosing.Chooser), if any
        self.last_values = None  # a last-value queue's index: key -> its last message (lastvalue.py)

    def depth(self) -> int:
        return len(self.messages) + len(self.parked) + len(self.blocked)

    def pop_oldest(self) -> Message:
        for source in (self.parked, self.blocked, self.messages):
            if source:
                return source.popleft()
        raise IndexError("empty queue")


class Durable:
    """A named durable topic subscription: matching messages wait in its queue while its client is away."""

    __slots__ = ("name", "pattern", "queue", "sub")

    def __init__(self, name: str, pattern: str):
        self.name = name
        self.pattern = pattern
        self.queue = Queue(f"durable:{name}", owner=self)
        self.sub = None


class Temp:
    """A temporary destination, private to the connection that uses it: /temp-queue/NAME (a queue:
    messages wait for its subscription) or /temp-topic/NAME (a topic). Others reach it only by
    its reply name, a broker-wide unique destination the broker writes into reply-to headers."""

    __slots__ = ("private", "public", "session", "sub", "auto", "queue")

    def __init__(self, private: str, public: str, session: Session, is_queue: bool):
        self.private = private
        self.public = public
        self.session = session
        self.sub = None          # its one subscription (the broker's own, or the owner's SUBSCRIBE)
        self.auto = False        # the subscription is the one the broker made for a reply-to
        self.queue = Queue(public, owner=self) if is_queue else None


class Delivery:
    """A message handed to a client-ack subscription and not yet acknowledged."""

    __slots__ = ("ack_id", "message", "queue", "nacks")

    def __init__(self, ack_id: str, message: Message, queue: Queue | None, nacks: int):
        self.ack_id = ack_id
        self.message = message
        self.queue = queue
        self.nacks = nacks


class Later:
    """The result of an operator's action that the cluster answers (``broker/manage.py`` in cluster
    mode): it comes in a later event, when the bridge has an answer (a PubAck, the messages read,
    the purge done) or its time is up. ``finish(value)`` (done) or ``fail(status, reason)`` (not
    done: an HTTP status and why) happens once; ``when_done(then)`` has ``then(status, value)``
    called with it (status None when done), at once if it came already."""

    __slots__ = ("then", "outcome", "value")

    def __init__(self, value=None):
        self.then = None
        self.outcome = None      # (status, value) once decided
        self.value = value       # what ``finish`` gives when the awaited answers only say "done"

    def finish(self, value=None) -> None:
        self._decide(None, self.value if value is None else value)

    def fail(self, status: int, reason: str) -> None:
        self._decide(status, reason)

    def _decide(self, status, value) -> None:
        if self.outcome is not None:
            return
        self.outcome = (status, value)
        if self.then is not None:
            self.then(status, value)

    def when_done(self, then) -> None:
        self.then = then
        if self.outcome is not None:
            then(*self.outcome)
