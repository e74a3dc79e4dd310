"""Standard input and open file objects: streams that live in the consumer and travel as file descriptors.

```
 consumer process                                           reader process
 "-"                 os.dup(0) ------------------ fd ---->  os.fdopen(fd)              (FdCarrier)
 open("x.rec")       os.dup(fileno), tell() ----- fd ---->  pread from that position   (never moves the
                                                                                        shared offset)
 BytesIO, GzipFile,  pump thread: obj.read1() ->  socket -> _PumpReader: unframes the chunks, raises
 HTTP body, ...      [len][chunk]...[0] or [err]            SourceError on an error marker or truncation
```

**Carrying a descriptor.**  :class:`FdCarrier` owns a descriptor in the process that created it.  Pickled,
it becomes ``multiprocessing.reduction.DupFd(fd)``: during ``Process.start()`` under ``spawn`` or
``forkserver`` the spawning popen passes the descriptor to the child (``pass_fds`` / ``SCM_RIGHTS``);
pickled at any other time, ``multiprocessing``'s resource sharer hands it over.  Under ``fork`` nothing is
pickled and the child inherits the number.  The consumer duplicates fd 0 because ``multiprocessing``
closes a child's fd 0 at start-up.

**Why only some file objects use their descriptor.**  ``gzip.GzipFile.fileno()`` works but returns the
*compressed* file's descriptor, and a buffered reader over a pipe may hold bytes its descriptor no longer
has.  So the descriptor is used only when its bytes are exactly the object's bytes: a regular file opened
with ``open(path, "rb")`` (read with ``pread`` from ``tell()``, whatever the buffering) or an unbuffered
``FileIO`` on a pipe, socket or terminal.  Everything else is copied by a pump thread.

**The pump's framing.**  A pump copies ``obj.read1()`` chunks into one end of a ``socketpair`` as
``[u32 length][bytes]``, then ``[u32 0]`` at the end, or ``[u32 0xFFFFFFFF][u32 n][message]`` if reading
the object failed.  A plain pipe could not tell the reader "the object raised" from "the object ended", and
a forked peer holding a copy of the write end would delay its end of file forever; the framing makes a
failed or truncated copy a :class:`SourceError` in the reader instead of a silently short stream.  The
pump writes with a short timeout and checks a stop flag, so :meth:`PumpSource.release` never hangs, even
when the reader is gone.
"""

from __future__ import annotations

import io
import os
import select
import socket
import stat
import struct
import threading
import time
import weakref
from multiprocessing.reduction import DupFd
from typing import Any, Iterator, Optional

from ..errors import SourceError
from .base import Source, Stream

__all__ = ["FdCarrier", "FdSource", "StdinSource", "PumpSource", "fileobj_source"]

_U32 = struct.Struct("<I")
_END = 0
_ERROR = 0xFFFFFFFF
_PUMP_CHUNK = 1 << 20
_SEND_TIMEOUT = 0.1  # seconds between checks of the stop flag while the socket is full
_JOIN_TIMEOUT = 2.0


class FdCarrier:
    """A file descriptor owned by the process that made this object; pickles as a duplicate for the receiver.

    The receiver :meth:`take` s the descriptor (and then owns it: the stream file closes it).  :meth:`close`
    acts only in the owning process: a forked child holds a copy of this object and must not close the
    parent's descriptor number under it.
    """

    def __init__(self, fd: int) -> None:
        self.fd: Optional[int] = fd
        self._owner = os.getpid()

    def __reduce__(self):
        if self.fd is None:
            raise SourceError("cannot send a released or already-read file descriptor to another process")
        return (_rebuild_carrier, (DupFd(self.fd),))

    def take(self) -> Optional[int]:
        """The descriptor, handed over to the caller (``None`` if already taken or closed)."""
        fd, self.fd = self.fd, None
        return fd

    def close(self) -> None:
        if self.fd is not None and os.getpid() == self._owner:
            fd, self.fd = self.fd, None
            try:
                os.close(fd)
            except OSError:
                pass


def _rebuild_carrier(dup: Any) -> FdCarrier:
    return FdCarrier(dup.detach())


