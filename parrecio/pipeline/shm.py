"""Named shared-memory segments with one owner, and the sweep that removes them if the owner dies.

Why not :mod:`multiprocessing.shared_memory`: before Python 3.13 every process that *attaches* to a
segment registers it with the resource tracker, which then unlinks it (with a warning) when that process
exits -- a decoder process that ends would destroy the consumer's ring.  Here a segment is created and
unlinked by its owner only; others attach and detach.

Every name starts with ``parrecio-<owner pid>-<token>-``, so that if the owner is killed (SIGKILL leaves
no chance to clean up) its surviving children can :func:`sweep` everything of that run from ``/dev/shm``.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
from typing import Callable, Iterable, Optional

from ..errors import PipelineError

try:  # CPython's own binding of shm_open/shm_unlink (what multiprocessing.shared_memory uses)
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

__all__ = ["Segment", "new_prefix", "sweep", "unlink", "leftover", "free_bytes", "SHM_DIR"]

SHM_DIR = "/dev/shm"


def new_prefix() -> str:
    """A name prefix unique to this process and call: ``parrecio-<pid>-<token>-``."""
    return f"parrecio-{os.getpid()}-{secrets.token_hex(4)}-"


class Segment:
    """A named shared-memory segment mapped into this process.

    ``Segment.create(name, size)`` makes it (the caller owns it and must :meth:`unlink` it);
    ``Segment.attach(name)`` maps an existing one.  ``buf`` is the writable ``mmap``; :attr:`mem` a
    memoryview of it that the segment owns (as ``shared_memory.SharedMemory`` owns its ``buf``).
    """

    __slots__ = ("name", "size", "buf", "_owner", "_mem")

    def __init__(self, name: str, size: int, buf: mmap.mmap, owner: bool) -> None:
        self.name, self.size, self.buf, self._owner = name, size, buf, owner
        self._mem: Optional[memoryview] = None

    @property
    def mem(self) -> memoryview:
        """A memoryview of the whole mapping, made once; released by :meth:`close`."""
        if self._mem is None:
            self._mem = memoryview(self.buf)
        return self._mem

    @classmethod
    def create(cls, name: str, size: int, purpose: str = "") -> "Segment":
        """A new segment ``name`` of ``size`` bytes, its pages allocated; ``purpose`` says what it holds
        in the error raised when /dev/shm has no room for it."""
        return _with_descriptors(lambda: cls._create(name, size, purpose), name)

    @classmethod
    def _create(cls, name: str, size: int, purpose: str) -> "Segment":
        if _posixshmem is None:  # pragma: no cover
            raise OSError("POSIX shared memory is not available on this platform")
        size = max(int(size), 1)
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            try:
                os.ftruncate(fd, size)
                _reserve(fd, size, purpose or name)
                buf = _mapped(fd, size, name, purpose)
            except BaseException:
                os.close(fd)
                unlink(name)
                raise
        except OSError as err:
            if err.errno in _SHM_ERRNOS:
                raise _unusable(err, name) from err
            raise
        os.close(fd)
        return cls(name, size, buf, True)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        """The existing segment ``name``, mapped here."""
        return _with_descriptors(lambda: cls._attach(name), name)

    @classmethod
    def _attach(cls, name: str) -> "Segment":
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            size = os.fstat(fd).st_size
            buf = _mapped(fd, size, name, "")
        finally:
            os.close(fd)
        return cls(name, size, buf, False)

    def close(self) -> bool:
        """Unmap, unless numpy arrays or memoryviews still use the memory (then the mapping lives on
        until they are gone).  Returns whether it was unmapped."""
        if self._mem is not None:
            self._mem.release()
            self._mem = None
        try:
            self.buf.close()
            return True
        except BufferError:
            return False

    def unlink(self) -> None:
        """Remove the name (the owner does this once); existing mappings stay valid."""
        unlink(self.name)

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, {self.size})"


def _with_descriptors(make: Callable[[], "Segment"], name: str) -> "Segment":
    """``make()``; when this process has run out of file descriptors (EMFILE), once more with its soft
    limit raised to its hard limit, then a PipelineError that says what holds them.

    A mapping keeps a descriptor for as long as it lives (CPython's ``mmap`` holds a duplicate, before
    Python 3.13 always): every output slot and one-off segment mapped here costs one, and output slots
    are as many as the batches the user keeps (``list(reader)`` of small batches: thousands), in the
    consumer and in each decoder process.  The usual soft limit (1024) is far below the usual hard one."""
    raised = False
    while True:
        try:
            return make()
        except OSError as err:
            if err.errno != errno.EMFILE:
                raise
            if raised or not _raise_descriptor_limit():
                raise _out_of_descriptors(err, name) from err
            raised = True


def _raise_descriptor_limit() -> bool:
    """Raise this process's soft limit on open descriptors to its hard limit; whether it rose."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else _nr_open()
        if soft == resource.RLIM_INFINITY or soft >= target:
            return False
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return True
    except (ImportError, ValueError, OSError):
        return False


