"""DIAG queries and topics, /queue/monitor and statistics dumps, against the running broker."""

from __future__ import annotations

import json
import os
import re
import socket
import time

import pytest
import websocket

from stompbroker.diag import schema
from stompbroker.protocol.stomp import unescape
from stompbroker.security import hash_secret
from stompwire import Wire


def wire(broker, connect=True) -> Wire:
    w = Wire(broker.connect())
    if connect:
        w.connect()
    return w


def diag(w: Wire, query: str) -> bytes:
    w.send(b"DIAG\n\n" + query.encode() + b"\0")
    end = b"\n\n\0"
    w.sock.settimeout(5)
    while end not in w.buf:
        w.buf += w.sock.recv(65536)
    raw, _, rest = bytes(w.buf).partition(end)
    w.buf = bytearray(rest)
    return raw + end


def value(w: Wire, query: str):
    raw = diag(w, query)
    prefix = b"DIAG\ncontent-type:text/plain\n" + query.encode() + b":"
    assert raw.startswith(prefix) and raw.endswith(b"\n\n\0"), raw
    text = raw[len(prefix):-3].decode()
    return json.loads(text) if text[:1] in "[{" else text


def test_diag_session_byte_for_byte_before_connect(start_broker):
    b = start_broker("diag_before_connect=true")  # stompica's way, for auth=off only
    w = wire(b, connect=False)
    assert diag(w, "session") == (b'DIAG\ncontent-type:text/plain\n'
                                  b'session:{"clients":1,"websockets":0,"stomp_connected":0,"subscriptions":0}\n\n\0')
    w.connect()
    w.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/a", "receipt": "r"})
    assert w.read()[0] == "RECEIPT"
    assert diag(w, "session") == (b'DIAG\ncontent-type:text/plain\n'
                                  b'session:{"clients":1,"websockets":0,"stomp_connected":1,"subscriptions":1}\n\n\0')


