"""The frames of one read cross the input ring as one FRAMES record, walked by the dispatcher."""

from __future__ import annotations

import re
import socket

from inprocess import resources  # noqa: F401 (a fixture)
from stompbroker.ipc import records as R
from stompbroker.processes import dispatcher, reader
from stompbroker.protocol.stomp import FrameParser

READ = (b"CONNECT\naccept-version:1.2\nhost:/\n\n\0"
        b"SUBSCRIBE\nid:s\ndestination:/topic/a\nreceipt:r1\n\n\0\n"
        b"SEND\r\ndestination:/topic/a\r\ncontent-length:3\r\n\r\na\0b\0"
        b"SEND\ndestination:/topic/a\nreceipt:r2\n\nplain\0")


def read_once(config, res, data: bytes):
    r = reader.Reader(config, res)
    sock = socket.socket()
    try:
        conn = reader.Conn(7, sock.fileno(), FrameParser())
        r.stomp(conn, data, 1.0)
    finally:
        sock.close()
    return r


def output(d):
    # Session and message ids differ from one broker to the next; they are not what is compared.
    return [(kind, conn, re.sub(rb"(session|message-id):[^\n]*", rb"\1:-", payload))
            for kind, conn, _, _, payload in R.iter_records(bytes(d.outboxes[0].buf))]


def test_a_read_of_several_frames_is_one_record_that_counts_its_frames(resources):
    config, res = resources
    r = read_once(config, res, READ)
    (kind, conn, aux, stamp, payload), = R.iter_records(bytes(r.out))
    assert (kind, conn, aux, r.count) == (R.FRAMES, 7, 4, 4)  # the ring still counts frames
    assert stamp == R.stamp(1.0)
    sizes = R.frame_sizes(4).unpack_from(payload)
    parts, pos = [], 8 * 4
    for size in sizes:
        parts.append(payload[pos:pos + size])
        pos += size
    assert pos == len(payload)
    assert parts == [b"CONNECT\naccept-version:1.2\nhost:/", b"",
                     b"SUBSCRIBE\nid:s\ndestination:/topic/a\nreceipt:r1", b"",
                     b"SEND\ndestination:/topic/a\ncontent-length:3", b"a\0b",
                     b"SEND\ndestination:/topic/a\nreceipt:r2", b"plain"]


def test_a_lone_frame_stays_a_frame_record(resources):
    config, res = resources
    r = read_once(config, res, b"CONNECT\naccept-version:1.2\n\n\0")
    (kind, conn, aux, _, payload), = R.iter_records(bytes(r.out))
    assert (kind, conn, aux, payload) == (R.FRAME, 7, 26, b"CONNECT\naccept-version:1.2")


def test_the_dispatcher_does_with_one_record_what_it_does_with_one_per_frame(resources):
    config, res = resources
    frames = FrameParser().feed(READ)
    one_each = dispatcher.Dispatcher(config, res)
    one_each.handle(R.record(R.OPEN, 7, b"127.0.0.1:1"), 0.0)
    assert one_each.handle(b"".join(R.record(R.FRAME, 7, h + b, len(h), 5) for h, b in frames), 1.0)
    batched = dispatcher.Dispatcher(config, res)
    batched.handle(R.record(R.OPEN, 7, b"127.0.0.1:1"), 0.0)
    assert batched.handle(bytes(read_once(config, res, READ).out), 1.0)
    got = output(batched)
    assert got == output(one_each)
    assert [payload.split(b"\n", 1)[0] for _, _, payload in got] == [
        b"CONNECTED", b"RECEIPT", b"MESSAGE", b"MESSAGE", b"RECEIPT"]
    assert got[2][2].endswith(b"\n\na\0b\0")


def test_a_bug_on_one_frame_of_a_read_closes_that_connection_once(resources, monkeypatch):
    config, res = resources
    d = dispatcher.Dispatcher(config, res)
    d.handle(R.record(R.OPEN, 7, b"127.0.0.1:1"), 0.0)
    real = d.broker.on_frame

    def buggy(conn, head, body, now):
        if head.startswith(b"SUBSCRIBE"):
            raise RuntimeError("a bug")
        return real(conn, head, body, now)

    monkeypatch.setattr(d.broker, "on_frame", buggy)
    assert d.handle(bytes(read_once(config, res, READ).out), 1.0)
    out = output(d)
    assert [k for k, _, _ in out] == [R.DATA, R.DATA, R.CLOSE]  # CONNECTED, ERROR, close; the rest ignored
    assert out[1][2].startswith(b"ERROR\nmessage:internal error\n")
    assert d.broker.sessions[7].closing
