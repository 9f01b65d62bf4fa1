"""Destination kinds, limits and value checks shared by the broker's modules.

``/queue/...`` is a queue (each message to one subscriber, kept while nobody can take it); a name
starting with ``#`` is stompica's worker queue (each message to one subscriber, round-robin, not
kept); ``/temp-queue/NAME`` and ``/temp-topic/NAME`` are temporary destinations, private to the
connection that names them and reached by others through the reply name the broker writes into
``reply-to`` (``/reply-queue/...``, ``/reply-topic/...``); anything else is a topic (every matching
subscription gets it).
"""

from __future__ import annotations

from .. import __version__

VERSIONS = ("1.0", "1.1", "1.2")
SERVER = f"stompbroker/{__version__}"
ACK_MODES = ("auto", "client", "client-individual")
CONNECT_COMMANDS = ("CONNECT", "STOMP")
CONSOLE_COMMANDS = ("DIAG", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "DISCONNECT")  # a console session's
TRANSACTIONAL = ("SEND", "ACK", "NACK")
QUEUE_PREFIX = "/queue/"
MONITOR = "/queue/monitor"   # stompserver's status destination: every subscriber gets each status
DIAG_PREFIX = "DIAG"         # stompica's DIAG topics: a SEND here gets the named statistics as headers
WORKER_PREFIX = "#"
TEMP_QUEUE = "/temp-queue/"  # RabbitMQ's and ActiveMQ's temporary destinations, private to one connection
TEMP_PREFIXES = (TEMP_QUEUE, "/temp-topic/")
REPLY_PREFIXES = ("/reply-queue/", "/reply-topic/")  # their broker-wide names, for others to send to
REDELIVERED = b"redelivered:true\n"
MAX_MILLIS = 10 ** 15          # ms: expires, expiration and replay-from beyond year 33000 are refused
MAX_HEART_BEAT = 2 ** 31 - 1   # ms: a heart-beat interval must fit the records' 32-bit field
OWNER_SEP = "\x1f"              # between the login and the name in a durable subscription's key
LOGGED = 200                   # characters of a client's value kept in logs and ERROR bodies


def millis(text: str) -> int:
    """A header of milliseconds: an integer from 0 to MAX_MILLIS, else ValueError."""
    text = text.strip()
    if len(text) > 16 or not text.isdigit():  # isdigit refuses signs; the length, 400-digit numbers
        raise ValueError(text)
    value = int(text)
    if value > MAX_MILLIS:
        raise ValueError(text)
    return value


def short(text: str) -> str:
    return text if len(text) <= LOGGED else f"{text[:LOGGED]}... ({len(text)} characters)"
