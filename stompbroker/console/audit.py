"""The management audit log: one JSON line per management action asked over HTTP (who, from where,
what, the result), in ``audit_log`` rotated at ``audit_log_max_bytes`` (``audit_log.1`` is the
newest old file, ``audit_log.N`` the oldest kept), or in the broker's log when no file is set.

Written on the dispatcher's thread: a line is a few hundred bytes and goes straight to the file
(no buffering, so a crash loses no line; no fsync). A failing write is counted and logged once
until writes work again; the action itself is not undone.
"""

from __future__ import annotations

import logging
import time

import orjson

from ..diag.dump import RotatingFile

log = logging.getLogger("stompbroker.audit")

MAX_VALUE = 200  # characters of a client-chosen value (a destination, a selector, a reason) kept per field


def clip(value):
    """Client-chosen text, cut so that one line stays small."""
    if isinstance(value, str) and len(value) > MAX_VALUE:
        return value[:MAX_VALUE] + "..."
    return value


class AuditLog:
    def __init__(self, path: str, max_bytes: int, files: int):
        self.path = path
        self.file = RotatingFile(path, max_bytes, files, make_dirs=False)
        self.errors = 0          # lines that could not be written
        self._failing = False

    def write(self, entry: dict) -> None:
        line = orjson.dumps({"ts": round(time.time() * 1000, 1), **{k: clip(v) for k, v in entry.items()}})
        if not self.path:
            log.info("audit %s", line.decode())
            return
        try:
            self.file.append(line)
        except OSError as exc:
            self.errors += 1
            if not self._failing:
                self._failing = True
                log.error("cannot write the audit log %s: %s (actions go on; lines are lost until it works)",
                          self.path, exc)
            return
        if self._failing:
            self._failing = False
            log.warning("the audit log %s is written again", self.path)

    def close(self) -> None:
        self.file.close()
