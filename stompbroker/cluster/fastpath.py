"""The bridge's queue hot path on its nats-py connection: raw messages in, raw commands out.

nats-py turns every message it reads into a ``Msg`` (its headers parsed into a dict, its subject
and reply decoded) and builds every publish through checks and a header encoder: for JetStream
messages that carry a ``Nats-Msg-Id`` that is most of the bridge's CPU per message. For its own
subscriptions (the PubAck inbox, the pull inboxes) the bridge takes the parser's raw fields
instead, and writes its publishes, pull requests and acks as ready-made protocol commands into
the connection's outgoing buffer, which nats-py's flusher writes (one write per turn of the loop).

This leans on three nats-py internals: ``Client._process_msg(sid, subject, reply, data, headers)``
(what the parser calls for each MSG/HMSG), and ``Client._pending`` / ``_pending_data_size`` /
``_flush_queue`` (the outgoing buffer and the flusher's wake-up), which ``Client.publish`` itself
uses. Where they are missing (another nats-py) it falls back to subscription callbacks and
``Client.publish``: slower, the same behaviour. ``tests/integration/test_cluster_jetstream.py``
runs both.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("stompbroker.cluster")

NATS_HDR = b"NATS/1.0"
# Under load the flusher is woken at most this often: one socket write carries the acks, pull
# requests and publishes of several turns of the loop (an idle connection writes at once).
COALESCE = 0.0005


def status_of(headers) -> str:
    """The inline status of a raw header block (``NATS/1.0 503\\r\\n...``: "503"), "" for none."""
    if not headers or len(headers) < 12 or headers[8:9] != b" ":
        return ""
    return headers[9:12].decode(errors="replace")


def header_block(name: str, value: str) -> bytes:
    return b"NATS/1.0\r\n%s: %s\r\n\r\n" % (name.encode(), value.replace("\r", " ").replace("\n", " ").encode())


class Inline:
    """Stands in for a nats-py subscription's pending queue: each message is handled as the
    connection reads it (no task, no queue)."""

    def __init__(self, handler):
        self.put_nowait = handler

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def task_done(self) -> None:
        pass

    async def join(self) -> None:
        pass

    async def get(self):
        await asyncio.Future()  # never: messages do not wait here


class FastPath:
    """One per connection. ``route(sub, handler)``: the subscription's messages go to
    ``handler(subject: bytes, reply: bytes, data: bytes, status: str)`` as read. ``send(command)``
    queues a protocol command (``pub``/``hpub``); False when it cannot go now (not connected)."""

    def __init__(self, nc):
        self.nc = nc
        self.last_kick = 0.0
        self.kick_due = False
        self.loop = None   # (asyncio.get_running_loop() asks the kernel for the pid each time)
        self.handlers: dict[int, object] = {}
        self.raw_in = False
        self.raw_out = all(hasattr(nc, a) for a in ("_pending", "_pending_data_size", "_flush_queue"))
        original = getattr(nc, "_process_msg", None)
        if original is not None and not getattr(original, "fastpath", False):
            handlers = self.handlers

            async def process_msg(sid, subject, reply, data, headers):
                handler = handlers.get(sid)
                if handler is None:
                    return await original(sid, subject, reply, data, headers)
                handler(subject, reply, data, status_of(headers) if headers else "")

            process_msg.fastpath = True
            process_msg.handlers = handlers
            nc._process_msg = process_msg
            self.raw_in = True
        elif original is not None:
            self.handlers = original.handlers  # (a second FastPath on the same connection shares the table)
            self.raw_in = True

    def route(self, sub, handler) -> None:
        sid = getattr(sub, "_id", None)
        if self.raw_in and sid is not None:
            self.handlers[sid] = handler
            return

        def adapt(msg):  # the slow way: nats-py's Msg, headers parsed
            status = (msg.headers or {}).get("Status", "") if msg.headers else ""
            handler(msg.subject.encode(), (msg.reply or "").encode(), msg.data, status)

        sub._pending_queue = Inline(adapt)

    def unroute(self, sub) -> None:
        self.handlers.pop(getattr(sub, "_id", None), None)

    # -- out ---------------------------------------------------------------------------------------
    def send(self, command: bytes) -> bool:
        nc = self.nc
        if not nc.is_connected:
            return False
        if not self.raw_out:
            asyncio.get_running_loop().create_task(self._publish_parsed(command))
            return True
        nc._pending.append(command)
        nc._pending_data_size += len(command)
        if not self.kick_due:
            loop = self.loop or self._loop()
            wait = self.last_kick + COALESCE - loop.time()
            if wait > 0:
                self.kick_due = True
                loop.call_later(wait, self._kick)
            else:
                self._kick()
        return True

    def _kick(self) -> None:
        """Wake nats-py's flusher (it writes everything pending)."""
        self.kick_due = False
        loop = self.loop or self._loop()
        self.last_kick = loop.time()
        queue = self.nc._flush_queue
        if queue is not None and queue.empty():
            try:
                queue.put_nowait(loop.create_future())
            except asyncio.QueueFull:
                pass

    def _loop(self):
        self.loop = asyncio.get_running_loop()
        return self.loop

    async def _publish_parsed(self, commands: bytes) -> None:
        """Without the internals: the commands (one or more) taken apart again and published the
        public way."""
        rest = commands
        while rest:
            line, _, rest = rest.partition(b"\r\n")
            parts = line.decode().split(" ")
            try:
                if parts[0] == "HPUB":
                    hdr_len, total = int(parts[-2]), int(parts[-1])
                    block, data, rest = rest[:hdr_len], rest[hdr_len:total], rest[total + 2:]
                    headers = dict(h.split(": ", 1) for h in block.decode().split("\r\n")[1:] if ": " in h)
                    await self.nc.publish(parts[1], data, reply=parts[2] if len(parts) == 5 else "", headers=headers)
                else:
                    size = int(parts[-1])
                    data, rest = rest[:size], rest[size + 2:]
                    await self.nc.publish(parts[1], data, reply=parts[2] if len(parts) == 4 else "")
            except Exception as exc:
                log.info("cluster: publish failed: %r", exc)


def pub(subject: bytes, reply: bytes, data: bytes) -> bytes:
    if reply:
        return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(data), data)
    return b"PUB %s %d\r\n%s\r\n" % (subject, len(data), data)


def hpub(subject: bytes, reply: bytes, headers: bytes, data: bytes) -> bytes:
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject, reply, len(headers), len(headers) + len(data), headers, data)
