"""Which groups a shard reads in an epoch, and in what order: pure functions, no I/O, no processes.

::

    indexed files (.idx):  all groups of all files --permutation(seed, epoch)--> global order
                           --pad / drop to a multiple of num_shards--> rank r takes order[r::num_shards]
    streams:               group g goes to rank g % num_shards as it arrives; EvenShards holds a rank's
                           group until its row of num_shards groups is complete (drop), and keeps copies
                           of the first row's groups to repeat at the end (pad)

The reader process (:mod:`parrecio.pipeline.reader_proc`) and ``workers=0``
(:mod:`parrecio.pipeline.inline`) both take their orders from here, so that they deliver the same samples
in the same order.  As in PyTorch's ``DistributedSampler``: the permutation is drawn over the whole data
set *before* it is split, so every epoch gives each rank a different part and the ranks together see
every group exactly once; ``pad`` repeats the first groups of the order to fill the last row, ``drop``
leaves out the groups past the last full row.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import CorruptRecordError, SourceError

__all__ = ["EVEN_SHARDS", "Order", "indexed_order", "shard_length", "whole_groups", "epoch_order", "EvenShards"]

EVEN_SHARDS = (None, "pad", "drop")


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


class Order(Sequence[Tuple[int, int]]):
    """A sequence of ``(file, group)`` pairs held as two int64 arrays: 16 bytes a group, where a list of
    tuples took about 100 (the reader process of a shuffled read of a million groups held 100 MB of it).
    Slicing gives an :class:`Order`; iterating yields plain ints."""

    __slots__ = ("files", "groups")

    def __init__(self, files: np.ndarray, groups: np.ndarray) -> None:
        self.files, self.groups = files, groups

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return Order(self.files[i], self.groups[i])
        return int(self.files[i]), int(self.groups[i])

    def __iter__(self) -> Iterator[Tuple[int, int]]:
        step = 1 << 16  # (plain ints a slice at a time: tolist() of the whole would be the list again)
        for at in range(0, len(self.groups), step):
            yield from zip(self.files[at:at + step].tolist(), self.groups[at:at + step].tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Order({list(self)[:4]}{', ...' if len(self) > 4 else ''}, {len(self)} groups)"


def indexed_order(counts: Sequence[int], *, shuffle: bool, seed: int, epoch: int, num_shards: int,
                  shard_index: int, even: Optional[str]) -> Order:
    """``(file, group)`` pairs that shard ``shard_index`` reads in ``epoch``, in order, for files of
    ``counts[i]`` groups each."""
    total = int(sum(counts))
    starts = np.cumsum([0] + list(counts))
    order = _rng(seed, epoch).permutation(total) if shuffle else np.arange(total)
    if even == "drop":
        order = order[:total - total % num_shards]
    elif even == "pad" and total % num_shards:
        pad = num_shards - total % num_shards
        order = np.concatenate([order, np.resize(order, pad)]) if total else order
    mine = order[shard_index::num_shards]
    files = np.searchsorted(starts, mine, side="right") - 1
    return Order(files.astype(np.int64), (mine - starts[files]).astype(np.int64))


def whole_groups(offsets: Sequence[int], nf: int, source: str, on_error: str) -> Tuple[List[int], bool]:
    """An index's record offsets, sorted and cut to whole groups of ``nf`` records, and whether an
    incomplete last group was left out (under ``on_error="skip"``; ``"raise"`` raises).  (Whether the
    offsets can be the file's at all: :func:`parrecio.recordio.index.check_offsets`.)"""
    offs = sorted(offsets)
    whole = len(offs) // nf * nf
    if whole < len(offs) and on_error == "raise":
        raise CorruptRecordError(f"the index lists {len(offs)} records, not a multiple of the group size "
                                 f"{nf}: the last group is incomplete", offs[whole], source=source)
    return offs[:whole], whole < len(offs)


def epoch_order(cfg: Any, epoch: int, offsets: Sequence[Sequence[int]]) -> Tuple[Order, int]:
    """This shard's ``(file, group)`` order of ``epoch`` for files whose whole groups start at
    ``offsets[file]`` (``cfg``: a PipelineConfig), and how many groups are left to the other shards."""
    nf = cfg.nfields
    counts = [len(o) // nf for o in offsets]
    order = indexed_order(counts, shuffle=cfg.shuffle_mode is not None, seed=cfg.seed, epoch=epoch,
                          num_shards=cfg.num_shards, shard_index=cfg.shard_index, even=cfg.even_shards)
    return order, max(0, sum(counts) - len(order))


def shard_length(total: int, num_shards: int, shard_index: int, even: Optional[str]) -> int:
    """Groups shard ``shard_index`` reads out of ``total``."""
    if even == "drop":
        return total // num_shards
    if even == "pad":
        return -(-total // num_shards) if total else 0
    return max(0, -(-(total - shard_index) // num_shards))


class EvenShards:
    """Equal shard lengths for a stream, whose length is known only at its end.

    Feed it every group of the epoch in stream order (``group(g, item)``, ``item`` None for a group
    of another shard that need not be kept); it returns the items to emit now.  ``end(total)`` returns
    what is left to emit when the epoch's ``total`` groups are known.  Holding costs one group per
    shard (drop), and copies of the first row's groups before this shard's (pad)."""

    def __init__(self, num_shards: int, shard_index: int, even: str) -> None:
        self.n, self.r, self.even = num_shards, shard_index, even
        self.held: Any = None          # our group of the row in progress (drop: emitted when it completes)
        self.held_row = -1
        self.first_row: List[Any] = []  # pad: groups 0 .. r-1 (another shard's, repeated at the end)

    def wants_copy(self, g: int) -> bool:
        """Whether group ``g`` of another shard must be kept (pad: the first row before ours)."""
        return self.even == "pad" and g < self.r

    def group(self, g: int, item: Any) -> List[Any]:
        out: List[Any] = []
        if self.held is not None and g >= (self.held_row + 1) * self.n - 1:
            out.append(self.held)  # its row is complete (this is the row's last group, or later)
            self.held = None
        if g % self.n == self.r:
            if self.even == "drop" and g < (g // self.n + 1) * self.n - 1:
                self.held, self.held_row = item, g // self.n
            else:
                out.append(item)
        elif self.wants_copy(g):
            self.first_row.append(item)
        return out

    def end(self, total: int) -> List[Any]:
        self.held = None  # drop: a row still incomplete at the end is the tail that is left out
        if self.even == "pad" and total % self.n and self.r >= total % self.n:
            # the padding repeats the order from its start, cyclically (DistributedSampler's rule)
            return [self.first_row[(self.r - total % self.n) % total]]
        return []


def resume_overrun(position: int, samples: int, epoch: int) -> SourceError:
    """The error of a resumed epoch whose saved position lies past its end: the data changed since the
    state was saved (a stream's length is known only once it has been read)."""
    return SourceError(f"the resumed position {position} is past the end of epoch {epoch}: this shard's "
                       f"order has {samples} samples now; the data changed since the state was saved, "
                       f"and resuming would skip or repeat samples")
