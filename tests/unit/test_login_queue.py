"""The login check queue: fair across addresses and logins, one check at a time per address, back-off
per (address, login) and per address after refusals, cancellable jobs."""

from __future__ import annotations

import pytest

from stompbroker.security import logins

WINDOW = 600.0


def LoginQueue(backoff: float, max_backoff: float = 10.0, window: float = WINDOW, max_records: int = 100_000):
    """The queue with the default settings' figures unless a test says otherwise."""
    return logins.LoginQueue(backoff, max_backoff, window, max_records)


def run(q: LoginQueue, until: float, verdict) -> list[tuple[float, str, str]]:
    """Check everything due with an instant checker until ``until``: [(time, address, login)]."""
    now, checked = 0.0, []
    while now < until:
        taken = q.take(now)
        if taken is None:
            due = q.next_due()
            if due is None:
                break
            now = due
            continue
        address, login, _, job = taken
        checked.append((now, address, login))
        q.done(address, login, verdict(login, job), now)
    return checked


def test_a_flood_from_one_address_does_not_delay_another_address():
    q = LoginQueue(backoff=0.25)
    for i in range(300):
        q.add("10.0.0.66", "root", i, f"guess {i}")
    q.add("10.0.0.1", "root", 300, "honest")
    assert q.take(0.0)[3] == "guess 0"
    assert q.take(0.0)[3] == "honest"  # second in line, not 301st
    assert q.take(0.0) is None  # one check in flight per address


def test_parallel_guesses_are_no_faster_than_sequential_ones():
    q = LoginQueue(backoff=0.25, max_backoff=10.0)
    for i in range(300):
        q.add("10.0.0.66", "root", i, i)
    checks = run(q, 60.0, lambda login, job: False)
    # 0.25 + 0.5 + 1 + 2 + 4 + 8 = 15.75 s, then one guess per 10 s: 11 guesses in a minute
    assert len(checks) == 11


def test_a_success_at_another_login_does_not_reset_the_back_off():
    # Guess root's passcode, log in as alice, guess again... from one address.
    q = LoginQueue(backoff=0.25, max_backoff=10.0)
    for i in range(100):
        q.add("a", "root", ("root", i), None)
        q.add("a", "alice", ("alice", i), None)
    checks = run(q, 60.0, lambda login, job: login == "alice")
    guesses = [when for when, _, login in checks if login == "root"]
    assert len(guesses) == 11  # as fast as guessing alone: 3.7 guesses/s before, 0.18/s here
    assert guesses[1:4] == [0.25, 0.75, 1.75]


def test_a_success_ends_only_its_own_back_off():
    q = LoginQueue(backoff=1.0)
    q.add("a", "bob", 1, None)
    q.add("a", "bob", 2, None)
    q.add("a", "bob", 3, None)
    q.take(0.0)
    assert q.done("a", "bob", False, 0.0) == 1.0
    assert q.take(0.5) is None and q.next_due() == 1.0
    address, login, job_id, _ = q.take(1.0)
    assert job_id == 2
    assert q.done(address, login, True, 1.0) == 0.0
    assert q.take(1.0)[2] == 3 and ("a", "bob") not in q.pairs


def test_guesses_at_one_login_do_not_hold_up_another_login_from_that_address():
    q = LoginQueue(backoff=5.0)
    for i in range(50):
        q.add("nat", "root", i, None)
    q.done(*q.take(0.0)[:2], False, 0.0)   # root backs off 5 s at this address
    q.add("nat", "alice", 99, None)
    assert q.take(0.1)[1:3] == ("alice", 99)  # not behind root's 49 waiting guesses
    q.done("nat", "alice", True, 0.1)
    assert q.take(0.2) is None
    assert q.take(5.0)[1] == "root"


def test_spraying_many_logins_from_one_address_backs_the_address_off():
    q = LoginQueue(backoff=0.25, max_backoff=10.0)
    for i in range(1000):
        q.add("sprayer", f"user{i}", i, None)
    q.add("sprayer", "alice", "honest", None)
    checks = run(q, 60.0, lambda login, job: False)
    # one failing login costs nothing shared; each further one doubles the address's rest
    assert [when for when, _, _ in checks[:5]] == [0.0, 0.0, 0.25, 0.75, 1.75]
    assert len(checks) == 12  # not 1000 (a refusal per login, each backing off alone)


def test_failing_logins_count_for_the_address_only_for_a_while():
    q = LoginQueue(backoff=1.0, max_backoff=10.0)
    for n, login in enumerate(("a", "b", "c")):
        q.add("x", login, n, None)
        q.done(*q.take(100.0 * n)[:2], False, 100.0 * n)
    q.add("x", "d", 9, None)
    assert q.done(*q.take(300.0)[:2], False, 300.0) == 4.0   # a, b, c, d failing: 2 ** (4 - 2)
    q.add("x", "e", 10, None)
    later = 250.0 + WINDOW
    assert q.done(*q.take(later)[:2], False, later) == 1.0   # only d and e within the window (not 8 s)


def test_a_cancelled_job_is_never_taken_and_passes_the_turn_on():
    q = LoginQueue(backoff=1.0)
    for i in range(40):
        q.add("a", "root", i, None)
    q.add("a", "alice", 40, None)
    for i in range(40):
        assert q.cancel(i) == ("a", "root")
    assert q.cancel(0) is None and len(q) == 1
    assert q.take(0.0)[2] == 40
    q.done("a", "alice", True, 0.0)
    assert q.take(0.0) is None and not q.waiting and not q.where


def test_retry_at_says_when_a_waiting_check_may_start():
    q = LoginQueue(backoff=2.0)
    q.add("a", "root", 1, None)
    q.done(*q.take(0.0)[:2], False, 10.0)
    assert q.retry_at("a", "root") == 12.0 and q.retry_at("a", "alice") == 0.0
    q.add("a", "bob", 2, None)
    q.done(*q.take(12.0)[:2], False, 12.0)  # a second failing login: the address rests too
    assert q.retry_at("a", "alice") == 14.0


def test_refusal_records_are_bounded():
    q = LoginQueue(backoff=0.001, max_backoff=0.001, max_records=100)
    for i in range(1000):
        q.add(f"10.0.{i // 250}.{i % 250}", f"u{i}", i, None)
        taken = q.take(float(i))
        q.done(*taken[:2], False, float(i))
    assert len(q.pairs) == 100 and sum(map(len, q.failing.values())) == 100


@pytest.mark.parametrize("refusals,delay", [(1, 0.25), (2, 0.5), (6, 8.0), (7, 10.0), (100, 10.0)])
def test_the_back_off_doubles_up_to_its_most(refusals, delay):
    assert LoginQueue(backoff=0.25, max_backoff=10.0)._delay(refusals) == delay


def test_the_window_and_the_cap_are_the_queues_own():
    """auth_fail_window_ms and auth_fail_delay_max_ms reach the queue: a shorter window forgets
    the first failing login sooner, a lower cap stops the doubling sooner."""
    q = LoginQueue(backoff=1.0, max_backoff=3.0, window=50.0)
    for n, login in enumerate(("a", "b", "c")):
        q.add("x", login, n, None)
        q.done(*q.take(30.0 * n)[:2], False, 30.0 * n)   # at 0, 30, 60: a is out of the window at 60
    q.add("x", "d", 9, None)
    assert q.done(*q.take(70.0)[:2], False, 70.0) == 2.0  # b, c, d failing: 2 ** (3 - 2); with a, 3 (the cap)
    assert q._delay(5) == 3.0
