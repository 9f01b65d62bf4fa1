"""Unit tests for stompbroker.protocol.stomp (sans-IO STOMP framing)."""

import pickle

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.protocol.stomp import (
    FrameParser, ProtocolError, escape, parse_head, render_frame, unescape,
)


def feed_all(parser, chunks):
    frames = []
    for chunk in chunks:
        frames += parser.feed(chunk)
    return frames


def one_by_one(data):
    return [data[i:i + 1] for i in range(len(data))]


# (wire bytes, expected frames, expected heart-beats)
VALID = [
    (b"SEND\ndestination:/topic/a\nreceipt:7\n\nhello\0",
     [(b"SEND\ndestination:/topic/a\nreceipt:7", b"hello")], 0),
    (b"SEND\r\ndestination:/queue/b\r\n\r\nbody\0",
     [(b"SEND\ndestination:/queue/b", b"body")], 0),
    (b"DISCONNECT\n\n\0", [(b"DISCONNECT", b"")], 0),
    (b"DISCONNECT\r\n\r\n\0", [(b"DISCONNECT", b"")], 0),
    (b"SEND\ncontent-length:5\n\na\0b\0c\0", [(b"SEND\ncontent-length:5", b"a\0b\0c")], 0),
    (b"SEND\ncontent-length:0\n\n\0", [(b"SEND\ncontent-length:0", b"")], 0),
    (b"SEND\ncontent-length:007\n\n\0\0\0\0\0\0\0\0", [(b"SEND\ncontent-length:007", bytes(7))], 0),
    # mixed line endings; CRLF normalised in the head, the body is untouched
    (b"SEND\r\na:b\n\r\nx\r\ny\0", [(b"SEND\na:b", b"x\r\ny")], 0),
    (b"SEND\na:b\r\n\nz\0", [(b"SEND\na:b", b"z")], 0),
    (b"SEND\n\nline1\r\nline2\n\n\0", [(b"SEND", b"line1\r\nline2\n\n")], 0),
    # a lone CR inside a body is just data
    (b"SEND\n\n\r\r\0", [(b"SEND", b"\r\r")], 0),
    # heart-beats before, between and after frames
    (b"\n\r\n\nCONNECT\naccept-version:1.2\nhost:x\n\n\0",
     [(b"CONNECT\naccept-version:1.2\nhost:x", b"")], 3),
    (b"MESSAGE\n\nx\0\nMESSAGE\n\ny\0\r\n\n",
     [(b"MESSAGE", b"x"), (b"MESSAGE", b"y")], 3),
    # first content-length wins
    (b"SEND\ncontent-length:2\ncontent-length:9\n\nab\0",
     [(b"SEND\ncontent-length:2\ncontent-length:9", b"ab")], 0),
    # header text is passed through raw (escapes are the dispatcher's business)
    (b"SEND\na\\cb:c\\nd\nx-content-length:zz\n\n\0", [(b"SEND\na\\cb:c\\nd\nx-content-length:zz", b"")], 0),
    # the parser does not judge command names
    (b"whatever 1\n\n\0", [(b"whatever 1", b"")], 0),
]


@pytest.mark.parametrize("data,expected,beats", VALID)
def test_valid_frame_whole(data, expected, beats):
    p = FrameParser()
    assert p.feed(data) == expected
    assert p.heartbeats == beats
    assert p.buffered == 0


@pytest.mark.parametrize("data,expected,beats", VALID)
def test_valid_frame_one_byte_at_a_time(data, expected, beats):
    p = FrameParser()
    assert feed_all(p, one_by_one(data)) == expected
    assert p.heartbeats == beats
    assert p.buffered == 0


@pytest.mark.parametrize("data,expected,beats", VALID)
def test_valid_frame_split_everywhere(data, expected, beats):
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            p = FrameParser()
            assert feed_all(p, [data[:i], data[i:j], data[j:]]) == expected, (i, j)
            assert p.heartbeats == beats
            assert p.buffered == 0


