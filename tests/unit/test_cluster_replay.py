"""cluster/jetstream.replay against a stand-in JetStream context. The end of a replay is asked of
the stream's leader, not of the consumer: a new consumer of a replicated stream answers 503 until
its own leader is elected (seen on a fresh CI machine), and one placed on a replica still applying
a leader change said nothing was pending and sent nothing for a second (seen in CI under load);
replay waits for both instead of ending the SUBSCRIBE's replay-from short."""

import asyncio
import datetime
import time as real_time
from types import SimpleNamespace

import nats.errors
import nats.js.errors
import pytest

from stompbroker.cluster import jetstream as J


class Sub:
    def __init__(self, answers):
        self.answers = list(answers)

    async def fetch(self, n, timeout):
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def unsubscribe(self):
        pass


class Js:
    def __init__(self, answers, last_seq=2, last_age_s=0.0, electing=()):
        self.sub = Sub(answers)
        self.electing = list(electing)   # what get_msg does first: raise, or "hang"
        self.deleted = []
        self.consumers = 0
        self.last = None if last_seq is None else SimpleNamespace(
            seq=last_seq, time=datetime.datetime.fromtimestamp(real_time.time() - last_age_s, datetime.timezone.utc))

    async def get_msg(self, stream, subject):
        if self.electing:
            first = self.electing.pop(0)
            if first == "hang":
                await asyncio.sleep(30)
            raise first
        if self.last is None:
            raise nats.js.errors.NotFoundError()
        return self.last

    async def add_consumer(self, stream, config):
        self.consumers += 1
        return SimpleNamespace(name="c1", num_pending=0)

    async def pull_subscribe_bind(self, consumer, stream):
        return self.sub

    async def delete_consumer(self, stream, name):
        self.deleted.append(name)


def msg(data, seq):
    return SimpleNamespace(data=data, metadata=SimpleNamespace(sequence=SimpleNamespace(stream=seq)))


def read(js):
    async def main():
        return [m.data async for m in J.replay(js, "S", ["s.>"], real_time.time() - 60)]
    return asyncio.run(main())


def test_replay_waits_out_a_consumer_that_is_not_ready_yet():
    unavailable = nats.js.errors.ServiceUnavailableError()
    js = Js([unavailable, unavailable, [msg(b"a", 1), msg(b"b", 2)]])
    assert read(js) == [b"a", b"b"]
    assert js.deleted == ["c1"]


def test_replay_asks_again_a_stream_whose_leader_is_being_elected():
    js = Js([[msg(b"a", 1), msg(b"b", 2)]], electing=[nats.js.errors.ServiceUnavailableError(), "hang"])
    began = real_time.monotonic()
    assert read(js) == [b"a", b"b"]
    assert 1.0 <= real_time.monotonic() - began < 5


def test_replay_reads_on_to_the_end_its_stream_leader_named():
    silent = nats.errors.TimeoutError()
    js = Js([silent, [msg(b"a", 3)], silent, [msg(b"b", 5), msg(b"after the end", 6)]], last_seq=5)
    assert read(js) == [b"a", b"b"]
    assert js.deleted == ["c1"]


def test_a_replay_of_a_stream_with_nothing_since_its_start_makes_no_consumer():
    assert read(Js([], last_seq=None)) == []             # nothing on its subjects at all
    js = Js([], last_seq=7, last_age_s=3600)             # the last one is older than the start
    assert read(js) == [] and js.consumers == 0


def test_replay_gives_up_on_a_consumer_that_never_sends(monkeypatch):
    clock = iter([0.0, 1.0, 100.0, 0.0, 100.0, 200.0])  # (its own clock only: the event loop keeps the real one)
    monkeypatch.setattr(J, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    js = Js([[msg(b"a", 1)], nats.errors.TimeoutError(), nats.errors.TimeoutError()])
    assert read(js) == [b"a"]
    assert js.deleted == ["c1"]
    js = Js([nats.js.errors.ServiceUnavailableError()] * 3)
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        read(js)
    assert js.deleted == ["c1"]
