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
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from .. import __version__
from ..broker import vhosts
from ..diag import answers
from ..protocol.websocket import http_response
from . import manage
from .audit import AuditLog
from .metrics import exposition

log = logging.getLogger("stompbroker.http")

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")

# path -> (file under static/, content type); served to anyone: library code and the page's script
# hold no data (the page itself and the figures are behind the login).
STATIC = {
    "/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/console/console.css": ("console.css", "text/css; charset=utf-8"),
    "/console/manage.js": ("manage.js", "text/javascript; charset=utf-8"),
    "/console/vendor/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/console/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "/console/vendor/stomp.umd.min.js": ("vendor/stomp.umd.min.js", "text/javascript; charset=utf-8"),
    "/console/vendor/uPlot.LICENSE.txt": ("vendor/uPlot.LICENSE.txt", "text/plain; charset=utf-8"),
    "/console/vendor/stompjs.LICENSE.txt": ("vendor/stompjs.LICENSE.txt", "text/plain; charset=utf-8"),
}
PAGES = ("/", "/index.html")
API = ("/api/overview", "/api/queues", "/api/connections", "/api/subscriptions", "/api/vhosts", "/api/scheduled")
QUEUE_SORTS = ("name", "depth", "enqueued", "dequeued", "unacked", "consumers")  # ?sort= of /api/queues
METRICS = "/metrics"
TOKEN = "/console/token"  # POST (with logins checked): a STOMP passcode for the page (security/console_tokens.py)
ALLOWED_METHODS = ("GET", "HEAD")
SCHEDULED = "/api/scheduled"  # GET lists, GET /api/scheduled/<id> shows one; cancelling is an action (manage.py)
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
class Request(NamedTuple):
    """What the dispatcher needs of a request: its head's method, target and a few headers (empty
    when absent), and its body (a management action's JSON)."""

    method: str
    target: str
    authorization: str = ""
    accept: str = ""
    origin: str = ""
    host: str = ""
    content_type: str = ""
    fetch_site: str = ""   # Sec-Fetch-Site: browsers say where the request comes from
    body: bytes = b""


REQUEST_HEADERS = ("authorization", "accept", "origin", "host", "content-type", "sec-fetch-site")


def encode_request(request: dict, body: bytes = b"") -> bytes:
    """A parsed request head (protocol/handshake.py) and its body as one record.

    Header values never hold NUL (the parser refuses it), so NUL separates them; the body comes
    last, whatever it holds."""
    h = request["headers"]
    fields = (request["method"], request["path"], *(h.get(name, "") for name in REQUEST_HEADERS))
    return "\0".join(fields).encode("latin-1", "replace") + b"\0" + body


def decode_request(payload: bytes) -> Request:
    parts = payload.split(b"\0", len(REQUEST_HEADERS) + 2)
    return Request(*(p.decode("latin-1") for p in parts[:-1]), parts[-1])


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
def one_job(path: str) -> bool:
    """/api/scheduled/<id> (one segment: ids hold no slash)."""
    return path.startswith(SCHEDULED + "/") and "/" not in path[len(SCHEDULED) + 1:]


def job_info(job) -> dict:
    """A scheduled message as the API shows it: its destination as its virtual host's clients name
    it, and that virtual host."""
    vhost, destination = vhosts.split(job.destination)
    return {**job.info(), "destination": destination, "vhost": vhost}


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


