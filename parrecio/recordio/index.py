"""Random access to a RecordIO file through its ``.idx`` index (MXNet ``MXIndexedRecordIO``).

The ``.idx`` file (MXNet ``MXIndexedRecordIO``, DALI ``tools/rec2idx.py``) is text, one line per record::

    key \\t byte_offset \\n

where ``byte_offset`` is where the record's first frame starts in the ``.rec`` file.
:class:`IndexedRecordReader` reads a record with ``os.pread`` (one call for most records: it asks for the
span up to the next indexed offset) and parses it with the same
:func:`~parrecio.recordio.framing.read_record` as the streaming reader, so validation and part joining are
identical.  Nothing is read ahead of use, and reads are safe from several threads (no shared file
position).
"""

from __future__ import annotations

import bisect
import io
import os
import struct
import threading
import weakref
from collections import OrderedDict
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ..errors import CorruptRecordError, SourceError
from .filecheck import FileCheck, identity
from .framing import CFLAG_FIRST, CFLAG_FULL, DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, MAGIC, check_join, read_record
from .joins import AmbiguousJoin, IndexedJoin
from .paths import check_path_arg, index_path

__all__ = ["IndexedRecordReader", "IndexMismatch", "read_index", "indexed_count", "check_end", "check_shift",
           "check_offsets", "check_index"]

Key = Union[int, str]
_DEFAULT_READ = 64 << 10  # bytes asked for when the record's span is unknown


def indexed_count(rec_path: Union[str, "os.PathLike[str]"]) -> Optional[int]:
    """How many records the ``.idx`` beside ``rec_path`` lists; ``None`` when there is none or it is broken
    (for progress totals: a missing or broken index only costs the total)."""
    idx = index_path(rec_path)
    if not os.path.isfile(idx):
        return None
    try:
        return len(read_index(idx))
    except Exception:
        return None


def read_index(idx_path: Union[str, "os.PathLike[str]"]) -> List[tuple]:
    """Parse an ``.idx`` file into a list of ``(key, offset)`` in file order.

    Keys are ``int`` when every key parses as one, else ``str``.  Blank lines are ignored; a malformed line
    raises :class:`~parrecio.errors.CorruptRecordError` whose ``offset`` is the line's byte offset in the
    ``.idx`` file.
    """
    keys, offsets = read_index_columns(idx_path)
    return list(zip(keys, offsets))


def read_index_columns(idx_path: Any) -> Tuple[List[Key], List[int]]:
    """:func:`read_index` as two lists, ``(keys, offsets)``: no tuple per line, and the file read line by
    line (an index of millions of records is parsed in about half the memory).  ``idx_path``: a path, or
    an index that is no local file and has an ``index_bytes()`` method
    (:class:`parrecio.sources.s3.S3Index`)."""
    fetch = getattr(idx_path, "index_bytes", None)
    if callable(fetch):
        name = str(idx_path)
        opener: Callable[[], BinaryIO] = lambda: io.BytesIO(fetch())  # noqa: E731
    else:
        name = os.fsdecode(check_path_arg(idx_path, "idx_path", file_ok=False))
        opener = lambda: open(name, "rb")  # noqa: E731
    try:
        try:
            return _parse_index(opener, name, as_int=True)
        except _NotInt:  # (rare: a key that is no int) every key is kept as written
            return _parse_index(opener, name, as_int=False)
    except OSError as err:
        raise SourceError(f"could not read index {name}: {err}") from err


class _NotInt(Exception):
    pass


def _parse_index(opener: Callable[[], BinaryIO], name: str, as_int: bool) -> Tuple[List[Key], List[int]]:
    keys: List[Any] = []
    offsets: List[int] = []
    at = 0
    with opener() as f:
        for line in f:
            start, at = at, at + len(line)
            text = line.strip()
            if not text:
                continue
            parts = text.split(b"\t")
            try:
                if len(parts) != 2:
                    raise ValueError("expected 'key<TAB>offset'")
                offset = int(parts[1])
                if offset < 0:
                    raise ValueError("negative offset")
                key = parts[0].decode("utf-8")
            except ValueError as err:
                shown = line.rstrip(b"\n")[:80]
                raise CorruptRecordError(f"malformed index line {shown!r}: {err}", start, source=name) from None
            if as_int:
                try:
                    keys.append(int(key))
                except ValueError:
                    raise _NotInt() from None
            else:
                keys.append(key)
            offsets.append(offset)
    return keys, offsets


