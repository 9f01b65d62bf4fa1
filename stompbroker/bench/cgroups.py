"""CPU quotas for the bench's scale-out runs: a cgroup per node with a fixed share of the CPU.

On one machine more nodes cannot add CPU, so ``stompbroker-bench cluster --scale`` gives each node
(its broker processes and its NATS server) the same quota: N nodes then have N times the CPU of
one, as N machines would. cgroup v2 (``cpu.max``, the ``cpu`` controller enabled for the root's
children) where the unified hierarchy has the cpu controller, else v1 (``cpu.cfs_quota_us``).
Needs root.
"""

from __future__ import annotations

import contextlib
import os

V2_ROOT = "/sys/fs/cgroup"
V1_ROOT = "/sys/fs/cgroup/cpu"
PERIOD_US = 100_000


class CgroupError(RuntimeError):
    pass


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def flavour() -> str | None:
    """"v2", "v1" or None (no CPU controller this process can use)."""
    try:
        if "cpu" in _read(os.path.join(V2_ROOT, "cgroup.controllers")).split():
            return "v2" if os.access(V2_ROOT, os.W_OK) else None
    except OSError:
        pass
    if os.path.exists(os.path.join(V1_ROOT, "cpu.cfs_quota_us")) and os.access(V1_ROOT, os.W_OK):
        return "v1"
    return None


class CpuGroup:
    """A cgroup limited to ``cores`` CPUs (0.25 = a quarter of one core) in each period of
    ``period_us``, made now, removed by close()."""

    def __init__(self, name: str, cores: float, period_us: int = PERIOD_US):
        self.kind = flavour()
        if self.kind is None:
            raise CgroupError("no writable cgroup CPU controller (cgroup v2 with cpu, or v1 cpu): run as root")
        self.cores = cores
        self.period_us = period_us
        quota = max(int(cores * period_us), 1000)
        if self.kind == "v2":
            control = os.path.join(V2_ROOT, "cgroup.subtree_control")
            if "cpu" not in _read(control).split():
                _write(control, "+cpu")
            self.path = os.path.join(V2_ROOT, name)
            os.makedirs(self.path, exist_ok=True)
            _write(os.path.join(self.path, "cpu.max"), f"{quota} {period_us}")
            self.root = V2_ROOT
        else:
            self.path = os.path.join(V1_ROOT, name)
            os.makedirs(self.path, exist_ok=True)
            _write(os.path.join(self.path, "cpu.cfs_period_us"), str(period_us))
            _write(os.path.join(self.path, "cpu.cfs_quota_us"), str(quota))
            self.root = V1_ROOT

    def add(self, pid: int) -> None:
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def add_tree(self, pid: int) -> int:
        """A process and all its descendants (children forked later inherit the group); how many."""
        import psutil

        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            return 0
        moved = 0
        for p in procs:
            with contextlib.suppress(OSError):
                self.add(p.pid)
                moved += 1
        return moved

    def throttled(self) -> dict:
        """How often and how long the quota held the group back (cpu.stat)."""
        try:
            stat = dict(line.split() for line in _read(os.path.join(self.path, "cpu.stat")).splitlines() if line)
        except OSError:
            return {}
        periods = int(stat.get("nr_periods", 0))
        throttled = int(stat.get("nr_throttled", 0))
        seconds = (int(stat["throttled_usec"]) / 1e6 if "throttled_usec" in stat
                   else int(stat.get("throttled_time", 0)) / 1e9)
        return {"periods": periods, "throttled_periods": throttled, "throttled_s": round(seconds, 3)}

    def close(self) -> None:
        """Move what is left to the root group and remove this one."""
        try:
            pids = _read(os.path.join(self.path, "cgroup.procs")).split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.root, "cgroup.procs"), pid)
        with contextlib.suppress(OSError):
            os.rmdir(self.path)