def test_all_frames_in_one_stream():
    stream = b"".join(d for d, _, _ in VALID)
    expected = [f for _, fs, _ in VALID for f in fs]
    beats = sum(b for _, _, b in VALID)
    for chunks in ([stream], one_by_one(stream)):
        p = FrameParser()
        assert feed_all(p, chunks) == expected
        assert p.heartbeats == beats
    for i in range(len(stream) + 1):
        p = FrameParser()
        assert feed_all(p, [stream[:i], stream[i:]]) == expected
        assert p.heartbeats == beats


def test_frames_are_bytes():
    p = FrameParser()
    frames = p.feed(b"SEN") + p.feed(bytearray(b"D\n\nab")) + p.feed(memoryview(b"c\0SEND\n\nd\0"))
    assert frames == [(b"SEND", b"abc"), (b"SEND", b"d")]
    for head, body in frames:
        assert type(head) is bytes and type(body) is bytes


def test_buffered_counts_partial_frame():
    p = FrameParser()
    assert p.feed(b"\n\nSEND\nde") == []
    assert p.buffered == 7
    assert p.heartbeats == 2
    assert p.feed(b"st:x\n\nbo") == []
    assert p.buffered == 15
    assert p.feed(b"dy\0SEN") == [(b"SEND\ndest:x", b"body")]
    assert p.buffered == 3
    assert p.feed(b"\r") == []  # a CR between frames waits for its LF
    p2 = FrameParser()
    p2.feed(b"\r")
    assert p2.buffered == 1
    assert p2.feed(b"\n") == [] and p2.heartbeats == 1 and p2.buffered == 0


def test_heartbeats_only():
    p = FrameParser()
    assert feed_all(p, [b"\n", b"\r", b"\n", b"\n\n", b"\r\n\r", b"\n"]) == []
    assert p.heartbeats == 6
    assert p.buffered == 0


def test_1000_pipelined_sends_in_one_feed():
    pieces, expected = [], []
    for i in range(1000):
        body = f"message number {i:06d} ".encode() * 2
        pieces.append(render_frame("SEND", {"destination": f"/queue/q{i}", "receipt": f"r{i}",
                                            "content-type": "text/plain"}, body))
        expected.append((f"SEND\ndestination:/queue/q{i}\nreceipt:r{i}\ncontent-type:text/plain"
                         f"\ncontent-length:{len(body)}".encode(), body))
    wire = b"".join(pieces)
    p = FrameParser()
    assert p.feed(wire) == expected
    assert p.buffered == 0 and p.heartbeats == 0
    # with a partial frame at the end, and in odd-sized chunks
    p = FrameParser()
    assert p.feed(wire[:-10]) == expected[:-1]
    assert p.buffered == len(pieces[-1]) - 10
    assert p.feed(wire[-10:]) == expected[-1:]
    assert p.buffered == 0
    p = FrameParser()
    assert feed_all(p, [wire[i:i + 997] for i in range(0, len(wire), 997)]) == expected


def test_1000_pipelined_crlf_sends():
    wire = b"".join(f"SEND\r\ndestination:/q/{i}\r\n\r\nbody {i}\0".encode() for i in range(1000))
    p = FrameParser()
    out = p.feed(wire)
    assert out == [(f"SEND\ndestination:/q/{i}".encode(), f"body {i}".encode()) for i in range(1000)]


def test_1mb_binary_body_full_of_nuls():
    body = (bytes(range(256)) + bytes(256)) * 2048  # 1 MiB, half NULs
    assert len(body) == 1 << 20
    wire = render_frame("SEND", {"destination": "/queue/bin"}, body) + b"\n" + render_frame("SEND", {"a": "b"})
    expected = [(b"SEND\ndestination:/queue/bin\ncontent-length:1048576", body), (b"SEND\na:b", b"")]
    p = FrameParser()
    assert p.feed(wire) == expected
    assert p.heartbeats == 1
    for size in (4096, 65536, 7919):
        p = FrameParser()
        assert feed_all(p, [wire[i:i + size] for i in range(0, len(wire), size)]) == expected
        assert p.buffered == 0


