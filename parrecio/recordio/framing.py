"""RecordIO framing: the one implementation of frame validation, part joining, splitting and resync.

The format (dmlc-core ``include/dmlc/recordio.h``, ``src/recordio.cc``; MXNet ``python/mxnet/recordio.py``)::

    frame  = [magic u32 = 0xCED7230A][lrec u32][part payload][zero pad to a multiple of 4 bytes]
    lrec   = (cflag << 29) | length          length < 2**29 bytes, cflag in 0..3

A record is one frame with ``cflag 0``, or a multipart sequence ``1, 2, ..., 2, 3``.  dmlc-core's
``RecordIOWriter::WriteRecord`` (mirrored by :func:`split_payload`) splits a payload wherever the magic occurs
at a 4-byte-aligned offset of the payload and drops those 4 bytes; its ``RecordIOReader::NextRecord``
re-inserts them between the parts (``join="mxnet"``).  SageMaker Pipe mode's RecordIO wrapper, as read by AWS
ML-IO, splits at arbitrary sizes and joins by plain concatenation (``join="concat"``).  No header says
which convention a stream uses; the shapes of its multipart records do (``join="auto"``,
:mod:`parrecio.recordio.joins`).

``(MAGIC >> 29) == 6 > 3``, so an lrec word can never look like the magic: after corruption a reader
resyncs on the next 4-byte-aligned magic followed by a ``cflag`` of 0 or 1 (dmlc-core
``FindNextRecordIOHead``), see :func:`find_next_head`.

Everything that reads frames (the streaming :class:`~parrecio.recordio.reader.RecordReader` and the random
access :class:`~parrecio.recordio.index.IndexedRecordReader`) goes through :func:`read_record`, which pulls
bytes from a :class:`FrameSource`.
"""

from __future__ import annotations

import struct
from typing import Callable, Iterator, List, Optional, Protocol, Tuple, Union

from ..errors import CorruptRecordError

__all__ = [
    "MAGIC", "MAGIC_BYTES", "HEADER_SIZE", "LENGTH_MASK", "MAX_PAYLOAD_BYTES", "DEFAULT_MAX_RECORD_BYTES",
    "CFLAG_FULL", "CFLAG_FIRST", "CFLAG_MIDDLE", "CFLAG_LAST", "JOINS", "READ_JOINS",
    "encode_lrec", "padded_size", "frame_header", "split_payload", "encode_record",
    "check_join", "FrameSource", "read_record", "find_next_head", "frame_at",
]

MAGIC = 0xCED7230A
"""The frame magic (dmlc-core ``RecordIOWriter::kMagic``), stored little-endian."""
MAGIC_BYTES = struct.pack("<I", MAGIC)  # b"\x0a\x23\xd7\xce"
HEADER_SIZE = 8
"""Bytes of a frame header: magic u32 + lrec u32."""
LENGTH_MASK = (1 << 29) - 1
MAX_PAYLOAD_BYTES = LENGTH_MASK
"""The largest part length the lrec word can hold; dmlc-core refuses payloads of ``2**29`` bytes or more."""
DEFAULT_MAX_RECORD_BYTES = 64 << 20
"""Default limit on a record's (joined) payload size, 64 MiB: a larger length word is treated as corruption
rather than allocated.  Raise it with ``max_record_bytes=`` for datasets of bigger records."""

CFLAG_FULL, CFLAG_FIRST, CFLAG_MIDDLE, CFLAG_LAST = 0, 1, 2, 3
JOINS = ("mxnet", "concat")
READ_JOINS = ("auto",) + JOINS  # "auto": decided from the stream (parrecio.recordio.joins)

HEADER = struct.Struct("<II")
_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")  # indexed by length % 4


def encode_lrec(cflag: int, length: int) -> int:
    """Return the lrec word for a part of ``length`` bytes with continuation flag ``cflag`` (0..3)."""
    if not 0 <= cflag <= 3:
        raise ValueError(f"cflag must be 0..3, not {cflag}")
    if not 0 <= length <= LENGTH_MASK:
        raise ValueError(f"a RecordIO part holds at most {LENGTH_MASK} bytes, not {length}")
    return (cflag << 29) | length


def padded_size(length: int) -> int:
    """``length`` rounded up to a multiple of 4 bytes: what a part occupies on disk after its header."""
    return (length + 3) & ~3


def frame_header(cflag: int, length: int) -> bytes:
    """The 8 header bytes of a frame: magic and lrec, little-endian."""
    return HEADER.pack(MAGIC, encode_lrec(cflag, length))


