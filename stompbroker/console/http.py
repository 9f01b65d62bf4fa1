"""The broker's own HTTP site on its STOMP port: the web console, a JSON API and Prometheus metrics.

Sans-IO: the reader hands a plain (non-upgrade) HTTP request to the dispatcher as one record
(``encode_request``), the dispatcher asks ``Site.route`` what it is, checks the login when the route
needs one (off its thread, like STOMP logins) and writes ``Site.respond``'s bytes back through the
connection's writer, which then closes the connection. Every answer is a whole HTTP/1.1 response with
``Connection: close``: one request per connection, so a slow or hostile client holds a connection
(bounded by ``max_connections`` and ``connect_timeout_ms``) and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import html
import logging
import math
import os
import time
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from .. import __version__
from ..broker import scheduling
from ..diag import answers
from ..protocol.websocket import http_response
from .metrics import exposition

log = logging.getLogger("stompbroker.http")

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")

# path -> (file under static/, content type); served to anyone: library code and the page's script
# hold no data (the page itself and the figures are behind the login).
STATIC = {
    "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console.css", "text/css; charset=utf-8"),
    "/console/vendor/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/console/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "/console/vendor/stomp.umd.min.js": ("vendor/stomp.umd.min.js", "text/javascript; charset=utf-8"),
    "/console/vendor/uPlot.LICENSE.txt": ("vendor/uPlot.LICENSE.txt", "text/plain; charset=utf-8"),
    "/console/vendor/stompjs.LICENSE.txt": ("vendor/stompjs.LICENSE.txt", "text/plain; charset=utf-8"),
}
PAGES = ("/", "/index.html")
API = ("/api/overview", "/api/queues", "/api/connections", "/api/scheduled")
METRICS = "/metrics"
TOKEN = "/console/token"  # POST (with logins checked): a STOMP passcode for the page (security/console_tokens.py)
ALLOWED_METHODS = ("GET", "HEAD")
SCHEDULED = "/api/scheduled"  # GET lists; DELETE /api/scheduled/<id>, or ?destination=, cancels
REALM = "stompbroker"
SNAPSHOT_TTL = 0.25   # seconds a statistics snapshot serves further requests (bounds the cost of a scrape flood)
PAGE_SIZE = 100       # items per /api page unless ?page_size= says (RabbitMQ's management API's default)
SUBSCRIPTIONS_SHARE = 16  # a connection lists its subscriptions in at most 1/16 of the answer budget

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
PAGE_HEADERS = {
    **SECURITY_HEADERS,
    # Only the broker's own scripts, and WebSocket back to the broker alone ('self' covers ws: and
    # wss: to the page's own host and port in CSP Level 3, which Chromium and Firefox implement).
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
}


# -- the request record (reader -> dispatcher) ----------------------------------------------------
def encode_request(request: dict) -> bytes:
    """What the dispatcher needs of a request head: method, target, Authorization, Accept.

    Header values never hold NUL (the parser refuses it), so NUL separates them.
    """
    h = request["headers"]
    return "\0".join((request["method"], request["path"], h.get("authorization", ""), h.get("accept", ""))).encode(
        "latin-1", "replace")


def decode_request(payload: bytes) -> tuple[str, str, str, str]:
    method, target, authorization, accept = payload.decode("latin-1").split("\0")
    return method, target, authorization, accept


def basic_credentials(authorization: str) -> tuple[str, str] | None:
    """(login, password) of an ``Authorization: Basic`` header, or None."""
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    login, colon, password = decoded.partition(":")
    if not colon or not login:
        return None
    return login, password


# -- responses -------------------------------------------------------------------------------------
def text_response(status: int, reason: str, text: str, headers: dict | None = None) -> bytes:
    return http_response(status, reason, (text + "\n").encode(),
                         {"Content-Type": "text/plain; charset=utf-8", **SECURITY_HEADERS, **(headers or {})})


def not_found() -> bytes:
    return text_response(404, "Not Found", "not found")


def method_not_allowed() -> bytes:
    return text_response(405, "Method Not Allowed", "only GET and HEAD are served here",
                         {"Allow": ", ".join(ALLOWED_METHODS)})


def unauthorized(reason: str = "log in as an admin user") -> bytes:
    return text_response(401, "Unauthorized", reason,
                         {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})


def forbidden() -> bytes:
    return text_response(403, "Forbidden", "the console, API and metrics are for admin users")


def bad_request(reason: str) -> bytes:
    return text_response(400, "Bad Request", reason)


def internal_error() -> bytes:
    return text_response(500, "Internal Server Error", "internal error (see the broker's log)")


def failed(logger: logging.Logger, method: str, target: str, exc: Exception) -> bytes:
    """A 500 for a request the broker failed to answer (the caller counts it), and one log line:
    where it failed, not a traceback."""
    where = exc.__traceback__
    while where is not None and where.tb_next is not None:
        where = where.tb_next
    place = f" at {os.path.basename(where.tb_frame.f_code.co_filename)}:{where.tb_lineno}" if where else ""
    logger.error("internal error answering %s %s: %s: %s%s", method[:16], target[:200], type(exc).__name__,
                 str(exc)[:200], place)
    return internal_error()


class BadRequest(Exception):
    """A request the site cannot serve as asked: 400 with the reason."""


def paging(query: dict, max_page_size: int) -> tuple[int, int]:
    """(page, page_size) from ``?page=&page_size=`` (1 and PAGE_SIZE, at most ``max_page_size``,
    when absent)."""
    values = []
    for name, default, most in (("page", 1, 10 ** 9), ("page_size", min(PAGE_SIZE, max_page_size), max_page_size)):
        text = query.get(name, [str(default)])[0]
        if not (text.isascii() and text.isdigit()) or len(text) > 10 or not 1 <= int(text) <= most:
            raise BadRequest(f"{name} must be a whole number from 1 to {most}, not {text[:40]!r}")
        values.append(int(text))
    return values[0], values[1]


def page_of(items: list, page: int, page_size: int, budget: int, make=None) -> bytes:
    """One page of a list as JSON, in the RabbitMQ management API's envelope (``items``, ``page``,
    ``page_size``, ``page_count``, ``item_count``, ``total_count``, ``filtered_count``), cut to
    ``budget`` bytes (whole items; ``truncated`` says so: ask for smaller pages). ``make`` turns
    the page's items into what is shown (made only for the page, not for the whole list)."""
    total = len(items)
    chunk = items[(page - 1) * page_size:page * page_size]
    if make is not None:
        chunk = [make(item) for item in chunk]
    text, end = answers.json_items(chunk, 0, budget - 300)  # (300: the envelope)
    envelope = {"page": page, "page_size": page_size, "page_count": -(-total // page_size), "item_count": end,
                "total_count": total, "filtered_count": total, "truncated": end < len(chunk)}
    return b'{"items":' + text + b"," + orjson.dumps(envelope)[1:]


OVERVIEW = ("broker", "session", "totals", "stale", "ws_buffer", "writers", "process", "latency")


def overview(snapshot: dict, budget: int) -> bytes:
    """/api/overview as JSON of at most ``budget`` bytes. Its lists grow with the settings (writers
    and processes with ``processors``, a cluster's streams with ``cluster_streams``): when the whole
    would not fit, each list keeps the whole items that fit in an equal share of what the rest
    leaves, and ``truncated`` names each list cut with its full length."""
    value = {key: snapshot[key] for key in OVERVIEW}
    if snapshot.get("cluster"):  # cluster mode: the node, its NATS server, the streams and their leaders
        value["cluster"] = dict(snapshot["cluster"])
    body = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    if len(body) <= budget:
        return body
    holders = [(value, "writers"), (value, "process")]
    if isinstance(value.get("cluster", {}).get("streams"), list):
        holders.append((value["cluster"], "streams"))
    lists = {name: holder[name] for holder, name in holders}
    for holder, name in holders:
        holder[name] = []
    value["truncated"] = {name: 10 ** 12 for name in lists}  # (the widest counts, for the share)
    share = (budget - len(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS))) // len(holders) - 2
    value["truncated"] = {}
    for holder, name in holders:
        items = lists[name]
        text, end = answers.json_items(items, 0, share) if share > 2 else (b"[]", 0)
        if end and len(text) > share:  # (json_items keeps one item whatever its size)
            text, end = b"[]", 0
        holder[name] = orjson.Fragment(text)
        if end < len(items):
            value["truncated"][name] = len(items)
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def too_many_requests(retry_after: float) -> bytes:
    """The login's back-off (after refusals from its address) outlasts the time a request may wait."""
    return text_response(429, "Too Many Requests", "logins from this address back off after refusals; "
                         "try again later", {"Retry-After": str(max(1, math.ceil(retry_after)))})


