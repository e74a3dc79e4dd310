"""Sources: where a RecordIO stream comes from, and the one function that turns a user's ``channel`` into one.

```
 consumer process                                  reader process
 resolve(channel) -> Source  --- pickled --->      Source.streams(epoch) -> Stream(name, file), ...
   (checks paths, reads the SageMaker config,        (opens files, waits for FIFOs, receives fds;
    dups fds, starts a pump thread)                   reads each file to the end and closes it)
 Source.release()   (stops the pump, closes fds)
```

A :class:`Source` is created in the consumer process by :func:`~parrecio.sources.resolver.resolve` and opened
**only** in the reader
process: a FIFO can be read once, by one process, so nothing in the consumer may open it.  Everything a
source needs in the reader process travels inside it when it is pickled (file descriptors included, see
:mod:`parrecio.sources.fds`), under every start method.

Each epoch of a source is a sequence of :class:`Stream` objects, read one after the other as one RecordIO
stream per file (a record never spans two files).  ``default_join`` tells the RecordIO reader how multipart
records were written: ``"mxnet"`` for ``.rec`` files written by MXNet/dmlc-core, ``"concat"`` where
SageMaker's RecordIO wrapper produced the framing (see docs/ARCHITECTURE.md, section 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional

from ..errors import SourceError

__all__ = ["Stream", "Source", "DEFAULT_FIFO_TIMEOUT"]

DEFAULT_FIFO_TIMEOUT = 600.0
"""Seconds to wait for a SageMaker Pipe-mode FIFO to appear (SageMaker can take minutes per epoch)."""


@dataclass
class Stream:
    """One byte stream of an epoch, opened for binary reading in the reader process.

    ``file`` is a buffered binary reader: ``read(n)``/``readinto(b)`` return fewer bytes than asked only at
    the end of the stream.  The reader process reads it and closes it.  ``name`` names the stream in error
    messages (a path, ``"<stdin>"``, ``"train_0 (FIFO /opt/ml/input/data/train_0)"``).
    """

    name: str
    file: BinaryIO


class Source:
    """Base class of every source: picklable, created in the consumer, opened only in the reader process.

    Attributes:
        name: the channel as the user gave it, for messages.
        kind: a short word for the kind of source (``"files"``, ``"stdin"``, ``"fileobj"``,
            ``"sagemaker-pipe"``, ``"sagemaker-file"``).
        default_join: the multipart convention of the stream's writer when the source knows it
            (``"concat"``: SageMaker's RecordIO wrapper), else ``"auto"``: decided from the stream.
        epochs_supported: how many epochs :meth:`streams` can serve; ``None`` for any number, ``1`` for
            a stream that can be read only once (stdin, an open file object).
    """

    name: str = ""
    kind: str = "source"
    default_join: str = "auto"
    epochs_supported: Optional[int] = None

    def streams(self, epoch: int) -> Iterator[Stream]:
        """The streams of epoch ``epoch`` (0, 1, 2, ...), opened lazily; call only in the reader process.

        Raises :class:`SourceError` when a stream cannot be opened or the epoch cannot be served.
        """
        raise NotImplementedError

    def begin_pass(self, epoch: int) -> None:
        """A pass of epoch ``epoch`` is about to start (called in the consumer, before the source travels
        to the reader process with it)."""

    def end_pass(self, epoch: int, opened: bool) -> None:
        """The pass of epoch ``epoch`` ended (in the consumer); ``opened``: whether it opened a stream."""

    def rereadable(self) -> bool:
        """Whether an epoch's streams can be read again, in the consumer process too, at no more cost
        than reading them (regular files, objects): not a FIFO, stdin, a Pipe-mode channel."""
        return False

    def release(self) -> None:
        """Free what the source holds in the consumer process (fds, a pump thread).  Idempotent.

        Does nothing in any other process (a forked reader holds copies it must not touch).
        """

    def check_epoch(self, epoch: int) -> None:
        """Raise :class:`SourceError` if epoch ``epoch`` cannot be served by this source."""
        if epoch < 0:
            raise SourceError(f"{self.name}: epoch must be >= 0, got {epoch}")
        if self.epochs_supported is not None and epoch >= self.epochs_supported:
            raise SourceError(
                f"{self.name}: {self._once_reason()}; epoch {epoch} is impossible "
                f"(iterate it once, or give a path or SageMaker channel, which can be read again)"
            )

    def _once_reason(self) -> str:
        return f"this {self.kind} source serves only {self.epochs_supported} epoch(s)"

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} {self.name!r} join={self.default_join}>"
