"""No client can stall or starve the others: while each hostile pattern runs, a well-behaved
client's round trip (SEND with a receipt -> its MESSAGE) stays under 50 ms at p99 and the broker's
memory (the RSS of all its processes) stays under a bound.

The well-behaved client runs in its own process, so the hostile clients' Python work in this
process does not show up in its timings, and the attack runs at a lower CPU priority, standing for
an attacker on another machine. Every hostile pattern is bounded in count and in time.
The figures printed (``pytest -s``) are the ones docs/reliability.md reports.

The bound is 50 ms plus the p99 the same client sees with no attack at all, measured first: on
a quiet machine (CI) that is a millisecond or two, on a shared one it absorbs what other programs
do to the timings, while a stall of the broker (seconds, before these fixes) still fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import BrokerProcess
from stompbroker.security import hash_secret
from stompwire import Wire

pytestmark = pytest.mark.timeout(300)

MB = 1 << 20
P99_MS = float(os.environ.get("STALL_P99_MS", "50"))
# Bound for the whole broker (supervisor, reader, dispatcher, writer) with default settings: ~90 MiB
# at rest, the shared-memory rings (32 MiB each, counted in every process that maps them, as their
# pages get touched), and max_partial_bytes (128 MiB) of unfinished frames with their overhead.
MEMORY_BOUND = 512 * MB

PROBE = r"""
import json, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.create_connection((host, port), timeout=10)
buf = b""
def frame(command, headers, body=b""):
    sock.sendall(("\n".join([command] + [f"{k}:{v}" for k, v in headers.items()]) + "\n\n").encode() + body + b"\0")
def read():
    global buf
    while True:
        buf = buf.lstrip(b"\r\n")
        end = buf.find(b"\0")
        if end >= 0:
            data, buf = buf[:end], buf[end + 1:]
            return data.split(b"\n", 1)[0].decode()
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("closed")
        buf += more
frame("CONNECT", {"accept-version": "1.2", "login": "honest", "passcode": "h"})
assert read() == "CONNECTED"
frame("SUBSCRIBE", {"id": "p", "destination": "/queue/probe", "receipt": "s"})
assert read() == "RECEIPT"
print("ready", flush=True)
samples = []
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    i += 1
    start = time.perf_counter()
    frame("SEND", {"destination": "/queue/probe", "receipt": str(i)}, b"ping")
    got = set()
    while got != {"RECEIPT", "MESSAGE"}:
        command = read()
        got.add(command)
        if command == "MESSAGE":
            samples.append((time.perf_counter() - start) * 1000)
    time.sleep(0.01)
print(json.dumps(samples), flush=True)
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    path = tmp_path_factory.mktemp("stall") / "passwd"
    path.write_text(f"honest:{hash_secret('h')}\nmallory:{hash_secret('m')}\n")
    path.chmod(0o600)
    b = BrokerProcess("processors=3", "auth=passwd", f"passwd_file={path}", "log_level=WARNING")
    yield b
    b.close()


