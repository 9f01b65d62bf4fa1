"""broker/dedup.py's window: bounded by count and by time, whatever the ids' length."""

from stompbroker.broker import dedup


def test_window_remembers_within_its_time_and_forgets_after():
    w = dedup.Window(10.0, 100)
    k = dedup.key("/queue/a", "id")
    assert not w.seen(k, 0.0)
    assert w.seen(k, 9.9)
    assert not w.seen(k, 10.1)  # expired: taken as new (and remembered again)
    assert w.seen(k, 11.0)


def test_window_keeps_at_most_its_count_oldest_first():
    w = dedup.Window(100.0, 3)
    keys = [dedup.key("/queue/a", "x" * 100_000 + str(i)) for i in range(5)]
    for k in keys:
        assert not w.seen(k, 1.0)
    assert len(w.ids) == 3 and all(len(k) == 16 for k in w.ids)
    assert not w.seen(keys[0], 1.0)  # forgotten: the oldest went first
    assert w.seen(keys[4], 1.0)


def test_which_messages_are_deduplicated():
    assert dedup.applies("/queue/a", {})
    assert dedup.applies("/topic/a", {"persistent": "true"})
    assert not dedup.applies("/topic/a", {})
    assert dedup.key("/queue/a", "1") != dedup.key("/queue/b", "1")
