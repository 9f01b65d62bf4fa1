"""Permissions hold inside transactions, and durable subscriptions belong to the user who made them."""

from __future__ import annotations

import pytest

from stompbroker.security import hash_secret
from stompwire import Wire


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
