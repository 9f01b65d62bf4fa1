"""Virtual hosts (broker/vhosts.py) on a Broker driven directly: CONNECT's host picks one; each has
its own queues, topics, wildcards, durable subscriptions and dead-letter queue; one vhost alone
changes nothing."""

from __future__ import annotations

import pytest

from stompbroker.broker import manage, vhosts
from stompbroker.security.acl import PasswdError, parse_acl, parse_inline

from broker_harness import Rig


def join(rig: Rig, conn: int, host: str | None, **headers):
    rig.open(conn)
    if host is not None:
        headers["host"] = host
    rig.frame(conn, "CONNECT", accept_version="1.2", **headers)
    return rig.frames(conn)


@pytest.mark.parametrize("vhost, destination, inner", [
    ("eu", "/queue/jobs", "/queue/\x1eeu\x1ejobs"),
    ("eu", "#work", "#\x1eeu\x1ework"),
    ("eu", "/topic/a", "\x1eeu\x1e/topic/a"),
    ("eu", "/queue/*", "/queue/\x1eeu\x1e*"),
    ("eu", "/temp-queue/r", "/temp-queue/r"),       # broker-wide names stay
    ("eu", "/reply-queue/x-1", "/reply-queue/x-1"),
    ("eu", "/queue/monitor", "/queue/monitor"),
    ("/", "/queue/jobs", "/queue/jobs"),
    ("", "/topic/a", "/topic/a"),
])
def test_names_inside_a_vhost(vhost, destination, inner):
    assert vhosts.inside(vhost, destination) == inner
    assert vhosts.visible(inner) == destination
    assert vhosts.split(inner) == ((vhost or "/") if inner != destination else "/", destination)


def test_one_vhost_looks_at_no_host_header():
    rig = Rig()
    assert join(rig, 1, "anything.example")[0].command == "CONNECTED"
    rig.subscribe(1, "*", sub_id="all")
    rig.send(1, "/queue/a\x1eb", b"x")  # (the mark is an ordinary character then, wildcards reach it)
    rig.send(1, "/topic/a\x1eb", b"y")
    rig.send(1, "/topic/\x1eeu\x1eb", b"z")  # (what a vhost's name looks like inside: not here)
    got = rig.messages(1)
    assert sorted(o.body for o in got) == [b"x", b"y", b"z"]
    assert {o["destination"] for o in got} == {"/queue/a\x1eb", "/topic/a\x1eb", "/topic/\x1eeu\x1eb"}


def test_host_picks_the_vhost_unknown_ones_are_refused_or_fall_back():
    rig = Rig(vhosts=["eu", "us"])
    assert rig.config.vhosts == ["/", "eu", "us"]
    assert join(rig, 1, "eu")[0].command == "CONNECTED" and rig.broker.sessions[1].vhost == "eu"
    assert join(rig, 2, "/")[0].command == "CONNECTED" and rig.broker.sessions[2].vhost == ""
    assert join(rig, 3, None)[0].command == "CONNECTED" and rig.broker.sessions[3].vhost == ""
    refused = join(rig, 4, "broker.example")
    assert refused[0].command == "ERROR" and refused[0]["message"] == "unknown virtual host"
    fallback = Rig(vhosts=["eu"], vhost_fallback=True)
    assert join(fallback, 1, "broker.example")[0].command == "CONNECTED"
    assert fallback.broker.sessions[1].vhost == ""


def test_vhosts_keep_their_queues_topics_and_wildcards_apart():
    rig = Rig(vhosts=["eu"])
    join(rig, 1, "eu")
    join(rig, 2, "/")
    rig.subscribe(1, "/queue/jobs", sub_id="q")
    rig.subscribe(1, "*", sub_id="all")            # eu's topics only
    rig.subscribe(2, "/queue/*", sub_id="q")        # the default vhost's queues only
    rig.subscribe(2, "*", sub_id="all")
    rig.send(2, "/queue/jobs", b"default job")
    rig.send(2, "/topic/news", b"default news")
    rig.send(1, "/queue/jobs", b"eu job")
    rig.send(1, "/topic/news", b"eu news")
    eu = {(o["subscription"], o["destination"], o.body) for o in rig.messages(1)}
    default = sorted(o.body for o in rig.messages(2))
    assert eu == {("q", "/queue/jobs", b"eu job"), ("all", "/topic/news", b"eu news")}
    assert default == [b"default job", b"default news"]  # (the job to one of its two subscriptions)
    assert all("\x1e" not in o["destination"] for o in rig.seen if o.command == "MESSAGE")
    rig.frame(1, "SEND", destination="/queue/\x1eus\x1ejobs")  # no reaching into another vhost
    assert rig.error(1)["message"] == "invalid destination"


def test_durables_and_dead_letters_are_per_vhost():
    rig = Rig(vhosts=["eu"], max_redeliveries=0)
    join(rig, 1, "eu", client_id="c")
    join(rig, 2, "/", client_id="c")
    rig.subscribe(1, "/topic/d", sub_id="d1", durable="true")
    rig.subscribe(2, "/topic/d", sub_id="d1", durable="true")  # the same name: another subscription
    assert len(rig.broker.durables) == 2
    rig.subscribe(1, "/queue/work", sub_id="w", ack="client-individual")
    rig.send(1, "/queue/work", b"bad")
    (out,) = rig.messages(1)
    rig.frame(1, "NACK", id=out["ack"])
    dlq = vhosts.inside("eu", "/queue/DLQ")
    assert rig.broker.queues[dlq].depth() == 1 and "/queue/DLQ" not in rig.broker.queues
    (dead,) = rig.broker.queues[dlq].messages
    assert dead.headers["original-destination"] == "/queue/work"
    rig.frame(1, "UNSUBSCRIBE", id="w")
    rig.broker.manage(manage.move, dlq, None, None, None, now=rig.now)  # the redrive stays in eu
    (back,) = rig.broker.queues[vhosts.inside("eu", "/queue/work")].messages
    assert back.headers["redriven-from"] == "/queue/DLQ"


