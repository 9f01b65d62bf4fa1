"""cluster/jetstream.QueueBridge._take, the pulls of an operator's purge, move and delete, against a
stand-in NATS connection and JetStream context: a pull of a consumer made a moment before may find
"no messages" (404) while the stream holds the queue's messages; it is asked again, not taken as
the end (CI saw a move answer {"moved": 0} for a queue of 20)."""

import asyncio
import time
from types import SimpleNamespace

from stompbroker.cluster import jetstream as J


class Sub:
    def __init__(self, nc):
        self.nc = nc

    async def next_msg(self, timeout):
        if not self.nc.inbox:
            raise J.nats.errors.TimeoutError()
        return self.nc.inbox.pop(0)

    async def unsubscribe(self):
        pass


class Nc:
    """Each pull answers with the next of ``answers``: a list of stream sequences (then a 404), or
    "404" alone."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.inbox, self.pulls, self.naks = [], 0, []

    def new_inbox(self):
        return "_INBOX.x"

    async def subscribe(self, subject):
        return Sub(self)

    async def publish(self, subject, data, reply=""):
        if data == b"-NAK":
            self.naks.append(subject)
            return
        self.pulls += 1
        answer = self.answers.pop(0) if self.answers else "404"
        for seq in ([] if answer == "404" else answer):
            self.inbox.append(SimpleNamespace(headers=None, data=b"m%d" % seq,
                                              reply=f"$JS.ACK.S.c.1.{seq}.{seq}.0.0"))
        self.inbox.append(SimpleNamespace(headers={"Status": "404"}, data=b"", reply=""))


class Js:
    def __init__(self, stored, ack_pending=0):
        self.stored, self.ack_pending = stored, ack_pending

    async def stream_info(self, stream, subjects_filter=None):
        counts = {"s.q": self.stored} if self.stored and subjects_filter == "s.q" else {}   # (as JetStream)
        return SimpleNamespace(state=SimpleNamespace(subjects=counts))

    async def consumer_info(self, stream, consumer):
        return SimpleNamespace(num_ack_pending=self.ack_pending)


def take(nc, js, subject="s.q", seconds=2.0):
    bridge = object.__new__(J.QueueBridge)
    bridge.nc, bridge.js = nc, js
    got = []

    async def each(msg):
        got.append(msg.data)
        js.stored -= 1
        js.ack_pending += 1
    cut = asyncio.run(bridge._take("S", "c", 100, 50, time.monotonic() + seconds, each, subject))
    return got, cut


def test_a_pull_that_finds_nothing_while_the_stream_holds_the_queues_messages_is_asked_again():
    nc = Nc(["404", "404", [1, 2, 3]])
    got, cut = take(nc, Js(stored=3))
    assert got == [b"m1", b"m2", b"m3"] and not cut and nc.pulls >= 3


def test_nothing_there_or_all_held_by_nodes_ends_at_once():
    for js in (Js(stored=0), Js(stored=4, ack_pending=4)):
        nc = Nc(["404"])
        started = time.monotonic()
        got, cut = take(nc, js)
        assert (got, cut, nc.pulls) == ([], False, 1) and time.monotonic() - started < 0.5


def test_a_consumer_that_never_catches_up_is_cut_short_at_the_actions_bound():
    nc = Nc([])
    got, cut = take(nc, Js(stored=2), seconds=0.6)
    assert got == [] and cut
