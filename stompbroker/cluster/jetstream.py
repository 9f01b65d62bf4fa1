"""JetStream for queues, durable topic subscriptions and replay-from, used by the bridge process.

Everything here is asyncio over one nats-py connection; the decisions (how many to pull, when to
ack, nak, dead-letter) are made by the dispatcher (``cluster/queuing.py``) and arrive as calls.

Which stream holds what is ``cluster/shards.py``'s: ``cluster_streams`` shards of each kind.

- Queue streams (work-queue retention): one durable pull consumer per queue destination in the
  stream of its shard, shared by every node: each message goes to one node, and leaves the stream
  when acknowledged.
- Topic streams (limits retention, ``max_age`` = replay_retention): topic messages kept for
  durable subscriptions (one durable pull consumer each, in every shard its pattern may match)
  and replay-from (a short-lived consumer from a start time).
- A queue or durable is read from its shard in every layout whose streams exist (``PullGroup``),
  so messages stored before the shard count changed drain to the same consumers. Which exist, and
  their leaders spread over the NATS servers: ``cluster/leaders.py``.

Pulls are raw pull requests (``$JS.API.CONSUMER.MSG.NEXT``) answered on one inbox per consumer, so
each message is handed on the moment it arrives (nats-py's ``fetch`` waits to fill its batch).

Packs (``cluster/packs.py``) are made and taken apart by the dispatcher: here a JetStream message
is one publish, one pull, one ack, whatever it holds; only the credit counts its messages.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import time

import nats.errors
import nats.js.errors
from nats.js import api

from . import leaders, packs, removal, shards
from .fastpath import FastPath, pub
from .publisher import Publisher
from .records import ACK, NAK, SETTLE_OPS, TERM, pack_blobs, pack_taken

log = logging.getLogger("stompbroker.cluster")

PULL_EXPIRES = 10.0        # seconds a pull request waits on the server for messages
LOST_RETRY = 0.25          # seconds before a puller whose request got 409/503 asks again
PULL_SLACK = 2.0           # a request not ended by the server this long after its expiry is forgotten
DUPLICATE_WINDOW = 120.0   # seconds JetStream remembers a Nats-Msg-Id (documented in docs/cluster.md)
PURGE_BATCH = 256          # JetStream messages a purge asks its consumer for at a time
DELETE_HOLDS = 1024        # JetStream messages given back that a delete takes (and holds) at most
ACTION_TRY = 2.0           # seconds an operator's action gives one JetStream request before asking again
TAKE_GRACE = 0.5           # seconds an action that stopped still naks what its last pull brings
PEEK_READS = 2000          # JetStream messages a peek reads of each stream at most (each one request)
ANSWER_GRACE = 0.1         # seconds a removal still listens once every node it knew of answered
REPLAY_CATCH_UP = 10.0     # seconds a replay waits for its consumer to reach the end its stream's leader named


async def declare_stream(js, name: str, subjects: list[str], replicas: int, *, work_queue: bool,
                         max_age: float = 0.0, per_subject: int = 0, tag: str = "") -> int:
    """Create (or update) a stream; returns the replicas it got. ``replicas`` 0 means 3 when the
    NATS cluster can hold them, else 1. ``per_subject``: the most messages one subject holds; a
    publish over it is refused (discard-new per subject), never an older message dropped. ``tag``:
    only servers carrying this tag hold it (a changed tag moves an existing stream there)."""
    limits = dict(max_msgs_per_subject=per_subject, discard=api.DiscardPolicy.NEW,
                  discard_new_per_subject=True) if per_subject else {}
    config = api.StreamConfig(**limits,
        name=name, subjects=subjects, storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.WORK_QUEUE if work_queue else api.RetentionPolicy.LIMITS,
        max_age=max_age or None, duplicate_window=min(DUPLICATE_WINDOW, max_age or DUPLICATE_WINDOW),
        num_replicas=replicas or 3, placement=api.Placement(tags=[tag]) if tag else None)
    tries = [config.num_replicas] if replicas else [3, 1]
    for i, n in enumerate(tries):
        config.num_replicas = n
        try:
            try:
                await js.add_stream(config)
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != 10058:  # stream name already in use with a different configuration
                    raise
                await js.update_stream(config)
            return n
        except nats.js.errors.APIError:
            if i == len(tries) - 1:
                raise
            if tag:   # (cluster_replicas=0 with a tag on fewer servers than copies: say so, it is a choice)
                log.warning("stream %s: %d replicas refused (fewer NATS servers carry the tag %r), %d copy instead",
                            name, n, tag, tries[i + 1])
            else:
                log.info("stream %s: %d replicas refused, trying %d", name, n, tries[i + 1])
    return 0


async def declare_consumer(js, stream: str, name: str, filters, ack_wait_s: float,
                           start_time: float | None = None) -> None:
    """A durable pull consumer shared by every node. The broker decides dead-lettering itself
    (max_redeliveries counts NACKs), so JetStream never stops delivering a message: one it gave
    up on would stay in the stream, never delivered, never dead-lettered."""
    config = api.ConsumerConfig(
        durable_name=name, ack_policy=api.AckPolicy.EXPLICIT, **_filters(filters),
        ack_wait=ack_wait_s, max_deliver=-1, max_ack_pending=-1, max_waiting=4096,
        deliver_policy=api.DeliverPolicy.ALL if start_time is None else api.DeliverPolicy.BY_START_TIME,
        opt_start_time=None if start_time is None else _rfc3339(start_time))
    try:
        info = await asked_again(lambda: js.consumer_info(stream, name))
        have = info.config.filter_subjects or [info.config.filter_subject]
        if sorted(have) == sorted(config.filter_subjects or [config.filter_subject]):
            return  # made by another node (or this one before): as it is, its start time included
        await delete_consumer(js, stream, name)  # a durable subscribed anew to other destinations
    except nats.js.errors.NotFoundError:
        pass
    try:
        await asked_again(lambda: js.add_consumer(stream, config))  # (the same config again: a no-op)
    except nats.js.errors.APIError:
        await js.consumer_info(stream, name)  # another node made it meanwhile: fine; else the first error


async def asked_again(request, tries: int = 3):
    """A JetStream API request that changes nothing if made twice, made again when it went
    unanswered or answered 503: a consumer whose leader is being elected answers nothing (CI saw
    a consumer made a moment before go unanswered for 15 s on a loaded machine)."""
    for attempt in range(tries):
        try:
            return await request()
        except (nats.errors.TimeoutError, asyncio.TimeoutError, nats.js.errors.ServiceUnavailableError):
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.2)


async def until(stop: float, request):
    """``asked_again`` until the monotonic time ``stop`` (an operator's action: its own bound), each
    try given at most ACTION_TRY seconds (a request lost in a leader change is asked again, not
    waited for until the connection's timeout)."""
    while True:
        try:
            return await asyncio.wait_for(request(), max(min(ACTION_TRY, stop - time.monotonic()), 0.1))
        except (nats.errors.TimeoutError, asyncio.TimeoutError, nats.js.errors.ServiceUnavailableError):
            if time.monotonic() > stop:
                raise
            await asyncio.sleep(0.2)


async def delete_consumer(js, stream: str, name: str) -> None:
    try:
        await js.delete_consumer(stream, name)
    except nats.js.errors.NotFoundError:
        pass


def _filters(filters) -> dict:
    if isinstance(filters, str):
        filters = [filters]
    return {"filter_subject": filters[0]} if len(filters) == 1 else {"filter_subjects": list(filters)}


def _rfc3339(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class Credit:
    """The credit a dispatcher gave one queue or durable, shared by its pullers (``PullGroup``)."""

    __slots__ = ("value",)

    def __init__(self):
        self.value = 0


class Puller:
    """Pulls one consumer's messages as credits allow and hands each to ``on_message(reply, data,
    n)`` at once (its ack subject, payload and how many messages it holds, as the connection
    reads them: ``fastpath.py``).

    ``want`` is the credit (in messages) the dispatcher gave and messages have not used yet; it
    may go below zero when the dispatcher takes credit back while requests are out (what they
    still bring is handed on, and the dispatcher puts it back). Requests ask for ``want - asked``
    more, in batches: while requests are out, a new one goes only once it would ask for at least a
    quarter of the credit (each pull request is work for the stream's leader); when one is filled,
    what is left of the credit is asked for at once. A request counts
    JetStream messages, which may be packs: it asks for the credit divided by the messages per
    pack seen lately (``per``; at first the stream's pack size), so a node takes about what its
    consumers have room for. Pullers of one group share the credit (``shared``)."""

    def __init__(self, nc, stream: str, consumer: str, on_message, fast: FastPath | None = None,
                 shared: Credit | None = None):
        self.nc = nc
        self.fast = fast or FastPath(nc)
        self.stream = stream
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()
        self.on_message = on_message
        self.inbox = nc.new_inbox()
        self.sub = None
        self.shared = shared or Credit()
        self.requests: dict[bytes, list] = {}  # reply subject -> [JetStream messages still expected, deadline]
        self.ids = itertools.count(1)
        self.closed = False
        self.lost = False      # its consumer may be gone (deleted by an operator's delete meanwhile)
        self.wait_until = 0.0  # after a 409/503: no request before this (monotonic)
        self.loop = None
        self.per = float(shards.pack_of(stream))  # messages per JetStream message, lately

    @property
    def want(self) -> int:
        return self.shared.value

    @want.setter
    def want(self, value: int) -> None:
        self.shared.value = value

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.sub = await self.nc.subscribe(self.inbox + ".*", pending_bytes_limit=0, pending_msgs_limit=0)
        self.fast.route(self.sub, self._arrived)
        self.prefix = self.inbox.encode() + b"."

    async def credit(self, n: int) -> None:
        self.want += n
        self.ask()

    def asked(self) -> int:
        """Messages the requests out may still bring (their JetStream messages times ``per``)."""
        now = time.monotonic()
        for reply, (_, deadline) in list(self.requests.items()):
            if now > deadline:
                del self.requests[reply]
        return int(sum(left for left, _ in self.requests.values()) * self.per)

    def ask(self) -> None:
        if self.closed or self.sub is None or self.nc.is_closed or time.monotonic() < self.wait_until:
            return
        asked = self.asked()
        more = self.want - asked
        if more <= 0 or not self.nc.is_connected or (asked and more < max(self.want >> 2, 1)):
            return
        batch = max(int(more / self.per), 1)
        reply = self.prefix + b"%d" % next(self.ids)
        request = b'{"batch":%d,"expires":%d}' % (batch, int(PULL_EXPIRES * 1e9))
        if self.fast.send(pub(self.subject, reply, request)):
            self.requests[reply] = [batch, time.monotonic() + PULL_EXPIRES + PULL_SLACK]

    def _arrived(self, subject: bytes, reply: bytes, data: bytes, status: str) -> None:
        if status:  # status messages come on the request's own inbox subject
            if status != "100":  # 404 no messages, 408 expired, 409 over a limit: that request ended
                self.requests.pop(subject, None)
                if status in ("409", "503"):  # (409 also: the consumer was deleted; 503: nobody answers)
                    # The consumer may be gone (the keeper declares it again: QueueBridge._found) or
                    # its leader being elected (503 for a while): asked again a moment later, not
                    # at once, which would spin.
                    self.lost = True
                    self.wait_until = time.monotonic() + LOST_RETRY
                    if self.loop is not None:
                        self.loop.call_later(LOST_RETRY, self.ask)
                    return
                self.ask()
            return
        if self.closed:  # sent before the server saw the unsubscribe: let another pull have it
            self.fast.send(pub(reply, b"", b'-NAK {"delay":%d}' % int(0.25e9)))
            return
        # A message carries its stream subject: the server fills the requests in order.
        filled = False
        for request_reply, request in self.requests.items():
            request[0] -= 1
            if request[0] <= 0:
                del self.requests[request_reply]
                filled = True
            break
        n = packs.count(data)
        if n != 1 or self.per != 1.0:
            self.per += (n - self.per) / 4
        self.want -= n
        self.on_message(reply, data, n)
        if filled:  # it brought fewer messages than it counted on (packs smaller than ``per``): the rest now
            self.ask()

    async def close(self) -> None:
        self.closed = True
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except nats.errors.Error:
                pass
            # still routed a while: what the server sent before it saw the unsubscribe is nak'ed above
            asyncio.get_running_loop().call_later(PULL_SLACK, self.fast.unroute, self.sub)


def stream_sequence(reply: str) -> int:
    """A pulled message's stream sequence, from its ack subject (as ``delivered_count``)."""
    tokens = reply.split(".")
    try:
        return int(tokens[5] if len(tokens) == 9 else tokens[7])
    except (IndexError, ValueError):
        return 0


def delivered_count(reply: bytes) -> int:
    """JetStream's delivery count, from a pulled message's ack subject
    ``$JS.ACK.<stream>.<consumer>.<delivered>...`` (or, with a domain and account hash, two tokens on)."""
    tokens = reply.split(b".")
    try:
        return int(tokens[4] if len(tokens) == 9 else tokens[6])
    except (IndexError, ValueError):
        return 1


class PullGroup:
    """The pulls of one queue or durable: a ``Puller`` on each stream that may hold its messages
    (its shard in every layout present; every shard for a wildcard durable), sharing one credit.
    Each asks for the whole credit, so a group of k streams may bring up to k times it: what the
    dispatcher did not ask for waits in its local queue (it takes that credit back)."""

    def __init__(self, kind: str, consumer: str, pattern: str, start_ms: int):
        self.kind = kind
        self.consumer = consumer
        self.pattern = pattern
        self.start_ms = start_ms
        self.shared = Credit()
        self.members: dict[str, Puller] = {}   # stream -> its puller
        self.binding: set = set()              # tasks declaring its consumers
        self.closed = False
        self.deleted = False                   # a durable's end (UNSUBSCRIBE): its consumers go

    @property
    def want(self) -> int:
        return self.shared.value

    @want.setter
    def want(self, value: int) -> None:
        self.shared.value = value

    def ask(self) -> None:
        for puller in list(self.members.values()):
            puller.ask()

    def reset(self) -> None:
        """A new connection: the requests out on the old one are gone."""
        for puller in self.members.values():
            puller.requests.clear()

    async def close(self) -> None:
        self.closed = True
        for puller in list(self.members.values()):
            await puller.close()


async def replay_end(js, stream: str, filters, since_s: float, give_up: float) -> int | None:
    """The stream sequence a replay of ``filters`` reads up to: the last message on them, asked of
    the stream's leader (whose store has every stored message); None when none was stored since
    ``since_s``. (A consumer's own count cannot say it: one placed on a replica still applying a
    leader change reported none pending and delivered nothing for a second, then the messages.)
    A stream whose leader is being elected answers nothing, or 503: asked again until ``give_up``."""
    end = None
    for subject in [filters] if isinstance(filters, str) else filters:
        while True:
            try:
                last = await asyncio.wait_for(js.get_msg(stream, subject=subject), 1.0)
                break
            except nats.js.errors.NotFoundError:
                last = None
                break
            except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, asyncio.TimeoutError):
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.1)
        if last is None:
            continue
        stored = _epoch(last.time)
        if stored is None or stored >= since_s - 0.001:
            end = max(end or 0, last.seq)
    return end


async def replay(js, stream: str, filters, since_s: float, limit: int = 100_000):
    """The messages of ``stream`` on ``filters`` stored since ``since_s`` (epoch seconds), in
    order, read by a short-lived consumer up to what was there when it began (``replay_end``)."""
    # (a stream being elected a leader, a consumer's own not elected yet, a consumer on a replica
    # that is behind: each is asked again, for a while)
    give_up = time.monotonic() + REPLAY_CATCH_UP
    end = await replay_end(js, stream, filters, since_s, give_up)
    if end is None:
        return
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.BY_START_TIME, **_filters(filters),
        opt_start_time=_rfc3339(since_s), inactive_threshold=30.0, mem_storage=True, num_replicas=1)
    info = await js.add_consumer(stream, config)
    name = info.name
    try:
        sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
        left, seq = limit, 0
        while left > 0 and seq < end:
            try:
                msgs = await sub.fetch(min(left, 256), timeout=1.0)
            except nats.js.errors.ServiceUnavailableError:
                if time.monotonic() > give_up:
                    raise
                await asyncio.sleep(0.1)
                continue
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                if time.monotonic() > give_up:
                    log.warning("replay of %s stopped at sequence %d of %d: its consumer sent no more", stream, seq, end)
                    break
                continue
            for msg in msgs:
                yield msg
                left -= 1
                seq = msg.metadata.sequence.stream
                if seq >= end:
                    break
        await sub.unsubscribe()
    finally:
        try:
            await js.delete_consumer(stream, name)
        except nats.js.errors.Error:
            pass


