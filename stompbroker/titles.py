"""Process titles: each broker process names itself ``stompbroker: ROLE [details]`` (``reader``,
``dispatcher``, ``writer-0``, ``supervisor port=61613``); diagnostics, the benchmark and the tests
find a process's role from its title here."""

from __future__ import annotations

PREFIX = "stompbroker: "


def title(role: str, *details: str) -> str:
    """The title a process of ``role`` sets on itself."""
    return PREFIX + " ".join((role, *details))


def role_of(cmdline) -> str | None:
    """The role in a title or command line (a string or psutil's list), or None if it is not a
    broker process (or one just forked that has not named itself: it still reads ``supervisor``)."""
    text = cmdline if isinstance(cmdline, str) else " ".join(cmdline)
    text = text.strip()
    if not text.startswith(PREFIX):
        return None
    words = text[len(PREFIX):].split()
    return words[0] if words else None


def process_role(proc) -> str | None:
    """The role of a ``psutil.Process``, or None (not ours, or gone: its command line is read once)."""
    try:
        return role_of(proc.cmdline())
    except Exception:  # psutil.Error, or a process that vanished mid-read
        return None
