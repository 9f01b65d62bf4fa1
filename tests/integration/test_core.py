"""Broker core over TCP: the STOMP protocol, limits and the processes, against the real broker."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import psutil
import pytest
import stomp

from stompwire import Wire
from stompbroker.titles import process_role


def wire(broker, version="1.2", **headers) -> Wire:
    w = Wire(broker.connect())
    if version is not None:
        w.connect(version, **headers)
    return w


def roles(broker) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for child in psutil.Process(broker.proc.pid).children():
        role = process_role(child)
        if role is not None and role != "supervisor":
            # (a child just forked still carries the supervisor's title until it names itself)
            found.setdefault(role.rstrip("-0123456789").rstrip("-"), []).append(child.pid)
    return found


def wait_roles(broker, predicate, timeout=10.0) -> dict[str, list[int]]:
    """Wait until the broker's process roles satisfy predicate(roles); return them."""
    return wait_until(lambda: (lambda r: r if predicate(r) else None)(roles(broker)), timeout)


def wait_until(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


class Collector(stomp.ConnectionListener):
    def __init__(self):
        self.messages = []
        self.errors = []
        self.cond = threading.Condition()

    def on_message(self, frame):
        with self.cond:
            self.messages.append(frame)
            self.cond.notify_all()

    def on_error(self, frame):
        with self.cond:
            self.errors.append(frame)
            self.cond.notify_all()

    def wait_for(self, n, timeout=20.0):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= n, timeout), \
                f"got {len(self.messages)} of {n} messages"
        return self.messages


def stomp_client(broker, listener=None, version=1.2):
    cls = {1.0: stomp.Connection10, 1.1: stomp.Connection11, 1.2: stomp.Connection12}[version]
    conn = cls([broker.address], heartbeats=(0, 0))
    listener = listener or Collector()
    conn.set_listener("collector", listener)
    conn.connect(wait=True)
    return conn, listener


# -- processes -----------------------------------------------------------------------------------

def test_processors_4_gives_one_reader_one_dispatcher_two_writers(start_broker):
    b = start_broker("processors=4")
    expected = {"reader": 1, "dispatcher": 1, "writer": 2}
    found = wait_roles(b, lambda r: {k: len(v) for k, v in r.items()} == expected)
    assert {k: len(v) for k, v in found.items()} == expected


def test_processors_1_still_has_one_writer(start_broker):
    b = start_broker("processors=1")
    found = wait_roles(b, lambda r: len(r) == 3)
    assert {k: len(v) for k, v in found.items()} == {"reader": 1, "dispatcher": 1, "writer": 1}


def test_startup_prints_effective_settings(start_broker):
    b = start_broker("processors=3", "TTL=5000", "max_connections=77")
    log = b.log()
    assert "TTL=5000" in log and "max_connections=77" in log and "processors=3" in log


def test_killed_writer_is_restarted_and_broker_keeps_serving(start_broker):
    b = start_broker("processors=4")
    before = wait_roles(b, lambda r: len(r.get("writer", [])) == 2)
    victim = before["writer"][0]
    os.kill(victim, signal.SIGKILL)
    after = wait_roles(b, lambda r: len(r.get("writer", [])) == 2 and victim not in r["writer"])
    assert after["reader"] == before["reader"] and after["dispatcher"] == before["dispatcher"]
    assert "writer-0" in b.log() or "writer-1" in b.log()
    assert "killed by signal SIGKILL" in b.log()
    # New connections land on both writers (round-robin): each must work end to end.
    for i in range(4):
        w = wire(b)
        w.frame("SUBSCRIBE", {"id": "s", "destination": f"/topic/after-{i}"})
        w.frame("SEND", {"destination": f"/topic/after-{i}", "receipt": "r"}, b"x")
        frames = {w.read()[0], w.read()[0]}
        assert frames == {"MESSAGE", "RECEIPT"}
        w.close()


