"""Message selectors: the SQL-92 subset a SUBSCRIBE `selector` header may carry (as in ActiveMQ).

compile_selector(text) parses once and returns a predicate over a message's headers (str -> str).
The predicate is a tree of small closures; user text never reaches eval/exec.

Three-valued logic without a third value: every node is compiled into a pair of plain boolean
functions, is_true(h) and is_false(h); UNKNOWN is "neither". Then
    T(a AND b) = T(a) and T(b)     F(a AND b) = F(a) or F(b)
    T(a OR b)  = T(a) or T(b)      F(a OR b)  = F(a) and F(b)
    T(NOT a)   = F(a)              F(NOT a)   = T(a)
and the selector is the root's is_true, so per-message evaluation never handles None/UNKNOWN.
"""

from __future__ import annotations

import operator
import re
from itertools import repeat
from typing import Callable, Mapping

Headers = Mapping[str, str]
Predicate = Callable[[Headers], bool]
_Pair = tuple[Predicate, Predicate]  # (is_true, is_false)

MAX_DEPTH = 100  # maximum parenthesis nesting

__all__ = ["SelectorError", "compile_selector", "MAX_DEPTH"]


class SelectorError(ValueError):
    """Invalid selector. `position` is the 0-based character offset of the problem, if known."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message if position is None else f"{message} at {position}")
        self.position = position


# ---------------------------------------------------------------------------- tokens

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


# ---------------------------------------------------------------------------- node builders


def _yes(h: Headers) -> bool:
    return True


def _no(h: Headers) -> bool:
    return False


_TRUE: _Pair = (_yes, _no)
_FALSE: _Pair = (_no, _yes)
_UNKNOWN: _Pair = (_no, _no)


def _const(value: bool | None) -> _Pair:
    return _TRUE if value is True else _FALSE if value is False else _UNKNOWN


def _all(fns: list[Predicate]) -> Predicate:
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:  # the common case, without the loop
        a, b = fns
        return lambda h: a(h) and b(h)
    fns_t = tuple(fns)

    def all_(h: Headers) -> bool:
        for f in fns_t:
            if not f(h):
                return False
        return True

    return all_


def _any(fns: list[Predicate]) -> Predicate:
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        a, b = fns
        return lambda h: a(h) or b(h)
    fns_t = tuple(fns)

    def any_(h: Headers) -> bool:
        for f in fns_t:
            if f(h):
                return True
        return False

    return any_


def _and(pairs: list[_Pair]) -> _Pair:
    return _all([t for t, _ in pairs]), _any([f for _, f in pairs])


def _or(pairs: list[_Pair]) -> _Pair:
    return _any([t for t, _ in pairs]), _all([f for _, f in pairs])


_OPS = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt,
    ">": operator.gt, "<=": operator.le, ">=": operator.ge,
}
_MIRROR = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}

# An operand: ('h', header name), ('s', str), ('n', int|float) or ('b', bool)
_Operand = tuple[str, object]


def _compare(op: str, left: _Operand, right: _Operand, pos: int) -> _Pair:
    kinds = {left[0], right[0]}
    conv: Callable[[str], object] | None  # how strings are read in this comparison; None: as strings
    if "n" in kinds and "b" in kinds:
        raise SelectorError("cannot compare a number with a boolean", pos)
    if "n" in kinds:
        conv = _to_num
    elif "b" in kinds:
        if op not in ("=", "<>"):
            raise SelectorError(f"operator {op!r} cannot compare booleans", pos)
        conv = _to_bool
    else:
        conv = None

    def literal(operand: _Operand) -> object:
        kind, value = operand
        return conv(value) if kind == "s" and conv is not None else value

    fn = _OPS[op]
    if left[0] != "h" and right[0] != "h":  # two literals: decide now
        a, b = literal(left), literal(right)
        return _const(None if a is None or b is None else bool(fn(a, b)))
    if left[0] != "h":  # keep the header on the left
        left, right, fn = right, left, _OPS[_MIRROR[op]]
    name = left[1]

    if right[0] == "h":  # header vs header: only possible with conv None, i.e. as strings
        other = right[1]

        def hh_t(h: Headers) -> bool:
            a, b = h.get(name), h.get(other)
            return a is not None and b is not None and fn(a, b)

        def hh_f(h: Headers) -> bool:
            a, b = h.get(name), h.get(other)
            return a is not None and b is not None and not fn(a, b)

        return hh_t, hh_f

    c = literal(right)
    if c is None:  # e.g. x = 'abc' + numeric context: never comparable
        return _UNKNOWN
    if conv is None:

        def str_t(h: Headers) -> bool:
            v = h.get(name)
            return v is not None and fn(v, c)

        def str_f(h: Headers) -> bool:
            v = h.get(name)
            return v is not None and not fn(v, c)

        return str_t, str_f

    def conv_t(h: Headers) -> bool:
        v = h.get(name)
        if v is None:
            return False
        v = conv(v)
        return v is not None and fn(v, c)

    def conv_f(h: Headers) -> bool:
        v = h.get(name)
        if v is None:
            return False
        v = conv(v)
        return v is not None and not fn(v, c)

    return conv_t, conv_f


def _in(name: str, items: list[_Operand]) -> _Pair:
    # x IN (a, b) is x = a OR x = b; string items match as strings, number items numerically.
    strs = frozenset(v for k, v in items if k == "s")
    nums = frozenset(v for k, v in items if k == "n")

    def in_t(h: Headers) -> bool:
        v = h.get(name)
        if v is None:
            return False
        if v in strs:
            return True
        if nums:
            n = _to_num(v)
            return n is not None and n in nums
        return False

    def in_f(h: Headers) -> bool:
        v = h.get(name)
        if v is None or v in strs:
            return False
        if nums:
            n = _to_num(v)
            return n is not None and n not in nums  # not a number: UNKNOWN, not FALSE
        return True

    return in_t, in_f


def _like_matcher(pattern: str, escape: str | None, pos: int) -> Callable[[str], bool]:
    """Match `pattern` ('%' any run, '_' one char) against a whole string, in linear time.

    No regex: a backtracking engine makes '%____...%' or '%a%a%a%b' cost len(value) * len(pattern)
    steps or worse, and a subscriber must not be able to stall the broker. The pattern is split at
    '%' into fixed-length segments (characters and '_' holes); the first and last are anchored and
    checked in place, the middle ones are placed greedily left to right (correct when the only
    variable-length wildcard is '%'). A middle segment is found with str.find when it has no hole,
    by length alone when it is all holes, and otherwise by a bit-parallel automaton (shift-and: one
    step per character of the value, each an operation on an int of len(segment) bits), after
    skipping ahead with str.find to the first place its longest run of characters can be.
    """
    segments: list[list[str | None]] = [[]]  # characters, None for '_'
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            nxt = next(chars, None)
            if nxt is None or nxt not in ("%", "_", escape):
                raise SelectorError("invalid escape sequence in LIKE pattern", pos)
            segments[-1].append(nxt)
        elif ch == "%":
            segments.append([])
        else:
            segments[-1].append(None if ch == "_" else ch)
    if len(segments) == 1:
        whole = _fixed(segments[0])
        size = len(segments[0])
        return lambda s: len(s) == size and whole(s, 0)

    head, tail = segments[0], segments[-1]
    at_head, at_tail = _fixed(head), _fixed(tail)
    head_len, tail_len = len(head), len(tail)
    finders = [_finder(seg) for seg in segments[1:-1] if seg]
    min_len = sum(map(len, segments))

    def like(s: str) -> bool:
        if len(s) < min_len:
            return False
        end = len(s) - tail_len
        if not at_head(s, 0) or not at_tail(s, end):
            return False
        start = head_len
        for find in finders:
            start = find(s, start, end)
            if start < 0:
                return False
        return True

    return like


def _pieces(segment: list[str | None]) -> list[tuple[int, str]]:
    """(offset, text) of each run of characters of a segment."""
    pieces: list[tuple[int, str]] = []
    run_start = None
    for i, ch in enumerate(segment + [None]):
        if ch is not None and run_start is None:
            run_start = i
        elif ch is None and run_start is not None:
            pieces.append((run_start, "".join(segment[run_start:i])))
            run_start = None
    return pieces


def _fixed(segment: list[str | None]) -> Callable[[str, int], bool]:
    """f(s, at): the segment matches s at position `at` (the caller checked the length)."""
    pieces = _pieces(segment)
    if len(pieces) == 1 and len(pieces[0][1]) == len(segment):
        text = pieces[0][1]
        return lambda s, at: s.startswith(text, at)
    return lambda s, at: all(s.startswith(text, at + offset) for offset, text in pieces)


def _finder(segment: list[str | None]) -> Callable[[str, int, int], int]:
    """f(s, start, end): the end of the segment's leftmost match within s[start:end], or -1."""
    size = len(segment)
    pieces = _pieces(segment)
    if not pieces:  # all '_': any `size` characters
        return lambda s, start, end: start + size if start + size <= end else -1
    if len(pieces) == 1 and len(pieces[0][1]) == size:
        text = pieces[0][1]

        def find_text(s: str, start: int, end: int) -> int:
            at = s.find(text, start, end)
            return -1 if at < 0 else at + size

        return find_text
    # Shift-and: bit i of `state` means "the first i+1 positions of the segment match here".
    any_char = 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(segment):
        if ch is None:
            any_char |= 1 << i
        else:
            masks[ch] = masks.get(ch, 0) | 1 << i
    for ch in masks:
        masks[ch] |= any_char
    done = 1 << (size - 1)
    offset, longest = max(pieces, key=lambda p: len(p[1]))

    last = size - offset - len(longest)  # characters after the longest run

    def find_holes(s: str, start: int, end: int) -> int:
        while True:
            first = s.find(longest, start + offset, end - last)
            if first < 0:
                return -1
            start = first - offset  # no match starts earlier
            state = 0
            for i, mask in enumerate(map(masks.get, s[start:end], repeat(any_char)), start):
                state = ((state << 1) | 1) & mask
                if state & done:
                    return i + 1
                if not state:  # nothing in progress: skip to the next place the run occurs
                    start = i + 1
                    break
            else:
                return -1

    return find_holes


