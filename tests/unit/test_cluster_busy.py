"""The bridge's side of busy nodes (cluster/topics.py): a node's word that it is behind, heard from
the others and told to the dispatcher per pattern. A fake connection: no NATS."""

from __future__ import annotations

import asyncio
import types

from stompbroker.cluster import records as C
from stompbroker.cluster.topics import BUSY_TTL, Topics


class Bridge:
    def __init__(self):
        self.cluster, self.node, self.connected = "c", "n1", True
        self.nc = types.SimpleNamespace(is_connected=True, _pending=[], _pending_data_size=0, _flush_queue=None,
                                        max_payload=1 << 20)
        self.records: list[tuple[str, bytes, int]] = []

    def emit(self, kind: int, conn: int = 0, payload: bytes = b"", aux: int = 0) -> None:
        self.records.append((C.Kind(kind).name, bytes(payload), aux))

    def flush(self) -> None:
        pass

    def told(self, kind: str = "REMOTE_BUSY") -> dict:
        out = {payload.decode(): aux for name, payload, aux in self.records if name == kind}
        self.records.clear()
        return out


def word(node: str, flag: int) -> bytes:
    return b"%s %d" % (node.encode(), flag)


def test_the_dispatcher_hears_per_pattern_how_many_of_its_subscribers_nodes_are_busy():
    bridge = Bridge()
    t = Topics(bridge)
    t.node_interest("n2", {"/topic/a": 1, "/topic/b*": 2, "\x00/topic/d": 1})
    t.node_interest("n3", {"/topic/a": 4})
    bridge.told()
    heard = t.received_busy
    heard(b"c.busy", b"", word("n2", 1), "")
    assert bridge.told() == {"/topic/a": 1, "/topic/b*": 1}    # (a durable pattern reads JetStream: never)
    heard(b"c.busy", b"", word("n3", 1), "")
    assert bridge.told() == {"/topic/a": 2}
    heard(b"c.busy", b"", word("n3", 1), "")                  # a repeat: nothing new
    heard(b"c.busy", b"", word("n1", 1), "")                  # this node's own word
    heard(b"c.busy", b"", word("n9", 1), "")                  # a node with no interest known
    heard(b"c.busy", b"", b"x" * 300 + b" 1", "")
    heard(b"c.busy", b"", b"garbage", "")
    assert bridge.told() == {} and sorted(t.busy_nodes) == ["n2", "n3"]
    t.node_interest("n2", {"/topic/b*": 2})                  # a busy node's interest changes
    assert bridge.told() == {"/topic/a": 1}
    heard(b"c.busy", b"", word("n2", 0), "")
    assert bridge.told() == {"/topic/b*": 0}
    t.node_interest("n3", {})                                # a node that left
    assert bridge.told() == {"/topic/a": 0}
    assert t.status()["busy_nodes"] == ["n3"]


def test_a_busy_word_not_repeated_ends_after_busy_ttl():
    bridge = Bridge()
    t = Topics(bridge)
    t.node_interest("n2", {"/topic/a": 1})
    t.received_busy(b"c.busy", b"", word("n2", 1), "")
    bridge.told()
    until = t.busy_nodes["n2"]
    t.expire_busy(until - 0.01)
    assert bridge.told() == {}
    t.expire_busy(until)
    assert bridge.told() == {"/topic/a": 0} and t.busy_nodes == {}
    assert 1.0 <= BUSY_TTL <= 5.0


def test_this_nodes_word_goes_to_the_others_when_it_changes():
    bridge = Bridge()
    t = Topics(bridge)

    async def run():
        await t.busy(0, 1, b"")
        await t.busy(0, 0, b"")
    asyncio.run(run())
    assert bridge.nc._pending == [b"PUB c.busy 4\r\nn1 1\r\n", b"PUB c.busy 4\r\nn1 0\r\n"]
    assert t.status()["busy"] is False
