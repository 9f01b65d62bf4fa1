"""Topics across the nodes of a cluster: a real 3-server NATS JetStream cluster, three broker nodes,
stomp.py clients. Every count is exact: each matching subscription gets each message once."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request

import pytest
import stomp

from tests.stompwire import Wire, drain

pytestmark = pytest.mark.timeout(90)


class Got(stomp.ConnectionListener):
    def __init__(self):
        self.lock = threading.Lock()
        self.messages: list[tuple[str, str, str]] = []   # (subscription, destination, body)
        self.ids: list[tuple[str, str]] = []             # (subscription, message-id)
        self.errors: list[dict] = []
        self.receipts: list[str] = []

    def on_message(self, frame):
        with self.lock:
            self.messages.append((frame.headers["subscription"], frame.headers["destination"], frame.body))
            self.ids.append((frame.headers["subscription"], frame.headers["message-id"]))

    def on_error(self, frame):
        self.errors.append(dict(frame.headers, body=frame.body))

    def on_receipt(self, frame):
        self.receipts.append(frame.headers["receipt-id"])

    def by_sub(self) -> dict[str, list]:
        with self.lock:
            out: dict[str, list] = {}
            for sub, dest, body in self.messages:
                out.setdefault(sub, []).append((dest, body))
            return out


def client(node, listener=Got) -> tuple[stomp.Connection12, Got]:
    conn = stomp.Connection12([node.address], heartbeats=(0, 0))
    got = listener()
    conn.set_listener("", got)
    conn.connect(wait=True)
    return conn, got


def cluster_diag(node, **login) -> dict:
    """The node's DIAG ``cluster`` figures (the answer is a DIAG frame with a ``cluster:<JSON>`` header);
    ``login``: the CONNECT's login and passcode where the node asks for them."""
    w = Wire(node.connect())
    try:
        w.connect(**login)
        w.send(b"DIAG\n\ncluster\0")
        command, headers, _ = w.read()
        assert command == "DIAG", (command, headers)
        return json.loads(headers["cluster"])
    finally:
        w.close()


def wait_for(condition, timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.05)


def wait_interest(node, patterns: int, subscriptions: int | None = None, timeout: float = 15.0,
                  at_least: bool = False) -> None:
    """Until ``node`` knows the other nodes' interest (distinct patterns, and their subscriptions)."""
    def known():
        c = cluster_diag(node)
        seen = c["remote_patterns"]
        return c["connected"] and (seen >= patterns if at_least else seen == patterns) and (
            subscriptions is None or c["remote_subscriptions"] == subscriptions)
    wait_for(known, timeout, f"{patterns} remote patterns on {node.address}")


