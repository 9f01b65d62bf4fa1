"""Sans-IO STOMP 1.0-1.2 framing: no sockets, fed bytes, returns frames.

Two halves:
- FrameParser (reader process, hot path) splits a byte stream into raw
  ``(head, body)`` frames without decoding anything;
- parse_head / render_frame / escape / unescape (dispatcher process) decode
  heads and build outgoing frames.
"""

import os
import re

__all__ = ["ProtocolError", "FrameParser", "parse_head", "parse_head_cached", "escape", "unescape", "render_frame"]


class ProtocolError(Exception):
    """A fatal STOMP protocol error; the connection gets an ERROR frame and is closed."""

    def __init__(self, message: str, detail: str = "", receipt: str | None = None):
        # All three in args so the exception pickles (it may cross processes).
        super().__init__(message, detail, receipt)
        self.message = message
        self.detail = detail
        self.receipt = receipt

    def __str__(self) -> str:
        return f"{self.message}: {self.detail}" if self.detail else self.message


def _receipt(head: bytes) -> str | None:
    """Raw value of the first ``receipt`` header of a head, or None."""
    k = head.find(b"\nreceipt:")
    if k < 0:
        return None
    k += 9
    j = head.find(b"\n", k)
    return (head[k:j] if j >= 0 else head[k:]).decode("utf-8", "replace")


def _fail(message: str, detail: str, head: bytes) -> ProtocolError:
    return ProtocolError(message, detail, _receipt(head))


def _pure_python_asked() -> bool:
    return os.environ.get("STOMPBROKER_PURE_PYTHON", "") not in ("", "0")


def _compiled(module: str, name: str):
    """A function of one of this package's C modules: ``_framesplit.split`` (the common case of
    ``_parse_into``), ``_headparse.parse`` (of ``parse_head``) or ``_headrender.part`` (of
    ``Message.shared``, ``RENDER_PART``). None where it was not built (no C
    compiler at install: the setup goes on without it) or is turned off (STOMPBROKER_PURE_PYTHON=1, to
    compare or rule it out); the Python code then does it all, with the same results."""
    if _pure_python_asked():
        return None
    try:
        return getattr(__import__(f"{__package__}.{module}", fromlist=[name]), name)
    except ImportError:
        return None


def why_pure_python() -> str | None:
    """Why frames are split, heads decoded and messages rendered in pure Python here (for the broker's
    log at start), or None: compiled."""
    if _pure_python_asked():
        return "STOMPBROKER_PURE_PYTHON is set"
    built = (("_framesplit", FrameParser.split), ("_headparse", _PARSE_HEAD), ("_headrender", RENDER_PART))
    missing = [f"stompbroker/protocol/{module}.c" for module, function in built if function is None]
    if missing:
        return f"{' and '.join(missing)} not built (no C compiler at install: see README)"
    return None


# Unpacked at the start of each feed: (head, body offset, content-length, scan offset, line offset).
_FRESH = (None, 0, -1, 0, 0)


