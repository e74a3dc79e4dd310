"""The one decode path: a group's payloads -> its values, fixed-shape ones written into their place.

A decoder process (:mod:`parrecio.pipeline.worker`), ``workers=0`` (:mod:`parrecio.pipeline.inline`) and
the Ray datasource (:mod:`parrecio.integrations.ray`) decode with :meth:`DecodePlan.decode`; they differ
only in where the payloads and the ``out`` arrays lie (the ring and an output slot, the reader's buffer
and a local slot, a file and a block) and in how an error travels.  So a field gets the same payload (a
read-only ``memoryview``, released after the call: a decoder that keeps the view itself fails there), the
same sample key, and fails the same way in every mode.

A value may not point into the payload's memory, which is reused (``workers=0`` reads the next records
into it) or given back: an array that ``np.frombuffer(payload)`` made holds on to the view without the
export that ``release()`` would see.  So the view is made over an array of ours: whatever the decoder
keeps of the payload (the view, a view or a slice of it, an array over it, in its value at any depth or
elsewhere) keeps a reference to that array, which ``sys.getrefcount`` sees once the view is released.
Such a field is decoded again from a read-only memoryview of a ``bytes`` copy of the payload, which its
value then keeps alive, and gets such copies from then on.  A decoder process needs none of it (``stable``):
its values are pickled or written into a slot before the ring or the file under their payloads moves on.

``Json()`` fields call ``orjson.loads`` directly (a C function that gives the decoder's value for any
payload the decoder accepts); on a payload that fails, the decoder itself runs again to raise its own
error.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional, Sequence, Tuple, Type

import numpy as np

from ..decoders.base import is_random, sample_key, write_into
from ..decoders.basic import Json
from ..errors import DecodeError, field_error
from .mismatch import field_note

__all__ = ["DecodePlan", "FieldFailed", "failure_error"]

PASS, RAGGED, FIXED = range(3)  # how a field is decoded: bytes, a value, written into ``out``


def _fast_calls() -> dict:
    """Decoder type -> a C function giving the same value for any payload the decoder accepts (and
    failing on the others, which are then given to the decoder itself for its own error)."""
    import orjson
    return {Json: orjson.loads}


_FAST = _fast_calls()


class FieldFailed(Exception):
    """Field ``field`` of a group failed with ``error`` (the decoder's own exception)."""

    def __init__(self, field: int, error: BaseException) -> None:
        super().__init__(field, error)
        self.field = field
        self.error = error


class DecodePlan:
    """How each field of a group is decoded.

    ``decoders``/``specs``/``passthrough``: per field (``specs``: the output spec, None for a value of
    its own); ``seed``/``shard``: what :meth:`key` draws sample keys from; ``copy_passthrough``: whether
    passthrough fields are copied to ``bytes`` here (False in a decoder process: the consumer copies
    them); ``catch``: the exceptions that are a field's failure (a decoder process counts
    ``KeyboardInterrupt`` and ``SystemExit`` raised by a decoder among them; ``workers=0`` does not:
    Ctrl-C must stop the consumer); ``stable``: whether the payloads stay as they are while the values
    live (a decoder process: it pickles or writes them before the ring or file moves on), so that a value
    pointing into one need not be looked for (see the module's docstring; ~0.8 us a field)."""

    def __init__(self, decoders: Sequence[Any], specs: Sequence[Any], passthrough: Sequence[bool], *,
                 seed: int = 0, shard: int = 0, copy_passthrough: bool = True,
                 catch: Tuple[Type[BaseException], ...] = (Exception,), stable: bool = False) -> None:
        self.stable = stable
        self.nfields = len(decoders)
        self.seed, self.shard, self.catch = seed, shard, catch
        self.fields: List[tuple] = []  # (field, how, call, decoder, spec, random)
        for f, (dec, spec, p) in enumerate(zip(decoders, specs, passthrough)):
            if p:
                if copy_passthrough:
                    self.fields.append((f, PASS, bytes, dec, None, False))
                continue
            how = RAGGED if spec is None else FIXED
            call = _FAST.get(type(dec)) if how == RAGGED else None
            self.fields.append((f, how, call, dec, spec, is_random(dec)))
        self.keyed = any(t[5] for t in self.fields)
        self.copies = [False] * self.nfields  # fields given a copy of their payload (see the module's docstring)
        if len(self.fields) == 1 and self.fields[0][2] is not None:  # tiny records' case: one C call
            self.decode = self._decode_fast  # type: ignore[method-assign]

    @classmethod
    def of(cls, cfg: Any, **kw: Any) -> "DecodePlan":
        """The plan of the pipeline settings ``cfg`` (a PipelineConfig)."""
        return cls(cfg.decoders, cfg.layout.specs, cfg.passthrough, seed=cfg.seed, shard=cfg.shard_index, **kw)

    def key(self, epoch: int, seq: int) -> Optional[int]:
        """The key of sample ``seq`` of this shard's order in ``epoch`` (None when no field draws):
        whoever decodes it, on every re-run, in every mode (ARCHITECTURE invariant 8)."""
        return sample_key(self.seed, epoch, self.shard, seq) if self.keyed else None

    def _decode_fast(self, payloads: Sequence[Any], outs: Sequence[Any], key: Optional[int]) -> List[Any]:
        """:meth:`decode` of a plan whose one field has a fast call (Json, passthrough bytes)."""
        f, call = self.fields[0][0], self.fields[0][2]
        vals: List[Any] = [None] * self.nfields
        try:
            vals[f] = call(payloads[f])
            return vals
        except Exception:
            return DecodePlan.decode(self, payloads, outs, key)  # the decoder's own error

    def decode(self, payloads: Sequence[Any], outs: Sequence[Any], key: Optional[int]) -> List[Any]:
        """The values of one group (``payloads``: one buffer per field).  A fixed-shape field is written
        into ``outs[f]`` and its value is what does not live there (:func:`write_into`).  Raises
        :class:`FieldFailed` naming the first field that failed."""
        vals: List[Any] = [None] * self.nfields
        f = -1
        try:
            for f, how, call, dec, spec, rnd in self.fields:
                p = payloads[f]
                if call is not None:  # never writes into the payload: no read-only view needed
                    try:
                        vals[f] = call(p)
                        continue
                    except Exception:
                        pass  # the decoder's own error is the one to report: it runs below
                k = key if rnd else None
                out = outs[f] if how == FIXED else None
                if self.copies[f]:  # (never released: the value may keep it, and it keeps its bytes)
                    vals[f] = _call(how, dec, memoryview(bytes(p)), spec, out, k)
                    continue
                if self.stable:
                    view = memoryview(p)
                    if not view.readonly:
                        view = view.toreadonly()
                    refs = sys.getrefcount(view)
                    try:
                        vals[f] = _call(how, dec, view, spec, out, k)
                    finally:
                        # (a value that is or holds the view -- the payload, a dict of it -- keeps it, and
                        # travels as a copy of its bytes: parrecio.pipeline.worker)
                        if sys.getrefcount(view) <= refs:
                            view.release()  # BufferError if the decoder kept an export of the view
                    continue
                # The view is made over an array of our own, so that whatever the decoder keeps of it (a
                # view of a view, an array over it, at any depth) keeps a reference to that array.
                under = np.frombuffer(p, np.uint8)
                under.flags.writeable = False
                base = sys.getrefcount(under)
                view = memoryview(under)  # type: ignore[arg-type]
                refs = sys.getrefcount(view)
                try:
                    v = _call(how, dec, view, spec, out, k)
                    held = sys.getrefcount(view) > refs
                finally:
                    view.release()  # BufferError if the decoder kept an export of the view
                if held or sys.getrefcount(under) > base:
                    self.copies[f] = True
                    v = _call(how, dec, memoryview(bytes(p)), spec, out, k)
                vals[f] = v
        except self.catch as exc:
            raise FieldFailed(f, exc) from None
        return vals


def _call(how: int, dec: Any, payload: Any, spec: Any, out: Any, key: Optional[int]) -> Any:
    """One field's decoder on one payload: its value (a fixed-shape field's written into ``out``)."""
    if how == FIXED:
        return write_into(dec, payload, spec, out, key)
    return dec(payload) if key is None else dec(payload, key=key)


SKIP_LOG_CHARS = 2000  # of a skipped sample's error, in its log line (the DecodeError keeps it whole)


def log_skipped(log: Any, err: BaseException) -> None:
    """Log the error of a skipped sample: ``parrecio: skipped ...``, cut to :data:`SKIP_LOG_CHARS` (a
    decoder whose message held its payload logged 20 MB a skip)."""
    text = str(err)
    if len(text) > SKIP_LOG_CHARS:
        text = f"{text[:SKIP_LOG_CHARS]}... ({len(text)} characters; the DecodeError holds them all)"
    log.warning("parrecio: skipped %s", text)


def failure_error(cfg: Any, failure: FieldFailed, payloads: Sequence[Any], index: Optional[int],
                  offset: Optional[int], source: Optional[str], context: Optional[Sequence[str]] = None,
                  where: str = "the records around it") -> DecodeError:
    """The DecodeError of a group's ``failure`` in this process, worded as the pipeline words it
    (``field 'name' (decoder): reason; the payload is ...``), located at sample ``index``, byte
    ``offset`` of ``source``.  ``cfg``: has the fields' ``decoders`` and ``names``; ``context``: the
    sniff() kinds of records of the stream, which ``where`` names (see :func:`field_note`)."""
    f, exc = failure.field, failure.error
    try:
        note = field_note(str(exc), cfg.decoders, payloads, f, context, where)
    except Exception:  # a hint must never hide the error itself
        note = ""
    return field_error(f"field {cfg.names[f]!r} ({cfg.decoders[f]!r})", exc, index, offset, source, note)