def tree_rss(b) -> int:
    total = 0
    root = psutil.Process(b.proc.pid)
    for p in [root] + root.children(recursive=True):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def under_attack(b, attack, seconds: float = 4.0) -> tuple[list[float], int]:
    """Run `attack(stop_event)` in a thread while the probe measures; returns (round trips in ms,
    peak broker RSS)."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE, b.host, str(b.port), str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    assert probe.stdout.readline().strip() == "ready"
    stop = threading.Event()
    failure = []

    def run():
        # The attacker would be on another machine: here it shares the CPUs with the broker and the
        # probe, so it runs at a lower priority (this thread only) to stand for that.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            attack(stop)
        except Exception as exc:  # reported below, after the probe is collected
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    peak = 0
    while probe.poll() is None:
        peak = max(peak, tree_rss(b))
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    samples = json.loads(probe.stdout.readline())
    assert not failure, failure
    assert not thread.is_alive(), "the attack did not stop"
    return samples, peak


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def measure(name: str, b, attack, quiet: float, seconds: float = 4.0) -> None:
    """Run the attack under the probe and check the figures. A second try is allowed: on a shared
    machine another program can take the CPUs for a moment; a stall of the broker fails both."""
    for _ in range(2):
        samples, peak = under_attack(b, attack, seconds)
        figure = (f"stall figure: {name}: {len(samples)} round trips, p50 {sorted(samples)[len(samples) // 2]:.1f} "
                  f"ms, p99 {p99(samples):.1f} ms, max {max(samples):.1f} ms, broker RSS peak {peak / MB:.0f} MiB")
        print(figure)
        assert peak < MEMORY_BOUND, figure
        if len(samples) >= 50 and p99(samples) < P99_MS + quiet:
            return
    raise AssertionError(f"{figure} (bound {P99_MS} ms + {quiet:.1f} ms p99 with no attack)")


def login(b, user: str = "mallory", **kwargs) -> Wire:
    w = Wire(socket.create_connection(b.address, timeout=10, **kwargs))
    w.connect(login=user, passcode=user[0])
    return w


def burst(w: Wire, frames: list[bytes], receipt: str) -> None:
    """Pipeline `frames`, the last asking for a receipt, and wait for it (a flow-controlled client)."""
    w.send(b"".join(frames))
    while True:
        command, headers, _ = w.read(timeout=30)
        if command == "RECEIPT" and headers.get("receipt-id") == receipt:
            return
        assert command != "ERROR", headers


def send(destination: str, body: bytes = b"x", receipt: str | None = None, **headers) -> bytes:
    lines = ["SEND", f"destination:{destination}"] + [f"{k}:{v}" for k, v in headers.items()]
    if receipt is not None:
        lines.append(f"receipt:{receipt}")
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


@pytest.fixture(scope="module")
def quiet_p99(broker):
    samples, _ = under_attack(broker, lambda stop: stop.wait(5), seconds=3.0)
    print(f"stall figure: no attack: {len(samples)} round trips, p50 {sorted(samples)[len(samples) // 2]:.1f} ms, "
          f"p99 {p99(samples):.1f} ms")
    return p99(samples)


def test_selector_backlog(broker, quiet_p99):
    """20,000 messages no consumer's selector takes wait in a queue; 500 more SENDs arrive."""
    consumer = login(broker)
    consumer.frame("SUBSCRIBE", {"id": "s", "destination": "/queue/picky", "selector": "kind = 'never'",
                                 "receipt": "s"})
    consumer.read()
    producer = login(broker)
    for batch in range(20):
        burst(producer, [send("/queue/picky", kind="other") for _ in range(999)]
              + [send("/queue/picky", kind="other", receipt=f"b{batch}")], f"b{batch}")

    def attack(stop):
        for batch in range(50):  # 500 SENDs, 10 at a time
            if stop.is_set():
                return
            burst(producer, [send("/queue/picky", kind="other") for _ in range(9)]
                  + [send("/queue/picky", kind="other", receipt=f"a{batch}")], f"a{batch}")
            time.sleep(0.05)

    measure("selector backlog (20,000 waiting, 500 SENDs)", broker, attack, quiet_p99)
    consumer.close()
    producer.close()


def test_like_selectors(broker, quiet_p99):
    """A LIKE of 20,000 '_' is refused; the longest allowed one runs against 60 KB headers."""
    refused = login(broker)
    refused.frame("SUBSCRIBE", {"id": "l", "destination": "/topic/like", "receipt": "l",
                                "selector": "h LIKE '%" + "_" * 20_000 + "%'"})
    command, headers, _ = refused.read()
    assert (command, headers["message"]) == ("ERROR", "selector too long")
    consumer = login(broker)
    consumer.frame("SUBSCRIBE", {"id": "l", "destination": "/topic/like", "receipt": "l",
                                 "selector": "h LIKE '%" + "_" * 4000 + "x%'"})
    assert consumer.read()[0] == "RECEIPT"
    producer = login(broker)
    header = "a" * 60_000

    def attack(stop):
        for batch in range(100):
            if stop.is_set():
                return
            burst(producer, [send("/topic/like", h=header) for _ in range(4)]
                  + [send("/topic/like", h=header, receipt=f"l{batch}")], f"l{batch}")

    measure("LIKE selectors (60 KB headers)", broker, attack, quiet_p99)
    for w in (refused, consumer, producer):
        w.close()


