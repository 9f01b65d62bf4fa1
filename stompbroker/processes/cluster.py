"""The bridge: cluster mode's one process that talks to NATS (asyncio + nats-py).

Started by the supervisor only when the ``cluster`` setting is set (single-node mode never imports
nats), restarted alone when it dies. It holds one NATS connection (``name`` = node_id, ``no_echo``:
a node never gets its own publishes back, reconnecting forever) and two rings with the dispatcher
(``cluster/records.py``). It keeps no broker state: a new bridge says BRIDGE_START, the dispatcher
tells it the node's interest again, and it reads the other nodes' interest from the bucket anew.

The work is done by *parts*, one module each, which register handlers for the dispatcher's record
kinds and hooks for the connection's life (``cluster/topics.py``: topics, wildcards, ``#`` worker
queues, the interest bucket). A part is an object with ``handlers`` (record kind -> coroutine
``handler(conn, aux, payload)``), and optional coroutines ``connected()`` (after each connect or
reconnect), ``tick()`` (about every 100 ms), ``stop()``, and ``status()`` (a dict merged into the
STATUS record). Records are handled one at a time, in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time

import orjson

from ..cluster import records as C
from . import common

log = logging.getLogger("stompbroker.cluster")

STATUS_EVERY = 1.0      # seconds between STATUS records (and round-trip measurements)
TICK = 0.1
MAX_BACKLOG = 64 << 20  # bytes for the dispatcher held here while its ring is full; past it messages go
# Under load, records leave for the dispatcher at most this often: one wake-up of the dispatcher
# (and one ring write) carries many messages. An idle bridge sends at once; a busy one adds at most
# this much latency.
COALESCE = 0.0005


def tls_context(config):
    if not (config.cluster_tls_ca or config.cluster_tls_cert or any(u.startswith("tls://") for u in config.cluster)):
        return None
    context = ssl.create_default_context(cafile=config.cluster_tls_ca or None)
    if config.cluster_tls_cert:
        context.load_cert_chain(config.cluster_tls_cert, config.cluster_tls_key)
    return context


def replicas(config, servers: int) -> int:
    """Copies of a stream: cluster_replicas, or 3 when the NATS cluster has at least 3 servers, else 1."""
    if config.cluster_replicas:
        return config.cluster_replicas
    return 3 if servers >= 3 else 1


class Bridge:
    def __init__(self, config, resources):
        import nats  # only here: single-node mode never imports it
        self.nats = nats
        self.config = config
        self.node = config.node_id
        self.cluster = config.cluster_name
        self.origin = f"{self.node}:{os.urandom(4).hex()}".encode()  # this bridge's run, on every message it sends
        self.from_dispatcher, self.to_dispatcher = resources.bridge_rings
        self.to_dispatcher.resume_producer()
        self.nc = nats.NATS()
        self.js = None
        self.connected = False
        self.ever_connected = False
        self.stopping = False
        self.out = C.Records()
        self.backlog: list[tuple[bytearray, int]] = []
        self.backlog_bytes = 0
        self.flush_soon = False
        self.last_flush = 0.0               # loop time of the last records sent to the dispatcher
        self.loop = None                    # the running loop, kept (asking for it costs a getpid)
        self.logged_errors: dict[str, float] = {}  # error text -> when last logged
        self.wake = asyncio.Event()
        self.handlers: dict = {}
        self.stats = {"reconnects": 0, "disconnects": 0, "rtt_ms": 0.0, "dropped_in": 0}
        self.parts = []

    def add_part(self, part) -> None:
        self.parts.append(part)
        self.handlers.update(part.handlers)

    # -- to the dispatcher -----------------------------------------------------------------------
    def emit(self, kind: int, conn: int = 0, payload: bytes = b"", aux: int = 0) -> None:
        """A record for the dispatcher; what is emitted in one turn of the loop goes as one batch."""
        self.out.add(kind, conn, payload, aux)
        if len(self.out.buf) > (1 << 20):
            self.flush()
        elif not self.flush_soon:
            self.flush_soon = True
            loop = self.loop
            wait = self.last_flush + COALESCE - loop.time()
            if wait > 0:
                loop.call_later(wait, self.flush)
            else:
                loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_soon = False
        if self.out.count:
            buf, count = self.out.take()
            self.backlog.append((buf, count))
            self.backlog_bytes += len(buf)
        ring = self.to_dispatcher
        sent = False
        while self.backlog:
            buf, count = self.backlog[0]
            if not ring.try_write(buf, count):
                break
            self.backlog.pop(0)
            self.backlog_bytes -= len(buf)
            sent = True
        if sent:
            ring.notify()
            self.last_flush = self.loop.time()
        while self.backlog_bytes > MAX_BACKLOG and len(self.backlog) > 1:  # the dispatcher is stuck
            buf, count = self.backlog.pop(0)
            self.backlog_bytes -= len(buf)
            self.stats["dropped_in"] += count

    # -- NATS connection -------------------------------------------------------------------------
    async def connect(self) -> None:
        config = self.config
        options = dict(servers=config.cluster, name=self.node, no_echo=True, allow_reconnect=True,
                       max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=2,
                       ping_interval=5, max_outstanding_pings=2,
                       disconnected_cb=self._disconnected, reconnected_cb=self._reconnected,
                       error_cb=self._error, closed_cb=self._closed)
        if config.cluster_token:
            options["token"] = config.cluster_token
        if config.cluster_user:
            options["user"], options["password"] = config.cluster_user, config.cluster_password
        context = tls_context(config)
        if context is not None:
            options["tls"] = context
        await self.nc.connect(**options)  # retries forever (max_reconnect_attempts=-1)
        self.js = self.nc.jetstream()
        self.ever_connected = True
        await self._up()

    async def _up(self) -> None:
        self.connected = True
        log.info("cluster: connected to NATS %s as %s", self.server(), self.node)
        for part in self.parts:
            hook = getattr(part, "connected", None)
            if hook is not None:
                try:
                    await hook()
                except Exception:
                    log.exception("cluster: %s could not start on the new connection", type(part).__name__)
        self.send_status()

    async def _disconnected(self) -> None:
        if self.connected:
            self.stats["disconnects"] += 1
            log.warning("cluster: disconnected from NATS; reconnecting")
        self.connected = False
        self.send_status()

    async def _reconnected(self) -> None:
        self.stats["reconnects"] += 1
        await self._up()

    async def _error(self, exc) -> None:
        """NATS errors: refused credentials or TLS, servers down while reconnecting. Each kind is
        logged once, then at most every 30 s, so a wrong setting is seen and a long outage is not a flood."""
        if self.stopping:
            return
        text, now = repr(exc), time.monotonic()
        if now - self.logged_errors.get(text, -60.0) > 30:
            if len(self.logged_errors) > 100:
                self.logged_errors.clear()
            log.warning("cluster: NATS: %s", text)
            self.logged_errors[text] = now

    async def _closed(self) -> None:
        self.connected = False

    def server(self) -> str:
        url = self.nc.connected_url
        return f"{url.scheme}://{url.hostname}:{url.port}" if url is not None and self.connected else ""

    def replicas(self) -> int:
        return replicas(self.config, len(self.nc.servers))

    # -- status ----------------------------------------------------------------------------------
    def send_status(self) -> None:
        status = {"node": self.node, "server": self.server(), "connected": self.connected,
                  "reconnects": self.stats["reconnects"], "disconnects": self.stats["disconnects"],
                  "rtt_ms": self.stats["rtt_ms"], "dropped_in": self.stats["dropped_in"], "streams": []}
        for part in self.parts:
            extra = getattr(part, "status", None)
            if extra is not None:
                status.update(extra())
        self.emit(C.STATUS, 0, orjson.dumps(status))
        self.flush()

    async def measure(self) -> None:
        if not self.connected:
            return
        try:
            self.stats["rtt_ms"] = round(await self.nc.rtt(timeout=1) * 1000, 3)
        except Exception:
            return

    # -- loops -----------------------------------------------------------------------------------
    async def records(self) -> None:
        """The dispatcher's records, in order, one at a time."""
        ring = self.from_dispatcher
        while not self.stopping:
            ring.clear_wakeup()
            blob = ring.read(1 << 20)
            if not blob:
                self.flush()
                await self.wake.wait()
                self.wake.clear()
                continue
            for kind, conn, aux, _, payload in C.iter_records(blob):
                if kind == C.STOP:
                    self.stopping = True
                    break
                handler = self.handlers.get(kind)
                if handler is None:
                    log.error("cluster: record kind %d has no handler", kind)
                    continue
                try:
                    await handler(conn, aux, payload)
                except Exception:
                    log.exception("cluster: record kind %d failed", kind)
            self.flush()

    async def timers(self) -> None:
        next_status = 0.0
        while not self.stopping:
            await asyncio.sleep(TICK)
            for part in self.parts:
                tick = getattr(part, "tick", None)
                if tick is not None:
                    try:
                        await tick()
                    except Exception:
                        log.exception("cluster: %s tick failed", type(part).__name__)
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + STATUS_EVERY
                await self.measure()
                self.send_status()
            self.flush()

    async def main(self) -> None:
        from ..cluster.jetstream import QueuesPart
        from ..cluster.topics import Topics
        loop = self.loop = asyncio.get_running_loop()
        loop.add_reader(self.from_dispatcher.data_fd, self.wake.set)
        self.add_part(Topics(self))
        self.add_part(QueuesPart(self))
        self.emit(C.BRIDGE_START)
        self.send_status()
        connecting = asyncio.create_task(self.connect())
        timers = asyncio.create_task(self.timers())
        await self.records()  # until STOP
        for part in self.parts:
            stop = getattr(part, "stop", None)
            if stop is not None:
                try:
                    await asyncio.wait_for(stop(), 2)
                except Exception:
                    pass
        connecting.cancel()
        timers.cancel()
        try:
            await asyncio.wait_for(self.nc.drain(), 2) if self.connected else await self.nc.close()
        except Exception:
            pass
        self.flush()


def run(config, resources) -> None:
    common.become_child("cluster", config)
    asyncio.run(Bridge(config, resources).main())
