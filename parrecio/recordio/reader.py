"""Streaming RecordIO reader: files, pipes, FIFOs, sockets, any binary file object.

The format is described in :mod:`parrecio.recordio.framing` (dmlc-core ``RecordIOReader::NextRecord``,
MXNet ``MXRecordIO.read``).  :class:`RecordReader` reads the stream in large chunks into one preallocated
``bytearray`` (``readinto`` where the file object has it), and walks the frames in place:

- **fast path** (:meth:`RecordReader.iter_views`): a whole single-part record (``cflag 0``) already in the
  buffer is yielded as a ``memoryview`` slice of the buffer, no copy.  The check it does (magic equal,
  lrec at most ``max_record_bytes``, so cflag 0) only selects the happy case;
- **slow path**: everything else -- a record that straddles the end of the buffer, multipart records, end of
  stream, corruption -- goes through :func:`~parrecio.recordio.framing.read_record`, the one implementation
  of header validation and part joining, which pulls bytes through :meth:`RecordReader.view`.

The buffer is compacted (the partial record moved to its start) or grown (to fit the largest record) only
when a record does not fit; its size is ``max(chunk_size, largest record + 8)`` bytes, never the stream.
A caller may provide the buffer instead (``buffers=``, a :class:`Buffers`): then the stream is read
straight into memory it chooses -- the pipeline's shared-memory ring -- and single-part payloads are
yielded as views of that memory, where they can stay (see :mod:`parrecio.pipeline.ring_windows`).
With ``on_corrupt="skip"`` a corrupt record is dropped and the reader resyncs on the next 4-byte-aligned
magic followed by a ``cflag`` of 0 or 1 (dmlc-core ``FindNextRecordIOHead``).

``join="auto"`` (the default) reads multipart records by concatenation and joins them by the convention
the stream shows (:mod:`parrecio.recordio.joins`): decided at the first multipart record, looking ahead
up to 16 MiB from it where that record alone does not tell; :attr:`RecordReader.guess` says what and why.
"""

from __future__ import annotations

import os
import time
from typing import Any, BinaryIO, Callable, Iterator, List, NamedTuple, Optional, Tuple, Union

from ..errors import CorruptRecordError, SourceError
from .framing import (DEFAULT_MAX_RECORD_BYTES, HEADER, HEADER_SIZE, LENGTH_MASK, MAGIC, check_join,
                      find_next_head, padded_size, read_record)
from .joins import LOOKAHEAD_BYTES, AmbiguousJoin, JoinGuess, join_parts
from .paths import check_path_arg

__all__ = ["Record", "RecordReader", "Buffers", "DEFAULT_CHUNK_SIZE", "MAX_CORRUPT_REGIONS", "ON_CORRUPT"]

DEFAULT_CHUNK_SIZE = 4 << 20
"""Default read size and initial buffer size: 4 MiB."""
MAX_CORRUPT_REGIONS = 1000
"""How many ``(offset, nbytes)`` entries :attr:`RecordReader.corrupt_regions` keeps at most."""
ON_CORRUPT = ("raise", "skip")

Source = Union[str, "os.PathLike[str]", BinaryIO, Any]


class Record(NamedTuple):
    """One record: ``offset`` is the stream byte offset of its first frame, ``payload`` its joined bytes."""

    offset: int
    payload: bytes


class Buffers:
    """Where a :class:`RecordReader` reads the stream to, when the caller chooses (``buffers=``).

    :meth:`relocate` is called once before the first read and then whenever the unread part of the
    stream no longer fits: it returns ``(buf, mv, off, cap)`` -- an object with ``find`` (``bytearray``,
    ``mmap``), a ``memoryview`` of it, and the window ``mv[off:cap]`` that the reader may fill.  The
    reader then copies the bytes it keeps (the record in progress, ``kept`` bytes from index ``lo`` of
    the old buffer) to ``mv[off:]``, unless they are already there (same buffer, ``off == lo``).  Memory
    outside the windows handed out is never written, and a window is never written again once the
    reader moved on: views of it stay valid as long as the caller keeps that memory.

    :attr:`scanning` is true while the reader scans damaged bytes for the next frame head: nothing read
    then is kept but the last few bytes, however long the damage runs."""

    scanning = False

    def relocate(self, mv: Optional[memoryview], lo: int, kept: int, need: int,
                 offset: int) -> Tuple[Any, memoryview, int, int]:
        """A window of at least ``need`` bytes for the stream from stream ``offset`` on (``mv``: the
        current buffer, None the first time)."""
        raise NotImplementedError


