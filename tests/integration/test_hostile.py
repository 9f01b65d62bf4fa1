"""Hostile clients against the real broker: each attack is refused or contained, and the broker keeps serving.

After every attack :func:`assert_still_serving` checks that a new client connects and gets
CONNECTED, that no broker process died or was restarted (a crashed reader would be restarted by
the supervisor and the broker would "still serve", so the pids are compared), and that the log
holds no traceback.
"""

from __future__ import annotations

import random
import resource
import selectors
import socket
import threading
import time

import psutil
import pytest

from stompbroker.tools.client import parse_frames  # strict: ValueError unless whole frames
from stompwire import Wire

pytestmark = pytest.mark.timeout(180)


# --- helpers ------------------------------------------------------------------------------------

def tree(b) -> list[psutil.Process]:
    root = psutil.Process(b.proc.pid)
    return [root] + root.children(recursive=True)


def pids(b) -> set[int]:
    return {p.pid for p in tree(b)}


def tree_rss(b) -> int:
    total = 0
    for p in tree(b):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def assert_still_serving(b, before: set[int]) -> None:
    w = Wire(b.connect())
    try:
        headers = w.connect()
        assert headers["version"] == "1.2"
        w.frame("DISCONNECT", {"receipt": "bye"})
        assert w.read()[0] == "RECEIPT"
    finally:
        w.close()
    log = b.log()
    assert b.proc.poll() is None, f"the supervisor exited:\n{log[-3000:]}"
    assert pids(b) == before, f"a broker process died and was replaced:\n{log[-3000:]}"
    for bad in ("Traceback", "exited with status", "killed by signal", "restarting every process"):
        assert bad not in log, f"{bad!r} in the broker log:\n{log[-3000:]}"


