"""Scheduled delivery in the pure broker: AMQ_SCHEDULED_* and x-delay, the jobs' heap and the
broker's one timer, expiry from delivery, transactions, limits, bad values, browsing and
ActiveMQ.Scheduler.Management."""

from __future__ import annotations

import pytest

from broker_harness import Rig
from stompbroker.broker.schedule import Cron


def send(r: Rig, destination: str = "/queue/s", body: bytes = b"x", conn: int = 1, **headers) -> None:
    """(a dict for the header names with _, which the harness would turn into -)"""
    r.frame(conn, "SEND", headers, destination=destination, body=body)


def advance(r: Rig, seconds: float) -> None:
    """Time passes; the dispatcher calls on_timers when the broker's next timer comes."""
    r.now += seconds
    r.wall += seconds
    due = r.broker.next_timer()
    while due is not None and due <= r.wall * 1000 and r.broker.on_timers(r.now):
        due = r.broker.next_timer()


def rig(**settings) -> Rig:
    r = Rig(**settings)
    r.connect(1)
    r.connect(2)
    return r


def test_a_delayed_message_comes_at_its_time_with_the_job_id_and_not_before():
    r = rig()
    r.subscribe(2, "/queue/s")
    assert r.broker.next_timer() is None  # nothing scheduled: no timer at all
    send(r, AMQ_SCHEDULED_DELAY="2000", receipt="r")
    assert r.commands(1) == ["RECEIPT"] and r.frames(2) == []
    assert r.broker.next_timer() == r.wall * 1000 + 2000
    advance(r, 1.9)
    assert r.frames(2) == []
    advance(r, 0.2)
    (m,) = r.messages(2)
    assert m["scheduled-job-id"] == m["scheduledJobId"] and "AMQ_SCHEDULED_DELAY" not in m.headers
    assert r.broker.next_timer() is None and len(r.broker.jobs) == 0


def test_x_delay_and_scheduled_time_and_time_wins_over_delay():
    r = rig()
    r.subscribe(2, "/queue/s")
    send(r, body=b"rabbit", **{"x-delay": "1000"})
    send(r, body=b"at", AMQ_SCHEDULED_TIME=str(int(r.wall * 1000) + 3000), AMQ_SCHEDULED_DELAY="500")
    advance(r, 1.0)
    assert r.bodies(2) == [b"rabbit"]
    advance(r, 1.5)
    assert r.bodies(2) == []
    advance(r, 0.5)
    assert r.bodies(2) == [b"at"]


def test_repeat_and_period_each_firing_a_new_message():
    r = rig()
    r.subscribe(2, "/topic/t")
    send(r, "/topic/t", AMQ_SCHEDULED_DELAY="500", AMQ_SCHEDULED_PERIOD="1000", AMQ_SCHEDULED_REPEAT="2")
    got = []
    for _ in range(6):
        advance(r, 0.5)
        got.append(len(r.messages(2)))
    assert got == [1, 0, 1, 0, 1, 0]
    assert len(r.broker.jobs) == 0


def test_a_repeat_without_a_delay_starts_after_one_period():
    r = rig()
    r.subscribe(2, "/queue/s")
    send(r, AMQ_SCHEDULED_PERIOD="1000", AMQ_SCHEDULED_REPEAT="1")
    advance(r, 0.9)
    assert r.bodies(2) == []
    advance(r, 0.2)
    assert r.bodies(2) == [b"x"]
    advance(r, 1.0)
    assert r.bodies(2) == [b"x"]


def test_cron_fires_at_each_matching_minute():
    r = rig()
    r.wall = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    r.subscribe(2, "/queue/s")
    send(r, AMQ_SCHEDULED_CRON="*/5 * * * *")
    assert r.broker.next_timer() == (r.wall + 300) * 1000
    advance(r, 299)
    assert r.bodies(2) == []
    advance(r, 1)
    assert r.bodies(2) == [b"x"]
    advance(r, 300)
    assert r.bodies(2) == [b"x"]
    assert len(r.broker.jobs) == 1  # for ever, until cancelled


