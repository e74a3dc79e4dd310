"""Pillow's process-wide settings, changed for one decode at a time without races between threads.

``ImageFile.LOAD_TRUNCATED_IMAGES`` and ``Image.MAX_IMAGE_PIXELS`` are module globals that Pillow reads
while it opens and loads an image; a decoder that needs another value sets it around its call and puts
the user's value back.  Done bare, two threads that decode at once (decoders called directly from a thread
pool, ``workers=0`` readers in two threads) undo each other's setting: a strict decode accepted a
truncated image, and the user's process was left with ``MAX_IMAGE_PIXELS = None``.  Here the decodes that
need the same value share it, a decode that needs another waits until they are done (and holds up those
that come after it, so that it is not starved), and the last one out puts back the value it found.
Pillow's own code in other threads of the process still sees a decode's value while it runs, as it did.

Both survive ``os.fork()`` (a DataLoader's or a pool's fork workers, ``start_method="fork"`` decoders):
a thread that held a setting or the lock at the fork does not exist in the child, which gets a fresh one
(and the user's value back).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator, List, Tuple

_UNSET = object()


class SharedSetting:
    """The attribute ``name`` of ``owner``, held at one value by any number of concurrent holders."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self._reset()
        os.register_at_fork(after_in_child=self._after_fork)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._holders = 0
        self._waiting: List[Tuple[object, Any]] = []  # (token, value) of the threads waiting, oldest first
        self._value: Any = _UNSET
        self._found: Any = _UNSET

    def _after_fork(self) -> None:
        if self._found is not _UNSET:  # held (or being taken) by a thread that is not in this child
            setattr(self.owner, self.name, self._found)
        self._reset()

    def _may_enter(self, token: object, value: Any) -> bool:
        """Whether the waiter ``token`` may hold now: first in line once nobody holds, or joining holders
        of its value when nobody ahead of it waits for another (newcomers could otherwise keep the count
        of holders above 0, and a waiter for another value out, for ever)."""
        if not self._holders:
            return self._waiting[0][0] is token
        if self._value != value:
            return False
        for t, v in self._waiting:
            if t is token:
                return True
            if v != value:
                return False
        return False  # pragma: no cover - the token is always in line

    @contextmanager
    def holding(self, value: Any) -> Iterator[None]:
        """``owner.name == value`` from entry to exit, whatever other threads hold meanwhile."""
        with self._cond:
            if self._waiting or (self._holders and self._value != value):
                entry = (object(), value)
                self._waiting.append(entry)
                try:
                    while not self._may_enter(entry[0], value):
                        self._cond.wait()
                finally:
                    self._waiting.remove(entry)
                    self._cond.notify_all()  # (the next in line may go now too)
            if not self._holders:
                self._found, self._value = getattr(self.owner, self.name), value
                if self._found != value:
                    setattr(self.owner, self.name, value)
            self._holders += 1
        try:
            yield
        finally:
            with self._cond:
                self._holders -= 1
                if not self._holders:
                    if getattr(self.owner, self.name) != self._found:
                        setattr(self.owner, self.name, self._found)
                    self._value = self._found = _UNSET
                    self._cond.notify_all()


class ForkSafeLock:
    """A ``threading.Lock`` (as a context manager) that a forked child gets free: one held by a thread
    of the parent at the fork would be held for ever there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()
