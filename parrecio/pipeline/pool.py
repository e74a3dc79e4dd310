"""The decoder processes: start, feed, watch, replace.

Each worker has a task pipe and a result pipe of its own, and its process sentinel; the consumer waits on
all of them at once (``multiprocessing.connection.wait``), so a dead worker is noticed the moment it
dies, not at the next timeout.  Results are read without blocking (:mod:`parrecio.pipeline.wire`), so
a worker stopped in the middle of a large result cannot freeze the consumer.  A dead worker's unfinished
tasks are handed back to the caller (who decides how to re-run them) and a replacement is started in
its place.

A worker is *stuck* when it holds tasks and sent no byte for ``task_timeout`` seconds **of the
consumer's waiting** (:attr:`WorkerPool.clock`, advanced by the caller only while it waits for
results).  Time the consumer spends in its own loop body, or stopped, never counts against a decoder:
a training step longer than ``task_timeout`` is not a hung decoder.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import pickle
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Dict, List, Optional, Set, Tuple

from ..errors import PipelineError
from .children import child_entry, close_quietly, describe_exit, environ_now, forget_processes, start, start_retrying
from .config import PipelineConfig
from .messages import Stop, Task
from .pairing import Bell, Pairs, board_name
from .shm import Segment
from .wire import Frame, FrameReader, send_message
from .worker import CANNOT_LOAD, TAKEN, WorkerJob, worker_main

log = logging.getLogger("parrecio")

__all__ = ["WorkerPool", "ALL", "BELL"]

ALL = -2   # waitables(): every result pipe
BELL = -1  # waitables(): the bell, no result pipe (but those holding part of a frame)


@dataclass
class _Worker:
    index: int
    proc: Any
    task_conn: Any
    result_conn: Any
    task_fd: int            # task_conn.fileno(), read once: a task is written to it per chunk
    inbox: FrameReader
    inflight: Dict[int, Task] = field(default_factory=dict)
    progress: float = 0.0   # pool clock at its last byte received, or when it got work while it had none
    killing: bool = False   # judged stuck and killed; its death is yet to be collected
    taken: Set[int] = field(default_factory=set)  # isolated tasks it said it began (worker.TAKEN)
    sentinel: int = -1      # proc.sentinel, read once (the property checks the process is open)
    retired: List[str] = field(default_factory=list)  # output slots given back, to unmap with its next task


class WorkerPool:
    """``cfg.workers`` decoder processes started from ``ctx`` (a multiprocessing context)."""

    def __init__(self, ctx, cfg: PipelineConfig, job: WorkerJob, lifeline_r) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.job = job
        self.lifeline_r = lifeline_r
        self.workers: List[_Worker] = []
        self.started = False
        self.replaced = 0
        self.deaths_without_progress = 0  # reset by every result: bounds a crash-at-start loop
        self.clock = 0.0                  # seconds the consumer has spent waiting on the pool
        self.version = 0                  # changes whenever waitables() does
        self._ids = itertools.count()
        self._turn = 0                    # where pick() starts looking: ties go round the workers
        self._generations = itertools.count()  # every worker ever started gets its own seed
        self.bell: Optional[Bell] = None  # see start()
        self.pairs = Pairs()
        self.board: Optional[Segment] = None  # the progress board: see start()

    def start(self) -> None:
        """Start the ``cfg.workers`` processes (one by one into ``workers``: when a start fails, those
        started before it are stopped with the pool)."""
        self.started = True
        cfg = self.cfg
        if cfg.prefetch >= 2:
            # The consumer may wait for pairs of results on the bell instead of each result on its pipe
            # (parrecio.pipeline.pairing); with one task per worker, a pair would keep one idle.
            try:
                self.bell = Bell(self.ctx, board_name(self.job.prefix))
            except (OSError, PipelineError):  # (8 KiB of /dev/shm, or a pipe, not to be had: results are waited
                # for one by one; a full /dev/shm is a PipelineError of shm._reserve)
                log.debug("parrecio: no pairing bell", exc_info=True)
            else:
                self.job = dataclasses.replace(self.job, pairs=self.bell.name)
        # The progress board: each worker keeps [task id, group] of what it decodes there, so that when
        # it dies only that group is suspected of killing it, not every group of the tasks it held (a
        # second death of any of those, killed from outside, made an innocent sample a poison record).
        try:
            self.board = Segment.create(self.job.prefix + "progress", 16 * cfg.workers)
        except (OSError, PipelineError):  # (a page of /dev/shm not to be had: every group of a dead worker's
            # tasks is suspected)
            log.debug("parrecio: no progress board", exc_info=True)
        else:
            self.job = dataclasses.replace(self.job, progress=self.board.name)
        for i in range(self.cfg.workers):
            self.workers.append(self._spawn(i))

    def _spawn(self, index: int) -> _Worker:
        """A new worker ``index``.  A fork server that is dying (a SIGTERM sent to the whole process group:
        a container stopped, a job preempted) answers nothing: multiprocessing raises EOFError, and starts
        a new server only once the old one is seen dead.  So such a start is tried again for up to 2 s,
        with new pipes each time (a child the dying server forked anyway finds its pipes closed, and ends):
        a worker replaced while a pass shut down, after the user's handler turned that SIGTERM into an
        exception, failed with EOFError, a traceback in place of theirs."""
        return start_retrying(self.ctx, lambda: self._spawn_once(index))

    def _spawn_once(self, index: int) -> _Worker:
        self.version += 1
        job = self.job
        if self.board is not None:
            self._progress(index)[:] = array("q", [-1, -1])  # (not the entry of the worker it replaces)
            job = dataclasses.replace(job, slot=index)
        task_r, task_w = self.ctx.Pipe(duplex=False)
        res_r, res_w = self.ctx.Pipe(duplex=False)
        try:
            proc = self.ctx.Process(target=child_entry, name=f"parrecio-worker-{index}", daemon=True,
                                    args=(self.job.prefix, self.lifeline_r, worker_main, self.cfg, job,
                                          next(self._generations), task_r, res_w, self.lifeline_r,
                                          self.bell.w if self.bell is not None else None),
                                    kwargs={"environ": environ_now()})
            start(proc)
        except BaseException:
            close_quietly(task_r, task_w, res_r, res_w)
            raise
        task_r.close()
        res_w.close()
        return _Worker(index, proc, task_w, res_r, task_w.fileno(), FrameReader(res_r.fileno()), progress=self.clock,
                       sentinel=proc.sentinel)

    def _progress(self, index: int) -> memoryview:
        assert self.board is not None
        return memoryview(self.board.buf).cast("q")[2 * index:2 * index + 2]

    def _blamed(self, w: _Worker, task: Task) -> Optional[int]:
        """The group of ``task`` (0 .. n-1) that worker ``w``, dead, was decoding; -1 for none (it had not
        begun the task, or had decoded all of it); None when there is no progress board to tell."""
        if self.board is None:
            return None
        task_id, group = self._progress(w.index).tolist()
        return group if task_id == task.task_id and 0 <= group < task.n else -1

    @property
    def pids(self) -> List[int]:
        return [w.proc.pid for w in self.workers]

    def next_id(self) -> int:
        """A new task id."""
        return next(self._ids)

    def load(self) -> int:
        """Tasks in flight, all workers together."""
        return sum(len(w.inflight) for w in self.workers)

    def pick(self, max_inflight: int) -> Optional[_Worker]:
        """The least loaded worker with fewer than ``max_inflight`` tasks, or None.  A worker running
        an isolated task gets nothing else (were it to die, the task must be the only suspect).  Ties go
        round the workers, from the one after the last pick: when the reader is slower than the
        decoders (every worker idle at each chunk), the work is still spread, not all on worker 0."""
        workers = self.workers
        best, load, start = None, max_inflight, self._turn
        for k in range(len(workers)):  # a plain loop: called several times per task by the consumer
            w = workers[(start + k) % len(workers)]
            n = len(w.inflight)
            if n < load and not w.killing and not (n and any(t.isolated for t in w.inflight.values())):
                best, load = w, n
        if best is not None:
            self._turn = best.index + 1
        return best

    def retire(self, names: List[str]) -> None:
        """The output slots ``names`` were given back (``SlotPool.retire``): each worker unmaps them when
        its next task comes (a worker started later never mapped them)."""
        for w in self.workers:
            w.retired.extend(names)

    def submit(self, worker: _Worker, task: Task) -> None:
        """Send ``task`` to ``worker`` and count it in flight there."""
        if worker.retired:
            task.retired, worker.retired = tuple(worker.retired), []
        if not worker.inflight:
            worker.progress = self.clock
        worker.inflight[task.task_id] = task
        try:
            send_message(worker.task_fd, task)
        except (BrokenPipeError, OSError):
            pass  # it died: its sentinel will fire and the task will be re-run

    def waitables(self, watch: int = ALL) -> List[Any]:
        """What to wait on: every process sentinel, and ``watch``: the result pipes of all workers
        (:data:`ALL`), of worker ``watch`` alone, or of none but those holding part of a frame
        (:data:`BELL`); the bell's pipe unless ``ALL``."""
        objs: List[Any] = []
        for w in self.workers:
            if not w.inbox.eof and (watch == ALL or w.index == watch or w.inbox.partial):
                objs.append(w.result_conn)
            objs.append(w.sentinel)
        if watch != ALL and self.bell is not None:
            objs.append(self.bell.fd)
        return objs

    def partial(self) -> Tuple[int, ...]:
        """The workers whose result pipe holds part of a frame (a ``waitables`` key)."""
        return tuple(w.index for w in self.workers if w.inbox.partial)

    def collect(self, ready: List[Any], every: bool = False
                ) -> Tuple[List[Tuple[Task, Frame]], List[Tuple[Task, bool, Optional[int], str]]]:
        """Results from the ready workers (``every``: from every worker, when not all result pipes
        were watched), and the unfinished tasks of those that died, each with whether its worker had
        begun it (known of isolated tasks, which their worker says it takes: others count as begun) and
        the group it was decoding (:meth:`_blamed`), and how it died."""
        done: List[Tuple[Task, Frame]] = []
        orphans: List[Tuple[Task, bool, Optional[int], str]] = []
        bell = self.bell
        if bell is not None and bell.fd in ready:
            bell.drain()  # before the pipes: a ring is written after its frames
        for i, w in enumerate(self.workers):
            if w.result_conn in ready or (every and not w.inbox.eof):
                self._drain(w, done)
            if w.sentinel in ready and not w.proc.is_alive():
                got = len(done)
                self._drain(w, done)  # results it sent before dying still count
                self.deaths_without_progress = 0 if len(done) > got else self.deaths_without_progress + 1
                if self.deaths_without_progress > 2 * self.cfg.workers + 2:
                    code = w.proc.exitcode
                    why = ("something outside kills them (the kernel's OOM killer: see `dmesg`; a job "
                           "scheduler), or they crash as they start" if code is not None and code < 0 else
                           "see their output above -- a decoder that cannot be unpickled or imported in a new "
                           "process, or a script without `if __name__ == '__main__':` under the "
                           "spawn/forkserver start methods")
                    raise PipelineError(f"decoder processes keep dying without finishing any task (the last: "
                                        f"{describe_exit(code)}): {why}")
                how = describe_exit(w.proc.exitcode)
                orphans.extend((t, not t.isolated or t.task_id in w.taken, self._blamed(w, t), how)
                               for t in w.inflight.values())
                if w.inflight:
                    log.warning("parrecio: decoder process %d (pid %d) died (%s); "
                                "re-running its %d task(s) in a new one",
                                w.index, w.proc.pid, describe_exit(w.proc.exitcode), len(w.inflight))
                else:
                    log.warning("parrecio: decoder process %d (pid %d) died (%s) between tasks; "
                                "starting a new one", w.index, w.proc.pid, describe_exit(w.proc.exitcode))
                w.inflight.clear()  # (orphans now: a start of its replacement that fails leaves nothing to
                self._discard(w)    # wait for on its closed pipe -- "handle is closed" hid that failure)
                self.workers[i] = self._spawn(w.index)
                self.replaced += 1
        return done, orphans

    def _drain(self, w: _Worker, done: list) -> None:
        before = w.inbox.received
        for frame in w.inbox.read():
            if frame.task_id == CANNOT_LOAD:
                raise PipelineError(f"decoder process {w.index} cannot load the decoders it was sent: "
                                    f"{pickle.loads(frame.body)} (a decoder, and what it uses, must be importable "
                                    f"in a new process too: one started with this process's sys.path, in its "
                                    f"current directory)")
            if frame.body == TAKEN:  # (not progress: a worker that dies at once keeps saying it)
                w.taken.add(frame.task_id)
                continue
            self.deaths_without_progress = 0
            w.taken.discard(frame.task_id)
            task = w.inflight.pop(frame.task_id, None)
            if task is not None:
                done.append((task, frame))
        if w.inbox.received != before:
            w.progress = self.clock
        if w.inbox.eof:
            self.version += 1  # its result pipe leaves the waitables

    @staticmethod
    def _discard(w: _Worker) -> None:
        close_quietly(w.task_conn, w.result_conn)
        w.proc.join(0.1)

    def kill_stuck(self, timeout: float) -> None:
        """Kill the workers that hold tasks but sent nothing for ``timeout`` seconds of the consumer's
        waiting (a decoder that hangs, or a process stopped mid-send): their death is then handled like
        any other, and a sample that hangs again is poison."""
        for w in self.workers:
            if w.inflight and not w.killing and self.clock - w.progress > timeout and w.proc.is_alive():
                log.warning("parrecio: decoder process %d (pid %d) made no progress for %.1f s while "
                            "the consumer waited; killing it", w.index, w.proc.pid, self.clock - w.progress)
                w.killing = True
                w.proc.kill()

    def drain_all(self, timeout: float, replace: bool = True) -> None:
        """At the end of a pass: wait up to ``timeout`` seconds for every task in flight to finish
        (results discarded); workers still busy then are killed and replaced, so nothing writes into
        slots afterwards, and so are those that died (a pass that ended on "keep dying" left one in
        the pool, and every later pass failed on it at once).  ``replace=False`` (the reader closes):
        killed, not replaced -- at interpreter exit multiprocessing's own exit handler may have run
        first, and a start through its fork server, gone by then, printed a traceback."""
        deadline = time.monotonic() + timeout
        while self.load() and time.monotonic() < deadline:
            busy = [w for w in self.workers if w.inflight and not w.inbox.broken]  # (broken: replaced below)
            ready = wait([o for w in busy for o in (w.result_conn, w.proc.sentinel)],
                         max(0.0, deadline - time.monotonic()))
            for w in busy:
                if w.result_conn in ready:
                    self._drain(w, [])
                if w.proc.sentinel in ready and not w.proc.is_alive():
                    w.inflight.clear()
        for i, w in enumerate(self.workers):
            dead = not w.proc.is_alive()
            if w.inflight or w.killing or w.inbox.partial or dead:
                w.proc.kill()
                self._discard(w)
                if replace:
                    self.workers[i] = self._spawn(w.index)
                    self.replaced += dead and not w.killing  # (a dead one not replaced yet: see collect())
        self.deaths_without_progress = 0  # (each pass gets its own allowance)

    def unlink(self) -> None:
        """Remove the boards' names (their mappings stay valid): see ``Resources._unlink_memory``."""
        if self.bell is not None:
            self.bell.segment.unlink()
        if self.board is not None:
            self.board.unlink()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask every worker to stop; kill those that do not within ``timeout`` seconds.  Idempotent."""
        try:
            for w in self.workers:
                try:
                    w.task_conn.send(Stop())
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + timeout
            for w in self.workers:
                w.proc.join(max(0.0, deadline - time.monotonic()))
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join(1.0)
                self._discard(w)
            self.workers = []
        finally:  # (also when Ctrl-C cuts the wait short: the boards' segments must go)
            if self.bell is not None:
                bell, self.bell = self.bell, None
                bell.close()
            if self.board is not None:
                board, self.board = self.board, None
                board.unlink()
                board.close()

    def forget_after_fork(self) -> None:
        """In the child of an ``os.fork()`` of the consumer: let go of the workers without a word."""
        forget_processes(w.proc for w in self.workers)
        for w in self.workers:
            close_quietly(w.task_conn, w.result_conn)
        self.workers = []
        self.board = None  # (the parent's to remove)
        if self.bell is not None:
            # Its read end is the parent's; its write end stays open: a decoder process started by the
            # fork start method is such a child too, and rings with it.  The board is the parent's to remove.
            close_quietly(self.bell.r)
            self.bell = None
