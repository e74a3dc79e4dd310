"""The reader process's chunks: complete groups -> one ``Chunk`` message per chunk of groups.

A chunk names one stream and one place (the ring, a mapped file, a one-off segment), its groups have
consecutive positions in this shard's order, and it carries ``group_end``: the ring position below
which everything is framed and sent, or garbage (what the consumer may release once the chunk is
delivered).  A chunk is one message to a worker and one result back (~50-100 us of the consumer's
time), so it should carry enough work: :class:`ChunkSize`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

from .config import PipelineConfig
from .messages import FILE, IN_RING, ONEOFF, Chunk, Place
from .reader_link import Link
from .ring import RingWriter
from .shm import unlink

__all__ = ["Chunker", "ChunkSize", "AUTO_GROUPS", "AUTO_MIN_BYTES", "AUTO_MAX_GROUPS"]

AUTO_GROUPS = 64              # adaptive chunks: at least this many groups (a typical batch) ...
AUTO_MIN_BYTES = 64 << 10     # ... and, for small records, more until their payloads reach this ...
AUTO_MAX_GROUPS = 2048        # ... but never more groups than this


@dataclass
class _Pending:
    """The chunk being filled."""
    stream_id: int = 0
    first_seq: int = 0
    n: int = 0
    nbytes: int = 0
    ring_offs: array = field(default_factory=lambda: array("q"))
    lens: array = field(default_factory=lambda: array("q"))
    stream_offs: array = field(default_factory=lambda: array("q"))
    place: Place = IN_RING          # the ring, or a mapped file (see parrecio.pipeline.mapped)


class ChunkSize:
    """How many groups a chunk takes.  Adaptive sizing: at least AUTO_GROUPS groups, and small records
    keep filling it up to AUTO_MIN_BYTES (at most AUTO_MAX_GROUPS groups).  An explicit chunk_groups is
    exact.

    Ramp-up: the first chunk of each worker fills only its share of one output slot, so that the pass's
    first batch comes after slot_size / workers decodes per worker, not 2 * slot_size."""

    def __init__(self, cfg: PipelineConfig) -> None:
        groups = cfg.reader_chunk_groups()
        if groups is None:
            self.min_groups, self.max_groups, self.min_bytes = AUTO_GROUPS, AUTO_MAX_GROUPS, AUTO_MIN_BYTES
        else:
            self.min_groups = self.max_groups = groups
            self.min_bytes = 0
        self.full_groups = (self.min_groups, self.max_groups)
        self.ramp = cfg.workers if cfg.chunk_groups is None and cfg.layout.has_fixed and cfg.workers else 0
        if self.ramp:
            self.min_groups = self.max_groups = max(1, cfg.slot_size // cfg.workers)

    def sent(self) -> None:
        """A chunk of groups was sent: one step of the ramp-up."""
        if self.ramp:
            self.ramp -= 1
            if not self.ramp:
                self.min_groups, self.max_groups = self.full_groups


class Chunker:
    """The pending chunk and the positions: ``seq`` is the next group's position in this shard's order
    (a resumed epoch starts past the groups it leaves out, which are never sent)."""

    def __init__(self, cfg: PipelineConfig, link: Link, ring: RingWriter, seq: int) -> None:
        self.cfg, self.link, self.ring = cfg, link, ring
        self.seq = seq
        self.pending = _Pending(first_seq=seq)
        self.group_end = 0        # ring position after the last complete group: what a chunk may release
        self.sent_end = 0         # the group_end of the last chunk sent
        self.watermark: Optional[Callable[[], int]] = None  # the ring windows' (a stream read into them)
        self.cut_gap: Optional[int] = None  # views passes: garbage this long is a chunk of its own (advance)
        self.size = ChunkSize(cfg)
        self._mapped_cap = cfg.mapped_chunk_bytes  # (a property: worked out once, asked per group)
        # the file read in place, checked before a chunk of it goes out and after each wait: one that
        # changed is an error, never a chunk of other bytes (parrecio.pipeline.mapped)
        self.check: Optional[Callable[[], None]] = None

    def flush(self, release: bool = False) -> None:
        """Send the pending chunk.  With ``release``, send an empty one when nothing is pending but the
        watermark rose since the last chunk (ring space that only garbage holds, see
        :mod:`parrecio.pipeline.ring_windows`): the consumer releases it in order."""
        p = self.pending
        if p.n or (release and self.group_end > self.sent_end):
            if self.check is not None:
                try:
                    self.check()
                except BaseException:  # its groups may be of other bytes: never sent (a flush at the
                    self.pending = _Pending(stream_id=p.stream_id, first_seq=p.first_seq)  # end sent them)
                    raise
            self.link.send(Chunk(p.first_seq if p.n else self.seq, p.n, p.stream_id, p.ring_offs, p.lens,
                                 p.stream_offs, self.group_end, p.place, self.ring.head))
            self.sent_end = self.group_end
            if p.place.is_file:
                self.link.flight.mapped += p.nbytes  # the consumer releases sum(lens) of the chunk
            self.pending = _Pending(stream_id=p.stream_id, first_seq=self.seq)
            if p.n:
                self.size.sent()
        self.link.handle_ctrl()

    def advance(self, pos: int) -> None:
        """Everything below ring position ``pos`` (and the head) is framed and sent, or garbage.

        In a views pass (:attr:`cut_gap` set) a rise of at least ``cut_gap`` -- a stretch of garbage: a
        window's abandoned end, or one whose records were all copied out, the bytes skipped at a lap's end
        or by an early wrap -- ends the pending chunk below it and is released by an empty chunk of its
        own (:meth:`add` raises it to each group's start first).  A view pins its chunk's whole span,
        from the chunk before's ``group_end`` (:class:`~parrecio.pipeline.views.Pinned`): the next chunk's
        view, the loop variable's, pinned the stretch too -- up to 61 of 64 MiB after an early wrap."""
        pos = min(pos, self.ring.head)
        if self.cut_gap is not None and pos - self.group_end >= self.cut_gap:
            self.flush()
            self.group_end = pos
            self.flush(release=True)
        self.group_end = max(self.group_end, pos)

    def unreadable(self) -> None:
        """A group that cannot be read keeps its position in the order (a chunk's groups have
        consecutive positions)."""
        self.flush()
        self.seq += 1

    def add(self, stream_id: int, parts: List[Tuple[int, int]], first_offset: int, place: Place = IN_RING) -> None:
        """A complete group whose records, ``(offset, length)`` each, are all in the ring or all in the
        mapped file ``place``."""
        if self.cut_gap is not None and place == IN_RING:  # (views: the bytes below it may be garbage)
            # Its first payload lies above group_end, by less than the ring's size: that is its position.
            # (Below the windows' watermark: a group copied above a window leaves the window's rest be.)
            start = self.group_end + (parts[0][0] - self.group_end) % self.ring.size
            self.advance(start if self.watermark is None else min(start, self.watermark()))
        p = self.pending
        if p.n and (p.stream_id != stream_id or p.place != place):  # a chunk names one stream and
            self.flush()                                             # one place
            p = self.pending
        if place.is_file and self.link.flight.mapped:
            self.wait_for_mapped(sum(n for _, n in parts) + p.nbytes)
            p = self.pending
        if p.n == 0:
            p.stream_id, p.first_seq, p.place = stream_id, self.seq, place
        for off, n in parts:
            p.ring_offs.append(off)
            p.lens.append(n)
            p.nbytes += n
        p.stream_offs.append(first_offset)
        p.n += 1
        self.seq += 1
        self.group_end = self.ring.head if self.watermark is None else self.watermark()
        if self._full(p):
            self.flush()

    def add_oneoff(self, stream_id: int, name: str, offs: array, lens: array, first_offset: int) -> None:
        """A group in a one-off segment of its own: a chunk of one group, sent now -- after a check of
        the file it was copied from, as any chunk's (its segment is removed if that fails)."""
        self.flush()
        if self.check is not None:
            try:
                self.check()
            except BaseException:
                unlink(name)
                raise
        self.link.send(Chunk(self.seq, 1, stream_id, offs, lens, array("q", [first_offset]),
                             self.group_end, Place(ONEOFF, name)))
        self.sent_end = self.group_end
        self.seq += 1

    def wait_for_mapped(self, nbytes: int) -> None:
        """Pause while mapped groups in flight would exceed their budget with ``nbytes`` more (the
        page cache costs no shared memory, but descriptors in flight must stay bounded)."""
        flight, budget = self.link.flight, self.cfg.mapped_budget
        if flight.mapped + nbytes <= budget:
            return
        self.flush()
        self.link.wait_while(lambda: bool(flight.mapped) and flight.mapped + nbytes > budget)
        if self.check is not None:  # (the reader is ahead: a change is most likely made while it waits)
            self.check()

    def add_flat(self, stream_id: int, reader: Any, mm: Any, in_file: Place, start: int,
                 copied: Callable[[int, list, int], None], tally: List[int]) -> None:
        """The hot loop of the commonest small-record case (the group stream's ``Placement.flat``): a
        mapped file, one record per group, no shards, no shuffle, no resume skip.  Plain records are
        framed in bulk into the pending chunk's arrays (:meth:`RecordReader.scan_flat`); the one it stops
        at goes through :meth:`RecordReader.iter_views` -- a multipart record (joined in a new buffer) to
        ``copied(stream_id, [payload], offset)``, damage to the reader's ``on_corrupt``, the end.  The
        payloads of ``mm`` (the reader's buffer: a file mapped from its byte 0) are at their file
        offsets.  Adds the records and payload bytes it frames to ``tally`` as it goes (the caller counts
        them when the stream ends on an error too)."""
        cfg = self.cfg
        size, chunk_bytes = self.size, self._cap(in_file)
        while True:
            p = self.pending
            if p.n and (p.stream_id != stream_id or p.place != in_file):
                self.flush()
                p = self.pending
            if self.link.flight.mapped:
                self.wait_for_mapped(p.nbytes + min(chunk_bytes, cfg.mapped_budget // 2))
                p = self.pending
            if p.n == 0:
                p.stream_id, p.first_seq, p.place = stream_id, self.seq, in_file
            k, nb = p.n, p.nbytes
            # the chunk is full at max_groups, at its byte cap, or at min_groups once it has min_bytes
            if k < size.min_groups:
                room_n, room_b = size.min_groups - k, chunk_bytes - nb
            else:
                room_n, room_b = size.max_groups - k, min(chunk_bytes, size.min_bytes) - nb
            if room_n <= 0 or room_b <= 0:  # (a pending chunk is never full here: add() sends full ones)
                self.flush()
                continue
            got, gb = reader.scan_flat(p.ring_offs, p.lens, p.stream_offs, room_n, room_b)
            p.n, p.nbytes = k + got, nb + gb
            self.seq = p.first_seq + p.n
            tally[0] += got
            tally[1] += gb
            if got == room_n or gb >= room_b:  # stopped at a limit: full, or the next phase
                if self._full(p):
                    self.flush()
                continue
            # the next record is not plain, or the stream ended: one step of the general framing
            views = reader.iter_views()
            try:
                got1 = next(views, None)
            finally:
                views.close()
            if got1 is None:
                return
            offset, view = got1
            n = len(view)
            tally[0] += 1
            tally[1] += n
            if view.obj is not mm:  # a multipart record, joined in a new buffer: through the ring
                copied(stream_id, [bytes(view)], offset)
                continue
            p = self.pending  # (a single-part record that needed the slow path: it stays in place)
            if p.n == 0:
                p.stream_id, p.first_seq, p.place = stream_id, self.seq, in_file
            p.ring_offs.append(start + offset + 8)
            p.lens.append(n)
            p.stream_offs.append(offset)
            p.n += 1
            p.nbytes += n
            self.seq = p.first_seq + p.n
            if self._full(p):
                self.flush()

    def _full(self, p: _Pending) -> bool:
        """Whether chunk ``p`` is complete: ``max_groups``, its place's byte cap (:meth:`_cap`), or
        ``min_groups`` with ``min_bytes``."""
        size = self.size
        return p.n >= size.max_groups or p.nbytes >= self._cap(p.place) or (
            p.n >= size.min_groups and p.nbytes >= size.min_bytes)

    def _cap(self, place: Place) -> int:
        """The payload bytes at which a chunk in ``place`` is full (config.mapped_chunk_bytes)."""
        return self._mapped_cap if place.kind == FILE else self.cfg.chunk_bytes
