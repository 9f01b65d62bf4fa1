"""xtomp's shared-secret token login, and a sounder HMAC variant (pure: no I/O, the caller passes the time).

How it works (xtomp, ``secret`` and ``secret_timeout`` set): a service that knows the secret hands
a client

    login    = "<user> <unix-seconds> <random>"
    passcode = base64(sha1(login + secret))                     # mode "sha1", xtomp's

and the broker accepts that pair while the timestamp is at most ``timeout`` seconds old (and at
most ``skew`` seconds in the future). The session's user name is ``<user>``. With
``token_mode=hmac`` the passcode is ``base64(hmac_sha256(secret, login))`` instead.

Rules here (stricter than xtomp's, which they otherwise match byte for byte):

- the login is exactly three space-separated parts: a user (not empty), a timestamp (1 to 12 ASCII
  digits) and a random part (not empty; it may contain further spaces). xtomp also accepted
  ``"<user> <seconds>"`` with no random part;
- a timestamp more than ``skew`` seconds in the future is refused (xtomp accepted any future
  timestamp, so a token minted for the year 2100 never expired);
- the passcode is compared in constant time (xtomp used ``strncmp``), and must be the canonical
  padded standard base64 of the digest.

Weaknesses (of the scheme, both modes unless stated):

- **Bearer token, replayable.** Whoever sees a login/passcode pair (on the wire: STOMP has no TLS
  here; in a log; in a browser) can log in as that user, as many times as they like, until the
  timeout. :class:`ReplayGuard` can make each token single-use, at the cost of breaking a client
  that reconnects with the same token.
- **One secret for everybody.** Every user's tokens are made with the same secret, and every broker
  and issuing service holds it: one leak lets the holder mint tokens for any user, and nothing
  binds a token to one broker. There is no revocation short of changing the secret (which voids
  every token).
- **Fast, unsalted hash.** One observed pair lets anyone test guesses of the secret offline at
  billions of SHA-1s per second: the secret must be long and random (32+ random bytes), never a
  word.
- **SHA-1 of a concatenation (mode "sha1").** ``sha1(login + secret)`` is a home-made MAC on a
  Merkle-Damgard hash. With the secret *after* the message, as here, the classic length-extension
  forgery (append data to a signed message) does not directly apply, but the construction is one
  byte order away from it (``sha1(secret + login)`` is length-extension forgeable), and secret-
  suffix MACs fall to collisions: SHA-1 chosen-prefix collisions are practical (2020), so two
  equal-length, block-aligned logins ``a`` and ``b`` with ``sha1(a) == sha1(b)`` state have the same
  token for every secret: a token legitimately issued for ``a`` is valid for ``b``. Login fields
  are not delimited either (``user`` cannot contain a space, but the random part is free text).
  HMAC-SHA256 (mode "hmac") has none of these problems; use it whenever the issuers can.
- **Clock dependence.** Validity depends on the issuer's and the broker's clocks agreeing.
- **Timing of expiry vs. MAC.** The MAC is always computed and compared before the timestamp is
  judged, so time does not reveal which check failed (both are public information anyway).
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import os

__all__ = ["MODES", "DEFAULT_SKEW", "parse_token_login", "token_passcode", "verify_token", "make_token",
           "ReplayGuard"]

MODES = ("sha1", "hmac")
DEFAULT_SKEW = 30.0      # seconds a timestamp may be ahead of the broker's clock
_MAX_TS_DIGITS = 12


def _b(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)


def parse_token_login(login: str) -> tuple[str, int, str] | None:
    """``(user, unix seconds, random)`` of a token login, or None if it is not one."""
    if not isinstance(login, str):
        return None
    parts = login.split(" ", 2)
    if len(parts) != 3:
        return None
    user, ts, rand = parts
    if not user or not rand or not ts or len(ts) > _MAX_TS_DIGITS or not (ts.isascii() and ts.isdigit()):
        return None
    return user, int(ts), rand


def token_passcode(login: str, secret: str | bytes, mode: str = "sha1") -> str:
    """The passcode for a token ``login`` under ``secret``."""
    if mode == "sha1":
        digest = hashlib.sha1(_b(login) + _b(secret)).digest()
    elif mode == "hmac":
        digest = hmac.new(_b(secret), _b(login), hashlib.sha256).digest()
    else:
        raise ValueError(f"token mode must be one of {', '.join(MODES)}, not {mode!r}")
    return base64.b64encode(digest).decode("ascii")


def verify_token(login: str | None, passcode: str | None, secret: str | bytes, timeout: float, now: float,
                 mode: str = "sha1", skew: float = DEFAULT_SKEW) -> str | None:
    """The user name if ``login``/``passcode`` is a valid, current token; else None.

    ``timeout``: seconds a token stays valid after its timestamp; ``now``: the broker's
    ``time.time()``; ``skew``: seconds a timestamp may be in the future. An empty secret or an
    unknown mode is a ValueError (a configuration mistake, not a bad login).
    """
    if not secret:
        raise ValueError("empty token secret")
    if mode not in MODES:
        raise ValueError(f"token mode must be one of {', '.join(MODES)}, not {mode!r}")
    if not isinstance(login, str) or not isinstance(passcode, str):
        return None
    parsed = parse_token_login(login)
    expected = token_passcode(login, secret, mode).encode("ascii")
    good = hmac.compare_digest(expected, _b(passcode))
    if not good or parsed is None:
        return None
    user, ts, _ = parsed
    if ts > now + skew or now - ts > timeout:
        return None
    return user


def make_token(user: str, secret: str | bytes, now: float, mode: str = "sha1",
               nonce: str | None = None) -> tuple[str, str]:
    """``(login, passcode)`` for ``user`` at time ``now`` (a random nonce unless given)."""
    if not user or " " in user:
        raise ValueError("a token user must be non-empty and contain no space")
    if not secret:
        raise ValueError("empty token secret")
    nonce = os.urandom(12).hex() if nonce is None else nonce
    if not nonce:
        raise ValueError("empty nonce")
    login = f"{user} {int(now)} {nonce}"
    return login, token_passcode(login, secret, mode)


class ReplayGuard:
    """Remembers accepted token logins until they expire, to make tokens single-use (optional).

    ``first_use(login, expires, now)`` returns True the first time a login is seen (and records it
    until ``expires``), False on a replay. At most ``max_entries`` are kept: when full the entry
    that expires first is forgotten, which could let that one token be replayed once; size it for
    (logins per second) x (timeout).
    """

    def __init__(self, max_entries: int = 100_000):
        self.max_entries = max_entries
        self._seen: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def first_use(self, login: str, expires: float, now: float) -> bool:
        heap, seen = self._heap, self._seen
        while heap and (heap[0][0] <= now or len(seen) >= self.max_entries):
            when, old = heapq.heappop(heap)
            if seen.get(old) == when:
                del seen[old]
        if login in seen:
            return False
        seen[login] = expires
        heapq.heappush(heap, (expires, login))
        return True
