"""Realigning groups after a corrupt region: which record starts the next sample.

::

    stream   [a4][b4][a5 broken][b5][a6][b6][a7][b7]     the RecordReader skips a5 and resyncs on b5
    groups   (a4, b4)   b5 dropped   (a6, b6)   (a7, b7)   never (b5, a6): an image with another's label

The RecordReader finds the next record after damage (dmlc-core's resync), but not which record of a
group it is: counting on from there pairs every later record with the wrong sample.  With groups of
more than one record, the framing loops (the reader process, ``workers=0``, the Ray datasource) hand
every record after a corrupt region to one :class:`Realigner` until it says which one starts a group:

1. **The .idx** beside the file, when there is one, lists every record's offset: groups start at
   every ``nf``-th.  Records before the next listed group start are dropped; that one starts a group
   (the first listed start past the damage, or past the record, when the damage hid the next one).
2. **Payload kinds** otherwise (:func:`parrecio.decoders.base.payload_kinds`, e.g. ``Image`` reads
   images, ``Json`` JSON text): a record that only the first field can decode starts a group; one the
   first field cannot decode is dropped.  A record that the first field and another one could both
   decode (``[Raw(), Raw()]``, ``[Json(), Json()]``) leaves the group start unknown.
3. Where neither tells, or the realignment drops more records than damage can explain (``nf + 8``:
   the index or the fields do not describe the stream), the run stops with a
   :class:`~parrecio.errors.CorruptRecordError` naming the corrupt region's offset -- under
   ``on_error="skip"`` too: a skipped sample is counted, a mispaired one would be delivered.

**A record missing from a group** in an intact stream shows the same way, where the fields tell: in a
group opened by a record that only the first field reads, another such record, where a later field's
record belongs (``[Image(), Json()]``: two JPEGs in a row), starts the next group
(:attr:`Realigner.lead`, :meth:`Realigner.missing`); the open group is lost, counted, never paired with
the next sample's records.  Only image formats, whose magic number a 32-byte look tells
(:func:`~parrecio.decoders.sniff.sniff_image`), and only once two groups in a row of the stream were read
whole, each an image and then none (the streak of ``GroupStream._grouped``; one is not enough:
``[Image(), Json()]`` over records of ``[JPEG][JSON][JSON]`` reads one such group, then every other one):
until then such a record is as likely ``fields=`` listed in another order or size than the stream's,
and the decode error's hint says which (:mod:`parrecio.pipeline.mismatch`).  A group opened by a record
the first field cannot read (an extra label, or a label whose image is missing: ``[JSON][JPEG]``) is
not realigned: the kinds cannot tell it from a stream whose records change order there (two producers'
files in one Pipe-mode channel), which realigned would pair every later image with the next sample's
label; its samples fail to decode, as before.

Before the ``.idx`` realigns anything, the last group read whole before the damage must start at one of
its group starts (else the index does not fit the stream: :class:`IndexMismatch`).  A group of one
record needs none of this: every record starts one.  The groups lost are counted in
:attr:`Realigner.skipped_groups`: with an ``.idx``, every listed group start after the last group read
whole up to the one where reading goes on (groups that one region, or a length word that ran on,
swallowed whole included); without, the group
left open by the damage or that lost its first records -- once per corrupt region: groups swallowed
whole leave no trace to count them by.  Damage that runs on to the end of the stream (:meth:`ended`)
counts the groups listed to the end; without an ``.idx``, the group it broke, if records of it were
read (bytes after the last whole group are no group).
"""

from __future__ import annotations

import bisect
import os
from typing import Any, Callable, FrozenSet, List, Optional, Sequence

from ..decoders.sniff import IMAGE_KINDS, describe, first_bytes, sniff
from ..errors import CorruptRecordError
from ..recordio.index import IndexMismatch, check_offsets, read_index_columns
from ..recordio.paths import index_beside

__all__ = ["Realigner", "for_stream", "singles_lost", "EXTRA_DROPS"]

EXTRA_DROPS = 8  # records dropped past nf - 1 (garbage framed inside the damage) before we give up


