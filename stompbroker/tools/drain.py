"""stompbroker-drain DEST: remove every message waiting in a queue, printing them (or not)."""

from __future__ import annotations

import argparse
import sys
import time

from . import (CONNECTION_EPILOG, EXIT_OK, add_connection_options, check_connection_options, connect,
               binary_stdout, delimiter, exit_status_help, run_tool, where)
from .tap import format_message

PROG = "stompbroker-drain"

DESCRIPTION = """\
Empty the queue DEST: subscribe with ack:client-individual, write each message to stdout (unless
--quiet), ACK it, and stop once no message came for --idle seconds. Reports `drained N messages`
on stderr, N being the messages acknowledged (removed from the queue)."""

EPILOG = """\
A message is acknowledged only after it was written to stdout, and the run ends with DISCONNECT
and its receipt, so the broker has processed every ACK when drain exits 0. Messages that arrive
after the idle period (or that were not yet written when drain was interrupted) are not acked
and stay in the queue. Only queues keep messages for later: draining a /topic/ finds nothing.

""" + CONNECTION_EPILOG + "\n\n" + exit_status_help() + """

examples:
  stompbroker-drain /queue/jobs > jobs.txt            save and remove what /queue/jobs holds
  stompbroker-drain --quiet /queue/dead-letters       just empty it"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("destination", metavar="DEST", help="queue to empty, e.g. /queue/jobs")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not write the messages to stdout")
    parser.add_argument("-d", "--delimiter", type=delimiter, default=b"\n", metavar="DELIM",
                        help="written after every message (default newline; escapes like \\0 \\t \\n)")
    parser.add_argument("--headers", action="store_true", help="write each message's headers before its body")
    parser.add_argument("--idle", type=float, default=1.0, metavar="SECONDS",
                        help="stop after SECONDS without a message (default 1)")
    parser.add_argument("--max-time", type=float, default=None, metavar="SECONDS",
                        help="stop after SECONDS in total even if messages keep coming")
    add_connection_options(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_connection_options(parser, args)
    if args.idle <= 0:
        parser.error("--idle must be positive")
    if args.max_time is not None and args.max_time <= 0:
        parser.error("--max-time must be positive")
    return run_tool(PROG, lambda: drain(args))


def drain(args: argparse.Namespace) -> int:
    start = time.monotonic()
    out = None if args.quiet else binary_stdout()
    client = connect(args)
    acked = 0
    try:
        if args.verbose:
            print(f"{PROG}: connected to {where(args)} (STOMP {client.version}, {client.server or '?'})",
                  file=sys.stderr, flush=True)
        client.subscribe(args.destination, "drain-0", ack="client-individual", timeout=args.connect_timeout)
        end = None if args.max_time is None else start + args.max_time
        while True:
            wait = args.idle if end is None else min(args.idle, end - time.monotonic())
            frame = client.read_frame(max(wait, 0.0))
            if frame is None:
                break
            if frame.command != "MESSAGE":
                continue
            if not args.quiet:
                out.write(format_message(frame, args.headers, args.delimiter))
                out.flush()
            client.ack(frame)
            acked += 1
        client.disconnect(timeout=args.connect_timeout)  # its receipt: every ACK was processed
    except BaseException:
        if acked:
            print(f"{PROG}: stopped after acknowledging {acked} messages", file=sys.stderr, flush=True)
        raise
    finally:
        client.close()
    print(f"drained {acked} messages", file=sys.stderr, flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
