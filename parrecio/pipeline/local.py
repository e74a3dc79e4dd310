"""What a pass in this process (``workers=0``) reads and writes instead of the processes' pipes and
shared memory: streams opened here (:func:`local_streams`), output slots of plain memory
(:class:`LocalSlot`) and the spans that fill them (:class:`SpanBuilder`), delivered as a
:class:`~parrecio.pipeline.run.Run` delivers them."""

from __future__ import annotations

import logging
import os
import stat
import time
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..decoders.sniff import sniff
from ..errors import CorruptRecordError
from ..recordio import RecordReader
from ..sources.fifo import enlarge_pipe, stoppable, while_stoppable
from .decode import FieldFailed, failure_error, log_skipped
from .groups import CONTEXT, Group, GroupStream, Placement
from .mapped import FileCheck
from .passes import Cursor, Span, ended
from .poller import ReadyCheck, below_buffer

__all__ = ["LocalSlot", "SpanBuilder", "OpenFiles", "local_streams", "flat_values", "local_failure"]

log = logging.getLogger("parrecio")


class LocalSlot:
    """An output slot of this process: a span's lease (freed with the last view of it)."""

    __slots__ = ("arrays",)

    def __init__(self, layout: Any) -> None:
        self.arrays = layout.arrays(np.empty(layout.nbytes, np.uint8))


class SpanBuilder:
    """Decoded samples collected into spans of one slot, as a Run delivers them."""

    def __init__(self, layout: Any, columns: Sequence[bool], seq: int, max_bytes: int) -> None:
        self.layout, self.columns, self.row = layout, columns, 0
        self.lease: Optional[LocalSlot] = None
        self.fixed, self.size = layout.has_fixed, layout.slot_size
        self.listed = [f for f, c in enumerate(columns) if c]  # fields whose values are listed
        self.taken = 0  # samples in the spans taken
        # A span also ends once its samples' payloads reach this many bytes: listed values (raw payloads
        # copied to bytes, decoded values) are held until the span is taken, and slot_size records of
        # tens of MiB each were all held before the first sample was handed out.
        self.max_bytes = max_bytes
        self.start(seq)

    def start(self, seq: int) -> None:
        self.seq, self.n, self.index, self.nbytes = seq, 0, self.row, 0
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

    def add(self, vals: List[Any], parts: Sequence[Any]) -> bool:
        """Append one sample, decoded from the payloads ``parts``; whether the span is full (a slot's
        worth, or, where values are listed, their payloads reached ``max_bytes``)."""
        cols = self.cols
        for f in self.listed:
            cols[f].append(vals[f])  # type: ignore[union-attr]
        self.n += 1
        self.row += 1
        if (self.row if self.fixed else self.n) == self.size:
            return True
        if self.listed:  # (every value in a slot: nothing held but the slot)
            self.nbytes += sum(map(len, parts))
            return self.nbytes >= self.max_bytes
        return False

    def take(self, seq: int) -> Optional[Span]:
        """The span so far (None when empty); the next one starts at sample ``seq``."""
        span = Span(self.seq, self.n, self.lease, self.index, self.cols) if self.n else None
        self.taken += self.n
        self.start(seq)
        return span


def flat_values(plan: Any, gs: GroupStream, streams: Iterator[Tuple[int, str, Any, Placement]], cursor: Cursor,
                failed: Callable[[FieldFailed, Group, int], BaseException], raise_: bool,
                counts: List[int], run: Any) -> Generator[Any, None, int]:
    """The values of a pass in this process when each record is a sample of one value (the group
    stream's :attr:`~parrecio.pipeline.groups.GroupStream.flat` case, ``plan``'s one field not
    fixed-shape, not keyed): the per-record path, kept short.  ``failed(failure, group, index)`` words a
    decode error (raised under ``raise_``, else the sample is skipped); ``counts`` becomes [delivered,
    skipped] however it ends; ``run.aborted`` is looked at after each value (the pass was ended from
    outside: raises).  Returns the positions gone through."""
    call = plan.fields[0][2]
    seq = skipped = 0
    error = None
    try:
        try:
            for stream_id, name, reader, place in streams:
                kinds, records, nbytes, whole = gs.context(name), 0, 0, False
                try:
                    for offset, view in reader.iter_views():
                        records += 1
                        nbytes += len(view)
                        if kinds is not None and records <= CONTEXT:
                            kinds.append(sniff(view))
                        try:
                            if call is None:
                                value = plan.decode((view,), (), None)[0]
                            else:  # the plan's fast call, here without a list per record
                                try:
                                    value = call(view)
                                except Exception:  # the decoder's own error, as FieldFailed
                                    value = plan.decode((view,), (), None)[0]
                        except FieldFailed as exc:
                            error = failed(exc, Group(stream_id, offset, [view], False), seq)
                            if raise_:
                                break
                            seq += 1
                            skipped += 1
                            cursor.skipped += 1  # (its place: see Cursor.handed)
                            error = None
                            continue
                        seq += 1
                        cursor.pos = seq
                        yield value
                        if run.aborted:
                            raise ended(run.owner_pid)
                    whole = error is None
                finally:
                    gs.flat_done(reader, records, nbytes, whole, name, place.start)
                if error is not None:
                    break
        except CorruptRecordError as exc:
            error = exc.located(seq)
        if error is not None:
            raise error
        return seq
    finally:
        counts[:] = [seq - skipped, skipped]  # (seq: the samples yielded and skipped)
        close = getattr(streams, "close", None)
        if close is not None:  # its file now, not when a traceback that holds this frame goes
            close()


