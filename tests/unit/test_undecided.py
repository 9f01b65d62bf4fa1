"""processes/undecided.py: the connect timeout of connections whose protocol is not known yet."""

from stompbroker.processes.undecided import CLOSE, CONNECT_TIMEOUT, Deadlines, answer


def test_items_fall_due_in_the_order_added_and_leave_when_discarded():
    d = Deadlines(10.0)
    assert not d
    d.add("a", 100.0)
    d.add("b", 101.0)
    d.add("c", 102.0)
    assert d.next_due == 110.0
    d.discard("b")          # its protocol became known: it is no longer timed
    d.discard("nothing")
    assert d.due(109.9) == []
    assert d.due(111.5) == ["a"] and d.next_due == 112.0
    assert d.due(200.0) == ["c"] and not d


def test_no_timeout_keeps_nothing():
    d = Deadlines(0.0)
    d.add("a", 1.0)
    assert not d and d.due(1e9) == []


def test_what_an_undecided_connection_gets_at_its_deadline():
    assert answer(b"", under_way=False) == CONNECT_TIMEOUT  # said nothing: the port's own protocol says why
    assert answer(b"D", under_way=False) == CLOSE          # DELETE or DIAG? neither is assumed
    assert answer(b"", under_way=True) == CLOSE            # a TLS handshake or PROXY header never finished
