"""Sans-IO WebSocket (RFC 6455) server side for STOMP over WebSocket.

Nothing here touches a socket: the reader process feeds bytes in and gets
parsed requests / events out; writer processes call the encoders.

* ``parse_http_request`` + ``handshake_response`` (+ ``http_response``) do the
  opening handshake on a connection whose first bytes are ``GET `` (they live in
  ``handshake.py`` and are re-exported here).
* ``WsDecoder`` turns client socket bytes into whole messages and control
  events; the payloads of the messages form the STOMP byte stream.
* ``encode_frame`` / ``encode_message`` / ``encode_close`` build server frames
  (unmasked, FIN set, never fragmented).
* The client side, for the project's own clients (tools, benchmark, tests):
  ``encode_client_frame`` builds masked frames, ``parse_frame`` splits frames
  of either side without judging them.

The framing is hand-written rather than delegated to wsproto because it is
about 5x faster per small frame and on par for 64 KB frames (figures in
docs/websocket.md).
Extensions (permessage-deflate) are not negotiated: an offer is ignored, which
RFC 6455 allows, so frames with RSV bits set are protocol errors.
"""

from __future__ import annotations

import enum
import os
import struct

__all__ = [
    "HandshakeError", "body_length", "parse_http_request", "handshake_response", "http_response", "wants_upgrade", "with_header",
    "WsProtocolError", "WsDecoder", "encode_frame", "encode_message", "encode_close",
    "encode_client_frame", "parse_frame",
    "mask_bytes", "Opcode", "CloseCode", "WsEvent", "OP_CONT", "OP_TEXT", "OP_BIN", "OP_CLOSE", "OP_PING", "OP_PONG",
    "STOMP_SUBPROTOCOLS", "WS_GUID", "accept_key",
]



class Opcode(enum.IntEnum):
    """Frame opcodes, RFC 6455 section 5.2 (data frames 5.6, control frames 5.5)."""
    CONTINUATION = 0x0  # 5.4: a later fragment of a message
    TEXT = 0x1          # 5.6: UTF-8 text
    BINARY = 0x2        # 5.6
    CLOSE = 0x8         # 5.5.1
    PING = 0x9          # 5.5.2
    PONG = 0xA          # 5.5.3


class CloseCode(enum.IntEnum):
    """Close frame status codes, RFC 6455 section 7.4.1 (and the IANA registry, 11.7)."""
    NORMAL = 1000              # 7.4.1: the purpose is fulfilled
    GOING_AWAY = 1001          # 7.4.1: server going down, browser leaving the page
    PROTOCOL_ERROR = 1002      # 7.4.1
    UNSUPPORTED_DATA = 1003    # 7.4.1: a type of data it cannot accept
    # 1004 reserved; 1005 (no status) and 1006 (abnormal closure) are never sent (7.4.1)
    INVALID_DATA = 1007        # 7.4.1: e.g. not UTF-8 in a text message
    POLICY_VIOLATION = 1008    # 7.4.1
    MESSAGE_TOO_BIG = 1009     # 7.4.1
    MANDATORY_EXTENSION = 1010  # 7.4.1: client only
    INTERNAL_ERROR = 1011      # IANA registry (RFC 6455 errata)
    SERVICE_RESTART = 1012     # IANA registry
    TRY_AGAIN_LATER = 1013     # IANA registry
    BAD_GATEWAY = 1014         # IANA registry
    # 1015 (TLS handshake failure) is never sent; 3000-3999 registered, 4000-4999 private (7.4.2)


class WsEvent(enum.StrEnum):
    """What WsDecoder.feed returns, as the first item of each event tuple. A StrEnum: each is equal to
    its plain text ("message"...), so events compare equal to tuples written with strings."""
    MESSAGE = "message"  # (MESSAGE, payload: bytes, is_text: bool): a whole message, reassembled
    PING = "ping"        # (PING, payload)
    PONG = "pong"        # (PONG, payload)
    CLOSE = "close"      # (CLOSE, code | None, reason)


# The decoder compares opcodes read from the wire (plain ints) with these for every frame: plain
# ints, since comparing an int with an IntEnum member is slower (see ipc/records.py).
OP_CONT = Opcode.CONTINUATION.value
OP_TEXT = Opcode.TEXT.value
OP_BIN = Opcode.BINARY.value
OP_CLOSE = Opcode.CLOSE.value
OP_PING = Opcode.PING.value
OP_PONG = Opcode.PONG.value
_MESSAGE = WsEvent.MESSAGE  # one global lookup per message, not an enum attribute lookup

