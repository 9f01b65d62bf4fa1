"""The login check queue: fair across addresses, one check at a time per address, back-off after refusals."""

from __future__ import annotations

from stompbroker.security.logins import LoginQueue


def test_a_flood_from_one_address_does_not_delay_another_address():
    q = LoginQueue(backoff=0.25)
    for i in range(300):
        q.add("10.0.0.66", f"guess {i}")
    q.add("10.0.0.1", "honest")
    assert q.take(0.0) == ("10.0.0.66", "guess 0")
    assert q.take(0.0) == ("10.0.0.1", "honest")  # second in line, not 301st
    assert q.take(0.0) is None  # one check in flight per address


def test_parallel_guesses_are_no_faster_than_sequential_ones():
    q = LoginQueue(backoff=0.25, max_backoff=10.0)
    for i in range(300):
        q.add("10.0.0.66", i)
    now, checks = 0.0, 0
    while now < 60.0:  # a simulated minute with an instant checker
        job = q.take(now)
        if job is None:
            now = q.next_due()
            continue
        checks += 1
        q.done(job[0], False, now)
    # 0.25 + 0.5 + 1 + 2 + 4 + 8 = 15.75 s, then one guess per 10 s: 11 guesses in a minute
    assert checks == 11


def test_an_accepted_login_ends_the_back_off():
    q = LoginQueue(backoff=1.0)
    q.add("a", 1)
    q.add("a", 2)
    q.add("a", 3)
    q.done(*q.take(0.0)[:1], False, 0.0)
    assert q.take(0.5) is None and q.next_due() == 1.0
    address, job = q.take(1.0)
    assert job == 2
    q.done(address, True, 1.0)
    assert q.take(1.0) == ("a", 3) and "a" not in q.failures
