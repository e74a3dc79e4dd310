"""Spans of samples -> what the user gets: single values, tuples, dicts, or batches of columns.

::

    Run.spans()  --Span(seq, n, lease, index, columns)-->  unbatched() -> one sample at a time
                                                       \\-> batches()   -> batch_size samples as columns

The pipeline delivers *spans*: runs of consecutive samples as columns (:class:`~parrecio.pipeline.run.Span`),
so that a batch is put together with per-batch work only.  A column of a batch is one stacked numpy array
when every value is an array (or numpy scalar) of one shape and dtype, a tuple of columns when every
value is a tuple of one length (``ImageRecord``'s ``(image, label)``), else a list.  When the samples of
a batch fill one output slot in order -- the normal case, since a slot holds ``batch_size`` samples -- its
fixed-shape columns are views of that slot, not copies.
"""

from __future__ import annotations

import operator
from itertools import chain
from typing import Any, Callable, Iterator, List, Optional, Sequence

import numpy as np

from ..errors import CorruptRecordError, DecodeError
from .arrays import concatenated, stacked
from .passes import Cursor, Span
from .slots import SlotLayout

__all__ = ["collate", "shaper", "batches", "unbatched", "unbatched_blocks", "deliver"]


def collate(values: List[Any]) -> Any:
    """Stack a column of values (see the module docstring).  Values whose type has a
    ``collate_batch(values)`` classmethod batch themselves (:class:`parrecio.decoders.ProtobufSample`)."""
    first = values[0]
    own = getattr(type(first), "collate_batch", None)
    if own is not None:
        return own(values)
    if isinstance(first, (np.ndarray, np.generic)):
        shape, dtype = np.shape(first), first.dtype
        if all(isinstance(v, (np.ndarray, np.generic)) and np.shape(v) == shape and v.dtype == dtype
               for v in values):
            return stacked(values)
        return list(values)
    if isinstance(first, tuple) and all(isinstance(v, tuple) and len(v) == len(first) for v in values):
        return tuple(collate(list(col)) for col in zip(*values))
    return list(values)


_single = operator.itemgetter(0)


def shaper(kind: str, names: Optional[Sequence[str]]) -> Callable[[tuple], Any]:
    """values tuple -> the user's view of one sample (or batch): the value itself, the tuple, or a
    dict keyed by the field names."""
    if kind == "single":
        return _single
    if kind == "dict":
        return lambda values: dict(zip(names, values))
    return lambda values: values


def _fixed(layout: SlotLayout, span: Span) -> dict:
    """``{(field, part): rows}``: the span's rows of each fixed-shape output (views of its slot)."""
    i, n = span.index, span.n
    return {(e.field, e.part): arr[i:i + n] for e, arr in zip(layout.entries, span.lease.arrays)}


def _with_parts(col: Optional[list], parts: dict, nparts: int, n: int) -> list:
    """A tuple-spec column: each value's slot positions filled in from ``parts`` (``{part: rows}``)."""
    out = []
    for j in range(n):
        ragged = col[j] if col is not None else (None,) * nparts
        out.append(tuple(parts[p][j] if p in parts else ragged[p] for p in range(nparts)))
    return out


def unbatched(spans: Iterator[Span], layout: SlotLayout, kind: str,
              names: Optional[Sequence[str]], cursor: Cursor) -> Iterator[Any]:
    """One sample at a time, shaped for the user (fixed-shape values are views of their slot);
    ``cursor.pos`` follows the samples handed out."""
    for block in unbatched_blocks(spans, layout, kind, names, cursor):
        yield from block


def unbatched_blocks(spans: Iterator[Span], layout: SlotLayout, kind: str,
                     names: Optional[Sequence[str]], cursor: Cursor) -> Iterator[Iterator[Any]]:
    """:func:`unbatched`, a span at a time: per span, an iterator of its samples, to be taken whole
    before the next one is asked for.  Only asking for the next one drives the pipeline; taking the
    samples of one needs no lock (:meth:`ParallelReader._iterate`)."""
    shape = shaper(kind, names)
    try:
        for sp in spans:
            yield _samples(sp, layout, shape, cursor)
    finally:
        sp = None  # (see batches: the span's slot must not stay leased through an error's traceback)


