"""The broker as a Spark Structured Streaming source and sink: format ``stomp``, registered by
``register(spark)`` (Python Data Source API, no JVM code; docs/analysis.md, "Streaming").

Source, offsets the broker's own:
- a topic (``/topic/orders``, ``/topic/orders/*``) is read from the broker's replay log by sequence
  (``replay-from-seq``/``replay-to-seq``, broker/replayseq.py): the offset is the next sequence to
  read; the driver asks the broker for the log's end, executors read their ranges; a range read
  twice gives the same rows. It needs ``store=sqlite`` and messages the log keeps (sent
  ``persistent:true``, or matching a durable subscription) within ``replay_retention``.
- a queue (``/queue/jobs``) is consumed by the driver with ``client-individual`` acks: the offset
  counts the messages this query took; a batch's messages travel to the executors inside its
  partition and are acknowledged only in ``commit(end)``, once Spark has checkpointed the batch.
  Unacknowledged ones go back to the queue when the query dies and make up the batch it re-runs
  after a restart. One query per queue.

Sink: every row is a SEND with a receipt and a deterministic ``dedup-id`` (query id, batch id,
partition, row; or the ``dedupIdColumn`` column), so a batch Spark retries is stored once
(broker/dedup.py, within ``dedup_window``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import ssl
import sys
import time
from urllib.parse import urlsplit

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition, WriterCommitMessage

try:  # (Spark 4.1+: the rows come as Arrow batches, without a Row object each)
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _Writer
except ImportError:
    from pyspark.sql.datasource import DataSourceStreamWriter as _Writer
from pyspark.sql.types import (BinaryType, LongType, MapType, StringType, StructField, StructType, TimestampType)

from ..tools.client import BrokerError, StompClient

NAME = "stomp"
SCHEMA = StructType([
    StructField("destination", StringType()),
    StructField("message_id", StringType()),
    StructField("headers", MapType(StringType(), StringType())),
    StructField("body", BinaryType()),
    StructField("body_string", StringType()),   # body decoded as UTF-8 (invalid bytes replaced)
    StructField("timestamp", TimestampType()),  # when the broker accepted it (topics), or its timestamp header
    StructField("sequence", LongType()),        # replay-log sequence (topics); the query's offset (queues)
])
DROPPED = ("subscription", "ack", "content-length", "replayed", "replay-seq", "replay-ts")  # delivery, not message
READ_TIMEOUT = 60.0   # seconds a read may wait for the broker before the task fails
DEFAULT_MAX = 10_000  # queue messages one batch takes unless maxMessagesPerTrigger says


def register(spark) -> None:
    """Make ``spark.readStream.format("stomp")`` and ``df.writeStream.format("stomp")`` work.

    Spark runs the source and sink in Python workers, which need this package and pyarrow. They
    run ``PYSPARK_PYTHON`` (default ``python3``); when it is not set, an embedded or standalone
    session (not Spark Connect: its server has its own) is given this interpreter, which has them.
    On a cluster of several hosts, set ``PYSPARK_PYTHON`` to an interpreter that has them there."""
    sc = getattr(spark, "sparkContext", None) if not is_connect(spark) else None
    if sc is not None and not os.environ.get("PYSPARK_PYTHON") and not sc.getConf().get("spark.pyspark.python"):
        sc.pythonExec = sys.executable
    spark.dataSource.register(StompDataSource)


def is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


# -- options and connections (pure; unit-tested) ------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Options:
    url: str
    destination: str
    login: str | None
    passcode: str | None
    starting: str
    selector: str | None
    max_per_trigger: int | None
    partitions: int
    fail_on_data_loss: bool
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_verify: bool
    dedup_column: str | None
    persistent: bool
    poll: float
    live: bool

    @property
    def queue(self) -> bool:
        return self.destination.startswith("/queue/")


def parse_options(options: dict, env=os.environ) -> Options:
    """Spark's options (names case-insensitive) checked at once, with a message naming the option."""
    o = {k.lower(): v for k, v in options.items()}
    url = o.get("url", "stomp://127.0.0.1:61613")
    scheme = urlsplit(url).scheme
    if scheme not in ("stomp", "stomp+ssl", "ws", "wss"):
        raise ValueError(f"stomp: url must be stomp://, stomp+ssl://, ws:// or wss://, not {url!r}")
    starting = o.get("startingoffsets", "latest").lower()
    if starting not in ("earliest", "latest"):
        raise ValueError(f"stomp: startingOffsets must be earliest or latest, not {starting!r}")
    most = o.get("maxmessagespertrigger")
    return Options(
        url=url, destination=o.get("destination", ""),
        login=o.get("login", env.get("STOMPBROKER_LOGIN")),
        passcode=o.get("passcode", env.get("STOMPBROKER_PASSCODE")),
        starting=starting, selector=o.get("selector") or None,
        max_per_trigger=_positive(most, "maxMessagesPerTrigger") if most is not None else None,
        partitions=_positive(o.get("numpartitions", "1"), "numPartitions"),
        fail_on_data_loss=o.get("failondataloss", "true").lower() == "true",
        tls_ca=o.get("tls.ca"), tls_cert=o.get("tls.cert"), tls_key=o.get("tls.key"),
        tls_verify=o.get("tls.verify", "true").lower() == "true",
        dedup_column=o.get("dedupidcolumn"),
        persistent=o.get("persistent", "true").lower() == "true",
        poll=_positive(o.get("pollms", "200"), "pollMs") / 1000,
        live=_mode(o.get("mode", "exact")),
    )