class IndexMismatch(CorruptRecordError):
    """An index that does not fit its file: it lists an offset twice, one past the end, none at byte 0,
    or a record that frames whole but does not end where the index lists the next one, there being
    another record (or the end of the file).  The index then lists not every record (or records that are
    not there): grouping by it would pair records of two samples or leave records out, so the pipeline
    raises this whatever ``on_error`` says; it is not one damaged sample."""


def _starts_record(head: bytes) -> bool:
    """Whether ``head`` (8 bytes) is the header of a record's first frame."""
    if len(head) < HEADER_SIZE:
        return False
    magic, lrec = struct.unpack_from("<II", head)
    return magic == MAGIC and lrec >> 29 in (CFLAG_FULL, CFLAG_FIRST)


def check_end(offset: int, end: int, want: int, size: int, source: str, idx: str,
              peek: Callable[[int, int], bytes]) -> None:
    """Check that the record read by its index at ``offset`` ends (``end``: past its last frame) at
    ``want``, where the index's next offset is, or the end of the file (``size`` bytes); without that
    check a stale or foreign index returns records cut short or run on into the next ones, or leaves
    records out silently (an index of one line per sample, a file appended to afterwards).
    ``peek(at, n)`` reads the file.

    - Another record starts where it ends (or the file ends there), and none where the index lists the
      next one: the index does not list every record (or lists what is no record start, such as a
      multipart record's parts): :class:`IndexMismatch`.
    - It runs on over the next listed record, which is there; or it ends amid bytes that start no
      record: its length word is damaged -- one damaged sample, a
      :class:`~parrecio.errors.CorruptRecordError` that ``on_error="skip"`` skips (the index still says
      where the next group is).
    - The last record ends before bytes that start no record: trailing bytes (padding, a torn write),
      not this record's business: a streamed read says what they are."""
    if end == want:
        return
    last = want == size
    if end > want and not last and _starts_record(peek(want, HEADER_SIZE)):
        raise CorruptRecordError(f"the record runs on to byte {end}, past the record that {idx} lists at byte "
                                 f"{want}: its length word is damaged", offset, source=source)
    if end < size and _starts_record(peek(end, HEADER_SIZE)):
        if last:
            raise IndexMismatch(f"the last record that {idx} lists ends at byte {end}, and another record "
                                f"follows it there (the file has {size} bytes): the index lists not every record "
                                f"(records added after it was written?)", offset, source=source)
        raise IndexMismatch(f"the record ends at byte {end}, where another record starts, but {idx} lists the "
                            f"next record at byte {want}: the index is not this file's (written for an earlier "
                            f"version of it, or listing not every record: one line per record, as MXNet's "
                            f"im2rec writes it)", offset, source=source)
    if end == size:
        raise IndexMismatch(f"the record ends at byte {end}, where the file ends, but {idx} lists the next record "
                            f"at byte {want}, where none starts: the index is not this file's", offset,
                            source=source)
    if last and end < size:
        return
    raise CorruptRecordError(f"the record ends at byte {end}, but {idx} lists the next record at byte {want} and "
                             f"no record starts at byte {end}: its length word is damaged", offset, source=source)


SHIFT_SCAN = 1 << 20  #: bytes after a listed offset where no record starts that are searched for one


