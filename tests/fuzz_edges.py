"""A fuzzer of the broker's edges over real sockets: HTTP requests, WebSocket sessions and PROXY
protocol headers, as a hostile or broken client (or proxy) would send them.

One *input* is one connection: where it comes from (the trusted proxy address, which starts with a
PROXY header, or another loopback address, which does not), the bytes it sends (cut into chunks
sent one after the other), and what the broker must do with it. Inputs are built from
protocol-shaped pieces (request lines, headers, Host and Origin values, WebSocket frames of every
opcode, fragments, STOMP frames inside messages, PROXY v1 and v2 headers) and then, some of them,
mutated (bytes flipped, inserted, cut). ``Fuzzer.run`` keeps ``concurrency`` inputs in flight on one
epoll loop and judges each:

- **answered**: the broker wrote something and closed (an HTTP response, a WebSocket close, a STOMP
  ERROR), or closed without a word (a refused PROXY header);
- **connected**: the input made a STOMP session (CONNECTED seen); such a session may rightly stay
  open, so the fuzzer closes it;
- **hang**: neither, ``hang_after`` seconds after its last byte (every input that does not log in is
  closed by the broker within ``connect_timeout_ms``);
- **bad answer**: an HTTP request whose first answer is not HTTP, an HTTP status of 500 or one the
  broker never sends, or an HTTP response whose length is not its Content-Length. One exception:
  a connection whose first byte this fuzzer sent ``connect_timeout`` or more after it connected
  (its own loop was late, on a loaded machine) may have been told the STOMP connect timeout first,
  as any connection that says nothing for that long is: counted as ``late``.

With ``auth`` (a broker with ``auth=passwd`` and the users of ``PASSWD``), logins join in: HTTP
Basic credentials right, wrong, of a user who is not an admin, of nobody, or malformed, on every
path and on ``POST /console/token`` (the console's STOMP passcodes); STOMP CONNECTs (raw and over
WebSocket) with the same logins, made-up console passcodes, and the passcodes the broker minted
for earlier inputs, used from the address they were minted for (once, or twice: the second is
refused) or from another. A refused login is told after its back-off (at most 10 s), so the
caller's ``hang_after`` must be longer.

The broker's own health (no process restarted, no ``internal error`` or traceback in its log, its
memory) is judged by the caller, which owns the broker (tests/integration/test_fuzz_edges.py).
"""

from __future__ import annotations

import base64
import errno
import os
import random
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

from stompbroker.protocol.proxy import V2_SIGNATURE
from stompbroker.protocol.websocket import encode_client_frame, parse_frame

TRUSTED = "127.0.0.1"  # the proxy_trusted address; inputs from 127.0.0.2-254 are direct clients
BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # pick the port at connect
HTTP_METHODS = {b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"PATCH"}
HTTP_STATUSES = {101, 200, 400, 401, 403, 404, 405, 406, 408, 409, 411, 413, 415, 421, 426, 429, 431, 503}
Q = "%2F/%2Fqueue%2Ffuzz"  # /queue/fuzz in the default vhost, as a management path names it
# The management API's actions (docs/admin.md): (method, path, JSON bodies to pick from)
ACTIONS = [
    ("GET", f"/api/queues/{Q}/messages?count=5&encoding=base64", [None]),
    ("GET", f"/api/queues/{Q}/messages?count=-1&offset=x&truncate=99999999999", [None]),
    ("DELETE", f"/api/queues/{Q}/messages", [None, "{}"]),
    ("DELETE", f"/api/queues/{Q}", [None, "{}"]),
    ("POST", f"/api/queues/{Q}/move", ['{"to": "/queue/fuzz2", "count": 3}', '{"selector": "a > 1 AND"}',
                                      '{"to": "/queue/fuzz"}', '{"to": "/topic/*"}', '{"count": -5}', "{", "[]",
                                      '{"to": "/queue/' + "x" * 5000 + '"}', '{"to": "/queue/fuzz3", "selector": "k = 1"}']),
    ("POST", "/api/publish", ['{"destination": "/queue/fuzz", "body": "x"}', '{"destination": "/topic/fuzz", '
                              '"headers": {"priority": "12", "expires": "-1"}, "body": "y", "persistent": true}',
                              '{"vhost": "nowhere", "destination": "/queue/fuzz", "body": ""}', '{"destination": "DIAG"}',
                              '{"destination": "/queue/fuzz", "body": "' + "z" * 70000 + '"}', '{"body": 5}', "null"]),
    ("DELETE", "/api/connections/999999999", [None, '{"reason": "fuzz"}']),
    ("DELETE", "/api/connections/abc", [None]),
    ("DELETE", "/api/subscriptions/%2F/nope", [None]),
    ("DELETE", f"/api/scheduled/{Q}", [None]),
    ("DELETE", f"/api/scheduled/{Q}/ID:nope", [None]),
    ("GET", "/api/vhosts", [None]), ("GET", "/api/subscriptions?vhost=nowhere", [None]),
    ("GET", "/api/scheduled?vhost=%2F&destination=%2Fqueue%2Ffuzz", [None]),
    ("PUT", f"/api/queues/{Q}", ['{}']), ("PATCH", "/api/publish", ['{}']),
]
PASSWD = {"root": ("toor", "admin"), "bob": ("builder", "")}  # the auth=passwd broker's users
# right, wrong, not an admin, nobody, malformed; root's are the most (the others cost a scrypt check each,
# and the broker's two checkers would spend the run on them)
LOGINS = [("root", "toor")] * 6 + [("root", "guess"), ("root", ""), ("root", "console-" + "A" * 32), ("bob", "builder"),
                                   ("bob", "toor"), ("nobody", "x"), ("", ""), ("r\xf6\xf6t", "\xff"), ("root:toor", "x"),
                                   ("a" * 300, "b" * 300)]
