"""Opening a FIFO without hanging in silence: wait for it to appear, for a writer, for another reader to
let go -- and say so.

```
 open_fifo(path, wait)                                      in the process that reads it (the reader process,
   the path does not exist yet (Pipe mode)      -> wait     or the consumer with workers=0)
   another process has it open for reading      -> wait, not opened: two readers of a FIFO split its bytes
   opened O_NONBLOCK, no writer yet             -> wait
   data, a writer, or a writer that came and went -> return it, blocking again: open(path, "rb") as it were
 each wait: a WARNING after GRACE_S, again every REPEAT_S; at the deadline (fifo_timeout) a SourceError
```

Why not ``open(path, "rb")``: a FIFO's open blocks until a writer opens it, with no timeout, and nothing
says why (a second process on a Pipe-mode channel waited 600 s without a word).  ``O_NONBLOCK`` opens at
once; then a writer is present when a non-blocking read gives ``EAGAIN`` (no writer: end of file), data
when ``poll`` says so, and on Linux ``POLLHUP`` says a writer came and went without writing (an empty
stream: returned, its reader sees the end at once).  The byte such a probe may take is handed back first
(:class:`PrefixedRaw`).

Two readers of one FIFO each get part of the bytes, and with records that end on the kernel's page-sized
pieces neither sees an error (``parrecio pipe-serve`` and two scripts on one channel: 1264 + 1736 of 3000
records, silently).  So before opening, the processes of this user that hold the FIFO open read-only are
looked for in ``/proc/<pid>/fd`` (Linux; best-effort and cheap: a ``readlink`` per descriptor, a ``stat``
only for one with the FIFO's name) and, while there are any, it is not opened.  A reader that is itself
still waiting for a writer holds it open (``O_NONBLOCK``) and is found too.

Messages go to the logger ``"parrecio"`` of the process that waits.  With no logging configured (a plain
script, the CLI) Python's last-resort handler writes WARNING lines to stderr; a reader process started by
``forkserver``/``spawn`` writes to the stderr it inherited, which is the user's.
"""

from __future__ import annotations

import io
import logging
import os
import select
import stat
import sys
import threading
import time
from typing import BinaryIO, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, TypeVar

from ..errors import SourceError

__all__ = ["open_fifo", "stoppable", "open_plain", "enlarge_pipe", "FifoWait", "fifo_readers", "Holder", "PrefixedRaw",
           "is_fifo", "GRACE_S", "REPEAT_S", "MISSING", "NO_WRITER", "HELD", "GONE"]

log = logging.getLogger("parrecio")

GRACE_S = 2.0          # a wait longer than this is said (a writer that is just starting never is)
REPEAT_S = 60.0        # then said again this often, not more
POLL_S = 0.1           # the longest sleep between two looks at the FIFO
HELD_RECHECK_S = 0.5   # how often the processes that hold it are looked at again

MISSING, NO_WRITER, HELD, GONE = "missing", "no writer", "held", "gone"   # what a wait is for
# (GONE: missing again after another process held it open for reading: that process read it)
_LINUX = sys.platform.startswith("linux")
_CMDLINE_CHARS = 120


class Holder(NamedTuple):
    """A process that has the FIFO open read-only: its pid and what it is, for messages."""
    pid: int
    description: str


