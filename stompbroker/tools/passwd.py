"""stompbroker-passwd FILE LOGIN: add, replace or delete a user in a passwd file.

The secret is asked for twice on the terminal (or read from stdin with ``--password-stdin`` or
when stdin is not a terminal) and
stored as a salted scrypt hash (``stompbroker.security.passwd.hash_secret``). Every other line of
the file, comments and blank lines included, is kept as it is; a replaced user keeps its
permissions unless ``--permissions`` gives new ones. The file is written atomically (a temporary
file in the same directory, fsync, rename) with mode 0600, under an exclusive lock on the
directory so two runs cannot lose each other's changes.
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import os
import sys
import tempfile

from ..security.acl import check_login, parse_inline
from ..security.passwd import PasswdError, hash_secret, parse_passwd

PROG = "stompbroker-passwd"
EXIT_OK, EXIT_FAILURE, EXIT_INTERRUPTED = 0, 1, 130

DESCRIPTION = """\
Add LOGIN to the passwd file FILE, or set its secret if it is there already (stored as a salted
scrypt hash). Other lines, comments and the user's permissions are kept. FILE is created when
missing; it is always written atomically with mode 0600."""

EPILOG = """\
permissions (the optional third field of a passwd line): clauses separated by ';', each
read=PATTERN[,PATTERN...], write=PATTERN[,PATTERN...] or admin; a PATTERN with '*' matches every
destination starting with the text before the '*'. A user with no read/write rule may do
everything; with any, only what its rules allow.

exit status: 0 done; 1 failed (unreadable or malformed file, secrets differ, unknown LOGIN with
--delete...); 2 bad command line; 130 interrupted.

examples:
  stompbroker-passwd /etc/stompbroker/passwd alice
  printf '%s\\n' "$SECRET" | stompbroker-passwd --password-stdin passwd bob
  stompbroker-passwd --permissions 'read=/topic/*;write=/queue/jobs' passwd carol
  stompbroker-passwd --delete passwd carol"""


class Failure(Exception):
    """Reported as one line on stderr, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="the passwd file (created if missing)")
    parser.add_argument("login", metavar="LOGIN", help="the user to add, change or delete")
    parser.add_argument("--password-stdin", action="store_true",
                        help="read the secret from stdin (one line; the final newline is dropped) "
                             "instead of asking twice on the terminal (the default when stdin is not a terminal)")
    parser.add_argument("--delete", action="store_true", help="remove LOGIN's line")
    parser.add_argument("--permissions", metavar="SPEC", default=None,
                        help="set LOGIN's permissions (e.g. 'read=/topic/*;write=/queue/*;admin'; "
                             "'' removes them); default: keep them")
    return parser


NO_TTY_HINT = ("no secret: without a terminal, pipe it in on stdin "
               "(printf '%s\\n' \"$SECRET\" | stompbroker-passwd FILE LOGIN)")


def has_terminal() -> bool:
    """Whether getpass can prompt: stdin is a terminal, or the process has a controlling one."""
    if sys.stdin is not None and sys.stdin.isatty():
        return True
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
        return True
    except OSError:
        return False


def read_secret(from_stdin: bool, login: str) -> str:
    # Without a terminal to prompt on (scripts, containers, CI), stdin carries the secret.
    from_stdin = from_stdin or not has_terminal()
    if from_stdin:
        if sys.stdin is None:
            raise Failure(NO_TTY_HINT)
        data = sys.stdin.read()
        if not data:
            raise Failure(NO_TTY_HINT)
        if data.endswith("\n"):
            data = data[:-1]
            if data.endswith("\r"):
                data = data[:-1]
        if "\n" in data or "\r" in data:
            raise Failure("the secret on stdin must be one line")
    else:
        try:
            data = getpass.getpass(f"Secret for {login}: ")
            if data and getpass.getpass("Again: ") != data:
                raise Failure("the secrets differ; nothing changed")
        except EOFError:
            raise Failure(NO_TTY_HINT) from None
    if not data:
        raise Failure("empty secret; nothing changed")
    return data


def _line_login(line: str) -> str | None:
    """The login a passwd line defines, or None for comments, blank and unparsable lines."""
    text = line.strip()
    if not text or text.startswith("#") or ":" not in text:
        return None
    return text.partition(":")[0].strip()


def _permissions_field(line: str) -> str:
    rest = line.strip().partition(":")[2]
    return rest.partition(":")[2].strip()


def update(text: str, login: str, new_secret: str | None, permissions: str | None, path: str) -> str:
    """The new file text: LOGIN's line replaced (or appended), or removed when new_secret is None."""
    parse_passwd(text, path)  # refuse to rewrite a file the broker could not read
    lines = text.splitlines(keepends=True)
    index = next((i for i, line in enumerate(lines) if _line_login(line) == login), None)
    if new_secret is None:
        if index is None:
            raise Failure(f"{path}: no user {login!r}; nothing changed")
        del lines[index]
        return "".join(lines)
    if permissions is None:
        permissions = _permissions_field(lines[index]) if index is not None else ""
    entry = f"{login}:{new_secret}" + (f":{permissions}" if permissions else "")
    if index is None:
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += "\n"
        lines.append(entry + "\n")
    else:
        old = lines[index]
        ending = old[len(old.rstrip("\r\n")):] or "\n"
        lines[index] = entry + ending
    result = "".join(lines)
    parse_passwd(result, path)  # never write what would not load
    return result


def write_atomically(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def run(args: argparse.Namespace) -> int:
    path = os.path.realpath(args.file)  # through a symlink: keep the link, rewrite its target
    directory = os.path.dirname(path)
    if args.permissions is not None:
        try:
            parse_inline(args.permissions, 0, "--permissions")
        except PasswdError as exc:
            raise Failure(f"--permissions: {exc.reason}") from None
    secret = None if args.delete else read_secret(args.password_stdin, args.login)
    stored = None if secret is None else hash_secret(secret)
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise Failure(f"{directory}: {exc.strerror}") from None
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if args.delete:
                raise Failure(f"{args.file}: no such file") from None
            data = b""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise Failure(f"{args.file}:{line}: not valid UTF-8") from None
        try:
            new = update(text, args.login, stored, args.permissions, args.file)
        except PasswdError as exc:
            raise Failure(str(exc)) from None
        write_atomically(path, new)
    finally:
        os.close(dfd)  # releases the lock
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    reason = check_login(args.login)
    if reason:
        parser.error(reason)
    if args.delete and (args.password_stdin or args.permissions is not None):
        parser.error("--delete cannot be combined with --password-stdin or --permissions")
    try:
        return run(args)
    except Failure as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        name = exc.filename or args.file
        print(f"{PROG}: {name}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