@pytest.mark.parametrize("text, after, expected", [
    ("0 12 * * *", "2027-01-15T08:00", "2027-01-15T12:00"),
    ("30 8 1 * *", "2027-01-15T08:00", "2027-02-01T08:30"),
    ("0 0 * * 0", "2027-01-15T08:00", "2027-01-17T00:00"),       # Sunday
    ("0 0 13 * 5", "2027-01-15T08:00", "2027-01-22T00:00"),      # day 13 or a Friday
    ("15,45 9-10 * 2 *", "2027-01-15T08:00", "2027-02-01T09:15"),
    ("0 0 29 2 *", "2027-01-15T08:00", "2028-02-29T00:00"),      # the next leap day
])
def test_cron_next_times(text, after, expected):
    from datetime import datetime, timezone
    ms = lambda s: datetime.fromisoformat(s).replace(tzinfo=timezone.utc).timestamp() * 1000  # noqa: E731
    assert Cron(text).next_after(ms(after)) == ms(expected)


@pytest.mark.parametrize("headers, message", [
    ({"AMQ_SCHEDULED_DELAY": "-5"}, "invalid AMQ_SCHEDULED_DELAY"),
    ({"AMQ_SCHEDULED_DELAY": "soon"}, "invalid AMQ_SCHEDULED_DELAY"),
    ({"x-delay": "1.5"}, "invalid x-delay"),
    ({"AMQ_SCHEDULED_PERIOD": "-1"}, "invalid AMQ_SCHEDULED_PERIOD"),
    ({"AMQ_SCHEDULED_REPEAT": "1001", "AMQ_SCHEDULED_PERIOD": "10"}, "invalid AMQ_SCHEDULED_REPEAT"),
    ({"AMQ_SCHEDULED_REPEAT": "-1"}, "invalid AMQ_SCHEDULED_REPEAT"),
    ({"AMQ_SCHEDULED_CRON": "61 * * * *"}, "invalid AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": "* * *"}, "invalid AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": "0 0 30 2 *"}, "invalid AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_TIME": "tomorrow"}, "invalid AMQ_SCHEDULED_TIME"),
])
def test_bad_values_are_an_error_with_the_receipt_id(headers, message):
    r = rig()
    send(r, receipt="bad", **headers)
    error = r.error(1)
    assert error["message"] == message and error["receipt-id"] == "bad"
    assert len(r.broker.jobs) == 0


def test_zero_delay_and_a_classic_job_id_deliver_at_once():
    r = rig()
    r.subscribe(2, "/queue/s")
    send(r, body=b"zero", AMQ_SCHEDULED_DELAY="0")
    send(r, body=b"copy", AMQ_SCHEDULED_DELAY="5000", scheduledJobId="x-1")
    assert r.bodies(2) == [b"zero", b"copy"] and len(r.broker.jobs) == 0


def test_limits_per_broker_and_per_destination():
    r = rig(max_scheduled_messages=3, max_scheduled_per_destination=2)
    for _ in range(2):
        send(r, "/queue/a", AMQ_SCHEDULED_DELAY="1000")
    send(r, "/queue/a", AMQ_SCHEDULED_DELAY="1000", receipt="a3")
    error = r.error(1)
    assert error["message"] == "too many scheduled messages" and "max_scheduled_per_destination" in error.body.decode()
    r.connect(3)
    send(r, "/queue/b", AMQ_SCHEDULED_DELAY="1000", conn=3)
    send(r, "/queue/c", AMQ_SCHEDULED_DELAY="1000", conn=3, receipt="c")
    assert "max_scheduled_messages" in r.error(3).body.decode()