class FifoWait:
    """The clock and the messages of one wait for a FIFO.

    ``what`` names what is read (``"epoch 0 of SageMaker channel 'train' (Pipe mode)"``); ``timeout`` is the
    seconds allowed in all (``None``: as long as it takes); ``timeout_error(kind, who, hint)`` makes the
    :class:`SourceError` raised at the deadline (``who``: the processes that held it, for ``HELD`` and
    ``GONE``; ``hint``: ``hint()``'s sentence, for ``MISSING`` and ``GONE``); ``explain`` adds a word to a
    kind's reason; ``hint()`` is asked for a sentence when the FIFO is missing (a later epoch's FIFO that
    exists).
    """

    def __init__(self, what: str, timeout: Optional[float] = None, *, timeout_name: str = "fifo_timeout",
                 timeout_error: Optional[Callable[[str, str, str], SourceError]] = None,
                 explain: Optional[Dict[str, str]] = None, hint: Optional[Callable[[], str]] = None) -> None:
        self.what = what
        self.timeout = timeout
        self.timeout_name = timeout_name
        self.start = time.monotonic()
        self.deadline = None if timeout is None else self.start + timeout
        self._timeout_error = timeout_error
        self._explain = explain or {}
        self._hint = hint
        self._next_notice = self.start + GRACE_S
        self._noticed: Optional[str] = None  # the kind of wait last said
        self.notices = 0
        self.held_by = ""  # who had it open for reading before it went away (that process read it)

    def check(self, path: str, kind: str, holders: Callable[[], str] = lambda: "") -> None:
        """One more look found the FIFO not ready for reason ``kind`` (``holders()``: who holds it, for
        ``HELD``): raise at the deadline, say so when due (after GRACE_S, then every REPEAT_S, and at once
        when the reason changed after one was said)."""
        now = time.monotonic()
        if kind == MISSING and self.held_by:
            kind = GONE
        due = now >= self._next_notice or (self._noticed is not None and kind != self._noticed)
        expired = self.deadline is not None and now >= self.deadline
        if not (due or expired):
            return
        who = holders() if kind == HELD else self.held_by if kind == GONE else ""
        hint = self._hint() if kind in (MISSING, GONE) and self._hint is not None else ""
        if expired:
            raise self.error(path, kind, who, hint)
        self._noticed = kind
        self._next_notice = now + REPEAT_S
        self.notices += 1
        if self.deadline is None:
            limit = "waiting as long as it takes (not an error; close() or Ctrl-C ends the wait)"
        elif self.notices == 1:
            limit = f"waiting up to {self.timeout:g} s in all ({self.timeout_name}), then a SourceError"
        else:
            limit = f"{self.deadline - now:.0f} s left of {self.timeout_name}={self.timeout:g}, then a SourceError"
        log.warning("parrecio: %s: still waiting for %s after %.0f s: %s; %s", self.what, path, now - self.start,
                    self.reason(kind, who, hint), limit)

    def reason(self, kind: str, who: str = "", hint: str = "") -> str:
        """Why the FIFO is not being read, in words."""
        if kind == MISSING:
            text = "it does not exist yet"
        elif kind == NO_WRITER:
            text = "it exists, but no process has opened it for writing yet"
        elif kind == GONE:
            text = (f"it is gone: another process ({who}) had it open for reading until it was removed, so "
                    f"that process read it (two readers of one FIFO split its bytes: this one did not open it)")
        else:
            text = (f"another process has it open for reading ({who}); two readers of one FIFO split its "
                    f"bytes between them, each getting part of the records without an error, so it is not "
                    f"opened while that process holds it")
        extra = self._explain.get(kind)
        if extra:
            text += f" ({extra})"
        if hint:
            text += f"; {hint}"
        return text

    def error(self, path: str, kind: str, who: str = "", hint: str = "") -> SourceError:
        """The SourceError of a wait that reached its deadline."""
        if self._timeout_error is not None:
            return self._timeout_error(kind, who, hint)
        return SourceError(f"{self.what}: {path} was not ready within {self.timeout:g} s ({self.timeout_name}): "
                           f"{self.reason(kind, who, hint)}")

    def pause(self) -> float:
        """Seconds to sleep before the next look: short, and never past the deadline or a notice."""
        now = time.monotonic()
        until = self._next_notice if self.deadline is None else min(self._next_notice, self.deadline)
        return max(0.0, min(POLL_S, until - now))


_T = TypeVar("_T")
_waits = threading.local()  # .check: what a wait in this thread (for a FIFO, an S3 retry) calls before each look


def stoppable(items: Iterable[_T], check: Callable[[], None]) -> Iterator[_T]:
    """``items`` (a source's streams, whose ``next()`` may wait for a FIFO), with every such wait calling
    ``check()`` before each look at the FIFO (every 0.1 s at most): ``check`` raises to end the wait before
    the FIFO is opened, so that a pass stopped meanwhile (``close()``, a Stop to the reader process) leaves
    it to the next pass.  Once a writer is there, the FIFO is opened and returned whatever ``check`` says:
    closing it then would lose what the writer serves."""
    it = iter(items)
    waits = while_stoppable(check)
    try:
        while True:
            try:
                with waits:
                    item = next(it)
            except StopIteration:
                return
            yield item
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def check_stop() -> None:
    """Call the ``check`` of :func:`stoppable` or :func:`while_stoppable` that is in force in this
    thread, if any: it raises when the pass was ended (a wait for a FIFO, a source's retry loop)."""
    check = getattr(_waits, "check", None)
    if check is not None:
        check()


