"""The HTTP side of management actions, pure parts: which request is which action, the CSRF guard,
the rate limit, publish's arguments, manage grants, the audit log's rotation, request bodies."""

from __future__ import annotations

import json
import types

import orjson
import pytest

from stompbroker.console import manage
from stompbroker.console.audit import AuditLog
from stompbroker.console.http import Request
from stompbroker.protocol.handshake import HandshakeError, body_length
from stompbroker.security.acl import PasswdError, parse_acl, parse_inline


@pytest.mark.parametrize("method, path, expected", [
    ("GET", "/api/queues/%2F/%2Fqueue%2Fjobs/messages", (manage.Action("peek", "/", "/queue/jobs"), "")),
    ("DELETE", "/api/queues/%2F/%2Fqueue%2Fjobs/messages", (manage.Action("purge", "/", "/queue/jobs"), "")),
    ("DELETE", "/api/queues/%2F/%2Fqueue%2Fjobs", (manage.Action("delete", "/", "/queue/jobs"), "")),
    ("POST", "/api/queues/%2F/%2Fqueue%2FDLQ/move", (manage.Action("move", "/", "/queue/DLQ"), "")),
    ("POST", "/api/publish", (manage.Action("publish", "/", ""), "")),
    ("DELETE", "/api/connections/42", (manage.Action("close", "/", "42"), "")),
    ("DELETE", "/api/subscriptions/%2F/bob%1Fd1", (manage.Action("unsubscribe", "/", "bob\x1fd1"), "")),
    ("DELETE", "/api/scheduled/eu/%2Fqueue%2Fa", (manage.Action("cancel", "eu", "/queue/a"), "")),
    ("DELETE", "/api/scheduled/%2F/%2Fqueue%2Fa/b1-j7", (manage.Action("cancel", "/", "/queue/a", "b1-j7"), "")),
    ("GET", "/api/scheduled/%2F/%2Fqueue%2Fa/b1-j7", (None, "DELETE")),
    ("GET", "/api/queues/%2F/%2Fqueue%2Fjobs", (None, "DELETE")),
    ("PUT", "/api/queues/%2F/q/messages", (None, "GET, DELETE")),
    ("GET", "/api/publish", (None, "POST")),
    ("GET", "/api/nothing/here", (None, "")),
])
def test_action_of(method, path, expected):
    assert manage.action_of(method, path) == expected


def request(method="POST", origin="", host="127.0.0.1:61613", content_type="application/json", fetch_site="",
            body=b"{}"):
    return Request(method, "/api/publish", "", "", origin, host, content_type, fetch_site, body)


@pytest.mark.parametrize("req, refused", [
    (request(), False),                                              # a script: no Origin, JSON
    (request(origin="http://127.0.0.1:61613"), False),               # the broker's own page
    (request(origin="http://127.0.0.1:61613", fetch_site="same-origin"), False),
    (request(origin="http://evil.example"), True),                   # another site's page
    (request(origin="null"), True),                                  # a sandboxed page
    (request(origin="http://127.0.0.1:61614"), True),                # another port is another origin
    (request(fetch_site="cross-site"), True),
    (request(fetch_site="same-site"), True),
    (request(content_type="text/plain"), True),                      # what a form can send
    (request(content_type="application/x-www-form-urlencoded"), True),
    (request(method="DELETE", body=b"", content_type=""), False),
    (request(method="GET", origin="http://evil.example"), False),    # a read: nothing to forge
    (request(method="GET", fetch_site="cross-site"), True),          # a peek from another site's page
])
def test_forgery(req, refused):
    assert bool(manage.forgery(req)) is refused


