"""The console's pure parts: request records, Basic credentials, routing, metric families."""

from __future__ import annotations

import base64
import json
import os
import re
import types

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stompbroker.console import http
from stompbroker.console.metrics import exposition
from stompbroker.protocol.websocket import wants_upgrade


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("header, expected", [
    (basic("root:toor"), ("root", "toor")),
    (basic("root:pa:ss"), ("root", "pa:ss")),          # the password may hold colons
    ("basic " + base64.b64encode(b"a:b").decode(), ("a", "b")),
    (basic("root:"), ("root", "")),
    (basic("nocolon"), None),
    (basic(":secret"), None),
    ("Basic not-base64!!", None),
    ("Bearer abc", None),
    ("", None),
])
def test_basic_credentials(header, expected):
    assert http.basic_credentials(header) == expected


def test_request_record_round_trip():
    request = {"method": "GET", "path": "/metrics?x=1", "version": "HTTP/1.1",
               "headers": {"authorization": basic("a:b"), "accept": "text/plain"}}
    assert http.decode_request(http.encode_request(request)) == ("GET", "/metrics?x=1", basic("a:b"), "text/plain",
                                                                 "", "", "", "", b"")
    bare = {"method": "GET", "path": "/", "version": "HTTP/1.0", "headers": {}}
    assert http.decode_request(http.encode_request(bare)) == ("GET", "/", "", "", "", "", "", "", b"")
    post = {"method": "POST", "path": "/api/publish", "version": "HTTP/1.1",
            "headers": {"origin": "http://h", "host": "h", "content-type": "application/json", "sec-fetch-site": "none"}}
    body = b'{"a":"\x00 NUL and more\x00"}'  # the body comes last: NULs in it are its own
    assert http.decode_request(http.encode_request(post, body)) == ("POST", "/api/publish", "", "", "http://h", "h",
                                                                    "application/json", "none", body)


@pytest.mark.parametrize("headers, upgrade", [
    ({}, False),
    ({"host": "x", "accept": "*/*"}, False),
    ({"connection": "keep-alive"}, False),
    ({"upgrade": "websocket"}, True),
    ({"connection": "keep-alive, Upgrade"}, True),
    ({"sec-websocket-key": "abc"}, True),
])
def test_wants_upgrade(headers, upgrade):
    assert wants_upgrade(headers) is upgrade


def site(console=True, http_api=True, auth_required=False):
    return http.Site(config(console=console, http_api=http_api, auth_required=auth_required), stats=None)


def config(**settings):
    return types.SimpleNamespace(**{"console": True, "http_api": True, "max_connections": 10, "auth_required": False,
                                    "answer_bytes": 1 << 20, "metrics_max_queues": 1000, "api_max_page_size": 500,
                                    "audit_log": "", "audit_log_max_bytes": 1 << 20, "audit_log_files": 1,
                                    "manage_rate_limit": 10.0, "http_manage": True, "vhosts": ["/"], **settings})


@pytest.mark.parametrize("method, target, route, status", [
    ("GET", "/", "page", None),
    ("GET", "/index.html?x=1", "page", None),
    ("HEAD", "/", "page", None),
    ("GET", "/console/vendor/uPlot.iife.min.js", "static", None),
    ("GET", "/api/overview", "api", None),
    ("GET", "/metrics", "metrics", None),
    ("GET", "/nothing", None, 404),
    ("GET", "/console/../setup.cfg", None, 404),
    ("POST", "/metrics", None, 405),
    ("DELETE", "/api/queues", None, 405),
    ("POST", "/nothing", None, 404),
])
def test_routes(method, target, route, status):
    got, response = site().route(method, target)
    assert got == route
    if status is None:
        assert response is None
    else:
        assert response.startswith(b"HTTP/1.1 %d " % status)
        if status == 405:
            assert b"\r\nAllow: GET, HEAD\r\n" in response


