"""Connections: CONNECT/STOMP (versions, heart-beats, login checks, refusals told after their
back-off, the web console's read-only sessions), deadlines (connect timeout, heart-beat timeout,
console session end), DISCONNECT and the end of a session."""

from __future__ import annotations

import logging

from ..ipc import records as R
from ..protocol.stomp import ProtocolError, render_frame
from ..security.console_tokens import PREFIX as CONSOLE_PREFIX
from . import bounds, confirmations, replies, subscribing, temporary, transactions
from .model import Session
from .names import MAX_HEART_BEAT, SERVER, VERSIONS, short
from .vhosts import DEFAULT as DEFAULT_VHOST

log = logging.getLogger("stompbroker.broker")


def connect(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    receipt = headers.get("receipt")
    if session.connected:
        raise ProtocolError("already connected", "a second CONNECT on one connection", receipt)
    accepted = headers.get("accept-version")
    if accepted is None:
        version = "1.0"
    else:
        offered = {v.strip() for v in accepted.split(",")}
        common = [v for v in VERSIONS if v in offered]
        if not common:
            replies.error(b, session, "unsupported protocol version",
                           f"Supported protocol versions are {' '.join(VERSIONS)}", receipt,
                           extra={"version": ",".join(VERSIONS)})
            return
        version = common[-1]
    cx, cy = heart_beat(headers.get("heart-beat", "0,0") if version != "1.0" else "0,0", receipt)
    if cx and cx > b.config.heartbeat_max_ms:
        raise ProtocolError("heart-beat out of range",
                            f"the client heart-beats every {cx} ms; the broker needs at least every "
                            f"{b.config.heartbeat_max_ms} ms", receipt)
    if b.vhosts_on:
        session.vhost = choose_vhost(b, headers.get("host"), receipt)
    if b.auth is not None and b.auth.required:
        login, passcode = headers.get("login"), headers.get("passcode")
        if passcode and passcode.startswith(CONSOLE_PREFIX) and b.auth.console_login(login, passcode,
                                                                                     session.address, b.now):
            # the web console's page: no password check to wait for, a read-only session that ends
            connected(b, session, version, cx, cy, headers, login)
            session.console_until = b.now + b.auth.console.ttl
            b.timed.add(session)
            return
        session.pending = (version, cx, cy, headers, [])  # (frames that arrive before the verdict wait in its list)
        b.logins.submit(session.conn, login, passcode, session.address)
        return
    connected(b, session, version, cx, cy, headers, headers.get("login", ""))


def choose_vhost(b, host: str | None, receipt) -> str:
    """The virtual host a CONNECT's ``host`` names ("" for the default one): RabbitMQ's rule. One
    that names none of them is refused, or joins the default one with vhost_fallback."""
    if host in b.config.vhosts:
        return "" if host == DEFAULT_VHOST else host
    if host is None or b.config.vhost_fallback:
        return ""
    raise ProtocolError("unknown virtual host", f"this broker serves the virtual hosts {', '.join(b.config.vhosts)} "
                        f"(vhosts), not {short(host)!r}", receipt)


def auth_done(b, conn: int, user: str | None, now: float, delay: float) -> list[tuple[bytes, bytes]]:
    """A login check finished: CONNECTED, or a refusal told after ``delay`` seconds (the back-off
    the login queue gave it). Returns the frames that waited for the verdict, to be handled now."""
    session = b.sessions.get(conn)
    if session is None or session.pending is None:
        return []
    version, cx, cy, headers, backlog = session.pending
    session.pending = None
    bounds.release(b, session, session.kept)  # (what waited for the verdict: handled or dropped now)
    b.now = now
    if user is None:
        session.closing = True  # nothing more from it is read; the ERROR follows the delay
        b.delayed.append((now + delay, conn))
        return []
    connected(b, session, version, cx, cy, headers, user)
    return backlog


def connected(b, session: Session, version: str, cx: int, cy: int, headers: dict, login: str) -> None:
    receipt = headers.get("receipt")
    if session.vhost and b.auth is not None and b.auth.required and not b.auth.may_use_vhost(login, session.vhost):
        replies.error(b, session, "access refused", f"{short(login)!r} may not use the virtual host "
                      f"{session.vhost!r}", receipt)
        return
    hb_min = b.config.heartbeat_min_ms
    sx = hb_min if cy else 0           # the broker can send every hb_min ms
    sy = max(cx, hb_min) if cx else 0  # and wants the client's beats at the client's pace
    session.connected = True
    session.version = version
    session.escape = version != "1.0"
    session.login = login
    session.client_id = headers.get("client-id", session.login)
    session.hb_in = max(cx, sy) if cx and sy else 0
    if not session.hb_in:
        b.timed.discard(session)  # nothing to watch: idle connections cost no timer work
        if not b.timed:
            b.timed = set()  # (not the table a connect storm grew: sets keep their size once emptied)
    out_interval = max(sx, cy) if sx and cy else 0
    reply = {"version": version, "server": SERVER, "session": session.id, "heart-beat": f"{sx},{sy}"}
    session.outbox.add(R.DATA, session.conn, render_frame("CONNECTED", reply, escape_headers=False))
    if out_interval:
        session.outbox.add(R.HEARTBEAT, session.conn, aux=out_interval)
    replies.send_receipt(b, session, receipt)


def heart_beat(value: str, receipt) -> tuple[int, int]:
    try:
        cx, cy = (int(part) for part in value.split(","))
        if not (0 <= cx <= MAX_HEART_BEAT and 0 <= cy <= MAX_HEART_BEAT):
            raise ValueError
    except ValueError:
        raise ProtocolError("invalid heart-beat", f"heart-beat must be two integers from 0 to {MAX_HEART_BEAT}: "
                            f"{short(value)!r}", receipt) from None
    return cx, cy


def disconnect(b, session: Session, command: str, headers: dict, body: bytes) -> None:
    replies.send_receipt(b, session, headers.get("receipt"))
    replies.close(b, session)


def end_closed(b) -> None:
    """The sessions the broker closed during this event (``Broker.ending``, filled by
    ``replies.close``) are ended."""
    while b.ending:
        end_session(b, b.ending.pop(0))


def end_session(b, session: Session) -> None:
    """Subscriptions go (unacked queue messages back to their queues); open transactions are dropped."""
    for sub in list(session.subs.values()):
        subscribing.remove_subscription(b, session, sub)
    transactions.forget(b, session)
    temporary.forget(b, session)


def closed(b, conn: int, tell_writer: bool = True) -> None:
    session = b.sessions.pop(conn, None)
    if session is None:
        return
    b.holding.pop(session, None)
    b.timed.discard(session)
    if session.pending is not None:
        if b.logins is not None:
            b.logins.cancel(conn)
        bounds.release(b, session, session.kept)
    end_session(b, session)
    if b.backplane is not None:
        b.backplane.session_ended(session)
    if session.inflight and not session.written_final:
        # The writer may still be sending them: wait for its last count for this connection.
        b.unconfirmed[conn] = (session, b.now + b.config.shutdown_timeout_ms / 1000 + 2)
    else:
        confirmations.return_unwritten(b, session)
    b.stats["connections_closed"] += 1
    if tell_writer:  # the writer still holds its copy of the socket: let it go
        session.outbox.add(R.CLOSE, conn)


def reader_restarted(b, first_conn: int) -> None:
    """A new reader runs: every session belongs to the one that died. End them all (their unacked
    and unwritten queue messages go back to their queues) and have the writers cut the sockets."""
    if b.sessions:
        log.warning("reader restarted: ending its %d sessions; queued messages are kept", len(b.sessions))
    for session in b.sessions.values():  # first nobody takes deliveries: none go to the dead
        for sub in session.subs.values():
            b.index.remove(sub.destination, sub)
            if sub.durable is not None:
                sub.durable.sub = None
    for conn in list(b.sessions):
        closed(b, conn, tell_writer=False)
    floor = R.CONN_ID.pack(first_conn)
    for box in b.outboxes:
        box.add(R.RESET, 0, floor)


def check_deadlines(b, now: float) -> None:
    """ERROR and close connections that never sent CONNECT in time, or whose heart-beats stopped."""
    connect_timeout = b.config.connect_timeout_ms / 1000
    grace = b.config.heartbeat_grace_ms / 1000
    for session in list(b.timed):
        if session.closing:
            b.timed.discard(session)
            continue
        if not session.connected:
            if connect_timeout and now - session.opened > connect_timeout:
                if session.pending is not None:  # (closing the connection drops its check)
                    replies.error(b, session, "login not checked in time", "logins from this address wait "
                                   "for their turn or back off after refusals; try again later")
                else:
                    replies.error(b, session, "connect timeout", "no CONNECT frame in time")
        elif session.console_until and now >= session.console_until:
            replies.error(b, session, "session expired", "a web console session lasts console_token_ttl_ms; "
                           "the page opens a new one before then")
        elif session.hb_in and now - session.last_seen > session.hb_in / 1000 + grace + b.alive_lag:
            replies.error(b, session, "heart-beat timeout",
                           f"nothing received for {now - session.last_seen:.1f} s "
                           f"(heart-beat every {session.hb_in} ms)")


def refuse_delayed(b, now: float) -> None:
    """Refused logins get their ERROR once their back-off delay has passed."""
    due = [conn for when, conn in b.delayed if when <= now]
    b.delayed = [(when, conn) for when, conn in b.delayed if when > now]
    for conn in due:
        session = b.sessions.get(conn)
        if session is not None:
            replies.error(b, session, "access refused", "the login or passcode is not valid")
