"""The exceptions of parrecio, one hierarchy for every layer.

Each layer raises its own subclass of :class:`ParrecioError`, so a caller can catch what it can handle:

- :class:`CorruptRecordError` -- RecordIO framing (``parrecio.recordio``): bad magic, bad continuation
  flags, truncated header or payload, a length above the limit.  ``.offset`` is the byte offset in the
  stream where the problem was found.
- :class:`DecodeError` -- a decoder refused a payload (bad JPEG, bad JSON, a decompression bomb, ...).
  ``.index`` is the sample index in the stream and ``.offset`` the byte offset of the sample's first record,
  when known (a decoder called directly knows neither; the pipeline fills them in).
- :class:`SourceError` -- the stream could not be opened or read (missing path, unknown SageMaker channel,
  a FIFO that never appeared, ...).
- :class:`PipelineError` -- the parallel pipeline itself failed (a reader process died, a worker kept
  crashing, shared memory could not be created, ...).

Every exception pickles with its attributes intact: errors travel between processes as data and are
re-raised in the consumer at their sequence number.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["ParrecioError", "CorruptRecordError", "DecodeError", "SourceError", "PipelineError"]


class ParrecioError(Exception):
    """Base class of every error parrecio raises on purpose."""


class CorruptRecordError(ParrecioError):
    """The RecordIO framing is broken at byte ``offset`` of the stream."""

    def __init__(self, message: str, offset: int, *, source: Optional[str] = None) -> None:
        where = f"at byte offset {offset}" + (f" of {source}" if source else "")
        super().__init__(f"{message} ({where})")
        self.offset = offset
        self.source = source
        self.reason = message

    def __reduce__(self):
        return (_rebuild, (type(self), self.args, self.__dict__))


class DecodeError(ParrecioError):
    """A payload could not be decoded.

    ``index`` is the sample index in the stream (0-based) and ``offset`` the byte offset of the sample's
    first record; either is ``None`` when unknown (a decoder called directly on a buffer).
    """

    def __init__(self, message: str, *, index: Optional[int] = None, offset: Optional[int] = None) -> None:
        self.reason = message
        self.index = index
        self.offset = offset
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.index is not None:
            where.append(f"sample {self.index}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason

    def located(self, index: Optional[int], offset: Optional[int]) -> "DecodeError":
        """Return a copy that names the sample ``index`` and stream ``offset``."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        err.index, err.offset = index, offset
        err.args = (err._format(),)
        err.__cause__ = self.__cause__
        return err

    def __reduce__(self):
        return (_rebuild, (type(self), self.args, self.__dict__))


class SourceError(ParrecioError):
    """A stream could not be opened or read."""


class PipelineError(ParrecioError):
    """The parallel pipeline failed: a process died, shared memory ran out, a peer stopped answering."""


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err
