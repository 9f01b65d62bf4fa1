"""Virtual hosts on a real broker: stomp.py clients pick one by CONNECT's host, each vhost keeps its
own queues, logins need a grant for a vhost, and the API and /metrics act and report per vhost."""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
import time

import stomp

from stompbroker.security import hash_secret
from tests.stompwire import Wire


class Collect(stomp.ConnectionListener):
    def __init__(self):
        self.messages, self.errors = [], []

    def on_message(self, frame):
        self.messages.append(frame.body)

    def on_error(self, frame):
        self.errors.append(frame.headers.get("message"))


def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


def client(broker, login: str, vhost: str | None, wait: bool = True):
    listener = Collect()
    conn = stomp.Connection([broker.address], vhost=vhost, heartbeats=(0, 0))
    conn.set_listener("c", listener)
    conn.connect(login, login, wait=wait)
    return conn, listener


def call(broker, method: str, path: str, body=None):
    conn = http.client.HTTPConnection(*broker.address, timeout=10)
    try:
        headers = {"Authorization": "Basic " + base64.b64encode(b"root:root").decode()}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        response = conn.getresponse()
        text = response.read()
        return response.status, (json.loads(text) if text[:1] in (b"{", b"[") else text)
    finally:
        conn.close()


def test_vhosts_keep_clients_apart_and_the_api_acts_per_vhost(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('root')}:admin\nalice:{hash_secret('alice')}:vhost=eu\n"
                                     f"bob:{hash_secret('bob')}\n")
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", "vhosts=eu")
    eu, eu_seen = client(b, "alice", "eu")
    eu.subscribe("/queue/jobs", id="j")
    default, default_seen = client(b, "root", "/")
    default.send("/queue/jobs", "default job")
    eu.send("/queue/jobs", "eu job", receipt="r")
    until(lambda: eu_seen.messages)
    time.sleep(0.2)
    assert eu_seen.messages == ["eu job"]

    _, refused = client(b, "bob", "eu", wait=False)  # no grant for eu
    until(lambda: refused.errors)
    assert refused.errors == ["access refused"]
    _, unknown = client(b, "root", "broker.example", wait=False)  # stomp.py's host header otherwise
    until(lambda: unknown.errors)
    assert unknown.errors == ["unknown virtual host"]

    assert call(b, "GET", "/api/vhosts")[1]["items"] == [{"name": "/"}, {"name": "eu"}]
    assert [(q["destination"], q["depth"]) for q in call(b, "GET", "/api/queues")[1]["items"]] == \
        [("/queue/jobs", 1)]
    assert [(q["destination"], q["consumers"]) for q in call(b, "GET", "/api/queues?vhost=eu")[1]["items"]] == \
        [("/queue/jobs", 1)]
    status, answer = call(b, "POST", "/api/publish", {"vhost": "eu", "destination": "/queue/jobs", "body": "api"})
    assert status == 200
    until(lambda: len(eu_seen.messages) == 2)
    assert eu_seen.messages[1] == "api"
    peek = call(b, "GET", "/api/queues/%2F/%2Fqueue%2Fjobs/messages")[1]
    assert [m["payload"] for m in peek["messages"]] == ["default job"]
    assert call(b, "DELETE", "/api/queues/eu/%2Fqueue%2Fjobs/messages")[1] == {"purged": 0}
    assert call(b, "DELETE", "/api/queues/%2F/%2Fqueue%2Fjobs/messages")[1] == {"purged": 1}
    assert call(b, "DELETE", "/api/queues/us/%2Fqueue%2Fjobs/messages")[0] == 404
    assert call(b, "DELETE", "/api/queues/%2F/%2Fqueue%2F%1Eeu%1Ejobs/messages")[0] == 400  # no reaching across
    connections = call(b, "GET", "/api/connections")[1]["items"]
    assert {c["login"]: c["vhost"] for c in connections if c["connected"]} == {"alice": "eu", "root": "/"}

    eu.send("/queue/backlog", "waiting")
    until(lambda: call(b, "GET", "/api/queues?vhost=eu&name=backlog")[1]["items"])
    metrics = call(b, "GET", "/metrics")[1].decode()
    assert 'stompbroker_queue_messages{destination="/queue/backlog",vhost="eu"} 1.0' in metrics
    env = {**os.environ, "STOMPBROKER_PASSWORD": "root"}
    done = subprocess.run([sys.executable, "-m", "stompbroker.tools.admin", "--url", f"http://127.0.0.1:{b.port}",
                           "--user", "root", "--vhost", "eu", "--json", "queue", "list", "--name", "backlog"],
                          capture_output=True, timeout=30, env=env)
    assert [q["destination"] for q in json.loads(done.stdout)["items"]] == ["/queue/backlog"], done.stderr
    eu.disconnect()
    default.disconnect()


def test_scheduled_messages_are_listed_and_cancelled_per_vhost(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('root')}:admin\n")
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", "vhosts=eu")
    for vhost in ("eu", "/", "eu"):
        conn, _ = client(b, "root", vhost)
        conn.send("/queue/later", vhost, headers={"AMQ_SCHEDULED_DELAY": "600000"}, receipt="r")
        conn.disconnect()  # (stomp.py waits for the receipt of its DISCONNECT, after the SEND's)
    listed = call(b, "GET", "/api/scheduled?vhost=eu")[1]["items"]
    assert [(j["vhost"], j["destination"]) for j in listed] == [("eu", "/queue/later")] * 2
    (default,) = call(b, "GET", "/api/scheduled")[1]["items"]
    assert (default["vhost"], default["destination"]) == ("/", "/queue/later")
    assert call(b, "DELETE", f"/api/scheduled/eu/%2Fqueue%2Flater/{default['id']}")[0] == 404  # (another vhost's)
    assert call(b, "DELETE", "/api/scheduled/eu/%2Fqueue%2Flater")[1] == {"cancelled": 2}
    assert call(b, "GET", "/api/scheduled?vhost=eu")[1]["items"] == []
    assert [j["id"] for j in call(b, "GET", "/api/scheduled")[1]["items"]] == [default["id"]]
    assert call(b, "GET", "/api/scheduled?vhost=us")[0] == 400


