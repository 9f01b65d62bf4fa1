"""What NATS JetStream itself carries on this machine: the ceiling the cluster's queue figures are read
against (``stompbroker-bench cluster --scenario queue``).

A plain nats-py publisher and consumer, each its own process, on the very stream and replicas the
broker's queues use (found by subject, so however the cluster maps queues to streams): the
publisher publishes asynchronously (``publish_async``, at most ``pending`` PubAcks outstanding,
each message with a ``Nats-Msg-Id`` as the broker's have), the consumer fetches in batches from a
durable pull consumer and acknowledges each message. Counted: messages acknowledged by JetStream
(PubAcks) and consumed, and each client's CPU.

``pack`` > 1: each JetStream message carries ``pack`` messages' bytes and counts as that many (the
ceiling of JetStream for a broker that packs as many). The publisher spreads its messages over
SUBJECTS subjects under the queue's, so a packed layout's per-subject limit (in JetStream
messages) never holds it back while it runs ahead of its consumer.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import resource
import time

SUBJECTS = 256  # (16 let the packed publisher, at 430k msg/s, outrun its consumer by the limit: refused publishes)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _publisher(url: str, subject: str, size: int, duration: float, pending: int, t0: float,
                     pack: int = 1) -> dict:
    import nats

    nc = await nats.connect(url, name="bench-ceiling-pub")
    js = nc.jetstream(publish_async_max_pending=pending)
    body = os.urandom(size * pack // 2 + 1).hex()[:size * pack].encode()
    subjects = [f"{subject}.{i}" for i in range(SUBJECTS)]
    run = os.urandom(4).hex()
    await asyncio.sleep(max(t0 - time.monotonic(), 0))
    cpu0, start = _cpu(), time.monotonic()
    sent = acked = failed = 0

    def done(f):
        nonlocal acked, failed
        if f.cancelled() or f.exception() is not None:
            failed += 1
        else:
            acked += 1

    while time.monotonic() - start < duration:
        future = await js.publish_async(subjects[sent % SUBJECTS], body, headers={"Nats-Msg-Id": f"{run}-{sent}"})
        future.add_done_callback(done)
        sent += 1
    try:
        await asyncio.wait_for(js.publish_async_completed(), 30)
    except asyncio.TimeoutError:
        pass
    elapsed = time.monotonic() - start
    cpu = _cpu() - cpu0
    await nc.close()
    return {"sent": sent * pack, "acked": acked * pack, "failed": failed * pack, "seconds": elapsed, "cpu_s": cpu}


async def _consumer(url: str, stream: str, durable: str, batch: int, expect, stop_after: float, t0: float,
                    pack: int = 1) -> dict:
    import nats
    import nats.errors
    import nats.js.errors

    nc = await nats.connect(url, name="bench-ceiling-sub")
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind(durable, stream)
    await asyncio.sleep(max(t0 - time.monotonic(), 0))
    cpu0, start = _cpu(), time.monotonic()
    got, last = 0, start
    while True:
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            msgs = []
        except nats.js.errors.ServiceUnavailableError:  # (the consumer's leader is not elected yet)
            msgs = []
            await asyncio.sleep(0.1)
        for msg in msgs:
            await msg.ack()
        got += len(msgs) * pack
        now = time.monotonic()
        if msgs:
            last = now
        target = expect.value
        if (target >= 0 and got >= target) or now - start > stop_after or (target >= 0 and now - last > 3):
            break
    elapsed = last - start
    cpu = _cpu() - cpu0
    await nc.close()
    return {"consumed": got, "seconds": elapsed, "cpu_s": cpu}


def _run(fn, args, pipe) -> None:
    try:
        pipe.send(("ok", asyncio.run(fn(*args))))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        pipe.send(("error", repr(exc)))


async def _prepare(url: str, subject: str, durable: str, ack_wait: float) -> str:
    """The stream that holds ``subject`` (the broker's), and a durable pull consumer on it."""
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        stream = await js.find_stream_name_by_subject(subject)
        await js.add_consumer(stream, api.ConsumerConfig(durable_name=durable, ack_policy=api.AckPolicy.EXPLICIT,
                                                         filter_subject=subject + ".>", ack_wait=ack_wait,
                                                         max_ack_pending=-1))
        return stream
    finally:
        await nc.close()


async def _cleanup(url: str, stream: str, durable: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        await js.delete_consumer(stream, durable)
    except Exception:
        pass
    finally:
        await nc.close()


def measure(pub_url: str, sub_url: str, subject: str, size: int, duration: float, pending: int = 256,
            batch: int = 256, pack: int = 1) -> dict:
    """Run the pair for ``duration`` seconds; returns the rates, counts and CPU (the NATS servers' CPU
    is the caller's to measure around it). ``pack``: messages per JetStream message."""
    durable = "bench_ceiling_" + os.urandom(3).hex()
    stream = asyncio.run(_prepare(sub_url, subject, durable, 30.0))
    ctx = mp.get_context("fork")
    expect = ctx.Value("q", -1)
    t0 = time.monotonic() + 0.5
    pipes, procs = [], []
    for fn, args in ((_consumer, (sub_url, stream, durable, batch, expect, duration + 40, t0, pack)),
                     (_publisher, (pub_url, subject, size, duration, pending, t0, pack))):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_run, args=(fn, args, child), daemon=True)
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    try:
        if not pipes[1].poll(duration + 60):
            raise RuntimeError("the ceiling publisher did not finish")
        status, pub = pipes[1].recv()
        if status != "ok":
            raise RuntimeError(f"ceiling publisher: {pub}")
        expect.value = pub["acked"]
        if not pipes[0].poll(60):
            raise RuntimeError("the ceiling consumer did not finish")
        status, sub = pipes[0].recv()
        if status != "ok":
            raise RuntimeError(f"ceiling consumer: {sub}")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        asyncio.run(_cleanup(sub_url, stream, durable))
    seconds = max(pub["seconds"], sub["seconds"], 1e-9)
    return {"stream": stream, "subject": subject, "sent": pub["sent"], "acked": pub["acked"],
            "failed": pub["failed"], "consumed": sub["consumed"], "seconds": round(seconds, 3),
            "stored_per_s": round(pub["acked"] / max(pub["seconds"], 1e-9)),
            "consumed_per_s": round(sub["consumed"] / seconds),
            "client_cpu_s": {"publisher": round(pub["cpu_s"], 3), "consumer": round(sub["cpu_s"], 3)},
            "pack": pack,
            "flow_control": f"publish_async, at most {pending} PubAcks outstanding; fetch batches of {batch}, "
                            "each message acked" + (f"; {pack} messages per JetStream message" if pack > 1 else "")}
