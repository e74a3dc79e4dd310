"""The two decoders every stream can use: the raw payload, and JSON text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import DecodeError
from .value import Value

__all__ = ["Raw", "Json"]


@dataclass(frozen=True, repr=False)
class Raw(Value):
    """The payload itself, as ``bytes``.

    In the pipeline a ``Raw`` field is never sent to a decoder process: the consumer copies it out of the
    input ring when the sample is delivered (``passthrough``), which saves a round trip through a worker.
    """

    passthrough = True
    output_spec = None

    def __call__(self, payload: Any) -> bytes:
        return bytes(payload)


@dataclass(frozen=True, repr=False)
class Json(Value):
    """UTF-8 JSON text -> Python objects, with orjson.

    orjson refuses nesting deeper than 1024 levels, so hostile input cannot exhaust the stack.  Numbers
    become ``int``/``float``, objects ``dict``, arrays ``list``.
    """

    output_spec = None
    payload_kinds = frozenset({"json"})  # what a group's realignment may take for JSON (decoders.base)

    def __call__(self, payload: Any) -> Any:
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise DecodeError(f"invalid JSON: {exc}") from exc
