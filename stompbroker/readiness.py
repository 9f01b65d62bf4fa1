"""The readiness signal: once the broker serves, the supervisor writes one JSON line to
``ready_file`` (host, port, ssl_port, pid, version, ts); launchers wait for that file instead of
reading the log. Written to a temporary name and renamed, so a reader never sees half a line."""

from __future__ import annotations

import json
import os
import time


class NotReady(Exception):
    """The broker exited, or did not serve in time; the message says which."""


def write_ready(path: str, record: dict) -> None:
    """Write ``record`` as one JSON line at ``path`` atomically (raises OSError)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(record) + "\n")
    os.replace(tmp, path)


def read_ready(path: str) -> dict | None:
    """The record at ``path``, or None while there is none."""
    try:
        with open(path) as f:
            return json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return None


def wait_ready(path: str, proc, timeout: float = 20.0, poll: float = 0.02) -> dict:
    """Wait for the record ``proc`` (a ``subprocess.Popen``) writes at ``path``; raise NotReady
    if it exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        record = read_ready(path)
        if record is not None:
            return record
        if proc.poll() is not None:
            raise NotReady(f"broker exited with {proc.returncode}")
        if time.monotonic() >= deadline:
            raise NotReady(f"broker not ready within {timeout:g} s")
        time.sleep(poll)

