"""The passwd file: stompserver's ``login:secret`` lines, made safe (pure: reads files, nothing else).

Format, one user per line::

    # comment lines and blank lines are ignored; whitespace around lines and fields is trimmed
    alice:scrypt$8192$8$1$<salt base64>$<hash base64>
    bob:scrypt$8192$8$1$...$...:read=/topic/*,/queue/a;write=/queue/*;admin
    carol:plain-text-secret

- ``login``: not empty, no ``:``, whitespace or control characters, not starting with ``#``;
  each login at most once.
- ``secret``: a salted hash ``scrypt$N$r$p$SALT$HASH`` (standard base64, ``hashlib.scrypt``), as
  written by ``stompbroker-passwd`` / :func:`hash_secret`; or, for stompserver compatibility, the
  secret in plain text (accepted, but :attr:`Users.plain` lists those logins and
  :meth:`Users.warnings` says so). A secret cannot contain ``:`` (stompserver could not read
  such a line either) and cannot be empty.
- optional third field: permissions, see :mod:`stompbroker.security.acl` (the field may contain
  ``:``, it runs to the end of the line).

Hash parameters: N=8192 (2**13), r=8, p=1, a 16-byte salt and a 32-byte hash: 8 MiB of memory and
about 20 ms per verification on the development machine. That is below the usual interactive
recommendation (N=2**14..2**17) on purpose: the broker verifies inline, in the dispatcher, and each
verification stalls all traffic for its duration. The parameters are stored in each hash, so they
can be raised later without breaking existing lines (:attr:`Users.outdated` lists hashes whose
parameters differ from the current ones). Parameters read from a file are bounded (N*r*128 at most
256 MiB, p at most 16) so a bad file cannot make one login attempt take minutes.

Timing: :meth:`Users.verify` runs one scrypt for every attempt, with the user's parameters for a
known hashed user and with the default parameters otherwise (unknown login, plain-text secret,
missing passcode), and compares with ``hmac.compare_digest`` on fixed-length digests; so neither
"unknown login" nor "wrong passcode" nor "plain-text user" can be told apart by time (as long as
all hashes use the default parameters: see :attr:`Users.outdated`).

Successful verifications are remembered (``cache_size`` entries, ``cache_ttl`` seconds, keyed by an
HMAC of login and passcode under a per-process random key, never the passcode itself), so a client
that reconnects does not cost another scrypt. Failures are never cached: every wrong guess costs
the full scrypt. A cache hit is faster than a miss, which tells only someone who already knows the
passcode that it was used recently.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass

from .acl import (UNRESTRICTED, PasswdError, Permissions, check_login, load_acl, merge, parse_inline,
                  read_text)

__all__ = ["PasswdError", "Users", "Entry", "load", "parse_passwd", "hash_secret", "verify_secret",
           "parse_hash", "SCRYPT_N", "SCRYPT_R", "SCRYPT_P", "SALT_BYTES", "HASH_BYTES"]

SCRYPT_N = 2 ** 13
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
PREFIX = "scrypt$"

_MAX_MEMORY = 256 * 1024 * 1024  # N * r * 128 bytes
_MAX_P = 16


def _maxmem(n: int, r: int, p: int) -> int:
    # OpenSSL needs 128*r*(N+2) + 128*r*p bytes; leave some room.
    return 128 * r * (n + 2) + 128 * r * p + (1 << 20)


def _scrypt(secret: bytes, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    return hashlib.scrypt(secret, salt=salt, n=n, r=r, p=p, maxmem=_maxmem(n, r, p), dklen=dklen)


def _to_bytes(secret: str | bytes) -> bytes:
    if isinstance(secret, str):
        return secret.encode("utf-8", "surrogatepass")
    return bytes(secret)


@dataclass(frozen=True)
class Entry:
    """One passwd line: ``plain`` holds the plain-text secret (bytes) or None for a hashed one."""

    login: str
    n: int = 0
    r: int = 0
    p: int = 0
    salt: bytes = b""
    hash: bytes = b""
    plain: bytes | None = None
    line: int = 0

    @property
    def outdated(self) -> bool:
        return self.plain is None and (self.n, self.r, self.p) != (SCRYPT_N, SCRYPT_R, SCRYPT_P)


def hash_secret(secret: str | bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P,
                salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$SALT$HASH`` for ``secret`` (a new random salt unless given)."""
    raw = _to_bytes(secret)
    if not raw:
        raise ValueError("empty secret")
    salt = os.urandom(SALT_BYTES) if salt is None else bytes(salt)
    _check_params(n, r, p)
    digest = _scrypt(raw, salt, n, r, p, HASH_BYTES)
    return "$".join(("scrypt", str(n), str(r), str(p), base64.b64encode(salt).decode("ascii"),
                     base64.b64encode(digest).decode("ascii")))