def _samples(sp: Span, layout: SlotLayout, shape: Callable[[tuple], Any], cursor: Cursor) -> Iterator[Any]:
    """The samples of one span, shaped; ``cursor.pos`` set before each is handed out."""
    cols = sp.columns
    if sp.lease is not None:
        cols = list(cols)
        fixed = _fixed(layout, sp)
        for f, spec in enumerate(layout.specs):
            if isinstance(spec, tuple):
                parts = {p: fixed[(f, p)] for p in range(len(spec)) if (f, p) in fixed}
                cols[f] = _with_parts(cols[f], parts, len(spec), sp.n)
            elif (f, None) in fixed:
                cols[f] = list(fixed[(f, None)])
    pos = sp.seq
    if pos != cursor.pos:  # (samples left out before this span: see Cursor.handed)
        cursor.jump(pos)
    if len(cols) == 1:
        if shape is _single:  # the value itself (raw records: the tightest loop there is)
            for v in cols[0]:  # a list, or lazily copied payloads (parrecio.pipeline.feed.Payloads)
                pos += 1
                cursor.pos = pos
                yield v
            return
        for v in cols[0]:
            pos += 1
            cursor.pos = pos
            yield shape((v,))
    else:
        for values in zip(*cols):
            pos += 1
            cursor.pos = pos
            yield shape(values)


Where = Callable[[int], tuple]  # sample number -> (byte offset of its first record, its stream), or Nones


def _columns(spans: List[Span], layout: SlotLayout, nfields: int, where: Optional[Where] = None) -> List[Any]:
    """The columns of a batch made of ``spans`` (consecutive samples); a sample that cannot join the
    batch is a DecodeError located at it (``where``: its offset and stream), ``_row`` its row."""
    n = sum(sp.n for sp in spans)
    first = spans[0]
    fixed: dict = {}
    if first.lease is not None:
        lease = first.lease
        aligned = all(sp.lease is lease for sp in spans) and all(
            b.index == a.index + a.n for a, b in zip(spans, spans[1:]))
        if aligned:  # zero-copy: the slot holds exactly these samples, in order
            i = first.index
            for e, arr in zip(layout.entries, lease.arrays):
                fixed[(e.field, e.part)] = arr if (i, n) == (0, arr.shape[0]) else arr[i:i + n]
        else:  # samples were skipped: the rows come from several places, copy them together
            pieces = [_fixed(layout, sp) for sp in spans]
            for key in pieces[0]:
                fixed[key] = concatenated([p[key] for p in pieces])
    cols: List[Any] = []
    try:
        for f in range(nfields):
            spec = layout.specs[f]
            if (f, None) in fixed:
                cols.append(fixed[(f, None)])
                continue
            col = spans[0].columns[f] if len(spans) == 1 else list(chain.from_iterable(sp.columns[f] for sp in spans))
            if isinstance(spec, tuple) and fixed:
                cols.append(tuple(fixed[(f, p)] if (f, p) in fixed else collate([v[p] for v in col])
                                  for p in range(len(spec))))
            else:
                cols.append(collate(col))
    except DecodeError as exc:
        err = batch_error(exc, lambda i: _seq_at(spans, i), where)
        err._row = exc.index or 0
        raise err from None
    return cols


def _seq_at(spans: List[Span], i: int) -> int:
    """The sequence number of the batch's ``i``-th sample (spans may have gaps: skipped samples)."""
    for sp in spans:
        if i < sp.n:
            return sp.seq + i
        i -= sp.n
    return spans[-1].seq + spans[-1].n - 1


def batch_error(exc: DecodeError, seq_of: Callable[[int], int], where: Optional[Where] = None) -> DecodeError:
    """A DecodeError raised while batching (its ``index``: the position in the batch, or None) located at
    the sample it names: ``seq_of(i)`` is the sample number of the batch's ``i``-th sample, ``where(seq)``
    its offset and stream where known."""
    seq = seq_of(exc.index or 0)
    offset, source = where(seq) if where is not None else (None, None)
    return exc.located(seq, offset, source)


