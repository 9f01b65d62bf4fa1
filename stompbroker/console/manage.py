"""The HTTP side of operators' actions (docs/admin.md): which request is which action, the guards a
write API needs (logins only from the Authorization header, an Origin check on every non-GET, JSON
bodies only, rate limits per login), the actions' arguments from the path, query and JSON body, and
their JSON answers. The state changes themselves are ``broker/manage.py``'s.

Paths name a virtual host and a destination each as one URL-encoded segment (the default virtual
host ``/`` is ``%2F``, as in RabbitMQ's API); a destination is named as the clients of its virtual
host name it, and translated here (``broker/vhosts.py``)."""

from __future__ import annotations

import base64
import binascii
import math
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from ..broker import manage, vhosts
from ..broker.model import Later
from ..broker.selector import compile_selector
from ..broker.selector_lexer import SelectorError
from ..diag import answers
from ..protocol.hosts import same_origin
from ..protocol.websocket import http_response

DEFAULT_VHOST = vhosts.DEFAULT
PEEK_COUNT = 10          # messages a peek shows unless ?count= says
PREVIEW_BYTES = 4096     # of each body unless ?truncate= says
MAX_COUNT = 500          # messages one peek may show (as /api pages)
MAX_LIMITER_ENTRIES = 10_000  # logins the rate limiter remembers (it forgets them all past this)
JSON_HEADERS = {"Content-Type": "application/json", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"}
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 415: "Unsupported Media Type", 429: "Too Many Requests",
           500: "Internal Server Error", 503: "Service Unavailable"}


class Action(NamedTuple):
    """A management request: ``name`` (peek, purge, delete, move, publish, close, unsubscribe,
    cancel), the virtual host and what it acts on (a destination, a connection id, a durable
    subscription's key; "" for publish, whose destination is in its body); ``item``: the one
    scheduled message of that destination a cancel names ("": all of them)."""

    name: str
    vhost: str
    target: str
    item: str = ""


# (path shape, with * for one segment) -> {method: action}
SHAPES = {
    ("api", "queues", "*", "*", "messages"): {"GET": "peek", "DELETE": "purge"},
    ("api", "queues", "*", "*"): {"DELETE": "delete"},
    ("api", "queues", "*", "*", "move"): {"POST": "move"},
    ("api", "publish"): {"POST": "publish"},
    ("api", "connections", "*"): {"DELETE": "close"},
    ("api", "subscriptions", "*", "*"): {"DELETE": "unsubscribe"},
    ("api", "scheduled", "*", "*"): {"DELETE": "cancel"},
    ("api", "scheduled", "*", "*", "*"): {"DELETE": "cancel"},
}
# actions on one destination (a manage grant covering it allows them); the others need an admin
ON_DESTINATION = ("peek", "purge", "delete", "move", "publish", "cancel")


def action_of(method: str, path: str) -> tuple[Action | None, str]:
    """(the action a request asks for, "") or (None, the methods its path allows: "" when the path
    is no action's)."""
    segments = path.strip("/").split("/")
    for shape, methods in SHAPES.items():
        if len(shape) == len(segments) and all(s == "*" or s == p for s, p in zip(shape, segments)):
            name = methods.get(method)
            if name is None:
                return None, ", ".join(methods)
            values = [unquote(p, errors="replace") for s, p in zip(shape, segments) if s == "*"]
            if name == "close":
                return Action(name, DEFAULT_VHOST, values[0]), ""
            if name == "publish":
                return Action(name, DEFAULT_VHOST, ""), ""
            return Action(name, *values), ""
    return None, ""


# -- the guards ------------------------------------------------------------------------------------
def forgery(request) -> str:
    """Why a request may have been sent by another site's page (CSRF), or "". Browsers send Origin
    with every non-GET request and Sec-Fetch-Site with every request; scripts and the command-line
    tool send neither. A form can only post form or text bodies: an action's body must be JSON. A
    peek (GET) changes nothing, but another site's page may not spend its user's rate limit either."""
    if request.fetch_site and request.fetch_site not in ("same-origin", "none"):
        return f"a request from another site ({request.fetch_site[:20]}) may not act on the broker"
    if request.method in ("GET", "HEAD"):
        return ""
    if request.origin and not same_origin(request.origin, request.host or None):
        return "a page of another origin may not act on the broker (Origin must be the broker's own)"
    if request.body and request.content_type.split(";")[0].strip().lower() != "application/json":
        return "an action's body must be JSON (Content-Type: application/json)"
    return ""


