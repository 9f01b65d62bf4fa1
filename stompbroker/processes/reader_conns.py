"""The reader's plain data: one connection's state (``Conn``), what it speaks (``Mode``), and one
read on a plain connection's fd."""

from __future__ import annotations

import enum
import os
import struct

from ..protocol.stomp import FrameParser

READ_SIZE = 65536
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


class Mode(enum.IntEnum):
    """What a connection speaks, decided by its first bytes (a few comparisons per read, not per byte)."""
    NEW = 0        # nothing read yet
    STOMP = 1      # raw STOMP frames
    HTTP = 2       # an HTTP request head is being read (upgrade, health check, console)
    WEBSOCKET = 3  # STOMP inside WebSocket messages
    DEAD = 4       # an ERROR or close is on its way: read and ignore until the writer hangs up
    PROXY = 5      # a trusted proxy's connection: its PROXY header (protocol/proxy.py) is being read


NEW, STOMP, HTTP, WEBSOCKET, DEAD, PROXY = Mode.NEW, Mode.STOMP, Mode.HTTP, Mode.WEBSOCKET, Mode.DEAD, Mode.PROXY


class Conn:
    # (its writer is told by its id: Reader.writer_of; what it sent after its answer and close were
    # on their way is counted in Reader.dropping: an idle connection keeps no slot for them)
    __slots__ = ("id", "fd", "mode", "parser", "buf", "ws", "last_alive", "tls", "greeted", "held")

    def __init__(self, conn_id: int, fd: int, parser: FrameParser | None = None):
        self.id = conn_id
        # A bare fd, -1 once closed: a socket object would cost 100 bytes per idle connection. A TLS
        # connection's socket (the ssl module reads it) is its TlsLink's ``sock``.
        self.fd = fd
        self.mode = NEW
        self.parser = parser    # only while it holds an unfinished frame (see Framing.feed)
        self.buf = b""          # bytes of an HTTP request head, a PROXY header or an undecided first word
        self.ws = None          # WsDecoder once upgraded
        self.last_alive = 0.0
        self.tls = None         # TlsLink for connections on ssl_port (reader_tls.py)
        self.greeted = False    # a whole STOMP frame (its CONNECT) came: the full frame size applies
        self.held = 0           # bytes of unfinished frames counted in Reader.partial


def receive(fd: int) -> bytes | None:
    """What one read gives: bytes, b"" at the end of the stream (or on an error), None if nothing yet."""
    try:
        return os.read(fd, READ_SIZE)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""
