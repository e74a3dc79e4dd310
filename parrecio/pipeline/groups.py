"""The one group stream: records -> groups of this shard, in the order they are delivered.

::

    streams (RecordReader each, with its Placement)          .idx offsets of every file (by_index)
       |  framing; groups of len(fields) records; the resync rule after damage        |
       |  shards; equal shards (held back or repeated groups)                          |  epoch_order():
       v                                                                               v  shards, permutation
    [ shuffle buffer ]  (shuffle="buffer": draws from default_rng([seed, epoch]))     read_groups()
       |                                                                               |
       +---- the resume skip: the first ``skip`` groups of the order are left out -----+
       v
    Group(stream_id, offset, parts, held)

Every mode walks this one generator: the reader process (:mod:`parrecio.pipeline.reader_proc`) places
what it yields into the ring, a mapped file or a one-off segment; ``workers=0``
(:mod:`parrecio.pipeline.inline`) decodes it where it stands.  Where a record's payload goes while its
group is open is the :class:`Placement`'s business (``parts`` are whatever it returns: ring offsets,
file offsets, ``bytes``, a view), so the rules of grouping, sharding, shuffling and resuming exist once.

The stream's position is data (:class:`GroupStream`'s attributes), not generator locals: ``group_index``
counts the groups seen in the stream (all shards), ``skip`` the groups still to leave out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import CorruptRecordError
from ..decoders.sniff import sniff, sniff_image
from .plan import EvenShards, epoch_order, resume_overrun, whole_groups
from .resync import for_stream, singles_lost

__all__ = ["Group", "GroupStream", "Placement", "InProcess", "HOLD", "CONTEXT", "InOrder"]

CONTEXT = 16    # records sniffed at the start of each stream when asked to: a decode error's hint


class Group(NamedTuple):
    """One sample's records.  ``parts``: one entry per record, as the placement made it (or ``bytes``
    once ``held``: copied out of where it was read, as groups in the shuffle buffer are); ``None`` for a
    group the index lists but that cannot be read (``on_error="skip"``).  ``offset``: the stream offset
    of its first record."""
    stream_id: int
    offset: int
    parts: Optional[list]
    held: bool


def _payload_bytes(g: Group) -> int:
    """The payload bytes a group holds (what it costs in a shuffle buffer)."""
    return sum(len(p) for p in g.parts) if g.parts else 0


_NONE: list = []  # the parts before a group's first record
HOLD = object()  # Placement.add(): this record cannot stay where it was read; copy the group out


class Placement:
    """Where the records of an open group stay.  The base class holds every record as ``bytes``."""

    holds = True    # parts are bytes from the start (no record stays where it was read)
    start = 0       # where the stream's offset 0 lies in its file (the .idx is read only from the start)
    flat: Optional[Callable[[Any, "GroupStream", List[int]], None]] = None  # a fast loop for nf == 1

    def begin(self, offset: int, view: memoryview, keep: bool) -> None:
        """The record at stream offset ``offset`` opens a group (``keep``: of this shard)."""

    def add(self, offset: int, view: memoryview, parts: list) -> Any:
        """The part for this record of the open group (``parts``: the ones before it), or HOLD."""
        return bytes(view)

    def hold(self, parts: list) -> list:
        """The parts so far, copied out (after ``add`` said HOLD)."""
        return parts

    def framed(self, offset: int, view: memoryview) -> None:
        """Every record up to this one was framed (a group completed, or this record was dropped)."""

    def garbage(self) -> None:
        """The records framed so far that are not sent (dropped, another shard's, skipped) are garbage."""

    def broken(self) -> None:
        """Damage broke the open group: its records are dropped."""


class InProcess(Placement):
    """The records of a group decoded in this process (``workers=0``): the group's last record as the
    reader's view (decoded before the reader's next step), the others as ``bytes``; every record as
    ``bytes`` when groups wait (``hold``: the shuffle buffer, equal shards)."""

    def __init__(self, nfields: int, hold: bool) -> None:
        self.holds = hold
        self.last = nfields - 1

    def add(self, offset: int, view: memoryview, parts: list) -> Any:
        return bytes(view) if self.holds or len(parts) < self.last else view


@dataclass(frozen=True)
class InOrder:
    """The settings a group stream reads (a :class:`~parrecio.pipeline.config.PipelineConfig` has them
    all), for whole streams read in order: no shards, no shuffle, no ``.idx`` (the Ray datasource's
    streamed read tasks)."""
    nfields: int
    kinds: Tuple[Any, ...]          # payload kinds per field (the resync rule)
    names: Tuple[str, ...]          # field names (its messages)
    on_error: str
    num_shards: int = 1
    shard_index: int = 0
    even_shards: Optional[str] = None
    shuffle_mode: Optional[str] = None
    shuffle_buffer: int = 0
    shuffle_buffer_bytes: int = 0
    seed: int = 0
    index_paths: Tuple[Any, ...] = ()
    by_index: bool = False


@dataclass
class Counts:
    """What a group stream has read and left out, in records, bytes and groups."""
    records: int = 0
    bytes: int = 0
    sharded_out: int = 0      # groups of other shards
    skipped_groups: int = 0   # broken by damage, cut by a stream's end, unreadable by their index
    skipped_records: int = 0  # in corrupt regions (RecordReader's count)
    skipped_bytes: int = 0


class GroupStream:
    """This shard's groups of one pass (one epoch), for the pipeline settings ``cfg``
    (:class:`~parrecio.pipeline.config.PipelineConfig`); :attr:`count` adds up as the stream is read."""

    def __init__(self, cfg: Any, epoch: int, skip: int = 0, context: bool = False) -> None:
        self.cfg = cfg
        self.epoch = epoch
        self.resumed = skip       # groups of this shard's order already delivered (a resumed epoch)
        self.skip = skip          # of those, the ones not yet left out
        self.group_index = 0      # groups seen in the stream (all shards)
        self.place: Placement = Placement()  # the placement of the stream being read
        self.first_kinds: Optional[dict] = {} if context else None  # source -> sniff() of its first records
        self.count = Counts()
        self.even = (EvenShards(cfg.num_shards, cfg.shard_index, cfg.even_shards)
                     if cfg.even_shards is not None else None)
        self.rng = np.random.default_rng([cfg.seed, epoch]) if cfg.shuffle_mode is not None else None
        # Files read by index are checked after their reads (see indexed): after each group, or -- with
        # defer_checks, where the caller calls check_reads() before anything read goes out (the reader
        # process: before each chunk) -- once per file per chunk (an fstat, ~3 us, per group of 100-byte
        # records more than halved the rate of such a shuffle).
        self.defer_checks = False
        self._checks: List[Any] = []
        self._unchecked: set = set()

    def check_reads(self) -> None:
        """Check the files read by index since the last call (``defer_checks``): a SourceError if one of
        them changed, and its reads may be of other bytes."""
        unchecked = self._unchecked
        if unchecked:
            ids = sorted(unchecked)
            unchecked.clear()  # (in place: indexed() holds the set)
            for i in ids:
                self._checks[i]()

    @property
    def holds(self) -> bool:
        """Whether every group is held (copied out as it is read): they wait in the shuffle buffer, or
        for the epoch's end (equal shards of a stream)."""
        return self.cfg.shuffle_mode == "buffer" or self.even is not None

    def counters(self) -> dict:
        return dataclasses.asdict(self.count)

    @property
    def flat(self) -> bool:
        """Each record is a group and nothing is planned (one field; no shards, shuffle, index order
        or resume skip): :meth:`context`/:meth:`flat_done` around the caller's own loop may stand for :meth:`groups`."""
        cfg = self.cfg
        return (cfg.nfields == 1 and cfg.num_shards == 1 and cfg.shuffle_mode is None and not cfg.by_index
                and self.even is None and not self.skip)

    def context(self, name: str) -> Optional[list]:
        """Stream ``name`` begins: the list to append the sniff() kinds of its first CONTEXT records to
        (what a decode error's hint compares with), if asked for."""
        if self.first_kinds is None:
            return None
        kinds = self.first_kinds[name] = []
        return kinds

    def flat_done(self, reader: Any, records: int, nbytes: int, whole: bool, name: str, start: int) -> None:
        """The :attr:`flat` case: ``records`` records of ``nbytes`` bytes framed (``whole``: the stream
        ``name``, read from its offset ``start``, was read to its end)."""
        self.count.records += records
        self.count.bytes += nbytes
        self.group_index += records
        if whole:
            self._stream_done(reader, name, start, records)

    # -- the order -------------------------------------------------------------------------------
    def groups(self, streams: Iterator[Tuple[int, str, Any, Placement]]) -> Iterator[Group]:
        """The pass's groups from ``streams``: ``(stream_id, name, RecordReader, Placement)`` for each
        stream of the epoch, in turn (the caller opens and closes them around the ``yield``)."""
        gen = self._sharded(streams)
        if self.cfg.shuffle_mode == "buffer":
            gen = self._shuffled(gen)
        return self._skipping(gen) if self.skip else gen

    def _skipping(self, groups: Iterator[Group]) -> Iterator[Group]:
        """A resumed epoch: the groups delivered before are left out."""
        for g in groups:
            if self.skip:
                self.skip -= 1
                if not g.held:
                    self.place.garbage()
                continue
            yield g
        if self.skip:  # a resumed epoch shorter than its saved position
            raise resume_overrun(self.resumed, self.resumed - self.skip, self.epoch)

    def _sharded(self, streams: Iterator[Tuple[int, str, Any, Placement]]) -> Iterator[Group]:
        even = self.even
        try:
            for stream_id, name, reader, place in streams:
                self.place = place
                yield from self._frame(stream_id, name, reader, place)
        finally:
            close = getattr(streams, "close", None)
            if close is not None:  # now, not when a traceback that holds this frame goes
                close()
        if even is not None:  # the epoch's length is known now: the held-back or repeated groups
            yield from even.end(self.group_index)

    def _shuffled(self, groups: Iterator[Group]) -> Iterator[Group]:
        """Through a shuffle buffer of ``shuffle_buffer`` groups: once it is full, each new group swaps
        with a random one, which goes out (tf.data's shuffle, DALI's ``initial_fill``); at the end the
        rest in random order -- also when damage ends the pass (``on_error="raise"``): the groups read before
        it come out first, as an indexed shuffle delivers every group placed before a damaged one.
        The buffer also holds at most ``shuffle_buffer_bytes`` of payloads (one group whatever its size):
        a group that would pass the bound swaps as if the buffer were full, and while the bound is passed,
        random groups go out.  Below the bound the draws are those of the count alone (the orders of
        states saved before the bound existed)."""
        capacity, limit, rng = self.cfg.shuffle_buffer, self.cfg.shuffle_buffer_bytes, self.rng
        assert rng is not None
        buf: List[Group] = []
        held = 0  # payload bytes in buf
        damage: Optional[CorruptRecordError] = None
        try:
            for g in groups:
                size = _payload_bytes(g)
                if len(buf) < capacity and (held + size <= limit or not buf):
                    buf.append(g)
                    held += size
                    continue
                i = int(rng.integers(len(buf)))
                buf[i], g = g, buf[i]
                held += size - _payload_bytes(g)
                yield g
                while held > limit and len(buf) > 1:
                    i = int(rng.integers(len(buf)))
                    buf[i], buf[-1] = buf[-1], buf[i]
                    g = buf.pop()
                    held -= _payload_bytes(g)
                    yield g
        except CorruptRecordError as exc:
            damage = exc
        for i in rng.permutation(len(buf)):
            yield buf[i]
        buf.clear()
        if damage is not None:
            raise damage

    # -- one stream ------------------------------------------------------------------------------
    def _frame(self, stream_id: int, name: str, reader: Any, place: Placement) -> Iterator[Group]:
        """The records of one stream -> this shard's groups, in stream order, equal shards applied."""
        cfg = self.cfg
        kinds = self.context(name)
        if cfg.nfields == 1 and cfg.num_shards == 1:  # each record is a group: no grouping, shards, resync
            if place.flat is not None and not self.holds and not self.skip and kinds is None:
                return self._flat(name, reader, place)
            return self._ungrouped(stream_id, name, reader, place, kinds)
        return self._grouped(stream_id, name, reader, place, kinds)

    def _flat(self, name: str, reader: Any, place: Placement) -> Iterator[Group]:
        """The placement frames the stream itself (the reader process's hot loop): no group comes out."""
        assert place.flat is not None
        tally = [0, 0]  # records and payload bytes framed: counted when the stream ends on an error too
        whole = False
        try:
            place.flat(reader, self, tally)
            whole = True
        finally:
            self.flat_done(reader, tally[0], tally[1], whole, name, place.start)
        return iter(())

    def _grouped(self, stream_id: int, name: str, reader: Any, place: Placement,
                 kinds: Optional[list]) -> Iterator[Group]:
        cfg = self.cfg
        nf, num_shards, shard, even = cfg.nfields, cfg.num_shards, cfg.shard_index, self.even
        hold_all = place.holds
        parts: list = []
        held = hold_all
        first_offset, skipped_seen, keep, done_at = 0, 0, True, -1
        records = nbytes = 0
        last = -1  # the offset of the last record framed
        realign = for_stream(cfg, name, place.start)
        # A record missing from a group (resync.py): ``lead``, the image kinds only the first field reads
        # (``lead_bytes``: their first bytes); a group is clean when its first record is one of them and no
        # other is; ``trusted`` once two clean groups came one after the other in this stream (until then
        # a lead image past a group's first record is taken for fields= in another order or size, which
        # its decode error's hint names); ``opened``: the open group's first record is a lead image;
        # ``odd``: the open group is not clean.
        lead, lead_bytes = realign.lead, realign.lead_bytes
        streak, trusted, opened, odd = 0, False, False, False
        try:
            for offset, view in reader.iter_views():
                records += 1
                nbytes += len(view)
                if kinds is not None and records <= CONTEXT:
                    kinds.append(sniff(view))
                if reader.skipped_records != skipped_seen:  # a corrupt region was skipped: group broken
                    skipped_seen = reader.skipped_records
                    # (several regions since the last record are one run: the error names its start)
                    realign.damaged(reader.corrupt_run, bool(parts), done_at)
                    if parts:
                        parts, held = [], hold_all
                        place.broken()
                last = offset
                if realign.aligning and not realign.starts_group(offset, view):
                    place.framed(offset, view)  # dropped: a record of a group the damage broke
                    place.garbage()
                    continue
                if lead:
                    is_lead = bool(view) and view[0] in lead_bytes and sniff_image(view) in lead
                    if parts and is_lead:
                        if trusted and opened:  # the next sample starts here: the open one lost records
                            err = realign.missing(first_offset, len(parts), offset, view)
                            if cfg.on_error == "raise":
                                raise err
                            parts, held = [], hold_all
                            place.broken()
                        else:
                            odd = True
                    if not parts:
                        opened = is_lead
                        odd = not is_lead
                if not parts:
                    first_offset, keep = offset, num_shards == 1 or self._keeps()
                    place.begin(offset, view, keep)
                if not keep:
                    parts.append(None)
                elif held:
                    parts.append(bytes(view))
                else:
                    part = place.add(offset, view, parts)
                    if part is HOLD:  # it cannot stay where it was read: hold the group
                        parts = place.hold(parts)
                        part, held = bytes(view), True
                    parts.append(part)
                if len(parts) == nf:
                    g = self.group_index
                    self.group_index += 1
                    done_at = first_offset
                    if lead:
                        streak = 0 if odd else streak + 1
                        trusted = trusted or streak > 1
                    place.framed(offset, view)
                    if even is not None:
                        self.count.sharded_out += g % num_shards != shard
                        yield from even.group(g, Group(stream_id, first_offset, parts, held) if keep else None)
                    elif not keep:
                        self.count.sharded_out += 1
                        place.garbage()
                    else:
                        yield Group(stream_id, first_offset, parts, held)
                    parts, held = [], hold_all
            if reader.skipped_records != skipped_seen and cfg.nfields > 1:  # damage ran on to the end
                realign.damaged(reader.corrupt_run, bool(parts), done_at)
                parts = []
            realign.ended(last if records else None)
        finally:
            self.count.records += records
            self.count.bytes += nbytes
            self.count.skipped_groups += realign.skipped_groups
        self._stream_done(reader, name, place.start, records)
        if parts:
            self._cut_short(len(parts), first_offset, name)

    def _keeps(self) -> bool:
        """Whether the group that opens now is this shard's, or a copy that equal shards pad with (the
        first rows are repeated at the end)."""
        cfg, g = self.cfg, self.group_index
        keep = g % cfg.num_shards == cfg.shard_index
        if self.even is not None and not keep:
            keep = self.even.wants_copy(g)
        return keep

    def _cut_short(self, have: int, offset: int, name: str) -> None:
        """The stream ended inside a group (``have`` of its records read)."""
        msg = (f"stream ended inside a group: {have} of {self.cfg.nfields} records "
               f"(the stream's record count is not a multiple of the group size)")
        if self.cfg.on_error == "raise":
            raise CorruptRecordError(msg, offset, source=name)
        self.count.skipped_groups += 1

    def _ungrouped(self, stream_id: int, name: str, reader: Any, place: Placement,
                   kinds: Optional[list]) -> Iterator[Group]:
        """:meth:`_frame` for groups of one record and one shard (equal shards of one are all groups)."""
        hold_all, add, new = place.holds, place.add, tuple.__new__
        # (the base class's begin/framed do nothing: not called per record)
        begin = None if type(place).begin is Placement.begin else place.begin
        framed = None if type(place).framed is Placement.framed else place.framed
        records = nbytes = 0
        whole = False
        try:
            for offset, view in reader.iter_views():
                records += 1
                nbytes += len(view)
                if kinds is not None and records <= CONTEXT:
                    kinds.append(sniff(view))
                held = hold_all
                if held:
                    part = bytes(view)
                else:
                    if begin is not None:
                        begin(offset, view, True)
                    part = add(offset, view, _NONE)
                if part is HOLD:
                    part, held = bytes(view), True
                if framed is not None:
                    framed(offset, view)
                yield new(Group, (stream_id, offset, [part], held))
            whole = True
        finally:
            self.flat_done(reader, records, nbytes, whole, name, place.start)

    def _stream_done(self, reader: Any, name: str, start: int, records: int) -> None:
        """A stream read to its end: what its reader skipped (not counted for a stream cut short), and with
        groups of one record, the records its ``.idx`` says the damage lost (``records``: those framed)."""
        self.count.skipped_records += reader.skipped_records
        self.count.skipped_bytes += reader.skipped_bytes
        if reader.skipped_records and self.cfg.nfields == 1:
            self.count.skipped_groups += singles_lost(self.cfg, name, start, records)

    # -- by index ---------------------------------------------------------------------------------
    def indexed(self, readers: Sequence[Any], names: Sequence[str],
                on_stream: Optional[Callable[[int, str], None]] = None) -> Iterator[Group]:
        """This shard's groups read by their ``.idx`` offsets, in the epoch's order
        (:func:`parrecio.pipeline.plan.epoch_order`: a global permutation, then the shard's slice).
        ``readers``: one per file of ``cfg.index_paths`` (:func:`parrecio.sources.resolver.open_indexed`);
        ``on_stream(stream_id, name)`` is told each file before any group.  A group that cannot be read
        keeps its place in the order (``parts`` None) under ``on_error="skip"``."""
        from ..recordio.index import IndexMismatch, check_index
        from ..sources.resolver import read_groups
        cfg, nf = self.cfg, self.cfg.nfields
        offsets = []
        for stream_id, r in enumerate(readers):
            if on_stream is not None:
                on_stream(stream_id, names[stream_id])
            # (before any group: an index that does not fit its file would pair or leave out records)
            check_index(r, sorted(r.offsets), nf)
            offs, cut = whole_groups(r.offsets, nf, names[stream_id], cfg.on_error)
            self.count.skipped_groups += cut
            offsets.append(offs)
        order, others = epoch_order(cfg, self.epoch, offsets)
        self.count.sharded_out += others
        # a resumed epoch starts at its position in the order
        skip, self.skip = self.skip, 0
        if skip > len(order):
            raise resume_overrun(skip, len(order), self.epoch)
        groups = read_groups(readers, offsets, nf, order[skip:])
        # Each local file is checked after the group's reads (one fstat; or later, see defer_checks):
        # rewritten, truncated or replaced meanwhile, its reads may be of other bytes -- a SourceError,
        # before the group goes out, and before its damage counts.  (An s3:// object is read by If-Match
        # and ETag: a version it names.)
        checks = self._checks = [getattr(r, "check", None) for r in readers]
        unchecked = self._unchecked
        try:
            for stream_id, offs, payloads in groups:
                check = checks[stream_id]
                if check is not None:
                    if self.defer_checks and not isinstance(payloads, CorruptRecordError):
                        unchecked.add(stream_id)
                    else:
                        check()
                if isinstance(payloads, CorruptRecordError):
                    if cfg.on_error == "raise" or isinstance(payloads, IndexMismatch):  # (not one sample's)
                        raise payloads
                    self.count.skipped_groups += 1
                    self.count.skipped_records += 1
                    yield Group(stream_id, offs[0], None, True)
                    continue
                self.count.records += nf
                self.count.bytes += sum(map(len, payloads))
                yield Group(stream_id, offs[0], payloads, True)
        finally:
            close = getattr(groups, "close", None)
            if close is not None:
                close()


def open_indexed_all(cfg: Any, source: Any, opened: List[Any]) -> List[Any]:
    """A reader per file of ``cfg.index_paths`` (local files: pread; ``s3://`` objects: ranged GETs, read
    ahead), each appended to ``opened`` as soon as it is open (what the caller closes)."""
    from ..sources.resolver import open_indexed
    readers = []
    for rec, idx in cfg.index_paths:
        r = open_indexed(source, rec, idx, join=cfg.join, max_record_bytes=cfg.max_record_bytes)
        readers.append(r)
        opened.append(r)
    return readers