async def replay_merged(js, sources: list[tuple[str, list[str]]], since_s: float, limit: int = 100_000):
    """``replay`` of several streams at once, merged by the time each message was stored."""
    readers = [replay(js, stream, filters, since_s, limit) for stream, filters in sources]
    try:
        # every stream's first message at once (an empty one takes a fetch's timeout to say so)
        firsts = await asyncio.gather(*[_next(reader, stream) for reader, (stream, _) in zip(readers, sources)])
        heads = [[msg.metadata.timestamp, i, msg, reader, sources[i][0]]
                 for i, (msg, reader) in enumerate(zip(firsts, readers)) if msg is not None]
        left = limit
        while heads and left > 0:
            head = min(heads, key=lambda h: (h[0], h[1]))
            yield head[2]
            left -= 1
            msg = await _next(head[3], head[4])
            if msg is None:
                heads.remove(head)
            else:
                head[0], head[2] = msg.metadata.timestamp, msg
    finally:
        for reader in readers:
            await reader.aclose()


async def _next(reader, stream: str):
    """The next message of one stream's replay, None at its end or when JetStream failed it (the
    other streams' go on)."""
    try:
        return await anext(reader, None)
    except Exception as exc:
        log.warning("replay of %s failed: %r", stream, exc)
        return None


