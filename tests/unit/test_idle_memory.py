"""What one idle connection costs in each process, in Python objects (tracemalloc, in-process).

The broker's budget is 1 KB per idle connection summed over its processes (measured as PSS by
``stompbroker-bench --scenario idle``); these budgets keep each process's own share from creeping
back: per-connection objects are slotted, and containers, parsers and buffers an idle connection
does not use are not made (or are dropped once empty).
"""

from __future__ import annotations

import gc
import os
import socket
import time
import tracemalloc

from inprocess import resources  # noqa: F401 (a fixture)
from stompbroker.bench.procs import BrokerProcs
from stompbroker.broker import model
from stompbroker.broker.core import Broker
from stompbroker.ipc import records as R
from stompbroker.ipc.outbox import Outbox
from stompbroker.ipc.ring import Ring
from stompbroker.processes import common, reader, writer
from stompbroker.protocol.proxy import peer_text
from stompbroker.protocol.stomp import render_frame
from stompbroker.settings import make_config

N = 500
WARM = 16   # connections made before the count starts (see the tests)
CONNECT = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nheart-beat:0,0"


def per_connection(make, n: int = N) -> float:
    """Bytes still allocated after ``make()`` (which opens n connections), per connection; what the
    test itself allocates (its clients' sockets) is left out."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = make()
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    ignore = [tracemalloc.Filter(False, __file__), tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap*")]
    diff = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "filename")
    del kept
    return sum(stat.size_diff for stat in diff) / n


def test_dispatcher_session_of_an_idle_connection_is_small():
    broker = Broker(make_config(), [Outbox(0)])

    def make():
        for conn in range(1 << 40, (1 << 40) + N):
            # (the peer text made outside this file, as the dispatcher decodes it: it counts)
            broker.on_open(conn, 0, peer_text("127.0.0.1", conn % 60000 + 1024), 1.0)
            broker.on_stomp(conn)  # (the reader saw it speak STOMP: its connect timeout runs)
        for conn in range(1 << 40, (1 << 40) + N):
            broker.on_frame(conn, CONNECT, b"", 1.0)
        broker.outboxes[0].take()
        return None

    cost = per_connection(make)
    assert len(broker.sessions) == N and all(s.connected for s in broker.sessions.values())
    # A slotted Session (20 slots, 192 B), its peer packed into an int (32 B; the text is 64) and
    # its entry in Broker.sessions (its id comes from this test, left out); no dicts, lists or
    # deques of its own, no id string, no SessionMore, no table of Broker.timed kept at the size
    # the storm of unconnected sessions grew it to (an empty deque alone was 760 B; the whole was
    # 1.46 KB, then 359 B with 28 slots and the peer text; that table was 65 B more).
    assert cost < 275, f"{cost:.0f} bytes per idle session"   # (263 here)
    assert session_more_free(broker)


def session_more_free(broker) -> bool:
    return all(session.more is None for session in broker.sessions.values())


def test_a_session_s_rare_fields_and_peer_read_as_they_were_set():
    broker = Broker(make_config(), [Outbox(0)])
    broker.on_open(1, 0, "10.1.2.3:61613", 1.0, tls=True)
    broker.on_open(2, 0, "::1:40000", 1.0)
    broker.on_open(3, 0, "010.1.2.3:5", 1.0)   # not as peer_text writes it: kept as text
    one, two, three = (broker.sessions[conn] for conn in (1, 2, 3))
    assert (one.peer, one.address, two.peer, two.address, three.peer) == (
        "10.1.2.3:61613", "10.1.2.3", "::1:40000", "::1", "010.1.2.3:5")
    assert type(one._peer) is int and one.tls and not two.tls and two.more is None
    broker.on_peer(2, "192.168.0.9:1")
    assert two.peer == "192.168.0.9:1"
    broker.on_frame(2, b"CONNECT\naccept-version:1.2\nhost:/\nheart-beat:1000,0\nclient-id:c7", b"", 1.0)
    assert (two.client_id, two.hb_in, two.written_final) == ("c7", 1000, False)
    broker.on_frame(3, CONNECT + b"\nlogin:guest", b"", 1.0)
    assert (three.client_id, three.hb_in, three.tls, three.more) == ("guest", 0, False, None)
    assert three.id == f"{broker.token}-3" and one.id == ""
    # A frame's gate: a login check under way, or a console session's end; never both.
    assert (one.pending, one.console_until, one.gate) == (None, 0.0, None)
    one.pending = ("1.2", 0, 0, {}, [])
    assert one.pending == ("1.2", 0, 0, {}, []) and one.console_until == 0.0
    one.pending = None
    one.console_until = 5.0
    assert (one.pending, one.console_until) == (None, 5.0)
    one.pending = None   # (no login check to drop: the console's end stays)
    assert one.console_until == 5.0


def test_a_session_gives_back_its_containers_once_empty():
    broker = Broker(make_config(), [Outbox(0)])
    broker.on_open(1, 0, "127.0.0.1:1", 1.0)
    broker.on_frame(1, CONNECT, b"", 1.0)
    session = broker.sessions[1]
    broker.on_frame(1, b"SUBSCRIBE\nid:s\ndestination:/queue/a", b"", 1.0)
    broker.on_frame(1, b"BEGIN\ntransaction:t", b"", 1.0)
    broker.on_frame(1, b"SEND\ndestination:/queue/a", b"x", 1.0)
    assert len(session.subs) == 1 and len(session.transactions) == 1 and len(session.inflight) == 1
    broker.on_written(1, 1)  # the writer sent the queue delivery
    broker.on_frame(1, b"COMMIT\ntransaction:t", b"", 1.0)
    broker.on_frame(1, b"UNSUBSCRIBE\nid:s", b"", 1.0)
    shared = model.NO_ENTRIES
    assert session.subs is shared and session.transactions is shared and session.inflight == ()
    buf, count = broker.outboxes[0].take()
    assert count == 2 and b"ERROR" not in buf  # CONNECTED and the MESSAGE


def test_reader_connection_of_an_idle_client_is_small(resources):
    config, res = resources
    r = reader.Reader(config, res)
    r.listener.setblocking(False)
    handed = res.fd_pairs[0][1]  # where the sockets go to the (only) writer
    handed.setblocking(False)
    res.fd_pairs[0][0].settimeout(2.0)
    clients = [socket.socket() for _ in range(WARM + N)]  # made before the count starts: not the reader's

    def make(first: int, last: int):
        for i in range(first, last, 8):  # a few at a time: the writer's channel queues only a few sockets
            for client in clients[i:min(i + 8, last)]:
                client.connect(r.listener.getsockname())
                client.sendall(CONNECT + b"\n\n\0")
            r.accept(r.listener)
            while True:  # the writer's copies: not the reader's memory
                try:
                    _, fds, _, _ = socket.recv_fds(handed, 64, 64)
                except BlockingIOError:
                    break
                for fd in fds:
                    os.close(fd)
        assert len(r.conns) == last
        now = time.monotonic()
        for conn in list(r.conns.values())[first:]:
            r.read(conn, now)
        r.out, r.count = bytearray(), 0  # the records for the dispatcher
        return None

    try:
        make(0, WARM)   # what the first connections make once (the paths' own tables) is no connection's
        cost = per_connection(lambda: make(WARM, WARM + N))
        assert r.stats["frames_in"] == WARM + N  # every CONNECT was read
        # The Conn (slotted, 10 slots: its writer is told by its id, what a closing one drops is
        # counted apart) and its entries in Reader.conns; no socket object (a bare fd), no parser
        # (made when an unfinished frame must be kept), no selector key, no table of undecided
        # connections kept at the size their storm grew it (the whole was 0.58 KB, then 336 B with a
        # socket object, 249 B with the undecided table, 212 B with 12 slots).
        assert cost < 205, f"{cost:.0f} bytes per idle connection"   # (196 here)
        assert all(r.writer_of(conn) == 0 for conn in r.conns.values())  # (the only writer)
        assert all(type(conn.fd) is int for conn in r.conns.values())
        assert not any(isinstance(value, socket.socket) for conn in r.conns.values()
                       for value in (getattr(conn, name) for name in conn.__slots__))
    finally:
        for conn in r.conns.values():
            os.close(conn.fd)
        for client in clients:
            client.close()


def test_writer_connection_of_an_idle_client_is_small(resources):
    config, res = resources
    w = writer.Writer(0, config, res.output_rings[0], res.fd_pairs[0][1], res.writer_stats[0],
                      res.writer_latency[0])
    w.fd_sock.setblocking(False)
    pairs = [socket.socketpair() for _ in range(WARM + N)]  # made before the count starts: not the writer's
    connected = render_frame("CONNECTED", {"version": "1.2", "server": "stompbroker", "heart-beat": "0,0"})

    def make(first: int, last: int):
        for i in range(first, last, 8):  # a few at a time: the channel from the reader queues only a few
            for k, (_, theirs) in enumerate(pairs[i:min(i + 8, last)]):
                socket.send_fds(res.fd_pairs[0][0], [R.CONN_ID.pack(1000 + i + k)], [theirs.fileno()])
            w.adopt()
        assert len(w.conns) == last
        for c in list(w.conns.values())[first:]:  # each connection's CONNECTED, sent at once
            w.append(c, connected)
            w.flush(c)
        return None

    try:
        make(0, WARM)   # what the first connections make once (the paths' own tables) is no connection's
        cost = per_connection(lambda: make(WARM, WARM + N))
        assert all(ours.recv(1024) == connected for ours, _ in pairs)
        # The Conn (slotted, 14 slots) and its entry in Writer.conns; no socket object (a bare fd),
        # no batch list or buffer kept once everything is sent, no float of its own (its last write
        # is the loop's time), no deadline or heart-beat slots (the whole was 0.46 KB, then 345 B
        # with a socket object, 281 B with 16 slots and a float).
        assert cost < 255, f"{cost:.0f} bytes per idle connection"   # (241 here)
        assert not any(isinstance(getattr(c, name), socket.socket) for c in w.conns.values() for name in c.__slots__)
    finally:
        for c in w.conns.values():
            os.close(c.fd)
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


def test_the_rings_pages_of_idle_connections_are_few():
    """Each connection's OPEN and CONNECT (input ring) and CONNECTED (output ring) records, read as
    they come, touch the same few pages at the front of the rings, not fresh ones (the bench's
    "ring pages first touched": 262 B per connection, 2.6 MB for 10,000)."""
    config = make_config()
    input_bytes, output_bytes = config.ring_bytes
    rings = [Ring(input_bytes), Ring(output_bytes)]
    me = BrokerProcs(os.getpid(), "this process")
    try:
        before = me.shm_pss()
        peer = b"127.0.0.1:54321"
        connected = render_frame("CONNECTED", {"version": "1.2", "server": "stompbroker", "heart-beat": "0,0",
                                               "session": "0123456789abcdef-1099511627776"})
        n = 10_000
        for conn in range(1 << 40, (1 << 40) + n):
            assert rings[0].try_write(R.record(R.OPEN, conn, peer), 1) and rings[0].read()
            assert rings[0].try_write(R.record(R.FRAME, conn, CONNECT + b"\n\n", aux=len(CONNECT) + 2), 1)
            assert rings[0].read()
            assert rings[1].try_write(R.record(R.DATA, conn, connected), 1) and rings[1].read()
        cost = (me.shm_pss() - before) / n
        assert cost < 20, f"{cost:.0f} bytes of ring pages per idle connection"   # (14 here)
    finally:
        for ring in rings:
            ring.close()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_an_idle_process_gives_back_the_heap_it_freed():
    """What a connect storm or a burst made and freed stays resident otherwise (tune_malloc keeps up
    to 128 MB of free heap): a second after a loop's last work, IdleTrim gives it back, once."""
    trim = common.IdleTrim()
    blocks = [bytes(2000) for _ in range(20_000)]  # 40 MB of heap (malloc: larger than pymalloc's blocks)
    kept = blocks[::10]  # every tenth stays: what is freed is holes, which free() never gives back
    del blocks
    before = rss()
    trim.busy(10.0)
    assert trim.wait(10.25) == 0.75 and not trim.check(10.5)   # not yet a second idle
    assert trim.check(11.0) and trim.wait(11.0) is None and not trim.check(12.0)  # once
    assert before - rss() > 20 << 20, "the freed heap is still resident"
    del kept


def test_children_do_not_collect_what_they_inherited():
    """A full collection in a child would write to every object inherited from the supervisor,
    copying the pages they share (measured: 2-3 MB in each child, 2 MB more in the supervisor's
    share, once 10,000 connections had made objects enough for one)."""
    read_end, write_end = os.pipe()
    config = make_config()
    previous = common._supervisor_pid
    common._supervisor_pid = os.getpid()  # become_child checks its parent is the supervisor
    try:
        pid = os.fork()
        if pid == 0:  # the child
            try:
                common.become_child("test", config)
                os.write(write_end, str(gc.get_freeze_count()).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        frozen = int(os.read(read_end, 64) or b"0")
        os.waitpid(pid, 0)
    finally:
        common._supervisor_pid = previous
        os.close(read_end)
    assert frozen > 10_000  # every object the child inherited
