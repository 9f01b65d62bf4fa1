"""Permissions hold inside transactions, and durable subscriptions belong to the user who made them."""

from __future__ import annotations

import pytest

from stompbroker.security import hash_secret
from stompwire import Wire, drain


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from conftest import BrokerProcess
    path = tmp_path_factory.mktemp("auth") / "passwd"
    path.write_text(
        f"alice:{hash_secret('a')}:read=/topic/*,/queue/alice;write=/topic/*,/queue/alice\n"
        f"bob:{hash_secret('b')}:read=/topic/*,/queue/bob;write=/topic/*,/queue/bob\n")
    path.chmod(0o600)
    b = BrokerProcess("processors=3", "auth=passwd", f"passwd_file={path}")
    yield b
    b.close()


def login(broker, user: str) -> Wire:
    w = Wire(broker.connect())
    w.connect(login=user, passcode=user[0])
    return w


def test_send_in_a_transaction_is_checked_when_sent(secured):
    bob = login(secured, "bob")
    bob.frame("BEGIN", {"transaction": "t"})
    bob.frame("SEND", {"destination": "/queue/alice", "transaction": "t", "receipt": "s"}, b"from bob")
    cmd, headers, _ = bob.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "permission denied for /queue/alice", "s")
    bob.expect_closed()
    alice = login(secured, "alice")
    alice.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/alice"})
    alice.frame("SEND", {"destination": "/queue/alice", "receipt": "mine"}, b"from alice")
    frames = [alice.read(), alice.read()]
    assert [f[2] for f in frames if f[0] == "MESSAGE"] == [b"from alice"]  # nothing of bob's got in


def test_allowed_sends_in_a_transaction_commit(secured):
    bob = login(secured, "bob")
    bob.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/bob"})
    bob.frame("BEGIN", {"transaction": "t"})
    bob.frame("SEND", {"destination": "/queue/bob", "transaction": "t"}, b"x")
    bob.frame("COMMIT", {"transaction": "t", "receipt": "c"})
    frames = [bob.read(), bob.read()]
    assert sorted(f[0] for f in frames) == ["MESSAGE", "RECEIPT"]


def durable_subscribe(broker, user: str, destination: str, sub_id: str = "sub-0", **extra) -> Wire:
    w = login(broker, user)
    w.frame("SUBSCRIBE", {"id": sub_id, "destination": destination, "durable": "true", "receipt": "s", **extra})
    return w


def publish(broker, destination: str, *bodies: bytes) -> None:
    w = login(broker, "alice")
    for i, body in enumerate(bodies):
        w.frame("SEND", {"destination": destination, "receipt": str(i)}, body)
        assert w.read()[0] == "RECEIPT"
    w.close()


def test_durable_subscriptions_of_the_same_name_belong_to_their_users(secured):
    alice = durable_subscribe(secured, "alice", "/topic/owned")
    assert alice.read()[0] == "RECEIPT"
    alice.close()
    publish(secured, "/topic/owned", b"for alice 1", b"for alice 2")
    bob = durable_subscribe(secured, "bob", "/topic/owned")  # same id, another user
    frames = drain(bob)
    assert [f[0] for f in frames] == ["RECEIPT"], frames  # none of alice's backlog
    bob.close()
    alice = durable_subscribe(secured, "alice", "/topic/owned")
    assert [f[2] for f in drain(alice) if f[0] == "MESSAGE"] == [b"for alice 1", b"for alice 2"]
    alice.frame("UNSUBSCRIBE", {"id": "sub-0", "receipt": "u"})
    alice.read()


def test_reusing_a_durable_name_for_another_destination_is_refused_unless_replaced(secured):
    alice = durable_subscribe(secured, "alice", "/topic/first", "feed")
    assert alice.read()[0] == "RECEIPT"
    alice.close()
    publish(secured, "/topic/first", b"kept")
    other = durable_subscribe(secured, "alice", "/topic/second", "feed")
    cmd, headers, body = other.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "durable subscription exists", "s")
    assert b"replace-durable:true" in body
    back = durable_subscribe(secured, "alice", "/topic/first", "feed")
    assert [f[2] for f in drain(back) if f[0] == "MESSAGE"] == [b"kept"]  # the backlog is intact
    back.close()
    publish(secured, "/topic/first", b"dropped on replace")
    replaced = durable_subscribe(secured, "alice", "/topic/second", "feed", **{"replace-durable": "true"})
    assert [f[0] for f in drain(replaced)] == ["RECEIPT"]
    publish(secured, "/topic/second", b"new")
    assert [f[2] for f in drain(replaced)] == [b"new"]


def test_commit_checks_permissions_again(start_broker, tmp_path):
    import signal
    import time
    path = tmp_path / "passwd"
    entry = f"bob:{hash_secret('b')}:read=/queue/bob;write="
    path.write_text(entry + "/queue/bob\n")
    path.chmod(0o600)
    b = start_broker("auth=passwd", f"passwd_file={path}")
    bob = login(b, "bob")
    bob.frame("BEGIN", {"transaction": "t"})
    bob.frame("SEND", {"destination": "/queue/bob", "transaction": "t", "receipt": "s"}, b"x")
    assert bob.read()[0] == "RECEIPT"  # allowed when sent
    path.write_text(entry + "/topic/*\n")  # ... and no longer when committed
    b.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "passwd reloaded" not in b.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    bob.frame("COMMIT", {"transaction": "t", "receipt": "c"})
    cmd, headers, _ = bob.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "permission denied for /queue/bob", "c")
