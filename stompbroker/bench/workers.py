"""Worker processes of the load generator: producers, consumers, idle holders.

Each worker is a forked process that talks to the coordinator through one Pipe:
``("ready", info)`` once its connections are set up, then ``("result", dict)`` at the end, or
``("error", text)`` at any point. The coordinator publishes the start time (``shared.t0``,
time.monotonic, the same clock in every process on Linux) and the stop flag in shared memory;
workers publish their running count in ``shared.counts[slot]`` for the progress bar and for the
producers' in-flight limit.

Hot paths: producers send pre-rendered batches (one send call per batch, ~64 KB); consumers read
with recv_into into one preallocated buffer and count frames with one bytes.count per read.
"""

from __future__ import annotations

import os
import select
import socket
import time
import traceback

from .flowctl import BurstWindow, burst_frames
from .stats import BIN
from .wire import TOKEN, BenchError, Link, TokenCounter, TsScanner, make_body, stomp_frame, ws_frame

RECV_SIZE = 256 * 1024


class Shared:
    """Shared-memory state between the coordinator and the workers (made before forking)."""

    def __init__(self, ctx, slots: int):
        self.counts = ctx.RawArray("d", max(slots, 1))
        self.t0 = ctx.RawValue("d", 0.0)
        self.stop = ctx.RawValue("i", 0)


def _title(text: str) -> None:
    try:
        from setproctitle import setproctitle
        setproctitle(f"bench: {text}")
    except ImportError:
        pass


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _wait_start(shared: Shared) -> float:
    """Block until the coordinator has set t0, then until t0; return t0 (or 0 if stopped)."""
    while not shared.t0.value:
        if shared.stop.value:
            return 0.0
        time.sleep(0.002)
    t0 = shared.t0.value
    delay = t0 - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    return t0


def _bin(bins: list, t0: float, now: float, n: int) -> None:
    i = int((now - t0) / BIN)
    if i < 0:
        i = 0
    while len(bins) <= i:
        bins.append(0)
    bins[i] += n


def run_worker(kind: str, spec: dict, shared: Shared, slot: int, conn) -> None:
    """Process entry point."""
    _title(f"{kind}-{slot}")
    try:
        if kind == "producer":
            result = Producer(spec, shared, slot, conn).run()
        elif kind == "consumer":
            result = Consumer(spec, shared, slot, conn).run()
        elif kind == "idle":
            result = IdleHolder(spec, shared, slot, conn).run()
        else:
            raise ValueError(kind)
        conn.send(("result", result))
    except BenchError as exc:
        conn.send(("error", f"{kind} {slot}: {exc}"))
    except OSError as exc:  # refused, reset...: the broker is gone or refuses connections
        conn.send(("error", f"{kind} {slot}: {exc!r}"))
    except Exception as exc:  # report, do not hang the coordinator
        conn.send(("error", f"{kind} {slot}: {exc!r}\n{traceback.format_exc()}"))
    finally:
        conn.close()


# -- producer ----------------------------------------------------------------------------------
class Worker:
    """A benchmark process's job: its spec, the shared counters, its slot in them, its control pipe."""

    def __init__(self, spec, shared, slot, conn):
        self.spec = spec
        self.shared = shared
        self.slot = slot
        self.conn = conn


