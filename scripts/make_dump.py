"""Produce a realistic statistics dump: start the broker with diag_dump, drive a mixed load, stop.

    .venv/bin/python scripts/make_dump.py --out out/diag/diag.jsonl --duration 60

The load, paced per second and bounded in time, through the package's own client:
- topic fan-out: one publisher to /topic/load/news with 4 TCP subscribers and 1 WebSocket subscriber;
- a work queue: one producer to /queue/load/jobs, 3 consumers acknowledging each message;
- connection churn: a client that connects, sends one message and disconnects, five times a second.

Next to the dump it writes ``<out>.load.json`` with what the load sent and received, which the tests
compare with what the analysis reports. The broker is stopped (SIGTERM) two intervals after the
load ends, so the last dump line holds every count.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from stompbroker.readiness import NotReady, wait_ready  # noqa: E402
from stompbroker.tools.client import StompClient  # noqa: E402

TOPIC = "/topic/load/news"
QUEUE = "/queue/load/jobs"


class Load:
    def __init__(self, port: int, rate: int, duration: float):
        self.port = port
        self.rate = rate
        self.duration = duration
        self.lock = threading.Lock()
        self.counts = {"messages_sent": 0, "topic_sent": 0, "queue_sent": 0, "churn_sent": 0,
                       "topic_received": 0, "queue_received": 0, "connections": 0}
        self.stop = threading.Event()

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def client(self, ws: bool = False) -> StompClient:
        self.add("connections")
        if ws:
            return StompClient.connect(ws_url=f"ws://127.0.0.1:{self.port}/stomp")
        return StompClient.connect("127.0.0.1", self.port)

    def publisher(self, destination: str, counter: str, rate: int) -> None:
        c = self.client()
        start = time.monotonic()
        sent = 0
        while time.monotonic() - start < self.duration:
            due = int((time.monotonic() - start) * rate)
            batch = due - sent
            for i in range(sent, due):
                c.send(destination, f"{counter} {i}".encode(), flush=False)
            sent = due
            c.flush()
            self.add(counter, batch)
            self.add("messages_sent", batch)
            time.sleep(0.01)
        c.disconnect()  # its receipt: every SEND was processed

    def subscriber(self, destination: str, counter: str, ws: bool = False, ack: str = "auto") -> None:
        c = self.client(ws)
        c.subscribe(destination, "s", ack=ack)
        self.ready.release()
        while True:
            frame = c.read_frame(0.2)
            if frame is None:
                if self.stop.is_set():
                    break
                continue
            if ack != "auto":
                c.ack(frame)
            self.add(counter)
        c.disconnect()

    def churn(self) -> None:
        start = time.monotonic()
        while time.monotonic() - start < self.duration:
            c = self.client()
            c.send("/topic/load/churn", b"hello", receipt=True)
            c.disconnect()
            self.add("churn_sent")
            self.add("messages_sent")
            time.sleep(0.2)

    def run(self, progress) -> dict:
        subscribers = [(TOPIC, "topic_received", False, "auto")] * 4 + [(TOPIC, "topic_received", True, "auto")]
        subscribers += [(QUEUE, "queue_received", False, "client-individual")] * 3
        self.ready = threading.Semaphore(0)
        readers = [threading.Thread(target=self.subscriber, args=args, daemon=True) for args in subscribers]
        for t in readers:
            t.start()
        for _ in readers:
            self.ready.acquire(timeout=10)
        writers = [threading.Thread(target=self.publisher, args=(TOPIC, "topic_sent", self.rate), daemon=True),
                   threading.Thread(target=self.publisher, args=(QUEUE, "queue_sent", self.rate // 2), daemon=True),
                   threading.Thread(target=self.churn, daemon=True)]
        start = time.monotonic()
        for t in writers:
            t.start()
        while any(t.is_alive() for t in writers):
            progress(min(time.monotonic() - start, self.duration), self.duration, self.counts["messages_sent"])
            time.sleep(0.5)
        expected_topic = self.counts["topic_sent"] * 5
        expected_queue = self.counts["queue_sent"]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (self.counts["topic_received"] < expected_topic
                                               or self.counts["queue_received"] < expected_queue):
            time.sleep(0.1)
        self.stop.set()
        for t in readers:
            t.join(10)
        progress(self.duration, self.duration, self.counts["messages_sent"])
        return dict(self.counts)


def progress_bar(done: float, total: float, sent: int) -> None:
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done:5.1f}/{total:.0f} s  {sent} sent")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/diag/diag.jsonl", help="the dump file (rotated files beside it)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--rate", type=int, default=1000, help="topic messages per second (the queue gets half)")
    parser.add_argument("--interval", type=int, default=1000, help="diag_interval of the broker, ms")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("broker_settings", nargs="*", help="more key=value settings for the broker")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    log_path = args.out + ".broker.log"
    ready_path = args.out + ".ready.json"
    with open(log_path, "wb") as log:
        broker = subprocess.Popen([sys.executable, "-m", "stompbroker", "port=0", "processors=4",
                                   f"diag_dump={args.out}", f"diag_interval={args.interval}",
                                   f"ready_file={ready_path}", *args.broker_settings],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        try:
            port = wait_ready(ready_path, broker, timeout=20)["port"]
        except NotReady as exc:
            raise SystemExit(f"{exc}: see {log_path}") from None
        counts = Load(port, args.rate, args.duration).run(lambda *a: None if args.quiet else progress_bar(*a))
        time.sleep(2.5 * args.interval / 1000)  # the last interval's line, then stop
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(broker.pid, signal.SIGKILL)
    with open(args.out + ".load.json", "w") as f:
        json.dump(counts, f, indent=1)
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
