"""A decoder process: payloads from the input ring -> decoded values -> output slots / result frames.

::

    consumer --Task--> [ worker ] --result frame--> consumer          (parrecio.pipeline.wire)
                          |  reads payloads: input ring (memoryview slices, no copy)
                          |  writes fixed-shape results: output slots (numpy views of shared memory)

Each worker has its own task and result pipes, so a worker killed in the middle of a message breaks
nothing shared (a shared queue's lock would be left held).  It leaves when told to stop, when its
pipes close, or when the consumer dies (the lifeline pipe reports EOF): then it removes the run's
shared memory, since the consumer cannot (see :mod:`parrecio.pipeline.children`).

Anything a decoder raises -- an ordinary exception, ``KeyboardInterrupt``, ``SystemExit`` -- is data: a
:class:`RemoteError` raised in the consumer at that sample's position.  So is a value that cannot be
pickled back to the consumer.
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import os
import pickle
import random
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Dict, List, Optional

import numpy as np

from ..decoders.sniff import sniff
from .config import PipelineConfig
from .decode import DecodePlan, FieldFailed
from .mapped import MappedFiles
from .messages import RemoteError, Stop, Task, TaskDone
from .mismatch import field_note
from .pairing import Ringer
from .shipping import unship
from .shm import Segment
from .slots import SlotLayout
from .wire import pack_column, send_result

__all__ = ["WorkerJob", "worker_main", "seed_worker", "CANNOT_LOAD", "TAKEN"]

CANNOT_LOAD = -1  # the task id of the one frame a worker sends when its decoders do not load
TAKEN = b""  # the body of the frame that says a worker took an isolated task (a result's is never empty)


@dataclass(frozen=True)
class WorkerJob:
    """What a decoder process works on, beside the settings (:class:`PipelineConfig`, sent once at
    start: decoders are pickled there, never per task)."""
    ring_name: str              # the input ring's shared-memory segment
    prefix: str                 # shm name prefix of this reader, swept if the consumer dies
    pairs: str = ""             # the pairing board's segment (parrecio.pipeline.pairing), "" without one
    progress: str = ""          # the progress board's segment (see WorkerPool), "" without one
    slot: int = -1              # this worker's entry on it: its index in the pool


def seed_worker(seed: int, generation: int) -> None:
    """Seed ``random`` and ``numpy.random`` for the ``generation``-th decoder process ever started by a
    reader with base ``seed``: streams from ``SeedSequence(seed).spawn``, so a replacement never replays
    the stream of the worker it replaces, and base seeds ``s`` and ``s + 1`` share no stream."""
    ss = np.random.SeedSequence(seed, spawn_key=(generation,))  # == SeedSequence(seed).spawn(g + 1)[g]
    # one child sequence each: the same 256 bits given to both (both are MT19937, seeded by init_by_array)
    # started them in one state, and random.random() == np.random.random() at every draw
    for_random, for_numpy = ss.spawn(2)
    random.seed(int.from_bytes(for_random.generate_state(4, np.uint64).tobytes(), "little"))
    np.random.seed(for_numpy.generate_state(8, np.uint32))


def worker_main(cfg: PipelineConfig, job: WorkerJob, generation: int, task_conn, result_conn,
                lifeline, bell: Any = None) -> None:
    """Entry point of a decoder process (``generation`` numbers it among all workers of the reader;
    ``bell``: the write end of the pairing bell, with ``job.pairs``)."""
    seed_worker(cfg.seed, generation)
    try:
        cfg = dataclasses.replace(cfg, decoders=unship(cfg.decoders))
    except BaseException as exc:  # say why once, instead of dying at start again and again
        why = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        send_result(result_conn.fileno(), TaskDone(CANNOT_LOAD, None, 0.0, os.getpid()),
                    pickle.dumps(why), False)
        return
    # whatever a decoder raises -- KeyboardInterrupt, SystemExit, GeneratorExit, a BaseException of its own --
    # is a decode error of its sample (see above), never the end of this process
    plan = DecodePlan.of(cfg, copy_passthrough=False, catch=(BaseException,), stable=True)
    try:
        ring = Segment.attach(job.ring_name)
        ringer = Ringer(job.pairs, bell) if job.pairs else None
        board = Segment.attach(job.progress) if job.progress else None
    except FileNotFoundError:  # close() removed the names while this process was starting: nothing to do
        return
    # where this worker stands, for the consumer to read if it dies: [task id, group of the task (-1 before
    # the first, the task's n once all are decoded)] -- the group to blame, not every group of its tasks
    progress = None if board is None else memoryview(board.buf).cast("q")[2 * job.slot:2 * job.slot + 2]
    slots: Dict[str, tuple] = {}
    mapped = MappedFiles()
    result_fd = result_conn.fileno()
    if ringer is not None:
        os.set_blocking(result_fd, False)  # a full pipe rings the bell (send_result), then waits
    try:
        while True:
            ready = wait([task_conn, lifeline], cfg.poll_interval)
            if lifeline in ready:  # the consumer is gone: child_entry cleans up after it
                return
            if task_conn not in ready:
                continue
            msg = task_conn.recv()
            if isinstance(msg, Stop):
                return
            if msg.isolated:  # a re-run judging a poison record: say that its group is being decoded now
                send_result(result_fd, TaskDone(msg.task_id, None, 0.0, os.getpid()), TAKEN, False,
                            ringer.ring if ringer is not None else None)
            for name in msg.retired:  # output slots the consumer gave back: their memory goes with our mapping
                entry = slots.pop(name, None)
                if entry is not None:
                    seg, entry = entry[0], None  # (the arrays over it first)
                    seg.close()
            done = _run_task(cfg, job, msg, ring, slots, mapped, plan, progress)
            body, split = _pickled(done, msg.split, cfg.decoders)
            send_result(result_fd, done, body, split, ringer.ring if ringer is not None else None)
            if ringer is not None and msg.pair >= 0:
                ringer.done(msg.pair)
    except (EOFError, OSError):
        # Our pipes broke: the consumer closed them, or died (then its lifeline says so soon after, and
        # child_entry, seeing it, cleans up after it).
        lifeline.poll(cfg.poll_interval)
    finally:
        for seg, _ in slots.values():
            seg.close()
        mapped.close()
        ring.close()
        if ringer is not None:
            ringer.close()
        if progress is not None:
            progress.release()  # (before the segment's close: a view still exported would keep it mapped)
        if board is not None:
            board.close()


_NO_OUTS: List[Any] = []


def _run_task(cfg: PipelineConfig, job: WorkerJob, task: Task, ring: Segment, slots: Dict[str, tuple],
              mapped: MappedFiles, plan: DecodePlan, progress: Optional[memoryview] = None) -> TaskDone:
    """Decode the task's groups.  The values that travel back form columns (one list per field whose
    values are not all in output slots), and the failures a ``{group: RemoteError}`` dict.  ``progress``:
    this worker's entry on the progress board, kept current (the task, then each group as it starts)."""
    if progress is not None:
        progress[1] = -1  # (first: a death between the two writes blames no group of either task)
        progress[0] = task.task_id
    cpu0 = time.process_time()
    nf, n = len(cfg.decoders), task.n
    columns: List[Optional[list]] = [[None] * n if cfg.travels[f] else None for f in range(nf)]
    errors: Dict[int, RemoteError] = {}
    try:
        place = task.place
        if place.is_file:
            seg, buf = ring, mapped.get(place.name)  # cached: the mapping stays (seg is not closed)
        elif place.is_oneoff:
            seg = Segment.attach(place.name)
            buf = seg.buf
        else:
            seg, buf = ring, ring.buf
    except Exception as exc:  # the file changed under us, or cannot be opened again: each group fails
        err = RemoteError(exc)
        return TaskDone(task.task_id, (columns, {j: err for j in range(n)}), time.process_time() - cpu0,
                        os.getpid())
    mem = memoryview(buf).toreadonly()
    dests = _expand_dest(task, cfg.layout, slots)
    offs, lens = task.ring_offs, task.lens
    travel = [f for f in range(nf) if columns[f] is not None]
    seq0 = task.chunk_seq + task.start  # the sequence number of the task's first group
    decode, keyed, key = plan.decode, plan.keyed, None
    try:
        for j in range(n):
            if nf == 1:  # (tiny records: every 0.1 us counts here)
                payloads = [mem[offs[j]:offs[j] + lens[j]]]
            else:
                base = j * nf
                payloads = []
                for i in range(base, base + nf):  # (a loop, not a comprehension: no frame of its own)
                    payloads.append(mem[offs[i]:offs[i] + lens[i]])
            if keyed:  # the sample's key: its fields draw the same crop whoever decodes it, on every re-run
                key = plan.key(task.epoch, seq0 + j)
            if progress is not None:
                progress[1] = j
            try:
                vals = decode(payloads, dests[j] or _NO_OUTS, key)
            except FieldFailed as exc:
                # A decode error is data: it is raised at its sequence number.  KeyboardInterrupt and
                # SystemExit raised *by a decoder* are its errors too, not requests to end this process.
                errors[j] = RemoteError(exc.error, exc.field, _note(cfg, exc.error, mem, offs, lens, n, j, exc.field))
                for p in payloads:  # the error's traceback holds them: let go of the ring now
                    p.release()
                continue
            # (on success the slices go with ``payloads``: decoders were given views of their own)
            for f in travel:
                columns[f][j] = vals[f]
    finally:
        mem.release()
        if seg is not ring:
            seg.close()
    if progress is not None:
        progress[1] = n  # every group decoded: a death from here on (sending the result) blames none
    if place.is_file:
        try:  # checked again: a writer changes the file's time before its bytes, so values that any changed
            mapped.check(place.name)()  # bytes went into are never sent as good ones
        except Exception as exc:
            err = RemoteError(exc)
            columns = [None if c is None else [None] * n for c in columns]
            errors = {j: err for j in range(n)}
    return TaskDone(task.task_id, (columns, errors), time.process_time() - cpu0, os.getpid())


