"""Who may connect, read and write: the decisions, with no threads, no files and no clock (callers
pass the time).

:class:`Authenticator` answers whether a login and passcode are good (passwd users, signed tokens;
the web console's passcodes separately, see ``security/console_tokens.py``), what a user may read
and write, and who is an admin. It is given the users
(loaded by :func:`stompbroker.processes.login_checker.load_users`); the scrypt checks run off the
dispatcher's thread in :class:`stompbroker.processes.login_checker.LoginChecker`, whose verdicts
reach the broker as ``Broker.on_auth`` events. Successful logins are cached by
:class:`~stompbroker.security.passwd.Users`, so reconnecting clients cost little.
"""

from __future__ import annotations

from ..security import passwd, tokens
from ..security.console_tokens import ConsoleTokens


class Authenticator:
    def __init__(self, config, users: passwd.Users):
        self.config = config
        self.secret = config.secret
        self.required = config.auth_required
        self.users = users
        self.console = ConsoleTokens(config.console_token_ttl_ms / 1000, config.console_tokens_per_user)  # the web console's passcodes

    def replace_users(self, users: passwd.Users) -> None:
        """New passwd and ACL files (SIGHUP)."""
        self.users = users
        self.console.clear()  # a removed user or admin right must not live on in a console passcode

    def console_login(self, login: str | None, passcode: str, address: str, now: float) -> bool:
        """Is this a console passcode ``login`` got over HTTP Basic from ``address`` (and is it still
        an admin)? Fast (a lookup): it runs on the dispatcher's thread. ``now``: monotonic."""
        return self.is_admin(login) and self.console.redeem(login, passcode, address, now)

    def check(self, login: str | None, passcode: str | None, now: float) -> str | None:
        """The user a login and passcode stand for at ``now`` (the wall clock, epoch seconds: token
        expiry), or None (refused). Slow: scrypt. Console passcodes are not passwords: never here."""
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

    def is_admin(self, login: str | None) -> bool:
        return self.users.is_admin(login)

    def can_manage(self, login: str | None, destination: str) -> bool:
        return self.users.can_manage(login, destination)

    def may_use_vhost(self, login: str | None, vhost: str) -> bool:
        return self.users.may_use_vhost(login, vhost)

    def manages_some(self, login: str | None) -> bool:
        return self.users.manages_some(login)
