"""The puller's requests (``cluster/jetstream.Puller``), byte by byte against a fake connection:
what it asks JetStream for as credit comes and messages arrive."""

from __future__ import annotations

import re

from stompbroker.cluster import packs
from stompbroker.cluster.jetstream import Puller


class FakeNats:
    is_closed = False
    is_connected = True

    def new_inbox(self) -> str:
        return "_INBOX.t"


class FakeFast:
    def __init__(self):
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> bool:
        self.sent.append(data)
        return True


def make(stream: str = "C_Q_0_P16"):
    fast, got = FakeFast(), []
    puller = Puller(FakeNats(), stream, "cons", lambda reply, data, n: got.append(n), fast)
    puller.sub = object()  # started (no real subscription)
    puller.prefix = b"_INBOX.t."
    return puller, fast, got


def requests(fast: FakeFast) -> list[tuple[bytes, int]]:
    """(reply subject, batch) of each pull request sent."""
    out = []
    for data in fast.sent:
        m = re.match(rb"PUB \$JS\.API\.CONSUMER\.MSG\.NEXT\.\S+ (\S+) \d+\r\n\{\"batch\":(\d+)", data)
        if m:
            out.append((m.group(1), int(m.group(2))))
    return out


def single() -> bytes:
    return packs.single("m1", "/queue/a", {}, b"x")


def test_a_request_filled_below_the_credit_asks_for_the_rest_at_once():
    # A pack layout's stream: the puller expects packs of 16, so credit 20 asks for 1 JetStream
    # message; a message sent alone (a dedup-id, a quiet node) fills that request with 1 message.
    # The other 19 are asked for at once, not at the keeper's next turn (ack_wait / 3 later, which
    # delivered one message per 0.67 s per node for the first seconds of a test's load).
    puller, fast, got = make()
    puller.want = 20
    puller.ask()
    [(reply, batch)] = requests(fast)
    assert batch == 1
    puller._arrived(reply, b"$JS.ACK.C_Q_0_P16.cons.1.1.1.0.0", single(), "")
    assert got == [1]
    more = requests(fast)[1:]
    assert more, "nothing asked after the request was filled"
    assert more[0][1] >= 1


def test_no_request_while_the_credit_is_used_up():
    puller, fast, got = make("C_Q_0")  # unpacked: 1 message each
    puller.want = 2
    puller.ask()
    [(reply, batch)] = requests(fast)
    assert batch == 2
    puller._arrived(reply, b"$JS.ACK.C_Q_0.cons.1.1.1.0.0", single(), "")
    puller._arrived(reply, b"$JS.ACK.C_Q_0.cons.1.2.2.0.0", single(), "")
    assert got == [1, 1] and puller.want == 0
    assert len(requests(fast)) == 1  # nothing more to ask for


def test_an_ended_request_asks_again():
    puller, fast, _ = make("C_Q_0")
    puller.want = 4
    puller.ask()
    [(reply, _)] = requests(fast)
    puller._arrived(reply, b"", b"", "408")  # expired on the server
    assert len(requests(fast)) == 2


def test_a_pull_refused_asks_again_a_moment_later_and_flags_the_consumer_for_the_keeper():
    # 409 Consumer Deleted (a queue deleted by an operator while a subscriber arrived here), 503 no
    # responders (that, or a consumer whose leader is being elected): asked again at once, that
    # would spin; never asked again, a puller without a keeper (or before it comes) would stall.
    puller, fast, got = make("C_Q_0")
    puller.want = 10
    puller.ask()
    [(reply, _)] = requests(fast)
    for status in ("409", "503"):
        puller._arrived(reply, b"", b"", status)
        assert puller.lost and requests(fast) == [(reply, 10)]   # flagged for QueueBridge._found
        puller.ask()
        assert len(requests(fast)) == 1                          # not at once
    puller.wait_until = 0.0                                      # (LOST_RETRY later)
    puller.ask()
    assert len(requests(fast)) == 2 and puller.lost              # asked again, still checked by the keeper
    puller.lost = False                                          # (QueueBridge._found: the consumer is there)
    puller._arrived(requests(fast)[-1][0], b"", b"", "408")   # (an expired request: asked again at once)
    assert not puller.lost and len(requests(fast)) == 3


def test_a_refused_pull_is_asked_again_by_the_puller_itself():
    """Without waiting for the bridge's keeper: a consumer just made answers 503 until its leader is
    elected, and a puller left waiting took none of the credit it had (CI: competing pullers)."""
    import asyncio

    from stompbroker.cluster import jetstream

    async def main():
        puller, fast, _ = make("C_Q_0")
        puller.loop = asyncio.get_running_loop()
        puller.want = 5
        puller.ask()
        [(reply, _)] = requests(fast)
        puller._arrived(reply, b"", b"", "503")
        assert len(requests(fast)) == 1
        asked_at = asyncio.get_running_loop().time()
        while len(requests(fast)) < 2:                       # (bounded: 5 s)
            assert asyncio.get_running_loop().time() - asked_at < 5, "never asked again"
            await asyncio.sleep(0.01)
        assert asyncio.get_running_loop().time() - asked_at >= jetstream.LOST_RETRY - 0.05  # not at once

    asyncio.run(main())
