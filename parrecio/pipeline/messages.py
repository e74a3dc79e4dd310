"""Everything that crosses a process boundary: small typed messages, each naming its sequence numbers.

Channels (all ``multiprocessing`` pipes, one writer and one reader each)::

    reader process --data--> consumer     StreamStart, Chunk, Waiting, ReaderEnd
    consumer --ctrl--> reader process     Release, Stop
    consumer --task--> worker i           Task, Stop
    worker i --result--> consumer         TaskDone, in a frame of its own (parrecio.pipeline.wire)

Payload bytes never travel in these messages: a ``Chunk`` carries the ring offsets and lengths of many
groups as packed ``array('q')`` bytes, so one message of a few hundred bytes describes a whole chunk.
Errors travel as :class:`RemoteError` data and are raised in the consumer at their sequence number.
"""

from __future__ import annotations

import pickle
import traceback
from array import array
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Tuple

from ..errors import DecodeError, ParrecioError, field_error, said

__all__ = ["StreamStart", "Chunk", "Waiting", "ReaderEnd", "Release", "Stop", "Begun", "Task", "TaskDone",
           "RemoteError"]


@dataclass
class StreamStart:
    """The reader opened stream number ``stream_id`` (a file, a FIFO, stdin) called ``name``; ``mapped``:
    the segment name of the file it maps (:mod:`parrecio.pipeline.mapped`), None for a stream."""
    stream_id: int
    name: str
    mapped: Optional[str] = None


class Place(NamedTuple):
    """Where a chunk's payloads lie: ``kind`` RING (the input ring), FILE (a regular file read in place;
    ``name`` its key, :mod:`parrecio.pipeline.mapped`) or ONEOFF (a shared-memory segment of its own,
    ``name``, for a group too big for the ring: removed by the consumer after delivery)."""
    kind: int
    name: str = ""

    @property
    def is_file(self) -> bool:
        return self.kind == FILE

    @property
    def is_oneoff(self) -> bool:
        return self.kind == ONEOFF


RING, FILE, ONEOFF = range(3)
IN_RING = Place(RING)


@dataclass
class Chunk:
    """Groups ``first_seq .. first_seq + n - 1``, all from stream ``stream_id``.

    ``ring_offs``/``lens`` are ``n * nfields`` int64 (group-major) byte offsets into the payloads'
    :class:`Place` and payload lengths; ``stream_offs`` the stream byte offset of each group's first record.  After the
    chunk is delivered the ring may be released up to ``ring_end`` (a monotonic byte position).  ``ring_top``
    (>= ``ring_end``, or -1: the same) is the ring position after every byte placed by then: a group copied
    into the ring (multipart, held) lies above the window being framed, past ``ring_end``, and a later pass's
    reader must start above it while views of the chunk live.
    """
    first_seq: int
    n: int
    stream_id: int
    ring_offs: array
    lens: array
    stream_offs: array
    ring_end: int
    place: Place = IN_RING
    ring_top: int = -1

    def __reduce__(self):
        # One per task, unpickled by the consumer on a cold wake-up: a plain tuple with the arrays as
        # bytes (as Task), not a dataclass's generic reduce.
        return _chunk, (self.first_seq, self.n, self.stream_id, self.ring_offs.tobytes(), self.lens.tobytes(),
                        self.stream_offs.tobytes(), self.ring_end, self.place.kind, self.place.name, self.ring_top)


def _q(data: bytes) -> array:
    a = array("q")
    a.frombytes(data)
    return a


def _chunk(first_seq: int, n: int, stream_id: int, offs: bytes, lens: bytes, stream_offs: bytes, ring_end: int,
           kind: int, name: str, ring_top: int = -1) -> Chunk:
    return Chunk(first_seq, n, stream_id, _q(offs), _q(lens), _q(stream_offs), ring_end, Place(kind, name), ring_top)


@dataclass
class Waiting:
    """The reader process waits for space (ring, one-off or mapped budget) and has handled ``seen``
    ``Release`` messages: sent when a wait starts and after each release that did not end it, only when
    its job asks (``ReaderJob.report_waits``: views are handed out, and may pin the ring)."""
    seen: int


@dataclass
class ReaderEnd:
    """The reader is done: ``n_groups`` groups were sent.  ``error`` (a ParrecioError, or a RemoteError
    for anything else) is raised at sequence number ``n_groups``.  ``stats`` are the reader's counters."""
    n_groups: int
    stats: dict
    error: Optional[BaseException] = None


@dataclass
class Release:
    """The consumer delivered everything up to ring position ``pos``: the reader may overwrite it.
    ``oneoff_bytes``: the size of a one-off segment it delivered and removed (0 for none)."""
    pos: int
    oneoff_bytes: int = 0
    mapped_bytes: int = 0   # payload bytes of a delivered chunk read in place from a mapped file

    def __reduce__(self):  # one per chunk, pickled by the consumer: a plain tuple
        return Release, (self.pos, self.oneoff_bytes, self.mapped_bytes)


@dataclass
class Stop:
    """Stop now (end of run, early break, close)."""


