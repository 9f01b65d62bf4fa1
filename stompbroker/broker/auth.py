"""Who may connect, read and write: logins checked off the dispatcher's thread.

A scrypt verification takes about 20 ms; done inline it would stall every client of the broker, so
CONNECTs that need one go to worker threads (hashlib's scrypt releases the GIL) and the verdict
comes back through an eventfd, like the store's commits. The checks wait in a
:class:`~stompbroker.security.logins.LoginQueue`: round-robin over client addresses, one in flight
per address, and a back-off after a refusal, so a flood of guesses from one address neither goes
faster than guessing one by one nor holds up logins from elsewhere. Successful logins are cached
by :class:`~stompbroker.security.passwd.Users`, so reconnecting clients cost little.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time

from ..security import passwd, tokens
from ..security.logins import LoginQueue

log = logging.getLogger("stompbroker.auth")

CONSOLE_TOKEN_TTL = 12 * 3600   # seconds a console page's STOMP passcode stays valid
CONSOLE_TOKENS = 1000           # most console passcodes kept; the oldest goes first
AUTH_THREADS = 2  # scrypt releases the GIL: two checks (of two addresses) run at once


class Authenticator:
    def __init__(self, config):
        self.config = config
        self.secret = config.secret
        self.required = config.auth == "passwd" or bool(self.secret)
        self.users = self._load()
        self.console_tokens: dict[str, tuple[str, float]] = {}  # passcode -> (login, monotonic expiry)
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs = LoginQueue(config.auth_fail_delay_ms / 1000)
        self._cancelled: set[int] = set()
        self._ready = threading.Condition()
        self._results: list = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, name=f"auth-{i}", daemon=True)
                         for i in range(AUTH_THREADS)]
        for thread in self._threads:
            thread.start()

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
    def submit(self, conn: int, login: str | None, passcode: str | None, address: str = "") -> None:
        with self._ready:
            self._jobs.add(address, (conn, login, passcode))
            self._ready.notify()

    def cancel(self, conn: int) -> None:
        """The connection went: its check, if not started, is skipped."""
        with self._ready:
            if self._jobs.waiting:
                self._cancelled.add(conn)

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

    def _next(self) -> tuple[str, tuple]:
        with self._ready:
            while True:
                now = time.monotonic()
                taken = self._jobs.take(now)
                if taken is None:
                    due = self._jobs.next_due()
                    self._ready.wait(None if due is None else max(due - now, 0.001))
                    continue
                address, job = taken
                if job[0] in self._cancelled:
                    self._cancelled.discard(job[0])
                    self._jobs.release(address)
                    continue
                if not self._jobs.waiting:
                    self._cancelled.clear()
                return address, job

    def _run(self) -> None:
        while True:
            address, (conn, login, passcode) = self._next()
            try:
                user = self.check(login, passcode)
            except Exception:  # a broken check must refuse, never crash the dispatcher
                log.exception("login check failed")
                user = None
            with self._ready:
                self._jobs.done(address, user is not None, time.monotonic())
                self._ready.notify()
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