def _note(cfg: PipelineConfig, exc: BaseException, mem: memoryview, offs, lens, n: int, j: int, f: int) -> str:
    """What field ``f`` of group ``j`` was given, and what the task's records nearby (up to three groups
    either side, successive unless the read is shuffled) suggest (:func:`parrecio.pipeline.mismatch.field_note`)."""
    nf = len(cfg.decoders)
    lo, hi = (max(0, j - 3), min(n, j + 4)) if not cfg.shuffle else (j, j + 1)
    records = [mem[offs[i]:offs[i] + lens[i]] for i in range(lo * nf, hi * nf)]
    try:
        group = records[(j - lo) * nf:(j - lo + 1) * nf]
        context = [sniff(r) for r in records] if hi - lo > 1 else None
        return field_note(str(exc), cfg.decoders, group, f, context, group_at=(j - lo) * nf)
    except Exception:  # a hint must never hide the error itself
        return ""
    finally:
        for r in records:
            r.release()


# Json() returns values up to orjson's limit, 1024 levels deep; pickling one takes two recursion levels a
# level, past the interpreter's 1000 (the consumer's unpickling does not recurse; workers=0 delivers them)
_DEEPEST_VALUE = 1024


def view_of(data: bytes, fmt: str, shape: tuple) -> memoryview:
    """A read-only memoryview of ``data`` as ``fmt`` and ``shape``: a decoder's memoryview value, come back."""
    view = memoryview(data)
    try:
        return view if (fmt, shape) == ("B", (len(data),)) else view.cast(fmt, shape)
    except (TypeError, ValueError):  # (a format cast() does not take: the bytes, as 'B')
        return view


