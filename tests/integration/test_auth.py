"""Authentication and permissions against the running broker."""

from __future__ import annotations

import re
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
    w, frame = connect(secured, "root", "toor")
    assert frame[0] == "CONNECTED"
    # answered before the flood's 4th check (after 300, 600, 1200 ms back-offs), not after 150 checks
    assert secured.log().count("from 127.0.0.3") <= 3
    # One check at a time for the flooding address, each after its back-off: in 2 s at most the
    # refusals a sequential guesser gets (300, 600, 1200 ms back-offs: 3 or 4 checks).
    time.sleep(1.7)
    refused = secured.log().count("from 127.0.0.3")
    assert refused <= 4, f"{refused} guesses checked in 2 s"
    for sock in flood:
        sock.close()


# -- HTTP logins share the queue, are cancelled with their connection, and get HTTP answers ----------
def basic(login, password):
    import base64
    return "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()


def http_request(broker, source, path, authorization, method="GET"):
    sock = socket.create_connection(broker.address, timeout=15, source_address=(source, 0))
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {authorization}\r\n\r\n".encode())
    return sock


def answer_of(sock) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def test_http_logins_closed_by_their_client_are_not_checked(secured):
    # 40 bad HTTP logins hung up at once: their checks are dropped, not run one by one with a
    # growing back-off in front of the next login from that address.
    socks = [http_request(secured, "127.0.0.5", "/metrics", basic("root", f"guess{i}")) for i in range(40)]
    time.sleep(0.1)  # (the requests reach the dispatcher before the hang-ups)
    for sock in socks:
        sock.close()
    for _ in range(3):
        w = Wire(socket.create_connection(secured.address, timeout=5, source_address=("127.0.0.5", 0)))
        w.frame("CONNECT", {"accept-version": "1.2", "login": "root", "passcode": "toor"})
        assert w.read(timeout=15)[0] == "CONNECTED"
        w.close()
    assert secured.log().count("from 127.0.0.5") <= 3  # at most what was checked before they went


def test_an_http_login_not_checked_in_time_gets_an_http_answer(start_broker, passwd_file):
    b = start_broker("auth=passwd", f"passwd_file={passwd_file}", "auth_fail_delay_ms=5000",
                     "connect_timeout_ms=1500")
    guess = http_request(b, "127.0.0.6", "/metrics", basic("root", "guess"))
    logged(b, "refused", "from 127.0.0.6")
    # root backs off for 5 s at that address, longer than the 1.5 s a connection has to log in
    late = answer_of(http_request(b, "127.0.0.6", "/metrics", basic("root", "toor")))
    assert late.startswith(b"HTTP/1.1 429 "), late[:200]
    retry = int(re.search(rb"\r\nRetry-After: (\d+)\r\n", late).group(1))
    assert 1 <= retry <= 5
    assert answer_of(guess).startswith(b"HTTP/1.1 401 ")


def logged(broker, *texts: str, timeout: float = 15.0) -> None:
    """Wait for a log line holding every one of ``texts``."""
    deadline = time.monotonic() + timeout
    while not any(all(t in line for t in texts) for line in broker.log().splitlines()):
        assert time.monotonic() < deadline, f"never logged: {texts}"
        time.sleep(0.02)


# -- back-off per (address, login) and per address --------------------------------------------------
def test_a_valid_login_does_not_reset_the_back_off_of_guesses_at_another(start_broker, passwd_file):
    b = start_broker("auth=passwd", f"passwd_file={passwd_file}", "auth_fail_delay_ms=50")
    started = time.monotonic()
    for _ in range(5):  # guess root's passcode, log in as alice, guess again...
        w = Wire(socket.create_connection(b.address, timeout=5, source_address=("127.0.0.7", 0)))
        w.frame("CONNECT", {"accept-version": "1.2", "login": "root", "passcode": "guess"})
        assert w.read(timeout=15)[1]["message"] == "access refused"
        w = Wire(socket.create_connection(b.address, timeout=5, source_address=("127.0.0.7", 0)))
        w.frame("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "wonderland"})
        assert w.read(timeout=15)[0] == "CONNECTED"
    # root's back-off at that address kept doubling: 50 + 100 + 200 + 400 + 800 ms at the least
    assert time.monotonic() - started >= 1.5
    assert "login refused for 'root' from 127.0.0.7: 5 in a row" in b.log()


def test_guesses_at_one_login_do_not_hold_up_another_login_from_that_address(start_broker, passwd_file):
    b = start_broker("auth=passwd", f"passwd_file={passwd_file}", "auth_fail_delay_ms=5000")
    flood = []
    for _ in range(50):  # parallel guesses at root from one address (behind a NAT, say)
        w = Wire(socket.create_connection(b.address, timeout=5, source_address=("127.0.0.10", 0)))
        w.frame("CONNECT", {"accept-version": "1.2", "login": "root", "passcode": "guess"})
        flood.append(w)
    logged(b, "login refused for 'root' from 127.0.0.10")  # the first guess: root backs off 5 s there
    w = Wire(socket.create_connection(b.address, timeout=5, source_address=("127.0.0.10", 0)))
    w.frame("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "wonderland"})
    assert w.read(timeout=15)[0] == "CONNECTED"
    # and it came before root's next verdict: the rest of the flood has had no answer yet
    assert b.log().count("login refused for 'root' from 127.0.0.10") == 1
    other = Wire(socket.create_connection(b.address, timeout=5, source_address=("127.0.0.11", 0)))
    other.frame("CONNECT", {"accept-version": "1.2", "login": "root", "passcode": "toor"})
    assert other.read(timeout=15)[0] == "CONNECTED"  # root itself, from elsewhere: not held up either
    assert b.log().count("login refused for 'root' from 127.0.0.10") == 1
    for f in flood:
        f.close()
