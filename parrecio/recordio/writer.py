"""RecordIO writer, byte-identical to MXNet's ``MXRecordIO`` / ``MXIndexedRecordIO``.

Each payload becomes the frames dmlc-core's ``RecordIOWriter::WriteRecord`` writes (see
:func:`parrecio.recordio.framing.encode_record`): split wherever the magic ``0xCED7230A`` occurs at a
4-byte-aligned offset of the payload (those 4 bytes dropped; cflags ``1, 2, ..., 3``), the last part
zero-padded to a multiple of 4 bytes.  With ``index=`` an ``.idx`` text file is written as
``MXIndexedRecordIO.write_idx`` does: one line ``f"{key}\\t{offset}\\n"`` per record, the offset taken before
the record is written (``index=True``: next to the record file, its suffix replaced by ``.idx``).
"""

from __future__ import annotations

import io
import os
from typing import Any, BinaryIO, Optional, Union

from .framing import HEADER, MAGIC, MAX_PAYLOAD_BYTES, encode_record
from .paths import check_path_arg, index_path

__all__ = ["RecordWriter"]

_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")


class RecordWriter:
    """Write records to a RecordIO file, optionally with an MXNet ``.idx`` index.

    :param path_or_file: a path (created or truncated; closed by :meth:`close`) or a binary file object
        opened for writing (not closed by :meth:`close`; offsets continue from its ``tell()`` when it has
        one, else from 0).
    :param index: where to write an ``.idx`` index alongside: a path (created or truncated), a binary file
        object opened for writing (not closed by :meth:`close`), ``True`` for ``path_or_file`` with its
        suffix replaced by ``.idx`` (``data.rec`` -> ``data.idx``; only when ``path_or_file`` is a path), or
        ``None``/``False`` for no index.
    :param split_magic: a payload that holds the RecordIO magic at a 4-byte-aligned offset is written as
        MXNet's writer does (default): split there into a multipart record, the magic dropped between the
        parts (the readers put it back with ``join="mxnet"``).  ``False`` writes every payload as one frame,
        as SageMaker's RecordIO-protobuf writer and ML-IO do (their readers join parts by concatenation,
        and one frame needs no join).

    A bool or an int where a path or a file object is expected raises ``TypeError``: file descriptors are
    not taken (``True == 1`` would be standard output).
    """

    def __init__(self, path_or_file: Union[str, "os.PathLike[str]", BinaryIO], *,
                 index: Union[str, "os.PathLike[str]", BinaryIO, bool, None] = None,
                 split_magic: bool = True) -> None:
        self._split = bool(split_magic)
        self._idx = None
        self._owns_idx = False
        check_path_arg(path_or_file, "path_or_file")
        if index is True:
            if not isinstance(path_or_file, (str, bytes, os.PathLike)):
                raise TypeError("index=True puts the index next to the record file, so path_or_file must be a "
                                f"path, not {type(path_or_file).__name__}; give index a path or a binary file "
                                "object")
            index = index_path(path_or_file)
        elif index is False:
            index = None
        else:
            check_path_arg(index, "index")
            if index is not None and not isinstance(index, (str, bytes, os.PathLike)) \
                    and not hasattr(index, "write"):
                raise TypeError(f"index must be a path or a binary file object, not {type(index).__name__}")
        if isinstance(path_or_file, (str, bytes, os.PathLike)):
            self.path: Optional[str] = os.fsdecode(path_or_file)
            self._file: Any = open(self.path, "wb")
            self._owns = True
            self._pos = 0
        else:
            if not hasattr(path_or_file, "write"):
                raise TypeError(f"path_or_file must be a path or a binary file object, not "
                                f"{type(path_or_file).__name__}")
            self.path = None
            self._file = path_or_file
            self._owns = False
            try:
                self._pos = int(path_or_file.tell())
            except (AttributeError, OSError, io.UnsupportedOperation):
                self._pos = 0
        if index is not None:
            if isinstance(index, (str, bytes, os.PathLike)):
                try:
                    self._idx = open(index, "wb")
                except BaseException:
                    self.close()
                    raise
                self._owns_idx = True
            else:
                self._idx = index
        self._count = 0

    def write(self, payload: Any, key: Union[int, str, None] = None) -> int:
        """Append one record; return its byte offset in the file.

        :param payload: a bytes-like object (``bytes``, ``bytearray``, ``memoryview``, contiguous numpy
            array), less than ``2**29`` bytes (``ValueError`` otherwise, as dmlc-core refuses it).
        :param key: the record's key in the ``.idx`` file (int or str without tab/newline); default the
            running record number, 0 for the first record written by this writer.  Ignored without an index.
        """
        if self._file is None:
            raise ValueError("I/O operation on a closed RecordWriter")
        size = len(payload) if isinstance(payload, (bytes, bytearray)) else memoryview(payload).nbytes
        if size > MAX_PAYLOAD_BYTES:  # checked before any copy
            raise ValueError(f"RecordIO only accepts payloads of less than 2**29 bytes, not {size}")
        if not isinstance(payload, (bytes, bytearray)):
            payload = memoryview(payload).cast("B").tobytes()
        if key is not None and isinstance(key, str) and ("\t" in key or "\n" in key or "\r" in key):
            raise ValueError(f"an index key may not contain tab or newline characters: {key!r}")
        pos = self._pos
        write = self._file.write
        if not self._split or payload.find(b"\x0a\x23\xd7\xce") < 0:  # one frame, no split search needed
            write(HEADER.pack(MAGIC, size))
            write(payload)
            write(_PAD[size & 3])
            written = 8 + ((size + 3) & ~3)
        else:
            written = 0
            for chunk in encode_record(payload):
                write(chunk)
                written += len(chunk)
        self._pos = pos + written
        if self._idx is not None:
            self._idx.write(f"{self._count if key is None else key}\t{pos}\n".encode("utf-8"))
        self._count += 1
        return pos

    def tell(self) -> int:
        """Byte offset where the next record will start (``MXRecordIO.tell``)."""
        return self._pos

    def flush(self) -> None:
        """Flush the record file and the index to the operating system."""
        if self._file is not None:
            self._file.flush()
        if self._idx is not None:
            self._idx.flush()

    def close(self) -> None:
        """Flush; close the index and, if the writer opened it, the record file.  Idempotent."""
        f, self._file = self._file, None
        idx, self._idx = self._idx, None
        try:
            if f is not None:
                if self._owns:
                    f.close()
                else:
                    f.flush()
        finally:
            if idx is not None:
                if self._owns_idx:
                    idx.close()
                else:
                    idx.flush()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._file is None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
