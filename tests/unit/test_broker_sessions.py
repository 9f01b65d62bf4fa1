"""The pure broker's sessions: CONNECT, versions, heart-beats, refusals, receipts, ERROR, timeouts, DIAG."""

from __future__ import annotations

import pytest

from broker_harness import Rig
from stompbroker.ipc.records import alive_every
from stompbroker.security.console_tokens import ConsoleTokens


# -- CONNECT and versions ---------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["CONNECT", "STOMP"])
@pytest.mark.parametrize("offered,chosen", [(None, "1.0"), ("1.0", "1.0"), ("1.1", "1.1"), ("1.2", "1.2"),
                                            ("1.0,1.1", "1.1"), ("1.2, 1.0", "1.2"), ("1.1,2.0", "1.1")])
def test_connect_picks_the_highest_common_version(command, offered, chosen):
    rig = Rig()
    rig.open(1)
    rig.frame(1, command, {"accept-version": offered} if offered else {})
    (reply,) = rig.frames(1)
    assert reply.command == "CONNECTED"
    assert reply["version"] == chosen and reply["server"].startswith("stompbroker/") and reply["session"]


def test_no_common_version_is_an_error_listing_ours():
    rig = Rig()
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="2.0,3.1", receipt="r")
    error = rig.error(1)
    assert error["message"] == "unsupported protocol version"
    assert error["version"] == "1.0,1.1,1.2" and error["receipt-id"] == "r"


def test_a_second_connect_is_refused():
    rig = Rig()
    rig.connect(1)
    rig.frame(1, "CONNECT", accept_version="1.2")
    assert rig.error(1)["message"] == "already connected"


@pytest.mark.parametrize("command", ["SEND", "SUBSCRIBE", "BEGIN", "ACK", "DISCONNECT"])
def test_frames_before_connect_are_refused(command):
    rig = Rig()
    rig.open(1)
    rig.frame(1, command, destination="/queue/a", receipt="r1")
    error = rig.error(1)
    assert error["message"] == "not connected" and error["receipt-id"] == "r1"


def test_an_unknown_command_is_an_error_with_its_receipt():
    rig = Rig()
    rig.connect(1)
    rig.frame(1, "PUBLISH", receipt="r2")
    error = rig.error(1)
    assert error["message"] == "unknown command" and error["receipt-id"] == "r2"
    assert b"PUBLISH" in error.body and error["content-type"] == "text/plain"


def test_after_an_error_the_connection_is_deaf():
    rig = Rig()
    rig.connect(1)
    rig.frame(1, "PUBLISH")
    rig.take(1)
    rig.send(1, "/topic/t", receipt="late")
    assert rig.take(1) == []


def test_bad_frame_from_the_reader_gets_error_with_receipt():
    rig = Rig()
    rig.connect(1)
    rig.broker.on_bad_frame(1, "frame too large", "more than max_frame_size", "r3")
    error = rig.error(1)
    assert error["message"] == "frame too large" and error["receipt-id"] == "r3"
    assert error.body == b"more than max_frame_size"


# -- heart-beats ------------------------------------------------------------------------------------
@pytest.mark.parametrize("client,broker_says,out_every,in_every", [
    ("0,0", "0,0", 0, 0),          # no heart-beats either way
    ("0,500", "100,0", 500, 0),    # the client wants beats every 500 ms; the broker can do 100
    ("500,0", "0,500", 0, 500),    # the client sends every 500 ms
    ("50,50", "100,100", 100, 100),  # faster than heartbeat_min_ms: raised to it
    ("2000,3000", "100,2000", 3000, 2000),
])
def test_heart_beat_negotiation(client, broker_says, out_every, in_every):
    rig = Rig(heartbeat_min_ms=100)
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", heart_beat=client)
    got = rig.take(1)
    assert got[0].command == "CONNECTED" and got[0]["heart-beat"] == broker_says
    beats = [o.aux for o in got if o.kind == "HEARTBEAT"]
    assert beats == ([out_every] if out_every else [])
    # the incoming interval shows in when a silent connection is cut
    if in_every:  # cut once silent for the interval + grace + the ALIVE reports' lag, not before
        rig.tick(in_every / 1000 + rig.config.heartbeat_grace_ms / 1000 + alive_every(rig.config) - 0.01)
        assert rig.take(1) == []
        rig.tick(0.02)
        assert rig.error(1)["message"] == "heart-beat timeout"
    else:
        rig.tick(3600)
        assert rig.take(1) == []