def blast(sock: socket.socket, data: bytes, chunk: int = 1 << 16) -> threading.Thread:
    """Send ``data`` from a thread (the broker may stop reading and hang up half-way: that is fine)."""

    def run():
        view = memoryview(data)
        try:
            for i in range(0, len(data), chunk):
                sock.sendall(view[i:i + chunk])
        except OSError:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def read_until_gone(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the broker sends until it closes the connection (a reset counts as closed)."""
    data = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the broker did not close the connection; got {bytes(data[:200])!r}")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError):
            return bytes(data)
        except socket.timeout:
            continue
        if not chunk:
            return bytes(data)
        data += chunk


def connected_wire(b, **settings) -> Wire:
    w = Wire(b.connect(timeout=10))
    w.connect(**settings)
    return w


def expect_error_then_close(w: Wire, message: str, timeout: float = 15.0) -> dict:
    cmd, headers, _ = w.read(timeout=timeout)
    assert (cmd, headers.get("message")) == ("ERROR", message), (cmd, headers)
    read_until_gone(w.sock)
    return headers


# --- limits -------------------------------------------------------------------------------------

@pytest.mark.parametrize("frame,message", [
    # body over the limit, no content-length: refused as soon as 1000 bytes pass without a NUL
    (b"SEND\ndestination:/topic/a\n\n" + b"x" * 200_000 + b"\0", "frame too large"),
    # content-length over the limit: refused from the header alone
    (b"SEND\ndestination:/topic/a\ncontent-length:200000\n\n" + b"x" * 200_000 + b"\0", "frame too large"),
    # headers alone over the limit
    (b"SEND\ndestination:/topic/a\n" + b"".join(b"h%d:%s\n" % (i, b"v" * 90) for i in range(20)) + b"\n\0",
     "frame too large"),
    # headers and body each under the limit, together over it (the limit is on the whole frame)
    (b"SEND\ndestination:/topic/a\nx:" + b"h" * 590 + b"\n\n" + b"b" * 600 + b"\0", "frame too large"),
    (b"SEND\ndestination:/topic/a\nx:" + b"h" * 590 + b"\ncontent-length:600\n\n" + b"b" * 600 + b"\0",
     "frame too large"),
], ids=["body", "content-length", "headers", "headers+body", "headers+content-length"])
def test_frame_larger_than_the_limit(start_broker, frame, message):
    b = start_broker("processors=3", "max_frame_size=1000")
    before = pids(b)
    w = connected_wire(b)
    w.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/a", "receipt": "sub"})
    assert w.read()[0] == "RECEIPT"
    blast(w.sock, frame)
    cmd, headers, _ = w.read(timeout=15)
    # Nothing may be delivered for the oversized frame: the first reply must be the ERROR.
    assert (cmd, headers.get("message")) == ("ERROR", message), (cmd, headers)
    read_until_gone(w.sock)
    assert_still_serving(b, before)


def test_one_megabyte_header_line(start_broker):
    b = start_broker("processors=3")  # max_header_line 64 KB
    before = pids(b)
    w = connected_wire(b)
    blast(w.sock, b"SEND\ndestination:/topic/a\nx-long:" + b"y" * (1 << 20) + b"\n\n\0")
    expect_error_then_close(w, "header line too long")
    # The same before CONNECT: the line is the command itself.
    w = Wire(b.connect())
    blast(w.sock, b"C" * (1 << 20) + b"\n\n\0")
    expect_error_then_close(w, "header line too long")
    assert_still_serving(b, before)


@pytest.mark.parametrize("pieces", [1, 2], ids=["one-write", "line-first"])
def test_limit_error_carries_receipt_id_whatever_the_chunking(start_broker, pieces):
    """README: a limit breach gets an ERROR "with receipt-id when the frame asked for a receipt".

    The receipt header has arrived before the over-long line; whether the rest of the head comes in
    the same TCP segment or later must not matter.
    """
    b = start_broker("processors=3", "max_header_line=100")
    before = pids(b)
    w = connected_wire(b)
    head = b"SEND\ndestination:/topic/a\nreceipt:r1\nx-long:" + b"y" * 200
    if pieces == 1:
        w.send(head + b"\n\n\0")
    else:
        w.send(head)
        time.sleep(0.3)
        try:
            w.send(b"\n\n\0")
        except OSError:
            pass
    headers = expect_error_then_close(w, "header line too long")
    assert headers.get("receipt-id") == "r1", headers
    assert_still_serving(b, before)


def test_one_hundred_thousand_headers(start_broker):
    b = start_broker("processors=3")  # max_headers 256
    before = pids(b)
    w = connected_wire(b)
    head = b"SEND\ndestination:/topic/a\n" + b"".join(b"h%d:v\n" % i for i in range(100_000))
    blast(w.sock, head + b"\nbody\0")
    expect_error_then_close(w, "too many headers")
    assert_still_serving(b, before)


@pytest.mark.parametrize("connect_first", [False, True], ids=["before-connect", "after-connect"])
def test_one_megabyte_of_random_bytes(start_broker, connect_first):
    b = start_broker("processors=3")
    before = pids(b)
    rng = random.Random(20240611)
    garbage = rng.randbytes(1 << 20)
    if garbage.startswith(b"GET "):  # keep it a STOMP-side test (p = 2**-32)
        garbage = b"\x01" + garbage[1:]
    sock = b.connect()
    if connect_first:
        w = Wire(sock)
        w.connect()
    blast(sock, garbage)
    data = read_until_gone(sock, timeout=20)
    # Whatever was read of the garbage, the broker answered with an ERROR (when the reset did not
    # destroy it first) and hung up.
    assert data == b"" or data.startswith(b"ERROR\n"), data[:200]
    if data:
        frames = parse_frames(data)
        assert [f[0] for f in frames] == ["ERROR"]
    assert_still_serving(b, before)


# --- slow and silent clients --------------------------------------------------------------------

@pytest.mark.parametrize("greeting", [b"CONNECT\naccept-ver", b""], ids=["half-connect", "nothing"])
def test_silent_client_is_closed_after_connect_timeout(start_broker, greeting):
    b = start_broker("processors=3", "connect_timeout_ms=400")
    before = pids(b)
    w = Wire(b.connect())
    start = time.monotonic()
    if greeting:
        w.send(greeting)
    cmd, headers, _ = w.read(timeout=10)
    elapsed = time.monotonic() - start
    assert (cmd, headers.get("message")) == ("ERROR", "connect timeout")
    assert 0.35 <= elapsed < 3.0, elapsed
    read_until_gone(w.sock)
    assert_still_serving(b, before)


def small_buffer_subscriber(b, destination: str, sub_id: str) -> Wire:
    """A subscriber with a small receive buffer, so the kernel cannot absorb a flood for it."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    raw.settimeout(10)
    raw.connect(b.address)
    slow = Wire(raw)
    slow.connect()
    slow.frame("SUBSCRIBE", {"id": sub_id, "destination": destination, "receipt": "s"})
    assert slow.read()[0] == "RECEIPT"
    return slow


def test_subscriber_that_never_reads(start_broker):
    """50 MB published to a subscriber that never reads: it is cut off, the others get everything,
    and the broker's memory stays bounded."""
    max_pending = 2_000_000
    b = start_broker("processors=3", f"max_pending_bytes={max_pending}", "max_frame_size=65536",
                     "input_queue_bytes=1048576", "output_queue_bytes=1048576")
    before = pids(b)

    slow = small_buffer_subscriber(b, "/topic/flood", "slow")

    fasts = []
    for name in ("fast1", "fast2"):
        f = connected_wire(b)
        f.frame("SUBSCRIBE", {"id": name, "destination": "/topic/flood", "receipt": "f"})
        assert f.read()[0] == "RECEIPT"
        fasts.append(f)
    pub = connected_wire(b)

    body_size, n = 32 * 1024, 1600  # 52 MB
    received = [0, 0]
    raws = [bytearray(), bytearray()]
    stop = threading.Event()

    def consume(i):
        sock = fasts[i].sock
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                chunk = sock.recv(1 << 20)
            except socket.timeout:
                continue
            if not chunk:
                return
            raws[i] += chunk
            received[i] += len(chunk)

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()

    time.sleep(0.2)
    rss_before = tree_rss(b)
    rss_peak = rss_before
    per_message = body_size + 120  # body and MESSAGE headers
    deadline = time.monotonic() + 120
    try:
        for i in range(n):
            pub.frame("SEND", {"destination": "/topic/flood"}, b"%08d" % i + b"z" * (body_size - 8))
            if i % 32 == 31:
                # Pace on the fast subscribers (not on the slow one): they must never be the laggards.
                pub.frame("SEND", {"destination": "/topic/sync", "receipt": str(i)})
                assert pub.read(timeout=30)[0] == "RECEIPT"
                while min(received) < (i + 1) * body_size - 4_000_000:
                    assert time.monotonic() < deadline, f"fast subscribers stalled at {received}"
                    time.sleep(0.005)
                rss_peak = max(rss_peak, tree_rss(b))
        while min(received) < n * per_message - n * 120 and time.monotonic() < deadline:
            time.sleep(0.01)
        # ...and every message, whole and in order, to both fast subscribers
        wait_deadline = time.monotonic() + 30
        while time.monotonic() < wait_deadline:
            if all(r.count(b"\0") >= n for r in raws):
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    for r in raws:
        frames = parse_frames(bytes(r))
        assert len(frames) == n
        assert all(f[0] == "MESSAGE" and len(f[2]) == body_size for f in frames)
        assert [int(f[2][:8]) for f in frames] == list(range(n))

    rss_after = tree_rss(b)
    # The slow subscriber was cut off (it never read, so the ERROR may not have reached it either):
    # what it can still read is whole frames, the last perhaps cut by the close, far from 52 MB.
    data = read_until_gone(slow.sock, timeout=15)
    frames = parse_frames(bytes(slow.buf) + data, cut_tail=True)
    messages = [f for f in frames if f[0] == "MESSAGE"]
    assert frames[len(messages):] in ([], [frames[-1]]) and all(f[0] == "MESSAGE" for f in frames[:len(messages)])
    if len(frames) > len(messages):
        assert frames[-1][0] == "ERROR" and frames[-1][1].get("message") == "slow consumer"
    assert [int(f[2][:8]) for f in messages] == list(range(len(messages)))
    assert len(data) < 20_000_000
    assert "slow consumer" in b.log()
    # Memory: the broker never held the flood for the slow one (52 MB); allow for its 2 MB
    # allowance, batches, the 1 MB rings and allocator slack.
    bound = 24 * 1024 * 1024
    assert rss_peak - rss_before < bound, (rss_before, rss_peak)
    assert rss_after - rss_before < bound, (rss_before, rss_after)
    assert_still_serving(b, before)


def test_slow_consumer_gets_whole_frames_then_error(start_broker):
    """A consumer that falls behind and is cut off must still get a valid STOMP stream: the frames
    sent so far, whole, then the ERROR (README: "queued batches are dropped, an ERROR is appended")."""
    b = start_broker("processors=3", "max_pending_bytes=1000000")
    before = pids(b)
    slow = small_buffer_subscriber(b, "/topic/f", "s")
    pub = connected_wire(b)
    # Not reading yet: its socket fills, a batch is left half-sent, then the pending output passes
    # the limit. As soon as the broker says so, read everything (within its 1 s linger).
    for i in range(2000):
        pub.frame("SEND", {"destination": "/topic/f"}, b"%08d" % i + b"z" * (32 * 1024 - 8))
        if i % 4 == 3:
            pub.frame("SEND", {"destination": "/topic/sync", "receipt": str(i)})
            assert pub.read(timeout=30)[0] == "RECEIPT"
            if "slow consumer" in b.log():
                break
    else:
        raise AssertionError("never declared a slow consumer")
    data = bytes(slow.buf) + read_until_gone(slow.sock, timeout=15)
    frames = parse_frames(data)  # ValueError: a frame cut short and the ERROR glued to it
    assert frames[-1][0] == "ERROR" and frames[-1][1]["message"] == "slow consumer"
    messages = frames[:-1]
    assert all(f[0] == "MESSAGE" for f in messages)
    assert [int(f[2][:8]) for f in messages] == list(range(len(messages)))
    assert_still_serving(b, before)


# --- many clients -------------------------------------------------------------------------------

def test_thousand_connections_at_once(start_broker):
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 200:  # before the broker starts: it inherits the limit
        want = n + 500 if hard == resource.RLIM_INFINITY else min(hard, n + 500)
        assert want >= n + 200, f"RLIMIT_NOFILE hard limit {hard} is too low for {n} connections"
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    b = start_broker("processors=3")
    before = pids(b)
    sel = selectors.DefaultSelector()
    socks = []
    try:
        for _ in range(n):  # every connect in flight at once
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(b.address)
            socks.append(s)
            sel.register(s, selectors.EVENT_WRITE, [b""])
        connect = b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0"
        done = 0
        deadline = time.monotonic() + 60
        while done < n:
            assert time.monotonic() < deadline, f"only {done} of {n} connections got CONNECTED"
            for key, mask in sel.select(timeout=1):
                s, state = key.fileobj, key.data
                if mask & selectors.EVENT_WRITE:
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    assert err == 0, f"connect failed: errno {err}"
                    s.sendall(connect)  # a tiny frame always fits in a fresh socket's buffer
                    sel.modify(s, selectors.EVENT_READ, state)
                else:
                    chunk = s.recv(4096)
                    assert chunk, f"closed by the broker after {state[0]!r}"
                    state[0] += chunk
                    if b"\0" in state[0]:
                        assert state[0].startswith(b"CONNECTED\n"), state[0][:200]
                        sel.unregister(s)
                        done += 1
        # all still open at the same time, and the broker still does work for them
        assert all(s.fileno() >= 0 for s in socks)
        w = connected_wire(b)
        w.frame("SEND", {"destination": "/topic/x", "receipt": "ok"})
        assert w.read()[0] == "RECEIPT"
        w.close()
    finally:
        sel.close()
        for s in socks:
            s.close()
    assert_still_serving(b, before)


# --- garbage after good frames -------------------------------------------------------------------

def test_frames_before_a_bad_frame_in_the_same_write_are_processed(start_broker):
    """Good frames followed by a malformed one in one TCP segment: the good ones are handled (the
    message is published, its RECEIPT sent), then the ERROR; as when they arrive in separate reads."""
    b = start_broker("processors=3")
    before = pids(b)
    sub = connected_wire(b)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/g", "receipt": "s"})
    assert sub.read()[0] == "RECEIPT"
    w = connected_wire(b)
    w.send(b"SEND\ndestination:/topic/g\nreceipt:good\n\nhello\0"
           b"SEND\ndestination:/topic/g\r\x01bad\n\n\0")
    replies = [w.read(timeout=10)]
    if replies[0][0] != "ERROR":
        replies.append(w.read(timeout=10))
    assert [(c, h.get("receipt-id") or h.get("message")) for c, h, _ in replies] == \
        [("RECEIPT", "good"), ("ERROR", "malformed frame")]
    read_until_gone(w.sock)
    cmd, _, body = sub.read(timeout=10)
    assert (cmd, body) == ("MESSAGE", b"hello")
    assert_still_serving(b, before)


# --- encoding -----------------------------------------------------------------------------------

@pytest.mark.parametrize("version,frame", [
    ("1.2", b"SEND\ndestination:/topic/a\nreceipt:r1\nx-bad:\xff\xfe\n\nbody\0"),
    ("1.2", b"SEND\ndestination:/topic/a\nreceipt:r1\n\xc3\x28:v\n\n\0"),
    ("1.2", b"SEND\ndestination:/topic/\xed\xa0\x80\nreceipt:r1\n\n\0"),     # a UTF-16 surrogate
    ("1.2", b"SUBSCRIBE\nid:1\ndestination:/topic/\xc0\xaf\nreceipt:r1\n\n\0"),  # overlong '/'
    ("1.0", b"SEND\ndestination:/topic/a\nreceipt:r1\nx-bad:\x80\n\n\0"),
    ("1.2", b"SE\xffND\ndestination:/topic/a\nreceipt:r1\n\n\0"),
    (None, b"CONNECT\naccept-version:1.2\nlogin:\xff\xfe\nreceipt:r1\n\n\0"),
], ids=["value", "name", "surrogate", "overlong", "stomp-1.0", "command", "connect-login"])
def test_invalid_utf8_in_headers(start_broker, version, frame):
    b = start_broker("processors=3")
    before = pids(b)
    w = Wire(b.connect())
    if version is not None:
        w.connect(version)
    w.send(frame)
    headers = expect_error_then_close(w, "invalid UTF-8")
    assert headers.get("receipt-id") == "r1"
    assert_still_serving(b, before)


# --- what a connection may make the dispatcher hold ---------------------------------------------

def test_transactions_are_bounded_per_connection(start_broker):
    # Before: any number of transactions, each up to max_transaction_frames frames of up to
    # max_frame_size: one client could make the dispatcher hold all it sent. (Default limits:
    # max_transactions 100, max_held_bytes 64 MB.)
    b = start_broker("processors=3")
    before = pids(b)
    w = connected_wire(b)
    for i in range(100):
        w.frame("BEGIN", {"transaction": f"t{i}"})
    w.frame("BEGIN", {"transaction": "t100", "receipt": "one-more"})
    assert expect_error_then_close(w, "too many transactions")["receipt-id"] == "one-more"
    w = connected_wire(b)
    w.frame("BEGIN", {"transaction": "big"})
    body = b"x" * (1 << 20)
    for i in range(70):  # the 64th MB passes 64 MB with its headers and bookkeeping
        w.frame("SEND", {"destination": "/queue/held", "transaction": "big", "receipt": str(i),
                         "content-length": str(len(body))}, body)
        cmd, headers, _ = w.read(timeout=15)
        if cmd == "ERROR":
            break
        assert cmd == "RECEIPT"
    assert (headers["message"], headers["receipt-id"]) == ("transaction too large", "63")
    read_until_gone(w.sock)
    assert_still_serving(b, before)
