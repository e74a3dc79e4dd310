"""``workers=0``: one pass read and decoded in the consumer's own thread (PyTorch's ``num_workers=0``).

It is the pipeline without its processes: the one group stream (:mod:`parrecio.pipeline.groups`), read
here, through the one decode path (:mod:`parrecio.pipeline.decode`) into local slots, as spans that
:mod:`parrecio.pipeline.batching` turns into samples or batches -- the same values, order, errors
(index, offset, source), ``on_error="skip"`` counts, shuffles and shards as ``workers >= 1``.  Nothing is
started: no process, no pipe, no shared memory; decoders need not be picklable and ``pdb`` stops in them.

Payload lifetime: the last record of a group is the reader's view, decoded before the reader's next
step; the others, and every record of a group that waits (shuffle buffer, equal shards), are ``bytes``.

On purpose unlike the processes: a ``KeyboardInterrupt``/``SystemExit`` raised by a decoder is not a
decode error (Ctrl-C must stop the consumer); an exception that is not a ParrecioError raised while
reading propagates as it is; a decode error's traceback continues into the decoder's frames; counters
are added at the end of the pass, and ``wait_workers_time``/``user_time`` stay 0.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from ..errors import CorruptRecordError
from .batching import batches, unbatched
from .decode import FIXED, DecodePlan, FieldFailed, failure_error
from ..decoders.sniff import sniff
from .groups import CONTEXT, Group, GroupStream, InProcess, open_indexed_all
from .local import SpanBuilder, local_streams
from .passes import Pass, Span, ended

log = logging.getLogger("parrecio")

__all__ = ["InlineRun"]


class InlineRun(Pass):
    """One pass over the stream, read and decoded by the thread that iterates it."""

    def __init__(self, res: Any, epoch: int, skip: int = 0) -> None:
        super().__init__(res, epoch, skip)
        self.plan = DecodePlan.of(self.cfg)
        self.groups = GroupStream(self.cfg, epoch, skip, context=True)
        self.names: Dict[int, str] = {}   # stream id -> source name
        self.positions: Optional[int] = None  # of this shard's order gone through, once completed
        self.counts = [0, 0]              # samples delivered, skipped (added to stats at the end)
        self._gen: Any = None             # a weak reference to the pass's generator
        self._started = 0.0
        self._open: List[Any] = []        # files and readers of the pass, closed by shutdown()

    def shutdown(self) -> None:
        """Close the pass's files now, unless the iterating thread is inside the pass at this moment (a
        close() from another thread): then it closes them itself when it comes out.  Idempotent."""
        if os.getpid() != self.owner_pid:
            return
        self.closed = True
        gen = self._gen() if self._gen is not None else None
        if gen is not None and gen.gi_running:
            return
        opened, self._open = self._open, []
        for obj in opened:
            try:
                obj.close()
            except Exception:
                pass

    def forget_after_fork(self) -> None:
        self.closed = True
        self._open = []

    def items(self, batch_size: Optional[int], drop_last: bool, kind: str, names: Sequence[str],
              on_end: Optional[Callable[["InlineRun", float], None]] = None) -> Iterator[Any]:
        """What the user iterates (see :mod:`parrecio.pipeline.batching`); ``on_end(run, seconds)`` is
        called when the pass ends, however it ends, with the time from its first ``next()``."""
        layout, plan = self.cfg.layout, self.plan
        if (batch_size is None and kind == "single" and self.groups.flat and len(plan.fields) == 1
                and plan.fields[0][1] != FIXED and not plan.keyed):
            gen = self._single(on_end)
        elif batch_size is None:
            gen = self._pass(unbatched(self.spans(), layout, kind, names, self.cursor), on_end)
        else:
            gen = self._pass(batches(self.spans(), batch_size, drop_last, layout, self.nf, kind, names,
                                     self.cursor), on_end)
        self._gen = weakref.ref(gen)
        return gen

    def _pass(self, items: Iterator[Any], on_end: Any) -> Iterator[Any]:
        self._started = time.perf_counter()
        if self.aborted:
            raise ended()
        try:
            for item in items:
                yield item
                if self.aborted:
                    raise ended()
        finally:
            getattr(items, "close")()  # a generator's
            self._count(on_end)

    def _single(self, on_end: Any) -> Iterator[Any]:
        """One record per sample, one value each, nothing planned (the group stream's ``flat`` case):
        the per-record path, kept short."""
        self._started = time.perf_counter()
        if self.aborted:
            raise ended()
        plan, gs, cursor, raise_ = self.plan, self.groups, self.cursor, self.cfg.on_error == "raise"
        call = plan.fields[0][2]
        seq = skipped = 0
        failed = None
        try:
            try:
                for stream_id, name, reader, _ in self._streams():
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
                                failed = self._failed(exc, Group(stream_id, offset, [view], False), seq)
                                if raise_:
                                    break
                                seq += 1
                                skipped += 1
                                failed = None
                                continue
                            seq += 1
                            cursor.pos = seq
                            yield value
                            if self.aborted:
                                raise ended()
                        whole = failed is None
                    finally:
                        gs.flat_done(reader, records, nbytes, whole)
                    if failed is not None:
                        break
            except CorruptRecordError as exc:
                failed = exc.located(seq)
            if failed is not None:
                raise failed
            self.positions = seq
            self.completed = True
        finally:
            self.counts = [seq - skipped, skipped]  # (seq: the samples yielded and skipped)
            self._count(on_end)

    def spans(self) -> Iterator[Span]:
        """Every sample of the pass in order, as spans; the first error under ``on_error="raise"``
        after the samples before it."""
        cfg, plan, epoch = self.cfg, self.plan, self.epoch
        decode, keyed = plan.decode, plan.keyed
        seq = self.skip
        out = SpanBuilder(cfg.layout, [t or p for t, p in zip(cfg.travels, cfg.passthrough)], seq)
        failed = None
        try:
            for g in self._groups():
                if g.parts is not None:
                    try:
                        vals = decode(g.parts, out.outs(), plan.key(epoch, seq) if keyed else None)
                    except FieldFailed as exc:
                        failed = self._failed(exc, g, seq)
                    else:
                        seq += 1
                        if out.add(vals):
                            yield self._out(out.take(seq))  # type: ignore[arg-type]
                        continue
                seq += 1  # a group that failed, or that cannot be read: it keeps its position
                span = out.take(seq)
                if span is not None:
                    yield self._out(span)
                if failed is not None and cfg.on_error == "raise":
                    break
                self.counts[1] += failed is not None
                failed = None
        except CorruptRecordError as exc:
            failed = exc.located(seq)
        span = out.take(seq)
        if span is not None:
            yield self._out(span)
        if failed is not None:
            raise failed
        self.positions = seq
        self.completed = True

    def _out(self, span: Span) -> Span:
        self.counts[0] += span.n
        return span

    def _groups(self) -> Iterator[Group]:
        cfg, gs = self.cfg, self.groups
        if not cfg.by_index:
            return gs.groups(self._streams())
        readers = open_indexed_all(cfg, self.res.source, self._open)
        self.names = {i: str(rec) for i, (rec, _) in enumerate(cfg.index_paths)}
        return gs.indexed(readers, list(self.names.values()))

    def _streams(self) -> Iterator[Any]:
        def opened(objs: List[Any]) -> None:
            self._open = objs  # what shutdown() closes: this stream only
        return local_streams(self.cfg, self.res.source, self.epoch, self.stats, self.names,
                             InProcess(self.nf, self.groups.holds), opened)

    def _failed(self, failure: FieldFailed, g: Group, index: int) -> Any:
        """The DecodeError of sample ``index``, as the pipeline words it; logged when skipped."""
        source = self.names.get(g.stream_id, self.res.source.name)
        kinds = (self.groups.first_kinds or {}).get(source)
        err = failure_error(self.cfg, failure, g.parts or (), index, g.offset, source, kinds,
                            f"the first {len(kinds or ())} records of {source}")
        err.__traceback__ = failure.error.__traceback__  # post-mortem lands in the decoder's frame
        if self.cfg.on_error != "raise":
            log.warning("parrecio: skipped %s", err)
        return err

    def _count(self, on_end: Any) -> None:
        """The end of the pass: its counters into ``stats``, then the owner's ``on_end``."""
        st, c = self.stats, self.groups.counters()
        delivered, skipped = self.counts
        self.counts = [0, 0]
        self.delivered += delivered
        st.samples += delivered
        st.skipped += skipped + c.pop("skipped_groups")
        for k, v in c.items():
            setattr(st, k, getattr(st, k) + v)
        if on_end is not None:
            on_end(self, time.perf_counter() - self._started)
