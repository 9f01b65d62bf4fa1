"""Per-frame cost per broker process, from py-spy samples (``stompbroker-bench --profile``).

While a run's load goes, ``py-spy record --nonblocking --format raw`` samples each of the broker's
reader, dispatcher and writer processes (the ``bench`` extra installs py-spy). Every sample (a
stack) is put in one cost category by the rules below, looking at the innermost frames first;
a process's CPU seconds over the run (psutil) are shared out over the categories in proportion
to its samples, and divided by the frames the run moved (SENDs for ingest, deliveries otherwise):
microseconds of CPU per frame, per process, per category.

py-spy leaves out samples where a thread waits in a system call it knows to be idle (epoll,
select); what is left is close to on-CPU time, which is why shares are scaled by measured CPU and
not by wall time. The source line of the innermost frame decides system calls (``.send(``,
``recv``, the eventfd ``notify``), so the rules hold across versions of the code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

CATEGORIES = ("parse", "ring write", "ring read", "wake-up", "routing", "written counts", "render",
              "batch", "send", "recv", "wait", "store", "other")

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")

# (file suffix, function name pattern, category): the first rule matching the innermost frame
# that any rule matches wins.
RULES = [
    ("stompbroker/ipc/ring.py", r"(Ring\.)?notify$", "wake-up"),
    ("stompbroker/ipc/ring.py", r"(Ring\.)?(read|_get|clear_wakeup|used_bytes|pending_records)$", "ring read"),
    ("stompbroker/ipc/ring.py", r".*", "ring write"),
    ("stompbroker/", r"Outbox\..*", "render"),   # ipc/outbox.py (broker/model.py in older trees)
    ("stompbroker/ipc/records.py", r".*(iter_records|unpack).*", "ring read"),
    ("stompbroker/ipc/records.py", r".*", "ring write"),
    ("stompbroker/protocol/stomp.py", r".*(render|escape)$", "render"),
    ("stompbroker/protocol/stomp.py", r".*", "parse"),
    ("stompbroker/protocol/websocket.py", r".*(encode|Encoder|_is_utf8).*", "render"),
    ("stompbroker/protocol/websocket.py", r".*", "parse"),
    ("stompbroker/broker/confirmations.py", r".*", "written counts"),
    ("stompbroker/broker/core.py", r".*on_written$", "written counts"),
    ("stompbroker/broker/model.py", r".*shared$", "render"),
    ("stompbroker/broker/", r".*", "routing"),
    ("stompbroker/store/", r".*", "store"),
    ("stompbroker/processes/batching.py", r".*", "batch"),
    ("stompbroker/processes/writer.py", r".*append$", "batch"),
    ("stompbroker/processes/writer.py", r".*(flush|hang_up)$", "send"),
    ("stompbroker/processes/writer.py", r".*drain_ring$", "ring read"),
    ("stompbroker/processes/writer.py", r".*report$", "written counts"),
    ("stompbroker/processes/dispatcher.py", r".*progress$", "written counts"),
    ("stompbroker/processes/dispatcher.py", r".*(flush|flush_one|drain|write)$", "ring write"),
    ("stompbroker/processes/dispatcher.py", r".*(handle|frames)$", "ring read"),
    ("stompbroker/processes/reader_framing.py", r".*(read|received)$", "recv"),
    ("stompbroker/processes/reader_conns.py", r".*receive$", "recv"),
    ("stompbroker/processes/reader_framing.py", r".*(stomp|websocket)$", "parse"),
    ("stompbroker/processes/reader_first_bytes.py", r".*first_bytes$", "parse"),
    ("stompbroker/processes/reader_framing.py", r".*frames$", "ring write"),
    ("stompbroker/processes/reader.py", r".*(emit|push)$", "ring write"),
    ("selectors.py", r".*", "wait"),
    ("stompbroker/processes/poller.py", r".*", "wait"),
]
_RULES = [(f, re.compile(p), c) for f, p, c in RULES]

# The innermost frame's source line, for system calls made from Python.
LINE_RULES = [
    (re.compile(r"\.notify\(|eventfd_write|os\.write\("), "wake-up"),
    (re.compile(r"\.(send|sendall|sendmsg|send_fds)\("), "send"),
    (re.compile(r"\.(recv|recv_into|recvmsg|recv_fds)\("), "recv"),
    (re.compile(r"select\.select\(|\.poll\(|epoll"), "wait"),
]


def parse_frame(text: str) -> tuple[str, str, int]:
    m = _FRAME.match(text.strip())
    if not m:
        return text.strip(), "", 0
    return m.group("func"), m.group("file"), int(m.group("line"))


def read_raw(path: str) -> list[tuple[list[tuple[str, str, int]], int]]:
    """py-spy's raw (collapsed) output: one stack per line, outermost first, then the count."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            out.append(([parse_frame(x) for x in stack.split(";")], int(count)))
    return out


