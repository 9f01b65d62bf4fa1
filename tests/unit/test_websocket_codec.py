"""Unit tests for the sans-IO WebSocket codec (stompbroker.protocol.websocket)."""

import base64
import hashlib
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.protocol.websocket import (
    OP_BIN, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT,
    HandshakeError, WsDecoder, WsProtocolError,
    encode_close, encode_frame, encode_message, handshake_response, message_header,
    http_response, mask_bytes, parse_http_request,
)

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # the RFC 6455 section 1.3 sample


def request_bytes(extra=(), drop=(), path="/ws", first_line=None):
    headers = {
        "Host": "localhost:61613",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": KEY,
        "Sec-WebSocket-Version": "13",
    }
    for name in drop:
        del headers[name]
    lines = [first_line or f"GET {path} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def handshake(raw, **kw):
    request, consumed = parse_http_request(raw, 8192)
    assert consumed == len(raw)
    return handshake_response(request, **kw)


def handshake_status(raw, **kw):
    with pytest.raises(HandshakeError) as info:
        handshake(raw, **kw)
    return info.value.status


def client_frame(payload, opcode=OP_TEXT, fin=True, key=None, masked=True, rsv=0, length_bytes=None):
    """Build a client frame; length_bytes forces the 7/16/64-bit length form."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv | opcode
    m = 0x80 if masked else 0
    if length_bytes is None:
        length_bytes = 0 if n < 126 else 2 if n < 65536 else 8
    if length_bytes == 0:
        head = bytes((b0, m | n))
    elif length_bytes == 2:
        head = bytes((b0, m | 126)) + struct.pack("!H", n)
    else:
        head = bytes((b0, m | 127)) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    key = key or os.urandom(4)
    return head + key + mask_bytes(payload, key)


def feed_bytewise(dec, data):
    events = []
    for i in range(len(data)):
        events += dec.feed(data[i:i + 1])
    return events


def ws_error(data, **kw):
    with pytest.raises(WsProtocolError) as info:
        WsDecoder(**kw).feed(data)
    return info.value.code


# ---------------------------------------------------------------- handshake

def test_rfc6455_sample_key():
    response, proto = handshake(request_bytes())
    assert b"HTTP/1.1 101 Switching Protocols\r\n" in response
    assert b"\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in response
    assert response.endswith(b"\r\n\r\n")
    assert proto is None and b"Sec-WebSocket-Protocol" not in response


def test_parse_request_fields_and_leftover():
    raw = request_bytes(path="/ws?x=1", extra=[("X-Twice", " first "), ("x-twice", "second")])
    request, consumed = parse_http_request(raw + b"\x81\x80", 8192)
    assert consumed == len(raw)  # frame bytes after the head are left to the caller
    assert (request["method"], request["path"], request["version"]) == ("GET", "/ws?x=1", "HTTP/1.1")
    assert request["headers"]["x-twice"] == "first"  # first wins, stripped
    assert request["headers"]["sec-websocket-key"] == KEY


def test_request_split_into_one_byte_pieces():
    raw = request_bytes()
    for i in range(len(raw)):
        assert parse_http_request(raw[:i], 8192) is None
    assert parse_http_request(raw, 8192)[1] == len(raw)


def test_header_names_case_insensitive():
    raw = (b"GET / HTTP/1.1\r\nHOST: x\r\nuPgRaDe: WebSocket\r\nCONNECTION: keep-alive, Upgrade\r\n"
           b"sec-websocket-key: " + KEY.encode() + b"\r\nSEC-WEBSOCKET-VERSION: 13\r\n\r\n")
    assert b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in handshake(raw)[0]


@pytest.mark.parametrize("raw", [
    b"GET /\r\n\r\n",                                   # no version
    b"GET  / HTTP/1.1\r\n\r\n",                         # double space
    b"GET / HTTP/1.1\r\nNo-Colon\r\n\r\n",
    b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",              # space before colon
    b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",       # obsolete line folding
    b"GET / HTTP/1.1\r\nA: b\nc\r\n\r\n",               # bare LF
])
def test_malformed_request_is_400(raw):
    with pytest.raises(HandshakeError) as info:
        parse_http_request(raw, 8192)
    assert info.value.status == 400


def test_oversized_request_is_431():
    head = b"GET / HTTP/1.1\r\nX: " + b"a" * 200
    assert parse_http_request(head, max_size=256) is None  # still incomplete, still small
    with pytest.raises(HandshakeError) as info:
        parse_http_request(head + b"a" * 100, max_size=256)  # no end in sight
    assert info.value.status == 431
    with pytest.raises(HandshakeError) as info:
        parse_http_request(head + b"a" * 100 + b"\r\n\r\n", max_size=256)  # complete but too big
    assert info.value.status == 431


@pytest.mark.parametrize("raw,status", [
    (request_bytes(first_line="POST /ws HTTP/1.1"), 400),
    (request_bytes(first_line="GET /ws HTTP/1.0"), 400),
    (request_bytes(drop=["Upgrade"]), 400),
    (request_bytes(drop=["Upgrade"], extra=[("Upgrade", "h2c")]), 400),
    (request_bytes(drop=["Connection"]), 400),
    (request_bytes(drop=["Connection"], extra=[("Connection", "keep-alive")]), 400),
    (request_bytes(drop=["Sec-WebSocket-Version"]), 426),
    (request_bytes(drop=["Sec-WebSocket-Version"], extra=[("Sec-WebSocket-Version", "8")]), 426),
    (request_bytes(drop=["Sec-WebSocket-Key"]), 400),
    (request_bytes(drop=["Sec-WebSocket-Key"], extra=[("Sec-WebSocket-Key", "not base64!")]), 400),
    # valid base64, but of 15 bytes instead of 16
    (request_bytes(drop=["Sec-WebSocket-Key"],
                   extra=[("Sec-WebSocket-Key", base64.b64encode(b"x" * 15).decode())]), 400),
])
def test_validation_failures(raw, status):
    assert handshake_status(raw) == status


def test_426_carries_supported_version():
    with pytest.raises(HandshakeError) as info:
        handshake(request_bytes(drop=["Sec-WebSocket-Version"]))
    assert info.value.headers == {"Sec-WebSocket-Version": "13"}
    response = info.value.response()
    assert response.startswith(b"HTTP/1.1 426 ") and b"\r\nSec-WebSocket-Version: 13\r\n" in response


@pytest.mark.parametrize("offered,chosen", [
    ("v10.stomp, v11.stomp, v12.stomp", "v12.stomp"),   # stomp.js order: best wins, not first
    ("stomp,v11.stomp", "v11.stomp"),
    ("v10.stomp", "v10.stomp"),
    ("stomp", "stomp"),
    ("mqtt, wamp", None),                               # only unknown ones: accept without header
])
def test_subprotocol_choice(offered, chosen):
    response, proto = handshake(request_bytes(extra=[("Sec-WebSocket-Protocol", offered)]))
    assert proto == chosen
    if chosen:
        assert f"\r\nSec-WebSocket-Protocol: {chosen}\r\n".encode() in response
    else:
        assert b"Sec-WebSocket-Protocol" not in response


def test_origin_allow_list():
    allowed = ["https://app.example.com"]
    ok = request_bytes(extra=[("Origin", "https://app.example.com")])
    assert handshake(ok, allowed_origins=allowed)[0].startswith(b"HTTP/1.1 101")
    assert handshake_status(request_bytes(extra=[("Origin", "https://evil.example")]), allowed_origins=allowed) == 403
    assert handshake_status(request_bytes(), allowed_origins=allowed) == 403  # no Origin at all
    handshake(request_bytes(extra=[("Origin", "https://evil.example")]))  # None = any origin


def test_path_restriction():
    assert handshake(request_bytes(path="/stomp?token=1"), allowed_paths=["/stomp"])[0].startswith(b"HTTP/1.1 101")
    assert handshake_status(request_bytes(path="/other"), allowed_paths=["/stomp"]) == 404
    handshake(request_bytes(path="/anything"))  # None = any path


def test_http_response():
    resp = http_response(200, "OK", b"OK")
    head, body = resp.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert b"Content-Length: 2" in head and b"Connection: close" in head and body == b"OK"
    assert http_response(404, "Not Found").endswith(b"Content-Length: 0\r\nConnection: close\r\n\r\n")
    with pytest.raises(ValueError):  # no header injection
        http_response(400, "Bad\r\nSet-Cookie: x")


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("size,length_bytes", [(0, 0), (125, 0), (126, 2), (65535, 2), (65536, 8), (10, 8)])
def test_lengths_7_16_64_bit(size, length_bytes):
    payload = b"a" * size
    frame = client_frame(payload, length_bytes=length_bytes)
    assert WsDecoder().feed(frame) == [("message", payload, True)]


def test_text_and_binary():
    data = client_frame("héllo".encode(), OP_TEXT) + client_frame(b"\xff\x00", OP_BIN)
    assert WsDecoder().feed(data) == [("message", "héllo".encode(), True), ("message", b"\xff\x00", False)]


def test_fragmented_message_with_ping_in_the_middle():
    data = (client_frame(b"SEND\n", OP_TEXT, fin=False)
            + client_frame(b"", OP_CONT, fin=False)          # empty fragments are legal
            + client_frame(b"hb", OP_PING)
            + client_frame(b"\n\x00", OP_CONT, fin=True)
            + client_frame(b"p", OP_PONG))
    expected = [("ping", b"hb"), ("message", b"SEND\n\n\x00", True), ("pong", b"p")]
    assert WsDecoder().feed(data) == expected
    assert feed_bytewise(WsDecoder(), data) == expected


def test_one_byte_at_a_time_and_diagnostics():
    payload = os.urandom(300)
    frame = client_frame(payload, OP_BIN)
    dec = WsDecoder()
    for i in range(len(frame) - 1):
        assert dec.feed(frame[i:i + 1]) == []
    assert dec.allocated == len(frame) - 1
    assert dec.feed(frame[-1:]) == [("message", payload, False)]
    assert (dec.hits, dec.misses, dec.allocated) == (1, len(frame) - 1, 0)


def test_utf8_character_split_across_fragments():
    # Validation is on the assembled message, so a split character is fine.
    text = "€".encode()
    data = client_frame(text[:1], OP_TEXT, fin=False) + client_frame(text[1:], OP_CONT)
    assert WsDecoder().feed(data) == [("message", text, True)]


def test_close_events():
    assert WsDecoder().feed(client_frame(b"", OP_CLOSE)) == [("close", None, "")]
    dec = WsDecoder()
    data = client_frame(struct.pack("!H", 1001) + "bye ✓".encode(), OP_CLOSE)
    assert dec.feed(data + b"trailing garbage") == [("close", 1001, "bye ✓")]
    assert dec.feed(b"\xff\xff") == []  # nothing is read after a close


PROTOCOL_ERRORS = [
    (client_frame(b"x", masked=False), 1002),
    (client_frame(b"x", rsv=0x40), 1002),                      # RSV1 without an extension
    (client_frame(b"x", opcode=0x3), 1002),                    # reserved data opcode
    (client_frame(b"x", opcode=0xB), 1002),                    # reserved control opcode
    (client_frame(b"x", OP_PING, fin=False), 1002),
    (client_frame(b"x" * 126, OP_PING), 1002),
    (client_frame(b"x", OP_CONT), 1002),                        # nothing to continue
    (client_frame(b"a", OP_TEXT, fin=False) + client_frame(b"b", OP_TEXT), 1002),
    (client_frame(b"\xc3\x28", OP_TEXT), 1007),
    (client_frame(b"\xc3", OP_TEXT, fin=False) + client_frame(b"\x28", OP_CONT), 1007),
    (client_frame(b"\x03", OP_CLOSE), 1002),                    # 1-byte close payload
    (client_frame(struct.pack("!H", 1005), OP_CLOSE), 1002),   # reserved close code
    (client_frame(struct.pack("!H", 999), OP_CLOSE), 1002),
    (client_frame(struct.pack("!H", 5000), OP_CLOSE), 1002),
    (client_frame(struct.pack("!H", 1000) + b"\xff", OP_CLOSE), 1002),
    (b"\x82\xff" + struct.pack("!Q", 1 << 63), 1002),           # 64-bit length with MSB set
]


# (ids by position: the frames carry random masks, and parallel workers must collect the same names)
@pytest.mark.parametrize("data,code", PROTOCOL_ERRORS, ids=[f"case{i}" for i in range(len(PROTOCOL_ERRORS))])
def test_protocol_errors(data, code):
    assert ws_error(data) == code
    with pytest.raises(WsProtocolError) as info:
        feed_bytewise(WsDecoder(), data)
    assert info.value.code == code


def test_too_big_detected_from_length_field():
    # Only the header arrives: the error must come before the payload is buffered.
    assert ws_error(b"\x82\xff" + struct.pack("!Q", 2 ** 40) + b"abcd", max_message_size=1000) == 1009
    assert ws_error(b"\x82\xfe" + struct.pack("!H", 1001), max_message_size=1000) == 1009
    # Fragments count towards the assembled size.
    data = client_frame(b"a" * 600, OP_BIN, fin=False) + b"\x80\xfe" + struct.pack("!H", 401)
    assert ws_error(data, max_message_size=1000) == 1009
    assert WsDecoder(max_message_size=1000).feed(client_frame(b"a" * 1000, OP_BIN))[0][1] == b"a" * 1000


def test_fragments_are_held_as_their_bytes_and_counted_byte_by_byte():
    # What a fragmented message holds is exactly its payload bytes so far, whatever the fragment
    # sizes: empty fragments hold nothing (they used to cost a list entry each, unbounded).
    dec = WsDecoder(max_fragments=10_000)
    assert feed_bytewise(dec, client_frame(b"SEND\n", OP_TEXT, fin=False)) == []
    assert dec.allocated == 5
    for i in range(2000):
        frame = client_frame(b"" if i % 2 else b"x", OP_CONT, fin=False)
        assert feed_bytewise(dec, frame) == []
        assert dec.allocated == 5 + (i + 2) // 2
    assert feed_bytewise(dec, client_frame(b"\n\x00", OP_CONT)) == [("message", b"SEND\n" + b"x" * 1000 + b"\n\x00", True)]
    assert dec.allocated == 0


@pytest.mark.parametrize("payload", [b"", b"y"])
def test_a_message_in_more_than_max_fragments_frames_is_closed_1008(payload):
    first = client_frame(b"CONNECT\n", OP_TEXT, fin=False)
    more = client_frame(payload, OP_CONT, fin=False)
    last = client_frame(b"\n\x00", OP_CONT)
    # max_fragments frames, the first one included, make a message ...
    dec = WsDecoder(max_fragments=8)
    assert feed_bytewise(dec, first + more * 6 + last) == [("message", b"CONNECT\n" + payload * 6 + b"\n\x00", True)]
    # ... one more is refused on its first two bytes, before its payload is read
    dec = WsDecoder(max_fragments=8)
    assert feed_bytewise(dec, first + more * 7) == []
    with pytest.raises(WsProtocolError) as info:
        feed_bytewise(dec, last[:2])
    assert (info.value.code, info.value.reason) == (1008, "message in more than 8 fragments")
    assert dec.allocated == 0  # the failed message's bytes are let go
    with pytest.raises(WsProtocolError):
        dec.feed(client_frame(b"x"))  # and the error sticks
    # the count starts again with each message, and control frames in between do not count
    dec = WsDecoder(max_fragments=3)
    message = first + client_frame(b"p", OP_PING) + more + client_frame(b"p", OP_PING) + last
    assert [e[0] for e in dec.feed(message * 50)] == ["ping", "ping", "message"] * 50


def test_a_flood_of_empty_fragments_is_cut_within_the_limit():
    dec = WsDecoder()  # the default: 1024 frames per message
    flood = client_frame(b"S", OP_TEXT, fin=False) + client_frame(b"", OP_CONT, fin=False) * 100_000
    with pytest.raises(WsProtocolError) as info:
        dec.feed(flood)
    assert info.value.code == 1008


def test_error_keeps_earlier_events_and_sticks():
    dec = WsDecoder()
    with pytest.raises(WsProtocolError) as info:
        dec.feed(client_frame(b"DISCONNECT\n\n\x00") + client_frame(b"x", masked=False))
    assert info.value.events == [("message", b"DISCONNECT\n\n\x00", True)]
    with pytest.raises(WsProtocolError):
        dec.feed(client_frame(b"ok"))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(1, 50), max_size=20))
def test_arbitrary_bytes_only_raise_protocol_errors(data, cuts):
    dec = WsDecoder(max_message_size=1000)
    pos = 0
    try:
        for n in cuts + [len(data)]:
            dec.feed(data[pos:pos + n])
            pos += n
    except WsProtocolError as e:
        assert e.code in (1002, 1007, 1008, 1009)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([OP_TEXT, OP_BIN, OP_PING]), st.binary(max_size=125)), max_size=5),
       st.integers(1, 64))
def test_valid_frames_in_arbitrary_chunks(frames, chunk):
    frames = [(op, p.decode("latin-1").encode() if op == OP_TEXT else p) for op, p in frames]
    data = b"".join(client_frame(p, op) for op, p in frames)
    dec = WsDecoder()
    events = []
    for i in range(0, len(data), chunk):
        events += dec.feed(data[i:i + chunk])
    expected = [("ping", p) if op == OP_PING else ("message", p, op == OP_TEXT) for op, p in frames]
    assert events == expected


# ---------------------------------------------------------------- encoding

def decode_server_frame(frame):
    """Server frames are unmasked; re-mask them to reuse the decoder."""
    b0, b1 = frame[0], frame[1]
    assert b0 & 0x80 and not b1 & 0x80  # FIN set, not masked
    n = b1 & 0x7F
    offset = {126: 4, 127: 10}.get(n, 2)
    payload = frame[offset:]
    if n >= 126:
        assert len(payload) == int.from_bytes(frame[2:offset], "big")
    return b0 & 0x0F, payload


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70000])
def test_encode_round_trip(size):
    payload = os.urandom(size)
    frame = encode_frame(payload, OP_BIN)
    assert decode_server_frame(frame) == (OP_BIN, payload)
    # Same bytes, masked as a client would send them, through the decoder.
    key = os.urandom(4)
    masked = bytes((frame[0], frame[1] | 0x80)) + frame[2:len(frame) - size] + key + mask_bytes(payload, key)
    assert WsDecoder().feed(masked) == [("message", payload, False)]


def test_mask_bytes_is_an_involution_at_every_size():
    key = b"\x01\x80\xfe\x37"
    for n in (0, 1, 3, 4, 5, 511, 512, 513, 4099):  # both sides of the int/translate switch
        data = os.urandom(n)
        masked = mask_bytes(data, key)
        assert masked == bytes(b ^ key[i % 4] for i, b in enumerate(data))
        assert mask_bytes(masked, key) == data


def test_encode_message_text_vs_binary():
    assert decode_server_frame(encode_message(b"MESSAGE\n\nh\xc3\xa9\x00")) == (OP_TEXT, b"MESSAGE\n\nh\xc3\xa9\x00")
    assert decode_server_frame(encode_message(b"MESSAGE\n\n\xff\x00")) == (OP_BIN, b"MESSAGE\n\n\xff\x00")


def test_a_message_header_is_the_header_encode_frame_puts_before_a_frame():
    """What a writer appends before each frame: the header encode_frame makes, for every length
    class and both opcodes, from bytes or a memoryview (the writer's batch takes it, then the frame)."""
    for n in (0, 1, 125, 126, 127, 65535, 65536, 70000):
        for fill in (b"a", b"\xc3\xa9", b"\xff"):
            frame = (fill * n)[:n]
            try:
                opcode = OP_TEXT if frame.decode() is not None else OP_BIN
            except UnicodeDecodeError:  # (a cut character too)
                opcode = OP_BIN
            expected = encode_frame(frame, opcode)
            for given in (frame, memoryview(frame)):
                header = message_header(given)
                assert header + frame == expected == encode_message(given), (n, fill)


def test_encode_close():
    assert encode_close() == b"\x88\x02\x03\xe8"
    assert encode_close(None) == b"\x88\x00"
    op, payload = decode_server_frame(encode_close(1009, "é" * 100))
    assert op == OP_CLOSE and len(payload) <= 125
    assert payload[:2] == b"\x03\xf1" and payload[2:].decode() == "é" * 61  # cut on a character boundary
    with pytest.raises(ValueError):
        encode_frame(b"x" * 126, OP_PING)


def test_accept_key_formula():
    key = base64.b64encode(os.urandom(16)).decode()
    expected = base64.b64encode(hashlib.sha1(key.encode() + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    assert b"Sec-WebSocket-Accept: " + expected + b"\r\n" in handshake(request_bytes(
        drop=["Sec-WebSocket-Key"], extra=[("Sec-WebSocket-Key", key)]))[0]


def test_interop_with_wsproto_client():
    # An independent implementation catches errors that a test mirroring our own reading of the RFC cannot.
    import wsproto
    from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, Request, TextMessage
    client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    request, _ = parse_http_request(client.send(Request(host="h", target="/ws", subprotocols=["v11.stomp"])), 8192)
    response, proto = handshake_response(request)
    client.receive_data(response)
    assert [type(e) for e in client.events()] == [AcceptConnection] and proto == "v11.stomp"

    data = (client.send(TextMessage("SEND\n\nh\u00e9", message_finished=False)) + client.send(Ping(b"x"))
            + client.send(TextMessage("\0")) + client.send(BytesMessage(b"\xff" * 70000))
            + client.send(CloseConnection(1000, "ok")))
    assert WsDecoder().feed(data) == [("ping", b"x"), ("message", "SEND\n\nh\u00e9\0".encode(), True),
                                      ("message", b"\xff" * 70000, False), ("close", 1000, "ok")]

    client.receive_data(encode_message(b"MESSAGE\n\n\0") + encode_message(b"\xff" * 70000) + encode_close(1001, "bye"))
    events = list(client.events())
    assert [type(e) for e in events] == [TextMessage, BytesMessage, CloseConnection]
    assert events[1].data == b"\xff" * 70000 and events[2].code == 1001 and events[2].reason == "bye"
