"""One pass over the stream (an epoch): the consumer's side of the pipeline.

::

    reader process --Chunk--> [ Run ] --Task--> worker 0..W-1 --TaskDone--> [ Run ] --> samples, in order
                     <--Release/Stop--         (least loaded first,                  (views of output
                                                at most `prefetch` tasks each)         slots, zero-copy)

The run is driven by the consumer's own thread: no manager thread competes with the training loop for
the GIL.  Each step of :meth:`Run.spans` is one of

- receive: take Chunk messages from the reader (:class:`~parrecio.pipeline.feed.Feed` over its
  :class:`~parrecio.pipeline.reader_handle.ReaderHandle`; a chunk is a run of consecutive groups);
- ``_dispatch``: give chunks to idle workers as tasks, after reserving output-slot positions for them
  (:class:`~parrecio.pipeline.slots.SlotTracker`);
- ``_collect``: take results; re-run the tasks of a worker that died (see below);
- ``_deliver``: hand out the samples of the oldest chunk, as spans (columns of consecutive samples),
  once all its results are in, then release its ring space and its one-off segment (``Feed.release``).

Ordering is by construction: chunks are delivered oldest first, groups within a chunk in order.

Work done again -- the groups of a worker that died (a poison record is found and becomes a decode
error), a result that did not unpickle here -- follows :mod:`parrecio.pipeline.recovery`.

Liveness: the pool's clock advances only while the consumer waits here (never while the user's loop
body runs), and stuck workers are judged after the results at hand were collected.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterator, List, Optional, Tuple

from ..errors import CorruptRecordError, PipelineError, SourceError
from .decode import log_skipped
from .feed import CopyOut, Feed
from .messages import IN_RING, Chunk, RemoteError, Task
from .passes import Pass, Span, ended
from .poller import Poller
from .pool import ALL, BELL
from .reader_handle import ReaderHandle
from .reader_proc import ReaderJob
from .resources import Phase
from .recovery import Recovery, unsplit
from .shm import SHM_DIR, unlink
from .slots import SlotTracker
from .views import Pinned
from .wire import Frame

log = logging.getLogger("parrecio")

__all__ = ["Run"]


_new = tuple.__new__  # a Span without NamedTuple's argument handling


@dataclass
class _ChunkState:
    chunk: Chunk
    columns: list                       # per field: the list of values that travel back, or None
    missing: int
    pos0: Optional[int] = None          # output position of the first group (fixed-shape outputs)
    dispatched: bool = False
    worker: int = -1                    # the worker it was dispatched to whole
    pair: int = -1                      # its number among the pairs (parrecio.pipeline.pairing), -1: none
    errors: Dict[int, RemoteError] = field(default_factory=dict)   # group -> why it failed
    attempts: Dict[int, int] = field(default_factory=dict)   # group -> times its worker died

    @property
    def complete(self) -> bool:
        return self.missing == 0


class Run(Pass):
    """One pass over the stream.  Created and driven by :class:`parrecio.ParallelReader`."""

    def __init__(self, res: Any, epoch: int, skip: int = 0, views: bool = False) -> None:
        super().__init__(res, epoch, skip)  # res: the ParallelReader's Resources: pool, ring, slots, ...
        cfg = self.cfg
        self.chunks: Deque[_ChunkState] = deque()   # received, not yet delivered (oldest first)
        self.undispatched: Deque[_ChunkState] = deque()
        self.recovery = Recovery(self.stats)  # re-runs: after a worker died, after a result that did not unpickle
        self.tasks: Dict[int, _ChunkState] = {}
        retired = res.slots.retire()  # slots grown for batches the user kept in earlier passes, let go of
        if retired and res.pool is not None:
            res.pool.retire(retired)
        self.slots = SlotTracker(res.slots)  # output positions of this pass
        self.in_pipeline = 0        # chunks dispatched and not yet delivered
        self.poller = Poller()
        self._watch_data = True     # whether the wait includes the reader's data pipe (see _step)
        self._watch = ALL           # which result pipes the wait watches (see _watching)
        self._prev_pair = -1        # the pair number of the last chunk delivered
        self._pairing = True        # whether results may be waited for in pairs: off once a worker dies
        self._replaced = res.pool.replaced if res.pool is not None else 0
        if res.pool is not None:
            res.pool.pairs.align()  # the pass's first chunk starts a pair
        self.copy = CopyOut(cfg.passthrough, res.ring.buf)  # the payloads the consumer copies
        self.lazy = False           # whether payloads are copied as the user takes them (see spans())
        # a lazy chunk out and not yet released: (chunk, its one-off segment, its views' weak references)
        self.delivering: Optional[Tuple[Chunk, Any, Optional[list]]] = None
        self.views = views          # raw payloads as views (ParallelReader.iter_views)
        # Chunks given back only once their views are gone (parrecio.pipeline.views): this pass's when it
        # hands out views, and those an earlier pass's views still pin.  None: every chunk goes back
        # when delivered.
        self.pinned: Optional[Pinned] = res.pinned
        if self.pinned is None and views:
            self.pinned = Pinned()
        ring_pos = (self.pinned.tail, self.pinned.top) if self.pinned is not None else (0, 0)
        reader = None
        try:
            job = ReaderJob(res.source, epoch, res.ring.name, res.prefix, skip, ring_pos,
                            views=self.pinned is not None, serve_on=res.serves_on())
            lifeline = res.lifeline.r
            reader = res.take_spare(job)
            # (a spare killed as it was given its job read nothing: then another reads the pass)
            restart = None if reader is None else lambda: ReaderHandle(res.ctx, cfg, job, lifeline)
            if reader is None:
                reader = ReaderHandle(res.ctx, cfg, job, lifeline)
            # its chunks, its end, the ring's accounting (releases of groups read in place held back up
            # to a quarter of their budget, but not while views may pin chunks: see _unpin)
            hold = 0 if self.pinned is not None else cfg.mapped_budget // 4
            self.feed = Feed(reader, self.stats, epoch, ring_pos, hold, restart)
        except BaseException:
            self.closed = True
            try:
                if reader is not None:  # (a Ctrl-C after it started: it must not read on meanwhile)
                    reader.stop()
            finally:
                self.slots.close()
            raise  # (an earlier pass's pinned chunks stay with res for the next try)
        if self.pinned is not None:
            self.pinned.give_back = self.feed.release_ring
            res.pinned = None

    # -- the loop ----------------------------------------------------------------------------------
    def spans(self, lazy: bool = False) -> Iterator[Span]:
        """Every sample of the pass in stream order, as spans (bytes copied out of the ring,
        fixed-shape values leased).  Raises the first error under ``on_error="raise"`` after the
        samples before it.

        With ``lazy``, passthrough columns are :class:`~parrecio.pipeline.feed.Payloads` and a chunk's
        ring space is released only when the next span is asked for: the caller takes every sample of
        a span before it asks for the next (one at a time, unbatched), never holding a span back."""
        st = self.stats
        self.lazy = lazy and bool(self.copy)
        woke = False  # whether the chunks being delivered were collected by a wait just now
        try:
            while True:
                while self.chunks and self.chunks[0].complete:
                    spans, err = self._deliver(self.chunks.popleft())
                    yield from spans
                    del spans  # their leases: a slot whose samples were all handed out is free to reuse
                    if self.delivering is not None:  # every payload of it was taken
                        self._release_delivering()
                    if err is not None:
                        raise err
                    if self.aborted:
                        raise ended(self.owner_pid)
                    # Look for more results before the next complete chunk -- except right after a wait,
                    # whose step has just collected and dispatched: a pair's second chunk goes out at once.
                    if self.chunks and self.chunks[0].complete and not woke:
                        self._step(0.0)
                    woke = False
                if self.aborted:  # (first: a close() re-entered from a signal handler emptied the chunks)
                    raise ended(self.owner_pid)
                if self.feed.end is not None and not self.chunks:
                    self._finish()
                    return
                if self.pinned is not None:
                    self._unpin()
                if not self.chunks:  # waiting for the reader: it gets every release first
                    self.feed.flush()
                t0 = time.perf_counter()
                self._step(self.cfg.poll_interval)
                st.wait_workers_time += time.perf_counter() - t0
                woke = True
        finally:
            self.shutdown()

    def _step(self, timeout: float) -> None:
        """Dispatch what can be, then wait up to ``timeout`` s for a message or a death and handle it."""
        self._dispatch()
        pool = self.res.pool
        # While chunks wait for a worker, more of them are of no use: leave the reader's messages in
        # their pipe (its sentinel stays watched) instead of waking up for each one.
        self._watch_data = pool is None or not self.undispatched
        self._watch = watch = (self._watching() if timeout and self._pairing and self.delivered
                               and pool is not None and pool.bell is not None else ALL)
        end, reader = self.feed.end, self.feed.reader
        self.poller.watch((pool.version if pool is not None else -1, end is None, self._watch_data, watch,
                           pool.partial() if watch != ALL else (), id(reader)), self._waitables)
        t0 = time.monotonic()
        ready = self.poller.wait(timeout)
        if self.res.closing:  # close() from another thread: leave the pipeline to it
            raise ended(self.owner_pid)
        if end is None and (reader.data in ready or reader.sentinel in ready):
            for c in self.feed.receive():
                self._received(c)
            feed = self.feed
            if feed.end is not None:  # the reader is done: it serves the next pass, or a new one starts now
                feed.kept = self.res.prepare_spare(reader if feed.end.error is None else None)
        if pool is None:
            return
        # The pool's clock runs only while we wait here, and at most as long as we meant to wait (a
        # consumer stopped inside wait() does not make its decoders look stuck).
        pool.clock += min(time.monotonic() - t0, timeout)
        done, orphans = pool.collect(ready, watch != ALL)
        for task, frame in done:
            self._store(task, frame)
        if pool.replaced != self._replaced:
            # A worker died, perhaps between its result and its mark on the board: its partner's worker
            # would not ring.  Results are waited for one by one for the rest of the pass.
            self._pairing = False
        for task, taken, blamed, how in orphans:
            cs = self.tasks.pop(task.task_id, None)
            if cs is not None:
                cs.pair = -1
                self.recovery.orphaned(cs, task, taken, blamed, how)
        if self.cfg.task_timeout is not None:
            pool.kill_stuck(self.cfg.task_timeout)
        self.stats.workers_replaced = pool.replaced
        if done or orphans:
            self._dispatch()

    def _watching(self) -> int:
        """What the next wait watches (:meth:`WorkerPool.waitables`): the bell while the oldest chunk
        and its partner were both dispatched whole (the pair's second result wakes the consumer, not
        each one); the oldest chunk's worker while it was dispatched whole without its partner; else
        every result pipe."""
        chunks = self.chunks
        if not chunks:
            return ALL
        c0 = chunks[0]
        p = c0.pair
        if p < 0 or not c0.missing:
            return ALL
        if p & 1:
            partnered = self._prev_pair == p - 1  # delivered just before it
        else:
            partnered = len(chunks) > 1 and chunks[1].pair == p + 1
        return BELL if partnered else c0.worker

    def _waitables(self) -> List[Any]:
        objs: List[Any] = self.res.pool.waitables(self._watch) if self.res.pool is not None else []
        return objs + self.feed.reader.waitables(self._watch_data)

    def _received(self, msg: Chunk) -> None:
        cs = _ChunkState(msg, [[None] * msg.n if t else None for t in self.cfg.travels], msg.n)
        self.stats.chunks += 1
        if all(self.cfg.passthrough) or msg.n == 0:  # an empty chunk only releases ring space
            cs.missing = 0  # nothing to decode: the consumer copies the payloads out itself
        else:
            self.undispatched.append(cs)
        self.chunks.append(cs)

    # -- dispatch ----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        pool = self.res.pool
        if pool is None:
            return
        cap = self.cfg.prefetch
        retry, resplit = self.recovery.retry, self.recovery.resplit
        while retry:
            w = pool.pick(1)  # re-runs go first, each alone on an idle worker
            if w is None:
                return
            cs, start, n = retry.popleft()
            self._submit(w, cs, start, n, isolated=True)
        while resplit:
            w = pool.pick(cap)
            if w is None:
                return
            cs, start, n = resplit.popleft()
            self._submit(w, cs, start, n, split=True)
        while self.undispatched:
            w = pool.pick(cap)
            if w is None:
                return
            cs = self.undispatched[0]
            if self.cfg.layout.has_fixed and cs.pos0 is None:
                # a new physical slot only when nothing in flight could free one (the user holds them)
                stuck = self.in_pipeline == 0 and not retry and not resplit
                cs.pos0 = self.slots.reserve(cs.chunk.n, may_grow=stuck)
                if cs.pos0 is None:
                    return
            self.undispatched.popleft()
            cs.dispatched = True
            self.in_pipeline += 1
            cs.worker, cs.pair = w.index, pool.pairs.next()
            self._submit(w, cs, 0, cs.chunk.n, pair=cs.pair)

    def _submit(self, worker: Any, cs: _ChunkState, start: int, n: int, isolated: bool = False,
                split: bool = False, pair: int = -1) -> None:
        c, nf = cs.chunk, self.cfg.nfields
        dest = self.slots.dest(cs.pos0 + start, n) if cs.pos0 is not None else []
        task = Task(self.res.pool.next_id(), c.first_seq, start, n, c.place,
                    c.ring_offs[start * nf:(start + n) * nf], c.lens[start * nf:(start + n) * nf], dest,
                    isolated, split, self.epoch, pair)
        self.tasks[task.task_id] = cs
        self.res.pool.submit(worker, task)

    # -- results -----------------------------------------------------------------------------------
    def _store(self, task: Task, frame: Frame) -> None:
        cs = self.tasks.pop(task.task_id, None)
        if cs is None:
            return
        self.stats.add_worker(frame.pid, frame.cpu, task.n)
        if frame.split:
            columns, errors = unsplit(frame, self.cfg.decoders)
        else:
            try:
                columns, errors = frame.values()
            except Exception:  # some value does not unpickle here: re-run, each value pickled alone
                self.recovery.resplit.append((cs, task.start, task.n))
                cs.pair = -1  # (completed in parts: no pair's worker rings for it)
                return
        lo, hi = task.start, task.start + task.n
        for dst, col in zip(cs.columns, columns):
            if dst is not None:
                dst[lo:hi] = col
        for j, err in errors.items():
            cs.errors[lo + j] = err
        cs.missing -= task.n

    # -- delivery ----------------------------------------------------------------------------------
    def _deliver(self, cs: _ChunkState) -> Tuple[List[Span], Optional[BaseException]]:
        """The spans of a complete chunk, and the error to raise after them (if any); then release its
        ring space."""
        c = cs.chunk
        self._prev_pair = cs.pair
        ok = False
        try:
            spans, err = self._spans(cs)
            ok = True
        finally:
            if cs.dispatched:
                self.in_pipeline -= 1
            if self.delivering is None:
                self._give_back_later(c, None)
            elif not ok:
                self._release_delivering()
        self.delivered += sum(sp.n for sp in spans)
        return spans, err

    def _spans(self, cs: _ChunkState) -> Tuple[List[Span], Optional[BaseException]]:
        """Cut the chunk into spans: at each failed group, and where the output slot changes."""
        c = cs.chunk
        if c.n == 0:
            return [], None
        columns = list(cs.columns)
        if self.copy:
            refs: Optional[list] = [] if self.views and self.lazy else None
            seg = self.copy.into(c, columns, self.lazy, refs)
            if self.lazy:
                self.delivering = (c, seg, refs)
        n, seq0, pos0 = c.n, c.first_seq, cs.pos0
        if self.recent is not None and len(cs.errors) < n:  # (chunks that deliver samples: a batch's few)
            self.recent.append((seq0, c.stream_offs, c.stream_id))
        if pos0 is None and not cs.errors:  # the common case without fixed-shape outputs
            return [_new(Span, (seq0, n, None, 0, columns))], None
        S = self.cfg.slot_size
        spans: List[Span] = []
        a = 0
        for e in sorted(cs.errors) + [n]:
            j = a
            while j < e:  # groups a..e-1 succeeded: one span per slot they touch
                lease, index, b = None, 0, e
                if pos0 is not None:
                    b = min(e, j + S - (pos0 + j) % S)
                    lease, index = self.slots.deliver(pos0 + j, b - j)
                cols = columns if (j, b) == (0, n) else [None if col is None else col[j:b] for col in columns]
                spans.append(_new(Span, (seq0 + j, b - j, lease, index, cols)))
                j = b
            if e == n:
                break
            err = self._error_at(cs, e)
            if self.cfg.on_error == "raise" or isinstance(err, SourceError):  # (not a bad sample: see _error_at)
                if pos0 is not None:
                    self.slots.give_up(pos0 + e, n - e)
                return spans, err
            if pos0 is not None:
                self.slots.give_up(pos0 + e, 1)
            self.stats.skipped += 1
            log_skipped(log, err)
            a = e + 1
        return spans, None

    def _release_delivering(self) -> None:
        """The lazy chunk out: its payloads were all taken; its ring space and one-off segment go back
        (once its views are gone, when it handed out views)."""
        self._give_back_later(*self._take_delivering())

    def _take_delivering(self) -> Tuple[Chunk, Optional[list]]:
        """The lazy chunk out, let go of (this process's mapping of its one-off segment closed: views of
        it keep the mapping alive), and its views' weak references."""
        assert self.delivering is not None
        c, seg, refs = self.delivering
        self.delivering = None
        if seg is not None:
            seg.close()
        return c, refs

    # -- giving chunks back (views) ----------------------------------------------------------------
    def _give_back_later(self, c: Chunk, refs: Optional[list]) -> None:
        """Chunk ``c`` was delivered: it goes back to the reader now, or -- when views of it, or of a
        chunk before it, may be alive -- its ring space goes back once they are gone (:class:`Pinned`)."""
        if self.pinned is None:
            self.feed.release(c)
        else:
            self.feed.release(c, ring=False)
            # (views of a file read in place or of a one-off segment pin no ring space: theirs goes back
            # at delivery, and a view keeps its mapping alive)
            self.pinned.add(c.ring_end, (refs or []) if c.place == IN_RING else [], c.ring_top)
            if refs and c.place.is_oneoff:
                self.pinned.add_oneoff(sum(c.lens), refs)

    def _unpin(self) -> None:
        """Give back the chunks whose views are gone; when the reader waits for space that only views
        still alive hold, and nothing else is under way that could free any, raise instead of a hang."""
        pinned = self.pinned
        assert pinned is not None
        if pinned.release() or not pinned or self.chunks or not self.feed.reader_stuck():
            return
        gc.collect()  # views in reference cycles
        if pinned.release():
            return
        ring = self.res.ring.size
        whose = ("iter_views(): the reader process waits for input-ring space that views still in use hold"
                 if self.views else "the reader process waits for input-ring space that views kept from an "
                 "earlier iter_views() pass hold (its last loop variable too: del it)")
        raise PipelineError(
            f"{whose}: {len(pinned)} delivered chunk(s), {(pinned.head - pinned.tail) / 2**20:.2f} MiB of a "
            f"{ring / 2**20:.2f} MiB ring (Tuning(ring_bytes=...)). A view keeps its chunk, and every "
            f"chunk after it, from being reused until it and everything made from it (slices, numpy "
            f"arrays) is gone: copy what you keep (bytes(view)), or give the reader a larger ring")

    def _error_at(self, cs: _ChunkState, j: int) -> BaseException:
        """The DecodeError of group ``j`` of the chunk, naming the sample, its offset and its stream -- or
        the SourceError of a worker that found the file it reads in place changed (the pass ends there)."""
        cfg, c, r = self.cfg, cs.chunk, cs.errors[j]
        if r.type_name == "SourceError" and r.field < 0:  # the worker found its file changed, or gone
            orig = r.original()
            if isinstance(orig, SourceError):
                return orig
        source = self.source_of(c.stream_id)
        what = (f"field {cfg.names[r.field]!r} ({cfg.decoders[r.field]!r})" if 0 <= r.field < self.cfg.nfields
                else "decoder process")
        return r.as_decode_error(what, c.first_seq + j, c.stream_offs[j], source)

    @property
    def positions(self) -> Optional[int]:
        """Positions of this shard's order the pass went through (delivered, skipped or resumed past),
        once the reader has ended."""
        end = self.feed.end
        return None if end is None else end.n_groups

    def ring_in_use(self) -> int:
        return self.feed.ring_in_use()

    def chunks_waiting(self) -> int:
        return len(self.chunks)

    @property
    def reader(self) -> ReaderHandle:
        """The pass's reader process."""
        return self.feed.reader

    @property
    def reader_pid(self) -> int:
        return self.feed.reader.pid

    def _finish(self) -> None:
        end = self.feed.end
        self.slots.finish()
        if end.error is not None:
            err = end.error
            if isinstance(err, RemoteError):
                orig = err.original()
                raise PipelineError(f"the reader process failed on {self.res.source.name!r}: "
                                    f"{err.type_name}: {err.message}") from orig
            if isinstance(err, CorruptRecordError):
                err = err.located(end.n_groups)
            held = (self.pinned.oneoff_bytes if self.pinned is not None and isinstance(err, PipelineError)
                    and SHM_DIR in str(err) else 0)
            if held:  # (the reader found /dev/shm full, or unusable: say what, of it, the user's views hold)
                raise PipelineError(
                    f"{err}. Views still in use hold {held / 2**20:.1f} MiB of it: groups larger than half the "
                    f"input ring travel in segments of their own, which stay in /dev/shm as long as a view of "
                    f"them (or anything made from it) lives: copy what you keep (bytes(view))") from err
            raise err
        self.completed = True

    # -- shutdown ----------------------------------------------------------------------------------
    @property
    def opened_stream(self) -> bool:
        return bool(self.feed.streams)  # (the reader says each stream it opened: StreamStart)

    def shutdown(self) -> None:
        """End the run: stop the reader, let in-flight tasks finish (or kill their workers), free the
        run's slots and one-off segments.  Idempotent; returns within a few seconds whatever the peers do."""
        if self.closed or os.getpid() != self.owner_pid:
            return
        self.closed = True
        if self.delivering is not None:  # its payloads are dropped: its segment (if any) goes
            c, refs = self._take_delivering()
            if refs:  # (some views of it were handed out)
                self._give_back_later(c, refs)
            else:
                self.chunks.append(_ChunkState(c, [], 0))
        for c in self.feed.stop():
            self.chunks.append(_ChunkState(c, [], 0))  # only its one-off segment matters now
        # (after the reader's last messages: the streams it opened are known; a Pipe-mode FIFO is used up)
        self.res.source.end_pass(self.epoch, self.opened_stream)
        if self.pinned is not None and self.pinned:  # views still alive: the next pass writes after them
            self.res.pinned = self.pinned.detach()
        for cs in self.chunks:
            if cs.chunk.place.is_oneoff:
                unlink(cs.chunk.place.name)
        self.chunks.clear()
        self.undispatched.clear()
        self.recovery.clear()
        pool = self.res.pool
        try:
            if pool is not None and pool.started:
                # (it starts workers, which may fail; none when the whole reader closes)
                pool.drain_all(self.cfg.drain_timeout, replace=self.res.phase is not Phase.CLOSED)
        finally:
            self.tasks.clear()
            self.slots.close()
            self.copy.close()

    def source_of(self, stream_id: int) -> str:
        return self.feed.streams.get(stream_id, self.res.source.name)  # (the reader says each: StreamStart)

    def forget_after_fork(self) -> None:
        """In the child of an ``os.fork()`` of the consumer: let go of the reader process silently; the
        pass, if iterated here, ends at its next sample (its slots and results are the parent's)."""
        self.closed = self.aborted = True
        self.feed.reader.forget_after_fork()
