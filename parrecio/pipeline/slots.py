"""Output slots: where decoders write fixed-shape results, and how the consumer lends them out.

A slot is one shared-memory segment holding ``slot_size`` samples of every fixed-shape output (for each
such output an array ``(slot_size, *shape)``; with ``batch_size`` set, ``slot_size == batch_size`` so a
full slot *is* a batch).  Workers write sample results in place; the consumer hands out numpy views.

Lending: a view never outlives the memory it shows, and a slot is reused only when no view of it is
left.  Views are made from a *lease*, a ctypes array over the slot's memory: every numpy array derived
from it keeps it alive, and a weak reference to it reports the slot free when the last view is
gone.  Its callback may run in any thread, so it only appends to a deque that the consumer drains.

The pool starts with a few slots and grows only when every slot is held by the user (``list(reader)``):
growing then costs what the user holds anyway, while waiting would deadlock.
"""

from __future__ import annotations

import ctypes
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..decoders.base import ArraySpec, OutputSpec
from .shm import Segment

__all__ = ["SlotLayout", "SlotPool", "Lease", "SlotTracker"]

_ALIGN = 64


@dataclass(frozen=True)
class _Entry:
    field: int            # index of the field in the group
    part: Optional[int]   # position in a tuple value, or None when the value itself is the array
    spec: ArraySpec
    offset: int           # byte offset of this entry's (slot_size, *shape) array in the segment