def check_shift(exc: CorruptRecordError, offset: int, want: int, after: Optional[int], size: int, source: str,
                idx: str, peek: Callable[[int, int], bytes]) -> None:
    """``exc`` was raised reading the record that the index lists at ``offset`` (the next listed at
    ``want``, the one after that at ``after``; None: ``want`` is the last, or the file's end); nothing to
    say unless it is that no frame head is at ``offset`` (a bad magic there).
    Damage to its head is one damaged sample -- unless a record starts a little after ``offset`` and ends
    where the index's next record would, moved by the same number of bytes (or the record listed at
    ``want`` starts that much earlier, and ends so): bytes were inserted into the file, or removed from
    it, after the index was written, and every later listed offset is off by as much.  Read by such an
    index every later group failed as damaged, skipped one by one under ``on_error="skip"``: an
    :class:`IndexMismatch` instead, whatever ``on_error`` says.  ``peek(at, n)`` reads the file."""
    if exc.offset != offset or "bad magic" not in exc.reason:
        return
    from .framing import CFLAG_LAST, CFLAG_MIDDLE, find_next_head, frame_at
    window = peek(offset, min(max(want - offset, 0), SHIFT_SCAN) + HEADER_SIZE)

    def end_of(pos: int) -> Optional[int]:
        """Past the last frame of the record whose first frame is at ``pos`` (None: none there)."""
        frame = frame_at(peek, pos)
        if frame is None or frame[0] not in (CFLAG_FULL, CFLAG_FIRST):
            return None
        for _ in range(100_000):  # (a multipart record: its parts, as far as they go)
            if frame[0] in (CFLAG_FULL, CFLAG_LAST) or frame[1] >= size:
                return frame[1]
            frame = frame_at(peek, frame[1])
            if frame is None or frame[0] not in (CFLAG_MIDDLE, CFLAG_LAST):
                return None
        return None

    # A move is told only where the next listed record is missing too, and found moved as much: the
    # damaged record's own payload may hold whole frames (a nested .rec) of any size, one of which ends
    # where a move would put the next record, or at the file's end -- so never for the last record,
    # which has no next one to confirm it.
    if want >= size or _starts_record(peek(want, HEADER_SIZE)):
        return
    fits = []  # (bytes moved, listed offset, where that record starts)
    i = find_next_head(window, 4, len(window), offset)
    while i >= 0:
        pos = offset + i
        end = end_of(pos)
        if end is not None:
            for listed, nxt in ((offset, want), (want, after)):
                moved = pos - listed
                if moved < 0 or 0 < moved and pos < want:  # (at ``want``: that record itself)
                    moved_next = None if nxt is None else nxt + moved
                    if moved_next is not None and moved_next < size and end == moved_next \
                            and _starts_record(peek(moved_next, HEADER_SIZE)):
                        fits.append((abs(moved), listed, pos))
        i = find_next_head(window, i + 1, len(window), offset)
    if fits:  # (records of one size fit several moves: the smallest is the likely one)
        _, listed, pos = min(fits)
        moved = pos - listed
        how = "inserted into" if moved > 0 else "removed from"
        raise IndexMismatch(
            f"{idx} lists a record at byte {offset}, where none starts; the record it lists at byte {listed} "
            f"starts at byte {pos}, and ends where the next would, {abs(moved)} bytes "
            f"{'later' if moved > 0 else 'earlier'} too: bytes were {how} the file after the index was "
            f"written, and every offset it lists after them is off (rebuild the index)", offset, source=source)


def check_offsets(offsets: List[int], size: Optional[int], source: str, idx: str) -> None:
    """Raise :class:`IndexMismatch` when the sorted ``offsets`` of an index cannot be its file's (``size``
    bytes; None: not known): an offset listed twice, one at or past the end, none at byte 0 (where every
    writer puts the first record) or none at all for a file that is not empty."""
    if not offsets:
        if size:
            raise IndexMismatch(f"{idx} lists no record, and the file has {size} bytes: the index is not "
                                f"this file's", 0, source=source)
        return
    if offsets[0] != 0:
        raise IndexMismatch(f"{idx} lists no record at byte 0 (its first is at byte {offsets[0]}): the "
                            f"index is not this file's, or lists not every record", offsets[0], source=source)
    if size is not None and offsets[-1] >= size:
        bad = offsets[bisect.bisect_left(offsets, size)]
        raise IndexMismatch(f"{idx} lists a record at byte offset {bad}, at or past the end of the file "
                            f"({size} bytes): the index is not this file's (or the file was truncated)", bad,
                            source=source)
    for a, b in zip(offsets, offsets[1:]):
        if a == b:
            raise IndexMismatch(f"{idx} lists the record at byte offset {a} more than once", a, source=source)


_CHECKED: set = set()  # readers' index_identity() whose check_index passed (this process, any pass)


