"""A store written before durable subscriptions were keyed by login still loads and serves them."""

from __future__ import annotations

import sqlite3
import time

from stompwire import Wire

# The tables as the previous version wrote them; durable subscriptions were keyed by their bare name.
OLD_SCHEMA = """
CREATE TABLE messages (seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, message_id TEXT NOT NULL,
    headers BLOB NOT NULL, body BLOB NOT NULL, expires REAL NOT NULL DEFAULT 0,
    delivered INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
CREATE TABLE durable_subscriptions (name TEXT PRIMARY KEY, pattern TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE replay_log (seq INTEGER PRIMARY KEY, destination TEXT NOT NULL, ts REAL NOT NULL,
    message_id TEXT NOT NULL, headers BLOB NOT NULL, body BLOB NOT NULL);
CREATE INDEX replay_log_ts ON replay_log (ts);
"""


def test_durable_subscriptions_of_an_older_store_are_found_by_their_name(start_broker, tmp_path):
    path = str(tmp_path / "old.sqlite")
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    now = time.time() * 1000
    db.execute("INSERT INTO durable_subscriptions VALUES (?, ?, ?)", ("sub-0", "/topic/old", now))
    db.execute("INSERT INTO durable_subscriptions VALUES (?, ?, ?)", ("app1/s1", "/topic/amq", now))
    for seq, (queue, body) in enumerate([("durable:sub-0", b"waiting since before"),
                                         ("durable:app1/s1", b"activemq style")], 1):
        db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, 0, 0, ?)",
                   (seq, queue, f"old-{seq}", b'{"destination":"/topic/x"}', body, now))
    db.commit()
    db.close()
    b = start_broker("store=sqlite", f"store_path={path}")
    rabbit = Wire(b.connect())
    rabbit.connect()
    rabbit.frame("SUBSCRIBE", {"id": "sub-0", "destination": "/topic/old", "durable": "true"})
    assert rabbit.read()[2] == b"waiting since before"
    amq = Wire(b.connect())
    amq.connect(**{"client-id": "app1"})
    amq.frame("SUBSCRIBE", {"id": "1", "destination": "/topic/amq", "activemq.subscriptionName": "s1"})
    assert amq.read()[2] == b"activemq style"
