"""What every pass (one epoch) is to :class:`~parrecio.ParallelReader`, whichever mode runs it.

A pass is a :class:`~parrecio.pipeline.run.Run` (decoder processes) or an
:class:`~parrecio.pipeline.inline.InlineRun` (``workers=0``).  Both deliver :class:`Span` s -- runs of
consecutive samples as columns, fixed-shape values as rows of a slot -- that
:mod:`parrecio.pipeline.batching` turns into samples or batches, and both keep their position as data:
the :class:`Cursor` that ``state_dict()`` saves.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any, NamedTuple, Optional

from ..errors import PipelineError

__all__ = ["Pass", "Span", "Cursor", "ended"]


class Cursor:
    """Where a pass stands in this shard's order: ``pos``, the position (sequence number) after the last
    sample handed to the user -- what ``state_dict()`` saves.  The generators of
    :mod:`parrecio.pipeline.batching` set it before each item they yield, so it stays right after an
    error ends them: the samples delivered, in every mode.

    ``handed``, the samples of the epoch handed out by then, is ``pos`` less the places left out
    (``skipped``: samples that ``on_error="skip"`` dropped take a place each).  Samples come in spans
    without gaps, so the count moves once per span or batch, never per sample; padding sets it itself."""

    __slots__ = ("pos", "skipped")

    def __init__(self, pos: int, handed: int = 0) -> None:
        self.pos = pos
        self.skipped = pos - handed

    @property
    def handed(self) -> int:
        return self.pos - self.skipped

    @handed.setter
    def handed(self, value: int) -> None:
        self.skipped = self.pos - value

    def jump(self, seq: int) -> None:
        """The next sample handed out is at ``seq``: the places between were left out."""
        self.skipped += seq - self.pos
        self.pos = seq

    def failed(self, exc: BaseException) -> None:
        """``exc`` ended the pass at its place ``exc.index`` (a DecodeError or CorruptRecordError, every
        sample before it handed out): the places between the last sample handed out and it were left
        out (``on_error="skip"``), so the position is the failed sample's, as the error says -- a resume
        starts there, not at a sample it skipped already."""
        index = getattr(exc, "index", None)
        if isinstance(index, int) and index > self.pos:
            self.jump(index)


class Span(NamedTuple):
    """Consecutive delivered samples ``seq .. seq + n - 1`` of one chunk, as columns.

    ``columns[f]`` is the list of the ``n`` values of field ``f`` that travelled back from the workers
    (or were copied out of the ring), or ``None`` when the field's values are all in the output slot:
    rows ``index .. index + n - 1`` of ``lease.arrays``.  For a field with a tuple spec, the column holds
    tuples with ``None`` at the positions that live in the slot."""
    seq: int
    n: int
    lease: Optional[Any]
    index: int  # type: ignore[assignment]
    columns: list


def ended(owner_pid: int = 0) -> PipelineError:
    """Why a pass the user iterates has ended; ``owner_pid``: the process that made the reader."""
    if owner_pid and os.getpid() != owner_pid:
        return PipelineError(forked_why(owner_pid))
    return PipelineError("this pass was ended by close() or by a new iteration of the same ParallelReader")


def forked_why(owner_pid: int) -> str:
    return (f"the ParallelReader was made in process {owner_pid}, and this process ({os.getpid()}) is the child "
            f"of an os.fork() of it: only the process that made a reader reads it; make a new "
            f"ParallelReader in this process")


class Pass:
    """The state a pass shares with its owner: settings, epoch, where the user stands, how it ended."""

    def __init__(self, res: Any, epoch: int, skip: int) -> None:
        self.res = res              # the ParallelReader's Resources (its cfg, stats)
        # (attributes, not properties reading res: they are read several times per task, and neither
        # changes once a pass can start)
        self.cfg = res.cfg          # the pipeline's settings (parrecio.pipeline.config.PipelineConfig)
        self.stats = res.stats      # the ParallelReader's counters (parrecio.pipeline.stats.Stats)
        self.epoch = epoch
        self.skip = skip            # groups of this shard's order already delivered (a resumed epoch)
        self.before = skip          # samples of the epoch handed out before it (fewer if some were skipped)
        self.cursor = Cursor(skip, skip)  # where the user stands (set by batching's generators)
        self.owner_pid = os.getpid()
        self.thread = threading.current_thread()  # the thread that iterates this pass
        self.closed = False
        self.aborted = False        # ended from outside (close(), a new pass) before the consumer was done
        self.superseded = False     # ended by a newer pass (which owns the reader's position from then on)
        self.completed = False      # the whole stream was delivered without an error
        # its last items are not all handed out, whatever ``completed`` says: a batch padding.py holds
        # back, or equal shards' copies
        self.owes_copies = False
        self.delivered = 0          # samples yielded in this pass
        self._samples0 = 0          # stats.samples, and cursor.handed, when the pass begins (begin_count)
        # batched: (first sample number, offsets, stream id) of the last chunks or groups, for where()
        self.recent: Optional[deque] = None
        self._handed0 = 0
        self.user_iter: Any = None  # a weak reference to the iterator the user got for it
        # begun by an adapter that took its first item before the user asked for anything (tf.data's
        # signature inference): until it hands that item out, the reader acts as if the pass had not begun
        self.peeked = False

    @property
    def opened_stream(self) -> bool:
        """Whether the pass opened a stream of its source (a Pipe-mode FIFO is then used up)."""
        raise NotImplementedError

    def track_where(self, batch_size: Optional[int]) -> None:
        """Keep where the last chunks' samples lie, enough of them for a batch of ``batch_size`` (a
        sample that cannot join its batch is only found once the batch is made)."""
        self.recent = deque(maxlen=batch_size + 2) if batch_size else None

    def where(self, seq: int) -> tuple:
        """``(byte offset of its first record, stream name)`` of sample ``seq``, if it was delivered lately."""
        for first, offsets, stream_id in reversed(self.recent or ()):
            if first <= seq < first + len(offsets):
                return int(offsets[seq - first]), self.source_of(stream_id)
        return None, None

    def source_of(self, stream_id: int) -> str:
        """The name of the pass's stream ``stream_id`` (the source's, for one not opened by then)."""
        raise NotImplementedError

    def begin_count(self) -> None:
        """The cursor stands where the pass begins: ``stats.samples`` counts from here what it hands out."""
        self._samples0, self._handed0 = self.stats.samples, self.cursor.handed

    def count_samples(self) -> None:
        """``stats.samples``: the samples handed out, as the cursor says (equal shards' copies included;
        not those decoded ahead, nor a short last batch that drop_last drops)."""
        self.stats.samples = self._samples0 + max(0, self.cursor.handed - self._handed0)

    def abort(self) -> None:
        """End the pass from outside (close(), a new pass): the consumer's iterator raises if resumed."""
        self.aborted = not self.closed
        self.shutdown()

    def shutdown(self) -> None:
        raise NotImplementedError

    # -- for telemetry() -----------------------------------------------------------------------------
    @property
    def reader_pid(self) -> int:
        """The process that reads the stream."""
        return os.getpid()

    def ring_in_use(self) -> int:
        """Bytes of the input ring holding groups received and not yet delivered."""
        return 0

    def chunks_waiting(self) -> int:
        """Chunks received from the reader and not yet delivered."""
        return 0
