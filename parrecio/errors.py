"""The exceptions of parrecio, one hierarchy for every layer.

Each layer raises its own subclass of :class:`ParrecioError`, so a caller can catch what it can handle:

- :class:`CorruptRecordError` -- RecordIO framing (``parrecio.recordio``): bad magic, bad continuation
  flags, truncated header or payload, a length above the limit.  ``.offset`` is the byte offset in the
  stream where the problem was found.
- :class:`DecodeError` -- a decoder refused a payload (bad JPEG, bad JSON, a decompression bomb, ...).
  ``.index`` is the sample's position in the epoch's order (the sample index in the stream, unless the
  reader shards or shuffles: then its place in this shard's order, as ``state_dict()`` counts) and
  ``.offset`` the byte offset of the sample's first record, when known (a decoder called directly knows
  neither; the pipeline fills them in).
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


def _where(index: Optional[int], offset: Optional[int], source: Optional[str]) -> str:
    parts = []
    if index is not None:
        parts.append(f"sample {index}")
    if offset is not None:
        parts.append(f"byte offset {offset}" + (f" of {source}" if source else ""))
    elif source:
        parts.append(source)
    return ", ".join(parts)


class _Located(ParrecioError):
    """An error that names where in the stream it happened: sample index, byte offset, source name."""

    # Set by every __init__ (and _rebuild), never on the class: a wrapper that forwards missing attributes
    # to the error it wraps (Ray's RayTaskError(DecodeError)) would find class-level Nones first.
    reason: str
    index: Optional[int]
    offset: Optional[int]
    source: Optional[str]

    def _format(self) -> str:
        where = _where(self.index, self.offset, self.source)
        return f"{self.reason} ({where})" if where else self.reason

    def located(self, index: Optional[int], offset: Optional[int] = None,
                source: Optional[str] = None):
        """A copy that also names the sample ``index`` (and the ``offset``/``source`` if given)."""
        err = type(self).__new__(type(self))
        err.__dict__.update(self.__dict__)
        err.index = index
        if offset is not None:
            err.offset = offset
        if source is not None:
            err.source = source
        err.args = (err._format(),)
        err.__cause__ = self.__cause__
        return err

    def __reduce__(self):
        return (_rebuild, (type(self), self.args, self.__dict__))


class CorruptRecordError(_Located):
    """The RecordIO framing is broken at byte ``offset`` of the stream ``source``.

    In the pipeline ``index`` is the sample index at which the error is raised (every sample before it
    was delivered).
    """

    def __init__(self, message: str, offset: int, *, source: Optional[str] = None,
                 index: Optional[int] = None) -> None:
        self.reason, self.offset, self.source, self.index = message, offset, source, index
        super().__init__(self._format())


class DecodeError(_Located):
    """A payload could not be decoded.

    ``index`` is the sample's position in the epoch's order, 0-based (the sample index in the stream,
    unless the reader shards or shuffles: then its place in this shard's order, as ``state_dict()``
    counts), ``offset`` the byte offset of the sample's first record and ``source`` the stream's name;
    each is ``None`` when unknown (a decoder called directly on a buffer knows none of them; the pipeline
    fills them in).
    """

    def __init__(self, message: str, *, index: Optional[int] = None, offset: Optional[int] = None,
                 source: Optional[str] = None) -> None:
        self.reason, self.index, self.offset, self.source = message, index, offset, source
        super().__init__(self._format())


def field_error(what: str, exc: BaseException, index: Optional[int], offset: Optional[int],
                source: Optional[str], note: str = "") -> DecodeError:
    """The :class:`DecodeError` of a field that raised ``exc``: ``"<what>: <reason><note>"`` located at
    sample ``index``, byte ``offset`` of ``source``.  A DecodeError keeps its reason (and cause); any
    other exception is named by type and becomes the cause."""
    if isinstance(exc, DecodeError):
        err = exc.located(index, offset, source)
        err.reason = f"{what}: {exc.reason}{note}"
        err.args = (err._format(),)
        return err
    err = DecodeError(f"{what}: {type(exc).__name__}: {said(exc)}{note}", index=index, offset=offset, source=source)
    err.__cause__ = exc
    return err


def said(exc: BaseException) -> str:
    """``str(exc)``, or what stands for it when that raises (a decoder's exception class may be broken)."""
    try:
        return str(exc)
    except Exception as why:
        return f"<str() of the {type(exc).__name__} failed: {type(why).__name__}>"


class SourceError(ParrecioError):
    """A stream could not be opened or read."""


class PipelineError(ParrecioError):
    """The parallel pipeline failed: a process died, shared memory ran out, a peer stopped answering."""


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err
