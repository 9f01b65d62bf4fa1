"""``stompbroker-store``: check, export or repair a durable store (store=sqlite).

    stompbroker-store check PATH           verify it; exit 0 when the broker can start on it
    stompbroker-store export PATH [--out F] every readable queued message as JSON lines (body base64)
                             [--quarantined] the quarantined ones instead, each with its reason
    stompbroker-store release PATH [SEQ..] put quarantined messages (all, or these) back in their
                                           queues; with the broker stopped
    stompbroker-store repair PATH          copy what is readable into a fresh store; the damaged file
                                           is kept as PATH.damaged-<time> (a healthy store is left alone)

The broker quarantines a stored message at start when its destination is longer than
max_destination_length, or when the dispatcher died twice while loading it (docs/reliability.md).

Exit status: 0 done, 1 the file is not a store or cannot be read.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import sqlite3
import sys
import time

import orjson

from ..store import sqlite as store

COLUMNS = "seq, queue, message_id, headers, body, expires, delivered, created"
SQLITE_HEADER = b"SQLite format 3\0"
STEP = 256             # rowids read per query: one bad page loses little
MAX_ROWID = (1 << 63) - 1


class NotAStore(Exception):
    """The file is not an SQLite database at all: nothing in it can be read as messages."""


def require_sqlite(path: str) -> None:
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_HEADER))
    if head and head != SQLITE_HEADER:
        raise NotAStore(f"{path} is not an SQLite database (it does not start with the SQLite header), "
                        "so it holds no readable messages")


def readable_rows(path: str, table: str = "messages", columns: str = COLUMNS):
    """Rows of a possibly damaged database, read in rowid ranges so one bad page loses little.

    When the table's first and last rowids cannot be read, ranges that fail or hold nothing double
    in size, so a hopeless table costs some 60 queries instead of a walk to the largest rowid."""
    require_sqlite(path)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        try:
            low, high = db.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
            grow = False
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise NotAStore(f"{path} cannot be read as an SQLite database ({exc})") from None
            print(f"{table}: first and last rows unreadable ({exc}); probing", file=sys.stderr)
            low, high, grow = 0, MAX_ROWID, True
        failed = 0
        if low is None:
            return
        start, step = low, STEP
        while start <= high:
            try:
                rows = db.execute(f"SELECT {columns} FROM {table} WHERE rowid >= ? AND rowid < ? ORDER BY rowid",
                                  (start, min(start + step, MAX_ROWID))).fetchall()
            except sqlite3.DatabaseError as exc:
                failed += 1
                if not grow or failed <= 3:
                    print(f"{table}: unreadable rows {start}..{start + step - 1}: {exc}", file=sys.stderr)
                rows = None
            if rows:
                yield from rows
            start += step
            step = step * 2 if grow and not rows else STEP
        if grow and failed > 3:
            print(f"{table}: {failed} unreadable ranges in all", file=sys.stderr)
    finally:
        db.close()


def cmd_check(path: str) -> int:
    try:
        count = store.check(path)
    except store.StoreError as exc:
        print(exc, file=sys.stderr)
        return 1
    quarantined = store.quarantined(path)
    aside = f", {quarantined} quarantined (stompbroker-store export --quarantined)" if quarantined else ""
    print(f"{path}: ok, {count} queued messages{aside}")
    return 0


def cmd_export(path: str, out, quarantined: bool = False) -> int:
    n = 0
    rows = readable_rows(path, "quarantine", COLUMNS + ", reason") if quarantined else \
        ((*row, None) for row in readable_rows(path))
    for seq, queue, message_id, headers, body, expires, delivered, created, reason in rows:
        out.write(orjson.dumps({"seq": seq, "queue": queue, "message_id": message_id,
                                "headers": orjson.loads(headers), "body": base64.b64encode(body).decode(),
                                "expires": expires, "delivered": bool(delivered), "created": created,
                                **({"reason": reason} if quarantined else {})}) + b"\n")
        n += 1
    print(f"exported {n} {'quarantined ' if quarantined else ''}messages", file=sys.stderr)
    return 0


def cmd_release(path: str, seqs: list[int]) -> int:
    """Quarantined messages back into their queues (the broker loads them at its next start)."""
    try:
        moved = store.release(path, seqs or None)
    except store.StoreError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"released {moved} quarantined messages into their queues")
    return 0


def cmd_repair(path: str) -> int:
    require_sqlite(path)
    try:
        count = store.check(path)
    except store.StoreError as exc:
        print(f"{exc}; repairing", file=sys.stderr)
    else:
        print(f"{path}: ok, {count} queued messages; nothing to repair")
        return 0
    fresh = f"{path}.repair-{os.getpid()}"
    try:
        n = copy_readable(path, fresh)
    except BaseException:  # interrupted or failed: leave no half-made store behind
        for suffix in ("", "-wal", "-shm", "-journal"):
            if os.path.exists(fresh + suffix):
                os.unlink(fresh + suffix)
        raise
    damaged = f"{path}.damaged-{int(time.time())}"
    os.replace(path, damaged)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, damaged + suffix)
    os.replace(fresh, path)
    print(f"repaired {path}: {n} messages kept; the damaged file is {damaged}")
    return 0


def copy_readable(path: str, fresh: str) -> int:
    db = store.connect(fresh)
    try:
        db.executescript(store.SCHEMA)
        n = 0
        db.execute("BEGIN")
        for row in readable_rows(path):
            db.execute("INSERT OR IGNORE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
            n += 1
        for row in readable_rows(path, "durable_subscriptions", "name, pattern, created"):
            db.execute("INSERT OR IGNORE INTO durable_subscriptions VALUES (?, ?, ?)", row)
        try:
            for row in readable_rows(path, "quarantine", COLUMNS + ", reason, quarantined"):
                db.execute("INSERT OR IGNORE INTO quarantine VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        except sqlite3.OperationalError:  # a store written before the quarantine table
            pass
        try:
            for row in readable_rows(path, "scheduled", "job_id, destination, headers, body, state, created"):
                db.execute("INSERT OR IGNORE INTO scheduled VALUES (?, ?, ?, ?, ?, ?)", row)
        except sqlite3.OperationalError:  # a store written before scheduled messages
            pass
        db.execute("COMMIT")
    finally:
        db.close()
    return n


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stompbroker-store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("check", "export", "release", "repair"))
    parser.add_argument("path", help="the store file (the broker's store_path)")
    parser.add_argument("seqs", nargs="*", type=int, help="release: these quarantined messages (default: all)")
    parser.add_argument("--out", help="export: write here instead of standard output")
    parser.add_argument("--quarantined", action="store_true", help="export: the quarantined messages")
    args = parser.parse_args(argv)
    if not os.path.exists(args.path):
        print(f"{args.path}: no such file", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _interrupted)  # clean up as for Ctrl-C
    try:
        if args.command == "check":
            return cmd_check(args.path)
        if args.command == "export":
            require_sqlite(args.path)
            if args.out:
                with open(args.out, "wb") as out:
                    return cmd_export(args.path, out, args.quarantined)
            return cmd_export(args.path, sys.stdout.buffer, args.quarantined)
        if args.command == "release":
            return cmd_release(args.path, args.seqs)
        return cmd_repair(args.path)
    except NotAStore as exc:
        print(f"stompbroker-store: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stompbroker-store: interrupted; nothing was changed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