def _head(spans: List[Span], k: int) -> List[Span]:
    """The first ``k`` samples of ``spans``."""
    out: List[Span] = []
    for sp in spans:
        if k <= 0:
            break
        out.append(sp if sp.n <= k else _split(sp, k)[0])
        k -= sp.n
    return out


def _made(spans: List[Span], layout: SlotLayout, nfields: int, where: Optional[Where], shape: Any,
          cursor: Cursor, rows: int) -> Iterator[Any]:
    """The batch of ``spans`` (``rows`` samples) handed out; where a sample cannot join it, the samples
    before that one first, as a short batch (as before a sample that does not decode), then its error."""
    try:
        cols = _columns(spans, layout, nfields, where)
    except DecodeError as exc:
        k = getattr(exc, "_row", 0)
        if 0 < k < rows:
            head = _head(spans, k)
            cols = _columns(head, layout, nfields, where)
            _handed(cursor, head, k)
            yield shape(tuple(cols))
        raise
    _handed(cursor, spans, rows)
    yield shape(tuple(cols))


def _split(span: Span, k: int) -> tuple:
    """``span``'s first ``k`` samples and the rest, as two spans."""
    cols_a = [None if c is None else c[:k] for c in span.columns]
    cols_b = [None if c is None else c[k:] for c in span.columns]
    return (Span(span.seq, k, span.lease, span.index, cols_a),
            Span(span.seq + k, span.n - k, span.lease, span.index + k, cols_b))


def _handed(cursor: Cursor, spans: List[Span], rows: int) -> None:
    """The batch of ``rows`` samples made of ``spans`` is handed out: the cursor after its last sample,
    the places between them (and before the first) left out."""
    end = spans[-1].seq + spans[-1].n
    cursor.skipped += end - cursor.pos - rows
    cursor.pos = end


def batches(spans: Iterator[Span], batch_size: int, drop_last: bool, layout: SlotLayout,
            nfields: int, kind: str, names: Optional[Sequence[str]], cursor: Cursor,
            where: Optional[Where] = None) -> Iterator[Any]:
    """Group spans into batches of ``batch_size`` samples (the last one shorter unless ``drop_last``).

    When the stream raises a data error (a sample that does not decode, broken framing), the samples
    before it are not lost: they come out as a short batch first, then the error is raised."""
    shape = shaper(kind, names)
    buf: List[Span] = []
    have = 0
    try:
        for sp in spans:
            while sp is not None:
                room = batch_size - have
                if sp.n > room:
                    head, sp = _split(sp, room)
                else:
                    head, sp = sp, None
                buf.append(head)
                have += head.n
                if have == batch_size:
                    ready, buf, have = buf, [], 0  # a batch that cannot be made is not made again below
                    yield from _made(ready, layout, nfields, where, shape, cursor, batch_size)
        if buf and not drop_last:
            ready, buf = buf, []
            yield from _made(ready, layout, nfields, where, shape, cursor, have)
    except (DecodeError, CorruptRecordError):
        if buf:
            ready, buf = buf, []
            yield from _made(ready, layout, nfields, where, shape, cursor, have)
        raise
    finally:
        # An error's traceback keeps this frame, and the frame (its exception in a local of a frame
        # below: a reference cycle) lives until the garbage collector runs: the spans left in its
        # locals would keep their output slots leased that long, and the next pass would grow the
        # pool by a slot for each.
        buf = ready = head = sp = None


def deliver(spans: Iterator[Span], cfg: Any, batch_size: Optional[int], drop_last: bool,
            cursor: Cursor, where: Optional[Where] = None) -> Iterator[Any]:
    """A pass's spans as the user iterates them, samples or batches of ``batch_size``, shaped by the
    pipeline settings ``cfg`` (a PipelineConfig: its layout, kind and field names)."""
    if batch_size is None:
        return unbatched(spans, cfg.layout, cfg.kind, cfg.names, cursor)
    return batches(spans, batch_size, drop_last, cfg.layout, cfg.nfields, cfg.kind, cfg.names, cursor, where)
