"""Inspect a RecordIO stream in one pass, in bounded memory: counts, sizes, content kinds, corruption.

:func:`inspect_stream` reads the stream with :class:`~parrecio.recordio.RecordReader` (``on_corrupt="skip"``),
looks only at each payload's first bytes (:func:`~parrecio.decoders.sniff.sniff`) and keeps counters, so a
file of any size (or a pipe) is inspected with a few MiB of memory.

Multipart records (a first frame with cflag 1) are recognised from the bytes a record spans: a single
frame spans ``8 + padded(len(payload))`` bytes, a multipart record more (each extra part adds a header).
"""

from __future__ import annotations

import os

import struct
from collections import Counter
from typing import Any, BinaryIO, Dict, List, Optional, Tuple, Union

from ..decoders.sniff import IMAGE_KINDS, PREFIX, describe, guess_fields, sniff
from ..errors import SourceError
from ..recordio import DEFAULT_MAX_RECORD_BYTES, RecordReader
from ..recordio.framing import HEADER_SIZE, padded_size
from ..recordio.paths import check_path_arg

__all__ = ["inspect_stream", "payload_kind", "not_recordio", "no_record", "GUESS_RECORDS", "CountingReader"]

GUESS_RECORDS = 64
"""How many leading records :func:`inspect_stream` gives :func:`guess_fields` to guess the group size."""


def payload_kind(payload: Any) -> str:
    """:func:`sniff`'s kind, except that an MXNet image record is ``"imagerecord/<image kind>"``."""
    kind = sniff(payload)
    if kind != "other":
        return kind
    view = memoryview(payload).cast("B") if not isinstance(payload, bytes) else payload
    if len(view) >= 24:
        flag = struct.unpack_from("<I", view, 0)[0]
        start = 24 + 4 * flag
        if flag < 1 << 16 and start < len(view):
            inner = sniff(bytes(view[start:start + 16]))
            if inner in IMAGE_KINDS:
                return f"imagerecord/{inner}"
    return "other"


#: Compressed containers a RecordIO file is often shipped in: (magic, name, the command that opens it).
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gzip -dc"), (b"BZh", "bzip2", "bzip2 -dc"),
               (b"\xfd7zXZ\x00", "xz", "xz -dc"), (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc"),
               (b"PK\x03\x04", "zip", "unzip -p"))


def is_compressed(head: bytes) -> bool:
    """Whether ``head`` starts like one of the compressed containers RecordIO files are shipped in."""
    return any(head.startswith(magic) for magic, _, _ in _COMPRESSED)


def not_recordio(name: Any, head: bytes, nbytes: Optional[int] = None) -> SourceError:
    """The one error for input that is no RecordIO stream at all, whichever command met it: what the
    input starts with, and how to make RecordIO of such files (or get at the RecordIO inside)."""
    size = f" ({nbytes} bytes)" if nbytes is not None else ""
    for magic, container, command in _COMPRESSED:
        if head.startswith(magic):
            return SourceError(f"{name}: not a RecordIO stream{size}: it is {container}-compressed; decompress "
                               f"it first, e.g. {command} {name} | parrecio cat -  (or into a .rec file)")
    kind = sniff(head) if head else "empty"
    hint = ""
    if kind in IMAGE_KINDS:
        hint = "; to pack images into RecordIO: parrecio pack images DIR out.rec"
    elif kind == "json" or head.lstrip()[:2] in (b'{"', b"{ ", b"{\n", b"{}"):  # (a line cut at 64 bytes
        hint = "; to pack a manifest's records: parrecio pack manifest FILE out.rec"  # sniffs as text)
    return SourceError(f"{name}: not a RecordIO stream{size}: it starts with {describe(head)}, not with "
                       f"the RecordIO magic 0xCED7230A{hint}")


#: How far into a file whose first frame head is broken RecordIO frame heads are looked for before it is
#: called no RecordIO at all.  A zeroed first sector or page (4 KiB) hides the next head as far away as
#: the first record ends: 1 MiB covers the records of im2rec files (JPEGs of tens to hundreds of KiB), and
#: reading it costs nothing on an error path.  A first record beyond it, with only its magic damaged, is
#: found through its length word all the same.
FRAME_SEARCH_BYTES = 1 << 20


