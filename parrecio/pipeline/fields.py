"""The one rule for what ``fields=`` means: names, decoders and the shape of a sample.

``ParallelReader`` and the Ray Data datasource (:mod:`parrecio.integrations.ray`) both read it from here,
so a field is named alike everywhere (dict keys; ``"0"``, ``"1"``... for a sequence; ``"record"`` for
``None``).
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Sequence, Tuple, Union

from ..decoders.basic import Raw

__all__ = ["Fields", "normalize_fields"]

Fields = Union[None, Callable[[Any], Any], Sequence[Callable[[Any], Any]], Mapping[str, Callable[[Any], Any]]]


def normalize_fields(fields: Fields) -> Tuple[str, List[str], List[Any]]:
    """``fields`` -> ``(kind, names, decoders)``; ``kind`` is ``"single"`` (one value a sample),
    ``"tuple"`` or ``"dict"``.  ``ValueError``/``TypeError`` name what is wrong."""
    if fields is None:
        return "single", ["record"], [Raw()]
    if isinstance(fields, Mapping):
        if not fields:
            raise ValueError("fields must not be empty")
        names = [str(k) for k in fields]
        decs = list(fields.values())
        kind = "dict"
    elif isinstance(fields, (list, tuple)):
        if not fields:
            raise ValueError("fields must not be empty")
        names = [str(i) for i in range(len(fields))]
        decs = list(fields)
        kind = "tuple"
    elif callable(fields):
        _not_a_class("0", fields)
        return "single", ["0"], [fields]
    else:
        raise TypeError(f"fields must be None, a decoder, a sequence or a mapping of decoders, "
                        f"not {type(fields).__name__}")
    for name, d in zip(names, decs):
        if not callable(d):
            raise TypeError(f"field {name!r}: a decoder must be callable, got {d!r}")
        _not_a_class(name, d)
    return kind, names, decs


def _not_a_class(name: str, d: Any) -> None:
    """A parrecio decoder class given where its instance belongs (``Image`` for ``Image()``): callable, it
    would be called with each payload, and every sample failed (skipped silently with on_error="skip")."""
    if isinstance(d, type) and d.__module__.startswith("parrecio."):
        raise TypeError(f"field {name!r} is the class {d.__name__}, not a decoder: give an instance, "
                        f"e.g. {d.__name__}()")