class FrameParser:
    """Splits a STOMP byte stream into ``(head, body)`` frames.

    ``head`` is the command line and header lines (CRLF normalised to LF)
    joined by LF, without the trailing blank line; ``body`` is the bytes
    between the blank line and the NUL.  Nothing is decoded here.
    """

    # (a class attribute: a subclass may set None, as the tests' pure parser does)
    split = _compiled("_framesplit", "split")

    __slots__ = ("max_frame_size", "max_headers", "max_header_line", "max_names", "heartbeats",
                 "_buf", "_pending", "_error")

    def __init__(self, max_frame_size: int = 4 * 1024 * 1024, max_headers: int = 256,
                 max_header_line: int = 64 * 1024, max_destination: int | None = None, max_id: int | None = None):
        self.max_frame_size = max_frame_size
        self.max_headers = max_headers
        self.max_header_line = max_header_line
        # (command, header, limit, what): the names a frame gives the broker to keep and show
        # (NAMED); None when neither limit is set (a client parsing the broker's frames)
        self.max_names = named_limits(max_destination, max_id)
        self.heartbeats = 0  # EOLs seen between frames; never reset here
        self._buf = bytearray()  # starts at the first byte of an unfinished frame (or a lone CR)
        # State of the unfinished frame, offsets relative to the start of _buf;
        # kept so a frame fed one byte at a time is not rescanned (quadratic).
        self._pending = None
        self._error = None

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf)

    def unparsed(self) -> bytes:
        """The bytes held waiting for the rest of a frame."""
        return bytes(self._buf)

    def receipt(self) -> str | None:
        """The receipt header of the unfinished frame, if its line is complete (for a refusal)."""
        buf = self._buf
        end = buf.find(b"\n\n")
        head = bytes(buf if end < 0 else buf[:end])
        value = _receipt(head)
        if value is None or (end < 0 and head.find(b"\n", head.find(b"\nreceipt:") + 1) < 0):
            return None  # the value may be cut
        return value

    def discard(self) -> None:
        """Drop the unfinished frame (the connection is being closed): its memory goes now."""
        self._buf = bytearray()
        self._pending = None

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Return every frame completed by ``data``; raise ProtocolError (forever after) on bad input."""
        if self._error is not None:
            raise self._error
        if type(data) is not bytes:
            data = bytes(data)
        buf = self._buf
        if buf:
            buf += data
        else:
            buf = data  # common case: parse the caller's bytes directly, buffer only the leftover
        try:
            frames, pos = self._parse(buf)
        except ProtocolError as e:
            self._error = ProtocolError(e.message, e.detail, e.receipt)  # re-raised later without frames
            self._buf = bytearray()
            self._pending = None
            raise
        if buf is data:
            if pos < len(data):
                self._buf = bytearray(memoryview(data)[pos:])
        elif pos:
            del buf[:pos]  # once per feed, not once per frame
        return frames

    def _parse(self, buf):
        """Parse frames from ``buf``; return them and the offset of the first unconsumed byte."""
        frames = []
        try:
            return self._parse_into(buf, frames)
        except ProtocolError as e:
            e.frames = frames  # the whole frames before the bad one
            raise

    def _parse_into(self, buf, frames):
        n = len(buf)
        pos = 0
        copy = type(buf) is not bytes  # slices of the bytearray must become bytes
        mfs = self.max_frame_size
        max_headers = self.max_headers
        head_limit = min(mfs, self.max_header_line)
        if self.max_names is not None:  # a head longer than the shortest name limit has its names checked
            head_limit = min(head_limit, self.max_names[0] + 1)
        head, bstart, clen, scan, line = self._pending or _FRESH
        nn = crn = -2  # next LF LF / LF CR LF at or after the search start; -1: none in buf, -2: unknown
        # Clients send LF or CRLF throughout: with no CR in the whole read, no head needs its CRs looked at.
        cr = b"\r" in buf
        if not cr:
            crn = -1
        self._pending = None
        split = None if cr else self.split  # (with CRs it would look for LF LF in vain: leave them to Python)
        while True:
            if head is None and scan == 0 and split is not None:
                # Whole frames of the common shape in C; it stops at the first frame of any other
                # shape, or unfinished, which the code below takes from its first byte. (Not for a
                # head left unfinished by the last feed: scanned again each feed, it would be quadratic.)
                at = pos
                pos, beats = split(buf, pos, frames, head_limit, max_headers, mfs)
                if pos != at:
                    self.heartbeats += beats
                    scan = line = 0  # (what was known of an unfinished head is of a frame now taken)
            start = pos
            if head is None:
                # EOLs between frames are heart-beats (rare, so a plain loop is fine).
                while pos < n:
                    c = buf[pos]
                    if c == 10:
                        pos += 1
                    elif c == 13:
                        if pos + 1 == n:
                            return frames, pos  # CRLF split across feeds: keep the CR
                        if buf[pos + 1] != 10:
                            raise ProtocolError("malformed frame", "CR not followed by LF")
                        pos += 2
                    else:
                        break
                    self.heartbeats += 1
                else:
                    return frames, pos
                start = pos
                # The head ends at the first blank line: LF LF, or LF CR LF.  The next
                # position of each pattern is cached for the whole feed: searching again
                # for a pattern the stream lacks would make one feed of many frames quadratic.
                s = start + scan
                if nn < s and nn != -1:
                    nn = buf.find(b"\n\n", s)
                if crn < s and crn != -1:
                    crn = buf.find(b"\n\r\n", s)
                if crn >= 0 and (nn < 0 or crn < nn):
                    e = crn
                    bstart = crn + 3 - start
                elif nn >= 0:
                    e = nn
                    bstart = nn + 2 - start
                else:
                    line = self._unfinished_head(buf, start, scan, line)
                    self._pending = (None, 0, -1, max(n - start - 2, 0), line)
                    return frames, start
                head = buf[start:e]
                if copy:
                    head = bytes(head)
                if cr:
                    if head[-1] == 13:
                        head = head[:-1]  # the CR of the last line's CRLF
                    if b"\r" in head:
                        head = head.replace(b"\r\n", b"\n")
                        if b"\r" in head:
                            raise _fail("malformed frame", "CR not followed by LF", head)
                # One cheap test for the common case; _check_head finds the precise reason. (A head
                # of more than max_headers lines is longer than max_headers bytes.)
                if e - start >= head_limit or b"\0" in head or (
                        len(head) > max_headers and head.count(b"\n") > max_headers):
                    self._check_head(head, e + 1 - start)
                k = head.find(b"\ncontent-length:")  # first occurrence wins
                if k < 0:
                    clen = -1
                else:  # the common value here; anything else (and every refusal) in _content_length
                    j = head.find(b"\n", k + 16)
                    value = head[k + 16:j] if j >= 0 else head[k + 16:]
                    clen = int(value) if len(value) < 10 and value.isdigit() else -1
                    if clen < 0 or clen > mfs:
                        clen = self._content_length(head, k + 16)
                scan = bstart
            b = start + bstart
            if clen >= 0:
                if bstart + clen > mfs:
                    raise _fail("frame too large", f"headers and body exceed {mfs} bytes", head)
                end = b + clen
                if end >= n:
                    self._pending = (head, bstart, clen, 0, 0)
                    return frames, start
                if buf[end] != 0:
                    raise _fail("missing NUL after body", f"byte {clen} of the body must be NUL", head)
            else:
                end = buf.find(b"\0", start + scan)
                if end < 0:
                    if n - start > mfs:
                        raise _fail("frame too large", f"no NUL within {mfs} bytes of body", head)
                    self._pending = (head, bstart, -1, n - start, 0)
                    return frames, start
                if end - start > mfs:
                    raise _fail("frame too large", f"no NUL within {mfs} bytes of body", head)
            body = buf[b:end]
            frames.append((head, bytes(body) if copy else body))
            pos = end + 1
            head = None
            scan = line = 0

    def _unfinished_head(self, buf, start, scan, line):
        """Check the head seen so far; return the offset of its last (unfinished) line.

        Limits are on raw bytes and match _check_head's, so whether a frame is
        accepted does not depend on how the stream was chunked.
        """
        n = len(buf)
        # The header block may still end with the LF of a CRLF blank line.
        if n - start > self.max_frame_size + 1:
            raise ProtocolError("frame too large", f"headers not finished within {self.max_frame_size} bytes")
        if buf.find(b"\0", start + scan) >= 0:
            raise ProtocolError("malformed frame", "NUL before the end of the headers")
        nl = buf.rfind(b"\n", start + scan)
        if nl >= 0:
            line = nl + 1 - start
        if n - start - line - (buf[n - 1] == 13) > self.max_header_line:  # a final CR may start a CRLF
            raise _fail("header line too long", f"a header line exceeds {self.max_header_line} bytes",
                        bytes(buf[start:start + line]).replace(b"\r\n", b"\n"))
        return line

    def _check_head(self, head, size):
        """Raise the precise error for a head that failed the hot path's quick test.

        ``size`` is the raw size of the header block, up to and including the
        EOL of its last line.
        """
        if b"\0" in head:
            raise _fail("malformed frame", "NUL before the end of the headers", head)
        if size > self.max_frame_size:
            raise _fail("frame too large", f"headers exceed {self.max_frame_size} bytes", head)
        if head.count(b"\n") > self.max_headers:
            raise _fail("too many headers", f"more than {self.max_headers} headers", head)
        if len(head) > self.max_header_line and max(map(len, head.split(b"\n"))) > self.max_header_line:
            raise _fail("header line too long", f"a header line exceeds {self.max_header_line} bytes", head)
        if self.max_names is not None and len(head) > self.max_names[0]:
            _check_names(head, self.max_names[1])

    def _content_length(self, head, k):
        j = head.find(b"\n", k)
        value = head[k:j] if j >= 0 else head[k:]
        if not value.isdigit():  # ASCII digits only: no sign, no spaces, not empty
            raise _fail("invalid content-length", f"content-length {value[:40]!r} is not a decimal integer", head)
        if len(value) > 20:
            value = value.lstrip(b"0") or b"0"  # int() refuses very long digit strings
        clen = int(value) if len(value) <= 20 else self.max_frame_size + 1
        if clen > self.max_frame_size:
            raise _fail("frame too large", f"content-length exceeds {self.max_frame_size} bytes", head)
        return clen


# The headers whose values the broker keeps and shows (in MESSAGE frames, DIAG answers, the API,
# metrics), per command: (header, limit kind). Their lengths are checked as sent (escaped, UTF-8).
DESTINATION, ID = "destination", "id"
NAMED = {
    b"SEND": ((b"destination", DESTINATION), (b"reply-to", DESTINATION), (b"transaction", ID)),
    b"SUBSCRIBE": ((b"destination", DESTINATION), (b"id", ID), (b"activemq.subscriptionName", ID)),
    b"UNSUBSCRIBE": ((b"id", ID),),
    b"ACK": ((b"id", ID), (b"subscription", ID), (b"transaction", ID)),
    b"NACK": ((b"id", ID), (b"subscription", ID), (b"transaction", ID)),
    b"BEGIN": ((b"transaction", ID),), b"COMMIT": ((b"transaction", ID),), b"ABORT": ((b"transaction", ID),),
    b"CONNECT": ((b"client-id", ID),), b"STOMP": ((b"client-id", ID),),
}
_LIMIT_SETTINGS = {DESTINATION: "max_destination_length", ID: "max_id_length"}


def named_limits(max_destination: int | None, max_id: int | None):
    """(shortest limit, {command: ((header + b":", limit, header text), ...)}) or None for no limits."""
    limits = {DESTINATION: max_destination, ID: max_id}
    if max_destination is None and max_id is None:
        return None
    table = {command: tuple((name + b":", limits[kind], name.decode(), kind) for name, kind in names
                            if limits[kind] is not None)
             for command, names in NAMED.items()}
    return min(limit for limit in limits.values() if limit is not None), table


def _check_names(head: bytes, table: dict) -> None:
    """Raise for a destination or id longer than its limit (only heads longer than the shortest limit come here)."""
    lines = head.split(b"\n")
    names = table.get(lines[0])
    if not names:
        return
    for line in lines[1:]:
        for prefix, limit, name, kind in names:
            if line.startswith(prefix) and len(line) - len(prefix) > limit:
                raise _fail(f"{'destination' if kind == DESTINATION else name} too long",
                            f"{name} has {len(line) - len(prefix)} bytes; the broker accepts at most {limit} "
                            f"({_LIMIT_SETTINGS[kind]})", head)


# --- dispatcher side ---------------------------------------------------------

_UNESCAPES = {"\\r": "\r", "\\n": "\n", "\\c": ":", "\\\\": "\\"}
_ESCAPE_SEQ = re.compile(r"\\.?", re.S)  # a backslash and the next character, if any


def _unescape_seq(m):
    try:
        return _UNESCAPES[m.group()]
    except KeyError:
        raise ProtocolError("invalid header escape", f"undefined escape sequence {m.group()!r}") from None


def escape(value: str) -> str:
    """STOMP 1.1+ header escaping."""
    if "\\" in value or ":" in value or "\n" in value or "\r" in value:
        return value.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")
    return value


def unescape(value: str) -> str:
    """Undo STOMP 1.1+ header escaping; an undefined escape is a ProtocolError."""
    if "\\" not in value:
        return value
    return _ESCAPE_SEQ.sub(_unescape_seq, value)


_unescape = unescape  # parse_head's argument shadows the name


_PARSE_HEAD = _compiled("_headparse", "parse")
RENDER_PART = _compiled("_headrender", "part")


def parse_head(head: bytes, unescape: bool) -> tuple[str, dict[str, str]]:
    """Decode a head from FrameParser into (command, headers).

    The first occurrence of a header wins.  Pass ``unescape=False`` for 1.0
    sessions and for CONNECT/STOMP frames (never escaped). The common case (valid UTF-8, well-formed
    lines, nothing to unescape) is decoded in C where it was built; the rest, and every error, here.
    """
    if _PARSE_HEAD is not None:
        parsed = _PARSE_HEAD(head, unescape)
        if parsed is not None:
            return parsed
    return _parse_head_python(head, unescape)


def _parse_head_python(head: bytes, unescape: bool) -> tuple[str, dict[str, str]]:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("invalid UTF-8", "frame headers are not valid UTF-8", _receipt(head)) from None
    lines = text.split("\n")
    command = lines[0]
    headers = {}
    esc = unescape and "\\" in text  # no backslash anywhere: nothing to unescape
    for i in range(1, len(lines)):
        name, sep, value = lines[i].partition(":")
        if not name or not sep:
            raise ProtocolError("malformed header", f"bad header line {lines[i][:100]!r}",
                                _receipt_text(head, esc))
        if esc:
            try:
                name = _unescape(name)
                value = _unescape(value)
            except ProtocolError as e:
                e.receipt = _receipt_text(head, esc)
                raise
        if name not in headers:
            headers[name] = value
    return command, headers


# Producers repeat their heads byte for byte (same destination, same content-length, no per-message
# header), so without the C decoder the dispatcher remembers the last few hundred short heads it
# decoded, one table per escaping mode. A hit costs a lookup and a dict copy instead of a decode, split
# and loop. The C decoder costs less than the table's upkeep for every head but an exact repeat (0.39
# against 1.08 us for a head whose receipt alone differs; 0.34 against 0.18 for an exact repeat, and
# a SEND repeating its session's last head is not decoded at all: Broker.send_again).
HEAD_CACHE_ENTRIES = 512
HEAD_CACHE_MAX_HEAD = 512  # longer heads are rarely repeated; they are decoded every time
_HEADS: tuple[dict, dict] = ({}, {})


def parse_head_cached(head: bytes, unescape: bool) -> tuple[str, dict[str, str]]:
    """parse_head, remembered for short heads. The caller gets its own dict (handlers may change it).

    A client numbers its receipts, so a head with a ``receipt`` would never repeat: its first
    receipt line is cut out, the rest looked up (or decoded and remembered) and the receipt put
    back in the copy (last in its order: it is never forwarded). A receipt that needs unescaping
    or decoding fails, or a rest that does not parse, goes to parse_head whole (its error names the
    receipt, as before). Where the C decoder was built, parse_head at once (above)."""
    if _PARSE_HEAD is not None or len(head) > HEAD_CACHE_MAX_HEAD:
        return parse_head(head, unescape)
    cache = _HEADS[unescape]
    hit = cache.get(head)
    if hit is not None:
        return hit[0], hit[1].copy()
    k = head.find(b"\nreceipt:")
    if k >= 0:
        end = head.find(b"\n", k + 9)
        if end < 0:
            end = len(head)
        value = head[k + 9:end]
        if not (unescape and b"\\" in value):
            rest = head[:k] + head[end:]
            hit = cache.get(rest)
            try:
                receipt = value.decode("utf-8")
                if hit is None:
                    hit = parse_head(rest, unescape)
                    _remember(cache, rest, hit)
            except (ProtocolError, UnicodeDecodeError):
                return parse_head(head, unescape)  # raises, naming the receipt
            headers = hit[1].copy()
            headers["receipt"] = receipt  # (the first occurrence wins)
            return hit[0], headers
    command, headers = parse_head(head, unescape)  # a bad head raises here every time: never remembered
    _remember(cache, head, (command, headers))
    return command, headers


def _remember(cache: dict, head: bytes, parsed: tuple[str, dict[str, str]]) -> None:
    if len(cache) >= HEAD_CACHE_ENTRIES:
        cache.clear()  # a table of unique heads is dropped whole: no bookkeeping per hit
    cache[head] = (parsed[0], parsed[1].copy())


def _receipt_text(head: bytes, esc: bool) -> str | None:
    receipt = _receipt(head)
    if receipt is not None and esc:
        try:
            return _unescape(receipt)
        except ProtocolError:
            return None  # not readable
    return receipt


def render_frame(command: str, headers, body: bytes = b"", escape_headers: bool = True) -> bytes:
    """Build a frame; headers is a dict or an iterable of (name, value) pairs (str or int values).

    A content-length header is added when the body is non-empty and none is given.
    """
    parts = [command]
    has_length = False
    for name, value in (headers.items() if isinstance(headers, dict) else headers):
        if type(value) is not str:
            value = str(value)
        if name == "content-length":
            has_length = True
        if escape_headers:
            name = escape(name)
            value = escape(value)
        parts.append(name + ":" + value)
    if body and not has_length:
        parts.append("content-length:" + str(len(body)))
    return ("\n".join(parts) + "\n\n").encode("utf-8") + body + b"\0"
