"""Decoders: picklable callables ``payload -> value`` (see :mod:`parrecio.decoders.base`)."""

from .base import ArraySpec, Decoder, OutputSpec
from .basic import Json, Raw

__all__ = ["ArraySpec", "Decoder", "OutputSpec", "Raw", "Json"]
