"""The names of internal wire values: record kinds, control messages, WebSocket opcodes and close codes."""

from __future__ import annotations

import os

import pytest

from stompbroker.ipc import control, records as R
from stompbroker.ipc.control import Control
from stompbroker.protocol import websocket as ws


def test_record_kinds_are_plain_ints_named_by_one_enum():
    # The loops compare kinds with module-level ints (fast); Kind names them, with the same values.
    assert len({int(k) for k in R.Kind}) == len(R.Kind) and all(0 < k < 256 for k in R.Kind)
    for kind in R.Kind:
        assert type(getattr(R, kind.name)) is int and getattr(R, kind.name) == kind
    (decoded,) = R.iter_records(R.record(R.DATA, 7, b"x"))
    assert R.Kind(decoded[0]) is R.Kind.DATA


def test_record_kind_values_stay_as_they_were():
    # Records cross process boundaries: a kind never changes its number.
    assert [(k.name, k.value) for k in R.Kind] == [
        ("OPEN", 1), ("FRAME", 2), ("CLOSED", 3), ("ALIVE", 4), ("BAD_FRAME", 5), ("HTTP", 6), ("WS_OPEN", 7),
        ("WS_REPLY", 8), ("WS_CLOSE", 9), ("SHUTDOWN", 10), ("HTTP_REQUEST", 11), ("READER_START", 12), ("FRAMES", 13),
        ("PEER", 14), ("STOMP", 15),
        ("DATA", 20), ("RAW", 21), ("WS_ON", 22), ("CLOSE", 23), ("HEARTBEAT", 24), ("STOP", 25), ("RESET", 26),
        ("DATA_EACH", 27)]


def test_control_messages_round_trip_through_a_pipe():
    r, w = os.pipe()
    try:
        for index in range(100):
            os.write(w, control.encode(Control.WRITER_RESTARTED, index))
        os.write(w, control.encode(Control.STOP))
        got = control.decode(os.read(r, control.READ_SIZE))
    finally:
        os.close(r)
        os.close(w)
    assert got == [(Control.WRITER_RESTARTED, i) for i in range(100)] + [(Control.STOP, 0)]
    assert control.READ_SIZE % control.MESSAGE.size == 0   # a read never splits a message


def test_an_unknown_control_message_is_refused():
    with pytest.raises(ValueError):
        control.decode(control.MESSAGE.pack(99, 0))


def test_websocket_opcodes_and_close_codes():
    assert [ws.OP_CONT, ws.OP_TEXT, ws.OP_BIN, ws.OP_CLOSE, ws.OP_PING, ws.OP_PONG] == [0, 1, 2, 8, 9, 10]
    assert all(type(op) is int for op in (ws.OP_CONT, ws.OP_TEXT, ws.OP_BIN, ws.OP_CLOSE, ws.OP_PING, ws.OP_PONG))
    assert ws.encode_close() == b"\x88\x02\x03\xe8"
    assert ws.encode_close(ws.CloseCode.PROTOCOL_ERROR, "x") == b"\x88\x03\x03\xeax"
    decoder = ws.WsDecoder(max_message_size=10)
    frame = bytes((0x81, 0x80 | 11)) + b"\0\0\0\0" + b"a" * 11   # masked with a zero key
    with pytest.raises(ws.WsProtocolError) as caught:
        decoder.feed(frame)
    assert caught.value.code == ws.CloseCode.MESSAGE_TOO_BIG == 1009
    assert str(caught.value).startswith("1009 ")


def test_websocket_events_are_named_and_equal_to_their_text():
    decoder = ws.WsDecoder()
    masked = ws.mask_bytes(b"hi", b"\1\2\3\4")
    events = decoder.feed(bytes((0x81, 0x82)) + b"\1\2\3\4" + masked + bytes((0x89, 0x80)) + b"\0\0\0\0"
                          + bytes((0x88, 0x80)) + b"\0\0\0\0")
    assert events == [("message", b"hi", True), ("ping", b""), ("close", None, "")]
    assert [e[0] for e in events] == [ws.WsEvent.MESSAGE, ws.WsEvent.PING, ws.WsEvent.CLOSE]
    assert all(type(e[0]) is ws.WsEvent for e in events)
