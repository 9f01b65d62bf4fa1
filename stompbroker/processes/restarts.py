"""When the supervisor restarts a process that died: at once, or after a back-off (pure: no clock).

The supervisor never gives up on a child. Giving up (as it once did after 10 restarts in 10 s)
turned any input that can kill a process, sent again and again, into a broker stopped for good:
different frames that each kill the dispatcher (each is quarantined after two deaths, but there can
be many), or output that kills a writer, whose clients reconnect and ask again. Instead each role
(the dispatcher, which restarts every process; the reader; each writer; the cluster bridge) keeps
its own streak of deaths: a death within ``window`` seconds of that role's last restart extends
it, a restart that lived longer ends it. The first ``budget`` deaths of a streak are restarted at
once; each further one waits ``FIRST`` seconds, doubling up to ``max_delay``. So a crash loop costs
a bounded rate of restarts and log lines, the other processes keep serving meanwhile, and the
broker is back at full service as soon as the cause stops.
"""

from __future__ import annotations

FIRST = 0.1     # seconds: the first delayed restart's wait
WINDOW = 10.0   # seconds a restarted process must live for its next death to start a new streak


class Restarts:
    def __init__(self, budget: int, max_delay: float, window: float = WINDOW):
        self.budget = budget
        self.max_delay = max_delay
        self.window = window
        self.streaks: dict[str, tuple[int, float]] = {}  # role -> (deaths in a row, when it was restarted)

    def died(self, role: str, now: float) -> float:
        """Note a death of ``role`` at ``now``; returns the seconds to wait before restarting it."""
        streak, restarted = self.streaks.get(role, (0, float("-inf")))
        streak = streak + 1 if now - restarted < self.window else 1
        over = streak - self.budget
        delay = 0.0 if over <= 0 else min(FIRST * 2 ** min(over - 1, 30), self.max_delay)
        self.streaks[role] = (streak, now + delay)
        return delay

    def streak(self, role: str) -> int:
        return self.streaks.get(role, (0, 0.0))[0]