class FdSource(Source):
    """One stream read from a descriptor carried by an :class:`FdCarrier`; one epoch only.

    ``how`` says how the reader process turns the descriptor into a file: ``"plain"`` (``os.fdopen``),
    ``"pread"`` (positional reads from ``offset``, for regular files) or ``"pump"`` (unframe a pump's
    socket, see the module docstring).
    """

    epochs_supported = 1

    def __init__(self, carrier: FdCarrier, *, name: str, kind: str, how: str = "plain", offset: int = 0) -> None:
        self.name = name
        self.kind = kind
        self._carrier = carrier
        self._how = how
        self._offset = offset
        self._finalizer = weakref.finalize(self, carrier.close)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_finalizer", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._finalizer = None

    def _once_reason(self) -> str:
        return "stdin can be read only once" if self.kind == "stdin" else "an open file object can be read only once"

    def streams(self, epoch: int) -> Iterator[Stream]:
        self.check_epoch(epoch)
        fd = self._carrier.take()
        if fd is None:
            raise SourceError(f"{self.name}: already read or released ({self._once_reason()})")
        try:
            file = self._open(fd)
        except BaseException:
            os.close(fd)
            raise
        yield Stream(self.name, file)

    def _open(self, fd: int):
        if self._how == "pread":
            return io.BufferedReader(_PreadRaw(fd, self._offset))
        if self._how == "pump":
            return io.BufferedReader(_PumpReader(fd, self.name), buffer_size=_PUMP_CHUNK)
        return os.fdopen(fd, "rb")

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


class StdinSource(FdSource):
    """Standard input (``"-"``): file descriptor 0, duplicated in the consumer when resolved."""

    def __init__(self) -> None:
        try:
            fd = os.dup(0)
        except OSError as exc:
            raise SourceError(f"cannot use stdin ('-'): {exc.strerror or exc}") from exc
        super().__init__(FdCarrier(fd), name="<stdin>", kind="stdin")


class _FdRaw(io.RawIOBase):
    """A raw binary reader that owns the descriptor ``fd`` (closed with it)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class _PreadRaw(_FdRaw):
    """A regular file read with ``pread`` from ``start``: never moves the descriptor's shared offset."""

    def __init__(self, fd: int, start: int) -> None:
        super().__init__(fd)
        self._pos = start

    def readinto(self, buf) -> int:
        n = os.preadv(self._fd, [buf], self._pos)
        self._pos += n
        return n