def test_frame_exactly_max_frame_size():
    # the limit counts the whole frame before its NUL: command, headers, blank line and body
    p = FrameParser(max_frame_size=100)
    assert p.feed(b"SEND\n\n" + b"x" * 94 + b"\0") == [(b"SEND", b"x" * 94)]
    head = b"SEND\ncontent-length:76"  # 22 bytes, 24 with the blank line, 100 with the body
    assert p.feed(head + b"\n\n" + bytes(76) + b"\0") == [(head, bytes(76))]
    assert feed_all(p, one_by_one(head + b"\n\n" + bytes(76) + b"\0")) == [(head, bytes(76))]
    for frame in (b"SEND\n\n" + b"x" * 95 + b"\0", b"SEND\ncontent-length:77\n\n" + bytes(77) + b"\0"):
        for chunks in ([frame], one_by_one(frame)):
            with pytest.raises(ProtocolError) as info:
                feed_all(FrameParser(max_frame_size=100), chunks)
            assert info.value.message == "frame too large"


def test_headers_and_body_together_over_the_limit():
    # 60 bytes of head and 60 of body: each fits, the frame does not
    frame = b"SEND\nh:" + b"y" * 53 + b"\n\n" + b"z" * 60 + b"\0"
    with pytest.raises(ProtocolError) as info:
        FrameParser(max_frame_size=100).feed(frame)
    assert info.value.message == "frame too large"


def test_frames_before_a_bad_one_are_kept_on_the_error():
    good = b"SEND\ndestination:/a\n\nhello\0"
    with pytest.raises(ProtocolError) as info:
        FrameParser().feed(good + b"SEND\ndestination:/a\r\x01bad\n\n\0")
    assert info.value.frames == [(b"SEND\ndestination:/a", b"hello")]


def test_unfinished_header_block_limit():
    p = FrameParser(max_frame_size=100)
    head = b"SEND\na:" + b"x" * 91  # 98 bytes: with LF LF, 100
    assert p.feed(head + b"\n") == []
    assert p.feed(b"\n\0") == [(head, b"")]
    p = FrameParser(max_frame_size=100)
    with pytest.raises(ProtocolError) as info:
        feed_all(p, [head + b"xxx", b"x", b"\n\n\0"])
    assert info.value.message == "frame too large"


def test_destination_and_id_limits_per_command():
    """max_destination_length and max_id_length, counted in bytes as sent, for the headers the
    broker keeps and shows; other headers, and a parser without limits (a client's), are free."""
    limits = {"max_destination": 20, "max_id": 8}
    ok = [b"SEND\ndestination:/queue/" + b"d" * 13 + b"\nid:" + b"i" * 50 + b"\n\n\0",  # id: not SEND's
          b"SUBSCRIBE\ndestination:/topic/t\nid:" + b"i" * 8 + b"\nselector:" + b"s" * 3000 + b"\n\n\0",
          b"MESSAGE\ndestination:" + b"d" * 3000 + b"\n\n\0"]
    for wire in ok:
        assert len(FrameParser(**limits).feed(wire)) == 1
        assert len(feed_all(FrameParser(**limits), one_by_one(wire))) == 1
    bad = [
        (b"SEND\nreceipt:r1\ndestination:/queue/" + b"d" * 14 + b"\n\n\0", "destination too long", "r1"),
        (b"SEND\ndestination:/q\nreply-to:/queue/" + b"d" * 14 + b"\n\n\0", "destination too long", None),
        (b"SUBSCRIBE\ndestination:/q\nid:" + b"i" * 9 + b"\nreceipt:s\n\n\0", "id too long", "s"),
        (b"ACK\nsubscription:" + b"i" * 9 + b"\n\n\0", "subscription too long", None),
        (b"BEGIN\ntransaction:" + b"t" * 9 + b"\n\n\0", "transaction too long", None),
        (b"CONNECT\naccept-version:1.2\nclient-id:" + b"c" * 9 + b"\n\n\0", "client-id too long", None),
        (b"SUBSCRIBE\ndestination:/q\nid:1\nactivemq.subscriptionName:" + b"n" * 9 + b"\n\n\0",
         "activemq.subscriptionName too long", None),
    ]
    for wire, message, receipt in bad:
        for chunks in ([wire], one_by_one(wire)):
            with pytest.raises(ProtocolError) as info:
                feed_all(FrameParser(**limits), chunks)
            assert (info.value.message, info.value.receipt) == (message, receipt), wire
    assert len(FrameParser().feed(bad[0][0])) == 1