def records_after_damage(path: str, size: int) -> Optional[int]:
    """The offset of the first intact-looking RecordIO record in the file ``path`` (``size`` bytes) whose
    frame head at byte 0 is broken, or None when nothing says that it is RecordIO.

    A record start is the magic at a 4-byte-aligned offset and a length word with cflag 0 or 1, whose
    frame is followed by the next one (cflag as the first allows) or ends the file: two heads in a row, so
    random bytes pass with odds of about 2**-68 per offset, not 2**-34.  It is looked for where the length
    word at byte 4 points (only the magic damaged: any record size), then in the first
    :data:`FRAME_SEARCH_BYTES`.
    """
    from ..recordio.framing import (CFLAG_FIRST, CFLAG_FULL, CFLAG_LAST, CFLAG_MIDDLE, HEADER_SIZE, LENGTH_MASK,
                                    find_next_head, frame_at, padded_size)

    def peek(at: int, n: int) -> bytes:  # (``f``: opened below)
        f.seek(at)
        return f.read(n)

    def follows(cflag: int) -> Tuple[int, ...]:
        """The cflags a frame after one of ``cflag`` may have: a record's start, or its next part."""
        return (CFLAG_MIDDLE, CFLAG_LAST) if cflag in (CFLAG_FIRST, CFLAG_MIDDLE) else (CFLAG_FULL, CFLAG_FIRST)

    def record_at(pos: int, cflags: Tuple[int, ...] = (CFLAG_FULL, CFLAG_FIRST)) -> bool:
        """Whether a frame head with one of ``cflags`` is at ``pos``, and after it the next frame head that
        its cflag allows, or the end of the file where a record ends."""
        frame = frame_at(peek, pos)
        if frame is None or frame[0] not in cflags:
            return False
        if frame[1] == size:  # the last frame of the file: it must end its record
            return frame[0] in (CFLAG_FULL, CFLAG_LAST)
        after = frame_at(peek, frame[1])
        return after is not None and after[0] in follows(frame[0])

    try:
        with open(path, "rb") as f:
            f.seek(4)
            word = f.read(4)
            if len(word) == 4:
                lrec = int.from_bytes(word, "little")
                nxt = HEADER_SIZE + padded_size(lrec & LENGTH_MASK)
                if lrec >> 29 in (CFLAG_FULL, CFLAG_FIRST) and nxt < size and record_at(nxt, follows(lrec >> 29)):
                    return nxt
            f.seek(HEADER_SIZE)
            window = f.read(FRAME_SEARCH_BYTES + HEADER_SIZE - 1)  # (a head that starts in the first MiB, whole)
            pos = find_next_head(window, 0, len(window), HEADER_SIZE)  # the reader's resync rule: aligned, cflag 0/1
            while pos >= 0:
                if record_at(HEADER_SIZE + pos):
                    return HEADER_SIZE + pos
                pos = find_next_head(window, pos + 1, len(window), HEADER_SIZE)
    except OSError:
        pass
    return None


