"""stompbroker-store on files that are not stores, damaged tables, healthy stores and interruptions."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from stompbroker.store import sqlite as store
from stompbroker.tools import store as tool


def run_tool(*args, timeout=30):
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stompbroker.tools.store", *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - began


def make_store(path, messages=5):
    store.check(str(path))  # creates the schema
    db = sqlite3.connect(path)
    for i in range(messages):
        db.execute("INSERT INTO messages VALUES (?, ?, ?, ?, ?, 0, 0, 0)",
                   (i + 1, "/queue/a", f"m{i}", b"{}", b"x" * 10))
    db.commit()
    db.close()


@pytest.mark.parametrize("command", ["export", "repair"])
def test_a_file_that_is_not_a_database_fails_fast_and_is_left_alone(tmp_path, command):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database\n" * 100)
    result, took = run_tool(command, str(path))
    assert result.returncode == 1 and took < 10
    assert "is not an SQLite database" in result.stderr and len(result.stderr.splitlines()) == 1
    assert result.stdout == ""
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # not renamed, nothing left beside it


def test_a_damaged_table_is_probed_not_walked_to_the_largest_rowid(tmp_path):
    path = tmp_path / "store.sqlite"
    make_store(path, messages=2000)
    db = sqlite3.connect(path)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    page = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(path, "r+b") as f:  # the table's root page: its first and last rows are unreachable
        f.seek((root - 1) * page)
        f.write(b"\xff" * page)
    result, took = run_tool("export", str(path))
    assert result.returncode == 0 and took < 10, result.stderr
    assert "exported 0 messages" in result.stderr and len(result.stderr.splitlines()) < 10


def test_repair_leaves_a_healthy_store_alone(tmp_path):
    path = tmp_path / "store.sqlite"
    make_store(path)
    before = path.stat().st_ino
    result, _ = run_tool("repair", str(path))
    assert result.returncode == 0 and "nothing to repair" in result.stdout
    assert path.stat().st_ino == before
    assert not [name for name in os.listdir(tmp_path) if ".damaged-" in name or ".repair-" in name]


def test_an_interrupted_repair_leaves_no_partial_store(tmp_path, monkeypatch, capsys):
    path = tmp_path / "store.sqlite"
    make_store(path)

    def damaged(p):
        raise store.StoreError(f"{p} is damaged: test")

    def interrupted(p, *args):
        yield (1, "/queue/a", "m", b"{}", b"x", 0, 0, 0)
        raise KeyboardInterrupt  # Ctrl-C or SIGTERM half-way

    monkeypatch.setattr(store, "check", damaged)
    monkeypatch.setattr(tool, "readable_rows", interrupted)
    try:
        code = tool.main(["repair", str(path)])
    except KeyboardInterrupt:
        code = "KeyboardInterrupt escaped"
    assert sorted(os.listdir(tmp_path)) == ["store.sqlite"]
    assert code == 130
    assert "interrupted" in capsys.readouterr().err


def test_repair_keeps_scheduled_messages(tmp_path):
    path = tmp_path / "store.sqlite"
    make_store(path)
    db = sqlite3.connect(path)
    db.execute("INSERT INTO scheduled VALUES ('j1', '/queue/later', '{}', x'78', '{\"due\": 1}', 0)")
    db.commit()
    db.close()
    fresh = str(tmp_path / "fresh.sqlite")
    assert tool.copy_readable(str(path), fresh) == 5
    copied = sqlite3.connect(fresh).execute("SELECT job_id, destination, body FROM scheduled").fetchall()
    assert copied == [("j1", "/queue/later", b"x")]