class _PumpReader(_FdRaw):
    """The reader side of a pump: the payload bytes of ``[len][chunk]`` frames, until the end marker."""

    def __init__(self, fd: int, name: str) -> None:
        super().__init__(fd)
        self._name = name
        self._left = 0  # bytes left in the current chunk
        self._ended = False

    def readinto(self, buf) -> int:
        if self._ended or len(buf) == 0:
            return 0
        if self._left == 0:
            length = self._read_u32()
            if length == _END:
                self._ended = True
                return 0
            if length == _ERROR:
                message = self._read_exact(self._read_u32()).decode("utf-8", "replace")
                self._ended = True
                raise SourceError(message)
            self._left = length
        view = memoryview(buf).cast("B")[: self._left]
        n = os.readv(self._fd, [view])
        if n == 0:
            raise self._truncated()
        self._left -= n
        return n

    def _read_u32(self) -> int:
        return _U32.unpack(self._read_exact(4))[0]

    def _read_exact(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            part = os.read(self._fd, size - len(data))
            if not part:
                raise self._truncated()
            data += part
        return data

    def _truncated(self) -> SourceError:
        return SourceError(
            f"{self._name}: the copy of the file object ended early (the consumer process released the "
            f"source or died before the object's end)"
        )


class _Pump:
    """The consumer-side thread that copies a file object into a socket, framed (see the module docstring)."""

    def __init__(self, obj: Any, name: str) -> None:
        self._obj = obj
        self._name = name
        self._stop = threading.Event()
        self._owner = os.getpid()
        self.read_sock, self._write_sock = socket.socketpair()
        self._write_sock.settimeout(_SEND_TIMEOUT)
        self._thread = threading.Thread(target=self._run, name=f"parrecio-pump {name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if os.getpid() != self._owner:
            return
        self._stop.set()
        self._thread.join(_JOIN_TIMEOUT)  # a thread stuck in obj.read() is a daemon: left behind

    def _run(self) -> None:
        sock = self._write_sock
        try:
            self._copy(sock)
        except (OSError, _Stopped):
            pass  # the reader side is gone or the source was released: nothing to tell anyone
        finally:
            try:
                sock.shutdown(socket.SHUT_WR)  # acts on the socket, whoever else holds a copy of it
            except OSError:
                pass
            sock.close()

    def _copy(self, sock: socket.socket) -> None:
        read = getattr(self._obj, "read1", None) or self._obj.read
        fd = _waitable_fd(self._obj)
        while True:
            try:
                if fd is None:
                    data = read(_PUMP_CHUNK)
                elif self._buffered_first:  # (until a read takes less than a chunk: the buffer is empty)
                    data = self._read_buffered(fd, read)
                    self._buffered_first = data is not None and len(data) >= _PUMP_CHUNK
                else:
                    data = self._read_when_ready(fd, read)
            except Exception as exc:  # the object failed: tell the reader, as data
                message = f"{self._name}: reading the file object failed: {type(exc).__name__}: {exc}"
                encoded = message.encode("utf-8", "replace")
                self._send(sock, _U32.pack(_ERROR) + _U32.pack(len(encoded)) + encoded)
                return
            if data is None:  # a non-blocking object with nothing yet
                self._check_stop()
                time.sleep(0.01)
                continue
            if not data:
                self._send(sock, _U32.pack(_END))
                return
            self._send(sock, _U32.pack(len(data)))
            self._send(sock, data)

    # A buffered reader over a pipe or socket is read only once its descriptor is ready: blocked in its
    # read1(), the thread held the object's lock past stop(), and the user's own close() of the object
    # waited for a peer that had gone quiet (for ever).  Its first read also takes what the object holds
    # buffered already (the user peeked), which the descriptor's readiness does not show.
    _buffered_first = True

    def _read_buffered(self, fd: int, read: Any) -> Any:
        """What the object holds buffered now, without waiting (``None``: nothing yet)."""
        was = os.get_blocking(fd)
        os.set_blocking(fd, False)  # (for the one call: the descriptor's description may be shared)
        try:
            ready = _readable(fd, 0.0)
            data = read(_PUMP_CHUNK)
        finally:
            os.set_blocking(fd, was)
        return data if data or ready else None  # (b"" from a descriptor that is not ready: no data yet)

    def _read_when_ready(self, fd: int, read: Any) -> Any:
        """``read(chunk)`` once ``fd`` is readable (data or its end), looking at the stop flag meanwhile:
        it cannot block then, its buffer being empty after the first read of a chunk larger than it."""
        while not _readable(fd, 0.1):
            self._check_stop()
        return read(_PUMP_CHUNK)

    def _send(self, sock: socket.socket, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._check_stop()
            try:
                sent = sock.send(view)
            except socket.timeout:
                continue  # nothing was sent: the socket is full
            view = view[sent:]

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Stopped


class _Stopped(Exception):
    pass


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def _waitable_fd(obj: Any) -> Optional[int]:
    """The descriptor of a buffered reader over a pipe, socket or terminal, whose readiness tells whether
    its ``read1()`` would block; None for any other object (a GzipFile's descriptor is its compressed
    file's, a regular file is always ready)."""
    if not isinstance(obj, io.BufferedReader) or not isinstance(obj.raw, (io.FileIO, socket.SocketIO)):
        return None
    try:
        fd = obj.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) else None


class PumpSource(FdSource):
    """A file object without a usable descriptor, copied by a pump thread in the consumer; one epoch only."""

    def __init__(self, obj: Any, name: str) -> None:
        pump = _Pump(obj, name)
        carrier = FdCarrier(pump.read_sock.detach())
        super().__init__(carrier, name=name, kind="fileobj", how="pump")
        self._pump = pump
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release_pump, pump, carrier)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_pump", None)
        return state


def _release_pump(pump: _Pump, carrier: FdCarrier) -> None:
    pump.stop()
    carrier.close()


def fileobj_source(obj: Any) -> FdSource:
    """The source for an open binary file object: its descriptor when that is safe, else a pump thread.

    The object is read from its current position.  A regular file opened with ``open(path, "rb")`` is read
    with ``pread`` from its ``tell()``, leaving the object's own position alone.  Any other object should be
    handed over: a pump thread starts reading it at once, so do not use it afterwards.
    """
    if isinstance(obj, io.TextIOBase):
        raise SourceError(f"{_obj_name(obj)} is opened in text mode: open it in binary mode ('rb')")
    if getattr(obj, "closed", False):
        raise SourceError(f"{_obj_name(obj)} is closed")
    name = _obj_name(obj)
    raw = _file_io_of(obj)
    if raw is not None:
        fd = obj.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):
            start = obj.tell()
            if start:  # (the stream's byte offsets, which errors name, count from there)
                name = f"{name[:-1]} from byte {start}>"
            return FdSource(FdCarrier(os.dup(fd)), name=name, kind="fileobj", how="pread", offset=start)
        if raw is obj:  # unbuffered: no bytes hidden in a Python buffer
            return FdSource(FdCarrier(os.dup(fd)), name=name, kind="fileobj", how="plain")
    return PumpSource(obj, name)


def _file_io_of(obj: Any) -> Optional[io.FileIO]:
    """The ``FileIO`` whose descriptor holds exactly ``obj``'s bytes, or ``None``."""
    if isinstance(obj, io.FileIO):
        return obj
    if isinstance(obj, (io.BufferedReader, io.BufferedRandom)) and isinstance(getattr(obj, "raw", None), io.FileIO):
        return obj.raw
    return None


def _obj_name(obj: Any) -> str:
    name = getattr(obj, "name", None)
    if isinstance(name, (str, bytes)) and name:
        return f"<file object {os.fsdecode(name)}>"
    if isinstance(name, int):
        return f"<file object fd {name}>"
    return f"<{type(obj).__name__} object>"
