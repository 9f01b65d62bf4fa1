"""The ready_file record: written whole, read back, waited for by launchers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stompbroker.readiness import NotReady, read_ready, wait_ready, write_ready


def test_written_record_reads_back_and_no_temporary_file_is_left(tmp_path):
    path = str(tmp_path / "ready")
    assert read_ready(path) is None
    write_ready(path, {"host": "0.0.0.0", "port": 61613, "pid": 7})
    assert read_ready(path) == {"host": "0.0.0.0", "port": 61613, "pid": 7}
    assert [p.name for p in tmp_path.iterdir()] == ["ready"]


def test_wait_returns_the_record_a_process_writes(tmp_path):
    path = tmp_path / "ready"
    code = f"import time; from stompbroker.readiness import write_ready; time.sleep(0.2); write_ready({str(path)!r}, {{'port': 5}}); time.sleep(5)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert wait_ready(str(path), proc, timeout=20)["port"] == 5
    finally:
        proc.kill()
        proc.wait()


def test_wait_says_when_the_process_exits_first_or_time_runs_out(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(NotReady, match="exited with 3"):
        wait_ready(str(tmp_path / "ready"), proc, timeout=20)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        with pytest.raises(NotReady, match="not ready within 0.2 s"):
            wait_ready(str(tmp_path / "ready"), proc, timeout=0.2)
    finally:
        proc.kill()
        proc.wait()
