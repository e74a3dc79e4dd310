"""What a ParallelReader owns between passes, and the one place that frees it.

::

    Resources(cfg, source)                       created with the reader (nothing started yet)
      .start()  -> lifeline pipe, input ring, output slots, decoder processes (workers >= 1)
      .run      -> the pass being iterated (a Run, or an InlineRun for workers=0), if any
      .close()  -> ends the pass, stops the processes, unlinks the shared memory, releases the source

Every attribute exists from ``__init__``.  A ``weakref.finalize`` on the ParallelReader calls
:meth:`Resources.close`, so everything is freed even when the user never calls ``close()``: the
finalizer holds this object, never the reader.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import multiprocessing
import os
import subprocess
import sys
import threading
from typing import Any, NamedTuple, Optional, Tuple

from ..errors import PipelineError
from .children import close_quietly, plain_picklable, register_for_fork, start_forkserver, start_janitor
from .config import PipelineConfig
from .passes import ended, forked_why
from .pool import WorkerPool
from .reader_handle import ReaderHandle
from .shm import SHM_DIR, Segment, free_bytes, new_prefix
from .slots import SlotPool
from .stats import Stats
from .worker import WorkerJob

__all__ = ["Resources", "Phase", "Lifeline", "fit_memory"]

log = logging.getLogger("parrecio")

MIN_FIT_RING = 1 << 20   # the smallest ring fit_memory() shrinks to
_MIB = 2 ** 20


def fit_memory(cfg: PipelineConfig, slots: int, min_slots: int,
               free: Optional[int]) -> Tuple[PipelineConfig, int, Optional[str]]:
    """The ring size and the number of output slots to allocate when ``free`` bytes of /dev/shm are
    there (None: unknown): as asked when they fit (the ring, as much again for one-off segments in
    flight, the slots), else a smaller ring (down to 1 MiB, or the ring asked for if smaller) and fewer
    slots (down to ``min_slots``, what one task and two batches in delivery need), with a warning that
    says so.  When not even that fits, a :class:`PipelineError` that says what was free, what the least
    is made of, and how large /dev/shm must be (allocating would only fail later, on the first segment
    that no longer fits, with figures that say nothing about the whole)."""
    slot = cfg.layout.nbytes if cfg.layout.has_fixed else 0
    need = 2 * cfg.ring_bytes + slots * slot
    if free is None or need <= free:
        return cfg, slots, None
    floor = min(MIN_FIT_RING, cfg.ring_bytes)  # (a ring asked smaller than 1 MiB is fitted as it is)
    ring = min(cfg.ring_bytes, max(floor, free // 4))
    fit = min(slots, (free - 2 * ring) // slot) if slot else slots
    if fit < min_slots:
        ring = min(cfg.ring_bytes, (free - min_slots * slot) // 2)
        fit = min_slots
    if ring < floor or 2 * ring + fit * slot > free:
        raise PipelineError(_too_little_shm(cfg, slot, min_slots, floor, free))
    if ring < cfg.ring_bytes:
        ring = max(ring // 4096 * 4096, floor)
    small = dataclasses.replace(cfg, ring_bytes=ring, oneoff_budget=ring, mapped_budget=4 * ring,
                                chunk_bytes=max(1 << 20, ring // 8))
    ring_said = (f"a {ring / _MIB:.1f} MiB input ring (ring_bytes={cfg.ring_bytes})" if ring < cfg.ring_bytes
                 else f"the {ring / _MIB:.2f} MiB input ring asked for")
    slots_said = ""  # (raw records, or values that travel pickled: no slots to speak of)
    if slot:
        slots_said = f" and {fit} output slots of {slot / _MIB:.1f} MiB"
        slots_said += f" (instead of {slots})" if fit != slots else ""
    said = (f"parrecio: {SHM_DIR} has {free / _MIB:.0f} MiB free, less than the {need / _MIB:.0f} MiB "
            f"asked for; using {ring_said}{slots_said}, "
            f"which may be slower: give it more shared memory (docker run --shm-size=1g)")
    return small, fit, said


def _too_little_shm(cfg: PipelineConfig, slot: int, min_slots: int, floor: int, free: int) -> str:
    """What :func:`fit_memory` says when not even the least it runs with fits in ``free`` bytes."""
    least = 2 * floor + min_slots * slot
    parts = f"a {floor / _MIB:.1f} MiB input ring and as much again for records larger than half of it"
    if slot:
        per_sample = slot / max(cfg.slot_size, 1)
        parts += (f", and {min_slots} output slots of {slot / _MIB:.1f} MiB ({cfg.slot_size} samples of "
                  f"{per_sample / _MIB:.2f} MiB of fixed-shape outputs each: one task of the workers' and "
                  f"two batches)")
    size = 1 << max(least - 1, 1).bit_length()  # (the next power of two: what --shm-size is given as)
    shm_size = f"{size >> 30}g" if size >= 1 << 30 else f"{max(size >> 20, 1)}m"
    fewer = "a smaller batch_size or smaller outputs, or " if slot else ""
    return (f"{SHM_DIR} has {free / _MIB:.1f} MiB free, and this reader needs at least {least / _MIB:.1f} MiB "
            f"there: {parts}. Give it more shared memory (e.g. docker run --shm-size={shm_size}), or ask "
            f"for less: {fewer}workers=0, which uses no shared memory")


class Phase(enum.Enum):
    """Where a ParallelReader's resources are in their life."""
    NEW = "new"            # nothing started
    STARTED = "started"    # what the passes share is up (nothing, for workers=0)
    CLOSING = "closing"    # close() was called, from any thread: the iterating thread leaves the pipeline
    CLOSED = "closed"      # everything freed (or, in a forked child, forgotten)


