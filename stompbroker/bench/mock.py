"""A trivial STOMP "broker" used to measure the load generator's own ceiling (``--ceiling``).

One process, one epoll loop, no routing. Modes:

* ``sink``: answers CONNECT (and SUBSCRIBE receipts), then reads and throws away everything a
  producer sends: how fast can one producer process push SEND frames?
* ``source``: once a connection has subscribed and the run has started, streams pre-rendered
  MESSAGE frames (WebSocket-framed on WebSocket connections) as fast as the socket takes them:
  how fast can the consumer processes count deliveries?
* ``relay``: forwards what producers send, byte for byte (SEND frames included), to every
  subscribed connection (TCP only): the latency floor of the generator and the kernel.

Run it from the generator (``serve()`` in a forked process) or alone:
``python -m stompbroker.bench.mock source`` prints ``mock listening on 127.0.0.1:PORT``.
"""

from __future__ import annotations

import base64
import hashlib
import selectors
import socket
import sys
import time

from .wire import OP_CLOSE, OP_PING, OP_PONG, StompReader, make_body, parse_ws_frame, stomp_frame, ws_frame

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
BATCH_BYTES = 256 * 1024


class Conn:
    __slots__ = ("sock", "buf", "stomp", "ws", "phase", "subscribed", "out", "off", "bytes_in", "frames_out")

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()   # bytes not yet given to the STOMP reader (HTTP, WebSocket framing)
        self.stomp = StompReader()
        self.ws = False
        self.phase = "new"       # new -> control -> stream (sink/relay after the first SEND)
        self.subscribed = False
        self.out = b""
        self.off = 0
        self.bytes_in = 0
        self.frames_out = 0


