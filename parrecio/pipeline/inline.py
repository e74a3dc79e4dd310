"""``workers=0``: one pass read and decoded in the consumer's own thread (PyTorch's ``num_workers=0``).

The pipeline without its processes: the one group stream (:mod:`parrecio.pipeline.groups`) read here,
through the one decode path (:mod:`parrecio.pipeline.decode`) into local slots, as spans that
:mod:`parrecio.pipeline.batching` turns into samples or batches -- the same values, order, errors,
counts, shuffles and shards as ``workers >= 1`` (docs/ARCHITECTURE.md, "workers=0").  Nothing is started;
decoders need not be picklable and ``pdb`` stops in them.  A group's last record is the reader's view,
decoded before the reader's next step; the others, and every record of a group that waits, are ``bytes``.
"""

from __future__ import annotations

import copy
import os
import time
import weakref
from typing import Any, Callable, Dict, Iterator, Optional

from ..errors import CorruptRecordError
from .batching import deliver
from .decode import FIXED, DecodePlan, FieldFailed
from .groups import Group, GroupStream, InProcess, open_indexed_all
from .local import OpenFiles, SpanBuilder, flat_values, local_failure, local_streams
from .padding import take_rows
from .passes import Pass, Span, ended
from .stats import Stats

__all__ = ["InlineRun", "first_sample"]


