"""What a pass in this process (``workers=0``) reads and writes instead of the processes' pipes and
shared memory: streams opened here (:func:`local_streams`), output slots of plain memory
(:class:`LocalSlot`) and the spans that fill them (:class:`SpanBuilder`), delivered as a
:class:`~parrecio.pipeline.run.Run` delivers them."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..recordio import RecordReader
from .groups import Placement
from .passes import Span

__all__ = ["LocalSlot", "SpanBuilder", "local_streams"]


class LocalSlot:
    """An output slot of this process: a span's lease (freed with the last view of it)."""

    __slots__ = ("arrays",)

    def __init__(self, layout: Any) -> None:
        self.arrays = layout.arrays(np.empty(layout.nbytes, np.uint8))


class SpanBuilder:
    """Decoded samples collected into spans of one slot, as a Run delivers them."""

    def __init__(self, layout: Any, columns: Sequence[bool], seq: int) -> None:
        self.layout, self.columns, self.row = layout, columns, 0
        self.lease: Optional[LocalSlot] = None
        self.fixed, self.size = layout.has_fixed, layout.slot_size
        self.listed = [f for f, c in enumerate(columns) if c]  # fields whose values are listed
        self.start(seq)

    def start(self, seq: int) -> None:
        self.seq, self.n, self.index = seq, 0, self.row
        self.cols: List[Optional[list]] = [[] if c else None for c in self.columns]

    def outs(self) -> Sequence[Any]:
        """The ``out`` arguments of the next sample (a new slot when this one is full)."""
        if not self.fixed:
            return ()
        lease = self.lease
        if lease is None or self.row == self.size:
            lease = self.lease = LocalSlot(self.layout)
            self.row = self.index = 0
        return self.layout.outs(lease.arrays, self.row)

    def add(self, vals: List[Any]) -> bool:
        """Append one sample; whether the span is full (a slot's worth)."""
        cols = self.cols
        for f in self.listed:
            cols[f].append(vals[f])  # type: ignore[union-attr]
        self.n += 1
        self.row += 1
        return (self.row if self.fixed else self.n) == self.size

    def take(self, seq: int) -> Optional[Span]:
        """The span so far (None when empty); the next one starts at sample ``seq``."""
        span = Span(self.seq, self.n, self.lease, self.index, self.cols) if self.n else None
        self.start(seq)
        return span


def local_streams(cfg: Any, source: Any, epoch: int, stats: Any, names: Dict[int, str], place: Placement,
                  opened: Callable[[List[Any]], None]) -> Iterator[Tuple[int, str, RecordReader, Placement]]:
    """Each stream of ``source``'s epoch, opened and framed in this process for the group stream (its
    name recorded in ``names``), closed after it is read; ``opened(objs)`` is told what is open (to
    close from outside), ``opened([])`` when nothing is."""
    streams = source.streams(epoch)
    try:
        for stream_id, stream in enumerate(streams):
            names[stream_id] = stream.name
            objs: List[Any] = [stream.file]
            opened(objs)
            try:
                reader = RecordReader(_Timed(stream.file, stats), join=cfg.join, on_corrupt=cfg.on_error,
                                      max_record_bytes=cfg.max_record_bytes, source_name=stream.name)
                objs.append(reader)
                yield stream_id, stream.name, reader, place
            finally:
                opened([])
                for obj in reversed(objs):
                    try:
                        obj.close()
                    except OSError:
                        pass
    finally:
        streams.close()


class _Timed:
    """The stream as RecordReader sees it: one underlying read per call (``readinto1``, so that a FIFO
    never blocks for more than it has), the time spent reading counted in ``stats.read_time``."""

    def __init__(self, file: Any, stats: Any) -> None:
        self._file, self._stats = file, stats
        self._readinto = getattr(file, "readinto1", None) or getattr(file, "readinto", None)
        self.name = getattr(file, "name", None)

    def readinto(self, buf: Any) -> Optional[int]:
        t0 = time.perf_counter()
        try:
            if self._readinto is not None:
                return self._readinto(buf)
            data = (getattr(self._file, "read1", None) or self._file.read)(len(buf))
            if data is None:
                return None
            buf[:len(data)] = data
            return len(data)
        finally:
            self._stats.read_time += time.perf_counter() - t0

    def readable(self) -> bool:
        return True
