"""The floor under a lone receipted SEND: the same hops as the broker with no broker work.

A producer sends one frame and waits for the answer; a consumer on another connection reads
its copy. In between, ``--hops 3``: three processes like the broker's reader, dispatcher and
writer (epoll_wait and recv; an eventfd wake-up, epoll_wait and eventfd read; an eventfd
wake-up, epoll_wait, eventfd read and two sends: MESSAGE to the consumer, RECEIPT to the
producer), 64 bytes through shared memory at each hop; ``--hops 2``: the reader and the
dispatcher as one process (recv, then the eventfd to the writer); ``--hops 1``: one process that does
epoll_wait, recv and the two sends (the kernel's loopback TCP and one wake-up: what no change
to the broker's processes can remove). Prints CPU µs per message of the relay processes
(user, system), from /proc.

    python scripts/lone_floor.py --hops 3 --seconds 5
"""

from __future__ import annotations

import argparse
import mmap
import os
import select
import socket
import time

FRAME = b"SEND\ndestination:/topic/x\nreceipt:r\ncontent-length:117\n\n" + b"x" * 117 + b"\0"
MESSAGE = b"MESSAGE\ndestination:/topic/x\nsubscription:0\nmessage-id:1\ncontent-length:117\n\n" + b"x" * 117 + b"\0"
RECEIPT = b"RECEIPT\nreceipt-id:r\n\n\0"


def waiter(fd: int):
    ep = select.epoll()
    ep.register(fd, select.EPOLLIN)
    return ep


def reader(sock, shm, wake):
    ep = waiter(sock.fileno())
    while True:
        ep.poll()
        data = sock.recv(65536)
        if not data:
            return
        shm[0:64] = data[:64]
        os.eventfd_write(wake, 1)


def dispatcher(woken, shm, wake):
    ep = waiter(woken)
    while True:
        ep.poll()
        os.eventfd_read(woken)
        shm[64:128] = shm[0:64]
        os.eventfd_write(wake, 1)


def writer(woken, shm, consumer, producer):
    ep = waiter(woken)
    while True:
        ep.poll()
        os.eventfd_read(woken)
        bytes(shm[64:128])
        os.write(consumer.fileno(), MESSAGE)
        os.write(producer.fileno(), RECEIPT)


def reader_dispatcher(sock, shm, wake):
    ep = waiter(sock.fileno())
    while True:
        ep.poll()
        data = sock.recv(65536)
        if not data:
            return
        shm[64:128] = data[:64]
        os.eventfd_write(wake, 1)


def alone(producer, consumer):
    ep = waiter(producer.fileno())
    while True:
        ep.poll()
        if not producer.recv(65536):
            return
        os.write(consumer.fileno(), MESSAGE)
        os.write(producer.fileno(), RECEIPT)


def cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hops", type=int, choices=(1, 2, 3), default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    o = ap.parse_args()
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    cons_c = socket.create_connection(("127.0.0.1", port))
    cons_s, _ = lst.accept()
    prod_c = socket.create_connection(("127.0.0.1", port))
    prod_s, _ = lst.accept()
    for s in (cons_c, cons_s, prod_c, prod_s):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    shm = mmap.mmap(-1, 4096)
    a, b = os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)
    roles = {3: [lambda: reader(prod_s, shm, a), lambda: dispatcher(a, shm, b),
                 lambda: writer(b, shm, cons_s, prod_s)],
             2: [lambda: reader_dispatcher(prod_s, shm, b), lambda: writer(b, shm, cons_s, prod_s)],
             1: [lambda: alone(prod_s, cons_s)]}[o.hops]
    pids = []
    for role in roles:
        pid = os.fork()
        if pid == 0:
            try:
                role()
            finally:
                os._exit(0)
        pids.append(pid)
    consumer = os.fork()
    if consumer == 0:  # reads its MESSAGEs as they come
        cons_c.setblocking(True)
        while cons_c.recv(65536):
            pass
        os._exit(0)
    before = [cpu(p) for p in pids]
    n = 0
    end = time.monotonic() + o.seconds
    while time.monotonic() < end:
        prod_c.sendall(FRAME)
        prod_c.recv(65536)
        n += 1
    after = [cpu(p) for p in pids]
    for pid in pids + [consumer]:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    user = sum(x[0] - y[0] for x, y in zip(after, before))
    system = sum(x[1] - y[1] for x, y in zip(after, before))
    print(f"hops={o.hops} messages={n} ({n / o.seconds:.0f}/s): relay CPU {1e6 * (user + system) / n:.1f} µs per "
          f"message (user {1e6 * user / n:.1f}, system {1e6 * system / n:.1f}); load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