def test_killed_dispatcher_restarts_everything(start_broker):
    b = start_broker("processors=3")
    before = wait_roles(b, lambda r: len(r) == 3)
    os.kill(before["dispatcher"][0], signal.SIGKILL)
    wait_roles(b, lambda r: len(r) == 3 and r["dispatcher"] != before["dispatcher"])
    w = wire(b)
    w.frame("SEND", {"destination": "/topic/x", "receipt": "ok"})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "ok"})


def test_sigterm_flushes_and_exits_cleanly(start_broker):
    b = start_broker("processors=3")
    sub = wire(b)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/bye", "receipt": "s"})
    assert sub.read()[0] == "RECEIPT"
    pub = wire(b)
    for i in range(200):
        pub.frame("SEND", {"destination": "/topic/bye"}, str(i).encode())
    pub.frame("SEND", {"destination": "/topic/bye", "receipt": "last"}, b"200")
    assert pub.read()[0] == "RECEIPT"
    children = psutil.Process(b.proc.pid).children()
    assert b.stop(signal.SIGTERM) == 0
    bodies = [sub.read()[2] for _ in range(201)]
    assert bodies == [str(i).encode() for i in range(201)]
    sub.expect_closed()
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive
    assert "graceful shutdown" in b.log() and "stopped" in b.log()


def test_sigint_stops_fast(start_broker):
    b = start_broker("processors=3")
    children = psutil.Process(b.proc.pid).children()
    assert b.stop(signal.SIGINT) == 0
    assert not psutil.wait_procs(children, timeout=5)[1]
    assert "fast shutdown" in b.log()


# -- connecting ----------------------------------------------------------------------------------

def test_connected_headers_and_version_negotiation(broker):
    w = wire(broker, version=None)
    w.frame("CONNECT", {"accept-version": "1.0,1.1", "host": "x"})
    cmd, headers, _ = w.read()
    assert cmd == "CONNECTED"
    assert headers["version"] == "1.1"
    assert headers["server"].startswith("stompbroker/")
    assert headers["session"]
    assert headers["heart-beat"] == "0,0"


def test_stomp_command_and_no_accept_version_means_1_0(broker):
    w = wire(broker, version=None)
    w.frame("STOMP", {"host": "x"})
    cmd, headers, _ = w.read()
    assert cmd == "CONNECTED" and headers["version"] == "1.0"


def test_no_common_version_is_an_error_listing_supported_versions(broker):
    w = wire(broker, version=None)
    w.frame("CONNECT", {"accept-version": "2.0,3.1", "receipt": "r"})
    cmd, headers, body = w.read()
    assert cmd == "ERROR"
    assert headers["version"] == "1.0,1.1,1.2"
    assert headers["receipt-id"] == "r"
    assert b"1.0 1.1 1.2" in body
    w.expect_closed()


@pytest.mark.parametrize("frame,message", [
    (b"SEND\ndestination:/topic/a\n\nx\0", "not connected"),
    (b"SUBSCRIBE\nid:1\ndestination:/a\n\n\0", "not connected"),
    (b"FOO\n\n\0", "unknown command"),
])
def test_frames_before_connect_are_refused(broker, frame, message):
    w = wire(broker, version=None)
    w.send(frame)
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"]) == ("ERROR", message)
    w.expect_closed()


def test_second_connect_is_an_error(broker):
    w = wire(broker)
    w.frame("CONNECT", {"accept-version": "1.2", "receipt": "again"})
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "already connected", "again")
    w.expect_closed()


# -- messaging -----------------------------------------------------------------------------------

