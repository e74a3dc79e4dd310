"""ParallelReader: the public face of the pipeline.

::

    ParallelReader(channel, fields=..., workers=W)
      |  resolve(channel) -> Source                       (parrecio.sources)
      |  first iteration: ring + output slots in shared memory, W decoder processes (kept across epochs)
      |  each iteration: a Run (one reader process for that epoch)  (parrecio.pipeline.run)
      v
    samples or batches, in stream order                   (parrecio.pipeline.batching)

Every setting is checked once and frozen in a :class:`~parrecio.pipeline.config.PipelineConfig`; the
long-lived parts (decoder processes, input ring, output slots, lifeline, the source) live in
:class:`~parrecio.pipeline.resources.Resources`, which a ``weakref.finalize`` cleans up even when the
user never calls ``close()``; the reader object itself holds only the lifecycle state.  With
``workers=0`` a pass is an :class:`~parrecio.pipeline.inline.InlineRun` in this process instead.
"""

from __future__ import annotations

import difflib
import enum
import inspect
import logging
import multiprocessing
import os
import stat
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from ..decoders.base import ArraySpec, is_passthrough, payload_kinds, spec_of
from ..errors import CorruptRecordError, PipelineError, SourceError
from ..recordio.paths import index_beside
from ..sources import resolve
from .batching import deliver, unbatched_blocks
from .fields import Fields, normalize_fields
from .padding import padded, pads
from .shipping import ship
from .config import PipelineConfig
from .inline import InlineRun, first_sample
from .plan import EVEN_SHARDS, shard_length
from .tuning import TUNING_KEYWORDS, Tuning, count, slot_samples
from .views import as_views
from .resources import Resources
from .passes import ended
from .run import Run
from .slots import SlotLayout
from .stats import Stats

log = logging.getLogger("parrecio")

__all__ = ["ParallelReader"]

_END = object()
POLL_INTERVAL = 1.0  # seconds: how long a wait sleeps at most before it looks around again (no setting)



class State(enum.Enum):
    """Lifecycle of a ParallelReader (``reader.state``)."""

    NEW = "new"          # nothing started
    IDLE = "idle"        # processes and shared memory up, no pass running
    RUNNING = "running"  # a pass is being iterated
    CLOSED = "closed"


LOCAL_RANKS_ENV = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def local_ranks() -> int:
    """How many ranks of a distributed job share this host: ``LOCAL_WORLD_SIZE`` (torchrun, also on
    SageMaker's ``torch_distributed``), ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI, SageMaker's MPI and
    smdistributed launchers) or ``MPI_LOCALNRANKS`` (MPICH); 1 when none is set."""
    for name in LOCAL_RANKS_ENV:
        value = os.environ.get(name, "")
        if value.strip().isdigit() and int(value) >= 1:
            return int(value)
    return 1


