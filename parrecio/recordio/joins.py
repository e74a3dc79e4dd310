"""``join="auto"``: which multipart convention a stream was written with, decided from the stream itself.

Two writers split a payload into the parts of a multipart record (cflags 1, 2, ..., 3), differently:

- dmlc-core / MXNet (``im2rec``, ``MXRecordIO``): only where the magic occurs at a 4-byte-aligned offset
  of the payload, dropping those 4 bytes (``join="mxnet"`` puts them back).  So every part but the last is
  a multiple of 4 bytes long, of any length; such records are rare (a JPEG holds the aligned magic about
  once in 10^5 images).
- SageMaker's RecordIO wrapper and ``parrecio pack --split-bytes`` (:mod:`parrecio.recordio.wrapper`):
  every ``S`` bytes, ``S`` fixed for the stream, dropping nothing (``join="concat"``).  So every part but
  the last is exactly ``S`` bytes, the last 1..S, and no single-part record is longer than ``S``.

:class:`JoinGuess` holds what a stream has shown so far and decides at the first record that fits one
convention only: a part whose length is not a multiple of 4 (not MXNet's: concat, whether the parts are
of one size, as SageMaker cuts them, or not, as in ML-IO's test files); aligned parts of unequal lengths, a
last part longer than the others, or a single-part record longer than the parts (not a fixed split); a
second multipart record cut at the same ``S`` (MXNet's writer cuts where the magic happens to be: two
records with the magic at one offset, each no longer than ``2 S``, and no single-part record longer
than ``S`` in the look-ahead after them -- 16 MiB of a stream, up to :data:`PROBES` long records by
index -- do not happen by chance; a single-part record longer than ``S`` anywhere it looks decides
MXNet's, whichever record was read first).  A stream without multipart records needs no decision (both joins
read it alike).  Where the stream ends, or the look-ahead bound is reached, with one record that fits
both, :func:`ambiguous` is the error: the reader never guesses.

Readers use it like this (:class:`~parrecio.recordio.reader.RecordReader` for streams, which looks ahead
from an undecided record; :class:`IndexedJoin` for readers by index, which read a few more records that
the index shows to be long):

    record parts (lengths) --JoinGuess.multipart--> "mxnet" | "concat" | None (undecided: look further)
    single-part record     --JoinGuess.single-----> "mxnet" | None
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, List, Optional, Sequence

from ..errors import CorruptRecordError, SourceError
from .framing import HEADER_SIZE, MAGIC_BYTES, padded_size

__all__ = ["JoinGuess", "IndexedJoin", "AmbiguousJoin", "ambiguous", "join_parts", "LOOKAHEAD_BYTES",
           "PROBES"]

#: How far a streaming reader looks ahead of an undecided multipart record (bytes of the stream), before
#: it gives up with :func:`ambiguous`.  Held in memory while it looks.
LOOKAHEAD_BYTES = 16 << 20
#: How many further records a reader by index reads to decide.
PROBES = 8


class AmbiguousJoin(SourceError):
    """``join="auto"`` cannot tell a stream's multipart convention (or its records fit neither): the
    stream cannot be read right without ``join=``.  A :class:`~parrecio.errors.SourceError`, never
    skipped by ``on_error="skip"``."""


class JoinGuess:
    """What one stream has shown of its multipart convention; ``join`` once decided, with ``why``."""

    __slots__ = ("join", "why", "split", "max_single", "multi", "first", "second", "seen")

    def __init__(self) -> None:
        self.join: Optional[str] = None
        self.why = ""
        self.split: Optional[int] = None   # S of the undecided multipart records seen
        self.max_single = 0                # the longest single-part record seen
        self.multi = 0                     # multipart records seen that fit both conventions
        self.first: Optional[int] = None   # the first such record's offset
        self.second: Optional[int] = None  # the second's
        self.seen: set = set()             # their offsets: a record read again (by index) counts once

    def _decide(self, join: str, why: str) -> str:
        self.join, self.why = join, why
        return join

    def single(self, length: int) -> Optional[str]:
        """A single-part record of ``length`` bytes."""
        if length > self.max_single:
            self.max_single = length
            if self.split is not None and length > self.split and self.join is None:
                return self._decide("mxnet", f"a single-part record of {length} bytes is longer than the "
                                             f"{self.split}-byte parts of the multipart record at byte "
                                             f"{self.first}: not a fixed-size split")
        return self.join

    def multipart(self, lengths: Sequence[int], offset: int) -> Optional[str]:
        """A multipart record at stream byte ``offset`` whose parts are ``lengths`` bytes long."""
        if self.join is not None:
            return self.join
        head = lengths[:-1]
        size, last = lengths[0], lengths[-1]
        aligned = all(n % 4 == 0 for n in head)
        fixed = (size > 0 and all(n == size for n in head) and 1 <= last <= size)
        if not aligned:  # MXNet's writer cuts only at an aligned magic; concatenation is the other way
            odd = next(n for n in head if n % 4)   # (ML-IO's split records: parts of 8, 10, 1, 29 bytes)
            return self._decide("concat", f"the multipart record at byte {offset} has a {odd}-byte part, not "
                                          f"a multiple of 4: not MXNet's writer, which cuts at an aligned magic")
        if not fixed:
            return self._decide("mxnet", f"the parts of the multipart record at byte {offset} "
                                         f"({_show(lengths)} bytes) are not a fixed-size split")
        if self.max_single > size:
            return self._decide("mxnet", f"a single-part record of {self.max_single} bytes is longer than the "
                                         f"{size}-byte parts of the multipart record at byte {offset}: not a "
                                         f"fixed-size split")
        if self.split is not None and size != self.split:
            return self._decide("mxnet", f"the multipart records at bytes {self.first} and {offset} are cut at "
                                         f"{self.split} and {size} bytes: not a fixed-size split")
        if offset in self.seen:  # read again after an AmbiguousJoin: still one record, not two cut alike
            return None
        self.seen.add(offset)
        self.multi += 1
        if self.split is None:
            self.split, self.first = size, offset
        elif self.second is None:
            self.second = offset
        # (two records cut at one size are a fixed-size split only if no single-part record is longer:
        # that is for the look-ahead to show, settle() decides where it ends)
        return None

    def settle(self, source: Optional[str], looked: str) -> str:
        """Where a look-ahead (``looked``: what it read) ends without a decision: ``"concat"`` when two
        multipart records were cut at one size ``S`` and no single-part record it saw is longer than
        ``S``; else :class:`AmbiguousJoin`, raised."""
        if self.multi >= 2:
            return self._decide("concat", f"the multipart records at bytes {self.first} and {self.second} are "
                                          f"both cut every {self.split} bytes, and no record in {looked} is "
                                          f"longer than that otherwise")
        raise ambiguous(self, source, looked)

    def describe(self) -> str:
        """For ``stats`` and ``inspect``: what was chosen, and why."""
        if self.join is not None:
            return f"{self.join} ({self.why})"
        return "either (no multipart records)" if self.multi == 0 else "undecided"


def _show(lengths: Sequence[int]) -> str:
    return ", ".join(map(str, lengths[:6])) + (", ..." if len(lengths) > 6 else "")


def ambiguous(guess: JoinGuess, source: Optional[str], looked: str) -> AmbiguousJoin:
    """The error of a stream whose multipart convention cannot be told (see the module docstring)."""
    return AmbiguousJoin(
        f"{source or 'the stream'}: cannot tell how the multipart record at byte {guess.first} was written: "
        f"its parts are {guess.split} bytes and one more no longer, which fits MXNet's writer (cut at an "
        f"aligned magic, join='mxnet') and a fixed-size split (SageMaker's RecordIO wrapper, parrecio pack "
        f"--split-bytes: join='concat') alike, and {looked} shows nothing that tells them apart; pass "
        f"join='mxnet' or join='concat'")


def join_parts(joined: memoryview, lengths: Sequence[int], join: str, max_record_bytes: Optional[int] = None,
               offset: int = 0, source: Optional[str] = None) -> memoryview:
    """A multipart payload read by plain concatenation (``joined``, parts of ``lengths``), joined by
    ``join``: the same bytes for ``"concat"``, the magic put back between the parts for ``"mxnet"``.

    ``max_record_bytes`` bounds the joined payload as :func:`~parrecio.recordio.framing.read_record` does
    with ``join="mxnet"``: the concatenation was read within it, but the magics put back may carry it over
    (a CorruptRecordError naming ``offset`` and ``source``), so that a file's verdict does not depend on
    whether ``join`` was named or guessed."""
    if join == "concat" or len(lengths) < 2:
        return joined
    size = len(joined) + 4 * (len(lengths) - 1)
    if max_record_bytes is not None and size > max_record_bytes:
        raise CorruptRecordError(f"record of {size} bytes with the magic put back between its {len(lengths)} "
                                 f"parts (join='mxnet') exceeds max_record_bytes ({max_record_bytes})",
                                 offset, source=source)
    out = bytearray(size)
    src = dst = 0
    for k, n in enumerate(lengths):
        if k:
            out[dst:dst + 4] = MAGIC_BYTES
            dst += 4
        out[dst:dst + n] = joined[src:src + n]
        src += n
        dst += n
    return memoryview(out)


class IndexedJoin:
    """``join="auto"`` for a reader by index (local ``.idx`` or S3): one :class:`JoinGuess` for the file,
    decided at the first multipart record read (in any order) by reading up to :data:`PROBES` more records
    that must be multipart if the file is a fixed-size split of that record's part size: those whose span
    in the index is longer than one part of that size (their shape decides; file order)."""

    def __init__(self, source: str, spans: Callable[[], Sequence[tuple]],
                 read_parts: Callable[[int, List[int]], memoryview], max_record_bytes: Optional[int] = None) -> None:
        self.source = source
        self.max_record_bytes = max_record_bytes
        self.guess = JoinGuess()
        self._spans = spans            # () -> [(offset, span bytes)] in file order
        self._read_parts = read_parts  # (offset, parts) -> payload joined by concatenation; parts filled
        self._lock = threading.Lock()

    @classmethod
    def of(cls, reader: Any) -> "IndexedJoin":
        """The join of ``reader`` (its ``rec_path``, ``_spans()`` and ``_read(at, "concat", parts)``), which
        it holds weakly: a reference cycle between the two kept a whole parsed ``.idx`` alive per pass (a new
        reader each), freed only by a full garbage collection, which its few tracked objects hardly cause."""
        ref = weakref.ref(reader)
        return cls(reader.rec_path, lambda: ref()._spans(), lambda at, parts: ref()._read(at, "concat", parts),
                   reader.max_record_bytes)

    def payload(self, offset: int) -> memoryview:
        """The payload of the record at ``offset``, joined by the file's convention."""
        parts: List[int] = []
        joined = self._read_parts(offset, parts)
        if len(parts) < 2:
            return joined
        join = self.guess.join
        if join is None:
            with self._lock:
                join = self.guess.join or self._decide(offset, parts)
        return join_parts(joined, parts, join, self.max_record_bytes, offset, self.source)

    def _decide(self, offset: int, parts: List[int]) -> str:
        guess = self.guess
        got = guess.multipart(parts, offset)
        if got is not None:
            return got
        limit = HEADER_SIZE + padded_size(guess.split)
        probed = 0
        for at, span in self._spans():
            if at == offset or span <= limit:
                continue
            more: List[int] = []
            probed += 1
            try:
                self._read_parts(at, more)
            except CorruptRecordError:  # (a damaged record tells nothing; it is its own group's error)
                more = []
            got = None
            if more:
                got = guess.multipart(more, at) if len(more) > 1 else guess.single(more[0])
            if got is not None:
                return got
            if probed >= PROBES:
                break
        return guess.settle(self.source, "its index (no other record is longer than one part)"
                            if not probed else f"{probed} more of its longest records")