def _check_params(n: int, r: int, p: int) -> None:
    if n < 2 or n & (n - 1):
        raise ValueError(f"scrypt N must be a power of 2 greater than 1, not {n}")
    if r < 1 or p < 1:
        raise ValueError("scrypt r and p must be positive")
    if n * r * 128 > _MAX_MEMORY:
        raise ValueError(f"scrypt N*r*128 exceeds {_MAX_MEMORY} bytes")
    if p > _MAX_P:
        raise ValueError(f"scrypt p exceeds {_MAX_P}")


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{what} is not valid base64") from None


def parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    """``(n, r, p, salt, hash)`` of a ``scrypt$...`` string; ValueError says what is wrong."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("a hashed secret is scrypt$N$r$p$SALT$HASH")
    try:
        if not all(x.isascii() and x.isdigit() and len(x) <= 10 for x in parts[1:4]):
            raise ValueError
        n, r, p = (int(x) for x in parts[1:4])
    except ValueError:
        raise ValueError("scrypt N, r and p must be decimal integers") from None
    _check_params(n, r, p)
    salt = _b64(parts[4], "salt")
    digest = _b64(parts[5], "hash")
    if not 8 <= len(salt) <= 1024:
        raise ValueError("salt must be 8 to 1024 bytes")
    if not 16 <= len(digest) <= 64:
        raise ValueError("hash must be 16 to 64 bytes")
    return n, r, p, salt, digest


def verify_secret(stored: str, secret: str | bytes) -> bool:
    """Check ``secret`` against one ``scrypt$...`` string (ValueError if the string is malformed)."""
    n, r, p, salt, digest = parse_hash(stored)
    return hmac.compare_digest(_scrypt(_to_bytes(secret), salt, n, r, p, len(digest)), digest)


def parse_passwd(text: str, path: str | None = None) -> tuple[dict[str, Entry], dict[str, Permissions]]:
    """Parse passwd file text: entries by login and inline permissions by login (PasswdError if malformed)."""
    entries: dict[str, Entry] = {}
    perms: dict[str, Permissions] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        login, sep, rest = line.partition(":")
        login = login.strip()
        if not sep:
            raise PasswdError(number, "expected 'login:secret' (no ':' on the line)", path)
        reason = check_login(login)
        if reason:
            raise PasswdError(number, reason, path)
        if login in entries:
            raise PasswdError(number, f"login {login!r} already defined on line {entries[login].line}", path)
        secret, sep, spec = rest.partition(":")
        secret = secret.strip()
        if not secret:
            raise PasswdError(number, f"empty secret for {login!r}", path)
        if secret.startswith(PREFIX):
            try:
                n, r, p, salt, digest = parse_hash(secret)
            except ValueError as exc:
                raise PasswdError(number, f"bad hashed secret for {login!r}: {exc}", path) from None
            entries[login] = Entry(login, n, r, p, salt, digest, None, number)
        else:
            entries[login] = Entry(login, plain=secret.encode("utf-8"), line=number)
        if sep:
            permissions = parse_inline(spec, number, path)
            if permissions != UNRESTRICTED:
                perms[login] = permissions
    return entries, perms


class Users:
    """The users of a passwd file (and the permissions of any login); immutable but for the cache.

    Build it with :func:`load`; reload by building a new one (the cache goes with the old one).
    """

    def __init__(self, entries: dict[str, Entry] | None = None, inline: dict[str, Permissions] | None = None,
                 acl: dict[str, Permissions] | None = None, *, path: str | None = None,
                 acl_path: str | None = None, mode: int | None = None,
                 cache_size: int = 4096, cache_ttl: float = 300.0, clock=time.monotonic):
        self._entries = dict(entries or {})
        self.path = path
        self.acl_path = acl_path
        self._mode = mode
        acl = dict(acl or {})
        self._default = acl.pop("*", None)  # read/write rules of logins without their own
        own: dict[str, Permissions] = {}
        for source in (inline or {}, acl):
            for login, p in source.items():
                own[login] = merge(own.get(login, UNRESTRICTED), p)
        self._own = own
        self._perms = {login: self._resolve(login) for login in set(own) | set(self._entries)}
        self.plain = frozenset(login for login, e in self._entries.items() if e.plain is not None)
        self.outdated = frozenset(login for login, e in self._entries.items() if e.outdated)
        # Unknown logins and plain-text users pay a scrypt too: against a random "hash".
        self._dummy = Entry("", SCRYPT_N, SCRYPT_R, SCRYPT_P, os.urandom(SALT_BYTES), os.urandom(HASH_BYTES))
        self._cache_key = os.urandom(32)
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self.cache_size = cache_size
        self.cache_ttl = cache_ttl
        self._clock = clock

    # -- users ---------------------------------------------------------------------------------
    @property
    def logins(self) -> frozenset[str]:
        return frozenset(self._entries)

    def __contains__(self, login: object) -> bool:
        return login in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def verify(self, login: str | None, passcode: str | bytes | None) -> bool:
        """Is ``passcode`` right for ``login``? Same cost whichever part is wrong (one scrypt)."""
        login = login if isinstance(login, str) else ""
        given = passcode is not None
        pw = _to_bytes(passcode) if given else b""
        entry = self._entries.get(login)
        key = None
        if given and self.cache_size > 0:  # computed for unknown logins too: same cost
            lb = login.encode("utf-8", "surrogatepass")
            key = hmac.new(self._cache_key, b"%d:" % len(lb) + lb + pw, hashlib.sha256).digest()
            expiry = self._cache.get(key)
            if expiry is not None:
                if expiry > self._clock():
                    self._cache.move_to_end(key)
                    return True
                del self._cache[key]
        if entry is None or entry.plain is not None:
            d = self._dummy
            hmac.compare_digest(_scrypt(pw, d.salt, d.n, d.r, d.p, len(d.hash)), d.hash)
            ok = entry is not None and hmac.compare_digest(hashlib.sha256(pw).digest(),
                                                           hashlib.sha256(entry.plain).digest())
        else:
            ok = hmac.compare_digest(_scrypt(pw, entry.salt, entry.n, entry.r, entry.p, len(entry.hash)),
                                     entry.hash)
        ok = ok and given
        if ok and key is not None:  # only successes are cached
            self._cache[key] = self._clock() + self.cache_ttl
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ok

    # -- permissions ---------------------------------------------------------------------------
    def _resolve(self, login: str) -> Permissions:
        own = self._own.get(login, UNRESTRICTED)
        if own.restricted or self._default is None:
            return own
        return Permissions(self._default.read, self._default.write, own.admin, own.manage,
                           own.vhosts if own.vhosts is not None else self._default.vhosts)

    def permissions(self, login: str | None) -> Permissions:
        """Permissions of any login (unknown ones and ``""``, anonymous, included)."""
        login = login or ""
        found = self._perms.get(login)
        return found if found is not None else self._resolve(login)

    def can_read(self, login: str | None, destination: str) -> bool:
        """May ``login`` SUBSCRIBE to ``destination`` (a destination or a wildcard pattern)?"""
        return self.permissions(login).can_read(destination)

    def can_write(self, login: str | None, destination: str) -> bool:
        """May ``login`` SEND to ``destination``?"""
        return self.permissions(login).can_write(destination)

    def is_admin(self, login: str | None) -> bool:
        return self.permissions(login).admin

    def can_manage(self, login: str | None, destination: str) -> bool:
        """May ``login`` manage ``destination`` over the HTTP API (docs/admin.md)?"""
        return self.permissions(login).can_manage(destination)

    def may_use_vhost(self, login: str | None, vhost: str) -> bool:
        """May ``login`` connect to the virtual host ``vhost``?"""
        return self.permissions(login).may_use_vhost(vhost)

    def manages_some(self, login: str | None) -> bool:
        """Has ``login`` a manage grant (or is it an admin)?"""
        perms = self.permissions(login)
        return perms.admin or bool(perms.manage)

    # -- reporting -----------------------------------------------------------------------------
    def warnings(self) -> list[str]:
        """Things the broker should log at WARNING after loading."""
        where = self.path or "passwd"
        out = []
        if self.plain:
            out.append(f"{where}: {len(self.plain)} login(s) with a plain-text secret: "
                       f"{', '.join(sorted(self.plain))} (hash them with stompbroker-passwd)")
        if self.outdated:
            out.append(f"{where}: login(s) hashed with other scrypt parameters than "
                       f"N={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}: {', '.join(sorted(self.outdated))} "
                       "(verification time differs; set their secret again with stompbroker-passwd)")
        if self._mode is not None and self._mode & 0o077:
            out.append(f"{where}: mode {stat.S_IMODE(self._mode):04o} lets group or others access it; "
                       "use chmod 600")
        return out


def load(path: str | None, acl_file: str | None = None, **options) -> Users:
    """Read a passwd file (None: no users, e.g. token logins only) and an optional ACL file.

    Raises OSError when a file cannot be read and PasswdError on a malformed line. ``options``
    go to :class:`Users` (``cache_size``, ``cache_ttl``, ``clock``).
    """
    entries: dict[str, Entry] = {}
    inline: dict[str, Permissions] = {}
    mode = None
    if path is not None:
        mode = os.stat(path).st_mode
        entries, inline = parse_passwd(read_text(path), path)
    acl = load_acl(acl_file) if acl_file is not None else {}
    return Users(entries, inline, acl, path=path, acl_path=acl_file, mode=mode, **options)
