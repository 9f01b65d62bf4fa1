"""LIKE matching for selectors, in linear time and without regular expressions (see ``_like_matcher``)."""

from __future__ import annotations

from itertools import repeat
from typing import Callable

from .selector_lexer import SelectorError


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
