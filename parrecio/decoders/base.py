"""The decoder protocol: what the pipeline needs from a decoder, and nothing more.

A decoder is any callable ``decoder(payload) -> value`` (pickled by reference, or by value with
cloudpickle when the decoder processes cannot import it), where ``payload`` is a bytes-like
object (``bytes``, ``memoryview`` or a numpy ``uint8`` array; in the pipeline it is a read-only
``memoryview`` of shared memory, valid only during the call: a decoder must not keep it).  Decoders
raise :class:`parrecio.DecodeError` for payloads they refuse; any other exception is wrapped in one.

Optional attributes tell the pipeline how to treat a decoder:

``passthrough = True``
    The value is the payload itself, as ``bytes`` (:class:`~parrecio.decoders.Raw`): the pipeline never
    sends such a field to a decoder process; the consumer copies the payload out of shared memory when
    it delivers the sample.  :func:`is_passthrough` is the one place that reads it.

``random = True``
    The decoder draws random choices (a random crop, a flip: :mod:`parrecio.decoders.augment`).  The
    pipeline then calls it with a keyword ``key``, ``decoder(payload, key=k)`` and ``decode_into(payload,
    out, key=k)``: a 64-bit int, :func:`sample_key` of the reader's seed, the epoch, the shard and the
    sample's position in the epoch, the same for every field of the sample.  A decoder draws only from
    ``key`` (e.g. ``random.Random(key)``), so a sample decodes to the same pixels in any process, on a
    re-run after a crash, and in every rerun of the epoch, and the fields of a sample (an image and its
    boxes) draw the same crop.  :func:`is_random` is the one place that reads the flag.

``payload_kinds = frozenset({...})``
    The kinds of payload the decoder reads, as :func:`parrecio.decoders.sniff.sniff` names them
    (``Image``: the image formats and ``"other"``; ``Json``: ``"json"``).  Used for one thing: after a
    corrupt region, a record that only a group's first field can read starts the next group
    (:mod:`parrecio.pipeline.resync`).  Leave it out (any payload) unless the decoder refuses every other
    kind: a kind left out of the set drops records the decoder could have read.
    :func:`payload_kinds` is the one place that reads it.

The next two let the pipeline write results straight into shared memory instead of pickling them back
to the consumer:

``output_spec``
    An :class:`ArraySpec` when every value is a numpy array of one fixed shape and dtype (an image decoded
    to 224x224x3 ``uint8``), a tuple of ``ArraySpec | None`` when the value is a tuple whose positions
    with a spec are such arrays (``ImageRecord`` -> ``(image, label)``), or ``None`` (the default) when
    values are ragged or not arrays; those travel back in the result message.

``decode_into(payload, out)``
    Decode ``payload`` writing the fixed-shape array(s) into ``out``: an ``ndarray`` of the spec's shape
    and dtype for an ``ArraySpec``, or a tuple with an ``ndarray`` at each position that has a spec (and
    ``None`` elsewhere) for a tuple spec.  Returns ``None`` for an ``ArraySpec``; for a tuple spec it
    returns a tuple whose positions without a spec carry their values (positions with a spec are ignored).
    When a decoder has ``output_spec`` but no ``decode_into``, the pipeline calls the decoder and copies.
"""

from __future__ import annotations

import operator

from dataclasses import dataclass
from typing import Any, FrozenSet, Optional, Protocol, Tuple, Union, runtime_checkable

import numpy as np

__all__ = ["ArraySpec", "Decoder", "OutputSpec", "write_into", "spec_of", "is_passthrough", "is_random",
           "payload_kinds", "sample_key"]