from .handshake import (STOMP_SUBPROTOCOLS, WS_GUID, HandshakeError, accept_key, body_length, handshake_response,
                        http_response, parse_http_request, wants_upgrade, with_header)


# --------------------------------------------------------------------------
# Framing
# --------------------------------------------------------------------------

class WsProtocolError(Exception):
    """The peer broke the protocol: send ``encode_close(code, reason)`` and close.

    ``events`` holds the events decoded earlier in the same ``feed`` call, so
    a message that arrived just before the bad frame is not lost.
    """

    def __init__(self, code: int, reason: str, events: list | None = None):
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason
        self.events = events if events is not None else []


def _mask_int(data: bytes, key: bytes) -> bytes:
    # Repeat the key to the payload length and XOR the two as big ints: three
    # C-level linear steps, the least fixed overhead for small payloads.
    n = len(data)
    mask = (key * ((n + 3) >> 2))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(mask, "little")).to_bytes(n, "little")


_IDENTITY = bytes(range(256))
# _XOR_TABLES[k] maps byte b to b ^ k (for bytes.translate); built with the
# int trick so importing costs ~0.2 ms.
_XOR_TABLES = [_mask_int(_IDENTITY, bytes((k,)) * 4) for k in range(256)]
_MASK_INT_MAX = 512  # measured crossover is ~400-600 bytes on CPython 3.11


def mask_bytes(data: bytes, key: bytes) -> bytes:
    """XOR ``data`` with the 4-byte ``key`` repeated (masking is its own inverse).

    Small payloads use one big-int XOR; larger ones translate each of the
    four byte lanes (data[i::4]) through a 256-byte XOR table, which scales
    about 3x better than the int conversions (see docs/websocket.md).
    """
    n = len(data)
    if not n:
        return b""
    key = bytes(key)
    if n < _MASK_INT_MAX:
        return _mask_int(data, key)
    out = bytearray(data)
    t = _XOR_TABLES
    out[0::4] = out[0::4].translate(t[key[0]])
    out[1::4] = out[1::4].translate(t[key[1]])
    out[2::4] = out[2::4].translate(t[key[2]])
    out[3::4] = out[3::4].translate(t[key[3]])
    return bytes(out)


def _valid_close_code(code: int) -> bool:
    # 7.4.1/7.4.2: 1004-1006 and 1015 are reserved or local-only; 1012-1014 are IANA-registered.
    return (CloseCode.NORMAL <= code <= CloseCode.UNSUPPORTED_DATA or CloseCode.INVALID_DATA <= code
            <= CloseCode.BAD_GATEWAY or 3000 <= code <= 4999)


