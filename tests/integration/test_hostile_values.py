"""Hostile numbers and bytes get a precise ERROR (never "internal error"), and logs stay short."""

from __future__ import annotations

import pytest

from stompwire import Wire


@pytest.fixture(scope="module")
def durable_broker(tmp_path_factory):
    from conftest import BrokerProcess
    b = BrokerProcess("processors=3", "store=sqlite", f"store_path={tmp_path_factory.mktemp('s') / 'store.sqlite'}")
    yield b
    b.close()


def error_for(broker, command: str, headers: dict, connect: dict | None = None) -> dict:
    w = Wire(broker.connect())
    try:
        if connect is None:
            w.connect()
        if command:
            w.frame(command, {**headers, "receipt": "r"})
        cmd, got, body = w.read()
        assert cmd == "ERROR", (cmd, got, body)
        return got
    finally:
        w.close()


@pytest.mark.parametrize("headers", [
    {"expires": "9" * 400}, {"expires": "-5"}, {"expiration": "9" * 400}, {"expiration": "-5"},
], ids=["expires-400-digits", "expires-negative", "expiration-400-digits", "expiration-negative"])
@pytest.mark.parametrize("destination", ["/queue/hostile", "/topic/hostile"])
def test_hostile_expiry(durable_broker, headers, destination):
    got = error_for(durable_broker, "SEND", {"destination": destination, **headers})
    assert (got["message"], got["receipt-id"]) == ("invalid expiry", "r")
    assert "internal error" not in durable_broker.log()


def test_hostile_replay_from(durable_broker):
    got = error_for(durable_broker, "SUBSCRIBE", {"id": "1", "destination": "/topic/x", "replay-from": "9" * 400})
    assert (got["message"], got["receipt-id"]) == ("invalid replay-from", "r")
    assert "internal error" not in durable_broker.log()


@pytest.mark.parametrize("beat", ["0,5000000000", "5000000000,0", "0," + "9" * 400])
def test_hostile_heart_beat(durable_broker, beat):
    w = Wire(durable_broker.connect())
    w.frame("CONNECT", {"accept-version": "1.2", "heart-beat": beat, "receipt": "r"})
    cmd, got, _ = w.read()
    assert (cmd, got["message"]) == ("ERROR", "invalid heart-beat")
    w.expect_closed()
    assert "internal error" not in durable_broker.log()


def test_nul_byte_in_a_bad_frames_receipt(durable_broker):
    w = Wire(durable_broker.connect())
    w.connect()
    # An unknown command is refused by the dispatcher, a head with a NUL by the reader's parser.
    w.send(b"SEND\ndestination:/queue/x\ncontent-length:zz\nreceipt:a\0b\n\nbody\0")
    cmd, got, _ = w.read()
    assert cmd == "ERROR" and got["message"] != "internal error", got
    assert "\0" not in got.get("receipt-id", "")
    w.expect_closed()
    assert "internal error" not in durable_broker.log() and "Traceback" not in durable_broker.log()


def test_long_selector_is_not_logged_in_full(durable_broker):
    selector = "a = " + "(" * 5000 + "x"
    got = error_for(durable_broker, "SUBSCRIBE", {"id": "1", "destination": "/topic/x", "selector": selector})
    assert got["receipt-id"] == "r"
    assert "(" * 1000 not in durable_broker.log()