def test_heart_beats_are_ignored_in_stomp_1_0():
    rig = Rig()
    reply = rig.connect(1, version="1.0", heart_beat="1000,1000")
    assert reply["heart-beat"] == "0,0"


@pytest.mark.parametrize("value", ["1000", "a,b", "-1,0", "1,2,3", "99999999999,0"])
def test_an_invalid_heart_beat_is_refused(value):
    rig = Rig()
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", heart_beat=value, receipt="hb")
    error = rig.error(1)
    assert error["message"] == "invalid heart-beat" and error["receipt-id"] == "hb"


def test_a_client_that_beats_slower_than_heartbeat_max_is_refused():
    rig = Rig(heartbeat_max_ms=10_000)
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", heart_beat="20000,0")
    assert rig.error(1)["message"] == "heart-beat out of range"


def test_a_silent_heart_beating_client_is_cut_on_tick():
    rig = Rig(heartbeat_min_ms=100, heartbeat_grace_ms=1000)
    rig.connect(1, heart_beat="1000,0")
    rig.tick(0.5)
    rig.broker.on_alive(1, rig.now)   # the reader saw bytes (a heart-beat)
    # The reader's ALIVE reports lag the bytes by up to alive_every (here 0.25 s): allowed for.
    rig.tick(2.2)                     # past interval + grace, within the lag
    assert rig.take(1) == []
    rig.tick(0.1)                     # past interval + grace + the lag
    error = rig.error(1)
    assert error["message"] == "heart-beat timeout"


def test_frames_count_as_life():
    rig = Rig(heartbeat_min_ms=100, heartbeat_grace_ms=1000)
    rig.connect(1, heart_beat="1000,0")
    for _ in range(10):
        rig.tick(1.5)
        rig.send(1, "/topic/nobody")
    assert rig.take(1) == []


def test_a_connection_without_connect_is_cut_after_connect_timeout():
    rig = Rig(connect_timeout_ms=2000)
    rig.open(1)
    rig.tick(1.9)
    assert rig.take(1) == [] and rig.broker.needs_tick()
    rig.tick(0.2)
    assert rig.error(1)["message"] == "connect timeout"


def test_the_connect_timeout_is_only_for_connections_the_reader_saw_speak_stomp():
    # An HTTP request the reader has not read yet must never get a STOMP ERROR: the reader answers
    # connections whose protocol it does not know (processes/undecided.py), the broker the others.
    rig = Rig(connect_timeout_ms=2000)
    rig.open(1, stomp=False)
    rig.open(2, stomp=False)
    assert not rig.broker.needs_tick()
    rig.tick(5)
    assert rig.take(1) == [] and rig.take(2) == []
    rig.broker.on_stomp(1)          # its first bytes were STOMP, read late: the deadline has passed
    rig.broker.on_websocket(2)      # STOMP inside WebSocket
    rig.tick(0.1)
    assert rig.error(1)["message"] == "connect timeout"
    assert rig.error(2)["message"] == "connect timeout"


def test_an_idle_connected_broker_needs_no_tick():
    rig = Rig()
    rig.connect(1)
    assert not rig.broker.needs_tick()


# -- receipts, DISCONNECT, closing -----------------------------------------------------------------
def test_every_command_answers_its_receipt():
    rig = Rig()
    rig.connect(1)
    rig.frame(1, "SUBSCRIBE", destination="/queue/q", id="s", ack="client", receipt="1")
    rig.frame(1, "SEND", destination="/queue/q", receipt="2")
    (message,) = [o for o in rig.frames(1) if o.command == "MESSAGE"]
    rig.frame(1, "ACK", id=message["ack"], receipt="3")
    rig.frame(1, "BEGIN", transaction="t", receipt="4")
    rig.frame(1, "ABORT", transaction="t", receipt="5")
    rig.frame(1, "UNSUBSCRIBE", id="s", receipt="6")
    rig.frame(1, "DISCONNECT", receipt="7")
    got = rig.take(1)
    assert [(o.command, o.headers.get("receipt-id")) for o in got if o.kind == "DATA"] == [
        ("RECEIPT", str(i)) for i in range(3, 8)]
    assert got[-1].kind == "CLOSE"