@dataclass(frozen=True)
class ArraySpec:
    """A fixed array shape and dtype: every value a decoder returns has exactly these."""

    shape: Tuple[int, ...]
    dtype: np.dtype

    def __init__(self, shape, dtype) -> None:
        try:  # (int() made a dimension of 2.5 one of 2, silently)
            shape = tuple(operator.index(s) for s in shape)
        except TypeError:
            raise TypeError(f"ArraySpec shape {tuple(shape)!r}: dimensions are ints") from None
        dtype = np.dtype(dtype)
        if any(s < 0 for s in shape):
            raise ValueError(f"ArraySpec shape {shape}: a dimension below 0")
        if dtype.hasobject:  # (the slots are shared memory: no Python object can live there)
            raise ValueError(f"ArraySpec dtype {dtype}: holds Python objects, which cannot be written into "
                             f"shared memory; give no output_spec for such values (they travel pickled)")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)

    @property
    def nbytes(self) -> int:
        """Size of one value in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


OutputSpec = Union[ArraySpec, Tuple[Optional[ArraySpec], ...], None]


@runtime_checkable
class Decoder(Protocol):
    """Structural type of a decoder: a callable on a bytes-like payload."""

    def __call__(self, payload: Any) -> Any: ...


def is_passthrough(decoder: Any) -> bool:
    """Whether the field's value is its payload as ``bytes``, never decoded (``decoder.passthrough``)."""
    return bool(getattr(decoder, "passthrough", False))


def payload_kinds(decoder: Any) -> Optional[FrozenSet[str]]:
    """The payload kinds the decoder reads (``decoder.payload_kinds``), None for any."""
    kinds = getattr(decoder, "payload_kinds", None)
    return None if kinds is None else frozenset(kinds)


def is_random(decoder: Any) -> bool:
    """Whether the decoder takes a per-sample ``key`` (``decoder.random``)."""
    return bool(getattr(decoder, "random", False))


_MASK64 = (1 << 64) - 1


def _mix(state: int, value: int) -> int:
    """One splitmix64 step over ``state + value``: a well-spread 64-bit hash, the same everywhere."""
    z = (state + (value & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_key(seed: int, epoch: int, shard: int, index: int) -> int:
    """The 64-bit key of sample ``index`` (its position in the epoch's order on shard ``shard``) of epoch
    ``epoch`` of a reader with base ``seed``: what a ``random`` decoder draws from."""
    return _mix(_mix(_mix(_mix(0, seed), epoch), shard), index)


def spec_of(decoder: Any) -> OutputSpec:
    """The decoder's ``output_spec`` (``None`` when it has none), validated."""
    spec = getattr(decoder, "output_spec", None)
    if spec is None or isinstance(spec, ArraySpec):
        return spec
    if isinstance(spec, tuple) and all(s is None or isinstance(s, ArraySpec) for s in spec):
        return spec if any(s is not None for s in spec) else None
    raise TypeError(f"{decoder!r}.output_spec must be an ArraySpec, a tuple of ArraySpec|None, or None")


def _check(value: Any, spec: ArraySpec) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != spec.shape or arr.dtype != spec.dtype:
        raise ValueError(f"decoder returned an array of shape {arr.shape} and dtype {arr.dtype}, "
                         f"but its output_spec says {spec.shape} {spec.dtype}")
    return arr


def write_into(decoder: Any, payload: Any, spec: OutputSpec, out: Any, key: Optional[int] = None) -> Any:
    """Decode ``payload`` with ``decoder`` into ``out`` (see the module docstring); ``key`` is passed on
    (as ``key=``) when it is not None: the sample key of a ``random`` decoder.

    Returns what does not live in ``out``: ``None`` for an ``ArraySpec``, or for a tuple spec the tuple
    with ``None`` at each position that was written into ``out``.
    """
    decode_into = getattr(decoder, "decode_into", None)
    kw = {} if key is None else {"key": key}
    if isinstance(spec, ArraySpec):
        if decode_into is not None:
            decode_into(payload, out, **kw)
        else:
            out[...] = _check(decoder(payload, **kw), spec)
        return None
    if decode_into is not None:
        rest = decode_into(payload, out, **kw)
        if not isinstance(rest, tuple) or len(rest) != len(spec):
            size = f" of {len(rest)}" if isinstance(rest, tuple) else ""
            raise ValueError(f"decode_into returned {type(rest).__name__}{size}, but its output_spec is a "
                             f"tuple of {len(spec)}: return the values of the positions without a spec, "
                             f"None at the others")
    else:
        rest = decoder(payload, **kw)
        if not isinstance(rest, tuple) or len(rest) != len(spec):
            raise ValueError(f"decoder returned {type(rest).__name__}, but its output_spec is a tuple "
                             f"of {len(spec)}")
        for dst, s, v in zip(out, spec, rest):
            if s is not None:
                dst[...] = _check(v, s)
    return tuple(None if s is not None else v for s, v in zip(spec, rest))