def split_payload(payload: Union[bytes, bytearray]) -> List[Tuple[int, int]]:
    """Where dmlc-core's writer cuts ``payload``: a list of ``(start, end)`` byte ranges, one per part.

    A part ends wherever the magic occurs at a 4-byte-aligned offset of the payload; those 4 bytes are
    dropped.  One range means a single ``cflag 0`` frame; otherwise the cflags are ``1, 2, ..., 2, 3``.
    Parts may be empty (magic at the start, consecutive magics, magic as the last aligned word).
    """
    cuts: List[Tuple[int, int]] = []
    find = payload.find
    lower_align = len(payload) & ~3
    start = 0
    i = find(MAGIC_BYTES)
    while 0 <= i < lower_align:
        if i & 3:
            i = find(MAGIC_BYTES, i + 1)
            continue
        cuts.append((start, i))
        start = i + 4
        i = find(MAGIC_BYTES, start)
    cuts.append((start, len(payload)))
    return cuts


def encode_record(payload: Union[bytes, bytearray]) -> Iterator[bytes]:
    """Yield the byte strings that make up ``payload``'s frames, exactly as dmlc-core writes them.

    Intermediate parts are whole multiples of 4 bytes by construction; only the last is zero-padded.
    Raises ``ValueError`` for a payload of ``2**29`` bytes or more.
    """
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"RecordIO only accepts payloads of less than 2**29 bytes, not {len(payload)}")
    cuts = split_payload(payload)
    last = len(cuts) - 1
    for k, (a, b) in enumerate(cuts):
        cflag = 0 if last == 0 else (1 if k == 0 else (3 if k == last else 2))
        yield HEADER.pack(MAGIC, (cflag << 29) | (b - a))
        if b > a:
            yield payload[a:b] if (a, b) != (0, len(payload)) else payload
    yield _PAD[len(payload) & 3]


def check_join(join: str, auto: bool = True) -> str:
    """Validate a ``join`` argument (``"auto"``, where ``auto``, ``"mxnet"`` or ``"concat"``) and return it."""
    allowed = READ_JOINS if auto else JOINS
    if join not in allowed:
        raise ValueError(f"join must be one of {allowed}, not {join!r}")
    return join


class FrameSource(Protocol):
    """Where :func:`read_record` takes its bytes from."""

    def view(self, offset: int, nbytes: int) -> memoryview:
        """Return the stream's bytes ``[offset, offset + nbytes)``, shorter only at end of stream.

        The view may be invalidated by the next call to ``view``.  ``offset`` is an absolute stream offset
        in bytes, never before the start of the record being read.
        """
        ...


def read_record(src: FrameSource, offset: int, *, join: str, max_record_bytes: int,
                source: Optional[str] = None, parts: Optional[List[int]] = None
                ) -> Optional[Tuple[memoryview, int]]:
    """Read the record whose first frame starts at stream byte ``offset``.

    Returns ``(payload, next_offset)`` -- the joined payload (a view into ``src`` for a single frame, a view
    of a fresh ``bytearray`` for a multipart record) and the offset just past the record's last frame --
    or ``None`` at a clean end of stream (no byte at ``offset``).  ``join`` is ``"mxnet"`` (re-insert the
    magic between parts) or ``"concat"``.  ``max_record_bytes`` bounds the joined payload; it is checked
    against each length word before any byte of that part is requested, so a hostile length word is never
    allocated.  ``parts``, a list: the length of each part is appended to it (``join="auto"`` reads
    with ``"concat"`` and decides later, :mod:`parrecio.recordio.joins`).

    Raises :class:`~parrecio.errors.CorruptRecordError` (``.offset`` = the offending frame's offset) on a bad
    magic, a continuation part without a first part, a new record while a multipart record is open, a
    truncated header or payload, or a length above ``max_record_bytes``.
    """
    head = src.view(offset, HEADER_SIZE)
    if not len(head):
        return None
    cflag, length = _check_header(head, offset, max_record_bytes, source)
    if cflag > CFLAG_FIRST:
        raise CorruptRecordError(f"continuation part (cflag {cflag}) without a first part (cflag 1)",
                                 offset, source=source)
    body = _body(src, offset, length, source)
    if parts is not None:
        parts.append(length)
    if cflag == CFLAG_FULL:
        return body[:length], offset + HEADER_SIZE + padded_size(length)
    joined = bytearray(body[:length])
    sep = MAGIC_BYTES if join == "mxnet" else b""
    pos = offset + HEADER_SIZE + padded_size(length)
    while True:
        head = src.view(pos, HEADER_SIZE)
        if not len(head):
            raise CorruptRecordError(f"stream ends inside the multipart record that starts at byte {offset}",
                                     pos, source=source)
        cflag, length = _check_header(head, pos, max_record_bytes - len(joined) - len(sep), source,
                                      (offset, len(joined) + len(sep), max_record_bytes))
        if cflag < CFLAG_MIDDLE:
            raise CorruptRecordError(f"new record (cflag {cflag}) before the multipart record that starts at "
                                     f"byte {offset} was closed by a cflag 3 part", pos, source=source)
        body = _body(src, pos, length, source)
        if parts is not None:
            parts.append(length)
        joined += sep
        joined += body[:length]
        pos += HEADER_SIZE + padded_size(length)
        if cflag == CFLAG_LAST:
            return memoryview(joined), pos


