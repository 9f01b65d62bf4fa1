"""Selector text into tokens, and how a header or literal reads as a number (see ``selector.py``)."""

from __future__ import annotations

import re


class SelectorError(ValueError):
    """Invalid selector. `position` is the 0-based character offset of the problem, if known."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message if position is None else f"{message} at {position}")
        self.position = position


_KEYWORDS = frozenset("AND OR NOT IN LIKE ESCAPE IS NULL BETWEEN TRUE FALSE".split())
_COMPARISONS = frozenset(["=", "<>", "<", ">", "<=", ">="])
_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<str>'[^']*+(?:''[^']*+)*+')  # possessive: 'it''s is one unterminated literal
    | (?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<id>(?:[^\W\d]|[$.])[\w$.\-]*)
    | (?P<op>[<>=!]+|[(),])
    """,
    re.VERBOSE,
)
_IDENT_CHAR = re.compile(r"[\w$.\-]")
# What a header value must look like to count as a number. Stricter than float(): no
# whitespace, '_', 'nan' or 'inf' (NaN would break the T/F complementarity of comparisons).
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

# (kind, value, start, end); kind is 'str', 'num', 'id', 'kw', 'op' or 'end'
_Token = tuple[str, object, int, int]


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] == "'":
                raise SelectorError("unterminated string literal", pos)
            raise SelectorError(f"unexpected character {text[pos]!r}", pos)
        kind, src, end = m.lastgroup, m.group(), m.end()
        if kind == "str":
            tokens.append(("str", src[1:-1].replace("''", "'"), pos, end))
        elif kind == "num":
            if end < n and _IDENT_CHAR.match(text, end):  # 1e, 1.2.3, 12abc, 5-3
                raise SelectorError(f"invalid number {text[pos:end + 1]!r}", pos)
            tokens.append(("num", _to_num(src), pos, end))
        elif kind == "id":
            # isascii: 'ın'.upper() == 'IN', and such must not become keywords
            word = src.upper() if src.isascii() else src
            tokens.append(("kw", word, pos, end) if word in _KEYWORDS else ("id", src, pos, end))
        elif kind == "op":
            if src not in _COMPARISONS and src not in "(),":
                raise SelectorError(f"unknown operator {src!r}", pos)
            tokens.append(("op", src, pos, end))
        pos = end
    tokens.append(("end", None, n, n))
    return tokens


# ---------------------------------------------------------------------------- value conversion


def _to_num(s: str) -> int | float | None:
    """A header (or literal) as a number, or None when it does not look like one."""
    if not (s.isdigit() and s.isascii()):  # the fast path: plain digits
        if _NUMBER.fullmatch(s) is None:
            return None
        if "." in s or "e" in s or "E" in s:
            return float(s)
    try:
        return int(s)  # ints stay exact (int vs float comparisons are exact in Python)
    except ValueError:  # more digits than sys.get_int_max_str_digits()
        return float(s)


_BOOLS = {"true": True, "false": False}


def _to_bool(s: str) -> bool | None:
    return _BOOLS.get(s.lower()) if len(s) <= 5 else None


def _describe(text: str, tok: _Token) -> str:
    if tok[0] == "end":
        return "end of selector"
    src = text[tok[2]:tok[3]]
    return f"token {src if len(src) <= 40 else src[:37] + '...'!r}"
