"""cluster/leaders.Survey against a stand-in NATS connection: leaders are moved only from a whole
listing (during an election NATS leaves the streams whose leaders did not answer out of a listing,
as ``missing``: two nodes planning from such listings undid each other's moves, and a replay's
listing moved the leader of the very shard it was about to read), and a replay's names-only
listing moves nothing."""

import asyncio
from types import SimpleNamespace

import orjson

from stompbroker.cluster import leaders, shards

CLUSTER = "c1"
OWN = [shards.stream_name(CLUSTER, shards.TOPICS, 3, i) for i in range(3)]


def info(name: str, leader: str) -> dict:
    others = [s for s in ("nats0", "nats1", "nats2") if s != leader]
    return {"config": {"name": name, "subjects": [f"{name}.>"], "num_replicas": 3},
            "state": {"messages": 0, "bytes": 0, "first_seq": 0, "last_seq": 0, "consumer_count": 0},
            "cluster": {"name": "n", "leader": leader,
                        "replicas": [{"name": s, "current": True, "active": 0.1} for s in others]}}


class Nc:
    """Answers STREAM.LIST and STREAM.NAMES from ``streams``; records every other request."""

    def __init__(self, streams: list[dict], missing: list[str] = ()):
        self.streams, self.missing, self.asked = streams, list(missing), []

    async def request(self, subject, payload, timeout):
        if subject == "$JS.API.STREAM.LIST":
            answer = {"total": len(self.streams), "offset": 0, "streams": self.streams}
            if self.missing:
                answer["missing"] = self.missing
        elif subject == "$JS.API.STREAM.NAMES":
            answer = {"total": len(self.streams), "offset": 0, "streams": [s["config"]["name"] for s in self.streams]}
        else:
            self.asked.append(subject)
            answer = {"success": True}
        return SimpleNamespace(data=orjson.dumps(answer))


def survey(nc) -> leaders.Survey:
    return leaders.Survey(nc, CLUSTER, OWN)


def test_leaders_all_on_one_server_are_spread_from_a_whole_listing():
    nc = Nc([info(name, "nats0") for name in OWN])
    s = survey(nc)
    asyncio.run(s.run())
    assert s.whole and len(nc.asked) == 2
    assert all(subject.startswith("$JS.API.STREAM.LEADER.STEPDOWN.") for subject in nc.asked)


def test_a_listing_with_streams_missing_moves_no_leader_and_loses_no_stream():
    other = shards.stream_name(CLUSTER, shards.TOPICS, 6, 0)   # another layout's, read by this node
    led = [info(OWN[0], "nats0"), info(OWN[1], "nats0")]   # two streams' leaders did not answer
    nc = Nc(led, missing=[OWN[2], other])
    s = survey(nc)
    asyncio.run(s.run())
    assert nc.asked == []
    assert not s.whole
    assert s.present == set(OWN) | {other} and s.listed >= set(OWN)   # (not taken for deleted)


def test_a_listing_with_a_stream_in_an_election_moves_no_leader():
    nc = Nc([info(OWN[0], "nats0"), info(OWN[1], "nats0"), info(OWN[2], "")])
    s = survey(nc)
    asyncio.run(s.run())
    assert nc.asked == []
    assert s.whole


def test_names_finds_the_layouts_present_and_moves_nothing():
    other = shards.stream_name(CLUSTER, shards.TOPICS, 6, 0)
    nc = Nc([info(name, "nats0") for name in OWN] + [info(other, "nats0"), info("UNRELATED", "nats0")])
    s = survey(nc)
    assert asyncio.run(s.names()) is True
    assert s.present == set(OWN) | {other} and nc.asked == []