class RecordReader:
    """Iterate the records of a RecordIO stream.

    :param source: a path (``str``/``PathLike``; opened unbuffered and closed by :meth:`close`), a binary
        file object, which may return short reads (pipes, FIFOs, ``socket.makefile("rb")``), or a connected
        ``socket.socket``.  A file object is read from its
        current position (offsets are counted from there) and is not closed by :meth:`close`.  It must be
        blocking.  Not a file descriptor: an int or a bool is a ``TypeError``.
    :param join: how the parts of a multipart record are joined: ``"auto"`` (default: as the stream's
        multipart records show, :mod:`parrecio.recordio.joins`; a ``SourceError`` where they fit both),
        ``"mxnet"`` (dmlc-core and MXNet ``.rec`` files: the 4 magic bytes are re-inserted between the
        parts) or ``"concat"`` (SageMaker Pipe mode's RecordIO wrapper, ``parrecio pack --split-bytes``,
        AWS ML-IO: parts are concatenated).
    :param on_corrupt: ``"raise"`` (default) raises :class:`~parrecio.errors.CorruptRecordError` at the
        first framing error; ``"skip"`` drops the broken record, resyncs on the next frame head and counts
        what it dropped in :attr:`skipped_records`, :attr:`skipped_bytes` and :attr:`corrupt_regions`.
    :param max_record_bytes: the largest (joined) payload accepted, in bytes; a length word above it is
        corruption and is never allocated.  Default 64 MiB.
    :param chunk_size: bytes asked of the source per read, and the initial buffer size.  Default 4 MiB.
    :param source_name: how error messages name the stream; default the path, or the file object's
        ``.name``.
    :param buffers: a :class:`Buffers` that provides the memory the stream is read into (default: a
        buffer of the reader's own).

    Iterating yields :class:`Record` objects (``payload`` is ``bytes``); :meth:`iter_views` is the zero-copy
    variant.  The reader is single-pass: a new iteration continues where the last one stopped (after a
    ``break``, or a read error between records).  After a framing error (``on_corrupt="raise"``), or a read
    error inside a record, every later iteration raises that error again.
    """

    def __init__(self, source: Source, *, join: str = "auto", on_corrupt: str = "raise",
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, chunk_size: int = DEFAULT_CHUNK_SIZE,
                 source_name: Optional[str] = None, buffers: Optional[Buffers] = None) -> None:
        self.join = check_join(join)
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, not {on_corrupt!r}")
        self.on_corrupt = on_corrupt
        if int(max_record_bytes) < 0:
            raise ValueError(f"max_record_bytes must be >= 0, not {max_record_bytes}")
        self.max_record_bytes = int(max_record_bytes)
        if int(chunk_size) < HEADER_SIZE:
            raise ValueError(f"chunk_size must be at least {HEADER_SIZE} bytes, not {chunk_size}")
        self.chunk_size = int(chunk_size)
        self._file, self._owns, self.source_name = _open(source, source_name)
        self._read_into = _reader_of(self._file)
        self._buffers = buffers
        if buffers is None:
            self._buf = bytearray(self.chunk_size)
            self._mv = memoryview(self._buf)
            off, self._cap = 0, self.chunk_size
        else:
            self._buf, self._mv, off, self._cap = buffers.relocate(None, 0, 0, HEADER_SIZE, 0)
        self._base = -off  # stream offset of _buf[0]
        self._end = off  # end of the valid bytes in _buf; _cap: end of the part that may be filled
        self._resume = 0  # stream offset of the next record, saved when an iteration stops
        self._eof = False
        # Stream offset of the record being read: the buffer keeps it until the record is complete or
        # has been skipped, so that a resync can restart just after its head (see _skip).
        self._pin: Optional[int] = None
        self._iterating = False
        self._error: Optional[Exception] = None  # raised again by every later iteration
        #: Number of corrupt regions dropped under ``on_corrupt="skip"`` (one per broken record).
        self.skipped_records = 0
        #: Total bytes of the dropped regions.
        self.skipped_bytes = 0
        #: ``(offset, nbytes)`` of each dropped region, the first :data:`MAX_CORRUPT_REGIONS` only.
        self.corrupt_regions: List[Tuple[int, int]] = []
        #: Offset of the last dropped region (None before any).
        self.last_corrupt: Optional[int] = None
        #: The error of the first dropped region (None before any): what a stream with no intact record had.
        self.first_error: Optional[CorruptRecordError] = None
        #: Offset of the first region of the last run of damage: dropped regions one right after another,
        #: with no record between them (a broken record whose resync lands on another broken one).
        self.corrupt_run: Optional[int] = None
        self._run_end = -1  # where the last dropped region ended (the next head found, or end of stream)
        #: ``join="auto"``: what the stream has shown of its multipart convention (``.join`` once decided).
        self.guess = JoinGuess()
        self._max_single = 0

    @classmethod
    def over(cls, buffer: Any, start: int = 0, *, join: str = "auto", on_corrupt: str = "raise",
             max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
             source_name: Optional[str] = None) -> "RecordReader":
        """A reader of the records in ``buffer[start:]`` -- an ``mmap`` of a regular file, ``bytes`` or a
        ``bytearray`` -- that frames them in place: :meth:`iter_views` yields views of ``buffer`` itself
        (for single-part records), nothing is copied.  Offsets count from ``start``."""
        self = cls.__new__(cls)
        self.join = check_join(join)
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {ON_CORRUPT}, not {on_corrupt!r}")
        self.on_corrupt = on_corrupt
        self.max_record_bytes = int(max_record_bytes)
        self.chunk_size = DEFAULT_CHUNK_SIZE
        self._file, self._owns, self.source_name = buffer, False, source_name
        self._read_into = None
        self._buf, self._mv = buffer, memoryview(buffer)
        self._buffers = None
        self._base = -start  # stream offset of buffer[0]: offsets count from `start`
        self._end = self._cap = len(buffer)
        self._resume = 0
        self._eof = True     # the whole stream is there: the buffer is never refilled
        self._pin = None
        self._iterating = False
        self._error = None
        self.skipped_records = self.skipped_bytes = 0
        self.corrupt_regions = []
        self.last_corrupt = self.corrupt_run = None
        self.first_error = None
        self._run_end = -1
        self.guess = JoinGuess()
        self._max_single = 0
        return self

    # -- iteration ---------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        """Yield :class:`Record` objects whose ``payload`` is a ``bytes`` copy (safe to keep)."""
        new = tuple.__new__
        for offset, view in self.iter_views():
            yield new(Record, (offset, view.tobytes()))

    def iter_views(self) -> Iterator[Tuple[int, memoryview]]:
        """Yield ``(offset, payload)`` pairs without copying single-part payloads.

        ``offset`` is the stream byte offset of the record's first frame.  ``payload`` is a ``memoryview``
        into the reader's internal buffer (or, for a multipart record, of a fresh ``bytearray``).  **It is
        only valid until the next step of the iteration**: the buffer is then refilled in place.  Copy what
        must be kept (``bytes(payload)``, or into shared memory).
        """
        if self._file is None:
            raise ValueError("I/O operation on a closed RecordReader")
        if self._iterating:
            raise RuntimeError("this RecordReader is already being iterated")
        if self._error is not None:
            raise self._error.with_traceback(None)
        self._iterating = True
        unpack_from = HEADER.unpack_from
        magic_ = MAGIC
        maxlen = min(self.max_record_bytes, LENGTH_MASK)  # lrec <= maxlen also means cflag == 0
        buf, mv, base, end = self._buf, self._mv, self._base, self._end
        pos = self._resume - base  # base + pos stays the next record's offset whatever the buffer does
        longest = self._max_single  # of the single-part records: join="auto" compares it with parts
        try:
            while True:
                # Fast path: whole single-part records already in the buffer.
                while pos + 8 <= end:
                    magic, lrec = unpack_from(buf, pos)
                    if magic != magic_ or lrec > maxlen:
                        break
                    start = pos + 8
                    nxt = start + ((lrec + 3) & -4)
                    if nxt > end:
                        break
                    pos = nxt
                    if lrec > longest:
                        longest = lrec
                    yield base + start - 8, mv[start:start + lrec]
                # Slow path: refill, multipart, end of stream, corruption.
                self._max_single = longest
                got = self._next_slow(base + pos)
                longest = self._max_single  # the slow path's single-part records count too
                buf, mv, base, end = self._buf, self._mv, self._base, self._end
                if got is None:
                    pos = end
                    return
                offset, view, nxt_offset = got
                pos = nxt_offset - base
                yield offset, view
        finally:
            self._iterating = False
            if self._error is None:
                self._resume = base + pos
                if self._resume < self._base:  # an exception escaped mid-record, after the buffer moved on
                    self._error = SourceError(
                        f"reading {self.source_name or 'the stream'} stopped inside the record at byte offset "
                        f"{self._resume}, which is no longer buffered: this reader cannot resume")

    def scan_flat(self, offs: Any, lens: Any, stream_offs: Any, max_n: int, max_bytes: int) -> Tuple[int, int]:
        """Frame the next whole single-part records of a reader :meth:`over` a buffer, without a view
        or a generator step each: append each payload's position in the buffer, its length and its
        stream offset to ``offs``, ``lens``, ``stream_offs`` (``array`` s or lists).  Stops after
        ``max_n`` records, after the record that brings their payload bytes to ``max_bytes``, or before
        a record that is not plain (multipart, damaged, the end): :meth:`iter_views` takes that one.
        Returns ``(records, payload bytes)``.  What :meth:`iter_views`' fast path yields, in bulk (the
        reader process's hot loop on small records)."""
        if self._read_into is not None or self._buffers is not None or not self._eof:
            raise RuntimeError("scan_flat() needs a reader made by RecordReader.over()")
        if self._iterating or self._error is not None or max_n <= 0 or max_bytes <= 0:
            return 0, 0
        unpack_from, magic_ = HEADER.unpack_from, MAGIC
        maxlen = min(self.max_record_bytes, LENGTH_MASK)  # lrec <= maxlen also means cflag == 0
        buf, base, end = self._buf, self._base, self._end
        add_off, add_len, add_soff = offs.append, lens.append, stream_offs.append
        pos = self._resume - base
        longest = self._max_single
        n = nb = 0
        while pos + 8 <= end:
            magic, lrec = unpack_from(buf, pos)
            if magic != magic_ or lrec > maxlen:
                break
            nxt = pos + 8 + ((lrec + 3) & -4)
            if nxt > end:
                break
            add_off(pos + 8)
            add_len(lrec)
            add_soff(base + pos)
            if lrec > longest:
                longest = lrec
            pos = nxt
            n += 1
            nb += lrec
            if n >= max_n or nb >= max_bytes:
                break
        self._resume = base + pos
        self._max_single = longest
        return n, nb

    def _next_slow(self, offset: int) -> Optional[Tuple[int, memoryview, int]]:
        """The record at stream ``offset`` through the shared framing code; skip corruption if asked."""
        auto = self.join == "auto"
        while True:
            self._pin = offset
            try:
                if auto:
                    got = self._read_auto(offset)
                else:
                    got = read_record(self, offset, join=self.join, max_record_bytes=self.max_record_bytes,
                                      source=self.source_name)
            except AmbiguousJoin as err:  # join="auto" cannot tell: nothing after it can be read right
                self._pin = None
                self._error = err
                raise
            except CorruptRecordError as err:
                if self.on_corrupt == "raise":
                    self._pin = None
                    self._error = err
                    raise
                if self.first_error is None:
                    self.first_error = err
                nxt = self._skip(offset)
                if nxt is None:
                    return None
                offset = nxt
                continue
            finally:
                self._pin = None
            if got is None:
                return None
            view, nxt = got
            return offset, view, nxt

    # -- join="auto" ------------------------------------------------------------------------------------

    def _read_auto(self, offset: int) -> Optional[Tuple[memoryview, int]]:
        """The record at ``offset``, multipart ones joined by the stream's convention, decided at the
        first of them (looking ahead while the record's bytes stay pinned, :mod:`parrecio.recordio.joins`)."""
        guess = self.guess
        parts: List[int] = []
        got = read_record(self, offset, join="concat", max_record_bytes=self.max_record_bytes,
                          source=self.source_name, parts=parts)
        if got is None:
            return None
        view, nxt = got
        if len(parts) < 2:
            if guess.join is None:
                self._max_single = max(self._max_single, parts[0])
            return got
        join = guess.join
        if join is None:
            guess.single(self._max_single)
            join = guess.join or guess.multipart(parts, offset) or self._look_ahead(nxt)
            view, nxt = read_record(self, offset, join="concat", max_record_bytes=self.max_record_bytes,
                                    source=self.source_name)  # the look-ahead may have moved the buffer
        return join_parts(view, parts, join, self.max_record_bytes, offset, self.source_name), nxt

    def _look_ahead(self, pos: int) -> str:
        """Decide from the records after ``pos`` (headers only; the bytes stay buffered from the pin)."""
        guess = self.guess
        limit = None if self._read_into is None else pos + LOOKAHEAD_BYTES  # over(): all of it is there
        while limit is None or pos < limit:
            lengths = self._frames_at(pos)
            if not lengths:
                break  # the end, or bytes that are not a record: nothing more to learn
            at = pos
            pos += sum(HEADER_SIZE + padded_size(n) for n in lengths)
            got = guess.single(lengths[0]) if len(lengths) == 1 else guess.multipart(lengths, at)
            if got is not None:
                return got
            if limit is None and guess.multi >= 2:  # (a mapped file: 16 MiB past the second is enough)
                limit = pos + LOOKAHEAD_BYTES
        looked = f"the stream up to byte {pos} (its end, or bytes that are no record)" if limit is None or \
            pos < limit else f"the next {LOOKAHEAD_BYTES >> 20} MiB of the stream"
        return guess.settle(self.source_name, looked)

    def _frames_at(self, pos: int) -> List[int]:
        """The part lengths of the record at ``pos`` from its headers; [] where there is none."""
        lengths: List[int] = []
        total = 0
        while True:
            head = self.view(pos, HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                return []
            magic, lrec = HEADER.unpack_from(head)
            cflag, n = lrec >> 29, lrec & LENGTH_MASK
            total += n
            if magic != MAGIC or (cflag >= 2) != bool(lengths) or total > self.max_record_bytes:
                return []
            lengths.append(n)
            if cflag in (0, 3):
                return lengths
            pos += HEADER_SIZE + padded_size(n)

    # -- corruption --------------------------------------------------------------------------------------

    def _skip(self, record_start: int) -> Optional[int]:
        """Drop the broken record at ``record_start``; return the next head's offset (None: end of stream).

        The scan starts 4 bytes past the record start: the frames of a broken record parsed, but they
        may be garbage (a flipped length word, a stray cflag-1 head) covering intact records, so nothing
        after its head is trusted.  The record start is still buffered (pinned while it was read); the
        pin is dropped now so that the scan itself never holds more than a chunk.
        """
        self._pin = None
        nxt = self._resync(max(record_start + 4, self._base))
        stop = nxt if nxt is not None else self._base + self._end
        nbytes = stop - record_start
        self.skipped_records += 1
        self.skipped_bytes += nbytes
        self.last_corrupt = record_start
        if record_start != self._run_end:  # a record came between: a new run of damage
            self.corrupt_run = record_start
        self._run_end = stop
        if len(self.corrupt_regions) < MAX_CORRUPT_REGIONS:
            self.corrupt_regions.append((record_start, nbytes))
        return nxt

    def _resync(self, offset: int) -> Optional[int]:
        """Stream offset of the next frame head at or after ``offset``, or None at end of stream."""
        rel = offset - self._base
        buffers = self._buffers
        try:
            while True:
                i = find_next_head(self._buf, rel, self._end, self._base)
                if i >= 0:
                    return self._base + i
                if self._eof:
                    return None
                keep = max(rel, self._end - (HEADER_SIZE - 1))  # a head may straddle the refill
                if buffers is not None:
                    buffers.scanning = True
                rel = self._fill(keep, self._end - keep + 1)
        finally:
            if buffers is not None:
                buffers.scanning = False

    # -- buffer management (FrameSource protocol) --------------------------------------------------------

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Stream bytes ``[offset, offset + nbytes)`` from the buffer, reading as needed.

        Shorter only at end of stream.  May compact or replace the buffer, which invalidates earlier views
        and every offset before ``offset``.  ``nbytes`` must already be bounded (``read_record`` checks
        lengths against ``max_record_bytes`` before it asks).
        """
        rel = offset - self._base
        if rel + nbytes > self._end and not self._eof:
            rel = self._fill(rel, nbytes)
        return self._mv[rel:min(rel + nbytes, self._end)]

    def _fill(self, rel: int, nbytes: int) -> int:
        """Make the buffer hold ``[rel, rel + nbytes)`` or up to end of stream; return ``rel``'s new index.

        Bytes from the pinned record start on are kept too (bounded: the record's parts were checked
        against ``max_record_bytes`` before they were asked for)."""
        cap = self._cap
        lo = rel if self._pin is None else max(0, min(rel, self._pin - self._base))
        if rel + nbytes > cap:
            kept = self._end - lo
            need = rel - lo + nbytes
            if self._buffers is not None:
                old = self._mv
                self._buf, self._mv, off, self._cap = self._buffers.relocate(old, lo, kept, need,
                                                                            self._base + lo)
                if self._mv is not old or off != lo:
                    self._mv[off:off + kept] = old[lo:self._end]
                self._base += lo - off
                self._end = off + kept
                rel += off - lo
            else:
                if need > cap:
                    new = bytearray(max(need, self.chunk_size, cap + cap // 4))
                    newmv = memoryview(new)
                    newmv[:kept] = self._mv[lo:self._end]
                    self._buf, self._mv, self._cap = new, newmv, len(new)
                elif lo:
                    self._mv[:kept] = self._mv[lo:self._end]
                self._base += lo
                self._end = kept
                rel -= lo
        mv, need = self._mv, rel + nbytes
        end = self._end
        cap = self._cap
        try:
            while end < need:
                got = self._read_into(mv[end:cap])
                if got is None:  # a non-blocking source with nothing yet
                    time.sleep(0.001)
                    continue
                if not got:
                    self._eof = True
                    break
                end += got
        except OSError as err:
            raise SourceError(f"could not read {self.source_name or 'the stream'} at byte offset "
                              f"{self._base + end}: {err}") from err
        finally:
            self._end = end
        return rel

    # -- lifetime ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the buffer; close the file if the reader opened it.  Idempotent."""
        f, self._file = self._file, None
        if f is not None and self._owns:
            f.close()
        if f is not None and self._read_into is None:  # over(): let the caller close its mapping
            try:
                self._mv.release()
            except BufferError:  # a view is still alive: the buffer goes when it does
                pass

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._file is None

    def __enter__(self) -> "RecordReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RecordReader({self.source_name!r}, join={self.join!r}, on_corrupt={self.on_corrupt!r}, "
                f"skipped_records={self.skipped_records})")


