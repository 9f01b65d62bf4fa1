"""Command-line utilities around the broker (xtomp's utilities, redone).

- ``stompbroker-tap DEST``: print the messages of a destination to stdout;
- ``stompbroker-sink DEST``: publish stdin as messages;
- ``stompbroker-drain DEST``: empty a queue, printing (or not) what it held.

All three share :mod:`stompbroker.tools.client`, a small blocking STOMP 1.0-1.2 client over TCP or
WebSocket, and the connection options defined here.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
from contextlib import contextmanager

from .client import BrokerError, ClientError, ConnectionClosed, StompClient

__all__ = ["add_connection_options", "connect", "decode_escapes", "exit_status_help", "run_tool",
           "Interrupted",
           "BrokerError", "ClientError", "ConnectionClosed", "StompClient"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 61613  # the broker's default port
# The broker's own variables, so a shell set up for the broker points the tools at it too.
HOST_ENV, PORT_ENV = "STOMPBROKER_HOST", "STOMPBROKER_PORT"

EXIT_OK = 0
EXIT_FAILURE = 1      # the broker refused something, went away, or could not be reached
EXIT_USAGE = 2        # argparse's status for a bad command line
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a C tool killed by SIGPIPE reports

CONNECTION_EPILOG = """\
connection: --host/--port for raw STOMP over TCP (default $STOMPBROKER_HOST:$STOMPBROKER_PORT, else
127.0.0.1:61613, the broker's default),
or --ws ws://HOST:PORT/ for STOMP over WebSocket (any path; wss:// works too). The passcode can
also come from the STOMPBROKER_PASSCODE environment variable, which keeps it out of `ps`.

escapes in delimiters: \\n newline, \\t tab, \\r carriage return, \\0 NUL, \\\\ backslash,
\\xHH any byte; anything else is taken literally."""


def exit_status_help(extra: str = "", writes_stdout: bool = True) -> str:
    """The "exit status" paragraph of a tool's --help."""
    lines = ["exit status: 0 success; 1 the broker refused (ERROR frame, its message is printed), "
             "went away or could not be reached; 2 bad command line"]
    if extra:
        lines.append(extra)
    if writes_stdout:
        lines.append("141 stdout closed (e.g. piped into head)")
    lines.append("130 interrupted (Ctrl-C or SIGTERM)")
    return textwrap.fill("; ".join(lines), width=99)


class Interrupted(Exception):
    """SIGINT or SIGTERM: stop cleanly."""


def decode_escapes(text: str) -> bytes:
    r"""A delimiter from the command line to bytes: ``\n \t \r \0 \\ \xHH`` are decoded.

    Any other backslash sequence is kept as it is (so Windows paths and regex-looking text survive).
    """
    out = bytearray()
    simple = {"n": b"\n", "t": b"\t", "r": b"\r", "0": b"\0", "\\": b"\\", "a": b"\a",
              "b": b"\b", "f": b"\f", "v": b"\v", "e": b"\x1b"}
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in simple:
                out += simple[nxt]
                i += 2
                continue
            if nxt == "x" and _is_hex(text[i + 2:i + 4]):
                out.append(int(text[i + 2:i + 4], 16))
                i += 4
                continue
        out += c.encode("utf-8")
        i += 1
    return bytes(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def delimiter(text: str) -> bytes:
    """argparse type for -d."""
    return decode_escapes(text)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--host", default=None,
                       help=f"broker host for STOMP over TCP (default ${HOST_ENV}, else {DEFAULT_HOST})")
    group.add_argument("--port", type=int, default=None, help=f"broker port (default ${PORT_ENV}, else {DEFAULT_PORT})")
    group.add_argument("--ws", metavar="URL", default=None,
                       help=f"connect over WebSocket instead, e.g. ws://127.0.0.1:{DEFAULT_PORT}/")
    group.add_argument("--login", default=None, help="login header of CONNECT")
    group.add_argument("--passcode", default=None,
                       help="passcode header of CONNECT (default: $STOMPBROKER_PASSCODE)")
    group.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                       help="time allowed to connect and get CONNECTED (default 5)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="report progress on stderr (connected, subscribed, counts)")


def check_connection_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.ws is not None:
        if args.host is not None or args.port is not None:
            parser.error("--ws cannot be combined with --host/--port")
        if not args.ws.startswith(("ws://", "wss://")):
            parser.error(f"--ws needs a ws:// or wss:// URL, not {args.ws!r}")
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, not {args.port}")
    if args.ws is None:
        if args.host is None:
            args.host = os.environ.get(HOST_ENV) or DEFAULT_HOST
            if args.host in ("0.0.0.0", "::"):  # the broker's "every interface": reach it on loopback
                args.host = "127.0.0.1" if args.host == "0.0.0.0" else "::1"
        if args.port is None:
            text = os.environ.get(PORT_ENV)
            try:
                args.port = int(text) if text else DEFAULT_PORT
            except ValueError:
                parser.error(f"${PORT_ENV} must be a port number, not {text!r}")
            if not 0 < args.port < 65536:
                parser.error(f"${PORT_ENV} must be between 1 and 65535, not {args.port}")
    if args.connect_timeout <= 0:
        parser.error("--connect-timeout must be positive")


def connect(args: argparse.Namespace) -> StompClient:
    passcode = args.passcode if args.passcode is not None else os.environ.get("STOMPBROKER_PASSCODE")
    return StompClient.connect(
        host=args.host or DEFAULT_HOST, port=args.port or DEFAULT_PORT, ws_url=args.ws,
        login=args.login, passcode=passcode, timeout=args.connect_timeout,
    )


def binary_stdout():
    """sys.stdout as bytes; an error when the tool was started with stdout closed (>&-)."""
    if sys.stdout is None:
        raise ClientError("stdout is closed")
    return sys.stdout.buffer


def where(args: argparse.Namespace) -> str:
    return args.ws or f"{args.host or DEFAULT_HOST}:{args.port or DEFAULT_PORT}"


@contextmanager
def _signals():
    """SIGINT and SIGTERM raise Interrupted (once); the previous handlers come back afterwards."""

    def handler(signum, frame):
        # Ignore further signals while stopping: a second Ctrl-C must not break the clean-up.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_tool(prog: str, body) -> int:
    """Run ``body()`` (returns an exit status), turning failures into one line on stderr."""
    try:
        with _signals():
            return body()
    except Interrupted:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout closed (e.g. piped into `head`): stop quietly, and keep Python from complaining
        # again when it flushes stdout at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_BROKEN_PIPE
    except BrokerError as exc:
        print(f"{prog}: ERROR from the broker: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except ClientError as exc:  # ConnectionClosed, cannot connect, protocol trouble
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # stdin or stdout unusable (closed, EIO...)
        print(f"{prog}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
