"""The cluster's JetStream streams as they are, and their leaders spread: used by the bridge's
JetStream part (``cluster/jetstream.py``); asyncio over its nats-py connection.

Every SURVEY_EVERY seconds (and when asked) a node lists the streams: which of this cluster's queue
and topic streams exist (the layouts to read, ``cluster/shards.py``), each one's figures for STATUS
(messages, bytes, last sequence, leader, replicas, shard), and whether the leaders of this node's
layout are spread over the NATS servers; if not, it moves them (``shards.moves``): a leader
stepdown naming the preferred server, which JetStream elects (a moment's pause for that shard's
publishes, which retry). Every node may do it: they plan alike from the same state, and a second
request for a move already made is refused (already leader). A listing is whole only when every
stream's leader answered it; a node plans moves only from a whole listing, with every one of its
streams led (during an election a listing leaves streams out, and moves planned from it undid
the other nodes' moves). A server that does not honour the preferred server (NATS before 2.11) is
noticed, and the node stops asking.

A replay needs only the names of the streams that exist (``names``): NATS answers them at once,
where a listing waits seconds for a stream whose leader is being elected.
"""

from __future__ import annotations

import logging
import random
import time

import orjson
from nats.js import api

from . import shards

log = logging.getLogger("stompbroker.cluster")

SURVEY_EVERY = 5.0   # seconds between listings of the streams
MOVE_TRIES = 3       # moves of one stream that did not land before the servers are taken not to honour them


async def list_streams(nc) -> tuple[list[api.StreamInfo], list[str]]:
    """Every stream of the account (pages of 256), and the names of those left out: NATS names the
    streams whose leaders did not answer in time as ``missing`` (they exist; their figures are not
    known)."""
    infos, offset, missing = [], 0, []
    for _ in range(64):
        resp = orjson.loads((await nc.request("$JS.API.STREAM.LIST", orjson.dumps({"offset": offset}),
                                              timeout=5)).data)
        page = resp.get("streams") or []
        infos.extend(api.StreamInfo.from_response(s) for s in page)
        missing.extend(name for name in resp.get("missing") or () if isinstance(name, str))
        offset += len(page)
        if not page or offset >= resp.get("total", 0):
            break
    return infos, missing


async def stream_names(nc) -> list[str]:
    """The names of every stream of the account (pages of 1024)."""
    names: list[str] = []
    for _ in range(64):
        resp = orjson.loads((await nc.request("$JS.API.STREAM.NAMES", orjson.dumps({"offset": len(names)}),
                                              timeout=5)).data)
        page = resp.get("streams") or []
        names.extend(page)
        if not page or len(names) >= resp.get("total", 0):
            break
    return names


def figures(cluster: str, info) -> dict:
    """One stream's entry of the STATUS ``streams`` list (docs/diag-schema.md)."""
    parsed = shards.parse_stream(cluster, info.config.name)
    group = info.cluster
    return {"name": info.config.name, "messages": info.state.messages, "bytes": info.state.bytes,
            "stored": info.state.last_seq, "leader": (group.leader or "") if group else "",
            "replicas": info.config.num_replicas or 1, "shard": f"{parsed[2]}/{parsed[1]}" if parsed else ""}


class Survey:
    """What the last listing found, and the leader moves this node made."""

    def __init__(self, nc, cluster: str, own: list[str]):
        self.nc = nc
        self.cluster = cluster
        self.own = own                       # this node's layout's streams
        self.present: set[str] = set(own)    # this cluster's queue and topic streams that exist
        self.whole = False                   # the last listing had every stream's figures in it
        self.listed: set[str] = set(own)     # the streams the last listing named (missing ones too)
        self.streams: list[dict] = []        # each stream's figures, for STATUS
        self.due = 0.0
        self.moving: dict[str, tuple[str, int]] = {}   # stream -> (server asked to lead it, moves that did not land)
        self.balancing = True
        self.moves = 0

    async def run(self) -> list | None:
        """List the streams; their StreamInfos (None if NATS did not answer)."""
        self.due = time.monotonic() + SURVEY_EVERY * random.uniform(0.8, 1.2)
        try:
            infos, missing = await list_streams(self.nc)
        except Exception as exc:
            log.debug("cluster: stream list: %r", exc)
            return None
        self.whole = not missing
        self.listed = {i.config.name for i in infos} | set(missing)
        self.found(self.listed)
        self.streams = [figures(self.cluster, i) for i in sorted(
            (i for i in infos if i.config.name.startswith((f"{self.cluster}_", f"KV_{self.cluster}_"))),
            key=lambda i: i.config.name)]
        if self.balancing and self.whole:
            await self.balance({i.config.name: i for i in infos if i.config.name in self.present})
        return infos

    async def names(self) -> bool:
        """``present`` from the streams' names only; False if NATS did not answer."""
        try:
            self.found(set(await stream_names(self.nc)))
        except Exception as exc:
            log.debug("cluster: stream names: %r", exc)
            return False
        return True

    def found(self, names: set[str]) -> None:
        self.present = {name for name in names if shards.parse_stream(self.cluster, name)} | set(self.own)

    async def balance(self, infos: dict) -> None:
        """Spread the leaders of this node's layout over the servers, each kind on its own."""
        for stream, (target, failed) in list(self.moving.items()):  # did the last moves land?
            info = infos.get(stream)
            leader = info.cluster.leader if info is not None and info.cluster else None
            if leader == target or info is None:
                del self.moving[stream]
            elif leader:
                self.moving[stream] = (target, failed + 1)
                if failed + 1 >= MOVE_TRIES:
                    self.balancing = False
                    log.warning("cluster: stream leaders are not moving to the servers asked for (NATS before "
                                "2.11 ignores a preferred server); leaving them where JetStream put them")
                    return
        if any(infos.get(name) is None or (infos[name].cluster is not None and not infos[name].cluster.leader)
               for name in self.own):
            return  # (an election under way: its counts would mislead; the next listing plans)
        for kind in (shards.QUEUES, shards.TOPICS):
            streams = {}
            for name in self.own:
                info = infos.get(name)
                if (info.cluster is None or (info.config.num_replicas or 1) < 2
                        or shards.parse_stream(self.cluster, name)[0] != kind):
                    continue
                peers = [info.cluster.leader] if info.cluster.leader else []
                peers += [r.name for r in info.cluster.replicas or [] if r.current and not r.offline]
                streams[name] = (info.cluster.leader or "", peers)
            for name, target in shards.moves(streams):
                await self.move(name, streams[name][0], target)

    async def move(self, stream: str, leader: str, target: str) -> None:
        try:
            resp = orjson.loads((await self.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                                                       orjson.dumps({"placement": {"preferred": target}}),
                                                       timeout=2)).data)
        except Exception as exc:
            log.debug("cluster: leader of %s not moved: %r", stream, exc)
            return
        if resp.get("success"):
            self.moves += 1
            log.info("cluster: stream %s: leader moved from %s to %s", stream, leader, target)
            self.moving[stream] = (target, self.moving.get(stream, ("", 0))[1])