def test_receipts_in_order_with_messages():
    rig = Rig()
    rig.connect(1)
    rig.subscribe(1, "/topic/t")
    rig.send(1, "/topic/t", body=b"a", receipt="r")
    assert [o.command for o in rig.frames(1)] == ["MESSAGE", "RECEIPT"]


def test_connect_with_receipt_gets_connected_then_receipt():
    rig = Rig()
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", receipt="c")
    got = rig.frames(1)
    assert [o.command for o in got] == ["CONNECTED", "RECEIPT"] and got[1]["receipt-id"] == "c"


def test_disconnect_closes_and_later_frames_are_ignored():
    rig = Rig()
    rig.connect(1)
    rig.frame(1, "DISCONNECT")
    assert [o.kind for o in rig.take(1)] == ["CLOSE"]
    rig.send(1, "/topic/t", receipt="x")
    assert rig.take(1) == []


def test_on_closed_forgets_the_session_and_tells_the_writer():
    rig = Rig()
    rig.connect(1)
    rig.subscribe(1, "/topic/t")
    rig.broker.on_closed(1)
    assert [o.kind for o in rig.take(1)] == ["CLOSE"]
    rig.send(1, "/topic/t", receipt="gone")
    assert rig.take(1) == []   # the session is forgotten
    rig.connect(2)
    rig.send(2, "/topic/t")
    assert rig.take(1) == []
    rig.broker.on_closed(1)   # twice: nothing happens
    assert rig.take(1) == []


def test_error_on_a_websocket_connection_sends_a_close_frame():
    rig = Rig()
    rig.open(1)
    rig.broker.on_websocket(1)
    rig.frame(1, "CONNECT", accept_version="1.2")
    rig.take(1)
    rig.frame(1, "NOPE")
    got = rig.take(1)
    assert [o.command or o.kind for o in got] == ["ERROR", "CLOSE"]
    assert got[1].body == b"\x03\xe8"   # the writer sends a close frame, code 1000, before the FIN


def test_replies_go_to_the_connections_own_writer():
    rig = Rig(writers=3)
    for conn in range(3):
        rig.connect(conn + 1, writer=conn)
    rig.subscribe(3, "/topic/t")
    rig.send(1, "/topic/t")
    assert len(rig.outboxes[2].buf) > 0 and rig.outboxes[0].buf == bytearray()
    assert rig.bodies(3) == [b"x"]


def test_reader_restart_ends_every_session_and_resets_writers():
    rig = Rig(writers=2)
    rig.connect(1, writer=0)
    rig.connect(2, writer=1)
    rig.subscribe(1, "/queue/q", ack="client")
    rig.send(2, "/queue/q", body=b"kept")
    assert rig.bodies(1) == [b"kept"]
    rig.broker.on_reader_start(1000)
    resets = [o for o in (rig.take(0)) if o.kind == "RESET"]
    assert len(resets) == 2 and resets[0].body == (1000).to_bytes(8, "little")
    rig.send(2, "/topic/t", receipt="gone")
    assert rig.take(2) == []   # the old sessions are forgotten
    rig.connect(1001)
    rig.subscribe(1001, "/queue/q")
    (message,) = rig.messages(1001)
    assert message.body == b"kept" and message["redelivered"] == "true"


# -- logins (the check itself runs elsewhere; the broker waits for on_auth) -------------------------
class FakeAuth:
    required = True

    def __init__(self, admins=()):
        self.submitted = []
        self.cancelled = []
        self.admins = admins

    def submit(self, conn, login, passcode, ip):
        self.submitted.append((conn, login, passcode, ip))

    def cancel(self, conn):
        self.cancelled.append(conn)

    def can_read(self, login, destination):
        return not destination.startswith("/queue/secret")

    can_write = can_read

    def is_admin(self, login):
        return login in self.admins


