"""Per-user permissions: destination patterns, the inline form and the ACL file (pure: no I/O but reading a file).

Patterns follow the broker's wildcard rule (``broker/subscriptions.py``): a pattern containing
``*`` matches every destination that starts with the text before its first ``*`` (anything after
that ``*`` is ignored); ``*`` alone matches every destination; a pattern without ``*`` matches
exactly that destination.

Permissions of one login:

- ``read`` patterns: what it may SUBSCRIBE to;
- ``write`` patterns: what it may SEND to;
- ``admin``: a flag the broker gives meaning to (e.g. DIAG, /queue/monitor, the HTTP API);
- ``manage`` patterns: the destinations whose queues it may manage over the HTTP API (peek, purge,
  delete, move, publish: docs/admin.md) without being an admin (an admin may manage everything);
- ``vhost`` names: the virtual hosts besides ``/`` it may connect to (``*``: all; an admin may use
  every one; every login may use ``/``).

Rule: a login with **no read and no write rule may read and write everything**. As soon as it has
at least one read or write rule, it may read only what its read rules allow and write only what its
write rules allow (a login with only write rules cannot read anything). ``admin`` is not a
read/write rule: ``admin`` alone leaves read and write unrestricted, and so does ``manage``.

A subscription destination may itself be a wildcard (``/topic/*``); it is allowed only when one
rule *covers* everything it can match: a wildcard rule whose prefix is a prefix of the
subscription's prefix (rule ``/topic/*`` covers ``/topic/a/*``; rule ``/topic/a`` does not cover
``/topic/*``, and nothing but ``*`` covers ``*``).

Two places can give rules, and they add up (union of patterns, admin if either says so):

1. inline, as a third field of a passwd line (see ``passwd.py``)::

       alice:scrypt$...:read=/topic/*,/queue/a;write=/queue/*;manage=/queue/jobs*;admin

   clauses separated by ``;``, each ``read=P[,P...]``, ``write=P[,P...]``, ``manage=P[,P...]`` or ``admin``;
2. an ACL file, one rule per line (``#`` comment lines and blank lines ignored, whitespace trimmed)::

       alice read /topic/*,/queue/a
       alice write /queue/*
       alice admin
       bob   manage /queue/jobs*,/queue/DLQ
       bob   vhost  eu,us
       *     read /topic/public/*

   The login ``*`` gives the read/write rules of every login that has none of its own (anonymous
   and token logins included). ``* admin`` and ``* manage`` are refused. A ``#`` only starts a comment at the start
   of a line (``#jobs`` is a valid worker-queue destination), so there are no trailing comments.

Patterns may not be empty and may not contain whitespace, control characters, ``,`` or ``;``.
Logins may not be empty, start with ``#`` or contain ``:``, whitespace or control characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PasswdError", "Permissions", "UNRESTRICTED", "pattern_matches", "pattern_covers",
           "parse_inline", "parse_acl", "load_acl", "read_text", "check_login", "merge"]


class PasswdError(ValueError):
    """A malformed line in a passwd or ACL file: ``path``, ``line`` (1-based; 0 = the whole file), ``reason``."""

    def __init__(self, line: int, reason: str, path: str | None = None):
        super().__init__(line, reason, path)
        self.line = line
        self.reason = reason
        self.path = path

    def __str__(self) -> str:
        where = self.path or "<passwd>"
        return f"{where}:{self.line}: {self.reason}" if self.line else f"{where}: {self.reason}"


_BAD_PATTERN = re.compile(r"[\s,;\x00-\x1f\x7f]")
_BAD_LOGIN = re.compile(r"[\s:\x00-\x1f\x7f]")


def check_login(login: str) -> str | None:
    """Why ``login`` cannot appear in a passwd/ACL file, or None when it can."""
    if not login:
        return "empty login"
    if login.startswith("#"):
        return f"login {login[:40]!r} starts with '#' (it would be a comment)"
    if _BAD_LOGIN.search(login):
        return f"login {login[:40]!r} contains ':', whitespace or a control character"
    return None


def _check_pattern(pattern: str) -> str | None:
    if not pattern:
        return "empty destination pattern"
    if _BAD_PATTERN.search(pattern):
        return f"destination pattern {pattern[:60]!r} contains whitespace, ',', ';' or a control character"
    return None


def pattern_matches(pattern: str, destination: str) -> bool:
    """Does ``pattern`` match the (concrete) ``destination``?"""
    star = pattern.find("*")
    if star < 0:
        return destination == pattern
    return destination.startswith(pattern[:star])


def pattern_covers(rule: str, destination: str) -> bool:
    """Does ``rule`` allow ``destination``, which may itself be a wildcard subscription?

    A concrete destination is allowed when the rule matches it; a wildcard one when the rule
    matches every destination the wildcard can match.
    """
    dstar = destination.find("*")
    if dstar < 0:
        return pattern_matches(rule, destination)
    rstar = rule.find("*")
    return rstar >= 0 and destination[:dstar].startswith(rule[:rstar])


@dataclass(frozen=True)
class Permissions:
    """What one login may do. ``read``/``write`` None means "no rule given"."""

    read: tuple[str, ...] | None = None
    write: tuple[str, ...] | None = None
    admin: bool = False
    manage: tuple[str, ...] | None = None
    vhosts: tuple[str, ...] | None = None

    @property
    def restricted(self) -> bool:
        return self.read is not None or self.write is not None

    def can_read(self, destination: str) -> bool:
        """May SUBSCRIBE to ``destination`` (a destination or a wildcard pattern)."""
        if self.read is None:
            return self.write is None
        return any(pattern_covers(rule, destination) for rule in self.read)

    def can_write(self, destination: str) -> bool:
        """May SEND to ``destination``."""
        if self.write is None:
            return self.read is None
        return any(pattern_covers(rule, destination) for rule in self.write)

    def can_manage(self, destination: str) -> bool:
        """May manage ``destination`` over the HTTP API (an admin may manage every one)."""
        return self.admin or (self.manage is not None and any(pattern_covers(rule, destination)
                                                              for rule in self.manage))

    def may_use_vhost(self, vhost: str) -> bool:
        """May connect to the virtual host ``vhost`` (every login may use ``/``)."""
        return vhost == "/" or self.admin or (self.vhosts is not None and (vhost in self.vhosts or "*" in self.vhosts))

    def to_inline(self) -> str:
        """The inline form (``read=...;write=...;admin``), empty for no rules."""
        parts = []
        if self.read is not None:
            parts.append("read=" + ",".join(self.read))
        if self.write is not None:
            parts.append("write=" + ",".join(self.write))
        if self.manage is not None:
            parts.append("manage=" + ",".join(self.manage))
        if self.vhosts is not None:
            parts.append("vhost=" + ",".join(self.vhosts))
        if self.admin:
            parts.append("admin")
        return ";".join(parts)


UNRESTRICTED = Permissions()


def _union(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a + tuple(p for p in b if p not in a)


def merge(a: Permissions, b: Permissions) -> Permissions:
    """Rules from two places add up."""
    return Permissions(_union(a.read, b.read), _union(a.write, b.write), a.admin or b.admin,
                       _union(a.manage, b.manage), _union(a.vhosts, b.vhosts))


def _patterns(text: str, line: int, path: str | None, what: str) -> tuple[str, ...]:
    patterns = []
    for part in text.split(","):
        part = part.strip()
        reason = _check_pattern(part)
        if reason:
            raise PasswdError(line, f"{what}: {reason}", path)
        if part not in patterns:
            patterns.append(part)
    return tuple(patterns)


def parse_inline(spec: str, line: int = 0, path: str | None = None) -> Permissions:
    """Parse ``read=P,P;write=P;manage=P;admin`` (clauses in any order, repeatable; empty = no rules)."""
    read = write = manage = vhosts = None
    admin = False
    for clause in spec.split(";"):
        clause = clause.strip()
        if not clause:
            continue
        key, eq, value = clause.partition("=")
        key = key.strip()
        if key == "admin":
            if eq:
                raise PasswdError(line, "'admin' takes no value", path)
            admin = True
        elif key in ("read", "write", "manage", "vhost"):
            if not eq:
                raise PasswdError(line, f"'{key}' needs '=' and destination patterns", path)
            patterns = _patterns(value, line, path, key)
            if key == "read":
                read = _union(read, patterns)
            elif key == "write":
                write = _union(write, patterns)
            elif key == "manage":
                manage = _union(manage, patterns)
            else:
                vhosts = _union(vhosts, patterns)
        else:
            raise PasswdError(line, f"unknown permission {clause[:40]!r} (expected read=, write=, manage=, vhost= or admin)",
                              path)
    return Permissions(read, write, admin, manage, vhosts)


def parse_acl(text: str, path: str | None = None) -> dict[str, Permissions]:
    """Parse ACL file text into permissions by login (the ``*`` entry included as is)."""
    acl: dict[str, Permissions] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        login = fields[0]
        if login != "*":
            reason = check_login(login)
            if reason:
                raise PasswdError(number, reason, path)
        if len(fields) < 2:
            raise PasswdError(number, "expected 'LOGIN read|write|manage PATTERN[,PATTERN...]', 'LOGIN vhost NAME[,NAME...]' or 'LOGIN admin'", path)
        verb = fields[1]
        if verb == "admin":
            if len(fields) != 2:
                raise PasswdError(number, "'admin' takes no patterns", path)
            if login == "*":
                raise PasswdError(number, "'admin' cannot be given to every login ('*')", path)
            perms = Permissions(admin=True)
        elif verb in ("read", "write", "manage", "vhost"):
            if len(fields) < 3:
                raise PasswdError(number, f"'{verb}' needs destination patterns", path)
            if verb == "manage" and login == "*":
                raise PasswdError(number, "'manage' cannot be given to every login ('*')", path)
            patterns = _patterns(" ".join(fields[2:]), number, path, verb)
            perms = Permissions(**{"vhosts" if verb == "vhost" else verb: patterns})
        else:
            raise PasswdError(number, f"unknown permission {verb[:40]!r} (expected read, write, manage, vhost or admin)",
                              path)
        acl[login] = merge(acl.get(login, UNRESTRICTED), perms)
    return acl


def read_text(path: str) -> str:
    """A file's text as UTF-8; a decoding error becomes a PasswdError with its line number."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PasswdError(data.count(b"\n", 0, exc.start) + 1, "not valid UTF-8", path) from None


def load_acl(path: str) -> dict[str, Permissions]:
    """Read and parse an ACL file (OSError if it cannot be read, PasswdError if malformed)."""
    return parse_acl(read_text(path), path)
