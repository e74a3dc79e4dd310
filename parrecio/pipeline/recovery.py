"""The consumer's policy for work that has to be done again (:class:`~parrecio.pipeline.run.Run` applies it).

- **A worker died** (killed, out of memory, a decoder that crashed it): its task's groups are re-run,
  each alone on an idle worker, so that a group that kills its worker again -- a *poison* record -- is
  found; a single group that killed two workers becomes a decode error of that sample instead of an
  endless respawn loop.
- **A result did not unpickle here** (a value whose ``__reduce__`` fails in the consumer): the task is
  re-run with every value pickled on its own (``Task.split``), so that only the sample at fault becomes a
  decode error (:func:`unsplit`).
"""

from __future__ import annotations

import pickle
from collections import deque
from typing import Any, Deque, Optional, Sequence, Tuple

from ..errors import DecodeError, PipelineError
from .messages import RemoteError, Task
from .wire import Frame

__all__ = ["Recovery", "unsplit"]


class Recovery:
    """Runs of groups to submit again, before any new chunk: ``retry`` (each alone, after a worker
    died) and ``resplit`` (values pickled one by one), as ``(chunk state, start, n)``."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats
        self.retry: Deque[Tuple[Any, int, int]] = deque()
        self.resplit: Deque[Tuple[Any, int, int]] = deque()

    def orphaned(self, cs: Any, task: Task, taken: bool = True, blamed: Optional[int] = None,
                 how: str = "") -> None:
        """The worker running ``task`` (of the chunk state ``cs``) died: re-run its groups, each alone.  A
        group whose isolated re-run kills its worker too has killed two: it is a poison record -- unless
        that worker died before it took the group (``taken`` False: killed from outside while it started,
        or while it waited), which says nothing about the group: it is re-run again.  Of a whole task,
        only the group its worker was decoding (``blamed``, 0 .. n-1; -1: none) counts as having killed
        one; ``None`` (not known): every group of the task does.  ``how``: how the worker died (said in a
        poison record's error)."""
        self.stats.reruns += 1
        if task.isolated and not taken:
            self.retry.append((cs, task.start, task.n))
            return
        for j in range(task.start, task.start + task.n):
            if not task.isolated and blamed is not None and j != task.start + blamed:
                self.retry.append((cs, j, 1))  # decoded, or waiting, when its worker died: not a suspect
                continue
            tries = cs.attempts.get(j, 0) + 1
            cs.attempts[j] = tries
            if task.isolated and tries >= 2:
                last = f", {how} the second time" if how else ""
                exc = PipelineError(f"a decoder process died twice while decoding this sample{last} "
                                    f"(poison record: it crashes or exhausts its decoder)")
                cs.errors[j] = RemoteError(exc)
                cs.missing -= 1
            else:
                self.retry.append((cs, j, 1))

    def clear(self) -> None:
        self.retry.clear()
        self.resplit.clear()


def unsplit(frame: Frame, decoders: Sequence[Any]) -> tuple:
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
                err = DecodeError(f"the value decoded by {decoders[f]!r} cannot be unpickled "
                                  f"in the consumer: {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                errors[j] = RemoteError(err, f)
    return columns, errors