def test_scheduled_at_commit_and_dropped_at_abort():
    r = rig()
    r.subscribe(2, "/queue/s")
    r.frame(1, "BEGIN", transaction="t")
    send(r, body=b"committed", AMQ_SCHEDULED_DELAY="1000", transaction="t")
    advance(r, 5)  # the clock runs from the COMMIT, not the SEND
    assert len(r.broker.jobs) == 0
    r.frame(1, "COMMIT", transaction="t")
    r.frame(1, "BEGIN", transaction="u")
    send(r, body=b"aborted", AMQ_SCHEDULED_DELAY="1000", transaction="u")
    r.frame(1, "ABORT", transaction="u")
    assert len(r.broker.jobs) == 1
    advance(r, 1)
    assert r.bodies(2) == [b"committed"]


def test_expiry_counts_from_delivery():
    r = rig()
    send(r, body=b"fresh", AMQ_SCHEDULED_DELAY="10000", expiration="3000")
    send(r, body=b"stale", AMQ_SCHEDULED_DELAY="1000", expires=str(int(r.wall * 1000) + 2000))
    advance(r, 1)
    advance(r, 9)  # both have fired: "stale" 9 s ago with 2 s to live, "fresh" now with 3 s
    r.subscribe(2, "/queue/s")
    assert r.bodies(2) == [b"fresh"]


def test_scheduled_messages_keep_priority_and_groups():
    r = rig()
    send(r, body=b"low", AMQ_SCHEDULED_DELAY="1000", priority="1")
    send(r, body=b"high", AMQ_SCHEDULED_DELAY="1000", priority="9")
    advance(r, 1)
    r.subscribe(2, "/queue/s")
    got = r.messages(2)
    assert [m.body for m in got] == [b"high", b"low"] and got[0]["priority"] == "9"


def test_browsing_a_queue_shows_its_scheduled_messages_flagged():
    r = rig()
    send(r, body=b"now")
    send(r, body=b"later", AMQ_SCHEDULED_DELAY="60000")
    r.subscribe(2, "/queue/s", browser="true")
    got = r.messages(2)
    assert [m.body for m in got] == [b"now", b"later", b""]
    assert "scheduled" not in got[0].headers and got[1]["scheduled"] == "true"
    assert int(got[1]["scheduled-time"]) == int(r.wall * 1000) + 60000


def management(r: Rig, conn: int = 1, **headers) -> None:
    r.frame(conn, "SEND", headers, destination="/topic/ActiveMQ.Scheduler.Management")


def test_scheduler_management_browse_remove_and_remove_all():
    r = rig()
    send(r, "/queue/a", body=b"a1", AMQ_SCHEDULED_DELAY="1000")
    send(r, "/queue/a", body=b"a2", AMQ_SCHEDULED_DELAY="2000")
    send(r, "/queue/b", body=b"b1", AMQ_SCHEDULED_DELAY="3000")
    management(r, 2, AMQ_SCHEDULER_ACTION="BROWSE", **{"reply-to": "/temp-queue/jobs"})
    got = r.messages(2)
    assert [m.body for m in got] == [b"a1", b"a2", b"b1", b""]
    assert [m.headers.get("original-destination") for m in got[:3]] == ["/queue/a", "/queue/a", "/queue/b"]
    assert got[3]["browser"] == "end" and all(m["destination"] == "/temp-queue/jobs" for m in got)
    management(r, 2, AMQ_SCHEDULER_ACTION="REMOVE", scheduledJobId=got[0]["scheduledJobId"])
    management(r, 2, AMQ_SCHEDULER_ACTION="REMOVEALL", **{"original-destination": "/queue/b"})
    assert [j.body for j in r.broker.jobs.of()] == [b"a2"]
    management(r, 2, AMQ_SCHEDULER_ACTION="REMOVEALL")
    assert len(r.broker.jobs) == 0 and r.broker.next_timer() is None
    r.subscribe(2, "/queue/a", sub_id="a")
    advance(r, 5)
    assert r.frames(2) == []  # nothing cancelled fires
    management(r, 2, AMQ_SCHEDULER_ACTION="EXPLODE", receipt="x")
    assert r.error(2)["message"] == "invalid AMQ_SCHEDULER_ACTION"


