"""The supervisor's restart policy (processes/restarts.py): never give up, back off a crash loop."""

from __future__ import annotations

from stompbroker.processes.restarts import Restarts


def test_a_streak_past_the_budget_backs_off_doubling_to_its_most_and_never_gives_up():
    r = Restarts(budget=3, max_delay=1.0, window=10.0)
    now, delays = 0.0, []
    for _ in range(200):  # a process that dies at once after every restart
        delay = r.died("writer-0", now)
        delays.append(delay)
        now += delay + 0.01
    assert delays[:3] == [0.0] * 3 and delays[3:7] == [0.1, 0.2, 0.4, 0.8] and set(delays[7:]) == {1.0}
    assert r.streak("writer-0") == 200


def test_a_restart_that_lived_past_the_window_ends_the_streak_and_roles_count_apart():
    r = Restarts(budget=2, max_delay=5.0, window=10.0)
    assert [r.died("reader", t) for t in (0.0, 1.0, 2.0)] == [0.0, 0.0, 0.1]
    assert r.died("dispatcher", 2.5) == 0.0  # another role: its own streak
    assert r.died("reader", 2.1 + 10.0) == 0.0 and r.streak("reader") == 1