def _check_header(head: memoryview, offset: int, limit: int, source: Optional[str],
                  part_of: Optional[Tuple[int, int, int]] = None) -> Tuple[int, int]:
    """Validate a frame header; return ``(cflag, length)``.  ``limit`` is the bytes still allowed.
    ``part_of``: ``(where the record starts, its bytes before this part, max_record_bytes)`` for a part
    after the first of a multipart record (what an error about its length names)."""
    if len(head) < HEADER_SIZE:
        raise CorruptRecordError(f"truncated frame header: stream ends after {len(head)} of {HEADER_SIZE} "
                                 f"header bytes", offset, source=source)
    magic, lrec = HEADER.unpack_from(head)
    if magic != MAGIC:
        # At byte 0 the input is most likely no RecordIO at all: its first bytes say what it is (a PNG's
        # b'\x89PNG\r\n\x1a\n', gzip's b'\x1f\x8b').  The CLI names the kind (tools.inspect.not_recordio).
        what = f"; not a RecordIO stream? it starts with {bytes(head[:HEADER_SIZE])!r}" if offset == 0 else ""
        raise CorruptRecordError(f"bad magic 0x{magic:08X} (expected 0x{MAGIC:08X}){what}", offset, source=source)
    cflag, length = lrec >> 29, lrec & LENGTH_MASK
    if length > limit:
        if part_of is not None:
            start, before, most = part_of
            raise CorruptRecordError(f"a part of {length} bytes takes the multipart record that starts at byte "
                                     f"{start} to {before + length} bytes: it exceeds max_record_bytes ({most})",
                                     offset, source=source)
        raise CorruptRecordError(f"record length {length} bytes exceeds max_record_bytes ({limit})", offset,
                                 source=source)
    return cflag, length


def _body(src: FrameSource, offset: int, length: int, source: Optional[str]) -> memoryview:
    """The padded payload of the frame at ``offset``; raise if the stream ends inside it."""
    want = padded_size(length)
    body = src.view(offset + HEADER_SIZE, want)
    if len(body) < want:
        raise CorruptRecordError(f"truncated payload: frame declares {length} bytes (+{want - length} "
                                 f"padding) but the stream ends after {len(body)}", offset, source=source)
    return body


def frame_at(read: Callable[[int, int], bytes], pos: int) -> Optional[Tuple[int, int]]:
    """``(cflag, offset of the next frame)`` of the frame head at ``pos``, or None where none is (no magic
    there, or the stream ends inside the head); ``read(at, n)`` gives ``n`` bytes at offset ``at``.  The
    frame's payload is not read: what walks a file's frames by their heads (the CLI's checks)."""
    raw = read(pos, HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        return None
    magic, lrec = HEADER.unpack(raw)
    return (lrec >> 29, pos + HEADER_SIZE + padded_size(lrec & LENGTH_MASK)) if magic == MAGIC else None


def find_next_head(buf: Union[bytes, bytearray, memoryview], start: int, end: int, base: int) -> int:
    """Index in ``buf[start:end]`` of the next plausible frame head, or -1 (dmlc ``FindNextRecordIOHead``).

    A head is the magic at a stream offset (``base`` + index) that is a multiple of 4, followed by an lrec
    word whose cflag is 0 or 1.  Only heads whose 8 bytes lie entirely before ``end`` are found; the caller
    keeps the last 7 bytes when it refills.  ``buf`` must support ``.find`` (bytes/bytearray).
    """
    find = buf.find
    i = find(MAGIC_BYTES, start, end)
    while i >= 0 and i + HEADER_SIZE <= end:
        if not (base + i) & 3 and buf[i + 7] >> 5 <= CFLAG_FIRST:
            return i
        i = find(MAGIC_BYTES, i + 1, end)
    return -1
