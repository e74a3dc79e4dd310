"""Result frames from a decoder process to the consumer, read without ever blocking the consumer.

::

    worker:   send_result(fd, TaskDone)  --  [header: body length, task id, cpu, pid, split][body: pickle]
    consumer: FrameReader(fd).read()     --  whatever bytes are there now -> complete TaskDone frames

Why not ``Connection.send``/``recv``: ``recv`` blocks until the whole message is in, so a worker stopped
halfway through sending a 64 MiB result (SIGSTOP, a debugger) would freeze the consumer with it, out of
reach of every liveness check.  Here the consumer's end is non-blocking and a frame is assembled across
as many reads as it takes, so a stalled sender is just a worker that makes no progress.

The task id travels outside the pickle, so a body that cannot be unpickled in the consumer (a value
whose ``__reduce__`` fails there) is still attributed to its task, which is then re-run with every
value pickled on its own (``split``) to find the sample at fault.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .arrays import concatenated
from .messages import TaskDone

__all__ = ["send_message", "send_result", "FrameReader", "MessageReader", "Frame", "pack_column", "unpack_column"]

_HEADER = struct.Struct("<QqdqB")  # body length, task id, cpu seconds, pid, split
_HEADER_SIZE = _HEADER.size


class Frame:
    """A received result: the header fields and the still-pickled body."""

    __slots__ = ("task_id", "cpu", "pid", "split", "body")

    def __init__(self, task_id: int, cpu: float, pid: int, split: bool, body: memoryview) -> None:
        self.task_id, self.cpu, self.pid, self.split, self.body = task_id, cpu, pid, split, body

    def values(self) -> tuple:
        """The task's ``(columns, errors)`` (``TaskDone.values``, columns unpacked); raises whatever
        unpickling the body raises."""
        columns, errors = pickle.loads(self.body)
        return [unpack_column(c) for c in columns], errors


class _Packed:
    """A column of n arrays of one dtype and one trailing shape, sent as one array and their lengths:
    one pickled array instead of n (a ragged ``(k, 5)`` boxes array per sample costs ~1.5 us to
    unpickle; a slice of the packed array, ~0.1 us)."""

    __slots__ = ("data", "lens")

    def __init__(self, data: np.ndarray, lens: np.ndarray) -> None:
        self.data, self.lens = data, lens

    def __reduce__(self):
        return _Packed, (self.data, self.lens)


def pack_column(col: Optional[list]) -> Any:
    """``col`` as it travels: a :class:`_Packed` when every value is an ndarray (ndim >= 1) of one dtype
    and trailing shape -- the ragged arrays of a field -- else the list itself."""
    if not col or type(col[0]) is not np.ndarray:
        return col
    first = col[0]
    dtype, tail = first.dtype, first.shape[1:]
    if first.ndim == 0 or dtype.hasobject:
        return col
    for v in col:
        if type(v) is not np.ndarray or v.dtype != dtype or v.shape[1:] != tail or v.ndim == 0:
            return col
    lens = np.fromiter((len(v) for v in col), np.int64, len(col))
    return _Packed(concatenated(col), lens)


def unpack_column(col: Any) -> Optional[list]:
    """The list of values of a column made by :func:`pack_column` (packed arrays come back as views of
    one array)."""
    if type(col) is not _Packed:
        return col
    data, ends = col.data, np.cumsum(col.lens).tolist()
    starts = [0] + ends[:-1]
    return [data[a:b] for a, b in zip(starts, ends)]


_CONN_HEADER = struct.Struct("!i")  # multiprocessing.Connection's length prefix (-1: a long one follows)
_CONN_LONG = struct.Struct("!Q")


def send_message(fd: int, msg: Any) -> None:
    """Write ``msg`` to the blocking pipe ``fd`` as ``Connection.send`` does (its 4-byte length and the
    pickle), for the peer's ``Connection.recv``: one ``write`` of a ready buffer instead of the dozen
    Python calls of ``send`` (the consumer sends a task per chunk, each on a wake-up with cold caches).
    Only for messages that need no ``ForkingPickler`` reducer (no connections or descriptors inside)."""
    send_messages(fd, [msg])


def send_messages(fd: int, msgs: List[Any]) -> None:
    """:func:`send_message` of each of ``msgs``, in one ``write``: the peer finds them all at once."""
    parts = []
    for msg in msgs:
        body = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
        parts.append(_CONN_HEADER.pack(len(body)) if len(body) < 0x7FFFFFFF
                     else _CONN_HEADER.pack(-1) + _CONN_LONG.pack(len(body)))
        parts.append(body)
    data = memoryview(b"".join(parts))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def send_result(fd: int, msg: TaskDone, body: bytes, split: bool,
                full: Optional[Callable[[], None]] = None) -> None:
    """Write one frame (``body`` is the pickled ``msg.values``) to the pipe ``fd``: a blocking one, or,
    with ``full``, a non-blocking one -- each time the pipe is full, ``full()`` is called (the pairing
    bell: the consumer may not be watching this pipe), then the write waits for room."""
    header = _HEADER.pack(len(body), msg.task_id, msg.cpu, msg.pid, split)
    views = [memoryview(header), memoryview(body)]
    room = None
    while views:
        try:
            n = os.writev(fd, views)
        except BlockingIOError:
            assert full is not None  # (only a caller that set the pipe non-blocking gets here)
            full()  # after the bytes that filled the pipe: the consumer, woken, finds the frame begun
            if room is None:
                room = select.poll()
                room.register(fd, select.POLLOUT)
            room.poll()
            continue
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class _Frames:
    """Assembles length-prefixed frames from the non-blocking read end ``fd`` of a pipe (the framing:
    :meth:`_header`, in subclasses).

    Small frames are taken with one ``read`` of up to :attr:`CHUNK` bytes, several at a time; a large
    body is read straight into its own buffer.  A read that returns less than it asked for emptied the
    pipe, so no further system call is made to learn that it is empty (the consumer's ``poll`` is
    level-triggered: bytes that arrive later wake it again).  One such call costs microseconds, but the
    consumer makes it on every wake-up, with cold caches."""

    CHUNK = 1 << 16

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.eof = False
        self.received = 0  # bytes read so far: a sender that makes progress is alive
        self._pending = bytearray()  # bytes read past the last frame taken: the start of the next ones
        self._fields: Optional[tuple] = None  # the header of the frame whose body is being read
        self._body: Optional[memoryview] = None
        self._got = 0
        # An exception from a signal handler (Ctrl-C) that lands between a read and its bookkeeping
        # loses bytes of the stream: the next header would be read from amid a body (a length of
        # gigabytes).  Such a reader reads no more; its sender is to be replaced.
        self.broken = False

    def _header(self, pending: bytearray) -> Optional[Tuple[int, int, tuple]]:
        """``(header bytes, body bytes, header fields)`` from the start of ``pending``, or None while
        it holds only part of a header."""
        raise NotImplementedError

    @property
    def partial(self) -> bool:
        """Whether a frame has started to arrive but is not complete (or the stream was lost: broken)."""
        return self.broken or bool(self._pending) or self._fields is not None

    def _frames(self) -> List[Tuple[tuple, memoryview]]:
        """``(header fields, body)`` of every frame that can be completed from the bytes available now
        (never blocks).  Sets :attr:`eof` when the writer is gone; a frame cut short by that is dropped."""
        if self.broken:
            return []
        try:
            return self._frames_now()
        except BaseException:
            self.broken = self.eof = True
            raise

    def _frames_now(self) -> List[Tuple[tuple, memoryview]]:
        frames: List[Tuple[tuple, memoryview]] = []
        drained = False
        while True:
            if self._fields is None:
                pending = self._pending
                head = self._header(pending)
                if head is None:
                    if drained or self.eof:
                        break
                    drained = self._fill()
                    continue
                hsize, size, self._fields = head
                take = min(size, len(pending) - hsize)
                body = bytearray(size)
                body[:take] = pending[hsize:hsize + take]
                del pending[:hsize + take]
                self._body, self._got = memoryview(body), take
            body = self._body
            if self._got < len(body):
                if drained or self.eof:
                    break
                want = len(body) - self._got
                n = self._read_into(body[self._got:])
                if n is None:
                    break
                self._got += n
                drained = n < want
                if self._got < len(body):
                    continue
            frames.append((self._fields, body))
            self._fields, self._body = None, None
        return frames

    def _fill(self) -> bool:
        """Read what the pipe holds (up to CHUNK bytes) onto the pending bytes; True when that emptied
        it (or it would block, or the writer is gone)."""
        try:
            chunk = os.read(self.fd, self.CHUNK)
        except BlockingIOError:
            return True
        except OSError:  # the pipe is gone
            self.eof = True
            return True
        if not chunk:
            self.eof = True
            return True
        self._pending += chunk
        self.received += len(chunk)
        return len(chunk) < self.CHUNK

    def _read_into(self, buf: memoryview) -> Optional[int]:
        """Read into ``buf``: the byte count, or None when nothing more can come now (it would block,
        or the writer is gone: then :attr:`eof` is set)."""
        try:
            n = os.readv(self.fd, [buf])
        except BlockingIOError:
            return None
        except OSError:
            self.eof = True
            return None
        if n == 0:
            self.eof = True
            return None
        self.received += n
        return n


class FrameReader(_Frames):
    """The result frames of a worker's result pipe, as :func:`send_result` writes them."""

    def _header(self, pending: bytearray) -> Optional[Tuple[int, int, tuple]]:
        if len(pending) < _HEADER_SIZE:
            return None
        fields = _HEADER.unpack_from(pending)
        return _HEADER_SIZE, fields[0], fields

    def read(self) -> List[Frame]:
        """Every frame that can be completed from the bytes available now (never blocks).  Sets
        :attr:`eof` when the writer is gone; a frame cut short by that is dropped."""
        return [Frame(task_id, cpu, pid, bool(split), body)
                for (_, task_id, cpu, pid, split), body in self._frames()]


class MessageReader(_Frames):
    """The messages of a pipe written by ``multiprocessing.Connection.send`` (or :func:`send_message`),
    unpickled, read without blocking: the consumer's end of the reader process's data pipe, which
    :meth:`Connection.recv` would read with three system calls per message, plus one ``poll`` to ask
    whether there is one."""

    def _header(self, pending: bytearray) -> Optional[Tuple[int, int, tuple]]:
        if len(pending) < 4:
            return None
        (size,) = _CONN_HEADER.unpack_from(pending)
        if size != -1:
            return 4, size, ()
        if len(pending) < 12:  # a message of 2 GiB or more: Connection's 8-byte length follows
            return None
        return 12, _CONN_LONG.unpack_from(pending, 4)[0], ()

    def read(self) -> List[Any]:
        """Every message that can be completed from the bytes available now, unpickled (never blocks)."""
        return [pickle.loads(body) for _, body in self._frames()]
