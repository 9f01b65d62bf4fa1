"""``stompbroker-admin``: the broker's management API (docs/admin.md) from a shell, in the style of
``rabbitmqadmin``::

    stompbroker-admin --url http://127.0.0.1:61613 --user admin queue purge /queue/jobs

The password comes from ``STOMPBROKER_PASSWORD``, else a prompt (never the command line, where
other users could read it). ``--json`` prints the API's answers as they are; without it lists are
tables and actions one line. Exit status: 0 done, 1 the broker refused (its status and reason on
stderr), 2 a bad command line, 3 no answer (no broker there, a timeout, not its API).
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import sys
import urllib.error
import urllib.request
from urllib.parse import quote, urlencode

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
URL_ENV, USER_ENV, PASSWORD_ENV = "STOMPBROKER_URL", "STOMPBROKER_USER", "STOMPBROKER_PASSWORD"
DEFAULT_URL = "http://127.0.0.1:61613"
TIMEOUT = 30.0

EPILOG = f"""\
examples:
  stompbroker-admin --user admin queue list --sort depth --reverse
  stompbroker-admin --user admin queue peek /queue/jobs --count 5
  stompbroker-admin --user admin queue purge /queue/jobs
  stompbroker-admin --user admin queue move /queue/DLQ                  (redrive: each to its original destination)
  stompbroker-admin --user admin queue move /queue/DLQ --to /queue/jobs --count 10 --selector "retries < 3"
  stompbroker-admin --user admin publish /topic/news 'hello' --header lang=en
  stompbroker-admin --user admin connection close 1099511627777 --reason maintenance
  stompbroker-admin --user admin scheduled list /queue/jobs
  stompbroker-admin --user admin scheduled cancel /queue/jobs 5kq1-j12    (one; without the id: all of /queue/jobs)

The password is read from ${PASSWORD_ENV}, else asked for. --url defaults to ${URL_ENV}, else
{DEFAULT_URL}; --user to ${USER_ENV}.
exit status: 0 done, 1 the broker refused, 2 bad command line, 3 no answer from the broker.
"""


class Failed(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Api:
    def __init__(self, url: str, user: str | None, password: str | None, vhost: str):
        self.url = url.rstrip("/")
        self.vhost = vhost
        self.auth = None
        if user:
            self.auth = "Basic " + base64.b64encode(f"{user}:{password or ''}".encode()).decode()

    def call(self, method: str, path: str, body: dict | None = None, query: dict | None = None):
        if query:
            path += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.auth:
            request.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                reason = json.loads(text)["reason"]
            except (ValueError, KeyError, TypeError):
                reason = text.decode(errors="replace").strip()[:500]
            raise Failed(EXIT_REFUSED, f"{exc.code} {exc.reason}: {reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise Failed(EXIT_UNREACHABLE, f"no answer from {self.url}: {getattr(exc, 'reason', exc)}") from None
        try:
            return json.loads(text)
        except ValueError:
            raise Failed(EXIT_UNREACHABLE, f"{self.url}{path} did not answer JSON: is it the broker's API?") from None

    def queue(self, dest: str, tail: str = "") -> str:
        return f"/api/queues/{quote(self.vhost, safe='')}/{quote(dest, safe='')}{tail}"


# -- output ------------------------------------------------------------------------------------------
def table(items: list[dict], columns: list[str], out) -> None:
    rows = [[_cell(item.get(c)) for c in columns] for item in items]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    for row in [columns] + rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip(), file=out)


def _cell(value) -> str:
    if value is None:
        return "-"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text.replace("\x1f", "/").replace("\n", " ")


def page_note(answer: dict, out) -> None:
    if answer.get("page_count", 1) > 1 or answer.get("truncated"):
        print(f"(page {answer['page']} of {answer['page_count']}, {answer['filtered_count']} in all"
              f"{'; cut at the answer limit: ask for smaller pages' if answer.get('truncated') else ''})", file=out)


# -- commands ----------------------------------------------------------------------------------------
def run(args, api: Api, out) -> None:
    what = (args.noun, getattr(args, "verb", None))
    if what == ("queue", "list"):
        answer = api.call("GET", "/api/queues", query={"vhost": api.vhost, "name": args.name, "sort": args.sort,
                                                       "sort_reverse": "true" if args.reverse else None,
                                                       "page": args.page, "page_size": args.page_size})
        return show(args, answer, out, lambda: (table(answer["items"], ["destination", "depth", "enqueued",
                                                                        "dequeued", "unacked", "consumers"], out),
                                                page_note(answer, out)))
    if what == ("queue", "peek"):
        answer = api.call("GET", api.queue(args.destination, "/messages"),
                          query={"count": args.count, "offset": args.offset, "truncate": args.truncate,
                                 "encoding": "base64" if args.base64 else None})

        def human():
            print(f"{args.destination}: {answer['depth']} waiting; from {answer['offset']}:", file=out)
            for m in answer["messages"]:
                headers = {k: v for k, v in m["headers"].items() if k not in ("destination", "content-length")}
                cut = " (cut)" if m["truncated"] else ""
                print(f"- {m['message_id']}  {m['size']} bytes  {json.dumps(headers)}", file=out)
                print(f"  {m['payload_encoding']}: {m['payload']}{cut}", file=out)
        return show(args, answer, out, human)
    if what == ("queue", "purge"):
        answer = api.call("DELETE", api.queue(args.destination, "/messages"))
        more = " (stopped at its time: run it again for the rest)" if answer.get("truncated") else ""
        return show(args, answer, out, lambda: print(f"purged {answer['purged']} messages from {args.destination}"
                                                      f"{more}", file=out))
    if what == ("queue", "delete"):
        answer = api.call("DELETE", api.queue(args.destination))
        return show(args, answer, out, lambda: print(
            f"deleted {args.destination} ({answer['purged']} messages)" if answer["deleted"]
            else f"no queue {args.destination}", file=out))
    if what == ("queue", "move"):
        body = {k: v for k, v in (("to", args.to), ("count", args.count), ("selector", args.selector)) if v is not None}
        answer = api.call("POST", api.queue(args.destination, "/move"), body)
        where = args.to or "their original destinations"
        left = "" if answer.get("left") is None else f"; {answer['left']} left"  # (None: not counted, cluster mode)
        if answer.get("truncated"):
            left += " (stopped at its time: run it again for the rest)"
        return show(args, answer, out, lambda: print(f"moved {answer['moved']} messages from {args.destination} to "
                                                      f"{where}{left}", file=out))
    if what == ("connection", "list"):
        answer = api.call("GET", "/api/connections", query={"page": args.page, "page_size": args.page_size})
        return show(args, answer, out, lambda: (table(answer["items"], ["id", "peer", "login", "version", "websocket",
                                                                        "subscription_count", "age_seconds"], out),
                                                page_note(answer, out)))
    if what == ("connection", "close"):
        answer = api.call("DELETE", f"/api/connections/{quote(args.id, safe='')}",
                          {"reason": args.reason} if args.reason else None)
        return show(args, answer, out, lambda: print(f"closed connection {answer['closed']}", file=out))
    if what == ("subscription", "list"):
        answer = api.call("GET", "/api/subscriptions", query={"vhost": api.vhost, "page": args.page,
                                                              "page_size": args.page_size})
        return show(args, answer, out, lambda: (table(answer["items"], ["durable", "key", "destination", "attached",
                                                                        "connection", "id", "waiting"], out),
                                                page_note(answer, out)))
    if what == ("subscription", "remove"):
        answer = api.call("DELETE", f"/api/subscriptions/{quote(api.vhost, safe='')}/{quote(args.key, safe='')}")
        return show(args, answer, out, lambda: print(f"removed {args.key} ({answer['dropped']} messages dropped)",
                                                      file=out))
    if what == ("scheduled", "list"):
        answer = api.call("GET", "/api/scheduled", query={"vhost": api.vhost, "destination": args.destination,
                                                          "page": args.page, "page_size": args.page_size})
        return show(args, answer, out, lambda: (table(answer["items"], ["id", "destination", "next", "left", "period",
                                                                        "repeat", "cron", "bytes"], out),
                                                page_note(answer, out)))
    if what == ("scheduled", "cancel"):
        path = f"/api/scheduled/{quote(api.vhost, safe='')}/{quote(args.destination, safe='')}"
        answer = api.call("DELETE", path + (f"/{quote(args.id, safe='')}" if args.id else ""))
        return show(args, answer, out, lambda: print(f"cancelled {answer['cancelled']} scheduled messages of "
                                                      f"{args.destination}", file=out))
    if what == ("vhost", "list"):
        answer = api.call("GET", "/api/vhosts")
        return show(args, answer, out, lambda: table(answer["items"], ["name"], out))
    if args.noun == "publish":
        body = sys.stdin.buffer.read() if args.body == "-" else args.body.encode()
        headers = {}
        for item in args.header:
            name, sep, value = item.partition("=")
            if not sep:
                raise Failed(EXIT_USAGE, f"--header takes NAME=VALUE, not {item!r}")
            headers[name] = value
        payload = {"vhost": api.vhost, "destination": args.destination, "headers": headers,
                   "body": base64.b64encode(body).decode(), "body_encoding": "base64"}
        if args.non_persistent:  # (else as a SEND without the header: a --header persistent=true says more)
            payload["persistent"] = False
        answer = api.call("POST", "/api/publish", payload)
        return show(args, answer, out, lambda: print(f"published to {args.destination} "
                                                      f"({answer['delivered']} delivered at once)", file=out))
    raise Failed(EXIT_USAGE, "nothing to do (see --help)")


def show(args, answer, out, human) -> None:
    if args.json:
        print(json.dumps(answer, indent=2), file=out)
    else:
        human()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stompbroker-admin", description="Manage a stompbroker over its HTTP API "
                                "(docs/admin.md).", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get(URL_ENV, DEFAULT_URL), help="the broker's HTTP address")
    p.add_argument("--user", default=os.environ.get(USER_ENV), help="an admin login (or one with a manage grant)")
    p.add_argument("--vhost", default="/", help="virtual host (default /)")
    p.add_argument("--json", action="store_true", help="print the API's JSON answers")
    nouns = p.add_subparsers(dest="noun", required=True)

    def paged(sub):
        sub.add_argument("--page", type=int)
        sub.add_argument("--page-size", type=int)

    queue = nouns.add_parser("queue", help="list queues; peek at, purge, delete a queue; move its messages")
    verbs = queue.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="queues and their figures")
    listing.add_argument("--name", help="only queues whose name holds this text")
    listing.add_argument("--sort", choices=("name", "depth", "enqueued", "dequeued", "unacked", "consumers"))
    listing.add_argument("--reverse", action="store_true", help="largest first")
    paged(listing)
    peek = verbs.add_parser("peek", help="waiting messages, not consumed")
    peek.add_argument("destination")
    peek.add_argument("--count", type=int)
    peek.add_argument("--offset", type=int)
    peek.add_argument("--truncate", type=int, help="body bytes shown (4096)")
    peek.add_argument("--base64", action="store_true", help="bodies as base64 even when they are text")
    for name, text in (("purge", "drop the waiting messages"), ("delete", "forget the queue (not in use)")):
        verbs.add_parser(name, help=text).add_argument("destination")
    move = verbs.add_parser("move", help="move waiting messages (the dead-letter redrive)")
    move.add_argument("destination")
    move.add_argument("--to", help="target destination (default: each message's original-destination)")
    move.add_argument("--count", type=int, help="at most this many (default all)")
    move.add_argument("--selector", help="only messages this SQL92 selector accepts")

    connection = nouns.add_parser("connection", help="list connections; close one")
    verbs = connection.add_subparsers(dest="verb", required=True)
    paged(verbs.add_parser("list", help="connections"))
    close = verbs.add_parser("close", help="send an ERROR and close")
    close.add_argument("id")
    close.add_argument("--reason", help="told to the client in the ERROR")

    subscription = nouns.add_parser("subscription", help="list subscriptions; remove a durable one")
    verbs = subscription.add_subparsers(dest="verb", required=True)
    paged(verbs.add_parser("list", help="durable and live subscriptions"))
    verbs.add_parser("remove", help="remove a detached durable subscription").add_argument("key")

    scheduled = nouns.add_parser("scheduled", help="list scheduled messages; cancel one, or all of a destination")
    verbs = scheduled.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="scheduled messages by time (next: epoch ms)")
    listing.add_argument("destination", nargs="?", help="only this destination's")
    paged(listing)
    cancel = verbs.add_parser("cancel", help="cancel the scheduled message ID of DESTINATION (no ID: all of it)")
    cancel.add_argument("destination")
    cancel.add_argument("id", nargs="?")

    vhost = nouns.add_parser("vhost", help="list virtual hosts")
    vhost.add_subparsers(dest="verb", required=True).add_parser("list")

    publish = nouns.add_parser("publish", help="publish a message")
    publish.add_argument("destination")
    publish.add_argument("body", help="the body ('-': read stdin)")
    publish.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    publish.add_argument("--non-persistent", action="store_true", help="keep it out of the store")
    return p


def main(argv: list[str] | None = None, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = parser().parse_args(argv)
    password = None
    if args.user:
        password = os.environ.get(PASSWORD_ENV)
        if password is None:
            try:
                password = getpass.getpass(f"password for {args.user}: ")
            except (EOFError, KeyboardInterrupt):
                print("stompbroker-admin: no password (set STOMPBROKER_PASSWORD)", file=err)
                return EXIT_USAGE
    try:
        run(args, Api(args.url, args.user, password, args.vhost), out)
    except Failed as exc:
        print(f"stompbroker-admin: {exc}", file=err)
        return exc.status
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