def hoarders(b, count: int, first: bytes, size: int, stop, rate: int = 200 * MB) -> list:
    """`count` connections each send `first`, then body bytes up to `size` that never end the frame,
    at most `rate` bytes per second together (the attacker's own CPU would otherwise crowd the broker
    out of this shared machine; a flood of bandwidth is not the pattern under test)."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(b.address, timeout=5)
        sock.setblocking(False)
        socks.append([sock, first, 0])
    chunk = b"x" * 65536
    per_round = max(rate // 50 // len(chunk), 1)  # chunks per 20 ms round
    turn = 0
    deadline = time.monotonic() + 4
    while not stop.is_set() and time.monotonic() < deadline:
        sent = 0
        for k in range(len(socks)):
            entry = socks[(turn + k) % len(socks)]
            if entry[0] is None or entry[2] >= size:
                continue
            try:
                n = entry[0].send(entry[1] or chunk)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                entry[0] = None
                continue
            entry[1], entry[2] = b"", entry[2] + n
            sent += 1
            if sent >= per_round:
                turn = (turn + k + 1) % len(socks)
                break
        time.sleep(0.02 if sent else 0.05)
    return socks


def test_partial_frame_hoarding(broker, quiet_p99):
    """200 connections log in, then each sends 4 MB of a frame it never finishes."""
    first = b"CONNECT\naccept-version:1.2\nlogin:mallory\npasscode:m\n\n\0" \
            b"SEND\ndestination:/queue/x\ncontent-length:4000000\n\n"

    def attack(stop):
        socks = hoarders(broker, 200, first, 4 * MB, stop)
        stop.wait(5)
        for entry in socks:
            if entry[0] is not None:
                entry[0].close()

    measure("partial-frame hoarding (200 x 4 MB)", broker, attack, quiet_p99)


def test_pre_login_flood(broker, quiet_p99):
    """150 connections each send an unfinished 4 MB CONNECT; 500 more open and say nothing."""
    def attack(stop):
        socks = hoarders(broker, 150, b"CONNECT\naccept-version:1.2\ncontent-length:4000000\n\n", 4 * MB, stop)
        idle = [socket.create_connection(broker.address, timeout=5) for _ in range(500)]
        stop.wait(5)
        for sock in idle + [e[0] for e in socks if e[0] is not None]:
            sock.close()

    measure("pre-login flood (150 x 4 MB CONNECT, 500 idle)", broker, attack, quiet_p99)


def test_login_flood(broker, quiet_p99):
    """300 parallel wrong passcodes from one address (127.0.0.3)."""
    def attack(stop):
        socks = []
        for _ in range(300):
            sock = socket.create_connection(broker.address, timeout=5, source_address=("127.0.0.3", 0))
            sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:honest\npasscode:guess\n\n\0")
            socks.append(sock)
        stop.wait(5)
        for sock in socks:
            sock.close()

    measure("login flood (300 parallel guesses)", broker, attack, quiet_p99)
    # And an honest login from another address is not queued behind them.
    start = time.monotonic()
    login(broker, "honest").close()
    assert time.monotonic() - start < 1.0


def test_one_hundred_thousand_queue_names(broker, quiet_p99):
    """100,000 distinct /queue/ names, each consumed at once by a wildcard subscriber."""
    consumer = login(broker)
    consumer.frame("SUBSCRIBE", {"id": "w", "destination": "/queue/walk.*", "receipt": "w"})
    consumer.read()
    drained = threading.Event()

    def drain():
        # A consumer that keeps up: the walk is about the broker's queues, not a slow consumer's
        # unsent deliveries (those are bounded by max_pending_bytes). Quiet spells are no reason to stop.
        consumer.sock.settimeout(1.0)
        while not drained.is_set():
            try:
                if not consumer.sock.recv(1 << 20):
                    return
            except socket.timeout:
                continue
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    producer = login(broker)

    def attack(stop):
        for batch in range(400):  # 250 SENDs per receipt
            if stop.is_set():
                raise AssertionError(f"only {batch * 250} names in time")
            burst(producer, [send(f"/queue/walk.{batch}.{i}") for i in range(249)]
                  + [send(f"/queue/walk.{batch}.249", receipt=f"q{batch}")], f"q{batch}")

    measure("100,000 queue names", broker, attack, quiet_p99, seconds=10.0)
    # More names cost nothing more: idle queues are not kept (each one used to stay, ~95 MiB of the
    # dispatcher per 100,000). The first further round settles the allocator and the destination
    # cache (at most 100,000 names); the next must not grow the dispatcher, where queues live.
    def walk(prefix: str) -> int:
        for batch in range(100):
            burst(producer, [send(f"/queue/walk.{prefix}.{batch}.{i}") for i in range(999)]
                  + [send(f"/queue/walk.{prefix}.{batch}.999", receipt=f"{prefix}{batch}")], f"{prefix}{batch}")
        dispatcher, = [p for p in psutil.Process(broker.proc.pid).children() if "dispatcher" in p.name()]
        return dispatcher.memory_full_info().uss

    middle = walk("again")
    after = walk("more")
    print(f"stall figure: 100,000 queue names: dispatcher private memory (USS) {middle / MB:.0f} MiB, "
          f"{after / MB:.0f} MiB after 100,000 more")
    assert after - middle < 8 * MB
    drained.set()
    consumer.close()
    producer.close()
