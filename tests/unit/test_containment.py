"""A bug while handling one connection costs that connection, not the process (and every client)."""

from __future__ import annotations

import signal
import socket

import pytest

from stompbroker.ipc import records as R
from stompbroker.processes import dispatcher, reader
from stompbroker.processes.common import Resources
from stompbroker.settings import make_config


@pytest.fixture
def resources():
    config = make_config(processors=3, input_queue_bytes=1 << 20, output_queue_bytes=1 << 20,
                         max_frame_size=65536)
    listener = socket.socket()
    res = Resources(config, listener)
    yield config, res
    signal.set_wakeup_fd(-1)  # the dispatcher installs its own for SIGHUP
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    res.close()
    listener.close()


def outbox_records(d):
    return [(kind, conn, payload) for kind, conn, _, _, payload in R.iter_records(bytes(d.outboxes[0].buf))]


def test_dispatcher_bug_closes_only_that_connection(resources, monkeypatch):
    config, res = resources
    d = dispatcher.Dispatcher(config, res)
    d.handle(R.record(R.OPEN, 1, b"127.0.0.1:1") + R.record(R.OPEN, 2, b"127.0.0.1:2"), 0.0)
    real = d.broker.on_frame

    def buggy(conn, head, body, now):
        if conn == 1:
            raise RuntimeError("a bug")
        return real(conn, head, body, now)

    monkeypatch.setattr(d.broker, "on_frame", buggy)
    head = b"CONNECT\naccept-version:1.2"
    assert d.handle(R.record(R.FRAME, 1, head, len(head)) + R.record(R.FRAME, 2, head, len(head)), 0.0)
    out = outbox_records(d)
    assert [(k, c) for k, c, _ in out] == [(R.DATA, 1), (R.CLOSE, 1), (R.DATA, 2)]
    assert out[0][2].startswith(b"ERROR\nmessage:internal error\n")
    assert out[2][2].startswith(b"CONNECTED\n")
    assert 2 in d.broker.sessions and d.broker.sessions[1].closing


def test_reader_bug_reports_a_bad_frame_and_goes_on(resources, monkeypatch):
    config, res = resources
    r = reader.Reader(config, res)
    conn = reader.Conn(7, socket.socket(), 0, None)
    monkeypatch.setattr(r, "read", lambda c, now: (_ for _ in ()).throw(RuntimeError("a bug")))
    r.serve(conn, 0, 0.0, set())
    (kind, conn_id, _, _, payload), = R.iter_records(bytes(r.out))
    assert (kind, conn_id) == (R.BAD_FRAME, 7) and payload.startswith(b"internal error\0")
    assert conn.mode == reader.DEAD
    conn.sock.close()
