"""STOMP and WebSocket over TLS (ssl_port), with certificates made on the fly."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time

import psutil
import pytest
import stomp
import trustme
import websocket

from conftest import ROOT
from stompwire import Wire
from stompbroker.titles import process_role


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def tls_files(ca, tmp_path):
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_path, key_path, ca_path = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(key_path))
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    ca.cert_pem.write_to_path(str(ca_path))
    return cert_path, key_path, ca_path


@pytest.fixture
def tls_broker(start_broker, tls_files):
    cert, key, _ = tls_files
    port = free_port()
    b = start_broker(f"ssl_port={port}", f"ssl_cert={cert}", f"ssl_key={key}")
    b.tls_port = port
    return b


def tls_wire(broker, ca, **context_options) -> Wire:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    for name, value in context_options.items():
        getattr(context, name)(*value)
    raw = socket.create_connection(("127.0.0.1", broker.tls_port), timeout=10)
    return Wire(context.wrap_socket(raw, server_hostname="localhost"))


def test_stomp_over_tls_with_large_frames_and_ordering(tls_broker, ca):
    sub = tls_wire(tls_broker, ca)
    sub.connect()
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/secure", "receipt": "s"})
    assert sub.read()[:2] == ("RECEIPT", {"receipt-id": "s"})
    pub = Wire(tls_broker.connect())  # a plain client publishes to a TLS subscriber
    pub.connect()
    big = bytes(range(256)) * 2000
    pub.frame("SEND", {"destination": "/topic/secure", "content-length": len(big)}, big)
    for i in range(500):
        pub.frame("SEND", {"destination": "/topic/secure"}, str(i).encode())
    assert sub.read(timeout=20)[2] == big
    assert [sub.read()[2] for _ in range(500)] == [str(i).encode() for i in range(500)]
    sub.frame("DISCONNECT", {"receipt": "bye"})
    assert sub.read()[:2] == ("RECEIPT", {"receipt-id": "bye"})
    sub.expect_closed()


def test_stomp_py_over_tls(tls_broker, tls_files):
    _, _, ca_path = tls_files
    conn = stomp.Connection12([("127.0.0.1", tls_broker.tls_port)])
    conn.set_ssl(for_hosts=[("127.0.0.1", tls_broker.tls_port)], ca_certs=str(ca_path))
    conn.connect(wait=True)
    assert conn.is_connected()
    conn.disconnect()


def test_wss(tls_broker, tls_files):
    _, _, ca_path = tls_files
    ws = websocket.create_connection(f"wss://localhost:{tls_broker.tls_port}/stomp", subprotocols=["v12.stomp"],
                                     sslopt={"ca_certs": str(ca_path)}, timeout=10)
    ws.send("CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
    assert ws.recv().startswith("CONNECTED\n")
    ws.send("SUBSCRIBE\nid:1\ndestination:/topic/w\n\n\0SEND\ndestination:/topic/w\n\nover wss\0")
    frame = ws.recv()
    assert frame.startswith("MESSAGE\n") and frame.endswith("\n\nover wss\0")
    ws.close()


def test_plain_stomp_on_the_tls_port_fails_cleanly(tls_broker):
    w = Wire(socket.create_connection(("127.0.0.1", tls_broker.tls_port), timeout=5))
    w.send(b"CONNECT\naccept-version:1.2\n\n\0")
    try:
        w.expect_closed()
    except ConnectionResetError:
        pass  # closed with its unread bytes: a reset is a close too
    assert Wire(tls_broker.connect()).connect()["version"] == "1.2"  # the broker still serves


def test_client_certificates_required(start_broker, tls_files, ca, tmp_path):
    cert, key, ca_path = tls_files
    port = free_port()
    b = start_broker(f"ssl_port={port}", f"ssl_cert={cert}", f"ssl_key={key}", f"ssl_ca={ca_path}",
                     "ssl_verify_client=required")
    b.tls_port = port
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        w = tls_wire(b, ca)  # no client certificate
        w.connect()
    client = ca.issue_cert("client@example")
    client_pem = tmp_path / "client.pem"
    client.private_key_and_cert_chain_pem.write_to_path(str(client_pem))
    w = tls_wire(b, ca, load_cert_chain=(str(client_pem),))
    assert w.connect()["version"] == "1.2"


def test_bad_certificate_stops_the_start(tmp_path):
    missing = tmp_path / "missing.pem"
    proc = subprocess.run([sys.executable, "-m", "stompbroker", "port=0", f"ssl_port={free_port()}",
                           f"ssl_cert={missing}", f"ssl_key={missing}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "cannot start" in proc.stderr


def reader_pid(broker) -> int:
    for child in psutil.Process(broker.proc.pid).children():
        if process_role(child) == "reader":
            return child.pid
    raise AssertionError("no reader process")


def test_client_close_and_writer_output_in_one_batch(tls_broker, ca):
    """The reader sees a client's close and output from that client's writer in one batch of
    events: handling the close must not leave the output's event to act on a closed socket. The
    reader is paused so both are waiting when it wakes; the writer's output is heart-beats."""
    wires = []
    for _ in range(20):
        w = tls_wire(tls_broker, ca)
        w.connect(**{"heart-beat": "0,100"})
        wires.append(w)
    pid = reader_pid(tls_broker)
    os.kill(pid, signal.SIGSTOP)
    try:
        for w in wires:
            w.close()
        time.sleep(0.3)  # the writer beats into every connection meanwhile
    finally:
        os.kill(pid, signal.SIGCONT)
    probe = tls_wire(tls_broker, ca)  # the reader still serves, after handling every close
    probe.connect()
    probe.frame("DISCONNECT", {"receipt": "last"})
    assert probe.read()[:2] == ("RECEIPT", {"receipt-id": "last"})
    log = tls_broker.log()
    errors = log.count("internal error")
    assert errors == 0 and "Traceback" not in log, f"{errors} internal errors in 20 connections:\n{log[-3000:]}"


def test_quick_tls_closes_cause_no_internal_error(tls_broker, ca):
    """Clients that close right after sending CONNECT, or CONNECT and DISCONNECT, 30 at a time,
    as happens in production: each close must be an ordinary one, never an internal error."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    for round in range(4):
        wires = []
        for _ in range(30):
            raw = socket.create_connection(("127.0.0.1", tls_broker.tls_port), timeout=10)
            wires.append(Wire(context.wrap_socket(raw, server_hostname="localhost")))
        for w in wires:
            w.send(b"CONNECT\naccept-version:1.2\n\n\0" + (b"DISCONNECT\n\n\0" if round % 2 else b""))
        for w in wires:
            w.close()
    probe = tls_wire(tls_broker, ca)
    probe.connect()
    probe.frame("DISCONNECT", {"receipt": "last"})
    assert probe.read()[:2] == ("RECEIPT", {"receipt-id": "last"})
    log = tls_broker.log()
    errors = log.count("internal error")
    assert errors == 0 and "Traceback" not in log, f"{errors} internal errors in 121 connections:\n{log[-3000:]}"