def check_index(reader: Any, sorted_offsets: List[int], nfields: int) -> None:
    """Check that ``reader``'s index fits its file before any group is read by it: the offsets
    (:func:`check_offsets`), and -- where reads are cheap (``reader.probe_upfront``: a local file, not
    an object each read of which is a GET) -- the records of its first group and the one after, and its
    last record, read whole, each ending where the next listed one starts (:func:`check_end`).  An index
    of one line per sample, of another file or of the file before records were added then fails at once,
    whatever ``on_error`` says (it is not one damaged sample: every group would be wrong, or records left
    out silently); elsewhere when those records are read.  A damaged record is left to the group that
    holds it.  Passed once per process for an unchanged file (``reader.index_identity()``) and the same
    offsets."""
    ident = reader.index_identity()
    key = None if ident is None else (ident, len(sorted_offsets), hash(tuple(sorted_offsets)))
    if key is not None and key in _CHECKED:
        return
    check_offsets(sorted_offsets, reader.size, reader.rec_path, reader.idx_path)
    for offset in {*sorted_offsets[:nfields + 1], *sorted_offsets[-1:]} if reader.probe_upfront else ():
        try:
            reader.read_at(offset)
        except IndexMismatch:
            raise
        except (CorruptRecordError, AmbiguousJoin):  # (its end was checked before its parts were joined)
            pass
    if key is not None:
        _CHECKED.add(key)


def spans_of(sorted_offsets: List[int], size: int) -> List[Tuple[int, int]]:
    """``(offset, bytes to the next record or the end)`` of each record start, in file order."""
    ends = sorted_offsets[1:] + [size]
    return [(a, b - a) for a, b in zip(sorted_offsets, ends)]


class WindowSource:
    """A :class:`~parrecio.recordio.framing.FrameSource` over ``fetch(offset, nbytes) -> bytes`` (a
    ``pread``, a ranged GET), one per record read (so thread-safe): one window of bytes at a time, the
    first ``first`` bytes long (the record's span, from the index), later ones ``later`` (a multipart
    record that runs past it)."""

    __slots__ = ("fetch", "first", "later", "lo", "data")

    def __init__(self, fetch: Any, first: int, later: int = _DEFAULT_READ) -> None:
        self.fetch, self.first, self.later = fetch, first, later
        self.lo = 0
        self.data = memoryview(b"")

    def view(self, offset: int, nbytes: int) -> memoryview:
        rel = offset - self.lo
        if rel < 0 or rel + nbytes > len(self.data):
            self.data = memoryview(self.fetch(offset, max(nbytes, self.first)))
            self.lo, rel = offset, 0
            self.first = self.later  # the span was for the first read only
        return self.data[rel:rel + nbytes]


