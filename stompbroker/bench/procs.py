"""The broker under test as processes (CPU and memory of its process tree, or one this generator
spawns) and the machine around it (how busy it was with other work during a run)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..titles import process_role
from ..readiness import NotReady, wait_ready
from .wire import BenchError

# The checkout (or site-packages) holding this stompbroker: the spawned broker runs the same code.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the broker's processes --------------------------------------------------------------------
def _role(proc) -> str:
    role = process_role(proc)
    if role is not None:
        return role
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:
        cmd = ""
    if "resource_tracker" in cmd:
        return "resource_tracker"
    try:
        return proc.name()
    except Exception:
        return "?"


class BrokerProcs:
    """CPU and memory of a process tree (the broker we spawned, or --pid)."""

    def __init__(self, pid: int | None, label: str):
        self.pid = pid
        self.label = label
        self._seen = {}   # pid -> Process (kept so cpu_times work for the same objects)

    def processes(self) -> list:
        if not self.pid:
            return []
        import psutil
        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in procs:
            out.append(self._seen.setdefault(p.pid, p))
        return out

    def cpu(self) -> dict:
        """{role: cpu seconds}, roles numbered if repeated; '<role>:sys' for the kernel part; '_total'."""
        import psutil
        out: dict = {}
        for p in self.processes():
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            role = _role(p)
            key = role if role not in out else f"{role}#{p.pid}"
            out[key] = t.user + t.system
            out[key + ":sys"] = t.system
        out["_total"] = sum(v for k, v in out.items() if not k.endswith(":sys"))
        return out

    def counters(self) -> dict:
        """{role: {"writes", "reads", "voluntary", "involuntary"}}: read/write system calls
        (/proc/PID/io; a ring's eventfd wake-up is a write, socket sends are not counted) and
        context switches, roles named as in cpu()."""
        import psutil
        out: dict = {}
        for p in self.processes():
            try:
                io = p.io_counters()
                cs = p.num_ctx_switches()
            except (psutil.Error, AttributeError, NotImplementedError):
                continue
            role = _role(p)
            key = role if role not in out else f"{role}#{p.pid}"
            out[key] = {"writes": io.write_count, "reads": io.read_count,
                        "voluntary": cs.voluntary, "involuntary": cs.involuntary}
        return out

    def pss(self) -> tuple[int | None, dict]:
        total, by, _ = self.memory()
        return total, by

    def memory(self) -> tuple[int | None, dict, int | None]:
        """(PSS summed over the process tree, PSS by role, USS summed)."""
        import psutil
        total, by, uss = 0, {}, 0
        procs = self.processes()
        if not procs:
            return None, {}, None
        for p in procs:
            try:
                info = p.memory_full_info()
            except (psutil.Error, AttributeError):
                continue
            role = _role(p)
            by[role if role not in by else f"{role}#{p.pid}"] = info.pss
            total += info.pss
            uss += info.uss
        return total, by, uss

    def shm_pss(self) -> int | None:
        """PSS of the tree's shared-memory mappings (/dev/shm: the broker's rings and statistics),
        summed: pages of the rings first touched show here, once, whichever processes touched them."""
        procs = self.processes()
        if not procs:
            return None
        total = 0
        for p in procs:
            try:
                with open(f"/proc/{p.pid}/smaps") as f:
                    total += shm_pss_of(f.read())
            except OSError:
                continue
        return total

    @staticmethod
    def delta(before: dict, after: dict) -> dict:
        return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}


def shm_pss_of(smaps: str) -> int:
    """Bytes of PSS of the /dev/shm mappings in a /proc/PID/smaps text."""
    total, inside = 0, False
    for line in smaps.splitlines():
        first = line.split(None, 1)[0] if line else ""
        if "-" in first and not first.endswith(":"):  # a mapping's header line: "start-end perms ... path"
            parts = line.split(None, 5)
            inside = len(parts) == 6 and parts[5].startswith("/dev/shm/")
        elif inside and first == "Pss:":
            total += int(line.split()[1]) * 1024
    return total


class SpawnedBroker(BrokerProcs):
    """``python -m stompbroker port=0 ARGS`` in a scratch directory (removed at stop), so files the broker
    writes with relative paths (a sqlite store, diagnostics dumps) never land in the source tree."""

    def __init__(self, args: list[str], extra_env: dict | None = None, root: str = ROOT):
        self.workdir = tempfile.mkdtemp(prefix="bench-broker-")
        self.log_path = os.path.join(self.workdir, "broker.log")
        self._log = open(self.log_path, "wb")
        extra_env = dict(extra_env or {})
        path = [p for p in (extra_env.pop("PYTHONPATH", ""), root, os.environ.get("PYTHONPATH", "")) if p]
        env = {**os.environ, **extra_env, "PYTHONPATH": os.pathsep.join(path)}
        ready_path = os.path.join(self.workdir, "ready.json")
        # Older trees (a git ref being compared) have no ready_file: give them a free port and
        # wait until it accepts.
        has_ready = os.path.exists(os.path.join(root, "stompbroker", "readiness.py"))
        where = ["port=0", f"ready_file={ready_path}"] if has_ready else [f"port={free_port()}"]
        self.proc = subprocess.Popen([sys.executable, "-m", "stompbroker", *where, *args],
                                     cwd=self.workdir, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        super().__init__(self.proc.pid, "stompbroker " + " ".join(args))
        try:
            if has_ready:
                self.port = wait_ready(ready_path, self.proc, timeout=30)["port"]
            else:
                self.port = int(where[0].split("=")[1])
                wait_accepting(self.port, self.proc, timeout=30)
        except NotReady as exc:
            log = self.log()[-2000:]
            self.stop()  # removes the work directory, the log with it
            raise BenchError(f"{exc}:\n{log}") from None

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_accepting(port: int, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise NotReady(f"the broker exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            time.sleep(1.0)  # the listener is up; let the other processes finish starting
            return
        time.sleep(0.1)
    raise NotReady(f"nothing accepted on port {port} within {timeout} s")


def broker_has_setting(name: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "stompbroker", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    return f"--{name}" in out.stdout


def system_busy() -> float:
    """CPU seconds the whole machine has been busy (every process, every core)."""
    import psutil
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def machine_load(flow, broker_cpu) -> dict:
    """How busy the shared machine was during a run, and how much of that was neither the broker nor
    the generator (other people's work: the figures are noisy when this is high)."""
    window = max(flow.t_stop - flow.t0, 1e-9)
    busy = flow.sys_after - flow.sys_before
    others = busy - (broker_cpu or 0.0) - flow.generator_cpu
    return {"cores": os.cpu_count(), "busy_cores": round(busy / window, 2),
            "other_processes_cores": round(max(others, 0.0) / window, 2), "load_avg": os.getloadavg()}


def machine_info() -> dict:
    import platform
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        info["load_avg"] = os.getloadavg()
    except OSError:
        pass
    return info
