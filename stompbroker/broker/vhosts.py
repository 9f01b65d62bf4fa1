"""Virtual hosts: the destinations of a vhost other than the default ``/`` live in the broker's one
namespace under names no client can write.

A destination ``D`` that a session of vhost ``V`` names becomes ``MARK V MARK D``, with the kind
prefix kept in front (``/queue/`` and ``#``) so that every test of a destination's kind still holds:
``/queue/jobs`` in ``eu`` is ``/queue/\\x1eeu\\x1ejobs``, ``/topic/a`` is ``\\x1eeu\\x1e/topic/a``. A
wildcard of the vhost becomes a prefix inside it; a wildcard without the mark never reaches a name
with one (``reaches``), so the default vhost's ``*`` and ``/queue/*`` stay in the default vhost.
Clients may not use the mark themselves while vhosts are on. The broker-wide names stay as they are:
temporary destinations (private to their connection), reply names (unique to the broker), DIAG
and ``/queue/monitor`` (for admins). Default-vhost names are unchanged: a broker with one vhost
sees no difference.
"""

from __future__ import annotations

MARK = "\x1e"
DEFAULT = "/"
KEPT_PREFIXES = ("/queue/", "#")   # kind prefixes that stay in front of the vhost's mark
BROKER_WIDE = ("/temp-queue/", "/temp-topic/", "/reply-queue/", "/reply-topic/", "/queue/monitor", "DIAG")


def inside(vhost: str, destination: str) -> str:
    """The broker's name of ``destination`` as a session of ``vhost`` names it."""
    if not vhost or vhost == DEFAULT or destination.startswith(BROKER_WIDE):
        return destination
    for prefix in KEPT_PREFIXES:
        if destination.startswith(prefix):
            return prefix + MARK + vhost + MARK + destination[len(prefix):]
    return MARK + vhost + MARK + destination


def split(name: str) -> tuple[str, str]:
    """(vhost, the destination as its clients name it) of a broker name."""
    start = name.find(MARK)
    if start < 0:
        return DEFAULT, name
    end = name.find(MARK, start + 1)
    if end < 0:
        return DEFAULT, name
    return name[start + 1:end], name[:start] + name[end + 1:]


def visible(name: str) -> str:
    """A broker name as the clients of its vhost know it."""
    return name if MARK not in name else split(name)[1]


rendering = False  # the dispatcher's one broker serves several vhosts (Broker sets it): see rendered


def rendered(name: str) -> str:
    """A destination as a MESSAGE names it: ``visible`` when vhosts are on; otherwise the name as it
    is (a client may then use the mark in a name, and sees it back unchanged)."""
    return visible(name) if rendering else name


def reaches(prefix: str, name: str) -> bool:
    """May a wildcard whose prefix is ``prefix`` (already known to start ``name``) reach ``name``?
    Not across a vhost's mark that the prefix does not hold."""
    return name.find(MARK) < len(prefix)


def shown(name: str) -> str:
    """A broker name in broker-wide figures (DIAG, /metrics): ``VHOST:`` before a vhost's names."""
    if MARK not in name:
        return name
    vhost, destination = split(name)
    return f"{vhost}:{destination}"