def test_send_subscribe_message_headers(broker):
    sub = wire(broker)
    sub.frame("SUBSCRIBE", {"id": "sub-1", "destination": "/topic/h", "receipt": "s"})
    assert sub.read()[:2] == ("RECEIPT", {"receipt-id": "s"})
    pub = wire(broker)
    pub.frame("SEND", {"destination": "/topic/h", "content-type": "text/plain", "custom": "value",
                       "receipt": "p", "transaction-free": "yes"}, b"hello")
    assert pub.read()[:2] == ("RECEIPT", {"receipt-id": "p"})
    cmd, headers, body = sub.read()
    assert cmd == "MESSAGE" and body == b"hello"
    assert headers["subscription"] == "sub-1"
    assert headers["destination"] == "/topic/h"
    assert headers["message-id"]
    assert headers["content-length"] == "5"
    assert headers["content-type"] == "text/plain"
    assert headers["custom"] == "value"
    assert "receipt" not in headers


def test_every_matching_subscription_gets_the_message(broker):
    a, b = wire(broker), wire(broker)
    a.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/fan"})
    a.frame("SUBSCRIBE", {"id": "2", "destination": "/topic/*", "receipt": "r"})
    b.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/fan", "receipt": "r"})
    assert a.read()[0] == b.read()[0] == "RECEIPT"
    b.frame("SEND", {"destination": "/topic/fan"}, b"m")
    got = sorted(a.read()[1]["subscription"] for _ in range(2))
    assert got == ["1", "2"]
    assert b.read()[1]["subscription"] == "1"


def test_wildcard_send_is_refused(broker):
    w = wire(broker)
    w.frame("SEND", {"destination": "/topic/*", "receipt": "w"})
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "wildcard destination", "w")


def test_unsubscribe_by_id_stops_delivery(broker):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "u", "destination": "/topic/unsub"})
    w.frame("UNSUBSCRIBE", {"id": "u"})
    w.frame("SEND", {"destination": "/topic/unsub", "receipt": "done"}, b"lost")
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "done"})


def test_unsubscribe_by_destination_in_1_0(broker):
    w = wire(broker, version="1.0")
    w.frame("SUBSCRIBE", {"destination": "/topic/ten"})
    w.frame("SEND", {"destination": "/topic/ten", "receipt": "1"}, b"a")
    first = {w.read()[0], w.read()[0]}
    assert first == {"MESSAGE", "RECEIPT"}
    w.frame("UNSUBSCRIBE", {"destination": "/topic/ten"})
    w.frame("SEND", {"destination": "/topic/ten", "receipt": "2"}, b"b")
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "2"})


def test_disconnect_receipt_then_close(broker):
    w = wire(broker)
    w.frame("DISCONNECT", {"receipt": "bye"})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "bye"})
    w.expect_closed()


def test_binary_body_with_nuls_1mb(broker):
    body = bytes(range(256)) * 4096  # 1 MiB, NULs included
    sub = wire(broker)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/bin", "receipt": "s"})
    assert sub.read()[0] == "RECEIPT"
    pub = wire(broker)
    pub.frame("SEND", {"destination": "/topic/bin", "content-length": len(body)}, body)
    cmd, headers, got = sub.read(timeout=20)
    assert cmd == "MESSAGE" and headers["content-length"] == str(len(body)) and got == body


def test_header_escaping_round_trip_1_2(broker):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "e", "destination": "/topic/esc"})
    w.send(b"SEND\ndestination:/topic/esc\nweird:a\\cb\\nc\\\\d\\re\nreceipt:x\n\n\0")
    frames = {}
    for _ in range(2):
        cmd, headers, _ = w.read()
        frames[cmd] = headers
    assert frames["MESSAGE"]["weird"] == "a\\cb\\nc\\\\d\\re"  # re-escaped on the wire


def test_invalid_escape_is_an_error(broker):
    w = wire(broker)
    w.send(b"SEND\ndestination:/topic/a\nbad:\\t\nreceipt:q\n\n\0")
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"]) == ("ERROR", "invalid header escape")
    w.expect_closed()


def test_1_0_headers_are_not_unescaped(broker):
    w = wire(broker, version="1.0")
    w.frame("SUBSCRIBE", {"destination": "/topic/raw10", "id": "r"})
    w.send(b"SEND\ndestination:/topic/raw10\nv:a\\nb:c\nreceipt:z\n\n\0")
    cmd, headers, _ = w.read()  # the MESSAGE is queued before the RECEIPT
    assert cmd == "MESSAGE" and headers["v"] == "a\\nb:c"


