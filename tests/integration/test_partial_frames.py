"""Unfinished frames cannot make the reader hoard memory: a tight limit before the first frame, a
broker-wide budget after it, and the memory goes back when the connections go."""

from __future__ import annotations

import socket
import time

import psutil
import pytest

from stompbroker.titles import process_role

pytestmark = pytest.mark.timeout(120)

MB = 1 << 20


def reader_rss(broker) -> int:
    for p in psutil.Process(broker.proc.pid).children():
        if process_role(p) == "reader":
            return p.memory_info().rss
    raise AssertionError("no reader process")


def hoard(broker, count: int, first: bytes, size: int, seconds: float = 6.0) -> tuple[list, int]:
    """`count` connections each send `first` and then body bytes up to `size`, never finishing the
    frame; returns the sockets and the reader's peak RSS seen meanwhile."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(broker.address, timeout=5)
        sock.setblocking(False)
        socks.append([sock, first, 0])
    chunk = b"x" * 65536
    peak = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy = False
        for entry in socks:
            sock, data, sent = entry
            if sent >= size or sock is None:
                continue
            try:
                n = sock.send(data or chunk)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                entry[0] = None  # closed by the broker
                continue
            entry[1], entry[2] = b"", sent + n
            busy = True
        peak = max(peak, reader_rss(broker))
        if not busy:
            time.sleep(0.05)
            if all(e[0] is None or e[2] >= size for e in socks):
                break
    for _ in range(10):
        peak = max(peak, reader_rss(broker))
        time.sleep(0.05)
    return socks, peak


def errors(socks) -> list[bytes]:
    found = []
    for sock, _, _ in socks:
        if sock is None:
            continue
        sock.setblocking(True)
        sock.settimeout(3)
        data = b""
        try:
            while b"\0" not in data:
                more = sock.recv(65536)
                if not more:
                    break
                data += more
        except OSError:
            pass
        found.append(data)
        sock.close()
    return found


def test_unfinished_connect_frames_are_cut_at_max_first_frame(start_broker):
    b = start_broker("processors=3")
    before = reader_rss(b)
    socks, peak = hoard(b, 150, b"CONNECT\naccept-version:1.2\ncontent-length:4000000\n\n", 1 * MB)
    replies = errors(socks)
    assert sum(b"message:frame too large" in r for r in replies) == 150
    assert peak - before < 48 * MB, f"reader grew by {(peak - before) / MB:.0f} MiB"


def test_unfinished_frames_stay_within_max_partial_bytes_and_memory_comes_back(start_broker):
    b = start_broker("processors=3", f"max_partial_bytes={32 * MB}")
    before = reader_rss(b)
    first = b"CONNECT\naccept-version:1.2\n\n\0SEND\ndestination:/queue/x\ncontent-length:4000000\n\n"
    socks, peak = hoard(b, 40, first, 2 * MB)
    grown = peak - before
    replies = errors(socks)  # closes every socket
    busy = sum(b"message:broker busy" in r for r in replies)
    assert busy >= 20, f"{busy} connections refused"  # 40 x 2 MB = 80 MB asked, 32 MB allowed
    assert grown < 2 * 32 * MB + 16 * MB, f"reader grew by {grown / MB:.0f} MiB"
    deadline = time.monotonic() + 5
    while reader_rss(b) - before > 16 * MB and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reader_rss(b) - before <= 16 * MB, f"{(reader_rss(b) - before) / MB:.0f} MiB not given back"


def test_a_client_writing_past_its_error_is_read_then_reset(start_broker):
    # A frame refused by its headers (content-length over max_frame_size) while the client is still
    # writing its body: the reader reads and drops up to close_read_limit, so a client writing a
    # frame somewhat larger than the limit finishes and reads its ERROR; one that goes on writing
    # is no longer read and, once the writer has closed, gets a reset. Before, it was not read at all
    # and its sendall hung in the closed window until the kernel gave up on the orphaned socket
    # (about a minute); a 5 MB frame never got to read its ERROR.
    broker = start_broker("processors=3", "close_read_limit=2097152")
    head = b"SEND\ndestination:/queue/big\ncontent-length:999999999\n\n"
    small = socket.create_connection(broker.address, timeout=10)
    small.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
    assert small.recv(4096).startswith(b"CONNECTED")
    small.sendall(head + b"z" * (5 * MB))  # within what is read and the sockets' buffers
    answer = b""
    while b"\0" not in answer:
        chunk = small.recv(4096)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"ERROR") and b"frame too large" in answer, answer
    small.close()

    flood = socket.create_connection(broker.address, timeout=10)
    flood.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0")
    assert flood.recv(4096).startswith(b"CONNECTED")
    started = time.monotonic()
    with pytest.raises(OSError) as cut:
        flood.sendall(head + b"z" * (512 * MB))
    took = time.monotonic() - started
    assert took < 8, f"the flood was told after {took:.1f} s"
    assert isinstance(cut.value, (ConnectionResetError, BrokenPipeError)), cut.value
    flood.close()
