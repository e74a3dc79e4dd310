"""A regular file's version, and the check that it is still that version (:class:`FileCheck`).

A file read in place (:mod:`parrecio.pipeline.mapped`) or by its index offsets
(:class:`~parrecio.recordio.index.IndexedRecordReader`) is checked after its reads: a writer changes the
file's time before its bytes, so a check after a read sees any change that the read could have seen.  A
file replaced, rewritten, truncated or grown while it is read is then a
:class:`~parrecio.errors.SourceError` that says so, never silently different bytes.
"""

from __future__ import annotations

import os

from ..errors import SourceError

__all__ = ["FileCheck", "identity"]


def identity(st: os.stat_result) -> str:
    """A regular file's version: device, inode, size and modification time."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


class FileCheck:
    """``check()``: raise a :class:`~parrecio.errors.SourceError` if the open file ``fd``, read as
    version ``ident`` (:func:`identity`), is not that version any more: replaced (another inode),
    truncated, grown, or rewritten (another modification time).  A file that grew may have been
    appended to, or rewritten whole with more bytes (``open(path, "wb")``): the two cannot be told apart
    here, so both are a change."""

    __slots__ = ("fd", "path", "ident", "_key")

    def __init__(self, fd: int, ident: str, path: str) -> None:
        self.fd, self.path, self.ident = fd, path, ident
        self._key = tuple(map(int, ident.split(":")))  # (compared as numbers: no string made per check)

    @classmethod
    def of(cls, fd: int, path: str) -> "FileCheck":
        """The check of the regular file open as ``fd``, as it is now."""
        return cls(fd, identity(os.fstat(fd)), path)

    def __call__(self) -> None:
        st = os.fstat(self.fd)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self._key:
            raise self.changed(st)

    def changed(self, st: os.stat_result) -> SourceError:
        """The error for the file found as ``st`` (another version than :attr:`ident`)."""
        dev, ino, size, _ = map(int, self.ident.split(":"))
        if (st.st_dev, st.st_ino) != (dev, ino):
            how = "it was replaced by another file"
        elif st.st_size < size:
            how = f"it was truncated from {size} to {st.st_size} bytes"
        elif st.st_size > size:
            how = f"it grew from {size} to {st.st_size} bytes (appended to, or rewritten)"
        else:
            how = "it was rewritten (its modification time changed)"
        return SourceError(f"{self.path} changed while it was being read: {how} since it was opened")
