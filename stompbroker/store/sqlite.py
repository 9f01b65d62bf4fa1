"""Durable queue store: SQLite in WAL mode, written by one thread of the dispatcher process.

The dispatcher records operations (insert a message, delete it when acknowledged, mark it
delivered) as it routes; at the end of each round it hands them over as one batch and goes on.
The store thread writes each batch in one transaction and commits with an fsync (group commit:
one fsync for everything a round did), then reports the batch's generation through an eventfd, and
the dispatcher releases the receipts that waited for it. A message inserted and acknowledged within
the same round never reaches the disk. With ``checkpoint=N`` receipts do not wait and the thread
commits at most every N seconds (the last N seconds can be lost in a crash).

A commit that fails (disk full, I/O error) is rolled back and kept: the thread retries it, with
every batch that came after it, every ``RETRY`` seconds until it goes through, so nothing is ever
dropped and no later commit can release the receipts that wait for it. ``failing_since`` tells the
dispatcher how long the store has been unable to write; it decides when senders get an ERROR.
For tests, ``STOMPBROKER_STORE_FAULT=<path>`` makes every commit fail while that file exists.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import select
import sqlite3
import threading
import time

import orjson

log = logging.getLogger("stompbroker.store")

RETRY = 0.5  # seconds between attempts to write a batch that failed

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,          -- send order across the whole store
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    headers BLOB NOT NULL,            -- JSON object
    body BLOB NOT NULL,
    expires REAL NOT NULL DEFAULT 0,  -- epoch ms, 0 = never
    delivered INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL             -- epoch ms
);
CREATE TABLE IF NOT EXISTS durable_subscriptions (
    name TEXT PRIMARY KEY,
    pattern TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS replay_log (
    seq INTEGER PRIMARY KEY,
    destination TEXT NOT NULL,
    ts REAL NOT NULL,                 -- epoch ms when the broker accepted the message
    message_id TEXT NOT NULL,
    headers BLOB NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS replay_log_ts ON replay_log (ts);
CREATE TABLE IF NOT EXISTS scheduled (     -- messages waiting for their time (AMQ_SCHEDULED_*)
    job_id TEXT PRIMARY KEY,
    destination TEXT NOT NULL,
    headers BLOB NOT NULL,            -- JSON object, as sent (the scheduling headers included)
    body BLOB NOT NULL,
    state BLOB NOT NULL,              -- JSON: next time (epoch ms), deliveries left, cron base, ttl
    created REAL NOT NULL             -- epoch ms
);
CREATE TABLE IF NOT EXISTS quarantine (   -- messages set aside at start, kept for the operator
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    headers BLOB NOT NULL,
    body BLOB NOT NULL,
    expires REAL NOT NULL DEFAULT 0,
    delivered INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    reason TEXT NOT NULL,             -- why (a name over a limit; the dispatcher died loading it twice)
    quarantined REAL NOT NULL         -- epoch ms
);
"""
MESSAGE_COLUMNS = "seq, queue, message_id, headers, body, expires, delivered, created"


class StoreError(Exception):
    """The store cannot be opened or read: the broker must not start on it."""


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")  # fsync at every commit: a receipt means on disk
    return db


def check(path: str) -> int:
    """Open and verify a store; returns how many queued messages it holds. Raises StoreError."""
    try:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        db = connect(path)
        try:
            db.executescript(SCHEMA)
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise StoreError(f"{path} is damaged: {'; '.join(problems[:5])}")
            return db.execute("SELECT count(*) FROM messages").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{path} cannot be used as a store: {exc}") from None


def quarantined(path: str) -> int:
    """How many messages a (checked) store holds in quarantine."""
    db = connect(path)
    try:
        db.executescript(SCHEMA)
        return db.execute("SELECT count(*) FROM quarantine").fetchone()[0]
    finally:
        db.close()


