"""The one table of broker settings.

It feeds the command line (stompica's ``key=value`` form and ``--key value`` flags), the config
file (``-c broker.conf``), the ``STOMPBROKER_*`` environment variables and the settings section
of the README (``python -m stompbroker.settings`` prints it as Markdown).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Setting:
    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    secret: bool = False  # never logged or shown: describe() prints *** for it
    # A default that follows other settings: the default is the word "auto" (None once parsed),
    # and this gives the value from the others' (the help says how).
    derive: Callable[[dict], Any] | None = None


def auth_on(values: dict) -> bool:
    """Logins are checked: a passwd file, or xtomp's token secret."""
    return values["auth"] != "off" or bool(values["secret"])


def _int(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false (also yes/no, on/off, 1/0), got {text!r}")


def _auto_bool(text: str) -> bool | None:
    """A flag whose default follows other settings: "auto" (None until make_config derives it)."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        return _bool(text)
    except ValueError:
        raise ValueError(f"expected auto, true or false (also yes/no, on/off, 1/0), got {text!r}") from None


def _list(text: str) -> list[str]:
    return [part.strip() for part in str(text).split(",") if part.strip()]


KB = 1024
MB = 1024 * 1024
MAX_CLUSTER_STREAMS = 64   # shards of each kind: each is a JetStream stream (a Raft group) per kind
MAX_CLUSTER_PACK = 1024    # messages in one JetStream message (cluster_pack_max)

SETTINGS: tuple[Setting, ...] = (
    Setting("processors", _int, 0, "processor count; writers = max(processors-2, 1); 0 = number of CPUs"),
    Setting("host", str, "127.0.0.1", "address to bind (0.0.0.0 for every interface)"),
    Setting("port", _int, 61613, "TCP port for STOMP and WebSocket (0 = pick a free port and log it)"),
    Setting("max_input_queue_size", _int, 1_000_000, "frames in the reader-to-dispatcher queue before the reader stops reading (TCP backpressure)"),
    Setting("input_queue_bytes", _int, 32 * MB, "bytes of shared memory for the input queue (raised to at least four max-size frames plus 1 MB)"),
    Setting("output_queue_bytes", _int, 32 * MB, "bytes of shared memory for each dispatcher-to-writer queue"),
    Setting("max_stale_queue_size", _int, 1_000_000, "messages kept in the TTL stale queue; when full the oldest is dropped"),
    Setting("TTL", _int, 0, "milliseconds an unrouted message waits in the stale queue for a late subscriber (0 = off)"),
    Setting("ws_paths", _list, "", "comma list of the only paths a WebSocket upgrade may use (empty = any path)"),
    Setting("ws_origins", _list, "", "comma list of allowed Origin headers for WebSocket upgrades, xtomp's websockets_origin (empty = any when logins are not checked; when they are (auth=passwd, or a secret), the broker's own pages and clients that send no Origin)"),
    Setting("http_hosts", _list, "", "comma list of the host names HTTP requests and WebSocket upgrades may name in Host (.example.com: it and every name under it; * = any), against DNS rebinding; others get 421. IP addresses always pass (empty = localhost and host)"),
    Setting("hsts_max_age", _int, 31_536_000, "seconds browsers keep to https for the broker's host name: Strict-Transport-Security on every HTTP answer on ssl_port (0 = no header); it holds for every port of that name"),
    Setting("proxy_protocol", _bool, False, "connections from proxy_trusted addresses must start with a PROXY protocol header (v1 or v2: haproxy's send-proxy, send-proxy-v2), whose client address the broker then uses (login throttling, logs, /api/connections, DIAG connections); a PROXY header from any other peer closes its connection"),
    Setting("proxy_trusted", _list, "", "comma list of the proxies' addresses or networks (10.0.0.5, 10.1.0.0/16, ::1) whose PROXY headers are believed; needed with proxy_protocol=true"),
    Setting("ssl_port", _int, 0, "TCP port for STOMP and WebSocket over TLS (wss); 0 = off"),
    Setting("ssl_cert", str, "", "PEM certificate chain for ssl_port"),
    Setting("ssl_key", str, "", "PEM private key for ssl_port"),
    Setting("ssl_ca", str, "", "CA bundle to verify client certificates (default: the system's)"),
    Setting("ssl_verify_client", str, "none", "client certificates: none, optional or required"),
    Setting("max_queue_messages", _int, 100_000, "messages a /queue/ destination holds; a SEND over it gets an ERROR"),
    Setting("max_selector_length", _int, 4096, "longest SUBSCRIBE selector, in characters (evaluation costs at most about header length x selector length / 64 word operations)"),
    Setting("queue_scan_budget", _int, 100, "messages a queue examines per event without delivering them (no selector takes them, or only full consumers do); the rest wait for the next event or tick"),
    Setting("max_browse_messages", _int, 10_000, "waiting messages one queue browse (SUBSCRIBE browser:true) looks at, first to be delivered first; those its selector accepts are sent, then the end marker"),
    Setting("max_message_groups", _int, 1024, "message groups (JMSXGroupID) one queue remembers the consumer of; past it the oldest assignment is forgotten (its next message picks a consumer again)"),
    Setting("max_scheduled_messages", _int, 100_000, "scheduled messages (AMQ_SCHEDULED_*, x-delay) the broker holds; a SEND over it gets an ERROR"),
    Setting("max_scheduled_per_destination", _int, 10_000, "scheduled messages one destination may have waiting; a SEND over it gets an ERROR"),
    Setting("max_scheduled_repeat", _int, 1000, "largest AMQ_SCHEDULED_REPEAT (ActiveMQ's maxSchedulerRepeatAllowed); a SEND over it gets an ERROR"),
    Setting("scheduled_batch", _int, 1000, "scheduled messages delivered at most per dispatcher round when many are due at once; the rest follow in the next rounds"),
    Setting("client_prefetch", _int, 100, "unacknowledged messages per client-ack subscription unless it sets prefetch-count (0 = no limit)"),
    Setting("max_redeliveries", _int, 5, "NACKs of one message before it goes to the dead-letter queue"),
    Setting("dead_letter_queue", str, "/queue/DLQ", "where messages NACKed too often go"),
    Setting("max_transaction_frames", _int, 10_000, "frames one transaction may hold before COMMIT"),
    Setting("max_transactions", _int, 100, "transactions one connection may have open; a BEGIN over it gets an ERROR"),
    Setting("max_held_bytes", _int, 64 * MB, "bytes the dispatcher holds for one connection: the frames of its open transactions and the topic messages delivered to it and not yet acknowledged (client acks; each counted as its size plus 256 bytes); a frame or a delivery that would pass it gets the connection an ERROR"),
    Setting("max_held_bytes_total", _int, 256 * MB, "bytes of frames the dispatcher holds in open transactions and for logins not yet checked, all connections together; the connection whose frame would pass it gets a 'broker busy' ERROR"),
    Setting("max_durables", _int, 10_000, "durable topic subscriptions the broker keeps (they outlive their connections); a SUBSCRIBE making one more gets an ERROR"),
    Setting("store", str, "memory", "queue store: memory, or sqlite (durable: messages survive restarts and crashes)"),
    Setting("store_path", str, "stompbroker.sqlite", "the sqlite store's file (store=sqlite)"),
    Setting("checkpoint", _float, 0.0, "seconds between store commits; 0 = commit before each receipt (safe); N = faster, may lose the last N seconds"),
    Setting("store_error_timeout_ms", _int, 5_000, "while the store cannot write (disk full), a persistent SEND waits this long for its receipt before its sender gets an ERROR; past it new persistent SENDs are refused at once"),
    Setting("replay_retention", _float, 3600.0, "seconds stored messages (queue messages, persistent:true topic messages and those matching a durable subscription) stay in the replay log for replay-from and replay-from-seq (store=sqlite; 0 = no replay log); the newest is always kept"),
    Setting("dedup_window", _float, 120.0, "seconds a SEND's dedup-id is remembered on a single node: a repeat to the same queue, or a repeat persistent:true topic message, within it is answered and dropped (with store=sqlite also across restarts; 0 = off; cluster mode: JetStream's own 120 s)"),
    Setting("max_dedup_ids", _int, 100_000, "dedup-ids remembered at most (about 150 bytes each, whatever their length); past it the oldest are forgotten before dedup_window ends"),
    Setting("max_frame_size", _int, 4 * MB, "largest STOMP frame (headers and body) accepted, in bytes"),
    Setting("max_first_frame", _int, 64 * KB, "largest frame before a connection's first complete frame (its CONNECT), in bytes: what a client that has not logged in may make the broker hold"),
    Setting("max_partial_bytes", _int, 128 * MB, "bytes of unfinished frames the reader holds for all connections together; the connection that would go past it gets a 'broker busy' ERROR and is closed"),
    Setting("close_read_limit", _int, 16 * MB, "bytes the reader still reads (and drops) from a connection once its ERROR or close is on its way, so that a client in the middle of writing a large frame finishes and reads the answer; past it the connection is no longer read (its TCP window closes) and is reset when it closes"),
    Setting("ws_max_fragments", _int, 1024, "most WebSocket frames one message may come in (its first included); a message in more gets close 1008"),
    Setting("max_headers", _int, 256, "most header lines in one frame"),
    Setting("max_header_line", _int, 64 * KB, "longest header line, in bytes"),
    Setting("max_http_head", _int, 8 * KB, "largest HTTP request head (request line and headers, of a request or a WebSocket upgrade), in bytes, 1 KB to 1 MB; a longer one gets 431. The reader holds at most about this plus one read (64 KB) per connection while a head comes"),
    Setting("max_destination_length", _int, 1 * KB, "longest destination name (SEND and SUBSCRIBE `destination`, SEND `reply-to`), in bytes as sent; checked at the reader (stored messages of longer names are quarantined at start)"),
    Setting("max_id_length", _int, 1 * KB, "longest subscription id (`id`, `subscription`), transaction name, durable subscription name (`activemq.subscriptionName`) and CONNECT `client-id`, in bytes as sent; checked at the reader"),
    Setting("max_connections", _int, 10_000, "most open client connections; more are refused with an ERROR"),
    Setting("max_subscriptions", _int, 1_000, "most subscriptions per connection"),
    Setting("max_answer_bytes", _int, 1 * MB, "largest answer the broker builds: a DIAG answer, a /queue/monitor status, an /api page, a /metrics body (at most a quarter of output_queue_bytes); longer lists are cut and continue (see README, Diagnostics and Console)"),
    Setting("api_max_page_size", _int, 500, "most items an /api/queues or /api/connections page may ask for (?page_size=, default 100 or this if lower), 1 to 100,000; every page is also cut at max_answer_bytes"),
    Setting("metrics_max_queues", _int, 1_000, "most queues with series of their own in /metrics, the deepest (0 = none); stompbroker_queues, stompbroker_queued_messages and stompbroker_unacked_messages count all of them"),
    Setting("max_pending_bytes", _int, 16 * MB, "unsent output per connection; past it, a connection that took nothing for 1 s (or has 4x this unsent) is closed as a slow consumer"),
    Setting("write_buffer_size", _int, 10_240, "bytes a writer batches per connection into one send (stompica's 10 KB)"),
    Setting("heartbeat_min_ms", _int, 100, "the broker never sends or expects heart-beats more often than this"),
    Setting("heartbeat_max_ms", _int, 120_000, "a client that can heart-beat only less often than this is refused"),
    Setting("heartbeat_grace_ms", _int, 1_000, "silence allowed past a client's heart-beat interval before it is disconnected"),
    Setting("connect_timeout_ms", _int, 10_000, "time a new connection has to send CONNECT before it is closed"),
    Setting("restart_budget", _int, 10, "deaths in a row of one process (each within 10 s of its restart) restarted at once (1 to 1,000); each further one waits, from 0.1 s doubling up to restart_delay_max_ms. The supervisor never gives up (see docs/reliability.md)"),
    Setting("restart_delay_max_ms", _int, 5_000, "longest wait before restarting a process that keeps dying (100 ms to 60 s); the other processes serve meanwhile"),
    Setting("shutdown_timeout_ms", _int, 5_000, "on SIGTERM, time writers have to flush before connections are cut"),
    Setting("auth", str, "off", "off: any login is accepted; passwd: logins are checked against passwd_file"),
    Setting("passwd_file", str, "stompbroker.passwd", "users, as login:secret[:permissions] lines (stompbroker-passwd writes them); re-read on SIGHUP"),
    Setting("acl_file", str, "", "optional per-user read/write/manage/admin rules (lines: login read|write|manage PATTERN,...; login admin)"),
    Setting("secret", str, "", "xtomp token logins: passcode = base64(sha1(login + secret)), login = '<user> <unix-seconds> <random>'; never logged (prefer STOMPBROKER_SECRET or a config file to the command line)", secret=True),
    Setting("secret_timeout", _float, 60.0, "seconds a token login stays valid"),
    Setting("token_mode", str, "sha1", "sha1 (xtomp's) or hmac (HMAC-SHA256: prefer it)"),
    Setting("auth_fail_delay_ms", _int, 250, "a refused login waits this long, doubling per failure from the same address (at most auth_fail_delay_max_ms)"),
    Setting("auth_fail_delay_max_ms", _int, 10_000, "longest back-off of a refused login, in milliseconds (0 to 1 hour): the doubling of auth_fail_delay_ms stops here, per (address, login) and per address"),
    Setting("auth_fail_window_ms", _int, 600_000, "a refused login counts towards its address's back-off (several logins failing from one address: password spraying) for this long, in milliseconds (0 to 1 day)"),
    Setting("auth_fail_records", _int, 100_000, "refused (address, login) pairs, and addresses backing off, the login queue remembers (1 to 10,000,000; 100,000 of them measured 66 MB at most); past it the least recent is forgotten"),
    Setting("diag_admin_only", _auto_bool, "auto", "only admin users may use DIAG frames, DIAG destinations and /queue/monitor; auto = true when logins are checked (auth=passwd or secret set), false when not", derive=auth_on),
    Setting("diag_before_connect", _bool, False, "answer DIAG frames before CONNECT, as stompica did (only with auth=off and no secret: before CONNECT nobody is logged in)"),
    Setting("diag_interval", _int, 1_000, "milliseconds per statistics interval (latency percentiles, dump lines)"),
    Setting("diag_dump", str, "", "append one JSON line of statistics per interval to this file (empty = off)"),
    Setting("diag_dump_max_bytes", _int, 64 * MB, "rotate the dump file past this size"),
    Setting("diag_dump_backups", _int, 5, "rotated dump files kept (path.1 ... path.N)"),
    Setting("node_id", str, "", "this broker's name in dump lines (broker.node), to analyse several brokers as a fleet (empty = none: the analysis names it after the dump's directory)"),
    Setting("cluster", _list, "", "cluster mode: comma list of NATS servers (nats://host:4222 or tls://host:4222) every node of the cluster connects to (empty = single node, no NATS); see docs/cluster.md"),
    Setting("cluster_name", str, "stompbroker", "prefix of every NATS subject, stream and key-value bucket of this cluster, so two clusters can share one NATS"),
    Setting("cluster_token", str, "", "NATS token for the cluster connection", secret=True),
    Setting("cluster_user", str, "", "NATS user for the cluster connection"),
    Setting("cluster_password", str, "", "NATS password for cluster_user", secret=True),
    Setting("cluster_tls_ca", str, "", "CA bundle to verify the NATS servers (tls:// URLs; default: the system's)"),
    Setting("cluster_tls_cert", str, "", "PEM client certificate for the NATS connection (with cluster_tls_key)"),
    Setting("cluster_tls_key", str, "", "PEM private key for cluster_tls_cert"),
    Setting("cluster_replicas", _int, 0, "copies JetStream keeps of queue and durable streams (0 = 3 when the NATS cluster has at least 3 servers, else 1)"),
    Setting("cluster_streams", _int, 6, "shards of queues and of durable/replay topic messages: each destination lives in one of this many JetStream streams of each kind, by a hash of its name, and their leaders are spread over the NATS servers (1 = one stream of each kind; give every node the same; see docs/cluster.md for changing it)"),
    Setting("cluster_placement_tags", _list, "", "comma list of NATS server tags (each server's server_tags) to place the shards by: shard i of each kind goes to the servers carrying tag number i mod the count. With one copy (cluster_replicas=1) JetStream places a stream by free storage and never moves it, so shards can crowd on a few servers; one tag per server spreads them evenly. A tag must be carried by as many servers as there are copies. Changing the tags moves the existing streams (JetStream copies them over, nothing is lost). Empty = JetStream places them; give every node the same; see docs/cluster.md"),
    Setting("cluster_pack_max", _int, 16, "under load, up to this many queue messages of one destination go to JetStream as one message (those one round of the dispatcher has for it; a quiet node sends each at once): a fraction of JetStream's work per message. An auto-ack consumer pulls up to 4 packs ahead (at least 64 messages). A queue then holds at most max_queue_messages // cluster_pack_max JetStream messages, so between that many and max_queue_messages messages before a SEND gets 'queue full' (fewer per pack when max_queue_messages is under 1000 x this; 1 = one message each, the limit exact; give every node the same; see docs/cluster.md)"),
    Setting("cluster_topic_pack_max", _int, 64, "under load, up to this many topic messages that one round of the dispatcher publishes in a row to one destination go to NATS as one message (a quiet node sends each at the end of its round): a fraction of NATS's and the bridges' work per message, order kept; 1 = each message alone (every node reads both)"),
    Setting("cluster_ack_wait_ms", _int, 30_000, "a queue message delivered by a node and not acknowledged within this is redelivered elsewhere (a dead node's unacked messages come back after it)"),
    Setting("cluster_busy_bytes", _int, MB, "a node whose deliveries fall this far behind (bytes waiting in a writer's queue, or in the bridge's queue to the dispatcher) while other nodes' messages reach it tells the other nodes it is busy, until under a quarter of it: they hold the receipts (and other replies) of the sessions publishing topic messages it subscribes, so producers that wait for receipts slow down instead of starving its own (0 = never say so)"),
    Setting("cluster_busy_hold_ms", _int, 1000, "how long at most a session's replies are held while a node it publishes to is busy (cluster_busy_bytes); they go as soon as that node catches up (0 = never hold)"),
    Setting("cluster_timeout_ms", _int, 10_000, "while NATS is unreachable, a SEND that needs it waits this long before its sender gets an ERROR 'cluster unavailable'"),
    Setting("console", _bool, True, "serve the web console at / on the broker's port (admin users only when auth is on)"),
    Setting("http_api", _bool, True, "serve /api/overview, /api/queues, /api/connections, /api/scheduled (JSON) and /metrics (Prometheus) on the broker's port (admin users only when auth is on)"),
    Setting("vhosts", _list, ["/"], "virtual hosts: a CONNECT's host header picks one (RabbitMQ's rule), each with its own destinations, durable subscriptions and dead-letter queue; / is always one of them, and with / alone the host header is not looked at (see docs/admin.md, Virtual hosts)"),
    Setting("vhost_fallback", _bool, False, "with several vhosts: a CONNECT whose host names none of them (many clients send the server's host name) joins / instead of getting an ERROR"),
    Setting("http_manage", _bool, True, "with logins checked: serve the management actions of docs/admin.md (purge, move, peek, publish, close a connection...) to admin users and to logins with a manage grant; without logins checked they are refused"),
    Setting("max_http_body", _int, 1 * MB, "largest body of an HTTP request (a management action's JSON; at most max_frame_size): a longer one gets 413"),
    Setting("manage_rate_limit", _float, 10.0, "management actions per second per login (bursts of as many); more get 429 (0 = no limit)"),
    Setting("audit_log", str, "", "file of the management audit log: one JSON line per action (who, from where, what, the result), rotated at audit_log_max_bytes (empty = the lines go to the broker's log)"),
    Setting("audit_log_max_bytes", _int, 10 * MB, "size at which the audit log is rotated (audit_log.1 ... audit_log.N)"),
    Setting("audit_log_files", _int, 5, "rotated audit log files kept besides the current one"),
    Setting("console_token_ttl_ms", _int, 300_000, "with logins checked: how long a web console's STOMP passcode (single-use, for the address and user it was issued to) and the read-only session it opens last; the page renews both before then"),
    Setting("console_tokens_per_user", _int, 8, "with logins checked: unused console passcodes kept per user (1 to 1,000; a page holds one for a moment, before its STOMP login); minting one more forgets that user's oldest"),
    Setting("monitor_interval", _int, 5_000, "milliseconds between /queue/monitor status messages"),
    Setting("log_level", str, "INFO", "DEBUG, INFO, WARNING or ERROR"),
    Setting("log_format", str, "text", "text, or json: one JSON object per line (ts, level, process, pid, logger, message)"),
    Setting("ready_file", str, "", "once the broker serves, write one JSON line here (host, port, ssl_port, pid, version); removed at stop (empty = off)"),
)

# stompica spelled the TTL key in capitals; accept every spelling of every key.
BY_LOWER = {s.name.lower(): s for s in SETTINGS}


@dataclass(frozen=True)
class Config:
    values: dict

    def __post_init__(self) -> None:
        # Settings become plain instance attributes: the hot paths read a few per message, and a
        # lookup that falls through to __getattr__ costs fifty times an instance attribute.
        for name, value in self.values.items():
            if not hasattr(type(self), name):
                object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def auth_required(self) -> bool:
        """Logins are checked (auth=passwd, or a token secret)."""
        return auth_on(self.values)

    @property
    def writers(self) -> int:
        processors = self.values["processors"] or os.cpu_count() or 1
        return max(processors - 2, 1)

    @property
    def ring_bytes(self) -> tuple[int, int]:
        """(input ring, each output ring) in bytes: the settings, raised to hold a few maximum-size
        frames in flight."""
        margin = 4 * self.values["max_frame_size"] + MB
        return max(self.values["input_queue_bytes"], margin), max(self.values["output_queue_bytes"], margin)

    @property
    def http_body_bytes(self) -> int:
        """The largest HTTP request body read: max_http_body, at most max_frame_size (it crosses the
        input ring as one record, as a frame does)."""
        return min(self.values["max_http_body"], self.values["max_frame_size"])

    @property
    def answer_bytes(self) -> int:
        """The most an answer (DIAG, monitor status, /api page, /metrics) may hold: max_answer_bytes,
        at most a quarter of an output ring, so one answer with a maximum-size frame always fits it."""
        return min(self.values["max_answer_bytes"], self.ring_bytes[1] // 4)

    @property
    def settings_id(self) -> str:
        """Short stable hash of the effective settings, to tell runs apart in diagnostics dumps
        (secrets count only as set or not: a short hash of one could be brute-forced)."""
        shown = {s.name: bool(self.values[s.name]) if s.secret else self.values[s.name] for s in SETTINGS}
        text = ",".join(f"{k}={shown[k]}" for k in sorted(shown))
        return hashlib.sha1(text.encode()).hexdigest()[:8]

    def secrets(self) -> list[str]:
        """The values of secret settings that are set, for redaction wherever text is logged."""
        return [str(self.values[s.name]) for s in SETTINGS if s.secret and self.values[s.name]]

    def describe(self, every: bool = False) -> str:
        """The settings that differ from their defaults (every one with every=True), secrets as ***."""
        words = []
        for s in SETTINGS:
            value = self.values[s.name]
            if not every and value == _default(s, self.values):
                continue
            if isinstance(value, list):
                value = ",".join(value)
            words.append(f"{s.name}={'***' if s.secret and value else value}")
        return " ".join(words) or "all defaults"


def _default(s: Setting, values: dict | None = None) -> Any:
    """A setting's default; one that follows other settings needs their ``values``."""
    if s.derive is not None and values is not None:
        return s.derive(values)
    return s.type(s.default) if isinstance(s.default, str) else s.default


def make_config(**overrides: Any) -> Config:
    """Defaults plus overrides, validated; used by the CLI and by tests."""
    values = {s.name: _default(s) for s in SETTINGS}
    for key, value in overrides.items():
        setting = BY_LOWER.get(key.lower())
        if setting is None:
            raise ValueError(f"unknown setting {key!r}")
        values[setting.name] = convert(setting, value) if isinstance(value, str) else value
    for s in SETTINGS:  # "auto": from the settings it follows, once they are all known
        if s.derive is not None and values[s.name] is None:
            values[s.name] = s.derive(values)
    validate(values)
    return Config(values)


def convert(setting: Setting, text: str) -> Any:
    """A setting's value from text; ValueError names the setting and what it accepts."""
    try:
        return setting.type(text)
    except ValueError as exc:
        raise ValueError(f"{setting.name}: {exc}") from None


def validate(values: dict) -> None:
    for name in ("max_input_queue_size", "max_frame_size", "max_first_frame", "max_partial_bytes", "close_read_limit", "ws_max_fragments", "max_headers", "max_header_line",
                 "max_connections", "max_subscriptions", "max_pending_bytes", "write_buffer_size",
                 "input_queue_bytes", "output_queue_bytes", "heartbeat_min_ms", "heartbeat_max_ms",
                 "max_destination_length", "max_id_length", "max_answer_bytes",
                 "max_queue_messages", "queue_scan_budget", "max_browse_messages", "max_message_groups", "max_scheduled_messages",
                 "max_scheduled_per_destination", "scheduled_batch", "max_selector_length", "max_transaction_frames", "max_transactions",
                 "max_held_bytes", "max_held_bytes_total", "max_durables", "diag_interval", "monitor_interval",
                 "diag_dump_max_bytes", "max_http_body", "audit_log_max_bytes"):
        if values[name] <= 0:
            raise ValueError(f"{name} must be positive, got {values[name]}")
    for name in ("processors", "port", "TTL", "max_stale_queue_size", "heartbeat_grace_ms", "metrics_max_queues",
                 "max_scheduled_repeat",
                 "client_prefetch", "max_redeliveries", "diag_dump_backups",
                 "connect_timeout_ms", "shutdown_timeout_ms", "store_error_timeout_ms", "cluster_replicas",
                 "hsts_max_age", "manage_rate_limit", "audit_log_files"):
        if values[name] < 0:
            raise ValueError(f"{name} must not be negative, got {values[name]}")
    for name, low, high in (("max_http_head", KB, MB), ("api_max_page_size", 1, 100_000),
                            ("auth_fail_delay_ms", 0, 3_600_000), ("auth_fail_delay_max_ms", 0, 3_600_000),
                            ("auth_fail_window_ms", 0, 86_400_000), ("auth_fail_records", 1, 10_000_000),
                            ("console_tokens_per_user", 1, 1_000), ("restart_budget", 1, 1_000),
                            ("restart_delay_max_ms", 100, 60_000)):
        if not low <= values[name] <= high:
            raise ValueError(f"{name} must be {low} to {high}, got {values[name]}")
    for network in values["proxy_trusted"]:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(f"proxy_trusted: not an IP address or network: {network!r}") from None
    if values["proxy_protocol"] and not values["proxy_trusted"]:
        raise ValueError("proxy_protocol=true needs proxy_trusted: the addresses of the proxies in front of the "
                         "broker (a header from anyone else would let a client choose its own address)")
    if values["ssl_port"] and not (values["ssl_cert"] and values["ssl_key"]):
        raise ValueError("ssl_port needs ssl_cert and ssl_key")
    if values["ssl_verify_client"] not in ("none", "optional", "required"):
        raise ValueError("ssl_verify_client must be none, optional or required")
    if values["ssl_port"] > 65535:
        raise ValueError("ssl_port must be at most 65535")
    if values["auth"] not in ("off", "passwd"):
        raise ValueError(f"auth must be off or passwd, got {values['auth']!r}")
    if values["token_mode"] not in ("sha1", "hmac"):
        raise ValueError(f"token_mode must be sha1 or hmac, got {values['token_mode']!r}")
    if values["store"] not in ("memory", "sqlite"):
        raise ValueError(f"store must be memory or sqlite, got {values['store']!r}")
    if values["diag_before_connect"] and auth_on(values):
        raise ValueError("diag_before_connect=true needs auth=off and no secret: before CONNECT nobody has "
                         "logged in, and with logins checked only a session may ask DIAG")
    for vhost in values["vhosts"]:
        if len(vhost) > 100 or not vhost.isprintable() or any(c in vhost for c in " :;"):
            raise ValueError(f"vhosts: a name of at most 100 printable characters without spaces, ':' or ';', "
                             f"not {vhost[:40]!r}")
    if "/" not in values["vhosts"]:
        values["vhosts"] = ["/", *values["vhosts"]]
    if values["console_token_ttl_ms"] <= 0:
        raise ValueError(f"console_token_ttl_ms must be positive, got {values['console_token_ttl_ms']}")
    if values["checkpoint"] < 0 or values["replay_retention"] < 0 or values["dedup_window"] < 0:
        raise ValueError("checkpoint, replay_retention and dedup_window must not be negative")
    if not values["dead_letter_queue"].startswith("/queue/"):
        raise ValueError("dead_letter_queue must be a /queue/ destination")
    if values["port"] > 65535:
        raise ValueError(f"port must be at most 65535, got {values['port']}")
    if values["heartbeat_min_ms"] > values["heartbeat_max_ms"]:
        raise ValueError("heartbeat_min_ms must not exceed heartbeat_max_ms")
    for url in values["cluster"]:
        if not url.startswith(("nats://", "tls://")):
            raise ValueError(f"cluster: expected nats://host:port or tls://host:port URLs, got {url!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", values["cluster_name"]):
        raise ValueError(f"cluster_name may hold only letters, digits, _ and - (it names NATS subjects and "
                         f"streams), got {values['cluster_name']!r}")
    for name in ("cluster_ack_wait_ms", "cluster_timeout_ms"):
        if values[name] <= 0:
            raise ValueError(f"{name} must be positive, got {values[name]}")
    if not 1 <= values["cluster_streams"] <= MAX_CLUSTER_STREAMS:
        raise ValueError(f"cluster_streams must be 1 to {MAX_CLUSTER_STREAMS}, got {values['cluster_streams']}")
    if len(values["cluster_placement_tags"]) > MAX_CLUSTER_STREAMS:
        raise ValueError(f"cluster_placement_tags: at most {MAX_CLUSTER_STREAMS} tags (one per shard)")
    for tag in values["cluster_placement_tags"]:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", tag):
            raise ValueError(f"cluster_placement_tags: a tag is 1 to 64 letters, digits and _ . : -, got {tag!r}")
    if not 1 <= values["cluster_pack_max"] <= MAX_CLUSTER_PACK:
        raise ValueError(f"cluster_pack_max must be 1 to {MAX_CLUSTER_PACK}, got {values['cluster_pack_max']}")
    for name, most in (("cluster_busy_bytes", 1 << 30), ("cluster_busy_hold_ms", 60_000)):
        if not 0 <= values[name] <= most:
            raise ValueError(f"{name} must be 0 to {most}, got {values[name]}")
    if not 1 <= values["cluster_topic_pack_max"] <= MAX_CLUSTER_PACK:
        raise ValueError(f"cluster_topic_pack_max must be 1 to {MAX_CLUSTER_PACK}, "
                         f"got {values['cluster_topic_pack_max']}")
    if bool(values["cluster_tls_cert"]) != bool(values["cluster_tls_key"]):
        raise ValueError("cluster_tls_cert and cluster_tls_key go together")
    if values["cluster"] and not values["node_id"]:
        raise ValueError("cluster mode needs a node_id (unique per node: it names the node's interest and its "
                         "NATS connection)")
    if not re.fullmatch(r"[A-Za-z0-9_=-]*", values["node_id"]) and values["cluster"]:
        raise ValueError(f"node_id may hold only letters, digits, _, = and - in cluster mode, got "
                         f"{values['node_id']!r}")
    if values["log_format"] not in ("text", "json"):
        raise ValueError(f"log_format must be text or json, got {values['log_format']!r}")
    if values["log_level"].upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"log_level must be DEBUG, INFO, WARNING or ERROR, got {values['log_level']!r}")


def markdown_table() -> str:
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.name}` | `{s.default}` | {s.help} |")
    return "\n".join(rows)


README_START = "<!-- settings: generated by `python -m stompbroker.settings --readme` -->"
README_END = "<!-- /settings -->"


def update_readme(path: str) -> None:
    text = open(path).read()
    start = text.index(README_START) + len(README_START)
    end = text.index(README_END)
    with open(path, "w") as f:
        f.write(text[:start] + "\n" + markdown_table() + "\n" + text[end:])


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--readme"]:
        update_readme("README.md")
    else:
        print(markdown_table())
