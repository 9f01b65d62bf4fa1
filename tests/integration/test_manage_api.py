"""Management actions over HTTP on a real broker (docs/admin.md): each action, who may ask it, the
CSRF guard against a foreign origin, the audit log and its metric, moves and purges while consumers
run (nothing lost, nothing twice), and actions on disk before their answer (store=sqlite)."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import threading
import time
from urllib.parse import quote

import pytest
import stomp

from stompbroker.security import hash_secret


def q(name: str) -> str:
    return quote(name, safe="")


class Api:
    def __init__(self, broker, user: str = "root", password: str = "toor"):
        self.broker = broker
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def call(self, method: str, path: str, body=None, headers: dict | None = None, raw: bytes | None = None):
        conn = http.client.HTTPConnection(*self.broker.address, timeout=15)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            sent = {"Authorization": self.auth, **({"Content-Type": "application/json"} if data else {}),
                    **(headers or {})}
            conn.request(method, path, body=data, headers={k: v for k, v in sent.items() if v is not None})
            response = conn.getresponse()
            text = response.read()
            head = {k.lower(): v for k, v in response.getheaders()}
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            return response.status, value, head
        finally:
            conn.close()

    def ok(self, method: str, path: str, body=None, **kwargs):
        status, value, _ = self.call(method, path, body, **kwargs)
        assert status == 200, (status, value)
        return value


@pytest.fixture
def managed(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('toor')}:admin\nbob:{hash_secret('bob')}:manage=/queue/jobs*\n"
                                     f"user:{hash_secret('user')}\n")

    def start(*settings: str):
        return start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", "store=sqlite",
                            f"store_path={tmp_path / 'store.db'}", f"audit_log={tmp_path / 'audit.log'}", *settings)
    return start


def client(broker, user: str = "root", password: str = "toor", listener=None) -> stomp.Connection:
    conn = stomp.Connection([broker.address], heartbeats=(0, 0))
    if listener is not None:
        conn.set_listener("l", listener)
    conn.connect(user, password, wait=True)
    return conn


def send(broker, destination: str, bodies, **headers) -> None:
    conn = client(broker)
    for i, body in enumerate(bodies):
        conn.send(destination, body, headers={"n": str(i), **headers}, receipt=f"r{i}" if i == len(bodies) - 1 else None)
    time.sleep(0.2)
    conn.disconnect()


class Collect(stomp.ConnectionListener):
    def __init__(self):
        self.messages, self.errors = [], []

    def on_message(self, frame):
        self.messages.append((frame.headers, frame.body))

    def on_error(self, frame):
        self.errors.append((frame.headers, frame.body))

    def wait(self, what: str, timeout: float = 5) -> list:
        deadline = time.monotonic() + timeout
        while not getattr(self, what) and time.monotonic() < deadline:
            time.sleep(0.05)
        return getattr(self, what)


def audit(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]


def test_each_action_over_http_is_done_audited_and_counted(managed, tmp_path):
    b = managed()
    api = Api(b)
    send(b, "/queue/jobs", [f"job{i}" for i in range(6)], kind="a")
    send(b, "/queue/bin", [b"\xff\x00\x01"])

    queues = api.ok("GET", "/api/queues?name=job&sort=depth&sort_reverse=true")
    assert [x["destination"] for x in queues["items"]] == ["/queue/jobs"] and queues["total_count"] == 2
    peek = api.ok("GET", f"/api/queues/%2F/{q('/queue/jobs')}/messages?count=2&offset=1")
    assert [m["payload"] for m in peek["messages"]] == ["job1", "job2"] and peek["depth"] == 6
    assert peek["messages"][0]["headers"]["n"] == "1" and peek["messages"][0]["size"] == 4
    binary = api.ok("GET", f"/api/queues/%2F/{q('/queue/bin')}/messages")["messages"][0]
    assert binary["payload_encoding"] == "base64" and base64.b64decode(binary["payload"]) == b"\xff\x00\x01"

    assert api.ok("POST", f"/api/queues/%2F/{q('/queue/jobs')}/move",
                  {"to": "/queue/later", "count": 2, "selector": "n >= 3"}) == {"moved": 2, "left": 4}
    moved = api.ok("GET", f"/api/queues/%2F/{q('/queue/later')}/messages")["messages"]
    assert [(m["payload"], m["headers"]["redriven-from"], m["headers"]["kind"]) for m in moved] == \
        [("job3", "/queue/jobs", "a"), ("job4", "/queue/jobs", "a")]
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/jobs')}/messages") == {"purged": 4}
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/jobs')}/messages") == {"purged": 0}  # a retry is safe
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/later')}") == {"deleted": True, "purged": 2}
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/later')}") == {"deleted": False, "purged": 0}

    listener = Collect()
    sub = client(b, listener=listener)
    sub.subscribe("/topic/news", id="t")
    time.sleep(0.2)
    assert api.ok("POST", "/api/publish", {"destination": "/topic/news", "headers": {"h": "v"}, "body": "hello"}) == \
        {"published": True, "delivered": 1}
    (headers, body), = listener.wait("messages")
    assert body == "hello" and headers["h"] == "v"

    conns = api.ok("GET", "/api/connections")["items"]
    (mine,) = [c for c in conns if c["subscription_count"] == 1]
    assert api.ok("DELETE", f"/api/connections/{mine['id']}", {"reason": "maintenance window"}) == {"closed": mine["id"]}
    (headers, body), = listener.wait("errors")
    assert headers["message"] == "closed by an operator" and body == "maintenance window"
    assert api.call("DELETE", f"/api/connections/{mine['id']}")[0] == 404

    durable = client(b)
    durable.subscribe("/topic/d", id="d1", headers={"durable": "true"})
    time.sleep(0.2)
    durable.disconnect()
    send(b, "/topic/d", ["kept"])
    (entry,) = [s for s in api.ok("GET", "/api/subscriptions")["items"] if s["durable"]]
    assert entry["destination"] == "/topic/d" and not entry["attached"] and entry["waiting"] == 1
    assert api.ok("DELETE", f"/api/subscriptions/%2F/{q(entry['key'])}") == {"removed": entry["key"], "dropped": 1}
    assert api.call("DELETE", f"/api/subscriptions/%2F/{q(entry['key'])}")[0] == 404

    assert api.ok("GET", "/api/vhosts")["items"] == [{"name": "/"}]
    status, value, _ = api.call("DELETE", f"/api/queues/other/{q('/queue/x')}/messages")
    assert status == 404 and "virtual host" in value["reason"]
    assert api.call("GET", "/api/publish")[0] == 405
    assert api.call("POST", f"/api/queues/%2F/{q('/queue/x')}/move", {"to": "/queue/*"})[0] == 400
    assert api.call("POST", f"/api/queues/%2F/{q('/queue/x')}/move", {"to": "/q", "selector": "a ="})[0] == 400

    # who may: a manage grant covers its destinations only; a plain user nothing; no login, nothing
    assert Api(b, "bob", "bob").ok("DELETE", f"/api/queues/%2F/{q('/queue/jobs.2')}/messages") == {"purged": 0}
    assert Api(b, "bob", "bob").call("DELETE", f"/api/queues/%2F/{q('/queue/bin')}/messages")[0] == 403
    assert Api(b, "user", "user").call("DELETE", f"/api/queues/%2F/{q('/queue/bin')}/messages")[0] == 403
    status, _, head = Api(b, "root", "wrong").call("DELETE", f"/api/queues/%2F/{q('/queue/bin')}/messages")
    assert status == 401 and "set-cookie" not in head
    assert api.ok("GET", f"/api/queues/%2F/{q('/queue/bin')}/messages")["depth"] == 1

    lines = audit(tmp_path)
    purges = [e for e in lines if e["action"] == "purge"]
    assert [(e["user"], e["status"], e.get("purged")) for e in purges] == \
        [("root", 200, 4), ("root", 200, 0), ("root", 404, None), ("bob", 200, 0), ("bob", 403, None),
         ("user", 403, None)]
    assert all(e["peer"].startswith("127.0.0.1:") and e["vhost"] in ("/", "other") and e["ts"] > 0 for e in lines)
    (move,) = [e for e in lines if e["action"] == "move" and e["status"] == 200]
    assert move["to"] == "/queue/later" and move["moved"] == 2 and move["selector"] == "n >= 3"
    (close,) = [e for e in lines if e["action"] == "close" and e["status"] == 200]
    assert close["reason"] == "maintenance window"
    # (the refused login is not an action anyone did: 401 before any check of what it asked)
    metrics = api.call("GET", "/metrics")[1].decode()
    assert 'stompbroker_http_actions_total{action="purge",status="200"} 3.0' in metrics
    assert 'stompbroker_http_actions_total{action="purge",status="403"} 2.0' in metrics


def test_publish_persistent_true_is_the_sends_header(managed):
    """``"persistent": true`` publishes as a SEND with ``persistent:true``: a kept topic message,
    so a dedup-id holds for it (it was dropped, and the repeat delivered)."""
    b = managed()
    api = Api(b)
    listener = Collect()
    sub = client(b, listener=listener)
    sub.subscribe("/topic/kept", id="t")
    time.sleep(0.2)
    for delivered in (1, 0):
        assert api.ok("POST", "/api/publish", {"destination": "/topic/kept", "body": "kept", "persistent": True,
                                               "headers": {"dedup-id": "once"}}) == \
            {"published": True, "delivered": delivered}
    assert api.call("POST", "/api/publish", {"destination": "/topic/kept", "persistent": "yes"})[0] == 400
    assert [body for _, body in listener.wait("messages")] == ["kept"]
    sub.disconnect()


def test_a_page_of_a_foreign_origin_cannot_act(managed, tmp_path):
    b = managed()
    send(b, "/queue/jobs", ["a", "b"])
    api = Api(b)
    path = f"/api/queues/%2F/{q('/queue/jobs')}/messages"
    # what another site's page makes a browser send (the browser adds the Basic credentials it keeps)
    for headers in ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
                    {"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "same-site"}):
        status, value, _ = api.call("DELETE", path, headers=headers)
        assert status == 403 and ("another" in value["reason"] or "origin" in value["reason"]), (headers, value)
    form = api.call("POST", f"/api/queues/%2F/{q('/queue/jobs')}/move", raw=b"to=/queue/stolen",
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form[0] == 403 and "JSON" in form[1]["reason"]
    assert api.call("GET", path, headers={"Sec-Fetch-Site": "cross-site"})[0] == 403  # its peeks too
    assert api.ok("GET", f"{path}?count=5")["depth"] == 2  # untouched
    own = f"http://127.0.0.1:{b.port}"
    assert api.ok("DELETE", path, headers={"Origin": own, "Sec-Fetch-Site": "same-origin"}) == {"purged": 2}
    refused = [e for e in audit(tmp_path) if e["status"] == 403]
    assert len(refused) == 6 and all(e["user"] is None and e["login"] == "root" for e in refused)


def test_scheduled_messages_are_cancelled_as_guarded_audited_actions(managed, tmp_path):
    """DELETE /api/scheduled/VHOST/DEST[/ID]: an admin or a manage grant on DEST, the CSRF guard,
    one audit line each, counted in /metrics; the old unguarded DELETE shapes are 405."""
    b = managed()
    api = Api(b)
    conn = client(b)
    for i, destination in enumerate(("/queue/jobs.a", "/queue/jobs.a", "/queue/jobs.a", "/queue/bin")):
        conn.send(destination, f"later{i}", headers={"AMQ_SCHEDULED_DELAY": "600000"}, receipt=f"s{i}")
    until_listed = time.monotonic() + 10
    while len(api.ok("GET", "/api/scheduled")["items"]) < 4:
        assert time.monotonic() < until_listed
        time.sleep(0.05)
    conn.disconnect()
    first, second, third = [j["id"] for j in api.ok("GET", f"/api/scheduled?destination={q('/queue/jobs.a')}")["items"]]
    path = f"/api/scheduled/%2F/{q('/queue/jobs.a')}"

    for headers in ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
        status, value, _ = api.call("DELETE", f"{path}/{first}", headers=headers)
        assert status == 403 and ("another" in value["reason"] or "origin" in value["reason"]), value
    assert api.call("DELETE", f"/api/scheduled/{first}")[0] == 405  # (the list's own paths take GET only)
    assert api.call("DELETE", f"/api/scheduled?destination={q('/queue/jobs.a')}")[0] == 405
    assert Api(b, "user", "user").call("DELETE", f"{path}/{first}")[0] == 403
    assert Api(b, "bob", "bob").call("DELETE", f"/api/scheduled/%2F/{q('/queue/bin')}")[0] == 403
    assert Api(b, "bob", "bob").call("GET", "/api/scheduled")[0] == 403  # (a grant opens no lists)
    assert len(api.ok("GET", "/api/scheduled")["items"]) == 4  # all refused: nothing cancelled

    assert Api(b, "bob", "bob").ok("DELETE", f"{path}/{first}") == {"cancelled": 1}
    assert api.call("DELETE", f"/api/scheduled/%2F/{q('/queue/bin')}/{second}")[0] == 404  # another's job
    assert api.call("DELETE", f"{path}/{first}")[0] == 404  # gone
    assert api.ok("DELETE", path) == {"cancelled": 2}
    assert api.ok("DELETE", path) == {"cancelled": 0}  # a retry is safe
    assert [j["destination"] for j in api.ok("GET", "/api/scheduled")["items"]] == ["/queue/bin"]
    assert api.call("GET", f"/api/scheduled/{second}")[0] == 404

    cancels = [e for e in audit(tmp_path) if e["action"] == "cancel"]
    assert [(e["user"], e["status"], e["target"], e.get("id"), e.get("cancelled")) for e in cancels] == [
        (None, 403, "/queue/jobs.a", first, None), (None, 403, "/queue/jobs.a", first, None),
        ("user", 403, "/queue/jobs.a", first, None), ("bob", 403, "/queue/bin", None, None),
        ("bob", 200, "/queue/jobs.a", first, 1), ("root", 404, "/queue/bin", second, None),
        ("root", 404, "/queue/jobs.a", first, None), ("root", 200, "/queue/jobs.a", None, 2),
        ("root", 200, "/queue/jobs.a", None, 0)]
    metrics = api.call("GET", "/metrics")[1].decode()
    assert 'stompbroker_http_actions_total{action="cancel",status="200"} 3.0' in metrics
    assert 'stompbroker_http_actions_total{action="cancel",status="403"} 4.0' in metrics
    assert 'stompbroker_http_actions_total{action="cancel",status="404"} 2.0' in metrics


def test_limits_of_a_write_api(managed):
    b = managed("max_http_body=100", "manage_rate_limit=2")
    api = Api(b)
    status, _, _ = api.call("POST", "/api/publish", {"destination": "/queue/a", "body": "x" * 200})
    assert status == 413
    conn = http.client.HTTPConnection(*b.address, timeout=10)
    conn.putrequest("POST", "/api/publish")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()
    answers = [api.call("DELETE", f"/api/queues/%2F/{q('/queue/a')}/messages") for _ in range(4)]
    assert [a[0] for a in answers[:2]] == [200, 200] and 429 in [a[0] for a in answers[2:]]
    limited = next(a for a in answers if a[0] == 429)
    assert int(limited[2]["retry-after"]) >= 1


def test_request_bodies_are_bounded_in_time_and_together(start_broker):
    """A body that stalls gets 408; bodies held for all connections past max_partial_bytes, 503."""
    b = start_broker("connect_timeout_ms=1000", "max_partial_bytes=3000", "max_http_body=2000")
    head = b"POST /api/publish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    slow = b.connect(timeout=10)
    slow.sendall(head + b"Content-Length: 100\r\n\r\n{\"destination\"")
    assert slow.recv(4096).startswith(b"HTTP/1.1 408 ")  # half of connect_timeout_ms, then closed
    slow.close()
    hoarders = []
    for _ in range(3):  # each holds 1500 bytes of a 2000-byte body: the second passes 3000 together
        sock = b.connect(timeout=10)
        sock.sendall(head + b"Content-Length: 2000\r\n\r\n" + b" " * 1500)
        hoarders.append(sock)
    answers = []
    for sock in hoarders:
        sock.settimeout(5)
        try:
            answers.append(sock.recv(4096)[:12])
        except TimeoutError:
            answers.append(b"")
        sock.close()
    assert b"HTTP/1.1 503" in answers, answers


def test_management_needs_logins_checked(start_broker):
    b = start_broker()
    status, value, _ = Api(b).call("DELETE", f"/api/queues/%2F/{q('/queue/a')}/messages")
    assert status == 403 and "logins" in value["reason"]


class Counting(stomp.ConnectionListener):
    def __init__(self, conn=None):
        self.conn = conn
        self.bodies: list[str] = []
        self.redriven = 0
        self.lock = threading.Lock()

    def on_message(self, frame):
        with self.lock:
            self.bodies.append(frame.body)
            self.redriven += "redriven-from" in frame.headers
        if self.conn is not None:
            self.conn.ack(frame.headers["message-id"], frame.headers["subscription"])


def consumers(b, destination: str, n: int) -> list[Counting]:
    listeners = []
    for i in range(n):
        listener = Counting()
        conn = client(b, listener=listener)
        listener.conn = conn
        conn.subscribe(destination, id=f"s{i}", ack="client-individual", headers={"prefetch-count": "1"})
        listeners.append(listener)
    return listeners


def drain(listeners: list[Counting], expected: int, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while sum(len(x.bodies) for x in listeners) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # anything extra (a duplicate) would come now
    return [body for x in listeners for body in x.bodies]


def test_move_and_purge_while_consumers_run_lose_nothing_and_deliver_nothing_twice(managed):
    b = managed("manage_rate_limit=0")
    api = Api(b)
    sent = 1500
    src, dst = consumers(b, "/queue/src", 2), consumers(b, "/queue/dst", 2)
    producer = threading.Thread(target=send, args=(b, "/queue/src", [f"m{i}" for i in range(sent)]))
    producer.start()
    moved = 0
    deadline = time.monotonic() + 30
    while (producer.is_alive() or moved == 0) and time.monotonic() < deadline:
        moved += api.ok("POST", f"/api/queues/%2F/{q('/queue/src')}/move", {"to": "/queue/dst"})["moved"]
    producer.join(30)
    delivered = drain(src + dst, sent)
    lost = sent - len(set(delivered))
    duplicated = len(delivered) - len(set(delivered))
    redriven = sum(x.redriven for x in dst)
    print(f"move: sent {sent}, moved {moved}, delivered {len(delivered)}, lost {lost}, duplicated {duplicated}")
    assert moved > 0 and redriven == moved and sum(len(x.bodies) for x in dst) == moved
    assert (lost, duplicated) == (0, 0)

    workers = consumers(b, "/queue/p", 2)
    producer = threading.Thread(target=send, args=(b, "/queue/p", [f"p{i}" for i in range(sent)]))
    producer.start()
    purged = 0
    while producer.is_alive() and time.monotonic() < deadline + 30:
        purged += api.ok("DELETE", f"/api/queues/%2F/{q('/queue/p')}/messages")["purged"]
    producer.join(30)
    purged += api.ok("DELETE", f"/api/queues/%2F/{q('/queue/p')}/messages")["purged"]
    delivered = drain(workers, sent - purged)
    duplicated = len(delivered) - len(set(delivered))
    print(f"purge: sent {sent}, purged {purged}, delivered {len(delivered)}, duplicated {duplicated}")
    assert purged > 0 and len(delivered) + purged == sent and duplicated == 0


def test_an_action_is_on_disk_before_its_answer(managed):
    b = managed()
    api = Api(b)
    send(b, "/queue/jobs", [f"j{i}" for i in range(5)])
    assert api.ok("POST", f"/api/queues/%2F/{q('/queue/jobs')}/move", {"to": "/queue/kept", "count": 3}) == \
        {"moved": 3, "left": 2}
    assert api.ok("DELETE", f"/api/queues/%2F/{q('/queue/jobs')}/messages") == {"purged": 2}
    assert api.ok("POST", "/api/publish", {"destination": "/queue/kept", "body": "new"})["published"]
    b.stop(signal.SIGKILL)  # no shutdown commit: only what was on disk at the answers survives
    again = managed()
    queues = {x["destination"]: x["depth"] for x in Api(again).ok("GET", "/api/queues")["items"]}
    assert queues == {"/queue/kept": 4}
    kept = Api(again).ok("GET", f"/api/queues/%2F/{q('/queue/kept')}/messages")["messages"]
    assert [m["payload"] for m in kept] == ["j0", "j1", "j2", "new"]
    assert all(m["headers"]["redriven-from"] == "/queue/jobs" for m in kept[:3])
