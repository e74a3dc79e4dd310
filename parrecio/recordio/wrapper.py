"""SageMaker's RecordIO wrapper framing, for writing streams the way Pipe mode delivers them.

With ``RecordWrapperType: RecordIO`` SageMaker wraps each S3 object (or each attribute of an augmented
manifest line) in RecordIO frames.  Readers of such streams (AWS ML-IO, sagemaker-tensorflow's
``PipeModeDataset``) join multipart records by plain concatenation, so a writer may split a payload at
arbitrary sizes and drops nothing: that is ``join="concat"`` in :mod:`parrecio.recordio.framing`, and it
differs from MXNet's writer, which splits only at an aligned magic and drops it.

::

    payload <= split_bytes:  [magic][lrec cflag 0, n][payload][pad]
    payload >  split_bytes:  [magic][cflag 1, split][part 1][pad] [magic][cflag 2, split][part 2][pad] ...
                             [magic][cflag 3, rest][last part][pad]

Every part is padded to a multiple of 4 bytes.  Without ``split_bytes`` a payload is split only when it
exceeds what one lrec word can hold (``2**29 - 1`` bytes).
"""

from __future__ import annotations

from typing import BinaryIO, Iterable, Iterator, Optional

from .framing import (CFLAG_FIRST, CFLAG_FULL, CFLAG_LAST, CFLAG_MIDDLE, MAX_PAYLOAD_BYTES,
                                frame_header)

__all__ = ["encode_sagemaker_record", "write_sagemaker_recordio"]

_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")  # indexed by length % 4


def encode_sagemaker_record(payload, split_bytes: Optional[int] = None) -> Iterator[bytes]:
    """Yield the byte strings of ``payload``'s frames in SageMaker wrapper framing (see the module docstring).

    ``split_bytes`` (>= 1) is the largest part; ``None`` means ``2**29 - 1``, the format's limit.
    """
    limit = MAX_PAYLOAD_BYTES if split_bytes is None else min(int(split_bytes), MAX_PAYLOAD_BYTES)
    if limit < 1:
        raise ValueError(f"split_bytes must be >= 1, not {split_bytes}")
    view = memoryview(payload).cast("B")
    size = len(view)
    if size <= limit:
        yield frame_header(CFLAG_FULL, size)
        yield view
        yield _PAD[size & 3]
        return
    for start in range(0, size, limit):
        part = view[start:start + limit]
        if start == 0:
            cflag = CFLAG_FIRST
        elif start + limit >= size:
            cflag = CFLAG_LAST
        else:
            cflag = CFLAG_MIDDLE
        yield frame_header(cflag, len(part))
        yield part
        yield _PAD[len(part) & 3]


def telling_split(split_bytes: Optional[int]) -> Optional[int]:
    """The part size the library's own writers use for ``split_bytes``: one byte less when it is a
    multiple of 4.  MXNet's parts are always multiples of 4 (its writer cuts at an aligned magic), so
    with a part of another length ``join="auto"`` tells the file's convention at its first multipart
    record; with parts of exactly 65536 bytes, a file with a single split record fitted both and was
    refused as ambiguous (``pack manifest --split-bytes 65536`` of a manifest with one large image)."""
    if split_bytes is None or split_bytes % 4 or split_bytes < 4:
        return split_bytes
    return split_bytes - 1


def write_sagemaker_recordio(records: Iterable, file: BinaryIO, split_bytes: Optional[int] = None) -> int:
    """Write each payload of ``records`` to ``file`` in SageMaker wrapper framing; return the bytes written.

    ``file`` is any binary file object with ``write`` (a FIFO, a pipe, a ``BytesIO``).  Records larger
    than ``split_bytes`` become multipart records (cflags 1, 2, ..., 3) joined by concatenation.
    """
    total = 0
    write = file.write
    for payload in records:
        for piece in encode_sagemaker_record(payload, split_bytes):
            if len(piece):
                _write_all(write, piece)
                total += len(piece)
    return total


def _write_all(write, data) -> None:
    """``write`` until all of ``data`` is written (raw files and pipes may write only part of it)."""
    view = memoryview(data).cast("B")
    while view:
        n = write(view)
        if n is None:  # a raw file object that would block: let the caller's blocking file decide
            raise BlockingIOError("the output file is non-blocking and full")
        if n == len(view):
            return
        view = view[n:]
