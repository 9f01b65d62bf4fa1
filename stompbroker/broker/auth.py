"""Who may connect, read and write: logins checked off the dispatcher's thread.

A scrypt verification takes about 20 ms; done inline it would stall every client of the broker, so
CONNECTs that need one go to a worker thread (hashlib's scrypt releases the GIL) and the verdict
comes back through an eventfd, like the store's commits. Successful logins are cached by
:class:`~stompbroker.security.passwd.Users`, so reconnecting clients cost little.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time

from ..security import passwd, tokens

log = logging.getLogger("stompbroker.auth")

CONSOLE_TOKEN_TTL = 12 * 3600   # seconds a console page's STOMP passcode stays valid
CONSOLE_TOKENS = 1000           # most console passcodes kept; the oldest goes first


class Authenticator:
    def __init__(self, config):
        self.config = config
        self.secret = config.secret
        self.required = config.auth == "passwd" or bool(self.secret)
        self.users = self._load()
        self.console_tokens: dict[str, tuple[str, float]] = {}  # passcode -> (login, monotonic expiry)
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs: queue.Queue = queue.Queue()
        self._results: list = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="auth", daemon=True)
        self._thread.start()

    def _load(self) -> passwd.Users:
        if self.config.auth != "passwd" and not self.config.acl_file:
            return passwd.Users()
        users = passwd.load(self.config.passwd_file if self.config.auth == "passwd" else None,
                            self.config.acl_file or None)
        for warning in users.warnings():
            log.warning(warning)
        return users

    def reload(self) -> None:
        """SIGHUP: read the passwd and ACL files again; keep the old ones if the new ones are bad."""
        try:
            self.users = self._load()
        except (OSError, passwd.PasswdError) as exc:
            log.error("passwd reload failed, keeping the previous users: %s", exc)
            return
        self.console_tokens = {}  # a removed user or admin right must not live on in an open console
        log.info("passwd reloaded: %d users", len(self.users))

    # -- verification (worker thread) ------------------------------------------------------------
    def submit(self, conn: int, login: str | None, passcode: str | None) -> None:
        self._jobs.put((conn, login, passcode))

    def results(self) -> list[tuple[int, str | None]]:
        """(connection, user name or None for refused) for the verifications finished so far."""
        try:
            os.eventfd_read(self.done_fd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._results = self._results, []
        return done

    def console_token(self, login: str) -> str:
        """A STOMP passcode for one console page of ``login`` (already checked over HTTP Basic)."""
        tokens = self.console_tokens
        while len(tokens) >= CONSOLE_TOKENS:
            del tokens[next(iter(tokens))]
        token = "console-" + secrets.token_urlsafe(24)
        tokens[token] = (login, time.monotonic() + CONSOLE_TOKEN_TTL)
        return token

    def check(self, login: str | None, passcode: str | None) -> str | None:
        if passcode and passcode.startswith("console-"):
            entry = self.console_tokens.get(passcode)
            if entry is not None and entry[0] == login and time.monotonic() < entry[1]:
                return login
        if self.secret and login and login.count(" ") >= 2:
            user = tokens.verify_token(login, passcode, self.secret, self.config.secret_timeout, time.time(),
                                       self.config.token_mode)
            if user is not None:
                return user
        if self.config.auth == "passwd" and self.users.verify(login, passcode):
            return login
        return None

    def _run(self) -> None:
        while True:
            conn, login, passcode = self._jobs.get()
            try:
                user = self.check(login, passcode)
            except Exception:  # a broken check must refuse, never crash the dispatcher
                log.exception("login check failed")
                user = None
            with self._lock:
                self._results.append((conn, user))
            os.eventfd_write(self.done_fd, 1)

    # -- permissions -----------------------------------------------------------------------------
    def can_read(self, login: str, destination: str) -> bool:
        return self.users.can_read(login, destination)

    def can_write(self, login: str, destination: str) -> bool:
        return self.users.can_write(login, destination)

    def is_admin(self, login: str) -> bool:
        return self.users.is_admin(login)