class Realigner:
    """Decides, after each corrupt region of one stream, which record starts the next group.

    ``kinds``: per field, the payload kinds its decoder reads (None: any); ``names``: the field names
    (for messages); ``index``: a function returning the stream's record offsets from its ``.idx`` (read
    only when damage occurs), or None."""

    def __init__(self, kinds: Sequence[Optional[FrozenSet[str]]], names: Sequence[str], source: str,
                 index: Optional[Callable[[], Sequence[int]]] = None, index_name: str = "its .idx") -> None:
        self.nf = len(kinds)
        self.kinds = tuple(kinds)
        self.names = tuple(names)
        self.source = source
        self._index = index
        self._index_name = index_name
        self._starts: Optional[List[int]] = None  # group starts from the .idx, once read
        self.aligning = False      # records are being dropped until a group start
        self.skipped_groups = 0    # groups known broken by damage
        self._region = 0           # offset of the corrupt region that began the realignment
        self._next_start: Optional[int] = None
        self._listed = -1          # the .idx's first group start after that region
        self._broken = False       # the group at the damage lost records already
        self._dropped = 0
        self._lost_from = 0        # with an .idx: the start of the first group the damage broke
        self._offsets: List[int] = []  # with an .idx: every record's offset, sorted (once read)
        self._resumed_at = -1      # the group start where reading went on after the last damage
        # the image kinds that only the first field reads (none where another field reads any payload)
        self.lead: FrozenSet[str] = frozenset()
        others = [k for k in self.kinds[1:] if k is not None]
        if self.nf > 1 and len(others) == self.nf - 1:
            first = self.kinds[0]
            self.lead = frozenset(k for k in IMAGE_KINDS if (first is None or k in first)
                                  and not any(k in o for o in others))
        self.lead_bytes = first_bytes(self.lead)  # what a lead image's first byte is

    def damaged(self, region: int, open_group: bool, done_at: int = -1) -> None:
        """A corrupt region at stream offset ``region`` was skipped; ``open_group``: the records of a
        group were read before it (that group is broken); ``done_at``: the first record of the last group
        completed before it (-1: none)."""
        if self.nf == 1:
            return
        first = not self.aligning
        if self.aligning:  # more damage before a group start was found: the error names the first
            self._broken = self._broken or open_group
        else:
            self.aligning, self._broken, self._dropped = True, open_group, 0
            self._region = region
        self._next_start = None
        if self._index is not None:
            starts = self._load()
            if first:
                self._check_agrees(done_at)
                # every group after the last one completed is lost up to where reading goes on: the one
                # the damage is in, and any that a length word before it ran on over
                # (not before where reading went on after earlier damage: those were counted then)
                j = bisect.bisect_right(starts, max(done_at, self._resumed_at - 1))
                self._lost_from = starts[j] if j < len(starts) else -1
            i = bisect.bisect_right(starts, region)
            self._next_start = starts[i] if i < len(starts) else -1
            if first:
                self._listed = self._next_start  # (named if no record is found there)

    def _load(self) -> List[int]:
        """The group starts of the .idx (read once, checked to be an index's offsets)."""
        if self._starts is None:
            assert self._index is not None
            offs = sorted(self._index())
            check_offsets(offs, None, self.source, self._index_name)
            self._offsets = offs
            self._starts = offs[:len(offs) // self.nf * self.nf:self.nf]
        return self._starts

    def _check_agrees(self, done_at: int) -> None:
        """The last group read whole before the damage, at ``done_at``, must start where the .idx lists a
        group start: else its group starts are not the stream's -- a line lost or added, or a file changed
        after it was written, or a length word earlier that ran on over records so that the stream's
        groups were paired across them already -- and realigning by them would pair records of two
        samples."""
        starts = self._starts
        assert starts is not None
        if done_at < 0:
            return
        j = bisect.bisect_left(starts, done_at)
        if j < len(starts) and starts[j] == done_at:
            return
        raise IndexMismatch(
            f"the last group read before the corrupt region at byte {self._region} starts at byte {done_at}, "
            f"where {self._index_name} lists no group start: the index does not fit this stream (a line lost "
            f"or added, or the file changed after it was written), or a damaged length word before that ran "
            f"on over records (RecordIO has no checksum); its group starts cannot realign the groups",
            done_at, source=self.source)

    def missing(self, first: int, have: int, offset: int, payload: Any) -> CorruptRecordError:
        """The group that began at ``first`` lost records: after ``have`` of them, the record at ``offset``
        is one only the first field reads (an image of :attr:`lead`), which starts the next group.  Counts
        the group lost and returns the error that names it (raised under ``on_error="raise"``)."""
        self.skipped_groups += 1
        # The groups go on from here, not at the .idx's every nf-th record: damage later is realigned by
        # the kinds (its check that the last whole group starts at a listed group start would blame the
        # index for this record missing).
        self._index = None
        self._starts = None
        return CorruptRecordError(
            f"the sample whose first record is at byte {first} has {have} of {self.nf} records: the record "
            f"at byte {offset} is {describe(payload)}, which only field {self.names[0]!r} reads, so it starts "
            f"the next sample -- a record of this one is missing (or one too many came before it); its "
            f"records are not paired with the next sample's", first, source=self.source)

    def starts_group(self, offset: int, payload: Any) -> bool:
        """While :attr:`aligning`: whether the record at ``offset`` starts a group (then aligning ends)
        or is dropped.  Raises CorruptRecordError where the start cannot be known."""
        if self._next_start is not None:
            if offset > self._next_start >= 0:  # that start was inside the damage too: the next one
                i = bisect.bisect_left(self._starts, offset)
                self._next_start = self._starts[i] if i < len(self._starts) else -1
            start = offset == self._next_start
        else:
            start = self._by_kind(offset, payload)
        if start:
            self.aligning = False
            self.skipped_groups += self._lost(offset) if self._starts is not None else self._broken
            self._resumed_at = offset
            return True
        self._broken = True
        self._dropped += 1
        if self._dropped > self.nf - 1 + EXTRA_DROPS:
            if self._next_start is not None:  # the index's group start is not where the records are
                listed = (f"lists the next group start at byte {self._listed}, where no record of this "
                          f"stream starts" if self._listed >= 0 else "lists no group start after it")
                raise IndexMismatch(
                    f"could not realign the groups of {self.nf} records after the corrupt region at byte "
                    f"{self._region}: {self._dropped} records dropped, and {self._index_name} {listed}: the "
                    f"index does not fit this stream (bytes inserted or removed, or the file changed after "
                    f"it was written)", self._region, source=self.source)
            how = "no record the first field could start a sample with"
            raise CorruptRecordError(
                f"could not realign the groups of {self.nf} records after the corrupt region at byte "
                f"{self._region}: {self._dropped} records dropped, {how} (the index or the fields do not "
                f"describe this stream)", self._region, source=self.source)
        return False

    def ended(self, last: Optional[int] = None) -> None:
        """The stream ended (``last``: the offset of its last record).  Where records were being dropped
        (damage that ran on to its end), count the groups lost -- those its ``.idx`` lists from the
        broken one on, or one.  Where the ``.idx`` realigned groups, the stream's last record must be one
        it lists: else it does not fit the stream (an error after the samples, but not silence)."""
        if not self.aligning:
            if self._starts is not None and last is not None:
                j = bisect.bisect_left(self._offsets, last)
                if j == len(self._offsets) or self._offsets[j] != last:
                    raise IndexMismatch(
                        f"the stream's last record, at byte {last}, is not one that {self._index_name} lists: "
                        f"the index does not fit this stream (the groups realigned by it after the corrupt "
                        f"region at byte {self._region} may pair records of two samples)", last,
                        source=self.source)
            return
        self.aligning = False
        # (without an .idx, bytes after the last whole group that start no record -- padding, a torn
        # write -- cannot be told from a group whose records were all cut off: counted only when records
        # of a group were read or dropped)
        self.skipped_groups += self._lost(None) if self._starts is not None else int(self._broken)

    def _lost(self, start: Optional[int]) -> int:
        """Groups the .idx lists from the first one the damage broke up to ``start`` (None: the end)."""
        assert self._starts is not None
        if self._lost_from < 0:  # (the damage began past the last listed group start: no listed group)
            return 0
        end = len(self._starts) if start is None else bisect.bisect_left(self._starts, start)
        return max(0, end - bisect.bisect_left(self._starts, self._lost_from))

    def _by_kind(self, offset: int, payload: Any) -> bool:
        kind = sniff(payload)
        could = [i for i, k in enumerate(self.kinds) if k is None or kind in k]
        if 0 not in could:
            return False
        if could == [0]:
            return True
        others = ", ".join(repr(self.names[i]) for i in could)
        raise CorruptRecordError(
            f"cannot tell which record starts the next sample after the corrupt region at byte "
            f"{self._region}: the record at byte {offset} is {describe(payload)} and could be field {others}, "
            f"so the groups of {self.nf} records cannot be realigned without pairing records of different "
            f"samples; a .idx beside the file, or fields that tell a sample's first record from the others "
            f"(Image then Json), let a reader skip the damage", self._region, source=self.source)


def _index_path(cfg: Any, name: str, start: int) -> Any:
    """The ``.idx`` of the stream ``name``: the one ``cfg.index_paths`` pairs with it, or that lies beside
    the file ``name`` (in a channel where other files have none, ``cfg.index_paths`` is empty), when the
    stream is read from its start; else None."""
    if start != 0:
        return None
    idx = next((i for rec, i in cfg.index_paths if str(rec) == name), None)
    return idx if idx is not None else index_beside(name)


def for_stream(cfg: Any, name: str, start: int = 0) -> Realigner:
    """The Realigner of the stream ``name`` of a pipeline with settings ``cfg`` (a PipelineConfig), with
    its ``.idx`` (:func:`_index_path`)."""
    idx = _index_path(cfg, name, start)
    index = None if idx is None else (lambda: read_index_columns(idx)[1])
    return Realigner(cfg.kinds, cfg.names, name, index, str(idx) if idx is not None else "its .idx")


def singles_lost(cfg: Any, name: str, start: int, framed: int) -> int:
    """Groups of one record need no realigning, but damage loses records all the same: a corrupt region,
    a length word that ran on over records, the record a file is cut inside.  With an ``.idx``, the
    stream ``name`` (read whole from ``start``, with damage) lost the records it lists inside the file
    less the ``framed`` ones; without one, or where it cannot be read, 0 (the corrupt regions are
    counted).  The index is read only here, after damage."""
    idx = _index_path(cfg, name, start)
    if idx is None:
        return 0
    try:
        offsets = sorted(read_index_columns(idx)[1])
        check_offsets(offsets, None, name, str(idx))  # (none at 0, or one listed twice: counts nothing)
        size = os.path.getsize(name)
    except (OSError, ValueError, CorruptRecordError):  # (nor an index that cannot be read)
        return 0
    # Records lost inside the file's bytes: those listed past its end are not counted (a file cut at a
    # record's end shows no damage to count them by, and an index of a longer file would count them all).
    return max(0, bisect.bisect_left(offsets, size) - framed)
