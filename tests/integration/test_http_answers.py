"""An HTTP client always gets an HTTP answer, however late the reader reads its request: the STOMP
connect timeout is the dispatcher's only for connections the reader has seen speak STOMP, and the
reader answers the others in the protocol their bytes show. The reader is held with SIGSTOP past
connect_timeout_ms while requests wait unread in its sockets (what a starved reader on a loaded
machine does by chance), so each case is deterministic."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from contextlib import contextmanager

import psutil

from stompbroker.titles import process_role
from tests.stompwire import Wire

TIMEOUT_MS = 300


def reader_pid(broker) -> int:
    (pid,) = [p.pid for p in psutil.Process(broker.proc.pid).children() if process_role(p) == "reader"]
    return pid


def accepted(broker, socks: list) -> list:
    """``socks`` once the reader has accepted them all (the dispatcher counts them as clients)."""
    w = Wire(socket.create_connection(broker.address, timeout=10))
    w.connect()
    deadline = time.monotonic() + 10
    while True:
        w.frame("DIAG", body=b"session")
        clients = json.loads(w.read()[1]["session"])["clients"]
        if clients >= len(socks) + 1:
            w.sock.close()
            return socks
        assert time.monotonic() < deadline, clients
        time.sleep(0.02)


@contextmanager
def reader_stopped(broker):
    pid = reader_pid(broker)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def nothing_for(sock: socket.socket, seconds: float) -> bytes:
    """What the broker writes to ``sock`` within ``seconds`` (b"" if nothing; the socket stays open)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(65536)
    except socket.timeout:
        return b""


def read_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while True:
        more = sock.recv(65536)
        if not more:
            return data
        data += more


def test_a_request_the_reader_reads_after_the_connect_timeout_gets_its_http_answer(start_broker):
    # Before: the dispatcher's connect timeout fired while the reader had not read the request, and
    # the client got "ERROR\nmessage:connect timeout" (a STOMP frame) instead of an HTTP response.
    b = start_broker("processors=3", f"connect_timeout_ms={TIMEOUT_MS}")
    requests = {
        "/api/overview": b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\n\r\n",  # the dispatcher answers it
        "/health_check": b"GET /health_check HTTP/1.1\r\n\r\n",                     # the reader does
        "split head": b"GET /api/queues HTTP/1.1\r\nHo",                           # unfinished: 408 by the reader
    }
    socks = dict(zip(requests, accepted(b, [socket.create_connection(b.address, timeout=10) for _ in requests])))
    with reader_stopped(b):
        for name, request in requests.items():
            socks[name].sendall(request)
        # ten connect timeouts pass on the first socket, then the others are looked at
        early = {name: nothing_for(sock, 0.05 if i else 10 * TIMEOUT_MS / 1000) for i, (name, sock) in
                 enumerate(socks.items())}
        assert early == dict.fromkeys(socks, b""), early  # nothing STOMP while the reader has not read them
    answers = {name: read_all(sock) for name, sock in socks.items()}
    for sock in socks.values():
        sock.close()
    assert answers["/api/overview"].startswith(b"HTTP/1.1 200 "), answers
    assert answers["/health_check"].startswith(b"HTTP/1.1 200 "), answers
    assert answers["split head"].startswith(b"HTTP/1.1 408 "), answers
    assert "Traceback" not in b.log()


def test_a_stomp_client_whose_connect_waited_unread_is_judged_by_it(start_broker):
    b = start_broker("processors=3", f"connect_timeout_ms={TIMEOUT_MS}")
    silent, sock = accepted(b, [socket.create_connection(b.address, timeout=10) for _ in range(2)])
    w = Wire(sock)
    with reader_stopped(b):
        w.send(b"CONNECT\naccept-version:1.2\nhost:x\n\n\0")
        time.sleep(10 * TIMEOUT_MS / 1000)  # (nothing to wait for: the broker must stay silent meanwhile)
    cmd, headers, _ = w.read()
    assert cmd == "CONNECTED"  # its CONNECT came in time; the reader was late, not the client
    w.frame("DISCONNECT", {"receipt": "bye"})
    assert w.read()[0] == "RECEIPT"
    # a connection that said nothing still gets the STOMP connect timeout, from the reader now
    assert read_all(silent).startswith(b"ERROR\nmessage:connect timeout\n")
    silent.close()