def release(path: str, seqs: list[int] | None = None) -> int:
    """Quarantined messages (all, or those of ``seqs``) back into their queues; the broker must be
    stopped (it loads queues at start). Returns how many moved."""
    try:
        db = connect(path)
        try:
            db.executescript(SCHEMA)
            where, args = ("WHERE seq IN (SELECT value FROM json_each(?))", (orjson.dumps(seqs).decode(),)) \
                if seqs else ("", ())
            db.execute("BEGIN IMMEDIATE")
            before = db.total_changes
            db.execute(f"INSERT OR IGNORE INTO messages SELECT {MESSAGE_COLUMNS} FROM quarantine {where}", args)
            moved = db.total_changes - before
            db.execute(f"DELETE FROM quarantine {where}", args)
            db.execute("COMMIT")
            return moved
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot release quarantined messages: {exc}") from None


class Store:
    def __init__(self, path: str, checkpoint: float, replay_retention: float):
        self.path = path
        self.checkpoint = checkpoint
        self.replay_retention = replay_retention
        self.sync_receipts = checkpoint == 0    # receipts wait for the commit
        self.db = connect(path)
        self.db.executescript(SCHEMA)
        self.reader = connect(path)             # for replay queries from the dispatcher thread
        self.next_seq = (self.db.execute("SELECT max(seq) FROM messages").fetchone()[0] or 0) + 1
        self.next_log = (self.db.execute("SELECT max(seq) FROM replay_log").fetchone()[0] or 0) + 1
        self._reset_batch()
        self.generation = 1        # the batch being gathered now
        self.done = 0              # the last generation committed
        self.ops = 0               # operations recorded so far (to tell whether a frame wrote anything)
        self.done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.stats = {"commits": 0, "rows_written": 0, "errors": 0}
        self.failing_since = 0.0   # monotonic time of the first failed commit of an outage (0 = fine)
        self.unwritten = 0         # operations given up at close because the store could not write
        self._give_up_at = None    # set by close(): stop retrying after this (monotonic)
        self._fault = os.environ.get("STOMPBROKER_STORE_FAULT")
        self.retry = RETRY
        self._batches: queue_module.Queue = queue_module.Queue()
        self._done_lock = threading.Lock()
        self._finished: list[int] = []
        self._thread = threading.Thread(target=self._run, name="store", daemon=True)
        self._thread.start()

    # -- recovery ------------------------------------------------------------------------------
    def load(self):
        """Every stored message in send order: (seq, queue, id, headers, body, expires ms, delivered)."""
        for seq, name, message_id, headers, body, expires, delivered in self.db.execute(
                "SELECT seq, queue, message_id, headers, body, expires, delivered FROM messages ORDER BY seq"):
            yield seq, name, message_id, orjson.loads(headers), bytes(body), expires, bool(delivered)

    def quarantine(self, seqs, reason: str) -> int:
        """Set stored messages aside (at start, before anything else writes): out of their queues,
        into the quarantine table with the reason; ``stompbroker-store`` exports or releases them.
        Returns how many were moved."""
        seqs = [(seq,) for seq in seqs]
        now = time.time() * 1000
        db = self.db
        db.execute("BEGIN")
        try:
            before = db.total_changes
            db.executemany(f"INSERT OR REPLACE INTO quarantine SELECT {MESSAGE_COLUMNS}, ?, ? FROM messages "
                           "WHERE seq = ?", [(reason, now, seq) for (seq,) in seqs])
            moved = db.total_changes - before
            db.executemany("DELETE FROM messages WHERE seq = ?", seqs)
            db.execute("COMMIT")
        except sqlite3.Error:
            db.execute("ROLLBACK")
            raise
        return moved

    def load_jobs(self):
        """Every scheduled message: (job id, destination, headers, body, state), oldest first; the
        headers and state as stored (JSON: the caller decodes them, and drops a row it cannot read)."""
        for job_id, destination, headers, body, state in self.db.execute(
                "SELECT job_id, destination, headers, body, state FROM scheduled ORDER BY created, rowid"):
            yield job_id, destination, headers, bytes(body), state

    def load_durables(self) -> list[tuple[str, str]]:
        return list(self.db.execute("SELECT name, pattern FROM durable_subscriptions ORDER BY created"))

    # -- operations, gathered per round ----------------------------------------------------------
    def _reset_batch(self) -> None:
        self._inserts: dict[int, list] = {}
        self._deletes: set[int] = set()
        self._delivered: set[int] = set()
        self._durable_ops: list = []
        self._log: list = []
        self._jobs: dict[str, list | None] = {}  # job id -> its row to write, or None to delete

    def insert(self, queue: str, message_id: str, headers: dict, body: bytes, expires_ms: float) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self._inserts[seq] = [seq, queue, message_id, orjson.dumps(headers), body, expires_ms, 0, time.time() * 1000]
        self.ops += 1
        return seq

    def delete(self, seq: int) -> None:
        if self._inserts.pop(seq, None) is None:  # inserted and gone within one round: never written
            self._deletes.add(seq)
            self._delivered.discard(seq)
        self.ops += 1

    def mark_delivered(self, seq: int) -> None:
        row = self._inserts.get(seq)
        if row is not None:
            row[6] = 1
        else:
            self._delivered.add(seq)
        self.ops += 1

    def add_durable(self, name: str, pattern: str) -> None:
        self._durable_ops.append(("add", name, pattern))
        self.ops += 1

    def remove_durable(self, name: str) -> None:
        self._durable_ops.append(("remove", name, ""))
        self.ops += 1

    def log(self, destination: str, message_id: str, headers: dict, body: bytes) -> None:
        if self.replay_retention > 0:
            self._log.append((self.next_log, destination, time.time() * 1000, message_id,
                              orjson.dumps(headers), body))
            self.next_log += 1
            self.ops += 1

    def put_job(self, job_id: str, destination: str, headers: dict, body: bytes, state: dict) -> None:
        """A scheduled message, new or with its state moved on (a repeat fired): written whole."""
        self._jobs[job_id] = [job_id, destination, orjson.dumps(headers), body, orjson.dumps(state),
                              time.time() * 1000]
        self.ops += 1

    def drop_job(self, job_id: str) -> None:
        self._jobs[job_id] = None
        self.ops += 1

    def pending(self) -> bool:
        return bool(self._inserts or self._deletes or self._delivered or self._durable_ops or self._log
                    or self._jobs)

    def submit(self) -> int:
        """Hand this round's operations to the store thread; returns their generation."""
        generation = self.generation
        batch = (generation, list(self._inserts.values()), list(self._deletes), list(self._delivered),
                 self._durable_ops, self._log, self._jobs)
        self._reset_batch()
        self.generation += 1
        self._batches.put(batch)
        return generation

    def finished(self) -> int:
        """The highest generation on disk (after draining the eventfd)."""
        try:
            os.eventfd_read(self.done_fd)
        except BlockingIOError:
            pass
        with self._done_lock:
            if self._finished:
                self.done = max(self._finished)
                self._finished.clear()
        return self.done

    def replay(self, exact: str | None, prefix: str | None, since_ms: float):
        if exact is not None:
            rows = self.reader.execute(
                "SELECT destination, message_id, headers, body FROM replay_log WHERE ts >= ? AND destination = ? "
                "ORDER BY seq", (since_ms, exact))
        else:
            rows = self.reader.execute(
                "SELECT destination, message_id, headers, body FROM replay_log WHERE ts >= ? "
                "AND substr(destination, 1, ?) = ? ORDER BY seq", (since_ms, len(prefix), prefix))
        for destination, message_id, headers, body in rows:
            yield destination, message_id, orjson.loads(headers), bytes(body)

    def replay_seq(self, exact: str | None, prefix: str | None, start: int, stop: int | None, limit: int | None):
        """Replay-log rows from sequence ``start`` (to ``stop``, excluded; at most ``limit``) and the
        sequence to read from next. Rows are committed in sequence order, so everything up to the
        log's highest committed sequence is there: the next read starts after it, or after the last
        row returned when ``limit`` cut the read short. Also the log's lowest sequence (older ones
        are past ``replay_retention``)."""
        low, high = self.reader.execute("SELECT min(seq), max(seq) FROM replay_log").fetchone()
        top = start if high is None else high + 1
        stop = top if stop is None else min(stop, top)
        where, args = ("destination = ?", (exact,)) if exact is not None else \
            ("substr(destination, 1, ?) = ?", (len(prefix), prefix))
        rows = self.reader.execute(
            f"SELECT seq, ts, destination, message_id, headers, body FROM replay_log WHERE seq >= ? AND seq < ? "
            f"AND {where} ORDER BY seq LIMIT ?", (start, stop, *args, -1 if limit is None else limit)).fetchall()
        if limit and len(rows) >= limit:  # (limit 0: no rows, only where the log ends)
            stop = rows[-1][0] + 1 if rows else start
        return ([(seq, ts, d, m, orjson.loads(h), bytes(body)) for seq, ts, d, m, h, body in rows], max(stop, start),
                low or top)

    def dedup_ids(self, since_ms: float):
        """(destination, dedup-id, epoch ms) of the messages kept since ``since_ms``, oldest first:
        the replay log's (queue and persistent topic messages) and the queues' own. (The headers
        are JSON in a BLOB: X'64656475702d6964' is b"dedup-id".)"""
        rows = self.reader.execute(
            "SELECT destination, headers, ts FROM replay_log WHERE ts >= ? AND instr(headers, X'64656475702d6964') > 0 "
            "UNION ALL SELECT queue, headers, created FROM messages WHERE created >= ? AND queue LIKE '/queue/%' "
            "AND instr(headers, X'64656475702d6964') > 0 "
            "ORDER BY 3", (since_ms, since_ms))
        for destination, headers, ts in rows:
            dedup_id = orjson.loads(headers).get("dedup-id")
            if isinstance(dedup_id, str):
                yield destination, dedup_id, ts

    def sync(self, timeout: float) -> bool:
        """Submit what is pending and wait (up to ``timeout`` s) until everything is on disk."""
        if self.pending():
            self.submit()
        target = self.generation - 1
        deadline = time.monotonic() + timeout
        while self.finished() < target:
            left = deadline - time.monotonic()
            if left <= 0 or self.failing_since:  # an outage: the caller gets on with what it can do
                return False
            select.select([self.done_fd], [], [], min(left, self.retry))
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Write everything still pending and stop the thread (giving up after ``timeout`` s of errors)."""
        if self.pending():
            self.submit()
        self._give_up_at = time.monotonic() + timeout
        self._batches.put(None)
        self._thread.join(timeout + 5)
        self.finished()
        self.db.close()
        self.reader.close()
        os.close(self.done_fd)

    # -- the store thread ------------------------------------------------------------------------
    def _run(self) -> None:
        next_commit = time.monotonic() + self.checkpoint
        next_trim = time.monotonic() + 60
        stopping = False
        failed: list = []  # batches whose commit failed: retried, in order, before anything newer
        while not (stopping and not failed):
            if failed:  # wait a little before trying again, taking whatever comes meanwhile
                try:
                    batch = self._batches.get(timeout=self.retry)
                except queue_module.Empty:
                    batch = ()
                batches = failed + ([batch] if batch != () else [])
            else:
                batch = self._batches.get()
                batches = [batch]
                if self.checkpoint:  # gather everything until the next checkpoint time
                    while time.monotonic() < next_commit and batch is not None:
                        try:
                            batch = self._batches.get(timeout=max(next_commit - time.monotonic(), 0))
                            batches.append(batch)
                        except queue_module.Empty:
                            break
                    next_commit = time.monotonic() + self.checkpoint
            while True:  # and whatever else is already waiting: one commit for all of it
                try:
                    batches.append(self._batches.get_nowait())
                except queue_module.Empty:
                    break
            if None in batches:
                stopping = True
                batches = [b for b in batches if b is not None]
            failed = []
            if batches and not self._write(batches):
                failed = batches
                if stopping and time.monotonic() >= (self._give_up_at or 0):
                    self.unwritten = sum(len(b[1]) + len(b[2]) + len(b[3]) + len(b[4]) + len(b[5]) + len(b[6])
                                         for b in failed)
                    log.error("store still cannot write at shutdown: %d operations not written (their "
                              "senders got no receipt)", self.unwritten)
                    break
            if self.replay_retention > 0 and time.monotonic() > next_trim:
                next_trim = time.monotonic() + 60
                cutoff = time.time() * 1000 - self.replay_retention * 1000
                try:
                    # the newest row stays: sequences go on from it after a restart
                    self.db.execute("DELETE FROM replay_log WHERE ts < ? AND seq < (SELECT max(seq) FROM replay_log)",
                                    (cutoff,))
                except sqlite3.Error as exc:
                    log.warning("replay log trim failed: %s", exc)

    def _write(self, batches: list) -> bool:
        """Write the batches in one transaction; True when committed. A failure is rolled back."""
        db = self.db
        rows = 0
        # A message inserted by one batch and deleted by a later one of the same transaction (sent and
        # written to its subscriber meanwhile) never needs to touch the disk.
        elided = {row[0] for b in batches for row in b[1]} & {seq for b in batches for seq in b[2]}
        if elided:
            batches = [(g, [r for r in ins if r[0] not in elided], [s for s in dels if s not in elided],
                        [s for s in dlv if s not in elided], dur, lg, jobs)
                       for g, ins, dels, dlv, dur, lg, jobs in batches]
        try:
            db.execute("BEGIN")
            if self._fault is not None and os.path.exists(self._fault):
                raise sqlite3.OperationalError(f"database or disk is full (injected: {self._fault} exists)")
            for generation, inserts, deletes, delivered, durable_ops, log_rows, jobs in batches:
                db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)", inserts)
                db.executemany("DELETE FROM messages WHERE seq = ?", [(s,) for s in deletes])
                db.executemany("UPDATE messages SET delivered = 1 WHERE seq = ?", [(s,) for s in delivered])
                for op, name, pattern in durable_ops:
                    if op == "add":
                        db.execute("INSERT OR REPLACE INTO durable_subscriptions VALUES (?, ?, ?)",
                                   (name, pattern, time.time() * 1000))
                    else:
                        db.execute("DELETE FROM durable_subscriptions WHERE name = ?", (name,))
                db.executemany("INSERT INTO replay_log VALUES (?, ?, ?, ?, ?, ?)", log_rows)
                db.executemany("INSERT OR REPLACE INTO scheduled VALUES (?, ?, ?, ?, ?, ?)",
                               [row for row in jobs.values() if row is not None])
                db.executemany("DELETE FROM scheduled WHERE job_id = ?",
                               [(job_id,) for job_id, row in jobs.items() if row is None])
                rows += len(inserts) + len(deletes) + len(delivered) + len(log_rows) + len(jobs)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            # Not reported as done: receipts stay held; the caller keeps the batches and retries.
            self.stats["errors"] += 1
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            if not self.failing_since:  # once per outage, not once per attempt
                self.failing_since = time.monotonic()
                log.error("store commit failed: %s; receipts are held and the write is retried every %g s",
                          exc, self.retry)
                os.eventfd_write(self.done_fd, 1)  # the dispatcher starts timing the outage
            return False
        self.stats["commits"] += 1
        self.stats["rows_written"] += rows
        if self.failing_since:
            log.warning("store writable again after %.1f s (%d failed attempts so far)",
                        time.monotonic() - self.failing_since, self.stats["errors"])
            self.failing_since = 0.0
        with self._done_lock:
            self._finished.append(max(b[0] for b in batches))
        os.eventfd_write(self.done_fd, 1)
        return True
