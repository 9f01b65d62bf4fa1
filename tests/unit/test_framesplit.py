"""The compiled frame splitter (protocol/_framesplit.c) against the pure-Python parser: the same
frames, errors, unfinished bytes and heart-beats from any bytes however they are cut, and the
splitter's own stops, byte by byte."""

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.protocol import stomp
from stompbroker.protocol.stomp import FrameParser, ProtocolError, render_frame

split = FrameParser.split


class PureParser(FrameParser):
    __slots__ = ()
    split = None


def test_the_install_built_the_compiled_splitter_and_the_parser_uses_it():
    # README's install compiles it (setup.py); without it the reader parses about 1.6x slower.
    assert split is not None, "stompbroker/protocol/_framesplit.c was not built (pip install -e . needs a C compiler)"


def run(parser_class, chunks, **limits):
    """What a parser gives for the chunks: frames per feed, then the error or the state it ends in."""
    parser = parser_class(**limits)
    got = []
    for chunk in chunks:
        try:
            got.append(parser.feed(chunk))
        except ProtocolError as exc:
            got.append(("error", exc.message, exc.detail, exc.receipt, getattr(exc, "frames", None)))
            break
    return got, parser.buffered, parser.heartbeats, parser.unparsed()


def cut(data, cuts):
    cuts = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


TOKENS = [b"\n", b"\n\n", b"\r", b"\r\n", b"\0", b"SEND", b"SEND\ndestination:/q/a\n", b":", b"a",
          b"content-length:", b"\ncontent-length:", b"receipt:7", b"0", b"3", b"12", b"1234567890",
          b"-", b"x" * 20, b"\xff"]
wires = st.one_of(st.binary(max_size=200), st.lists(st.sampled_from(TOKENS), max_size=60).map(b"".join))
frames = st.lists(st.tuples(st.sampled_from(["SEND", "ACK", "x"]),
                            st.lists(st.tuples(st.sampled_from(["destination", "receipt", "id", "a:b"]),
                                               st.text(max_size=8)), max_size=4),
                            st.binary(max_size=30), st.booleans(), st.integers(0, 2)), max_size=8)


def rendered(spec):
    out = b""
    for command, headers, body, with_length, beats in spec:
        frame = render_frame(command, headers, body)
        if not with_length:
            frame = frame.replace(b"\ncontent-length:%d" % len(body), b"") if b"\0" not in body else frame
        out += b"\n" * beats + frame
    return out


LIMITS = [{}, {"max_frame_size": 40, "max_headers": 3, "max_header_line": 12},
          {"max_destination": 8, "max_id": 4}]


@settings(max_examples=1500, deadline=None)
@given(wire=st.one_of(wires, frames.map(rendered)), cuts=st.lists(st.integers(0, 10_000), max_size=12),
       limits=st.sampled_from(LIMITS))
def test_compiled_and_pure_parsers_agree_on_any_bytes_whole_and_cut(wire, cuts, limits):
    for chunks in ([wire], cut(wire, cuts), [wire[i:i + 1] for i in range(len(wire))]):
        assert run(FrameParser, chunks, **limits) == run(PureParser, chunks, **limits)


def take(data, pos=0, head_limit=1000, max_headers=10, max_frame=1000):
    frames = []
    pos, beats = split(data, pos, frames, head_limit, max_headers, max_frame)
    return frames, pos, beats


def test_whole_frames_are_taken_with_the_heart_beats_before_them():
    data = b"\n\nSEND\ndestination:/q\ncontent-length:2\n\nab\0\nACK\nid:1\n\n\0"
    assert take(data) == ([(b"SEND\ndestination:/q\ncontent-length:2", b"ab"), (b"ACK\nid:1", b"")],
                          len(data), 3)
    assert take(bytearray(data), 2) == (take(data)[0], len(data), 1)  # any buffer, from any offset


@pytest.mark.parametrize("rest", [
    b"SEND\ndest:x\n",                                 # head unfinished
    b"SEND\ncontent-length:5\n\nab",                   # body unfinished
    b"SEND\n\nab",                                     # no NUL yet
    b"SEND\ncontent-length:2\n\nabc",                  # missing NUL: the parser's error
    b"SEND\r\nx:1\r\n\r\n\0",                          # CRs: the parser's
    b"\r\nSEND\n\n\0",                                 # a CRLF heart-beat
    b"SEND\ncontent-length:1234567890\n\n\0",          # 10 digits
    b"SEND\ncontent-length:\n\n\0",                    # no digits
    b"SEND\ncontent-length:+1\n\nx\0",                 # not digits
    b"SEND\nx:\0\n\n\0",                               # NUL in the head
    b"SEND\n" + b"a:1\n" * 11 + b"\n\0",               # over max_headers
    b"SEND\n" + b"a" * 1000 + b"\n\n\0",               # over head_limit
    b"SEND\ncontent-length:999\n\n" + b"x" * 999 + b"\0",  # over max_frame
    b"SEND\n\n" + b"x" * 1000 + b"\0",                 # over max_frame, no content-length
])
def test_it_stops_at_the_first_frame_of_another_shape_and_takes_what_came_before(rest):
    first = b"SEND\ncontent-length:1\n\nz\0\n"
    assert take(first + rest) == ([(b"SEND\ncontent-length:1", b"z")], len(first), 1)


def test_the_parser_gives_a_cr_read_to_python_and_splits_the_next_one():
    parser = FrameParser()
    assert parser.feed(b"SEND\r\nx:1\r\n\r\n\0") == [(b"SEND\nx:1", b"")]
    assert parser.feed(b"SEND\nx:2\n\n\0SEND\nx:3\n\n\0") == [(b"SEND\nx:2", b""), (b"SEND\nx:3", b"")]


def test_a_head_fed_byte_by_byte_is_not_rescanned_by_the_splitter(monkeypatch):
    calls = []

    def counting(*args):
        calls.append(args[1])
        return split(*args)
    monkeypatch.setattr(FrameParser, "split", staticmethod(counting))
    parser = FrameParser()
    wire = b"SEND\n" + b"a:b\n" * 200 + b"\n\0"
    for i in range(len(wire)):
        parser.feed(wire[i:i + 1])
    assert parser.heartbeats == 0 and not parser.buffered
    assert len(calls) <= 4  # its first bytes and after it: not once per byte (807 bytes)


def test_pure_python_when_turned_off(monkeypatch):
    monkeypatch.setenv("STOMPBROKER_PURE_PYTHON", "1")
    assert stomp._compiled("_framesplit", "split") is None
    monkeypatch.setenv("STOMPBROKER_PURE_PYTHON", "0")
    assert stomp._compiled("_framesplit", "split") is split


def test_the_log_line_says_why_frames_are_split_or_heads_decoded_in_pure_python(monkeypatch):
    assert stomp.why_pure_python() is None
    monkeypatch.setattr(FrameParser, "split", None)
    monkeypatch.delenv("STOMPBROKER_PURE_PYTHON", raising=False)
    assert stomp.why_pure_python() == "stompbroker/protocol/_framesplit.c not built (no C compiler at install: see README)"
    monkeypatch.setattr(stomp, "_PARSE_HEAD", None)
    assert "_framesplit.c and stompbroker/protocol/_headparse.c not built" in stomp.why_pure_python()
    monkeypatch.setenv("STOMPBROKER_PURE_PYTHON", "1")
    assert stomp.why_pure_python() == "STOMPBROKER_PURE_PYTHON is set"
