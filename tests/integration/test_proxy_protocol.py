"""PROXY protocol through a real haproxy (docker/haproxy.cfg, send-proxy-v2; and send-proxy for v1):
the broker knows each client by its own address (login back-off, logs, /api/connections), and
closes without a word a trusted peer's connection that lacks a valid header, and any other peer's
that carries one. Clients pick distinct loopback source addresses (127.0.0.3, .4, ...); haproxy
reaches the broker from 127.0.0.1, the one trusted address."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import struct
import time

import pytest
import trustme

from stompbroker.protocol.proxy import V2_SIGNATURE
from stompbroker.security import hash_secret
from stompbroker.tools.natscluster import free_ports
from tests.haproxy import Haproxy
from tests.stompwire import Wire

pytestmark = [pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy not installed (apt-get install haproxy)"),
              pytest.mark.timeout(120)]

CONNECT = b"CONNECT\naccept-version:1.2\nlogin:root\npasscode:toor\n\n\0"


@pytest.fixture
def proxied(start_broker, tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\n")
    path.chmod(0o600)
    return start_broker("auth=passwd", f"passwd_file={path}", "auth_fail_delay_ms=300", "proxy_protocol=true",
                        "proxy_trusted=127.0.0.1")


@pytest.fixture
def proxied_tls(start_broker, tmp_path):
    """The proxied broker with ssl_port too; ``.tls_port``, ``.ca``."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\n")
    path.chmod(0o600)
    (tls_port,) = free_ports(1)
    b = start_broker("auth=passwd", f"passwd_file={path}", "proxy_protocol=true", "proxy_trusted=127.0.0.1",
                     f"ssl_port={tls_port}", f"ssl_cert={tmp_path / 'cert.pem'}", f"ssl_key={tmp_path / 'key.pem'}")
    b.tls_port, b.ca = tls_port, ca
    return b


def tls_passthrough(front: int, tls_port: int):
    """docker/haproxy.cfg plus a TCP frontend that passes TLS through to ssl_port with a v2 header."""
    return lambda text: text + (f"\nfrontend stomp_tls\n    bind 127.0.0.1:{front}\n    default_backend brokers_tls\n\n"
                                f"backend brokers_tls\n    server t1 127.0.0.1:{tls_port} send-proxy-v2\n")


def tls_client(port: int, source: str, ca) -> socket.socket:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context.wrap_socket(client(port, source), server_hostname="localhost")


def client(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def api_connections(port: int, source: str) -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", "/api/connections", headers={
            "Authorization": "Basic " + base64.b64encode(b"root:toor").decode()})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        return json.loads(response.read())["items"]
    finally:
        conn.close()


def closed_without_a_word(sock: socket.socket, data: bytes) -> bool:
    sock.sendall(data)
    sock.settimeout(5)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_clients_behind_haproxy_are_known_by_their_own_address(proxied, tmp_path, version):
    edit = (lambda text: text) if version == "v2" else (lambda text: text.replace("send-proxy-v2", "send-proxy"))
    with Haproxy([proxied.port] * 3, tmp_path, edit) as lb:  # UP: its health checks carry the header too
        w = Wire(client(lb.port, "127.0.0.3"))
        w.connect(login="root", passcode="toor")
        local = w.sock.getsockname()
        peers = {c["peer"] for c in api_connections(lb.port, "127.0.0.5")}  # the API through haproxy too
        assert f"{local[0]}:{local[1]}" in peers, peers
        assert not any(p.startswith("127.0.0.1:") for p in peers), peers  # never haproxy's address
        w.close()


def test_login_back_off_is_per_client_behind_haproxy(proxied, tmp_path):
    # Without the PROXY header every client has haproxy's address, so one guesser's back-off holds
    # up everyone's login (the honest login below waited seconds).
    with Haproxy([proxied.port] * 3, tmp_path) as lb:
        flood = []
        for _ in range(40):
            sock = client(lb.port, "127.0.0.3")
            sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:root\npasscode:guess\n\n\0")
            flood.append(sock)
        deadline = time.monotonic() + 10
        while "login refused for 'root' from 127.0.0.3: 1 in a row" not in proxied.log():  # in its back-off
            assert time.monotonic() < deadline, proxied.log()[-2000:]
            time.sleep(0.05)
        start = time.monotonic()
        w = Wire(client(lb.port, "127.0.0.4"))
        w.connect(login="root", passcode="toor")
        waited = time.monotonic() - start
        assert waited < 1.0, f"{waited:.2f} s"
        log = proxied.log()
        assert "login refused for 'root' from 127.0.0.3" in log and "from 127.0.0.1:" not in log
        w.close()
        for sock in flood:
            sock.close()