@dataclass
class Begun:
    """A waiting reader process (a spare, or the last pass's reader kept) took its job, before it reads
    anything: one that dies before this message read nothing of the pass, and another can take its job."""


@dataclass
class Task:
    """Decode the groups ``[start, start + n)`` of chunk ``chunk_seq`` (its ``first_seq``).

    ``dest`` lists where fixed-shape results go, as runs ``(slot_segment, group_index, slot_index, count)``:
    groups ``group_index .. +count`` of this task go to positions ``slot_index ..`` of that slot.
    """
    task_id: int
    chunk_seq: int
    start: int
    n: int
    place: Place
    ring_offs: array
    lens: array
    dest: List[Tuple[str, int, int, int]] = field(default_factory=list)
    isolated: bool = False  # a re-run after a crash: its worker gets no other task meanwhile
    split: bool = False     # pickle each value on its own (a re-run after a result that did not unpickle)
    epoch: int = 0          # the pass's epoch: with the group's sequence number, the key of random decoders
    pair: int = -1          # a whole chunk's number among its pass's pairs (parrecio.pipeline.pairing), or -1
    retired: Tuple[str, ...] = ()  # output slots the pool gave back since this worker's last task: unmap them

    def __reduce__(self):
        # The consumer pickles one Task per chunk: as a plain tuple with the arrays as bytes this takes half
        # the time of a dataclass's generic reduce (3.4 against 6.9 us warm; several times that on a
        # wake-up with cold caches, where it was ~1/10 of the consumer's cost per task).
        return _task, (self.task_id, self.chunk_seq, self.start, self.n, self.place.kind, self.place.name,
                       self.ring_offs.tobytes(), self.lens.tobytes(), self.dest, self.isolated, self.split,
                       self.epoch, self.pair, self.retired)


def _task(task_id: int, chunk_seq: int, start: int, n: int, kind: int, name: str, offs: bytes, lens: bytes,
          dest: list, isolated: bool, split: bool, epoch: int, pair: int, retired: Tuple[str, ...] = ()) -> Task:
    return Task(task_id, chunk_seq, start, n, Place(kind, name), _q(offs), _q(lens), dest, isolated, split, epoch,
                pair, retired)


@dataclass
class TaskDone:
    """Results of task ``task_id``: ``values[j]`` is the tuple of ragged field values of group ``j``
    (``None`` at fixed-shape fields), or a :class:`RemoteError` if it failed.  ``cpu`` is seconds."""
    task_id: int
    values: list
    cpu: float
    pid: int


class RemoteError:
    """An exception raised in another process, as data.

    The original is kept when it pickles; otherwise its type name and message.  ``traceback`` is the text
    of the remote traceback, chained as the cause when the consumer raises it.
    """

    __slots__ = ("exc_bytes", "type_name", "message", "traceback", "field", "note")

    def __init__(self, exc: BaseException, field: int = -1, note: str = "") -> None:
        self.field = field  # which field of the group failed, -1 when not field-specific
        self.note = note    # appended to the reason: what the payload is (parrecio.pipeline.mismatch)
        self.type_name = type(exc).__name__
        self.message = said(exc)
        try:
            self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        except Exception:  # (its str() raises: the frames without the last line)
            self.traceback = "".join(traceback.format_tb(exc.__traceback__)) + f"{self.type_name}: {self.message}\n"
        try:
            self.exc_bytes: Optional[bytes] = pickle.dumps(exc)
            if not isinstance(pickle.loads(self.exc_bytes), BaseException):  # (a __reduce__ of its own)
                self.exc_bytes = None
        except Exception:
            self.exc_bytes = None

    def __getstate__(self):
        return (self.exc_bytes, self.type_name, self.message, self.traceback, self.field, self.note)

    def __setstate__(self, state):
        self.exc_bytes, self.type_name, self.message, self.traceback, self.field, self.note = state

    def original(self) -> Optional[BaseException]:
        """The remote exception rebuilt here, with the remote traceback as its cause, or None."""
        if self.exc_bytes is None:
            return None
        try:
            exc = pickle.loads(self.exc_bytes)
            exc.__cause__ = _RemoteTraceback(self.traceback)
        except Exception:  # (it loaded in the decoder process; here something differs)
            return None
        return exc

    def as_decode_error(self, what: str, index: int, offset: Optional[int],
                        source: Optional[str]) -> ParrecioError:
        """The error to raise for the sample ``index`` at byte ``offset`` of stream ``source``.

        A DecodeError keeps its reason, prefixed with ``what`` (which field failed); any other exception
        becomes a DecodeError whose cause is the original exception.
        """
        orig = self.original()
        if isinstance(orig, DecodeError):
            return field_error(what, orig, index, offset, source, self.note)
        err = DecodeError(f"{what}: {self.type_name}: {self.message}{self.note}", index=index, offset=offset,
                          source=source)
        err.__cause__ = orig if orig is not None else _RemoteTraceback(self.traceback)
        return err


class _RemoteTraceback(Exception):
    """Carries the text of a traceback from another process (as concurrent.futures does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb
