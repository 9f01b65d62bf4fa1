"""``stompbroker-store``: check, export or repair a durable store (store=sqlite).

    stompbroker-store check PATH           verify it; exit 0 when the broker can start on it
    stompbroker-store export PATH [--out F] every readable queued message as JSON lines (body base64)
    stompbroker-store repair PATH          copy what is readable into a fresh store; the damaged file
                                           is kept as PATH.damaged-<time>
"""

from __future__ import annotations

import argparse
import base64
import os
import sqlite3
import sys
import time

import orjson

from ..store import sqlite as store

COLUMNS = "seq, queue, message_id, headers, body, expires, delivered, created"


def readable_rows(path: str, table: str = "messages", columns: str = COLUMNS):
    """Rows of a possibly damaged database, read in rowid ranges so one bad page loses little."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        try:
            low, high = db.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        except sqlite3.DatabaseError:
            low, high = 0, 1 << 40
        if low is None:
            return
        step = 256
        start = low
        while start <= high:
            try:
                yield from db.execute(f"SELECT {columns} FROM {table} WHERE rowid >= ? AND rowid < ? ORDER BY rowid",
                                      (start, start + step)).fetchall()
            except sqlite3.DatabaseError as exc:
                print(f"unreadable rows {start}..{start + step - 1}: {exc}", file=sys.stderr)
            start += step
    finally:
        db.close()


def cmd_check(path: str) -> int:
    try:
        count = store.check(path)
    except store.StoreError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{path}: ok, {count} queued messages")
    return 0


def cmd_export(path: str, out) -> int:
    n = 0
    for seq, queue, message_id, headers, body, expires, delivered, created in readable_rows(path):
        out.write(orjson.dumps({"seq": seq, "queue": queue, "message_id": message_id,
                                "headers": orjson.loads(headers), "body": base64.b64encode(body).decode(),
                                "expires": expires, "delivered": bool(delivered), "created": created}) + b"\n")
        n += 1
    print(f"exported {n} messages", file=sys.stderr)
    return 0


def cmd_repair(path: str) -> int:
    fresh = f"{path}.repair-{os.getpid()}"
    db = store.connect(fresh)
    db.executescript(store.SCHEMA)
    n = 0
    db.execute("BEGIN")
    for row in readable_rows(path):
        db.execute("INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
        n += 1
    for row in readable_rows(path, "durable_subscriptions", "name, pattern, created"):
        db.execute("INSERT OR IGNORE INTO durable_subscriptions VALUES (?, ?, ?)", row)
    db.execute("COMMIT")
    db.close()
    damaged = f"{path}.damaged-{int(time.time())}"
    os.replace(path, damaged)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, damaged + suffix)
    os.replace(fresh, path)
    print(f"repaired {path}: {n} messages kept; the damaged file is {damaged}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stompbroker-store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("check", "export", "repair"))
    parser.add_argument("path", help="the store file (the broker's store_path)")
    parser.add_argument("--out", help="export: write here instead of standard output")
    args = parser.parse_args(argv)
    if not os.path.exists(args.path):
        print(f"{args.path}: no such file", file=sys.stderr)
        return 1
    if args.command == "check":
        return cmd_check(args.path)
    if args.command == "export":
        if args.out:
            with open(args.out, "wb") as out:
                return cmd_export(args.path, out)
        return cmd_export(args.path, sys.stdout.buffer)
    return cmd_repair(args.path)


if __name__ == "__main__":
    sys.exit(main())
