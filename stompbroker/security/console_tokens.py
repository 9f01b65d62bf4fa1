"""The web console's STOMP passcodes (pure: the caller passes the time).

A browser keeps HTTP Basic credentials to itself, so the console page, once the user has logged in
over HTTP Basic, asks the broker for a STOMP passcode of its own (``POST /console/token``, for admin
users) just before each STOMP login. Such a passcode is made to be worth little to anyone else:

- it stands for the user who asked, from the address that asked, for one login within ``ttl``
  seconds (a login with another user name or from another address is refused and leaves it);
- the session it opens is read-only and ends ``ttl`` seconds after its login (the broker enforces
  that: ``broker/sessions.py``), so a page renews it (``console/static/console.js``);
- it is not a password: HTTP Basic and ordinary STOMP logins never accept it;
- each user has at most ``per_user`` unused ones (the oldest go first), so no request of one user
  can push out another user's passcode, and the whole is bounded by the number of admin users.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

__all__ = ["PREFIX", "ConsoleTokens"]

PREFIX = "console-"


class ConsoleTokens:
    def __init__(self, ttl: float, per_user: int):
        """``per_user``: unused passcodes kept per user (console_tokens_per_user)."""
        self.ttl = ttl
        self.per_user = per_user
        self._by_user: dict[str, OrderedDict[str, tuple[str, float]]] = {}  # user -> passcode -> (address, expiry)

    def __len__(self) -> int:
        return sum(map(len, self._by_user.values()))

    def mint(self, user: str, address: str, now: float) -> str:
        """A new passcode for ``user`` logging in from ``address``."""
        own = self._by_user.setdefault(user, OrderedDict())
        for passcode in [p for p, (_, expiry) in own.items() if expiry <= now]:
            del own[passcode]
        while len(own) >= self.per_user:
            own.popitem(last=False)
        passcode = PREFIX + secrets.token_urlsafe(24)
        own[passcode] = (address, now + self.ttl)
        return passcode

    def redeem(self, user: str | None, passcode: str, address: str, now: float) -> bool:
        """Is ``passcode`` one of ``user``'s, issued to ``address`` and current? If so it is used up."""
        own = self._by_user.get(user or "")
        entry = own.get(passcode) if own is not None else None
        if entry is None or entry[0] != address or now >= entry[1]:
            return False
        del own[passcode]
        if not own:
            del self._by_user[user]
        return True

    def clear(self) -> None:
        self._by_user.clear()