def _default_workers() -> int:
    """The CPUs this process may use, divided among the ranks that share the host (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        cpus = os.cpu_count() or 1
    return max(1, cpus // local_ranks())


class ParallelReader:
    """Read a RecordIO stream with one reader process and ``workers`` decoder processes; iterate to get
    samples (or batches) in stream order.

    Args:
        channel: where the stream comes from: a ``.rec`` path, a directory (its ``.rec`` files in name
            order), a glob, a list of those, ``"-"`` for stdin, a FIFO path, an open binary file object,
            a SageMaker channel name, or an ``s3://bucket/prefix/`` or ``s3://bucket/key`` URL (see
            :func:`parrecio.sources.resolve`).
        fields: one decoder per record position of a group; the group size is ``len(fields)``.  A
            sequence gives tuples, a mapping ``name -> decoder`` gives dicts, a single decoder gives its
            value, ``None`` gives each record's payload as ``bytes``.  A decoder is any callable
            ``payload -> value`` (see :mod:`parrecio.decoders`); one the decoder processes cannot
            import (a notebook's, a lambda) travels by value (:mod:`parrecio.pipeline.shipping`).
        workers: decoder processes (default: the CPUs this process may use, divided by the processes on
            this machine that a launcher says share them -- ``LOCAL_WORLD_SIZE``,
            ``OMPI_COMM_WORLD_LOCAL_SIZE`` or ``MPI_LOCALNRANKS`` -- and at least 1; 0 in a daemonic
            process, which may not start any, such as a ``multiprocessing.Pool``'s worker).  ``0`` decodes in this
            process: no child processes, no shared memory, decoders need not be picklable and ``pdb``
            works in them; the fastest mode when decoding is cheaper than moving the data between
            processes.  The output (values, order, errors, shuffles, shards) is the same for any value.
        batch_size: ``None`` yields one sample at a time; an int yields batches of columns (a column is
            one stacked numpy array when the values are arrays of one shape and dtype, a tuple of such
            columns when they are tuples -- ``ImageRecord``'s ``(image, label)`` --, else a list).
        drop_last: drop the last batch when it is shorter than ``batch_size``.
        on_error: ``"raise"``: a bad sample (undecodable payload, broken framing) raises
            :class:`~parrecio.DecodeError` / :class:`~parrecio.CorruptRecordError` at its position, after
            every sample before it was yielded; ``"skip"``: drop it, keep going, count it in ``stats``.
        join: multipart convention, ``"auto"``, ``"mxnet"`` or ``"concat"``; default: the source's (``"concat"`` for
            SageMaker Pipe-mode channels with the RecordIO wrapper; ``"auto"``, decided from each stream's
            multipart records, for everything else: :mod:`parrecio.recordio.joins`).
        num_shards, shard_index: read only this rank's part of the groups (the others are skipped by the
            reader process, never decoded): with ``.idx`` files and ``shuffle``, slice ``shard_index``
            of the epoch's global permutation (``perm[shard_index::num_shards]``, as PyTorch's
            DistributedSampler); otherwise every ``num_shards``-th group from ``shard_index`` on
            (default ``None``: 0).
            ``num_shards="env"`` takes both from the ``WORLD_SIZE`` and ``RANK`` environment variables
            (torch.distributed style; a ``shard_index`` given with it is an error); with neither set (a
            plain ``python train.py``), one shard, with a ``UserWarning``.
        even_shards: ``None`` (default): shards differ by at most one group.  ``"pad"``: every shard
            yields ``ceil(groups / num_shards)`` (the first groups of the order repeat to fill the last
            row), ``"drop"``: ``floor(groups / num_shards)`` (the tail that does not divide evenly is
            left out), so that every rank runs the same number of steps (DDP collectives).  For streams
            the count is known only at their end: a rank holds back its group of each row until the
            row is complete (drop) or keeps copies of the first row's groups to repeat (pad).
        seed: base seed.  Decoder process number ``g`` (counting replacements) seeds ``random`` and
            ``numpy.random`` from ``SeedSequence(seed, spawn_key=(g,))``, and the shuffle of epoch ``e``
            is drawn from ``(seed, e)``: reproducible for a given seed and epoch.
        shuffle: shuffle the groups every epoch.  When every file has an ``.idx`` beside it, a global
            permutation of all groups, read by their offsets; otherwise (streams, FIFOs, stdin) a shuffle
            buffer of ``shuffle_buffer`` groups in the reader process (memory: that many groups of
            payloads, at most about ``shuffle_buffer_bytes``).
        shuffle_buffer: groups in the shuffle buffer of a stream (see ``shuffle``).
        shuffle_buffer_bytes: the payload bytes the shuffle buffer may hold (default 1 GiB): where
            ``shuffle_buffer`` groups would hold more, it holds fewer (at least one group, whatever its
            size), so large records cannot take the reader process's memory.
        tuning: a :class:`~parrecio.pipeline.tuning.Tuning` (ring size, task size, prefetch, start method,
            timeouts...): how the work is done, never what is delivered (given to ParallelReader
            itself, as the first release took them, they are refused with a TypeError naming Tuning).
        **source_options: passed to :func:`parrecio.sources.resolve` (``sm_input_dir``, ``pipe_dir``,
            ``config_dir``, ``fifo_timeout``; ``storage_options`` for ``s3://`` channels, see
            :mod:`parrecio.sources.s3`).
    """

    def __init__(self, channel: Any, fields: Fields = None, *, workers: Optional[int] = None,
                 batch_size: Optional[int] = None, drop_last: bool = False, shuffle: bool = False,
                 seed: int = 0, on_error: str = "raise", num_shards: Union[int, str] = 1,
                 shard_index: Optional[int] = None, even_shards: Optional[str] = None, shuffle_buffer: int = 1024,
                 shuffle_buffer_bytes: int = 1 << 30, join: Optional[str] = None, tuning: Optional[Tuning] = None,
                 **source_options: Any) -> None:
        # Every value is checked before anything is opened, started or registered.
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if join not in (None, "auto", "mxnet", "concat"):
            raise ValueError(f"join must be 'auto', 'mxnet' or 'concat', not {join!r}")
        batch_size = None if batch_size is None else count("batch_size", batch_size)
        num_shards, shard_index = _shards(num_shards, shard_index)
        num_shards = count("num_shards", num_shards)
        shard_index = count("shard_index", shard_index, minimum=0)
        if not shard_index < num_shards:
            raise ValueError(f"need 0 <= shard_index < num_shards, got {shard_index} and {num_shards}")
        if even_shards not in EVEN_SHARDS:
            raise ValueError(f"even_shards must be None, 'pad' or 'drop', not {even_shards!r}")
        daemon = multiprocessing.current_process().daemon  # a Pool's or a DataLoader's worker: no children
        workers = (0 if daemon else _default_workers()) if workers is None else count("workers", workers, minimum=0)
        if workers and daemon:
            raise ValueError(f"workers={workers} in a daemonic process ({multiprocessing.current_process().name}: "
                             f"a multiprocessing.Pool or DataLoader worker, say), which may not start the reader "
                             f"and decoder processes: use workers=0 there (decoding in that process), or make the "
                             f"ParallelReader in the main process")
        seed = count("seed", seed, minimum=0, maximum=(1 << 64) - 1)  # a 64-bit seed, as torch.Generator takes
        shuffle_buffer = count("shuffle_buffer", shuffle_buffer)
        shuffle_buffer_bytes = count("shuffle_buffer_bytes", shuffle_buffer_bytes)
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, (bool, np.bool_)):  # ("no" would be true)
                raise TypeError(f"{name} must be True or False, not {flag!r}")
        tuning = _tuning(tuning, source_options)
        methods = multiprocessing.get_all_start_methods()
        kind, names, decoders = normalize_fields(fields)
        start_method = tuning.start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if workers and start_method != "fork":  # (workers=0: decoders stay in this process)
            ship(decoders, names, start_method)  # one that cannot travel is refused now, not at the first pass
        passthrough = tuple(is_passthrough(d) for d in decoders)
        specs = [None if p else spec_of(d) for d, p in zip(decoders, passthrough)]
        layout = SlotLayout(specs, batch_size or slot_samples(tuning, SlotLayout(specs, 1).nbytes))
        # From here on something may need cleaning up: the finalizer exists before the source does
        # (resolving "-" dups stdin, a file object may get a pump thread).
        self._res = res = Resources()
        self._finalizer = weakref.finalize(self, res.close)
        res.source = source = resolve(channel, **source_options)
        index_paths = _index_paths(source)
        res.cfg = PipelineConfig(
            decoders=tuple(decoders), names=tuple(names), kind=kind,
            passthrough=passthrough, kinds=tuple(payload_kinds(d) for d in decoders), layout=layout,
            travels=tuple(_travels(passthrough, layout)),
            batch_size=batch_size, drop_last=bool(drop_last), join=join or source.default_join,
            on_error=on_error, max_record_bytes=tuning.max_record_bytes,
            num_shards=num_shards, shard_index=shard_index, even_shards=even_shards,
            shuffle_mode=None if not shuffle else "index" if index_paths else "buffer",
            shuffle_buffer=shuffle_buffer, shuffle_buffer_bytes=shuffle_buffer_bytes, seed=seed,
            index_paths=index_paths, workers=workers,
            start_method=start_method, ring_bytes=tuning.ring_bytes, chunk_groups=tuning.chunk_groups,
            chunk_bytes=max(1 << 20, tuning.ring_bytes // 8), oneoff_budget=tuning.ring_bytes,
            mapped_budget=4 * tuning.ring_bytes, prefetch=tuning.prefetch, poll_interval=POLL_INTERVAL,
            drain_timeout=2.0, task_timeout=tuning.task_timeout)
        res.stats.workers = workers
        self._state = State.NEW
        self._epoch = 0           # the next pass's epoch
        self._skip = 0            # groups the next pass leaves out first (load_state_dict)
        self._handed = 0          # samples of its epoch delivered before them (fewer if some were skipped)
        # (epoch, position, completed, samples handed out) where the last pass stopped
        self._progress = (0, 0, False, 0)
        # the pass that was begun when set_epoch() planned the next one (its end must not put back its own
        # epoch over that plan), or None
        self._planned_during: Any = None
        self._procs: Dict[int, Any] = {}  # psutil handles for telemetry()
        self._pass_samples: Optional[Tuple[int, Any]] = None  # samples of the last complete pass, and the
        #                                                       data it read (_data_key)
        self._indexed_groups: Optional[Tuple[int, Any]] = None  # groups the .idx files list, and the data
        #                                                         (_data_key): read by __len__
        res.warm_up(strict=False)  # the fork server boots while the user builds a model (the pass its memory)

    def __reduce__(self) -> Any:
        raise TypeError("a ParallelReader cannot be pickled (it holds processes, pipes and shared memory): "
                        "send its arguments and make one where it is used -- one per process, e.g. one "
                        "per rank with num_shards/shard_index")

    # -- lifecycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every process and remove the shared memory.  Arrays already handed out stay valid.
        Idempotent; returns within a few seconds whatever the other processes do."""
        self._finalizer()
        self._state = State.CLOSED

    def __enter__(self) -> "ParallelReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- iteration -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """One pass over the stream (for a SageMaker Pipe-mode channel: the next epoch).

        A new pass ends the previous one if it is unfinished (resuming that one raises) -- from another
        thread too, unless the previous pass is the main thread's, or its thread is inside its ``next()``
        right now: then the new one is refused."""
        return self._pass(views=False)

    def iter_views(self) -> Iterator[Any]:
        """One pass, as ``iter(reader)``, with each raw payload (``fields=None``, or a ``Raw()`` field) a
        read-only ``memoryview`` (format ``"B"``) instead of ``bytes``.

        With ``workers >= 1`` the views are not copies: they are the payloads where the reader process
        put them (the input ring, or the mapping of a regular file), and the consumer never touches
        their bytes.  A view is valid for as long as you hold it or anything made from it (a slice,
        ``np.frombuffer``); the memory under it is reused only once all of it is gone.  Views you keep
        hold back the input ring (it is released in stream order): a kept view holds its chunk (up to
        about 1/5 of ``ring_bytes``) and everything read after it, so keep views for a few samples at
        most and copy what you keep for longer (``bytes(view)``).  If the reader would wait for space
        that only your views hold, a ``PipelineError`` says so instead of a hang.  With ``workers=0``
        the views are of copies (the reader refills one buffer in place).

        Samples one at a time only: ``batch_size`` must be None."""
        if self.batch_size is not None:
            raise ValueError(f"iter_views() hands out samples one at a time: make the ParallelReader "
                             f"with batch_size=None (it has batch_size={self.batch_size})")
        if not any(self._res.cfg.passthrough):
            raise ValueError("iter_views() hands out raw payloads as views, and no field is raw: use "
                             "fields=None or a Raw() field (its records' bytes), or iterate the reader")
        return self._pass(views=True)

    def _end_pass_elsewhere(self) -> None:
        """Ask the pass that another thread iterates to end (for adapters whose framework iterates in
        threads of its own, as tf.data's prefetch does): that thread raises when it next looks -- after
        each sample, and at least every ``poll_interval`` while it waits -- and frees the pass as it comes
        out.  Takes no lock (that thread holds it while it waits); a no-op without a pass."""
        run = self._res.run
        if run is not None and not run.closed:
            run.aborted = True  # (read by the iterating thread; its shutdown() is its own to do)

    def _drop_unstarted(self, peeked: bool = False) -> None:
        """End the pass whose iterator was dropped before its first ``next()`` (``iter(loader)`` only to
        look at it): a generator never started runs no ``finally`` to end it; with ``peeked``, also a
        pass an adapter only peeked at (:meth:`_peek`).  Where the source can be read again it does not
        count as an epoch either: the next pass is that epoch again, from where it would have started (a
        stream its reader process may have read from is used up, as by a pass left after some batches).
        (Under ``res.lock``.)"""
        res = self._res
        run = res.run
        if run is None or run.user_iter is None:
            return
        if run.user_iter() is not None and not (peeked and run.peeked):
            return
        run.superseded = True  # (a peeked pass's generator, closed later, must not say where the stream stands)
        run.abort()
        res.run = None
        self._give_back(run)
        if self._state is State.RUNNING:
            self._state = State.IDLE

    def _give_back(self, run: Any) -> None:
        """``run`` ended before anything of it was handed out: where the source can be read again, it
        does not count as an epoch, and the next pass is that epoch again, from where it would have
        started -- unless set_epoch() planned another since.  (Under ``res.lock``.)"""
        if self._res.source.rereadable():
            self._res.stats.epochs -= 1
            if self._planned_during is not run:
                self._epoch, self._skip, self._handed = run.epoch, run.skip, run.before
                self._progress = (self._epoch, self._skip, False, self._handed)

    def _peek(self) -> Tuple[Any, Iterator[Any]]:
        """Begin a pass and take its first item, for an adapter that must look at it before the user asks
        for anything (tf.data's signature inference): the item and the pass's iterator.  Until
        :meth:`_peek_taken`, the reader acts as if the pass had not begun: ``state_dict()`` says where it
        starts, and ``set_epoch()`` of another epoch or ``load_state_dict()`` end it (where the source can
        be read again; a stream cannot be, and then ``load_state_dict`` is refused) and plan theirs.
        Raises ``StopIteration`` when the pass is empty."""
        it = iter(self)
        first = next(it)
        with self._res.lock:
            run = self._res.run
            if run is not None and run.user_iter is not None and run.user_iter() is it:
                run.peeked = True
        return first, it

    def _peek_taken(self, it: Iterator[Any]) -> bool:
        """The adapter hands out the item :meth:`_peek` took: True, and the pass counts it from now on;
        False when that pass was ended meanwhile (by ``set_epoch``, ``load_state_dict``, ``close``): the
        adapter begins a new one."""
        with self._res.lock:
            run = self._res.run
            if run is None or not run.peeked or run.aborted or run.user_iter is None or run.user_iter() is not it:
                return False
            run.peeked = False
            return True

    def _peek_dropped(self, it: Iterator[Any]) -> None:
        """The adapter will not hand out the item :meth:`_peek` took (its signature could not be inferred):
        that pass ends as one never begun."""
        with self._res.lock:
            run = self._res.run
            if run is not None and run.peeked and run.user_iter is not None and run.user_iter() is it:
                self._drop_unstarted(peeked=True)
        close = getattr(it, "close", None)
        if close is not None:
            close()

    def _start_failed(self, exc: BaseException) -> None:
        """A pass failed to start (a Ctrl-C included) after its reader process may have read some of the
        source: where the source can be read again the next pass starts anew (the same epoch); where it
        cannot (a FIFO, stdin, a Pipe-mode channel), those bytes are gone and a new start would silently
        miss them, so the reader is closed, saying why when it is used again.  (``workers=0`` reads
        nothing before its first ``next()``.)"""
        res = self._res
        if self.workers and not res.closed and not res.source.rereadable():
            res.closed_why = (f"its pass of epoch {self._epoch} failed to start ({type(exc).__name__}) after "
                              f"reading from {res.source.name}, which cannot be read again")
            res.close()
        if res.closed:
            self._state = State.CLOSED

    def _pass(self, views: bool) -> Iterator[Any]:
        res = self._res
        with res.lock:
            if self._state is State.CLOSED or res.closing:
                raise PipelineError("this ParallelReader is closed" + (f": {res.closed_why}" if res.closed_why
                                                                        else ""))
            self._drop_unstarted(peeked=True)
            if res.run is not None:  # a previous pass was left unfinished: end it first
                other = res.run.thread
                if other is not threading.current_thread() and other.is_alive() and (
                        other is threading.main_thread() or _running(res.run)):
                    raise PipelineError(
                        f"this ParallelReader is being iterated by another thread ({other.name}): one "
                        f"pass at a time; finish or close that pass first, or give each thread its "
                        f"own reader")
                # (left in this thread, or suspended in a thread of its own that lives on -- a framework's
                # prefetch or pool thread outlives its iterator: Keras stopped early --: it raises if
                # resumed.  The main thread's pass is the program's own loop: never ended from elsewhere)
                if other is not threading.current_thread():
                    _stop_resuming(res.run)
                res.run.superseded = True
                res.run.abort()
                res.run = None
            res.source.check_epoch(self._epoch)
            if not res.started:
                res.start()  # (a failure leaves it NEW: see Resources.start)
            res.source.begin_pass(self._epoch)  # (a Pipe-mode channel: which FIFO the pass reads)
            try:
                if self.workers == 0:
                    run = res.run = InlineRun(res, self._epoch, self._skip)
                else:
                    run = res.run = Run(res, self._epoch, self._skip, views=views)
                run.before = run.cursor.handed = self._handed
                run.begin_count()
                run.track_where(self.batch_size)
                res.start_workers()
            except BaseException as exc:
                self._start_failed(exc)
                raise
            self._progress = (self._epoch, self._skip, False, self._handed)
            self._epoch += 1
            self._skip = self._handed = 0
            self._planned_during = None
            res.stats.epochs += 1
            self._state = State.RUNNING
        if self.workers == 0:  # decoded in this process; no lock or clock per item: run checks run.aborted
            if pads(res.cfg):  # the pass ends after its copies: padded() calls _inline_ended
                items = run.items(self.batch_size, False, None)
                items = padded(items, run, self.batch_size, self.drop_last, res.stats,
                               lambda: self._inline_ended(run, time.perf_counter() - run._started),
                               lambda: first_sample(res, run.epoch, self.batch_size))
            else:
                items = run.items(self.batch_size, self.drop_last, self._inline_ended)
            # (views of the copies: the reader refills its buffer in place)
            out = as_views(items, res.cfg.passthrough, res.cfg.kind, res.cfg.names) if views else items
        else:
            out = self._iterate(run, views)
        run.user_iter = weakref.ref(out)  # (dropped before its first next(), it never ends the pass itself)
        return out

    def _inline_ended(self, run: InlineRun, seconds: float) -> None:
        """The end of a ``workers=0`` pass (:mod:`parrecio.pipeline.inline`): what ``_iterate`` does in
        its ``finally``."""
        res = self._res
        with res.lock:
            res.stats.wall_time += seconds
            run.count_samples()
            if not run.superseded:
                self._pass_ended(run, run.cursor.pos)
            run.shutdown()
            if res.run is run:
                res.run = None
                if self._state is State.RUNNING:
                    self._state = State.IDLE

    def _iterate(self, run: Run, views: bool = False) -> Iterator[Any]:
        res, st, cfg = self._res, self._res.stats, self._res.cfg
        cursor = run.cursor
        pad = pads(cfg)  # then padded() drops a short last batch: it may need filling instead
        blocks: Iterator[Iterable[Any]]
        if self.batch_size is None and not pad:
            # a span at a time: the pipeline (under the lock) once per span, not per sample; payloads
            # copied as each sample is taken (feed.Payloads), or handed out as views of where they lie
            blocks = unbatched_blocks(run.spans(lazy=True), cfg.layout, cfg.kind, cfg.names, cursor)
        else:
            items = deliver(run.spans(), cfg, self.batch_size, self.drop_last and not pad, cursor, run.where)
            if pad:
                items = padded(items, run, self.batch_size, self.drop_last, st,
                               epoch_first=lambda: first_sample(res, run.epoch, self.batch_size))
            if views:  # (a padded pass's payloads are copies: views of those)
                items = as_views(items, cfg.passthrough, cfg.kind, cfg.names)
            blocks = _singles(items)
        clock = run.copy.clock  # the consumer's time taking large payloads, inside the blocks
        last = start = time.perf_counter()
        first = True
        item = block = None
        try:
            while True:
                with res.lock:  # inside the pipeline; released while the user's loop body runs
                    if run.aborted or res.closing:  # this pass was ended by close() or a new iteration
                        raise ended(run.owner_pid)
                    try:
                        block = next(blocks, _END)
                    except Exception as exc:
                        if run.aborted or res.closing:  # a close() re-entered from a signal handler in
                            raise ended(run.owner_pid) from exc  # there freed what the pipeline was using
                        cursor.failed(exc)
                        raise
                if block is _END:
                    if run.aborted:  # (never a pass ended by close() that looks complete)
                        raise ended(run.owner_pid)
                    break
                t0 = time.perf_counter()
                if first:
                    st.startup_time += t0 - start
                    first = False
                # The block's time, less its large payloads' copying, is the user's: timed once per
                # block, not twice per sample (that alone would be a third of a tiny record's cost).
                c0 = clock[0]
                try:
                    for item in block:
                        yield item
                        if run.aborted:  # close() from another thread, or a new pass in this one
                            raise ended(run.owner_pid)
                except ValueError:  # a payload's mapping closed under it by close() in another thread
                    if run.aborted or res.closing:
                        raise ended(run.owner_pid) from None
                    raise
                finally:
                    # (not held while the pipeline runs: a view kept by this frame pinned the ring as if
                    # the user kept it -- the reader stuck behind a stretch of damage, "views still in use")
                    item = None
                    now = time.perf_counter()
                    st.user_time += now - t0 - (clock[0] - c0)
                    st.wall_time += now - last  # kept current: telemetry() mid-pass has a verdict
                    run.count_samples()
                    last = now
        finally:
            # An error's traceback keeps this frame (until the garbage collector breaks the cycle it is
            # part of): the last batch in its locals would keep its output slot leased that long.
            item = block = None
            with res.lock:
                st.wall_time += time.perf_counter() - last
                blocks.close()  # type: ignore[attr-defined]
                run.count_samples()  # (not the samples of chunks read ahead that a loop left early never took)
                if not run.superseded:  # (a newer pass owns where the stream stands: an older iterator
                    self._pass_ended(run, cursor.pos)  # dropped late must not put it back)
                run.shutdown()
                if res.run is run:
                    res.run = None
                    if self._state is State.RUNNING:
                        self._state = State.IDLE

    def _pass_ended(self, run: Any, pos: int) -> None:
        """Bookkeeping at the end of a pass: where it stopped, and its length when it was complete (with
        every copy that equal shards owe: one left before them stopped inside the epoch).  A next pass
        planned by set_epoch() while this one ran stays what state_dict() says; a pass only peeked at
        (its iterator let go of before the adapter handed its first item out) is given back."""
        if run.peeked:
            run.peeked = False
            self._give_back(run)
            return
        done = run.completed and not run.owes_copies
        if done and not run.skip:
            self._pass_samples = (run.delivered, self._data_key())
        if self._planned_during is run:
            self._progress = (self._epoch, self._skip, False, self._handed)
        elif done:
            self._progress = (run.epoch, 0, True, 0)
        else:
            self._progress = (run.epoch, pos, False, run.cursor.handed)

    # -- epochs and resuming -------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch of the pass being iterated, else of the next pass (the shuffle of epoch ``e`` is
        drawn from ``(seed, e)``; a SageMaker Pipe-mode channel reads the job's next FIFO, whatever ``e``)."""
        run = self._res.run
        return run.epoch if run is not None else self._epoch

    @property
    def resuming(self) -> bool:
        """Whether the next pass is the rest of an epoch (after :meth:`load_state_dict`), which may be
        empty: a state saved after the epoch's last batch."""
        with self._res.lock:
            self._drop_unstarted()  # (a pass made and dropped unstarted took the position: it is given back)
            run = self._res.run
            if run is not None and run.peeked:  # (not begun, for the user)
                return bool(run.skip or run.before)
        return bool(self._skip or self._handed)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (as ``DistributedSampler.set_epoch``): every rank that
        calls it with the same value gets its part of the same global order.

        After :meth:`load_state_dict`, ``set_epoch`` of the loaded epoch keeps the loaded position (the
        resumed loop of the README); another epoch drops it, with a warning."""
        epoch = count("epoch", epoch, minimum=0)
        with self._res.lock:
            run = self._res.run
            if run is not None and run.peeked:  # a pass an adapter began to look at its first batch
                if epoch == run.epoch:  # it is that epoch's pass already (a plan for the one after, undone)
                    if self._planned_during is run:
                        self._epoch, self._planned_during = run.epoch + 1, None
                    return
                if not self._res.source.rereadable():
                    warnings.warn(f"set_epoch({epoch}) after the pass of epoch {run.epoch} was begun to look "
                                  f"at its first batch (tf.data's signature inference): "
                                  f"{self._res.source.name} cannot be read again, so that pass stays epoch "
                                  f"{run.epoch} and epoch {epoch} is the pass after it (call set_epoch "
                                  f"before dataset(), or give it output_signature)", UserWarning, stacklevel=2)
                    self._epoch, self._planned_during = epoch, run
                    return
            self._drop_unstarted(peeked=True)  # (before its epoch is set: it would set back its own)
        if self._skip and epoch != self._epoch:
            warnings.warn(f"set_epoch({epoch}) after load_state_dict() of epoch {self._epoch} at position "
                          f"{self._skip}: the saved position is dropped and epoch {epoch} starts from its "
                          f"beginning (call set_epoch({self._epoch}) to resume the saved epoch)",
                          UserWarning, stacklevel=2)
        if epoch != self._epoch:
            self._skip = self._handed = 0
        self._epoch = epoch
        self._planned_during = self._res.run  # (a pass begun: its end leaves this plan as it is)
        self._progress = (self._epoch, self._skip, False, self._handed)

    def state_dict(self) -> dict:
        """Where the data stream stands, as a small picklable dict: the epoch and the position in this
        shard's order of that epoch after the last sample (or batch) you received -- or the start of
        the next epoch once a pass was complete -- the settings it depends on, and what identifies the
        data (the source, each file's or object's size).  Give it to :meth:`load_state_dict` of a new
        reader made with the same arguments to go on from there.  After an error you caught, the
        position is that of the samples delivered before it."""
        with self._res.lock:
            self._drop_unstarted()
        run = self._res.run
        if run is not None and not run.peeked:  # mid-pass: after the last item handed out
            epoch, pos, done, handed = run.epoch, run.cursor.pos, False, run.cursor.handed
        else:  # where the last pass stopped (or what set_epoch/load_state_dict set)
            epoch, pos, done, handed = self._progress
        if done:
            epoch, pos, handed = epoch + 1, 0, 0
        state = {"version": _STATE_VERSION, "epoch": epoch, "position": pos, **_order_settings(self._res)}
        state["data"] = _fingerprint(self._res.source)
        # the samples delivered up to there, where they are fewer than the places (on_error="skip" left some
        # out: what remains of a pass counted by its samples, no .idx, is its count less these) or equal
        # shards pad (those skipped before it are padded too); else they are the position
        if pads(self._res.cfg) or handed != pos:
            state["delivered"] = handed
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass is the rest of that epoch, in the same order as
        an uninterrupted run (the reader leaves out the groups delivered before; they are read but
        never decoded).  Raises ``ValueError`` when the state comes from a reader with another seed,
        sharding, shuffle or group size, from other data (another source, a file or object of another
        size), or names a position past the epoch's end where that is known (the ``.idx``); and
        ``PipelineError`` while a pass is being iterated."""
        cfg, res = self._res.cfg, self._res
        with res.lock:
            run = res.run
            if run is not None and run.peeked and not res.source.rereadable():
                raise PipelineError(f"load_state_dict() after a pass was begun to look at its first batch "
                                    f"(tf.data's signature inference): {res.source.name} cannot be read "
                                    f"again; call load_state_dict before dataset(), or give it "
                                    f"output_signature")
            self._drop_unstarted(peeked=True)
        if res.run is not None:
            raise PipelineError("load_state_dict() while a pass is being iterated: call it before "
                                "the next `for` loop")
        if not isinstance(state, Mapping) or "epoch" not in state or "position" not in state:
            raise ValueError(f"not a state_dict() of a ParallelReader (no epoch and position): {state!r}"[:300])
        version = state.get("version", _STATE_VERSION)
        if not isinstance(version, int) or not 1 <= version <= _STATE_VERSION:
            raise ValueError(f"state_dict version {version!r} is not one this parrecio reads (1 to "
                             f"{_STATE_VERSION}): saved by a newer parrecio?")
        mine = _order_settings(res)
        for key, value in mine.items():
            if key in state and state[key] != value:
                why = _WHY.get(key, "")
                raise ValueError(f"state_dict was saved with {key}={state[key]!r}, this reader has "
                                 f"{key}={value!r}{why}: make the reader with the same arguments and data")
        saved, data = state.get("data"), _fingerprint(self._res.source)
        if saved is not None and data is not None:
            _same_data([tuple(x) for x in saved], data)
        epoch = count("epoch", state["epoch"], minimum=0)
        pos = count("position", state["position"], minimum=0)
        listed = None
        if pos and cfg.index_paths:
            try:
                listed = self._groups_listed()
            except CorruptRecordError:  # (no length to check against; a read by that index says why)
                pass
        if listed is not None:
            n = shard_length(listed, cfg.num_shards, cfg.shard_index, cfg.even_shards)
            if pos > n:
                raise ValueError(f"state_dict position {pos} is past the end of epoch {epoch}: this "
                                 f"shard's order has {n} samples (the data changed since it was saved?)")
        handed = pos
        if "delivered" in state:
            handed = count("delivered", state["delivered"], minimum=0)
            if handed > pos:
                raise ValueError(f"state_dict delivered={handed} is more than its position {pos}")
        self._epoch, self._skip, self._handed = epoch, pos, handed
        self._progress = (self._epoch, self._skip, False, self._handed)

    def _groups_listed(self) -> int:
        """Groups the ``.idx`` files list (read again once the data changed: :meth:`_data_key`)."""
        key = self._data_key()
        if self._indexed_groups is None or self._indexed_groups[1] != key:
            cfg = self._res.cfg
            self._indexed_groups = (_indexed_groups(cfg.index_paths, cfg.nfields, cfg.join), key)
        return self._indexed_groups[0]

    def _data_key(self) -> Any:
        """What the data is now: each file's size and time (an object's size), and each local ``.idx``
        file's.  A length counted or listed on other data is not this data's (files refreshed between
        passes, from 300 to 500 records, kept len() at 300; one rewritten at the same size with other
        records kept the old length: a state's fingerprint is sizes only, the times count here too)."""
        source = self._res.source
        objects = getattr(source, "objects", None)
        files = repr(_fingerprint(source)) if objects else tuple(
            _stat_key(path) for path in getattr(source, "paths", None) or ())
        return files, tuple(_stat_key(str(path)) for _, path in self._res.cfg.index_paths)

    def __len__(self) -> int:
        """Samples (or batches, with ``batch_size``) of the pass being iterated, else of the next pass.

        A whole pass is known from the ``.idx`` files when every file has one, else from the previous
        complete pass (of the same data: files that changed size, or ``.idx`` files that changed, are
        counted again); ``TypeError`` when not known yet (a stream read for the first time, stdin, a
        Pipe-mode channel before its first epoch ends, an ``.idx`` that does not fit its file).  A
        resumed pass (after :meth:`load_state_dict`) yields only what remains of its epoch, and that is
        what its length is: the saved position is left out (the passes after it are whole again)."""
        return self._length()

    def _length(self, whole: bool = False) -> int:
        """``len(self)``; with ``whole``, that of a whole pass even where the next one is resumed."""
        done = self._pass_samples
        counted = done[0] if done is not None and done[1] == self._data_key() else None
        # With .idx files, the length is theirs: a pass's count leaves out the samples it skipped (bad
        # ones under on_error="skip"), so it changed from one epoch to the next and could be too low.
        n = counted if not self._res.cfg.index_paths else None
        delivered = n is not None  # (a count of samples delivered, not of places in the order)
        if n is None and self._res.cfg.index_paths:
            cfg = self._res.cfg
            try:
                listed = self._groups_listed()
            except (CorruptRecordError, _Gone) as exc:  # (TypeError: list(reader) asks len() for a hint,
                if counted is None or isinstance(exc, _Gone):  # and reads on; another SourceError is raised)
                    why = "an .idx does not fit its file: " if isinstance(exc, CorruptRecordError) else ""
                    raise TypeError(f"the number of samples is not known: {why}{exc}") from exc
                n, delivered = counted, True  # (a stream read in order does not need its .idx: its pass counted it)
            else:
                n = shard_length(listed, cfg.num_shards, cfg.shard_index, cfg.even_shards)
        if n is None:
            raise TypeError(("the number of samples is not known: the files changed since the complete pass "
                             "that counted them" if done is not None else
                             "the number of samples is not known before a first complete pass") +
                            " (no .idx file next to every .rec file)")
        run, cfg = self._res.run, self._res.cfg
        if whole:  # (a whole pass: nothing left out)
            done_before = 0
        elif pads(cfg) or delivered:
            # a resumed pass pads up to the share, or a pass's count left out the samples it skipped: what
            # remains after the samples delivered before the saved place (not the places, skipped ones too)
            done_before = run.before if run is not None else self._handed
        else:
            done_before = run.skip if run is not None else self._skip
        n = max(0, n - done_before)
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    # -- introspection -------------------------------------------------------------------------------
    @property
    def worker_pids(self) -> List[int]:
        """Process ids of the decoder processes (empty before the first iteration)."""
        return self._res.pool.pids if self._res.pool is not None else []

    @property
    def stats(self) -> Stats:
        """Counters and per-stage times, totals over every pass so far (see :class:`Stats`)."""
        return self._res.stats

    def telemetry(self) -> dict:
        """A snapshot of the running pipeline: per-process CPU (percent of one core since the previous
        call), resident memory (``rss_bytes``) and what of it is the process's own (``private_bytes``:
        without the pages of mapped files and shared memory it has touched), fill levels of the input
        ring, tasks and output slots, and the bottleneck verdict of :attr:`stats`."""
        import psutil
        res = self._res
        procs = {}
        if res.pool is not None:
            procs.update({f"worker {w.index}": w.proc.pid for w in res.pool.workers})
        if res.run is not None:
            procs["reader"] = res.run.reader_pid
        usage = {}
        for name, pid in procs.items():
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                mem = proc.memory_info()
                # rss counts the pages of mapped files read (page cache: shared, reclaimable) and of the
                # shared-memory ring; private_bytes leaves them out (Linux: rss - shared, the RssAnon)
                shared = getattr(mem, "shared", None)
                usage[name] = {"pid": pid, "cpu_percent": proc.cpu_percent(None), "rss_bytes": mem.rss,
                               "private_bytes": None if shared is None else max(mem.rss - shared, 0)}
            except psutil.Error:
                usage[name] = {"pid": pid, "cpu_percent": None, "rss_bytes": None, "private_bytes": None}
        run = res.run
        queues = {
            "ring_bytes": res.cfg.ring_bytes,
            "ring_used_bytes": run.ring_in_use() if run is not None else 0,
            "tasks_in_flight": res.pool.load() if res.pool is not None else 0,
            "chunks_waiting": run.chunks_waiting() if run is not None else 0,
            "slots": len(res.slots.segments) if res.slots is not None else 0,
            "slots_free": len(res.slots.free) if res.slots is not None else 0,
        }
        return {"processes": usage, "queues": queues, "bottleneck": res.stats.bottleneck}

    @property
    def batch_size(self) -> Optional[int]:
        return self._res.cfg.batch_size

    @property
    def drop_last(self) -> bool:
        return self._res.cfg.drop_last

    @property
    def workers(self) -> int:
        """Decoder processes (0: decoding in this process)."""
        return self._res.cfg.workers

    @property
    def seed(self) -> int:
        return self._res.cfg.seed

    @property
    def config(self) -> PipelineConfig:
        """Every setting, checked and frozen."""
        return self._res.cfg

    @property
    def state(self) -> State:
        return self._state

    @property
    def source(self) -> Any:
        return self._res.source

    def __repr__(self) -> str:
        return (f"ParallelReader({self._res.source.name!r}, fields={self._res.cfg.decoders!r}, "
                f"workers={self.workers}, batch_size={self.batch_size}, state={self._state.value})")


def _travels(passthrough: List[bool], layout: SlotLayout) -> List[bool]:
    """Per field, whether (some of) its values travel back from the workers in result frames: not a
    passthrough field, and not one whose values all live in output slots."""
    return [not p and not isinstance(spec, ArraySpec) for p, spec in zip(passthrough, layout.specs)]



def _tuning(tuning: Optional[Tuning], options: dict) -> Tuning:
    """The Tuning to use.  The first release's tuning keywords on ParallelReader itself (deprecated for
    one release) are refused with the place they moved to, before a source would take them for its own."""
    if tuning is not None and not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a parrecio.Tuning, not {type(tuning).__name__}")
    if "poll_interval" in options:
        raise TypeError("ParallelReader() takes no poll_interval: every wait is woken by its event (a "
                        "message, a death, the lifeline)")
    moved = {k: options[k] for k in options if k in TUNING_KEYWORDS}
    if moved:
        given = ", ".join(f"{k}={v!r}" for k, v in moved.items())
        raise TypeError(f"ParallelReader({given}): these are settings of tuning=Tuning({given})")
    known = set(inspect.signature(resolve).parameters) - {"channel"}
    for k in options:
        if k not in known:  # (the source's options: a typo would otherwise be an error of resolve())
            mine = [p for p in inspect.signature(ParallelReader.__init__).parameters
                    if p not in ("self", "source_options")]
            close = difflib.get_close_matches(k, mine + sorted(known) + list(_ALIASES), n=1, cutoff=0.6)
            close = [_ALIASES.get(c, c) for c in close]
            hint = f" (did you mean {close[0]}=?)" if close else ""
            raise TypeError(f"ParallelReader() got an unexpected keyword argument {k!r}{hint}; it takes "
                            f"{', '.join(mine)} and the source's {', '.join(sorted(known))}")
    return tuning or Tuning()


_ALIASES = {"num_workers": "workers", "shuffle_seed": "seed", "drop_remainder": "drop_last",
            "world_size": "num_shards", "rank": "shard_index"}  # other loaders' names


def _shards(num_shards: Union[int, str], shard_index: Optional[int]) -> tuple:
    """(num_shards, shard_index), from WORLD_SIZE/RANK when ``num_shards == "env"``; other values as given,
    for ``count`` to check (``int()`` here made 2.5 shards 2, and True shard 1).

    Neither variable set is a plain run (``python train.py`` of a torchrun script): one shard, all the data,
    with a warning; one of them without the other is an error (a launcher set up half-way)."""
    if not isinstance(num_shards, str) or num_shards != "env":
        return num_shards, 0 if shard_index is None else shard_index
    if shard_index is not None:  # (it was left unused, silently)
        raise ValueError(f'num_shards="env" takes the shard index from RANK: leave shard_index out (it is '
                         f'{shard_index!r})')
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is None and rank is None:
        warnings.warn('num_shards="env": WORLD_SIZE and RANK are not set (not started by torchrun or another '
                      'launcher), so this process reads all the data as one shard (num_shards=1, '
                      'shard_index=0)', UserWarning, stacklevel=3)
        return 1, 0
    if world is None or rank is None:
        missing = "WORLD_SIZE" if world is None else "RANK"
        raise ValueError(f'num_shards="env" needs the environment variables WORLD_SIZE and RANK; '
                         f"{missing} is not set (the other is {rank if world is None else world!r})")
    try:
        size, index = int(world), int(rank)
    except ValueError:
        raise ValueError(f"WORLD_SIZE={world!r} and RANK={rank!r} must be integers") from None
    if not 0 <= index < size:  # (else "need 0 <= shard_index < num_shards", which names neither variable)
        raise ValueError(f'num_shards="env": RANK={rank} must be in 0..WORLD_SIZE - 1 (WORLD_SIZE={world})')
    return size, index


# 3: the shuffle's kind and buffer are saved (a state saved under another order resumed into wrong samples)
# 4: and the buffer's byte bound (an older parrecio would resume a state bounded otherwise without a word)
_STATE_VERSION = 4


_WHY = {  # what a setting that differs from the saved one depends on, where that is not the argument itself
    "shuffle_mode": " (a shuffle by index needs an .idx beside every file, else it is a shuffle buffer's)",
    "by_index": " (read by the .idx beside every file, or as a stream where one is missing: an .idx was "
                "added or removed)",
    "buffer_on_error": " (the on_error of a shuffle buffer: past damage it draws other samples; start the "
                       "epoch again with set_epoch() to change it)",
}


def _order_settings(res: Any) -> Dict[str, Any]:
    """What a shard's order of an epoch depends on, besides the epoch, as state_dict() saves it and
    load_state_dict() compares it (a key missing from a state saved by an older version is not compared)."""
    cfg = res.cfg
    return {"seed": cfg.seed, "num_shards": cfg.num_shards, "shard_index": cfg.shard_index,
            "even_shards": cfg.even_shards, "shuffle": cfg.shuffle_mode is not None,
            "shuffle_mode": cfg.shuffle_mode,
            "shuffle_buffer": cfg.shuffle_buffer if cfg.shuffle_mode == "buffer" else None,
            "shuffle_buffer_bytes": cfg.shuffle_buffer_bytes if cfg.shuffle_mode == "buffer" else None,
            # a shuffle buffer is drawn on past damage under "skip", emptied at it under "raise": the
            # positions after it name other samples
            "buffer_on_error": cfg.on_error if cfg.shuffle_mode == "buffer" else None,
            # equal shards read in order are read by the .idx where every file has one (a damaged group
            # keeps its place), else as a stream (it takes none)
            "by_index": cfg.by_index,
            "nfields": cfg.nfields, "source": str(res.source.name)}


def _stat_key(path: Any) -> tuple:
    """``(path, size, mtime_ns)`` of a local file, ``(path,)`` where it cannot be stat'ed, is an
    ``s3://`` object, or is no regular file (what :meth:`ParallelReader._data_key` compares): every write
    into a FIFO sets its time, and the next pass's writer made a length known from a pass unknown."""
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    try:
        st = None if isinstance(name, str) and name.startswith("s3://") else os.stat(name)
    except (OSError, TypeError, ValueError):
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        return (name,)
    return (name, st.st_size, st.st_mtime_ns)


def _fingerprint(source: Any) -> Optional[List[List[Any]]]:
    """``[[name, bytes], ...]`` of the files (or ``s3://`` objects) the source reads, None for a
    stream whose size is unknown (a FIFO, stdin, a Pipe-mode channel): what a saved position is
    checked against.  Sizes, not times: a copy of the data on another machine is the same data."""
    objects = getattr(source, "objects", None)
    if objects:
        return [[str(o.url), int(o.size)] for o in objects]
    paths = getattr(source, "paths", None)
    if not paths:
        return None
    out = []
    for p in paths:
        try:
            out.append([os.fspath(p), os.stat(p).st_size])
        except (OSError, TypeError):
            return None
    return out


def _same_data(saved: List[tuple], data: List[List[Any]]) -> None:
    """ValueError naming the first difference between the data a state was saved on and this data."""
    now = [tuple(x) for x in data]
    if saved == now:
        return
    for (a, na), (b, nb) in zip(saved, now):
        if a != b:
            raise ValueError(f"state_dict was saved on {a} ({na} bytes), this reader reads {b} ({nb} bytes) "
                             f"in its place: a saved position belongs to the data it was saved on")
        if na != nb:
            raise ValueError(f"state_dict was saved when {a} had {na} bytes; it has {nb} bytes now: the data "
                             f"changed, and the saved position would skip or repeat samples")
    raise ValueError(f"state_dict was saved on {len(saved)} files or objects, this reader reads {len(now)}: "
                     f"a saved position belongs to the data it was saved on")


class _Gone(SourceError):
    """A listed file is gone: no length (a TypeError from len()), where another SourceError is raised."""


def _indexed_groups(index_paths: tuple, nfields: int, join: str = "auto") -> int:
    """Groups listed by the ``.idx`` of every ``(rec, idx)`` pair (``join``: the reader's, for the records
    the check reads).  The indexes are read on a few threads: an ``s3://`` one is a GET of its own (tens of
    ms), so a channel of many objects would otherwise wait for each in turn."""
    from concurrent.futures import ThreadPoolExecutor

    from ..recordio import IndexedRecordReader
    from ..recordio.index import read_index_columns
    from ..recordio.index import check_index

    def listed(pair: tuple) -> int:
        rec, idx = pair
        if isinstance(rec, str) and not rec.startswith("s3://"):
            if not os.path.isfile(rec):  # (its .idx alone would still count it: a length for a pass that fails)
                raise _Gone(f"{rec} is gone, or no longer a regular file: its .idx does not count a pass")
            # a local file: its index must fit it (as a read by index checks it), or the length would not
            # be its epoch's (records appended after the .idx was written, one line per sample)
            with IndexedRecordReader(rec, idx, join=join) as r:
                check_index(r, sorted(r.offsets), nfields)
                return len(r) // nfields
        return len(read_index_columns(idx)[1]) // nfields

    if len(index_paths) == 1:
        return listed(index_paths[0])
    with ThreadPoolExecutor(min(16, len(index_paths))) as pool:
        return sum(pool.map(listed, index_paths))


def _index_paths(source: Any) -> tuple:
    """``((rec, idx), ...)`` when the source is regular files that all have an ``.idx`` beside them, or
    a source that says its own pairs (``s3://`` objects: ``(url, S3Index)``, the index a path-like that
    ``read_index`` reads, see :mod:`parrecio.sources.s3`)."""
    pairs = getattr(source, "index_pairs", None)
    if callable(pairs):
        return tuple(pairs())
    paths = getattr(source, "paths", None)
    if not paths:
        return ()
    out = []
    for p in paths:
        idx = index_beside(p)
        if idx is None:
            return ()
        out.append((p, idx))
    return tuple(out)


def _running(run: Any) -> bool:
    """Whether a thread is inside ``next()`` of the iterator the user got for ``run`` right now (not only
    holding it, suspended); True when that cannot be told."""
    it = run.user_iter() if run.user_iter is not None else None
    return it is not None and bool(getattr(it, "gi_running", True))


def _stop_resuming(run: Any) -> None:
    """Before another thread's suspended pass is shut down: that thread may have resumed it just now,
    and be taking a sample out of a block (a payload copied out of the ring, outside the lock).  It sees
    ``aborted`` at its next step; wait (50 ms at most) for the one it is taking to be out, so that no
    sample it hands out is read from memory the next pass reuses."""
    run.aborted = True
    deadline = time.monotonic() + 0.05
    while _running(run) and time.monotonic() < deadline:
        time.sleep(0.001)


def _singles(items: Iterator[Any]) -> Iterator[Tuple[Any]]:
    """Each item as a block of one; the last one let go of when an error comes through (see
    ``ParallelReader._iterate``: a generator expression's frame would keep it in the traceback)."""
    try:
        for item in items:
            yield (item,)
    finally:
        item = None
