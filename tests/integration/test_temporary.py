"""Temporary destinations for request/reply: /temp-queue/NAME and /temp-topic/NAME are private to the
connection that names them; a reply-to naming one is rewritten to a broker-wide reply name that
routes back to that connection, which is subscribed to it (RabbitMQ's behaviour)."""

from __future__ import annotations

import pytest

from stompwire import Wire, subscribe
from stompwire import connected as wire


def receipt(w: Wire, command: str, headers: dict, body: bytes = b"", tag: str = "r") -> None:
    w.frame(command, {**headers, "receipt": tag}, body)
    frame = w.read()
    assert frame[:2] == ("RECEIPT", {"receipt-id": tag}), frame


def nothing_more(w: Wire, within: float = 0.3) -> None:
    with pytest.raises(TimeoutError):
        w.read(within)


def serve_one(responder: Wire, answer: bytes) -> dict:
    """Take one request and answer it at its reply-to; returns the request's headers."""
    cmd, headers, body = responder.read()
    assert cmd == "MESSAGE", (cmd, headers, body)
    receipt(responder, "SEND", {"destination": headers["reply-to"],
                                "correlation-id": headers.get("correlation-id", "")}, answer, tag="answered")
    return headers


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_request_reply_over_a_temporary_queue(broker, version):
    responder = wire(broker)
    subscribe(responder, "/queue/rpc-echo")
    requester = wire(broker, version)
    receipt(requester, "SEND", {"destination": "/queue/rpc-echo", "reply-to": "/temp-queue/replies",
                                "correlation-id": "c1"}, b"ping")
    request = serve_one(responder, b"pong")
    assert request["reply-to"].startswith("/reply-queue/")  # a broker-wide name, not the private one
    cmd, headers, body = requester.read()
    assert (cmd, body) == ("MESSAGE", b"pong")
    assert headers["destination"] == "/temp-queue/replies"
    assert headers["subscription"] == "/temp-queue/replies"
    assert headers["correlation-id"] == "c1"
    # The same temporary queue serves the next request, under the same reply name.
    receipt(requester, "SEND", {"destination": "/queue/rpc-echo", "reply-to": "/temp-queue/replies"}, b"again")
    assert serve_one(responder, b"pong2")["reply-to"] == request["reply-to"]
    assert requester.read()[2] == b"pong2"


def test_temporary_names_are_private_to_each_connection(broker):
    responder = wire(broker)
    subscribe(responder, "/topic/rpc-private")
    spy = wire(broker)
    subscribe(spy, "*", "everything")                 # sees the requests, never the replies
    subscribe(spy, "/temp-queue/replies", "mine")      # its own temporary queue, not theirs
    a, b = wire(broker), wire(broker)
    receipt(a, "SEND", {"destination": "/topic/rpc-private", "reply-to": "/temp-queue/replies"}, b"from a")
    receipt(b, "SEND", {"destination": "/topic/rpc-private", "reply-to": "/temp-queue/replies"}, b"from b")
    requests = {body: headers["reply-to"] for _, headers, body in (responder.read(), responder.read())}
    to_a, to_b = requests[b"from a"], requests[b"from b"]
    assert to_a != to_b
    receipt(responder, "SEND", {"destination": to_a}, b"for a")
    receipt(responder, "SEND", {"destination": to_b}, b"for b")
    assert a.read()[2] == b"for a" and b.read()[2] == b"for b"
    nothing_more(a)
    nothing_more(b)
    seen = [spy.read()[2] for _ in range(2)]
    assert sorted(seen) == [b"from a", b"from b"]
    nothing_more(spy)
    thief = wire(broker)  # the reply name can be written to, not read
    thief.frame("SUBSCRIBE", {"id": "t", "destination": to_a, "receipt": "t"})
    cmd, headers, _ = thief.read()
    assert cmd == "ERROR" and headers["receipt-id"] == "t" and to_a in headers["message"]


