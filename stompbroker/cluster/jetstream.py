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

from . import leaders, shards

log = logging.getLogger("stompbroker.cluster")

PULL_EXPIRES = 10.0        # seconds a pull request waits on the server for messages
PULL_SLACK = 2.0           # a request not ended by the server this long after its expiry is forgotten
DUPLICATE_WINDOW = 120.0   # seconds JetStream remembers a Nats-Msg-Id (documented in docs/cluster.md)
STATUS = "Status"
PER_SUBJECT_FULL = 10077   # JetStream's "store failed" code, with "maximum messages per subject exceeded"


class QueueFull(Exception):
    """The queue stream holds max_queue_messages for this destination (discard-new per subject)."""


async def declare_stream(js, name: str, subjects: list[str], replicas: int, *, work_queue: bool,
                         max_age: float = 0.0, per_subject: int = 0) -> int:
    """Create (or update) a stream; returns the replicas it got. ``replicas`` 0 means 3 when the
    NATS cluster can hold them, else 1. ``per_subject``: the most messages one subject holds; a
    publish over it is refused (discard-new per subject), never an older message dropped."""
    limits = dict(max_msgs_per_subject=per_subject, discard=api.DiscardPolicy.NEW,
                  discard_new_per_subject=True) if per_subject else {}
    config = api.StreamConfig(**limits,
        name=name, subjects=subjects, storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.WORK_QUEUE if work_queue else api.RetentionPolicy.LIMITS,
        max_age=max_age or None, duplicate_window=min(DUPLICATE_WINDOW, max_age or DUPLICATE_WINDOW), num_replicas=replicas or 3)
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
        info = await js.consumer_info(stream, name)
        have = info.config.filter_subjects or [info.config.filter_subject]
        if sorted(have) == sorted(config.filter_subjects or [config.filter_subject]):
            return  # made by another node (or this one before): as it is, its start time included
        await delete_consumer(js, stream, name)  # a durable subscribed anew to other destinations
    except nats.js.errors.NotFoundError:
        pass
    try:
        await js.add_consumer(stream, config)
    except nats.js.errors.APIError:
        await js.consumer_info(stream, name)  # another node made it meanwhile: fine; else the first error


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


async def publish(js, subject: str, payload: bytes, msg_id: str, deadline: float) -> api.PubAck:
    """Publish and wait for JetStream to store it (PubAck), retrying with the same Nats-Msg-Id
    (so a retry never stores it twice) until the monotonic ``deadline``; raises TimeoutError then."""
    headers = {"Nats-Msg-Id": msg_id}
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"JetStream did not store the message within the timeout ({subject})")
        try:
            try:
                return await js.publish(subject, payload, timeout=min(left, 2.0), headers=dict(headers))
            except nats.js.errors.APIError as exc:  # (a 503 ServiceUnavailableError, retried below)
                if exc.err_code == PER_SUBJECT_FULL and "per subject" in (exc.description or ""):
                    raise QueueFull(exc.description) from None
                raise
        except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError, nats.errors.ConnectionClosedError,
                nats.errors.NoRespondersError, asyncio.TimeoutError, nats.js.errors.ServiceUnavailableError):
            pass
        except nats.js.errors.APIError as exc:
            # Temporary while a stream leader is elected; anything else is final.
            if exc.code not in (503, 500) and exc.err_code not in (10008, 10074):
                raise
        await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
        delay = min(delay * 2, 0.5)


class Credit:
    """The credit a dispatcher gave one queue or durable, shared by its pullers (``PullGroup``)."""

    __slots__ = ("value",)

    def __init__(self):
        self.value = 0


