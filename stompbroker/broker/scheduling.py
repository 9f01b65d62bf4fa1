"""Scheduled delivery in the broker: a SEND that asks for a later time becomes a job (kept in the
store unless ``persistent:false``, its receipt held until it is on disk), the jobs of a restart
come back from the store, each firing's headers and expiry, and ActiveMQ's
``ActiveMQ.Scheduler.Management`` destination (browse, cancel one, cancel all). Publishing a
firing is ``routing.fire_due``'s (above)."""

from __future__ import annotations

import logging

import orjson

from ..protocol.stomp import ProtocolError
from . import schedule, vhosts
from .model import Session

log = logging.getLogger("stompbroker.broker")

MANAGEMENT = "activemq.scheduler.management"
ACTION = "AMQ_SCHEDULER_ACTION"
START, END = "ACTION_START_TIME", "ACTION_END_TIME"


def accept(b, session: Session, destination: str, headers: dict, receipt) -> schedule.Spec | None:
    """The schedule a SEND asks for (checked against the limits), or None to deliver it now."""
    spec = schedule.spec(headers, b.config.max_scheduled_repeat, receipt)
    if spec is None:
        return None
    if b.backplane is not None:
        raise ProtocolError("scheduled delivery not supported in cluster mode", "send without AMQ_SCHEDULED_* "
                            "and x-delay in cluster mode", receipt)
    jobs = b.jobs
    if len(jobs) >= b.config.max_scheduled_messages:
        raise ProtocolError("too many scheduled messages", f"the broker holds {len(jobs)} scheduled messages, "
                            "the most allowed (max_scheduled_messages)", receipt)
    if jobs.per_destination.get(destination, 0) >= b.config.max_scheduled_per_destination:
        raise ProtocolError("too many scheduled messages", f"{destination} has "
                            f"{jobs.per_destination[destination]} scheduled messages, the most allowed "
                            "(max_scheduled_per_destination)", receipt)
    return spec


def add(b, destination: str, headers: dict, body: bytes, spec: schedule.Spec, ttl_ms: float) -> schedule.Job:
    """A new job: timed, in the heap, and in the store (for ``persistent:false``, memory only)."""
    stored = b.store is not None and headers.get("persistent") != "false"
    job = schedule.Job(f"{b.token}-j{next(b.job_ids)}", destination, headers, body, spec, ttl_ms, stored)
    job.start(b.clock() * 1000)
    b.jobs.add(job)
    if stored:
        b.store.put_job(job.id, destination, headers, body, job.state())
    return job


def ttl_of(b, headers: dict, expires: float) -> float:
    """How long each firing lives, in ms (0 = for ever): its expiry counts from its delivery."""
    return max((expires - b.now) * 1000, 1.0) if expires else 0.0


def firing(b, job: schedule.Job) -> tuple[dict, float]:
    """A firing's headers (an ``expires`` header moved on by as much) and its monotonic deadline."""
    headers = schedule.delivered_headers(job.headers, job.id)
    expires = 0.0
    if job.ttl:
        expires = b.now + job.ttl / 1000
        if "expires" in headers:
            headers["expires"] = str(int(b.clock() * 1000 + job.ttl))
    return headers, expires


def fired(b, job: schedule.Job) -> None:
    """After a firing: the job's next time, or its end (in the store in the same commit as the
    message it published, so a crash leaves one or the other)."""
    if job.advance():
        b.jobs.again(job)
        if job.stored:
            b.store.put_job(job.id, job.destination, job.headers, job.body, job.state())
    else:
        b.jobs.remove(job)
        if job.stored:
            b.store.drop_job(job.id)


def cancel(b, job: schedule.Job) -> None:
    b.jobs.cancel(job)
    if job.stored:
        b.store.drop_job(job.id)