def _epoch(rfc3339) -> float | None:
    if not rfc3339:
        return None
    if isinstance(rfc3339, datetime.datetime):
        return rfc3339.timestamp()
    text = str(rfc3339).replace("Z", "+00:00")
    if "." in text:  # (nanoseconds: Python reads at most microseconds)
        head, _, rest = text.partition(".")
        digits = "".join(itertools.takewhile(str.isdigit, rest))
        text = f"{head}.{digits[:6]}{rest[len(digits):]}"
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class QueueBridge:
    """The bridge's half of ``cluster/queuing.py``: runs its commands on JetStream and sends its
    events back with ``emit(tuple)``. Pulled messages are held by a number (``ref``) until the
    dispatcher settles them (a pack once all its members are settled); while held, JetStream is
    told they are in progress, so only the messages of a node that is gone come back after
    ack_wait."""

    def __init__(self, nc, js, config, emit, emit_message=None, emit_stored=None):
        self.nc = nc
        self.js = js
        self.config = config
        self.emit = emit
        # the hot path's answers, binary (QueuesPart); plain events otherwise (tests)
        self.emit_message = emit_message or (lambda key, ref, delivered, data: emit(("message", key, ref, delivered,
                                                                                      data)))
        self.emit_stored = emit_stored or (lambda token: emit(("stored", token)))
        self.fast = FastPath(nc)
        self.publisher = Publisher(nc, self.fast, self.emit_stored, self._failed)
        self.cluster = config.cluster_name
        self.shards = config.cluster_streams   # this node's layout: shards ...
        self.pack = packs.size(config)         # ... and the most queue messages in one JetStream message
        self.ack_wait = config.cluster_ack_wait_ms / 1000
        self.pullers: dict[str, PullGroup] = {}
        self.held: dict[int, list] = {}       # ref -> [ack subject, when it was last touched]
        self.unsettled = 0                    # settles that found no connection (the message comes back)
        self.refs = itertools.count(1)
        self.ready = asyncio.Event()
        self.tasks: set = set()
        self.replicas = 0
        self.replicas_hint = config.cluster_replicas   # 0: 3 if the NATS cluster takes them, else 1
        self.listing = leaders.Survey(nc, self.cluster, self.own(shards.QUEUES) + self.own(shards.TOPICS))
        self.node = config.node_id
        self.peers = lambda: ()   # the other live nodes, None before the interest bucket was read (QueuesPart)
        self.answering: dict[int, asyncio.Queue | str] = {}   # removal request -> where its answer goes
        self.removals = itertools.count(1)

    def own(self, kind: str) -> list[str]:
        """This node's layout's streams of ``kind``."""
        p = self.pack if kind == shards.QUEUES else 1
        return [shards.stream_name(self.cluster, kind, self.shards, i, p) for i in range(self.shards)]

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def start(self) -> None:
        await self.publisher.start()
        await self.nc.subscribe(removal.subject(self.cluster), cb=self._removal_asked)
        self.spawn(self._declare())
        self.spawn(self._keeper())

    def status(self) -> dict:
        return {"queue_consumers": len(self.pullers), "queue_held": len(self.held), "stream_replicas": self.replicas,
                "queue_publishing": self.publisher.pending(), "queue_unsettled": self.unsettled,
                "streams": self.listing.streams, "cluster_streams": self.shards, "leader_moves": self.listing.moves}

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    async def _declare(self) -> None:
        while True:
            try:
                await self.declare()
                break
            except Exception as exc:  # NATS not there yet, no meta leader yet: try again
                log.info("JetStream streams not declared yet: %s", exc)
                await asyncio.sleep(0.5)
        self.ready.set()
        self.publisher.ready = True
        self.publisher.tick(time.monotonic())
        await self.survey()

    async def declare(self) -> None:
        """Create (or update) this node's layout's streams."""
        retention = getattr(self.config, "replay_retention", 3600.0) or 3600.0
        queues, topics = self.own(shards.QUEUES), self.own(shards.TOPICS)

        def subjects(kind, i):
            return [shards.subject_root(self.cluster, kind, self.shards, i,
                                        self.pack if kind == shards.QUEUES else 1) + ".>"]
        limit = packs.queue_limit(self.config)   # (in packs: never more than max_queue_messages messages)
        tags = getattr(self.config, "cluster_placement_tags", None) or []

        def tag(i):
            return tags[i % len(tags)] if tags else ""
        # the first one finds out how many replicas the NATS cluster takes
        self.replicas = await declare_stream(self.js, queues[0], subjects(shards.QUEUES, 0), self.replicas_hint,
                                             work_queue=True, per_subject=limit, tag=tag(0))
        await asyncio.gather(
            *[declare_stream(self.js, name, subjects(shards.QUEUES, i), self.replicas or 1, work_queue=True,
                             per_subject=limit, tag=tag(i)) for i, name in enumerate(queues) if i],
            *[declare_stream(self.js, name, subjects(shards.TOPICS, i), self.replicas or 1, work_queue=False,
                             max_age=retention, tag=tag(i)) for i, name in enumerate(topics)])
        log.info("JetStream: %d queue and %d topic streams ready (%d replicas)", len(queues), len(topics),
                 self.replicas)

    async def _keeper(self) -> None:
        """Held messages stay ours (in progress) while the node lives; lost pull requests are
        asked again; the streams are listed every ``leaders.SURVEY_EVERY`` seconds."""
        every = max(min(self.ack_wait / 3, 1.0), 0.05)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for held in list(self.held.values()):
                if now - held[1] > self.ack_wait / 3:
                    held[1] = now
                    self.fast.send(pub(held[0], b"", b"+WPI"))
            for group in list(self.pullers.values()):
                for stream, puller in list(group.members.items()):
                    if puller.lost and not group.binding:
                        task = self.spawn(self._found(group, puller, stream))
                        group.binding.add(task)
                        task.add_done_callback(group.binding.discard)
                group.ask()
            if self.ready.is_set() and now >= self.listing.due:
                await self.survey()

    async def survey(self) -> None:
        """List the streams (``cluster/leaders.py``): the layouts to read, this node's streams
        declared again if one was deleted, the figures for STATUS, the leaders spread."""
        before = self.listing.present
        infos = await self.listing.run()
        if infos is None:
            return
        if not self.listing.listed >= set(self.listing.own):
            try:  # one of this node's streams was deleted (by hand?): publishes need it
                await self.declare()
            except Exception as exc:
                log.warning("cluster: this node's streams cannot be declared again: %r", exc)
        self.present_changed(before)

    def present_changed(self, before: set[str]) -> None:
        if self.listing.present != before:
            for key, group in list(self.pullers.items()):
                self.reconcile(key, group)

    # -- commands from the dispatcher ------------------------------------------------------------
    async def handle(self, command: tuple) -> None:
        """One command; commands are handled in order, and only an unbind is awaited here: its
        UNSUB must reach the server before the naks that follow it (see ``cluster/queuing.py``)."""
        kind = command[0]
        if kind in ("ack", "nak", "term"):
            delay = command[2] if len(command) > 2 else 0
            self.settle(command[1], SETTLE_OPS[kind], int((delay or 0) * 1000))
        elif kind == "publish":
            _, tokens, subject, msg_id, payload, timeout_ms = command
            self.publish(tokens, subject.encode(), msg_id, payload, timeout_ms)
        elif kind == "credit":
            group = self.pullers.get(command[1])
            if group is not None:
                group.want += command[2]
                group.ask()
        elif kind == "bind":
            _, key, stream_kind, consumer, pattern, start_ms, replace = command
            old = self.pullers.pop(key, None)
            if old is not None:
                await old.close()
            group = self.pullers[key] = PullGroup(stream_kind, consumer, pattern, start_ms)
            if replace:  # a durable subscribed anew to another destination: its old consumers go first
                self.spawn(self._replace(key, group))
            else:
                self.reconcile(key, group)
        elif kind == "unbind":
            _, key, delete = command
            group = self.pullers.pop(key, None)
            if group is not None:
                group.deleted = bool(delete)
                await group.close()
            if delete:
                self.spawn(self._delete(delete, group))
        elif kind == "replay":
            _, token, pattern, since_ms = command
            self.spawn(self._replay(token, pattern, since_ms))
        elif kind == "peek":
            _, token, name, want, max_bytes, timeout_ms = command
            self.spawn(self._action(token, timeout_ms, self.peek(token, name, want, max_bytes, timeout_ms)))
        elif kind == "take":
            _, token, name, consumer, want, max_bytes, timeout_ms = command
            self.spawn(self._action(token, timeout_ms, self.take(token, name, consumer, want, max_bytes, timeout_ms)))
        elif kind == "delete":
            _, token, name, consumer, timeout_ms = command
            done = [0]
            self.spawn(self._action(token, timeout_ms, self.delete(token, name, consumer, timeout_ms, done), done))
        elif kind == "purge":
            _, token, name, consumer, timeout_ms = command
            done = [0]   # (terminated so far: said even when the time runs out)
            self.spawn(self._action(token, timeout_ms, self.purge(token, name, consumer, timeout_ms, done), done))
        elif kind == "forget":
            _, token, key, consumer, timeout_ms = command
            self.spawn(self._action(token, timeout_ms, self.forget(token, key, consumer, timeout_ms)))
        elif kind == "forget_elsewhere":
            for op in (removal.DROP, removal.RELEASE):   # (no answers: the end is this node's client's)
                self.fast.send(pub(removal.subject(self.cluster).encode(), b"", removal.request(op, command[1])))
        elif kind == "durable_answer":
            _, n, held, attached = command
            self._removal_answered(n, removal.answer(self.node, held, attached))

    def sources(self, kind: str, pattern: str) -> list[tuple[str, list[str]]]:
        """(stream, filters) holding a queue's or topic pattern's messages: its shards in this
        node's layout, and in every other layout whose streams exist."""
        present = self.listing.present
        layouts = set(shards.layouts(self.cluster, present, kind)) | {(self.shards, self.pack)}
        return [(stream, filters) for stream, filters in shards.reads(self.cluster, kind, pattern, layouts)
                if stream in present]

    def reconcile(self, key: str, group: PullGroup) -> None:
        """Pull from every stream that may hold the group's messages, and from no other."""
        if group.closed:
            return
        wanted = dict(self.sources(group.kind, group.pattern))
        for stream in [s for s in group.members if s not in wanted]:  # (its stream was deleted)
            self.spawn(group.members.pop(stream).close())
        for stream, filters in wanted.items():
            if stream not in group.members:
                puller = group.members[stream] = Puller(
                    self.nc, stream, group.consumer,
                    lambda reply, data, n, key=key: self._arrived(key, reply, data, n), self.fast, group.shared)
                task = self.spawn(self._bind(group, puller, stream, filters))
                group.binding.add(task)
                task.add_done_callback(group.binding.discard)

    def settle(self, ref: int, op: int, delay_ms: int = 0) -> None:
        self.settle_many(((ref, op, delay_ms),))

    def settle_many(self, settles) -> None:
        """Ack, nak or term held messages ((ref, op, delay_ms)...): one publish to each one's ack
        subject, written together with the turn's other commands and not awaited by anyone
        (JetStream has them long before ack_wait; if the connection loses them, the messages come
        back after ack_wait, as from a dead node)."""
        held, commands = self.held, []
        for ref, op, delay_ms in settles:
            entry = held.pop(ref, None)
            if entry is not None:
                commands.append(pub(entry[0], b"", b"" if op == ACK else b"+TERM" if op == TERM else
                                    b'-NAK {"delay":%d}' % (delay_ms * 1_000_000) if delay_ms else b"-NAK"))
        if commands and not self.fast.send(b"".join(commands)):  # not connected: redelivered after ack_wait
            self.unsettled += len(commands)

    def publish(self, tokens, subject: bytes, msg_id: str, payload: bytes, timeout_ms: int) -> None:
        """One JetStream message (one message, or a pack: a token for each of its messages)."""
        self.publisher.publish(tokens, subject, msg_id, payload, time.monotonic() + timeout_ms / 1000)

    def _failed(self, token: int, reason: str, refused) -> None:
        self.emit(("failed", token, reason, refused))

    async def tick(self) -> None:
        self.publisher.tick(time.monotonic())

    async def _start_time(self, group: PullGroup, stream: str) -> float | None:
        """When a durable's consumer in ``stream`` starts: as its consumers in the group's other
        streams did (a layout that came later holds nothing older), else when it was made."""
        if group.kind != shards.TOPICS:
            return None
        starts = []
        for other in list(group.members):
            if other == stream:
                continue
            try:
                info = await self.js.consumer_info(other, group.consumer)
            except Exception:
                continue
            start = _epoch(info.config.opt_start_time)
            if start is not None:
                starts.append(start)
        if starts:
            return min(starts)
        return group.start_ms / 1000 if group.start_ms else None

    async def _bind(self, group: PullGroup, puller: Puller, stream: str, filters: list[str]) -> None:
        """Declare the consumer and pull it. A durable's consumer is declared even when its
        subscription left meanwhile: it keeps what is sent for the durable until it comes back."""
        durable = group.kind == shards.TOPICS
        while not group.deleted and (durable or not (puller.closed or group.closed)):
            try:
                await self.ready.wait()
                await declare_consumer(self.js, stream, group.consumer, filters, self.ack_wait,
                                       start_time=await self._start_time(group, stream))
                if puller.closed or group.closed:
                    return
                await puller.start()
                puller.ask()
                log.debug("pulling %s (%s) from %s, credit %d", group.consumer, filters, stream, puller.want)
                return
            except Exception as exc:
                log.info("JetStream consumer %s not ready yet: %s", group.consumer, exc)
                await asyncio.sleep(0.5)

    async def _found(self, group: PullGroup, puller: Puller, stream: str) -> None:
        """A pull was refused (409, 503): the consumer is declared again if it is gone (a queue an
        operator deleted while a subscriber arrived here; it is the same consumer made anew), and
        the puller asks again."""
        if group.deleted or group.closed or puller.closed:
            return
        filters = dict(self.sources(group.kind, group.pattern)).get(stream)
        if filters is None:
            return
        try:
            await asyncio.wait_for(declare_consumer(self.js, stream, group.consumer, filters, self.ack_wait,
                                                    start_time=await self._start_time(group, stream)),
                                   self.config.cluster_timeout_ms / 1000)
        except Exception as exc:
            log.info("JetStream consumer %s not checked: %r", group.consumer, exc)
            return   # (still lost: the keeper tries again)
        puller.lost = False
        puller.wait_until = 0.0
        puller.requests.clear()   # (those out went to the consumer that is gone)
        puller.ask()

    async def _replace(self, key: str, group: PullGroup) -> None:
        await self._delete(group.consumer)
        if self.pullers.get(key) is group:
            self.reconcile(key, group)

    def topic_streams(self) -> list[str]:
        """Every layout's topic streams (a durable's consumers may be in any of them)."""
        topics = shards.layouts(self.cluster, self.listing.present, shards.TOPICS)
        return sorted(shards.stream_name(self.cluster, shards.TOPICS, n, i) for (n, _), ids in topics.items()
                      for i in ids)

    async def _delete(self, consumer: str, group: PullGroup | None = None) -> None:
        """A durable's consumers go from every topic stream (once any being declared are made)."""
        try:
            if group is not None and group.binding:
                await asyncio.wait(list(group.binding), timeout=self.config.cluster_timeout_ms / 1000)
            await self.ready.wait()
            for stream in self.topic_streams():
                await delete_consumer(self.js, stream, consumer)
        except Exception as exc:
            log.warning("durable consumer %s not deleted: %s", consumer, exc)

    def _arrived(self, key: str, reply: bytes, data: bytes, n: int = 1) -> None:
        ref = next(self.refs)
        self.held[ref] = [reply, time.monotonic()]
        self.emit_message(key, ref, delivered_count(reply), data)

    # -- operators' actions (broker/manage.py, cluster/queuing.py) ----------------------------------
    async def _action(self, token: int, timeout_ms: int, work, done: list | None = None) -> None:
        """An operator's action: its answer, or ("refused", token, 503, why) when JetStream fails
        it or does not answer within ``cluster_timeout_ms`` (``done``: what it did meanwhile)."""
        try:
            event = await asyncio.wait_for(work, timeout_ms / 1000)
        except asyncio.TimeoutError:
            log.warning("cluster: an operator's action got no answer from JetStream within cluster_timeout_ms")
            event = ("refused", token, 503, f"cluster unavailable: JetStream did not answer within "
                                            f"cluster_timeout_ms ({timeout_ms} ms)")
        except Exception as exc:
            log.warning("cluster: an operator's action failed: %r", exc, exc_info=True)
            event = ("refused", token, 503, f"cluster unavailable: JetStream: {exc!r}"[:500])
        if event[0] == "refused" and done and event[2] != 409:   # (a 409 refused before it took any)
            event = event[:3] + (f"{event[3]}; {done[0]} messages were purged before it stopped",)
        self.emit(event)

    async def _relist(self) -> None:
        """Every layout's streams as they are now (another node's layout may be newer than the last
        listing): an action reads them once."""
        before = self.listing.present
        try:
            listed = await asyncio.wait_for(self.listing.names(), ACTION_TRY)
        except asyncio.TimeoutError:
            return  # (the last listing's, then)
        if listed:
            self.present_changed(before)

    async def peek(self, token: int, name: str, want: int, max_bytes: int, timeout_ms: int) -> tuple:
        """("peeked", token, stored, cut, payload): a queue's first JetStream messages (up to ``want``
        queue messages, ``max_bytes``, PEEK_READS JetStream messages of each stream), read by
        sequence from each stream that may hold it (every layout's shard) without a consumer (a
        work-queue stream takes no second one), merged by the time each was stored. A request
        JetStream leaves unanswered or answers 503 is asked again, until 3/4 of ``timeout_ms``."""
        stop = time.monotonic() + timeout_ms / 1000 * 0.75
        await self.ready.wait()
        await self._relist()
        found, stored, size, cut = [], 0, 0, False
        for index, (stream, filters) in enumerate(self.sources(shards.QUEUES, name)):
            subject = filters[0]
            try:
                info = await until(stop, lambda: self.js.stream_info(stream, subjects_filter=subject))
            except nats.js.errors.NotFoundError:
                continue  # (a layout's stream deleted meanwhile)
            stored += (info.state.subjects or {}).get(subject, 0)
            seq, members, reads = 1, 0, 0
            while members < want and not cut:
                if reads >= PEEK_READS:
                    cut = True
                    break
                try:
                    msg = await until(stop, lambda: self.js.get_msg(stream, seq=seq, subject=subject, next=True))
                except nats.js.errors.NotFoundError:
                    break
                data = msg.data or b""
                if found and size + len(data) > max_bytes:  # (the first one in any case: a pack may be more)
                    cut = True
                    break
                size += len(data)
                reads += 1
                members += packs.count(data)
                found.append((_epoch(msg.time) or 0.0, index, msg.seq, data))
                seq = msg.seq + 1
        found.sort(key=lambda f: f[:3])
        return "peeked", token, stored, cut, pack_blobs([f[3] for f in found])

    async def purge(self, token: int, name: str, consumer: str, timeout_ms: int, done: list) -> tuple:
        """("purged", token, n, cut): a queue's messages JetStream has not handed to any node, in
        every stream that may hold it, taken through the queue's own consumer (``_take``) and
        terminated; ``n`` counts their queue messages (a pack's each). At 3/4 of ``timeout_ms`` it
        stops and says so (``cut``): a retry purges the rest."""
        stop = time.monotonic() + timeout_ms / 1000 * 0.75

        async def term(msg) -> None:
            await self.nc.publish(msg.reply, b"+TERM")
            done[0] += packs.count(msg.data)
        cut = False
        async for stream, filters, last, left in self._waiting(name, consumer, stop):
            cut = await self._take(stream, consumer, last, left, stop, term, filters[0])
            if cut:
                break
        await self.nc.flush(timeout=max(stop + timeout_ms / 4000 - time.monotonic(), 0.1))
        return "purged", token, done[0], cut

    async def delete(self, token: int, name: str, consumer: str, timeout_ms: int, done: list) -> tuple:
        """("deleted", token, found, n): a queue deleted across the cluster, or ("refused", token,
        409, why) while it is in use (``_in_use``). Otherwise its stored messages are terminated as
        a purge does (``n`` queue messages) and, once the stream has removed them, its consumer is
        deleted from every stream; ``found``: a consumer or a message was there. A delete cut short
        by the time bound deletes no consumer (503: ask again)."""
        stop = time.monotonic() + timeout_ms / 1000 * 0.75
        await self.ready.wait()
        await self._relist()
        sources = self.sources(shards.QUEUES, name)
        held: list = []   # messages given back by nodes, taken to tell them from those nodes hold
        try:
            found, why = await self._in_use(sources, consumer, stop, held)
        except BaseException:
            await self._give_back(held)
            raise
        if why:
            await self._give_back(held)
            return "refused", token, 409, f"the queue is in use in the cluster: {why} (close its consumers first, " \
                                          "or purge it)"
        for msg in held:
            await self.nc.publish(msg.reply, b"+TERM")
            done[0] += packs.count(msg.data)

        async def term(msg) -> None:
            await self.nc.publish(msg.reply, b"+TERM")
            done[0] += packs.count(msg.data)
        late = ("refused", token, 503, "cluster unavailable: the delete ran out of time before every message "
                                       "was taken; the queue was not deleted, ask again")
        taken = []
        async for stream, filters, last, left in self._waiting(name, consumer, stop):
            found = True
            taken.append((stream, filters[0], last))
            if await self._take(stream, consumer, last, left, stop, term, filters[0]):
                await self.nc.flush(timeout=max(stop + timeout_ms / 4000 - time.monotonic(), 0.1))
                return late
        await self.nc.flush(timeout=max(stop + timeout_ms / 4000 - time.monotonic(), 0.1))
        # A termination is applied by the stream a moment after it is sent; a message whose consumer
        # is deleted before that would stay. The consumer goes once the stream holds none of the
        # queue's messages stored up to ``last`` (one stored later stays for the next consumer).
        for stream, subject, last in taken:
            while True:
                try:
                    first = await until(stop, lambda: self.js.get_msg(stream, seq=1, subject=subject, next=True))
                except nats.js.errors.NotFoundError:
                    break
                if first.seq > last:
                    break
                if time.monotonic() > stop:
                    return late
                await asyncio.sleep(0.05)
        for stream, _ in sources:
            await until(stop + timeout_ms / 8000, lambda: delete_consumer(self.js, stream, consumer))
        return "deleted", token, found, done[0]

    async def _in_use(self, sources, consumer: str, stop: float, held: list) -> tuple[bool, str]:
        """(found, why the queue is in use or ""): whether its consumer exists in any stream, and in
        use when a pull request of a node waits there (``num_waiting``: a node pulls only while it
        has subscribers on the queue) or a node holds one of its messages, delivered (or pulled) and
        not acknowledged. JetStream counts as pending (``num_ack_pending``) also what nodes gave
        back (a NAK, a node's consumers gone, past the ack wait) until it is delivered again; so
        when some are pending, up to that many are taken (redeliveries come first, into ``held``)
        and the consumer asked again: pending beyond those taken are held by nodes."""
        found, counts = False, {}
        for stream, _ in sources:
            try:
                info = await until(stop, lambda: self.js.consumer_info(stream, consumer))
            except nats.js.errors.NotFoundError:
                continue
            found = True
            if info.num_waiting:
                return found, f"{info.num_waiting} pull requests of nodes with subscribers on it"
            counts[stream] = info.num_ack_pending or 0
        pending, capped = 0, False
        for stream, count in counts.items():
            if not count:
                continue
            taken = []

            async def hold(msg):
                taken.append(msg)
            capped = capped or count > DELETE_HOLDS
            await self._take(stream, consumer, 2 ** 62, min(count, DELETE_HOLDS), stop, hold)
            held += taken
            info = await until(stop, lambda: self.js.consumer_info(stream, consumer))
            if info.num_waiting:
                return found, f"{info.num_waiting} pull requests of nodes with subscribers on it"
            pending += max((info.num_ack_pending or 0) - len(taken), 0)
        if pending:
            return found, f"{pending} messages delivered to nodes and not acknowledged" + (
                f" (or given back, more than the {DELETE_HOLDS} a delete takes to tell: purge it first)"
                if capped else "")
        return found, ""

    async def forget(self, token: int, key: str, consumer: str, timeout_ms: int) -> tuple:
        """("forgotten", token, found, n): durable subscription ``key`` removed across the cluster,
        or ("refused", token, status, why) (``removal.verdict``). Every node is asked to hold it,
        then to drop its record, each step waiting at most a quarter of ``timeout_ms`` for them;
        then its consumer is deleted from every topic stream, ``n`` counting the JetStream messages
        it had not had acknowledged. ``found``: a node held its record, or a stream its consumer."""
        stop = time.monotonic() + timeout_ms / 1000 * 0.75
        wait_ms = timeout_ms // 4
        peers = await self._peers(wait_ms)
        if peers is None:
            return "refused", token, 503, ("cluster unavailable: this node has not read the other nodes' entries "
                                           "in the interest bucket yet; nothing was removed, ask again")
        expected = {self.node, *peers}
        try:
            held = await self._ask_nodes(removal.HOLD, key, expected, wait_ms)
            refused = removal.verdict(removal.HOLD, expected, held, wait_ms)
            if refused is None:
                dropped = await self._ask_nodes(removal.DROP, key, expected, wait_ms)
                refused = removal.verdict(removal.DROP, expected, dropped, wait_ms)
            if refused is not None:
                return ("refused", token, *refused)
            found, n = await self._forget_consumer(consumer, stop)
            return "forgotten", token, found or removal.held_anywhere(held), n
        finally:
            self._tell_nodes(removal.RELEASE, key)

    async def _peers(self, wait_ms: int) -> list[str] | None:
        """The other nodes, waited for at most ``wait_ms`` while the bucket was not read yet (a bridge
        just connected)."""
        stop = time.monotonic() + wait_ms / 1000
        while (peers := self.peers()) is None and time.monotonic() < stop:
            await asyncio.sleep(0.05)
        return peers

    async def _ask_nodes(self, op: str, key: str, expected: set, wait_ms: int) -> dict[str, dict]:
        """Every node's answer to a removal's ``op`` (this node's own dispatcher's too: NATS does not
        echo), by node, gathered until all of ``expected`` answered or ``wait_ms`` passed."""
        inbox = self.nc.new_inbox()
        got: asyncio.Queue = asyncio.Queue()

        async def heard(msg) -> None:
            got.put_nowait(msg.data)
        sub = await self.nc.subscribe(inbox, cb=heard)
        n = self._tell_nodes(op, key, inbox)
        self.answering[n] = got
        answers: dict[str, dict] = {}
        asked = time.monotonic()
        stop = deadline = asked + wait_ms / 1000
        try:
            while (left := stop - time.monotonic()) > 0:
                try:
                    answer = removal.read_answer(await asyncio.wait_for(got.get(), left))
                except asyncio.TimeoutError:
                    break
                if answer is not None:
                    answers[answer["node"]] = answer
                if stop == deadline and expected <= answers.keys():
                    # a node the bucket does not list yet (just started) answers about as fast: a moment for it
                    now = time.monotonic()
                    stop = min(deadline, now + max(ANSWER_GRACE, now - asked))
            return answers
        finally:
            self.answering.pop(n, None)
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass

    def _tell_nodes(self, op: str, key: str, reply: str = "") -> int:
        """A removal's request to every node, this one's dispatcher included: its number here."""
        n = next(self.removals)
        self.fast.send(pub(removal.subject(self.cluster).encode(), reply.encode(), removal.request(op, key)))
        self.emit(("durable_asked", n, op, key))
        return n

    async def _removal_asked(self, msg) -> None:
        """Another node's removal asks this one: its dispatcher answers (``_removal_answered``)."""
        asked = removal.read_request(msg.data)
        if asked is None:
            return
        n = next(self.removals)
        if msg.reply:
            self.answering[n] = msg.reply
        self.emit(("durable_asked", n, *asked))

    def _removal_answered(self, n: int, answer: bytes) -> None:
        to = self.answering.pop(n, None)
        if isinstance(to, asyncio.Queue):
            to.put_nowait(answer)
        elif to:
            self.fast.send(pub(to.encode(), b"", answer))

    async def _forget_consumer(self, consumer: str, stop: float) -> tuple[bool, int]:
        """(found, n): a durable's consumer deleted from every topic stream; ``n`` its JetStream
        messages not acknowledged (waiting, or given back by a node)."""
        await self.ready.wait()
        await self._relist()
        found, n = False, 0
        for stream in self.topic_streams():
            try:
                info = await until(stop, lambda: self.js.consumer_info(stream, consumer))
            except nats.js.errors.NotFoundError:
                continue
            found = True
            n += (info.num_pending or 0) + (info.num_ack_pending or 0)
            await until(stop, lambda: delete_consumer(self.js, stream, consumer))
        return found, n

    async def _give_back(self, held: list) -> None:
        for msg in held:
            await self.nc.publish(msg.reply, b"-NAK")
        if held:
            await self.nc.flush(timeout=2)

    async def take(self, token: int, name: str, consumer: str, want: int, max_bytes: int, timeout_ms: int) -> tuple:
        """("taken", token, cut, payload): up to ``want`` of a queue's messages JetStream has not
        handed to any node (and ``max_bytes`` of them), taken through its consumer (``_take``) and
        held here, as pulled messages are, for the dispatcher to move or give back
        (``records.pack_taken``: each one's ref, delivery count and data). At half of
        ``timeout_ms`` it stops (``cut``). If it fails, what it took goes back (nak)."""
        stop = time.monotonic() + timeout_ms / 1000 * 0.5
        taken, counted, size = [], [0], [0]

        async def hold(msg):
            data = msg.data or b""
            if taken and size[0] + len(data) > max_bytes:  # (enough: this one goes back)
                await self.nc.publish(msg.reply, b"-NAK")
                return False
            ref = next(self.refs)
            reply = msg.reply.encode()
            self.held[ref] = [reply, time.monotonic()]
            taken.append((ref, delivered_count(reply), data))
            counted[0] += packs.count(data)
            size[0] += len(data)
            return counted[0] < want
        try:
            cut = False
            async for stream, filters, last, left in self._waiting(name, consumer, stop):
                cut = await self._take(stream, consumer, last, min(left, want - counted[0]), stop, hold, filters[0])
                if cut:
                    break
            return "taken", token, cut, pack_taken(taken)
        except BaseException:
            self.settle_many([(ref, NAK, 0) for ref, _, _ in taken])
            raise

    async def _waiting(self, name: str, consumer: str, stop: float):
        """(stream, filters, last sequence, JetStream messages stored for it) of each stream holding messages of queue ``name``, its consumer declared (as the nodes
        declare it: a queue nobody subscribed to yet gets it now). Requests that change nothing are
        asked again until ``stop`` when JetStream leaves them unanswered or answers 503 (a consumer
        just made has its leader elected)."""
        await self.ready.wait()
        await self._relist()
        for stream, filters in self.sources(shards.QUEUES, name):
            subject = filters[0]
            try:
                info = await until(stop, lambda: self.js.stream_info(stream, subjects_filter=subject))
            except nats.js.errors.NotFoundError:
                continue  # (a layout's stream deleted meanwhile)
            stored = (info.state.subjects or {}).get(subject)
            if not stored:
                continue  # nothing stored for it here: no consumer made for nothing
            await until(stop, lambda: declare_consumer(self.js, stream, consumer, filters, self.ack_wait))
            try:
                last = (await until(stop, lambda: self.js.get_msg(stream, subject=subject))).seq
            except nats.js.errors.NotFoundError:
                continue  # (taken meanwhile)
            # what a pull may get now is among the messages stored then (a consumer's own counts
            # are not yet right just after it was made)
            yield stream, filters, last, stored

    async def _take(self, stream: str, consumer: str, last: int, left: int, stop: float, each,
                    queue_subject: str = "") -> bool:
        """Pull up to ``left`` JetStream messages of ``consumer`` (no waiting: what it has now) and
        hand those stored up to sequence ``last`` to ``each`` (a coroutine; False: no more); nak
        the others (stored after the action began, or past ``each``'s end). The queue's own
        consumer, the one every node pulls: what it hands here it hands to no node, and a message a
        node holds (delivered or not) is never among them. True when it stopped before the end:
        ``each`` had enough, or ``stop`` came (what the server still sends for the pull then is
        nak'ed for up to TAKE_GRACE seconds; later, it comes back after cluster_ack_wait_ms).
        ``queue_subject``: the queue's; a pull that found nothing is asked again while the stream
        holds more of its messages than nodes hold unacknowledged (``_undelivered``)."""
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        enough = False
        try:
            while left > 0 and not enough:
                if time.monotonic() >= stop:
                    return True
                batch = min(left, PURGE_BATCH)
                await self.nc.publish(subject, b'{"batch":%d,"no_wait":true}' % batch, reply=inbox)
                got, unanswered = 0, False
                while got < batch:
                    late = time.monotonic() >= stop
                    try:
                        msg = await sub.next_msg(timeout=TAKE_GRACE if late or enough else stop - time.monotonic())
                    except nats.errors.TimeoutError:
                        return True
                    status = (msg.headers or {}).get("Status")
                    if status == "100":
                        continue
                    if status:  # 404 no messages, 408, 409: the request ended; 503: nobody answered it
                        unanswered = status == "503" or (status == "404" and not got and queue_subject != "" and
                                                         await self._undelivered(stream, consumer, queue_subject,
                                                                                 stop))
                        break
                    got += 1
                    if late or enough or stream_sequence(msg.reply) > last:
                        await self.nc.publish(msg.reply, b"-NAK")
                        continue
                    enough = await each(msg) is False
                if late:
                    return True
                if unanswered and not got:  # (a consumer just made: its leader is being elected, or catching up)
                    await asyncio.sleep(0.2)
                    continue
                if got < batch:
                    return enough  # it had no more
                left -= got
            return enough
        finally:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass

    async def _undelivered(self, stream: str, consumer: str, subject: str, stop: float) -> bool:
        """Does the stream hold messages of ``subject`` that no node holds unacknowledged? Then a
        pull that found none met a consumer not caught up yet (made a moment ago, or its leader
        just changed), and is asked again. (Messages a node gave back with a delay count as
        available: asked again until the action's bound, which then says it was cut short.)"""
        try:
            info = await until(stop, lambda: self.js.stream_info(stream, subjects_filter=subject))
            consumer_info = await until(stop, lambda: self.js.consumer_info(stream, consumer))
        except Exception:
            return False
        stored = (info.state.subjects or {}).get(subject, 0)
        return stored > (consumer_info.num_ack_pending or 0)

    async def _replay(self, token: int, pattern: str, since_ms: float) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), self.config.cluster_timeout_ms / 1000)
            await self._relist()
            async for msg in replay_merged(self.js, self.sources(shards.TOPICS, pattern), since_ms / 1000):
                self.emit(("replayed", token, msg.data))
        except Exception as exc:
            log.warning("replay of %s failed: %r", pattern, exc)
        self.emit(("replay_end", token))


