"""The web console, JSON API, Prometheus /metrics and DIAG totals on a real broker."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stompbroker.security import hash_secret
from stompwire import Wire, connected

CHROMIUM = "/usr/bin/chromium"


def get(broker, path, method="GET", headers=None, timeout=15.0):
    """(status, headers, body) of one request over its own connection."""
    conn = http.client.HTTPConnection(broker.host, broker.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def basic(login, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()}


def scrape(broker, headers=None) -> dict:
    """/metrics parsed by prometheus_client: {(sample name, labels...): value}, plus family types."""
    status, head, body = get(broker, "/metrics", headers=headers)
    assert status == 200, (status, body)
    assert head["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        samples[("TYPE", family.name)] = family.type
        for s in family.samples:
            samples[(s.name, *sorted(s.labels.items()))] = s.value
    return samples


def stomp(broker, **headers) -> Wire:
    w = Wire(broker.connect())
    w.connect(**headers)
    return w


def send_and_consume(broker, destination, count, body=b"x" * 100):
    """count messages published with a receipt on the last, then all of them consumed."""
    consumer = stomp(broker)
    consumer.frame("SUBSCRIBE", {"id": "s", "destination": destination, "receipt": "sub"})
    assert consumer.read()[0] == "RECEIPT"
    producer = stomp(broker)
    for i in range(count):
        headers = {"destination": destination}
        if i == count - 1:
            headers["receipt"] = "last"
        producer.frame("SEND", headers, body)
    assert producer.read(timeout=15)[1]["receipt-id"] == "last"
    for _ in range(count):
        assert consumer.read(timeout=15)[0] == "MESSAGE"
    return producer, consumer


# -- /metrics ------------------------------------------------------------------------------------
def test_metrics_scrape_parses_and_moves_with_traffic(start_broker):
    b = start_broker("processors=4")
    before = scrape(b)
    for name in ("stompbroker_messages_published", "stompbroker_messages_delivered", "stompbroker_sent_bytes",
                 "stompbroker_process_cpu_seconds", "stompbroker_queue_enqueued_messages"):
        assert before[("TYPE", name)] == "counter", name
    for name in ("stompbroker_connections", "stompbroker_subscriptions", "stompbroker_queue_messages",
                 "stompbroker_process_resident_memory_bytes", "stompbroker_stale_queue_messages"):
        assert before[("TYPE", name)] == "gauge", name
    roles = {key[1][1] for key in before if key[0] == "stompbroker_process_resident_memory_bytes"}
    assert roles == {"supervisor", "reader", "dispatcher", "writer-0", "writer-1"}

    producer, consumer = send_and_consume(b, "/queue/metrics", 200)
    waiting = stomp(b)
    for _ in range(7):  # left in a queue nobody reads
        waiting.frame("SEND", {"destination": "/queue/backlog"}, b"y")
    waiting.frame("SEND", {"destination": "/queue/backlog", "receipt": "r"}, b"y")
    assert waiting.read()[0] == "RECEIPT"
    time.sleep(0.3)  # past the snapshot's reuse window
    after = scrape(b)

    def moved(name):
        return after[(name,)] - before[(name,)]
    assert moved("stompbroker_messages_published_total") == 208
    assert moved("stompbroker_messages_delivered_total") == 200
    assert moved("stompbroker_frames_received_total") >= 208
    assert moved("stompbroker_received_bytes_total") >= 208 * 100
    assert moved("stompbroker_sent_bytes_total") >= 200 * 100
    assert after[("stompbroker_queue_enqueued_messages_total", ("destination", "/queue/metrics"), ("vhost", "/"))] == 200
    assert after[("stompbroker_queue_dequeued_messages_total", ("destination", "/queue/metrics"), ("vhost", "/"))] == 200
    assert after[("stompbroker_queue_consumers", ("destination", "/queue/metrics"), ("vhost", "/"))] == 1
    assert after[("stompbroker_queue_messages", ("destination", "/queue/backlog"), ("vhost", "/"))] == 8
    assert after[("stompbroker_stomp_sessions",)] == 3
    assert after[("stompbroker_subscriptions",)] == 1
    frames = sum(v for k, v in after.items() if k[0] == "stompbroker_writer_frames_total")
    assert frames >= 200
    batches = sum(v for k, v in after.items() if k[0] == "stompbroker_writer_batch_fill_ratio_count")
    assert batches > 0
    assert after[("stompbroker_delivery_latency_window_deliveries",)] >= 0
    assert after[("stompbroker_process_cpu_seconds_total", ("role", "dispatcher"))] >= 0
    assert sum(v for k, v in after.items() if k[0] == "stompbroker_process_cpu_seconds_total") > 0


def test_metrics_speaks_openmetrics_when_asked(broker):
    status, head, body = get(broker, "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200
    assert head["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


# -- the JSON API and DIAG totals ------------------------------------------------------------------
def diag_frame(broker, query):
    w = Wire(broker.connect())
    w.connect()
    w.send(f"DIAG\n\n{query}\0".encode())
    command, headers, _ = w.read()
    assert command == "DIAG"
    return json.loads(headers[query])


def test_diag_totals_frame_and_topic_forms(start_broker):
    b = start_broker("processors=3")
    empty = diag_frame(b, "totals")
    assert empty["messages_published"] == 0 and empty["messages_delivered"] == 0
    send_and_consume(b, "/topic/totals", 25)
    totals = diag_frame(b, "totals")
    assert totals["messages_published"] == 25
    assert totals["messages_delivered"] == 25
    assert totals["messages_dropped"] == 0 and totals["errors"] == 0
    assert set(totals) >= {"frames_in", "frames_out", "bytes_in", "bytes_out", "connections_opened",
                           "connections_closed", "messages_expired", "dump_errors", "dump_dropped"}
    # the topic form: a SEND to a DIAG destination comes back with the figures as headers
    w = stomp(b)
    w.frame("SUBSCRIBE", {"id": "d", "destination": "DIAG/me"})
    w.frame("SEND", {"destination": "DIAG/me", "receipt": "q"}, b"totals")
    frames = [w.read(), w.read()]
    message = next(f for f in frames if f[0] == "MESSAGE")
    assert int(message[1]["messages_published"]) == 25  # taken before the query's own SEND is routed
    assert int(message[1]["messages_delivered"]) == 25


def test_api_gives_the_same_figures_as_diag(start_broker):
    b = start_broker("processors=3")
    producer, consumer = send_and_consume(b, "/queue/api", 30)
    producer.frame("SEND", {"destination": "/queue/api-backlog", "receipt": "r"}, b"z")
    assert producer.read()[0] == "RECEIPT"
    time.sleep(0.3)
    status, head, body = get(b, "/api/overview")
    assert status == 200 and head["content-type"] == "application/json"
    overview = json.loads(body)
    assert set(overview) >= {"broker", "session", "totals", "stale", "writers", "process", "latency"}
    totals = diag_frame(b, "totals")
    for key in ("messages_published", "messages_delivered", "errors"):
        assert overview["totals"][key] == totals[key], key
    assert totals["connections_opened"] == overview["totals"]["connections_opened"] + 1  # the DIAG one
    assert overview["session"]["stomp_connected"] == 2
    assert {p["role"] for p in overview["process"]} == {"supervisor", "reader", "dispatcher", "writer-0"}
    assert overview["broker"]["uptime_seconds"] > 0

    status, _, body = get(b, "/api/queues")
    page = json.loads(body)
    queues = {q["destination"]: q for q in page["items"]}
    assert queues == {q["destination"]: q for q in diag_frame(b, "queues")}
    assert page["total_count"] == len(queues) and page["page"] == 1 and page["truncated"] is False
    assert queues["/queue/api"]["dequeued"] == 30 and queues["/queue/api"]["consumers"] == 1
    assert queues["/queue/api-backlog"]["depth"] == 1

    status, _, body = get(b, "/api/connections")
    listed = json.loads(body)
    stomp_conns = [c for c in listed["items"] if c["connected"]]
    assert len(stomp_conns) == 2 and listed["truncated"] is False and listed["total_count"] >= 3  # and this one
    subscribed = [c for c in stomp_conns if c["subscriptions"]]
    assert subscribed[0]["subscriptions"] == [{"id": "s", "destination": "/queue/api", "ack": "auto", "unacked": 0}]
    assert subscribed[0]["subscription_count"] == 1 and subscribed[0]["subscriptions_truncated"] is False
    assert subscribed[0]["version"] == "1.2" and subscribed[0]["peer"].startswith("127.0.0.1:")
    status, _, body = get(b, "/api/connections?page=2&page_size=1")
    assert len(json.loads(body)["items"]) == 1 and json.loads(body)["page_count"] >= 3


# -- HTTP behaviour ----------------------------------------------------------------------------------
def test_http_errors_are_http_responses(broker):
    status, head, _ = get(broker, "/no/such/page")
    assert status == 404
    status, head, _ = get(broker, "/metrics", method="POST")
    assert status == 405 and head["allow"] == "GET, HEAD"
    status, head, body = get(broker, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(head["content-length"]) > 1000
    status, _, body = get(broker, "/health_check")
    assert (status, body) == (200, b"OK\n")
    with broker.connect() as sock:  # a request head over the limit
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * 9000 + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 431 ")
    status, head, body = get(broker, "/")
    assert status == 200 and head["content-type"].startswith("text/html")
    assert "default-src 'self'" in head["content-security-policy"]
    for src in re.findall(rb'(?:src|href)="(/[^"]+)"', body):  # every script and style is served here
        assert get(broker, src.decode())[0] == 200, src


def test_the_head_limit_and_the_page_size_are_settings(start_broker):
    """max_http_head and api_max_page_size, not their defaults (8 KB, 500), take effect."""
    b = start_broker("max_http_head=16384", "api_max_page_size=2")
    assert get(b, "/api/overview", headers={"X-Filler": "a" * 9000})[0] == 200  # over 8 KB, under 16 KB
    with b.connect() as sock:
        sock.sendall(b"GET /api/overview HTTP/1.1\r\nX-Filler: " + b"a" * 17000 + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 431 ")
    sessions = [connected(b) for _ in range(2)]  # with the request's own: three connections
    status, _, body = get(b, "/api/connections")
    page = json.loads(body)
    assert status == 200 and page["page_size"] == 2 and len(page["items"]) == 2 and page["total_count"] == 3
    status, _, body = get(b, "/api/connections?page_size=3")
    assert status == 400 and b"page_size must be a whole number from 1 to 2" in body
    for w in sessions:
        w.close()


def test_websocket_still_opens_on_the_console_path(broker):
    import websocket
    ws = websocket.create_connection(f"ws://{broker.host}:{broker.port}/", subprotocols=["v12.stomp"], timeout=5)
    ws.send("CONNECT\naccept-version:1.2\nhost:x\n\n\0")
    assert ws.recv().startswith("CONNECTED")
    ws.close()


def test_settings_turn_the_console_and_the_api_off(start_broker):
    b = start_broker("console=false")
    assert get(b, "/")[0] == 404
    assert get(b, "/console/console.js")[0] == 404
    assert get(b, "/metrics")[0] == 200
    b2 = start_broker("console=false", "http_api=false")
    for path in ("/", "/metrics", "/api/overview"):
        assert get(b2, path)[0] == 404, path
    assert get(b2, "/health_check")[0] == 200


def test_stalled_http_clients_do_not_stall_the_broker(start_broker):
    b = start_broker("processors=3", "connect_timeout_ms=1500")
    stalled = []
    for _ in range(50):  # request heads that never end
        s = b.connect()
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        stalled.append(s)
    readers = []
    for _ in range(20):  # complete requests whose answers are never read
        s = b.connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.sendall(b"GET /console/vendor/uPlot.iife.min.js HTTP/1.1\r\nHost: x\r\n\r\n")
        readers.append(s)
    started = time.monotonic()
    send_and_consume(b, "/queue/meanwhile", 50)
    assert get(b, "/api/queues")[0] == 200
    assert time.monotonic() - started < 10
    for s in stalled:  # unfinished heads get a 408 after half the connect timeout, then the close
        s.settimeout(10)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:100]
    for s in stalled + readers:
        s.close()


def test_metrics_over_tls_on_ssl_port(start_broker, tmp_path):
    import ssl

    import trustme
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = start_broker(f"ssl_port={port}", f"ssl_cert={tmp_path / 'cert.pem'}", f"ssl_key={tmp_path / 'key.pem'}")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    body = response.read()
    conn.close()
    assert response.status == 200
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert "stompbroker_messages_published" in names
    assert get(b, "/api/overview")[0] == 200  # and on the plain port


# -- auth ---------------------------------------------------------------------------------------------
@pytest.fixture
def secured(start_broker, tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\nalice:{hash_secret('wonderland')}\n")
    path.chmod(0o600)
    return start_broker("auth=passwd", f"passwd_file={path}", "auth_fail_delay_ms=100")


def test_console_api_and_metrics_are_for_admins_when_auth_is_on(secured):
    for path in ("/", "/api/overview", "/api/queues", "/api/connections", "/metrics"):
        status, head, _ = get(secured, path)
        assert status == 401, path
        assert head["www-authenticate"].startswith('Basic realm="stompbroker"')
    assert get(secured, "/metrics", headers=basic("root", "wrong"))[0] == 401
    assert get(secured, "/metrics", headers=basic("nobody", "toor"))[0] == 401
    assert get(secured, "/metrics", headers=basic("alice", "wonderland"))[0] == 403
    assert get(secured, "/api/overview", headers=basic("alice", "wonderland"))[0] == 403
    assert scrape(secured, basic("root", "toor"))[("TYPE", "stompbroker_messages_published")] == "counter"
    assert get(secured, "/api/queues", headers=basic("root", "toor"))[0] == 200
    assert get(secured, "/console/vendor/stomp.umd.min.js")[0] == 200  # library code is public
    assert get(secured, "/nothing", headers=basic("root", "toor"))[0] == 404


def mint(broker, login="root", password="toor", source="127.0.0.1"):
    """POST /console/token as the page does: (status, JSON answer or None)."""
    conn = http.client.HTTPConnection(broker.host, broker.port, timeout=15, source_address=(source, 0))
    try:
        conn.request("POST", "/console/token", headers=basic(login, password))
        response = conn.getresponse()
        body = response.read()
        return response.status, json.loads(body) if response.status == 200 else None
    finally:
        conn.close()


def console_login(broker, token, login="root", source="127.0.0.1"):
    w = Wire(socket.create_connection(broker.address, timeout=5, source_address=(source, 0)))
    w.frame("CONNECT", {"accept-version": "1.2", "login": login, "passcode": token, "heart-beat": "0,0"})
    return w, w.read(timeout=15)


def test_a_console_token_is_a_read_only_single_use_session_of_its_user(secured):
    status, _, page = get(secured, "/", headers=basic("root", "toor"))
    assert status == 200 and b"console-" not in page  # the page carries no passcode: it asks for one
    assert get(secured, "/console/token", headers=basic("root", "toor"))[0] == 405  # minted by POST only
    assert mint(secured, "alice", "wonderland")[0] == 403
    status, token = mint(secured)
    assert status == 200 and token["login"] == "root" and token["passcode"].startswith("console-")
    assert 0 < token["expires_in"] <= 300
    w, connected = console_login(secured, token["passcode"])
    assert connected[0] == "CONNECTED"
    w.send(b"DIAG\n\ntotals\0")
    assert w.read()[0] == "DIAG"
    w.frame("SUBSCRIBE", {"id": "m", "destination": "/queue/monitor", "receipt": "m"})
    assert w.read()[0] == "RECEIPT"
    w.frame("SEND", {"destination": "/queue/orders", "receipt": "s"}, b"x")
    cmd, headers, _ = w.read()
    assert (cmd, headers["message"], headers["receipt-id"]) == ("ERROR", "permission denied for SEND", "s")
    _, again = console_login(secured, token["passcode"])  # used once: gone
    assert again[1]["message"] == "access refused"
    _, token = mint(secured)
    w, _ = console_login(secured, token["passcode"])
    w.frame("SUBSCRIBE", {"id": "q", "destination": "/queue/orders"})
    assert w.read()[1]["message"] == "permission denied for /queue/orders"
    _, token = mint(secured)
    assert console_login(secured, token["passcode"], login="alice")[1][1]["message"] == "access refused"
    assert console_login(secured, token["passcode"], source="127.0.0.2")[1][1]["message"] == "access refused"
    assert get(secured, "/metrics", headers=basic("root", token["passcode"]))[0] == 401  # not a password
    assert console_login(secured, token["passcode"])[1][0] == "CONNECTED"  # (still unused until here)


def test_console_tokens_are_a_bounded_pool_per_user_that_head_does_not_fill(start_broker, tmp_path):
    PER_USER = 3  # console_tokens_per_user, not its default (8)
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\nops:{hash_secret('ops')}:admin\n")
    path.chmod(0o600)
    b = start_broker("auth=passwd", f"passwd_file={path}", f"console_tokens_per_user={PER_USER}")
    _, kept = mint(b)
    for _ in range(1000):  # an open console's token outlives a flood of page loads
        assert get(b, "/", method="HEAD", headers=basic("root", "toor"))[0] == 200
    for _ in range(PER_USER * 3):  # and another admin's tokens
        assert mint(b, "ops", "ops")[0] == 200
    assert console_login(b, kept["passcode"])[1][0] == "CONNECTED"
    _, oldest = mint(b)
    for _ in range(PER_USER):  # root's own pool is bounded: its oldest token goes
        newest = mint(b)[1]
    assert console_login(b, oldest["passcode"])[1][1]["message"] == "access refused"
    assert console_login(b, newest["passcode"])[1][0] == "CONNECTED"


def test_a_console_session_lasts_as_long_as_its_token(start_broker, tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"root:{hash_secret('toor')}:admin\n")
    path.chmod(0o600)
    b = start_broker("auth=passwd", f"passwd_file={path}", "console_token_ttl_ms=1000")
    _, token = mint(b)
    assert token["expires_in"] == 1
    w, connected = console_login(b, token["passcode"])
    assert connected[0] == "CONNECTED"
    cmd, headers, _ = w.read(timeout=5)
    assert (cmd, headers["message"]) == ("ERROR", "session expired")
    assert get(b, "/console/token", method="POST")[0] == 401
    open_broker = start_broker()  # without auth the page needs no token
    assert get(open_broker, "/console/token", method="POST")[0] == 404


# -- a real browser ---------------------------------------------------------------------------------
@pytest.mark.parametrize("auth", [False, True], ids=["open", "auth"])
def test_console_in_a_headless_browser_shows_live_figures(start_broker, tmp_path, auth):
    from playwright import sync_api as playwright
    assert os.path.exists(CHROMIUM), "the console test needs Debian's chromium (./build.sh test installs it)"
    settings, login, credentials = ["processors=4"], {}, None
    if auth:  # the page behind HTTP Basic, its STOMP logins by passcodes it asks for, renewed every 2.4 s
        path = tmp_path / "passwd"
        path.write_text(f"root:{hash_secret('toor')}:admin\n")
        settings += ["auth=passwd", f"passwd_file={path}", "console_token_ttl_ms=3000"]
        login = {"login": "root", "passcode": "toor"}
        credentials = {"username": "root", "password": "toor"}
    b = start_broker(*settings)
    stop = threading.Event()
    sent = [0]

    def traffic():  # bounded in count and time
        consumer = stomp(b, **login)
        consumer.frame("SUBSCRIBE", {"id": "c", "destination": "/queue/browser"})
        producer = stomp(b, **login)
        consumer.sock.setblocking(False)
        deadline = time.monotonic() + 40
        while not stop.is_set() and time.monotonic() < deadline and sent[0] < 200_000:
            for destination in ("/queue/browser", "/queue/browser-backlog", "/topic/browser"):
                producer.frame("SEND", {"destination": destination}, b"m" * 100)
            sent[0] += 3
            if sent[0] % 150 == 0:
                time.sleep(0.02)
                try:
                    while consumer.sock.recv(1 << 20):
                        pass
                except BlockingIOError:
                    pass
    loader = threading.Thread(target=traffic, daemon=True)
    loader.start()
    errors = []
    shot = os.environ.get("CONSOLE_SCREENSHOT", str(tmp_path / "console.png")).replace(".png", f"-{'auth' if auth else 'open'}.png")
    try:
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000}, http_credentials=credentials)
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"http://{b.host}:{b.port}/")
                # polled from here: the page's Content-Security-Policy forbids the eval wait_for_function uses
                until(lambda: page.inner_text("#status") == "live")
                until(lambda: page.inner_text("#tile-in-rate") != "–")  # two samples make a rate
                first = number(page.inner_text("#tile-published"))
                time.sleep(1.5)  # one sample a second
                second = number(page.inner_text("#tile-published"))
                assert second > first > 0, (first, second)
                assert number(page.inner_text("#tile-in-rate")) > 0
                assert number(page.inner_text("#tile-connections")) >= 3
                assert number(page.inner_text("#tile-queued")) > 0     # the backlog queue nobody reads
                rows = page.inner_text("#queues tbody")
                assert "/queue/browser-backlog" in rows and "/queue/browser" in rows
                assert page.locator(".charts canvas").count() == 9
                processes = page.inner_text("#processes tbody")
                for role in ("supervisor", "reader", "dispatcher", "writer-0", "writer-1"):
                    assert role in processes
                # each process has its own colour, the same in the table and the charts
                colours = page.eval_on_selector_all("#processes .swatch", "els => els.map(e => e.style.background)")
                assert len(set(colours)) == 5
                assert not page.is_visible("#cluster-box")  # a single node
                page.screenshot(path=shot, full_page=True)
                if auth:  # a new session before the broker ends the last: three of them, and no ERROR
                    seen = set()
                    until(lambda: len(page_sessions(b, seen)) >= 3, timeout=20)
                    until(lambda: page.inner_text("#status") == "live")
                    published = number(page.inner_text("#tile-published"))
                    until(lambda: number(page.inner_text("#tile-published")) > published)
                    overview = json.loads(get(b, "/api/overview", headers=basic("root", "toor"))[2])
                    assert overview["totals"]["errors"] == 0  # (a session the broker ended gets one)
                stop.set()
                loader.join(10)
                if not auth:  # the console's own queries are DIAG frames, not messages: idle reads 0/s
                    until(lambda: page.inner_text("#tile-in-rate") == "0" and page.inner_text("#tile-out-rate") == "0")
                    published = page.inner_text("#tile-published")
                    time.sleep(1.5)
                    assert page.inner_text("#tile-published") == published
            finally:
                browser.close()
    finally:
        stop.set()
        loader.join(10)
    assert os.path.getsize(shot) > 20_000
    assert not errors, errors


def page_sessions(broker, seen: set) -> set:
    """``seen`` and the page's STOMP sessions open now (polled: each lasts a few seconds)."""
    body = get(broker, "/api/connections", headers=basic("root", "toor"))[2]
    seen.update(c["session"] for c in json.loads(body)["items"] if c["websocket"] and c["login"] == "root")
    return seen