# --- errors ------------------------------------------------------------------

ERRORS = [
    # (parser kwargs, wire, message, receipt)
    ({"max_frame_size": 100}, b"SEND\na:" + b"x" * 200 + b"\n\n\0", "frame too large", None),
    ({"max_frame_size": 100}, b"SEND\nreceipt:r1\na:" + b"x" * 200 + b"\n", "frame too large", None),
    ({"max_frame_size": 100}, b"SEND\n" + b"a:b\n" * 30, "frame too large", None),
    ({"max_frame_size": 100}, b"SEND\n\n" + b"x" * 101, "frame too large", None),
    ({"max_frame_size": 100}, b"SEND\nreceipt:r2\n\n" + b"x" * 101 + b"\0", "frame too large", "r2"),
    ({"max_frame_size": 100}, b"SEND\nreceipt:r3\ncontent-length:101\n\n", "frame too large", "r3"),
    ({}, b"SEND\ncontent-length:" + b"9" * 5000 + b"\n\n\0", "frame too large", None),
    ({"max_headers": 3}, b"SEND\na:1\nb:2\nc:3\nreceipt:r4\n\n\0", "too many headers", "r4"),
    ({"max_header_line": 10}, b"SEND\na:123456789\n\n\0", "header line too long", None),
    ({"max_header_line": 10}, b"SEND\nreceipt:r5\na:123456789", "header line too long", "r5"),
    ({"max_header_line": 10}, b"SEND\nreceipt:5\na:123456789\n\n\0", "header line too long", "5"),
    ({"max_header_line": 10}, b"SEND_A_VERY_LONG_COMMAND\n\n\0", "header line too long", None),
    ({}, b"SEND\ncontent-length:abc\n\n\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length:-1\n\n\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length:\n\n\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length: 5\n\nhello\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length:5 \n\nhello\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length:+5\n\nhello\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length:1.5\n\nhello\0", "invalid content-length", None),
    ({}, b"SEND\ncontent-length:\xd9\xa3\n\nabc\0", "invalid content-length", None),
    ({}, b"SEND\nreceipt:r6\ncontent-length:x\n\n\0", "invalid content-length", "r6"),
    ({}, b"SEND\ncontent-length:3\nreceipt:r7\n\nabcd\0", "missing NUL after body", "r7"),
    ({}, b"SEND\ncontent-length:3\n\nab\0x", "missing NUL after body", None),
    ({}, b"\0", "malformed frame", None),
    ({}, b"SEND\n\n\0\0", "malformed frame", None),
    ({}, b"SEND\n\0", "malformed frame", None),
    ({}, b"SEND\na:b\0\n\n", "malformed frame", None),
    ({}, b"\rSEND\n\n\0", "malformed frame", None),
    ({}, b"SEND\n\n\0\r\r", "malformed frame", None),
    ({}, b"SEND\rX\n\n\0", "malformed frame", None),
    ({}, b"SEND\nreceipt:r8\na:b\r\r\n\n\0", "malformed frame", "r8"),
]


def _expect_error(parser, chunks):
    """Feed chunks until a ProtocolError; return it. Fails if none is raised."""
    with pytest.raises(ProtocolError) as info:
        for chunk in chunks:
            parser.feed(chunk)
    return info.value


