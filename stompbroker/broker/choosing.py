"""Which consumer of a queue gets a message, when the plain round-robin is not enough: exclusive
consumers (``activemq.exclusive``), consumer priority (``activemq.priority``, ``x-priority``) and
message groups (``JMSXGroupID``).

A queue gets a ``Chooser`` (``Queue.chooser``) when a consumer with such an option subscribes to
it or a message of a group is sent to it; ``queues.scan`` asks it instead of its own round-robin.
A queue without one pays nothing for any of this.
"""

from __future__ import annotations

from ..protocol.stomp import ProtocolError

GROUP = "JMSXGroupID"
GROUP_SEQ = "JMSXGroupSeq"


class Options:
    """A consumer's choices: exclusive, its priority, and its age among the exclusive ones."""

    __slots__ = ("exclusive", "priority", "seq")

    def __init__(self, exclusive: bool, priority: int, seq: int):
        self.exclusive = exclusive
        self.priority = priority
        self.seq = seq


def options(headers: dict, seq: int, receipt) -> Options | None:
    """A SUBSCRIBE's consumer options, or None without any. ``activemq.priority`` (ActiveMQ, 0-127)
    and ``x-priority`` (RabbitMQ, any integer) are one option; a bad value is an ERROR."""
    exclusive = headers.get("activemq.exclusive")
    level = headers.get("activemq.priority", headers.get("x-priority"))
    if exclusive is None and level is None:
        return None
    if exclusive not in (None, "true", "false"):
        raise ProtocolError("invalid activemq.exclusive", f"activemq.exclusive must be true or false, "
                            f"not {exclusive[:40]!r}", receipt)
    priority = 0
    if level is not None:
        try:
            priority = int(level)
            if not -1000 <= priority <= 1000:
                raise ValueError
        except ValueError:
            raise ProtocolError("invalid consumer priority", "activemq.priority and x-priority must be integers "
                                f"from -1000 to 1000, not {level[:40]!r}", receipt) from None
    return Options(exclusive == "true", priority, seq)


class Chooser:
    """One queue's choosing state: its groups' owners (oldest first, at most ``max_groups``: the
    oldest assignment is forgotten past it) and the round-robin count among equal consumers."""

    __slots__ = ("groups", "max_groups", "turn")

    def __init__(self, max_groups: int):
        self.groups: dict[str, object] = {}
        self.max_groups = max_groups
        self.turn = 0

    def choose(self, subs: tuple, message, avoid) -> tuple:
        """(the subscription to deliver to or None, whether any consumer has room), as scan's own loop.

        An exclusive consumer present: only the first of them (highest priority, then oldest) may
        take. A group's message goes to its owner while the owner is there and accepts it (and
        waits for the owner's room); otherwise to the highest-priority consumer with room that
        accepts it, round-robin among equals, which becomes the group's owner. ``JMSXGroupSeq:-1``
        closes the group after its message. A NACKed message avoids its last consumer if another can
        take it."""
        exclusive = [s for s in subs if s.options is not None and s.options.exclusive]
        if exclusive:
            subs = (min(exclusive, key=lambda s: (-s.options.priority, s.options.seq)),)
        headers = message.headers
        group = headers.get(GROUP)
        if group is not None:
            owner = self.groups.get(group)
            if owner is not None and owner in subs and (owner.accepts is None or owner.accepts(headers)):
                if owner.prefetch and len(owner.unacked) >= owner.prefetch:
                    return None, True  # it waits for its owner's room (blocked)
                self._assigned(group, owner, headers)
                return owner, True
        any_room = False
        for skip in (avoid, None) if avoid is not None else (None,):
            best, top = [], None
            for sub in subs:
                if sub.prefetch and len(sub.unacked) >= sub.prefetch:
                    continue
                any_room = True
                if sub is skip or (sub.accepts is not None and not sub.accepts(headers)):
                    continue
                level = sub.options.priority if sub.options is not None else 0
                if top is None or level > top:
                    best, top = [sub], level
                elif level == top:
                    best.append(sub)
            if best:
                chosen = best[self.turn % len(best)]
                self.turn += 1
                if group is not None:
                    self._assigned(group, chosen, headers)
                return chosen, True
        return None, any_room

    def _assigned(self, group: str, sub, headers: dict) -> None:
        groups = self.groups
        if headers.get(GROUP_SEQ, "").strip() == "-1":
            groups.pop(group, None)
            return
        if groups.get(group) is not sub:
            groups.pop(group, None)
            groups[group] = sub
            if len(groups) > self.max_groups:
                del groups[next(iter(groups))]