class Puller:
    """Pulls one consumer's messages as credits allow and hands each to ``on_message(msg)`` at once.

    ``want`` is the credit the dispatcher gave and messages have not used yet; it may go below
    zero when the dispatcher takes credit back while requests are out (what they still bring is
    handed on, and the dispatcher puts it back). Requests ask for ``want - asked`` more. Pullers
    of one group share it (``shared``)."""

    def __init__(self, nc, stream: str, consumer: str, on_message, shared: Credit | None = None):
        self.nc = nc
        self.stream = stream
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.on_message = on_message
        self.inbox = nc.new_inbox()
        self.sub = None
        self.shared = shared or Credit()
        self.requests: dict[str, list] = {}   # reply subject -> [messages still expected, deadline]
        self.ids = itertools.count(1)
        self.closed = False

    @property
    def want(self) -> int:
        return self.shared.value

    @want.setter
    def want(self, value: int) -> None:
        self.shared.value = value

    async def start(self) -> None:
        self.sub = await self.nc.subscribe(self.inbox + ".*", cb=self._arrived)

    async def credit(self, n: int) -> None:
        self.want += n
        await self.ask()

    def asked(self) -> int:
        now = time.monotonic()
        for reply, (_, deadline) in list(self.requests.items()):
            if now > deadline:
                del self.requests[reply]
        return sum(left for left, _ in self.requests.values())

    async def ask(self) -> None:
        if self.closed or self.sub is None or self.nc.is_closed:
            return
        more = self.want - self.asked()
        if more <= 0 or not self.nc.is_connected:
            return
        reply = f"{self.inbox}.{next(self.ids)}"
        self.requests[reply] = [more, time.monotonic() + PULL_EXPIRES + PULL_SLACK]
        request = b'{"batch":%d,"expires":%d}' % (more, int(PULL_EXPIRES * 1e9))
        try:
            await self.nc.publish(self.subject, request, reply=reply)
        except nats.errors.Error:
            self.requests.pop(reply, None)

    async def _arrived(self, msg) -> None:
        if self.closed:  # sent before the server saw the unsubscribe: let another pull have it
            await msg.nak(0.25)
            return
        status = msg.headers.get(STATUS) if msg.headers else None
        if status:  # status messages come on the request's own inbox subject
            if status != "100":  # 404 no messages, 408 expired, 409 over a limit: that request ended
                self.requests.pop(msg.subject, None)
                await self.ask()
            return
        # A message carries its stream subject: the server fills the requests in order.
        for reply, request in self.requests.items():
            request[0] -= 1
            if request[0] <= 0:
                del self.requests[reply]
            break
        self.want -= 1
        self.on_message(msg)

    async def close(self) -> None:
        self.closed = True
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except nats.errors.Error:
                pass


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

    async def ask(self) -> None:
        for puller in list(self.members.values()):
            await puller.ask()

    def reset(self) -> None:
        """A new connection: the requests out on the old one are gone."""
        for puller in self.members.values():
            puller.requests.clear()

    async def close(self) -> None:
        self.closed = True
        for puller in list(self.members.values()):
            await puller.close()