@pytest.mark.parametrize("kwargs,wire,message,receipt", ERRORS)
def test_errors_whole(kwargs, wire, message, receipt):
    p = FrameParser(**kwargs)
    err = _expect_error(p, [wire])
    assert err.message == message
    assert err.receipt == receipt
    assert err.detail and str(err).startswith(message)
    # stays failed
    for later in (b"", b"SEND\n\n\0", wire):
        with pytest.raises(ProtocolError) as again:
            p.feed(later)
        assert again.value.message == message


@pytest.mark.parametrize("kwargs,wire,message,receipt", ERRORS)
def test_errors_one_byte_at_a_time(kwargs, wire, message, receipt):
    # valid frames first, so the error has to be found mid-stream
    p = FrameParser(**kwargs)
    good = b"SEND\n\nok\0\n"
    err = _expect_error(p, one_by_one(good + wire))
    assert err.message == message
    assert err.receipt in (receipt, None)  # some errors show before the head (and its receipt) is complete
    with pytest.raises(ProtocolError):
        p.feed(b"SEND\n\n\0")


@pytest.mark.parametrize("kwargs,wire,message,receipt", ERRORS)
def test_errors_split_everywhere(kwargs, wire, message, receipt):
    for i in range(min(len(wire), 300) + 1):
        p = FrameParser(**kwargs)
        err = _expect_error(p, [wire[:i], wire[i:]])
        assert err.message == message, i
        assert err.receipt in (receipt, None)


def test_frames_before_the_error_are_not_lost_when_fed_separately():
    p = FrameParser()
    assert p.feed(b"SEND\n\na\0") == [(b"SEND", b"a")]
    with pytest.raises(ProtocolError):
        p.feed(b"SEND\ncontent-length:q\n\n\0")
    assert p.buffered == 0


def test_protocol_error_pickles():
    err = ProtocolError("frame too large", "detail", "r1")
    back = pickle.loads(pickle.dumps(err))
    assert (back.message, back.detail, back.receipt) == ("frame too large", "detail", "r1")
    assert str(ProtocolError("m")) == "m"


# --- parse_head / escape -------------------------------------------------------

def test_parse_head_basic():
    assert parse_head(b"SEND\ndestination:/topic/a\nreceipt:7", True) == (
        "SEND", {"destination": "/topic/a", "receipt": "7"})
    assert parse_head(b"DISCONNECT", True) == ("DISCONNECT", {})
    assert parse_head(b"SEND\nempty:", True) == ("SEND", {"empty": ""})
    assert parse_head("SEND\nnom:caf\u00e9 \u2603".encode(), True) == ("SEND", {"nom": "caf\u00e9 \u2603"})


def test_parse_head_first_occurrence_wins():
    assert parse_head(b"SEND\na:1\nb:2\na:3", True) == ("SEND", {"a": "1", "b": "2"})
    # after unescaping, names that become equal also count as repeats
    assert parse_head(b"SEND\na\\cb:1\na:b:2", False)[1] == {"a\\cb": "1", "a": "b:2"}
    assert parse_head(b"SEND\na\\cb:1\na\\cb:2", True)[1] == {"a:b": "1"}


def test_parse_head_unescapes_values_and_names():
    head = b"SEND\nk\\ce\\\\y:line1\\nline2\\r\\c\\\\end"
    assert parse_head(head, True) == ("SEND", {"k:e\\y": "line1\nline2\r:\\end"})
    assert parse_head(head, False) == ("SEND", {"k\\ce\\\\y": "line1\\nline2\\r\\c\\\\end"})


def test_parse_head_value_with_colons():
    # 1.0 and CONNECT headers are raw: only the first colon separates
    assert parse_head(b"CONNECT\nlogin:a:b\npasscode:x\\ty", False) == (
        "CONNECT", {"login": "a:b", "passcode": "x\\ty"})