def test_rate_limiter_allows_bursts_then_tells_when_to_come_back():
    limiter = manage.RateLimiter(2.0)
    assert [limiter.take("a", 10.0) for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("a", 10.0) == pytest.approx(0.5)
    assert limiter.take("b", 10.0) == 0.0          # per login
    assert limiter.take("a", 10.5) == 0.0          # a token came back
    assert manage.RateLimiter(0).take("a", 0.0) == 0.0  # 0 = no limit


CONFIG = types.SimpleNamespace(max_destination_length=100, max_headers=3, max_header_line=50)


def test_publish_args():
    body = {"destination": "/queue/a", "headers": {"n": 1, "b": True, "s": "x"}, "body": "aGk=",
            "body_encoding": "base64", "persistent": False}
    assert manage.publish_args(body, CONFIG) == ("/", "/queue/a", {"n": "1", "b": "true", "s": "x",
                                                                    "persistent": "false"}, b"hi")
    assert manage.publish_args({"destination": "/topic/a", "persistent": True}, CONFIG)[2] == {"persistent": "true"}
    assert manage.publish_args({"destination": "/topic/a", "headers": {"persistent": "true"}, "persistent": False},
                               CONFIG)[2] == {"persistent": "false"}
    assert manage.publish_args({"destination": "/topic/a"}, CONFIG)[2] == {}
    for bad in ({"destination": "/q", "persistent": "yes"}, {"headers": {"a": "1"}}, {"destination": "/q", "headers": {"a:b": "1"}},
                {"destination": "/q", "headers": {"a": "x\0"}}, {"destination": "/q", "headers": {"a": ["x"]}},
                {"destination": "/q", "headers": {str(i): "" for i in range(4)}},
                {"destination": "/q", "body": "!!", "body_encoding": "base64"},
                {"destination": "/q", "headers": {"a": "x" * 60}}):
        with pytest.raises(manage.Invalid):
            manage.publish_args(bad, CONFIG)


class Auth:
    def __init__(self, acl: str):
        self.perms = parse_acl(acl)

    def is_admin(self, user):
        return self.perms.get(user, parse_inline("")).admin

    def can_manage(self, user, destination):
        return self.perms.get(user, parse_inline("")).can_manage(destination)


def test_manage_grants_cover_destinations_admins_everything():
    auth = Auth("root admin\nbob manage /queue/jobs*,/queue/DLQ\n")
    purge = manage.Action("purge", "/", "/queue/jobs.1")
    assert manage.allowed(auth, "root", manage.Action("close", "/", "1"), request())
    assert manage.allowed(auth, "bob", purge, request(method="DELETE"))
    assert not manage.allowed(auth, "bob", manage.Action("purge", "/", "/queue/other"), request())
    assert not manage.allowed(auth, "bob", manage.Action("close", "/", "1"), request())
    move = manage.Action("move", "/", "/queue/DLQ")
    assert manage.allowed(auth, "bob", move, request(body=b'{"to": "/queue/jobs"}'))
    assert not manage.allowed(auth, "bob", move, request(body=b'{"to": "/queue/other"}'))
    assert not manage.allowed(auth, "bob", move, request(body=b'{}'))  # to each original destination: admins
    publish = manage.Action("publish", "/", "")
    assert manage.allowed(auth, "bob", publish, request(body=b'{"destination": "/queue/jobs"}'))
    assert not manage.allowed(auth, "bob", publish, request(body=b'{"destination": "/topic/x"}'))
    assert not manage.allowed(auth, "eve", purge, request())


def test_manage_in_acl_files_and_inline():
    assert parse_inline("manage=/queue/a*;read=/topic/x").can_manage("/queue/a.b")
    assert parse_inline("manage=/queue/a*").can_read("/anything")  # manage leaves read and write alone
    assert parse_inline("manage=/queue/a").to_inline() == "manage=/queue/a"
    assert parse_acl("bob manage /queue/a\n")["bob"].manage == ("/queue/a",)
    with pytest.raises(PasswdError):
        parse_acl("* manage /queue/a\n")
    with pytest.raises(PasswdError):
        parse_acl("bob manage\n")


def test_audit_log_writes_json_lines_and_rotates(tmp_path):
    path = tmp_path / "audit.log"
    log = AuditLog(str(path), max_bytes=300, files=2)
    for i in range(12):
        log.write({"user": "root", "action": "purge", "target": "/queue/" + "x" * 500, "n": i})
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.log", "audit.log.1", "audit.log.2"]
    lines = [json.loads(line) for name in reversed(files) for line in (tmp_path / name).read_text().splitlines()]
    assert [entry["n"] for entry in lines] == list(range(12 - len(lines), 12))  # oldest files dropped, order kept
    assert all(len(entry["target"]) <= 203 and entry["user"] == "root" and entry["ts"] > 0 for entry in lines)
    assert log.errors == 0


def test_audit_log_counts_lines_it_cannot_write(tmp_path):
    log = AuditLog(str(tmp_path / "missing" / "audit.log"), max_bytes=1000, files=1)
    log.write({"action": "purge"})
    log.write({"action": "purge"})
    assert log.errors == 2


@pytest.mark.parametrize("headers, length", [({}, 0), ({"content-length": "12"}, 12), ({"content-length": "0"}, 0)])
def test_body_length(headers, length):
    assert body_length(headers, 100) == length


@pytest.mark.parametrize("headers, status", [({"content-length": "101"}, 413), ({"content-length": "-1"}, 400),
                                             ({"content-length": "1e3"}, 400), ({"transfer-encoding": "chunked"}, 411)])
def test_body_length_refusals(headers, status):
    with pytest.raises(HandshakeError) as refused:
        body_length(headers, 100)
    assert refused.value.status == status


def test_refusals_are_json():
    head, _, body = manage.refusal(409, "in use").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 409 Conflict") and b"application/json" in head
    assert orjson.loads(body) == {"error": "conflict", "reason": "in use"}


def test_a_peek_is_cut_to_the_answer_budget():
    from broker_harness import Rig
    rig = Rig(max_answer_bytes=4096)
    rig.connect(1)
    for i in range(50):
        rig.send(1, "/queue/big", b"x" * 300)
    target = "/api/queues/%2F/%2Fqueue%2Fbig/messages?count=50&truncate=300"
    status, response, noted = manage.perform(rig.broker, rig.config, manage.Action("peek", "/", "/queue/big"),
                                             Request("GET", target), rig.now)
    body = response.partition(b"\r\n\r\n")[2]
    answer = orjson.loads(body)
    assert status == 200 and len(body) <= rig.config.answer_bytes
    assert answer["truncated"] and 0 < answer["count"] == len(answer["messages"]) < 50 and answer["depth"] == 50
    assert noted == {"count": answer["count"]}


def test_an_action_the_cluster_answers_later_is_shaped_then_or_refused_with_its_reason():
    from stompbroker.broker.model import Later
    assert manage.later_or_now(3, lambda n: (200, {"n": n}, {}), {}) == (200, {"n": 3}, {})
    waiting = manage.later_or_now(Later(), lambda n: (200, {"published": True, "delivered": n}, {"size": 1}),
                                  {"size": 1})
    assert isinstance(waiting, manage.Waiting)
    status, response, noted = manage.finished(waiting, None, 0)
    assert status == 200 and response.endswith(b'{"published":true,"delivered":0}')
    assert noted == {"size": 1, "published": True, "delivered": 0}
    status, response, noted = manage.finished(waiting, 409, "queue full: no room")
    assert status == 409 and b'"reason":"queue full: no room"' in response
    assert noted == {"size": 1, "reason": "queue full: no room"}
