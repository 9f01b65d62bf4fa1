"""Which stream holds a destination, and which leader moves spread the shards (cluster/shards.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from stompbroker.cluster import shards as S


def test_shard_of_is_stable_and_spreads():
    # pinned: a node of another version or run must put a destination in the same shard
    assert S.shard_of("/queue/orders", 6) == 5 and S.shard_of("/queue/orders", 5) == 3   # crc32 of the UTF-8
    assert S.shard_of("/queue/anything", 1) == 0
    counts = Counter(S.shard_of(f"/queue/q{i}", 6) for i in range(6000))
    assert set(counts) == set(range(6)) and max(counts.values()) < 1.15 * min(counts.values())  # (±5 % here)


def test_layout_one_keeps_the_single_stream_names():
    assert S.stream_name("c", S.QUEUES, 1, 0) == "c_QUEUES" and S.stream_name("c", S.TOPICS, 1, 0) == "c_TOPICS"
    assert S.queue_subject("c", 1, "/queue/a.b") == "c.q.queue.a%2Eb"
    assert S.topic_subject("c", 1, "/topic/x") == "c.d.t.topic.x"


def test_sharded_names_and_subjects():
    i = S.shard_of("/queue/a", 6)
    assert S.stream_name("c", S.QUEUES, 6, i) == f"c_QUEUES_6_{i}"
    assert S.queue_subject("c", 6, "/queue/a") == f"c.q6_{i}.queue.a"
    j = S.shard_of("/topic/x", 6)
    assert S.topic_subject("c", 6, "/topic/x") == f"c.d6_{j}.t.topic.x"
    assert S.topic_subject("c", 6, "rel") == f"c.d6_{S.shard_of('rel', 6)}.r.rel"


@pytest.mark.parametrize("name, parsed", [
    ("c_QUEUES", ("q", 1, 0)), ("c_TOPICS", ("d", 1, 0)), ("c_QUEUES_6_5", ("q", 6, 5)), ("c_TOPICS_3_0", ("d", 3, 0)),
    ("c_QUEUES_6_6", None), ("c_QUEUES_1_0", None), ("c_OTHER", None), ("d_QUEUES", None), ("KV_c_interest", None),
    ("c_QUEUES_6", None)])
def test_parse_stream(name, parsed):
    assert S.parse_stream("c", name) == parsed


def test_reads_one_shard_per_layout_and_every_shard_for_a_wildcard():
    q = S.reads("c", S.QUEUES, "/queue/a", [6, 1, 3])
    assert q == [("c_QUEUES", ["c.q.queue.a"]),
                 (f"c_QUEUES_3_{S.shard_of('/queue/a', 3)}", [S.queue_subject("c", 3, "/queue/a")]),
                 (f"c_QUEUES_6_{S.shard_of('/queue/a', 6)}", [S.queue_subject("c", 6, "/queue/a")])]
    exact = S.reads("c", S.TOPICS, "/topic/x", [4])
    assert exact == [(f"c_TOPICS_4_{S.shard_of('/topic/x', 4)}", [S.topic_subject("c", 4, "/topic/x")])]
    wild = S.reads("c", S.TOPICS, "/topic/a*", [3])
    assert wild == [(f"c_TOPICS_3_{i}", [f"c.d3_{i}.t.topic.>"]) for i in range(3)]
    # every subject a wildcard's destination is kept on is under one of its filters
    for dest in ("/topic/ab", "/topic/a/b"):
        subject = S.topic_subject("c", 3, dest)
        assert any(subject.startswith(f[:-1]) for _, filters in wild for f in filters)
    star = S.reads("c", S.TOPICS, "*", [2])
    assert star == [(f"c_TOPICS_2_{i}", [f"c.d2_{i}.t.>", f"c.d2_{i}.r.>"]) for i in range(2)]


def test_layouts_present():
    names = ["c_QUEUES", "c_QUEUES_6_0", "c_QUEUES_6_4", "c_TOPICS_6_1", "x_QUEUES", "KV_c_interest"]
    assert S.layouts("c", names, S.QUEUES) == {1: {0}, 6: {0, 4}}
    assert S.layouts("c", names, S.TOPICS) == {6: {1}}


def spread(streams, moves):
    led = {name: leader for name, (leader, _) in streams.items()}
    led.update(dict(moves))
    return Counter(led.values())


def test_moves_spread_leaders_with_the_fewest_moves():
    servers = ["a", "b", "c"]
    streams = {f"s{i}": ("a", servers) for i in range(6)}   # one server leads all six
    moves = S.moves(streams)
    assert len(moves) == 4 and sorted(spread(streams, moves).values()) == [2, 2, 2]
    balanced = {"s0": ("a", servers), "s1": ("b", servers), "s2": ("c", servers), "s3": ("a", servers)}
    assert S.moves(balanced) == []   # 2, 1, 1: off by one at most is spread
    five = [f"n{i}" for i in range(5)]
    streams = {f"s{i}": ("n0" if i < 3 else "n1", five) for i in range(5)}
    assert sorted(spread(streams, S.moves(streams)).values()) == [1, 1, 1, 1, 1]


def test_moves_go_only_to_current_replicas_and_leave_single_copies():
    # s0..s3 led by a; b is down (not a current replica of any)
    streams = {f"s{i}": ("a", ["a", "c"]) for i in range(4)}
    moves = S.moves(streams)
    assert {t for _, t in moves} == {"c"} and len(moves) == 2
    assert S.moves({f"s{i}": ("a", ["a"]) for i in range(4)}) == []          # one replica: nowhere to go
    assert S.moves({"s0": ("", ["a", "b"]), "s1": ("", ["a", "b"])}) == []   # no leader (electing)


def test_moves_chain_through_a_server_when_the_ends_share_no_stream():
    # 3 copies over 5 servers: a leads two streams, e leads none, and no stream of a has a copy on e;
    # b leads one that e holds: b's goes to e, one of a's to b
    streams = {"s0": ("a", ["a", "b", "c"]), "s1": ("a", ["a", "b", "d"]), "s2": ("b", ["b", "e", "c"]),
               "s3": ("c", ["c", "d", "a"]), "s4": ("d", ["d", "c", "b"])}
    moves = S.moves(streams)
    assert sorted(spread(streams, moves).values()) == [1, 1, 1, 1, 1], moves
    assert len(moves) == 2 and ("s2", "e") in moves
