"""Messages on the supervisor's control pipe to the reader: fixed-size binary, one definition.

Each message is 8 bytes (a kind and an argument). A pipe write of at most PIPE_BUF bytes is atomic,
and readers read multiples of 8, so a read never splits one.
"""

from __future__ import annotations

import enum
import struct

MESSAGE = struct.Struct("<II")  # kind, argument
READ_SIZE = MESSAGE.size * 512


class Control(enum.IntEnum):
    STOP = 1              # stop accepting and reading; tell the dispatcher (SHUTDOWN)
    WRITER_RESTARTED = 2  # argument: the writer's index; its connections are gone, close them


def encode(kind: Control, argument: int = 0) -> bytes:
    return MESSAGE.pack(kind, argument)


def decode(data: bytes) -> list[tuple[Control, int]]:
    """The messages in what one read returned, in order."""
    return [(Control(kind), argument) for kind, argument in MESSAGE.iter_unpack(data)]
