"""The compiled head decoder (protocol/_headparse.c) against the pure-Python parse_head: where it
answers, the same command and headers in the same order; where it does not (None), the Python code
decides, errors included; and it answers for every head of the common shape."""

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.protocol import stomp
from stompbroker.protocol.stomp import ProtocolError

parse = stomp._PARSE_HEAD


def test_the_install_built_the_compiled_head_decoder_and_parse_head_uses_it(monkeypatch):
    assert parse is not None, "stompbroker/protocol/_headparse.c was not built (pip install -e . needs a C compiler)"
    calls = []
    monkeypatch.setattr(stomp, "_PARSE_HEAD", lambda head, unescape: calls.append(head) or parse(head, unescape))
    assert stomp.parse_head(b"SEND\ndestination:/q/a", True) == ("SEND", {"destination": "/q/a"})
    assert calls == [b"SEND\ndestination:/q/a"]


def pure(head: bytes, unescape: bool):
    saved, stomp._PARSE_HEAD = stomp._PARSE_HEAD, None
    try:
        return stomp.parse_head(head, unescape)
    except ProtocolError as exc:
        return ("error", exc.message, exc.detail, exc.receipt)
    finally:
        stomp._PARSE_HEAD = saved


def common(head: bytes, unescape: bool) -> bool:
    """The shape the C decoder must take: valid UTF-8, every header line with a name and a colon,
    no backslash where escapes count."""
    try:
        head.decode()
    except UnicodeDecodeError:
        return False
    if unescape and b"\\" in head:
        return False
    return all(line.partition(b":")[0] and b":" in line for line in head.split(b"\n")[1:])


TOKENS = [b"\n", b":", b"::", b"\\", b"\\n", b"\\c", b"\\t", b"\r", b"\0", b"SEND", b"destination", b"receipt",
          b"id", b"content-length", b"a", b"/q/x", b"\xc3\xa9", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf0\x9f\x98\x80",
          b" ", b"x" * 20]
heads = st.one_of(st.binary(max_size=120), st.lists(st.sampled_from(TOKENS), max_size=40).map(b"".join))


@settings(max_examples=3000, deadline=None)
@given(heads, st.booleans())
def test_the_compiled_decoder_agrees_with_python_or_leaves_it_to_python(head, unescape):
    got = parse(head, unescape)
    if got is None:
        assert not common(head, unescape)
        return
    assert common(head, unescape)
    want = pure(head, unescape)
    assert got == want
    assert list(got[1]) == list(want[1])  # (the same order too: handlers and renderers keep it)


@pytest.mark.parametrize("head, unescape", [
    (b"SEND\ndestination:/q/a\ndestination:/q/b\nid:1", True),     # the first occurrence wins
    (b"SEND\nx:a:b:c\ny:", True),                                   # colons in a value; an empty value
    (b"SEND\ndestination:a\\cb", False),                            # 1.0: backslashes are plain bytes
    (b"SEND\ndestination:caf\xc3\xa9\ncontent-type:text/plain", True),
    (b"", True), (b"CONNECT", False), (b"SEND\nname:val\r", True),  # no headers; a CR stays in the value
    (b"SEND\nid:\x00", True),
])
def test_the_common_shapes(head, unescape):
    assert parse(head, unescape) == pure(head, unescape)


@pytest.mark.parametrize("head, unescape, error", [
    (b"SEND\ndestination:a\\cb", True, None),                            # unescaped by Python: a:b
    (b"SEND\ndestination:a\\tb", True, "invalid header escape"),
    (b"SEND\nno colon", True, "malformed header"),
    (b"SEND\n:no name", True, "malformed header"),
    (b"SEND\ndestination:/q/a\n", True, "malformed header"),            # an empty line
    (b"SEND\ndestination:\xff\nreceipt:7", True, "invalid UTF-8"),
    (b"SEND\ndestination:a\ndestination:\xff", True, "invalid UTF-8"),  # even in a header that loses
    (b"SE\xc3ND", True, "invalid UTF-8"),
])
def test_what_it_leaves_to_python(head, unescape, error):
    assert parse(head, unescape) is None
    want = pure(head, unescape)
    if error is None:
        assert want == ("SEND", {"destination": "a:b"})
        assert stomp.parse_head(head, unescape) == want
    else:
        assert want[:2] == ("error", error)
        with pytest.raises(ProtocolError) as raised:
            stomp.parse_head(head, unescape)
        assert (raised.value.message, raised.value.detail, raised.value.receipt) == want[1:]