class SourceLines:
    """Source lines by (file as py-spy names it, line), looked up under the broker's tree."""

    def __init__(self, root: str):
        self.root = root
        self.cache: dict[str, list[str]] = {}

    def line(self, file: str, lineno: int) -> str:
        if file not in self.cache:
            self.cache[file] = []
            for base in (self.root, ""):
                path = os.path.join(base, file) if base else file
                if os.path.isfile(path):
                    with open(path, errors="replace") as f:
                        self.cache[file] = f.read().splitlines()
                    break
        lines = self.cache[file]
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


def classify(stack: list[tuple[str, str, int]], lines: SourceLines | None = None) -> str:
    """The cost category of one sample (stack outermost first)."""
    if not stack:
        return "other"
    func, file, lineno = stack[-1]
    if lines is not None and "stompbroker/" in file:
        text = lines.line(file, lineno)
        for regex, category in LINE_RULES:
            if regex.search(text):
                if category == "recv" and file.endswith("processes/dispatcher.py"):
                    return "written counts"   # the writers' count channel
                if category == "send" and file.endswith("processes/writer.py") and "report" in func:
                    return "written counts"
                return category
    for func, file, _ in reversed(stack):
        for suffix, regex, category in _RULES:
            if (suffix in file if suffix.endswith("/") else file.endswith(suffix)) and regex.match(func):
                return category
    return "other"


def shares(samples, lines: SourceLines | None = None) -> tuple[dict, int]:
    """({category: fraction of samples}, sample count)."""
    counts = dict.fromkeys(CATEGORIES, 0)
    total = 0
    for stack, n in samples:
        counts[classify(stack, lines)] += n
        total += n
    return {k: v / total for k, v in counts.items()} if total else {}, total


def top_functions(samples, n: int = 12) -> dict:
    """The functions with the most samples: inclusive (on the stack) and self (innermost), as
    fractions of the process's samples."""
    total = sum(c for _, c in samples) or 1
    incl: dict[str, int] = {}
    self_: dict[str, int] = {}
    for stack, c in samples:
        seen = set()
        for func, file, _ in stack:
            key = f"{func} ({file.rsplit('stompbroker/', 1)[-1]})"
            if key not in seen:
                seen.add(key)
                incl[key] = incl.get(key, 0) + c
        if stack:
            func, file, line = stack[-1]
            key = f"{func} ({file.rsplit('stompbroker/', 1)[-1]}:{line})"
            self_[key] = self_.get(key, 0) + c
    best = lambda d: {k: round(v / total, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]}  # noqa: E731
    return {"inclusive": best(incl), "self": best(self_)}


def role_group(role: str) -> str:
    return "writers" if role.startswith("writer") else role


def per_frame(cpu_by_process: dict, profiles: dict, frames: int, counts: dict | None = None,
              wake_us: float | None = None) -> dict:
    """{process: {category: µs of CPU per frame}, plus 'total'}: cpu_by_process as in results
    (role -> CPU seconds), profiles role -> (shares, samples); writers are summed.

    py-spy counts a thread that is runnable but not running as busy where it stands. Here that is
    right after a wake-up: a process that writes a ring's eventfd is often preempted by the process
    it woke (samples in ``notify``), and one woken from select/epoll waits for a CPU (samples in
    ``wait``). With ``counts`` (role -> {"wake-up": eventfd writes, "wait": sleeps}) and the CPU cost
    of one (``wake_us``), those two costs are capped at count x cost, and the rest of the process's
    CPU is shared by the other samples."""
    out: dict = {}
    for role, (share, nsamples) in profiles.items():
        cpu = cpu_by_process.get(role)
        if cpu is None or not share or not frames:
            continue
        group = out.setdefault(role_group(role), dict.fromkeys(CATEGORIES, 0.0))
        capped = {}
        if counts is not None and wake_us is not None and role in counts:
            for cat, n in counts[role].items():
                capped[cat] = min(cpu * share.get(cat, 0.0), n * wake_us / 1e6)
        free_share = 1 - sum(share.get(cat, 0.0) for cat in capped)
        rest = (cpu - sum(capped.values())) / free_share if free_share > 0 else 0.0
        for k, v in share.items():
            group[k] += (capped[k] if k in capped else rest * v) / frames * 1e6
    for group in out.values():
        group["total"] = sum(group[k] for k in CATEGORIES)
    return {g: {k: round(v, 3) for k, v in d.items()} for g, d in out.items()}