class RateLimiter:
    """A token bucket per login: ``rate`` actions per second, bursts of ``max(rate, 1)``."""

    def __init__(self, rate: float):
        self.rate = rate
        self.burst = max(rate, 1.0)
        self.buckets: dict[str, tuple[float, float]] = {}  # login -> (tokens, when)

    def take(self, login: str, now: float) -> float:
        """0 when ``login`` may act now (a token is taken), else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        tokens, then = self.buckets.get(login, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1:
            self.buckets[login] = (tokens, now)
            return (1 - tokens) / self.rate
        if len(self.buckets) >= MAX_LIMITER_ENTRIES and login not in self.buckets:
            self.buckets.clear()  # logins are few (passwd users, token holders): only a flood gets here
        self.buckets[login] = (tokens - 1, now)
        return 0.0


# -- answers ---------------------------------------------------------------------------------------
def json_answer(status: int, value, headers: dict | None = None) -> bytes:
    body = value if isinstance(value, bytes) else orjson.dumps(value)
    return http_response(status, REASONS.get(status, "Error"), body, {**JSON_HEADERS, **(headers or {})})


def refusal(status: int, reason: str, headers: dict | None = None) -> bytes:
    return json_answer(status, {"error": REASONS.get(status, "error").lower(), "reason": reason}, headers)


def too_many(retry_after: float) -> bytes:
    return refusal(429, "too many management actions from this login (manage_rate_limit)",
                   {"Retry-After": str(max(1, math.ceil(retry_after)))})


class Invalid(Exception):
    """A request whose arguments are wrong: 400 with the reason."""


# -- arguments -------------------------------------------------------------------------------------
def body_of(request) -> dict:
    if not request.body:
        return {}
    try:
        value = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        raise Invalid("the body is not JSON") from None
    if not isinstance(value, dict):
        raise Invalid("the body must be a JSON object")
    return value


def whole(value, name: str, low: int, high: int, default: int | None = None) -> int | None:
    if value is None:
        return default
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Invalid(f"{name} must be a whole number from {low} to {high}")
    return value


def text(value, name: str, most: int, default: str | None = None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str) or len(value) > most:
        raise Invalid(f"{name} must be a string of at most {most} characters")
    return value


def publish_args(body: dict, config) -> tuple[str, str, dict, bytes]:
    """(vhost, destination, headers, body) of POST /api/publish."""
    vhost = text(body.get("vhost"), "vhost", 200, DEFAULT_VHOST)
    destination = text(body.get("destination"), "destination", config.max_destination_length)
    if not destination:
        raise Invalid("publish needs a destination")
    raw = body.get("headers") or {}
    if not isinstance(raw, dict) or len(raw) > config.max_headers:
        raise Invalid(f"headers must be an object of at most {config.max_headers} names")
    headers = {}
    for name, value in raw.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = str(value)
        if not isinstance(value, str) or not name or any(c in name for c in ":\r\n\0") or "\0" in value \
                or len(name) + len(value) + 1 > config.max_header_line:
            raise Invalid(f"header {name[:40]!r}: a name without ':' or line breaks and a string value, "
                          f"at most {config.max_header_line} characters together")
        headers[name] = value
    if body.get("persistent") is not None:  # as a SEND's header: true keeps a topic message too (docs/admin.md)
        if not isinstance(body["persistent"], bool):
            raise Invalid("persistent must be true or false")
        headers["persistent"] = "true" if body["persistent"] else "false"
    payload = body.get("body", "")
    encoding = body.get("body_encoding", "string")
    if not isinstance(payload, str) or encoding not in ("string", "base64"):
        raise Invalid("body must be a string, body_encoding string or base64")
    try:
        data = base64.b64decode(payload, validate=True) if encoding == "base64" else payload.encode()
    except (binascii.Error, ValueError):
        raise Invalid("body is not base64") from None
    return vhost, destination, headers, data


def preview(message, truncate: int, encoding: str) -> dict:
    """One waiting message as a peek shows it: headers, size, the body's first ``truncate`` bytes as
    text (when they are UTF-8 and ``encoding`` is auto) or base64."""
    data = message.body[:truncate]
    shown = None
    if encoding == "auto":
        try:
            shown, kind = data.decode("utf-8"), "string"
        except UnicodeDecodeError:  # (also a character cut at truncate: base64 then)
            pass
    if shown is None:
        shown, kind = base64.b64encode(data).decode(), "base64"
    headers = message.headers
    if vhosts.rendering and vhosts.MARK in headers.get("destination", ""):  # (as its vhost's clients name it)
        headers = {**headers, "destination": vhosts.visible(headers["destination"])}
    return {"message_id": message.id, "destination": vhosts.rendered(message.destination), "headers": headers,
            "size": len(message.body), "redelivered": bool(message.redelivered or message.nacks),
            "payload": shown, "payload_encoding": kind, "truncated": len(message.body) > truncate}


# -- the actions -------------------------------------------------------------------------------------
def allowed(auth, user: str, action: Action, request) -> bool:
    """May ``user`` (checked) do ``action``? Admins may do every action; a manage grant allows the
    actions on the destinations it covers (a move's target too)."""
    if auth is None or auth.is_admin(user):
        return True
    if action.name not in ON_DESTINATION:
        return False
    try:
        body = body_of(request)
    except Invalid:
        body = {}
    names = [action.target] if action.target else []
    if action.name == "publish":
        names = [body.get("destination")]
    elif action.name == "move":
        names.append(body.get("to"))  # (None, a dead letter's redrive to each original destination: admins)
    return all(isinstance(name, str) and name and auth.can_manage(user, name) for name in names)


class Waiting(NamedTuple):
    """An action the cluster answers later (cluster mode): ``later`` (``broker.model.Later``) comes
    with its result, which ``shape`` makes into (status, value, noted); ``noted``: what the audit
    log keeps of its arguments whatever the result."""

    later: Later
    shape: object
    noted: dict


def perform(broker, config, action: Action, request, now: float) -> tuple[int, bytes, dict] | Waiting:
    """Do ``action``: (HTTP status, answer, what the audit log keeps of its arguments and result), or
    ``Waiting`` when the cluster answers it later (``finished`` then makes the same)."""
    query = parse_qs(urlsplit(request.target).query)
    first = {name: values[0] for name, values in query.items()}
    try:
        body = body_of(request)
        if action.vhost not in config.vhosts:
            return 404, refusal(404, no_vhost(action.vhost, config)), {}
        result = _perform(broker, config, action, first, body, now)
    except Invalid as exc:
        return 400, refusal(400, str(exc)), {}
    except manage.Refused as exc:
        return exc.status, refusal(exc.status, exc.reason), {}
    if isinstance(result, Waiting):
        return result
    return _answer(*result)


def finished(waiting: Waiting, status: int | None, value) -> tuple[int, bytes, dict]:
    """(HTTP status, answer, audit) of an action the cluster answered: ``status`` None and its
    result, or the HTTP status it failed with and the reason."""
    if status is not None:
        return status, refusal(status, value), {**waiting.noted, "reason": value}
    try:
        return _answer(*waiting.shape(value))
    except Invalid as exc:
        return 400, refusal(400, str(exc)), waiting.noted
    except manage.Refused as exc:
        return exc.status, refusal(exc.status, exc.reason), {**waiting.noted, "reason": exc.reason}


def later_or_now(result, shape, noted: dict):
    """``shape(result)`` now, or ``Waiting`` for a result the cluster gives later."""
    if isinstance(result, Later):
        return Waiting(result, shape, noted)
    return shape(result)


def _answer(status: int, value, noted: dict) -> tuple[int, bytes, dict]:
    if status != 200:
        return status, refusal(status, value), noted
    if isinstance(value, bytes):
        return 200, json_answer(200, value), noted
    return 200, json_answer(200, value), {**noted, **value}


def no_vhost(vhost: str, config) -> str:
    return f"no virtual host {vhost[:100]!r} (vhosts: {', '.join(config.vhosts)})"


def durable_key(vhost: str, key: str) -> str:
    """A durable subscription's key as the broker keeps it (``durables.durable_key``)."""
    return key if vhost == DEFAULT_VHOST else vhosts.MARK + vhost + vhosts.MARK + key


def _perform(broker, config, action: Action, query: dict, body: dict, now: float) -> tuple[int, object, dict]:
    name = action.name
    if len(config.vhosts) > 1 and any(isinstance(value, str) and vhosts.MARK in value
                                      for value in (action.target, body.get("to"), body.get("destination"))):
        raise Invalid("a destination or key may not hold the character U+001E (it marks virtual hosts)")
    target = vhosts.inside(action.vhost, action.target) if name in ON_DESTINATION else action.target
    if name == "peek":
        count = whole(query.get("count"), "count", 1, MAX_COUNT, PEEK_COUNT)
        offset = whole(query.get("offset"), "offset", 0, 10 ** 9, 0)
        truncate = whole(query.get("truncate"), "truncate", 0, config.answer_bytes // 8, PREVIEW_BYTES)
        encoding = query.get("encoding", "auto")
        if encoding not in ("auto", "base64"):
            raise Invalid("encoding must be auto or base64")
        def peeked(result):
            depth, messages = result[:2]
            cut = len(result) > 2 and result[2]  # (cluster mode: the bridge stopped reading at a bound)
            shown = [preview(m, truncate, encoding) for m in messages]
            listed, end = answers.json_items(shown, 0, config.answer_bytes - 300)
            envelope = {"destination": action.target, "vhost": action.vhost, "depth": depth, "offset": offset,
                        "count": end, "truncated": end < len(shown) or bool(cut)}
            return 200, b'{"messages":' + listed + b"," + orjson.dumps(envelope)[1:], {"count": end}
        return later_or_now(broker.manage(manage.peek, target, offset, count, now=now), peeked, {})
    if name == "purge":
        def purged(result):
            n, cut = result if isinstance(result, tuple) else (result, False)  # (cut: cluster mode, time ran out)
            return 200, {"purged": n, **({"truncated": True} if cut else {})}, {}
        return later_or_now(broker.manage(manage.purge, target, now=now), purged, {})
    if name == "delete":
        return later_or_now(broker.manage(manage.delete, target, now=now),
                            lambda purged: (200, {"deleted": purged is not None, "purged": purged or 0}, {}), {})
    if name == "move":
        to = text(body.get("to"), "to", config.max_destination_length)
        count = whole(body.get("count"), "count", 1, 10 ** 9)
        selector = text(body.get("selector"), "selector", config.max_selector_length)
        accepts = None
        if selector:
            try:
                accepts = compile_selector(selector)
            except SelectorError as exc:
                raise Invalid(f"selector: {exc}") from None
        inner = vhosts.inside(action.vhost, to) if to is not None else None
        noted = {"to": to, "count": count, "selector": selector}
        return later_or_now(broker.manage(manage.move, target, inner, count, accepts, now=now),
                            lambda result: (200, {"moved": result[0], "left": result[1],
                                                  **({"truncated": True} if result[2:3] == (True,) else {})},
                                            noted), noted)
    if name == "publish":
        vhost, destination, headers, data = publish_args(body, config)
        if vhost not in config.vhosts:
            return 404, no_vhost(vhost, config), {}
        delivered = broker.manage(manage.publish, vhosts.inside(vhost, destination), headers, data, now=now)
        noted = {"destination": destination, "size": len(data)}
        return later_or_now(delivered, lambda n: (200, {"published": True, "delivered": n}, noted), noted)
    if name == "close":
        reason = text(body.get("reason", query.get("reason")), "reason", 500) or "closed by an operator"
        conn = int(target) if target.isascii() and target.isdigit() and len(target) < 20 else -1
        if not broker.manage(manage.close_connection, conn, reason, now=now):
            return 404, f"no open STOMP connection {target[:40]!r}", {"reason": reason}
        return 200, {"closed": conn}, {"reason": reason}
    if name == "cancel":
        cancelled = broker.manage(manage.cancel_scheduled, target, action.item or None, now=now)
        if cancelled is None:
            return 404, f"no scheduled message {action.item[:60]!r} for {action.target[:100]!r}", {}
        return 200, {"cancelled": cancelled}, {}
    # unsubscribe
    def removed(dropped):
        if dropped is None:
            return 404, "no such durable subscription", {}
        return 200, {"removed": target, "dropped": dropped}, {}
    return later_or_now(broker.manage(manage.remove_durable, durable_key(action.vhost, target), now=now), removed, {})
