"""The reader process as the consumer's :class:`~parrecio.pipeline.run.Run` takes it: its chunks in
stream order, its streams' names, its end; and the input ring's accounting -- a chunk's ring space
(and its one-off segment, or its bytes of a mapped file) given back once its samples are delivered.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from .mapped import MappedFiles
from .messages import Chunk, ReaderEnd, StreamStart
from .reader_handle import ReaderHandle
from .shm import Segment, unlink

log = logging.getLogger("parrecio")

__all__ = ["Feed", "CopyOut"]


class Feed:
    """``reader``: the pass's reader process; ``stats``: where its counters are added when it ends."""

    def __init__(self, reader: ReaderHandle, stats: Any, epoch: int) -> None:
        self.reader, self.stats, self.epoch = reader, stats, epoch
        self.streams: Dict[int, str] = {}   # stream id -> its name
        self.end: Optional[ReaderEnd] = None
        self.received_pos = 0               # ring position after the newest chunk received
        self.released_pos = 0               # ring position released to the reader

    def receive(self) -> List[Chunk]:
        """The chunks that are there now (never blocks); raises PipelineError if the reader died."""
        return self._take(self.reader.receive())

    def stop(self) -> List[Chunk]:
        """Stop the reader; the chunks it sent meanwhile (their one-off segments are ours to remove)."""
        return self._take(self.reader.stop())

    def _take(self, msgs: List[Any]) -> List[Chunk]:
        chunks = []
        for msg in msgs:
            if isinstance(msg, Chunk):
                self.received_pos = msg.ring_end
                chunks.append(msg)
            elif isinstance(msg, StreamStart):
                self.streams[msg.stream_id] = msg.name
                log.info("parrecio: epoch %d: reading %s", self.epoch, msg.name)
            elif isinstance(msg, ReaderEnd) and self.end is None:
                self.end = msg
                self.stats.add_reader(msg.stats)
        return chunks

    def release(self, c: Chunk) -> None:
        """Chunk ``c`` was delivered: its ring space, one-off segment or mapped bytes go back."""
        oneoff = mapped = 0
        if c.place.is_file:
            mapped = sum(c.lens)
        elif c.place.is_oneoff:
            unlink(c.place.name)
            oneoff = sum(c.lens)
        self.released_pos = max(self.released_pos, c.ring_end)
        self.reader.release(c.ring_end, oneoff, mapped)

    def ring_in_use(self) -> int:
        """Bytes of the input ring holding chunks received and not yet delivered."""
        return max(0, self.received_pos - self.released_pos)


class CopyOut:
    """The passthrough fields' payloads of a chunk, copied to ``bytes`` by the consumer out of where they
    lie: the input ring (``ring_mem``), a one-off segment, or a mapped file."""

    def __init__(self, passthrough: Any, ring_mem: Any) -> None:
        self.fields = [f for f, p in enumerate(passthrough) if p]
        self.nf = len(passthrough)
        self.ring_mem = ring_mem
        self.mapped = MappedFiles()  # files read in place, mapped here once each

    def __bool__(self) -> bool:
        return bool(self.fields)

    def into(self, c: Chunk, columns: list) -> None:
        """Fill ``columns[f]`` of each passthrough field ``f`` with chunk ``c``'s payloads."""
        nf, ring_mem, place = self.nf, self.ring_mem, c.place
        seg = Segment.attach(place.name) if place.is_oneoff else None
        mem = (memoryview(seg.buf) if seg is not None else
               memoryview(self.mapped.get(place.name)) if place.is_file else ring_mem)
        try:
            offs, lens = c.ring_offs, c.lens
            for f in self.fields:
                columns[f] = [bytes(mem[o:o + k]) for o, k in zip(offs[f::nf], lens[f::nf])]
        finally:
            if mem is not ring_mem:
                mem.release()
            if seg is not None:
                seg.close()

    def close(self) -> None:
        self.mapped.close()