class _Reducers:
    """The results pickler's dispatch table: copyreg's, and a memoryview -- a decoder that returns its
    payload, a slice of it, a dict that holds it -- as a copy of its bytes, which comes back as a read-only
    memoryview of them: what ``workers=0`` gives (a view of a copy of the payload), where pickle refused
    ("cannot pickle 'memoryview' object": a DecodeError per sample)."""

    def __getitem__(self, cls: type) -> Any:
        if cls is memoryview:
            return _reduce_view
        return copyreg.dispatch_table[cls]


def _reduce_view(view: memoryview) -> tuple:
    return view_of, (view.tobytes(), view.format, tuple(view.shape or ()))


_REDUCERS = _Reducers()


def _dumps(value: Any) -> bytes:
    """``pickle.dumps`` (a memoryview as its bytes: :class:`_Reducers`), with the recursion limit raised
    for a value as deep as a decoder may return."""
    try:
        return _dump(value)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 2 * _DEEPEST_VALUE + 100)  # 100: the frames below this one
        try:
            return _dump(value)
        finally:
            sys.setrecursionlimit(limit)


def _dump(value: Any) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _REDUCERS  # type: ignore[assignment]
    pickler.dump(value)
    return buf.getvalue()


def _pickled(done: TaskDone, split: bool, decoders: List[Any]) -> tuple:
    """``(body, split)``: the columns (arrays packed, see :func:`pack_column`) and errors pickled as one
    object, or -- when asked to (``split``), or when a value cannot be pickled -- each value pickled on
    its own, a value that cannot be replaced by the error that says so."""
    columns, errors = done.values
    if not split:
        try:
            return _dumps(([pack_column(c) for c in columns], errors)), False
        except Exception:
            pass  # some value does not pickle: find it
    out: List[Optional[list]] = [None if c is None else [None] * len(c) for c in columns]
    errors = dict(errors)
    for f, col in enumerate(columns):
        for j, v in enumerate(col or ()):
            if j in errors:
                continue
            try:
                out[f][j] = _dumps(v)
            except Exception as exc:
                err = TypeError(f"the value decoded by {decoders[f]!r} cannot be pickled to travel back "
                                f"to the consumer: {type(exc).__name__}: {exc}")
                errors[j] = RemoteError(err, f)
    return pickle.dumps((out, errors), pickle.HIGHEST_PROTOCOL), True


def _expand_dest(task: Task, layout: SlotLayout, slots: Dict[str, tuple]) -> List[Optional[list]]:
    """Per group of the task, the ``out`` arguments of its fields (None where nothing is fixed)."""
    dests: List[Optional[list]] = [None] * task.n
    for name, g0, i0, count in task.dest:
        entry = slots.get(name)
        if entry is None:  # a slot this worker has not seen yet (the pool grew): map it once
            seg = Segment.attach(name)
            entry = slots[name] = (seg, layout.arrays(seg.buf))
        arrays = entry[1]
        for k in range(count):
            dests[g0 + k] = layout.outs(arrays, i0 + k)
    return dests
