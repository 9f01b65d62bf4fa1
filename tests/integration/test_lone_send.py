"""A lone receipted SEND (one in flight, every process asleep in between): the system calls each broker
process makes for it, as the kernel counts them (/proc/PID/io), never timed (the cost in CPU is
stompbroker-bench's ``--scenario lone``)."""

from __future__ import annotations

import psutil

from stompwire import connected, subscribe
from stompbroker.titles import process_role

LONE = 300


def by_role(broker) -> dict[str, psutil.Process]:
    return {process_role(p): p for p in psutil.Process(broker.proc.pid).children()}


def io(procs: dict) -> dict[str, tuple[int, int]]:
    return {role: (p.io_counters().read_count, p.io_counters().write_count) for role, p in procs.items()}


def lone_sends(producer, consumer, n: int) -> None:
    for i in range(n):
        producer.frame("SEND", {"destination": "/topic/lone", "receipt": f"r{i}"}, b"x" * 117)
        command, headers, _ = producer.read()
        assert (command, headers["receipt-id"]) == ("RECEIPT", f"r{i}")
        command, _, body = consumer.read()
        assert (command, body) == ("MESSAGE", b"x" * 117)


def test_a_lone_send_costs_each_process_its_wake_up_and_its_io_only(start_broker):
    broker = start_broker("processors=3")
    producer, consumer = connected(broker), connected(broker)
    subscribe(consumer, "/topic/lone", "0")
    lone_sends(producer, consumer, 20)  # (start-up: the writer adopts the sockets)
    procs = by_role(broker)
    before = io(procs)
    lone_sends(producer, consumer, LONE)
    after = io(procs)
    per = {role: ((after[role][0] - before[role][0]) / LONE, (after[role][1] - before[role][1]) / LONE)
           for role in after}
    # The reader: the client's bytes (a read) and the dispatcher's wake-up (an eventfd write).
    assert per["reader"][0] <= 1.1 and per["reader"][1] <= 1.1, per
    # The dispatcher: the writer's wake-up; its own wake-up is edge-triggered, not read back.
    assert per["dispatcher"][0] <= 0.1 and per["dispatcher"][1] <= 1.1, per
    # The writer: a MESSAGE and a RECEIPT, one send each; no read of its wake-up either.
    assert per["writer-0"][0] <= 0.1 and per["writer-0"][1] <= 2.1, per
