"""Decoders are values: frozen dataclasses, so repr, equality, hashing and pickling come from the fields.

Each built-in decoder is ``@dataclass(frozen=True, repr=False)`` over its constructor parameters and
inherits :class:`Value`, which adds the one thing dataclasses do not give: a repr that names only the
parameters that differ from their defaults.  Error messages quote decoders (``field 'image'
(Image(size=(224, 224)))``), so a repr of all thirteen ``Image`` parameters would bury the record's
offset.  ``eval(repr(decoder)) == decoder`` for every built-in decoder.

``__post_init__`` validates and normalizes the fields (``size=224`` -> ``(224, 224)``, lists ->
tuples, so that every decoder hashes) and stores what it derives from them (``output_spec``, lookup
tables) with :func:`derive`: attributes that are not fields, hence not compared, hashed or shown.
:func:`dataclasses.replace` builds a changed copy and validates it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Value", "derive", "shown_as"]


def derive(decoder: Any, **attributes: Any) -> None:
    """Set attributes of a frozen decoder in its ``__post_init__`` (normalized fields, derived state)."""
    for name, value in attributes.items():
        object.__setattr__(decoder, name, value)


def shown_as(show: Any) -> dict:
    """Field metadata: ``repr`` shows the field's value as ``show(value)`` (a form the constructor takes)."""
    return {"repr": show}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


class Value:
    """Mixin of the frozen dataclass decoders: a repr of the non-default fields, in declaration order."""

    def __repr__(self) -> str:
        args = []
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if field.repr and value != _default(field):
                show = field.metadata.get("repr")
                args.append(f"{field.name}={(show(value) if show else value)!r}")
        return f"{type(self).__name__}({', '.join(args)})"