def test_stompica_queries_byte_for_byte(start_broker):
    b = start_broker("TTL=5000")
    w = wire(b)
    w.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/x/*"})
    w.frame("SUBSCRIBE", {"id": "2", "destination": "/topic/y"})
    w.frame("SEND", {"destination": "/topic/nobody", "receipt": "r"}, b"stale")
    assert w.read()[0] == "RECEIPT"
    other = wire(b)
    assert diag(other, "ws_buffer") == b'DIAG\ncontent-type:text/plain\nws_buffer:{"allocated":0,"hits":0,"misses":0}\n\n\0'
    # stompica's frame form: the input and output queue sizes only (the topic form has more)
    assert diag(other, "stale") == b'DIAG\ncontent-type:text/plain\nstale:{"in":0,"out":0}\n\n\0'
    assert diag(other, "session-size") == b"DIAG\ncontent-type:text/plain\nsession-size:2\n\n\0"
    assert diag(other, "session-encoded-size") == b"DIAG\ncontent-type:text/plain\nsession-encoded-size:0\n\n\0"
    assert diag(other, "session-connected-size") == b"DIAG\ncontent-type:text/plain\nsession-connected-size:2\n\n\0"
    assert diag(other, "pubsub-size") == b"DIAG\ncontent-type:text/plain\npubsub-size:2\n\n\0"
    assert diag(other, "subs") == b"DIAG\ncontent-type:text/plain\nsubs:/topic/y,/topic/x/*\n\n\0"


def test_diag_topic_form_adds_statistics_headers(broker):
    w = wire(broker)
    w.frame("SUBSCRIBE", {"id": "d", "destination": "DIAG/abc", "receipt": "r"})
    assert w.read()[0] == "RECEIPT"
    expected = {"session": ["clients", "websockets", "stomp_connected", "subscriptions"],
                "ws_buffer": ["allocated", "hits", "misses"],
                "stale": ["input-queue-size", "output-queue-size", "stale-queue-size"]}
    for query, names in expected.items():
        w.frame("SEND", {"destination": "DIAG/abc"}, query.encode())
        cmd, headers, body = w.read()
        assert cmd == "MESSAGE" and body == query.encode()
        for name in names:
            assert headers[name].isdigit(), (name, headers)
    w.frame("SEND", {"destination": "DIAG/abc"}, b"session")
    assert int(w.read()[1]["stomp_connected"]) >= 1


def test_diag_topic_raw_bytes(start_broker):
    b = start_broker()
    w = wire(b)
    w.send(b"SUBSCRIBE\nid:1\ndestination:DIAG/raw\n\n\0SEND\ndestination:DIAG/raw\n\nsession\0")
    cmd, headers, body = w.read()
    assert cmd == "MESSAGE"
    raw_headers = {k: headers[k] for k in ("clients", "websockets", "stomp_connected", "subscriptions")}
    assert raw_headers == {"clients": "1", "websockets": "0", "stomp_connected": "1", "subscriptions": "1"}


def test_new_queries_writers_process_queues_latency(start_broker):
    b = start_broker("processors=4", "diag_interval=200")
    sub = wire(b)
    sub.frame("SUBSCRIBE", {"id": "1", "destination": "/queue/work", "ack": "client", "receipt": "r"})
    assert sub.read()[0] == "RECEIPT"
    pub = wire(b)
    for i in range(50):
        pub.frame("SEND", {"destination": "/queue/work"}, b"x" * 100)
    pub.frame("SEND", {"destination": "/queue/idle", "receipt": "done"})
    assert pub.read()[0] == "RECEIPT"
    for _ in range(50):
        assert sub.read()[0] == "MESSAGE"
    # A writer publishes each interval's histogram when the interval ends, and the query shows the
    # ones published within the last two intervals: poll for it rather than guess one sleep.
    deadline = time.monotonic() + 5
    lat = value(pub, "latency")
    while lat["count"] < 50 and time.monotonic() < deadline:
        time.sleep(0.05)
        lat = value(pub, "latency")
    assert lat["count"] >= 50
    writers = value(pub, "writers")
    assert [w["index"] for w in writers] == [0, 1]
    assert sum(w["connections"] for w in writers) == 2
    assert sum(w["frames"] for w in writers) >= 53
    assert all(0 <= w["batch_fill"] <= 1 and w["pending_bytes"] >= 0 for w in writers)
    roles = sorted(p["role"] for p in value(pub, "process"))
    assert roles == ["dispatcher", "reader", "supervisor", "writer-0", "writer-1"]
    assert all(p["rss"] > 1_000_000 for p in value(pub, "process"))
    queues = {q["destination"]: q for q in value(pub, "queues")}
    assert queues["/queue/work"] == {"destination": "/queue/work", "depth": 0, "enqueued": 50, "dequeued": 0,
                                     "unacked": 50, "consumers": 1}
    assert queues["/queue/idle"]["depth"] == 1
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"] < 5000


def connections(w: Wire) -> tuple[list[dict], int]:
    """Every part of DIAG connections (continued from next-offset), and how many parts it took."""
    items, offset, parts = [], 0, 0
    while True:
        w.send(b"DIAG\noffset:%d\n\nconnections\0" % offset)
        cmd, headers, _ = w.read()
        assert cmd == "DIAG", headers
        part = json.loads(headers["connections"])
        assert part and int(headers["total"]) >= offset + len(part)
        items += part
        parts += 1
        if "next-offset" not in headers:
            return items, parts
        assert headers["truncated"] == "true" and int(headers["next-offset"]) == offset + len(part)
        offset += len(part)


def test_diag_connections_lists_every_connection_by_its_clients_address_in_parts(start_broker):
    # Behind a proxy the broker knows each client by its PROXY header; DIAG now shows it, with the
    # login, the protocol and the subscription count, in parts of at most max_answer_bytes.
    b = start_broker("proxy_protocol=true", "proxy_trusted=127.0.0.9", "max_answer_bytes=1500")
    alice = wire(b, connect=False)
    alice.connect(login="alice")
    for i in range(3):
        alice.frame("SUBSCRIBE", {"id": str(i), "destination": f"/topic/{i}", "receipt": str(i)})
        assert alice.read()[0] == "RECEIPT"
    proxied = Wire(socket.create_connection(b.address, timeout=10, source_address=("127.0.0.9", 0)))
    proxied.send(b"PROXY TCP4 192.0.2.9 127.0.0.1 4321 61613\r\n")
    proxied.connect(login="bob")
    ws = websocket.create_connection(f"ws://{b.host}:{b.port}/", timeout=5)
    ws.send("CONNECT\naccept-version:1.2\nlogin:carol\n\n\0")
    assert ws.recv().startswith("CONNECTED")
    crowd = [wire(b) for _ in range(20)]
    silent = b.connect()  # has said nothing: its protocol is not known yet
    admin = wire(b)
    expected = 3 + len(crowd) + 2
    deadline = time.monotonic() + 10
    while True:
        items, parts = connections(admin)
        if len(items) == expected:
            break
        assert time.monotonic() < deadline, items
        time.sleep(0.05)
    assert parts > 1 and len({c["id"] for c in items}) == expected
    by_login = {c["login"]: c for c in items}
    assert by_login["alice"]["subscriptions"] == 3 and by_login["alice"]["protocol"] == "stomp"
    assert by_login["bob"]["address"] == "192.0.2.9:4321"
    assert by_login["carol"]["protocol"] == "websocket" and not by_login["carol"]["tls"]
    here = "%s:%s" % silent.getsockname()
    assert [c["protocol"] for c in items if c["address"] == here] == [""]
    admin.frame("SUBSCRIBE", {"id": "d", "destination": "DIAG/me", "receipt": "s"})  # the topic form
    assert admin.read()[0] == "RECEIPT"
    admin.frame("SEND", {"destination": "DIAG/me", "offset": str(expected - 1)}, b"connections")
    cmd, headers, _ = admin.read()
    listed = json.loads(unescape(headers["connections"]))  # (a MESSAGE's headers are escaped: ':' is '\\c')
    assert cmd == "MESSAGE" and len(listed) == 1 and headers["total"] == str(expected)
    for w in [alice, proxied, *crowd, admin]:
        w.sock.close()
    ws.close()
    silent.close()


def test_unknown_diag_query_is_an_error(broker):
    w = wire(broker)
    w.send(b"DIAG\nreceipt:q\n\nnonsense\0")
    cmd, headers, body = w.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "unknown DIAG query", "q")
    assert b"session" in body


def test_queue_monitor(start_broker):
    b = start_broker("monitor_interval=200")
    pub = wire(b)
    for _ in range(3):
        pub.frame("SEND", {"destination": "/queue/client2"}, b"m")
    pub.frame("SEND", {"destination": "/queue/test", "receipt": "r"}, b"m")
    assert pub.read()[0] == "RECEIPT"
    watchers = [wire(b), wire(b)]
    for w in watchers:
        w.frame("SUBSCRIBE", {"id": "m", "destination": "/queue/monitor"})
    for w in watchers:  # every subscriber gets the status, not one of them
        cmd, headers, body = w.read(timeout=3)
        assert cmd == "MESSAGE" and headers["destination"] == "/queue/monitor"
        assert body == (b"Queue: /queue/client2\nsize: 3\nenqueued: 3\ndequeued: 0\n\n"
                        b"Queue: /queue/test\nsize: 1\nenqueued: 1\ndequeued: 0\n\n")
    start = time.monotonic()
    watchers[0].read(timeout=3)
    assert 0.1 < time.monotonic() - start < 2


def test_monitor_is_reserved(broker):
    w = wire(broker)
    w.frame("SEND", {"destination": "/queue/monitor", "receipt": "x"})
    assert w.read()[1]["message"] == "reserved destination"


SCHEMA_KEYS = {"schema", "ts", "interval_ms", "settings_id", "broker", "session", "ws_buffer", "stale", "totals",
               "writers", "process", "queues", "latency"}


def test_dump_lines_schema_and_rotation(start_broker, tmp_path):
    path = tmp_path / "dump" / "diag.jsonl"
    b = start_broker("diag_interval=100", f"diag_dump={path}", "diag_dump_max_bytes=4000", "diag_dump_backups=2")
    w = wire(b)
    w.frame("SEND", {"destination": "/queue/q", "receipt": "r"}, b"x")
    assert w.read()[0] == "RECEIPT"
    deadline = time.monotonic() + 15
    while not os.path.exists(f"{path}.2") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.path.exists(f"{path}.1") and os.path.exists(f"{path}.2")
    assert not os.path.exists(f"{path}.3")
    lines = []
    for name in (f"{path}.2", f"{path}.1", str(path)):
        assert os.path.getsize(name) <= 4000
        lines += [json.loads(line) for line in open(name, "rb") if line.strip()]
    assert len(lines) >= 3
    for line in lines:
        assert set(line) >= SCHEMA_KEYS
        assert schema.problems(line) == []  # every field the one schema declares, of its type
        assert line["schema"] == 1 and line["interval_ms"] == 100
        assert re.fullmatch(r"[0-9a-f]{8}", line["settings_id"])
        assert set(line["totals"]) >= {"frames_in", "frames_out", "bytes_in", "bytes_out", "connections_opened",
                                       "connections_closed", "messages_published", "messages_delivered"}
        assert {p["role"] for p in line["process"]} >= {"supervisor", "reader", "dispatcher", "writer-0"}
    stamps = [line["ts"] for line in lines]
    assert stamps == sorted(stamps)
    assert any(q["destination"] == "/queue/q" and q["depth"] == 1 for q in lines[-1]["queues"])


def test_dump_to_unwritable_path_keeps_serving(start_broker, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    b = start_broker("diag_interval=100", f"diag_dump={blocker}/sub/diag.jsonl")
    time.sleep(0.5)
    w = wire(b)
    w.frame("SEND", {"destination": "/topic/x", "receipt": "alive"})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": "alive"})
    assert "cannot write statistics dump" in b.log()


def test_dump_lines_name_their_node(start_broker, tmp_path):
    # Several brokers' dumps analysed as one fleet are told apart by broker.node.
    path = tmp_path / "diag.jsonl"
    start_broker("diag_interval=100", f"diag_dump={path}", "node_id=edge-1")
    deadline = time.monotonic() + 15
    while not (path.exists() and path.read_bytes().count(b"\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    line = json.loads(path.read_bytes().split(b"\n")[0])
    assert line["broker"]["node"] == "edge-1"


# -- nothing but CONNECT before login ---------------------------------------------------------------
@pytest.fixture
def secured(start_broker, tmp_path):
    """auth=passwd with an admin, root/toor, and a user, bob/builder (diag_admin_only left to its default)."""
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\nbob:{hash_secret('builder')}\n")
    path.chmod(0o600)
    return start_broker("auth=passwd", f"passwd_file={path}")


def login(broker, user: str, passcode: str) -> Wire:
    w = wire(broker, connect=False)
    w.connect(login=user, passcode=passcode)
    return w


def test_diag_needs_a_session_and_admin_when_auth_is_on(secured):
    b = secured
    bob = login(b, "bob", "builder")
    bob.frame("SUBSCRIBE", {"id": "p", "destination": "/queue/bob-payroll-2026", "receipt": "s"})
    assert bob.read(timeout=15)[0] == "RECEIPT"
    anonymous = wire(b, connect=False)  # no CONNECT: nothing but an ERROR, naming no destination
    anonymous.send(b"DIAG\n\nsubs\0")
    cmd, headers, body = anonymous.read()
    assert (cmd, headers["message"]) == ("ERROR", "not connected") and b"payroll" not in body
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:  # a foreign web page: no WebSocket at all
        websocket.create_connection(f"ws://{b.host}:{b.port}/", origin="http://evil.example", timeout=5)
    assert refused.value.status_code == 403
    ws = websocket.create_connection(f"ws://{b.host}:{b.port}/", suppress_origin=True, timeout=5)
    ws.send("DIAG\n\nsubs\0")  # the same over WebSocket
    answer = ws.recv()
    assert answer.startswith("ERROR") and "not connected" in answer and "payroll" not in answer
    user = login(b, "bob", "builder")  # a user, not an admin: diag_admin_only is on with auth
    user.send(b"DIAG\nreceipt:d\n\nsubs\0")
    cmd, headers, _ = user.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "permission denied for DIAG", "d")
    for destination in ("/queue/monitor", "DIAG/bob"):
        w = login(b, "bob", "builder")
        w.frame("SUBSCRIBE", {"id": "m", "destination": destination})
        assert w.read(timeout=15)[1]["message"] == f"permission denied for {destination}"
    user = login(b, "bob", "builder")  # connections are admins' too: logins and addresses
    user.send(b"DIAG\n\nconnections\0")
    assert user.read()[1]["message"] == "permission denied for DIAG"
    root = login(b, "root", "toor")
    assert "/queue/bob-payroll-2026" in value(root, "subs")
    assert "bob" in {c["login"] for c in value(root, "connections")}


def test_a_wildcard_subscription_of_a_user_does_not_read_diag_answers(secured):
    bob = login(secured, "bob", "builder")
    bob.frame("SUBSCRIBE", {"id": "all", "destination": "*", "receipt": "s"})
    assert bob.read(timeout=15)[0] == "RECEIPT"
    root = login(secured, "root", "toor")
    root.frame("SUBSCRIBE", {"id": "d", "destination": "DIAG/root", "receipt": "s"})
    assert root.read(timeout=15)[0] == "RECEIPT"
    root.frame("SEND", {"destination": "DIAG/root"}, b"totals")
    assert root.read()[1]["destination"] == "DIAG/root"  # the admin's answer
    root.frame("SEND", {"destination": "/topic/after", "receipt": "r"}, b"plain")
    assert root.read()[0] == "RECEIPT"
    cmd, headers, body = bob.read()  # bob's "*" got the plain message, not the statistics before it
    assert (cmd, headers["destination"], body) == ("MESSAGE", "/topic/after", b"plain")


def test_diag_before_connect_is_off_by_default(start_broker):
    b = start_broker()
    w = wire(b, connect=False)
    w.send(b"DIAG\n\nsession\0")
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"]) == ("ERROR", "not connected")
    w = wire(b)
    assert value(w, "session")["stomp_connected"] == 1
