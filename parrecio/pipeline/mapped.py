"""Regular files read in place: payloads go from the page cache to the decoders with no copy in between.

::

    reader process:  mmap(file) -> RecordReader.over(mapping) -> (file offset, length) per record
                                                  --Chunk(Place(FILE, "file:..."))--> consumer --Task--> worker
    worker/consumer: MappedFiles.get("file:...") -> the same file mapped read-only -> payload views

The page cache is shared memory already: the reader process only reads each record's 8-byte header
(one page touched per record) and sends descriptors; the workers read the payload bytes where they are.
Streams (FIFOs, stdin from a pipe, sockets) cannot be mapped; their payloads still go through the ring.

A mapped segment's name identifies the file *and its version*: device, inode, size and modification
time.  Every process checks them again (one ``fstat``, ~1 us) whenever it takes up the file: the reader
process before each chunk it sends and after each wait for the consumer, a worker before and after each
task, the consumer at each chunk and after each read it copies.  A writer changes the file's time before
its bytes, so a check after a read sees any change that the read could have seen.  So a file replaced,
rewritten or truncated while it is read is an error that says so (:class:`FileCheck`: a
:class:`~parrecio.errors.SourceError`, which ends the pass whatever ``on_error`` says: it is not one bad
sample), not silently different bytes.

Touching a page of a mapping past the end of a file that shrank is a SIGBUS, which kills the process.
The consumer -- the user's own process -- therefore never reads a file's payloads through its mapping:
it copies them with ``pread`` (:class:`~parrecio.pipeline.feed.Payloads`), which returns short instead.
What remains is a truncation between a check and a read of the reader process or a worker: that process
dies.  A worker's task is re-run, and the re-run's check says what happened; the reader's death is an
error that says so too (the consumer looks at the file: :func:`changed_since`).  Views of a mapped file
that the user holds (``iter_views``) are a mapping like ``numpy.memmap``'s.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections import OrderedDict
from typing import Dict, Optional, Tuple

from ..errors import SourceError
from ..recordio.filecheck import FileCheck, identity as _identity

__all__ = ["PREFIX", "map_stream", "MappedFiles", "FileCheck", "changed_since"]

PREFIX = "file:"


def _version_of(name: str) -> Tuple[str, str]:
    """``(version, path)`` of the segment ``name`` that :func:`map_stream` made (``file:<version>:<path>``)."""
    *version, path = name[len(PREFIX):].split(":", 4)
    return ":".join(version), path


def changed_since(name: str) -> Optional[SourceError]:
    """The error of the file that segment ``name`` maps if it changed since (asked after a process died of
    SIGBUS); None if it did not, or cannot be looked at."""
    ident, path = _version_of(name)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return None if _identity(st) == ident else FileCheck(-1, ident, path).changed(st)


def map_stream(file) -> Optional[Tuple[mmap.mmap, str, int, FileCheck]]:
    """``(mapping, segment name, start, check)`` for a stream that is a regular file of a path the other
    processes can open, read from ``start`` (``check()`` raises once the file changed); None for anything
    else (a pipe, a socket, a file with bytes already buffered above its descriptor, an empty file)."""
    if hasattr(getattr(file, "raw", file), "pending"):  # bytes read ahead to sniff the stream: not plain
        return None
    try:
        fd = file.fileno()
        st = os.fstat(fd)
    except (AttributeError, OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    try:
        start = file.tell()
        path = os.readlink(f"/proc/self/fd/{fd}")
    except (AttributeError, OSError, ValueError):
        return None
    if not os.path.isabs(path) or path.endswith(" (deleted)"):
        return None
    try:
        if _identity(os.stat(path)) != _identity(st):  # the path now names another file
            return None
        mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    if hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    return mm, f"{PREFIX}{_identity(st)}:{path}", start, FileCheck(fd, _identity(st), path)


class MappedFiles:
    """The mapped files of one process, by segment name (the ``capacity`` most recent stay mapped, each
    with a descriptor open on it and its :class:`FileCheck`: :meth:`check`)."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._maps: "OrderedDict[str, mmap.mmap]" = OrderedDict()
        self._checks: Dict[str, FileCheck] = {}

    def check(self, name: str) -> FileCheck:
        """The check of the file :meth:`get` mapped for ``name`` (call that first), with a descriptor of
        it (``fd``): the consumer reads payloads with ``os.pread`` from there."""
        return self._checks[name]

    def get(self, name: str) -> mmap.mmap:
        """The read-only mapping of the file that ``name`` identifies; SourceError if that file changed
        since the reader process framed it (checked at every call)."""
        mm = self._maps.get(name)
        if mm is not None:
            self._maps.move_to_end(name)
            self._checks[name]()
            return mm
        ident, path = _version_of(name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            raise SourceError(f"cannot open {path} again to read it in place: {err}") from err
        try:
            check = FileCheck(fd, ident, path)
            check()
            mm = mmap.mmap(fd, int(ident.split(":")[2]), prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self._maps[name], self._checks[name] = mm, check
        while len(self._maps) > self.capacity:
            old, omm = self._maps.popitem(last=False)
            self._close(omm)
            os.close(self._checks.pop(old).fd)
        return mm

    @staticmethod
    def _close(mm: mmap.mmap) -> None:
        try:
            mm.close()
        except BufferError:  # a view of it is still alive somewhere: the mapping goes with it
            pass

    def close(self) -> None:
        while self._maps:
            self._close(self._maps.popitem()[1])
        while self._checks:
            os.close(self._checks.popitem()[1].fd)
