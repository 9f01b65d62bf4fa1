"""Message selectors: the SQL-92 subset a SUBSCRIBE `selector` header may carry (as in ActiveMQ).

compile_selector(text) parses once and returns a predicate over a message's headers (str -> str).
The predicate is a tree of small closures; user text never reaches eval/exec.

Three-valued logic without a third value: every node is compiled into a pair of plain boolean
functions, is_true(h) and is_false(h); UNKNOWN is "neither". Then
    T(a AND b) = T(a) and T(b)     F(a AND b) = F(a) or F(b)
    T(a OR b)  = T(a) or T(b)      F(a OR b)  = F(a) and F(b)
    T(NOT a)   = F(a)              F(NOT a)   = T(a)
and the selector is the root's is_true, so per-message evaluation never handles None/UNKNOWN.

Split in four: ``selector_lexer`` (tokens, numbers), ``selector_eval`` (the node pairs),
``selector_like`` (LIKE matching) and this module (the parser and ``compile_selector``).
"""

from __future__ import annotations

from .selector_eval import (Predicate, _and, _compare, _const, _in, _is_null, _like, _Operand, _or,
                            _Pair)
from .selector_lexer import _COMPARISONS, SelectorError, _describe, _tokenize, _Token
from .selector_like import _like_matcher

MAX_DEPTH = 100  # maximum parenthesis nesting

__all__ = ["SelectorError", "compile_selector", "MAX_DEPTH"]


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

        if self.accept("kw", "IS"):
            self.need_header(left, tok)
            negate = self.accept("kw", "NOT")
            self.expect("kw", "NULL")
            pair = _is_null(left[1])
            return (pair[1], pair[0]) if negate else pair
        return self.parse_in_like_between(left)

    def parse_in_like_between(self, left: _Operand) -> _Pair:
        """[NOT] IN (...), [NOT] LIKE '...' [ESCAPE '.'], [NOT] BETWEEN a AND b, after the operand."""
        negate = self.accept("kw", "NOT")
        tok = self.peek()
        if tok[0] == "kw" and tok[1] in ("IN", "LIKE"):
            self.need_header(left, tok)
        if self.accept("kw", "IN"):
            pair = _in(left[1], self.parse_in_list())
        elif self.accept("kw", "LIKE"):
            pair = self.parse_like(left[1])
        elif self.accept("kw", "BETWEEN"):
            low = self.parse_operand()
            self.expect("kw", "AND")
            high = self.parse_operand()
            pair = _and([_compare(">=", left, low, tok[2]), _compare("<=", left, high, tok[2])])
        else:
            raise self.fail("IN, LIKE or BETWEEN")
        return (pair[1], pair[0]) if negate else pair

    def parse_in_list(self) -> list[_Operand]:
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
        return items

    def parse_like(self, name: str) -> _Pair:
        pattern_pos = self.peek()[2]
        pattern = self.parse_string()
        escape = None
        if self.accept("kw", "ESCAPE"):
            esc_tok = self.peek()
            escape = self.parse_string()
            if len(escape) != 1:
                raise SelectorError("ESCAPE must be a single character", esc_tok[2])
        return _like(name, _like_matcher(pattern, escape, pattern_pos))



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
