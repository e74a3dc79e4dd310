"""Files, directories, globs and FIFO paths: a fixed list of paths, each one a stream, every epoch.

```
 resolve("data/")        -> FileSource(paths=("/cwd/data/a.rec", "/cwd/data/b.rec"))   listed once, in the consumer
 FileSource.streams(e)   -> Stream("/cwd/data/a.rec", open(...)), Stream("/cwd/data/b.rec", ...)   in the reader
```

The list of paths is fixed when the source is resolved (errors come early, in the consumer, and every
epoch reads the same files, made absolute then: a later ``os.chdir`` changes nothing).  Files are opened
only in :meth:`FileSource.streams`, in the reader process, so a FIFO path is opened by the reader alone
(:func:`parrecio.sources.fifo.open_fifo`: it says when it waits for a writer, and never opens a FIFO that
another process is reading).

Directory rule (:func:`list_recordio_files`): the ``*.rec`` files of the directory in name order; if it
has none, every regular file whose name does not start with ``.`` and does not end in ``.idx`` or ``.lst``
(the index and image-list files that sit next to ``.rec`` files).  "Name order" is plain string order of
the path relative to the directory, which for a recursive listing is the order in which S3 lists keys.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from typing import Iterable, Iterator, List, Optional, Sequence

from ..errors import SourceError
from ..recordio.paths import recordio_names
from .base import Source, Stream
from .fifo import FifoWait, is_fifo, open_fifo, open_plain

__all__ = ["FileSource", "list_recordio_files", "expand_patterns", "GLOB_CHARS"]

GLOB_CHARS = frozenset("*?[")


def _is_glob(path: str) -> bool:
    return any(c in GLOB_CHARS for c in path)


def list_recordio_files(directory: str, *, recursive: bool = False) -> List[str]:
    """The RecordIO files of ``directory``, by the directory rule (see the module docstring).

    With ``recursive``, files in subdirectories count too (hidden subdirectories are skipped) and the
    order is that of the relative paths (``a/x.rec`` < ``a0.rec`` < ``b.rec``, as S3 lists keys).
    Returns an empty list when nothing qualifies.
    """
    found = sorted(_walk_regular_files(directory, recursive))  # (relative path, full path), hidden skipped
    full = dict(found)
    return [full[rel] for rel in recordio_names([rel for rel, _ in found])]


def _walk_regular_files(directory: str, recursive: bool) -> Iterator[tuple]:
    stack = [("", directory)]
    seen = set()  # directories walked, by (device, inode): a symlink back up (a loop) or twice to one
    while stack:  # directory would list its files again and again
        prefix, path = stack.pop()
        try:
            entries = list(os.scandir(path))
            st = os.stat(path)
        except OSError as exc:
            raise SourceError(f"cannot list directory {path}: {exc.strerror or exc}") from exc
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        subdirs = []
        for entry in sorted(entries, key=lambda e: e.name):
            rel = prefix + entry.name
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_file():  # follows symlinks; FIFOs, sockets and devices are not regular files
                    yield rel, entry.path
                elif recursive and entry.is_dir():
                    subdirs.append((rel + "/", entry.path))
            except OSError:  # a symlink loop (ELOOP), an entry gone meanwhile: skipped, as a dangling link
                continue
        stack.extend(reversed(subdirs))  # (walked in name order: of two ways to one directory, the first)


def expand_patterns(patterns: Iterable) -> List[str]:
    """Expand paths, directories and glob patterns into the list of file paths, in the given order.

    An existing path is taken literally (even if it contains glob characters); a directory by the directory
    rule; anything else with ``*``, ``?`` or ``[`` as a glob (``recursive=True``, sorted, matched
    directories expanded).  Raises :class:`SourceError` for a missing path, an empty glob or a directory
    without files.
    """
    paths: List[str] = []
    for item in patterns:
        if not isinstance(item, (str, bytes, os.PathLike)):
            raise SourceError(f"expected a path or glob pattern in the channel list, got {item!r}")
        pattern = os.fsdecode(item)
        try:
            os.lstat(pattern)  # (as lexists() does, which says False -- "no such file" -- for EACCES too)
            exists = True
        except PermissionError as exc:
            raise SourceError(f"cannot use {pattern!r}: {exc.strerror} (a folder on its path cannot be "
                              f"searched by this user)") from None
        except (OSError, ValueError):
            exists = False
        if exists:
            paths.extend(_expand_existing(pattern))
        elif _is_glob(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
            if not matches:
                raise SourceError(f"glob pattern {pattern!r} matches no file")
            found: List[str] = []
            for match in matches:
                found.extend(_expand_existing(match, from_glob=pattern))
            if not found:  # (this glob's own: one of a list matched nothing either)
                raise SourceError(f"glob pattern {pattern!r} matches only directories without files")
            paths.extend(_once_each(found))
        else:
            raise SourceError(f"no such file or directory: {pattern!r} (cwd {cwd_shown()})")
    return paths


def _absolute(path: str) -> str:
    """``path`` made absolute without changing the file it names: ``os.path.abspath`` drops ``x/..`` as
    text, and where ``x`` is a symbolic link to a folder elsewhere the kernel's ``..`` is that folder's
    parent -- another file, read silently.  ``.`` and doubled slashes are tidied; ``..`` is left to the
    kernel."""
    path = os.fspath(path)
    joined = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    return joined if ".." in joined.split(os.sep) else os.path.normpath(joined)


def cwd_shown() -> str:
    """The working directory, for a message: ``os.getcwd()`` raises once it was deleted."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return "deleted"


def _once_each(paths: List[str]) -> List[str]:
    """``paths`` without the later ones that name a file named before (one glob's matches: ``**`` follows
    symlinks to directories, and one back up -- ``up -> ..`` -- matched every file dozens of times)."""
    seen, out = set(), []
    for path in paths:
        try:
            st = os.stat(path)
            key: tuple = (st.st_dev, st.st_ino)
        except OSError:
            key = (path,)  # (opened as given: its error then says what is wrong)
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def _expand_existing(path: str, from_glob: Optional[str] = None) -> List[str]:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if from_glob is not None and exc.errno == errno.ELOOP:
            # glob's `**` follows a link back up (`up -> ..`) some 40 levels deep, until the kernel stops
            # resolving: such a match is another way to a file named once already (_once_each), or a
            # looping link, skipped as a directory listing skips it
            return []
        raise SourceError(f"cannot use {path!r}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(mode):
        return [path]  # a regular file, a FIFO, a character device...: opened as given
    files = list_recordio_files(path)
    if not files and from_glob is None:
        raise SourceError(
            f"directory {path!r} has no RecordIO files (looked for *.rec, then for any regular, non-hidden "
            f"file other than *.idx/*.lst; subdirectories are not searched)"
        )
    return files


class FileSource(Source):
    """A fixed list of file paths (regular files or FIFOs), opened one after the other, every epoch.

    ``paths`` is public: the pipeline may shard by file.  ``default_join`` is ``"auto"`` unless given.
    """

    kind = "files"

    def __init__(self, paths: Sequence[str], *, name: Optional[str] = None, default_join: str = "auto",
                 kind: Optional[str] = None) -> None:
        if not paths:
            raise SourceError(f"{name or 'file list'}: no files")
        # Absolute: every pass opens them by name, and the process may have changed its directory since
        # (a relative name would then read another file, silently).
        self.paths = tuple(_absolute(p) for p in paths)
        self.name = name if name is not None else _describe(list(paths))
        self.default_join = default_join
        if kind is not None:
            self.kind = kind
        check_heads(self.paths[:CHECKED_FILES])

    def rereadable(self) -> bool:
        return all(os.path.isfile(p) for p in self.paths)  # (a FIFO path is not)

    @classmethod
    def from_patterns(cls, patterns: Sequence, *, name: Optional[str] = None) -> "FileSource":
        """A source over ``patterns`` (paths, directories, globs) expanded by :func:`expand_patterns`."""
        if isinstance(patterns, (list, tuple)) and not patterns:
            raise SourceError("empty channel list: give at least one path")
        if name is None:
            name = _describe([os.fsdecode(p) if isinstance(p, (str, bytes, os.PathLike)) else repr(p)
                              for p in patterns])
        return cls(expand_patterns(patterns), name=name)

    def streams(self, epoch: int) -> Iterator[Stream]:
        self.check_epoch(epoch)
        for path in self.paths:
            yield Stream(path, open_for_reading(path))


def open_for_reading(path: str):
    """``open(path, "rb")`` with errors as :class:`SourceError` naming the path.

    A FIFO is opened by :func:`parrecio.sources.fifo.open_fifo`: not while another process has it open for
    reading (the two would split its bytes), and never blocked in ``open()``; a wait for its writer (or for
    that other reader) longer than 2 s is said in a WARNING, again every 60 s, and is not an error.
    """
    if is_fifo(path):
        return open_fifo(path, FifoWait("FIFO source", None))
    return open_plain(path)


def _describe(paths: Sequence[str]) -> str:
    if len(paths) == 1:
        return paths[0]
    head = ", ".join(paths[:3])
    return f"[{head}{', ...' if len(paths) > 3 else ''}] ({len(paths)} paths)"


#: How many of a source's files are checked for the RecordIO magic when it is made.
CHECKED_FILES = 64


def check_heads(paths: Sequence[str]) -> None:
    """A regular file that plainly holds another format (a folder of JPEGs given as the channel): say
    what it is now, when the reader is made, not at the first ``next()`` (FIFOs and the like are read by
    the reader process only; they are not touched here)."""
    from ..recordio.framing import MAGIC_BYTES
    for path in paths:
        try:
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                head = f.read(64)
        except OSError:
            continue  # opening it is the reader's to report, with the path
        if head and not head.startswith(MAGIC_BYTES) and _known_other(head):
            from ..tools.inspect import not_recordio
            raise not_recordio(path, head, os.path.getsize(path))


def _known_other(head: bytes) -> bool:
    """Whether ``head`` is plainly another format (an image, JSON or text, a compressed file): bytes that
    say nothing (``"other"``) may be a RecordIO file whose first record is damaged, which
    ``on_error="skip"`` reads past: those are left to the reader."""
    from ..decoders.sniff import sniff
    from ..tools.inspect import is_compressed
    return sniff(head) != "other" or is_compressed(head)
