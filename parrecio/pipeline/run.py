"""One pass over the stream (an epoch): the consumer's side of the pipeline.

::

    reader process --Chunk--> [ Run ] --Task--> worker 0..W-1 --TaskDone--> [ Run ] --> samples, in order
                     <--Release/Stop--         (least loaded first,                  (views of output
                                                at most `prefetch` tasks each)         slots, zero-copy)

The run is driven by the consumer's own thread: no manager thread competes with the training loop for
the GIL.  Each step of :meth:`Run.samples` is one of

- ``_receive``: take Chunk messages from the reader (a chunk is a run of consecutive groups);
- ``_dispatch``: give chunks to idle workers as tasks, after reserving output-slot positions for them;
- ``_collect``: take results; re-run the tasks of a worker that died (see below);
- ``_deliver``: hand out the samples of the oldest chunk once all its results are in, then release its
  ring space (``Release``) and its one-off segment.

Ordering is by construction: chunks are delivered oldest first, groups within a chunk in order.

Worker death: its tasks are re-run.  A task of several groups is re-run as one task per group, so that a
group that kills its worker again (a "poison" record) is found; a single group that killed two workers
becomes a decode error of that sample instead of an endless respawn loop.

A result that cannot be unpickled here (a value whose ``__reduce__`` fails in the consumer) is
re-run with every value pickled on its own (``Task.split``), so that only the sample at fault becomes a
decode error.

Liveness: the pool's clock advances only while the consumer waits here (never while the user's loop
body runs), and stuck workers are judged after the results at hand were collected.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterator, List, NamedTuple, Optional, Tuple

from ..errors import CorruptRecordError, DecodeError, PipelineError
from .children import child_entry, close_quietly, describe_exit, forget_processes, start
from .mapped import MappedFiles, is_mapped
from .messages import Chunk, ReaderEnd, Release, RemoteError, Stop, StreamStart, Task
from .poller import Poller
from .reader_proc import ReaderConfig, reader_main
from .shm import Segment, sweep, unlink
from .slots import Lease
from .wire import Frame

log = logging.getLogger("parrecio")

__all__ = ["Run", "Span"]


class Span(NamedTuple):
    """Consecutive delivered samples ``seq .. seq + n - 1`` of one chunk, as columns.

    ``columns[f]`` is the list of the ``n`` values of field ``f`` that travelled back from the workers
    (or were copied out of the ring), or ``None`` when the field's values are all in the output slot:
    rows ``index .. index + n - 1`` of ``lease.arrays``.  For a field with a tuple spec, the column holds
    tuples with ``None`` at the positions that live in the slot."""
    seq: int
    n: int
    lease: Optional[Lease]
    index: int
    columns: list


_new = tuple.__new__  # a Span without NamedTuple's argument handling


@dataclass
class _Slot:
    """A logical output slot of this run (positions ``k*S .. k*S+S-1``) and the physical slot it uses."""
    phys: int
    remaining: int           # positions not yet delivered or skipped
    assigned: int = 0        # positions handed to groups so far
    lease: Optional[Lease] = None


@dataclass
class _ChunkState:
    chunk: Chunk
    columns: list                       # per field: the list of values that travel back, or None
    missing: int
    pos0: Optional[int] = None          # output position of the first group (fixed-shape outputs)
    dispatched: bool = False
    errors: Dict[int, RemoteError] = field(default_factory=dict)   # group -> why it failed
    attempts: Dict[int, int] = field(default_factory=dict)   # group -> times its worker died

    @property
    def complete(self) -> bool:
        return self.missing == 0


def _ended() -> PipelineError:
    return PipelineError("this pass was ended by close() or by a new iteration of the same ParallelReader")


class Run:
    """One pass over the stream.  Created and driven by :class:`parrecio.ParallelReader`."""

    def __init__(self, shared: Any, epoch: int) -> None:
        self.sh = shared            # the ParallelReader's long-lived parts: pool, ring, slots, config
        self.cfg = shared.cfg
        self.epoch = epoch
        self.nf = len(self.cfg.decoders)
        self.chunks: Deque[_ChunkState] = deque()   # received, not yet delivered (oldest first)
        self.undispatched: Deque[_ChunkState] = deque()
        self.retry: Deque[Tuple[_ChunkState, int, int]] = deque()  # (chunk, start, n) to re-run alone
        self.resplit: Deque[Tuple[_ChunkState, int, int]] = deque()  # ... with values pickled one by one
        self.tasks: Dict[int, _ChunkState] = {}
        self.slots: Dict[int, _Slot] = {}
        self.next_pos = 0
        self.in_pipeline = 0        # chunks dispatched and not yet delivered
        self.streams: Dict[int, str] = {}
        self.end: Optional[ReaderEnd] = None
        self.received_pos = 0       # ring position after the newest chunk received
        self.released_pos = 0       # ring position released to the reader
        self.closed = False
        self.aborted = False        # ended from outside (close(), a new pass) before the consumer was done
        self.completed = False      # the whole stream was delivered without an error
        self.delivered = 0          # samples yielded in this pass
        self.stats = shared.stats
        self.owner_pid = os.getpid()
        self.thread = threading.current_thread()  # the thread that iterates this pass
        self.poller = Poller()
        self.mapped = MappedFiles()  # files read in place, for passthrough fields
        self.copied = [f for f, p in enumerate(shared.passthrough) if p]  # payloads the consumer copies
        self.travels = shared.travels  # fields whose values travel back from the workers
        self._start_reader()

    # -- reader process ----------------------------------------------------------------------------
    def _start_reader(self) -> None:
        sh, cfg = self.sh, self.cfg
        ctx = sh.ctx
        rcfg = ReaderConfig(
            source=sh.source, epoch=self.epoch, nfields=self.nf, join=cfg.join, on_error=cfg.on_error,
            max_record_bytes=cfg.max_record_bytes, ring_name=sh.ring.name, prefix=sh.prefix,
            chunk_groups=self._chunk_groups(),
            chunk_bytes=cfg.chunk_bytes, oneoff_budget=cfg.oneoff_budget, num_shards=cfg.num_shards,
            shard_index=cfg.shard_index, poll_interval=cfg.poll_interval, shuffle=cfg.shuffle,
            shuffle_buffer=cfg.shuffle_buffer, seed=cfg.seed, index_paths=cfg.index_paths,
            mapped_budget=4 * sh.ring.size)
        data_r, data_w = ctx.Pipe(duplex=False)
        ctrl_r, ctrl_w = ctx.Pipe(duplex=False)
        self.data, self.ctrl = data_r, ctrl_w
        try:
            self.reader = ctx.Process(target=child_entry, name="parrecio-reader", daemon=True,
                                      args=(sh.prefix, sh.lifeline_r, reader_main, rcfg, data_w, ctrl_r,
                                            sh.lifeline_r))
            start(self.reader)
        except BaseException:
            self.closed = True
            close_quietly(data_r, data_w, ctrl_r, ctrl_w)
            raise
        finally:
            data_w.close()  # the child has its own copies (or none: it did not start)
            ctrl_r.close()

    def _chunk_groups(self) -> Optional[int]:
        """Groups per chunk (None: adaptive).  With fixed-shape outputs a chunk fills two output slots
        (two batches), so that batches come out as spans of one slot, zero-copy, and the consumer's
        per-task cost (~0.3-0.7 ms on a busy 2-core host) is spread over 2 x batch_size samples.
        Without decoders the consumer copies payloads itself: chunks of 1024 groups at least."""
        sh, groups = self.sh, self.cfg.chunk_groups
        if sh.pool is None:
            return None if groups is None else max(groups, 1024)
        if groups is None and sh.layout.has_fixed:
            return 2 * sh.layout.slot_size
        return groups

    # -- the loop ----------------------------------------------------------------------------------
    def spans(self) -> Iterator[Span]:
        """Every sample of the pass in stream order, as spans (bytes copied out of the ring,
        fixed-shape values leased).  Raises the first error under ``on_error="raise"`` after the
        samples before it."""
        st = self.stats
        try:
            while True:
                while self.chunks and self.chunks[0].complete:
                    spans, err = self._deliver(self.chunks.popleft())
                    yield from spans
                    if err is not None:
                        raise err
                    if self.aborted:
                        raise _ended()
                    self._step(0.0)
                if self.end is not None and not self.chunks:
                    self._finish()
                    return
                if self.aborted:
                    raise _ended()
                t0 = time.perf_counter()
                self._step(self.cfg.poll_interval)
                st.wait_workers_time += time.perf_counter() - t0
        finally:
            self.shutdown()

    def _step(self, timeout: float) -> None:
        """Dispatch what can be, then wait up to ``timeout`` s for a message or a death and handle it."""
        self._dispatch()
        pool = self.sh.pool
        self.poller.watch((pool.version if pool is not None else -1, self.end is None), self._waitables)
        t0 = time.monotonic()
        ready = self.poller.wait(timeout)
        if self.sh.closing:  # close() from another thread: leave the pipeline to it
            raise _ended()
        if self.data in ready or self.reader.sentinel in ready:
            self._receive()
        if pool is None:
            return
        # The pool's clock runs only while we wait here, and at most as long as we meant to wait (a
        # consumer stopped inside wait() does not make its decoders look stuck).
        pool.clock += min(time.monotonic() - t0, timeout)
        done, orphans = pool.collect(ready)
        for task, frame in done:
            self._store(task, frame)
        for task in orphans:
            self._orphaned(task)
        if self.cfg.task_timeout is not None:
            pool.kill_stuck(self.cfg.task_timeout)
        self.stats.workers_replaced = pool.replaced
        if done or orphans:
            self._dispatch()

    def _waitables(self) -> List[Any]:
        objs: List[Any] = self.sh.pool.waitables() if self.sh.pool is not None else []
        if self.end is None:
            objs += [self.data, self.reader.sentinel]
        return objs

    def _receive(self) -> None:
        eof = False
        try:
            while self.end is None and self.data.poll():
                self._on_message(self.data.recv())
        except (EOFError, OSError):
            eof = True  # the reader's end of the pipe is closed: it will send nothing more
        if self.end is None and (eof or not self.reader.is_alive()):
            self.reader.join(1.0)
            raise PipelineError(f"the reader process died ({describe_exit(self.reader.exitcode)}) "
                                f"before the end of the stream {self.sh.source.name!r}")

    def _on_message(self, msg: Any) -> None:
        if isinstance(msg, Chunk):
            self.received_pos = msg.ring_end
            cs = _ChunkState(msg, [[None] * msg.n if t else None for t in self.travels], msg.n)
            self.stats.chunks += 1
            if all(self.sh.passthrough):
                cs.missing = 0  # nothing to decode: the consumer copies the payloads out itself
            else:
                self.undispatched.append(cs)
            self.chunks.append(cs)
        elif isinstance(msg, StreamStart):
            self.streams[msg.stream_id] = msg.name
            log.info("parrecio: epoch %d: reading %s", self.epoch, msg.name)
        elif isinstance(msg, ReaderEnd):
            self.end = msg
            self.stats.add_reader(msg.stats)

    # -- dispatch ----------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        pool = self.sh.pool
        if pool is None:
            return
        cap = self.cfg.prefetch
        while self.retry:
            w = pool.pick(1)  # re-runs go first, each alone on an idle worker
            if w is None:
                return
            cs, start, n = self.retry.popleft()
            self._submit(w, cs, start, n, isolated=True)
        while self.resplit:
            w = pool.pick(cap)
            if w is None:
                return
            cs, start, n = self.resplit.popleft()
            self._submit(w, cs, start, n, split=True)
        while self.undispatched:
            w = pool.pick(cap)
            if w is None:
                return
            cs = self.undispatched[0]
            if self.sh.layout.has_fixed and cs.pos0 is None and not self._reserve(cs):
                return
            self.undispatched.popleft()
            cs.dispatched = True
            self.in_pipeline += 1
            self._submit(w, cs, 0, cs.chunk.n)

    def _submit(self, worker: Any, cs: _ChunkState, start: int, n: int, isolated: bool = False,
                split: bool = False) -> None:
        c, nf = cs.chunk, self.nf
        dest = []
        if cs.pos0 is not None:
            S = self.sh.layout.slot_size
            j = start
            while j < start + n:
                p = cs.pos0 + j
                k, i = divmod(p, S)
                count = min(S - i, start + n - j)
                dest.append((self.sh.slots.segments[self.slots[k].phys].name, j - start, i, count))
                j += count
        task = Task(self.sh.pool.next_id(), c.first_seq, start, n, c.segment or self.sh.ring.name,
                    c.ring_offs[start * nf:(start + n) * nf], c.lens[start * nf:(start + n) * nf], dest,
                    isolated, split)
        self.tasks[task.task_id] = cs
        self.sh.pool.submit(worker, task)

    def _reserve(self, cs: _ChunkState) -> bool:
        """Give the chunk's groups output positions, taking physical slots for new logical ones.
        False when no slot is free (the user holds them, or they are still being filled)."""
        S = self.sh.layout.slot_size
        p0, n = self.next_pos, cs.chunk.n
        for k in range(p0 // S, (p0 + n - 1) // S + 1):
            if k not in self.slots:
                stuck = self.in_pipeline == 0 and not self.retry and not self.resplit  # nothing could free one
                phys = self.sh.slots.acquire(may_grow=stuck)
                if phys is None:
                    return False
                self.slots[k] = _Slot(phys, S)
        for k in range(p0 // S, (p0 + n - 1) // S + 1):
            lo, hi = max(p0, k * S), min(p0 + n, (k + 1) * S)
            self.slots[k].assigned += hi - lo
        cs.pos0 = p0
        self.next_pos = p0 + n
        return True

    # -- results -----------------------------------------------------------------------------------
    def _store(self, task: Task, frame: Frame) -> None:
        cs = self.tasks.pop(task.task_id, None)
        if cs is None:
            return
        self.stats.add_worker(frame.pid, frame.cpu, task.n)
        if frame.split:
            columns, errors = self._unsplit(frame)
        else:
            try:
                columns, errors = frame.values()
            except Exception:  # some value does not unpickle here: re-run, each value pickled alone
                self.resplit.append((cs, task.start, task.n))
                return
        lo, hi = task.start, task.start + task.n
        for dst, col in zip(cs.columns, columns):
            if dst is not None:
                dst[lo:hi] = col
        for j, err in errors.items():
            cs.errors[lo + j] = err
        cs.missing -= task.n

    def _unsplit(self, frame: Frame) -> tuple:
        """The columns and errors of a split frame: each value pickled on its own, one that cannot be
        unpickled here replaced by the error that says so."""
        columns, errors = pickle.loads(frame.body)
        for f, col in enumerate(columns):
            for j, b in enumerate(col or ()):
                if j in errors or b is None:
                    continue
                try:
                    col[j] = pickle.loads(b)
                except Exception as exc:
                    err = DecodeError(f"the value decoded by {self.cfg.decoders[f]!r} cannot be unpickled "
                                      f"in the consumer: {type(exc).__name__}: {exc}")
                    err.__cause__ = exc
                    errors[j] = RemoteError(err, f)
        return columns, errors

    def _orphaned(self, task: Task) -> None:
        """The worker running ``task`` died: re-run its groups, each alone on an idle worker.  A group
        whose isolated re-run kills its worker too has killed two: it is a poison record."""
        cs = self.tasks.pop(task.task_id, None)
        if cs is None:
            return
        self.stats.reruns += 1
        for j in range(task.start, task.start + task.n):
            tries = cs.attempts.get(j, 0) + 1
            cs.attempts[j] = tries
            if task.isolated and tries >= 2:
                exc = PipelineError("a decoder process died twice while decoding this sample "
                                    "(poison record: it crashes or exhausts its decoder)")
                cs.errors[j] = RemoteError(exc)
                cs.missing -= 1
            else:
                self.retry.append((cs, j, 1))

    # -- delivery ----------------------------------------------------------------------------------
    def _deliver(self, cs: _ChunkState) -> Tuple[List[Span], Optional[BaseException]]:
        """The spans of a complete chunk, and the error to raise after them (if any); then release its
        ring space."""
        sh, c = self.sh, cs.chunk
        try:
            spans, err = self._spans(cs)
        finally:
            if cs.dispatched:
                self.in_pipeline -= 1
            oneoff = mapped = 0
            if is_mapped(c.segment):
                mapped = sum(c.lens)
            elif c.segment is not None:
                unlink(c.segment)
                oneoff = sum(c.lens)
            try:
                self.released_pos = max(self.released_pos, c.ring_end)
                self.ctrl.send(Release(c.ring_end, oneoff, mapped))
            except (BrokenPipeError, OSError):
                pass  # the reader has finished
        delivered = sum(sp.n for sp in spans)
        self.stats.samples += delivered
        self.delivered += delivered
        return spans, err

    def _spans(self, cs: _ChunkState) -> Tuple[List[Span], Optional[BaseException]]:
        """Cut the chunk into spans: at each failed group, and where the output slot changes."""
        sh, c, nf = self.sh, cs.chunk, self.nf
        columns = list(cs.columns)
        if self.copied:
            self._copy_out(cs, columns)
        n, seq0 = c.n, c.first_seq
        if cs.pos0 is None and not cs.errors:  # the common case without fixed-shape outputs
            return [_new(Span, (seq0, n, None, 0, columns))], None
        S = sh.layout.slot_size
        spans: List[Span] = []
        a = 0
        for e in sorted(cs.errors) + [n]:
            j = a
            while j < e:  # groups a..e-1 succeeded: one span per slot they touch
                lease, index, b = None, 0, e
                if cs.pos0 is not None:
                    k, index = divmod(cs.pos0 + j, S)
                    b = min(e, j + S - index)
                    slot = self.slots[k]
                    if slot.lease is None:
                        slot.lease = sh.slots.lease(slot.phys)
                    lease = slot.lease
                    slot.remaining -= b - j
                    if slot.remaining == 0:
                        self._slot_done(k)
                cols = columns if (j, b) == (0, n) else [None if col is None else col[j:b] for col in columns]
                spans.append(_new(Span, (seq0 + j, b - j, lease, index, cols)))
                j = b
            if e == n:
                break
            if cs.pos0 is not None:
                self._abandon_slots(cs, e, e + 1)
            err = self._error_at(cs, e)
            if self.cfg.on_error == "raise":
                self._abandon_slots(cs, e + 1, n)
                return spans, err
            self.stats.skipped += 1
            log.warning("parrecio: skipped %s", err)
            a = e + 1
        return spans, None

    def _error_at(self, cs: _ChunkState, j: int) -> BaseException:
        """The DecodeError of group ``j`` of the chunk, naming the sample, its offset and its stream."""
        sh, c, r = self.sh, cs.chunk, cs.errors[j]
        source = self.streams.get(c.stream_id, sh.source.name)
        nf = self.nf
        what = (f"field {sh.field_names[r.field]!r} ({sh.cfg.decoders[r.field]!r})" if 0 <= r.field < nf
                else "decoder process")
        return r.as_decode_error(what, c.first_seq + j, c.stream_offs[j], source)

    def _copy_out(self, cs: _ChunkState, columns: list) -> None:
        """The passthrough fields' columns: their payloads copied out of the ring (or one-off segment)."""
        c, nf, sh = cs.chunk, self.nf, self.sh
        seg = Segment.attach(c.segment) if c.segment is not None and not is_mapped(c.segment) else None
        mem = (memoryview(seg.buf) if seg is not None else
               memoryview(self.mapped.get(c.segment)) if is_mapped(c.segment) else sh.ring_mem)
        try:
            offs, lens = c.ring_offs, c.lens
            for f in self.copied:
                columns[f] = [bytes(mem[o:o + k]) for o, k in zip(offs[f::nf], lens[f::nf])]
        finally:
            if mem is not sh.ring_mem:
                mem.release()
            if seg is not None:
                seg.close()

    def _abandon_slots(self, cs: _ChunkState, start: int, stop: int) -> None:
        """Positions of groups ``start..stop-1`` of the chunk will never be delivered (failed, or the
        pass ends with an error): count them as done so that their slots are finished."""
        if cs.pos0 is None:
            return
        S = self.sh.layout.slot_size
        for j in range(start, stop):
            k = (cs.pos0 + j) // S
            slot = self.slots.get(k)
            if slot is not None:
                slot.remaining -= 1
                if slot.remaining == 0:
                    self._slot_done(k)

    def ring_in_use(self) -> int:
        """Bytes of the input ring holding groups received and not yet delivered."""
        return max(0, self.received_pos - self.released_pos)

    def _slot_done(self, k: int) -> None:
        slot = self.slots.pop(k)
        slot.lease = None  # the user's views keep the memory; the pool frees it when they are gone
        self.sh.slots.finish(slot.phys)

    def _finish(self) -> None:
        end = self.end
        for k in list(self.slots):  # the last slot was only partly used
            slot = self.slots[k]
            slot.remaining -= self.sh.layout.slot_size - slot.assigned
            if slot.remaining <= 0:
                self._slot_done(k)
        if end.error is not None:
            err = end.error
            if isinstance(err, RemoteError):
                orig = err.original()
                raise PipelineError(f"the reader process failed on {self.sh.source.name!r}: "
                                    f"{err.type_name}: {err.message}") from orig
            if isinstance(err, CorruptRecordError):
                err = err.located(end.n_groups)
            raise err
        self.completed = True

    # -- shutdown ----------------------------------------------------------------------------------
    def abort(self) -> None:
        """End the pass from outside (close(), a new pass): the consumer's iterator raises if resumed."""
        self.aborted = not self.closed
        self.shutdown()

    def shutdown(self) -> None:
        """End the run: stop the reader, let in-flight tasks finish (or kill their workers), free the
        run's slots and one-off segments.  Idempotent; returns within a few seconds whatever the peers do."""
        if self.closed or os.getpid() != self.owner_pid:
            return
        self.closed = True
        sh = self.sh
        try:
            self.ctrl.send(Stop())
        except (BrokenPipeError, OSError):
            pass
        deadline = time.monotonic() + 1.0
        while self.reader.is_alive() and time.monotonic() < deadline:
            self._drain_data()
            self.reader.join(0.02)
        if self.reader.is_alive():
            self.reader.kill()  # not terminate(): on SIGTERM a child first waits to see if we died too
            self.reader.join(1.0)
        self._drain_data()
        for cs in self.chunks:
            if cs.chunk.segment is not None and not is_mapped(cs.chunk.segment):
                unlink(cs.chunk.segment)
        sweep(f"{sh.prefix}r{self.reader.pid}x")  # one-off segments it made but never sent
        self.chunks.clear()
        self.undispatched.clear()
        self.retry.clear()
        self.resplit.clear()
        if sh.pool is not None and sh.pool.load():
            sh.pool.drain_all(self.cfg.drain_timeout)
        self.tasks.clear()
        for k in list(self.slots):
            self._slot_done(k)
        close_quietly(self.data, self.ctrl)
        self.mapped.close()

    def forget_after_fork(self) -> None:
        """In the child of an ``os.fork()`` of the consumer: let go of the reader process silently."""
        self.closed = True
        forget_processes([self.reader])
        close_quietly(self.data, self.ctrl)

    def _drain_data(self) -> None:
        try:
            while self.data.poll():
                msg = self.data.recv()
                if isinstance(msg, Chunk):
                    self.chunks.append(_ChunkState(msg, [], 0))  # only its one-off segment matters
                elif isinstance(msg, ReaderEnd) and self.end is None:
                    self.end = msg
                    self.stats.add_reader(msg.stats)
        except (EOFError, OSError):
            pass
