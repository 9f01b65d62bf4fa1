"""A crash loop cannot start from one input: an input that kills the dispatcher twice is quarantined.

No input kills the dispatcher today (the last known ones are fixed), so the fault is injected:
``STOMPBROKER_FAULT_DIE_ON=<text>`` makes the dispatcher SIGKILL itself, as the kernel's OOM killer
would, when it handles a frame or loads a stored message whose body holds the text. Everything
else is the real broker: the supervisor restarts every process, reads the dispatcher's note of what
it was handling, and quarantines what killed it twice; the stored message in the test was written
by the broker itself, through an ordinary SEND, before the fault was switched on.
"""

from __future__ import annotations

import http.client
import json
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import ROOT
from stompwire import Wire, connected, subscribe

FAULT = {"STOMPBROKER_FAULT_DIE_ON": "POISON"}


def reconnect(broker, timeout: float = 30.0) -> Wire:
    """A CONNECTED session, once the broker serves again after a restart."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connected(broker)
        except (OSError, AssertionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def send_poison(broker, receipt: str) -> tuple:
    """The poison SEND from a fresh session; what came back (a frame, or None when the connection died)."""
    w = reconnect(broker)
    w.frame("SEND", {"destination": "/queue/p", "receipt": receipt}, b"a POISON message")
    try:
        return w.read(20)
    except ConnectionError:
        return None


def test_a_frame_that_kills_the_dispatcher_twice_is_refused_after(start_broker, tmp_path):
    store = tmp_path / "store.sqlite"
    b = start_broker("processors=3", "store=sqlite", f"store_path={store}", env=FAULT)
    keeper = connected(b)
    keeper.frame("SEND", {"destination": "/queue/kept", "receipt": "k"}, b"kept")
    assert keeper.read()[:2] == ("RECEIPT", {"receipt-id": "k"})
    assert send_poison(b, "p1") is None      # the dispatcher died: every connection was cut
    assert send_poison(b, "p2") is None      # the client tried again (another receipt): died again
    command, headers, body = send_poison(b, "p3")
    assert (command, headers["message"], headers["receipt-id"]) == ("ERROR", "refused", "p3")
    log = b.log()
    assert log.count("the dispatcher died handling SEND frame to /queue/p") == 1
    assert "the dispatcher died 2 times handling SEND frame to /queue/p" in log and "quarantined" in log
    assert log.count("restarting every process") == 2 and b.proc.poll() is None
    # the broker serves: the receipted message survived both restarts, new traffic flows
    w = reconnect(b)
    subscribe(w, "/queue/kept")
    assert w.read(10)[2] == b"kept"
    w.frame("SEND", {"destination": "/queue/p", "receipt": "fine"}, b"a harmless message")
    assert w.read(10)[:2] == ("RECEIPT", {"receipt-id": "fine"})


def test_a_stored_message_that_kills_the_dispatcher_twice_is_quarantined(start_broker, tmp_path):
    store = tmp_path / "store.sqlite"
    settings = ("processors=3", "store=sqlite", f"store_path={store}")
    b = start_broker(*settings)
    w = connected(b)
    for i, body in enumerate((b"first", b"a POISON message", b"last")):
        w.frame("SEND", {"destination": "/queue/s", "receipt": f"r{i}"}, body)
        assert w.read()[:2] == ("RECEIPT", {"receipt-id": f"r{i}"})
    assert b.stop(signal.SIGTERM) == 0
    b = start_broker(*settings, env=FAULT)  # its dispatcher dies loading the second message, twice
    log = b.log()
    assert "the dispatcher died handling stored message 2 (while loading the store)" in log
    assert "the dispatcher died 2 times loading stored message 2" in log
    assert "quarantined 1 stored messages that killed the dispatcher twice while loading (seq 2)" in log
    w = connected(b)
    subscribe(w, "/queue/s")
    assert [w.read(10)[2] for _ in range(2)] == [b"first", b"last"]
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT seq, body, reason FROM quarantine").fetchall() == [
            (2, b"a POISON message", "the dispatcher died twice loading it")]
    assert b.stop(signal.SIGTERM) == 0
    # the operator looks at it and, once the cause is fixed, puts it back
    tool = [sys.executable, "-m", "stompbroker.tools.store"]
    check = subprocess.run([*tool, "check", str(store)], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert "1 quarantined" in check.stdout
    exported = subprocess.run([*tool, "export", str(store), "--quarantined"], cwd=ROOT, capture_output=True,
                              timeout=30)
    (row,) = [json.loads(line) for line in exported.stdout.splitlines()]
    assert (row["seq"], row["queue"], row["reason"]) == (2, "/queue/s", "the dispatcher died twice loading it")
    released = subprocess.run([*tool, "release", str(store), "2"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30)
    assert released.returncode == 0 and "released 1" in released.stdout
    b = start_broker(*settings)  # without the fault
    w = connected(b)
    subscribe(w, "/queue/s")
    assert w.read(10)[2] == b"a POISON message"


def http_get(broker, path: str) -> tuple[int, bytes] | None:
    """(status, body), or None when the connection was cut (the dispatcher died)."""
    conn = http.client.HTTPConnection(broker.host, broker.port, timeout=20)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    except (ConnectionError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def test_an_http_request_that_kills_the_dispatcher_twice_gets_a_500_counted_in_metrics(start_broker):
    b = start_broker("processors=3", env=FAULT)
    for _ in range(2):
        reconnect(b).close()  # the broker serves again
        assert http_get(b, "/api/overview?POISON") is None
    reconnect(b).close()
    status, body = http_get(b, "/api/overview?POISON")
    assert status == 500 and b"made the broker fail twice" in body
    assert "the dispatcher died 2 times handling HTTP GET /api/overview?POISON" in b.log()
    status, body = http_get(b, "/metrics")  # (failed before: the refusal's 500 was not counted)
    assert status == 200 and b"stompbroker_http_internal_errors_total 1.0" in body