def _open_rec(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise SourceError(f"could not open {path}: {err}") from err


class _OpenRecs:
    """The ``.rec`` descriptors of this process's IndexedRecordReaders, at most :attr:`limit` open at
    once: the one opened longest ago is closed, and opened again when read again (checked to be the same
    file; the order of opening, not of reads: a shuffled read reads its files at random anyway, and a
    lock per read cost more).  A shuffled read of thousands of indexed files keeps one reader of each for
    the pass: with a descriptor each, 400 files under ``ulimit -n 256`` (or 2,000 under the common 1,024)
    failed with EMFILE.  Never more than a quarter of this process's descriptor limit either (under
    ``ulimit -n 64`` the 64 ``.rec`` files left none for the ``.idx`` read next)."""

    most = 64

    @property
    def limit(self) -> int:
        try:
            import resource
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, ValueError, OSError):  # pragma: no cover
            return self.most
        return self.most if soft == resource.RLIM_INFINITY else max(1, min(self.most, soft // 4))

    def __init__(self) -> None:
        self._lru: "OrderedDict[int, weakref.ref]" = OrderedDict()
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # (a thread of the parent may have held it at the fork)
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def opened(self, reader: "IndexedRecordReader") -> None:
        with self._lock:
            self._lru.pop(id(reader), None)  # (to the end: never among the oldest, let go of by its own read)
            self._lru[id(reader)] = weakref.ref(reader)
            over = len(self._lru) - self.limit
            oldest = list(self._lru.items())[:over] if over > 0 else []
        for key, ref in oldest:  # (outside the lock: a reader's _io may be held by a read that opens)
            r = ref()
            if r is None or r._let_go():
                with self._lock:
                    if self._lru.get(key) is ref:
                        del self._lru[key]

    def forget(self, reader: "IndexedRecordReader") -> None:
        with self._lock:
            self._lru.pop(id(reader), None)


_OPEN_RECS = _OpenRecs()


class IndexedRecordReader:
    """Read records by key or offset from a ``.rec`` file and its ``.idx`` index.

    :param rec_path: the RecordIO file.
    :param idx_path: its index; default ``rec_path`` with the suffix replaced by ``.idx``.
    :param join: ``"auto"`` (default), ``"mxnet"`` or ``"concat"``, as for
        :class:`~parrecio.recordio.reader.RecordReader`; ``"auto"`` decides at the first multipart record
        read, from it and a few more records the index shows to be long (:class:`~parrecio.recordio.joins.IndexedJoin`).
    :param max_record_bytes: the largest (joined) payload accepted, in bytes (default 64 MiB).

    ``reader[key]`` returns the payload ``bytes`` (``KeyError`` for an unknown key), :meth:`read_at` reads
    the record whose first frame starts at a byte offset.  Framing errors raise
    :class:`~parrecio.errors.CorruptRecordError`, and so does a record that does not end where the index
    lists the next one (or at the end of the file), :class:`IndexMismatch`: the record is damaged or the
    index is not this file's (never bytes cut short or run on into the next record).  Iterating yields
    the keys in file order.
    """

    def __init__(self, rec_path: Union[str, "os.PathLike[str]"],
                 idx_path: Union[str, "os.PathLike[str]", None] = None, *, join: str = "auto",
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.join = check_join(join)
        self.max_record_bytes = int(max_record_bytes)
        self.rec_path = os.fsdecode(check_path_arg(rec_path, "rec_path", file_ok=False))
        check_path_arg(idx_path, "idx_path", file_ok=False)
        if idx_path is None:
            idx_path = index_path(self.rec_path)
        self.idx_path = os.fsdecode(idx_path)
        keys, self._offsets = read_index_columns(self.idx_path)
        # im2rec's and pack's keys are 0, 1, 2...: a range holds them in 48 bytes, not 40 a record
        self._keys: Sequence[Key] = range(len(keys)) if all(k == i for i, k in enumerate(keys)) else keys
        del keys
        self._key_map: Optional[Dict[Key, int]] = None  # (made at the first look-up by key: ~100 B a record)
        self._io = threading.RLock()  # (held by each read, and by a close of its descriptor: see _OpenRecs)
        self._closed = False
        self._fd: Optional[int] = _open_rec(self.rec_path)
        st = os.fstat(self._fd)
        self._size = st.st_size
        self._check = FileCheck(self._fd, identity(st), self.rec_path)  # (the version its reads are of)
        _OPEN_RECS.opened(self)
        self._sorted = sorted(set(self._offsets))
        self._auto = None if self.join != "auto" else IndexedJoin.of(self)

    @property
    def keys(self) -> List[Key]:
        """The keys in ``.idx`` file order (a copy)."""
        return list(self._keys)

    @property
    def offsets(self) -> List[int]:
        """The byte offsets in ``.idx`` file order (a copy), parallel to :attr:`keys`."""
        return list(self._offsets)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys)

    @property
    def _by_key(self) -> Dict[Key, int]:
        if self._key_map is None:
            self._key_map = dict(zip(self._keys, self._offsets))
        return self._key_map

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __getitem__(self, key: Key) -> bytes:
        """The payload of the record stored under ``key``."""
        return self.read_at(self._by_key[key])

    def read_at(self, offset: int) -> bytes:
        """The payload of the record whose first frame starts at byte ``offset`` of the ``.rec`` file."""
        if self._closed:
            raise ValueError("I/O operation on a closed IndexedRecordReader")
        if offset < 0:
            raise ValueError(f"offset must be >= 0, not {offset}")
        if self._auto is not None:
            return self._auto.payload(offset).tobytes()
        return self._read(offset, self.join).tobytes()

    def _read(self, offset: int, join: str, parts: Optional[List[int]] = None) -> memoryview:
        i = bisect.bisect_right(self._sorted, offset)
        want = self._sorted[i] if i < len(self._sorted) else self._size  # (where a listed record ends)
        span = min(max(want - offset, HEADER_SIZE), self.max_record_bytes + HEADER_SIZE + 3)
        with self._io:
            fd = self._fd_now()
            try:
                got = read_record(WindowSource(lambda at, n: os.pread(fd, n, at), span), offset, join=join,
                                  max_record_bytes=self.max_record_bytes, source=self.rec_path, parts=parts)
            except CorruptRecordError as exc:
                if i and self._sorted[i - 1] == offset:  # (a listed record, or else no index's business)
                    after = self._sorted[i + 1] if i + 1 < len(self._sorted) else None
                    check_shift(exc, offset, want, after, self._size, self.rec_path, self.idx_path,
                                lambda at, n: os.pread(fd, n, at))
                raise
            if got is None:
                raise CorruptRecordError("no record here: offset at or past the end of the file", offset,
                                         source=self.rec_path)
            if got[1] != want and i and self._sorted[i - 1] == offset:  # (a listed record: it ends at the next)
                check_end(offset, got[1], want, self._size, self.rec_path, self.idx_path,
                          lambda at, n: os.pread(fd, n, at))
        return got[0]

    def _fd_now(self) -> int:
        """The ``.rec`` file's descriptor (with ``_io`` held), opened again if it was let go of to keep
        this process's descriptors few (:class:`_OpenRecs`): the same file, unchanged, or a SourceError."""
        if self._closed:
            raise ValueError("I/O operation on a closed IndexedRecordReader")
        fd = self._fd
        if fd is None:
            fd = self._check.fd = _open_rec(self.rec_path)
            try:
                self._check()  # (the file opened again is the version read before, or a SourceError)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            _OPEN_RECS.opened(self)
        return fd

    def _let_go(self) -> bool:
        """Close the descriptor until the next read, unless a read holds it now; whether it was closed."""
        if not self._io.acquire(blocking=False):
            return False
        try:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
            return True
        finally:
            self._io.release()

    def check(self) -> None:
        """Raise :class:`~parrecio.errors.SourceError` if the ``.rec`` file changed since it was opened
        (replaced, rewritten, truncated or grown): the reads since may be of other bytes.  Called after
        reads, it sees any change they could have seen (:mod:`parrecio.recordio.filecheck`); each read
        does not call it (one ``fstat``, ~1 us): the pipeline checks each group it reads."""
        with self._io:
            if self._fd is None:  # (let go of: opening it again checks it)
                self._fd_now()
            else:
                self._check()

    probe_upfront = True  # (check_index: reads are preads)

    @property
    def size(self) -> int:
        """The ``.rec`` file's size in bytes when it was opened."""
        return self._size

    def index_identity(self) -> Tuple[Any, ...]:
        """What :func:`check_index` remembers a passed check by: the paths, sizes and times of both files."""
        idx = os.stat(self.idx_path)
        with self._io:  # (its descriptor may be let go of by another thread's read meanwhile)
            rec = os.stat(self.rec_path) if self._closed or self._fd is None else os.fstat(self._fd)
        return (self.rec_path, self.idx_path, rec.st_size, rec.st_mtime_ns, rec.st_ino, idx.st_size,
                idx.st_mtime_ns, idx.st_ino)

    def _spans(self) -> List[Tuple[int, int]]:
        return spans_of(self._sorted, self._size)

    def close(self) -> None:
        """Close the ``.rec`` file.  Idempotent."""
        with self._io:
            self._closed = True
            fd, self._fd = self._fd, None
        _OPEN_RECS.forget(self)
        if fd is not None:
            os.close(fd)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __del__(self) -> None:
        # Only the descriptor: no lock.  The cyclic garbage collector may run this inside _OpenRecs's lock
        # (it allocates there), and no other thread can read a reader being collected; its entry there
        # is a dead weak reference, dropped by the next opened().
        fd = self.__dict__.get("_fd")
        if fd is not None:
            self._fd = None
            try:
                os.close(fd)
            except OSError:  # pragma: no cover - interpreter shutdown
                pass

    def __enter__(self) -> "IndexedRecordReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IndexedRecordReader({self.rec_path!r}, {len(self)} records)"