def test_owner_subscribes_to_its_temporary_queue(broker):
    """ActiveMQ's way: the owner SUBSCRIBEs to /temp-queue/NAME itself (here client-individual),
    which takes over from the broker's subscription; it may also SEND there itself."""
    responder = wire(broker)
    subscribe(responder, "/queue/rpc-own")
    owner = wire(broker)
    subscribe(owner, "/temp-queue/inbox", "mine", ack="client-individual")
    receipt(owner, "SEND", {"destination": "/queue/rpc-own", "reply-to": "/temp-queue/inbox"}, b"q")
    serve_one(responder, b"answer")
    cmd, headers, body = owner.read()
    assert (cmd, body, headers["subscription"], headers["destination"]) == \
        ("MESSAGE", b"answer", "mine", "/temp-queue/inbox")
    receipt(owner, "ACK", {"id": headers["ack"]})
    owner.frame("SEND", {"destination": "/temp-queue/inbox"}, b"to myself")
    cmd, headers, body = owner.read()
    assert (body, headers["subscription"]) == (b"to myself", "mine")
    owner.frame("NACK", {"id": headers["ack"]})
    assert owner.read()[1]["redelivered"] == "true"
    # While nobody reads it, a temporary queue keeps its messages.
    receipt(owner, "UNSUBSCRIBE", {"id": "mine"})
    receipt(owner, "SEND", {"destination": "/temp-queue/inbox"}, b"kept")
    nothing_more(owner)
    subscribe(owner, "/temp-queue/inbox", "again")
    got = [owner.read()[2] for _ in range(2)]
    assert got == [b"to myself", b"kept"]  # the unacknowledged one came back first


def test_temporary_destinations_vanish_with_their_connection(broker):
    responder = wire(broker)
    subscribe(responder, "/queue/rpc-gone")
    requester = wire(broker)
    receipt(requester, "SEND", {"destination": "/queue/rpc-gone", "reply-to": "/temp-queue/replies"}, b"q")
    reply_name = serve_one(responder, b"first")["reply-to"]
    assert requester.read()[2] == b"first"
    requester.frame("DISCONNECT", {"receipt": "bye"})
    assert requester.read()[:2] == ("RECEIPT", {"receipt-id": "bye"})
    successor = wire(broker)  # same private name, a new temporary queue
    receipt(successor, "SEND", {"destination": "/queue/rpc-gone", "reply-to": "/temp-queue/replies"}, b"q2")
    assert serve_one(responder, b"second")["reply-to"] != reply_name
    assert successor.read()[2] == b"second"
    # An answer to the vanished name is accepted (its sender is not at fault) and goes nowhere.
    receipt(responder, "SEND", {"destination": reply_name}, b"too late")
    nothing_more(successor)


def test_request_reply_over_a_temporary_topic_and_in_a_transaction(broker):
    responder = wire(broker)
    subscribe(responder, "/queue/rpc-topic")
    requester = wire(broker)
    receipt(requester, "BEGIN", {"transaction": "t"})
    requester.frame("SEND", {"destination": "/queue/rpc-topic", "reply-to": "/temp-topic/answers",
                             "transaction": "t"}, b"q")
    receipt(requester, "COMMIT", {"transaction": "t"})
    request = serve_one(responder, b"a")
    assert request["reply-to"].startswith("/reply-topic/")
    cmd, headers, body = requester.read()
    assert (body, headers["destination"], headers["subscription"]) == (b"a", "/temp-topic/answers",
                                                                        "/temp-topic/answers")


def test_temporary_destinations_are_limited_per_connection(start_broker):
    b = start_broker("max_subscriptions=3")
    w = wire(b)
    for i in range(3):
        receipt(w, "SEND", {"destination": "/topic/x", "reply-to": f"/temp-queue/r{i}"})
    w.frame("SEND", {"destination": "/topic/x", "reply-to": "/temp-queue/r3", "receipt": "over"})
    cmd, headers, _ = w.read()
    assert cmd == "ERROR" and headers["receipt-id"] == "over"
