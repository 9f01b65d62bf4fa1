"""Destination matching: exact names and `*` prefixes, looked up without scanning subscriptions."""

from __future__ import annotations

from stompbroker.broker.subscriptions import SubscriptionIndex


class CountingDict(dict):
    lookups = 0

    def get(self, key, default=None):
        CountingDict.lookups += 1
        return super().get(key, default)


def test_exact_and_wildcard_matches():
    index = SubscriptionIndex()
    index.add("/topic/a", "exact")
    index.add("/topic/*", "topics")
    index.add("*", "all")
    index.add("/queue/*", "queues")
    assert set(index.match("/topic/a")) == {"exact", "topics", "all"}
    assert set(index.match("/topic/a/b")) == {"topics", "all"}
    assert set(index.match("/queue/x")) == {"queues", "all"}
    assert index.match("/topi") == ("all",)
    index.remove("*", "all")
    assert set(index.match("/topic/a")) == {"exact", "topics"}  # the cache was dropped
    assert sorted(index.patterns()) == ["/queue/*", "/topic/*", "/topic/a"]


def test_matching_cost_does_not_grow_with_the_number_of_subscriptions():
    index = SubscriptionIndex()
    index.prefixed = CountingDict()
    for i in range(10_000):
        index.add(f"/topic/many/{i:05d}/*", i)  # 10,000 patterns, one prefix length
    CountingDict.lookups = 0
    assert index.match("/topic/many/04242/x") == (4242,)
    assert CountingDict.lookups == 1  # one dict lookup per prefix length in use, not per subscription
    CountingDict.lookups = 0
    index.match("/topic/many/04242/x")
    assert CountingDict.lookups == 0  # and repeated destinations come from the cache


def test_removing_the_last_pattern_of_a_length_forgets_that_length():
    index = SubscriptionIndex()
    index.add("/a*", 1)
    index.add("/abc*", 2)
    index.remove("/abc*", 2)
    index.remove("/abc*", 2)  # twice: harmless
    assert index.match("/abcd") == (1,)
    assert len(index) == 1
