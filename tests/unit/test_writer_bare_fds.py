"""The writer keeps each connection's bare fd: once it closes one, the number is the kernel's to give
again, and nothing meant for the closed connection may reach the connection that gets it next."""

from __future__ import annotations

import socket

from inprocess import resources  # noqa: F401 (a fixture)
from stompbroker.ipc import records as R
from stompbroker.processes import writer


def make_writer(res, config):
    w = writer.Writer(0, config, res.output_rings[0], res.fd_pairs[0][1], res.writer_stats[0],
                      res.writer_latency[0])
    w.fd_sock.setblocking(False)
    return w


def adopt(w, res, conn_id: int, theirs: socket.socket) -> writer.Conn:
    socket.send_fds(res.fd_pairs[0][0], [R.CONN_ID.pack(conn_id)], [theirs.fileno()])
    w.adopt()
    return w.conns[conn_id]


def test_output_for_a_discarded_connection_never_reaches_the_one_that_gets_its_fd(resources):
    config, res = resources
    w = make_writer(res, config)
    old_ours, old_theirs = socket.socketpair()
    new_ours, new_theirs = socket.socketpair()
    try:
        old = adopt(w, res, 1, old_theirs)
        fd = old.fd
        w.discard(old)
        assert old.fd == -1
        new = adopt(w, res, 2, new_theirs)
        assert new.fd == fd  # the kernel gave the number again
        w.append(old, b"MESSAGE\n\nfor the old one\0")  # (a late frame for it, as a bug might send)
        w.flush(old)
        w.append(new, b"MESSAGE\n\nfor the new one\0")
        w.flush(new)
        new_ours.settimeout(1.0)
        assert new_ours.recv(1024) == b"MESSAGE\n\nfor the new one\0"
    finally:
        for c in list(w.conns.values()):
            w.discard(c)
        for s in (old_ours, old_theirs, new_ours, new_theirs):
            s.close()


def test_a_connection_closed_twice_closes_its_fd_once(resources):
    config, res = resources
    w = make_writer(res, config)
    ours, theirs = socket.socketpair()
    try:
        c = adopt(w, res, 1, theirs)
        w.discard(c)
        other = socket.socket()  # takes the freed number
        try:
            w.discard(c)  # must not close the number again (it is another socket's now)
            assert other.fileno() >= 0
            other.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)  # still open
        finally:
            other.close()
    finally:
        ours.close()
        theirs.close()


def test_a_discarded_connection_s_written_count_is_reported_final(resources):
    """(Discarded is told by its fd, -1, not by a field of its own.)"""
    config, res = resources
    report, dispatcher_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    w = writer.Writer(0, config, res.output_rings[0], res.fd_pairs[0][1], res.writer_stats[0],
                      res.writer_latency[0], report)
    w.fd_sock.setblocking(False)
    ours, theirs = socket.socketpair()
    try:
        c = adopt(w, res, 1, theirs)
        w.progress.add(c)
        w.report()  # open: its count may still grow
        w.discard(c)
        w.report()
        pairs = []
        for _ in range(2):
            data = dispatcher_end.recv(4096)
            pairs.append(R.WRITTEN_PAIR.unpack_from(data, R.WRITTEN_HEAD.size))
        assert pairs == [(1, 0), (1, R.WRITTEN_FINAL)]
    finally:
        for s in (report, dispatcher_end, ours, theirs):
            s.close()