def test_the_console_passcode_is_minted_by_post_only_and_only_with_logins_checked():
    assert site(auth_required=True).route("POST", "/console/token") == ("token", None)
    for method in ("GET", "HEAD"):
        refused = site(auth_required=True).route(method, "/console/token")[1]
        assert refused.startswith(b"HTTP/1.1 405 ") and b"\r\nAllow: POST\r\n" in refused
    assert site().route("POST", "/console/token")[1].startswith(b"HTTP/1.1 404 ")
    assert site(console=False, auth_required=True).route("POST", "/console/token")[1].startswith(b"HTTP/1.1 404 ")
    answer = http.token_answer("root", "console-x", 300.0)
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"login": "root", "passcode": "console-x", "expires_in": 300}
    assert b"Cache-Control: no-store" in answer


def test_late_logins_get_http_answers_that_say_when_to_come_back():
    assert re.search(rb"^HTTP/1.1 429 .*\r\nRetry-After: 3\r\n", http.too_many_requests(2.1), re.S)
    assert re.search(rb"^HTTP/1.1 503 .*\r\nRetry-After: 1\r\n", http.unavailable(), re.S)


def test_settings_turn_routes_off():
    assert site(console=False).route("GET", "/")[1].startswith(b"HTTP/1.1 404 ")
    assert site(console=False).route("GET", "/console/console.js")[1].startswith(b"HTTP/1.1 404 ")
    assert site(console=False).route("GET", "/metrics") == ("metrics", None)
    assert site(http_api=False).route("GET", "/metrics")[1].startswith(b"HTTP/1.1 404 ")
    assert site(http_api=False).route("GET", "/api/queues")[1].startswith(b"HTTP/1.1 404 ")
    assert site(http_api=False).route("GET", "/") == ("page", None)


def test_every_static_file_is_packaged_and_the_page_carries_no_passcode():
    s = site()
    for path in http.STATIC:
        response = s.respond("GET", path)
        assert response.startswith(b"HTTP/1.1 200 ") and len(response) > 300, path
    assert b'name="stomp-auth" content=""' in s.respond("GET", "/")
    page = site(auth_required=True).respond("GET", "/")  # the page asks for a passcode before each login
    assert b'name="stomp-auth" content="token"' in page and b"passcode" not in page
    head = s.respond("HEAD", "/")
    assert head.endswith(b"\r\n\r\n") and b"Content-Length: " in head and b"<html" not in head


def test_unauthorized_asks_for_basic():
    response = http.unauthorized()
    assert response.startswith(b"HTTP/1.1 401 ")
    assert b'WWW-Authenticate: Basic realm="stompbroker"' in response


SNAPSHOT = {
    "broker": {"version": "9.9", "start": 1_700_000_000_000.0, "pid": 1},
    "session": {"clients": 3, "websockets": 1, "stomp_connected": 2, "subscriptions": 4},
    "totals": {"messages_published": 10, "messages_delivered": 20, "bytes_in": 300, "bytes_out": 400,
               "frames_in": 5, "frames_out": 6, "errors": 0, "connections_opened": 4, "connections_closed": 1,
               "messages_dropped": 0, "messages_expired": 0, "messages_dead_lettered": 0, "dump_errors": 0,
               "dump_dropped": 0},
    "stale": {"input-queue-size": 1, "output-queue-size": 2, "stale-queue-size": 3},
    "ws_buffer": {"allocated": 0, "hits": 0, "misses": 0},
    "queues": [{"destination": '/queue/a"b', "depth": 7, "enqueued": 9, "dequeued": 2, "unacked": 1, "consumers": 1}],
    "writers": [{"index": 0, "connections": 2, "frames": 6, "bytes": 400, "batches": 4, "fill_sum": 1.5,
                 "pending_bytes": 0}],
    "process": [{"role": "reader", "pid": 5, "rss": 1000, "cpu_seconds": 0.5}],
    "latency": {"count": 8, "p50_ms": 0.5, "p90_ms": 1.0, "p99_ms": 2.0, "p999_ms": 2.0, "max_ms": 4.0},
    "cluster": {"node": "n1", "server": "nats://127.0.0.1:4222", "connected": 1, "rtt_ms": 0.25, "messages_in": 3,
                "messages_out": 4, "bytes_in": 30, "bytes_out": 40, "reconnects": 1, "subscriptions": 2,
                "peers": 4, "local_patterns": 2, "remote_patterns": 5, "remote_subscriptions": 6, "held": 0,
                "failed": 0, "busy": 1, "busy_nodes": 2, "throttled": 3,
                "streams": [{"name": "c_QUEUES_6_1", "messages": 6, "bytes": 600, "stored": 9, "leader": "nats2",
                             "replicas": 3, "shard": "1/6"}]},
    "http": {"internal_errors": 0, "audit_errors": 1, "actions": [{"action": "purge", "status": 200, "count": 3}]},
}