class QueuesPart:
    """The bridge part (``processes/cluster.py``) for queues, durables and replay. The hot path is
    binary (records.py: QUEUE_PUBLISH and QUEUE_SETTLE in, QUEUE_STORED and QUEUE_MESSAGE out; the
    PubAcks of one turn of the loop go back as one record); the rest carries ``cluster/queuing.py``'s
    packed commands and events (QUEUE_CMD, QUEUE_EVENT)."""

    def __init__(self, bridge):
        from . import queuing
        from . import records as C
        self.C = C
        self.bridge = bridge
        self.unpack = queuing.unpack
        self.pack = queuing.pack
        self.queues = QueueBridge(bridge.nc, None, bridge.config, self._emit, self._emit_message, self._emit_stored)
        # the nodes whose entry the interest bucket holds, empty or not (``Topics.heard``), once read
        topics = next((part for part in bridge.parts if hasattr(part, "heard")), None)
        if topics is not None:
            self.queues.peers = lambda: list(topics.heard) if topics.started else None
        self.handlers = {C.QUEUE_CMD: self._command, C.QUEUE_PUBLISH: self._publish, C.QUEUE_SETTLE: self._settle}
        self.stored: list[int] = []
        self.keys: dict[str, bytes] = {}
        self.started = False

    def _emit(self, event: tuple) -> None:
        self.bridge.emit(self.C.QUEUE_EVENT, 0, self.pack(event))

    def _emit_message(self, key: str, ref: int, delivered: int, data: bytes) -> None:
        raw = self.keys.get(key)
        if raw is None:
            if len(self.keys) > 10_000:
                self.keys.clear()
            raw = self.keys[key] = key.encode()
        self.bridge.emit(self.C.QUEUE_MESSAGE, ref, self.C.pack_pulled(raw, data), min(delivered, 0xFFFFFFFF))

    def _emit_stored(self, token: int) -> None:
        if not self.stored:
            self.bridge.loop.call_soon(self._stored_out)
        self.stored.append(token)

    def _stored_out(self) -> None:
        tokens, self.stored = self.stored, []
        if tokens:
            self.bridge.emit(self.C.QUEUE_STORED, 0, self.C.pack_tokens(tokens))

    async def _command(self, conn: int, aux: int, payload) -> None:
        await self.queues.handle(self.unpack(payload))

    async def _publish(self, n: int, timeout_ms: int, payload) -> None:
        subject, msg_id, tokens, message = self.C.unpack_queue_publish(payload)
        self.queues.publish(tokens, subject, msg_id, message, timeout_ms)

    async def _settle(self, conn: int, aux: int, payload) -> None:
        self.queues.settle_many(self.C.iter_settles(payload))

    async def connected(self) -> None:
        self.queues.js = self.bridge.nc.jetstream(timeout=10)  # (stream and consumer calls on a loaded machine)
        self.queues.replicas_hint = self.bridge.replicas()
        if not self.started:
            self.started = True
            await self.queues.start()
            return
        self.queues.publisher.resend()  # their PubAcks may have gone with the old connection
        for group in list(self.queues.pullers.values()):  # a new connection: the old pulls are gone
            group.reset()
            group.ask()

    async def tick(self) -> None:
        await self.queues.tick()

    def status(self) -> dict:
        return self.queues.status()

    async def stop(self) -> None:
        await self.queues.stop()
