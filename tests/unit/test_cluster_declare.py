"""cluster/jetstream.declare_consumer against a stand-in JetStream context: a consumer whose leader
is being elected answers nothing (CI saw a consumer made a moment before go unanswered for 15 s on a
loaded machine), and the requests that change nothing if made twice are made again."""

import asyncio
from types import SimpleNamespace

import nats.errors
import nats.js.errors
import pytest

from stompbroker.cluster import jetstream as J


class Js:
    def __init__(self, info_answers, add_answers):
        self.info_answers, self.add_answers = list(info_answers), list(add_answers)
        self.asked = []

    async def _answer(self, answers, what):
        self.asked.append(what)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def consumer_info(self, stream, name):
        return await self._answer(self.info_answers, "info")

    async def add_consumer(self, stream, config):
        return await self._answer(self.add_answers, "add")


def declare(js):
    asyncio.run(J.declare_consumer(js, "S", "c1", "s.q.a", 30.0))


def test_an_unanswered_consumer_info_and_add_are_asked_again():
    js = Js([nats.errors.TimeoutError(), nats.js.errors.NotFoundError()],
            [nats.js.errors.ServiceUnavailableError(), SimpleNamespace(name="c1")])
    declare(js)
    assert js.asked == ["info", "info", "add", "add"]


def test_one_already_there_as_asked_is_kept_after_a_silence():
    there = SimpleNamespace(config=SimpleNamespace(filter_subjects=None, filter_subject="s.q.a"))
    js = Js([nats.errors.TimeoutError(), there], [])
    declare(js)
    assert js.asked == ["info", "info"]


def test_a_consumer_that_never_answers_fails_after_three_tries():
    js = Js([nats.errors.TimeoutError()] * 3, [])
    with pytest.raises(nats.errors.TimeoutError):
        declare(js)
    assert js.asked == ["info"] * 3