def test_scheduled_messages_and_their_stomp_management_stay_in_their_vhost():
    """ActiveMQ.Scheduler.Management in a vhost is that vhost's: it browses and cancels its jobs only,
    and its reply-to is a name of that vhost."""
    rig = Rig(vhosts=["eu"])
    join(rig, 1, "eu")
    join(rig, 2, "/")
    later = {"AMQ_SCHEDULED_DELAY": "60000"}  # (a dict: the harness turns _ into - in keywords)
    rig.frame(1, "SEND", later, destination="/queue/later", body=b"eu")
    rig.frame(2, "SEND", later, destination="/queue/later", body=b"default")
    rig.subscribe(1, "/queue/replies", sub_id="r")
    rig.frame(1, "SEND", {"AMQ_SCHEDULER_ACTION": "BROWSE", "reply-to": "/queue/replies"},
              destination="/queue/ActiveMQ.Scheduler.Management")
    got = rig.messages(1)
    assert [m.body for m in got] == [b"eu", b""] and got[0]["original-destination"] == "/queue/later"
    assert "/queue/ActiveMQ.Scheduler.Management" not in [vhosts.visible(q) for q in rig.broker.queues]
    default_id = next(j.id for j in rig.broker.jobs.of() if j.body == b"default")
    rig.frame(1, "SEND", {"AMQ_SCHEDULER_ACTION": "REMOVE", "scheduledJobId": default_id},
              destination="/queue/ActiveMQ.Scheduler.Management")
    rig.frame(1, "SEND", {"AMQ_SCHEDULER_ACTION": "REMOVEALL"}, destination="/topic/ActiveMQ.Scheduler.Management")
    assert [j.body for j in rig.broker.jobs.of()] == [b"default"]


def test_vhost_grants():
    perms = parse_acl("alice vhost eu\n* vhost us\nroot admin\n")
    assert perms["alice"].may_use_vhost("eu") and not perms["alice"].may_use_vhost("us")
    assert perms["alice"].may_use_vhost("/") and perms["root"].may_use_vhost("anything")
    assert parse_inline("vhost=*").may_use_vhost("eu") and parse_inline("vhost=eu").to_inline() == "vhost=eu"
    with pytest.raises(PasswdError):
        parse_acl("alice vhost\n")


class Auth:
    """Logins checked at once: alice may use eu, bob nothing but /."""
    required = True

    def __init__(self):
        self.perms = parse_acl("alice vhost eu\n")
        self.verdicts = []

    def submit(self, conn, login, passcode, address):
        self.verdicts.append((conn, login))

    def cancel(self, conn):
        return None

    def may_use_vhost(self, login, vhost):
        return self.perms.get(login, parse_inline("")).may_use_vhost(vhost)

    def is_admin(self, login):
        return False

    def can_read(self, login, destination):
        return True

    can_write = can_read


def test_a_login_needs_a_grant_for_a_vhost():
    auth = Auth()
    rig = Rig(auth=auth, vhosts=["eu"])
    for conn, login in ((1, "alice"), (2, "bob")):
        join(rig, conn, "eu", login=login, passcode="x")
        rig.broker.on_auth(conn, login, rig.now)
    assert rig.frames(1)[0].command == "CONNECTED"
    refused = rig.frames(2)[0]
    assert refused.command == "ERROR" and refused["message"] == "access refused" and b"eu" in refused.body


def test_replay_from_stays_in_its_vhost(tmp_path):
    from stompbroker.broker.core import Broker
    from stompbroker.ipc.outbox import Outbox
    from stompbroker.settings import make_config
    from stompbroker.store.sqlite import Store

    from broker_harness import decode

    config = make_config(store="sqlite", store_path=str(tmp_path / "s.db"), vhosts=["eu"])
    store = Store(config.store_path, 0.0, config.replay_retention)
    box = Outbox(0)
    broker = Broker(config, [box], clock=lambda: 1.7e9)
    broker.recover(store, 1.0)
    for conn, host in ((1, "eu"), (2, "/")):
        broker.on_open(conn, 0, "127.0.0.1:1", 1.0)
        broker.on_frame(conn, f"CONNECT\naccept-version:1.2\nhost:{host}".encode(), b"", 1.0)
    broker.on_frame(1, b"SEND\ndestination:/queue/q", b"eu message", 1.0)
    broker.on_frame(2, b"SEND\ndestination:/queue/q", b"default message", 1.0)
    store.sync(5)
    box.take()
    broker.on_frame(2, b"SUBSCRIBE\nid:all\ndestination:*\nreplay-from:0", b"", 1.0)
    buf, _ = box.take()
    replayed = [o.body for o in decode(buf) if o.command == "MESSAGE" and o.headers.get("replayed") == "true"]
    assert replayed == [b"default message"]
    store.close(5)


def test_the_stale_queue_gives_a_wildcard_its_own_vhosts_messages_only():
    rig = Rig(vhosts=["eu"], TTL=10_000)
    join(rig, 1, "eu")
    join(rig, 2, "/")
    rig.send(1, "/topic/late", b"eu")       # nobody subscribed: kept in the stale queue
    rig.send(2, "/topic/late", b"default")
    rig.subscribe(2, "*")
    rig.subscribe(1, "*")
    assert rig.bodies(2) == [b"default"] and rig.bodies(1) == [b"eu"]
