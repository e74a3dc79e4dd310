"""Samples -> what the user gets: single values, tuples, dicts, or batches of columns.

A column is one stacked numpy array when every value is an array (or numpy scalar) of one shape and
dtype, a tuple of columns when every value is a tuple of one length (``ImageRecord``'s ``(image,
label)``), else a list.  When the ``batch_size`` samples of a batch fill one output slot in order -- the
normal case -- its fixed-shape columns are views of that slot, not copies.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterator, List, Optional, Sequence

import numpy as np

from ..errors import CorruptRecordError, DecodeError
from .run import Sample
from .slots import SlotLayout

__all__ = ["collate", "shaper", "batches"]


def collate(values: List[Any]) -> Any:
    """Stack a column of values (see the module docstring)."""
    first = values[0]
    if isinstance(first, (np.ndarray, np.generic)):
        shape, dtype = np.shape(first), first.dtype
        if all(isinstance(v, (np.ndarray, np.generic)) and np.shape(v) == shape and v.dtype == dtype
               for v in values):
            return np.stack(values)
        return list(values)
    if isinstance(first, tuple) and all(isinstance(v, tuple) and len(v) == len(first) for v in values):
        return tuple(collate(list(col)) for col in zip(*values))
    return list(values)


def shaper(kind: str, names: Optional[Sequence[str]]) -> Callable[[tuple], Any]:
    """values tuple -> the user's view of one sample (or batch): the value itself, the tuple, or a
    dict keyed by the field names."""
    if kind == "single":
        return operator.itemgetter(0)
    if kind == "dict":
        return lambda values: dict(zip(names, values))
    return lambda values: values


def _columns(samples: List[Sample], layout: SlotLayout, nfields: int) -> List[Any]:
    n = len(samples)
    lease = samples[0].lease
    aligned = lease is not None and all(s.lease is lease and s.index == j for j, s in enumerate(samples))
    fixed = {}
    if aligned:  # zero-copy: the slot holds exactly this batch, in order
        for e, arr in zip(layout.entries, lease.arrays):
            fixed[(e.field, e.part)] = arr[:n] if n < arr.shape[0] else arr
    cols: List[Any] = []
    for f in range(nfields):
        spec = layout.specs[f]
        if aligned and (f, None) in fixed:
            cols.append(fixed[(f, None)])
        elif aligned and isinstance(spec, tuple):
            cols.append(tuple(fixed[(f, p)] if (f, p) in fixed else collate([s.values[f][p] for s in samples])
                              for p in range(len(spec))))
        else:
            cols.append(collate([s.values[f] for s in samples]))
    return cols


def batches(samples: Iterator[Sample], batch_size: int, drop_last: bool, layout: SlotLayout,
            nfields: int, kind: str, names: Optional[Sequence[str]]) -> Iterator[Any]:
    """Group samples into batches of ``batch_size`` (the last one shorter unless ``drop_last``).

    When the stream raises a data error (a sample that does not decode, broken framing), the samples
    before it are not lost: they come out as a short batch first, then the error is raised."""
    shape = shaper(kind, names)
    buf: List[Sample] = []
    try:
        for s in samples:
            buf.append(s)
            if len(buf) == batch_size:
                cols = _columns(buf, layout, nfields)
                buf = []
                yield shape(tuple(cols))
    except (DecodeError, CorruptRecordError):
        if buf:
            cols = _columns(buf, layout, nfields)
            buf = []
            yield shape(tuple(cols))
        raise
    if buf and not drop_last:
        cols = _columns(buf, layout, nfields)
        buf = []
        yield shape(tuple(cols))
