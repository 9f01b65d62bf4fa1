"""The pure decisions behind the safer defaults: which Host a request may name (DNS rebinding),
which Origin may open a WebSocket, HSTS's header, and what the start-up log warns about."""

from __future__ import annotations

import pytest

from stompbroker.protocol.handshake import HandshakeError, handshake_response, http_response, parse_http_request, \
    with_header
from stompbroker.protocol.hosts import HostPolicy, same_origin, split_host
from stompbroker.security.exposure import is_loopback, warnings
from stompbroker.settings import make_config


@pytest.mark.parametrize("value, parsed", [
    ("localhost", ("localhost", None)), ("LocalHost:61613", ("localhost", 61613)), ("localhost.", ("localhost", None)),
    ("[::1]:8080", ("::1", 8080)), ("[::1]", ("::1", None)), ("::1", ("::1", None)),
    ("10.0.0.5:61613", ("10.0.0.5", 61613)), ("a.example:", None), ("a.example:x", None), ("[::1", None),
    ("[::1]x", None), ("", None), (":80", None), ("a:123456", None),
    ("127.0.0.1:4650\xb2", None), ("a:\u0661", None),  # digits to str.isdigit, not to int (found by the fuzzer)
])
def test_split_host(value, parsed):
    assert split_host(value) == parsed


def test_default_hosts_are_loopback_names_and_the_host_setting():
    policy = HostPolicy.from_config(make_config(host="broker.internal"))
    for host in ("localhost", "localhost:61613", "LOCALHOST.", "broker.internal:61613", "127.0.0.1:61613",
                 "[::1]:61613", "10.1.2.3", "[2001:db8::1]:61613", None):
        assert policy.allows(host), host
    # the names DNS rebinding would send, and what is not a Host at all
    for host in ("evil.example", "evil.example:61613", "localhost.evil.example", "127.0.0.1.nip.io", "",
                 "broker.internal.evil.example", "[::1", "a b"):
        assert not policy.allows(host), host
    assert HostPolicy.from_config(make_config(host="0.0.0.0")).allows("localhost:1")


def test_http_hosts_replace_the_default_and_star_allows_any():
    policy = HostPolicy.from_config(make_config(http_hosts="broker.example.com,.corp.example"))
    assert policy.allows("broker.example.com:443") and policy.allows("a.b.corp.example") and policy.allows("corp.example")
    assert policy.allows("192.0.2.1:61613")  # an address: never the result of rebinding
    assert not policy.allows("localhost") and not policy.allows("xcorp.example") and not policy.allows("example.com")
    assert HostPolicy.from_config(make_config(http_hosts="*")).allows("anything.at.all")


@pytest.mark.parametrize("origin, host, allowed", [
    (None, "127.0.0.1:61613", True),                         # not a browser
    ("http://127.0.0.1:61613", "127.0.0.1:61613", True),
    ("HTTP://LocalHost:61613", "localhost:61613", True),
    ("http://localhost", "localhost:80", True),               # default ports
    ("https://broker.example", "broker.example:443", True),
    ("https://broker.example", "broker.example", True),       # through a proxy that ends TLS
    ("https://broker.example:8443", "broker.example:8443", True),
    ("https://broker.example", "broker.example:80", False),
    ("http://evil.example", "127.0.0.1:61613", False),
    ("http://127.0.0.1:3000", "127.0.0.1:61613", False),       # another port is another origin
    ("null", "127.0.0.1:61613", False),                       # sandboxed frames, file: pages
    ("http://127.0.0.1:61613/path", "127.0.0.1:61613", False),
    ("http://127.0.0.1:99999", "127.0.0.1:61613", False),
    ("http://127.0.0.1:61613", None, False),
    ("ftp://127.0.0.1:61613", "127.0.0.1:61613", False),
])
def test_same_origin(origin, host, allowed):
    assert same_origin(origin, host) is allowed


