"""``stompbroker`` command line: settings from key=value words, --flags, a config file and the environment."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
import time

import orjson

from . import __version__
from .settings import BY_LOWER, SETTINGS, Config, convert, make_config

_KEY_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_CONFIG_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*[=:]\s*(.*?)\s*$")
HINT = "(stompbroker --help lists every setting)"

EPILOG = """\
Every setting can be given four ways (highest priority first): as key=value words like stompica
(stompbroker processors=10 port=3000 TTL=5000), as --flags (--port 3000), as STOMPBROKER_<NAME>
environment variables (STOMPBROKER_PORT=3000), or in a config file (-c broker.conf, lines of
"name = value"). Names are case-insensitive. Unknown names are an error.
"""


class SettingsError(Exception):
    """A bad setting: one line saying where and what."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise SettingsError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="stompbroker",
        usage="stompbroker [key=value ...] [--name value ...] [-c CONFIG_FILE]",
        description=f"stompbroker {__version__}: a multi-process STOMP 1.0-1.2 broker (TCP and WebSocket).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,  # only what was given, to tell sources apart
        allow_abbrev=False,
    )
    parser.add_argument("-c", "--config", help="config file of 'name = value' lines")
    parser.add_argument("--version", action="version", version=f"stompbroker {__version__}")
    for s in SETTINGS:
        default = "" if s.secret else f" (default: {s.default})"
        flags = [f"--{s.name}"] + ([f"--{s.name.lower()}"] if s.name.lower() != s.name else [])
        parser.add_argument(*flags, dest=s.name, help=f"{s.help}{default}", metavar=s.name.upper())
    return parser


def unknown(key: str) -> str:
    close = difflib.get_close_matches(key.lower(), list(BY_LOWER), n=1)
    return f"unknown setting {key!r}" + (f" (did you mean {BY_LOWER[close[0]].name}?)" if close else "")


def translate_argv(argv: list[str]) -> list[str]:
    """Turn stompica's key=value words into --key value flags; unknown keys are refused."""
    out = []
    for word in argv:
        match = _KEY_VALUE.match(word)
        if match and not word.startswith("-"):
            key, value = match.groups()
            setting = BY_LOWER.get(key.lower())
            if setting is None:
                raise SettingsError(unknown(key))
            out += [f"--{setting.name}", value]
        else:
            out.append(word)
    return out


def read_config_file(path: str) -> dict[str, tuple[str, str]]:
    """name -> (value, "path:line") from a file of "name = value" lines (# comments)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"config file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    found = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith(("#", ";", "[")):
            continue
        match = _CONFIG_LINE.match(text)
        if match is None:
            raise SettingsError(f"{path}:{number}: expected 'name = value', got {text[:60]!r}")
        key, value = match.groups()
        setting = BY_LOWER.get(key.lower())
        if setting is None:
            raise SettingsError(f"{path}:{number}: {unknown(key)}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        found[setting.name] = (value, f"{path}:{number}")
    return found


def gather(argv: list[str], environ) -> dict[str, tuple[str, str]]:
    """Every given setting as name -> (text, where it came from), the highest priority winning."""
    args = build_parser().parse_args(translate_argv(argv))
    given = {}
    config_file = getattr(args, "config", None)
    if config_file:
        given.update(read_config_file(config_file))
    for s in SETTINGS:
        env = f"STOMPBROKER_{s.name.upper()}"
        if env in environ:
            given[s.name] = (environ[env], env)
    for s in SETTINGS:
        if hasattr(args, s.name):
            given[s.name] = (getattr(args, s.name), "command line")
    return given


def parse_config(argv: list[str] | None = None, environ=None) -> Config:
    """The effective settings; a bad one prints one line (where, what) and exits with status 2."""
    try:
        given = gather(sys.argv[1:] if argv is None else argv, os.environ if environ is None else environ)
        values = {}
        for name, (text, where) in given.items():
            try:
                values[name] = convert(BY_LOWER[name.lower()], text)
            except ValueError as exc:
                raise SettingsError(f"{where}: {exc}") from None
        try:
            return make_config(**values)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    except SettingsError as exc:
        print(f"stompbroker: {exc} {HINT}", file=sys.stderr)
        raise SystemExit(2) from None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, process, pid, logger, message[, exc]."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "process": record.processName,
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


class Redacting(logging.Formatter):
    """Wraps a formatter so that no secret value ever reaches the log, whatever the message."""

    def __init__(self, inner: logging.Formatter, secrets: list[str]):
        super().__init__()
        self.inner = inner
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def setup_logging(config: Config) -> None:
    if config.log_format == "json":
        formatter = JsonFormatter()
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(processName)s[%(process)d] %(message)s")
    secrets = config.secrets()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Redacting(formatter, secrets) if secrets else formatter)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(config.log_level.upper())


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    setup_logging(config)
    from .processes.supervisor import run

    return run(config)


if __name__ == "__main__":
    sys.exit(main())
