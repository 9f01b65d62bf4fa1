"""Pipelined JetStream publishing for the bridge: many publishes in flight, each answered on its own.

Every publish goes out at once on the bridge's one connection with a reply subject of its own
under one inbox subscription; JetStream answers each with a PubAck (or an error) on it. Nothing
waits for one PubAck before sending the next, and no task or future is made per message: the
command is written raw and the PubAck read raw where the connection reads it (``fastpath.py``),
and its sender's token is handed to ``on_stored`` (the dispatcher then releases that sender's
receipt: a receipt still comes only after its PubAck).

A publish not answered within ``ATTEMPT`` seconds, or answered "no responders" / a temporary
error (no stream leader while one is elected), is sent again with the same ``Nats-Msg-Id``, so
JetStream stores it once; past its deadline it fails (``on_failed(token, reason, refused)``:
refused False = it may have been stored, True = refused, "full" = the destination holds
max_queue_messages). The sends keep the order the dispatcher gave; a retried one may land after
later ones (as with any retry).
"""

from __future__ import annotations

import itertools
import time

import orjson

from .fastpath import header_block, hpub

ATTEMPT = 2.0              # seconds one send waits for its PubAck before it is sent again
FIRST_RETRY = 0.05         # seconds before the first retry of a refused-for-now send; doubles up to MAX_RETRY
MAX_RETRY = 0.5
PER_SUBJECT_FULL = 10077   # JetStream's "store failed" code, with "maximum messages per subject exceeded"
TEMPORARY_CODES = (503, 500)
# 10008/10074: no stream leader for now; 10158: "duplicate message id is in process" (a copy with the
# same Nats-Msg-Id is being stored right now: asked again, the answer is the stored one)
TEMPORARY_ERR_CODES = (10008, 10074, 10158)


def classify(data: bytes) -> tuple[str, str]:
    """A PubAck's verdict: ("stored", ""), ("retry", why), ("full", why) or ("refused", why)."""
    if b'"error"' not in data:
        return "stored", ""
    try:
        error = orjson.loads(data)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "refused", data[:200].decode(errors="replace")
    code, err_code, text = error.get("code"), error.get("err_code"), error.get("description") or ""
    if err_code == PER_SUBJECT_FULL and "per subject" in text:
        return "full", text
    if code in TEMPORARY_CODES or err_code in TEMPORARY_ERR_CODES:
        return "retry", text
    return "refused", text or f"JetStream error {code}/{err_code}"


class Send:
    __slots__ = ("token", "subject", "headers", "payload", "deadline", "due", "delay", "sent")

    def __init__(self, token: int, subject: str, msg_id: str, payload: bytes, deadline: float):
        self.token = token
        self.subject = subject.encode()
        self.headers = header_block("Nats-Msg-Id", msg_id)
        self.payload = payload
        self.deadline = deadline    # monotonic: fail after this
        self.due = 0.0              # monotonic: send (again) at this time; 0 = waiting for its PubAck
        self.delay = FIRST_RETRY
        self.sent = 0.0             # monotonic: when it last went out


class Publisher:
    """One per connection: ``publish`` sends at once (or queues behind what waits), ``tick`` (the
    bridge's timer) retries and expires, ``resend`` after a reconnect."""

    def __init__(self, nc, fast, on_stored, on_failed):
        self.nc = nc
        self.fast = fast                # fastpath.FastPath of the connection
        self.on_stored = on_stored      # (token) -> None
        self.on_failed = on_failed      # (token, reason, refused) -> None
        self.prefix = b""
        self.sub = None
        self.ids = itertools.count(1)
        self.inflight: dict[bytes, Send] = {}  # reply subject -> send awaiting its PubAck
        self.later: list[Send] = []           # sends waiting to go (again): not ready, refused for now
        self.ready = False                    # the streams exist: sends go out
        self.stats = {"published": 0, "retried": 0, "failed": 0}

    async def start(self) -> None:
        if self.sub is None:
            inbox = self.nc.new_inbox() + "."
            self.sub = await self.nc.subscribe(inbox + "*", pending_bytes_limit=0, pending_msgs_limit=0)
            self.fast.route(self.sub, self._answered)
            self.prefix = inbox.encode()

    def pending(self) -> int:
        return len(self.inflight) + len(self.later)

    def publish(self, token: int, subject: str, msg_id: str, payload: bytes, deadline: float) -> None:
        send = Send(token, subject, msg_id, payload, deadline)
        if not self.ready or self.later or self.sub is None:  # (behind what waits, in order)
            self.later.append(send)
            return
        self._send(send)

    def _send(self, send: Send) -> None:
        if len(send.payload) + len(send.headers) > getattr(self.nc, "max_payload", 1 << 20):
            self._fail(send, f"larger than the NATS server's max_payload ({len(send.payload)} bytes)", True)
            return
        reply = self.prefix + b"%d" % next(self.ids)
        send.due = 0.0
        send.sent = time.monotonic()
        if not self.fast.send(hpub(send.subject, reply, send.headers, send.payload)):  # not connected now
            self._retry(send, send.sent)
            return
        self.inflight[reply] = send
        self.stats["published"] += 1

    def _answered(self, subject: bytes, reply: bytes, data: bytes, status: str) -> None:
        send = self.inflight.pop(subject, None)
        if send is None:
            return  # answered after it was sent again (the new send gets its own answer)
        if status:  # 503 no responders: no stream (leader) for the subject now
            self._retry(send, time.monotonic())
            return
        verdict, why = classify(data)
        if verdict == "stored":
            self.on_stored(send.token)
        elif verdict == "retry":
            self._retry(send, time.monotonic())
        elif verdict == "full":
            self._fail(send, why, "full")
        else:
            self._fail(send, why, True)

    def _retry(self, send: Send, now: float) -> None:
        send.due = now + send.delay
        send.delay = min(send.delay * 2, MAX_RETRY)
        self.stats["retried"] += 1
        self.later.append(send)

    def _fail(self, send: Send, why: str, refused) -> None:
        self.stats["failed"] += 1
        self.on_failed(send.token, why, refused)

    def tick(self, now: float) -> None:
        """Sends past their deadline fail; unanswered ones go again; the due ones go (in order)."""
        if self.inflight:
            old = []
            for reply, send in self.inflight.items():  # (oldest first)
                if now - send.sent < ATTEMPT and now <= send.deadline:
                    break
                old.append(reply)
            for reply in old:
                send = self.inflight.pop(reply)
                if now > send.deadline:
                    self._fail(send, "JetStream did not store it in time", False)
                else:
                    self.stats["retried"] += 1
                    self.later.append(send)   # unanswered: the request or its PubAck was lost
        if not self.later:
            return
        waiting, self.later = self.later, []
        for send in waiting:
            if now > send.deadline:
                self._fail(send, "JetStream did not store it in time", False)
            elif not self.ready or self.sub is None or not self.nc.is_connected or send.due > now:
                self.later.append(send)
            else:
                self._send(send)

    def resend(self) -> None:
        """A new connection: what had no PubAck goes again (JetStream drops the copies it has)."""
        waiting = list(self.inflight.values())
        self.inflight.clear()
        self.later[:0] = waiting
        self.tick(time.monotonic())
