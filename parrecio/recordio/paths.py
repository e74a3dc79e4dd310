"""The one check of path / file arguments shared by :mod:`parrecio.recordio` and :mod:`parrecio.tools`.

Python's ``open()`` (and ``os.stat``, ``os.walk``...) take an int as a file descriptor, and ``True == 1``:
``RecordWriter(path, index=True)`` once wrote the index to standard output and then closed it.  Every public
function that takes a path or a file object calls :func:`check_path_arg` first, so a bool or an int (any
integer-like value: ``numpy.int64`` too) is a ``TypeError`` naming the parameter, never a descriptor.
"""

from __future__ import annotations

import os
import stat
from typing import Any, List, Optional, Sequence, Union

__all__ = ["check_path_arg", "index_path", "index_beside", "recordio_names", "NOT_RECORDS"]


def index_path(rec_path: Union[str, "os.PathLike[str]"]) -> str:
    """The ``.idx`` that goes with a record file: its suffix replaced (``train.rec`` -> ``train.idx``), as
    ``im2rec`` names it.  The one rule: writers put the index there and readers look for it there."""
    return os.path.splitext(os.fsdecode(rec_path))[0] + ".idx"


def index_beside(rec_path: str) -> Optional[str]:
    """The ``.idx`` of the regular file ``rec_path`` when there is one (:func:`index_path`), else None (no
    such file, not a regular file: a FIFO, a device)."""
    idx = index_path(rec_path)
    try:
        return idx if stat.S_ISREG(os.stat(rec_path).st_mode) and os.path.isfile(idx) else None
    except (OSError, ValueError):
        return None


NOT_RECORDS = (".idx", ".lst")  # what a folder holds beside its RecordIO files


def recordio_names(names: Sequence[str]) -> List[str]:
    """The folder rule, for a directory and an ``s3://`` prefix alike: of ``names`` (the non-hidden
    entries, in order), the ``*.rec`` ones, or when there are none every one that is not ``*.idx`` or
    ``*.lst``."""
    recs = [n for n in names if n.endswith(".rec")]
    return recs or [n for n in names if not n.endswith(NOT_RECORDS)]


def check_path_arg(value: Any, name: str, *, file_ok: bool = True, fd_ok: bool = False) -> Any:
    """Return ``value``; raise ``TypeError`` if it is a bool, or an integer and ``fd_ok`` is false.

    :param name: the parameter's name, for the message (``"index must be a path or a binary file object,
        not bool"``).
    :param file_ok: whether the parameter also takes a file object (only the message says so).
    :param fd_ok: accept ints (file descriptors); bools are refused all the same.
    """
    if isinstance(value, (str, bytes, os.PathLike)):
        return value
    if isinstance(value, bool) or (not fd_ok and hasattr(type(value), "__index__")):
        what = "a path or a binary file object" if file_ok else "a path"
        if fd_ok:
            what += " or a file descriptor"
        raise TypeError(f"{name} must be {what}, not {type(value).__name__}")
    return value