def until(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the console never showed it"
        time.sleep(0.1)


def number(text: str) -> float:
    """A tile's figure: '12.5k' -> 12500."""
    text = text.strip()
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:], 1)
    return float(text.rstrip("kMG")) * scale


def test_console_in_a_headless_browser_lists_and_cancels_scheduled_messages(secured):
    """The buttons are management actions (DELETE /api/scheduled/VHOST/DEST[/ID]): the page's
    fetch carries its Basic credentials and its own Origin, and each cancel is audited."""
    from playwright import sync_api as playwright
    assert os.path.exists(CHROMIUM), "the console test needs Debian's chromium (./build.sh test installs it)"
    b = secured
    producer = stomp(b, login="root", passcode="toor")
    for i, destination in enumerate(("/queue/one", "/queue/two", "/queue/two")):
        producer.frame("SEND", {"destination": destination, "AMQ_SCHEDULED_DELAY": "600000", "receipt": str(i)})
        assert producer.read()[0] == "RECEIPT"

    def jobs():
        return [j["destination"] for j in json.loads(get(b, "/api/scheduled", headers=basic("root", "toor"))[2])["items"]]

    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(http_credentials={"username": "root", "password": "toor"})
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://{b.host}:{b.port}/")
            until(lambda: page.locator("#scheduled tbody tr").count() == 3)
            page.locator("#scheduled tbody tr", has_text="/queue/one").get_by_role(
                "button", name="cancel", exact=True).click()
            until(lambda: jobs() == ["/queue/two", "/queue/two"])
            page.locator("#scheduled tbody tr", has_text="/queue/two").first.get_by_role(
                "button", name="cancel all", exact=True).click()
            until(lambda: jobs() == [])
            until(lambda: page.inner_text("#scheduled tbody") == "none")
            metrics = scrape(b, headers=basic("root", "toor"))
            assert metrics[("stompbroker_http_actions_total", ("action", "cancel"), ("status", "200"))] == 2
            assert not errors, errors
        finally:
            browser.close()
