"""Streams read straight into the input ring: the kernel's copy is the only copy of a payload.

::

    FIFO, stdin, socket, file object --readinto--> [ window of the input ring ]   (reader process)
                                                      |  RecordReader frames it in place
                                                      v
                                   (ring offset, length) per record --Chunk--> consumer --Task--> workers

A :class:`~parrecio.recordio.reader.RecordReader` asks :class:`RingWindows` for the memory it reads
into (its ``buffers=`` hook).  A window is a stretch of the ring reserved from the ring's head, at most
1/8 of the ring; when the stream's next record does not fit in it, the reader asks for the next one and
carries over the part of the record it has (a few bytes, or one record, per window).  Single-part
payloads are then handed to the decoders where they lie; only what cannot lie there is copied:

- a multipart record (joined in a new buffer) or a record larger than a window (read into a private
  buffer): its group is *held* (copied out) and placed in the ring, or in a one-off segment, whole;
- a group whose records would span more than half the ring: held too.

What a chunk may release (``group_end``) is the *watermark*: the lowest ring position that later chunks
or the framing still need -- the start of the records not framed yet, of the open group, or the head.
Everything below it that no chunk uses (the rest of a window, sharded-out groups, skipped corruption) is
garbage, and is released by the next chunk; when nothing is pending the reader sends an empty chunk to
release it, so that a long stretch of such bytes never leaves the reader waiting for itself.

Why waits end: a window is at most 1/8 of the ring and a group at most half of it, so the space a new
window (or a held group) waits for always lies below the watermark of chunks already sent.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..recordio.reader import Buffers
from .ring import ALIGN, GroupTooLarge, RingWriter

__all__ = ["RingWindows", "window_bytes"]

MAX_WINDOW = 8 << 20   # bytes read ahead at most (and the longest record read in place): 1/8 of the ring


def window_bytes(ring_size: int, parts: int = 8) -> int:
    """The window of a ring of ``ring_size`` bytes: 1/``parts`` of it, 4 KiB to 8 MiB."""
    return max(4096, min(MAX_WINDOW, ring_size // parts))


class RingWindows(Buffers):
    """The RecordReader buffer of one stream, as windows of the input ring (``mem``: a memoryview of its
    segment's mapping).  ``advance(pos)`` raises the reader process's watermark to ring position ``pos``.

    The framing loop keeps :attr:`floor` (where the open group's records lie in the ring, None when no
    group is open or it was copied out) and :attr:`unframed` (the ring position of the first byte not
    framed yet, after the last complete group) current; :attr:`delta` and :attr:`shift` turn a stream
    offset into a segment offset and a ring position while a ring window is :attr:`active`."""

    def __init__(self, ring: RingWriter, mem: memoryview, advance: Callable[[int], None],
                 window: Optional[int] = None) -> None:
        self.ring = ring
        self.mem = mem
        self.obj = mem.obj            # the mapping: what a view of the ring has as .obj
        self.advance = advance
        self.window = window or window_bytes(ring.size)
        self.active = False           # the reader's buffer is a window of the ring (not a private one)
        self.win_pos = 0              # ring position of the window's start
        self.win_off = 0              # its offset in the segment
        self.win_end = 0              # ring position of its end
        self.delta = 0                # stream offset + delta = segment offset (in the active window)
        self.shift = 0                # stream offset + shift = ring position (in the active window)
        self.floor: Optional[int] = None
        self.unframed: Optional[int] = None

    def watermark(self) -> int:
        """What a chunk sent now may release: below the bytes not framed yet, the open group's records
        (:attr:`floor`: a window moved while it was open sets :attr:`unframed` above them), and the head."""
        u = self.unframed
        w = self.ring.head if u is None or not self.active else min(self.ring.head, u)
        return w if self.floor is None else min(w, self.floor)

    def finish(self) -> None:
        """The stream ended, every record of it framed: give the unused end of its last window back to
        the ring when nothing was placed after the window, so that the next stream's window starts
        where this one's bytes end.  A prefix of many small objects (one stream each) then uses the
        ring as one stream of the same bytes does, not a whole window (1/8 of the ring) per object.
        Nothing at or above :attr:`unframed` is in use: every chunk's records and its ``group_end`` lie
        below it; what lies above (a window's unread end, an unfinished group) was never sent."""
        ring, u = self.ring, self.unframed
        if self.active and u is not None and ring.head == self.win_end and self.win_pos <= u < ring.head:
            ring.head = -(-u // ALIGN) * ALIGN
        self.active = False

    def relocate(self, mv: Optional[memoryview], lo: int, kept: int, need: int,
                 offset: int) -> Tuple[Any, memoryview, int, int]:
        ring = self.ring
        head = ring.head
        kept_pos = self.win_pos + (lo - self.win_off) if self.active and mv is self.mem else None
        low = min(p for p in (kept_pos, self.floor, head) if p is not None)
        self.advance(low)  # what lies below is framed and sent, or garbage: release it
        size = max(need, self.window)
        if size <= self.window and not self.scanning:
            if kept_pos is not None and head == self.win_end:
                ring.head = kept_pos  # nothing was placed after the window: it may go on in place
            try:  # waits for ring space (sending what is pending first)
                off, = ring.place((size,), low)
            except GroupTooLarge:  # the open group and this window would outgrow half the ring
                ring.head = head
            else:
                self.active = True
                self.win_pos, self.win_off = ring.placed, off
                self.win_end = ring.placed + size
                self.delta, self.shift = off - offset, ring.placed - offset
                self.unframed = ring.placed  # the bytes carried over (if any) start the window
                return self.obj, self.mem, off, off + size
        # A record larger than a window, or a group that would outgrow half the ring: a private
        # buffer; what is read there is copied into the ring (or a one-off segment) group by group.
        # It grows by a quarter at least: a record of many small parts is joined as it is read, ~100
        # bytes more asked for at a time, and a buffer of just the size asked for copied the record
        # once per part (a 32 MiB record in 97-byte parts: hours).
        # A scan of damage for the next frame head reads it there too, a window at a time: the damage
        # may run longer than the ring, and ring windows are released only behind the views in use
        # (the loop variable's held the reader up: "views still in use hold ...").
        self.active = False
        if mv is not None and mv is not self.mem and not self.scanning:
            size = max(size, len(mv) + len(mv) // 4)
        private = bytearray(size)
        return private, memoryview(private), 0, size
