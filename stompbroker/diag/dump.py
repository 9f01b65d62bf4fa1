"""Files of JSON lines rotated by size (path, path.1 ... path.N): the statistics dump here, and the
management audit log (``console/audit.py``)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("stompbroker.diag")


class RotatingFile:
    """Appends lines to ``path`` unbuffered (a crash loses no line written), rotated when the next
    would pass ``max_bytes``: ``path.1`` is the newest old file, ``path.N`` the oldest of ``backups``
    kept (0: the file starts over). A write the disk refuses raises OSError and closes the file;
    the next write opens it again. ``make_dirs``: create the file's directory if missing."""

    def __init__(self, path: str, max_bytes: int, backups: int, make_dirs: bool = True):
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.make_dirs = make_dirs
        self._file = None
        self._size = 0

    def append(self, line: bytes) -> None:
        try:
            if self._file is None:
                self._open()
            if self._size and self._size + len(line) + 1 > self.max_bytes:
                self._rotate()
            self._file.write(line + b"\n")
            self._size += len(line) + 1
        except OSError:
            self.close()
            raise

    def _open(self) -> None:
        if self.make_dirs:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "ab", buffering=0)
        self._size = self._file.tell()

    def _rotate(self) -> None:
        self.close()
        if self.backups > 0:
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


class DumpWriter:
    def __init__(self, path: str, max_bytes: int, backups: int):
        self.path = path
        self.file = RotatingFile(path, max_bytes, backups)
        self.errors = 0
        self.lines = 0

    def write(self, line: bytes) -> bool:
        """Append one line; False (logged and counted) when the disk refuses: the broker goes on."""
        try:
            self.file.append(line)
        except OSError as exc:
            self.errors += 1
            if self.errors in (1, 10, 100) or self.errors % 1000 == 0:
                log.error("cannot write statistics dump %s: %s (%d errors so far)", self.path, exc, self.errors)
            return False
        self.lines += 1
        return True

    def close(self) -> None:
        self.file.close()