def unavailable() -> bytes:
    """The login could not be checked in time: too many are waiting."""
    return text_response(503, "Service Unavailable", "too many logins are waiting to be checked; try again later",
                         {"Retry-After": "1"})


def token_answer(login: str, passcode: str, expires_in: float) -> bytes:
    """The page's STOMP login: user, single-use passcode and the seconds it (and its session) lasts."""
    return json_response({"login": login, "passcode": passcode, "expires_in": round(expires_in)})


def _head_only(response: bytes) -> bytes:
    """HEAD: the same head (Content-Length included), no body."""
    end = response.find(b"\r\n\r\n")
    return response[:end + 4]


class Site:
    """Routes and pages; ``stats`` is the dispatcher's ``diag.stats.Statistics``."""

    def __init__(self, config, stats, clock=time.monotonic):
        self.config = config
        self.stats = stats
        self.clock = clock
        self._files: dict[str, bytes] = {}
        self._snapshot: dict | None = None
        self._snapshot_at = 0.0
        self.errors = 0       # HTTP answers 5xx but 503: failed, quarantined, or too large to send
        self.unavailable = 0  # HTTP answers 503: a login not checked in time

    # -- routing ---------------------------------------------------------------------------------
    def route(self, method: str, target: str) -> tuple[str | None, bytes | None]:
        """(route, None) for a request to serve, or (None, response) for one answered at once.

        ``route`` is ``"page"``, ``"api"``, ``"metrics"``, ``"token"`` or ``"static"``; only
        ``"static"`` needs no login.
        """
        path = urlsplit(target).path
        if path == TOKEN and self.config.console and self.config.auth_required:
            if method != "POST":  # minted on purpose only: never by a page load, a HEAD or a prefetch
                return None, text_response(405, "Method Not Allowed", "a console passcode is asked for by POST",
                                           {"Allow": "POST"})
            return "token", None
        if path in PAGES and self.config.console:
            kind = "page"
        elif path in STATIC and self.config.console:
            kind = "static"
        elif (path in API or path == METRICS or path.startswith(SCHEDULED + "/")) and self.config.http_api:
            kind = "metrics" if path == METRICS else "api"
        else:
            return None, not_found()
        if method == "DELETE" and path.startswith(SCHEDULED):
            return kind, None  # (no form or cross-site page can send a DELETE without the broker's CORS)
        if method not in ALLOWED_METHODS:
            return None, method_not_allowed()
        return kind, None

    def respond(self, method: str, target: str, accept: str = "") -> bytes:
        """The response to a routed request (not ``"token"``: the dispatcher mints those)."""
        try:
            response = self._cancel(target) if method == "DELETE" else self._respond(target, accept)
        except BadRequest as exc:
            response = bad_request(str(exc))
        except Exception as exc:  # a bug costs this request a 500, never the broker
            response = self.failed(method, target, exc)
        return _head_only(response) if method == "HEAD" else response

    def answered(self, status: int) -> None:
        """Count an HTTP answer's status in /metrics when it is a 5xx (the dispatcher passes every
        HTTP answer it sends here: stompbroker_http_internal_errors_total, _unavailable_total)."""
        if status == 503:
            self.unavailable += 1
        elif 500 <= status < 600:
            self.errors += 1

    def failed(self, method: str, target: str, exc: Exception) -> bytes:
        """A 500 for a request the broker failed to answer: one log line (where it failed, not a
        traceback); counted when it is sent (answered)."""
        return failed(log, method, target, exc)

    def _respond(self, target: str, accept: str) -> bytes:
        parts = urlsplit(target)
        path = parts.path
        if path in STATIC:
            name, content_type = STATIC[path]
            return http_response(200, "OK", self._file(name),
                                 {"Content-Type": content_type, "Cache-Control": "max-age=3600", **SECURITY_HEADERS})
        if path in PAGES:
            page = self._file("index.html").decode()
            ws_path = (getattr(self.config, "ws_paths", None) or ["/"])[0]  # an allowed WebSocket path
            # With logins checked the page asks for a STOMP passcode (POST /console/token) before each login.
            auth = "token" if self.config.auth_required else ""
            for name, value in (("auth", auth), ("ws_path", ws_path)):
                page = page.replace("{{%s}}" % name, html.escape(value))
            return http_response(200, "OK", page.encode(), {"Content-Type": "text/html; charset=utf-8", **PAGE_HEADERS})
        snapshot = self.snapshot()
        budget = self.config.answer_bytes
        if path == METRICS:
            body, content_type = exposition(snapshot, accept, self.config.metrics_max_queues, budget)
            return http_response(200, "OK", body, {"Content-Type": content_type, "Cache-Control": "no-store",
                                                   **SECURITY_HEADERS})
        if path == "/api/overview":
            return json_response(overview(snapshot, budget))
        page, page_size = paging(parse_qs(parts.query), self.config.api_max_page_size)
        if path == "/api/queues":
            queues = snapshot.get("sorted_queues")
            if queues is None:  # by name, so pages follow one another (sorted once per snapshot)
                queues = snapshot["sorted_queues"] = sorted(snapshot["queues"], key=lambda q: q["destination"])
            return json_response(page_of(queues, page, page_size, budget))
        if path.startswith(SCHEDULED + "/"):
            job = self.stats.broker.jobs.by_id.get(unquote(path[len(SCHEDULED) + 1:]))
            return json_response(job.info()) if job is not None else not_found()
        if path == SCHEDULED:  # by time; ?destination= for one destination's
            destination = parse_qs(parts.query).get("destination", [None])[0]
            jobs = self.stats.broker.jobs.of(destination)
            return json_response(page_of(jobs, page, page_size, budget, lambda job: job.info()))
        sessions = list(self.stats.broker.sessions.values())
        return json_response(page_of(sessions, page, page_size, budget, self.connection))

    def _cancel(self, target: str) -> bytes:
        """DELETE /api/scheduled/<job id>: that job; DELETE /api/scheduled?destination=D: every job
        of D (a DELETE of them all names no destination and is refused)."""
        parts = urlsplit(target)
        broker = self.stats.broker
        if parts.path.startswith(SCHEDULED + "/"):
            job = broker.jobs.by_id.get(unquote(parts.path[len(SCHEDULED) + 1:]))
            if job is None:
                return not_found()
            jobs = [job]
        elif parts.path == SCHEDULED:
            destination = parse_qs(parts.query).get("destination", [None])[0]
            if not destination:
                raise BadRequest("DELETE /api/scheduled cancels one job (/api/scheduled/<id>) or one "
                                 "destination's (?destination=)")
            jobs = broker.jobs.of(destination)
        else:
            return method_not_allowed()
        for job in jobs:
            scheduling.cancel(broker, job)
        return json_response({"cancelled": len(jobs)})

    def _file(self, name: str) -> bytes:
        data = self._files.get(name)
        if data is None:
            with open(os.path.join(STATIC_DIR, name), "rb") as f:
                data = self._files[name] = f.read()
        return data

    # -- figures -----------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Every DIAG figure at once; reused for SNAPSHOT_TTL so a flood of requests costs little."""
        now = self.clock()
        if self._snapshot is not None and now - self._snapshot_at < SNAPSHOT_TTL:
            return self._snapshot
        stats = self.stats
        writers = stats.writers()
        for w in writers:
            w["fill_sum"] = float(stats.resources.writer_stats[w["index"]].read()["fill"])
        processes = stats.processes()
        pid_of = {p["role"]: p["pid"] for p in processes}
        for w in writers:
            w["pid"] = pid_of.get(f"writer-{w['index']}", 0)
        start = stats.started
        self._snapshot = {
            "ts": round(time.time() * 1000, 1),
            "broker": {"version": __version__, "start": start, "pid": os.getppid(),
                       "uptime_seconds": round(time.time() - start / 1000, 3)},
            "session": stats.query("session"),
            "totals": stats.totals(writers),
            "stale": stats.query("stale"),
            "ws_buffer": stats.query("ws_buffer"),
            "writers": writers,
            "process": processes,
            "latency": stats.latency(),
            "queues": stats.query("queues"),
            "cluster": stats.query("cluster"),  # {} on a single node
            # failed here, or in the reader (before the request reached the dispatcher)
            "http": {"internal_errors": self.errors + int(stats.resources.reader_stats.read()["http_errors"]),
                     "unavailable": self.unavailable},
        }
        self._snapshot_at = now
        return self._snapshot

    def connection(self, session) -> dict:
        """One connection as /api/connections shows it; its subscriptions as many as fit in a share
        of the answer budget (``subscription_count`` counts them all)."""
        now = self.clock()
        subs = [{"id": sub.id, "destination": sub.destination, "ack": sub.ack, "unacked": len(sub.unacked)}
                for sub in session.subs.values()]
        listed, end = answers.json_items(subs, 0, self.config.answer_bytes // SUBSCRIPTIONS_SHARE)
        return {
            "id": session.conn,
            "session": session.id,
            "peer": session.peer,
            "writer": session.outbox.index,
            "websocket": session.websocket,
            "connected": session.connected,
            "version": session.version if session.connected else None,
            "login": session.login,
            "client_id": session.client_id,
            "age_seconds": round(now - session.opened, 3),
            "idle_seconds": round(now - session.last_seen, 3),
            "subscription_count": len(subs),
            "subscriptions": orjson.Fragment(listed),
            "subscriptions_truncated": end < len(subs),
        }


def json_response(value) -> bytes:
    """200 with ``value`` as JSON (bytes: already JSON)."""
    body = value if isinstance(value, bytes) else orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    return http_response(200, "OK", body,
                         {"Content-Type": "application/json", "Cache-Control": "no-store", **SECURITY_HEADERS})