def test_a_login_waits_for_the_check_and_frames_wait_with_it():
    auth = FakeAuth()
    rig = Rig(auth=auth)
    rig.open(1, peer="10.0.0.1:5555")
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    rig.subscribe(1, "/topic/t", receipt="s")
    assert rig.take(1) == [] and auth.submitted == [(1, "u", "p", "10.0.0.1")]
    rig.broker.on_auth(1, "u", rig.now)
    assert rig.commands(1) == ["CONNECTED", "RECEIPT"]


def test_a_refused_login_gets_its_error_after_its_back_off():
    rig = Rig(auth=FakeAuth())
    rig.open(1, peer="10.0.0.2:1")
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="bad")
    rig.broker.on_auth(1, None, rig.now, 0.5)  # the login queue's verdict: refused, told in 0.5 s
    rig.tick(0.4)
    assert rig.take(1) == []
    rig.tick(0.2)
    error = rig.error(1)
    assert error["message"] == "access refused" and b"login or passcode" in error.body


def test_a_login_not_checked_by_the_connect_timeout_is_told_so():
    auth = FakeAuth()
    rig = Rig(auth=auth, connect_timeout_ms=1000)
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    rig.tick(1.2)
    assert rig.error(1)["message"] == "login not checked in time"
    rig.broker.on_closed(1)
    assert auth.cancelled == [1]


def test_closing_while_a_login_is_checked_cancels_it():
    auth = FakeAuth()
    rig = Rig(auth=auth)
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    rig.broker.on_closed(1)
    assert auth.cancelled == [1]
    rig.broker.on_auth(1, "u", rig.now)   # the answer comes late: ignored
    assert [o.kind for o in rig.take(1)] == ["CLOSE"]


def test_permissions_refuse_with_the_destination_named():
    rig = Rig(auth=FakeAuth())
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    rig.broker.on_auth(1, "u", rig.now)
    rig.take(1)
    rig.frame(1, "SUBSCRIBE", destination="/queue/secret", id="s", receipt="r")
    error = rig.error(1)
    assert error["message"] == "permission denied for /queue/secret" and error["receipt-id"] == "r"


# -- DIAG --------------------------------------------------------------------------------------------
class FakeDiag:
    def text(self, query, offset=0, vhost=None):
        if query == "queues":  # a list, in parts
            return f"<queues from {offset}>", {"total": "9", "truncated": "true", "next-offset": str(offset + 3)}
        return f"<{query}>", {}

    def headers(self, query, offset=0, vhost=None):
        return {"answer": query}

    def monitor_body(self):
        return b"Queue: x\n"


def test_diag_frame_answers_a_query_before_connect_as_stompica_did_when_asked_to():
    rig = Rig(diag=FakeDiag(), diag_before_connect=True)
    rig.open(1)
    rig.frame(1, "DIAG", body=b"session-size\n", receipt="d")
    got = rig.frames(1)
    assert [o.command for o in got] == ["DIAG", "RECEIPT"]
    assert got[0]["session-size"] == "<session-size>"   # stompica's form: the answer is a header


def test_a_diag_list_answer_says_where_it_was_cut_and_continues_from_an_offset():
    rig = Rig(diag=FakeDiag())
    rig.connect(1)
    rig.frame(1, "DIAG", body=b"queues")
    rig.frame(1, "DIAG", {"offset": "3"}, body=b"queues")
    first, second = rig.frames(1)
    assert (first["queues"], first["truncated"], first["next-offset"], first["total"]) == (
        "<queues from 0>", "true", "3", "9")
    assert second["queues"] == "<queues from 3>" and second["next-offset"] == "6"
    rig.frame(1, "DIAG", {"offset": "²", "receipt": "r"}, body=b"queues")  # (a digit to isdigit, not to int)
    error = rig.error(1)
    assert error["message"] == "invalid offset" and error["receipt-id"] == "r"