def page_of(items: list, page: int, page_size: int, budget: int, make=None, total: int | None = None) -> bytes:
    """One page of a list as JSON, in the RabbitMQ management API's envelope (``items``, ``page``,
    ``page_size``, ``page_count``, ``item_count``, ``total_count``, ``filtered_count``), cut to
    ``budget`` bytes (whole items; ``truncated`` says so: ask for smaller pages). ``make`` turns
    the page's items into what is shown (made only for the page, not for the whole list); ``total``:
    the items before a filter kept ``items`` (``total_count``; ``filtered_count`` is ``len(items)``)."""
    filtered = len(items)
    chunk = items[(page - 1) * page_size:page * page_size]
    if make is not None:
        chunk = [make(item) for item in chunk]
    text, end = answers.json_items(chunk, 0, budget - 300)  # (300: the envelope)
    envelope = {"page": page, "page_size": page_size, "page_count": -(-filtered // page_size), "item_count": end,
                "total_count": filtered if total is None else total, "filtered_count": filtered,
                "truncated": end < len(chunk)}
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
        self.audit = AuditLog(config.audit_log, config.audit_log_max_bytes, config.audit_log_files)
        self.limiter = manage.RateLimiter(config.manage_rate_limit)
        self.actions: dict[tuple[str, int], int] = {}  # (action, HTTP status) -> requests, for /metrics

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
        elif (path in API or path == METRICS or one_job(path)) and self.config.http_api:
            kind = "metrics" if path == METRICS else "api"
        elif path.startswith("/api/") and self.config.http_api:
            action, allow = manage.action_of(method, path)
            if action is not None:
                return "action", None
            if allow:
                return None, text_response(405, "Method Not Allowed", f"{path[:100]} takes {allow}", {"Allow": allow})
            return None, not_found()
        else:
            return None, not_found()
        if method not in ALLOWED_METHODS:
            return None, method_not_allowed()
        return kind, None

    def respond(self, method: str, target: str, accept: str = "") -> bytes:
        """The response to a routed request (not ``"token"``: the dispatcher mints those)."""
        try:
            response = self._respond(target, accept)
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
            dlq = getattr(self.config, "dead_letter_queue", "")
            for name, value in (("auth", auth), ("ws_path", ws_path), ("dlq", dlq)):
                page = page.replace("{{%s}}" % name, html.escape(value))
            return http_response(200, "OK", page.encode(), {"Content-Type": "text/html; charset=utf-8", **PAGE_HEADERS})
        snapshot = self.snapshot()
        budget = self.config.answer_bytes
        if path == METRICS:
            vhost = parse_qs(parts.query).get("vhost", [None])[0]  # (the per-queue series of one vhost)
            if vhost is not None and vhost not in self.config.vhosts:
                raise BadRequest(manage.no_vhost(vhost, self.config))
            body, content_type = exposition(snapshot, accept, self.config.metrics_max_queues, budget, vhost)
            return http_response(200, "OK", body, {"Content-Type": content_type, "Cache-Control": "no-store",
                                                   **SECURITY_HEADERS})
        if path == "/api/overview":
            return json_response(overview(snapshot, budget))
        query = parse_qs(parts.query)
        page, page_size = paging(query, self.config.api_max_page_size)
        if path == "/api/vhosts":
            return json_response(page_of([{"name": name} for name in self.config.vhosts], page, page_size, budget))
        vhost = query.get("vhost", [manage.DEFAULT_VHOST])[0]
        if vhost not in self.config.vhosts:
            raise BadRequest(manage.no_vhost(vhost, self.config))
        if path == "/api/queues":
            return json_response(self.queue_page(snapshot, query, page, page_size, vhost))
        if path == "/api/subscriptions":
            return json_response(page_of(self.subscriptions(vhost), page, page_size, budget))
        if path.startswith(SCHEDULED + "/"):  # one job, by its id (ids are broker-wide)
            job = self.stats.broker.jobs.by_id.get(unquote(path[len(SCHEDULED) + 1:]))
            return json_response(job_info(job)) if job is not None else not_found()
        if path == SCHEDULED:  # by time; ?destination= for one destination's
            return json_response(page_of(self.scheduled(vhost, query.get("destination", [None])[0]),
                                         page, page_size, budget, job_info))
        sessions = list(self.stats.broker.sessions.values())
        return json_response(page_of(sessions, page, page_size, budget, self.connection))

    def queue_page(self, snapshot: dict, query: dict, page: int, page_size: int, vhost: str = "/") -> bytes:
        """/api/queues: the queues of ``vhost`` (named as its clients name them); ``name`` keeps the
        queues whose name holds that text, ``sort`` orders them (QUEUE_SORTS; ``sort_reverse=true``
        for the largest first), then one page."""
        sort = query.get("sort", ["name"])[0]
        if sort not in QUEUE_SORTS:
            raise BadRequest(f"sort must be one of {', '.join(QUEUE_SORTS)}")
        reverse = query.get("sort_reverse", ["false"])[0] == "true"
        key = "destination" if sort == "name" else sort
        cache = snapshot.setdefault("sorted_queues", {})  # sorted once per snapshot, vhost and order
        queues = cache.get((vhost, key, reverse))
        if queues is None:
            # (queue_stats shows a vhost's queue as "VHOST:destination" and says its vhost)
            mine = [q if vhost == "/" else {**q, "destination": q["destination"][len(vhost) + 1:]}
                    for q in snapshot["queues"] if q.get("vhost", "/") == vhost]
            queues = cache[(vhost, key, reverse)] = sorted(mine, key=lambda q: (q[key], q["destination"]),
                                                           reverse=reverse)
        total = len(queues)
        name = query.get("name", [""])[0]
        if name:
            queues = [q for q in queues if name in q["destination"]]
        return page_of(queues, page, page_size, self.config.answer_bytes, total=total)

    def scheduled(self, vhost: str, destination: str | None) -> list:
        """/api/scheduled: the scheduled messages of ``vhost`` (of its ``destination``, named as its
        clients name it), by time."""
        jobs = self.stats.broker.jobs
        if destination is not None:
            return jobs.of(vhosts.inside(vhost, destination))
        return [job for job in jobs.of() if vhosts.split(job.destination)[0] == vhost]

    def subscriptions(self, vhost: str = "/") -> list[dict]:
        """/api/subscriptions: the durable subscriptions of ``vhost`` (attached or not) and its other
        live ones, named as its clients name them."""
        broker = self.stats.broker
        items = []
        for d in broker.durables.values():
            their_vhost, key = vhosts.split(d.name) if broker.vhosts_on else (vhosts.DEFAULT, d.name)
            if their_vhost == vhost:
                items.append({"durable": True, "key": key, "destination": vhosts.rendered(d.pattern),
                              "attached": d.sub is not None, "connection": d.sub.session.conn if d.sub else None,
                              "id": d.sub.id if d.sub is not None else None, "waiting": d.queue.depth()})
        own = "" if vhost == "/" else vhost
        for session in broker.sessions.values():
            if session.vhost != own:
                continue
            for sub in session.subs.values():
                if sub.durable is None:
                    items.append({"durable": False, "key": None, "destination": vhosts.rendered(sub.destination),
                                  "attached": True,
                                  "connection": session.conn, "id": sub.id, "waiting": None})
        return items

    # -- management actions (console/manage.py, broker/manage.py) -----------------------------------
    def precheck(self, request, peer: str) -> bytes | None:
        """The answer to an action refused before its login is checked (actions off or without
        logins, a forged request), else None."""
        action, _ = manage.action_of(request.method, urlsplit(request.target).path)
        if not (self.config.http_manage and self.config.auth_required):
            response = manage.refusal(403, "management actions are off: they need logins checked (passwd_file "
                                           "or secret) and http_manage=true")
        else:
            reason = manage.forgery(request)
            if not reason:
                return None
            response = manage.refusal(403, reason)
        self.noted(action, request, peer, None, 403, {})
        return response

    def act(self, broker, request, user: str | None, peer: str, now: float, answer=None) -> bytes | None:
        """An action asked by ``user`` (its login checked): the permission, the rate limit, then the
        action; each is audited and counted. None when the cluster answers it later: then
        ``answer(response)`` is called with its answer (audited and counted then)."""
        action, _ = manage.action_of(request.method, urlsplit(request.target).path)
        if not manage.allowed(broker.auth, user, action, request):
            status, response, noted = 403, manage.refusal(403, f"{user} may not {action.name} here: an admin or "
                                                               "a manage grant covering it is needed"), {}
        else:
            wait = self.limiter.take(user or "", now)
            if wait:
                status, response, noted = 429, manage.too_many(wait), {}
            else:
                try:
                    result = manage.perform(broker, self.config, action, request, now)
                    if isinstance(result, manage.Waiting):
                        result.later.when_done(lambda status, value: self._finished(
                            result, status, value, action, request, peer, user, answer))
                        return None
                    status, response, noted = result
                except Exception as exc:  # a bug costs this request a 500, never the broker
                    status, response, noted = 500, self.failed(request.method, request.target, exc), {}
        self.noted(action, request, peer, user, status, noted)
        return response

    def _finished(self, waiting, status, value, action, request, peer: str, user: str | None, answer) -> None:
        """An action the cluster answered: audited, counted and answered now."""
        try:
            status, response, noted = manage.finished(waiting, status, value)
        except Exception as exc:  # a bug costs this request a 500, never the broker
            status, response, noted = 500, self.failed(request.method, request.target, exc), {}
        self.noted(action, request, peer, user, status, noted)
        if answer is not None:
            answer(response)

    def noted(self, action, request, peer: str, user: str | None, status: int, result: dict) -> None:
        """One action in the audit log and the counts of /metrics."""
        self._snapshot = None  # the next look shows what the action did, and its count
        key = (action.name, status)
        if key in self.actions or len(self.actions) < 1000:
            self.actions[key] = self.actions.get(key, 0) + 1
        claimed = basic_credentials(request.authorization)
        self.audit.write({"user": user, "login": claimed[0] if claimed else None, "peer": peer,
                          "action": action.name, "method": request.method, "vhost": action.vhost,
                          "target": action.target, **({"id": action.item} if action.item else {}),
                          "status": status, **result})

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
            "vhosts": list(self.config.vhosts),
            "vhost_connections": stats.vhost_connections(),
            "cluster": stats.query("cluster"),  # {} on a single node
            "http": {"internal_errors": self.errors + int(stats.resources.reader_stats.read()["http_errors"]),
                     "unavailable": self.unavailable, "audit_errors": self.audit.errors,
                     "actions": [{"action": a, "status": s, "count": n} for (a, s), n in sorted(self.actions.items())]},
        }
        self._snapshot_at = now
        return self._snapshot

    def connection(self, session) -> dict:
        """One connection as /api/connections shows it; its subscriptions as many as fit in a share
        of the answer budget (``subscription_count`` counts them all)."""
        now = self.clock()
        subs = [{"id": sub.id, "destination": vhosts.rendered(sub.destination), "ack": sub.ack,
                 "unacked": len(sub.unacked)}
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
            "vhost": session.vhost or "/",
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
