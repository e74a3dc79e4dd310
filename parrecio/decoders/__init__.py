"""Decoders: callables ``payload -> value`` (see :mod:`parrecio.decoders.base`).

- :class:`Raw`, :class:`Json`: the payload itself, JSON text.
- :class:`Image`, :class:`Mask`: encoded images -> ``uint8`` arrays; segmentation masks -> class ids.
- :class:`BoundingBoxes`, :class:`ClassLabel`: Ground Truth labels -> arrays.
- :class:`ImageRecord`: MXNet ``.rec`` image records -> ``(image, label)``.
- :class:`RandomResizedCrop`, :class:`CenterCrop` (``Image(crop=...)``), ``IMAGENET_MEAN``/``IMAGENET_STD``
  (``Image(mean=..., std=...)``): augmentations fused with decoding (:mod:`parrecio.decoders.augment`).
- :func:`sniff`, :func:`guess_fields`: what payloads look like, how records group into samples.

The exports other than :func:`sniff` and :func:`guess_fields` are lazy (:mod:`parrecio._lazy`): a decoder
process imports the decoders its fields use (Pillow only for images).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
# Eager: `sniff` is also the name of its submodule (see parrecio._lazy), and both are cheap.
from .sniff import guess_fields, sniff

if TYPE_CHECKING:
    from .augment import IMAGENET_MEAN, IMAGENET_STD, CenterCrop, RandomResizedCrop
    from .base import ArraySpec, Decoder, OutputSpec
    from .basic import Json, Raw
    from .image import Geometry, Image
    from .mask import Mask
    from .imagerecord import ImageRecord
    from .labels import BoundingBoxes, ClassLabel
    from .protobuf_record import ProtobufRecord, ProtobufSample, SparseCOO, SparseTensor

__all__ = ["ArraySpec", "Decoder", "OutputSpec", "Raw", "Json", "Image", "Mask", "Geometry", "BoundingBoxes",
           "ProtobufRecord", "ProtobufSample", "SparseCOO", "SparseTensor",
           "ClassLabel", "ImageRecord", "RandomResizedCrop", "CenterCrop", "IMAGENET_MEAN", "IMAGENET_STD",
           "sniff", "guess_fields"]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["IMAGENET_MEAN", "IMAGENET_STD", "CenterCrop", "RandomResizedCrop"], ".augment"),
    **dict.fromkeys(["ArraySpec", "Decoder", "OutputSpec"], ".base"),
    **dict.fromkeys(["Json", "Raw"], ".basic"),
    **dict.fromkeys(["Geometry", "Image"], ".image"),
    "Mask": ".mask",
    "ImageRecord": ".imagerecord",
    **dict.fromkeys(["BoundingBoxes", "ClassLabel"], ".labels"),
    **dict.fromkeys(["ProtobufRecord", "ProtobufSample", "SparseCOO", "SparseTensor"], ".protobuf_record"),
})
