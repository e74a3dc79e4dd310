"""Raw payloads as views (:meth:`ParallelReader.iter_views`): zero-copy, and never reused under the user.

::

    input ring / one-off segment / mapped file
        |  np.frombuffer(mapping, uint8, length, offset): the *exporter* of one payload (read-only)
        v
    memoryview(exporter) --> the user      (slices, numpy arrays made from it all keep the exporter alive)
        |
    weakref(exporter) in its chunk's list --> Pinned: a chunk's ring space goes back to the reader process
                                              once every exporter of it is gone (its one-off segment and
                                              mapped bytes at once: never reused, kept mapped by the view)

The rule is the output slots' rule: a view is valid for as long as the user holds it, or anything made
from it.  The input ring is released in stream order (a prefix, see :mod:`parrecio.pipeline.ring`), so a
chunk whose views are alive holds back the release of every chunk after it: views that are kept pin the
ring.  When the reader process waits for space that only such views hold (it says so with a
``Waiting`` message, and has seen every ``Release`` sent), the consumer collects garbage once and, if
nothing went back, raises :class:`~parrecio.errors.PipelineError` saying how much the views pin -- never
a hang, never a payload overwritten under a live view.

A pass that ends while views are alive hands its pinned chunks to the next pass (``Resources.pinned``):
that pass's reader process starts its ring at the first byte they pin and writes after the last
(``ReaderJob.ring_pos``), and they go back to it once they are gone.  The same rule holds there: views
kept through a pass pin its ring, and raise once the reader has nowhere to go.

Where the payloads are copies anyway (``workers=0``, whose reader refills one buffer in place; a padded
pass), :func:`as_views` hands out memoryviews of those copies: the same samples of the same types in
every mode, zero-copy where the bytes lie in shared memory.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, Callable, Deque, Iterator, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["exported", "Pinned", "as_views"]


def exported(mm: Any, offset: int, length: int, refs: List[Any]) -> memoryview:
    """A read-only memoryview of ``mm[offset:offset + length]`` without a copy; the weak reference that
    tells when the user let go of it (and of everything made from it) is appended to ``refs``."""
    a = np.frombuffer(mm, np.uint8, length, offset)
    a.flags.writeable = False
    refs.append(weakref.ref(a))
    return memoryview(a)  # type: ignore[arg-type]  # (numpy's stubs do not declare the buffer protocol)


class _Entry:
    """A delivered chunk whose views may be alive: it holds the ring below ``ring_end``; bytes of it may lie
    up to ``top`` (a group copied above the window: see :attr:`Chunk.ring_top`)."""

    __slots__ = ("refs", "first_live", "ring_end", "top")

    def __init__(self, refs: List[Any], ring_end: int, top: int) -> None:
        self.refs, self.first_live, self.ring_end, self.top = refs, 0, ring_end, top

    def alive(self) -> bool:
        refs, i = self.refs, self.first_live
        while i < len(refs) and refs[i]() is None:
            i += 1
        self.first_live = i  # the dead ones are not looked at again
        return i < len(refs)


class Pinned:
    """The ring space of delivered chunks, in stream order, given back -- ``give_back(ring_end)`` -- once
    none of a chunk's views is alive and every chunk before it went back (the ring is released as a
    prefix).  A chunk's one-off segment and mapped bytes go back when it is delivered: they are never
    reused, and a view keeps its mapping alive."""

    def __init__(self) -> None:
        self._q: Deque[_Entry] = deque()
        self.give_back: Callable[[int], None] = _unbound  # set by the pass that holds it
        self.tail = 0             # ring position below which everything went back
        self._oneoffs: List[Tuple[_Entry, int]] = []  # delivered one-off chunks whose views may be alive

    def add_oneoff(self, nbytes: int, refs: List[Any]) -> None:
        """A chunk in a one-off segment of ``nbytes`` was delivered (and went back), its views' weak
        references in ``refs``: while they live, the segment's memory stays in /dev/shm.  Only counted
        (:attr:`oneoff_bytes`), to say so when /dev/shm runs out: views kept of such groups are bounded by
        /dev/shm alone, as output slots the user holds are."""
        self._oneoffs = [(e, n) for e, n in self._oneoffs if e.alive()]
        self._oneoffs.append((_Entry(refs, 0, 0), nbytes))

    @property
    def oneoff_bytes(self) -> int:
        """Bytes of one-off segments that views still hold."""
        self._oneoffs = [(e, n) for e, n in self._oneoffs if e.alive()]
        return sum(n for _, n in self._oneoffs)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __len__(self) -> int:
        return len(self._q)

    @property
    def head(self) -> int:
        """The ring position after the last chunk held back (``tail`` when none is)."""
        return self._q[-1].ring_end if self._q else self.tail

    @property
    def top(self) -> int:
        """The ring position after every byte a chunk held back may lie in: where the next pass's reader
        starts writing (``tail`` when none is held back)."""
        return self._q[-1].top if self._q else self.tail

    def add(self, ring_end: int, refs: List[Any], top: int = -1) -> None:
        """A chunk that holds the ring below ``ring_end`` was delivered, its views' weak references in
        ``refs``: give it back once they are gone and those before it went back (at once if so now).  One
        that holds no ring space beyond the last one held back, and whose views pin none, is not kept:
        behind a view kept for good, an entry per chunk of a file read in place grew without end."""
        if ring_end <= self.head and not refs:
            self.release()
            return
        self._q.append(_Entry(refs, max(ring_end, self.head), max(top, ring_end, self.top)))
        self.release()

    def release(self) -> bool:
        """Give back the chunks at the front whose views are all gone; whether any went back."""
        q = self._q
        pos = None
        while q and not q[0].alive():
            pos = q.popleft().ring_end
        if pos is None:
            return False
        self.tail = max(self.tail, pos)
        self.give_back(self.tail)  # one release for all of them
        return True

    def detach(self) -> "Pinned":
        """This, for the next pass to take (it sets its own ``give_back``): its pass has ended."""
        self.give_back = _unbound
        return self


def _unbound(ring_end: int) -> None:
    raise AssertionError("a Pinned is given back only by the pass that holds it")


def as_views(items: Iterator[Any], passthrough: Sequence[bool], kind: str,
             names: Optional[Sequence[str]]) -> Iterator[Any]:
    """``items`` with each passthrough value (``bytes``, a copy) as a memoryview of it."""
    raw = [f for f, p in enumerate(passthrough) if p]
    try:
        if kind == "single":
            for v in items:
                yield _view(v)
        elif kind == "dict":
            keys = [names[f] for f in raw] if names is not None else []
            for d in items:
                d = dict(d)
                for k in keys:
                    d[k] = _view(d[k])
                yield d
        else:
            for t in items:
                values = list(t)
                for f in raw:
                    values[f] = _view(values[f])
                yield tuple(values)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()  # the pass ends now, not when the garbage collector finds its generator


def _view(v: Any) -> Any:
    return v if v is None or type(v) is memoryview else memoryview(v)