def diag(w: Wire, query: str, **headers) -> tuple[str, dict]:
    w.frame("DIAG", headers, query.encode())
    command, head, _ = w.read()
    return command, head


def test_diag_answers_for_the_askers_vhost_and_admins_may_name_another(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('root')}:admin\nalice:{hash_secret('alice')}:vhost=eu\n")
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", "vhosts=eu,us", "diag_admin_only=false")
    root_eu, root_default, alice = Wire(b.connect()), Wire(b.connect()), Wire(b.connect())
    root_eu.connect(login="root", passcode="root", host="eu")
    root_default.connect(login="root", passcode="root", host="/")
    alice.connect(login="alice", passcode="alice", host="eu")
    for w, name in ((root_eu, "eu-jobs"), (root_default, "jobs")):
        w.frame("SEND", {"destination": f"/queue/{name}", "receipt": "r"}, b"x")
        assert w.read()[0] == "RECEIPT"
    alice.frame("SUBSCRIBE", {"destination": "/topic/eu-news", "id": "1", "receipt": "s"})
    assert alice.read()[0] == "RECEIPT"

    def names(w, query, **headers):
        command, head = diag(w, query, **headers)
        assert command == "DIAG", head
        return head[query]

    assert [q["destination"] for q in json.loads(names(root_eu, "queues"))] == ["/queue/eu-jobs"]
    assert [q["destination"] for q in json.loads(names(root_default, "queues"))] == ["/queue/jobs"]
    assert [q["destination"] for q in json.loads(names(root_default, "queues", vhost="eu"))] == ["/queue/eu-jobs"]
    assert json.loads(names(root_default, "queues", vhost="us")) == []
    everywhere = [q["destination"] for q in json.loads(names(root_default, "queues", vhost="*"))]
    assert sorted(everywhere) == ["/queue/jobs", "eu:/queue/eu-jobs"]
    assert names(alice, "subs") == "/topic/eu-news" and names(root_default, "subs") == ""
    assert names(alice, "pubsub-size") == "1" and names(root_default, "pubsub-size") == "0"
    assert sorted(c["login"] for c in json.loads(names(alice, "connections"))) == ["alice", "root"]
    assert [c["login"] for c in json.loads(names(root_default, "connections"))] == ["root"]
    assert names(root_default, "session-size") == "1"
    root_eu.frame("SUBSCRIBE", {"destination": "DIAG/t", "id": "d"})      # the topic form: the sender's vhost
    root_eu.frame("SEND", {"destination": "DIAG/t"}, b"queues")
    command, head, _ = root_eu.read()
    assert command == "MESSAGE" and [q["destination"] for q in json.loads(head["queues"].replace("\\c", ":"))] == ["/queue/eu-jobs"]
    command, head = diag(root_default, "queues", vhost="nowhere")
    assert (command, head["message"]) == ("ERROR", "unknown vhost")
    command, head = diag(alice, "queues", vhost="/")  # not an admin: its own vhost only
    assert (command, head["message"]) == ("ERROR", "permission denied for DIAG")


def test_metrics_name_each_queues_vhost_and_give_one_vhost_when_asked(start_broker, tmp_path):
    (tmp_path / "passwd").write_text(f"root:{hash_secret('root')}:admin\n")
    b = start_broker("auth=passwd", f"passwd_file={tmp_path / 'passwd'}", "vhosts=eu,us")
    eu, _ = client(b, "root", "eu")
    default, _ = client(b, "root", "/")
    for conn, name, n in ((eu, "/queue/orders", 3), (default, "/queue/orders", 2)):
        for i in range(n):
            conn.send(name, str(i), receipt=f"r{i}")
    until(lambda: sum(q["depth"] for q in call(b, "GET", "/api/queues?vhost=eu")[1]["items"]) == 3)
    time.sleep(0.3)  # (past the snapshot's reuse window)
    metrics = call(b, "GET", "/metrics")[1].decode()
    assert 'stompbroker_queue_messages{destination="/queue/orders",vhost="eu"} 3.0' in metrics
    assert 'stompbroker_queue_messages{destination="/queue/orders",vhost="/"} 2.0' in metrics
    for line in ('stompbroker_vhost_queued_messages{vhost="eu"} 3.0', 'stompbroker_vhost_queued_messages{vhost="us"} 0.0',
                 'stompbroker_vhost_queues{vhost="/"} 1.0', 'stompbroker_vhost_connections{vhost="eu"} 1.0',
                 "stompbroker_queued_messages 5.0"):
        assert line in metrics, line
    one = call(b, "GET", "/metrics?vhost=eu")[1].decode()
    assert 'stompbroker_queue_messages{destination="/queue/orders",vhost="eu"} 3.0' in one
    assert 'stompbroker_queue_messages{destination="/queue/orders",vhost="/"}' not in one
    assert "stompbroker_queued_messages 3.0" in one and 'stompbroker_vhost_queued_messages{vhost="/"} 2.0' in one
    assert call(b, "GET", "/metrics?vhost=nowhere")[0] == 400
    eu.disconnect()
    default.disconnect()
