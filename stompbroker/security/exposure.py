"""What the broker warns about at start: settings that leave it open to the network it listens on.

A pure decision (``warnings(config)``, tested as such); the supervisor logs each line at WARNING.
Loopback is safe by construction (nothing else can connect); any other address (``0.0.0.0``, an
interface address, a host name other than ``localhost``) is taken as reachable by others.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    host = host.strip().lower().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def warnings(config, port: int | None = None) -> list[str]:
    """Lines to log; ``port`` is the one bound (``port=0`` has the system pick it)."""
    if is_loopback(config.host):
        return []
    where = f"{config.host}:{port or config.port}"
    http = config.console or config.http_api
    if not config.auth_required:  # (a token secret checks logins even with auth=off)
        return [f"SECURITY: auth=off on {where}: anyone who can reach it may log in, publish, subscribe and "
                f"read every queue{', the console, /api and /metrics' if http else ''}"
                f"{'' if config.ws_origins else ', and any web page a browser on that network opens may do so over WebSocket'}; "
                "set auth=passwd and a passwd_file (README.md, Security)"]
    if http:  # port serves plain HTTP whether or not ssl_port also serves TLS
        tls = (f"ssl_port {config.ssl_port} serves TLS, but port still takes them; " if config.ssl_port else
               "serve TLS (ssl_port) and use https://, ")
        return [f"SECURITY: HTTP Basic passwords for the console, /api and /metrics (and STOMP passcodes) may cross "
                f"the network in clear on {where}: {tls}put a TLS proxy in front, or turn the HTTP side off "
                "(console=false http_api=false)"]
    return []