def test_repeated_header_first_wins(broker):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "r", "destination": "/topic/rep"})
    w.send(b"SEND\ndestination:/topic/rep\nk:first\nk:second\n\n\0")
    cmd, headers, _ = w.read()
    assert cmd == "MESSAGE" and headers["k"] == "first"


def test_crlf_frames_and_eols_between_frames(broker):
    w = wire(broker, version=None)
    w.send(b"\r\n\nCONNECT\r\naccept-version:1.2\r\n\r\n\0\r\n\n"
           b"SUBSCRIBE\r\nid:1\r\ndestination:/topic/crlf\r\n\r\n\0\n\n"
           b"SEND\r\ndestination:/topic/crlf\r\nreceipt:c\r\n\r\nbody\0")
    assert w.read()[0] == "CONNECTED"
    got = {}
    for _ in range(2):
        cmd, headers, body = w.read()
        got[cmd] = body
    assert got == {"RECEIPT": b"", "MESSAGE": b"body"}


def test_frame_written_one_byte_at_a_time(broker):
    w = wire(broker, version=None)
    w.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for byte in b"CONNECT\naccept-version:1.2\nheart-beat:0,0\n\n\0":
        w.send(bytes([byte]))
        time.sleep(0.001)
    assert w.read()[0] == "CONNECTED"


def test_1000_pipelined_sends_in_one_write(broker):
    sub = wire(broker)
    sub.frame("SUBSCRIBE", {"id": "p", "destination": "/topic/pipe", "receipt": "s"})
    assert sub.read()[0] == "RECEIPT"
    pub = wire(broker)
    data = b"".join(b"SEND\ndestination:/topic/pipe\n\n%d\0" % i for i in range(1000))
    pub.send(data + b"SEND\ndestination:/topic/pipe\nreceipt:end\n\nend\0")
    assert pub.read()[:2] == ("RECEIPT", {"receipt-id": "end"})
    bodies = [sub.read()[2] for _ in range(1001)]
    assert bodies == [str(i).encode() for i in range(1000)] + [b"end"]


def test_10000_messages_arrive_in_order_with_stomp_py(broker):
    conn, listener = stomp_client(broker)
    conn.subscribe("/topic/order", id="o")
    pub, _ = stomp_client(broker)
    pub.send("/topic/sync", "x", receipt="sync")  # receipts are ordered after the SUBSCRIBE above
    time.sleep(0.2)
    for i in range(10_000):
        pub.send("/topic/order", str(i))
    messages = listener.wait_for(10_000, timeout=60)
    assert [m.body for m in messages] == [str(i) for i in range(10_000)]
    conn.disconnect()
    pub.disconnect()


# -- errors and limits ---------------------------------------------------------------------------

@pytest.mark.parametrize("frame,message", [
    (b"SEND\nreceipt:r\n\n\0", "missing destination"),
    (b"SUBSCRIBE\nid:1\nreceipt:r\n\n\0", "missing destination"),
    (b"SUBSCRIBE\ndestination:/a\nreceipt:r\n\n\0", "missing id"),
    (b"SUBSCRIBE\nid:1\ndestination:/a\nack:sometimes\nreceipt:r\n\n\0", "invalid ack mode"),
    (b"UNSUBSCRIBE\nreceipt:r\n\n\0", "missing id"),
    (b"BOGUS\nreceipt:r\n\n\0", "unknown command"),
    (b"SEND\ndestination:/a\nno colon here\nreceipt:r\n\n\0", "malformed header"),
    (b"SEND\ndestination:/a\ncontent-length:x\nreceipt:r\n\n\0", "invalid content-length"),
    (b"SEND\ndestination:/a\ncontent-length:1\nreceipt:r\n\nab\0", "missing NUL after body"),
])
def test_bad_frames_get_error_with_receipt_id_then_close(broker, frame, message):
    w = wire(broker)
    w.send(frame)
    cmd, headers, body = w.read()
    assert cmd == "ERROR"
    assert headers["message"] == message
    assert headers["receipt-id"] == "r"
    assert body
    w.expect_closed()


