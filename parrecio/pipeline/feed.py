"""The reader process as the consumer's :class:`~parrecio.pipeline.run.Run` takes it: its chunks in
stream order, its streams' names, its end; and the input ring's accounting -- a chunk's ring space
(and its one-off segment, or its bytes of a mapped file) given back once its samples are delivered.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import PipelineError, SourceError
from .mapped import FileCheck, MappedFiles, changed_since
from .messages import Chunk, ReaderEnd, StreamStart, Waiting
from .reader_handle import ReaderHandle, ReaderLost
from .shm import Segment, unlink
from .views import exported

log = logging.getLogger("parrecio")

__all__ = ["Feed", "CopyOut", "Payloads"]


class Feed:
    """``reader``: the pass's reader process; ``stats``: where its counters are added when it ends;
    ``hold``: the bytes of groups read in place whose release may be held back (see :meth:`release`)."""

    def __init__(self, reader: ReaderHandle, stats: Any, epoch: int, ring_pos: Tuple[int, int] = (0, 0),
                 hold: int = 0, restart: Optional[Callable[[], ReaderHandle]] = None) -> None:
        self.reader, self.stats, self.epoch = reader, stats, epoch
        self.restart = restart              # a new reader process for the same job (see receive)
        self.hold = hold
        self.sent_pos = ring_pos[0]         # the ring position of the last Release sent
        self.owed = [0, 0]                  # one-off and mapped bytes released and not yet sent
        self.streams: Dict[int, str] = {}   # stream id -> its name
        self.end: Optional[ReaderEnd] = None
        # ring positions: released to the reader, and after the newest chunk received (a pass starts
        # where the chunks that views still pin leave it: ReaderJob.ring_pos)
        self.released_pos, self.received_pos = ring_pos
        self._start = ring_pos[0]
        self.waiting = -1                   # the Releases the reader had seen when it last said Waiting
        self.kept = False                   # the reader ended cleanly and waits for the next pass's job
        self.file: Optional[str] = None     # the segment of the file the reader mapped last

    def receive(self) -> List[Chunk]:
        """The chunks that are there now (never blocks); raises PipelineError if the reader died (the
        file it read in place changed, when that is why)."""
        try:
            msgs = self.reader.receive()
        except ReaderLost:
            if self.restart is None:
                raise
            # A waiting reader killed as its pass began (the OOM killer, a kill): it read nothing, so a
            # new one reads the pass; once only.
            self.reader.stop()
            self.reader, self.restart = self.restart(), None
            if self.sent_pos != self._start:  # (a Release the dead one took with it: ring space freed since)
                self.reader.release(self.sent_pos)
            return []
        except PipelineError as exc:
            why = self._file_changed()
            if why is None:
                raise
            raise SourceError(f"{why} (the reader process died of SIGBUS reading it)") from exc
        return self._take(msgs)

    def _file_changed(self) -> Optional[SourceError]:
        """Why a reader killed by SIGBUS died, if the file it last sent a chunk of changed."""
        if self.file is None or self.reader.proc.exitcode != -getattr(signal, "SIGBUS", 0):
            return None
        return changed_since(self.file)

    def stop(self) -> List[Chunk]:
        """Stop the reader -- unless it was kept for the next pass: then it sends nothing more --; the
        chunks it sent meanwhile (their one-off segments are ours to remove)."""
        return [] if self.kept else self._take(self.reader.stop())

    def _take(self, msgs: List[Any]) -> List[Chunk]:
        chunks = []
        for msg in msgs:
            if isinstance(msg, Chunk):
                self.received_pos = msg.ring_end
                chunks.append(msg)
                if msg.place.is_file:
                    self.file = msg.place.name
            elif isinstance(msg, StreamStart):
                self.streams[msg.stream_id] = msg.name
                if msg.mapped is not None:
                    self.file = msg.mapped
                log.info("parrecio: epoch %d: reading %s", self.epoch, msg.name)
            elif isinstance(msg, Waiting):
                self.waiting = msg.seen
            elif isinstance(msg, ReaderEnd) and self.end is None:
                self.end = msg
                self.stats.add_reader(msg.stats)
        return chunks

    def release(self, c: Chunk, ring: bool = True) -> None:
        """Chunk ``c`` was delivered: its one-off segment or mapped bytes go back, and its ring space
        unless its views pin it (``ring=False``: :meth:`release_ring` gives that back later)."""
        oneoff = mapped = 0
        if c.place.is_file:
            mapped = sum(c.lens)
        elif c.place.is_oneoff:
            unlink(c.place.name)
            oneoff = sum(c.lens)
        if ring:
            self.released_pos = max(self.released_pos, c.ring_end)
        elif not oneoff and not mapped:
            return
        # Nothing is sent once the reader has ended (its ReaderEnd was its last act of this pass): a
        # regular file is often framed whole long before its chunks are delivered, and each send to a
        # process that is gone costs a failed write, a SIGPIPE and an exception -- and a kept reader
        # may be reading the next pass.
        if self.end is not None:
            return
        owed = self.owed
        owed[0] += oneoff
        owed[1] += mapped
        # A Release wakes the reader (10-200 us of the consumer's CPU for the write on a busy 2-core host,
        # median ~50, and the reader's own wake-up).  A file read in place is framed far ahead (its mapped
        # budget is 4x the ring): its releases are held back until ``hold`` bytes are owed, and the reader
        # frames several chunks a wake-up.  Ring space goes back at once (a ring kept small stays in the CPU's caches:
        # RingWriter.plan), as do one-off segments.  Whatever is owed goes out before the consumer waits
        # with no chunk in hand (flush), so the reader never waits on what we hold.
        if oneoff or owed[1] >= self.hold or self.released_pos != self.sent_pos:
            self.flush()

    def flush(self) -> None:
        """Send the releases held back (see :meth:`release`)."""
        owed = self.owed
        if self.end is None and (self.released_pos != self.sent_pos or owed[0] or owed[1]):
            self.reader.release(self.released_pos, owed[0], owed[1])
            self.sent_pos = self.released_pos
            owed[0] = owed[1] = 0

    def release_ring(self, pos: int) -> None:
        """Ring space below ``pos`` goes back (chunks that views pinned)."""
        self.released_pos = max(self.released_pos, pos)
        self.flush()

    def reader_stuck(self) -> bool:
        """Whether the reader waits for space and has seen every release sent: only a release frees it."""
        return self.end is None and self.waiting == self.reader.releases_sent

    def ring_in_use(self) -> int:
        """Bytes of the input ring holding chunks received and not yet delivered."""
        return max(0, self.received_pos - self.released_pos)


class Payloads:
    """A passthrough field's column of one chunk, copied lazily: ``bytes`` of each payload made as it is
    taken (by index or iteration) out of where it lies; a slice is another lazy column.  Unbatched passes
    hand these out, so that each payload is copied just before the user gets it -- one allocation of its
    size at a time, reused by the allocator like a plain read loop's -- instead of a whole chunk's
    (~100 MB of 100 KB records) at once, which glibc trims and faults in again.  Valid while its chunk
    is not released (see :meth:`Run.spans`); an ``mmap`` closed under it (the reader closed from another
    thread) raises ``ValueError``, never reads freed memory.

    Payloads in the input ring or a one-off segment are sliced out of the mapping ``mm``.  A file's
    (``file``: its :class:`~parrecio.pipeline.mapped.FileCheck`) are read with ``pread``, never through
    its mapping: a file truncated under this process would be a SIGBUS in the user's process, where
    ``pread`` returns short (a SourceError naming the file); small ones by blocks (:data:`BLOCK_BYTES`),
    sliced from there, each block followed by a check that the file did not change.

    With ``refs`` (a list), payloads are not copied: each is a read-only memoryview of the mapping
    (:func:`~parrecio.pipeline.views.exported`), its weak reference appended to ``refs``."""

    __slots__ = ("mm", "file", "offs", "lens", "clock", "refs")

    def __init__(self, mm: Any, file: Optional[FileCheck], offs: Sequence[int], lens: Sequence[int],
                 clock: Optional[List[float]] = None, refs: Optional[List[Any]] = None) -> None:
        self.mm, self.file, self.offs, self.lens = mm, file, offs, lens
        self.clock = clock if clock is not None else [0.0]  # seconds spent in pread() (added up)
        self.refs = refs

    def __len__(self) -> int:
        return len(self.offs)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return Payloads(self.mm, self.file, self.offs[i], self.lens[i], self.clock, self.refs)
        if self.refs is not None:
            return exported(self.mm, self.offs[i], self.lens[i], self.refs)
        if self.file is None:
            o = self.offs[i]
            return self.mm[o:o + self.lens[i]]
        return next(self._reads([self.offs[i]], [self.lens[i]]))

    def __iter__(self) -> Iterator[Any]:
        mm, refs = self.mm, self.refs
        if refs is not None:
            return (exported(mm, o, k, refs) for o, k in zip(self.offs, self.lens))
        if self.file is None:
            return (mm[o:o + k] for o, k in zip(self.offs, self.lens))
        return self._reads(self.offs, self.lens)

    def _reads(self, offs: Sequence[int], lens: Sequence[int]) -> Iterator[bytes]:
        file = self.file
        assert file is not None  # (only a file's payloads are read here)
        clock, now = self.clock, time.perf_counter
        last = max((o + k for o, k in zip(offs, lens)), default=0)  # (the column's end in the file)
        block, b0, b1 = b"", 0, 0  # the block read last: file bytes b0..b1
        for o, k in zip(offs, lens):
            if k >= PREAD_BYTES:
                t0 = now()
                b = _read(file, o, k)
                clock[0] += now() - t0  # the consumer's time, not the user's (ParallelReader._iterate)
                yield b
                continue
            if o < b0 or o + k > b1:
                t0 = now()
                b0 = o
                block = _read(file, o, max(k, min(BLOCK_BYTES, last - o)))
                b1 = o + len(block)
                clock[0] += now() - t0
            yield block[o - b0:o - b0 + k]


# A file's payload this large is read alone; smaller ones are read by blocks of BLOCK_BYTES (or up to the
# end of their column) and sliced from the block: one pread() and one fstat() per block, and a second
# copy of the bytes that costs less than a system call per payload would.
PREAD_BYTES = 32 << 10
BLOCK_BYTES = 1 << 20


def _read(file: FileCheck, o: int, k: int) -> bytes:
    """``k`` bytes at offset ``o`` of the file checked by ``file``, and a check that it did not change
    (before these bytes are handed out); SourceError where the file ends short of them."""
    b = os.pread(file.fd, k, o)
    file()
    if len(b) != k:  # (the check above tells a truncation first: kept in case it could not)
        raise SourceError(f"{file.path} was truncated while it was being read: {k} bytes at offset {o} "
                          f"expected, {len(b)} there")
    return b


class CopyOut:
    """The passthrough fields' payloads of a chunk, copied to ``bytes`` by the consumer out of where they
    lie: the input ring (the mapping ``ring_buf``), a one-off segment, or a mapped file.  Slicing an
    ``mmap`` makes the ``bytes`` in one copy (no memoryview in between)."""

    def __init__(self, passthrough: Any, ring_buf: Any) -> None:
        self.fields = [f for f, p in enumerate(passthrough) if p]
        self.nf = len(passthrough)
        self.ring_buf = ring_buf
        self.mapped = MappedFiles()  # files read in place, mapped here once each
        self.clock = [0.0]  # seconds its lazy columns spent reading large payloads (Payloads.clock)

    def __bool__(self) -> bool:
        return bool(self.fields)

    def into(self, c: Chunk, columns: list, lazy: bool = False,
             refs: Optional[List[Any]] = None) -> Optional[Segment]:
        """Fill ``columns[f]`` of each passthrough field ``f`` with chunk ``c``'s payloads: lists of
        ``bytes``, or with ``lazy`` :class:`Payloads` (views of the payloads, with ``refs``); then the
        one-off segment they are read from (to :meth:`Segment.close` once the chunk is released) when
        it is lazy, else None."""
        nf, place = self.nf, c.place
        seg = Segment.attach(place.name) if place.is_oneoff else None
        mm = seg.buf if seg is not None else self.mapped.get(place.name) if place.is_file else self.ring_buf
        file = self.mapped.check(place.name) if place.is_file else None  # (checked by get() just now)
        try:
            offs, lens = c.ring_offs, c.lens
            for f in self.fields:
                col = Payloads(mm, file, offs[f::nf], lens[f::nf], self.clock, refs)
                columns[f] = col if lazy else list(col)
        except BaseException:
            if seg is not None:
                seg.close()
            raise
        if seg is not None and not lazy:
            seg.close()
            seg = None
        return seg

    def close(self) -> None:
        self.mapped.close()
