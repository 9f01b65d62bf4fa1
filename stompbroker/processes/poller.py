"""The part of a selector the reader uses, over epoll, without an object per connection.

``selectors`` keeps a ``SelectorKey`` and a map entry per registered socket (about 150 bytes per
idle connection). Here a connection's socket is found in the caller's own map of connections by
fd; only the few other registrations (listeners, control channel, TLS socket pairs) keep their data
in ``others``. Events and masks are ``selectors``' (EVENT_READ, EVENT_WRITE); a file is a socket or
an fd. The writer uses it too, with no connection map (its few registrations are all ``others``):
``selectors``' wrapper took a fifth of its Python time when each wake-up brings one message.
"""

from __future__ import annotations

import select
from selectors import EVENT_READ, EVENT_WRITE

_TO_EPOLL = {EVENT_READ: select.EPOLLIN, EVENT_WRITE: select.EPOLLOUT,
             EVENT_READ | EVENT_WRITE: select.EPOLLIN | select.EPOLLOUT}
_NOT_IN = ~select.EPOLLIN
_NOT_OUT = ~select.EPOLLOUT


class Poller:
    def __init__(self, conns: dict):
        self.epoll = select.epoll()
        self.conns = conns    # fd -> connection: registered with that connection as data, nothing kept
        self.others: dict = {}

    def register(self, fileobj, events: int, data) -> None:
        fd = fileobj if type(fileobj) is int else fileobj.fileno()
        self.epoll.register(fd, _TO_EPOLL[events])
        if self.conns.get(fd) is not data:
            self.others[fd] = data

    def modify(self, fileobj, events: int, data) -> None:
        fd = fileobj if type(fileobj) is int else fileobj.fileno()
        self.epoll.modify(fd, _TO_EPOLL[events])
        if self.conns.get(fd) is not data:
            self.others[fd] = data

    def quiet(self, fileobj) -> None:
        """Stop reading a registered socket: only its peer's hang-up (or the socket shut down here or
        in another process) is reported, as a readable event."""
        self.epoll.modify(fileobj if type(fileobj) is int else fileobj.fileno(), select.EPOLLRDHUP)

    def unregister(self, fileobj) -> None:
        fd = fileobj if type(fileobj) is int else fileobj.fileno()
        self.epoll.unregister(fd)
        self.others.pop(fd, None)

    def select(self, timeout: float | None = None) -> list:
        """[(data, events)] of the ready registrations (as selectors: an error or hang-up is both)."""
        ready = []
        others, conns = self.others, self.conns
        for fd, event in self.epoll.poll(-1 if timeout is None else timeout):
            data = conns.get(fd)
            if data is None:
                data = others.get(fd)
                if data is None:
                    continue  # unregistered by an earlier event of this batch (or registered on
                    # ``epoll`` directly, a ring's wake-up: Ring.watch, nothing to do but wake)
            events = 0
            if event & _NOT_IN:
                events |= EVENT_WRITE
            if event & _NOT_OUT:
                events |= EVENT_READ
            ready.append((data, events))
        return ready