def _open(source: Source, name: Optional[str]) -> Tuple[Any, bool, Optional[str]]:
    """``(file object, owned, display name)`` of a path or a file object."""
    check_path_arg(source, "source")
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fsdecode(source)
        try:
            f = open(path, "rb", buffering=0)
        except OSError as err:
            raise SourceError(f"could not open {path}: {err}") from err
        return f, True, name if name is not None else path
    if not any(hasattr(source, a) for a in ("readinto", "read", "recv_into")):
        raise TypeError(f"source must be a path or a binary file object, not {type(source).__name__}")
    if name is None:
        raw = getattr(source, "name", None)
        name = raw if isinstance(raw, str) else (f"<fd {raw}>" if isinstance(raw, int) else None)
    return source, False, name


def _reader_of(f: Any) -> Callable[[memoryview], Optional[int]]:
    """A ``readinto``-like function for ``f`` that does at most one underlying read per call.

    ``readinto1`` (buffered objects) returns what one raw read gives instead of blocking until the whole
    buffer is full, which matters on pipes; raw files and sockets' ``readinto`` already behave so.
    """
    for name in ("readinto1", "readinto", "recv_into"):  # recv_into: a socket.socket itself
        fn = getattr(f, name, None)
        if fn is not None:
            return fn
    read = getattr(f, "read1", None) or f.read

    def read_into(mv: memoryview) -> Optional[int]:
        data = read(len(mv))
        if data is None:
            return None
        n = len(data)
        mv[:n] = data
        return n

    return read_into
