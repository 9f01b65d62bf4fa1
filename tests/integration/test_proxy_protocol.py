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
import struct
import time

import pytest

from stompbroker.protocol.proxy import V2_SIGNATURE
from stompbroker.security import hash_secret
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
