"""A thread pool of daemon threads, for reads that may hang on the network.

:class:`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits, and a
``shutdown(cancel_futures=True)`` cancels only what has not started.  A ranged GET already running
against a server that stopped answering waits out botocore's timeouts and retries (``read_timeout`` x
``max_attempts``: 150 s by default), so a program that closed its reader could not exit for minutes.
Here the threads are daemons (the interpreter does not wait for them), and what they run checks
:attr:`DaemonPool.closed` between attempts.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, List

__all__ = ["DaemonPool"]


class DaemonPool:
    """``submit(fn, *args)`` -> a :class:`~concurrent.futures.Future`, run by at most ``workers``
    daemon threads named ``<name> N``, started by the first ``workers`` submits."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers, self._name = max(1, int(workers)), name
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.closed = False       # shut down: what runs should stop at its next chance

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "Future[Any]":
        future: "Future[Any]" = Future()
        with self._lock:
            if self.closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if len(self._threads) < self._workers:
                t = threading.Thread(target=self._work, name=f"{self._name} {len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                del future, fn, args, kwargs, item  # (not kept alive while this thread waits)
            if self.closed:
                return

    def shutdown(self, wait: bool = False) -> None:
        """Stop: queued work is cancelled, idle threads end, running work ends at its next look at
        :attr:`closed`.  ``wait``: join the threads (bounded by what they run).  A no-op in a forked
        child (its threads are not there; a parent's thread may have held the lock at the fork)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            self.closed = True
            threads = list(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join()