def _nr_open() -> int:
    """The kernel's cap on a descriptor limit (an unlimited hard limit cannot be set beyond it)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def _out_of_descriptors(err: OSError, name: str) -> PipelineError:
    try:
        import resource
        limit = f" ({resource.getrlimit(resource.RLIMIT_NOFILE)[0]} allowed, the hard limit)"
    except (ImportError, ValueError, OSError):  # pragma: no cover
        limit = ""
    return PipelineError(
        f"cannot map the shared-memory segment {name}: this process has no file descriptor left{limit}. "
        f"Each output slot and each segment of a large group mapped here holds one for as long as it is "
        f"mapped, and the batches and views you keep hold theirs (a list of every batch: one each): raise "
        f"the limit (`ulimit -n`), or keep copies (np.array(batch), bytes(view)) instead of the batches "
        f"themselves")


def _mapped(fd: int, size: int, name: str, purpose: str) -> mmap.mmap:
    """``size`` bytes of the segment ``fd`` mapped here; ENOMEM (this process's address space is full, or
    capped by ``ulimit -v``) as an error that says so."""
    try:
        return mmap.mmap(fd, size)
    except OSError as err:
        if err.errno != errno.ENOMEM:
            raise
        try:
            import resource
            cap = resource.getrlimit(resource.RLIMIT_AS)[0]
            capped = "" if cap == resource.RLIM_INFINITY else f" (capped at {cap / 2**20:.0f} MiB by `ulimit -v`)"
        except (ImportError, ValueError, OSError):  # pragma: no cover
            capped = ""
        raise PipelineError(
            f"cannot map {size / 2**20:.1f} MiB of shared memory for {purpose or 'the segment ' + name}: this "
            f"process's address space is full{capped}. Ask for less (ring_bytes=, fewer workers, a smaller "
            f"batch_size), raise the limit, or read with workers=0 (no shared memory)") from err


# What says that /dev/shm itself cannot hold our segments (not a limit of this process, such as EMFILE):
# (ENOMEM is not among them: from mmap it is this process's address space; a full tmpfs is _reserve's)
_SHM_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOSPC, errno.ENOTDIR}


def _unusable(err: OSError, name: str) -> PipelineError:
    """``err`` from creating segment ``name``, where /dev/shm is at fault (read-only, not ours, missing,
    out of inodes), as a PipelineError that names /dev/shm and what to do."""
    what = errno.errorcode.get(err.errno or 0, "?")
    return PipelineError(
        f"cannot create the shared-memory segment {name} in {SHM_DIR}: {err.strerror} ({what}). The decoder "
        f"processes need a writable {SHM_DIR} with room and inodes to spare (Docker: --shm-size=1g or "
        f"--ipc=host); workers=0 reads without shared memory")


def _reserve(fd: int, size: int, what: str) -> None:
    """Allocate the segment's pages now.  On a full tmpfs (Docker's default /dev/shm is 64 MiB) a write
    to a page that cannot be allocated kills the process with SIGBUS; failing here gives an error."""
    if not hasattr(os, "posix_fallocate"):  # pragma: no cover - macOS
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.ENOMEM):
            return  # this file system cannot preallocate: go on without
        try:
            st = os.statvfs(SHM_DIR)
            free = f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free in {SHM_DIR}"
        except OSError:
            free = "shared memory is full"
        raise PipelineError(
            f"cannot allocate {size / 2**20:.1f} MiB of shared memory for {what} ({free}): make "
            f"{SHM_DIR} larger (e.g. `docker run --shm-size=1g`), or ask for less (ring_bytes=, "
            f"fewer workers, a smaller batch_size)") from err


def free_bytes() -> Optional[int]:
    """Bytes free in ``/dev/shm`` now (None when it cannot be told)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    if not st.f_blocks or st.f_flag & os.ST_RDONLY:  # (a tmpfs mounted with size=0 has no limit, and says
        return None                                   # 0 blocks of 0 free; a read-only one fails to create)
    if not os.access(SHM_DIR, os.W_OK | os.X_OK):
        return None  # (not ours to write: creating fails with EACCES, which says so; its room does not matter)
    return st.f_bavail * st.f_frsize


def unlink(name: str) -> bool:
    """Remove the segment called ``name`` (existing mappings stay valid); False if it was not there."""
    try:
        _posixshmem.shm_unlink("/" + name)
        return True
    except FileNotFoundError:
        return False


def sweep(prefix: str, also: Iterable[str] = ()) -> int:
    """Unlink every segment whose name starts with ``prefix`` (and the names in ``also``).

    Used by children whose owner died.  Returns how many names were removed.
    """
    names = set(also)
    try:
        names.update(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except OSError:  # no /dev/shm listing (macOS): only the names we know
        pass
    removed = 0
    for name in names:
        try:
            removed += unlink(name)
        except OSError:
            pass
    return removed


def leftover(prefix: Optional[str] = None) -> list:
    """Names of our segments still in ``/dev/shm`` (all of parrecio's, or those with ``prefix``)."""
    want = prefix or "parrecio-"
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(want))
    except OSError:
        return []
