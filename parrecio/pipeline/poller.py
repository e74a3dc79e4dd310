"""Waiting on many pipes and process sentinels at once, without paying for the set on every wait.

``multiprocessing.connection.wait`` builds a new selector and registers every object on each call:
~15-20 us with a reader and two workers, paid once per message by the consumer.  :class:`Poller` keeps
one ``select.poll`` object whose registrations change only when the set of objects does (a worker
replaced, the reader finished), so a wait costs one system call.
"""

from __future__ import annotations

import select
from typing import Any, Callable, Dict, Hashable, List, Sequence, Tuple

__all__ = ["Poller", "ReadyCheck", "below_buffer"]

_EVENTS = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else obj.fileno()


class Poller:
    """``wait(timeout)`` -> the ready objects among those given to :meth:`watch` (pipes, connections,
    process sentinels: anything with ``fileno()``, or an int file descriptor)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._objs: Dict[int, Any] = {}
        self._key: Hashable = object()

    def watch(self, key: Hashable, objs: Callable[[], Sequence[Any]]) -> None:
        """Watch the objects ``objs()`` returns; ``key`` names the set: while it is unchanged,
        ``objs`` is not called (pass something that changes whenever the set does)."""
        if key == self._key:
            return
        self._key = key
        new = {_fd(o): o for o in objs()}
        for fd in self._objs.keys() - new.keys():
            self._poll.unregister(fd)
        for fd in new.keys() - self._objs.keys():
            self._poll.register(fd, _EVENTS)
        self._objs = new

    def wait(self, timeout: float) -> List[Any]:
        """The watched objects that are ready (readable, closed or errored) within ``timeout`` s."""
        if not self._objs:
            return []
        try:
            events = self._poll.poll(max(0, int(timeout * 1000 + 0.999)))
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for safety
            return []
        objs = self._objs
        return [objs[fd] for fd, _ in events if fd in objs]


class ReadyCheck:
    """``ready()``: whether one pipe or sentinel is readable (or closed) right now, with one ``poll(0)``
    system call.  ``Connection.poll()`` and ``Process.is_alive()`` each build a selector per call
    (~15-20 us); the consumer asks this of the reader's pipe and sentinel at every message it takes."""

    __slots__ = ("_poll",)

    def __init__(self, obj: Any) -> None:
        self._poll = select.poll()
        self._poll.register(_fd(obj), _EVENTS)

    def ready(self, timeout_ms: int = 0) -> bool:
        """Whether it is readable now, or becomes so within ``timeout_ms`` milliseconds."""
        return bool(self._poll.poll(timeout_ms))


def below_buffer(file: Any) -> Tuple[Any, Callable[[], int]]:
    """``(what to read, pending())`` of a stream that is waited for with ``poll()``: its raw file below any
    Python-level buffer (data waiting in a ``BufferedReader`` is invisible to ``poll()``: we would wait
    for bytes we already have), and the bytes that raw file holds above its descriptor (a stream whose
    first bytes were read to check them: ``PrefixedRaw.pending``), which need no wait."""
    raw = getattr(file, "raw", None)
    if raw is not None and hasattr(raw, "readinto"):
        file = raw
    return file, getattr(file, "pending", _nothing_pending)


def _nothing_pending() -> int:
    return 0