def test_topics_and_wildcards_reach_each_matching_subscription_once_in_producer_order(start_nodes):
    n0, n1, n2 = start_nodes(3)
    c0, g0 = client(n0)
    c1, g1 = client(n1)
    c2, g2 = client(n2)
    c0.subscribe("/topic/price/eu", id="A")
    c1.subscribe("/topic/price/*", id="B")
    c1.subscribe("/topic/price/eu", id="C")
    c1.subscribe("/topic/*", id="D")        # overlaps B and C on the same node: one NATS subscription
    c2.subscribe("/topic/price/us", id="E")
    c2.subscribe("/topic/pr*", id="F")
    wait_interest(n0, 5)  # B, C, D, E, F
    wait_interest(n1, 3)  # A (= C's pattern), E, F
    wait_interest(n2, 3)  # A, B, D
    n = 40
    destinations = ["/topic/price/eu", "/topic/price/us", "/topic/other", "/topic/price/a.b c>%"]
    producers = [("p0", c0), ("p1", c1), ("p2", c2)]
    for i in range(n):
        for name, conn in producers:
            for d in destinations:
                conn.send(d, f"{name}:{i}")
    for name, conn in producers:
        conn.send("/topic/other", "end", receipt=f"end-{name}")
    eu, us, other, odd = (3 * n,) * 4
    expected = {"A": eu, "B": eu + us + odd, "C": eu, "D": eu + us + other + odd + 3, "E": us,
                "F": eu + us + odd}
    gots = {"A": g0, "B": g1, "C": g1, "D": g1, "E": g2, "F": g2}

    def counts():
        return {sub: len(g.by_sub().get(sub, [])) for sub, g in gots.items()}
    try:
        wait_for(lambda: counts() == expected, 30, "every delivery")
    finally:
        print("counts", counts(), "expected", expected)
    time.sleep(0.5)  # nothing more arrives: no duplicates
    assert counts() == expected
    for sub, g in gots.items():
        ids = [mid for s, mid in g.ids if s == sub]
        assert len(ids) == len(set(ids)), f"duplicates on {sub}"
        for d in destinations:
            for name, _ in producers:
                seq = [int(body.split(":")[1]) for dest, body in g.by_sub().get(sub, [])
                       if dest == d and body.startswith(name + ":")]
                assert seq == sorted(seq), f"{sub} {d} {name} out of order"
    assert {m[1] for m in g1.messages if m[0] == "B"} == {"/topic/price/eu", "/topic/price/us", "/topic/price/a.b c>%"}
    # a node publishes only what another node wants, and receives only what it wants, once:
    # n1 (D: /topic/*) wants everything; n0 only eu (A); n2 eu, us and the odd one (E, F), plus
    # n0's /topic/other: F's NATS subscription is the superset `.t.topic.>` (n1 does not publish
    # /topic/other: nobody elsewhere matches it)
    def crossed():  # (the bridge reports its figures every second)
        stats = [cluster_diag(node) for node in (n0, n1, n2)]
        return [c["messages_out"] for c in stats], [c["messages_in"] for c in stats]
    expected_crossed = ([4 * n + 1, 3 * n, 4 * n + 1], [2 * n, 8 * n + 2, 6 * n + n + 1])
    try:
        wait_for(lambda: crossed() == expected_crossed, 5, "the bridges' figures")
    finally:
        print("crossed", crossed(), "expected", expected_crossed)
    for _, conn in producers:
        conn.disconnect()