OP_CONT, OP_TEXT, OP_BIN, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


@dataclass
class Report:
    inputs: int = 0
    answered: int = 0
    silent: int = 0           # closed without a word
    connected: int = 0
    late: int = 0             # HTTP requests sent connect_timeout after their connect, told the connect timeout
    hangs: list = field(default_factory=list)        # (kind, first bytes) of each
    bad_answers: list = field(default_factory=list)  # (kind, why, first bytes sent, first bytes received)
    kinds: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        top = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        return (f"{self.inputs} inputs in {self.seconds:.0f} s ({self.inputs / max(self.seconds, 1e-9):.0f}/s): "
                f"{self.answered} answered, {self.silent} closed silently, {self.connected} logged in, "
                f"{self.late} sent too late for their connect timeout; "
                f"{len(self.hangs)} hangs, {len(self.bad_answers)} bad answers; HTTP statuses: {top}; "
                f"kinds: {self.kinds}")


# -- inputs ------------------------------------------------------------------------------------------
class Inputs:
    """Inputs for a broker on ``port`` (what a well-formed Host names) from a seeded generator."""

    def __init__(self, port: int, seed: int, auth: bool = False):
        self.port = port
        self.r = random.Random(seed)
        self.auth = auth
        self.minted: list[tuple[str, bytes, str]] = []  # (source, PROXY header, passcode) from earlier answers
        own = f"127.0.0.1:{port}"
        self.hosts = [own, own, own, f"localhost:{port}", "localhost", f"[::1]:{port}", "10.9.8.7", "evil.example",
                      f"evil.example:{port}", "localhost.evil.example", "", " ", "a b", "[::1", "127.0.0.1:99999",
                      "x" * 300, "\xff\xfe", "LOCALHOST.", None]
        self.origins = [None, None, f"http://{own}", "http://evil.example", "null", "", "http://127.0.0.1:1",
                        "https://" + own, "http://[::1", "ws://x:y", "\x80"]
        self.paths = ["/", "/index.html", "/api/overview", "/api/queues", "/api/connections",
                      "/api/connections?limit=3", "/api/connections?limit=-1", "/api/connections?limit=1e9",
                      "/api/connections?limit=99999999999999999999999", "/api/connections?limit=&limit=x",
                      "/metrics", "/metrics?x=1", "/health_check", "/health_check?full", "/console/console.js",
                      "/console/vendor/uPlot.min.css", "/console/vendor/nothing.js", "/nothing", "/%00", "/%zz",
                      "/..%2f..%2fetc%2fpasswd", "//", "*", "/ws", "/stomp", "http://evil.example/api/overview",
                      "/api/overview#x", "/?" + "&".join("a=%d" % i for i in range(50)), "/" + "a" * 7000, "/\x7f"]
        self.accepts = ["", "*/*", "text/plain", "application/openmetrics-text",
                        "application/openmetrics-text; version=1.0.0", "application/openmetrics-text; version=0.0.1",
                        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "application/json", ";;;", "a" * 500]
        self.authorizations = ["", "Basic " + base64.b64encode(b"root:toor").decode(), "Basic", "Basic !!!",
                               "Basic " + base64.b64encode(b"nocolon").decode(), "Bearer x", "basic YTpi",
                               "Basic " + base64.b64encode(b"\xff:\xfe").decode()]

    def make(self) -> tuple[str, str, int | None, list[bytes]]:
        """(kind, source address, length of the PROXY header before the client's own bytes, or None
        when the header is one the broker must refuse, chunks)."""
        r = self.r
        if self.auth and self.minted and r.random() < 0.05:
            return self.console_login()
        roll = r.random()
        if roll < 0.40:
            kind, data = "http", self.http_request()
        elif roll < 0.80:
            kind, data = "websocket", self.websocket_session()
        elif roll < 0.88:
            kind, data = "stomp", self.stomp_frames(raw=True)
        else:
            kind, data = "bytes", r.randbytes(r.randrange(0, 300))
        if r.random() < 0.25:
            data = self.mutate(data)
        source = TRUSTED if r.random() < 0.6 else f"127.0.0.{r.randrange(2, 255)}"
        header, valid = self.proxy_header() if source == TRUSTED or r.random() < 0.05 else (b"", True)
        believed = valid and (source == TRUSTED) == bool(header)  # (any header from others is refused)
        return kind, source, len(header) if believed else None, self.chunks(header + data)

    def console_login(self) -> tuple[str, str, int | None, list[bytes]]:
        """A STOMP login with a passcode the broker minted for an earlier input: from the address it
        was minted for (the same source and PROXY header), where it works once, or from another."""
        r = self.r
        source, header, passcode = self.minted[-1] if r.random() < 0.7 else r.choice(self.minted)
        if r.random() < 0.7:
            self.minted.remove((source, header, passcode))  # used up (else it is tried again, and refused)
        if r.random() < 0.2:
            source, header = f"127.0.0.{r.randrange(2, 255)}", b""
        frames = (f"CONNECT\naccept-version:1.2\nlogin:root\npasscode:{passcode}\n\n\0".encode()
                  + r.choice([b"DIAG\n\nsession\0", b"SUBSCRIBE\nid:m\ndestination:/queue/monitor\n\n\0",
                              b"SEND\ndestination:/topic/fuzz\n\nno\0", b"SUBSCRIBE\nid:x\ndestination:/topic/x\n\n\0",
                              b"DISCONNECT\nreceipt:bye\n\n\0"]))
        kind = "token"
        if r.random() < 0.3:
            kind, frames = "token-ws", (self.http_request(upgrade=True, authorization=False)
                                        + encode_client_frame(frames, OP_TEXT))
        return kind, source, len(header) if source == TRUSTED else 0, self.chunks(header + frames)

    def learn(self, source: str, header: bytes, received: bytes) -> None:
        """A passcode in a POST /console/token answer, kept for a later input to log in with."""
        start = received.find(b'"passcode":"')
        if start >= 0:
            end = received.find(b'"', start + 12)
            if end > 0:
                self.minted.append((source, header, received[start + 12:end].decode()))
                del self.minted[:-50]

    def chunks(self, data: bytes) -> list[bytes]:
        r = self.r
        if len(data) < 2 or r.random() < 0.6:
            return [data]
        cuts = sorted(r.sample(range(1, len(data)), min(len(data) - 1, r.randrange(1, 6))))
        return [data[i:j] for i, j in zip([0] + cuts, cuts + [len(data)])]

    def mutate(self, data: bytes) -> bytes:
        r = self.r
        data = bytearray(data)
        for _ in range(r.randrange(1, 4)):
            what = r.random()
            if not data or what < 0.3:
                data[r.randrange(len(data) + 1):0] = r.choice([b"\r", b"\n", b"\0", b"\r\n", b"\xff", b" ", b":",
                                                                r.randbytes(r.randrange(1, 20))])
            elif what < 0.6:
                data[r.randrange(len(data))] = r.randrange(256)
            elif what < 0.8:
                del data[r.randrange(len(data)):]
            else:
                start = r.randrange(len(data))
                data[start:start] = data[start:start + r.randrange(1, 40)] * r.randrange(1, 4)
        return bytes(data)

    def proxy_header(self) -> tuple[bytes, bool]:
        """A PROXY header, and whether it is a valid one."""
        r = self.r
        client = f"10.{r.randrange(256)}.{r.randrange(256)}.{r.randrange(1, 255)}"
        port = r.randrange(1, 65536)
        roll = r.random()
        if roll < 0.45:
            return f"PROXY TCP4 {client} 127.0.0.1 {port} {self.port}\r\n".encode(), True
        if roll < 0.85:
            return (V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", 12) + socket.inet_aton(client)
                    + socket.inet_aton("127.0.0.1") + struct.pack("!HH", port, self.port)), True
        if roll < 0.9:
            return r.choice([b"PROXY UNKNOWN\r\n", V2_SIGNATURE + b"\x20\x00\x00\x00",  # the proxy's own
                             f"PROXY TCP6 ::ffff:{client} ::1 {port} 1\r\n".encode(),
                             V2_SIGNATURE + b"\x21\x21\x00\x24" + r.randbytes(36)]), True
        return r.choice([b"PROXY TCP4 1.2.3.4\r\n", b"PROXY " + b"9" * 120, V2_SIGNATURE + b"\x21\x11\xff\xff",
                         V2_SIGNATURE + b"\x31\x11\x00\x0c" + b"\0" * 12, V2_SIGNATURE[:7], b"",
                         V2_SIGNATURE + b"\x22\x11\x00\x00", b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"]), False

    def basic(self) -> str:
        login, passcode = self.r.choice(LOGINS)
        return "Basic " + base64.b64encode(f"{login}:{passcode}".encode("utf-8", "replace")).decode()

    def header_lines(self, upgrade: bool, authorization: bool = True, extras: int = 4) -> list[str]:
        r = self.r
        lines = []
        if self.auth and authorization and r.random() < 0.6:
            lines.append(f"Authorization: {self.basic()}")
        host = r.choice(self.hosts)
        if host is not None:
            lines.append(f"Host: {host}")
        if upgrade or r.random() < 0.1:
            lines += r.sample(["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                               "Sec-WebSocket-Key: " + base64.b64encode(r.randbytes(16)).decode()],
                              4 if r.random() < 0.8 else r.randrange(0, 4))
            if r.random() < 0.5:
                lines.append("Sec-WebSocket-Protocol: " + r.choice(["v12.stomp", "v10.stomp, stomp", "mqtt", ""]))
            origin = r.choice(self.origins)
            if origin is not None:
                lines.append(f"Origin: {origin}")
        for _ in range(r.randrange(0, extras)):
            lines.append(r.choice([
                f"Accept: {r.choice(self.accepts)}", f"Authorization: {r.choice(self.authorizations)}",
                "Content-Length: " + r.choice(["0", "5", "-1", "99999999999"]), "Transfer-Encoding: chunked",
                "Connection: keep-alive", "X-Forwarded-For: 1.2.3.4", "Cookie: " + "c" * r.randrange(0, 2000),
                "Sec-WebSocket-Version: " + r.choice(["8", "13", "x"]), "Host: second.example",
                "X\x80Y: z", "bad header", " folded", "A:" + "\t" * 3]))
        return lines

    def http_request(self, upgrade: bool = False, authorization: bool = True) -> bytes:
        r = self.r
        if not upgrade and r.random() < 0.2:
            return self.action_request(authorization)
        method = "GET" if upgrade or r.random() < 0.75 else r.choice(["HEAD", "POST", "PUT", "OPTIONS", "get", "TRACE"])
        version = "HTTP/1.1" if r.random() < 0.9 else r.choice(["HTTP/1.0", "HTTP/2.0", "HTTX/1.1", ""])
        path = "/" if upgrade and r.random() < 0.7 else r.choice(self.paths)
        extras = 4
        if self.auth and not upgrade and r.random() < 0.25:  # the console's passcodes: asked for by POST
            method, path = ("POST" if r.random() < 0.85 else r.choice(["GET", "HEAD", "PUT"])), r.choice(
                ["/console/token", "/console/token", "/console/token?x=1", "/console/token/"])
            extras = 1 if r.random() < 0.7 else 4  # (mostly well formed, to reach the login)
        head = [f"{method} {path} {version}"] + self.header_lines(upgrade, authorization, extras)
        end = "\r\n\r\n" if r.random() < 0.95 else r.choice(["\r\n", "", "\n\n"])
        return ("\r\n".join(head) + end).encode("latin-1", "replace")

    def action_request(self, authorization: bool) -> bytes:
        """A management action: mostly well formed (JSON, a same-origin or no Origin, the length
        right), to reach the actions themselves, with a wrong part now and then."""
        r = self.r
        method, path, bodies = r.choice(ACTIONS)
        body = (r.choice(bodies) or "").encode()
        if r.random() < 0.8:  # (the broker's own host and an admin's login: the action itself runs)
            head = [f"{method} {path} HTTP/1.1", f"Host: {self.hosts[0]}"]
            if self.auth and authorization:
                head.append("Authorization: Basic " + base64.b64encode(b"root:toor").decode())
        else:
            head = [f"{method} {path} HTTP/1.1"] + self.header_lines(False, authorization, 4)
        if body or r.random() < 0.1:
            head.append("Content-Type: " + ("application/json" if r.random() < 0.9 else r.choice(["text/plain", ""])))
            length = len(body) if r.random() < 0.9 else r.choice([0, len(body) + 10, 10 ** 12])
            head.append(f"Content-Length: {length}")
        if r.random() < 0.2:
            head.append(r.choice(["Origin: http://evil.example", "Sec-Fetch-Site: cross-site", "Origin: null"]))
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace") + body

    def stomp_frames(self, raw: bool = False) -> bytes:
        r = self.r
        out = []
        if r.random() < 0.8:
            login = b""
            if self.auth and r.random() < 0.5:
                user, passcode = r.choice(LOGINS)
                login = f"login:{user}\npasscode:{passcode}\n".encode("utf-8", "replace")
            out.append(b"CONNECT\naccept-version:1.2\nhost:fuzz\n" + r.choice([b"", b"heart-beat:0,0\n",
                                                                                b"heart-beat:1,1\n", b"login:x\n"])
                       + login + b"\n\0")
        for _ in range(r.randrange(0, 5)):
            out.append(r.choice([
                b"SEND\ndestination:/topic/fuzz\n\nhello\0",
                b"SEND\ndestination:/topic/fuzz\ncontent-length:3\n\nabc\0",
                b"SUBSCRIBE\nid:1\ndestination:/topic/fuzz\n\n\0", b"UNSUBSCRIBE\nid:1\n\n\0",
                b"DIAG\n\n" + r.choice([b"session", b"ws_buffer", b"stale", b"totals", b"latency", b"nope", b""])
                + b"\0", b"ACK\nid:zz\n\n\0", b"BEGIN\ntransaction:t\n\n\0", b"\n", b"\r\n",
                b"DISCONNECT\nreceipt:bye\n\n\0", b"SEND\n\n\0", b"GARBAGE\n\n\0",
                b"SEND\ndestination:/topic/fuzz\ncontent-length:99999999\n\n", r.randbytes(r.randrange(0, 40))]))
        return b"".join(out)

    def websocket_session(self) -> bytes:
        r = self.r
        out = [self.http_request(upgrade=True)]
        stomp = self.stomp_frames()
        pos = 0
        while pos < len(stomp) or r.random() < 0.3:
            roll = r.random()
            if roll < 0.55 and pos < len(stomp):
                n = r.randrange(1, len(stomp) - pos + 1)
                part = stomp[pos:pos + n]
                pos += n
                if r.random() < 0.3 and len(part) > 1:  # fragmented, sometimes into many tiny pieces
                    cut = r.randrange(1, len(part))
                    out.append(encode_client_frame(part[:cut], r.choice([OP_TEXT, OP_BIN]), fin=False))
                    for _ in range(r.choice([0, 1, 3, 50, 1100])):
                        out.append(encode_client_frame(b"", OP_CONT, fin=False))
                    out.append(encode_client_frame(part[cut:], OP_CONT, fin=True))
                else:
                    out.append(encode_client_frame(part, OP_TEXT if r.random() < 0.8 else OP_BIN))
            elif roll < 0.7:
                out.append(encode_client_frame(r.randbytes(r.randrange(0, 126)), OP_PING))
            elif roll < 0.75:
                out.append(encode_client_frame(r.randbytes(r.randrange(0, 20)), OP_PONG))
            elif roll < 0.8:
                out.append(encode_client_frame(r.choice([b"", b"\x03\xe8", b"\x03\xe8bye", b"\x03", b"\x0f\xa0",
                                                         b"\x03\xe8\xff"]), OP_CLOSE))
            else:  # frames a client must not send
                out.append(r.choice([
                    encode_client_frame(b"x", OP_TEXT, masked=False), encode_client_frame(b"x", OP_TEXT, rsv=4),
                    encode_client_frame(b"x", 0x3), encode_client_frame(b"x" * 126, OP_PING),
                    encode_client_frame(b"x", OP_PING, fin=False), encode_client_frame(b"x", OP_CONT),
                    encode_client_frame(b"\xc3\x28", OP_TEXT), b"\x82\xff" + struct.pack("!Q", 1 << 63),
                    b"\x82\xff" + struct.pack("!Q", 1 << 40) + b"abcd", b"\x81\xfe\x00",
                    encode_client_frame(b"a", OP_TEXT, fin=False) + encode_client_frame(b"b", OP_TEXT)]))
        return b"".join(out)


# -- the run -----------------------------------------------------------------------------------------
@dataclass
class Flight:
    kind: str
    chunks: list
    header: int | None = 0   # bytes of PROXY header before the client's own (None: a refused header)
    source: str = ""
    sent: bytes = b""
    received: bytearray = field(default_factory=bytearray)
    deadline: float = 0.0
    connected: bool = False
    done_sending: bool = False
    close_at: float = 0.0
    opened: float = 0.0      # when it connected
    first_sent: float = 0.0  # when its first byte went


class Fuzzer:
    def __init__(self, port: int, seed: int = 0, concurrency: int = 100, hang_after: float = 5.0,
                 connect_timeout: float = 1.0, auth: bool = False):
        self.port = port
        self.seed = seed
        self.inputs = Inputs(port, seed, auth)
        self.concurrency = concurrency
        self.hang_after = hang_after
        self.connect_timeout = connect_timeout  # the broker's connect_timeout_ms, in seconds
        self.report = Report()

    def run(self, seconds: float, max_inputs: int = 0, tick=None) -> Report:
        sel = selectors.DefaultSelector()
        flights: dict[socket.socket, Flight] = {}
        start = time.monotonic()
        stop_at = start + seconds
        next_tick = start + 1.0
        report = self.report
        while True:
            now = time.monotonic()
            starting = now < stop_at and (not max_inputs or report.inputs < max_inputs)
            while starting and len(flights) < self.concurrency and (not max_inputs or report.inputs < max_inputs):
                self.launch(sel, flights, now)
            if not flights and not starting:
                break
            for key, mask in sel.select(0.05):
                sock = key.fileobj
                flight = flights.get(sock)
                if flight is not None:
                    self.serve(sel, flights, sock, flight, mask, now)
            now = time.monotonic()
            for sock, flight in list(flights.items()):
                if flight.close_at and now >= flight.close_at:
                    self.finish(sel, flights, sock, "connected")
                elif now >= flight.deadline:
                    report.hangs.append((flight.kind, flight.sent[:200]))
                    self.finish(sel, flights, sock, None)
            if tick is not None and now >= next_tick:
                next_tick = now + 1.0
                tick(report)
        report.seconds = time.monotonic() - start
        sel.close()
        return report

    def launch(self, sel, flights, now: float) -> None:
        kind, source, header, chunks = self.inputs.make()
        self.report.inputs += 1
        self.report.kinds[kind] = self.report.kinds.get(kind, 0) + 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_IP, BIND_ADDRESS_NO_PORT, 1)
        sock.bind((source, 0))
        opened = time.monotonic()  # (before: the broker accepts, and times it, after this)
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(err, f"cannot connect to the broker: {os.strerror(err)}")
        flights[sock] = Flight(kind, chunks, header, deadline=now + self.hang_after, opened=opened, source=source)
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def serve(self, sel, flights, sock, flight: Flight, mask: int, now: float) -> None:
        if mask & selectors.EVENT_WRITE:
            if flight.chunks:
                chunk = flight.chunks.pop(0)
                try:
                    before = time.monotonic()
                    sent = sock.send(chunk)
                    if sent and not flight.sent:
                        flight.first_sent = before
                    flight.sent += chunk[:sent]
                    if sent < len(chunk):
                        flight.chunks.insert(0, chunk[sent:])
                except (BlockingIOError, InterruptedError):
                    flight.chunks.insert(0, chunk)
                except OSError:
                    flight.chunks = []  # the broker closed it already: read what it said
            if not flight.chunks:
                sel.modify(sock, selectors.EVENT_READ)
                flight.deadline = now + self.hang_after
        if mask & selectors.EVENT_READ:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if data:
                flight.received += data
                if not flight.connected and b"CONNECTED\n" in flight.received:
                    flight.connected = True
                    flight.close_at = now + 0.05  # read a little more, then let it go
                return
            self.finish(sel, flights, sock, "closed")

    def finish(self, sel, flights, sock, how: str | None) -> None:
        flight = flights.pop(sock)
        sel.unregister(sock)
        sock.close()
        report = self.report
        if how is None:
            return  # a hang, counted by the caller
        if flight.connected:
            report.connected += 1
        elif flight.received:
            report.answered += 1
        else:
            report.silent += 1
        if self.inputs.auth and flight.header is not None and b'"passcode":"' in flight.received:
            self.inputs.learn(flight.source, bytes(flight.sent[:flight.header]), bytes(flight.received))
        why = self.judge(flight)
        if why is not None:
            report.bad_answers.append((flight.kind, why, flight.sent[:300], bytes(flight.received[:300])))

    def judge(self, flight: Flight) -> str | None:
        """What is wrong with the broker's answer to an HTTP request, or None."""
        if flight.header is None:
            return None  # refused without a word, or its bytes taken for what they look like: any close is right
        sent = flight.sent[flight.header:]
        got = bytes(flight.received)
        method, space, _ = sent[:8].partition(b" ")
        if not got or not space or method not in HTTP_METHODS:  # the reader's own test for HTTP
            return None
        if not got.startswith(b"HTTP/1.1 "):
            if got.startswith(b"ERROR\nmessage:connect timeout\n") and (
                    not flight.sent or flight.first_sent - flight.opened >= self.connect_timeout):
                self.report.late += 1  # it said nothing for the whole connect timeout: STOMP's, the port's own
                return None
            return "an HTTP request got a non-HTTP answer"  # (however late the reader read it)
        try:
            status = int(got[9:12])
        except ValueError:
            return "unreadable status line"
        self.report.statuses[status] = self.report.statuses.get(status, 0) + 1
        if status not in HTTP_STATUSES:
            return f"HTTP status {status}"
        head, sep, body = got.partition(b"\r\n\r\n")
        if not sep:
            return "HTTP head cut short"
        if status == 101:
            return self.judge_websocket(body)
        length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
        if len(length) != 1:
            return "no single Content-Length"
        if int(length[0].split(b":", 1)[1]) != len(body) and not sent.startswith(b"HEAD "):
            return f"body of {len(body)} bytes, Content-Length {int(length[0].split(b':', 1)[1])}"
        return None

    @staticmethod
    def judge_websocket(data: bytes) -> str | None:
        """Server frames must be well formed: unmasked, FIN set, known opcodes."""
        pos = 0
        while (parsed := parse_frame(data, pos)) is not None:
            fin, opcode, _, end = parsed
            if not fin or opcode not in (OP_TEXT, OP_BIN, OP_CLOSE, OP_PONG) or data[pos + 1] & 0x80:
                return f"server frame fin={fin} opcode={opcode} masked={bool(data[pos + 1] & 0x80)}"
            pos = end
        return None
