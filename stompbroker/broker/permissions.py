"""Who may do what with a destination: the user's permissions (ACL), diagnostics for admins
only, and the web console's read-only sessions."""

from __future__ import annotations

from ..protocol.stomp import ProtocolError
from .model import Session
from .names import CONSOLE_COMMANDS, DIAG_PREFIX, MONITOR, short
from .vhosts import visible


def allowed(b, session: Session, destination: str, write: bool, receipt) -> None:
    """Refuse, with an ERROR naming the destination, what the user's permissions do not allow."""
    if b.config.diag_admin_only and (destination.startswith(DIAG_PREFIX) or destination == MONITOR) \
            and not (b.auth is not None and b.auth.is_admin(session.login)):
        raise ProtocolError(f"permission denied for {destination}", "diagnostics are for admin users", receipt)
    if b.auth is None or not b.auth.required:
        return
    if b.vhosts_on:
        destination = visible(destination)  # rules name destinations as clients do, in any virtual host
    may = b.auth.can_write if write else b.auth.can_read
    if not may(session.login, destination):
        verb = "write to" if write else "read from"
        raise ProtocolError(f"permission denied for {destination}", f"{session.login!r} may not {verb} "
                            f"{destination}", receipt)


def console_scope(command: str, headers: dict) -> None:
    """A session opened with a console passcode reads statistics (DIAG frames, /queue/monitor) and
    nothing else: it publishes nothing and reads no user destination."""
    if command not in CONSOLE_COMMANDS:
        raise ProtocolError(f"permission denied for {command}", "a web console session may only ask DIAG "
                            f"queries and read {MONITOR}", headers.get("receipt"))
    destination = headers.get("destination")
    if command == "SUBSCRIBE" and destination != MONITOR:
        raise ProtocolError(f"permission denied for {short(destination or '')}", "a web console session may "
                            f"only ask DIAG queries and read {MONITOR}", headers.get("receipt"))
