"""How decoders reach the decoder processes: by reference when the children can import them, else by value.

::

    ParallelReader(fields=...)   ship(decoder) -> the decoder itself      (pickled by reference: module.name)
                                              -> Shipped(cloudpickle bytes) (defined in a notebook cell,
                                                 python -c, a script piped to python; a lambda, a closure)
    decoder process              unship(cfg.decoders) -> the decoders; one that does not load ends the run
                                 at once with a PipelineError that names it and says why

Pickle stores a function or class as "module.qualname", which a child resolves by importing the module.
That fails for ``__main__``, which the children never import (:func:`parrecio.pipeline.children.start`:
a script without a ``__main__`` guard would run again in each of them), and for lambdas and local
functions everywhere.  cloudpickle -- what Ray, Dask and joblib/loky use -- stores those by value
instead.  Decoders are pickled once per process start, never per sample.
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence, Tuple

__all__ = ["Shipped", "ship", "unship"]


class Shipped:
    """A decoder travelling by value: cloudpickle's bytes, loaded in the decoder process."""

    __slots__ = ("blob", "text")

    def __init__(self, blob: bytes, text: str) -> None:
        self.blob, self.text = blob, text

    def load(self) -> Any:
        return pickle.loads(self.blob)

    def __repr__(self) -> str:
        return self.text


def ship(decoder: Any, name: str, method: str) -> Any:
    """``decoder`` as it travels to the children of start method ``method``: itself when pickle can
    send it by reference and the children can import what it names, else a :class:`Shipped`.
    ``TypeError`` (naming field ``name``) when not even cloudpickle can pickle it."""
    try:
        data = pickle.dumps(decoder)
    except Exception:
        data = None
    if data is not None and b"__main__" not in data:
        return decoder
    try:
        import cloudpickle
        blob = cloudpickle.dumps(decoder)
    except Exception as exc:
        raise TypeError(f"field {name!r}: the decoder {decoder!r} cannot be pickled, not even by value "
                        f"(cloudpickle), so it cannot reach the decoder processes ({method} start "
                        f"method): {type(exc).__name__}: {exc}") from exc
    return Shipped(blob, repr(decoder))


def unship(decoders: Sequence[Any]) -> Tuple[Any, ...]:
    """The decoders themselves, in a decoder process."""
    return tuple(d.load() if isinstance(d, Shipped) else d for d in decoders)