def _mode(text: str) -> bool:
    if text.lower() not in ("exact", "live"):
        raise ValueError(f"stomp: mode must be exact or live, not {text!r}")
    return text.lower() == "live"


def _positive(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"stomp: {name} must be a positive whole number, not {text!r}")
    return value


def tls_context(opts: Options) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=opts.tls_ca)
    if not opts.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if opts.tls_cert:
        context.load_cert_chain(opts.tls_cert, opts.tls_key)
    return context


def connect(opts: Options) -> StompClient:
    parts = urlsplit(opts.url)
    tls = tls_context(opts) if parts.scheme in ("stomp+ssl", "wss") else None
    try:
        if parts.scheme in ("ws", "wss"):
            return StompClient.connect(ws_url=opts.url, login=opts.login, passcode=opts.passcode, timeout=10, tls=tls)
        return StompClient.connect(parts.hostname or "127.0.0.1", parts.port or 61613, login=opts.login,
                                   passcode=opts.passcode, timeout=10, tls=tls)
    except BrokerError as exc:  # (a bare "access refused" deep in a Spark stack trace says too little)
        who = f"login {opts.login!r}" if opts.login is not None else "no login"
        raise PermissionError(f"stomp: {opts.url} refused the connection with {who}: {exc.message or exc.detail}; "
                              "check the login and passcode options (or STOMPBROKER_LOGIN and "
                              "STOMPBROKER_PASSCODE where the query runs)") from None


def to_row(headers: dict, body: bytes, sequence: int):
    """A MESSAGE as a row of SCHEMA."""
    ts = headers.get("replay-ts") or headers.get("timestamp")
    try:
        when = datetime.datetime.fromtimestamp(int(ts) / 1000, datetime.timezone.utc) if ts else None
    except ValueError:
        when = None
    kept = {k: v for k, v in headers.items() if k not in DROPPED}
    return (headers.get("destination"), headers.get("message-id"), kept, bytes(body),
            body.decode("utf-8", "replace"), when or datetime.datetime.now(datetime.timezone.utc), sequence)


