"""The reader process's side of its pipes: chunks out, control in, the consumer's lifeline.

Every wait of the reader process (for ring space, for the one-off or mapped budget, for data from a
stalled FIFO) goes through :meth:`Link.watch`: while it waits it handles ``Release`` and ``Stop`` and
notices the consumer's death (EOF on the lifeline; then it stops, and child_entry removes the run's
shared memory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, List

from .messages import Release, Stop, Waiting
from .poller import Poller
from .wire import send_messages

__all__ = ["Link", "InFlight", "Stopped"]


class Stopped(Exception):
    """The consumer asked us to stop, or died."""


@dataclass
class InFlight:
    """What the reader sent that the consumer has not released yet (bounded by the settings' budgets)."""
    oneoff: int = 0   # bytes of one-off segments
    mapped: int = 0   # bytes of groups read in place from mapped files


class Link:
    """``data``: chunks to the consumer; ``ctrl``: its ``Release``/``Stop``; ``lifeline``: EOF when it died.
    ``release(pos)`` frees the input ring below ``pos``; ``stats.wait_consumer_time`` adds up the waits
    for the consumer (seconds)."""

    def __init__(self, data: Any, ctrl: Any, lifeline: Any, poll_interval: float,
                 release: Callable[[int], None], stats: Any) -> None:
        self.data, self.ctrl, self.lifeline = data, ctrl, lifeline
        self.poll_interval = poll_interval
        self.release = release
        self.stats = stats
        self.poller = Poller()
        self.flight = InFlight()
        self.releases = 0             # Release messages handled
        self.report_waits = False     # say Waiting when a wait starts (see parrecio.pipeline.views)
        self._held: List[Any] = []    # messages announced, to go out with the next one (see announce)

    def send(self, msg: Any) -> None:
        if self._held:
            self._held.append(msg)
            self._send_held()
        else:
            self.data.send(msg)

    def announce(self, msg: Any) -> None:
        """Send ``msg`` with the next message, or before the next wait: it is news (a stream's start)
        that needs no wake-up of the consumer of its own.  (Sent on its own, a pass's first
        ``StreamStart`` cost the consumer a wake-up with nothing to do, ~0.1 ms, per stream.)"""
        self._held.append(msg)

    def _send_held(self) -> None:
        msgs, self._held = self._held, []
        send_messages(self.data.fileno(), msgs)

    def handle_ctrl(self) -> None:
        """The control messages that arrived (without waiting)."""
        while self.ctrl.poll():
            msg = self.ctrl.recv()
            if isinstance(msg, Release):
                self.releases += 1
                self.release(msg.pos)
                self.flight.oneoff -= msg.oneoff_bytes
                self.flight.mapped -= msg.mapped_bytes
            elif isinstance(msg, Stop):
                if self._held:  # (a stream's start: the consumer counts a Pipe-mode FIFO opened as used up)
                    self._send_held()
                raise Stopped()

    def watch(self, extra: List[Any], timeout: float) -> list:
        """Wait until one of ``extra`` is ready, handling control messages and consumer death."""
        if self._held:  # (what was announced goes out before we may block)
            self._send_held()
        # one poll set, registered again only when ``extra`` changes (a wait per FIFO read when the
        # stream is slower than we are: multiprocessing's wait() would build a selector each time)
        self.poller.watch(tuple(extra), lambda: extra + [self.ctrl, self.lifeline])
        ready = self.poller.wait(timeout)
        if self.lifeline in ready:  # the consumer died: child_entry cleans up after it
            raise Stopped()
        if self.ctrl in ready:
            self.handle_ctrl()
        return ready

    def wait_while(self, busy: Callable[[], bool]) -> None:
        """Wait for the consumer's releases while ``busy()``.  With ``report_waits``, say so (and again
        after each release that did not end the wait): the consumer can then tell a reader that only
        its user's views hold up from one that is on its way."""
        t0 = time.perf_counter()
        said = -1
        while busy():
            if self.report_waits and said != self.releases:
                said = self.releases
                self.data.send(Waiting(said))
            self.watch([], self.poll_interval)
        self.stats.wait_consumer_time += time.perf_counter() - t0
