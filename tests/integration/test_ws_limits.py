"""WebSocket framing cannot make the reader hoard memory: fragments, control frames and partial
messages count against max_first_frame, max_frame_size and max_partial_bytes, a message may come in
at most ws_max_fragments frames, and pings are answered once per read. Each offender gets a clean
close (WebSocket 1008/1009, or a STOMP ERROR and close 1000 for the STOMP-level limits), and the
reader's memory, read with psutil, stays bounded."""

from __future__ import annotations

import base64
import os
import socket
import time

import pytest

from stompbroker.protocol.websocket import OP_BIN, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, encode_client_frame, \
    parse_frame
from tests.integration.test_partial_frames import reader_rss

pytestmark = pytest.mark.timeout(120)

MB = 1 << 20
CONNECT = b"CONNECT\naccept-version:1.2\n\n\0"


def upgraded(broker) -> socket.socket:
    sock = socket.create_connection(broker.address, timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return sock


def frames_of(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of every whole server frame in data."""
    out, pos = [], 0
    while (parsed := parse_frame(data, pos)) is not None:
        _, opcode, payload, pos = parsed
        out.append((opcode, payload))
    return out


def connected(broker) -> socket.socket:
    sock = upgraded(broker)
    sock.sendall(encode_client_frame(CONNECT))
    data = b""
    while not frames_of(data):
        data += sock.recv(65536)
    assert frames_of(data)[0][1].startswith(b"CONNECTED\n")
    return sock


def flood(broker, sock: socket.socket, start: bytes, repeat: bytes, seconds: float = 6.0) -> tuple[list, int, float]:
    """Send ``start`` and then ``repeat`` over and over until the broker closes the connection (or
    ``seconds`` pass); returns the frames the broker sent, the reader's peak RSS growth and how long
    the broker took to close."""
    before = reader_rss(broker)
    sock.setblocking(False)
    batch = repeat * max(1, 65536 // len(repeat))
    pending, received, peak = start + batch, b"", 0
    began = time.monotonic()
    closed_at = None
    while time.monotonic() - began < seconds and closed_at is None:
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    closed_at = time.monotonic()
                    break
                received += chunk
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            closed_at = time.monotonic()
        if closed_at is None:
            try:
                sent = sock.send(pending)
                pending = pending[sent:] or batch
            except (BlockingIOError, InterruptedError):
                time.sleep(0.001)
            except OSError:  # reset: read what is left
                pass
        peak = max(peak, reader_rss(broker) - before)
    sock.close()
    assert closed_at is not None, f"not closed within {seconds} s"
    return frames_of(received), peak, closed_at - began


def close_code(frames) -> tuple[int, str]:
    closes = [payload for opcode, payload in frames if opcode == OP_CLOSE]
    assert closes, frames[:3]
    return int.from_bytes(closes[0][:2], "big"), closes[0][2:].decode()


@pytest.fixture(scope="module")
def broker():
    from tests.conftest import BrokerProcess
    b = BrokerProcess("processors=3", "connect_timeout_ms=60000")
    yield b
    b.close()


@pytest.mark.parametrize("stage", ["before CONNECT", "after CONNECT"])
@pytest.mark.parametrize("size", [0, 1])
def test_a_flood_of_tiny_continuation_frames_is_closed_1008_and_costs_no_memory(broker, stage, size):
    # Before the fix: 0-byte fragments grew the reader by ~140 MiB in 4 s and were cut at
    # connect_timeout_ms before CONNECT, never after it.
    sock = upgraded(broker) if stage == "before CONNECT" else connected(broker)
    frames, grown, took = flood(broker, sock, encode_client_frame(b"SEND\n", OP_TEXT, fin=False),
                                encode_client_frame(b"x" * size, OP_CONT, fin=False))
    assert close_code(frames) == (1008, "message in more than 1024 fragments")
    assert grown < 16 * MB, f"reader grew by {grown / MB:.0f} MiB"
    assert took < 5, took


def test_fragments_before_connect_count_against_max_first_frame(broker):
    # fragments of 200 bytes: over the 64 KB a client that has not logged in may make the broker hold
    # long before the fragment limit (the limits are checked after each read of at most 64 KB).
    sock = upgraded(broker)
    frames, grown, _ = flood(broker, sock, encode_client_frame(b"CONNECT\n", OP_TEXT, fin=False),
                             encode_client_frame(b"h" * 200, OP_CONT, fin=False))
    stomp = [payload for opcode, payload in frames if opcode in (OP_TEXT, OP_BIN)]
    assert stomp and stomp[0].startswith(b"ERROR\n") and b"message:frame too large" in stomp[0], frames[:2]
    assert close_code(frames)[0] == 1000
    assert grown < 16 * MB


def test_fragments_after_connect_count_against_max_frame_size(broker):
    sock = connected(broker)
    frames, grown, _ = flood(broker, sock, encode_client_frame(b"SEND\ndestination:/queue/f\n\n", OP_TEXT, fin=False),
                             encode_client_frame(b"b" * 8192, OP_CONT, fin=False))
    assert close_code(frames) == (1009, "message larger than 4194304 bytes")
    assert grown < 48 * MB, f"reader grew by {grown / MB:.0f} MiB"


def test_fragments_of_many_connections_count_against_max_partial_bytes(start_broker):
    b = start_broker("processors=3", f"max_partial_bytes={16 * MB}")
    socks = [connected(b) for _ in range(20)]
    before = reader_rss(b)
    fragment = encode_client_frame(b"p" * 8000, OP_CONT, fin=False)
    for sock in socks:  # 20 x 1.6 MB of unfinished messages asked, 16 MB allowed
        sock.sendall(encode_client_frame(b"SEND\ndestination:/queue/p\n\n", OP_BIN, fin=False))
        try:
            sock.sendall(fragment * 200)
        except OSError:
            pass  # refused already
    answers = []
    for sock in socks:
        sock.settimeout(0.5)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        answers.append(frames_of(data))
        sock.close()
    busy = sum(any(op == OP_TEXT and b"message:broker busy" in p for op, p in f) for f in answers)
    assert busy >= 8, f"{busy} connections refused"
    assert reader_rss(b) - before < 2 * 16 * MB + 16 * MB


def test_a_ping_flood_gets_one_pong_per_read(broker):
    sock = connected(broker)
    pings = encode_client_frame(b"p", OP_PING) * 20_000 + encode_client_frame(b"last", OP_PING)
    sock.sendall(pings)
    data = b""
    sock.settimeout(5)
    while not any(f == (OP_PONG, b"last") for f in frames_of(data)):
        data += sock.recv(65536)
    pongs = [f for f in frames_of(data) if f[0] == OP_PONG]
    # 120 KB of pings arrive in a few reads; before, each of the 20,001 got its own pong
    assert len(pongs) < 100, len(pongs)
    sock.close()


def test_what_a_closed_client_still_sends_is_not_read(broker):
    # Once the broker has answered a connection with a close (here 1008 for too many fragments), the
    # reader stops reading it: its TCP window closes. Before, the reader read and dropped whatever
    # it sent until the writer's linger ended, as fast as loopback goes (~0.5 GB in that second),
    # slowing every other client's round trips several times (a bystander's p99 went 5 -> 47 ms).
    sock = connected(broker)
    sock.setblocking(False)
    one = encode_client_frame(b"x", OP_CONT, fin=False)
    batch = encode_client_frame(b"SEND\n", OP_TEXT, fin=False) + one * 9000
    received, after_close, closed_at = b"", 0, None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (closed_at is None or time.monotonic() < closed_at + 0.8):
        try:
            sent = sock.send(batch)
            if closed_at is not None:
                after_close += sent
            batch = batch[sent:] or one * 9000
        except (BlockingIOError, InterruptedError):
            time.sleep(0.001)
        except OSError:
            break  # the broker cut it
        try:
            received += sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            break
        if closed_at is None and any(op == OP_CLOSE for op, _ in frames_of(received)):
            closed_at = time.monotonic()
    sock.close()
    assert closed_at is not None and close_code(frames_of(received))[0] == 1008
    assert after_close < 32 * MB, f"{after_close / MB:.0f} MiB taken after the close"
