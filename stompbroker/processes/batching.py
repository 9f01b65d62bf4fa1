"""How a writer gathers one connection's output into batches (pure: no sockets, no clock).

A connection (``writer.Conn``) has ``batches``, the closed batches waiting to be sent, each
``(bytes, stamp of its first frame, frame count, marked frames)``, and ``cur``/``cur_stamp``/
``cur_frames``/``cur_marks``, the batch being filled. With nothing waiting they are the shared
empty ``()`` and ``b""``, so an idle connection keeps no list and no buffer. Marked frames are queue deliveries the writer
reports to the dispatcher once they are sent, so the store keeps them until then. Frames are appended to the current batch; when the next frame would take it past
``limit`` (``write_buffer_size``) the batch is closed first, so a batch never goes over the limit
unless it is one frame larger than that, which is then a batch of its own. Each batch is one send().
On a WebSocket connection each STOMP frame becomes one WebSocket message.
"""

from __future__ import annotations

from ..protocol.websocket import message_header


def add(c, data, stamp: int, limit: int, ws: bool = False, mark: int = 0) -> int:
    """Append one frame to c's current batch (as a WebSocket message when ws); return its bytes on the wire."""
    n = len(data)
    if ws:  # the WebSocket header goes in first and the frame after it: no joined copy between
        header = message_header(data)
        n += len(header)
    if c.cur and len(c.cur) + n > limit:
        close(c)
    if c.cur_frames:
        if ws:
            c.cur += header
        c.cur += data
    else:  # an idle connection keeps no buffer: one is made for its first frame
        c.cur_stamp = stamp
        if ws:
            c.cur = bytearray(header)
            c.cur += data
        else:
            c.cur = bytearray(data)
    c.cur_frames += 1
    c.cur_marks += mark
    c.pending += n
    return n


def close(c) -> None:
    """Close the current batch: it joins the ones waiting to be sent."""
    batch = (c.cur, c.cur_stamp, c.cur_frames, c.cur_marks)
    if c.batches:
        c.batches.append(batch)
    else:
        c.batches = [batch]  # (() while none wait: an idle connection keeps no list)
    c.cur = b""
    c.cur_frames = 0
    c.cur_marks = 0
