"""Who may connect, read and write: the decisions, with no threads, no files and no clock (callers
pass the time).

:class:`Authenticator` answers whether a login and passcode are good (passwd users, signed tokens,
console passcodes), what a user may read and write, and who is an admin. It is given the users
(loaded by :func:`stompbroker.processes.login_checker.load_users`); the scrypt checks run off the
dispatcher's thread in :class:`stompbroker.processes.login_checker.LoginChecker`, whose verdicts
reach the broker as ``Broker.on_auth`` events. Successful logins are cached by
:class:`~stompbroker.security.passwd.Users`, so reconnecting clients cost little.
"""

from __future__ import annotations

import secrets

from ..security import passwd, tokens

CONSOLE_TOKEN_TTL = 12 * 3600   # seconds a console page's STOMP passcode stays valid
CONSOLE_TOKENS = 1000           # most console passcodes kept; the oldest goes first


class Authenticator:
    def __init__(self, config, users: passwd.Users):
        self.config = config
        self.secret = config.secret
        self.required = config.auth == "passwd" or bool(self.secret)
        self.users = users
        self.console_tokens: dict[str, tuple[str, float]] = {}  # passcode -> (login, expiry, epoch seconds)

    def replace_users(self, users: passwd.Users) -> None:
        """New passwd and ACL files (SIGHUP)."""
        self.users = users
        self.console_tokens = {}  # a removed user or admin right must not live on in an open console

    def console_token(self, login: str, now: float) -> str:
        """A STOMP passcode for one console page of ``login`` (already checked over HTTP Basic);
        ``now`` is the wall clock (epoch seconds)."""
        tokens = self.console_tokens
        while len(tokens) >= CONSOLE_TOKENS:
            del tokens[next(iter(tokens))]
        token = "console-" + secrets.token_urlsafe(24)
        tokens[token] = (login, now + CONSOLE_TOKEN_TTL)
        return token

    def check(self, login: str | None, passcode: str | None, now: float) -> str | None:
        """The user a login and passcode stand for at ``now`` (the wall clock, epoch seconds: token
        and console passcode expiry), or None (refused). Slow: scrypt."""
        if passcode and passcode.startswith("console-"):
            entry = self.console_tokens.get(passcode)
            if entry is not None and entry[0] == login and now < entry[1]:
                return login
        if self.secret and login and login.count(" ") >= 2:
            user = tokens.verify_token(login, passcode, self.secret, self.config.secret_timeout, now,
                                       self.config.token_mode)
            if user is not None:
                return user
        if self.config.auth == "passwd" and self.users.verify(login, passcode):
            return login
        return None

    # -- permissions -----------------------------------------------------------------------------
    def can_read(self, login: str, destination: str) -> bool:
        return self.users.can_read(login, destination)

    def can_write(self, login: str, destination: str) -> bool:
        return self.users.can_write(login, destination)

    def is_admin(self, login: str) -> bool:
        return self.users.is_admin(login)