def test_metric_families_parse_with_prometheus_names_and_units():
    body, content_type = exposition(SNAPSHOT)
    assert content_type.startswith("text/plain")
    samples = {}
    types_ = {}
    for family in text_string_to_metric_families(body.decode()):
        types_[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("stompbroker_messages_published_total", ())] == 10
    assert types_["stompbroker_messages_published"] == "counter"
    assert samples[("stompbroker_sent_bytes_total", ())] == 400
    assert samples[("stompbroker_start_time_seconds", ())] == 1_700_000_000
    assert samples[("stompbroker_queue_messages", (("destination", '/queue/a"b'), ("vhost", "/")))] == 7
    assert samples[("stompbroker_writer_batch_fill_ratio_sum", (("writer", "0"),))] == 1.5
    assert samples[("stompbroker_writer_batch_fill_ratio_count", (("writer", "0"),))] == 4
    assert samples[("stompbroker_process_resident_memory_bytes", (("role", "reader"),))] == 1000
    assert samples[("stompbroker_delivery_latency_seconds", (("quantile", "0.99"),))] == pytest.approx(0.002)
    assert samples[("stompbroker_build_info", (("version", "9.9"),))] == 1
    assert samples[("stompbroker_cluster_node_info", (("node", "n1"), ("server", "nats://127.0.0.1:4222")))] == 1
    assert samples[("stompbroker_cluster_messages_sent_total", ())] == 4
    assert samples[("stompbroker_cluster_rtt_seconds", ())] == pytest.approx(0.00025)
    assert samples[("stompbroker_cluster_busy", ())] == 1
    assert samples[("stompbroker_cluster_busy_nodes", ())] == 2
    assert samples[("stompbroker_cluster_peers", ())] == 4
    assert samples[("stompbroker_cluster_throttled_total", ())] == 3
    assert samples[("stompbroker_cluster_stream_messages", (("stream", "c_QUEUES_6_1"),))] == 6
    assert samples[("stompbroker_cluster_stream_leader", (("server", "nats2"), ("stream", "c_QUEUES_6_1")))] == 1
    assert samples[("stompbroker_http_actions_total", (("action", "purge"), ("status", "200")))] == 3
    assert samples[("stompbroker_audit_log_errors_total", ())] == 1
    for name in types_:
        assert name.startswith("stompbroker_"), name