class Mock:
    def __init__(self, mode: str, size: int = 117, host: str = "127.0.0.1", port: int = 0, start_at=None):
        self.mode = mode
        self.size = size
        self.listener = socket.create_server((host, port), backlog=1024)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.start_at = start_at          # a shared value: monotonic time the source may start, or 0
        self.conns: dict[int, Conn] = {}
        self.subscribers: list[Conn] = []
        body = make_body(size)
        msg = stomp_frame("MESSAGE", [("subscription", "0"), ("message-id", "mock-1234567"),
                                      ("destination", "/topic/bench-mock")], body)
        per = max(BATCH_BYTES // len(msg), 1)
        self.batch_tcp = msg * per
        self.batch_ws = ws_frame(msg, masked=False) * per
        self.per_batch = per

    # -- loop --------------------------------------------------------------------------------
    def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for key, events in self.sel.select(0.05):
                if key.data is None:
                    self.accept()
                    continue
                c = key.data
                if events & selectors.EVENT_READ:
                    self.read(c)
                if events & selectors.EVENT_WRITE and c.sock is not None:
                    self.write(c)
            if self.mode == "source":
                self.maybe_start()

    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = Conn(sock)
            self.conns[sock.fileno()] = c
            self.sel.register(sock, selectors.EVENT_READ, c)

    def close(self, c: Conn) -> None:
        if c.sock is None:
            return
        self.sel.unregister(c.sock)
        self.conns.pop(c.sock.fileno(), None)
        c.sock.close()
        c.sock = None
        if c in self.subscribers:
            self.subscribers.remove(c)

    def read(self, c: Conn) -> None:
        try:
            data = c.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close(c)
            return
        c.bytes_in += len(data)
        if c.phase == "stream":
            if self.mode == "relay":
                self.relay(data)
            return  # sink: thrown away
        c.buf += data
        if c.phase == "new":
            if c.buf.startswith(b"GET "):
                end = c.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(c.buf[:end]).decode("latin-1")
                del c.buf[:end + 4]
                key = ""
                for line in head.split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "sec-websocket-key":
                        key = value.strip()
                accept = base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()
                c.sock.sendall((f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: v12.stomp\r\n\r\n").encode())
                c.ws = True
            c.phase = "control"
        self.control(c)

    def control(self, c: Conn) -> None:
        """Answer the frames before the first SEND; from the first SEND on, the connection streams."""
        if not c.ws:
            data, c.buf = bytes(c.buf), bytearray()
            self.frames(c, c.stomp.feed(data), b"")
            return
        while c.phase == "control":
            parsed = parse_ws_frame(c.buf)
            if parsed is None:
                return
            _, opcode, payload, pos = parsed
            raw_frame = bytes(c.buf[:pos])
            del c.buf[:pos]
            if opcode == OP_CLOSE:
                self.close(c)
                return
            if opcode not in (OP_PING, OP_PONG):
                self.frames(c, c.stomp.feed(payload), raw_frame)

    def frames(self, c: Conn, frames: list, raw: bytes) -> None:
        """Answer control frames; a SEND switches to streaming, and a relay forwards it and what
        follows (on WebSocket ``raw`` is the SEND's WebSocket frame, forwarded as it came)."""
        for i, (command, headers, body) in enumerate(frames):
            if command in ("CONNECT", "STOMP"):
                self.reply(c, stomp_frame("CONNECTED", [("version", "1.2"), ("heart-beat", "0,0"),
                                                       ("server", "bench-mock")]))
            elif command == "SUBSCRIBE":
                if "receipt" in headers:
                    self.reply(c, stomp_frame("RECEIPT", [("receipt-id", headers["receipt"])]))
                if not c.subscribed:
                    c.subscribed = True
                    self.subscribers.append(c)
            elif command == "SEND":
                if "receipt" in headers:
                    self.reply(c, stomp_frame("RECEIPT", [("receipt-id", headers["receipt"])]))
                c.phase = "stream"
                rest = bytes(c.buf)
                c.buf = bytearray()
                if self.mode == "relay":
                    sends = raw or b"".join(stomp_frame(*f) for f in frames[i:]) + c.stomp.partial()
                    self.relay(sends + rest)
                return
            elif "receipt" in headers:
                self.reply(c, stomp_frame("RECEIPT", [("receipt-id", headers["receipt"])]))

    def reply(self, c: Conn, frame: bytes) -> None:
        c.sock.setblocking(True)
        c.sock.sendall(ws_frame(frame, masked=False) if c.ws else frame)
        c.sock.setblocking(False)

    # -- relay -------------------------------------------------------------------------------
    def relay(self, data: bytes) -> None:
        for s in list(self.subscribers):
            if s.ws:
                continue  # relay forwards raw client bytes: TCP subscribers only
            try:
                s.sock.setblocking(True)
                s.sock.sendall(data)
                s.sock.setblocking(False)
            except OSError:
                self.close(s)

    # -- source ------------------------------------------------------------------------------
    def maybe_start(self) -> None:
        started = self.start_at is None or (self.start_at.value and time.monotonic() >= self.start_at.value)
        if not started:
            return
        for c in self.subscribers:
            if not c.out:
                c.out = self.batch_ws if c.ws else self.batch_tcp
                c.off = 0
                self.sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def write(self, c: Conn) -> None:
        if not c.out:
            return
        view = memoryview(c.out)
        for _ in range(8):
            try:
                sent = c.sock.send(view[c.off:])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.close(c)
                return
            c.off += sent
            if c.off >= len(c.out):
                c.off = 0
                c.frames_out += self.per_batch


def serve(mode: str, size: int, port_pipe, start_at, deadline: float) -> None:
    """Entry point of a forked process: report the port through port_pipe, serve until deadline."""
    try:
        from setproctitle import setproctitle
        setproctitle(f"bench: mock-{mode}")
    except ImportError:
        pass
    mock = Mock(mode, size, start_at=start_at)
    port_pipe.send(mock.port)
    port_pipe.close()
    mock.run(deadline)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "sink"
    m = Mock(mode, port=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(f"mock listening on 127.0.0.1:{m.port}", flush=True)
    m.run(time.monotonic() + 3600)
