"""The input ring: payload bytes from the reader process to the decoders, in shared memory.

The reader process is the only writer; it places each record at the next free offset (wrapping around,
a record never straddles the end) and blocks when the ring is full.  Capacity is checked per group (the
records of one sample), and the consumer is only ever told about complete groups: a group's first
records are never released, and so never overwritten, before the group is complete and decoded.  The consumer releases space in
stream order, after delivering the groups that used it, by sending the ring position up to which
everything is delivered.  Because space is released only after delivery, a crashed worker's groups are
still in the ring and can be decoded again.

Positions are monotonic byte counts (``head``, ``tail``); the offset in the segment is ``pos % size``.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["RingWriter", "ALIGN"]

ALIGN = 64  # records start on cache-line boundaries: decoders read them faster, the waste is small
SOFT_SIZE = 16 << 20  # past this offset, wrap early when the ring's start is free (see place)


class RingWriter:
    """Allocates space for records in a ring of ``size`` bytes.

    ``wait_for_release(needed_tail)`` is called when the ring is full; it must block until the consumer
    has released up to at least ``needed_tail`` (or raise to abort) and return the new tail.

    The unit of capacity is the *group*: the records of one sample, placed one after another from the
    group's start (``floor``).  A group may span at most ``max_span`` bytes (half the ring): then the
    space it waits for always lies before its own start, i.e. in groups already sent to the consumer,
    so the wait ends.  A group that would span more goes to a segment of its own (the caller's part).
    """

    def __init__(self, size: int, wait_for_release: Callable[[int], int]) -> None:
        self.size = size
        self.max_span = size // 2
        self.head = 0
        self.tail = 0
        self.placed = 0  # position of the last placement's first byte
        self.soft = min(size, SOFT_SIZE)
        self._wait = wait_for_release

    def place(self, n: int, floor: int) -> int:
        """Reserve ``n`` bytes for a record of the group that starts at position ``floor``; return their
        offset in the segment, or -1 if the group would then span more than :attr:`max_span` (nothing
        is reserved).  Blocks while the ring is full."""
        start = self.head
        off = start % self.size
        if off + n > self.size:  # does not fit before the end: skip to the start of the next lap
            start += self.size - off
            off = 0
        elif off >= self.soft and floor == start and self.tail >= start - off + n:
            # The ring's start is free already (what is in flight is small): go back there, so that
            # the bytes in use stay in the CPU's caches instead of cycling through the whole ring.
            # Only for the first record of a group: the skipped bytes are then no part of its span.
            start += self.size - off
            off = 0
            floor = start
        end = start + n
        if end - floor > self.max_span:
            return -1
        if end - self.tail > self.size:
            self.tail = self._wait(end - self.size)
        self.head = -(-end // ALIGN) * ALIGN
        self.placed = start
        return off

    def span(self, sizes: Sequence[int]) -> int:
        """Bytes that records of ``sizes``, placed from the head now, would span (nothing is reserved)."""
        pos = self.head
        for n in sizes:
            off = pos % self.size
            if off + n > self.size:
                pos += self.size - off
            end = pos + n
            pos = -(-end // ALIGN) * ALIGN
        return (end if sizes else pos) - self.head

    def rewind(self, pos: int) -> None:
        """Give back everything placed after ``pos`` (a group abandoned before it was sent)."""
        self.head = pos

    def release(self, pos: int) -> None:
        """The consumer released everything before ``pos``."""
        if pos > self.tail:
            self.tail = pos