class SlotLayout:
    """Where each fixed-shape output of each field lives inside a slot segment.  Picklable."""

    def __init__(self, specs: Sequence[OutputSpec], slot_size: int) -> None:
        self.slot_size = slot_size
        self.specs = list(specs)
        entries: List[_Entry] = []
        offset = 0
        for f, spec in enumerate(specs):
            parts = [(None, spec)] if isinstance(spec, ArraySpec) else \
                list(enumerate(spec)) if isinstance(spec, tuple) else []
            for part, s in parts:
                if s is None:
                    continue
                entries.append(_Entry(f, part, s, offset))
                offset += -(-(slot_size * s.nbytes) // _ALIGN) * _ALIGN
        self.entries = entries
        # (dtype, element count, byte offset, shape) per entry, worked out once: a Lease is made per batch
        self._views = [(e.spec.dtype, slot_size * int(np.prod(e.spec.shape, dtype=np.int64)), e.offset,
                        (slot_size,) + tuple(e.spec.shape)) for e in entries]
        self.nbytes = max(offset, 1)

    @property
    def has_fixed(self) -> bool:
        return bool(self.entries)

    def arrays(self, buf) -> List[np.ndarray]:
        """One ``(slot_size, *shape)`` array per entry, over ``buf`` (an mmap or a lease)."""
        return [np.frombuffer(buf, dtype, count, offset).reshape(shape) for dtype, count, offset, shape in self._views]

    def outs(self, arrays: List[np.ndarray], index: int) -> List[object]:
        """Per field, the ``out`` argument of ``decode_into`` for the sample at slot ``index``:
        an array (ArraySpec), a tuple of arrays/None (tuple spec), or None (no fixed output)."""
        outs: List[object] = [None] * len(self.specs)
        for f, spec in enumerate(self.specs):
            if isinstance(spec, tuple):
                outs[f] = [None] * len(spec)
        for e, arr in zip(self.entries, arrays):
            if e.part is None:
                outs[e.field] = arr[index, ...]
            else:
                outs[e.field][e.part] = arr[index, ...]
        return [tuple(o) if isinstance(o, list) else o for o in outs]


class Lease:
    """The consumer's claim on a slot's memory while views of it are in the user's hands."""

    __slots__ = ("slot", "arrays", "__weakref__")

    def __init__(self, pool: "SlotPool", slot: int) -> None:
        seg = pool.segments[slot]
        mem = (ctypes.c_ubyte * seg.size).from_buffer(seg.buf)
        self.slot = slot
        self.arrays = pool.layout.arrays(mem)
        # A plain weak reference with a callback, kept alive by the pool until it fires (a
        # weakref.finalize costs several times as much, for an atexit hook this does not need: the
        # segments are unlinked at close whatever views are alive).
        ref = weakref.ref(mem, pool._on_release)
        pool._refs[id(ref)] = (ref, slot)


class SlotPool:
    """The consumer's set of output slots.  Only the consumer thread calls its methods."""

    def __init__(self, layout: SlotLayout, prefix: str, initial: int) -> None:
        self.layout = layout
        self.prefix = prefix
        self.segments: Dict[int, Segment] = {}  # slot number -> its segment (numbers never reused)
        self._made = 0
        self.initial = initial  # what the pool shrinks back to (retire)
        self.free: Deque[int] = deque()
        self._released: Deque[int] = deque()  # appended by the leases' weakref callbacks, from any thread
        self._refs: Dict[int, tuple] = {}  # id of a lease's weak reference -> (it, its slot), until it fires
        self._leased = set()
        self._busy = set()  # acquired by a run, not yet finished
        for _ in range(initial):
            self._grow()

    def _grow(self) -> int:
        slot = self._made
        self.segments[slot] = Segment.create(f"{self.prefix}s{slot}", self.layout.nbytes,
                                             f"output slot {slot} ({self.layout.slot_size} samples' fixed-shape "
                                             f"outputs)")
        self._made += 1
        self.free.append(slot)
        return slot

    def _on_release(self, ref: weakref.ref) -> None:
        # The last view of a lease died (any thread, whenever the garbage collector gets to it): only a
        # deque append and a dict pop, both atomic under the GIL.
        entry = self._refs.pop(id(ref), None)
        if entry is not None:
            self._released.append(entry[1])

    def poll(self) -> None:
        """Take in the slots whose last view died."""
        while self._released:
            slot = self._released.popleft()
            self._leased.discard(slot)
            if slot not in self._busy:
                self.free.append(slot)

    def acquire(self, may_grow: bool) -> Optional[int]:
        """A free slot, or a new one when ``may_grow`` and none is free, else None."""
        self.poll()
        if not self.free:
            if not may_grow:
                return None
            self._grow()
        slot = self.free.popleft()
        self._busy.add(slot)
        return slot

    def lease(self, slot: int) -> Lease:
        """A new lease on ``slot``: views made from it keep the slot out of the free list."""
        self._leased.add(slot)
        return Lease(self, slot)

    def finish(self, slot: int) -> None:
        """The run is done with ``slot``: it is free once no view of it is left."""
        self.poll()  # while it is still busy: poll() frees no busy slot, so it is freed once, here or later
        self._busy.discard(slot)
        if slot not in self._leased:
            self.free.append(slot)

    def retire(self) -> List[str]:
        """Give back the free slots past the initial number (a pool grown by batches the user kept, and has
        let go of since): unmapped here, their names removed; returns those names, which the decoder
        processes unmap too (``Task.retired``).  Called between passes: a pool that grows anew in each
        pass (the user keeps a batch or two) costs a few segments per pass, never a leak."""
        self.poll()
        names: List[str] = []
        while len(self.segments) > self.initial and self.free:
            seg = self.segments.pop(self.free.pop())
            seg.unlink()
            seg.close()
            names.append(seg.name)
        return names

    def unlink(self) -> None:
        """Remove every segment's name (their mappings stay valid)."""
        for seg in self.segments.values():
            seg.unlink()

    def close(self) -> None:
        """Unlink every segment; unmap those no view uses (the others stay mapped for the user)."""
        self.unlink()
        for seg in self.segments.values():
            seg.close()
        self.segments = {}
        self.free.clear()


@dataclass
class _Logical:
    """Logical slot ``k`` of a pass (positions ``k*S .. k*S+S-1``) and the physical slot it uses."""
    phys: int
    remaining: int           # positions not yet delivered or given up
    assigned: int = 0        # positions handed to groups so far
    lease: Optional[Lease] = None


class SlotTracker:
    """The output positions of one pass.  Sample ``p`` (in the order groups are reserved) is written at
    position ``p``: row ``p % S`` of logical slot ``p // S``, which holds a physical slot of the pool from
    its first reservation until every one of its positions was delivered or given up."""

    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        self.size = pool.layout.slot_size
        self.slots: Dict[int, _Logical] = {}
        self.next_pos = 0

    def reserve(self, n: int, may_grow: bool) -> Optional[int]:
        """Positions for ``n`` groups: the first one, or None when no physical slot is free (the user
        holds them, or they are still being filled) and ``may_grow`` is False."""
        S, p0 = self.size, self.next_pos
        ks = range(p0 // S, (p0 + n - 1) // S + 1)
        for k in ks:
            if k not in self.slots:
                phys = self.pool.acquire(may_grow)
                if phys is None:
                    return None
                self.slots[k] = _Logical(phys, S)
        for k in ks:
            self.slots[k].assigned += min(p0 + n, (k + 1) * S) - max(p0, k * S)
        self.next_pos = p0 + n
        return p0

    def dest(self, pos: int, n: int) -> List[Tuple[str, int, int]]:
        """Where ``n`` groups from position ``pos`` go: ``(slot segment, first group, row, count)``
        runs, one per slot they touch."""
        S, out, j = self.size, [], 0
        while j < n:
            k, i = divmod(pos + j, S)
            count = min(S - i, n - j)
            out.append((self.pool.segments[self.slots[k].phys].name, j, i, count))
            j += count
        return out

    def deliver(self, pos: int, n: int) -> Tuple["Lease", int]:
        """Positions ``pos .. pos + n - 1`` (within one slot) are handed to the user: the slot's lease
        and the row of ``pos``."""
        k, i = divmod(pos, self.size)
        slot = self.slots[k]
        if slot.lease is None:
            slot.lease = self.pool.lease(slot.phys)
        lease = slot.lease
        self._done(k, slot, n)
        return lease, i

    def give_up(self, pos: int, n: int) -> None:
        """Positions ``pos .. pos + n - 1`` will never be delivered (failed, or the pass ended)."""
        for p in range(pos, pos + n):
            k = p // self.size
            slot = self.slots.get(k)
            if slot is not None:
                self._done(k, slot, 1)

    def _done(self, k: int, slot: _Logical, n: int) -> None:
        slot.remaining -= n
        if slot.remaining <= 0:
            del self.slots[k]
            slot.lease = None  # the user's views keep the memory; the pool frees it when they are gone
            self.pool.finish(slot.phys)

    def finish(self) -> None:
        """The pass delivered everything: the last slot was only partly used."""
        for k in list(self.slots):
            slot = self.slots[k]
            self._done(k, slot, self.size - slot.assigned)

    def close(self) -> None:
        """The pass is over, whatever was delivered: every slot back to the pool."""
        for k in list(self.slots):
            slot = self.slots.pop(k)
            slot.lease = None
            self.pool.finish(slot.phys)

    def __len__(self) -> int:
        return len(self.slots)
