"""stompbroker-tap DEST: subscribe to a destination and print every message body to stdout."""

from __future__ import annotations

import argparse
import sys
import time

from . import (CONNECTION_EPILOG, EXIT_OK, add_connection_options, check_connection_options, connect,
               binary_stdout, delimiter, exit_status_help, run_tool, where)
from .client import Frame, escape

PROG = "stompbroker-tap"
EXIT_TIMEOUT = 3  # -n N given, and a timeout came first

DESCRIPTION = """\
Subscribe to DEST and write each message body to stdout (raw bytes, binary-safe), followed by the
delimiter. Runs until -n messages arrived, a timeout expired, the broker closed the connection or
Ctrl-C."""

EPILOG = """\
timeouts: --timeout is seconds of SILENCE: the timer starts when the subscription is in place and
restarts at every message, so `--timeout 2` means "stop once nothing came for 2 s".
--max-time is the TOTAL run time. Either one ending the run is a normal end (status 0), except
with -n: then stopping before N messages arrived exits with status 3.

acknowledgements: on /queue/ destinations tap subscribes with ack:client-individual and acks each
message only after writing it to stdout, so a message tap did not print (-n reached, Ctrl-C)
stays in the queue for the next consumer; elsewhere it uses ack:auto. --ack overrides this.

--headers writes each message as its headers (name:value lines, STOMP 1.1 escaping), a blank line
and the body, then the delimiter.

""" + CONNECTION_EPILOG + "\n\n" + exit_status_help("3 a timeout came before -n messages") + """

examples:
  stompbroker-tap /topic/prices                      one body per line, until Ctrl-C
  stompbroker-tap -n 1 --timeout 5 /queue/replies    wait up to 5 s for one reply
  stompbroker-tap -d '\\0' /topic/events | xargs -0 -n1 echo
  stompbroker-tap --ws ws://127.0.0.1:61613/ --headers '/topic/*'"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("destination", metavar="DEST", help="destination to subscribe to, e.g. /topic/a, "
                                                             "/queue/jobs or /topic/* (wildcard)")
    parser.add_argument("-d", "--delimiter", type=delimiter, default=b"\n", metavar="DELIM",
                        help="written after every message (default newline; escapes like \\0 \\t \\n; "
                             "'' for none)")
    parser.add_argument("--headers", action="store_true", help="write each message's headers before its body")
    parser.add_argument("-n", "--count", type=int, default=None, metavar="N", help="stop after N messages")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="stop after SECONDS without a message (silence, not total time)")
    parser.add_argument("--max-time", type=float, default=None, metavar="SECONDS",
                        help="stop after SECONDS in total")
    parser.add_argument("--ack", choices=("auto", "client-individual"), default=None,
                        help="ack mode of the subscription (default: client-individual on /queue/, else auto)")
    add_connection_options(parser)
    return parser


def format_message(frame: Frame, with_headers: bool, delim: bytes) -> bytes:
    if not with_headers:
        return frame.body + delim
    head = "".join(f"{escape(name)}:{escape(value)}\n" for name, value in frame.headers.items())
    return head.encode("utf-8") + b"\n" + frame.body + delim


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_connection_options(parser, args)
    if args.count is not None and args.count < 1:
        parser.error("-n must be at least 1")
    for name in ("timeout", "max_time"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return run_tool(PROG, lambda: tap(args))


def tap(args: argparse.Namespace) -> int:
    start = time.monotonic()
    ack = args.ack or ("client-individual" if args.destination.startswith("/queue/") else "auto")
    out = binary_stdout()
    client = connect(args)
    received = 0
    try:
        if args.verbose:
            print(f"{PROG}: connected to {where(args)} (STOMP {client.version}, {client.server or '?'})",
                  file=sys.stderr, flush=True)
        client.subscribe(args.destination, "tap-0", ack=ack, timeout=args.connect_timeout)
        if args.verbose:
            print(f"{PROG}: subscribed to {args.destination} (ack:{ack})", file=sys.stderr, flush=True)
        end = None if args.max_time is None else start + args.max_time
        while args.count is None or received < args.count:
            wait = args.timeout
            if end is not None:
                left = end - time.monotonic()
                wait = left if wait is None else min(wait, left)
            frame = client.read_frame(None if wait is None else max(wait, 0.0))
            if frame is None:
                break  # silence for --timeout, or --max-time reached
            if frame.command != "MESSAGE":
                continue
            out.write(format_message(frame, args.headers, args.delimiter))
            out.flush()
            received += 1
            if ack != "auto":
                client.ack(frame)
        if args.verbose:
            print(f"{PROG}: {received} messages", file=sys.stderr, flush=True)
        client.disconnect(timeout=args.connect_timeout)
    finally:
        client.close()
    if args.count is not None and received < args.count:
        return EXIT_TIMEOUT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
