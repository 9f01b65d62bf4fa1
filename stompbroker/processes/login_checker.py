"""The dispatcher's login checks, run off its thread.

A scrypt verification takes about 20 ms; done inline it would stall every client of the broker, so
CONNECTs (and console logins) that need one go to worker threads (hashlib's scrypt releases the
GIL) and the verdict comes back through an eventfd, like the store's commits; the dispatcher feeds
it to the broker as ``Broker.on_auth``. The checks wait in a
:class:`~stompbroker.security.logins.LoginQueue`: round-robin over client addresses, one in flight
per address, and a back-off after a refusal, so a flood of guesses from one address neither goes
faster than guessing one by one nor holds up logins from elsewhere. The verdict itself is
:meth:`stompbroker.broker.auth.Authenticator.check`.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ..security import passwd
from ..security.logins import LoginQueue

log = logging.getLogger("stompbroker.auth")

AUTH_THREADS = 2  # scrypt releases the GIL: two checks (of two addresses) run at once


def load_users(config) -> passwd.Users:
    """The passwd and ACL files the settings name (raises OSError or PasswdError)."""
    if config.auth != "passwd" and not config.acl_file:
        return passwd.Users()
    users = passwd.load(config.passwd_file if config.auth == "passwd" else None, config.acl_file or None)
    for warning in users.warnings():
        log.warning(warning)
    return users


class LoginChecker:
    def __init__(self, auth, backoff: float):
        self.auth = auth  # the Authenticator: its check() runs on the threads
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs = LoginQueue(backoff)
        self._cancelled: set[int] = set()
        self._ready = threading.Condition()
        self._results: list = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, name=f"auth-{i}", daemon=True)
                         for i in range(AUTH_THREADS)]
        for thread in self._threads:
            thread.start()

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
                user = self.auth.check(login, passcode, time.time())
            except Exception:  # a broken check must refuse, never crash the dispatcher
                log.exception("login check failed")
                user = None
            with self._ready:
                self._jobs.done(address, user is not None, time.monotonic())
                self._ready.notify()
            with self._lock:
                self._results.append((conn, user))
            os.eventfd_write(self.done_fd, 1)
