"""The client side of the wire: frames the project's clients send are what the broker's decoder
accepts, and what the broker's encoder writes is what the clients read."""

from __future__ import annotations

import pytest

from stompbroker.protocol.stomp import render_frame
from stompbroker.protocol.websocket import (OP_BIN, OP_CLOSE, OP_TEXT, WsDecoder, WsEvent, encode_client_frame,
                                            encode_frame, parse_frame)
from stompbroker.tools.client import FrameReader, decode, parse_frames


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 300_000])
def test_client_frames_decode_on_the_broker_and_server_frames_on_the_client(size):
    payload = bytes(i % 251 for i in range(size))
    events = WsDecoder(max_message_size=1 << 20).feed(encode_client_frame(payload, OP_BIN))
    assert events == [(WsEvent.MESSAGE, payload, False)]
    frame = encode_frame(payload, OP_BIN)
    assert parse_frame(frame[:-1] if size else frame[:1]) is None
    assert parse_frame(frame) == (True, OP_BIN, payload, len(frame))
    assert parse_frame(b"xx" + encode_client_frame(payload, key=b"abcd"), 2)[2] == payload


def test_fragments_and_bad_frames_for_hostile_tests():
    first = encode_client_frame(b"hel", OP_TEXT, fin=False)
    rest = encode_client_frame(b"lo", 0)
    assert WsDecoder().feed(first + rest) == [(WsEvent.MESSAGE, b"hello", True)]
    assert encode_client_frame(b"x", masked=False) == b"\x81\x01x"
    assert encode_client_frame(b"", OP_CLOSE, rsv=4, key=b"\0\0\0\0")[0] == 0x80 | 0x40 | OP_CLOSE


def test_reader_returns_frames_and_gives_back_what_it_has_not_returned():
    stream = (b"\n" + render_frame("MESSAGE", {"a": "1"}, b"x\0y") + b"\r\n"
              + render_frame("RECEIPT", {"receipt-id": "r"}) + b"ERROR\nmessage:cut")
    reader = FrameReader()
    for i in range(len(stream)):  # byte by byte
        reader.feed(stream[i:i + 1])
    head, body = reader.next()
    assert decode(head, body).headers == {"a": "1", "content-length": "3"} and body == b"x\0y"
    assert reader.unread() == render_frame("RECEIPT", {"receipt-id": "r"}) + b"ERROR\nmessage:cut"
    assert reader.next()[0] == b"RECEIPT\nreceipt-id:r"
    assert reader.next() is None and reader.partial


def test_headers_are_unescaped_only_when_asked_and_leniently():
    head = b"MESSAGE\nk\\cey:a\\nb\\x"
    assert decode(head, b"").headers == {"k\\cey": "a\\nb\\x"}
    assert decode(head, b"", unescaped=True).headers == {"k:ey": "a\nb\\x"}  # \x kept: shown, not refused


def test_parse_frames_is_strict_unless_the_tail_may_be_cut():
    whole = render_frame("MESSAGE", {}, b"abc")
    assert parse_frames(whole + whole) == [("MESSAGE", {"content-length": "3"}, b"abc")] * 2
    assert parse_frames(whole + whole[:-2], cut_tail=True) == [("MESSAGE", {"content-length": "3"}, b"abc")]
    with pytest.raises(ValueError, match="unfinished"):
        parse_frames(whole + whole[:-2])
    with pytest.raises(ValueError, match="missing NUL"):
        parse_frames(whole[:-1] + b"ERROR\n\n\0")
