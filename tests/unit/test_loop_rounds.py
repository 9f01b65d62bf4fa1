"""What a process's loop does per lone message (one message per wake-up, as with one receipted SEND
in flight): counted in lines of Python run (sys.settrace), a count that does not depend on the
machine. Each figure is a bound a little above today's: a change that adds per-round work shows."""

from __future__ import annotations

import socket
import sys
import time

from inprocess import resources  # noqa: F401 (a fixture)
from stompbroker.ipc import records as R
from stompbroker.processes import writer

FRAME = b"MESSAGE\ndestination:/topic/t\nmessage-id:1\nsubscription:0\ncontent-length:5\n\nhello\0"


def lines_run(fn) -> tuple[int, object]:
    """(Python lines run by fn(), its result)."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        result = fn()
    finally:
        sys.settrace(None)
    return count, result


def test_a_writer_round_with_one_message(resources):
    config, res = resources
    w = writer.Writer(0, config, res.output_rings[0], res.fd_pairs[0][1], res.writer_stats[0],
                      res.writer_latency[0])
    w.start()
    ours, theirs = socket.socketpair()
    socket.send_fds(res.fd_pairs[0][0], [R.CONN_ID.pack(1)], [theirs.fileno()])
    ring = res.output_rings[0]
    ours.settimeout(1.0)
    try:
        counts = []
        for i in range(3):  # (the first adopts the socket; the last is counted)
            ring.try_write(R.record(R.DATA, 1, FRAME, 0, R.stamp(time.monotonic())), 1)
            ring.notify()
            n, going = lines_run(w.round)
            assert going
            assert ours.recv(1024) == FRAME
            counts.append(n)
        print("writer lines per lone message", counts)
        assert counts[-1] <= 140, counts  # 163 before the loop trims (2026-11-28), 138 after
    finally:
        for c in list(w.conns.values()):
            w.discard(c)
        ours.close()
        theirs.close()