class Producer(Worker):
    """Sends SEND frames all-out (pre-rendered batches) or at a fixed rate (open loop, timestamped).

    spec keys: target, transport, destination, size, duration, mode ("allout" | "paced" | "lone"), rate,
    flow (flowctl.flow_spec: "bursts" of burst_bytes with at most `bursts` unreceipted, or
    "window"), batch_bytes, window (frames in flight between receipts, 0 = none), receipt_each
    (every SEND asks for a receipt), receipts (paced: every SEND asks for a receipt, timed),
    headers (extra SEND headers), final (final SEND with a receipt on
    end_destination, waited for), end_destination, consumer_slots, fan (deliveries per SEND that
    the consumers should see), max_inflight (deliveries sent but not yet counted), grace.
    """

    def __init__(self, spec, shared, slot, conn):
        super().__init__(spec, shared, slot, conn)
        self.receipts = TokenCounter(b"RECEIPT")
        self.receipts_total = 0
        self.final_seen = False
        self.tail = b""
        self.receipt_ts: TsScanner | None = None   # paced runs: receipt-id is the scheduled time
        self.receipt_lat_ns: list[int] = []
        self.bursts: BurstWindow | None = None

    def run(self) -> dict:
        spec = self.spec
        link = Link(spec["target"], spec["transport"]).open()
        link.stomp_connect()
        self.link = link
        sock = link.sock
        sock.setblocking(False)
        unread = link.unread()
        if unread:
            self.receipts_total += self._count_receipts(unread)
        self.conn.send(("ready", {"version": link.version}))
        t0 = _wait_start(self.shared)
        if not t0:
            return {"sent": 0, "aborted": True}
        cpu0 = _cpu()
        if spec["mode"] == "paced":
            out = self._paced(sock, t0)
        elif spec["mode"] == "lone":
            out = self._lone(sock, t0)
        else:
            out = self._allout(sock, t0)
        out["t_last_send"] = time.monotonic()
        if spec.get("final", True):
            self._final(sock, link)
        out["t_done"] = time.monotonic()
        out["cpu_s"] = _cpu() - cpu0
        out["receipt_latency_ns"] = self.receipt_lat_ns
        out["t0"] = t0
        link.close()
        return out

    # incoming: RECEIPT frames (and an ERROR if something went wrong)
    def _drain(self, sock, block_until: float | None = None) -> int:
        """Read what the broker sent (non-blocking socket); return receipts counted.

        With block_until, first wait (up to then) for something to arrive."""
        got = 0
        if block_until is not None:
            left = block_until - time.monotonic()
            if left <= 0:
                return 0
            r, _, _ = select.select([sock], [], [], left)
            if not r:
                return 0
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return got
            if not data:
                raise BenchError("the broker closed the producer connection")
            n = self._count_receipts(data)
            self.receipts_total += n
            if self.receipt_ts is not None:
                now_ns = time.monotonic_ns()
                self.receipt_lat_ns += [now_ns - ts for ts in self.receipt_ts.feed(data)]
            got += n

    def _count_receipts(self, data: bytes) -> int:
        buf = bytearray(self.receipts.carry) + data
        n = buf.count(b"RECEIPT")
        self.receipts.carry = bytes(buf[-(len(b"RECEIPT") - 1):])
        window = self.tail + data
        if b"bench-final" in window:
            self.final_seen = True
        if b"ERROR\n" in window:
            raise BenchError(f"ERROR from broker: {window[window.find(b'ERROR'):][:300]!r}")
        self.tail = window[-16:]
        return n

    def _send(self, sock, data, hard_deadline: float) -> None:
        """Send everything (non-blocking socket, waiting for room), within the hard deadline."""
        view = memoryview(data)
        off, n = 0, len(data)
        while off < n:
            try:
                off += sock.send(view[off:])
                continue
            except (BlockingIOError, InterruptedError):
                pass
            left = hard_deadline - time.monotonic()
            if left <= 0 or self.shared.stop.value:
                raise BenchError("could not send within the time bound (broker not reading?)")
            select.select([], [sock], [], min(left, 0.5))

    def _allout(self, sock, t0: float) -> dict:
        spec = self.spec
        body = make_body(spec["size"])
        headers = [("destination", spec["destination"]), *spec.get("headers", [])]
        wire = self.link.wrap
        plain = wire(stomp_frame("SEND", headers, body))
        with_receipt = wire(stomp_frame("SEND", headers + [("receipt", "w")], body))
        flow = spec.get("flow") or {"mode": "window"}
        window = spec.get("window", 0)
        each = spec.get("receipt_each", False)
        bursts = BurstWindow(flow["bursts"]) if flow["mode"] == "bursts" and not each else None
        self.bursts = bursts
        if bursts:
            per = burst_frames(len(plain), len(with_receipt), flow["burst_bytes"])
        else:
            per = max(spec.get("batch_bytes", 65536) // len(plain), 1)
        cap = spec.get("max_inflight", 0)
        fan = spec.get("fan", 0)
        if cap and fan:
            per = max(min(per, cap // (2 * fan)), 1)  # one batch must not overshoot the in-flight limit
        if bursts:
            batch = plain * (per - 1) + with_receipt
        elif each:
            per = max(min(per, window // 4), 1)
            batch = with_receipt * per
        elif window:
            per = min(per, max(window // 4, 1))
            batch = plain * (per - 1) + with_receipt
        else:
            batch = plain * per
        asked_per_batch = 0 if bursts else per if each else (1 if window else 0)
        end = t0 + spec["duration"]
        hard = end + spec.get("grace", 30.0)
        slots = spec.get("consumer_slots", [])
        counts = self.shared.counts
        sent = batches = 0
        bins: list = []
        asked = 0
        stalled = 0.0
        while True:
            now = time.monotonic()
            if now >= end or self.shared.stop.value:
                break
            if bursts:
                # At most `bursts` bursts unreceipted: the way real producers wait for confirmation.
                bursts.receipted(self._drain(sock))
                while not bursts.room():
                    t = time.monotonic()
                    if t >= hard or self.shared.stop.value:
                        raise BenchError("receipts stopped coming back")
                    bursts.receipted(self._drain(sock, block_until=min(t + 0.05, hard)))
                    stalled += time.monotonic() - t
            elif asked_per_batch:
                # Receipt window: at most `window` frames sent and not yet confirmed.
                self._drain(sock)
                while (asked - self.receipts_total) * (per // asked_per_batch) >= window:
                    t = time.monotonic()
                    if t >= hard or self.shared.stop.value:
                        raise BenchError("receipts stopped coming back")
                    self._drain(sock, block_until=min(t + 0.05, hard))
                    stalled += time.monotonic() - t
            if cap and slots and fan:
                # End-to-end limit: deliveries sent but not counted by the consumers yet.
                t = time.monotonic()
                while sent * fan - sum(counts[i] for i in slots) > cap:
                    if time.monotonic() >= end or self.shared.stop.value:
                        break
                    time.sleep(0.001)
                stalled += time.monotonic() - t
            self._send(sock, batch, hard)
            if bursts:
                bursts.sent()
            sent += per
            batches += 1
            asked += asked_per_batch
            counts[self.slot] = sent
            _bin(bins, t0, time.monotonic(), per)
        return {"sent": sent, "batches": batches, "frames_per_batch": per, "bins": bins,
                "bytes_sent": batches * len(batch), "stalled_s": stalled}

    def _lone(self, sock, t0: float) -> dict:
        """One SEND in flight: each asks for a receipt (its own id), and the next goes once the RECEIPT
        is back and the consumers have counted the MESSAGE (every process of the broker sleeps in
        between)."""
        spec = self.spec
        # each with a receipt id of its own, as clients number them (a constant one would let the
        # broker's caches of heads and MESSAGE blocks hit on every message)
        head, tail = stomp_frame("SEND", [("destination", spec["destination"]), *spec.get("headers", []),
                                          ("receipt", "\x01")], make_body(spec["size"])).split(b"\x01")
        wrap = self.link.wrap
        end = t0 + spec["duration"]
        hard = end + spec.get("grace", 30.0)
        slots = spec.get("consumer_slots", [])
        fan = spec.get("fan", 0)
        counts = self.shared.counts
        sent = 0
        bins: list = []
        self._drain(sock)
        nbytes = 0
        while time.monotonic() < end and not self.shared.stop.value:
            frame = wrap(head + str(sent).encode() + tail)
            self._send(sock, frame, hard)
            nbytes += len(frame)
            sent += 1
            counts[self.slot] = sent
            goal = self.receipts_total + 1
            while self.receipts_total < goal:
                if time.monotonic() >= hard or self.shared.stop.value:
                    raise BenchError("receipts stopped coming back")
                self._drain(sock, block_until=min(time.monotonic() + 0.05, hard))
            while fan and slots and sum(counts[i] for i in slots) < sent * fan:
                if time.monotonic() >= hard or self.shared.stop.value:
                    raise BenchError("deliveries stopped coming")
                time.sleep(0.00005)  # (rare: the MESSAGE is written before the RECEIPT)
            _bin(bins, t0, time.monotonic(), 1)
        return {"sent": sent, "bins": bins, "bytes_sent": nbytes}

    def _paced(self, sock, t0: float) -> dict:
        """Open loop: message i is due at t0 + i/rate and carries that time, whatever happens."""
        spec = self.spec
        rate = float(spec["rate"])
        body = make_body(spec["size"])
        extra = "".join(f"{k}:{v}\n" for k, v in spec.get("headers", []))
        prefix = f"SEND\ndestination:{spec['destination']}\n{extra}bench-ts:".encode()
        suffix = f"\ncontent-length:{len(body)}\n\n".encode() + body + b"\0"
        receipts = spec.get("receipts", False)
        if receipts:
            # receipt:<scheduled time>: the receipt's round trip is timed from when the SEND was due.
            self.receipt_ts = TsScanner("receipt-id")
        ws = self.link.ws
        t0_ns = int(t0 * 1e9)
        interval_ns = 1e9 / rate
        total = int(spec["duration"] * rate)
        hard = t0 + spec["duration"] + spec.get("grace", 30.0)
        counts = self.shared.counts
        i = 0
        bins: list = []
        max_lag = 0.0
        sends = 0
        while i < total and not self.shared.stop.value:
            now_ns = time.monotonic_ns()
            due = min(int((now_ns - t0_ns) / interval_ns) + 1, total)
            if due > i:
                parts = []
                for k in range(i, due):
                    ts = str(t0_ns + int(k * interval_ns)).encode()
                    frame = prefix + ts + (b"\nreceipt:" + ts if receipts else b"") + suffix
                    parts.append(ws_frame(frame) if ws else frame)
                lag = (now_ns - (t0_ns + i * interval_ns)) / 1e9
                max_lag = max(max_lag, lag)
                self._send(sock, b"".join(parts), hard)
                sends += 1
                _bin(bins, t0, time.monotonic(), due - i)
                i = due
                counts[self.slot] = i
                if spec.get("window") or receipts:
                    self._drain(sock)
            next_ns = t0_ns + i * interval_ns
            delay = (next_ns - time.monotonic_ns()) / 1e9
            if delay > 0:
                if receipts:  # wait for the next due time or a receipt, whichever comes first
                    self._drain(sock, block_until=time.monotonic() + delay)
                else:
                    time.sleep(delay)
        return {"sent": i, "bins": bins, "max_lag_s": max_lag, "send_calls": sends}

    def _final(self, sock, link) -> None:
        """A last SEND with a receipt: once it is back, the broker has processed every SEND before it."""
        frame = stomp_frame("SEND", [("destination", self.spec["end_destination"]), ("receipt", "bench-final")])
        hard = time.monotonic() + self.spec.get("grace", 30.0)
        # Not beside an unreceipted burst: the flow control's bound holds for the final SEND too.
        while self.bursts is not None and self.bursts.in_flight and not self.final_seen:
            if time.monotonic() >= hard or self.shared.stop.value:
                raise BenchError("receipts stopped coming back")
            self.bursts.receipted(self._drain(sock, block_until=min(time.monotonic() + 0.1, hard)))
        self._send(sock, link.wrap(frame), hard)
        while not self.final_seen:
            if time.monotonic() >= hard or self.shared.stop.value:
                raise BenchError("no receipt for the final SEND within the time bound")
            self._drain(sock, block_until=min(time.monotonic() + 0.1, hard))


# -- consumer ----------------------------------------------------------------------------------
class Consumer(Worker):
    """Holds connections with subscriptions and counts what arrives.

    spec keys: target, transport, links (list of lists of (destination, id, extra headers)),
    mode ("count" | "latency").
    """

    def run(self) -> dict:
        spec = self.spec
        ws = spec["transport"] == "ws"
        latency = spec.get("mode") == "latency"
        links = []
        for i, subs in enumerate(spec["links"]):
            link = Link(spec["target"], spec["transport"], timeout=30.0).open()
            link.stomp_connect()
            for j, (dest, sub_id, extra) in enumerate(subs):
                last = j == len(subs) - 1
                link.subscribe(dest, sub_id, extra, receipt=f"sub-{i}" if last else None)
            links.append(link)
        for i, link in enumerate(links):
            link.wait_receipt(f"sub-{i}", timeout=30.0)
        self.conn.send(("ready", {"connections": len(links)}))

        carry_len = len(TOKEN) - 1 if ws else 0
        buf = bytearray(RECV_SIZE + carry_len)
        mv = memoryview(buf)
        ep = select.epoll()
        state = {}
        for link in links:
            link.sock.setblocking(False)
            st = {"link": link, "count": 0, "bytes": 0, "counter": TokenCounter() if ws else None,
                  "scanner": TsScanner() if latency else None, "closed": None, "tail": b""}
            state[link.sock.fileno()] = st
            ep.register(link.sock.fileno(), select.EPOLLIN)
        lat_ns: list = []
        t0 = _wait_start(self.shared)
        cpu0 = _cpu()
        # Bytes read during set-up after the receipt (normally none) count too.
        total = 0
        for st in state.values():
            raw = st["link"].unread()
            if raw:
                c = st["counter"].feed(raw) if ws else raw.count(b"\0")
                st["count"] += c
                st["bytes"] += len(raw)
                total += c
        counts = self.shared.counts
        stop = self.shared.stop
        bins: list = []
        t_first = t_last = 0.0
        open_fds = len(state)
        while not stop.value and open_fds:
            events = ep.poll(0.05)
            if not events:
                continue
            now = time.monotonic()
            got = 0
            for fd, _ in events:
                st = state[fd]
                sock = st["link"].sock
                try:
                    if ws:
                        counter = st["counter"]
                        counter.prepare(buf)
                        n = sock.recv_into(mv[carry_len:])
                    else:
                        n = sock.recv_into(mv)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    n = 0
                    st["closed"] = f"read error: {exc}"
                if not n:
                    st["closed"] = st["closed"] or f"closed by the broker; last bytes {st['tail']!r}"
                    ep.unregister(fd)
                    open_fds -= 1
                    continue
                c = counter.count(buf, n) if ws else buf.count(b"\0", 0, n)
                st["count"] += c
                st["bytes"] += n
                st["tail"] = bytes(mv[max(carry_len + n - 200, 0):carry_len + n])
                got += c
                if latency:
                    now_ns = time.monotonic_ns()
                    for ts in st["scanner"].feed(mv[carry_len:carry_len + n]):
                        lat_ns.append(now_ns - ts)
            if got:
                total += got
                counts[self.slot] = total
                if not t_first:
                    t_first = now
                t_last = now
                _bin(bins, t0, now, got)
        cpu = _cpu() - cpu0
        for st in state.values():
            st["link"].close()
        return {
            "delivered": total,
            "per_link": [st["count"] for st in state.values()],
            "bytes": sum(st["bytes"] for st in state.values()),
            "closed": [st["closed"] for st in state.values() if st["closed"]],
            "t0": t0, "t_first": t_first, "t_last": t_last, "bins": bins, "cpu_s": cpu,
            "latency_ns": lat_ns,
        }


# -- idle connections --------------------------------------------------------------------------
class IdleHolder(Worker):
    """Opens many STOMP connections (TCP), keeps them idle until told to stop.

    spec keys: target, n, in_flight (connection attempts at once), timeout.
    """

    def run(self) -> dict:
        spec = self.spec
        target = spec["target"]
        host, port, _ = target.address("tcp")
        connect = stomp_frame("CONNECT", target.connect_headers())
        n = spec["n"]
        in_flight = spec.get("in_flight", 200)
        deadline = time.monotonic() + spec.get("timeout", 60.0)
        ep = select.epoll()
        pending: dict[int, list] = {}   # fd -> [sock, phase, data]
        done: list[socket.socket] = []
        failed = 0
        errors: dict[str, int] = {}
        started = 0
        t_start = time.monotonic()
        while (started < n or pending) and time.monotonic() < deadline and not self.shared.stop.value:
            while started < n and len(pending) < in_flight:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex((host, port))
                pending[s.fileno()] = [s, "connecting", b""]
                ep.register(s.fileno(), select.EPOLLOUT)
                started += 1
            for fd, ev in ep.poll(0.05):
                entry = pending.get(fd)
                if entry is None:
                    continue
                s = entry[0]
                if entry[1] == "connecting":
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        errors[os.strerror(err)] = errors.get(os.strerror(err), 0) + 1
                        failed += 1
                        ep.unregister(fd)
                        del pending[fd]
                        s.close()
                        continue
                    s.send(connect)
                    entry[1] = "connected?"
                    ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    data = s.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    data = b""
                    errors[str(exc)] = errors.get(str(exc), 0) + 1
                entry[2] += data
                if b"CONNECTED" in entry[2] and b"\0" in entry[2]:
                    ep.unregister(fd)
                    del pending[fd]
                    done.append(s)
                elif not data or b"ERROR" in entry[2]:
                    if b"ERROR" in entry[2]:
                        key = entry[2][:120].decode(errors="replace")
                        errors[key] = errors.get(key, 0) + 1
                    failed += 1
                    ep.unregister(fd)
                    del pending[fd]
                    s.close()
            self.shared.counts[self.slot] = len(done)
        failed += len(pending)
        for entry in pending.values():
            entry[0].close()
        elapsed = time.monotonic() - t_start
        self.conn.send(("ready", {"open": len(done), "failed": failed, "seconds": elapsed, "errors": errors}))
        # Hold the connections (reading nothing: the broker sends nothing to idle STOMP clients).
        while not self.shared.stop.value:
            time.sleep(0.05)
        closed_by_broker = 0
        for s in done:
            try:
                if s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    closed_by_broker += 1
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed_by_broker += 1
            s.close()
        return {"open": len(done), "failed": failed, "seconds": elapsed, "errors": errors,
                "closed_by_broker": closed_by_broker}
