"""The consumer's side of the reader process of one pass: start it, take its messages, give back ring
space, stop it.  (:mod:`parrecio.pipeline.pool` is the same for the decoder processes.)

::

    consumer                                   reader process (parrecio.pipeline.reader_proc)
    ReaderHandle.receive()   <--data pipe---   StreamStart, Chunk, ..., ReaderEnd
    ReaderHandle.release()   ---ctrl pipe-->   Release(ring position, one-off bytes, mapped bytes)
    ReaderHandle.stop()      ---ctrl pipe-->   Stop; then join, or SIGKILL after a second

One reader process reads a pass at a time.  When a pass's reader ends cleanly it waits for the next
pass's job and is kept for it; otherwise the next pass's is started ahead, as a spare that waits for its
job, once the current one has ended (:meth:`parrecio.pipeline.resources.Resources.prepare_spare`).  Its death is noticed
through its sentinel, which the consumer waits on beside the data pipe (:meth:`waitables`); a reader
that died before its ``ReaderEnd`` is a :class:`PipelineError` naming how it died.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Tuple

from ..errors import PipelineError
from .children import child_entry, close_quietly, describe_exit, environ_now, forget_processes, start, start_retrying
from .messages import Begun, ReaderEnd, Release, Stop
from .poller import ReadyCheck
from .config import PipelineConfig
from .reader_proc import ReaderJob, serve_main
from .shm import sweep
from .wire import MessageReader, send_message

__all__ = ["ReaderHandle", "ReaderLost"]


class ReaderLost(PipelineError):
    """A waiting reader process given its job died before it took it (its :class:`Begun`): it read
    nothing of the pass, so another process can read it (:class:`parrecio.pipeline.feed.Feed`)."""


class ReaderHandle:
    """A started reader process for one pass, and the two pipes to it.

    With ``job=None`` the process is a *spare*, started ahead of its pass (``prefix``: the run's shared
    memory prefix): it waits until :meth:`begin` sends it its job (:func:`reader_proc.serve_main`), as
    does a reader kept after a pass that ended cleanly."""

    def __init__(self, ctx: Any, cfg: PipelineConfig, job: Optional[ReaderJob], lifeline_r: Any,
                 prefix: str = "") -> None:
        self.prefix = job.prefix if job is not None else prefix
        self.source_name = job.source.name if job is not None else ""
        self.ended = False  # its ReaderEnd was received: it sends nothing more
        self.releases_sent = 0  # Release messages sent (its Waiting says how many it has seen)
        self.begun = True  # False from begin() until its Begun comes: a death meanwhile read nothing
        self.data, self.ctrl, self.proc = start_retrying(ctx, lambda: self._started(ctx, cfg, job, lifeline_r))
        data_r, ctrl_w = self.data, self.ctrl
        # The data pipe, read without blocking, every message there at once; a cheap check of the
        # process's end (its sentinel is readable once it has exited), asked at every receive.
        self._inbox = MessageReader(data_r.fileno())
        self._ctrl_fd = ctrl_w.fileno()
        self.sentinel = self.proc.sentinel  # (Process.sentinel is a property that checks it is open)
        self._exited = ReadyCheck(self.sentinel)

    def _started(self, ctx: Any, cfg: PipelineConfig, job: Optional[ReaderJob],
                 lifeline_r: Any) -> Tuple[Any, Any, Any]:
        """The process started, with new pipes: ``(data pipe's read end, control pipe's write end, process)``."""
        data_r, data_w = ctx.Pipe(duplex=False)
        ctrl_r, ctrl_w = ctx.Pipe(duplex=False)
        try:
            proc = ctx.Process(target=child_entry, name="parrecio-reader", daemon=True,
                               args=(self.prefix, lifeline_r, serve_main, cfg, data_w, ctrl_r, lifeline_r, job),
                               kwargs={"environ": environ_now()})
            start(proc)
        except BaseException:
            close_quietly(data_r, data_w, ctrl_r, ctrl_w)
            raise
        finally:
            close_quietly(data_w, ctrl_r)  # the child has its own copies (or none: it did not start)
        return data_r, ctrl_w, proc

    def begin(self, job: ReaderJob) -> bool:
        """Give a waiting process (a spare, or the last pass's reader kept) its pass's job; False when it
        can no longer take one (it died)."""
        try:
            self.ctrl.send(job)
        except (BrokenPipeError, OSError):
            return False
        self.source_name = job.source.name
        self.ended = False
        self.releases_sent = 0
        self.begun = False
        return self.proc.is_alive()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def waitables(self, data: bool = True) -> List[Any]:
        """What to wait on for its messages (unless ``data`` is False) and its death (nothing once it
        has ended)."""
        return [] if self.ended else [self.data, self.sentinel] if data else [self.sentinel]

    def receive(self) -> List[Any]:
        """The messages that are there now (never blocks).  Raises PipelineError if the process died,
        or closed its pipe, before its ``ReaderEnd``."""
        msgs: List[Any] = []
        # Whether it has exited, asked before the drain: then everything it wrote is in the pipe, and the
        # drain reads its ReaderEnd if it sent one.  Asked after (or again after a second drain), a reader
        # that sent its ReaderEnd and exited in between was taken for dead with its ReaderEnd unread ("died
        # (exit code 0)" instead of the pass's CorruptRecordError, on a loaded machine: an audit's hunt).
        exited = self._exited.ready()
        eof = self._receive_into(msgs)
        if not self.ended and (eof or exited):
            self.proc.join(1.0)
            # (killed while it waited, the job sent into its pipe regardless: nothing of the pass was read)
            kind = PipelineError if self.begun else ReaderLost
            raise kind(f"the reader process died ({describe_exit(self.proc.exitcode)}) "
                       f"before the end of the stream {self.source_name!r}")
        return msgs

    def _receive_into(self, msgs: List[Any]) -> bool:
        """Append the messages waiting in the pipe (up to its ReaderEnd); True at the pipe's end (its
        end is closed: it will send nothing more)."""
        if self.ended:
            return False
        for msg in self._inbox.read():
            if isinstance(msg, Begun):
                self.begun = True
                continue
            msgs.append(msg)
            if isinstance(msg, ReaderEnd):
                self.ended = True
                break
        return self._inbox.eof

    def release(self, pos: int, oneoff_bytes: int = 0, mapped_bytes: int = 0) -> None:
        """Everything before ring position ``pos`` was delivered (plus a one-off segment's or a mapped
        chunk's bytes): the reader may reuse it.  (Only while the pass has not ended: see
        :meth:`Feed.release <parrecio.pipeline.feed.Feed.release>`.)"""
        try:
            send_message(self._ctrl_fd, Release(pos, oneoff_bytes, mapped_bytes))
            self.releases_sent += 1
        except (BrokenPipeError, OSError):
            pass  # the reader has finished

    def stop(self) -> List[Any]:
        """Stop the process (Stop, then SIGKILL after a second) and remove the one-off segments it made
        but never sent.  Returns the messages it sent meanwhile (their one-off segments are the
        caller's to remove).  Idempotent."""
        try:
            self.ctrl.send(Stop())
        except (BrokenPipeError, OSError):
            pass
        msgs: List[Any] = []
        deadline = time.monotonic() + 1.0
        while self.proc.is_alive() and time.monotonic() < deadline:
            msgs += self._drain()
            self.proc.join(0.02)
        if self.proc.is_alive():
            self.proc.kill()  # not terminate(): on SIGTERM a child first waits to see if we died too
            self.proc.join(1.0)
        msgs += self._drain()
        sweep(f"{self.prefix}r{self.proc.pid}x")
        close_quietly(self.data, self.ctrl)
        return msgs

    def _drain(self) -> List[Any]:
        return self._inbox.read()

    def forget_after_fork(self) -> None:
        """In the child of an ``os.fork()`` of the consumer: let go of the process silently."""
        forget_processes([self.proc])
        close_quietly(self.data, self.ctrl)
