"""A tiny raw-socket STOMP helper for byte-level tests: frames go out exactly as written (no
escaping, no content-length added), frames in are split by the project's one client parser
(``stompbroker.tools.client.FrameReader``) and returned with their headers as sent."""

from __future__ import annotations

import socket
import time

from stompbroker.tools.client import FrameReader, decode


class Wire:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._reader = FrameReader()

    @property
    def buf(self) -> bytearray:
        """What was received and not yet read as frames (tests may read the rest themselves)."""
        return bytearray(self._reader.unread())

    @buf.setter
    def buf(self, data) -> None:
        self._reader = FrameReader(bytes(data))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self, command: str, headers: dict | None = None, body: bytes = b"") -> None:
        lines = [command] + [f"{k}:{v}" for k, v in (headers or {}).items()]
        self.send(("\n".join(lines) + "\n\n").encode() + body + b"\0")

    def connect(self, version: str = "1.2", **headers) -> dict:
        self.frame("CONNECT", {"accept-version": version, "host": "localhost", **headers})
        frame = self.read()
        assert frame[0] == "CONNECTED", frame
        return frame[1]

    def read(self, timeout: float = 5.0) -> tuple[str, dict, bytes]:
        """Next frame as (command, headers, body); heart-beat EOLs are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._parse()
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete frame; buffered {self.buf[:200]!r}")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"closed by the broker; buffered {self.buf[:200]!r}")
            self._reader.feed(chunk)

    def _parse(self) -> tuple[str, dict, bytes] | None:
        """The next frame already received, or None."""
        raw = self._reader.next()
        if raw is None:
            return None
        frame = decode(*raw)
        return frame.command, frame.headers, frame.body

    def expect_closed(self, timeout: float = 5.0) -> None:
        """The broker closes the connection (after any frames already read)."""
        self.sock.settimeout(timeout)
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return
            self._reader.feed(chunk)

    def close(self) -> None:
        self.sock.close()


def connected(broker, version: str = "1.2") -> Wire:
    """A new connection to ``broker`` that has sent CONNECT and read CONNECTED."""
    w = Wire(broker.connect())
    w.connect(version)
    return w


def subscribe(w: Wire, dest: str, sub_id: str = "s", **headers) -> None:
    """SUBSCRIBE with a receipt, and wait for it."""
    w.frame("SUBSCRIBE", {"id": sub_id, "destination": dest, "receipt": f"sub-{sub_id}", **headers})
    assert w.read()[:2] == ("RECEIPT", {"receipt-id": f"sub-{sub_id}"})


def drain(w: Wire, timeout: float = 0.5) -> list:
    """Every frame that arrives until ``timeout`` s pass with none."""
    frames = []
    while True:
        try:
            frames.append(w.read(timeout))
        except TimeoutError:
            return frames
