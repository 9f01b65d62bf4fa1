"""Inputs that kill the dispatcher: noted while it handles them, quarantined once one kills it twice.

A fault that kills the dispatcher outright (a crash in C code, the kernel's OOM killer, an error
outside the guard around each input) restarts every process, since the dispatcher holds all broker
state. If the same input comes back (a client retries its frame, a scraper its request, the store
its message at recovery) the broker would die again, and again: a crash loop. So:

- the dispatcher keeps a ``Note`` in shared memory of what it is handling: a record of the input
  ring (whose bytes the ring keeps until the dispatcher is done with them: ``Ring.read(hold=True)``)
  and, inside a record of several frames, which frame; or the stored message it is loading;
- when the dispatcher dies, the supervisor reads the note and the held bytes (``suspect``), names
  the input in its log and counts the deaths per input (``Deaths``); an input that killed it twice
  is quarantined: the next dispatcher refuses that frame (an ERROR with its receipt-id) or HTTP
  request (a 500), compared without its ``receipt`` header, and moves that stored message to the
  store's quarantine table (``stompbroker-store export --quarantined`` shows it, ``release`` puts
  it back).

A death while handling anything else (a tick, a connection closing, the writers' counts) is
logged but not attributed to an input. For tests, ``STOMPBROKER_FAULT_DIE_ON=<text>`` makes the
dispatcher kill itself (SIGKILL, as the OOM killer would) on a frame or a stored message whose body
holds that text, or an HTTP request whose target does: no input kills it otherwise, and the machinery must be shown to work.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal

from ..ipc import records as R
from ..ipc.ring import anonymous_segment

log = logging.getLogger("stompbroker.supervisor")

# Note slots (u64), written by the dispatcher only
WHAT, BLOB, RECORD, FRAME, ROW = range(5)
IDLE, INPUT, LOADING = 0, 1, 2   # WHAT: nothing noted, a record of the held input blob, a stored message
DEATHS_TO_QUARANTINE = 2
LOGGED = 200


class Note:
    """What the dispatcher is handling, in shared memory the supervisor reads after its death."""

    def __init__(self):
        self._shm = anonymous_segment(8 * 8)
        # the dispatcher's input loops write BLOB, WHAT (INPUT, IDLE), RECORD and FRAME here directly:
        # a store each, no call
        self.slots = self._shm.buf.cast("Q")

    def loading(self, seq: int) -> None:
        self.slots[ROW] = seq
        self.slots[WHAT] = LOADING

    def idle(self) -> None:
        self.slots[WHAT] = IDLE

    def close(self) -> None:
        self.slots.release()
        self._shm.close()


def frame_key(head: bytes, body: bytes) -> bytes:
    """A frame's identity for quarantine: its bytes without its receipt (a client that sends the same
    frame again after a reconnection may ask for another receipt)."""
    if b"\nreceipt:" in head:
        head = b"\n".join(line for line in head.split(b"\n") if not line.startswith(b"receipt:"))
    return b"F" + hashlib.blake2b(head + b"\0" + body, digest_size=16).digest()


def request_key(payload: bytes) -> bytes:
    return b"H" + hashlib.blake2b(payload, digest_size=16).digest()


def describe_frame(head: bytes, body: bytes, conn: int) -> str:
    lines = head.split(b"\n")
    destination = next((line[12:] for line in lines[1:] if line.startswith(b"destination:")), b"")
    text = lines[0][:32].decode(errors="replace") + " frame"
    if destination:
        text += " to " + destination[:LOGGED].decode(errors="replace")
    return f"{text} ({len(head) + len(body)} bytes, connection {conn})"


def suspect(note: Note, ring) -> tuple[bytes | int | None, str]:
    """(key, description) of what the dead dispatcher was handling: a frame's or HTTP request's
    key (bytes), a stored message's seq (int), or None when it was nothing to quarantine."""
    slots = note.slots
    what = slots[WHAT]
    if what == LOADING:
        return int(slots[ROW]), f"stored message {slots[ROW]} (while loading the store)"
    if what != INPUT:
        return None, "no input (between inputs: a tick, a store commit, the writers' counts)"
    blob = ring.peek(slots[BLOB])
    pos = slots[RECORD]
    if len(blob) != slots[BLOB] or pos + R.HEADER_SIZE > len(blob):
        return None, "an input record no longer readable"
    length, kind, conn, aux, _ = R.unpack_header(blob, pos)
    start, stop = pos + R.HEADER_SIZE, pos + length
    if kind == R.FRAME:
        head, body = blob[start:start + aux], blob[start + aux:stop]
    elif kind == R.FRAMES:
        index = slots[FRAME] >> 1  # (the dispatcher writes twice the index: its loop's counter)
        if index >= aux:
            return None, "an input record no longer readable"
        sizes = R.frame_sizes(aux).unpack_from(blob, start)
        at = start + R.FRAME_SIZE * 2 * aux + sum(sizes[:2 * index])
        head, body = blob[at:at + sizes[2 * index]], blob[at + sizes[2 * index]:at + sizes[2 * index] + sizes[2 * index + 1]]
    elif kind == R.HTTP_REQUEST:
        method, target = blob[start:stop].split(b"\0")[:2]
        return request_key(blob[start:stop]), (f"HTTP {method[:16].decode(errors='replace')} "
                                               f"{target[:LOGGED].decode(errors='replace')} (connection {conn})")
    else:
        return None, f"a {R.Kind(kind).name} record (connection {conn})"
    return frame_key(head, body), describe_frame(head, body, conn)


