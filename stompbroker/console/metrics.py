"""Prometheus metrics: the DIAG figures as metric families, rendered by ``prometheus_client``.

A custom collector turns one statistics snapshot (the same figures as the DIAG queries and the dump
line) into metric families on each scrape; ``prometheus_client``'s exposition code writes the text
(or OpenMetrics, when the scraper asks for it). Nothing is kept between scrapes: counters are the
broker's own cumulative counters, which restart from 0 with the broker, as Prometheus expects.
The names and their meaning are listed in docs/metrics.md.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, SummaryMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import CollectorRegistry

PREFIX = "stompbroker_"
DEFAULT_VHOST = "/"

# (totals key, metric name without prefix and _total, help)
TOTALS = (
    ("messages_published", "messages_published", "SEND frames accepted"),
    ("messages_delivered", "messages_delivered", "MESSAGE frames delivered to subscribers"),
    ("messages_dropped", "messages_dropped", "messages that reached nobody and were not kept"),
    ("messages_expired", "messages_expired", "messages not delivered because their expiry had passed"),
    ("messages_dead_lettered", "messages_dead_lettered", "messages moved to the dead-letter queue"),
    ("frames_in", "frames_received", "STOMP frames received"),
    ("frames_out", "frames_sent", "STOMP frames sent"),
    ("bytes_in", "received_bytes", "bytes received on client sockets"),
    ("bytes_out", "sent_bytes", "bytes sent on client sockets"),
    ("connections_opened", "connections_opened", "client connections accepted"),
    ("connections_closed", "connections_closed", "client connections closed"),
    ("errors", "errors", "ERROR frames sent (each closes its connection)"),
    ("dump_errors", "diag_dump_errors", "statistics dump lines the disk refused"),
    ("dump_dropped", "diag_dump_dropped", "statistics dump lines dropped because the writer could not keep up"),
)

CLUSTER_TOTALS = (
    ("messages_in", "cluster_messages_received", "messages received from other nodes"),
    ("messages_out", "cluster_messages_sent", "messages published for other nodes"),
    ("bytes_in", "cluster_received_bytes", "bytes received from NATS for other nodes' messages"),
    ("bytes_out", "cluster_sent_bytes", "bytes published to NATS"),
    ("reconnects", "cluster_reconnects", "reconnections to NATS"),
    ("failed", "cluster_unavailable_errors", "SENDs answered with ERROR cluster unavailable"),
    ("throttled", "cluster_throttled", "times a session's replies were held because it published to a busy node"),
)

QUANTILES = (("0.5", "p50_ms"), ("0.9", "p90_ms"), ("0.99", "p99_ms"), ("0.999", "p999_ms"), ("1", "max_ms"))


TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def negotiate(accept: str) -> str:
    """The content type of a scrape: OpenMetrics 1.0.0 when ``Accept`` ranks it above the text
    format, else the text format (whatever else it says: an unknown type or version, a malformed
    header). Never an error: a scraper always gets metrics in a format it can read or ignore."""
    best, best_q = TEXT, -1.0
    for position, offer in enumerate(accept.split(",")[:32]):
        kind, *params = [part.strip() for part in offer.split(";")]
        options = {}
        for param in params:
            name, _, value = param.partition("=")
            options[name.strip().lower()] = value.strip().strip('"')
        try:
            q = float(options.get("q", "1"))
        except ValueError:
            continue
        if not 0 < q <= 1:
            continue
        kind = kind.lower()
        if kind == "application/openmetrics-text" and options.get("version", "1.0.0") == "1.0.0":
            candidate = OPENMETRICS
        elif kind in ("text/plain", "text/*", "*/*") and options.get("version", "0.0.4") == "0.0.4":
            candidate = TEXT
        else:
            continue
        if q > best_q:  # the first of equal preference wins
            best, best_q = candidate, q
    return best


def of_vhost(queues: list, vhost: str | None) -> list:
    """The queues of ``vhost`` (every queue: None), each with its ``vhost`` and its destination as
    its clients name it (a snapshot shows another vhost's as ``VHOST:destination``)."""
    out = []
    for q in queues:
        their = q.get("vhost", DEFAULT_VHOST)
        if vhost is None or their == vhost:
            name = q["destination"] if their == DEFAULT_VHOST else q["destination"][len(their) + 1:]
            out.append({**q, "vhost": their, "destination": name})
    return out


def families(s: dict, max_queues: int | None = None, vhost: str | None = None):
    """Metric families for one snapshot (see ``snapshot`` in console/http.py for its shape);
    per-queue series for the ``max_queues`` deepest queues at most (all of them: None), of
    ``vhost`` only when one is named (the per-vhost totals still name every vhost)."""
    info = InfoMetricFamily(PREFIX + "build", "broker version")
    info.add_metric([], {"version": s["broker"]["version"]})
    yield info
    yield GaugeMetricFamily(PREFIX + "start_time_seconds", "broker start time, Unix epoch seconds",
                            value=s["broker"]["start"] / 1000)

    session = s["session"]
    yield GaugeMetricFamily(PREFIX + "connections", "open client connections (TCP and WebSocket)",
                            value=session["clients"])
    yield GaugeMetricFamily(PREFIX + "websocket_connections", "open WebSocket connections",
                            value=session["websockets"])
    yield GaugeMetricFamily(PREFIX + "stomp_sessions", "connections past the STOMP CONNECT handshake",
                            value=session["stomp_connected"])
    yield GaugeMetricFamily(PREFIX + "subscriptions", "active subscriptions", value=session["subscriptions"])

    totals = s["totals"]
    for key, name, text in TOTALS:
        if key in totals:
            yield CounterMetricFamily(PREFIX + name, text, value=totals[key])

    stale = s["stale"]
    yield GaugeMetricFamily(PREFIX + "input_queue_records",
                            "records waiting in the reader-to-dispatcher queue", value=stale["input-queue-size"])
    yield GaugeMetricFamily(PREFIX + "output_queue_records",
                            "records waiting in the dispatcher-to-writer queues", value=stale["output-queue-size"])
    yield GaugeMetricFamily(PREFIX + "stale_queue_messages",
                            "messages waiting in the TTL stale queue", value=stale["stale-queue-size"])
    yield GaugeMetricFamily(PREFIX + "websocket_buffer_bytes",
                            "bytes held for partial WebSocket frames", value=s["ws_buffer"]["allocated"])

    everywhere = of_vhost(s["queues"], None)
    by_vhost = {name: [0, 0, 0, 0] for name in s.get("vhosts", ())}   # queues, messages, unacked, connections
    for q in everywhere:
        figures = by_vhost.setdefault(q["vhost"], [0, 0, 0, 0])
        figures[0] += 1
        figures[1] += q["depth"]
        figures[2] += q["unacked"]
    for name, n in s.get("vhost_connections", {}).items():
        by_vhost.setdefault(name, [0, 0, 0, 0])[3] = n
    for index, (name, text) in enumerate((
            ("vhost_queues", "queues in the virtual host"),
            ("vhost_queued_messages", "messages waiting in the virtual host's queues"),
            ("vhost_unacked_messages", "delivered, not yet acknowledged, in the virtual host's queues"),
            ("vhost_connections", "STOMP sessions of the virtual host"))):
        family = GaugeMetricFamily(PREFIX + name, text, labels=["vhost"])
        for vhost_name in sorted(by_vhost):
            family.add_metric([vhost_name], by_vhost[vhost_name][index])
        yield family

    every = everywhere if vhost is None else [q for q in everywhere if q["vhost"] == vhost]
    listed = every if max_queues is None or len(every) <= max_queues else deepest(every)[:max_queues]
    scope = "in the broker" if vhost is None else "in this virtual host"
    yield GaugeMetricFamily(PREFIX + "queues", f"queues {scope}", value=len(every))
    yield GaugeMetricFamily(PREFIX + "queues_listed", "queues with series of their own (stompbroker_queue_*) in this "
                            "scrape: the deepest, at most metrics_max_queues", value=len(listed))
    yield GaugeMetricFamily(PREFIX + "queued_messages", f"messages waiting, all queues {scope}",
                            value=sum(q["depth"] for q in every))
    yield GaugeMetricFamily(PREFIX + "unacked_messages", f"delivered, not yet acknowledged, all queues {scope}",
                            value=sum(q["unacked"] for q in every))
    labels = ["vhost", "destination"]
    depth = GaugeMetricFamily(PREFIX + "queue_messages", "messages waiting in the destination", labels=labels)
    unacked = GaugeMetricFamily(PREFIX + "queue_unacked_messages", "delivered, not yet acknowledged", labels=labels)
    consumers = GaugeMetricFamily(PREFIX + "queue_consumers", "subscribers of the destination", labels=labels)
    enqueued = CounterMetricFamily(PREFIX + "queue_enqueued_messages", "messages added to the destination",
                                   labels=labels)
    dequeued = CounterMetricFamily(PREFIX + "queue_dequeued_messages", "messages removed from the destination",
                                   labels=labels)
    for q in listed:
        value = [q["vhost"], q["destination"]]
        depth.add_metric(value, q["depth"])
        unacked.add_metric(value, q["unacked"])
        consumers.add_metric(value, q["consumers"])
        enqueued.add_metric(value, q["enqueued"])
        dequeued.add_metric(value, q["dequeued"])
    yield from (depth, unacked, consumers, enqueued, dequeued)

    labels = ["writer"]
    w_conns = GaugeMetricFamily(PREFIX + "writer_connections", "connections assigned to the writer", labels=labels)
    w_frames = CounterMetricFamily(PREFIX + "writer_frames", "frames written by the writer", labels=labels)
    w_bytes = CounterMetricFamily(PREFIX + "writer_sent_bytes", "bytes written by the writer", labels=labels)
    w_pending = GaugeMetricFamily(PREFIX + "writer_pending_bytes", "bytes queued, not yet written", labels=labels)
    # fill of the write buffer per socket write: rate(_sum) / rate(_count) is the mean fill
    w_fill = SummaryMetricFamily(PREFIX + "writer_batch_fill_ratio",
                                 "fill of the write buffer (0..1) per socket write batch", labels=labels)
    for w in s["writers"]:
        value = [str(w["index"])]
        w_conns.add_metric(value, w["connections"])
        w_frames.add_metric(value, w["frames"])
        w_bytes.add_metric(value, w["bytes"])
        w_pending.add_metric(value, w["pending_bytes"])
        w_fill.add_metric(value, count_value=w["batches"], sum_value=w["fill_sum"])
    yield from (w_conns, w_frames, w_bytes, w_pending, w_fill)

    labels = ["role"]
    rss = GaugeMetricFamily(PREFIX + "process_resident_memory_bytes", "resident set size of the process",
                            labels=labels)
    cpu = CounterMetricFamily(PREFIX + "process_cpu_seconds", "user and system CPU time of the process",
                              labels=labels)
    for p in s["process"]:
        rss.add_metric([p["role"]], p["rss"])
        cpu.add_metric([p["role"]], p["cpu_seconds"])
    yield from (rss, cpu)

    lat = s["latency"]
    quantiles = GaugeMetricFamily(PREFIX + "delivery_latency_seconds",
                                  "input-queue-to-socket latency over the last diag_interval, by quantile "
                                  "(1 = maximum); absent when nothing was delivered", labels=["quantile"])
    if lat.get("count"):
        for q, key in QUANTILES:
            if lat.get(key) is not None:
                quantiles.add_metric([q], lat[key] / 1000)
    yield quantiles
    yield GaugeMetricFamily(PREFIX + "delivery_latency_window_deliveries",
                            "deliveries measured over the last diag_interval", value=lat.get("count", 0))

    yield CounterMetricFamily(PREFIX + "http_unavailable", "HTTP requests answered 503: their login was not "
                              "checked in time (too many waiting)", value=s.get("http", {}).get("unavailable", 0))
    yield CounterMetricFamily(PREFIX + "http_internal_errors", "HTTP requests answered 500 (or another 5xx "
                              "but 503): the broker failed to answer them, refused a quarantined request, or "
                              "had an answer too large to send (each logged in one line)", value=s.get("http", {}).get("internal_errors", 0))
    actions = CounterMetricFamily(PREFIX + "http_actions", "management actions asked over HTTP (docs/admin.md), "
                                  "by action and the HTTP status answered (each one a line of the audit log)",
                                  labels=["action", "status"])
    for entry in s.get("http", {}).get("actions", ()):
        actions.add_metric([entry["action"], str(entry["status"])], entry["count"])
    yield actions
    yield CounterMetricFamily(PREFIX + "audit_log_errors", "audit log lines that could not be written (audit_log)",
                              value=s.get("http", {}).get("audit_errors", 0))

    cluster = s.get("cluster")
    if cluster:  # cluster mode (docs/cluster.md)
        info = InfoMetricFamily(PREFIX + "cluster_node", "this node of the cluster and the NATS server it uses")
        info.add_metric([], {"node": cluster["node"], "server": cluster["server"]})
        yield info
        yield GaugeMetricFamily(PREFIX + "cluster_connected", "1 while the node reaches NATS",
                                value=cluster["connected"])
        yield GaugeMetricFamily(PREFIX + "cluster_rtt_seconds", "round trip to the NATS server, last measured",
                                value=cluster["rtt_ms"] / 1000)
        yield GaugeMetricFamily(PREFIX + "cluster_peers", "other live nodes this node has read in the interest bucket",
                                value=cluster["peers"])
        yield GaugeMetricFamily(PREFIX + "cluster_busy", "1 while this node says it is behind with its deliveries",
                                value=cluster["busy"])
        yield GaugeMetricFamily(PREFIX + "cluster_busy_nodes", "other nodes heard saying they are behind",
                                value=cluster["busy_nodes"])
        for key, name, text in CLUSTER_TOTALS:
            yield CounterMetricFamily(PREFIX + name, text, value=cluster[key])
        depth = GaugeMetricFamily(PREFIX + "cluster_stream_messages", "messages in the cluster's JetStream stream",
                                  labels=["stream"])
        leaders = GaugeMetricFamily(PREFIX + "cluster_stream_leader", "1 for the NATS server leading the stream now",
                                    labels=["stream", "server"])
        for stream in cluster["streams"]:
            depth.add_metric([stream["name"]], stream["messages"])
            if stream.get("leader"):
                leaders.add_metric([stream["name"], stream["leader"]], 1)
        yield depth
        yield leaders


def deepest(queues: list) -> list:
    """The queues by depth, deepest first (ties by name): the ones given series of their own."""
    return sorted(queues, key=lambda q: (-q["depth"], q["destination"]))


SERIES_BYTES = 5 * 80  # a queue's five series take about this plus five times its escaped name
BASE_BYTES = 16 * 1024  # everything but the per-queue series, with room to spare


def queues_within(queues: list, budget: int) -> int:
    """How many of the deepest queues' series fit in ``budget`` bytes, by the length of their names
    (a snapshot's: with ``VHOST:``, as long as the vhost label and the destination)."""
    left = budget - BASE_BYTES
    for n, q in enumerate(deepest(queues)):
        name = q["destination"]
        left -= SERIES_BYTES + 5 * (len(name.encode()) + name.count('"') + name.count("\\") + name.count("\n"))
        if left < 0:
            return n
    return len(queues)


class _Snapshot:
    """A collector over one snapshot: a registry is built per scrape, so nothing is shared."""

    def __init__(self, snapshot: dict, max_queues: int | None, vhost: str | None):
        self.snapshot = snapshot
        self.max_queues = max_queues
        self.vhost = vhost

    def collect(self):
        return families(self.snapshot, self.max_queues, self.vhost)


def exposition(snapshot: dict, accept: str = "", max_queues: int | None = None,
               budget: int | None = None, vhost: str | None = None) -> tuple[bytes, str]:
    """(body, content type) for a scrape; ``accept`` picks the text format or OpenMetrics. Per-queue
    series for at most ``max_queues`` queues (of ``vhost`` only, when named), and fewer (halving)
    while the body is over ``budget`` bytes: long queue names cost bytes, and a body must fit what
    carries it to the writer."""
    content_type = negotiate(accept)
    encode = generate_openmetrics if content_type == OPENMETRICS else generate_latest
    if budget is not None:
        # (the per-vhost totals take a few series per vhost: counted in like a queue's)
        fit = queues_within(snapshot["queues"], budget - 400 * len(snapshot.get("vhosts", ())))
        max_queues = fit if max_queues is None else min(max_queues, fit)
    while True:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(snapshot, max_queues, vhost))
        body = encode(registry)
        if budget is None or len(body) <= budget or not max_queues:
            return body, content_type
        max_queues //= 2  # (the estimate was short: names full of characters to escape)