def test_limits_frame_size_headers_line_length(start_broker):
    b = start_broker("max_frame_size=1000", "max_headers=5", "max_header_line=100")
    cases = [
        (b"SEND\ndestination:/a\ncontent-length:5000\n\n", "frame too large"),
        (b"SEND\ndestination:/a\n\n" + b"x" * 2000, "frame too large"),
        (b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(10)) + b"\n\0", "too many headers"),
        (b"SEND\ndestination:/a\nlong:" + b"y" * 200 + b"\n\n\0", "header line too long"),
    ]
    for frame, message in cases:
        w = wire(b)
        w.send(frame)
        cmd, headers, _ = w.read()
        assert (cmd, headers["message"]) == ("ERROR", message)
        w.expect_closed()
    assert wire(b) is not None  # the broker still serves


def test_max_connections(start_broker):
    b = start_broker("max_connections=3")
    keep = [wire(b) for _ in range(3)]
    extra = Wire(b.connect())
    cmd, headers, _ = extra.read()
    assert (cmd, headers["message"]) == ("ERROR", "too many connections")
    extra.expect_closed()
    keep[0].frame("DISCONNECT", {"receipt": "x"})
    keep[0].read()
    keep[0].expect_closed()
    wait_until(lambda: _can_connect(b))


def _can_connect(b) -> bool:
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2"})
    ok = w.read()[0] == "CONNECTED"
    w.close()
    return ok


def test_max_subscriptions(start_broker):
    b = start_broker("max_subscriptions=2")
    w = wire(b)
    w.frame("SUBSCRIBE", {"id": "1", "destination": "/a"})
    w.frame("SUBSCRIBE", {"id": "2", "destination": "/b"})
    w.frame("SUBSCRIBE", {"id": "3", "destination": "/c", "receipt": "third"})
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "too many subscriptions", "third")


def test_duplicate_subscription_id(broker):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "d", "destination": "/a"})
    w.frame("SUBSCRIBE", {"id": "d", "destination": "/b"})
    assert w.read()[1]["message"] == "duplicate subscription"


def test_connect_timeout(start_broker):
    b = start_broker("connect_timeout_ms=300")
    w = Wire(b.connect())
    w.send(b"CONNECT\naccept-ver")  # half a CONNECT, then silence
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"]) == ("ERROR", "connect timeout")
    w.expect_closed()


# -- heart-beats ---------------------------------------------------------------------------------

def test_heart_beat_negotiation_and_broker_beats(start_broker):
    b = start_broker("heartbeat_min_ms=100")
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": "0,200"})
    cmd, headers, _ = w.read()
    assert headers["heart-beat"] == "100,0"
    # The broker must now send something at least every 200 ms.
    w.sock.settimeout(2)
    start = time.monotonic()
    beats = 0
    while time.monotonic() - start < 1.0:
        chunk = w.sock.recv(10)
        assert chunk.strip(b"\n") == b""
        beats += chunk.count(b"\n")
    assert beats >= 4


def test_silent_client_is_disconnected_after_interval_and_grace(start_broker):
    b = start_broker("heartbeat_grace_ms=300")
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": "200,0"})
    cmd, headers, _ = w.read()
    assert headers["heart-beat"] == "0,200"
    start = time.monotonic()
    cmd, headers, _ = w.read(timeout=5)
    assert (cmd, headers["message"]) == ("ERROR", "heart-beat timeout")
    assert 0.4 <= time.monotonic() - start < 3
    w.expect_closed()


def test_client_heart_beats_keep_the_connection(start_broker):
    b = start_broker("heartbeat_grace_ms=200")
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": "200,0"})
    w.read()
    for _ in range(10):
        time.sleep(0.15)
        w.send(b"\n")
    w.frame("SEND", {"destination": "/topic/hb", "receipt": "alive"})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "alive"})


