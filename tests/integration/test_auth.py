"""Authentication and permissions against the running broker."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from stompbroker.security import hash_secret, make_token
from stompwire import Wire


def connect(broker, login=None, passcode=None, **extra):
    w = Wire(broker.connect())
    headers = {"accept-version": "1.2", **extra}
    if login is not None:
        headers["login"] = login
    if passcode is not None:
        headers["passcode"] = passcode
    w.frame("CONNECT", headers)
    return w, w.read(timeout=15)


@pytest.fixture
def passwd_file(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(
        "# users\n"
        f"alice:{hash_secret('wonderland')}:read=/topic/*,/queue/alice;write=/topic/*\n"
        f"  root : {hash_secret('toor')} : admin\n"
        "legacy:plaintext\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def secured(start_broker, passwd_file):
    return start_broker("auth=passwd", f"passwd_file={passwd_file}", "auth_fail_delay_ms=300")


def test_valid_login_connects_and_pipelined_frames_wait_for_the_check(secured):
    w = Wire(secured.connect())
    w.send(b"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:wonderland\n\n\0"
           b"SUBSCRIBE\nid:1\ndestination:/topic/news\nreceipt:sub\n\n\0")
    assert w.read(timeout=15)[0] == "CONNECTED"
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "sub"})


@pytest.mark.parametrize("login,passcode", [("alice", "wrong"), ("nobody", "wonderland"), ("alice", None),
                                            (None, None)])
def test_refused_logins_say_only_access_refused(secured, login, passcode):
    w, (cmd, headers, body) = connect(secured, login, passcode)
    assert cmd == "ERROR" and headers["message"] == "access refused"
    assert b"login or passcode" in body  # never which of the two
    w.expect_closed()


def test_plain_text_secret_accepted_with_a_warning(secured):
    w, frame = connect(secured, "legacy", "plaintext")
    assert frame[0] == "CONNECTED"
    assert "plain-text secret" in secured.log()


def test_repeated_failures_are_slowed_without_blocking_others(secured):
    durations = []
    for _ in range(3):
        start = time.monotonic()
        w, frame = connect(secured, "alice", "guess")
        assert frame[1]["message"] == "access refused"
        durations.append(time.monotonic() - start)
    assert durations[0] >= 0.25 and durations[2] >= 1.1  # 300 ms, 600 ms, 1200 ms
    # A slow refusal does not hold up anyone from another address (the guesser's own address waits
    # for its back-off before its next check).
    bad = Wire(secured.connect())
    bad.frame("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "guess"})
    start = time.monotonic()
    good = Wire(socket.create_connection(secured.address, timeout=5, source_address=("127.0.0.2", 0)))
    good.frame("CONNECT", {"accept-version": "1.2", "login": "root", "passcode": "toor"})
    frame = good.read(timeout=15)
    assert frame[0] == "CONNECTED" and time.monotonic() - start < 1.0
    assert bad.read(timeout=15)[1]["message"] == "access refused"


def test_permissions_name_the_destination(secured):
    w, _ = connect(secured, "alice", "wonderland")
    w.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/alice", "receipt": "ok"})
    assert w.read()[0] == "RECEIPT"
    w.frame("SEND", {"destination": "/topic/chat", "receipt": "sent"}, b"hi")
    assert w.read()[0] == "RECEIPT"
    w.frame("SUBSCRIBE", {"id": "2", "destination": "/queue/bob", "receipt": "no"})
    cmd, headers, body = w.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "permission denied for /queue/bob", "no")
    w, _ = connect(secured, "alice", "wonderland")
    w.frame("SEND", {"destination": "/queue/alice", "receipt": "no"}, b"x")
    assert w.read()[1]["message"] == "permission denied for /queue/alice"


def test_admin_only_diagnostics(start_broker, passwd_file):
    b = start_broker("auth=passwd", f"passwd_file={passwd_file}", "diag_admin_only=true")
    anon = Wire(b.connect())
    anon.send(b"DIAG\n\nsession\0")
    assert anon.read()[1]["message"] == "not connected"
    alice, _ = connect(b, "alice", "wonderland")
    alice.send(b"DIAG\n\nsession\0")
    assert alice.read()[1]["message"] == "permission denied for DIAG"
    root, _ = connect(b, "root", "toor")
    root.send(b"DIAG\n\nsession-size\0")
    assert root.read()[0] == "DIAG"
    root.frame("SUBSCRIBE", {"id": "m", "destination": "/queue/monitor", "receipt": "m"})
    assert root.read()[0] == "RECEIPT"


def test_sighup_rereads_the_passwd_file(secured, passwd_file):
    w, frame = connect(secured, "carol", "new")
    assert frame[1]["message"] == "access refused"
    with open(passwd_file, "a") as f:
        f.write(f"carol:{hash_secret('new')}\n")
    secured.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "passwd reloaded" not in secured.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    w, frame = connect(secured, "carol", "new")
    assert frame[0] == "CONNECTED"


@pytest.mark.parametrize("mode", ["sha1", "hmac"])
def test_token_logins(start_broker, mode):
    b = start_broker("secret=s3cret-shared-by-services", "secret_timeout=30", f"token_mode={mode}")
    login, passcode = make_token("dave", "s3cret-shared-by-services", time.time(), mode)
    w, frame = connect(b, login, passcode)
    assert frame[0] == "CONNECTED"
    old_login, old_passcode = make_token("dave", "s3cret-shared-by-services", time.time() - 120, mode)
    w, frame = connect(b, old_login, old_passcode)
    assert frame[1]["message"] == "access refused"
    forged_login, forged = make_token("dave", "another secret", time.time(), mode)
    w, frame = connect(b, forged_login, forged)
    assert frame[1]["message"] == "access refused"


def test_a_flood_of_guesses_from_one_address_does_not_delay_logins_from_another(secured):
    flood = []
    for _ in range(150):  # all in parallel, from 127.0.0.3
        sock = socket.create_connection(secured.address, timeout=5, source_address=("127.0.0.3", 0))
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:root\npasscode:guess\n\n\0")
        flood.append(sock)
    time.sleep(0.3)  # the flood is queued before the honest login arrives
    start = time.monotonic()
    w, frame = connect(secured, "root", "toor")
    waited = time.monotonic() - start
    assert frame[0] == "CONNECTED" and waited < 1.0, f"{waited:.2f} s"
    # One check at a time for the flooding address, each after its back-off: in 2 s at most the
    # refusals a sequential guesser gets (300, 600, 1200 ms back-offs: 3 or 4 checks).
    time.sleep(1.7)
    refused = secured.log().count("from 127.0.0.3")
    assert refused <= 4, f"{refused} guesses checked in 2 s"
    for sock in flood:
        sock.close()
