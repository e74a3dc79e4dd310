"""Waking the consumer once per two tasks instead of once per task.

The consumer is woken by every result it waits for, and a wake-up with the caches cold after the
decoders ran costs it ~0.3 ms: most of its CPU time per sample when the decoders are the bottleneck.
Chunks are therefore dispatched in *pairs* (consecutive chunks ``2k`` and ``2k + 1``, numbered by
:class:`Pairs`), and when the oldest chunk and its partner are both in flight the consumer does not
watch the workers' result pipes but one *bell* pipe, rung by whichever worker finishes the pair last.
Delivery of the older chunk waits for its partner, which runs at the same time on another worker (or
next on the same one); every worker keeps its queued task meanwhile (``prefetch`` >= 2).

The protocol, which needs no lock that a dying worker could leave held:

- worker, after writing the result frame of pair number ``p`` to its own pipe (:meth:`Ringer.done`):
  store ``p`` at ``board[p % N]``, enter and leave the bell pipe's mutex (``FIONREAD``), then read
  ``board[(p ^ 1) % N]``: equal to ``p ^ 1`` means the partner is done -- ring (write one byte).
- consumer: waits on the bell only while both chunks of a pair are undelivered and were each dispatched
  whole as a numbered task; on a wake it drains the bell *before* it reads the result pipes.

No wake-up is lost: the two workers' ``FIONREAD`` calls are ordered by the bell pipe's mutex, so the
later one reads the flag the earlier one stored before it (release/acquire of one kernel mutex, on every
architecture); a worker with both chunks sees its own flag.  A ring is written after its frame, so a
consumer that takes a ring finds both frames.  A spurious ring (an old one, a pair the consumer no
longer waits for) costs one wake-up.  A worker that dies mid-pair wakes the consumer through its
process sentinel, and the consumer stops pairing for the rest of the pass; the consumer's regular
timeout (``poll_interval``) bounds every wait besides.

A worker whose pipe is full would wait for a consumer that is not watching that pipe: it writes its
frames without blocking, and when the pipe is full it rings (after the bytes that filled it, so the
consumer, woken, finds part of a frame and watches that pipe until the frame is whole; or reads the
earlier frames that filled it), then waits for room, and rings again if the pipe fills again.  Small
frames (values in slots, ragged boxes, labels) never fill it; large ones (long JSON, many failed
samples) wake the consumer per task, as before pairing.
"""

from __future__ import annotations

import fcntl
import os
import termios
from typing import Any

import numpy as np

from .children import close_quietly
from .shm import Segment

__all__ = ["Pairs", "Bell", "Ringer", "board_name", "BOARD_ENTRIES"]

BOARD_ENTRIES = 1024  # flags of pairs in flight (far fewer than this are: workers x prefetch)
_NONE = -1
_FIONREAD_ARG = bytes(4)


class Pairs:
    """The consumer's numbering of whole-chunk tasks: ``next()`` -> 0, 1, 2, ...; :meth:`align` makes
    the next number even, so that a pass's first chunk starts a pair."""

    def __init__(self) -> None:
        self._next = 0

    def next(self) -> int:
        p = self._next
        self._next += 1
        return p

    def align(self) -> None:
        self._next += self._next & 1


class Bell:
    """The consumer's side: the board (a small shared-memory segment the workers write) and the read
    end of the bell pipe, whose write end every worker holds."""

    def __init__(self, ctx: Any, name: str) -> None:
        self.segment = Segment.create(name, BOARD_ENTRIES * 8)
        try:
            np.ndarray((BOARD_ENTRIES,), np.int64, self.segment.buf).fill(_NONE)  # pair 0 is not done yet
            self.r, self.w = ctx.Pipe(duplex=False)
        except BaseException:
            self.segment.unlink()
            self.segment.close()
            raise
        self.fd = self.r.fileno()
        os.set_blocking(self.fd, False)

    @property
    def name(self) -> str:
        return self.segment.name

    def drain(self) -> None:
        """Take every ring waiting in the pipe."""
        try:
            while len(os.read(self.fd, 4096)) == 4096:
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        close_quietly(self.r, self.w)
        self.segment.unlink()
        self.segment.close()


class Ringer:
    """A worker's side: marks its pairs done on the board and rings the bell when it finished a pair, or
    when its result pipe is full (:func:`~parrecio.pipeline.wire.send_result`)."""

    def __init__(self, board_name: str, bell_w: Any) -> None:
        self.segment = Segment.attach(board_name)
        self.flags = np.ndarray((BOARD_ENTRIES,), np.int64, self.segment.buf)
        self.fd = bell_w.fileno()
        self._conn = bell_w  # (keeps the descriptor open)
        os.set_blocking(self.fd, False)

    def done(self, pair: int) -> None:
        """The result frame of the task numbered ``pair`` is written: ring if its partner's is too."""
        flags = self.flags
        flags[pair % BOARD_ENTRIES] = pair
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, _FIONREAD_ARG)  # through the bell pipe's mutex
        except OSError:  # the consumer is gone
            return
        partner = pair ^ 1
        if flags[partner % BOARD_ENTRIES] == partner:
            self.ring()

    def ring(self) -> None:
        try:
            os.write(self.fd, b"\0")
        except (BlockingIOError, OSError):  # full: the consumer has rings to read; or it is gone
            pass

    def close(self) -> None:
        del self.flags  # (its view of the segment: the mapping closes only once none is left)
        self.segment.close()


def board_name(prefix: str) -> str:
    """The board segment's name for the run ``prefix`` (swept with the rest of its shared memory)."""
    return prefix + "pairs"
