"""Regular files read in place: payloads go from the page cache to the decoders with no copy in between.

::

    reader process:  mmap(file) -> RecordReader.over(mapping) -> (file offset, length) per record
                                                  --Chunk(Place(FILE, "file:..."))--> consumer --Task--> worker
    worker/consumer: MappedFiles.get("file:...") -> the same file mapped read-only -> payload views

The page cache is shared memory already: the reader process only reads each record's 8-byte header
(one page touched per record) and sends descriptors; the workers read the payload bytes where they are.
Streams (FIFOs, stdin from a pipe, sockets) cannot be mapped; their payloads still go through the ring.

A mapped segment's name identifies the file *and its version*: device, inode, size and modification
time.  A process that maps it checks them, so a file replaced or rewritten between the reader's framing
and a worker's decode is an error that says so, not silently different bytes.  A file truncated while a
worker reads it ends that worker with SIGBUS: it is re-run like any crashed worker, and a sample that
crashes two workers is reported as a poison record.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections import OrderedDict
from typing import Dict, Optional, Tuple

from ..errors import PipelineError

__all__ = ["PREFIX", "map_stream", "MappedFiles"]

PREFIX = "file:"


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def map_stream(file) -> Optional[Tuple[mmap.mmap, str, int]]:
    """``(mapping, segment name, start)`` for a stream that is a regular file of a path the other
    processes can open, read from ``start``; None for anything else (a pipe, a socket, a file with
    bytes already buffered above its descriptor, an empty file)."""
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
    return mm, f"{PREFIX}{_identity(st)}:{path}", start


class MappedFiles:
    """The mapped files of one process, by segment name (the ``capacity`` most recent stay mapped, each
    with a descriptor open on it: :meth:`fd`)."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._maps: "OrderedDict[str, mmap.mmap]" = OrderedDict()
        self._fds: Dict[str, int] = {}

    def fd(self, name: str) -> int:
        """A descriptor of the file :meth:`get` mapped for ``name`` (call that first): large payloads are
        cheaper to ``os.pread`` than to fault in page by page through a fresh mapping."""
        return self._fds[name]

    def get(self, name: str) -> mmap.mmap:
        """The read-only mapping of the file that ``name`` identifies; PipelineError if that file
        changed since the reader process framed it."""
        mm = self._maps.get(name)
        if mm is not None:
            self._maps.move_to_end(name)
            return mm
        *ident, path = name[len(PREFIX):].split(":", 4)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            raise PipelineError(f"cannot open {path} again to read it in place: {err}") from err
        try:
            st = os.fstat(fd)
            if _identity(st) != ":".join(ident):
                raise PipelineError(f"{path} changed while it was being read (size, inode or modification "
                                    f"time differ from when the reader process opened it)")
            mm = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self._maps[name], self._fds[name] = mm, fd
        while len(self._maps) > self.capacity:
            old, omm = self._maps.popitem(last=False)
            self._close(omm)
            os.close(self._fds.pop(old))
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
        while self._fds:
            os.close(self._fds.popitem()[1])
