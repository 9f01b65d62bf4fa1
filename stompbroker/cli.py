"""``stompbroker`` command line: settings from key=value words, --flags, a config file and the environment."""

from __future__ import annotations

import logging
import re
import sys

import configargparse

from . import __version__
from .settings import BY_LOWER, SETTINGS, Config, make_config

_KEY_VALUE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)

EPILOG = """\
Every setting can be given four ways (highest priority first): as key=value words like stompica
(stompbroker processors=10 port=3000 TTL=5000), as --flags (--port 3000), as STOMPBROKER_<NAME>
environment variables (STOMPBROKER_PORT=3000), or in a config file (-c broker.conf, lines of
"name = value"). Unknown names are an error.
"""


def build_parser() -> configargparse.ArgumentParser:
    parser = configargparse.ArgumentParser(
        prog="stompbroker",
        description=f"stompbroker {__version__}: a multi-process STOMP 1.0-1.2 broker (TCP and WebSocket).",
        epilog=EPILOG,
        formatter_class=configargparse.ArgumentDefaultsHelpFormatter,
        config_file_parser_class=configargparse.DefaultConfigFileParser,
    )
    parser.add_argument("-c", "--config", is_config_file=True, help="config file of 'name = value' lines")
    parser.add_argument("--version", action="version", version=f"stompbroker {__version__}")
    for s in SETTINGS:
        parser.add_argument(f"--{s.name}", type=s.type, default=s.default, help=s.help,
                            env_var=f"STOMPBROKER_{s.name.upper()}", metavar=s.name.upper())
    return parser


def translate_argv(argv: list[str]) -> list[str]:
    """Turn stompica's key=value words into --key value flags; unknown keys are refused."""
    out = []
    for word in argv:
        match = _KEY_VALUE.match(word)
        if match and not word.startswith("-"):
            key, value = match.groups()
            setting = BY_LOWER.get(key.lower())
            if setting is None:
                known = ", ".join(s.name for s in SETTINGS)
                raise SystemExit(f"stompbroker: unknown setting {key!r} (known: {known})")
            out += [f"--{setting.name}", value]
        else:
            out.append(word)
    return out


def parse_config(argv: list[str] | None = None) -> Config:
    parser = build_parser()
    args = parser.parse_args(translate_argv(sys.argv[1:] if argv is None else argv))
    values = {s.name: getattr(args, s.name) for s in SETTINGS}
    try:
        return make_config(**values)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(processName)s[%(process)d] %(message)s",
        stream=sys.stderr,
    )
    from .processes.supervisor import run

    return run(config)


if __name__ == "__main__":
    sys.exit(main())
