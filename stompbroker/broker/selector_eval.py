"""Selector nodes: each a pair of plain boolean functions of the headers, (is_true, is_false),
for three-valued logic without a third value (see ``selector.py``): constants, AND/OR, comparisons,
IN, LIKE (matching itself in ``selector_like.py``) and IS NULL."""

from __future__ import annotations

import operator
from typing import Callable, Mapping

from .selector_lexer import SelectorError, _to_num

Headers = Mapping[str, str]
Predicate = Callable[[Headers], bool]
_Pair = tuple[Predicate, Predicate]  # (is_true, is_false)


_BOOLS = {"true": True, "false": False}


def _to_bool(s: str) -> bool | None:
    return _BOOLS.get(s.lower()) if len(s) <= 5 else None



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
    if right[0] == "h":  # header vs header: only possible with conv None, i.e. as strings
        return _headers_compare(left[1], right[1], fn)
    c = literal(right)
    if c is None:  # e.g. x = 'abc' + numeric context: never comparable
        return _UNKNOWN
    return _header_compare(left[1], fn, c, conv)


def _headers_compare(name: str, other: str, fn) -> _Pair:
    def hh_t(h: Headers) -> bool:
        a, b = h.get(name), h.get(other)
        return a is not None and b is not None and fn(a, b)

    def hh_f(h: Headers) -> bool:
        a, b = h.get(name), h.get(other)
        return a is not None and b is not None and not fn(a, b)

    return hh_t, hh_f


def _header_compare(name: str, fn, c: object, conv: Callable[[str], object] | None) -> _Pair:
    """A header against a constant ``c``, the header read by ``conv`` (None: as a string)."""
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
