"""cluster/jetstream.replay against a stand-in JetStream context: a new consumer of a replicated
stream answers 503 until its own leader is elected (seen on a fresh CI machine), and replay waits
for it instead of failing the SUBSCRIBE's replay-from."""

import asyncio
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
    def __init__(self, answers):
        self.sub = Sub(answers)
        self.deleted = []

    async def add_consumer(self, stream, config):
        return SimpleNamespace(name="c1", num_pending=2)

    async def pull_subscribe_bind(self, consumer, stream):
        return self.sub

    async def delete_consumer(self, stream, name):
        self.deleted.append(name)


def msg(data, pending):
    return SimpleNamespace(data=data, metadata=SimpleNamespace(num_pending=pending))


def read(js):
    async def main():
        return [m.data async for m in J.replay(js, "S", ["s.>"], 0)]
    return asyncio.run(main())


def test_replay_waits_out_a_consumer_that_is_not_ready_yet():
    unavailable = nats.js.errors.ServiceUnavailableError()
    js = Js([unavailable, unavailable, [msg(b"a", 1), msg(b"b", 0)]])
    assert read(js) == [b"a", b"b"]
    assert js.deleted == ["c1"]


def test_replay_ends_on_silence_and_gives_up_on_a_consumer_that_never_answers(monkeypatch):
    assert read(Js([nats.errors.TimeoutError()])) == []
    clock = iter([0.0, 100.0, 200.0])   # (its own clock only: the event loop keeps the real one)
    monkeypatch.setattr(J, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    js = Js([nats.js.errors.ServiceUnavailableError()] * 3)
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        read(js)
    assert js.deleted == ["c1"]