class Deaths:
    """The supervisor's count of dispatcher deaths per input, and the quarantine it hands on (the
    next dispatcher is forked with ``quarantine``: {key or seq: description})."""

    def __init__(self):
        self.counts: dict = {}
        self.quarantine: dict = {}

    def died(self, note: Note, ring) -> bool:
        """Read the note after a death; log it; True when the input is now quarantined."""
        key, text = suspect(note, ring)
        note.idle()
        if key is None:
            log.error("the dispatcher died handling %s", text)
            return False
        count = self.counts[key] = self.counts.get(key, 0) + 1
        if count < DEATHS_TO_QUARANTINE:
            log.error("the dispatcher died handling %s", text)
            return False
        self.quarantine[key] = text
        if isinstance(key, int):
            log.error("the dispatcher died %d times loading %s: it goes to the store's quarantine table "
                      "(stompbroker-store export --quarantined; docs/reliability.md)", count, text)
        else:
            log.error("the dispatcher died %d times handling %s: it is quarantined, the same input is refused "
                      "from now on (docs/reliability.md)", count, text)
        return True


class Refusals:
    """The dispatcher's side of a quarantine: is this frame or request one that killed it twice?"""

    def __init__(self, quarantine: dict):
        self.inputs = {key: text for key, text in quarantine.items() if isinstance(key, bytes)}
        self.rows = sorted(key for key in quarantine if isinstance(key, int))

    def frame(self, head: bytes, body: bytes) -> bool:
        return frame_key(head, body) in self.inputs

    def request(self, payload: bytes) -> bool:
        return request_key(payload) in self.inputs


def die_on(marker: bytes, on_frame):
    """The test fault: ``on_frame`` that kills its process on a frame whose body holds ``marker``."""
    def dying(conn, head, body, now):
        if marker in body:
            die()
        return on_frame(conn, head, body, now)
    return dying


def die_on_request(marker: bytes, http_request):
    """The test fault for HTTP: ``http_request`` that kills its process on a request holding ``marker``."""
    def dying(conn, payload, now):
        if marker in payload:
            die()
        return http_request(conn, payload, now)
    return dying


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fault_marker() -> bytes | None:
    marker = os.environ.get("STOMPBROKER_FAULT_DIE_ON")
    return marker.encode() if marker else None