def test_diag_connections_come_in_parts_of_whole_connections():
    import json

    from stompbroker.diag.stats import Statistics

    rig = Rig(max_answer_bytes=400)
    stats = rig.broker.diag = Statistics(rig.broker, None, rig.config)
    for conn in range(1, 11):
        rig.connect(conn, login=f"user{conn}")
    rig.broker.on_peer(3, "192.0.2.3:1000")  # (its proxy's PROXY header named it)
    rig.open(11, stomp=False)                 # has said nothing yet
    seen, offset, parts = [], 0, 0
    while True:
        text, more = stats.text("connections", offset)
        assert len(text.encode()) <= 400 and more["total"] == "11"
        seen += json.loads(text)
        parts += 1
        if "next-offset" not in more:
            break
        offset = int(more["next-offset"])
        assert offset == len(seen)
    assert parts > 2 and [c["id"] for c in seen] == list(range(1, 12))
    assert seen[2] == {"id": 3, "address": "192.0.2.3:1000", "login": "user3", "protocol": "stomp", "tls": False,
                       "subscriptions": 0}
    assert (seen[10]["protocol"], seen[10]["login"]) == ("", "")
    assert stats.text("connections", 99) == ("[]", {"total": "11"})


def test_diag_needs_a_session_by_default():
    rig = Rig(diag=FakeDiag())
    rig.open(1)
    rig.frame(1, "DIAG", body=b"session-size")
    assert rig.error(1)["message"] == "not connected"


def test_an_unknown_diag_query_is_an_error():
    rig = Rig(diag=FakeDiag())
    rig.connect(1)
    rig.frame(1, "DIAG", body=b"nonsense", receipt="q")
    error = rig.error(1)
    assert error["message"] == "unknown DIAG query" and error["receipt-id"] == "q"


def test_diag_admin_only_refuses_other_users():
    rig = Rig(diag=FakeDiag(), diag_admin_only=True)
    rig.connect(1)
    rig.frame(1, "DIAG", body=b"session-size")
    assert rig.error(1)["message"] == "permission denied for DIAG"


def test_send_to_a_diag_topic_carries_the_query_as_headers():
    rig = Rig(diag=FakeDiag())
    rig.connect(1)
    rig.subscribe(1, "DIAG.out")
    rig.send(1, "DIAG.out", body=b"session")
    (message,) = rig.messages(1)
    assert message["answer"] == "session"


def test_the_monitor_queue_gets_status_on_tick_and_refuses_sends():
    rig = Rig(diag=FakeDiag(), monitor_interval=1000)
    rig.connect(1)
    rig.subscribe(1, "/queue/monitor")
    assert rig.broker.needs_tick()
    rig.tick(0.1)
    assert rig.bodies(1) == [b"Queue: x\n"]
    rig.tick(0.5)
    assert rig.take(1) == []
    rig.send(1, "/queue/monitor")
    assert rig.error(1)["message"] == "reserved destination"


def test_monitor_statuses_stop_over_the_outbox_limit_and_resume():
    """Many monitor subscribers: the status goes out as a fan-out does, never the whole lot at once."""
    rig = Rig(diag=FakeDiag(), monitor_interval=1000)
    for conn in range(1, 21):
        rig.connect(conn)
        rig.subscribe(conn, "/queue/monitor")
    for box in rig.outboxes:
        box.take()
        box.limit = 100
    rig.tick(0.1)
    assert rig.broker.unfinished
    batches = 0
    while rig.broker.unfinished:
        assert len(rig.outboxes[0].buf) < 300
        rig.outboxes[0].take()
        rig.broker.resume()
        batches += 1
    assert batches > 5


def test_frames_waiting_for_a_login_are_bounded():
    rig = Rig(auth=FakeAuth())
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    for _ in range(1001):
        rig.send(1, "/topic/t")
    assert rig.error(1)["message"] == "too many frames before CONNECTED"


def test_stomp_1_0_header_values_are_not_escaped():
    rig = Rig()
    rig.connect(1, version="1.0")
    rig.connect(2)
    rig.frame(1, "SUBSCRIBE", destination="/topic/t")
    rig.frame(2, "SEND", {"destination": "/topic/t", "note": "a\\nb"})   # 1.2: an escaped line break
    (message,) = rig.messages(1)
    assert message["note"] == "a b"   # 1.0 cannot carry it: the break becomes a space


