"""What one connection can make the dispatcher hold is bounded: open transactions and the bytes of
their frames (per connection and for all connections together), frames sent before a login is
checked, unacknowledged topic messages, and the durable subscriptions its users leave behind."""

from __future__ import annotations

from broker_harness import Rig

KB = 1024
BODY = b"x" * (10 * KB)


class PendingAuth:
    """Logins wait until the test says (``submit`` keeps them)."""

    required = True

    def __init__(self):
        self.submitted = []

    def submit(self, conn, login, passcode, ip):
        self.submitted.append(conn)

    def cancel(self, conn):
        pass

    def can_read(self, login, destination):
        return True

    can_write = can_read

    def is_admin(self, login):
        return False


def test_a_connection_may_have_max_transactions_open():
    rig = Rig(max_transactions=3)
    rig.connect(1)
    for i in range(3):
        rig.frame(1, "BEGIN", transaction=f"t{i}")
    rig.frame(1, "BEGIN", transaction="t3", receipt="b")
    error = rig.error(1)
    assert (error["message"], error["receipt-id"]) == ("too many transactions", "b")
    assert "max_transactions" in error.body.decode()


def test_frames_held_in_transactions_are_bounded_per_connection_and_released_at_commit_and_abort():
    rig = Rig(max_held_bytes=100 * KB)
    rig.connect(1)
    rig.subscribe(1, "/topic/t")
    rig.frame(1, "BEGIN", transaction="a")
    rig.frame(1, "BEGIN", transaction="b")
    for i in range(4):  # 4 x 10 KB in each: 80 KB and their bookkeeping
        rig.send(1, "/topic/t", BODY, transaction="a")
        rig.send(1, "/topic/t", BODY, transaction="b")
    rig.frame(1, "COMMIT", transaction="a")
    rig.frame(1, "ABORT", transaction="b")
    assert len(rig.messages(1)) == 4
    assert rig.broker.sessions[1].kept == 0 and rig.broker.kept == 0
    rig.frame(1, "BEGIN", transaction="c")  # what was released may be held again
    for i in range(9):
        rig.send(1, "/topic/t", BODY, transaction="c")
    assert rig.take(1) == []
    rig.send(1, "/topic/t", BODY, transaction="c", receipt="r")  # the 10th passes 100 KB
    error = rig.error(1)
    assert (error["message"], error["receipt-id"]) == ("transaction too large", "r")
    assert "max_held_bytes" in error.body.decode()
    rig.broker.on_closed(1)
    assert rig.broker.kept == 0  # an ended session's transactions are gone, and counted so


def test_empty_frames_count_too():
    rig = Rig(max_held_bytes=100 * KB)
    rig.connect(1)
    rig.frame(1, "BEGIN", transaction="a")
    for i in range(1000):
        rig.send(1, "/topic/t", b"", transaction="a")
        if rig.broker.sessions[1].closing:
            break
    assert 100 < i < 1000 and rig.error(1)["message"] == "transaction too large"


def test_frames_held_in_transactions_are_bounded_for_all_connections_together():
    rig = Rig(max_held_bytes=100 * KB, max_held_bytes_total=150 * KB)
    for conn in (1, 2):
        rig.connect(conn)
        rig.frame(conn, "BEGIN", transaction="a")
    for i in range(9):
        rig.send(1, "/topic/t", BODY, transaction="a")
    for i in range(7):
        rig.send(2, "/topic/t", BODY, transaction="a", receipt=str(i))
        if rig.broker.sessions[2].closing:
            break
    error = rig.error(2)
    assert (error["message"], error["receipt-id"]) == ("broker busy", str(i)) and 4 <= i < 7
    assert "max_held_bytes_total" in error.body.decode()
    assert rig.broker.sessions[1].kept == rig.broker.kept  # (the refused connection's are gone)
    rig.frame(1, "COMMIT", transaction="a")
    assert rig.broker.kept == 0


def test_frames_sent_before_the_login_is_checked_may_hold_max_first_frame():
    auth = PendingAuth()
    rig = Rig(auth=auth, max_first_frame=64 * KB)
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    assert auth.submitted == [1]
    for i in range(6):  # 60 KB and their bookkeeping
        rig.send(1, "/topic/t", BODY)
    assert rig.take(1) == [] and rig.broker.kept > 60 * KB
    rig.send(1, "/topic/t", BODY, receipt="r")
    error = rig.error(1)
    assert error["message"] == "too many frames before CONNECTED" and "max_first_frame" in error.body.decode()
    rig.broker.on_closed(1)
    assert rig.broker.kept == 0
    # a login that is checked in time releases what waited, and the frames are handled
    rig.open(2)
    rig.frame(2, "CONNECT", accept_version="1.2", login="u", passcode="p")
    rig.send(2, "/topic/t", BODY)
    rig.broker.on_auth(2, "u", rig.now)
    assert rig.commands(2) == ["CONNECTED"] and rig.broker.kept == 0 and rig.broker.sessions[2].kept == 0


def test_unacknowledged_topic_messages_are_bounded_per_connection():
    # A client-ack topic subscription takes what is published whatever its prefetch (a topic keeps
    # nothing for later): a subscriber that never acknowledges made the dispatcher keep every one.
    rig = Rig(max_held_bytes=100 * KB)
    rig.connect(1)
    rig.subscribe(1, "/topic/t", "c", ack="client-individual", prefetch_count="0")
    rig.connect(2)
    rig.subscribe(2, "/topic/t", "auto")
    for i in range(9):
        rig.send(2, "/topic/t", BODY)
    got = rig.messages(1)
    assert len(got) == 9 and len(rig.messages(2)) == 9
    rig.frame(1, "ACK", id=got[0]["ack"])  # room for one more
    rig.send(2, "/topic/t", BODY)
    assert len(rig.messages(1)) == 1
    rig.send(2, "/topic/t", BODY)  # over 100 KB unacknowledged: the subscriber is told and closed
    error = rig.error(1)
    assert error["message"] == "too many unacknowledged messages" and "max_held_bytes" in error.body.decode()
    assert len(rig.messages(2)) == 2  # the others still get every message
    rig.broker.on_closed(1)
    assert rig.broker.kept == 0


def test_durable_subscriptions_are_bounded_for_the_broker():
    rig = Rig(max_durables=3)
    rig.connect(1)
    for i in range(3):
        rig.subscribe(1, f"/topic/d{i}", f"d{i}", durable="true")
    rig.broker.on_closed(1)  # they outlive their connection
    rig.connect(2)
    rig.subscribe(2, "/topic/d0", "d0", durable="true", receipt="again")  # an existing one: attached
    assert rig.commands(2) == ["RECEIPT"]
    rig.subscribe(2, "/topic/d9", "d9", durable="true", receipt="new")
    error = rig.error(2)
    assert (error["message"], error["receipt-id"]) == ("too many durable subscriptions", "new")
    assert "max_durables" in error.body.decode()
