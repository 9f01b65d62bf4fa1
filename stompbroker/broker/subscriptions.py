"""Which subscriptions does a destination reach? Exact names and ``*`` prefixes, indexed.

stompica's wildcard rule: a pattern containing ``*`` matches every destination that starts with the
text before its first ``*`` (``*`` alone matches everything). Patterns are indexed by that prefix, and
a lookup tries only the prefix lengths in use, so the cost does not grow with the number of
subscriptions. Results are cached per destination until the next subscribe or unsubscribe.
"""

from __future__ import annotations

from .vhosts import MARK, shown


class SubscriptionIndex:
    def __init__(self, vhosts: bool = False):
        self.vhosts = vhosts  # several virtual hosts: a pattern reaches into one only from inside it
        self.exact: dict[str, list] = {}
        self.prefixed: dict[str, list] = {}
        self._prefix_lengths: dict[int, int] = {}  # prefix length -> number of patterns of that length
        self._cache: dict[str, tuple] = {}

    def __len__(self) -> int:
        return sum(map(len, self.exact.values())) + sum(map(len, self.prefixed.values()))

    @staticmethod
    def wildcard_prefix(pattern: str) -> str | None:
        star = pattern.find("*")
        return None if star < 0 else pattern[:star]

    def add(self, pattern: str, sub) -> None:
        prefix = self.wildcard_prefix(pattern)
        if prefix is None:
            self.exact.setdefault(pattern, []).append(sub)
        else:
            self.prefixed.setdefault(prefix, []).append(sub)
            self._prefix_lengths[len(prefix)] = self._prefix_lengths.get(len(prefix), 0) + 1
        self._cache.clear()

    def remove(self, pattern: str, sub) -> None:
        prefix = self.wildcard_prefix(pattern)
        table, key = (self.exact, pattern) if prefix is None else (self.prefixed, prefix)
        subs = table.get(key)
        if not subs or sub not in subs:
            return
        subs.remove(sub)
        if not subs:
            del table[key]
        if prefix is not None:
            n = self._prefix_lengths[len(prefix)] - 1
            if n:
                self._prefix_lengths[len(prefix)] = n
            else:
                del self._prefix_lengths[len(prefix)]
        self._cache.clear()

    def match(self, destination: str) -> tuple:
        """Subscriptions reached by a destination, in subscription order within each pattern."""
        found = self._cache.get(destination)
        if found is None:
            found = list(self.exact.get(destination, ()))
            mark = destination.find(MARK) if self.vhosts else -1  # (vhosts.py)
            for length in self._prefix_lengths:
                if mark < length <= len(destination):
                    found.extend(self.prefixed.get(destination[:length], ()))
            found = tuple(found)
            if len(self._cache) > 100_000:  # destinations are client-chosen: keep the cache bounded
                self._cache.clear()
            self._cache[destination] = found
        return found

    def patterns(self, raw: bool = False) -> list[str]:
        """The patterns subscribed to (a virtual host's shown ``VHOST:pattern``; ``raw``: the
        broker's names), for DIAG."""
        patterns = list(self.exact) + [p + "*" for p in self.prefixed]
        return [shown(p) for p in patterns] if self.vhosts and not raw else patterns
