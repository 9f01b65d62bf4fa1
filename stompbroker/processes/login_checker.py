"""The dispatcher's login checks, run off its thread.

A scrypt verification takes about 20 ms; done inline it would stall every client of the broker, so
CONNECTs and HTTP Basic logins that need one go to worker threads (hashlib's scrypt releases the
GIL) and the verdict comes back through an eventfd, like the store's commits. The checks wait in a
:class:`~stompbroker.security.logins.LoginQueue`: round-robin over client addresses and over the
logins of each address, one in flight per address, and a back-off after a refusal per (address,
login) and per address, so a flood of guesses neither goes faster than guessing one by one nor holds
up other logins. A check whose connection goes is dropped (:meth:`LoginChecker.cancel`). The
verdict itself is :meth:`stompbroker.broker.auth.Authenticator.check`; the dispatcher feeds it to
the broker (``Broker.on_auth``) or answers the HTTP request.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ..security import passwd
from ..security.logins import LoginQueue

log = logging.getLogger("stompbroker.auth")

AUTH_THREADS = 2   # scrypt releases the GIL: two checks (of two addresses) run at once
LOGIN_KEY = 64     # characters of a login its back-off is kept under (longer ones share one)


def load_users(config) -> passwd.Users:
    """The passwd and ACL files the settings name (raises OSError or PasswdError)."""
    if config.auth != "passwd" and not config.acl_file:
        return passwd.Users()
    users = passwd.load(config.passwd_file if config.auth == "passwd" else None, config.acl_file or None)
    for warning in users.warnings():
        log.warning(warning)
    return users


class LoginChecker:
    def __init__(self, auth, config):
        self.auth = auth  # the Authenticator: its check() runs on the threads
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._jobs = LoginQueue(config.auth_fail_delay_ms / 1000, config.auth_fail_delay_max_ms / 1000,
                                config.auth_fail_window_ms / 1000, config.auth_fail_records)
        self._ready = threading.Condition()
        self._results: list = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, name=f"auth-{i}", daemon=True)
                         for i in range(AUTH_THREADS)]
        for thread in self._threads:
            thread.start()

    def submit(self, conn: int, login: str | None, passcode: str | None, address: str = "") -> None:
        with self._ready:
            self._jobs.add(address, (login or "")[:LOGIN_KEY], conn, (login, passcode))
            self._ready.notify()

    def cancel(self, conn: int) -> float | None:
        """The connection went (or waited too long): its check, if not started, is dropped.
        Returns when it could have started by the back-offs (monotonic; in the past: it only
        waited its turn), or None when it was not waiting (being checked, or done)."""
        with self._ready:
            place = self._jobs.cancel(conn)
            return None if place is None else self._jobs.retry_at(*place)

    def results(self) -> list[tuple[int, str | None, float]]:
        """(connection, user name or None for refused, seconds the refusal waits before it is told)
        for the checks finished so far."""
        try:
            os.eventfd_read(self.done_fd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._results = self._results, []
        return done

    def _next(self) -> tuple:
        with self._ready:
            while True:
                now = time.monotonic()
                taken = self._jobs.take(now)
                if taken is not None:
                    return taken
                due = self._jobs.next_due()
                self._ready.wait(None if due is None else max(due - now, 0.001))

    def _run(self) -> None:
        while True:
            address, key, conn, (login, passcode) = self._next()
            try:
                user = self.auth.check(login, passcode, time.time())
            except Exception:  # a broken check must refuse, never crash the dispatcher
                log.exception("login check failed")
                user = None
            with self._ready:
                delay = self._jobs.done(address, key, user is not None, time.monotonic())
                if user is None:
                    failures = self._jobs.pairs[(address, key)][0]
                    failing = len(self._jobs.failing.get(address, ()))
                self._ready.notify()
            if user is None:
                log.warning("login refused for %r from %s: %d in a row for this login there, %d login(s) failing "
                            "there; told in %.2f s", key, address, failures, failing, delay)
            with self._lock:
                self._results.append((conn, user, delay))
            os.eventfd_write(self.done_fd, 1)
