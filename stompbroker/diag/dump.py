"""Statistics dump files: append JSON lines, rotate by size (path, path.1 ... path.N)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("stompbroker.diag")


class DumpWriter:
    def __init__(self, path: str, max_bytes: int, backups: int):
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.errors = 0
        self.lines = 0
        self._file = None
        self._size = 0

    def write(self, line: bytes) -> bool:
        """Append one line; False (logged and counted) when the disk refuses: the broker goes on."""
        try:
            if self._file is None:
                self._open()
            if self._size and self._size + len(line) + 1 > self.max_bytes:
                self._rotate()
            self._file.write(line + b"\n")
            self._file.flush()
            self._size += len(line) + 1
            self.lines += 1
            return True
        except OSError as exc:
            self.errors += 1
            if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
                log.error("cannot write statistics dump %s: %s (%d errors so far)", self.path, exc, self.errors)
            self.close()
            return False

    def _open(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        self._file = open(self.path, "ab")
        self._size = self._file.tell()

    def _rotate(self) -> None:
        self.close()
        if self.backups:
            for i in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{i}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._open()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
