"""Authentication and authorisation, as pure modules (no sockets, no processes).

- :mod:`.passwd`: the passwd file (``login:secret[:permissions]``, scrypt hashes or plain text),
  :func:`load`, :class:`Users` (``verify``, ``can_read``, ``can_write``, ``is_admin``),
  :func:`hash_secret`;
- :mod:`.acl`: destination patterns, inline permissions and the ACL file;
- :mod:`.tokens`: xtomp's shared-secret token logins (:func:`verify_token`, :func:`make_token`).

The ``stompbroker-passwd`` command (:mod:`stompbroker.tools.passwd`) edits passwd files.
"""

from .acl import PasswdError, Permissions, UNRESTRICTED, load_acl, parse_acl, parse_inline, pattern_covers, \
    pattern_matches
from .passwd import Users, hash_secret, load, parse_hash, parse_passwd, verify_secret
from .tokens import DEFAULT_SKEW, MODES, ReplayGuard, make_token, parse_token_login, token_passcode, verify_token

__all__ = ["PasswdError", "Permissions", "UNRESTRICTED", "load_acl", "parse_acl", "parse_inline",
           "pattern_covers", "pattern_matches", "Users", "hash_secret", "load", "parse_hash", "parse_passwd",
           "verify_secret", "DEFAULT_SKEW", "MODES", "ReplayGuard", "make_token", "parse_token_login",
           "token_passcode", "verify_token"]