def test_diag_topic_answers_reach_only_admins_when_diag_is_for_admins():
    auth = FakeAuth(admins=("root",))
    rig = Rig(auth=auth, diag=FakeDiag(), diag_admin_only=True)
    for conn, login in ((1, "root"), (2, "bob")):
        rig.open(conn)
        rig.frame(conn, "CONNECT", accept_version="1.2", login=login, passcode="p")
        rig.broker.on_auth(conn, login, rig.now)
        rig.take(conn)
    rig.subscribe(1, "DIAG/r")
    rig.subscribe(2, "*")
    rig.send(1, "DIAG/r", body=b"session")
    assert rig.messages(1)[0]["answer"] == "session" and rig.take(2) == []
    rig.subscribe(2, "DIAG/r", sub_id="d", receipt="r")
    assert rig.error(2)["message"] == "permission denied for DIAG/r"


# -- the web console's read-only sessions -------------------------------------------------------------
class ConsoleAuth(FakeAuth):
    def __init__(self):
        super().__init__(admins=("root",))
        self.console = ConsoleTokens(ttl=60.0, per_user=8)

    def console_login(self, login, passcode, address, now):
        return self.is_admin(login) and self.console.redeem(login, passcode, address, now)


def test_a_console_passcode_opens_a_read_only_session_at_once_that_ends():
    auth = ConsoleAuth()
    rig = Rig(auth=auth, diag=FakeDiag())
    passcode = auth.console.mint("root", "10.0.0.9", rig.now)
    rig.open(1, peer="10.0.0.9:4000")
    rig.frame(1, "CONNECT", accept_version="1.2", login="root", passcode=passcode)
    assert rig.commands(1) == ["CONNECTED"] and auth.submitted == []   # no password check to wait for
    rig.frame(1, "DIAG", body=b"session-size")
    rig.subscribe(1, "/queue/monitor", receipt="m")
    assert rig.commands(1) == ["DIAG", "RECEIPT"]
    for command, headers, refused in (("SEND", {"destination": "/queue/a"}, "SEND"),
                                      ("BEGIN", {"transaction": "t"}, "BEGIN"),
                                      ("SUBSCRIBE", {"destination": "/topic/*", "id": "x"}, "/topic/*")):
        conn = 2 + len(rig.seen)
        rig.open(conn, peer="10.0.0.9:4001")
        rig.frame(conn, "CONNECT", accept_version="1.2", login="root",
                  passcode=auth.console.mint("root", "10.0.0.9", rig.now))
        rig.take(conn)
        rig.frame(conn, command, headers, receipt="r")
        error = rig.error(conn)
        assert (error["message"], error["receipt-id"]) == (f"permission denied for {refused}", "r")
    rig.tick(59.0)
    assert [o.command for o in rig.take(1)] == ["MESSAGE"]  # a monitor status, no ERROR yet
    rig.tick(1.5)
    assert rig.error(1)["message"] == "session expired"


def test_a_wrong_console_passcode_is_checked_like_any_passcode():
    auth = ConsoleAuth()
    rig = Rig(auth=auth)
    passcode = auth.console.mint("root", "10.0.0.9", rig.now)
    rig.open(1, peer="10.0.0.8:4000")   # another address
    rig.frame(1, "CONNECT", accept_version="1.2", login="root", passcode=passcode)
    assert rig.take(1) == [] and auth.submitted == [(1, "root", passcode, "10.0.0.8")]


def test_a_scheduler_browse_may_reply_only_where_its_user_may_write():
    """AMQ_SCHEDULER_ACTION:BROWSE sends every job to its reply-to: a user may not have the broker
    write the jobs where the user could not (it did, without a check)."""
    rig = Rig(auth=FakeAuth())
    rig.open(1)
    rig.frame(1, "CONNECT", accept_version="1.2", login="u", passcode="p")
    rig.broker.on_auth(1, "u", rig.now)
    rig.take(1)
    rig.frame(1, "SEND", {"AMQ_SCHEDULED_DELAY": "60000"}, destination="/queue/jobs")
    rig.frame(1, "SEND", {"AMQ_SCHEDULER_ACTION": "BROWSE", "reply-to": "/queue/secret-inbox"},
              destination="/queue/ActiveMQ.Scheduler.Management", receipt="r")
    error = rig.error(1)
    assert error["message"] == "permission denied for /queue/secret-inbox" and error["receipt-id"] == "r"
    assert "/queue/secret-inbox" not in rig.broker.queues