def test_a_trusted_peer_without_a_valid_header_is_closed_without_a_word(proxied):
    cases = {
        "no PROXY header": CONNECT,
        "malformed v1 header": b"PROXY TCP4 1.2.3.4\r\n" + CONNECT,
        "v2 header over 4096 bytes": V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", 5000),
        "unknown v2 command 3": V2_SIGNATURE + b"\x23\x11\x00\x0c" + b"\0" * 12,
    }
    for reason, data in cases.items():
        assert closed_without_a_word(client(proxied.port, "127.0.0.1"), data), reason
    log = proxied.log()
    for reason in cases:
        assert reason in log, reason
    # a good header, straight from the trusted address: its client is who the header says
    w = Wire(client(proxied.port, "127.0.0.1"))
    w.send(b"PROXY TCP4 192.0.2.44 127.0.0.1 50123 61613\r\n")
    w.connect(login="root", passcode="toor")
    assert "192.0.2.44:50123" in {c["peer"] for c in api_connections(proxied.port, "127.0.0.9")}
    w.close()


def test_a_header_from_anyone_else_is_closed_and_their_plain_connections_work(proxied, tmp_path):
    header = b"PROXY TCP4 192.0.2.1 127.0.0.1 1000 61613\r\n"
    assert closed_without_a_word(client(proxied.port, "127.0.0.2"), header + CONNECT)
    v2 = V2_SIGNATURE + b"\x21\x11\x00\x0c" + bytes([192, 0, 2, 1, 127, 0, 0, 1]) + b"\x03\xe8\xee\xee"
    assert closed_without_a_word(client(proxied.port, "127.0.0.2"), v2 + CONNECT)
    assert "a PROXY header where none is believed" in proxied.log()
    w = Wire(client(proxied.port, "127.0.0.2"))  # an untrusted peer may still connect directly
    w.connect(login="root", passcode="toor")
    w.close()
    with Haproxy([proxied.port] * 3, tmp_path) as lb:  # a client behind haproxy sending a header of its own
        assert closed_without_a_word(client(lb.port, "127.0.0.3"), header + CONNECT)


def test_tls_passed_through_haproxy_is_known_by_its_clients_address(proxied_tls, tmp_path):
    # haproxy in TCP mode passes TLS through to ssl_port and starts each connection with a v2 header:
    # the broker reads the header, then does the TLS handshake. Before, TLS started at the first
    # byte, so the header broke every handshake.
    b = proxied_tls
    (front,) = free_ports(1)
    with Haproxy([b.port] * 3, tmp_path, tls_passthrough(front, b.tls_port)):
        w = Wire(tls_client(front, "127.0.0.3", b.ca))
        w.connect(login="root", passcode="toor")
        local = w.sock.getsockname()
        peers = {c["peer"] for c in api_connections(b.port, "127.0.0.5")}  # (straight to the broker)
        assert f"{local[0]}:{local[1]}" in peers, peers
        assert not any(p.startswith("127.0.0.1:") for p in peers), peers
        # HTTPS through the same path: an HTTP answer with HSTS (it came in on ssl_port)
        sock = tls_client(front, "127.0.0.4", b.ca)
        sock.sendall(b"GET /health_check HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = read_to_end(sock)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"Strict-Transport-Security" in answer, answer
        w.close()
    assert "Traceback" not in b.log()


def test_tls_port_refuses_a_trusted_peer_without_a_header_and_a_header_from_anyone_else(proxied_tls):
    b = proxied_tls
    # a trusted peer starting TLS with no header: closed without a word, logged
    raw = client(b.tls_port, "127.0.0.1")
    context = ssl.create_default_context()
    b.ca.configure_trust(context)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        context.wrap_socket(raw, server_hostname="localhost")
    raw.close()
    deadline = time.monotonic() + 5
    while "no PROXY header" not in b.log():
        assert time.monotonic() < deadline, b.log()[-2000:]
        time.sleep(0.05)
    # anyone else speaks TLS from the first byte, as before
    w = Wire(tls_client(b.tls_port, "127.0.0.2", b.ca))
    w.connect(login="root", passcode="toor")
    w.close()
    # a header straight from the trusted address, then TLS: the client is who the header says
    raw = client(b.tls_port, "127.0.0.1")
    raw.sendall(b"PROXY TCP4 192.0.2.45 127.0.0.1 50124 61614\r\n")
    w = Wire(context.wrap_socket(raw, server_hostname="localhost"))
    w.connect(login="root", passcode="toor")
    assert "192.0.2.45:50124" in {c["peer"] for c in api_connections(b.port, "127.0.0.9")}
    w.close()


def read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            more = sock.recv(65536)
        except (ssl.SSLError, ConnectionError):
            return data
        if not more:
            return data
        data += more
