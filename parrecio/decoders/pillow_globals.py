"""Pillow's process-wide settings, changed for one decode at a time without races between threads.

``ImageFile.LOAD_TRUNCATED_IMAGES`` and ``Image.MAX_IMAGE_PIXELS`` are module globals that Pillow reads
while it opens and loads an image; a decoder that needs another value sets it around its call and puts
the user's value back.  Done bare, two threads that decode at once (decoders called directly from a thread
pool, ``workers=0`` readers in two threads) undo each other's setting: a strict decode accepted a
truncated image, and the user's process was left with ``MAX_IMAGE_PIXELS = None``.  Here the decodes that
need the same value share it, a decode that needs another waits until they are done, and the last one out
puts back the value it found.  Pillow's own code in other threads of the process still sees a decode's
value while it runs, as it did.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

_UNSET = object()


class SharedSetting:
    """The attribute ``name`` of ``owner``, held at one value by any number of concurrent holders."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a thread that held it does not exist there

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._holders = 0
        self._value: Any = _UNSET
        self._found: Any = _UNSET

    @contextmanager
    def holding(self, value: Any) -> Iterator[None]:
        """``owner.name == value`` from entry to exit, whatever other threads hold meanwhile."""
        with self._cond:
            while self._holders and self._value != value:
                self._cond.wait()
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
