"""Equal shards under ``on_error="skip"``: a rank that skipped samples pads its pass back to its share.

``even_shards="pad"``/``"drop"`` give every rank the same number of positions in an epoch's order, so
that DDP's collectives line up.  A sample skipped on one rank (it does not decode, or its group cannot be
read by its ``.idx`` offsets) would leave that rank one sample, and maybe one batch, short: the other
ranks then wait forever in their next all-reduce.  So a rank delivers, for each position it lost, a copy
of the first sample it delivered in the pass, at the end of the pass (as ``DistributedSampler`` pads with
repeated samples):

    positions of the pass  P (the reader's count: ReaderEnd.n_groups, InlineRun.positions)
    delivered              D (samples handed out, counted here)
    resumed at             skip, after B samples of the epoch were delivered (B = skip - those lost before:
                           state_dict()'s "delivered"; the cursor's ``handed`` counts them on)
    padded                 P - B - D    (stats.padded)

Batched, the copies first fill the pass's short last batch, then make whole batches (the last one
shorter), so that the rank yields as many batches as one that skipped nothing; with ``drop_last`` as
many whole batches as its share holds.  The last batch is held back until the pass ends (one batch of
look-ahead), since it can only be filled, or dropped, once the count is known; so the batches come from
the pipeline with ``drop_last=False`` and the rule is applied here.

Groups lost in the framing of a stream (a corrupt region) take no position: every rank reads the whole
stream and loses them alike, and nothing is padded for them.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ..decoders.protobuf_record import SparseCOO, is_csr
from ..errors import PipelineError
from .arrays import concatenated

__all__ = ["pads", "padded", "rows_of", "take_rows", "join_rows"]


def pads(cfg: Any) -> bool:
    """Whether a pass of ``cfg`` pads: equal shards of several ranks, samples skipped on error."""
    return cfg.even_shards is not None and cfg.num_shards > 1 and cfg.on_error == "skip"


# -- rows of a batch: nested tuples and dicts whose leaves are arrays (rows on axis 0) or lists ----------

def rows_of(batch: Any) -> int:
    """The number of samples in ``batch``."""
    if isinstance(batch, SparseCOO) or is_csr(batch):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        return rows_of(next(iter(batch.values())))
    if isinstance(batch, tuple):
        return rows_of(batch[0])
    return len(batch)


def take_rows(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of ``batch``, copied (no view of an output slot)."""
    if isinstance(batch, SparseCOO):
        keep = (batch.indices[:, 0] >= start) & (batch.indices[:, 0] < stop)
        indices = batch.indices[keep]
        indices[:, 0] -= start
        return type(batch)(indices, batch.values[keep].copy(), (stop - start, *batch.shape[1:]))
    if is_csr(batch):
        return batch[start:stop].copy()
    if isinstance(batch, dict):
        return {k: take_rows(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(take_rows(v, start, stop) for v in batch)
    if isinstance(batch, np.ndarray):
        return batch[start:stop].copy()
    return copy.deepcopy(list(batch[start:stop]))


def join_rows(a: Any, b: Any) -> Any:
    """The rows of ``a`` followed by those of ``b`` (of the same structure).  A column is one array where
    both parts are arrays of the same row shape and dtype, else a list of the rows (the batch column rule:
    a held short batch's ragged column may have been stacked, its rows happening to share a shape)."""
    if isinstance(a, SparseCOO) and isinstance(b, SparseCOO) and a.shape[1:] == b.shape[1:]:
        shifted = b.indices.copy()
        shifted[:, 0] += a.shape[0]
        return type(a)(np.concatenate([a.indices, shifted]), np.concatenate([a.values, b.values]),
                       (a.shape[0] + b.shape[0], *a.shape[1:]))
    if is_csr(a) and is_csr(b) and a.shape[1:] == b.shape[1:]:
        import scipy.sparse
        return scipy.sparse.vstack([a, b], format="csr")
    if isinstance(a, dict):
        return {k: join_rows(v, b[k]) for k, v in a.items()}
    if isinstance(a, tuple) and not isinstance(a, SparseCOO):  # (a SparseCOO is one column, a named tuple)
        return tuple(join_rows(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape[1:] == b.shape[1:] \
            and a.dtype == b.dtype:
        return concatenated([a, b])
    return list(a) + list(b)


def _repeat(row: Any, n: int) -> Any:
    """``n`` copies of a one-row batch, as one batch."""
    if isinstance(row, SparseCOO) or is_csr(row):
        out = take_rows(row, 0, min(n, 1))
        for _ in range(n - 1):
            out = join_rows(out, row)
        return out
    if isinstance(row, dict):
        return {k: _repeat(v, n) for k, v in row.items()}
    if isinstance(row, tuple):
        return tuple(_repeat(v, n) for v in row)
    if isinstance(row, np.ndarray):
        return np.repeat(row, n, axis=0)
    return [copy.deepcopy(row[0]) for _ in range(n)]


# -- the pass -----------------------------------------------------------------------------------------

def padded(items: Iterator[Any], run: Any, batch_size: Optional[int], drop_last: bool, stats: Any,
           on_end: Optional[Callable[[], None]] = None,
           epoch_first: Optional[Callable[[], Any]] = None) -> Iterator[Any]:
    """``items`` (one pass's samples or batches), then the copies that bring it to its share.

    ``run`` gives ``before`` (the samples of the epoch delivered before the pass), ``cursor`` (set to each
    item's position as it is handed out, its ``handed`` to the samples of the epoch delivered by then)
    and, once the pass has completed, ``completed`` and ``positions``.  ``on_end`` is called when the
    pass ends, after the last copy or on any exit.  ``epoch_first()``: the epoch's first sample (a one-row
    batch when batched), or None where the source cannot be read again: what a resumed pass copies, as
    an uninterrupted one does (else its own first sample; and it may have none: resumed after the
    epoch's last sample, before its copies)."""
    cursor = run.cursor
    before = run.before   # samples of the epoch delivered before this pass (a resumed one)
    delivered = 0         # samples handed out, not counting `held`
    first: Any = None     # a copy of the pass's first sample (a one-row batch when batched)
    held: Any = None      # the last batch, held back until the count is known
    held_pos = 0
    # A batch held back is not handed out: the stream may be read to its end (run.completed) while the
    # user takes the batch before it, and a loop left then must leave the epoch unfinished.
    run.owes_copies = batch_size is not None
    try:
        try:
            for item in items:
                pos = cursor.pos
                if first is None:
                    first = take_rows(item, 0, 1) if batch_size else copy.deepcopy(item)
                if batch_size is None:
                    delivered += 1
                    cursor.handed = before + delivered
                    yield item
                    continue
                if held is not None:
                    delivered += rows_of(held)
                    cursor.pos, cursor.handed = held_pos, before + delivered
                    yield held
                    cursor.pos = pos
                held, held_pos = item, pos
        except Exception:  # a stop (a corrupt stream): the batch before it still comes out first
            if held is not None:
                cursor.pos, cursor.handed = held_pos, before + delivered + rows_of(held)
                yield held
            raise
        if not run.completed:
            return
        kept = held
        missing, held = _missing(run.positions - before, delivered, held, batch_size, drop_last)
        if kept is not None and held is None:  # the short last batch is dropped: not handed out
            cursor.handed = before + delivered
        if missing > 0 and before and epoch_first is not None:  # resumed: copy what an uninterrupted pass does
            again = epoch_first()
            first = first if again is None else again
        if missing > 0 and first is None:
            if before:
                raise PipelineError(
                    f"shard {run.cfg.shard_index} of epoch {run.epoch} was resumed after its last sample "
                    f"with {missing} copies still owed (even_shards={run.cfg.even_shards!r}, on_error="
                    f"'skip'), and its stream cannot be read again to copy its first sample "
                    f"({run.res.source.name})")
            raise PipelineError(f"every sample of shard {run.cfg.shard_index} in epoch {run.epoch} was "
                                f"skipped: nothing to pad its {missing} positions with (even_shards="
                                f"{run.cfg.even_shards!r}, on_error='skip')")
        # Until the last copy is out, the pass is not over: left here (a break, close()), its state is a
        # position in the epoch, whose copies a resumed pass hands out (ParallelReader._pass_ended).
        run.owes_copies = True
        if held is not None:
            room = max(0, min(missing, batch_size - rows_of(held)))
            if room:
                held = join_rows(held, _repeat(first, room))
                missing -= room
                _count(run, stats, room)
            delivered += rows_of(held)
            # the pass is complete: every position is gone through (skipped ones after the batch too),
            # and the copies in it count as handed out
            cursor.pos, cursor.handed = run.positions, before + delivered
            yield held
        while missing > 0:
            n = 1 if batch_size is None else min(missing, batch_size)
            _count(run, stats, n)
            delivered += n
            # every position of the share is gone through, and each copy counts as a sample handed out
            cursor.pos, cursor.handed = run.positions, before + delivered
            yield copy.deepcopy(first) if batch_size is None else _repeat(first, n)
            missing -= n
        run.owes_copies = False
    finally:
        items.close()  # its own end first (counters, the reader's files), then the owner's
        if on_end is not None:
            on_end()


def _missing(share: int, delivered: int, held: Any, batch_size: Optional[int], drop_last: bool) -> tuple:
    """``(copies to add, the held last batch or None)`` for a pass that owes ``share`` samples and handed
    out ``delivered`` (``held`` not counted)."""
    if batch_size is None:
        return share - delivered, held
    have = delivered + (rows_of(held) if held is not None else 0)
    if not drop_last:
        return share - have, held
    batches_left = share // batch_size - delivered // batch_size  # whole batches only: as the share holds
    missing = max(0, batches_left * batch_size - (have - delivered))
    return missing, (None if batches_left == 0 else held)  # a short last batch is dropped


def _count(run: Any, stats: Any, n: int) -> None:
    run.delivered += n
    stats.padded += n  # (stats.samples: the cursor's handed, Pass.count_samples)