def _like(name: str, matcher: Callable[[str], bool]) -> _Pair:
    def like_t(h: Headers) -> bool:
        v = h.get(name)
        return v is not None and matcher(v)

    def like_f(h: Headers) -> bool:
        v = h.get(name)
        return v is not None and not matcher(v)

    return like_t, like_f


def _is_null(name: str) -> _Pair:
    def null_t(h: Headers) -> bool:
        return h.get(name) is None

    def null_f(h: Headers) -> bool:
        return h.get(name) is not None

    return null_t, null_f


# ---------------------------------------------------------------------------- parser


def _describe(text: str, tok: _Token) -> str:
    if tok[0] == "end":
        return "end of selector"
    src = text[tok[2]:tok[3]]
    return f"token {src if len(src) <= 40 else src[:37] + '...'!r}"


class _Parser:
    """Recursive descent; precedence OR < AND < NOT < comparison."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0

    def fail(self, expected: str | None = None) -> SelectorError:
        tok = self.tokens[self.i]
        msg = f"unexpected {_describe(self.text, tok)} at {tok[2]}"
        err = SelectorError(msg + (f", expected {expected}" if expected else ""))
        err.position = tok[2]
        return err

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        if tok[0] != "end":
            self.i += 1
        return tok

    def accept(self, kind: str, value: str) -> bool:
        tok = self.tokens[self.i]
        if tok[0] == kind and tok[1] == value:
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: str) -> None:
        if not self.accept(kind, value):
            raise self.fail(repr(value))

    def parse(self) -> Predicate:
        if self.peek()[0] == "end":
            raise SelectorError("empty selector", 0)
        is_true, _ = self.parse_or()
        if self.peek()[0] != "end":
            raise self.fail()  # trailing tokens
        return is_true

    def parse_or(self) -> _Pair:
        terms = [self.parse_and()]
        while self.accept("kw", "OR"):
            terms.append(self.parse_and())
        return _or(terms)

    def parse_and(self) -> _Pair:
        terms = [self.parse_not()]
        while self.accept("kw", "AND"):
            terms.append(self.parse_not())
        return _and(terms)

    def parse_not(self) -> _Pair:
        negate = False
        while self.accept("kw", "NOT"):  # a loop, not recursion: NOT NOT ... costs no stack
            negate = not negate
        is_true, is_false = self.parse_predicate()
        return (is_false, is_true) if negate else (is_true, is_false)

    def parse_operand(self, what: str = "a header name or literal") -> _Operand:
        kind, value, _, _ = self.peek()
        if kind == "id":
            operand: _Operand = ("h", value)
        elif kind == "str":
            operand = ("s", value)
        elif kind == "num":
            operand = ("n", value)
        elif kind == "kw" and value in ("TRUE", "FALSE"):
            operand = ("b", value == "TRUE")
        else:
            raise self.fail(what)
        self.i += 1
        return operand

    def parse_string(self) -> str:
        tok = self.peek()
        if tok[0] != "str":
            raise self.fail("a string literal")
        self.i += 1
        return tok[1]

    def need_header(self, left: _Operand, tok: _Token) -> None:
        if left[0] != "h":  # IS / IN / LIKE apply to headers only
            raise SelectorError(f"{tok[1]} needs a header name on its left", tok[2])

    def parse_predicate(self) -> _Pair:
        start = self.peek()
        if start[0] == "op" and start[1] == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise SelectorError(f"nesting deeper than {MAX_DEPTH}", start[2])
            self.i += 1
            pair = self.parse_or()
            self.expect("op", ")")
            self.depth -= 1
            return pair

        left = self.parse_operand()
        tok = self.peek()
        if tok[0] == "op" and tok[1] in _COMPARISONS:
            self.i += 1
            return _compare(tok[1], left, self.parse_operand(), tok[2])

        if tok[0] != "kw" or tok[1] not in ("IS", "NOT", "IN", "LIKE", "BETWEEN"):
            if left[0] == "b":  # bare TRUE / FALSE
                return _const(left[1])
            raise self.fail("a comparison")

        name = left[1]
        if self.accept("kw", "IS"):
            self.need_header(left, tok)
            negate = self.accept("kw", "NOT")
            self.expect("kw", "NULL")
            pair = _is_null(name)
            return (pair[1], pair[0]) if negate else pair

        negate = self.accept("kw", "NOT")
        tok = self.peek()
        if tok[0] == "kw" and tok[1] in ("IN", "LIKE"):
            self.need_header(left, tok)
        if self.accept("kw", "IN"):
            self.expect("op", "(")
            items: list[_Operand] = []
            if self.peek()[:2] == ("op", ")"):
                raise SelectorError("IN list is empty", self.peek()[2])
            while True:
                if self.peek()[0] not in ("str", "num"):
                    raise self.fail("a string or number literal")
                items.append(self.parse_operand())
                if not self.accept("op", ","):
                    break
            self.expect("op", ")")
            pair = _in(name, items)
        elif self.accept("kw", "LIKE"):
            pattern_pos = self.peek()[2]
            pattern = self.parse_string()
            escape = None
            if self.accept("kw", "ESCAPE"):
                esc_tok = self.peek()
                escape = self.parse_string()
                if len(escape) != 1:
                    raise SelectorError("ESCAPE must be a single character", esc_tok[2])
            pair = _like(name, _like_matcher(pattern, escape, pattern_pos))
        elif self.accept("kw", "BETWEEN"):
            low = self.parse_operand()
            self.expect("kw", "AND")
            high = self.parse_operand()
            pair = _and([_compare(">=", left, low, tok[2]), _compare("<=", left, high, tok[2])])
        else:
            raise self.fail("IN, LIKE or BETWEEN")
        return (pair[1], pair[0]) if negate else pair


def compile_selector(text: str) -> Predicate:
    """Parse `text` once; return f(headers) -> bool, True only when the selector is TRUE.

    Keywords are case-insensitive; identifiers are header names (a missing header is NULL);
    a header compared with a number literal is read as a number (if it does not look like one,
    the comparison is UNKNOWN); strings compare by code point. Raises SelectorError only.
    """
    if not isinstance(text, str):
        raise SelectorError(f"selector must be a string, not {type(text).__name__}")
    try:
        return _Parser(text).parse()
    except RecursionError:  # only if called with the stack already nearly full
        raise SelectorError("selector too deeply nested") from None
