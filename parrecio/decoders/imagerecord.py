"""MXNet image records (``.rec`` files made by ``im2rec``) -> ``(image, label)``.

A payload is ``[IRHeader 24 bytes][flag x float32 labels][image bytes]`` (see
:mod:`parrecio.recordio.irheader`).  :class:`ImageRecord` splits it without copying the image bytes and
hands them to an :class:`~parrecio.decoders.Image` decoder; the label is what MXNet's ``ImageRecordIter``
sees: the header's scalar ``label`` when ``flag == 0``, the ``flag`` float32 labels otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Tuple, Union

import numpy as np

from ..errors import DecodeError
from ..recordio.irheader import unpack
from .base import ArraySpec, is_random, write_into
from .checks import check_int
from .image import Image
from .value import Value, derive, shown_as

__all__ = ["ImageRecord"]

Label = Union[float, np.ndarray]
#: The most float32 labels a fixed label spec holds per record (64 MiB): more is a typing mistake.
MAX_LABEL_WIDTH = 1 << 24


@dataclass(frozen=True, repr=False)
class ImageRecord(Value):
    """An MXNet image record payload -> ``(image, label)``.

    Parameters
    ----------
    image:
        The decoder of the image bytes (default ``Image()``: RGB at the image's own size).  Any decoder
        works; with a fixed ``output_spec`` (e.g. ``Image(size=(224, 224))``) the image is written straight
        into the pipeline's shared memory.
    label_width:
        ``None`` (default): the label is a ``float32`` array -- 0-d for ``flag == 0`` records, ``(flag,)``
        otherwise -- so that a batch of them is one array (``labels.shape == (batch,)``) when the
        records agree; it travels back in the result message.
        ``0``: every record must have a scalar label (``flag == 0``); the label is a 0-d ``float32`` array
        and has a fixed spec ``ArraySpec((), float32)`` (the im2rec classification case).
        ``n >= 1``: every record must have ``flag == n`` labels (or, for ``n == 1``, a scalar label); the
        label is a ``float32`` array ``(n,)`` with a fixed spec, like ``ImageRecordIter(label_width=n)``.
        A record that does not fit raises :class:`DecodeError`.
    label_dtype:
        The labels' numpy dtype; ``None`` (default) keeps MXNet's ``float32``.  ``"int64"`` (or any
        integer dtype) gives class ids ready for a loss such as ``torch.nn.functional.cross_entropy``:
        a label that is not a whole number the dtype holds raises :class:`DecodeError` (never a silent
        truncation).  A float dtype converts the float32 values.

    ``output_spec`` is ``(image.output_spec, label spec)``, or ``None`` when neither is fixed;
    ``decode_into(payload, out)`` follows :mod:`parrecio.decoders.base`.
    """

    image: Any = field(default_factory=Image)
    label_width: Optional[int] = None
    label_dtype: Any = field(default=None, metadata=shown_as(lambda dtype: dtype.name))

    def __post_init__(self) -> None:
        label_width = None if self.label_width is None else \
            check_int("label_width", self.label_width, 0, MAX_LABEL_WIDTH,
                      want=f"None or an int in 0..{MAX_LABEL_WIDTH}")
        try:  # None stays None (the default's repr, and dataclasses.replace); it means float32
            label_dtype = None if self.label_dtype is None else np.dtype(self.label_dtype)
        except TypeError:
            raise TypeError(f"label_dtype must be None or a numpy integer or float dtype, got "
                            f"{self.label_dtype!r}") from None
        if label_dtype is not None and label_dtype.kind not in "iuf":
            raise ValueError(f"label_dtype must be an integer or float dtype, got {label_dtype}")
        derive(self, label_dtype=label_dtype)
        object.__setattr__(self, "_dtype", np.dtype(np.float32) if label_dtype is None else label_dtype)
        image = Image() if self.image is None else self.image
        if not callable(image):
            raise TypeError(f"image must be a decoder (a callable of the image bytes) such as Image(), got {image!r}")
        derive(self, image=image, label_width=label_width)
        if self.label_width is None:
            label_spec = None
        else:
            label_spec = ArraySpec((self.label_width,) if self.label_width else (), self._dtype)
        image_spec = getattr(self.image, "output_spec", None)
        if image_spec is not None and not isinstance(image_spec, ArraySpec):
            raise ValueError(f"the image decoder's output_spec must be an ArraySpec or None, got {image_spec!r}")
        output_spec: Optional[Tuple[Optional[ArraySpec], Optional[ArraySpec]]] = \
            (image_spec, label_spec) if image_spec is not None or label_spec is not None else None
        derive(self, output_spec=output_spec)

    @property
    def random(self) -> bool:
        """Whether the image decoder is ``random`` (the key is then passed on to it)."""
        return is_random(self.image)

    def _label(self, header: Any) -> Label:
        """The label MXNet would see, shaped by ``label_width``, in ``label_dtype``."""
        width = self.label_width
        if header.flag == 0:
            if width is None:
                label = np.array(header.label, dtype=np.float32)
            elif width in (0, 1):
                label = np.full((width,) if width else (), header.label, dtype=np.float32)
            else:
                raise DecodeError(f"image record (id {header.id}) has a scalar label, but label_width={width}")
        elif width is None or header.flag == width:
            label = header.label
        else:
            raise DecodeError(f"image record (id {header.id}) has {header.flag} labels, but label_width={width}")
        dtype = self._dtype
        if dtype == np.float32:
            return label
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            wide = label.astype(np.float64)  # (bounds as floats: float(max) + 1 is exact, max itself not)
            if not (np.all(np.isfinite(wide)) and np.all(wide == np.round(wide))
                    and np.all(wide >= float(info.min)) and np.all(wide < float(info.max) + 1)):
                shown = label.tolist() if label.ndim == 0 or label.size <= 8 else f"{label[:8].tolist()}..."
                raise DecodeError(f"image record (id {header.id}) has the label {shown}, which label_dtype="
                                  f"{dtype.name} cannot hold exactly (class ids are whole numbers)")
        return label.astype(dtype)

    def __call__(self, payload: Any, key: Optional[int] = None) -> Tuple[Any, Label]:
        """Decode ``payload`` (bytes-like) to ``(image, label)``; ``key`` goes to a ``random`` image decoder."""
        header, data = unpack(payload)
        label = self._label(header)
        return (self.image(data, key=key) if self.random else self.image(data)), label

    def decode_into(self, payload: Any, out: Tuple[Optional[np.ndarray], Optional[np.ndarray]],
                    key: Optional[int] = None) -> Tuple[Any, Any]:
        """Write the positions with a spec into ``out``; return the others (``None`` where written)."""
        if self.output_spec is None:
            raise TypeError(f"{self!r} has no output_spec: call it instead")
        image_out, label_out = out
        header, data = unpack(payload)
        label = self._label(header)
        key = key if self.random else None
        if self.output_spec[0] is not None:  # (checked against the image decoder's spec, as a field's is)
            image = write_into(self.image, data, self.output_spec[0], image_out, key)
        else:
            image = self.image(data) if key is None else self.image(data, key=key)
        if self.output_spec[1] is not None:
            label_out[...] = label
            label = None
        return image, label