def test_heart_beats_are_judged_exactly_with_a_short_grace(start_broker):
    """heartbeat_grace_ms=100: a client beating every 50 ms (deadline 100 ms + 100 ms) stays for
    2 s; once silent it is closed soon after its deadline."""
    b = start_broker("heartbeat_grace_ms=100", "heartbeat_min_ms=100")
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": "50,0"})
    assert w.read()[1]["heart-beat"] == "0,100"
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        time.sleep(0.05)
        w.send(b"\n")
    w.frame("SEND", {"destination": "/topic/hb", "receipt": "alive"})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "alive"})
    start = time.monotonic()
    cmd, headers, _ = w.read(timeout=5)
    assert (cmd, headers["message"]) == ("ERROR", "heart-beat timeout")
    assert 0.2 <= time.monotonic() - start < 2
    w.expect_closed()


def test_heart_beat_out_of_range_and_invalid(start_broker):
    b = start_broker("heartbeat_max_ms=1000")
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": "5000,0"})
    assert w.read()[1]["message"] == "heart-beat out of range"
    w = Wire(b.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": "soon"})
    assert w.read()[1]["message"] == "invalid heart-beat"


# -- flow ----------------------------------------------------------------------------------------

def test_slow_consumer_is_closed_and_does_not_stall_a_fast_one(start_broker):
    b = start_broker("processors=3", "max_pending_bytes=4000000")
    slow = wire(b)  # subscribes, then never reads until the end
    slow.frame("SUBSCRIBE", {"id": "s", "destination": "/topic/flood", "receipt": "s"})
    assert slow.read()[0] == "RECEIPT"
    fast = wire(b)
    fast.frame("SUBSCRIBE", {"id": "f", "destination": "/topic/flood", "receipt": "f"})
    assert fast.read()[0] == "RECEIPT"
    pub = wire(b)
    body = b"z" * 10_000
    n = 4000  # 40 MB: more than the kernel buffers plus the slow consumer's allowance
    raw = bytearray()

    def consume():  # read as fast as the socket allows; parse afterwards
        fast.sock.settimeout(30)
        nuls = 0
        while nuls < n:
            chunk = fast.sock.recv(1 << 20)
            if not chunk:
                break
            raw.extend(chunk)
            nuls += chunk.count(b"\0")

    t = threading.Thread(target=consume)
    t.start()
    for i in range(n):
        pub.frame("SEND", {"destination": "/topic/flood"}, body)
        if i % 50 == 49:  # pace on receipts so the fast consumer is really the faster party
            pub.frame("SEND", {"destination": "/topic/sync", "receipt": str(i)})
            assert pub.read(timeout=30)[0] == "RECEIPT"
    t.join(60)
    fast.buf = raw
    frames = [fast.read(timeout=1) for _ in range(n)]
    assert [(f[0], len(f[2])) for f in frames] == [("MESSAGE", 10_000)] * n
    assert "slow consumer" in b.log()
    slow.sock.settimeout(10)
    data = b""
    while True:  # the slow one is cut off; it may still read what was sent before
        chunk = slow.sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    assert len(data) < n * len(body)


def test_backpressure_small_input_queue_loses_nothing(start_broker):
    b = start_broker("max_input_queue_size=20", "max_frame_size=65536", "input_queue_bytes=1")
    sub = wire(b)
    sub.frame("SUBSCRIBE", {"id": "bp", "destination": "/topic/bp", "receipt": "s"})
    assert sub.read()[0] == "RECEIPT"
    pub = wire(b)
    n = 5000
    pub.send(b"".join(b"SEND\ndestination:/topic/bp\n\n%d\0" % i for i in range(n)))
    bodies = [sub.read(timeout=30)[2] for _ in range(n)]
    assert bodies == [str(i).encode() for i in range(n)]
