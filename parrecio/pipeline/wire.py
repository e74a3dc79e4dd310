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
import struct
from typing import Any, List, Optional

import numpy as np

from .messages import TaskDone

__all__ = ["send_result", "FrameReader", "Frame", "pack_column", "unpack_column"]

_HEADER = struct.Struct("<QqdqB")  # body length, task id, cpu seconds, pid, split


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
    return _Packed(np.concatenate(col), lens)


def unpack_column(col: Any) -> Optional[list]:
    """The list of values of a column made by :func:`pack_column` (packed arrays come back as views of
    one array)."""
    if type(col) is not _Packed:
        return col
    data, ends = col.data, np.cumsum(col.lens).tolist()
    starts = [0] + ends[:-1]
    return [data[a:b] for a, b in zip(starts, ends)]


def send_result(fd: int, msg: TaskDone, body: bytes, split: bool) -> None:
    """Write one frame (``body`` is the pickled ``msg.values``) to the blocking file descriptor ``fd``."""
    header = _HEADER.pack(len(body), msg.task_id, msg.cpu, msg.pid, split)
    views = [memoryview(header), memoryview(body)]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


class FrameReader:
    """Assembles frames from the non-blocking read end ``fd`` of a worker's result pipe."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self.eof = False
        self.received = 0  # bytes read so far: a sender that makes progress is alive
        self._header = bytearray()
        self._fields: Optional[tuple] = None
        self._body: Optional[memoryview] = None
        self._got = 0

    @property
    def partial(self) -> bool:
        """Whether a frame has started to arrive but is not complete."""
        return bool(self._header) or self._fields is not None

    def read(self) -> List[Frame]:
        """Every frame that can be completed from the bytes available now (never blocks).  Sets
        :attr:`eof` when the writer is gone; a frame cut short by that is dropped."""
        frames: List[Frame] = []
        while not self.eof:
            try:
                if self._fields is None:
                    chunk = os.read(self.fd, _HEADER.size - len(self._header))
                    if not chunk:
                        self.eof = True
                        break
                    self._header += chunk
                    self.received += len(chunk)
                    if len(self._header) < _HEADER.size:
                        continue
                    self._fields = _HEADER.unpack(self._header)
                    self._header = bytearray()
                    self._body = memoryview(bytearray(self._fields[0]))
                    self._got = 0
                if self._got < len(self._body):
                    n = os.readv(self.fd, [self._body[self._got:]])
                    if n == 0:
                        self.eof = True
                        break
                    self._got += n
                    self.received += n
                if self._got == len(self._body):
                    _, task_id, cpu, pid, split = self._fields
                    frames.append(Frame(task_id, cpu, pid, bool(split), self._body))
                    self._fields, self._body = None, None
            except BlockingIOError:
                break
            except OSError:  # the pipe is gone
                self.eof = True
                break
        return frames