class WsDecoder:
    """Incremental decoder for client-to-server frames.

    ``feed(data)`` returns a list of events:
      (WsEvent.MESSAGE, payload: bytes, is_text: bool)  whole message, reassembled
      (WsEvent.PING, payload) / (WsEvent.PONG, payload)
      (WsEvent.CLOSE, code | None, reason)
    and raises WsProtocolError on a protocol violation (1002, 1007), a message over
    ``max_message_size`` bytes (1009) or in more than ``max_fragments`` frames (1008); the decoder
    then stays failed (every later feed raises the same
    error). After a close frame, further bytes are ignored (RFC 6455 5.5.1).
    """

    def __init__(self, max_message_size: int = 4 * 1024 * 1024, max_fragments: int = 1024):
        self.max_message_size = max_message_size
        self.max_fragments = max_fragments  # frames one message may come in (its first one included)
        self._buf = bytearray()       # unparsed bytes (at most one partial frame)
        # The message in progress, its fragments joined as they come: a list of parts would cost an
        # object per fragment, which empty or 1-byte fragments would turn into unbounded memory.
        self._message = bytearray()
        self._frag_op: int | None = None  # OP_TEXT/OP_BIN while a message is fragmented
        self._fragments = 0
        self._error: WsProtocolError | None = None
        self.closed = False
        self.hits = 0
        self.misses = 0

    @property
    def allocated(self) -> int:
        """Bytes held between feeds: a partial frame and the fragments of an unfinished message."""
        return len(self._buf) + len(self._message)

    def _fail(self, code: int, reason: str, events: list) -> WsProtocolError:
        self._error = WsProtocolError(code, reason)
        self._buf = bytearray()
        self._message = bytearray()
        self._fragments = 0
        return WsProtocolError(code, reason, events)

    def feed(self, data: bytes) -> list[tuple]:
        if self._error is not None:
            raise WsProtocolError(self._error.code, self._error.reason)
        if self.closed:
            return []
        # Common case: nothing pending, parse the caller's bytes directly
        # instead of copying them into the buffer first. Otherwise append in
        # place (amortised O(1)), so a big frame arriving in many reads is not
        # copied again on every read.
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        events: list[tuple] = []
        pos = 0
        size = len(buf)
        max_msg = self.max_message_size
        while size - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            # Checks that need only the first two bytes come first, so a bad
            # frame is rejected before any of it is buffered.
            if b0 & 0x70:
                raise self._fail(CloseCode.PROTOCOL_ERROR, "reserved bits set", events)
            if not b1 & 0x80:
                raise self._fail(CloseCode.PROTOCOL_ERROR, "client frame not masked", events)
            length = b1 & 0x7F
            if opcode >= OP_CLOSE:
                if opcode > OP_PONG:
                    raise self._fail(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode:#x}", events)
                if not fin:
                    raise self._fail(CloseCode.PROTOCOL_ERROR, "fragmented control frame", events)
                if length > 125:
                    raise self._fail(CloseCode.PROTOCOL_ERROR, "control frame payload over 125 bytes", events)
            elif opcode == OP_CONT:
                if self._frag_op is None:
                    raise self._fail(CloseCode.PROTOCOL_ERROR, "continuation frame without a message", events)
                if self._fragments >= self.max_fragments:
                    raise self._fail(CloseCode.POLICY_VIOLATION, f"message in more than {self.max_fragments} "
                                     "fragments", events)
            elif opcode <= OP_BIN:
                if self._frag_op is not None:
                    raise self._fail(CloseCode.PROTOCOL_ERROR, "new message inside a fragmented message", events)
            else:
                raise self._fail(CloseCode.PROTOCOL_ERROR, f"unknown opcode {opcode:#x}", events)

            if length < 126:
                hdr = 6
            elif length == 126:
                if size - pos < 4:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                hdr = 8
            else:
                if size - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2:pos + 10], "big")
                if length >> 63:
                    raise self._fail(CloseCode.PROTOCOL_ERROR, "64-bit length with the high bit set", events)
                hdr = 14
            # Non-minimal length encodings are accepted (as browsers never
            # send them, rejecting them would only add a failure mode).
            if opcode < OP_CLOSE and len(self._message) + length > max_msg:
                raise self._fail(CloseCode.MESSAGE_TOO_BIG, f"message larger than {max_msg} bytes", events)

            end = pos + hdr + length
            if end > size:
                break
            if length:
                payload = mask_bytes(buf[pos + hdr:end], buf[end - length - 4:end - length])
            else:
                payload = b""
            pos = end

            if opcode == OP_TEXT or opcode == OP_BIN:
                if fin:
                    if opcode == OP_TEXT and not _is_utf8(payload):
                        raise self._fail(CloseCode.INVALID_DATA, "invalid UTF-8 in text message", events)
                    events.append((_MESSAGE, payload, opcode == OP_TEXT))
                else:
                    self._frag_op = opcode
                    self._message += payload
                    self._fragments = 1
            elif opcode == OP_CONT:
                self._message += payload
                self._fragments += 1
                if fin:
                    message = bytes(self._message)
                    is_text = self._frag_op == OP_TEXT
                    self._message = bytearray()  # give a big message's memory back
                    self._frag_op = None
                    self._fragments = 0
                    if is_text and not _is_utf8(message):
                        raise self._fail(CloseCode.INVALID_DATA, "invalid UTF-8 in text message", events)
                    events.append((_MESSAGE, message, is_text))
            elif opcode == OP_PING:
                events.append((WsEvent.PING, payload))
            elif opcode == OP_PONG:
                events.append((WsEvent.PONG, payload))
            else:  # OP_CLOSE
                events.append(self._close_event(payload, events))
                self.closed = True
                pos = size  # ignore anything after the close frame
                break

        if pos >= size:
            if self._buf:
                self._buf = bytearray()  # release a big frame's memory
        elif buf is self._buf:
            del buf[:pos]  # cheap: bytearray drops a prefix by moving its start
        else:
            self._buf = bytearray(buf[pos:])
        if events:
            self.hits += 1
        else:
            self.misses += 1
        return events

    def _close_event(self, payload: bytes, events: list) -> tuple:
        if not payload:
            return (WsEvent.CLOSE, None, "")
        if len(payload) == 1:
            raise self._fail(CloseCode.PROTOCOL_ERROR, "close payload of 1 byte", events)
        code = (payload[0] << 8) | payload[1]
        if not _valid_close_code(code):
            raise self._fail(CloseCode.PROTOCOL_ERROR, f"invalid close code {code}", events)
        try:
            reason = payload[2:].decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(CloseCode.PROTOCOL_ERROR, "invalid UTF-8 in close reason", events) from None
        return (WsEvent.CLOSE, code, reason)


