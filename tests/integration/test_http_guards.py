"""Safer defaults of the HTTP and WebSocket port on a real broker: the Host allow-list (DNS
rebinding gets 421), WebSocket Origin same-origin when logins are checked, HSTS on the TLS port,
the console's CSP, and the start-up warnings. Tests bind loopback only; "off loopback" runs the
broker on a veth address inside a network namespace the test creates (root and iproute2 needed)."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time

import pytest

from stompbroker.security import hash_secret

KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def get(broker, path: str, host: str | None, port: int | None = None, context=None) -> tuple[int, dict, bytes]:
    """One request naming ``host`` in its Host header (None: no Host header at all)."""
    cls = http.client.HTTPSConnection if context else http.client.HTTPConnection
    kwargs = {"context": context} if context else {}
    conn = cls("127.0.0.1", port or broker.port, timeout=10, **kwargs)
    try:
        conn.putrequest("GET", path, skip_host=True)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def upgrade(broker, host: str, origin: str | None = None) -> int:
    """The status of a WebSocket upgrade naming ``host`` and ``origin``."""
    lines = ["GET / HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {KEY}", "Sec-WebSocket-Version: 13"] + ([f"Origin: {origin}"] if origin else [])
    with socket.create_connection(broker.address, timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n" not in head:
            more = sock.recv(4096)
            assert more, head
            head += more
    return int(head.split(b" ", 2)[1])


def test_dns_rebinding_names_get_421_and_everything_else_is_served(start_broker):
    b = start_broker()
    own = f"127.0.0.1:{b.port}"
    for host in (own, f"localhost:{b.port}", "localhost", f"[::1]:{b.port}", None):
        assert get(b, "/api/overview", host)[0] == 200, host
    status, head, body = get(b, "/api/overview", f"evil.example:{b.port}")
    assert status == 421 and b"http_hosts" in body and head["connection"] == "close"
    for path in ("/", "/metrics", "/api/connections", "/console/console.js", "/nothing"):
        assert get(b, path, "localhost.evil.example")[0] == 421, path
    assert get(b, "/health_check", "evil.example")[0] == 200  # load balancers and probes name anything
    assert get(b, "/api/overview", "127.0.0.1:4650\xb2")[0] == 421  # (was an internal error: found by the fuzzer)
    assert get(b, "http://evil.example/api/overview", "localhost")[0] == 421  # absolute-form names a host too
    assert get(b, "http://evil.examp]e/api/overview", "localhost")[0] == 400  # (was an internal error: the fuzzer)
    assert upgrade(b, f"evil.example:{b.port}") == 421
    assert upgrade(b, own) == 101
    assert "SECURITY" not in b.log()  # loopback: nothing to warn about

    anyone = start_broker("http_hosts=*")
    assert get(anyone, "/api/overview", "evil.example")[0] == 200
    named = start_broker("http_hosts=broker.example,.corp.example")
    assert get(named, "/api/overview", "a.corp.example")[0] == 200
    assert get(named, "/api/overview", "localhost")[0] == 421  # the list replaces the default


def test_websocket_origin_is_same_origin_when_logins_are_checked(start_broker, tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\n")
    path.chmod(0o600)
    b = start_broker("auth=passwd", f"passwd_file={path}")
    own = f"127.0.0.1:{b.port}"
    assert upgrade(b, own, "http://evil.example") == 403
    assert upgrade(b, own, f"http://127.0.0.1:{b.port + 1}") == 403
    assert upgrade(b, own, "null") == 403
    assert upgrade(b, own, f"http://{own}") == 101      # the console's own page
    assert upgrade(b, own) == 101                       # no Origin: not a browser
    listed = start_broker("auth=passwd", f"passwd_file={path}", "ws_origins=https://app.example")
    assert upgrade(listed, own, "https://app.example") == 101
    assert upgrade(listed, own, f"http://127.0.0.1:{listed.port}") == 403  # ws_origins is the whole list
    open_broker = start_broker()  # auth=off: any page (as before; ws_origins closes it)
    assert upgrade(open_broker, f"127.0.0.1:{open_broker.port}", "http://evil.example") == 101


def test_a_token_secret_alone_makes_websocket_origin_same_origin(start_broker):
    """auth=off with a token secret still checks logins: the same Origin rule as auth=passwd."""
    b = start_broker("secret=s3cret")
    own = f"127.0.0.1:{b.port}"
    assert upgrade(b, own, "http://evil.example") == 403
    assert upgrade(b, own, f"http://{own}") == 101


def test_hsts_on_every_http_answer_of_the_tls_port_only(start_broker, tmp_path):
    import trustme
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    tls = {}
    for name, extra in (("default", ()), ("off", ("hsts_max_age=0",))):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        tls[name] = (start_broker(f"ssl_port={port}", f"ssl_cert={tmp_path / 'cert.pem'}",
                                  f"ssl_key={tmp_path / 'key.pem'}", *extra), port)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    b, port = tls["default"]
    for path, host, status in (("/api/overview", "localhost", 200), ("/", "localhost", 200),
                               ("/health_check", None, 200), ("/nothing", "localhost", 404),
                               ("/api/overview", "evil.example", 421)):
        got, head, _ = get(b, path, host, port, context)
        assert got == status and head["strict-transport-security"] == "max-age=31536000", (path, head)
    assert "strict-transport-security" not in get(b, "/api/overview", "localhost")[1]  # plain port
    b, port = tls["off"]
    assert "strict-transport-security" not in get(b, "/api/overview", "localhost", port, context)[1]


def test_the_console_may_connect_to_its_own_broker_only(start_broker):
    b = start_broker()
    status, head, _ = get(b, "/", "localhost")
    assert status == 200
    policy = head["content-security-policy"]
    assert "connect-src 'self';" in policy and "ws:" not in policy and "wss:" not in policy
    # tests/integration/test_console.py drives the page in headless chromium under this policy


def test_a_first_word_cut_across_reads_is_answered_in_its_own_protocol(start_broker):
    # Found by the edge fuzzer: "OPT" in one read and "IONS / HTTP/1.1..." in the next was taken for
    # STOMP, and got a STOMP ERROR at connect_timeout_ms instead of an HTTP answer.
    b = start_broker("connect_timeout_ms=4000")
    for first, rest, answer in ((b"OPT", b"IONS /api/overview HTTP/1.1\r\nHost: localhost\r\n\r\n", b"HTTP/1.1 405 "),
                                (b"D", b"ELETE / HTTP/1.1\r\nHost: localhost\r\n\r\n", b"HTTP/1.1 405 "),
                                (b"D", b"IAG\n\nsession\0", b"ERROR\nmessage:not connected\n")):  # STOMP's
        with socket.create_connection(b.address, timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(first)
            time.sleep(0.2)  # so the reader reads the first bytes alone
            sock.sendall(rest)
            started = time.monotonic()
            got = sock.recv(100)
            assert got.startswith(answer), (first, got)
            assert time.monotonic() - started < 2


# -- off loopback, in a network namespace ------------------------------------------------------------
NETNS = f"sbt{os.getpid() % 100000}"
ADDRESS, PEER = "10.213.62.1", "10.213.62.2"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns():
    """A network namespace of its own with a veth pair: 10.213.62.1 (the broker) and .2 (a client)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    ip("netns", "add", NETNS)
    try:
        ip("-n", NETNS, "link", "set", "lo", "up")
        ip("-n", NETNS, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
        ip("-n", NETNS, "addr", "add", f"{ADDRESS}/24", "dev", "v0")
        ip("-n", NETNS, "addr", "add", f"{PEER}/24", "dev", "v1")
        ip("-n", NETNS, "link", "set", "v0", "up")
        ip("-n", NETNS, "link", "set", "v1", "up")
        yield NETNS
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, timeout=10)


CLIENT = """
import http.client, sys
port, host = int(sys.argv[1]), sys.argv[2]
conn = http.client.HTTPConnection("{address}", port, timeout=10, source_address=("{peer}", 0))
conn.putrequest("GET", "/api/overview", skip_host=True)
conn.putheader("Host", host)
conn.endheaders()
print(conn.getresponse().status)
"""


def test_off_loopback_the_start_warns_and_hosts_hold(netns, start_broker):
    b = start_broker(f"host={ADDRESS}", "processors=3", prefix=("ip", "netns", "exec", netns))
    client = CLIENT.format(address=ADDRESS, peer=PEER)

    def status(host: str) -> int:
        out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", client, str(b.port), host],
                             capture_output=True, text=True, timeout=20, check=True)
        return int(out.stdout)

    assert status(f"{ADDRESS}:{b.port}") == 200           # the address it was reached at
    assert status(f"rebound.evil.example:{b.port}") == 421
    text = b.log()
    assert f"SECURITY: auth=off on {ADDRESS}:{b.port}: anyone who can reach it may log in" in text, text[-3000:]
    assert text.count("SECURITY:") == 1
