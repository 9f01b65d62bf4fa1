"""Operators' actions in cluster mode, the dispatcher's side (broker/manage.py, cluster/backplane.py,
cluster/queuing.py): their results come later, from the bridge (a ``Later``), driven through the
real Broker with the in-memory JetStream stand-in of test_cluster_queuing."""

from __future__ import annotations

from stompbroker.broker import manage
from stompbroker.broker.model import Later

from test_cluster_queuing import FakeJetStream


def test_a_later_gives_its_outcome_once_whenever_it_is_asked_for():
    seen = []
    later = Later(value=3)
    later.when_done(lambda *outcome: seen.append(outcome))
    later.finish()
    later.fail(503, "too late")               # (decided already: nothing more)
    assert seen == [(None, 3)]
    early = Later()
    early.fail(409, "full")
    early.when_done(lambda *outcome: seen.append(outcome))
    assert seen[-1] == (409, "full")


def test_a_published_queue_message_is_answered_once_jetstream_stored_it():
    js = FakeJetStream()
    a = js.join()
    later = a.broker.manage(manage.publish, "/queue/q", {"h": "v"}, b"body", now=a.now)
    assert isinstance(later, Later) and later.outcome is None   # nothing before JetStream stored it
    js.run()
    assert later.outcome == (None, 0) and js.depth() == 1
    assert a.broker.backplane.waiting == {}


def test_a_publish_jetstream_cannot_store_fails_503_and_one_it_never_answers_too():
    js = FakeJetStream()
    js.fail = True
    a = js.join(cluster_timeout_ms=2000)
    later = a.broker.manage(manage.publish, "/queue/q", {}, b"x", now=a.now)
    js.run()
    assert later.outcome[0] == 503 and later.outcome[1].startswith("cluster unavailable")
    js.fail, js.silent = False, True
    later = a.broker.manage(manage.publish, "/queue/q", {}, b"x", now=a.now)
    js.run()
    a.tick(1.0)
    assert later.outcome is None
    a.tick(4.0)
    assert later.outcome[0] == 503


def test_a_message_nothing_keeps_is_answered_at_once_and_a_non_persistent_one_too():
    js = FakeJetStream()
    a = js.join()
    assert a.broker.manage(manage.publish, "/topic/news", {}, b"x", now=a.now) == 0   # no durable, no remote interest
    assert a.broker.manage(manage.publish, "/queue/q", {"persistent": "false"}, b"x", now=a.now) == 0