def test_many_jobs_one_heap_fired_in_batches_in_time_order():
    r = rig(scheduled_batch=100)
    r.subscribe(2, "/queue/s")
    for i in range(1000):
        send(r, body=str(i).encode(), AMQ_SCHEDULED_DELAY=str(1000 + (i * 7919) % 1000))
    assert r.broker.next_timer() == r.wall * 1000 + 1000
    advance(r, 2)
    got = [int(b) for b in r.bodies(2)]
    assert sorted(got) == list(range(1000))
    assert [1000 + (i * 7919) % 1000 for i in got] == sorted(1000 + (i * 7919) % 1000 for i in got)


def test_cluster_mode_refuses_scheduling():
    from stompbroker.cluster.backplane import Backplane
    r = Rig(cluster="nats://127.0.0.1:4222", node_id="n0")
    r.broker.backplane = Backplane(r.config)
    r.connect(1)
    send(r, "/topic/t", AMQ_SCHEDULED_DELAY="1000", receipt="r")
    error = r.error(1)
    assert error["message"] == "scheduled delivery not supported in cluster mode" and error["receipt-id"] == "r"


def test_firings_stop_at_a_full_outbox_and_the_rest_follow_in_order():
    r = rig()
    r.connect(3)
    r.subscribe(2, "/topic/t")
    r.subscribe(3, "/topic/t")  # (two: a fan-out stopped after the first leaves a step unfinished)
    for i in range(50):
        send(r, "/topic/t", body=str(i).encode() * 1000, AMQ_SCHEDULED_DELAY="1000")
    r.outboxes[0].limit = 20_000
    r.now += 1
    r.wall += 1
    fired = r.broker.on_timers(r.now)
    # A job leaves only with its message published (in the same store commit), never before it:
    assert 0 < fired < 50 and len(r.broker.jobs) == 50 - fired
    got = []
    for _ in range(200):  # the dispatcher: drain, resume what is unfinished, then the timers again
        got += r.bodies(2)
        if r.broker.unfinished:
            r.broker.resume()
        elif not r.broker.on_timers(r.now):
            break
    got += r.bodies(2)
    assert got == [str(i).encode() * 1000 for i in range(50)]
    assert r.bodies(3) == got
    assert len(r.broker.jobs) == 0


def test_unreadable_stored_jobs_are_dropped_not_a_crash_at_start():
    from stompbroker.broker import scheduling

    class Store:
        dropped = []

        def load_jobs(self):
            good = b'{"AMQ_SCHEDULED_DELAY": "1000"}'
            yield "ok", "/queue/s", good, b"x", b'{"due": 1800000001000, "left": 1, "base": 0, "ttl": 0}'
            yield "bad-json", "/queue/s", b"{", b"x", b"{}"
            yield "no-due", "/queue/s", good, b"x", b'{"left": 1}'
            yield "not-a-dict", "/queue/s", b"[1]", b"x", b"[]"
            yield "bad-value", "/queue/s", b'{"AMQ_SCHEDULED_DELAY": "-1"}', b"x", b'{"due": 1, "left": 1}'

        def drop_job(self, job_id):
            self.dropped.append(job_id)

    r = rig()
    store = Store()
    assert scheduling.load(r.broker, store) == 1
    assert store.dropped == ["bad-json", "no-due", "not-a-dict", "bad-value"]
    assert [j.id for j in r.broker.jobs.of()] == ["ok"] and r.broker.next_timer() == 1_800_000_001_000


def test_a_job_whose_delivery_fails_is_dropped_and_the_others_go(monkeypatch, caplog):
    from stompbroker.broker import scheduling
    r = rig()
    r.subscribe(2, "/queue/s")
    send(r, body=b"bad", AMQ_SCHEDULED_DELAY="1000")
    send(r, body=b"good", AMQ_SCHEDULED_DELAY="1000")
    real = scheduling.firing

    def firing(b, job):
        if job.body == b"bad":
            raise RuntimeError("a bug")
        return real(b, job)

    monkeypatch.setattr(scheduling, "firing", firing)
    advance(r, 1)
    assert r.bodies(2) == [b"good"] and len(r.broker.jobs) == 0
    assert "dropped: delivering it failed" in caplog.text