@pytest.mark.parametrize("head,receipt", [
    (b"SEND\nreceipt:9\nfoo:a\\tb", "9"),
    (b"SEND\nfoo:a\\tb\nreceipt:10", "10"),
    (b"SEND\nfoo:trailing\\", None),
    (b"SEND\nfoo\\x:1", None),
    (b"SEND\nreceipt:a\\cb\nfoo:\\", "a:b"),
    (b"SEND\nreceipt:a\\qb\nfoo:1", None),  # the receipt itself is unreadable
])
def test_parse_head_undefined_escape(head, receipt):
    with pytest.raises(ProtocolError) as info:
        parse_head(head, True)
    assert info.value.message == "invalid header escape"
    assert info.value.receipt == receipt
    parse_head(head, False)  # not an error when not unescaping


@pytest.mark.parametrize("head", [b"SEND\nno-colon", b"SEND\n:value", b"SEND\na:1\n", b"SEND\n\na:1"])
def test_parse_head_malformed_line(head):
    for flag in (True, False):
        with pytest.raises(ProtocolError) as info:
            parse_head(head + b"\nreceipt:r", flag)
        assert info.value.message == "malformed header"
        assert info.value.receipt == "r"


def test_parse_head_invalid_utf8():
    with pytest.raises(ProtocolError) as info:
        parse_head(b"SEND\nreceipt:r9\nx:\xff\xfe", True)
    assert info.value.message == "invalid UTF-8"
    assert info.value.receipt == "r9"
    with pytest.raises(ProtocolError):
        parse_head(b"SEND\xc3", False)


@pytest.mark.parametrize("value,escaped", [
    ("plain", "plain"),
    ("", ""),
    ("a:b", "a\\cb"),
    ("line\nbreak", "line\\nbreak"),
    ("cr\r", "cr\\r"),
    ("back\\slash", "back\\\\slash"),
    ("\\n", "\\\\n"),
    (":\r\n\\", "\\c\\r\\n\\\\"),
    ("caf\u00e9", "caf\u00e9"),
])
def test_escape_round_trip(value, escaped):
    assert escape(value) == escaped
    assert unescape(escaped) == value


def test_escape_fast_path_returns_same_object():
    s = "/topic/prices.eu"
    assert escape(s) is s
    assert unescape(s) is s


def test_unescape_errors():
    for bad in ("\\t", "a\\", "\\C", "\\\\\\"):
        with pytest.raises(ProtocolError) as info:
            unescape(bad)
        assert info.value.message == "invalid header escape"


# --- render_frame ---------------------------------------------------------------

def test_render_frame_exact():
    assert render_frame("MESSAGE", {"destination": "/q/a", "message-id": 5}, b"hi") == (
        b"MESSAGE\ndestination:/q/a\nmessage-id:5\ncontent-length:2\n\nhi\0")
    assert render_frame("RECEIPT", {"receipt-id": "7"}) == b"RECEIPT\nreceipt-id:7\n\n\0"
    assert render_frame("DISCONNECT", {}) == b"DISCONNECT\n\n\0"
    assert render_frame("SEND", [("content-length", 3)], b"a\0b") == b"SEND\ncontent-length:3\n\na\0b\0"
    assert render_frame("SEND", [("a", "1"), ("a", "2")]) == b"SEND\na:1\na:2\n\n\0"
    assert render_frame("SEND", (p for p in [("k", "v")]), b"\0") == b"SEND\nk:v\ncontent-length:1\n\n\0\0"
    assert render_frame("MESSAGE", {"n": "caf\u00e9"}) == "MESSAGE\nn:caf\u00e9\n\n\0".encode()


def test_render_frame_escaping():
    assert render_frame("ERROR", [("message", "a:b\nc"), ("x:y", "\\")]) == (
        b"ERROR\nmessage:a\\cb\\nc\nx\\cy:\\\\\n\n\0")
    assert render_frame("CONNECTED", {"server": "stompbroker/0.1:x", "version": "1.2"},
                        escape_headers=False) == b"CONNECTED\nserver:stompbroker/0.1:x\nversion:1.2\n\n\0"


