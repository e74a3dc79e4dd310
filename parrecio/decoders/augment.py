"""Training augmentations fused with decoding: where a crop comes from, and float32 normalization.

``Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD)`` decodes,
crops, resizes, flips and normalizes in one pass in the decoder process, writing float32 straight into
the output slot.  This module holds the pieces :class:`~parrecio.decoders.Image` (and ``Mask``,
``BoundingBoxes(image=...)``) use:

- the crop policies :class:`RandomResizedCrop` (torchvision's sampling rule, draw for draw) and
  :class:`CenterCrop` (``Resize(s / fraction)`` + ``CenterCrop(s)``, the validation transform): each
  maps an image size to a source box ``(x, y, w, h)`` in pixels of the upright image;
- the per-sample random stream: :func:`sample_rng` of the 64-bit ``key`` the pipeline gives every
  sample (:func:`parrecio.decoders.base.sample_key` of seed, epoch, shard and position), so the crop and
  flip of a sample do not depend on which process decoded it, or how often;
- :func:`normalization_lut` and :func:`write_pixels`: ``(pixel / 255 - mean) / std`` as one 256-entry
  float32 table per channel, applied while the pixels are copied into the output (no float temporaries:
  about 4x cheaper than numpy arithmetic on a 224x224x3 image).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from .checks import is_real
from .value import Value, derive

__all__ = ["RandomResizedCrop", "CenterCrop", "IMAGENET_MEAN", "IMAGENET_STD", "sample_rng",
           "normalization_lut", "write_pixels"]

#: torchvision's ImageNet statistics, in units of the 0..1 pixel range.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Box = Tuple[float, float, float, float]  # (x, y, w, h) in pixels of the upright source image


def sample_rng(key: Optional[int]) -> random.Random:
    """The random stream of one sample: ``random.Random(key)`` (Mersenne Twister seeded from the int, the
    same on every platform and Python 3 version).  ``key=None`` -- a decoder called outside the
    pipeline without a key -- draws a fresh key from the process's ``random``, as torchvision's
    transforms draw from the global generator."""
    return random.Random(random.getrandbits(64) if key is None else key)


def _pair(value: Sequence[float], name: str) -> Tuple[float, float]:
    try:
        lo, hi = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high), got {value!r}") from None
    if not (is_real(lo) and is_real(hi)):
        raise TypeError(f"{name} must be a pair of numbers (low, high), got {value!r}")
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi or lo <= 0:
        raise ValueError(f"{name} must be finite with 0 < low <= high, got {value!r}")
    return lo, hi


#: The crop's width / height is drawn within these bounds: beyond them no image has such a crop, and the
#: sampling's square roots overflow (``ratio=(1e-308, 1e308)`` made every decode an OverflowError).
RATIO_LIMITS = (1e-6, 1e6)

#: The smallest ``CenterCrop`` fraction: below it the box is a speck of a pixel, and the scale that maps
#: it to the output (and boxes with it) overflows float32 near 1e-34.
MIN_FRACTION = 1e-4


@dataclass(frozen=True, repr=False)
class RandomResizedCrop(Value):
    """torchvision's ``RandomResizedCrop`` box: a random area fraction and aspect ratio, then a random place.

    Parameters
    ----------
    scale:
        ``(low, high)``: the crop's area as a fraction of the image's, drawn uniformly.
    ratio:
        ``(low, high)``: the crop's width / height, drawn log-uniformly; within ``RATIO_LIMITS``
        (1e-6..1e6), beyond which the sampling's square roots overflow.

    The draws are torchvision's ``get_params``, in order: up to 10 tries of ``(area, log ratio)``, the
    first box that fits taking a random top-left corner; else the whole image cropped to the nearest
    allowed ratio, centred.  The output size comes from the decoder's ``size``.
    """

    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)

    random = True

    def __post_init__(self) -> None:
        scale, ratio = _pair(self.scale, "scale"), _pair(self.ratio, "ratio")
        if scale[1] > 1.0:
            raise ValueError(f"scale is a fraction of the image's area: high must be <= 1, got {self.scale!r}")
        if ratio[0] < RATIO_LIMITS[0] or ratio[1] > RATIO_LIMITS[1]:
            raise ValueError(f"ratio (the crop's width / height) must be within [{RATIO_LIMITS[0]:g}, "
                             f"{RATIO_LIMITS[1]:g}], got {self.ratio!r}")
        derive(self, scale=scale, ratio=ratio, _log_ratio=(math.log(ratio[0]), math.log(ratio[1])))

    def box(self, width: int, height: int, out_w: int, out_h: int, rng: random.Random) -> Box:
        """The crop ``(x, y, w, h)`` of a ``width x height`` image; ``out_w, out_h`` are not used (the crop
        is resized to them whatever its shape, as torchvision's is)."""
        area = width * height
        lo, hi = self._log_ratio
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(lo, hi))
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                y = rng.randint(0, height - h)
                x = rng.randint(0, width - w)
                return float(x), float(y), float(w), float(h)
        in_ratio = width / height
        # (a side of at least 1 px: a 1-px-wide image with ratios above 2 gave a crop of no pixels)
        if in_ratio < self.ratio[0]:
            w, h = width, max(1, int(round(width / self.ratio[0])))
        elif in_ratio > self.ratio[1]:
            w, h = max(1, int(round(height * self.ratio[1]))), height
        else:
            w, h = width, height
        return float((width - w) // 2), float((height - h) // 2), float(w), float(h)


@dataclass(frozen=True, repr=False)
class CenterCrop(Value):
    """The validation crop: the centred box of the output's aspect ratio, ``fraction`` of the largest one.

    With a square ``size=s`` this is torchvision's ``Resize(round(s / fraction))`` + ``CenterCrop(s)``
    (``fraction=0.875``: ``Resize(256)`` + ``CenterCrop(224)``), up to the rounding of the intermediate
    size; ``fraction=1.0`` is ``Image(resize="shorter")``.  ``fraction`` is at least ``MIN_FRACTION`` (1e-4).
    """

    fraction: float = 0.875

    random = False

    def __post_init__(self) -> None:
        if not is_real(self.fraction) or not MIN_FRACTION <= float(self.fraction) <= 1:  # NaN fails it too
            kind = ValueError if is_real(self.fraction) else TypeError
            raise kind(f"fraction must be in (0, 1], at least {MIN_FRACTION:g}, got {self.fraction!r}")
        derive(self, fraction=float(self.fraction))

    def box(self, width: int, height: int, out_w: int, out_h: int, rng: Any = None) -> Box:
        """The centred crop ``(x, y, w, h)`` of a ``width x height`` image for an ``out_w x out_h`` output."""
        if out_w * height >= out_h * width:  # the output is wider than the image: the whole width
            w, h = float(width), width * out_h / out_w
        else:
            w, h = height * out_w / out_h, float(height)
        w, h = w * self.fraction, h * self.fraction
        return (width - w) / 2, (height - h) / 2, w, h


Crop = Union[RandomResizedCrop, CenterCrop]


def check_crop(crop: Any) -> Optional[Crop]:
    """``crop`` validated: None, a :class:`RandomResizedCrop` or a :class:`CenterCrop`."""
    if crop is None or isinstance(crop, (RandomResizedCrop, CenterCrop)):
        return crop
    raise TypeError(f"crop must be None, RandomResizedCrop(...) or CenterCrop(...), got {crop!r}")


def check_flip(flip: Any) -> float:
    """``flip``, the probability of a horizontal flip, validated."""
    if not is_real(flip):
        raise TypeError(f"flip must be a probability in [0, 1], got {flip!r}")
    value = float(flip)
    if not 0.0 <= value <= 1.0:  # NaN fails it too
        raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
    return value


def _channels(value: Any, channels: int, name: str) -> np.ndarray:
    raw = np.asarray(value)
    if raw.dtype.kind not in "iuf" or raw.ndim > 1:  # "0.5", True, None inside a list; [[0.2, ...]]
        raise TypeError(f"{name} must be one number or one per channel ({channels}), got {value!r}")
    arr = raw.astype(np.float64).reshape(-1)
    if arr.size == 1:
        arr = np.repeat(arr, channels)
    if arr.size != channels or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be one finite number or one per channel ({channels}), got {value!r}")
    return arr


def normalization_lut(mean: Any, std: Any, channels: int) -> np.ndarray:
    """``(channels, 256)`` float32: entry ``[c, v]`` is ``(v / 255 - mean[c]) / std[c]``, computed in float64.

    ``mean`` and ``std`` are in units of the 0..1 pixel range (torchvision's ``ToTensor`` +
    ``Normalize``); ``None`` means 0 and 1 (just the scaling to 0..1).  For MXNet's ``mean_r=123.68``
    style (0..255 units) divide by 255.
    """
    m = _channels(0.0 if mean is None else mean, channels, "mean")
    s = _channels(1.0 if std is None else std, channels, "std")
    if np.any(s <= 0):
        raise ValueError(f"std must be positive, got {std!r}")
    values = np.arange(256, dtype=np.float64) / 255.0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # judged below, not warned about
        lut = ((values[None, :] - m[:, None]) / s[:, None]).astype(np.float32)
    if not np.all(np.isfinite(lut)):
        raise ValueError(f"mean={mean!r} and std={std!r} overflow float32: (pixel / 255 - mean) / std must be "
                         f"finite for every pixel value 0..255 (mean and std are in units of the 0..1 range)")
    return lut


def write_pixels(dst: np.ndarray, src: np.ndarray, lut: Optional[np.ndarray], layout: str) -> None:
    """Copy ``uint8`` pixels ``src`` into ``dst`` (same shape, any strides: flipped views welcome),
    through ``lut`` (:func:`normalization_lut`) when given.  ``layout`` says where the channels are:
    last for ``"HWC"`` (none for a 2-D grey image), first for ``"CHW"``."""
    if lut is None:
        dst[...] = src
        return
    take = np.take
    if src.ndim == 2:
        take(lut[0], src, out=dst, mode="clip")
    elif layout == "CHW":
        for c in range(src.shape[0]):
            take(lut[c], src[c], out=dst[c], mode="clip")
    else:
        for c in range(src.shape[-1]):
            take(lut[c], src[..., c], out=dst[..., c], mode="clip")