async def replay(js, stream: str, filters, since_s: float, limit: int = 100_000):
    """The messages of ``stream`` on ``filters`` stored since ``since_s`` (epoch seconds), in
    order, read by a short-lived consumer; stops at what was there when it began."""
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.BY_START_TIME, **_filters(filters),
        opt_start_time=_rfc3339(since_s), inactive_threshold=30.0, mem_storage=True, num_replicas=1)
    info = await js.add_consumer(stream, config)
    name = info.name
    try:
        sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
        # (a new consumer of a replicated stream may not know its pending count yet: read until a
        # message says none is left, or nothing comes: for a while when it said some are there)
        wait = 5.0 if info.num_pending else 1.0
        left = limit
        while left > 0:
            try:
                msgs = await sub.fetch(min(left, 256), timeout=wait)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                break
            for msg in msgs:
                yield msg
                left -= 1
                if msg.metadata.num_pending == 0:
                    left = 0
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
    dispatcher settles them; while held, JetStream is told they are in progress, so only the
    messages of a node that is gone come back after ack_wait."""

    def __init__(self, nc, js, config, emit):
        self.nc = nc
        self.js = js
        self.config = config
        self.emit = emit
        self.cluster = config.cluster_name
        self.shards = config.cluster_streams   # this node's layout
        self.ack_wait = config.cluster_ack_wait_ms / 1000
        self.pullers: dict[str, PullGroup] = {}
        self.held: dict[int, tuple] = {}      # ref -> (message, when it was last touched)
        self.refs = itertools.count(1)
        self.ready = asyncio.Event()
        self.tasks: set = set()
        self.replicas = 0
        self.replicas_hint = config.cluster_replicas   # 0: 3 if the NATS cluster takes them, else 1
        self.listing = leaders.Survey(nc, self.cluster, self.own(shards.QUEUES) + self.own(shards.TOPICS))

    def own(self, kind: str) -> list[str]:
        """This node's layout's streams of ``kind``."""
        return [shards.stream_name(self.cluster, kind, self.shards, i) for i in range(self.shards)]

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def start(self) -> None:
        self.spawn(self._declare())
        self.spawn(self._keeper())

    def status(self) -> dict:
        return {"queue_consumers": len(self.pullers), "queue_held": len(self.held), "stream_replicas": self.replicas,
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
        await self.survey()

    async def declare(self) -> None:
        """Create (or update) this node's layout's streams."""
        retention = getattr(self.config, "replay_retention", 3600.0) or 3600.0
        queues, topics = self.own(shards.QUEUES), self.own(shards.TOPICS)

        def subjects(kind, i):
            return [shards.subject_root(self.cluster, kind, self.shards, i) + ".>"]
        # the first one finds out how many replicas the NATS cluster takes
        self.replicas = await declare_stream(self.js, queues[0], subjects(shards.QUEUES, 0), self.replicas_hint,
                                             work_queue=True, per_subject=self.config.max_queue_messages)
        await asyncio.gather(
            *[declare_stream(self.js, name, subjects(shards.QUEUES, i), self.replicas or 1, work_queue=True,
                             per_subject=self.config.max_queue_messages) for i, name in enumerate(queues) if i],
            *[declare_stream(self.js, name, subjects(shards.TOPICS, i), self.replicas or 1, work_queue=False,
                             max_age=retention) for i, name in enumerate(topics)])
        log.info("JetStream: %d queue and %d topic streams ready (%d replicas)", len(queues), len(topics),
                 self.replicas)

    async def _keeper(self) -> None:
        """Held messages stay ours (in progress) while the node lives; lost pull requests are
        asked again; the streams are listed every ``leaders.SURVEY_EVERY`` seconds."""
        every = max(min(self.ack_wait / 3, 1.0), 0.05)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for ref, (msg, touched) in list(self.held.items()):
                if now - touched > self.ack_wait / 3:
                    self.held[ref] = (msg, now)
                    try:
                        await msg.in_progress()
                    except Exception:
                        pass
            for group in list(self.pullers.values()):
                await group.ask()
            if self.ready.is_set() and now >= self.listing.due:
                await self.survey()

    async def survey(self) -> None:
        """List the streams (``cluster/leaders.py``): the layouts to read, this node's streams
        declared again if one was deleted, the figures for STATUS, the leaders spread."""
        before = self.listing.present
        infos = await self.listing.run()
        if infos is None:
            return
        if not {i.config.name for i in infos} >= set(self.listing.own):
            try:  # one of this node's streams was deleted (by hand?): publishes need it
                await self.declare()
            except Exception as exc:
                log.warning("cluster: this node's streams cannot be declared again: %r", exc)
        if self.listing.present != before:
            for key, group in list(self.pullers.items()):
                self.reconcile(key, group)

    # -- commands from the dispatcher ------------------------------------------------------------
    async def handle(self, command: tuple) -> None:
        """One command; commands are handled in order, and only an unbind is awaited here: its
        UNSUB must reach the server before the naks that follow it (see ``cluster/queuing.py``)."""
        kind = command[0]
        if kind in ("ack", "nak", "term"):
            held = self.held.pop(command[1], None)
            if held is not None:
                self.spawn(self._settle(held[0], kind, command[2] if len(command) > 2 else None))
        elif kind == "publish":
            _, token, subject, msg_id, payload, timeout_ms = command
            self.spawn(self._publish(token, subject, msg_id, payload, time.monotonic() + timeout_ms / 1000))
        elif kind == "credit":
            group = self.pullers.get(command[1])
            if group is not None:
                group.want += command[2]
                self.spawn(group.ask())
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

    def sources(self, kind: str, pattern: str) -> list[tuple[str, list[str]]]:
        """(stream, filters) holding a queue's or topic pattern's messages: its shards in this
        node's layout, and in every other layout whose streams exist."""
        present = self.listing.present
        layouts = set(shards.layouts(self.cluster, present, kind)) | {self.shards}
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
                puller = group.members[stream] = Puller(self.nc, stream, group.consumer,
                                                        lambda msg, key=key: self._arrived(key, msg), group.shared)
                task = self.spawn(self._bind(group, puller, stream, filters))
                group.binding.add(task)
                task.add_done_callback(group.binding.discard)

    async def _settle(self, msg, kind: str, delay: float | None = None) -> None:
        try:
            await (msg.ack() if kind == "ack" else msg.nak(delay) if kind == "nak" else msg.term())
        except Exception as exc:  # gone with the connection: JetStream redelivers after ack_wait
            log.info("JetStream %s failed: %s", kind, exc)

    async def _publish(self, token: int, subject: str, msg_id: str, payload: bytes, deadline: float) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), max(deadline - time.monotonic(), 0.001))
            await publish(self.js, subject, payload, msg_id, deadline)
        except (TimeoutError, asyncio.TimeoutError):
            self.emit(("failed", token, "JetStream did not store it in time", False))
            return
        except QueueFull as exc:
            self.emit(("failed", token, str(exc), "full"))
            return
        except Exception as exc:
            self.emit(("failed", token, str(exc) or type(exc).__name__, True))
            return
        self.emit(("stored", token))

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
                await puller.ask()
                log.debug("pulling %s (%s) from %s, credit %d", group.consumer, filters, stream, puller.want)
                return
            except Exception as exc:
                log.info("JetStream consumer %s not ready yet: %s", group.consumer, exc)
                await asyncio.sleep(0.5)

    async def _replace(self, key: str, group: PullGroup) -> None:
        await self._delete(group.consumer)
        if self.pullers.get(key) is group:
            self.reconcile(key, group)

    async def _delete(self, consumer: str, group: PullGroup | None = None) -> None:
        """A durable's consumers go from every topic stream (once any being declared are made)."""
        try:
            if group is not None and group.binding:
                await asyncio.wait(list(group.binding), timeout=self.config.cluster_timeout_ms / 1000)
            await self.ready.wait()
            topics = shards.layouts(self.cluster, self.listing.present, shards.TOPICS)
            for stream in sorted(shards.stream_name(self.cluster, shards.TOPICS, n, i) for n, ids in topics.items()
                                 for i in ids):
                await delete_consumer(self.js, stream, consumer)
        except Exception as exc:
            log.warning("durable consumer %s not deleted: %s", consumer, exc)

    def _arrived(self, key: str, msg) -> None:
        ref = next(self.refs)
        self.held[ref] = (msg, time.monotonic())
        try:
            delivered = msg.metadata.num_delivered
        except Exception:
            delivered = 1
        self.emit(("message", key, ref, delivered, msg.data))

    async def _replay(self, token: int, pattern: str, since_ms: float) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), self.config.cluster_timeout_ms / 1000)
            await self.survey()  # (every layout's streams, as they are now: a replay reads them once)
            async for msg in replay_merged(self.js, self.sources(shards.TOPICS, pattern), since_ms / 1000):
                self.emit(("replayed", token, msg.data))
        except Exception as exc:
            log.warning("replay of %s failed: %r", pattern, exc)
        self.emit(("replay_end", token))