# -- recording ---------------------------------------------------------------------------------------
def py_spy() -> str:
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(exe):
        raise SystemExit("--profile needs py-spy: pip install py-spy (the 'bench' extra)")
    return exe


class Recorder:
    """py-spy on each reader, dispatcher and writer process of a broker, for `seconds`."""

    PROFILED = ("reader", "dispatcher", "writer")

    def __init__(self, broker, out_dir: str, label: str, seconds: float, rate: int = 250):
        os.makedirs(out_dir, exist_ok=True)
        self.files: dict[str, str] = {}
        self.procs = []
        from .procs import _role
        for p in broker.processes():
            role = _role(p)
            if not role.startswith(self.PROFILED):
                continue
            path = os.path.join(out_dir, f"{label}-{role}.txt")
            self.files[role] = path
            self.procs.append(subprocess.Popen(
                [py_spy(), "record", "--pid", str(p.pid), "--duration", str(max(int(seconds), 1)),
                 "--rate", str(rate), "--nonblocking", "--format", "raw", "-o", path],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def wait(self, timeout: float = 30.0) -> dict:
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        return {role: path for role, path in self.files.items() if os.path.exists(path)}


_WAKE_US: list = []


def wake_cost_us(writes: int = 2000, gap_s: float = 0.0002) -> float:
    """CPU microseconds of one eventfd write that wakes a sleeping process, measured here: a child
    sleeps in select on an eventfd and this process writes it every `gap_s`, sleeping in between;
    the same loop without the writes is subtracted. Measured once per command (about 1 s)."""
    if _WAKE_US:
        return _WAKE_US[0]
    import resource
    import select
    import signal
    import time
    fd = os.eventfd(0, os.EFD_NONBLOCK)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the sleeper
        try:
            while True:
                select.select([fd], [], [])
                try:
                    os.eventfd_read(fd)
                except BlockingIOError:
                    pass
        finally:
            os._exit(0)

    def loop(write: bool) -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        c0 = usage.ru_utime + usage.ru_stime
        for _ in range(writes):
            if write:
                os.eventfd_write(fd, 1)
            time.sleep(gap_s)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime - c0

    try:
        cost = (loop(True) - loop(False)) / writes * 1e6
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    _WAKE_US.append(round(max(cost, 0.5), 2))
    return _WAKE_US[0]


def analyse(files: dict, result: dict, root: str, wake_us: float | None = None) -> dict:
    """The profile section of a result: per-frame costs per process and category, sample counts,
    top functions, raw file paths."""
    lines = SourceLines(root)
    frames = (result["counts"].get("sent") if result["scenario"] == "ingest"
              else result["counts"].get("delivered")) or 0
    profiles, tops = {}, {}
    for role, path in files.items():
        samples = read_raw(path)
        profiles[role] = shares(samples, lines)
        tops[role] = top_functions(samples)
    cpu = result["broker"].get("cpu_by_process") or {}
    calls = result["broker"].get("syscalls_by_process") or {}
    counts = {role: {"wake-up": c["writes"], "wait": c["voluntary"]} for role, c in calls.items()} if calls else None
    prev = result.get("profile") or {}
    wake_us = wake_us if wake_us is not None else prev.get("wake_us")
    per = lambda n: {role: round(c[n] / frames, 4) for role, c in calls.items()} if frames else {}  # noqa: E731
    return {
        "frames": frames, "frame": "SEND" if result["scenario"] == "ingest" else "delivery",
        "us_per_frame": per_frame(cpu, profiles, frames, counts, wake_us),
        "wake_us": wake_us,
        "wake_samples": {role: round(p[0].get("wake-up", 0.0), 4) for role, p in profiles.items()},
        "per_frame_counts": {"eventfd_writes": per("writes"), "voluntary_switches": per("voluntary"),
                             "involuntary_switches": per("involuntary")} if calls else {},
        "samples": {role: n for role, (_, n) in profiles.items()},
        "top": tops, "files": files, "root": root,
    }


def reanalyse(results: list[dict], wake_us: float | None = None) -> None:
    """Recompute the profile sections from their raw files (when still there) with these rules
    (and a new cost of one wake-up, if given)."""
    for res in results:
        prof = res.get("profile")
        if prof and all(os.path.exists(p) for p in prof["files"].values()):
            res["profile"] = analyse(prof["files"], res, prof.get("root", ""), wake_us)


def format_profile(res: dict) -> str:
    """A Markdown table: rows are categories, columns processes, cells µs of CPU per frame."""
    prof = res.get("profile")
    if not prof or not prof["us_per_frame"]:
        return ""
    groups = [g for g in ("reader", "dispatcher", "writers") if g in prof["us_per_frame"]]
    plural = "SENDs" if prof["frame"] == "SEND" else "deliveries"
    lines = [f"{res['name']}: µs of broker CPU per {prof['frame']} ({prof['frames']:,} {plural}; "
             f"flow: {res['parameters'].get('flow_control')})", "",
             "| cost | " + " | ".join(groups) + " | all |", "|---|" + "---:|" * (len(groups) + 1)]
    for cat in CATEGORIES + ("total",):
        vals = [prof["us_per_frame"][g].get(cat, 0.0) for g in groups]
        if cat != "total" and not any(v >= 0.005 for v in vals):
            continue
        name = f"**{cat}**" if cat == "total" else cat
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {sum(vals):.2f} |")
    counts = prof.get("per_frame_counts") or {}
    if counts:
        lines.append("")
        lines.append("per frame: eventfd writes " + ", ".join(f"{r} {v:.3f}" for r, v in counts["eventfd_writes"].items())
                     + "; preemptions " + ", ".join(f"{r} {v:.3f}" for r, v in counts["involuntary_switches"].items())
                     + f" (one waking eventfd write costs {prof.get('wake_us')} µs of CPU here)")
    return "\n".join(lines)


def compare_profiles(columns: list[tuple[str, list[dict]]]) -> str:
    """Per run name, a Markdown table of µs per frame by process and cost, one column per target
    (the median over its repetitions), for every run that was profiled."""
    import statistics
    names = []
    for _, results in columns:
        for r in results:
            if r.get("profile") and r["name"] not in names:
                names.append(r["name"])
    out = []
    for name in names:
        per = [[r["profile"] for r in results if r.get("name") == name and r.get("profile")]
               for _, results in columns]
        frame = next(p[0]["frame"] for p in per if p)
        head = ["process", "cost"] + [c[0] for c in columns]
        lines = [f"{name}: µs of broker CPU per {frame}, median of the profiled runs", "",
                 "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(columns)]
        for group in ("reader", "dispatcher", "writers"):
            for cat in CATEGORIES + ("total",):
                vals = []
                for profs in per:
                    xs = [p["us_per_frame"].get(group, {}).get(cat) for p in profs]
                    xs = [x for x in xs if x is not None]
                    vals.append(statistics.median(xs) if xs else None)
                if cat != "total" and not any(v is not None and v >= 0.005 for v in vals):
                    continue
                cells = ["-" if v is None else f"{v:.2f}" for v in vals]
                label = f"**{cat}**" if cat == "total" else cat
                lines.append(f"| {group} | {label} | " + " | ".join(cells) + " |")
            vals = []
            for profs in per:
                xs = [max((v for role, v in p.get("wake_samples", {}).items() if role_group(role) == group),
                          default=0.0) for p in profs if "wake_samples" in p]
                vals.append(statistics.median(xs) if xs else None)
            if any(v for v in vals if v):
                cells = ["-" if v is None else f"{v:.1%}" for v in vals]
                lines.append(f"| {group} | *samples in the eventfd wake-up (preempted by the woken process)* | "
                             + " | ".join(cells) + " |")
            for key, label in (("eventfd_writes", "eventfd writes per frame"),
                               ("voluntary_switches", "sleeps per frame (voluntary switches)"),
                               ("involuntary_switches", "preemptions per frame")):
                vals = []
                for profs in per:
                    xs = [sum(v for role, v in p.get("per_frame_counts", {}).get(key, {}).items()
                              if role_group(role) == group) for p in profs if p.get("per_frame_counts")]
                    vals.append(statistics.median(xs) if xs else None)
                if any(v is not None for v in vals):
                    cells = ["-" if v is None else f"{v:.3f}" for v in vals]
                    lines.append(f"| {group} | *{label}* | " + " | ".join(cells) + " |")
        totals = []
        for profs in per:
            xs = [sum(g.get("total", 0) for g in p["us_per_frame"].values()) for p in profs]
            totals.append(f"{statistics.median(xs):.2f}" if xs else "-")
        lines.append("| all | **total** | " + " | ".join(totals) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)
