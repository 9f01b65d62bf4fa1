"""Destination -> NATS subject mapping and the cover set (stompbroker/cluster/subjects.py), byte by byte."""

from __future__ import annotations

import pytest

from stompbroker.cluster import subjects as S


@pytest.mark.parametrize("destination, subject", [
    ("/topic/a/b", "c.t.topic.a.b"),
    ("/topic/price.eu", "c.t.topic.price%2Eeu"),
    ("/topic/a*b", "c.t.topic.a%2Ab"),
    ("/topic/x>y", "c.t.topic.x%3Ey"),
    ("/topic/a b", "c.t.topic.a%20b"),
    ("/topic/100%", "c.t.topic.100%25"),
    ("/topic/a/", "c.t.topic.a.%"),
    ("/topic//b", "c.t.topic.%.b"),
    ("/", "c.t.%"),
    ("news", "c.r.news"),
    ("news/eu", "c.r.news.eu"),
    ("/topic/é", "c.t.topic.%C3%A9"),
    ("/topic/tab\there", "c.t.topic.tab%09here"),
    ("/topic/Az09_-", "c.t.topic.Az09_-"),
])
def test_topic_subject(destination, subject):
    assert S.topic_subject("c", destination) == subject
    assert S.destination_of(subject) == destination


def test_every_token_is_a_valid_nats_token():
    nasty = "/topic/" + "".join(chr(i) for i in range(1, 256)) + "/../*/>/ /%/"
    subject = S.topic_subject("c", nasty)
    for token in subject.split("."):
        assert token and not set(token) & set(" \t\r\n*>"), token
    assert S.destination_of(subject) == nasty


def test_distinct_destinations_never_share_a_subject():
    names = ["/topic/a.b", "/topic/a/b", "/topic/a%2Eb", "/topic/a%b", "topic/a/b", "/topic/a/", "/topic/a",
             "/topic/a//", "/topic/%", "/topic/%25"]
    subjects = [S.topic_subject("c", n) for n in names]
    assert len(set(subjects)) == len(names), subjects


def test_worker_and_queue_subjects():
    assert S.worker_subject("c", "#jobs") == "c.w.jobs"
    assert S.worker_subject("c", "#a.b c") == "c.w.a%2Eb%20c"
    assert S.destination_of("c.w.a%2Eb%20c") == "#a.b c"
    assert S.queue_subject("c", "/queue/q.1") == "c.q.queue.q%2E1"


@pytest.mark.parametrize("pattern, filters", [
    ("/topic/a", ["c.t.topic.a"]),
    ("/topic/a*", ["c.t.topic.>"]),            # prefix /topic/a: its last whole segment is "topic"
    ("/topic/a/*", ["c.t.topic.a.>"]),
    ("/topic/a.b/c*", ["c.t.topic.a%2Eb.>"]),
    ("/topic*", ["c.t.>"]),
    ("/*", ["c.t.>"]),
    ("*", ["c.t.>", "c.r.>"]),
    ("new*", ["c.r.>"]),
    ("news/e*", ["c.r.news.>"]),
])
def test_pattern_filters(pattern, filters):
    assert S.pattern_filters("c", pattern) == filters


def test_wildcard_filter_is_a_superset_of_what_the_pattern_matches():
    # `/topic/a*` matches /topic/a, /topic/ab and /topic/a/b/c: all under c.t.topic.>
    (wide,) = S.pattern_filters("c", "/topic/a*")
    for destination in ("/topic/a", "/topic/ab", "/topic/a/b/c", "/topic/a."):
        assert S.topic_subject("c", destination).startswith(wide[:-1])


def test_cover_keeps_no_two_overlapping_subscriptions():
    filters = ["c.t.topic.a", "c.t.topic.>", "c.t.topic.a.>", "c.t.other", "c.r.x", "c.t.topic.b.c",
               "c.t.>"] 
    assert S.cover(filters) == {"c.t.>", "c.r.x"}
    assert S.cover(["c.t.topic.a", "c.t.topic.a.>", "c.t.topic.ab"]) == {
        "c.t.topic.a", "c.t.topic.a.>", "c.t.topic.ab"}  # `a.>` needs a token after a: no overlap
    assert S.cover(["c.t.topic.a.>", "c.t.topic.a.b", "c.t.topic.a.b.>"]) == {"c.t.topic.a.>"}
    assert S.cover(["c.t.ab.>", "c.t.a.>"]) == {"c.t.ab.>", "c.t.a.>"}  # token boundaries, not text prefixes
    assert S.cover([]) == set()


def test_cover_never_overlaps_on_random_sets():
    import random
    rng = random.Random(7)
    tokens = ["a", "b", "ab"]
    for _ in range(300):
        filters = []
        for _ in range(rng.randint(1, 6)):
            path = ".".join(rng.choice(tokens) for _ in range(rng.randint(1, 3)))
            filters.append(f"c.{path}" + (".>" if rng.random() < 0.4 else ""))
        chosen = S.cover(filters)
        for subject in ("c." + ".".join(p) for p in _paths(tokens, 4)):
            wanted = any(_match(f, subject) for f in filters)
            hits = sum(_match(f, subject) for f in chosen)
            assert hits == (1 if wanted else 0), (filters, chosen, subject)


def _paths(tokens, depth):
    if depth == 0:
        return [()]
    shorter = _paths(tokens, depth - 1)
    return [()] + [(t,) + p for t in tokens for p in shorter if len(p) < depth]


def _match(filter_: str, subject: str) -> bool:
    f, s = filter_.split("."), subject.split(".")
    if f[-1] == ">":
        return len(s) > len(f) - 1 and s[:len(f) - 1] == f[:-1]
    return f == s
