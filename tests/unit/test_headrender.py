"""The compiled MESSAGE renderer (protocol/_headrender.c) against the Python one (Message._shared):
where it answers, the same bytes, both escaping styles; where it does not (None: a header that is
not a str, a lone surrogate), the Python code renders, as it always did."""

import pytest
from hypothesis import given, settings, strategies as st

from stompbroker.broker import model
from stompbroker.broker.model import NOT_FORWARDED, Message
from stompbroker.protocol import stomp

part = stomp.RENDER_PART
# names and values with the characters either style treats specially, and beyond ASCII
TEXT = st.text(alphabet=st.sampled_from("ab:\\\r\n \té€😀-") | st.characters(codec="utf-8"), max_size=12)


def python(message: Message, escaped: bool) -> bytes:
    return Message(message.id, message.destination, message.headers, message.body)._shared(escaped)


def test_the_install_built_the_compiled_renderer_and_messages_use_it(monkeypatch):
    assert part is not None, "stompbroker/protocol/_headrender.c was not built (pip install -e . needs a C compiler)"
    calls = []
    monkeypatch.setattr(model, "RENDER_PART", lambda *args: calls.append(args[0]) or part(*args))
    assert Message("m-1", "/topic/a", {"k": "v"}, b"x").shared(True) == (
        b"message-id:m-1\ndestination:/topic/a\nk:v\ncontent-length:1\n\nx\0")
    assert calls == ["m-1"]


@settings(max_examples=3000, deadline=None)
@given(message_id=TEXT, destination=TEXT, headers=st.dictionaries(TEXT | st.sampled_from(sorted(NOT_FORWARDED)), TEXT,
                                                                  max_size=6),
       body=st.binary(max_size=40), escaped=st.booleans())
def test_the_same_bytes_as_python_for_any_headers(message_id, destination, headers, body, escaped):
    message = Message(message_id, destination, headers, body)
    assert part(message_id, destination, headers, NOT_FORWARDED, body, escaped) == python(message, escaped)


def test_what_is_not_a_str_or_not_utf8_is_left_to_python():
    good = ("m", "/topic/a", {"k": "v"}, NOT_FORWARDED, b"", True)
    assert part(*good) is not None
    class Name(str):
        pass

    for at, bad in [(2, {"k": 1}), (2, {1: "v"}), (2, {"k": "\udc80"}), (2, [("k", "v")]), (0, 1),
                    (2, {Name("k"): "v"}), (2, {"k": Name("v")}), (0, Name("m")),
                    (1, "/topic/\udc80"), (4, "body"), (3, ["receipt"])]:
        args = (*good[:at], bad, *good[at + 1:])
        assert part(*args) is None, args
    with pytest.raises(UnicodeEncodeError):   # as Python rendered it before
        Message("m", "/topic/a", {"k": "\udc80"}, b"").shared(True)
