"""The input ring: payload bytes from the reader process to the decoders, in shared memory.

The reader process is the only writer; it places each record at the next free offset (wrapping around,
a record never straddles the end) and blocks when the ring is full.  The consumer releases space in
stream order, after delivering the groups that used it, by sending the ring position up to which
everything is delivered.  Because space is released only after delivery, a crashed worker's groups are
still in the ring and can be decoded again.

Positions are monotonic byte counts (``head``, ``tail``); the offset in the segment is ``pos % size``.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["RingWriter", "ALIGN"]

ALIGN = 64  # records start on cache-line boundaries: decoders read them faster, the waste is small


class RingWriter:
    """Allocates space for records in a ring of ``size`` bytes.

    ``wait_for_release(needed_tail)`` is called when the ring is full; it must block until the consumer
    has released up to at least ``needed_tail`` (or raise to abort) and return the new tail.
    """

    def __init__(self, size: int, wait_for_release: Callable[[int], int]) -> None:
        self.size = size
        self.max_record = size // 2 - ALIGN  # larger records get a segment of their own
        self.head = 0
        self.tail = 0
        self._wait = wait_for_release

    def place(self, n: int) -> int:
        """Reserve ``n`` bytes; return their offset in the segment.  Blocks while the ring is full."""
        start = self.head
        off = start % self.size
        if off + n > self.size:  # does not fit before the end: skip to the start of the next lap
            start += self.size - off
            off = 0
        end = start + n
        if end - self.tail > self.size:
            self.tail = self._wait(end - self.size)
        self.head = -(-end // ALIGN) * ALIGN
        return off

    def release(self, pos: int) -> None:
        """The consumer released everything before ``pos``."""
        if pos > self.tail:
            self.tail = pos
