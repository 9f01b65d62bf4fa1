"""A bug while handling one connection costs that connection, not the process (and every client)."""

from __future__ import annotations

import logging
import selectors
import socket

from inprocess import resources  # noqa: F401 (a fixture)
from stompbroker.ipc import records as R
from stompbroker.console.http import encode_request
from stompbroker.processes import dispatcher, reader, reader_conns
from stompbroker.protocol import websocket as ws


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
    sock = socket.socket()
    conn = reader.Conn(7, sock.fileno(), None)
    monkeypatch.setattr(r, "read", lambda c, now: (_ for _ in ()).throw(RuntimeError("a bug")))
    r.serve(conn, 0, 0.0, set())
    (kind, conn_id, _, _, payload), = R.iter_records(bytes(r.out))
    assert (kind, conn_id) == (R.BAD_FRAME, 7) and payload.startswith(b"internal error\0")
    assert conn.mode == reader_conns.DEAD
    sock.close()


def test_a_reader_bug_on_an_http_request_is_answered_500_logged_once_and_counted(resources, monkeypatch, caplog):
    """Failed before: the HTTP client got a STOMP ERROR, the log a traceback, and no metric counted it."""
    config, res = resources
    r = reader.Reader(config, res)
    client, server = socket.socketpair()
    server.setblocking(False)
    conn = reader.Conn(7, server.fileno())
    r.conns[server.fileno()] = conn
    client.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    monkeypatch.setattr(ws, "wants_upgrade", lambda headers: 1 / 0)  # a bug in the reader's HTTP step
    with caplog.at_level(logging.INFO, logger="stompbroker"):
        r.serve(conn, selectors.EVENT_READ, 1.0, set())
    (kind, conn_id, _, _, payload), = R.iter_records(bytes(r.out))
    assert (kind, conn_id) == (R.HTTP, 7)
    assert payload.startswith(b"HTTP/1.1 500 ") and b"ZeroDivision" not in payload
    (line,) = [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert line.exc_info is None and line.getMessage().startswith(
        "internal error answering GET /metrics: ZeroDivisionError: division by zero at ")
    r.shared.update(r.stats)  # as the reader's loop does after each pass
    monkeypatch.undo()
    d = dispatcher.Dispatcher(config, res)
    request = {"method": "GET", "path": "/metrics", "headers": {}}
    d.handle(R.record(R.OPEN, 8, b"127.0.0.1:2") + R.record(R.HTTP_REQUEST, 8, encode_request(request)), 2.0)
    (answer,) = [payload for kind, c, payload in outbox_records(d) if c == 8 and kind != R.CLOSE]
    assert answer.startswith(b"HTTP/1.1 200 ") and b"\nstompbroker_http_internal_errors_total 1.0\n" in answer
    client.close()
    server.close()