def test_render_then_parse():
    wire = render_frame("MESSAGE", {"destination": "/t:x", "subscription": 0, "x": "1\n2"}, b"\0body\0")
    [(head, body)] = FrameParser().feed(wire)
    assert body == b"\0body\0"
    assert parse_head(head, True) == ("MESSAGE", {"destination": "/t:x", "subscription": "0",
                                                  "x": "1\n2", "content-length": "6"})


# --- properties -------------------------------------------------------------------

TOKENS = [b"\n", b"\r", b"\r\n", b"\0", b"SEND", b"CONNECT", b":", b"a", b"\\", b"\xff",
          b"content-length:", b"receipt:", b"0", b"3", b"12", b"-", b"xxxxxxxxxxxxxxxx"]


def _chunks(data, cuts):
    cuts = sorted(set(c % (len(data) + 1) for c in cuts))
    out, prev = [], 0
    for c in cuts + [len(data)]:
        out.append(data[prev:c])
        prev = c
    return out


@settings(max_examples=400, deadline=None)
@given(
    data=st.one_of(st.binary(max_size=300),
                   st.lists(st.sampled_from(TOKENS), max_size=80).map(b"".join)),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    small=st.booleans(),
)
def test_arbitrary_bytes_only_raise_protocol_error(data, cuts, small):
    kwargs = {"max_frame_size": 40, "max_headers": 3, "max_header_line": 12} if small else {}
    p = FrameParser(**kwargs)
    failed = False
    frames = []
    for chunk in _chunks(data, cuts):
        try:
            got = p.feed(chunk)
            frames += got
            for head, body in got:
                assert type(head) is bytes and type(body) is bytes
                assert head and not head.endswith(b"\n")
                for flag in (True, False):
                    try:
                        parse_head(head, flag)
                    except ProtocolError:
                        pass
        except ProtocolError:
            failed = True
            break
    if failed:
        with pytest.raises(ProtocolError):
            p.feed(b"SEND\n\n\0")
    else:
        # chunking only lets errors be found earlier: the same bytes fed whole give the same frames
        whole = FrameParser(**kwargs)
        assert whole.feed(data) == frames
        assert (whole.heartbeats, whole.buffered) == (p.heartbeats, p.buffered)


header_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
frame_strategy = st.tuples(
    st.sampled_from(["SEND", "MESSAGE", "SUBSCRIBE", "ACK", "x"]),
    st.lists(st.tuples(header_text.filter(lambda n: n and n != "content-length"), header_text), max_size=5),
    st.binary(max_size=40),
    st.integers(min_value=0, max_value=2),
)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(frame_strategy, max_size=6),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
       crlf_beats=st.booleans())
def test_rendered_frames_parse_back_whatever_the_chunking(frames, cuts, crlf_beats):
    beat = b"\r\n" if crlf_beats else b"\n"
    wire = b"".join(beat * beats + render_frame(cmd, headers, body) for cmd, headers, body, beats in frames)
    p = FrameParser()
    got = feed_all(p, _chunks(wire, cuts))
    assert p.buffered == 0
    assert p.heartbeats == sum(beats for *_, beats in frames)
    assert got == FrameParser().feed(wire)
    assert len(got) == len(frames)
    for (head, body), (cmd, headers, sent_body, _) in zip(got, frames):
        assert body == sent_body
        expected = {}
        for name, value in headers:
            expected.setdefault(name, value)
        if sent_body:
            expected.setdefault("content-length", str(len(sent_body)))
        assert parse_head(head, True) == (cmd, expected)


@pytest.fixture(params=["compiled", "pure"])
def head_decoder(request, monkeypatch):
    """parse_head_cached both ways: the C decoder (no table), and pure Python (the table)."""
    from stompbroker.protocol import stomp
    if request.param == "pure":
        monkeypatch.setattr(stomp, "_PARSE_HEAD", None)
    else:
        assert stomp._PARSE_HEAD is not None
    return request.param


