"""Output larger than a writer's ring, through a real broker: one publish whose fan-out is bigger
than the output ring stops over the outbox's limit, the dispatcher drains and resumes it, and
every subscriber gets every message once, in order; so does a queue consumer taking a backlog
bigger than the ring."""

from __future__ import annotations

from stompwire import connected, subscribe

SETTINGS = ("processors=3", "max_frame_size=65536", "output_queue_bytes=1048576")  # a ring of ~1.25 MB
BODY = 48 * 1024


def bodies(w, n: int) -> list[bytes]:
    got = []
    for _ in range(n):
        command, headers, body = w.read(10)
        assert command == "MESSAGE", (command, headers)
        got.append(body)
    return got


def test_a_fan_out_bigger_than_the_output_ring(start_broker):
    b = start_broker(*SETTINGS)
    subscribers = [connected(b) for _ in range(30)]  # 30 x 48 KB = 1.4 MB per message
    for w in subscribers:
        subscribe(w, "/topic/big")
    pub = connected(b)
    sent = [bytes([65 + i]) * BODY for i in range(6)]
    for i, body in enumerate(sent):
        pub.frame("SEND", {"destination": "/topic/big", "receipt": f"r{i}"}, body)
    for i in range(len(sent)):
        assert pub.read(10)[:2] == ("RECEIPT", {"receipt-id": f"r{i}"})
    for w in subscribers:
        assert bodies(w, len(sent)) == sent
    pub.frame("SEND", {"destination": "/topic/big"}, b"after")
    for w in subscribers:
        assert bodies(w, 1) == [b"after"]


def test_a_queue_backlog_bigger_than_the_output_ring(start_broker):
    b = start_broker(*SETTINGS)
    pub = connected(b)
    sent = [b"%03d" % i + b"." * BODY for i in range(60)]  # 2.9 MB waiting
    for i, body in enumerate(sent):
        pub.frame("SEND", {"destination": "/queue/big", "receipt": f"r{i}"}, body)
        assert pub.read(10)[0] == "RECEIPT"
    consumer = connected(b)
    subscribe(consumer, "/queue/big")
    assert bodies(consumer, len(sent)) == sent