class SubjectCounter:
    """A plain NATS client (raw protocol, its own thread) counting the messages published on a
    subject: only those, not the JetStream API and interest traffic that also crosses the servers.
    ``last``: set once a message whose payload ends with ``last_body`` arrived (a topic message's
    last member's body ends it)."""

    def __init__(self, url: str, subject: str, last_body: bytes):
        host, port = url.removeprefix("nats://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.sendall(b"CONNECT {\"verbose\":false}\r\nSUB %s 1\r\nPING\r\n" % subject.encode())
        self.count = 0
        self.last_body = last_body
        self.last = threading.Event()
        self.buf = b""
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        assert self.ready.wait(5), "no PONG from NATS"

    def run(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            self.buf += data
            while (cut := self.buf.find(b"\r\n")) >= 0:
                line = self.buf[:cut]
                if line.startswith(b"MSG "):
                    end = cut + 2 + int(line.split()[-1]) + 2
                    if len(self.buf) < end:
                        break
                    self.count += 1
                    if self.buf[:end - 2].endswith(self.last_body):
                        self.last.set()
                    self.buf = self.buf[end:]
                    continue
                self.buf = self.buf[cut + 2:]
                if line == b"PING":
                    self.sock.sendall(b"PONG\r\n")
                elif line == b"PONG":
                    self.ready.set()

    def close(self) -> None:
        self.sock.close()


def test_a_burst_crosses_nats_in_packs_and_arrives_whole_in_order(start_nodes, nats_cluster, cluster_name):
    """A producer's burst to one topic: the rounds' messages go to NATS as packs (NATS reads far
    fewer messages than were sent) and each subscriber elsewhere gets every one, once, in order."""
    n0, n1 = start_nodes(2)
    c1, g1 = client(n1)
    c1.subscribe("/topic/burst", id="a")
    c1.subscribe("/topic/bur*", id="b")
    wait_interest(n0, 2)
    w = Wire(n0.connect())
    w.connect()
    n = 3000
    counter = SubjectCounter(nats_cluster.urls[0], f"{cluster_name}.t.topic.burst", b"end")
    # in writes of 100 frames: each read of the broker's holds many (a client sending frame by frame
    # on a busy machine may have one in each round, and a round's one goes alone)
    frames = [b"SEND\ndestination:/topic/burst\n\n%d:%s\0" % (i, b"x" * (i % 300)) for i in range(n)]
    for i in range(0, n, 100):
        w.send(b"".join(frames[i:i + 100]))
    w.frame("SEND", {"destination": "/topic/burst", "receipt": "end"}, b"end")
    assert w.read()[0] == "RECEIPT"
    wait_for(lambda: len(g1.messages) == 2 * (n + 1), 30, "every delivery")
    assert counter.last.wait(10), "the last message on NATS"
    read = counter.count
    counter.close()
    for sub in ("a", "b"):
        bodies = [body for s, _, body in g1.messages if s == sub]
        assert [int(b.split(":")[0]) for b in bodies[:-1]] == list(range(n)) and bodies[-1] == "end"
        ids = [mid for s, mid in g1.ids if s == sub]
        assert len(set(ids)) == n + 1
    print("NATS messages read for", n + 1, "sent:", read)
    assert read < n / 4, read
    wait_for(lambda: cluster_diag(n0)["messages_out"] == n + 1 and cluster_diag(n1)["messages_in"] == n + 1, 5,
             "the bridges count messages, not packs")
    w.close()
    c1.disconnect()


def test_a_late_subscriber_on_another_node_gets_the_stale_message(start_nodes):
    n0, n1, n2 = start_nodes(3, "TTL=20000")
    c0, g0 = client(n0)
    for i in range(3):
        c0.send("/topic/late", f"stale-{i}")
    c0.send("/topic/late-other", "other", receipt="sent")
    wait_for(lambda: "sent" in g0.receipts, 5)
    c1, g1 = client(n1)
    c1.subscribe("/topic/late", id="late")
    wait_for(lambda: len(g1.messages) >= 3, 15, "stale messages on n1")
    time.sleep(0.3)
    assert [body for _, _, body in g1.messages] == ["stale-0", "stale-1", "stale-2"]
    # the first late subscriber took them: nobody else gets them again, on any node
    c2, g2 = client(n2)
    c2.subscribe("/topic/late", id="later")
    c0.subscribe("/topic/late", id="local-later")
    wait_interest(n0, 1, 2)
    time.sleep(0.5)
    assert g2.messages == [] and g0.messages == []
    # a wildcard late subscriber on another node takes what it matches
    c2.subscribe("/topic/late-*", id="wild")
    wait_for(lambda: g2.messages, 15, "stale message for the wildcard")
    time.sleep(0.3)
    assert g2.messages == [("wild", "/topic/late-other", "other")]
    for c in (c0, c1, c2):
        c.disconnect()


def test_worker_queue_messages_go_once_each_across_the_cluster(start_nodes):
    n0, n1, n2 = start_nodes(3)
    clients = [client(n) for n in (n0, n1, n2)]
    for i, (conn, _) in enumerate(clients):
        conn.subscribe("#jobs", id=f"w{i}")
    wait_interest(n0, 1, 2)
    wait_interest(n1, 1, 2)
    sender, sent_to = clients[0][0], 60
    for i in range(sent_to):
        sender.send("#jobs", f"job-{i}")
    other = clients[1][0]
    for i in range(30):
        other.send("#jobs", f"job-b{i}")

    def total():
        return sum(len(g.messages) for _, g in clients)
    wait_for(lambda: total() >= 90, 20, "every job")
    time.sleep(0.5)
    bodies = [body for _, g in clients for _, _, body in g.messages]
    assert len(bodies) == 90 and len(set(bodies)) == 90
    shares = [len(g.messages) for _, g in clients]
    assert all(s >= 10 for s in shares), shares  # round-robin over 3 subscriptions: about 30 each
    for conn, _ in clients:
        conn.disconnect()


def test_backplane_down_local_topics_flow_remote_sends_get_an_error_and_it_recovers(start_nodes, nats_cluster):
    n0, n1 = start_nodes(2, "cluster_timeout_ms=1500")
    patient = start_nodes(1, "cluster_timeout_ms=60000", first=2)[0]  # waits longer than NATS is down
    c1, g1 = client(n1)
    c1.subscribe("/topic/remote", id="far")
    c0, g0 = client(n0)
    c0.subscribe("/topic/local", id="near")
    wait_interest(n0, 1)
    wait_interest(patient, 1, at_least=True)  # n1's pattern, and n0's once it is announced
    c0.send("/topic/remote", "before", receipt="r-before")
    wait_for(lambda: g1.messages, 10, "the first cross-node message")
    try:
        nats_cluster.stop_all()
        wait_for(lambda: not cluster_diag(n0)["connected"], 15, "n0 to see NATS down")
        # local traffic keeps flowing, receipts at once
        started = time.monotonic()
        for i in range(50):
            c0.send("/topic/local", f"local-{i}", receipt=f"l{i}")
        wait_for(lambda: len(g0.messages) == 50 and "l49" in g0.receipts, 5, "local deliveries")
        assert time.monotonic() - started < 1.5  # never waited for the network
        # a SEND that needs another node: an ERROR after cluster_timeout_ms, not silence
        p, gp = client(n0)
        started = time.monotonic()
        p.send("/topic/remote", "during", receipt="r-during")
        wait_for(lambda: gp.errors, 10, "ERROR cluster unavailable")
        waited = time.monotonic() - started
        assert gp.errors[0]["message"] == "cluster unavailable"
        assert gp.errors[0].get("receipt-id") == "r-during"
        assert "r-during" not in gp.receipts
        assert 1.0 < waited < 6, waited
        # on a node that waits longer, the message and its receipt wait for NATS to come back
        w, gw = client(patient)
        w.send("/topic/remote", "held", receipt="r-held")
        time.sleep(1)
        assert gw.receipts == [] and gw.errors == []
    finally:
        nats_cluster.start_all()
    wait_for(lambda: "r-held" in gw.receipts, 30, "the held message's receipt")
    assert gw.errors == []
    # (it went out as soon as its node reconnected: n1 gets it if it was back on NATS by then)
    # it comes back by itself
    wait_for(lambda: cluster_diag(n0)["connected"], 30, "n0 to reconnect")
    wait_interest(n0, 1, timeout=30)
    before = len(g1.messages)
    q, _ = client(n0)
    q.send("/topic/remote", "after", receipt="r-after")
    wait_for(lambda: len(g1.messages) > before, 15, "a cross-node message after recovery")
    time.sleep(0.3)
    assert [body for _, _, body in g1.messages] in (["before", "held", "after"], ["before", "after"])
    assert cluster_diag(n0)["reconnects"] >= 1
    for c in (c0, c1, q, w):
        c.disconnect()


def test_changing_subscriptions_never_duplicate_or_lose_for_a_steady_one(start_nodes):
    """While another subscription on the receiving node keeps widening and narrowing its NATS
    subscriptions (exact -> `.>` -> exact), a steady subscription gets every message exactly once."""
    n0, n1 = start_nodes(2)
    c1, g1 = client(n1)
    c1.subscribe("/topic/steady/a", id="steady")
    wait_interest(n0, 1)
    c0, g0 = client(n0)
    flipper, _ = client(n1)
    total = 600
    stop = threading.Event()

    def flip():
        i = 0
        while not stop.is_set() and i < 200:
            flipper.subscribe("/topic/*", id=f"w{i}")
            time.sleep(0.01)
            flipper.unsubscribe(id=f"w{i}")
            time.sleep(0.01)
            i += 1
    t = threading.Thread(target=flip)
    t.start()
    try:
        for i in range(total):
            c0.send("/topic/steady/a", str(i))
            if i % 50 == 0:
                time.sleep(0.02)
    finally:
        stop.set()
        t.join()
    c0.send("/topic/steady/a", "end", receipt="end")
    wait_for(lambda: any(b == "end" for s, _, b in g1.messages if s == "steady"), 15, "the last message")
    bodies = [b for s, _, b in g1.messages if s == "steady"]
    assert bodies == [str(i) for i in range(total)] + ["end"]
    for c in (c0, c1, flipper):
        c.disconnect()


def test_a_restarted_bridge_takes_up_the_nodes_interest_again(start_nodes):
    import psutil
    from stompbroker.titles import process_role
    n0, n1 = start_nodes(2)
    c1, g1 = client(n1)
    c1.subscribe("/topic/r", id="r")
    wait_interest(n0, 1)
    (bridge,) = [p for p in psutil.Process(n1.proc.pid).children() if process_role(p) == "cluster"]
    bridge.kill()
    bridge.wait(5)
    wait_for(lambda: [p for p in psutil.Process(n1.proc.pid).children() if process_role(p) == "cluster"
                      and p.pid != bridge.pid], 10, "a new bridge")
    wait_for(lambda: cluster_diag(n1)["connected"] and cluster_diag(n1)["subscriptions"] == 1, 15,
             "the new bridge subscribed")
    c0, _ = client(n0)
    # the new bridge's subscription reaches n0's NATS server a moment after it is made: probe until one arrives
    deadline = time.monotonic() + 10
    i = 0
    while not g1.messages and time.monotonic() < deadline:
        c0.send("/topic/r", f"probe-{i}")
        i += 1
        time.sleep(0.05)
    assert g1.messages, "no message through the new bridge"
    c0.send("/topic/r", "after", receipt="x")
    wait_for(lambda: any(b == "after" for _, _, b in g1.messages), 10, "a message through the new bridge")
    time.sleep(0.3)
    bodies = [b for _, _, b in g1.messages]
    assert bodies[-1] == "after" and len(bodies) == len(set(bodies))
    assert "started cluster" in n1.log() and "cluster (pid" in n1.log()
    for c in (c0, c1):
        c.disconnect()


def test_the_cluster_section_in_dump_lines_monitor_and_metrics(start_nodes, tmp_path):
    import http.client

    from stompbroker.diag import schema
    dump = tmp_path / "diag.jsonl"
    n0, n1 = start_nodes(2, "diag_interval=200", "monitor_interval=200")
    node = start_nodes(1, "diag_interval=200", f"diag_dump={dump}", first=2)[0]
    c1, _ = client(n1)
    c1.subscribe("/topic/d", id="d")
    wait_interest(node, 1)
    c, g = client(node)
    c.subscribe("/queue/monitor", id="m")
    for i in range(5):
        c.send("/topic/d", str(i))
    wait_for(lambda: dump.exists() and any('"messages_out":5' in line for line in dump.read_text().splitlines()),
             15, "a dump line with the messages sent across")
    lines = [json.loads(line) for line in dump.read_text().splitlines() if line.strip()]
    last = lines[-1]
    assert schema.problems(last) == []
    assert last["cluster"]["node"] == "n2" and last["cluster"]["server"].startswith("nats://127.0.0.1:")
    assert last["cluster"]["connected"] == 1 and last["cluster"]["remote_patterns"] == 1
    assert any(s["name"].startswith("KV_") for s in last["cluster"]["streams"])
    wait_for(lambda: any("Cluster: n2" in body for s, _, body in g.messages if s == "m"), 10, "/queue/monitor")
    conn = http.client.HTTPConnection(node.host, node.port, timeout=10)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    assert "stompbroker_cluster_connected 1.0" in body and "stompbroker_cluster_messages_sent_total 5.0" in body
    assert 'stompbroker_cluster_node_info{node="n2"' in body
    for x in (c, c1):
        x.disconnect()


def test_the_console_shows_the_cluster(start_nodes):
    from playwright import sync_api as playwright
    n0, n1 = start_nodes(2)
    c1, _ = client(n1)
    c1.subscribe("/topic/console", id="c")
    wait_interest(n0, 1)
    c0, _ = client(n0)
    errors = []
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://{n0.host}:{n0.port}/")
            deadline = time.monotonic() + 15
            while not page.is_visible("#cluster-box") and time.monotonic() < deadline:
                c0.send("/topic/console", "x")
                time.sleep(0.2)
            row = page.inner_text("#cluster tbody")
            assert row.startswith("n0") and "nats://127.0.0.1:" in row, row
            assert row.split("\t")[-1].strip() == "no", row   # behind: no busy node
            # other nodes: n1, once n0 has read its entry
            wait_for(lambda: page.inner_text("#cluster tbody").split("\t")[2].strip() == "1", 15,
                     "the console to show n0's one other node")
            deadline = time.monotonic() + 15  # (the bridge reads stream depths every 5 s)
            while "KV_" not in page.inner_text("#streams tbody") and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "KV_" in page.inner_text("#streams tbody")
            # the shards and who leads them: spread over the three NATS servers (balanced by the nodes)
            deadline = time.monotonic() + 20

            def spread():
                return all(f"nats{i} 4" in page.inner_text("#leaders") for i in range(3))  # 6 queue + 6 topic shards
            while not spread() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert spread(), page.inner_text("#leaders")
            rows = [r.split("\t") for r in page.inner_text("#streams tbody").splitlines()]
            shard_rows = [r for r in rows if r[1] != "–"]
            assert len(shard_rows) == 12 and {r[1] for r in shard_rows} == {f"{i}/6" for i in range(6)}, rows
            if os.environ.get("CONSOLE_SCREENSHOT"):
                page.screenshot(path=os.environ["CONSOLE_SCREENSHOT"], full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    with urllib.request.urlopen(f"http://{n0.host}:{n0.port}/api/overview", timeout=5) as r:
        overview = json.loads(r.read())
    shard_streams = [s for s in overview["cluster"]["streams"] if s["shard"]]
    assert len(shard_streams) == 12 and all(s["leader"].startswith("nats") for s in shard_streams), shard_streams
    for c in (c0, c1):
        c.disconnect()


def test_durable_gets_plain_topic_messages_sent_on_another_node_while_away(start_nodes):
    """A durable subscription gets every matching topic message, as on one node, not only the
    persistent ones: made on node B, away, a plain SEND on node A, back on node C: it gets it once;
    a live subscriber on A gets it at once and once."""
    def wire(node, **headers):
        w = Wire(node.connect())
        w.connect(**headers)
        return w

    a, b, c = start_nodes(3)

    def durable(node):
        w = wire(node, **{"client-id": "app"})
        w.frame("SUBSCRIBE", {"destination": "/topic/plain", "id": "d", "ack": "client-individual",
                              "activemq.subscriptionName": "keep", "receipt": "sub"})
        command, headers, _ = w.read(timeout=15)
        assert (command, headers.get("receipt-id")) == ("RECEIPT", "sub"), (command, headers)
        return w

    w = durable(b)
    live = wire(a)
    live.frame("SUBSCRIBE", {"destination": "/topic/plain", "id": "l", "receipt": "lsub"})
    assert live.read(timeout=15)[1].get("receipt-id") == "lsub"
    time.sleep(1.0)  # (node A learns of B's durable subscription)
    w.close()        # away: the durable subscription stays
    time.sleep(0.3)
    sender = wire(a)
    sent = ["p1", "p2"]
    for body in sent:
        sender.frame("SEND", {"destination": "/topic/plain", "receipt": body}, body.encode())
        command, headers, _ = sender.read(timeout=15)
        assert (command, headers.get("receipt-id")) == ("RECEIPT", body), (command, headers)
    w = durable(c)   # back, on a third node
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 2 and time.monotonic() < deadline:
        command, headers, body = w.read(timeout=15)
        if command == "MESSAGE":
            got.append(body.decode())
            w.frame("ACK", {"id": headers["ack"]})
    got += [f[2].decode() for f in drain(w, 1.0) if f[0] == "MESSAGE"]
    live_got = [f[2].decode() for f in drain(live, 1.0) if f[0] == "MESSAGE"]
    print("durable got", got, "live got", live_got)
    assert got == sent
    assert live_got == sent
    # attached on the sending node: from JetStream only, never also live
    here = wire(c)
    here.frame("SEND", {"destination": "/topic/plain", "receipt": "p3"}, b"p3")
    assert here.read(timeout=15)[1].get("receipt-id") == "p3"
    frames = drain(w, 1.5)
    assert [f[2] for f in frames if f[0] == "MESSAGE"] == [b"p3"], frames
    assert [f[2] for f in drain(live, 1.0) if f[0] == "MESSAGE"] == [b"p3"]
    for x in (w, live, sender, here):
        x.close()


class Timed(Got):
    """Got, with when each receipt and each message body arrived (monotonic)."""

    def __init__(self):
        super().__init__()
        self.at: dict[str, float] = {}

    def on_message(self, frame):
        self.at.setdefault(frame.body, time.monotonic())
        super().on_message(frame)

    def on_receipt(self, frame):
        self.at[frame.headers["receipt-id"]] = time.monotonic()
        super().on_receipt(frame)


def test_a_busy_node_slows_the_producers_that_feed_it_and_its_word_ends_with_it(start_nodes):
    from tests.natscluster import kill_node
    (a,) = start_nodes(1, "cluster_busy_hold_ms=3000")
    # b says it is busy once a delivery of a's messages waits for its writer (a round that sees it
    # queued: a few messages), and never catches up (under 1 // 4 bytes)
    (b,) = start_nodes(1, "cluster_busy_bytes=1", first=1)
    cb, gb = client(b, Timed)
    cb.subscribe("/topic/busy", id="S")
    wait_interest(a, 1)
    ca, ga = client(a, Timed)
    other, go = client(a, Timed)
    warm, _ = client(a)   # (a session of its own: one that sent after a heard b is busy is held)

    def busy_on_a() -> bool:
        warm.send("/topic/busy", "warm-up")
        return cluster_diag(a)["busy_nodes"] == 1
    wait_for(busy_on_a, 15, "b's word that it is busy, on a")
    assert cluster_diag(b)["busy"] == 1
    throttled = cluster_diag(a)["throttled"]
    sent = time.monotonic()
    ca.send("/topic/busy", "held", receipt="r1")
    wait_for(lambda: "held" in gb.at, 10, "the message on b")
    other.send("/topic/free", "not held", receipt="q1")   # another session, to no busy node
    wait_for(lambda: "r1" in ga.at and "q1" in go.at, 10, "both receipts")
    try:
        assert gb.at["held"] < ga.at["r1"]       # the message went at once; its receipt was held
        assert go.at["q1"] < ga.at["r1"]         # the other session's was not
        assert ga.at["r1"] - sent >= 2.0         # held while b stayed busy (at most 3 s)
        assert cluster_diag(a)["throttled"] == throttled + 1
    finally:
        print("receipt after", round(ga.at["r1"] - sent, 3), "s")
    kill_node(b)
    wait_for(lambda: cluster_diag(a)["busy_nodes"] == 0, 10, "b's word to end")
    ca.send("/topic/busy", "after", receipt="r2")       # (b's interest lasts longer: still sent to NATS)
    wait_for(lambda: "r2" in ga.at, 10, "the receipt once b is gone")
    assert cluster_diag(a)["throttled"] == throttled + 1
    assert ga.errors == [] and gb.errors == []
    for c in (ca, other, warm):
        c.disconnect()
