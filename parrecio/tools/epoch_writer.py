"""One Pipe-mode epoch into a FIFO, knowing to the byte what the reader got (for ``pipe-serve``).

An epoch that Ctrl-C or SIGTERM cuts short must end *inside* a frame, so that the reader says the stream
was cut short instead of delivering an epoch that looks whole.  What to append depends on where the
bytes the FIFO took end: on a frame's end, a frame head's first bytes (the magic alone); inside a frame,
nothing -- any bytes appended there could complete a frame of up to that many bytes left (a 1-byte
label whose head was written: the magic became its payload and padding, and the epoch looked whole).  A
buffered file cannot say how much of a write it took when a signal interrupts it, so this writes the
descriptor itself: ``os.write`` returns what it took, and one that raises took nothing (an interrupted
``write(2)`` that took some bytes returns their count instead of failing).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable, Deque, Iterable, Optional

from ..recordio.framing import MAGIC_BYTES
from ..recordio.wrapper import encode_sagemaker_record

__all__ = ["EpochWriter"]


class EpochWriter:
    """Frames into the descriptor ``fd``, buffered up to ``buffer`` bytes (``write``: ``os.write``)."""

    def __init__(self, fd: int, buffer: int = 1 << 20,
                 write: Callable[[int, memoryview], int] = os.write) -> None:
        self.fd, self.size, self._write = fd, buffer, write
        self.buf = bytearray()
        self.queued = 0                    # bytes handed to this writer
        self.sent = 0                      # bytes the descriptor took
        self.ends: Deque[int] = deque()    # stream offsets of frame ends not sent yet
        self.boundary = 0                  # the last frame end the descriptor took all of

    def write_records(self, records: Iterable, split_bytes: Optional[int]) -> int:
        """Each payload in SageMaker wrapper framing (see :mod:`parrecio.recordio.wrapper`), all sent;
        returns the bytes written."""
        for payload in records:
            pieces = encode_sagemaker_record(payload, split_bytes)
            for head in pieces:  # (three pieces a frame: head, part, padding)
                self._frame(head, next(pieces), next(pieces))
        self._flush()
        return self.queued

    def cut_short(self) -> None:
        """End the stream inside a frame: the writing was interrupted.  Where the descriptor took whole
        frames, the buffered ones (whole frames too) go after them, then the magic; where it stopped
        inside one (an interrupted send: the rest of that send is dropped), nothing."""
        if self.sent == self.boundary:
            data, self.buf = self.buf + MAGIC_BYTES, bytearray()
            self._send(memoryview(data))

    def _frame(self, head: bytes, part: bytes, pad: bytes) -> None:
        n = len(head) + len(part) + len(pad)
        if len(self.buf) + n > self.size:
            self._flush()
        self.queued += n
        self.ends.append(self.queued)
        if n > self.size:  # a large part: from where it lies, not through the buffer
            self._send(memoryview(head))
            self._send(memoryview(part))
            self._send(memoryview(pad))
        else:
            self.buf += head
            self.buf += part
            self.buf += pad

    def _flush(self) -> None:
        if self.buf:
            data, self.buf = self.buf, bytearray()
            self._send(memoryview(data))

    def _send(self, view: memoryview) -> None:
        while view:
            n = self._write(self.fd, view)
            self.sent += n
            view = view[n:]
            ends = self.ends
            while ends and ends[0] <= self.sent:
                self.boundary = ends.popleft()
