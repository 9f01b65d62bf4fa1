"""A tiny raw-socket STOMP helper for byte-level tests (no client library in the way)."""

from __future__ import annotations

import socket
import time


class Wire:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

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
            self.buf += chunk

    def _parse(self):
        buf = self.buf
        pos = 0
        while pos < len(buf) and buf[pos] in b"\r\n":
            pos += 1
        end = buf.find(b"\n\n", pos)
        if end < 0:
            del buf[:pos]
            return None
        lines = buf[pos:end].decode().split("\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.setdefault(k, v)
        start = end + 2
        if "content-length" in headers:
            stop = start + int(headers["content-length"])
            if len(buf) <= stop:
                return None
            assert buf[stop:stop + 1] == b"\0"
        else:
            stop = buf.find(b"\0", start)
            if stop < 0:
                return None
        body = bytes(buf[start:stop])
        del buf[:stop + 1]  # bytearray: one move per frame, not a copy of the whole rest
        return lines[0], headers, body

    def expect_closed(self, timeout: float = 5.0) -> None:
        """The broker closes the connection (after any frames already read)."""
        self.sock.settimeout(timeout)
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()
