"""What killed the dispatcher (processes/poison.py): the note it keeps, the input the supervisor reads
back from the held ring, the count of deaths per input and what the next dispatcher refuses."""

from __future__ import annotations

import pytest

from stompbroker.ipc import records as R
from stompbroker.ipc.ring import Ring
from stompbroker.processes import poison


@pytest.fixture
def ring_and_note():
    ring, note = Ring(1 << 16), poison.Note()
    yield ring, note
    ring.close()
    note.close()


def frames_record(conn: int, frames: list) -> bytes:
    parts = [part for frame in frames for part in frame]
    sizes = R.frame_sizes(len(frames)).pack(*map(len, parts))
    return R.record(R.FRAMES, conn, sizes + b"".join(parts), len(frames))


def noting(note, blob: bytes) -> None:
    """What the dispatcher's loop writes before it handles a blob."""
    note.slots[poison.BLOB] = len(blob)
    note.slots[poison.WHAT] = poison.INPUT


def test_the_supervisor_reads_back_the_frame_being_handled(ring_and_note):
    ring, note = ring_and_note
    first = R.record(R.OPEN, 7, b"127.0.0.1:5000", 0)
    frame = R.record(R.FRAME, 7, b"SEND\ndestination:/queue/a\nreceipt:r1" + b"body", 36)
    several = frames_record(8, [(b"SEND\ndestination:/queue/b", b"one"), (b"SEND\ndestination:/queue/c", b"two")])
    assert ring.try_write(first + frame, 2) and ring.try_write(several, 2)
    blob = ring.read(1 << 16, hold=True)          # the dispatcher's read
    noting(note, blob)
    note.slots[poison.RECORD] = len(first)        # handling the FRAME
    key, text = poison.suspect(note, ring)
    assert key == poison.frame_key(b"SEND\ndestination:/queue/a", b"body")  # the receipt does not count
    assert text == "SEND frame to /queue/a (40 bytes, connection 7)"
    note.slots[poison.RECORD] = len(first) + len(frame)
    note.slots[poison.FRAME] = 2                  # the second frame of the FRAMES record (twice its index)
    key, text = poison.suspect(note, ring)
    assert key == poison.frame_key(b"SEND\ndestination:/queue/c", b"two") and "/queue/c" in text
    note.slots[poison.RECORD] = 0                 # an OPEN: nothing to quarantine
    assert poison.suspect(note, ring)[0] is None
    note.idle()
    assert poison.suspect(note, ring)[0] is None


def test_two_deaths_on_one_input_quarantine_it(ring_and_note):
    ring, note = ring_and_note
    request = R.record(R.HTTP_REQUEST, 3, b"GET\0/metrics\0\0text/plain")
    deaths = poison.Deaths()
    for death in range(2):
        assert ring.try_write(request, 1)
        noting(note, ring.read(1 << 16, hold=True))
        note.slots[poison.RECORD] = 0
        assert deaths.died(note, ring) is (death == 1)
        ring.reset()
    note.loading(42)
    assert not deaths.died(note, ring)
    note.loading(42)
    assert deaths.died(note, ring)
    refusals = poison.Refusals(deaths.quarantine)
    assert refusals.rows == [42]
    assert refusals.request(b"GET\0/metrics\0\0text/plain") and not refusals.request(b"GET\0/\0\0")
    assert deaths.quarantine[42] == "stored message 42 (while loading the store)"


def test_a_frame_is_known_again_with_another_receipt():
    refusals = poison.Refusals({poison.frame_key(b"SEND\ndestination:/q\nreceipt:a", b"x"): "SEND"})
    assert refusals.frame(b"SEND\ndestination:/q\nreceipt:zz", b"x")
    assert refusals.frame(b"SEND\ndestination:/q", b"x")
    assert not refusals.frame(b"SEND\ndestination:/q", b"y")