def split(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) cut into at most ``parts`` contiguous ranges."""
    if end <= start:
        return []
    size = -(-(end - start) // parts)
    return [(a, min(a + size, end)) for a in range(start, end, size)]


def dedup_id(query: str, batch: int | str, partition: int, row: int) -> str:
    return f"{query}:{batch}:{partition}:{row}"


# -- the data source ------------------------------------------------------------------------------
class StompDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return SCHEMA

    def streamReader(self, schema):
        opts = parse_options(self.options)
        if not opts.destination:
            raise ValueError("stomp: the source needs a destination option (/topic/... or /queue/...)")
        if opts.live:
            return LiveReader(opts)
        return QueueReader(opts) if opts.queue else TopicReader(opts)

    def streamWriter(self, schema, overwrite):
        return StompWriter(parse_options(self.options), [f.name for f in schema.fields])


@dataclasses.dataclass
class RangePartition(InputPartition):
    start: int
    stop: int


@dataclasses.dataclass
class RowsPartition(InputPartition):
    rows: list


def _max_rows(limit, opts: Options) -> int | None:
    rows = getattr(limit, "max_rows", None)
    if rows is not None:
        return rows
    return None if limit is not None else opts.max_per_trigger


class TopicReader(DataSourceStreamReader):
    """Offsets: {"seq": next replay-log sequence}."""

    def __init__(self, opts: Options):
        self.opts = opts

    def initialOffset(self) -> dict:
        if self.opts.starting == "earliest":
            return {"seq": 0}
        return {"seq": self._probe(0, 0)[0]}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        most = self.opts.max_per_trigger
        return ReadMaxRows(most) if most else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        start_seq = start["seq"] if start else 0
        most = _max_rows(limit, self.opts)
        following, first = self._probe(start_seq, 0 if most is None else most)
        if start_seq and first > start_seq and self.opts.fail_on_data_loss:
            raise RuntimeError(f"stomp: messages of {self.opts.destination} from sequence {start_seq} to {first - 1} "
                               "are no longer in the broker's replay log (replay_retention); failOnDataLoss=false "
                               "reads on from what is kept")
        return {"seq": max(following, start_seq)}

    def _probe(self, start: int, limit: int) -> tuple[int, int]:
        """(next sequence, first kept) from the broker; with ``limit`` reads that many rows to find it."""
        client = connect(self.opts)
        try:
            end = None
            for headers, _ in replay(client, self.opts, start, None, limit):
                end = headers
            return int(end["replay-next-seq"]), int(end["replay-first-seq"])
        finally:
            client.close()

    def partitions(self, start: dict, end: dict):
        return [RangePartition(a, b) for a, b in split(start["seq"], end["seq"], self.opts.partitions)]

    def read(self, partition: RangePartition):
        client = connect(self.opts)
        try:
            for headers, body in replay(client, self.opts, partition.start, partition.stop, None):
                if "replay-end" not in headers:
                    yield to_row(headers, body, int(headers["replay-seq"]))
        finally:
            client.close()


def replay(client: StompClient, opts: Options, start: int, stop: int | None, limit: int | None):
    """(headers, body) of the replay log's messages in [start, stop), then the end marker's."""
    headers = [("replay-from-seq", start)]
    if stop is not None:
        headers.append(("replay-to-seq", stop))
    if limit is not None:
        headers.append(("replay-limit", limit))
    if opts.selector:
        headers.append(("selector", opts.selector))
    client.subscribe(opts.destination, "replay", headers=headers)
    deadline = time.monotonic() + READ_TIMEOUT
    while True:
        frame = client.read_frame(timeout=max(deadline - time.monotonic(), 0.0))
        if frame is None:
            raise TimeoutError(f"stomp: no replay from {opts.url} within {READ_TIMEOUT:g} s")
        if frame.command != "MESSAGE" or frame.headers.get("replayed") != "true" and \
                frame.headers.get("replay-end") != "true":
            continue  # (live messages of the subscription: the log has them in order)
        yield frame.headers, frame.body
        if frame.headers.get("replay-end") == "true":
            return
        deadline = time.monotonic() + READ_TIMEOUT


class QueueReader(DataSourceStreamReader):
    """Offsets: {"taken": messages this query has taken from the queue}. The driver holds one
    client-individual subscription; its messages wait, unacknowledged, until commit."""

    ACK = "client-individual"

    def __init__(self, opts: Options):
        self.opts = opts
        self.client = None
        self.base = None     # offset of held[0]
        self.held = []       # (frame, row) in offset order, not yet acknowledged

    def __getstate__(self):  # (pickled to executors: they read from the partitions only)
        return {"opts": self.opts, "client": None, "base": None, "held": []}

    def _subscription(self) -> StompClient:
        if self.client is None:
            self.client = connect(self.opts)
            most = self.opts.max_per_trigger or DEFAULT_MAX
            headers = [("prefetch-count", 2 * most)]
            if self.opts.selector:
                headers.append(("selector", self.opts.selector))
            self.client.subscribe(self.opts.destination, "source", ack=self.ACK, headers=headers)
        return self.client

    def initialOffset(self) -> dict:
        return {"taken": 0}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        most = self.opts.max_per_trigger
        return ReadMaxRows(most) if most else ReadAllAvailable()

    def _take(self, count: int, wait: float) -> None:
        """Up to ``count`` more messages into held, waiting at most ``wait`` s for the first."""
        client = self._subscription()
        deadline = time.monotonic() + wait
        while count > 0:
            frame = client.read_frame(timeout=max(deadline - time.monotonic(), 0.0))
            if frame is None:
                return
            if frame.command != "MESSAGE":
                continue
            self.held.append((frame, to_row(frame.headers, frame.body, self.base + len(self.held))))
            count -= 1
            deadline = time.monotonic()  # after the first, only what has arrived already

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        start_n = start["taken"] if start else 0
        if self.base is None:
            self.base = start_n
        end = self.base + len(self.held)
        most = _max_rows(limit, self.opts) or DEFAULT_MAX
        room = start_n + most - end
        if room > 0:
            self._take(room, self.opts.poll)
        return {"taken": min(self.base + len(self.held), start_n + most)}

    def partitions(self, start: dict, end: dict):
        a, b = start["taken"], end["taken"]
        if b <= a:
            return []
        if self.base is None:  # a restarted query re-runs its last batch: the messages came back
            self.base = a
        if a < self.base:
            raise RuntimeError(f"stomp: batch from offset {a} was acknowledged already")
        missing = b - (self.base + len(self.held))
        deadline = time.monotonic() + READ_TIMEOUT
        while missing > 0 and time.monotonic() < deadline:
            self._take(missing, 1.0)
            missing = b - (self.base + len(self.held))
        if missing > 0:
            raise TimeoutError(f"stomp: {self.opts.destination} gave back {b - a - missing} of the {b - a} "
                               f"messages of the batch to re-run within {READ_TIMEOUT:g} s")
        return [RowsPartition([row for _, row in self.held[a - self.base:b - self.base]])]

    def read(self, partition: RowsPartition):
        return iter(partition.rows)

    def commit(self, end: dict) -> None:
        done = end["taken"] - (self.base or 0)
        if self.client is None or done <= 0:
            return
        frames = [frame for frame, _ in self.held[:done]]
        for frame in frames[:-1]:
            self.client.ack(frame, flush=False)
        receipt = self.client.next_receipt_id()
        last = frames[-1].headers
        self.client.send_frame("ACK", [("id", last.get("ack") or last.get("message-id", "")), ("receipt", receipt)])
        self.client.wait_receipt(receipt, READ_TIMEOUT)  # (with store=sqlite: the acks are on disk)
        del self.held[:done]
        self.base += done

    def stop(self) -> None:
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None


class LiveReader(QueueReader):
    """``mode=live``: whatever reaches a plain subscription while the query runs (topics without
    the replay log, DIAG topics); at most once: a batch re-run after a restart is empty."""

    ACK = "auto"

    def partitions(self, start: dict, end: dict):
        a, b = start["taken"], end["taken"]
        if self.base is None or a < self.base:
            return [RowsPartition([])] if b > a else []
        return [RowsPartition([row for _, row in self.held[a - self.base:b - self.base]])]

    def commit(self, end: dict) -> None:
        done = end["taken"] - (self.base or 0)
        if self.base is not None and done > 0:
            del self.held[:done]
            self.base += done


# -- the sink ---------------------------------------------------------------------------------------
def receipts(client: StompClient, waiting: set, until: int) -> None:
    """Read RECEIPTs until at most ``until`` of ``waiting`` are still missing (an ERROR raises)."""
    deadline = time.monotonic() + READ_TIMEOUT
    while len(waiting) > until:
        frame = client.read_frame(timeout=max(deadline - time.monotonic(), 0.0))
        if frame is None:
            raise TimeoutError(f"stomp: {len(waiting)} receipts missing after {READ_TIMEOUT:g} s")
        if frame.command == "RECEIPT":
            waiting.discard(frame.headers.get("receipt-id"))


@dataclasses.dataclass
class SentMessage(WriterCommitMessage):
    partition: int
    rows: int


def as_dicts(batches):
    """Rows as dicts, from Arrow record batches or Spark Rows."""
    for batch in batches:
        if hasattr(batch, "to_pydict"):
            columns = batch.to_pydict()
            names = list(columns)
            for values in zip(*columns.values()):
                yield dict(zip(names, values))
        else:
            yield batch.asDict()


class StompWriter(_Writer):
    WINDOW = 1000  # receipts outstanding at most

    def __init__(self, opts: Options, columns: list[str]):
        self.opts = opts
        self.columns = columns
        body = [c for c in ("body", "value", "body_string") if c in columns]
        if not body:
            raise ValueError("stomp: the sink needs a body (or value) column")
        if "destination" not in columns and not opts.destination:
            raise ValueError("stomp: the sink needs a destination option or a destination column")
        if opts.dedup_column and opts.dedup_column not in columns:
            raise ValueError(f"stomp: dedupIdColumn {opts.dedup_column!r} is not a column")
        self.body = body[0]

    def write(self, iterator):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") or "query"
        batch = ctx.getLocalProperty("streaming.sql.batchId") or "0"
        partition = ctx.partitionId()
        client = connect(self.opts)
        try:
            waiting = set()
            count = 0
            for count, row in enumerate(as_dicts(iterator), 1):
                destination, body, headers = self.frame(row, query, batch, partition, count - 1)
                receipt = client.next_receipt_id()
                waiting.add(receipt)
                client.send_frame("SEND", [("destination", destination), *headers, ("receipt", receipt)], body,
                                  flush=len(waiting) % 64 == 0)
                if len(waiting) >= self.WINDOW:
                    receipts(client, waiting, self.WINDOW // 2)
            client.flush()
            receipts(client, waiting, 0)
            return SentMessage(partition, count)
        finally:
            client.close()

    def frame(self, data: dict, query, batch, partition: int, index: int):
        destination = self.opts.destination or data.get("destination")  # (the option wins, as Kafka's topic)
        headers = dict(data.get("headers") or {})
        for name in ("destination", "content-length", "receipt", "transaction", "message-id", "redelivered"):
            headers.pop(name, None)
        if self.opts.persistent and not destination.startswith("/queue/"):
            headers.setdefault("persistent", "true")  # kept in the replay log, and de-duplicated
        key = data.get(self.opts.dedup_column) if self.opts.dedup_column else None
        headers["dedup-id"] = str(key) if key is not None else dedup_id(query, batch, partition, index)
        body = data.get(self.body)
        if isinstance(body, str):
            body = body.encode()
        return destination, bytes(body or b""), list(headers.items())

    def commit(self, messages, batchId: int) -> None:
        pass

    def abort(self, messages, batchId: int) -> None:
        pass  # a retried batch sends the same dedup-ids: what was stored is not stored again
