"""Answers that hold lists, cut to a byte budget: whole items only, and where the next part starts.

Every answer the broker builds from its state (a DIAG answer, a /queue/monitor status, an /api
page, the /metrics body) is bounded by ``max_answer_bytes`` (``Config.answer_bytes``): lists of
queues, subscriptions or connections can grow without bound, the ring that carries an answer to
its writer cannot. Pure functions; the callers say how a cut is shown (DIAG ``truncated`` and
``next-offset`` headers, an /api page's ``truncated``, a monitor status's last line).
"""

from __future__ import annotations

import orjson


def json_items(items: list, start: int, budget: int) -> tuple[bytes, int]:
    """A JSON array of ``items[start:]``, as many whole items as fit in ``budget`` bytes (always at
    least one, so a reader that continues from the returned index always gets further); returns the
    array and the index of the first item left out (``len(items)`` when none is)."""
    if start >= len(items):
        return b"[]", len(items)
    whole = orjson.dumps(items[start:] if start else items, option=orjson.OPT_NON_STR_KEYS)
    if len(whole) <= budget:
        return whole, len(items)
    parts = []
    used = 2  # the brackets
    end = start
    for item in items[start:]:
        part = orjson.dumps(item, option=orjson.OPT_NON_STR_KEYS)
        if parts and used + len(part) + 1 > budget:
            break
        parts.append(part)
        used += len(part) + 1
        end += 1
    return b"[" + b",".join(parts) + b"]", end


def json_iter(items, budget: int) -> tuple[bytes, int]:
    """As ``json_items``, from an iterator of the items from where the answer starts (only those
    that fit are made, plus one): the array and how many items it holds."""
    parts = []
    used = 2
    for item in items:
        part = orjson.dumps(item, option=orjson.OPT_NON_STR_KEYS)
        if parts and used + len(part) + 1 > budget:
            break
        parts.append(part)
        used += len(part) + 1
    return b"[" + b",".join(parts) + b"]", len(parts)


def joined(texts: list[str], start: int, budget: int, sep: str = ",") -> tuple[str, int]:
    """``sep``-joined ``texts[start:]`` within ``budget`` bytes (at least one), and where to continue."""
    used = 0
    end = start
    for text in texts[start:]:
        size = len(text.encode()) + len(sep)
        if end > start and used + size > budget:
            break
        used += size
        end += 1
    return sep.join(texts[start:end]), end
