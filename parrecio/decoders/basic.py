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
    become ``int``/``float``, objects ``dict``, arrays ``list``; an integer outside the 64-bit range
    (below -2**63, 2**64 and above) becomes a ``float``, as orjson reads it: ids that long belong in
    strings, or read the payload with ``Raw()`` and ``json.loads``.
    """

    output_spec = None
    payload_kinds = frozenset({"json"})  # what a group's realignment may take for JSON (decoders.base)

    def __call__(self, payload: Any) -> Any:
        return json_loads(payload)


def json_loads(payload: Any) -> Any:
    """orjson.loads of any bytes-like payload (a numpy array's buffer too); JSON errors, nesting too deep
    included, are a DecodeError."""
    if not isinstance(payload, (bytes, bytearray, memoryview, str)):
        payload = memoryview(payload)
    if isinstance(payload, memoryview) and (payload.ndim != 1 or payload.itemsize != 1):
        payload = payload.cast("B")
    # a UTF-8 byte order mark, which some Windows tools write: RFC 8259 lets a reader ignore it; orjson does not
    if isinstance(payload, str):
        payload = payload[1:] if payload.startswith("\ufeff") else payload
    elif payload[:3] == b"\xef\xbb\xbf":
        payload = payload[3:]
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc}") from exc