class while_stoppable:
    """``with while_stoppable(check):`` -- waits inside (a source's retries) call ``check`` through
    :func:`check_stop`, so that a pass ended from another thread stops them."""

    __slots__ = ("check", "outer")

    def __init__(self, check: Callable[[], None]) -> None:
        self.check = check

    def __enter__(self) -> None:
        self.outer = getattr(_waits, "check", None)
        _waits.check = self.check

    def __exit__(self, *exc: object) -> None:
        _waits.check = self.outer


def is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def open_fifo(path: str, wait: FifoWait, *, appear: bool = False) -> BinaryIO:
    """Open the FIFO ``path`` for reading as ``open(path, "rb")`` would, without blocking in ``open``: wait
    (saying so through ``wait``) while it does not exist (only with ``appear``; else that is a
    :class:`SourceError` at once), while another process holds it open for reading, and while no writer
    has opened it.  A path that exists and is not a FIFO is opened as it is (a directory is an error).
    """
    fd: Optional[int] = None
    holders: List[Holder] = []
    scan = True       # look for other readers before the next open (first, and after the FIFO changed)
    scanned = 0.0     # when the processes that hold it were last looked at
    try:
        while True:
            check_stop()
            try:
                st: Optional[os.stat_result] = os.stat(path)
            except FileNotFoundError:
                st = None
            except OSError as exc:
                raise SourceError(f"cannot open {path!r}: {exc.strerror or exc}") from exc
            if st is None:
                if not appear:
                    raise SourceError(f"cannot open {path!r}: No such file or directory")
                if fd is not None:  # removed while we waited for its writer: let go
                    os.close(fd)
                    fd = None
                if holders:  # removed while another process held it: that one read it
                    wait.held_by, holders = describe_holders(holders), []
                scan = True
                wait.check(path, MISSING)
                time.sleep(wait.pause())
                continue
            if stat.S_ISDIR(st.st_mode):
                raise SourceError(f"{wait.what}: {path} is a directory, not a FIFO")
            if not stat.S_ISFIFO(st.st_mode):
                return open_plain(path)
            if fd is not None:
                own = os.fstat(fd)
                if (own.st_dev, own.st_ino) != (st.st_dev, st.st_ino):  # replaced by a new FIFO of that name
                    os.close(fd)  # (pipe-serve replaces a stale one): open the new one
                    fd, scan = None, True
            if fd is None:
                now = time.monotonic()
                if scan:
                    holders, scan, scanned = fifo_readers(st), False, now
                elif holders and now - scanned >= HELD_RECHECK_S:
                    holders, scanned = fifo_readers(st, [h.pid for h in holders]), now  # only those: cheap
                    if not holders:
                        holders = fifo_readers(st)  # they let go: anyone else, before we open?
                if holders:
                    wait.check(path, HELD, lambda: describe_holders(holders))
                    time.sleep(wait.pause())
                    continue
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            ready, prefix = _probe(fd, wait.pause())
            if ready:
                os.set_blocking(fd, True)
                raw = io.FileIO(fd, "rb", closefd=True)
                fd = None  # the file owns it now
                raw.name = path  # as open(path) names it
                return io.BufferedReader(PrefixedRaw(prefix, raw) if prefix else raw)
            wait.check(path, NO_WRITER)
    finally:
        if fd is not None:
            os.close(fd)


def _probe(fd: int, timeout: float):
    """Wait up to ``timeout`` s for the FIFO ``fd`` (non-blocking) to have a writer; ``(ready, prefix)``:
    ready when there is data, a writer, or (Linux) a writer came and went; ``prefix`` the byte the probe
    read, if it read one."""
    events = 0
    if _LINUX:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        found = poller.poll(int(timeout * 1000))  # wakes on data, or on the hang-up of a writer that left
        events = found[0][1] if found else 0
        if events & select.POLLIN:
            return True, b""
    elif timeout:
        time.sleep(timeout)
    try:
        got = os.read(fd, 1)
    except BlockingIOError:  # EAGAIN: a writer has it open, nothing written yet
        return True, b""
    if got:  # data came between the poll and the read
        return True, got
    # end of file: no writer now.  On Linux a hang-up means one came and went: an empty stream.
    return bool(events & select.POLLHUP) if _LINUX else False, b""