class QueuesPart:
    """The bridge part (``processes/cluster.py``) for queues, durables and replay: one record kind
    each way, carrying ``cluster/queuing.py``'s packed commands and events."""

    def __init__(self, bridge):
        from . import queuing
        from . import records as C
        self.bridge = bridge
        self.unpack = queuing.unpack
        self.pack = queuing.pack
        self.kind_event = C.QUEUE_EVENT
        self.queues = QueueBridge(bridge.nc, None, bridge.config, self._emit)
        self.handlers = {C.QUEUE_CMD: self._command}
        self.started = False

    def _emit(self, event: tuple) -> None:
        self.bridge.emit(self.kind_event, 0, self.pack(event))

    async def _command(self, conn: int, aux: int, payload) -> None:
        await self.queues.handle(self.unpack(payload))

    async def connected(self) -> None:
        self.queues.js = self.bridge.nc.jetstream(timeout=10)  # (stream and consumer calls on a loaded machine)
        self.queues.replicas_hint = self.bridge.replicas()
        if not self.started:
            self.started = True
            await self.queues.start()
            return
        for group in list(self.queues.pullers.values()):  # a new connection: the old pulls are gone
            group.reset()
            await group.ask()

    def status(self) -> dict:
        return self.queues.status()

    async def stop(self) -> None:
        await self.queues.stop()