def test_a_remembered_head_decodes_as_parse_head_does_and_each_caller_gets_its_own_dict(head_decoder):
    from stompbroker.protocol import stomp
    heads = [b"SEND\ndestination:/queue/a\ncontent-length:3", b"SEND\ndestination:/queue/a\\cb\nx:\\n",
             b"SUBSCRIBE\nid:1\ndestination:/topic/t\nid:2", b"SEND\ndestination:/queue/" + b"x" * 600]
    for unescape in (True, False):
        for head in heads:
            first = stomp.parse_head_cached(head, unescape)
            first[1]["destination"] = "changed"  # a handler may rewrite its copy
            assert stomp.parse_head_cached(head, unescape) == stomp.parse_head(head, unescape)
    assert stomp.parse_head_cached(heads[1], True)[1]["destination"] == "/queue/a:b"
    assert stomp.parse_head_cached(heads[1], False)[1]["destination"] == "/queue/a\\cb"
    for _ in range(2):  # a bad head is refused every time, with its receipt
        with pytest.raises(ProtocolError) as err:
            stomp.parse_head_cached(b"SEND\nreceipt:r\nx:\\q", True)
        assert (err.value.message, err.value.receipt) == ("invalid header escape", "r")
    for i in range(stomp.HEAD_CACHE_ENTRIES * 2):  # unique heads: the table stays bounded
        assert stomp.parse_head_cached(b"SEND\nid:%d" % i, False)[1] == {"id": str(i)}
    assert len(stomp._HEADS[False]) <= stomp.HEAD_CACHE_ENTRIES


def test_numbered_receipts_do_not_defeat_the_head_cache(monkeypatch):
    """Heads that differ only in their receipt are decoded once; each gets its own receipt back
    (pure Python: the C decoder keeps no table)."""
    from stompbroker.protocol import stomp
    monkeypatch.setattr(stomp, "_PARSE_HEAD", None)
    stomp._HEADS[True].clear()
    decoded = []
    real = stomp.parse_head
    monkeypatch.setattr(stomp, "parse_head", lambda head, unescape: decoded.append(head) or real(head, unescape))
    for i in range(5):
        head = b"SEND\ndestination:/topic/t\nreceipt:%d\ncontent-length:117" % i
        command, headers = stomp.parse_head_cached(head, True)
        assert (command, headers) == real(head, True)
        assert headers["receipt"] == str(i)
    assert len(decoded) == 1


@pytest.mark.parametrize("head", [
    b"SEND\ndestination:/topic/t\nreceipt:7",                         # last line
    b"SEND\nreceipt:7\ndestination:/topic/t\nx:y",                   # first header
    b"SEND\nreceipt:7\ndestination:/topic/t\nreceipt:8",             # the first one wins
    b"SEND\nreceipt:\ndestination:/topic/t",                         # empty
    b"SEND\ndestination:/topic/a\\cb\nreceipt:7\nx:\\n",             # others escaped
    b"SEND\ndestination:/topic/t\nreceipt:a\\cb",                    # the receipt escaped
    b"SEND\ndestination:/topic/t\nreceipt:\xc3\xa9t\xc3\xa9",        # UTF-8
    b"SEND\ndestination:/topic/t\nreceipt:\xff",                      # not UTF-8
    b"SEND\ndestination:/topic/t\nreceipt:7\nbad line",               # malformed elsewhere
    b"SEND\ndestination:/topic/t\nreceipt:7\nx:\\q",                 # a bad escape elsewhere
    b"SEND\ndestination:/topic/t\nreceipt:a\\q",                     # a bad escape in the receipt
])
def test_a_head_with_a_receipt_decodes_as_parse_head_does(head, head_decoder):
    from stompbroker.protocol import stomp
    for unescape in (True, False):
        for _ in range(2):  # decoded, then remembered
            try:
                want = stomp.parse_head(head, unescape)
            except ProtocolError as exc:
                with pytest.raises(ProtocolError) as err:
                    stomp.parse_head_cached(head, unescape)
                assert (err.value.message, err.value.receipt) == (exc.message, exc.receipt)
                continue
            assert stomp.parse_head_cached(head, unescape) == want