def head_of(path: Any, n: int = 64) -> Optional[bytes]:
    """The first ``n`` bytes of the regular file ``path`` (None for anything else)."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read(n)
    except (OSError, TypeError, ValueError):
        return None


class CountingReader:
    """A raw binary reader that counts the bytes read through it and keeps the first ``keep`` bytes."""

    def __init__(self, raw: BinaryIO, name: Optional[str] = None, keep: int = 64) -> None:
        self.raw, self.name, self.nbytes = raw, name, 0
        self.head = bytearray()
        self._keep = keep

    def readinto(self, buf) -> Optional[int]:
        n = self.raw.readinto(buf)
        if n:
            if len(self.head) < self._keep:
                self.head += bytes(memoryview(buf)[:min(n, self._keep - len(self.head))])
            self.nbytes += n
        return n


def inspect_stream(source: Union[str, BinaryIO], *, join: str = "auto", name: Optional[str] = None,
                   max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, guess_records: int = GUESS_RECORDS,
                   max_group: int = 8) -> Dict[str, Any]:
    """Read the stream ``source`` (a path or a raw binary file object) once and describe it.

    Returns a JSON-able dict: ``source``, ``join`` (with ``"auto"``: what the stream showed and why),
    ``stream_bytes``, ``records``, ``multipart_records``,
    ``sizes`` (``min``/``mean``/``max``/``total`` payload bytes), ``group_size`` (guessed from the first
    ``guess_records`` records; 1 when nothing regular shows), ``groups``, ``leftover_records`` (records of
    an incomplete last group), ``fields`` (per position in a group: ``kinds`` -> count over the whole
    stream), ``skipped_records``, ``skipped_bytes``, ``corrupt_regions`` (``[{"offset", "bytes"}]``, the
    first 1000).  Raises :class:`SourceError` when no record at all is found in a non-empty stream
    (:class:`CorruptRecordError`, the first record's, where it starts with a RecordIO frame head).
    """
    check_path_arg(source, "source")
    owned = None
    if isinstance(source, (str, bytes, os.PathLike)):
        source = os.fsdecode(source)
        try:
            owned = raw = open(source, "rb", buffering=0)
        except OSError as exc:
            raise SourceError(f"cannot open {source}: {exc.strerror or exc}") from exc
        name = name or source
    else:
        raw = source
        name = name or getattr(source, "name", None) or "<stream>"
    counting = CountingReader(raw, name)
    try:
        with RecordReader(counting, join=join, on_corrupt="skip", max_record_bytes=max_record_bytes,
                          source_name=str(name)) as reader:
            result = _scan(reader, counting, guess_records, max_group)
            chosen = join if join != "auto" else "auto: " + reader.guess.describe()
            if result["records"] == 0 and counting.nbytes:
                raise no_record(name, bytes(counting.head), counting.nbytes, reader.first_error)
    finally:
        if owned is not None:
            owned.close()
    return {"source": str(name), "join": chosen, **result}


def no_record(name: Any, head: bytes, nbytes: int, first_error: Optional[Exception]) -> Exception:
    """The error for bytes with no intact record: what the first frame head's record had (a truncated
    download, a record over ``max_record_bytes``) when they start with one, else :func:`not_recordio`."""
    from ..recordio.framing import MAGIC_BYTES
    if first_error is not None and head.startswith(MAGIC_BYTES):
        return first_error
    return not_recordio(name, head, nbytes)


def _scan(reader: RecordReader, counting: CountingReader, guess_records: int, max_group: int) -> Dict[str, Any]:
    count = total = multipart = 0
    smallest: Optional[int] = None
    largest = 0
    first_prefixes: List[bytes] = []
    first_kinds: List[str] = []
    group = 0  # 0: not decided yet
    positions: List[Counter] = []
    prev_offset = prev_size = -1
    prev_skipped = 0
    region_i = 0
    regions = reader.corrupt_regions

    def finish(end: Optional[int]) -> None:
        """Count the previous record as multipart when it spans more than one frame would."""
        nonlocal multipart
        if end is not None and end - prev_offset > HEADER_SIZE + padded_size(prev_size):
            multipart += 1

    def decide() -> None:
        nonlocal group, positions
        try:
            group = len(guess_fields(first_prefixes, max_group=max_group))
        except ValueError:
            group = 1
        positions = [Counter() for _ in range(group)]
        for i, kind in enumerate(first_kinds):
            positions[i % group][kind] += 1
        first_prefixes.clear()
        first_kinds.clear()

    for offset, view in reader.iter_views():
        if count:
            finish(_record_end(prev_offset, offset, regions, region_i, reader.skipped_records - prev_skipped))
            while region_i < len(regions) and regions[region_i][0] < offset:
                region_i += 1
        size = len(view)
        kind = payload_kind(view[:PREFIX + 1] if size > PREFIX else view)
        if group:
            positions[count % group][kind] += 1
        else:
            first_prefixes.append(bytes(view[:PREFIX + 1]))
            first_kinds.append(kind)
            if len(first_kinds) >= guess_records:
                decide()
        count += 1
        total += size
        smallest = size if smallest is None else min(smallest, size)
        largest = max(largest, size)
        prev_offset, prev_size, prev_skipped = offset, size, reader.skipped_records
    if count:
        finish(_record_end(prev_offset, counting.nbytes, regions, region_i, reader.skipped_records - prev_skipped))
    if not group and first_kinds:
        decide()
    group = group or 1
    fields = [{"position": i, "kinds": dict(c.most_common())} for i, c in enumerate(positions)]
    return {
        "stream_bytes": counting.nbytes,
        "records": count,
        "multipart_records": multipart,
        "sizes": {"min": smallest or 0, "mean": (total / count) if count else 0.0, "max": largest,
                  "total": total},
        "group_size": group,
        "group_size_from": min(count, guess_records),
        "groups": count // group,
        "leftover_records": count % group,
        "fields": fields,
        "skipped_records": reader.skipped_records,
        "skipped_bytes": reader.skipped_bytes,
        "corrupt_regions": [{"offset": o, "bytes": n} for o, n in regions],
    }


def _record_end(start: int, next_offset: int, regions, region_i: int, new_skips: int) -> Optional[int]:
    """Where the record at ``start`` ends: the next record's offset, or a corrupt region found in between.

    ``None`` when a region in between was dropped from the (capped) region list, so the end is unknown.
    """
    while region_i < len(regions) and regions[region_i][0] <= start:
        region_i += 1
    if region_i < len(regions) and regions[region_i][0] < next_offset:
        return regions[region_i][0]
    return None if new_skips else next_offset
