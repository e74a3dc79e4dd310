"""The decoder processes: start, feed, watch, replace.

Each worker has a task pipe and a result pipe of its own, and its process sentinel; the consumer waits on
all of them at once (``multiprocessing.connection.wait``), so a dead worker is noticed the moment it
dies, not at the next timeout.  A dead worker's unfinished tasks are handed back to the caller (who
decides how to re-run them) and a replacement is started in its place.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..errors import PipelineError
from .messages import Stop, Task, TaskDone
from .worker import WorkerConfig, worker_main

log = logging.getLogger("parrecio")

__all__ = ["WorkerPool", "child_entry"]


def child_entry(close_fds: List[int], target, *args) -> None:
    """Process entry point: under ``fork``, first close the parent's ends that the child inherited
    (the lifeline's write end above all: a child holding it would keep the lifeline from ever firing)."""
    import os
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    target(*args)


def describe_exit(code: Optional[int]) -> str:
    """'exit code 1' or 'killed by SIGKILL'."""
    if code is not None and code < 0:
        import signal
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class _Worker:
    index: int
    proc: Any
    task_conn: Any
    result_conn: Any
    inflight: Dict[int, Task] = field(default_factory=dict)
    progress: float = 0.0  # monotonic time of its last result, or of getting work when it had none


class WorkerPool:
    """``n`` decoder processes started from ``ctx`` (a multiprocessing context)."""

    def __init__(self, ctx, cfg: WorkerConfig, n: int, lifeline_r, fork_close: List[int]) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.n = n
        self.lifeline_r = lifeline_r
        self.fork_close = fork_close
        self.workers: List[_Worker] = []
        self.replaced = 0
        self.deaths_without_progress = 0  # reset by every result: bounds a crash-at-start loop
        self._ids = itertools.count()

    def start(self) -> None:
        """Start the ``n`` processes."""
        self.workers = [self._spawn(i) for i in range(self.n)]

    def _spawn(self, index: int) -> _Worker:
        task_r, task_w = self.ctx.Pipe(duplex=False)
        res_r, res_w = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=child_entry, name=f"parrecio-worker-{index}", daemon=True,
                                args=(self.fork_close, worker_main, self.cfg, index, task_r, res_w,
                                      self.lifeline_r))
        proc.start()
        task_r.close()
        res_w.close()
        return _Worker(index, proc, task_w, res_r)

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
        an isolated task gets nothing else (were it to die, the task must be the only suspect)."""
        best = min((w for w in self.workers
                    if not any(t.isolated for t in w.inflight.values())),
                   key=lambda w: len(w.inflight), default=None)
        return best if best is not None and len(best.inflight) < max_inflight else None

    def submit(self, worker: _Worker, task: Task) -> None:
        """Send ``task`` to ``worker`` and count it in flight there."""
        if not worker.inflight:
            worker.progress = time.monotonic()
        worker.inflight[task.task_id] = task
        try:
            worker.task_conn.send(task)
        except (BrokenPipeError, OSError):
            pass  # it died: its sentinel will fire and the task will be re-run

    def waitables(self) -> List[Any]:
        """Every result pipe and process sentinel, for ``multiprocessing.connection.wait``."""
        objs: List[Any] = []
        for w in self.workers:
            objs.append(w.result_conn)
            objs.append(w.proc.sentinel)
        return objs

    def collect(self, ready: List[Any]) -> Tuple[List[Tuple[Task, TaskDone]], List[Task]]:
        """Results from the ready workers, and the unfinished tasks of those that died."""
        done: List[Tuple[Task, TaskDone]] = []
        orphans: List[Task] = []
        for i, w in enumerate(self.workers):
            if w.result_conn in ready:
                self._drain(w, done)
            if w.proc.sentinel in ready and not w.proc.is_alive():
                self._drain(w, done)  # results it sent before dying still count
                self.deaths_without_progress = 0 if done else self.deaths_without_progress + 1
                if self.deaths_without_progress > 2 * self.n + 2:
                    raise PipelineError(
                        f"decoder processes keep dying without finishing any task (the last: "
                        f"{describe_exit(w.proc.exitcode)}); see their output above -- a decoder that "
                        f"cannot be unpickled or imported in a new process, or a script without "
                        f"`if __name__ == '__main__':` under the spawn/forkserver start methods")
                orphans.extend(w.inflight.values())
                log.warning("parrecio: decoder process %d (pid %d) died (%s); "
                            "re-running its %d task(s) in a new one",
                            w.index, w.proc.pid, describe_exit(w.proc.exitcode), len(w.inflight))
                self._discard(w)
                self.workers[i] = self._spawn(w.index)
                self.replaced += 1
        return done, orphans

    def _drain(self, w: _Worker, done: list) -> None:
        try:
            while w.result_conn.poll():
                msg: TaskDone = w.result_conn.recv()
                self.deaths_without_progress = 0
                w.progress = time.monotonic()
                task = w.inflight.pop(msg.task_id, None)
                if task is not None:
                    done.append((task, msg))
        except (EOFError, OSError):
            pass  # a message cut short by the worker's death: its task stays in flight

    @staticmethod
    def _discard(w: _Worker) -> None:
        for c in (w.task_conn, w.result_conn):
            try:
                c.close()
            except OSError:
                pass
        w.proc.join(0.1)

    def kill_stuck(self, timeout: float) -> None:
        """Kill the workers that hold tasks but sent no result for ``timeout`` seconds (a decoder that
        hangs): their death is then handled like any other, and a sample that hangs again is poison."""
        now = time.monotonic()
        for w in self.workers:
            if w.inflight and now - w.progress > timeout and w.proc.is_alive():
                log.warning("parrecio: decoder process %d (pid %d) made no progress for %.0f s; killing it",
                            w.index, w.proc.pid, now - w.progress)
                w.proc.kill()

    def drain_all(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every task in flight to finish (results discarded);
        workers still busy then are killed and replaced, so nothing writes into slots afterwards."""
        from multiprocessing.connection import wait
        deadline = time.monotonic() + timeout
        while self.load() and time.monotonic() < deadline:
            busy = [w for w in self.workers if w.inflight]
            ready = wait([o for w in busy for o in (w.result_conn, w.proc.sentinel)],
                         max(0.0, deadline - time.monotonic()))
            for w in busy:
                if w.result_conn in ready:
                    self._drain(w, [])
                if w.proc.sentinel in ready and not w.proc.is_alive():
                    w.inflight.clear()
        for i, w in enumerate(self.workers):
            if w.inflight or not w.proc.is_alive():
                w.proc.kill()
                self._discard(w)
                self.workers[i] = self._spawn(w.index)

    def stop(self, timeout: float = 1.0) -> None:
        """Ask every worker to stop; kill those that do not within ``timeout`` seconds.  Idempotent."""
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