def open_plain(path: str) -> BinaryIO:
    """``open(path, "rb")`` with its error as a :class:`SourceError` naming the path."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise SourceError(f"cannot open {path!r}: {exc.strerror or exc}") from exc


# -- who else holds it (Linux /proc) ------------------------------------------------------------------------

def fifo_readers(st: os.stat_result, pids: Optional[Iterable[int]] = None) -> List[Holder]:
    """The other processes (of ``pids``, else all that ``/proc`` shows us: this user's, or all for root)
    that have the FIFO ``st`` open read-only.  Best-effort: ``[]`` where there is no ``/proc``; a process
    that is blocked in ``open()`` of it has no descriptor yet and is not seen; one that has it open
    read-write is a writer as much as a reader and is not counted."""
    if not _LINUX:
        return []
    me = os.getpid()
    key = (st.st_dev, st.st_ino)
    if pids is None:
        try:
            pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return []
    found: List[Holder] = []
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(base)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            link = f"{base}/{fd}"
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if not target.startswith("/"):  # pipe:[...], socket:[...], anon_inode:...
                continue
            try:
                held = os.stat(link)  # the open file itself, wherever it is mounted
            except OSError:
                continue
            if (held.st_dev, held.st_ino) == key and _access_mode(pid, fd) == os.O_RDONLY:
                found.append(Holder(pid, _describe_process(pid)))
                break
    return found


def describe_holders(holders: List[Holder]) -> str:
    return "; ".join(h.description for h in holders)


def _access_mode(pid: int, fd: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return text if len(text) <= _CMDLINE_CHARS else text[:_CMDLINE_CHARS - 3] + "..."


def _parent(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _describe_process(pid: int) -> str:
    """``pid 123: python train.py``; a multiprocessing child (a parrecio reader process: its command line
    is the fork server's) is named with the nearest ancestor that is not one."""
    text = f"pid {pid}: {_cmdline(pid)}"
    ancestor = pid
    for _ in range(3):
        if "multiprocessing" not in _cmdline(ancestor):
            break
        parent = _parent(ancestor)
        if not parent or parent <= 1:
            return text
        ancestor = parent
    else:
        return text
    return text if ancestor == pid else f"pid {pid}, a child of pid {ancestor}: {_cmdline(ancestor)}"


class PrefixedRaw(io.RawIOBase):
    """``prefix`` followed by the rest of the unbuffered ``raw`` file: gives back bytes read ahead (to check
    the magic, to see whether a FIFO has a writer).  ``fileno()`` is ``raw``'s (the FIFO); :meth:`pending`
    counts the prefix bytes not yet read, which ``select()`` on that descriptor cannot see."""

    def __init__(self, prefix: bytes, raw) -> None:
        super().__init__()
        self._prefix = memoryview(prefix)
        self._raw = raw

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    @property
    def name(self):
        return getattr(self._raw, "name", None)

    def pending(self) -> int:
        """Bytes of the prefix not handed out yet: readable now without waiting on the descriptor."""
        own = len(self._prefix)
        below = getattr(self._raw, "pending", None)
        return own + (below() if below is not None else 0)

    def readinto(self, buf) -> Optional[int]:
        if self._prefix:
            n = min(len(buf), len(self._prefix))
            buf[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._raw.readinto(buf)

    def close(self) -> None:
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


def enlarge_pipe(fd: int) -> None:
    """Grow a pipe's (FIFO's) kernel buffer to the largest an unprivileged process may set
    (``/proc/sys/fs/pipe-max-size``, 1 MiB by default): with the default 64 KiB the writer and this
    process take turns every 64 KiB, and a FIFO loop reads at about half the speed.  Whoever reads
    the stream calls it: the reader process, and the consumer itself with ``workers=0``."""
    try:
        import fcntl
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < size:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # not Linux, or the limit is lower for us (the other end set it, or a per-user quota)