def upgrade(origin=None, host="127.0.0.1:61613") -> dict:
    lines = ["GET / HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    if origin:
        lines.append(f"Origin: {origin}")
    return parse_http_request(("\r\n".join(lines) + "\r\n\r\n").encode(), 8192)[0]


def test_the_handshake_allows_same_origin_only_when_asked_and_ws_origins_overrides():
    assert handshake_response(upgrade("http://evil.example"))[0].startswith(b"HTTP/1.1 101 ")
    with pytest.raises(HandshakeError) as info:
        handshake_response(upgrade("http://evil.example"), same_origin_only=True)
    assert info.value.status == 403
    assert handshake_response(upgrade("http://127.0.0.1:61613"), same_origin_only=True)
    assert handshake_response(upgrade(None), same_origin_only=True)
    assert handshake_response(upgrade("http://evil.example"), None, ["http://evil.example"], same_origin_only=True)
    with pytest.raises(HandshakeError):
        handshake_response(upgrade("http://127.0.0.1:61613"), None, ["http://evil.example"], same_origin_only=True)


@pytest.mark.parametrize("target", ["http://evil.examp]e/api/overview", "http://[::1/x", "//x]y/z", "http://a:99999/",
                                    "http://a:x/"])
def test_request_targets_the_routing_could_not_split_are_400(target):
    # Found by the edge fuzzer: the first was an internal error in the dispatcher's routing.
    with pytest.raises(HandshakeError) as info:
        parse_http_request(f"GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode(), 8192)
    assert (info.value.status, info.value.reason) == (400, "malformed request target")


def test_an_absolute_form_target_names_its_host_too():
    request = parse_http_request(b"GET http://evil.example:8080/api/overview HTTP/1.1\r\nHost: localhost\r\n\r\n", 8192)[0]
    assert request["authority"] == "evil.example:8080" and not HostPolicy(["localhost"]).allows(request["authority"])
    assert parse_http_request(b"GET /api/overview?x=] HTTP/1.1\r\n\r\n", 8192)[0]["authority"] is None


def test_with_header_goes_after_the_status_line():
    response = http_response(200, "OK", b"body\r\n\r\nmore", {"X-A": "1"})
    added = with_header(response, "Strict-Transport-Security", "max-age=10")
    assert added.startswith(b"HTTP/1.1 200 OK\r\nStrict-Transport-Security: max-age=10\r\n")
    assert added.endswith(b"\r\n\r\nbody\r\n\r\nmore") and len(added) == len(response) + 39
    with pytest.raises(ValueError):
        with_header(response, "X", "a\r\nSet-Cookie: x")
    assert HandshakeError(421, "no").response().startswith(b"HTTP/1.1 421 Misdirected Request\r\n")


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("10.0.0.5", False), ("broker.example", False), ("", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_start_up_warnings():
    assert warnings(make_config()) == []  # the default: loopback
    assert warnings(make_config(host="::1", auth="off")) == []
    (open_broker,) = warnings(make_config(host="0.0.0.0"))
    assert open_broker.startswith("SECURITY: auth=off on 0.0.0.0:61613: anyone who can reach it may log in")
    assert "any web page" in open_broker and "the console, /api and /metrics" in open_broker
    (quiet,) = warnings(make_config(host="10.0.0.5", ws_origins="https://app.example", console="false",
                                    http_api="false"))
    assert "any web page" not in quiet and "/metrics" not in quiet
    (basic,) = warnings(make_config(host="10.0.0.5", auth="passwd"))
    assert "HTTP Basic passwords" in basic and "in clear on 10.0.0.5:61613" in basic
    assert warnings(make_config(host="10.0.0.5", auth="passwd", console="false", http_api="false")) == []


def test_a_token_secret_checks_logins_so_auth_off_with_one_is_not_called_open():
    (basic,) = warnings(make_config(host="0.0.0.0", auth="off", secret="s3cret"))
    assert "anyone who can reach it may log in" not in basic
    assert "HTTP Basic passwords" in basic and "in clear on 0.0.0.0:61613" in basic
    assert warnings(make_config(host="0.0.0.0", auth="off", secret="s3cret", console="false", http_api="false")) == []


def test_plain_http_basic_off_loopback_is_warned_about_with_ssl_port_too():
    """ssl_port adds a TLS port; port still serves plain HTTP, so Basic logins may come in clear."""
    (basic,) = warnings(make_config(host="10.0.0.5", auth="passwd", ssl_port="61614", ssl_cert="c", ssl_key="k"))
    assert "HTTP Basic passwords" in basic and "in clear on 10.0.0.5:61613" in basic
    assert "ssl_port 61614 serves TLS, but port still takes them" in basic
    assert warnings(make_config(host="10.0.0.5", auth="passwd", ssl_port="61614", ssl_cert="c", ssl_key="k",
                                console="false", http_api="false")) == []