def test_openmetrics_when_the_scraper_asks():
    body, content_type = exposition(SNAPSHOT, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_no_latency_quantiles_without_deliveries():
    quiet = dict(SNAPSHOT, latency={"count": 0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0,
                                    "max_ms": 0.0})
    body, _ = exposition(quiet)
    assert b"stompbroker_delivery_latency_seconds{" not in body
    assert b"stompbroker_delivery_latency_window_deliveries 0.0" in body


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def exposed_samples() -> set[str]:
    body, _ = exposition(SNAPSHOT)
    return {s.name for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def test_the_grafana_dashboard_uses_only_exposed_metrics():
    with open(os.path.join(ROOT, "docker", "grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"stompbroker_[a-z_]+", expr)}
    assert len(used) > 15
    assert used <= exposed_samples(), used - exposed_samples()


def test_the_metrics_table_documents_every_metric():
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        documented = set(re.findall(r"^\| `(stompbroker_[a-z_]+)`", f.read(), re.M))
    exposed = exposed_samples()
    for suffix in ("_sum", "_count"):  # the summary is documented under its family name
        exposed = {n[:-len(suffix)] if n.startswith("stompbroker_writer_batch_fill_ratio") and n.endswith(suffix)
                   else n for n in exposed}
    assert documented == exposed, (documented ^ exposed)


def test_the_page_opens_its_websocket_on_an_allowed_path():
    settings = config(ws_paths=["/stomp", "/ws"])
    assert b'name="stomp-path" content="/stomp"' in http.Site(settings, stats=None).respond("GET", "/")
    assert b'name="stomp-path" content="/"' in site().respond("GET", "/")


# -- answers bounded, negotiation that never fails, errors that cost one request ---------------------
@pytest.mark.parametrize("accept, openmetrics", [
    ("", False),
    ("text/plain", False),
    ("application/openmetrics-text", True),
    ("application/openmetrics-text; version=1.0.0", True),
    ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", True),                       # Prometheus' own
    ("application/openmetrics-text; version=abc", False),                     # was a 500 and a traceback
    ("application/openmetrics-text; version=2.0.0", False),                   # was echoed into Content-Type
    ("application/openmetrics-text; version=1.0.0; q=0.2, text/plain", False),  # the text format ranks higher
    ("application/openmetrics-text; q=abc", False),
    ("application/json", False),
    (";;;,,=;q=,", False),
    ("application/openmetrics-text; escaping=\r\nX-Evil: 1", True),
])
def test_metrics_negotiation_never_fails_and_never_echoes(accept, openmetrics):
    from stompbroker.console.metrics import OPENMETRICS, TEXT
    body, content_type = exposition(SNAPSHOT, accept)
    assert content_type == (OPENMETRICS if openmetrics else TEXT)
    assert body.endswith(b"# EOF\n") is openmetrics


def queue(name, depth):
    return {"destination": name, "depth": depth, "enqueued": depth, "dequeued": 0, "unacked": 0, "consumers": 0}


def test_metrics_list_the_deepest_queues_and_sum_them_all():
    snapshot = dict(SNAPSHOT, queues=[queue(f"/queue/q{i}", i) for i in range(50)])
    body, _ = exposition(snapshot, "", max_queues=10)
    samples = {(s.name, tuple(s.labels.values())): s.value
               for family in text_string_to_metric_families(body.decode()) for s in family.samples}
    listed = {labels[0] for name, labels in samples if name == "stompbroker_queue_messages"}
    assert listed == {f"/queue/q{i}" for i in range(40, 50)}
    assert samples[("stompbroker_queues", ())] == 50
    assert samples[("stompbroker_queues_listed", ())] == 10
    assert samples[("stompbroker_queued_messages", ())] == sum(range(50))


def test_metrics_stay_within_the_answer_budget_with_long_queue_names():
    """130 queues with 55 KB names (failed before: a 36 MB body, bigger than the ring that carries it)."""
    snapshot = dict(SNAPSHOT, queues=[queue(f"/queue/{i}-" + "x" * 55_000, 1) for i in range(130)])
    body, _ = exposition(snapshot, "", max_queues=1000, budget=1 << 20)
    assert len(body) <= 1 << 20
    assert b"stompbroker_queues 130.0" in body
    quoted = dict(SNAPSHOT, queues=[queue(f'/queue/{i}-' + '"\\' * 20_000, 1) for i in range(40)])
    body, _ = exposition(quoted, "", max_queues=1000, budget=1 << 20)
    assert len(body) <= 1 << 20 and b"stompbroker_queues_listed 0.0" not in body


class Stats:
    """The figures a Site reads (diag.stats.Statistics): fixed, with sessions of a Rig-like broker."""

    def __init__(self, sessions=(), queues=()):
        self.broker = types.SimpleNamespace(sessions={s.conn: s for s in sessions})
        self.resources = types.SimpleNamespace(writer_stats=[], reader_stats=types.SimpleNamespace(
            read=lambda: {"http_errors": 0.0}))
        self.started = 0.0
        self.queues = list(queues)

    def writers(self):
        return []

    def processes(self):
        return []

    def totals(self, writers):
        return SNAPSHOT["totals"]

    def latency(self):
        return SNAPSHOT["latency"]

    def vhost_connections(self):
        counts = {}
        for s in self.broker.sessions.values():
            counts[s.vhost or "/"] = counts.get(s.vhost or "/", 0) + 1
        return counts

    def query(self, name):
        return self.queues if name == "queues" else SNAPSHOT.get(name, {})


def page(site_, target):
    response = site_.respond("GET", target)
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), (json.loads(body) if body.startswith(b"{") else body)


def test_api_queues_pages_by_name_with_totals():
    s = http.Site(config(), Stats(queues=[queue(f"/queue/{i:03d}", i) for i in range(250)][::-1]))
    status, first = page(s, "/api/queues")
    assert status == 200 and first["page"] == 1 and first["page_size"] == 100 and first["item_count"] == 100
    assert (first["total_count"], first["page_count"], first["truncated"]) == (250, 3, False)
    assert first["items"][0]["destination"] == "/queue/000"
    status, last = page(s, "/api/queues?page=3&page_size=100")
    assert [q["destination"] for q in last["items"]] == [f"/queue/{i:03d}" for i in range(200, 250)]
    assert page(s, "/api/queues?page=4")[1]["items"] == []
    for bad in ("page=0", "page=x", "page_size=501", "page_size=-1", "page=" + "9" * 40, "page=%C2%B2"):
        status, body = page(s, "/api/queues?" + bad)
        assert status == 400, bad


def test_api_pages_are_cut_at_the_answer_budget():
    s = http.Site(config(answer_bytes=64 * 1024), Stats(queues=[queue(f"/queue/{i:03d}-" + "x" * 5000, 1)
                                                                for i in range(100)]))
    response = s.respond("GET", "/api/queues?page_size=500")
    assert len(response) < 64 * 1024 + 1024
    status, body = page(s, "/api/queues?page_size=500")
    assert body["truncated"] is True and 5 < body["item_count"] == len(body["items"]) < 13


def test_a_failing_handler_is_one_500_and_one_log_line(caplog):
    s = site()
    s.snapshot = lambda: 1 / 0
    with caplog.at_level("ERROR", logger="stompbroker.http"):
        response = s.respond("GET", "/api/overview")
    assert response.startswith(b"HTTP/1.1 500 ") and b"Traceback" not in response and b"ZeroDivision" not in response
    (record,) = caplog.records
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert "ZeroDivisionError" in record.getMessage() and "test_console_http.py" in record.getMessage()
    assert s.errors == 0  # counted once sent (answered, below), like every 5xx


def test_every_5xx_answer_is_counted_in_metrics():
    """The dispatcher tells the site every HTTP status it sends (failed requests, quarantined ones,
    answers too large for the ring, logins not checked in time)."""
    s = site()
    for status in (200, 401, 404, 429, 500, 500, 502, 503):
        s.answered(status)
    assert (s.errors, s.unavailable) == (3, 1)
    body, _ = exposition({**SNAPSHOT, "http": {"internal_errors": s.errors, "unavailable": s.unavailable}})
    assert b"stompbroker_http_internal_errors_total 3.0" in body
    assert b"stompbroker_http_unavailable_total 1.0" in body


class BigStats(Stats):
    """A broker with many processes and, in cluster mode, many streams."""

    def processes(self):
        return [{"role": f"writer-{i}", "pid": 100_000 + i, "rss": 30_000_000, "cpu_seconds": 1.5}
                for i in range(5000)]

    def query(self, name):
        if name == "cluster":
            return {**SNAPSHOT["cluster"], "streams": [
                {"name": f"c_QUEUES_64_{i}", "messages": i, "bytes": 600, "stored": 9, "leader": "nats2",
                 "replicas": 3, "shard": f"{i}/64"} for i in range(3000)]}
        return super().query(name)


def test_api_overview_is_cut_at_the_answer_budget():
    budget = 64 * 1024
    s = http.Site(config(answer_bytes=budget), BigStats())
    raw = s.respond("GET", "/api/overview").partition(b"\r\n\r\n")[2]
    assert len(raw) <= budget  # (failed before: 686 KB)
    status, body = page(s, "/api/overview")
    assert body["truncated"] == {"process": 5000, "streams": 3000}
    assert 100 < len(body["process"]) < 5000 and 100 < len(body["cluster"]["streams"]) < 3000
    assert body["process"][0]["role"] == "writer-0" and body["totals"] == SNAPSHOT["totals"]
    status, body = page(http.Site(config(), Stats()), "/api/overview")  # a broker that fits: nothing cut
    assert status == 200 and "truncated" not in body and body["process"] == []


def test_api_scheduled_lists_jobs_by_time_and_by_destination():
    from stompbroker.broker.schedule import Jobs, Job, Spec
    jobs = Jobs()
    for i, destination in enumerate(("/queue/b", "/queue/a", "/topic/c")):
        job = Job(f"j{i}", destination, {}, b"xy", Spec(1000 * (3 - i), 0, 0, 0, None), 0.0, False)
        job.start(1_000_000)
        jobs.add(job)
    stats = Stats()
    stats.broker.jobs = jobs
    s = http.Site(config(), stats)
    status, body = page(s, "/api/scheduled")
    assert status == 200 and [j["id"] for j in body["items"]] == ["j2", "j1", "j0"]
    assert body["items"][0] == {"id": "j2", "destination": "/topic/c", "next": 1_001_000, "left": 1, "period": 0,
                                "repeat": 0, "cron": "", "delay": 1000, "bytes": 2, "vhost": "/"}
    status, body = page(s, "/api/scheduled?destination=/queue/a")
    assert [j["id"] for j in body["items"]] == ["j1"] and body["total_count"] == 1


def test_api_scheduled_shows_one_virtual_host_at_a_time():
    from stompbroker.broker.schedule import Jobs, Job, Spec
    from stompbroker.broker.vhosts import inside
    jobs = Jobs()
    for i, (vhost, destination) in enumerate((("/", "/queue/a"), ("eu", "/queue/a"), ("eu", "/topic/t"))):
        job = Job(f"j{i}", inside(vhost, destination), {}, b"", Spec(1000 * (i + 1), 0, 0, 0, None), 0.0, False)
        job.start(0)
        jobs.add(job)
    stats = Stats()
    stats.broker.jobs = jobs
    s = http.Site(config(vhosts=["/", "eu"]), stats)
    _, body = page(s, "/api/scheduled")
    assert [(j["id"], j["vhost"], j["destination"]) for j in body["items"]] == [("j0", "/", "/queue/a")]
    _, body = page(s, "/api/scheduled?vhost=eu")
    assert [(j["id"], j["vhost"], j["destination"]) for j in body["items"]] == [("j1", "eu", "/queue/a"),
                                                                              ("j2", "eu", "/topic/t")]
    _, body = page(s, "/api/scheduled?vhost=eu&destination=/topic/t")
    assert [j["id"] for j in body["items"]] == ["j2"]
    assert page(s, "/api/scheduled?vhost=us")[0] == 400


def test_scheduled_messages_are_cancelled_as_management_actions_only():
    """DELETE under /api/scheduled is an action (guarded, audited: console/manage.py) naming the
    virtual host and destination; the listing's old DELETE forms are refused."""
    from broker_harness import Rig
    from stompbroker.console.http import Request
    rig = Rig()
    rig.connect(1)
    for destination in ("/queue/a", "/queue/a", "/queue/b"):
        rig.frame(1, "SEND", {"AMQ_SCHEDULED_DELAY": "60000"}, destination=destination)
    stats = Stats()
    stats.broker = rig.broker
    s = http.Site(config(), stats)
    assert s.route("DELETE", "/api/scheduled/x")[1].startswith(b"HTTP/1.1 405")
    assert s.route("DELETE", "/api/scheduled?destination=/queue/a")[1].startswith(b"HTTP/1.1 405")
    assert s.route("DELETE", "/api/scheduled/%2F/%2Fqueue%2Fa") == ("action", None)
    first = rig.broker.jobs.of("/queue/a")[0].id
    status, one = page(s, f"/api/scheduled/{first}")
    assert status == 200 and one["destination"] == "/queue/a" and one["vhost"] == "/"

    def cancel(path):
        response = s.act(rig.broker, Request("DELETE", path), None, "127.0.0.1:1", rig.now)
        return int(response[9:12]), json.loads(response.partition(b"\r\n\r\n")[2])

    assert cancel(f"/api/scheduled/%2F/%2Fqueue%2Fb/{first}")[0] == 404  # (another destination's)
    assert cancel(f"/api/scheduled/%2F/%2Fqueue%2Fa/{first}") == (200, {"cancelled": 1})
    assert cancel(f"/api/scheduled/%2F/%2Fqueue%2Fa/{first}")[0] == 404
    assert cancel("/api/scheduled/%2F/%2Fqueue%2Fa") == (200, {"cancelled": 1})
    assert cancel("/api/scheduled/nowhere/%2Fqueue%2Fb")[0] == 404  # no such virtual host
    assert [j.destination for j in rig.broker.jobs.of()] == ["/queue/b"]
    assert s.actions == {("cancel", 404): 3, ("cancel", 200): 2}