def load(b, store) -> int:
    """The jobs kept by the store, back in the heap (those whose time passed while the broker was
    down fire at once). A job whose headers no longer pass (a limit lowered) is dropped, logged."""
    count = 0
    for job_id, destination, headers, body, state in store.load_jobs():
        try:
            headers, state = orjson.loads(headers), orjson.loads(state)
            spec = schedule.spec(headers, b.config.max_scheduled_repeat, None)
            due, left, base, ttl = (float(state["due"]), int(state["left"]), float(state.get("base", 0.0)),
                                    float(state.get("ttl", 0.0)))
        except ProtocolError as exc:
            log.warning("scheduled message %s to %s dropped: %s", job_id, destination, exc.message)
            store.drop_job(job_id)
            continue
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # (a row the store cannot have written)
            log.warning("scheduled message %s to %s dropped: unreadable (%s)", job_id, destination, exc)
            store.drop_job(job_id)
            continue
        if spec is None:
            store.drop_job(job_id)
            continue
        job = schedule.Job(job_id, destination, headers, body, spec, ttl, True)
        job.due, job.left, job.base = due, left, base
        b.jobs.add(job)
        count += 1
    return count


# -- ActiveMQ.Scheduler.Management ------------------------------------------------------------------
def is_management(destination: str) -> bool:
    """ActiveMQ matches the name without its kind, ignoring case: /queue/ and /topic/ alike (in a
    virtual host, as its clients name it)."""
    destination = vhosts.rendered(destination)
    name = destination.rpartition("/")[2] if destination.startswith(("/queue/", "/topic/")) else destination
    return name.lower().startswith(MANAGEMENT)


def _session_jobs(b, session: Session, destination: str | None = None) -> list[schedule.Job]:
    """The jobs a management SEND sees: those of its session's virtual host (by time)."""
    if not b.vhosts_on:
        return b.jobs.of(destination)
    vhost = session.vhost or vhosts.DEFAULT
    if destination is not None:
        return b.jobs.of(vhosts.inside(vhost, destination))
    return [job for job in b.jobs.of() if vhosts.split(job.destination)[0] == vhost]


def manage(b, session: Session, headers: dict, receipt) -> list[tuple[str, dict, bytes]]:
    """A management SEND (its write permission checked by the caller): BROWSE returns the copies to
    send to its ``reply-to``, the end marker last; REMOVE and REMOVEALL cancel and return nothing.
    Each sees only the jobs of its session's virtual host."""
    action = headers.get(ACTION, "").upper()
    window = _window(headers, receipt)
    if action == "BROWSE":
        reply_to = headers.get("reply-to")
        if not reply_to:
            raise ProtocolError("missing reply-to", "AMQ_SCHEDULER_ACTION:BROWSE sends the jobs to reply-to", receipt)
        if b.vhosts_on:  # (a name of the session's virtual host, as its destination header's)
            if vhosts.MARK in reply_to:
                raise ProtocolError("invalid reply-to", "a destination may not hold the character U+001E", receipt)
            reply_to = vhosts.inside(session.vhost, reply_to)
        out = []
        for job in _session_jobs(b, session)[:b.config.max_browse_messages]:
            if window is None or window[0] <= job.due <= window[1]:
                copy = schedule.delivered_headers(job.headers, job.id)
                copy["original-destination"] = vhosts.rendered(job.destination)
                copy["scheduled-time"] = str(int(job.due))
                copy.pop("reply-to", None)
                copy["persistent"] = "false"
                out.append((reply_to, copy, job.body))
        out.append((reply_to, {"browser": "end", "persistent": "false"}, b""))  # (ActiveMQ sends no end)
        return out
    if action == "REMOVE":
        job = b.jobs.by_id.get(headers.get(schedule.CLASSIC_JOB_ID, headers.get(schedule.JOB_ID, "")))
        if job is not None and (not b.vhosts_on or vhosts.split(job.destination)[0] == (session.vhost or vhosts.DEFAULT)):
            cancel(b, job)
        return []
    if action == "REMOVEALL":
        destination = headers.get("original-destination")
        for job in _session_jobs(b, session, destination):
            if window is None or window[0] <= job.due <= window[1]:
                cancel(b, job)
        return []
    raise ProtocolError("invalid AMQ_SCHEDULER_ACTION", "AMQ_SCHEDULER_ACTION must be BROWSE, REMOVE or "
                        f"REMOVEALL, not {action[:40]!r}", receipt)


def _window(headers: dict, receipt) -> tuple[float, float] | None:
    if START not in headers and END not in headers:
        return None
    try:
        return float(int(headers.get(START, "0"))), float(int(headers.get(END, str(2 ** 62))))
    except ValueError:
        raise ProtocolError("invalid ACTION_START_TIME", "ACTION_START_TIME and ACTION_END_TIME are epoch "
                            "times in milliseconds", receipt) from None