_NEW, _CLOSING, _CLOSED = Phase.NEW, Phase.CLOSING, Phase.CLOSED  # (an Enum member's lookup costs ~60 ns;
#                                                               closing is checked once per item)


class Lifeline(NamedTuple):
    """A pipe whose write end only this process holds: every child sees EOF on ``r`` when it dies."""
    r: Any
    w: Any


class Resources:
    """Processes, shared memory and the source of one ParallelReader.

    ``lock`` is held by the thread that iterates while it is inside the pipeline (never while the user's
    loop body runs), and by :meth:`close` and a new pass: the pipeline is driven by one thread at a time."""

    def __init__(self) -> None:
        # cfg and source are set by the ParallelReader right after: the finalizer must exist before the
        # source is resolved (resolving "-" dups stdin; a file object may get a pump thread)
        self.cfg: Optional[PipelineConfig] = None
        self.source: Any = None                   # released by close()
        self.stats = Stats()
        self.prefix = ""                          # shared-memory names of this reader start with it
        self.lifeline: Optional[Lifeline] = None
        self.janitor: Any = None                  # children.start_janitor's process, reaped at close
        self.ring: Optional[Segment] = None       # the input ring (its .mem: the consumer's view of it)
        self.slots: Optional[SlotPool] = None     # output slots
        self.pool: Optional[WorkerPool] = None    # decoder processes (None: workers=0, or nothing to decode)
        self.spare: Optional[ReaderHandle] = None  # the next pass's reader process, started ahead
        self._spare_ok: Optional[bool] = None     # whether the source can be sent to a spare (see prepare_spare)
        self.run: Any = None                      # the pass being iterated
        self.pinned: Any = None                   # views.Pinned: chunks an ended pass's views still hold
        self.phase = Phase.NEW
        self._keep_source = False                 # (unstart: a close that keeps the source)
        self._released = False                    # the source was released (once)
        self.close_asked = False                  # close() was called (from any thread)
        self.closed_why = ""                      # why a reader was closed by itself (said when used again)
        self.lock = threading.RLock()
        self.owner_pid = os.getpid()
        register_for_fork(self)

    @property
    def ctx(self) -> Any:
        """The multiprocessing context of ``cfg.start_method``."""
        return multiprocessing.get_context(self.cfg.start_method)

    @property
    def started(self) -> bool:
        return self.phase is not _NEW

    @property
    def closing(self) -> bool:
        """Whether close() was called (the pipeline is left to it)."""
        phase = self.phase
        return phase is _CLOSING or phase is _CLOSED

    @property
    def closed(self) -> bool:
        return self.phase is _CLOSED

    def warm_up(self, strict: bool = True) -> None:
        """Boot the fork server now, when the children will come from one: its start-up (an interpreter
        importing numpy, Pillow and the children's modules) is most of the time to a first batch, and
        overlaps what happens before the children are asked for (see
        :func:`~parrecio.pipeline.children.start_forkserver`).  Cheap once it runs.  Not ``strict``
        (at construction, where it is only ahead of time): a failure is left to the first pass, which
        tries again and reports it."""
        cfg = self.cfg
        if cfg is None or not cfg.workers or cfg.start_method != "forkserver":
            return
        try:
            start_forkserver([*cfg.decoders, self.source])
        except Exception:
            if strict:
                raise
            log.debug("parrecio: the fork server did not start ahead of the first pass", exc_info=True)

    def start(self) -> None:
        """Start what the passes share: nothing for ``workers=0``; else the lifeline, the ring, the
        output slots and (when some field is decoded) the decoder processes.  On failure (a Ctrl-C
        included) everything started is freed again and the next pass starts anew (:meth:`unstart`):
        nothing of the source was read yet."""
        cfg = self.cfg
        self.phase = Phase.STARTED
        if cfg.workers == 0:
            return
        ctx = self.ctx
        self.prefix = new_prefix()
        try:
            self.warm_up()  # (again: when it was not up yet, it boots while the memory below is allocated)
            self.lifeline = Lifeline(*ctx.Pipe(duplex=False))
            # before any shared memory exists (see start_janitor; a kernel's shutdown ends its children)
            self.janitor = start_janitor(self.prefix, self.lifeline.r.fileno(), detached="ipykernel" in sys.modules)
            initial = least = 0
            if cfg.layout.has_fixed:
                # Enough slots for the tasks in flight (at most `prefetch` per worker) and two being
                # delivered; the pool grows later only when the user holds every slot.
                task = cfg.reader_chunk_groups() or cfg.slot_size
                least = math.ceil(task / cfg.slot_size) + 3  # one task, unaligned, and two batches
                # (at least that many up front: with long tasks of small slots, e.g. chunk_groups=3 and
                # batch_size=1, the tasks in flight plus two are fewer, and the pool would grow mid-pass)
                initial = max(math.ceil(cfg.workers * cfg.prefetch * task / cfg.slot_size) + 2, least)
            cfg, initial, warning = fit_memory(cfg, initial, least, free_bytes())  # (initial >= least)
            if warning:
                log.warning(warning)
                self.cfg = cfg
            self.ring = Segment.create(self.prefix + "ring", cfg.ring_bytes,
                                       f"the input ring (ring_bytes={cfg.ring_bytes})")
            self.slots = SlotPool(cfg.layout, self.prefix, initial)
            if not all(cfg.passthrough):
                # started by start_workers(), after the first pass's reader process
                self.pool = WorkerPool(ctx, cfg, WorkerJob(self.ring.name, self.prefix), self.lifeline.r)
            if self.close_asked:  # close() re-entered from a signal handler meanwhile: free what was made since
                raise ended(self.owner_pid)
        except BaseException:
            self.unstart()
            raise

    def start_workers(self) -> None:
        """Start the decoder processes, once (a no-op after that, and without any).  Called after the
        first pass's reader process started: its first chunk is then on its way while they start
        (the fork server starts one process at a time).  On failure (a Ctrl-C included) everything
        started is freed (:meth:`unstart`)."""
        if self.pool is None or self.pool.started:
            return
        try:
            self.pool.start()
        except BaseException:
            self.unstart()  # (ParallelReader._start_failed closes it where the source cannot be read again)
            raise

    def unstart(self) -> None:
        """Free everything :meth:`start` (and a first pass) started, keep the source and go back to
        NEW: a start that failed, or that a Ctrl-C cut short, must not leave the reader closed for good
        (a notebook's user interrupts the first batch and runs the cell again).  When close() was asked
        for meanwhile, it is a close()."""
        if self.closing or self.close_asked:
            self._close()
            return
        self._keep_source = True
        try:
            self._close()
        finally:
            self.prefix = ""
            self.lifeline = self.janitor = self.ring = self.slots = self.pool = self.spare = None
            self.run = self.pinned = None
            self.phase = Phase.NEW
            self._keep_source = False
            if self.close_asked:  # close() from another thread meanwhile: it is closed after all
                self._close()

    def prepare_spare(self, ended: Optional[ReaderHandle] = None) -> bool:
        """Have the next pass's reader process ready now, while this pass's last chunks are delivered:
        ``ended``, this pass's reader if its pass ended cleanly (it waits for its next job: kept, it
        costs nothing), or else a new process started now (a *spare*): its start -- the fork server's
        fork, the child's set-up, ~5-10 ms, ~0.7 ms of this process's CPU -- is then off the next pass's
        path to its first chunk, which matters for short passes (raw records of a file in the page
        cache, epochs of a few thousand samples).  It waits for its job (:meth:`take_spare`); unused,
        it is stopped by :meth:`close`.  Only for sources that travel by plain pickle (files,
        directories, Pipe-mode channels: no descriptor to hand over) and can serve another epoch; a
        failure to start one is left to the next pass, which starts its reader as usual.

        Returns True when ``ended`` was kept: its pass must not stop it."""
        if self.spare is not None or self.closing or not self.serves_on():
            return False
        if ended is not None and ended.is_alive():
            self.spare = ended
            return True
        try:
            self.spare = ReaderHandle(self.ctx, self.cfg, None, self.lifeline.r, self.prefix)
        except Exception:
            log.debug("parrecio: no spare reader process", exc_info=True)
        return False

    def serves_on(self) -> bool:
        """Whether a pass's reader that ends cleanly is to wait for the next pass's job
        (``ReaderJob.serve_on``): when the source can be sent to a waiting process."""
        return self.lifeline is not None and self._spare_allowed()

    def _spare_allowed(self) -> bool:
        if self._spare_ok is None:
            source = self.source
            epochs = getattr(source, "epochs_supported", 1)
            ok = source is not None and (epochs is None or epochs > 1)
            if ok:
                ok = plain_picklable(source)
            self._spare_ok = bool(ok)
        return self._spare_ok

    def take_spare(self, job: Any) -> Optional[ReaderHandle]:
        """The spare reader process, given ``job``; None when there is none (or it died)."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if spare.begin(job):
            return spare
        spare.stop()
        return None

    def close(self) -> None:
        """End the pass, stop every process, remove the shared memory, release the source.  Idempotent;
        callable from any thread; returns within a few seconds whatever the other threads do."""
        if os.getpid() != self.owner_pid:
            return
        self.close_asked = True  # (an unstart() in another thread, which looks CLOSED meanwhile, closes)
        if self.closed and not self._keep_source:
            return
        self.phase = Phase.CLOSING
        # Wait for the iterating thread to step out of the pipeline (it does within poll_interval);
        # past that, clean up anyway: close() must return whatever the other threads do.
        locked = self.lock.acquire(timeout=10.0)
        try:
            self._close()
        finally:
            if locked:
                self.lock.release()

    def _close(self) -> None:
        # Every step is idempotent and runs again on a closed reader: a close() re-entered from a signal
        # handler in the middle of start() closed what was there; start() then went on to allocate the
        # output slots, failed on the closed lifeline, and its unstart() found the reader closed already
        # (the slots stayed in /dev/shm for good).
        self.phase = Phase.CLOSED
        # Every step runs, whatever the one before it raised: Ctrl-C in the middle of stopping the
        # workers must not leave the ring and the slots in /dev/shm for good (a later close() finds
        # the reader closed already).  The first error is raised at the end.
        first: Optional[BaseException] = None
        for step in (self._close_run, self._unlink_memory, self._close_processes, self._close_memory,
                     self._close_rest):
            try:
                step()
            except BaseException as exc:
                first = first or exc
        if first is not None:
            raise first

    def _close_run(self) -> None:
        run, self.run = self.run, None
        self.pinned = None  # (the ring is unlinked below; its mapping lives on under the views)
        if run is not None:
            run.abort()

    def _unlink_memory(self) -> None:
        """Remove the shared memory's names before the processes stop (mappings stay valid): until they
        have, a death of this process is swept by them; after, nothing would sweep (a SIGKILL while the
        workers were being joined left 250-380 MB in /dev/shm)."""
        try:
            if self.ring is not None:
                self.ring.unlink()
        finally:
            try:
                if self.slots is not None:
                    self.slots.unlink()
            finally:
                if self.pool is not None:
                    self.pool.unlink()

    def _close_processes(self) -> None:
        spare, self.spare = self.spare, None
        try:
            if spare is not None:
                spare.stop()
        finally:
            if self.pool is not None:
                self.pool.stop()

    def _close_memory(self) -> None:
        try:
            if self.ring is not None:
                self.ring.unlink()
                self.ring.close()
        finally:
            if self.slots is not None:
                self.slots.close()

    def _close_rest(self) -> None:
        if self.lifeline is not None:  # (children still running, if a step was cut short, exit on its end)
            close_quietly(self.lifeline.w, self.lifeline.r)
        janitor, self.janitor = self.janitor, None
        try:
            if janitor is not None:  # it ends on the lifeline's end, finding nothing to remove
                try:
                    janitor.wait(2)
                except subprocess.TimeoutExpired:  # (another holder of the lifeline: not to wait for)
                    janitor.kill()
                    janitor.wait(2)
        finally:
            if self.source is not None and not self._keep_source and not self._released:
                self._released = True
                self.source.release()

    def forget_after_fork(self) -> None:
        """In the child of an ``os.fork()`` of the consumer: this process owns none of the pipeline.
        Close its copies of the consumer's pipe ends (the lifeline's write end above all: held here, it
        would keep the children of a killed parent alive) and forget the processes.  The lifeline's read
        end stays open: a child started with the ``fork`` method is such a child too, and watches it."""
        self.phase = Phase.CLOSED
        self.closed_why = forked_why(self.owner_pid)
        if self.janitor is not None:  # the parent's child: never waited for here (and no ResourceWarning
            self.janitor.returncode = 0  # from this copy's Popen.__del__ that it is "still running")
            self.janitor = None
        if self.run is not None:
            self.run.forget_after_fork()
        if self.spare is not None:
            self.spare.forget_after_fork()
            self.spare = None
        if self.pool is not None:
            self.pool.forget_after_fork()
        if self.lifeline is not None:
            close_quietly(self.lifeline.w)
