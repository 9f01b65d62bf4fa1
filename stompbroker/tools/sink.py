"""stompbroker-sink DEST: publish stdin as messages (one per line, per delimited piece, or whole)."""

from __future__ import annotations

import argparse
import os
import select
import sys

from . import (CONNECTION_EPILOG, EXIT_OK, add_connection_options, check_connection_options, connect,
               delimiter, exit_status_help, run_tool, where)
from .client import ClientError, StompClient

PROG = "stompbroker-sink"
READ_SIZE = 1 << 16
# Headers sink sets itself; -H cannot override them.
RESERVED = {"destination": "give DEST as the argument", "content-length": "sink computes it",
            "receipt": "use --receipt", "transaction": "transactions are not supported by sink"}

DESCRIPTION = """\
Publish stdin to DEST: one message per line (default), per piece between delimiters (-d), or
all of stdin as one message (--whole). Bodies are raw bytes (binary-safe; a CR before the newline
is kept). Messages are sent as the input arrives, so `tail -f log | stompbroker-sink ...` streams."""

EPILOG = """\
splitting: the delimiter ends a message and is not part of it; a final piece without a delimiter
is sent too, an empty input sends nothing (with --whole: one empty message). Empty pieces between
two delimiters are sent as empty messages.

delivery: without --receipt sink sends without waiting, watches for an ERROR while it goes, and at
the end sends DISCONNECT with a receipt: when it exits 0 the broker has processed every message.
With --receipt it waits for a RECEIPT after each message before sending the next (slower).
If the broker refuses a message (ERROR frame, e.g. a destination containing *), goes away or
cannot be reached, sink says so on stderr (with the ERROR's message) and exits 1.

""" + CONNECTION_EPILOG + "\n\n" + exit_status_help(writes_stdout=False) + """

examples:
  printf 'a\\nb\\n' | stompbroker-sink /topic/letters            two messages
  stompbroker-sink --whole -H content-type:image/png /queue/images < photo.png
  find . -print0 | stompbroker-sink -d '\\0' --receipt /queue/files
  stompbroker-tap -n 10 /topic/in | stompbroker-sink /topic/out    relay ten messages"""


def header(text: str) -> tuple[str, str]:
    """argparse type for -H name:value."""
    name, sep, value = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected name:value, got {text!r}")
    if name.lower() in RESERVED:
        raise argparse.ArgumentTypeError(f"header {name!r} cannot be set with -H: {RESERVED[name.lower()]}")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("destination", metavar="DEST", help="destination to send to, e.g. /topic/a or /queue/jobs")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("-d", "--delimiter", type=delimiter, default=b"\n", metavar="DELIM",
                       help="split stdin on DELIM (default newline; escapes like \\0 \\t \\n)")
    split.add_argument("--whole", action="store_true", help="send all of stdin as one message")
    parser.add_argument("--receipt", action="store_true", help="wait for the broker's RECEIPT after each message")
    parser.add_argument("--receipt-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for a receipt (default 10)")
    parser.add_argument("-H", "--header", dest="headers", type=header, action="append", default=[],
                        metavar="NAME:VALUE", help="extra header for every message (repeatable)")
    add_connection_options(parser)
    return parser


def read_input(fd: int, client: StompClient) -> bytes:
    """The next chunk of stdin; meanwhile, notice at once if the broker closes or sends an ERROR.

    Waiting on both matters for long-running pipelines (`tail -f log | stompbroker-sink ...`):
    without it sink would only find out at the next line.
    """
    while True:
        sock = client.fileno()
        ready, _, _ = select.select([fd, sock] if sock >= 0 else [fd], [], [])
        if sock in ready:
            client.poll()  # raises BrokerError / ConnectionClosed
        if fd in ready:
            return os.read(fd, READ_SIZE)


def pieces(fd: int, delim: bytes, client: StompClient):
    """Yield lists of complete pieces as stdin delivers them (streaming, not reading to EOF first)."""
    buf = bytearray()
    while True:
        chunk = read_input(fd, client)
        if not chunk:
            break
        start = max(len(buf) - len(delim) + 1, 0)  # a delimiter may straddle the old and new bytes
        buf += chunk
        if buf.find(delim, start) < 0:
            continue  # a long piece: no copying until it ends
        parts = bytes(buf).split(delim)
        buf = bytearray(parts.pop())
        yield parts
    if buf:
        yield [bytes(buf)]


def read_all(fd: int, client: StompClient) -> bytes:
    chunks = []
    while True:
        chunk = read_input(fd, client)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_connection_options(parser, args)
    if not args.whole and not args.delimiter:
        parser.error("the delimiter cannot be empty (use --whole to send stdin as one message)")
    if args.receipt_timeout <= 0:
        parser.error("--receipt-timeout must be positive")
    return run_tool(PROG, lambda: sink(args))


def sink(args: argparse.Namespace) -> int:
    # Check stdin before connecting: with fd 0 closed, the socket itself would become fd 0.
    fd = 0  # not sys.stdin.fileno(): sys.stdin is None when stdin is closed (<&-)
    try:
        os.fstat(fd)
    except OSError:
        raise ClientError("stdin is closed") from None
    client = connect(args)
    sent = 0
    try:
        if args.verbose:
            print(f"{PROG}: connected to {where(args)} (STOMP {client.version}, {client.server or '?'})",
                  file=sys.stderr, flush=True)
        batches = [[read_all(fd, client)]] if args.whole else pieces(fd, args.delimiter, client)
        for batch in batches:
            for body in batch:
                # Without --receipt, frames of one read go out together (one write on TCP).
                client.send(args.destination, body, args.headers, receipt=args.receipt,
                            timeout=args.receipt_timeout, flush=False)
                sent += 1
            client.flush()
            client.poll()  # an ERROR for an earlier message stops us here
        client.disconnect(timeout=args.receipt_timeout)
    finally:
        client.close()
    if args.verbose:
        print(f"{PROG}: sent {sent} messages to {args.destination}", file=sys.stderr, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
