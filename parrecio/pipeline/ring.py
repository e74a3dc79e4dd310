"""The input ring: payload bytes from the reader process to the decoders, in shared memory.

The reader process is the only writer; it places records at the next free offset (wrapping around,
a record never straddles the end) and blocks when the ring is full.  Capacity is checked per group (the
records of one sample), and the consumer is only ever told about complete groups: a group's first
records are never released, and so never overwritten, before the group is complete and decoded.  The consumer
releases space in
stream order, after delivering the groups that used it, by sending the ring position up to which
everything is delivered.  Because space is released only after delivery, a crashed worker's groups are
still in the ring and can be decoded again.

Positions are monotonic byte counts (``head``, ``tail``); the offset in the segment is ``pos % size``.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

__all__ = ["RingWriter", "GroupTooLarge", "ALIGN"]

ALIGN = 64  # records start on cache-line boundaries: decoders read them faster, the waste is small
SOFT_SIZE = 16 << 20  # past this offset, wrap early when the ring's start is free (see plan)


class GroupTooLarge(Exception):
    """The records asked for would span more than :attr:`RingWriter.max_span`: nothing was reserved,
    and the caller must take them elsewhere (a one-off segment, a private buffer)."""


def _align(pos: int) -> int:
    return -(-pos // ALIGN) * ALIGN


class RingWriter:
    """Allocates space for records in a ring of ``size`` bytes.

    ``wait_for_release(needed_tail)`` is called when the ring is full; it must block until the consumer
    has released up to at least ``needed_tail`` (or raise to abort) and return the new tail.

    The unit of capacity is the *group*: the records of one sample, placed one after another from the
    head.  A group may span at most ``max_span`` bytes (half the ring), counted from the head before it
    (the bytes skipped at the end of a lap are part of its span): then the space it waits for always
    lies before that head, i.e. in groups already sent to the consumer, so the wait ends.  A group that
    would span more raises :class:`GroupTooLarge` with nothing reserved; the caller sends it in a
    segment of its own.

    There is one way in, :meth:`place`, for a run of records whose sizes are all known (a held group,
    or one window of a stream); it returns every record's offset or raises.  The records a call places
    are contiguous but for the one jump to the next lap where a record would straddle the end.
    """

    def __init__(self, size: int, wait_for_release: Callable[[int], int], tail: int = 0, head: int = 0) -> None:
        self.size = size
        self.max_span = size // 2
        # (a pass may start after bytes that an earlier one's views still pin: tail .. head are in use)
        self.head = _align(head)
        self.tail = tail
        self.placed = self.head  # position of the last placement's first byte
        self.soft = min(size, SOFT_SIZE)
        self._wait = wait_for_release

    def _plan(self, sizes: Sequence[int], start: int) -> Tuple[List[int], int]:
        """Positions where records of ``sizes`` go from position ``start``, and where the last ends."""
        positions = []
        pos = end = start
        for n in sizes:
            off = pos % self.size
            if off + n > self.size:  # does not fit before the end: skip to the start of the next lap
                pos += self.size - off
            positions.append(pos)
            end = pos + n
            pos = _align(end)
        return positions, end

    def plan(self, sizes: Sequence[int], floor: Optional[int] = None) -> Tuple[List[int], int, int]:
        """Where :meth:`place` would put records of ``sizes`` now, without reserving anything: their
        positions, the end of the last one, and the position their span counts from.

        Early wrap: past :attr:`soft` (16 MiB) into the segment, the records go to the start of the next
        lap instead when all of them fit in space that is free already (what is in flight is small), so
        that the bytes in use stay in the CPU's caches instead of cycling through the whole ring.  That
        needs no wait, so the bytes it skips hold nothing up and are no part of the span; it is not
        taken while bytes below the head (``floor``) must stay where they are."""
        head = self.head
        off = head % self.size
        if sizes and off >= self.soft and (floor is None or floor >= head):
            positions, end = self._plan(sizes, head + self.size - off)
            if end - self.size <= self.tail:
                return positions, end, positions[0]
        positions, end = self._plan(sizes, head)
        return positions, end, head if floor is None else min(floor, head)

    def place(self, sizes: Sequence[int], floor: Optional[int] = None) -> List[int]:
        """Reserve space for records of ``sizes`` and return their offsets in the segment.  ``floor``: a
        position below the head that the span counts from (bytes kept there that must stay until these
        records are sent).  Blocks while the ring is full.

        Raises :class:`GroupTooLarge`, with nothing reserved, if the records would span more than
        :attr:`max_span`."""
        positions, end, base = self.plan(sizes, floor)
        if not positions:
            return []
        if end - base > self.max_span:
            raise GroupTooLarge(f"{len(positions)} records of {sum(sizes)} bytes would span {end - base} "
                                f"bytes of a {self.size}-byte ring (at most {self.max_span})")
        if end - self.tail > self.size:
            self.tail = self._wait(end - self.size)
        self.head = _align(end)
        self.placed = positions[0]
        return [p % self.size for p in positions]

    def release(self, pos: int) -> None:
        """The consumer released everything before ``pos``."""
        if pos > self.tail:
            self.tail = pos
