"""Where the reader process leaves a record while its group is open (:class:`~parrecio.pipeline.groups.Placement`).

- :class:`Mapped`: a regular file mapped read-only; a record stays in the page cache and its part is
  ``(file offset of the payload, length)`` (:mod:`parrecio.pipeline.mapped`);
- :class:`Windows`: a stream read into windows of the input ring (:mod:`parrecio.pipeline.ring_windows`);
  a record stays where ``readinto`` put it and its part is ``(segment offset, length)``, as long as
  its group fits in half the ring;
- the base :class:`~parrecio.pipeline.groups.Placement`: every record copied out as ``bytes`` (the
  shuffle buffer, equal shards of a stream: groups that wait).

A record that cannot stay (a multipart record joined in a buffer of its own, a group that outgrows half
the ring) makes the group held: its records so far are copied out, and the reader places it whole.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from .groups import HOLD, Placement
from .ring import RingWriter
from .ring_windows import RingWindows

__all__ = ["Mapped", "Windows"]


class Mapped(Placement):
    """The records of a file mapped as ``mm``, whose stream offset 0 is at ``start`` in it; ``flat``:
    the reader's own loop for groups of one record (``Placement.flat``)."""

    holds = False

    def __init__(self, mm: Any, start: int, flat: Callable[[Any, Any, List[int]], None]) -> None:
        self.mm = mm
        self.start = start
        self.flat = flat

    def add(self, offset: int, view: memoryview, parts: list) -> Any:
        if view.obj is self.mm:  # in place: its payload starts 8 bytes after its frame
            return (self.start + offset + 8, len(view))
        return HOLD  # a multipart record, joined in a new buffer

    def hold(self, parts: list) -> list:
        mm = self.mm
        return [bytes(mm[o:o + k]) for o, k in parts]


class Windows(Placement):
    """The records of a stream read into the ring windows ``win``; ``advance(pos)`` raises the
    reader's watermark (what a chunk may release) to ring position ``pos``."""

    holds = False

    def __init__(self, win: RingWindows, ring: RingWriter, mem: memoryview,
                 advance: Callable[[int], None]) -> None:
        self.win, self.mem, self.advance = win, mem, advance
        self.obj = win.obj          # what a view of the ring has as .obj
        self.max_span = ring.max_span
        self.floor: Optional[int] = None  # ring position where the open group starts (None: not in a window)

    def begin(self, offset: int, view: memoryview, keep: bool) -> None:
        win = self.win
        self.floor = offset + win.shift if view.obj is self.obj else None
        win.floor = self.floor if keep else None  # what the windows must not reuse

    def add(self, offset: int, view: memoryview, parts: list) -> Any:
        win, n = self.win, len(view)
        if view.obj is self.obj and self.floor is not None and \
                offset + 8 + n + win.shift - self.floor <= self.max_span:
            return (offset + 8 + win.delta, n)  # in place, 8 bytes after its frame
        return HOLD  # joined in a new buffer, read into a private one, or the group outgrows half the ring

    def hold(self, parts: list) -> list:
        self.win.floor = None
        mem = self.mem
        return [bytes(mem[o:o + k]) for o, k in parts]

    def framed(self, offset: int, view: memoryview) -> None:
        win = self.win  # framed up to the end of this record (a joined one: its start)
        win.floor = None
        win.unframed = offset + win.shift + (8 + ((len(view) + 3) & -4) if view.obj is self.obj else 0)

    def garbage(self) -> None:
        self.advance(self.win.watermark())  # released with the next chunk

    def broken(self) -> None:
        self.win.floor = None