def _is_utf8(data: bytes) -> bool:
    # isascii() is a fast C scan that allocates nothing: STOMP traffic is
    # almost always ASCII, so the decode below rarely runs.
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def encode_frame(payload: bytes, opcode: int = OP_TEXT) -> bytes:
    """One server frame: FIN set, unmasked."""
    n = len(payload)
    if opcode >= OP_CLOSE and n > 125:
        raise ValueError("control frame payload over 125 bytes")
    b0 = 0x80 | opcode
    if n < 126:
        header = bytes((b0, n))
    elif n < 0x10000:
        header = struct.pack("!BBH", b0, 126, n)
    else:
        header = struct.pack("!BBQ", b0, 127, n)
    return header + bytes(payload)


def encode_message(stomp_frame: bytes) -> bytes:
    """A STOMP frame as one WebSocket message: text if valid UTF-8, else binary.

    Text frames are what browser STOMP clients expect; a body that is not
    UTF-8 would make the client fail the connection with 1007, so it goes
    out as binary instead.
    """
    return message_header(stomp_frame) + bytes(stomp_frame)


# The headers of short text messages, made once: a writer puts one before each frame it sends.
_SHORT_TEXT = tuple(bytes((0x80 | OP_TEXT, n)) for n in range(126))


def message_header(stomp_frame) -> bytes:
    """The WebSocket header ``encode_message`` puts before ``stomp_frame`` (bytes or a memoryview
    of them): a writer appends it and the frame to its batch, with no joined copy between."""
    if type(stomp_frame) is not bytes:
        stomp_frame = bytes(stomp_frame)
    n = len(stomp_frame)
    if stomp_frame.isascii():
        if n < 126:
            return _SHORT_TEXT[n]
        b0 = 0x80 | OP_TEXT
    else:
        b0 = 0x80 | (OP_TEXT if _is_utf8(stomp_frame) else OP_BIN)
    if n < 126:
        return bytes((b0, n))
    if n < 0x10000:
        return struct.pack("!BBH", b0, 126, n)
    return struct.pack("!BBQ", b0, 127, n)


def encode_close(code: int | None = CloseCode.NORMAL, reason: str = "") -> bytes:
    """Close frame; the reason is cut at a character boundary to fit 125 bytes."""
    if code is None:
        return encode_frame(b"", OP_CLOSE)
    raw = reason.encode("utf-8")[:123].decode("utf-8", "ignore").encode("utf-8")
    return encode_frame(struct.pack("!H", code) + raw, OP_CLOSE)


# --- client side (the project's own clients; never on the broker's paths) ---------------------

def encode_client_frame(payload: bytes, opcode: int = OP_TEXT, key: bytes | None = None, fin: bool = True,
                        rsv: int = 0, masked: bool = True) -> bytes:
    """One client-to-server frame, masked with ``key`` (4 random bytes if None) as RFC 6455 5.3
    requires. ``fin=False``, ``rsv`` and ``masked=False`` build fragments and bad frames."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv << 4 | opcode
    m = 0x80 if masked else 0
    if n < 126:
        header = bytes((b0, m | n))
    elif n < 0x10000:
        header = struct.pack("!BBH", b0, m | 126, n)
    else:
        header = struct.pack("!BBQ", b0, m | 127, n)
    if not masked:
        return header + bytes(payload)
    key = os.urandom(4) if key is None else key
    return header + key + mask_bytes(payload, key)


def parse_frame(buf, pos: int = 0):
    """One frame of either side at ``buf[pos:]``, unmasked: (fin, opcode, payload, next_pos), or
    None while incomplete. Nothing is judged (RSV bits, lengths): callers that care check
    ``buf[pos]`` and ``buf[pos + 1]`` themselves; clients of the broker read its frames with it."""
    n = len(buf)
    if n - pos < 2:
        return None
    b0, b1 = buf[pos], buf[pos + 1]
    length = b1 & 0x7F
    p = pos + 2
    if length == 126:
        if n - p < 2:
            return None
        length = struct.unpack_from("!H", buf, p)[0]
        p += 2
    elif length == 127:
        if n - p < 8:
            return None
        length = struct.unpack_from("!Q", buf, p)[0]
        p += 8
    key = None
    if b1 & 0x80:
        if n - p < 4:
            return None
        key = bytes(buf[p:p + 4])
        p += 4
    if n - p < length:
        return None
    payload = bytes(buf[p:p + length])
    if key is not None:
        payload = mask_bytes(payload, key)
    return bool(b0 & 0x80), b0 & 0x0F, payload, p + length