class InlineRun(Pass):
    """One pass over the stream, read and decoded by the thread that iterates it."""

    def __init__(self, res: Any, epoch: int, skip: int = 0) -> None:
        super().__init__(res, epoch, skip)
        self.plan = DecodePlan.of(self.cfg)
        self.groups = GroupStream(self.cfg, epoch, skip, context=True)
        self.names: Dict[int, str] = {}   # stream id -> source name
        self.positions: Optional[int] = None  # of this shard's order gone through, once completed
        self.counts = [0, 0]              # samples delivered, skipped (added to stats at the end)
        self.files = OpenFiles()          # what shutdown() closes
        self._started = 0.0

    @property
    def opened_stream(self) -> bool:
        return bool(self.names)  # (each stream's name as it is opened: local_streams)

    def shutdown(self) -> None:
        if os.getpid() == self.owner_pid and not self.closed:
            self.closed = True
            self.files.close()
            self.res.source.end_pass(self.epoch, self.opened_stream)

    def source_of(self, stream_id: int) -> str:
        return self.names.get(stream_id, self.res.source.name)  # (each stream's name as it is opened)

    def forget_after_fork(self) -> None:
        self.closed = self.aborted = True  # (iterated here, it would read the parent's files and FIFOs)
        self.files.objs = []

    def items(self, batch_size: Optional[int], drop_last: bool,
              on_end: Optional[Callable[["InlineRun", float], None]] = None) -> Iterator[Any]:
        """What the user iterates (:func:`~parrecio.pipeline.batching.deliver`); ``on_end(run, seconds)``
        is called when the pass ends, however it ends, with the time from its first ``next()``."""
        plan = self.plan
        if (batch_size is None and self.cfg.kind == "single" and self.groups.flat and len(plan.fields) == 1
                and plan.fields[0][1] != FIXED and not plan.keyed):
            gen = self._pass(flat_values(self.plan, self.groups, self._streams(), self.cursor, self._failed,
                                         self.cfg.on_error == "raise", self.counts, self), on_end, flat=True)
        else:
            gen = self._pass(deliver(self.spans(), self.cfg, batch_size, drop_last, self.cursor, self.where), on_end)
        self.files.gen = weakref.ref(gen)
        return gen

    def _pass(self, items: Any, on_end: Any, flat: bool = False) -> Iterator[Any]:
        self._started = time.perf_counter()
        if self.aborted:
            raise ended(self.owner_pid)
        try:
            if flat:  # flat_values looks at self.aborted itself (no loop here: tiny records' cost)
                self.positions = yield from items
                self.completed = True
            else:
                for item in items:
                    yield item
                    if self.aborted:
                        raise ended(self.owner_pid)
        except Exception as exc:
            self.cursor.failed(exc)
            raise
        finally:
            items.close()  # a generator's
            # what the pass opened (the readers by index) is closed here, as it comes out: shutdown() from
            # on_end below runs inside this generator, where OpenFiles.close() would leave it to the pass
            self.files.gen = None
            self.files.close()
            self._count(on_end)

    def spans(self) -> Iterator[Span]:
        """Every sample of the pass in order, as spans; the first error under ``on_error="raise"``
        after the samples before it."""
        cfg, plan, epoch = self.cfg, self.plan, self.epoch
        decode, keyed = plan.decode, plan.keyed
        recent = self.recent
        seq = self.skip
        out = SpanBuilder(cfg.layout, [t or p for t, p in zip(cfg.travels, cfg.passthrough)], seq, cfg.chunk_bytes)
        failed = None
        try:
            try:
                for g in self._groups():
                    if g.parts is not None:
                        try:
                            vals = decode(g.parts, out.outs(), plan.key(epoch, seq) if keyed else None)
                        except FieldFailed as exc:
                            failed = self._failed(exc, g, seq)
                        else:
                            if recent is not None:  # (batched: where a sample that cannot join its batch lies)
                                recent.append((seq, (g.offset,), g.stream_id))
                            seq += 1
                            if out.add(vals, g.parts):
                                self.count_samples()  # (mid-pass, as the pipeline counts: once a span)
                                yield out.take(seq)  # type: ignore[misc]
                            continue
                    seq += 1  # a group that failed, or that cannot be read: it keeps its position
                    span = out.take(seq)
                    if span is not None:
                        yield span
                    if failed is not None and cfg.on_error == "raise":
                        break
                    self.counts[1] += failed is not None
                    failed = None
            except CorruptRecordError as exc:
                failed = exc.located(seq)
            span = out.take(seq)
            if span is not None:
                yield span
        finally:
            self.counts[0] = out.taken
        if failed is not None:
            raise failed
        self.positions = seq
        self.completed = True

    def _groups(self) -> Iterator[Group]:
        cfg = self.cfg
        if not cfg.by_index:
            return self.groups.groups(self._streams())
        self.names = {i: str(rec) for i, (rec, _) in enumerate(cfg.index_paths)}
        return self.groups.indexed(open_indexed_all(cfg, self.res.source, self.files.objs), list(self.names.values()))

    def _streams(self) -> Iterator[Any]:
        place = InProcess(self.cfg.nfields, self.groups.holds)
        return local_streams(self.cfg, self.res.source, self.epoch, self.stats, self.names, place, self.files,
                             self._check_aborted)

    def _check_aborted(self) -> None:
        """Raise when the pass was ended from another thread (``close()``) while it waits for its source."""
        if self.aborted:
            raise ended(self.owner_pid)

    def _failed(self, failure: FieldFailed, g: Group, index: int) -> Any:
        source = self.source_of(g.stream_id)
        return local_failure(self.cfg, failure, g, index, source, self.groups.first_kinds)

    def _count(self, on_end: Any) -> None:
        """The end of the pass: its counters into ``stats``, then the owner's ``on_end``."""
        delivered, skipped = self.counts
        self.counts = [0, 0]
        self.delivered += delivered
        self.count_samples()  # (what the cursor says was handed out: not what was decoded ahead)
        self.stats.skipped += skipped
        self.stats.add_reader(self.groups.counters())
        if on_end is not None:
            on_end(self, time.perf_counter() - self._started)


def first_sample(res: Any, epoch: int, batch_size: Optional[int]) -> Any:
    """The first sample that this shard's epoch ``epoch`` delivers (a one-row batch when batched), read and
    decoded again in this process, with counters of its own; None when it delivers none or the source
    cannot be read again.  What a resumed pass pads with when it has no sample of its own to copy
    (:func:`parrecio.pipeline.padding.padded`): the one an uninterrupted pass copies."""
    if not res.source.rereadable():
        return None
    run = InlineRun(res, epoch, 0)
    run.stats = Stats()
    items = run.items(batch_size, False)
    try:
        for item in items:
            return take_rows(item, 0, 1) if batch_size else copy.deepcopy(item)
        return None
    finally:
        items.close()  # type: ignore[attr-defined]
        run.shutdown()
