"""Removing a durable subscription in cluster mode (``DELETE /api/subscriptions/...`` on any node):
its requests and answers between the nodes, and the verdict on them. Pure.

Every node that ever held a client of the durable keeps its record (the others know its topic
pattern only), so the bridge of the node asked (``cluster/jetstream.py``, ``forget``) asks them
all on ``<cluster>.admin.durable``; each bridge hands the request to its dispatcher
(``cluster/queuing.py``, ``durable_asked``) and sends back its answer (``answer``):

- ``hold``: is a client attached to it here? If not, SUBSCRIBEs with its key are refused here
  until ``release`` (or ``cluster_timeout_ms``), so none attaches while it is removed.
- ``drop``: the record goes (its pattern is no longer announced: no node keeps topic messages
  for it any more once the interest bucket tells them).
- ``release``: the removal is over (done or refused); not answered.

A client's UNSUBSCRIBE of a durable subscription sends ``drop`` then ``release`` too, asking for
no answer: the nodes that held a client of it before drop their record.

The nodes expected to answer are this one and those whose entry the interest bucket holds (every
live node writes one, empty or not, every few seconds; a killed one is forgotten after its TTL);
once they all answered, the answers of others (a node just started) are taken for a moment more.
"""

from __future__ import annotations

import orjson

HOLD, DROP, RELEASE = "hold", "drop", "release"
# A durable subscription's key is a vhost, a login, a client-id and a name, each of at most
# max_id_length (1 KB by default): a longer one is nobody's, and a node does not keep it.
MAX_KEY = 64 * 1024


def subject(cluster: str) -> str:
    """What every node's bridge listens on for removals."""
    return f"{cluster}.admin.durable"


def request(op: str, key: str) -> bytes:
    return orjson.dumps({"op": op, "key": key})


def read_request(data: bytes) -> tuple[str, str] | None:
    """(op, key), or None for what is not a removal's request (another version's, garbage)."""
    try:
        asked = orjson.loads(data)
        op, key = asked["op"], asked["key"]
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return None
    if op not in (HOLD, DROP, RELEASE) or not isinstance(key, str) or len(key) > MAX_KEY:
        return None
    return op, key


def answer(node: str, held: bool, attached: bool) -> bytes:
    """A node's answer: whether it holds the durable's record, and a client is attached to it there."""
    return orjson.dumps({"node": node, "held": held, "attached": attached})


def read_answer(data: bytes) -> dict | None:
    try:
        got = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(got, dict) or not isinstance(got.get("node"), str):
        return None
    return got


def verdict(op: str, expected, answers: dict[str, dict], wait_ms: int) -> tuple[int, str] | None:
    """None when every expected node answered ``op`` and none has a client attached; else the
    HTTP status and why: 409 for an attached client (it says where), 503 for a node silent for
    ``wait_ms`` (asking again is safe)."""
    done = ("nothing was removed" if op == HOLD else
            "the nodes that answered dropped their record of it; its messages are kept")
    attached = sorted(node for node, got in answers.items() if got.get("attached"))
    if attached:
        return 409, (f"the durable subscription is attached to a connection on node {', '.join(attached)}: close "
                     f"that connection first, or have its client UNSUBSCRIBE; {done}")
    missing = sorted(set(expected) - answers.keys())
    if missing:
        return 503, (f"cluster unavailable: node {', '.join(missing)} did not answer within {wait_ms} ms; "
                     f"{done}; ask again")
    return None


def held_anywhere(answers: dict[str, dict]) -> bool:
    return any(got.get("held") for got in answers.values())