class OpenFiles:
    """The files and readers a pass in this process has open now, for :meth:`close` from outside the
    pass (``close()`` of the ParallelReader from another thread).  ``objs``: what is open; ``gen``: a
    weak reference to the pass's generator."""

    def __init__(self) -> None:
        self.objs: List[Any] = []
        self.gen: Any = None

    def close(self) -> None:
        """Close them now, unless the iterating thread is inside the pass at this moment: then the pass
        closes them itself when it comes out."""
        gen = self.gen() if self.gen is not None else None
        if gen is not None and gen.gi_running:
            return
        objs, self.objs = self.objs, []
        for obj in objs:
            try:
                obj.close()
            except Exception:
                pass


def local_failure(cfg: Any, failure: FieldFailed, g: Group, index: int, source: str,
                  first_kinds: Optional[dict]) -> BaseException:
    """The DecodeError of sample ``index`` (group ``g`` of stream ``source``), as the pipeline words it,
    its traceback continued into the decoder's frames (a post-mortem lands there); logged when skipped.
    ``first_kinds``: the group stream's sniff() of each stream's first records."""
    kinds = (first_kinds or {}).get(source)
    err = failure_error(cfg, failure, g.parts or (), index, g.offset, source, kinds,
                        f"the first {len(kinds or ())} records of {source}")
    err.__traceback__ = failure.error.__traceback__
    if cfg.on_error != "raise":
        log_skipped(log, err)
    return err


def local_streams(cfg: Any, source: Any, epoch: int, stats: Any, names: Dict[int, str], place: Placement,
                  files: OpenFiles, check: Optional[Callable[[], None]] = None
                  ) -> Iterator[Tuple[int, str, RecordReader, Placement]]:
    """Each stream of ``source``'s epoch, opened and framed in this process for the group stream (its
    name recorded in ``names``), closed after it is read; ``files.objs`` is what is open meanwhile.
    ``check()`` raises when the pass was ended from another thread (``close()``): looked at while a FIFO
    is waited for and while a read of a pipe or FIFO waits for data, which would otherwise never end."""
    streams: Any = source.streams(epoch) if check is None else stoppable(source.streams(epoch), check)
    try:
        for stream_id, stream in enumerate(streams):
            names[stream_id] = stream.name
            objs: List[Any] = [stream.file]
            files.objs = objs
            try:
                reader = RecordReader(_Timed(stream.file, stats, check), join=cfg.join, on_corrupt=cfg.on_error,
                                      max_record_bytes=cfg.max_record_bytes, source_name=stream.name)
                objs.append(reader)
                yield stream_id, stream.name, reader, place
            finally:
                files.objs = []
                for obj in reversed(objs):
                    try:
                        obj.close()
                    except OSError:
                        pass
    finally:
        streams.close()


_STOP_POLL_MS = 100  # how long a read of a pipe waits for data before it asks whether the pass was ended


class _Timed:
    """The stream as RecordReader sees it: one underlying read per call (``readinto1``, so that a FIFO
    never blocks for more than it has), the time spent reading counted in ``stats.read_time``; with
    ``stop``, a read of a pipe, FIFO or socket waits for data in steps of 0.1 s, calling ``stop()``
    between them (it raises to end the pass)."""

    def __init__(self, file: Any, stats: Any, stop: Optional[Callable[[], None]] = None) -> None:
        self._file, self._stats = file, stats
        self._readinto = getattr(file, "readinto1", None) or getattr(file, "readinto", None)
        self.name = getattr(file, "name", None)
        self._stop = stop
        self._ready: Optional[ReadyCheck] = None  # a pipe or FIFO with a stop(): data awaited in steps
        self._retries: Optional[while_stoppable] = None  # a stream of no descriptor (S3): its retries stop
        # A regular file is checked after each read: one replaced, truncated, rewritten or grown meanwhile
        # is a SourceError, as when the reader process reads it in place (parrecio.pipeline.mapped).
        self._check: Optional[FileCheck] = None
        try:
            fd = file.fileno()
            if stat.S_ISREG(os.fstat(fd).st_mode):
                self._check = FileCheck.of(fd, str(self.name))
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is None and stop is not None:
            self._retries = while_stoppable(stop)
        if fd is not None and self._check is None:
            enlarge_pipe(fd)  # (a FIFO read in 64 KiB turns with its writer: 0.37-0.40x a plain loop)
            mode = os.fstat(fd).st_mode
            if stop is not None and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
                self._file, self._pending = below_buffer(file)  # (as the reader process reads it)
                if self._file is not file:
                    self._readinto = self._file.readinto
                self._ready = ReadyCheck(fd)

    def readinto(self, buf: Any) -> Optional[int]:
        if self._ready is not None and not self._pending():
            while not self._ready.ready(_STOP_POLL_MS):
                self._stop()  # type: ignore[misc]
        t0 = time.perf_counter()
        try:
            if self._retries is not None:
                with self._retries:
                    return self._read(buf)
            return self._read(buf)
        finally:
            self._stats.read_time += time.perf_counter() - t0

    def _read(self, buf: Any) -> Optional[int]:
        if self._readinto is not None:
            n = self._readinto(buf)
        else:
            data = (getattr(self._file, "read1", None) or self._file.read)(len(buf))
            if data is None:
                return None
            buf[:len(data)] = data
            n = len(data)
        if self._check is not None:
            self._check()
        return n

    def readable(self) -> bool:
        return True
