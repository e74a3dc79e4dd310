"""Image decoders: encoded images -> ``uint8`` numpy arrays, with Pillow(-SIMD).

``Image`` decodes JPEG, PNG and every other format the loaded Pillow build reads to an ``RGB`` or ``L``
array, optionally resized to a fixed ``(height, width)``; then it has a fixed ``output_spec`` and a
``decode_into`` that writes straight into the pipeline's shared memory.  ``Mask`` decodes a semantic
segmentation mask (the PNG of a Ground Truth ``-ref`` attribute) to class ids, resized with NEAREST.

How one payload goes through ``Image``::

    payload --Image.open (lazy: header only)--> size check (max_pixels) --> plan (box, flip: the
            sample's key) --[draft]--> load() (strict) --> convert(mode) --> one resize(size, box)
            --> [EXIF transpose] --> one copy into out (mirrored with flip, through the mean/std table)

With ``crop`` a JPEG's load() is ``_jpegregion``: only the rows and columns of the box are decoded
(:meth:`_PillowDecoder._region_load`), with the whole decode's pixels, exactly, and its verdict on a
damaged file whatever the crop; augmentations: :mod:`parrecio.decoders.augment`.

Geometry.  ``resize`` says how the source fills the ``size`` frame; all three are one Pillow ``resize``
call with a source ``box``, so no pixel is computed twice and none outside the output:

- ``"stretch"``: the whole image to exactly ``size`` (aspect ratio not kept).
- ``"letterbox"``: scaled by ``s = min(W_out/W, H_out/H)`` to ``round(W*s) x round(H*s)``, centred, the
  rest filled with ``fill`` (left/top pad ``(W_out - w)//2``, ``(H_out - h)//2``).
- ``"shorter"``: scaled by ``s = max(W_out/W, H_out/H)`` (the shorter side matches) and cropped to
  ``size`` around the centre; the crop box is exact (fractional), not rounded to whole pixels first.

:meth:`Image.geometry` returns where a source point lands (``x_out = x*scale_x + offset_x``), for any
``resize``, so boxes can follow the image (``BoundingBoxes(image=...)`` does it for you);
:meth:`Image.letterbox_params` is the usual ``(scale, pad_x, pad_y)`` triple.

Exactness.  With the defaults (``draft=False``, ``reducing_gap=None``) the result equals, pixel for pixel,
``PIL.Image.open(f).convert(mode).resize((w, h), resample, box=...)`` -- what you would write by hand.
``draft`` lets libjpeg decode JPEGs at 1/2, 1/4 or 1/8 scale when the scaled image is still at least
``draft`` times as large as what the resize reads (``True``: 1); ``reducing_gap`` lets Pillow box-reduce
before resampling.  Both move pixels a little; the README ("Decoders") gives the measured differences
(``bench/bench_decoders.py``).  ``draft`` with ``mode="L"`` decodes only the luma channel.

JPEG backends.  ``backend="simplejpeg"`` decodes JPEG payloads with simplejpeg and hands the array to
the same single Pillow ``resize``.  Everything it does not take -- other formats, CMYK/YCCK JPEGs,
anything its header or strict decode rejects -- goes through Pillow, so errors and options mean the
same.  Its decode equals Pillow's only when both link
compatible libjpeg builds, so ``"auto"`` checks that in each process on a few reference JPEGs and
falls back to Pillow otherwise (:attr:`Image.jpeg_backend` says which is in use).

Strictness.  A truncated image raises :class:`DecodeError` even when Pillow's global
``ImageFile.LOAD_TRUNCATED_IMAGES`` is set (``allow_truncated=True`` accepts them).  Images whose header
claims more than ``max_pixels`` pixels are refused before any pixel memory is allocated (the one limit:
Pillow's ``MAX_IMAGE_PIXELS`` is not consulted, so a larger ``max_pixels`` is honoured).  A JPEG whose
data is damaged, or cut short but still ending with an EOI marker, decodes with grey or smeared blocks
(libjpeg only warns, and Pillow drops its warnings); ``strict=True`` refuses it with libjpeg's message,
checked after the header (a bomb is refused before it is decoded at all).
"""

from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image as PILImage
from PIL import ImageFile, features

from ..errors import DecodeError
from .base import ArraySpec
try:  # the JPEG region decoder (setup.py builds it where libjpeg's headers are; else whole decodes)
    from . import _jpegregion
except ImportError:  # pragma: no cover - depends on the build
    _jpegregion = None
from .augment import Crop, RandomResizedCrop, check_crop, check_flip, normalization_lut, sample_rng, write_pixels
from .checks import check_bool, check_real, is_int
from .pillow_globals import ForkSafeLock, SharedSetting
from .value import Value, derive
from .simplejpeg_backend import (_INSTALL_HINT, _JPEG_MAGIC, _prefix3, _require_simplejpeg, _simplejpeg,
                                 _simplejpeg_matches_pillow)
from .sniff import IMAGE_KINDS, describe, sniff

__all__ = ["Image", "Geometry", "RESAMPLING", "RESIZE_MODES", "BACKENDS"]

#: Resampling filters by name (Pillow's, all antialiased when reducing except "nearest").
RESAMPLING = {
    "nearest": PILImage.Resampling.NEAREST,
    "box": PILImage.Resampling.BOX,
    "bilinear": PILImage.Resampling.BILINEAR,
    "hamming": PILImage.Resampling.HAMMING,
    "bicubic": PILImage.Resampling.BICUBIC,
    "lanczos": PILImage.Resampling.LANCZOS,
}
#: The values of the ``resize`` parameter.
RESIZE_MODES = ("stretch", "letterbox", "shorter")
#: The values of ``Image``'s ``backend`` parameter (the JPEG decoder).
BACKENDS = ("pillow", "simplejpeg", "auto")

_TRANSPOSE = {  # EXIF orientation -> the transpose that shows the image upright (as ImageOps.exif_transpose)
    2: PILImage.Transpose.FLIP_LEFT_RIGHT,
    3: PILImage.Transpose.ROTATE_180,
    4: PILImage.Transpose.FLIP_TOP_BOTTOM,
    5: PILImage.Transpose.TRANSPOSE,
    6: PILImage.Transpose.ROTATE_270,
    7: PILImage.Transpose.TRANSVERSE,
    8: PILImage.Transpose.ROTATE_90,
}
_EXIF_ORIENTATION = 0x0112
# Pillow names a JPEG with an MPF segment (phones' gain or depth maps, 3D cameras) "MPO"; its first picture is
# what Pillow and libjpeg decode, so every JPEG path (strict checks, draft, the region decoder) applies to it.
_JPEG_FORMATS = ("JPEG", "MPO")

Size = Union[int, Tuple[int, int]]
_UPSAMPLE_MARGIN = 8  # columns around a decoded JPEG region (see _PillowDecoder._region_load)
# how far Pillow's filters reach, in source pixels per output pixel's scale (PIL.Image._filters_support)
_FILTER_SUPPORT = {"nearest": 1.0, "box": 0.5, "bilinear": 1.0, "hamming": 1.0, "bicubic": 2.0,
                   "lanczos": 3.0}
_REGION_GRAY, _REGION_FRAMED = 1, 2  # _jpegregion.decode_region's flags (its GRAY and FRAMED)


class Geometry(NamedTuple):
    """Where a point of the source image lands in the output frame.

    ``x_out = x * scale_x + offset_x`` and ``y_out = y * scale_y + offset_y``, in pixels, with (0, 0) the
    top-left corner of the top-left pixel.  ``width`` and ``height`` are the output frame's size.  A
    negative ``scale_x`` is a mirrored (horizontally flipped) output.
    """

    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    width: int
    height: int

    def apply(self, boxes: np.ndarray, clip: bool = True, dtype: Any = np.float32) -> np.ndarray:
        """Map ``(k, 5)`` ``[class_id, x0, y0, x1, y1]`` pixel boxes into the output frame (a new array of
        ``dtype``, which the mapping is computed in).

        Rows whose class id is negative (``max_boxes`` padding) are left as they are.  With ``clip`` the
        corners are clipped to the frame (a box wholly outside then has zero width or height).
        """
        out = np.array(boxes, dtype=dtype, copy=True)
        rows = out[:, 0] >= 0
        coords = out[rows, 1:5]
        coords[:, 0::2] = coords[:, 0::2] * self.scale_x + self.offset_x
        coords[:, 1::2] = coords[:, 1::2] * self.scale_y + self.offset_y
        if self.scale_x < 0:  # mirrored: the left edge is the old right one
            coords[:, [0, 2]] = coords[:, [2, 0]]
        if clip:
            np.clip(coords[:, 0::2], 0, self.width, out=coords[:, 0::2])
            np.clip(coords[:, 1::2], 0, self.height, out=coords[:, 1::2])
        out[rows, 1:5] = coords
        return out


class _Plan(NamedTuple):
    """One resize, in the upright frame: the source box (x, y, w, h) goes to content (cw x ch) at pad, and
    with ``flip`` the whole output frame is mirrored left to right."""

    box_x: float
    box_y: float
    box_w: float
    box_h: float
    content_w: int
    content_h: int
    pad_x: int
    pad_y: int
    flip: bool = False


_MAX_SIDE = 1 << 16  # the largest output side: JPEG's limit, and 12 GiB of RGB at that square


def _size_pair(size: Optional[Size]) -> Optional[Tuple[int, int]]:
    """``size`` as ``(height, width)`` ints in ``1.._MAX_SIDE``; floats and bools are refused, not truncated."""
    if size is None:
        return None
    pair = (size, size) if isinstance(size, (int, float, np.integer, np.floating)) else size
    try:
        height, width = pair
    except (TypeError, ValueError):
        raise TypeError(f"size must be an int or a (height, width) pair of ints, got {size!r}") from None
    if not (is_int(height) and is_int(width)):
        raise TypeError(f"size must be an int or a (height, width) pair of ints, got {size!r}")
    if not (1 <= height <= _MAX_SIDE and 1 <= width <= _MAX_SIDE):
        raise ValueError(f"size must be positive (height, width), each at most {_MAX_SIDE}, got {size!r}")
    return int(height), int(width)


def _plan(resize: str, src_w: int, src_h: int, out_w: int, out_h: int) -> _Plan:
    """The resize that puts a ``src_w x src_h`` upright image into the ``out_w x out_h`` frame."""
    if resize == "stretch":
        return _Plan(0.0, 0.0, src_w, src_h, out_w, out_h, 0, 0)
    if resize == "letterbox":
        scale = min(out_w / src_w, out_h / src_h)
        content_w = min(out_w, max(1, round(src_w * scale)))
        content_h = min(out_h, max(1, round(src_h * scale)))
        return _Plan(0.0, 0.0, src_w, src_h, content_w, content_h, (out_w - content_w) // 2,
                     (out_h - content_h) // 2)
    # "shorter": the side with the larger scale is kept whole; the other is cropped around the centre.
    # Computed as ratios of integers so that the whole side is exactly src (no 374.99999 boxes).
    if out_w * src_h >= out_h * src_w:
        box_h = min(src_h, out_h * src_w / out_w)
        return _Plan(0.0, (src_h - box_h) / 2, src_w, box_h, out_w, out_h, 0, 0)
    box_w = min(src_w, out_w * src_h / out_h)
    return _Plan((src_w - box_w) / 2, 0.0, box_w, src_h, out_w, out_h, 0, 0)


def _raw_box(orientation: int, raw_w: int, raw_h: int, plan: _Plan) -> Tuple[float, float, float, float]:
    """The plan's upright-frame box ``(x, y, w, h)`` in the raw (stored) frame of an image with EXIF
    ``orientation``, whose raw size is ``raw_w x raw_h``: where to resize before transposing."""
    x, y, w, h = plan.box_x, plan.box_y, plan.box_w, plan.box_h
    if orientation == 2:
        return raw_w - x - w, y, w, h
    if orientation == 3:
        return raw_w - x - w, raw_h - y - h, w, h
    if orientation == 4:
        return x, raw_h - y - h, w, h
    if orientation == 5:
        return y, x, h, w
    if orientation == 6:
        return y, raw_h - x - w, h, w
    if orientation == 7:
        return raw_w - y - h, raw_h - x - w, h, w
    if orientation == 8:
        return raw_w - y - h, x, h, w
    return x, y, w, h


def _check_resize(resize: str) -> str:
    if not isinstance(resize, str) or resize not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {resize!r}")
    return resize


def _check_formats(formats: Any) -> Optional[Tuple[str, ...]]:
    """``formats`` as a tuple of format names this Pillow opens (any case), or None: a bare string or an
    unknown name would make every payload unidentified."""
    if formats is None:
        return None
    names = None if isinstance(formats, str) else tuple(formats) if hasattr(formats, "__iter__") else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise TypeError(f"formats must be None or a sequence of Pillow format names such as ('JPEG', 'PNG'), "
                        f"got {formats!r}")
    PILImage.init()
    unknown = [n for n in names if n.upper() not in PILImage.OPEN]
    if not names or unknown:
        raise ValueError(f"formats must name formats this Pillow opens ({', '.join(sorted(PILImage.OPEN))}), "
                         f"got {formats!r}")
    return names


# Pillow's globals, set around a call (pillow_globals.py: two threads decoding at once undid each other's)
_PIXEL_LIMIT = SharedSetting(PILImage, "MAX_IMAGE_PIXELS")
_TRUNCATED = SharedSetting(ImageFile, "LOAD_TRUNCATED_IMAGES")
_WARNINGS = ForkSafeLock()  # catch_warnings() swaps the process's filter list: one at a time


def _open(payload: Any, max_pixels: int, formats: Optional[Tuple[str, ...]]) -> PILImage.Image:
    """Open lazily (header only) and refuse bombs before any pixel memory is allocated."""
    try:
        # max_pixels is the one limit, checked below (Pillow's own, 89 Mpx by default, would cap it,
        # and a value set in PIL.Image.MAX_IMAGE_PIXELS would not reach spawned decoder processes)
        with _PIXEL_LIMIT.holding(None), _WARNINGS, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "image file could not be identified")  # said below
            image = PILImage.open(io.BytesIO(payload), formats=formats)
    except PILImage.UnidentifiedImageError:
        raise DecodeError(_unidentified(payload, formats)) from None
    except Exception as exc:  # Pillow raises SyntaxError, OSError, ValueError, struct.error, ...
        raise DecodeError(f"corrupt image header ({type(exc).__name__}: {exc}); the payload is "
                          f"{describe(payload)}") from exc
    width, height = image.size
    if width < 1 or height < 1:
        raise DecodeError(f"{image.format} image has an empty size {width}x{height}")
    if width * height > max_pixels:
        raise DecodeError(f"{image.format} image of {width}x{height} = {width * height} pixels refused: more "
                          f"than max_pixels={max_pixels} (a decompression bomb?)")
    return image


def _unidentified(payload: Any, formats: Optional[Tuple[str, ...]]) -> str:
    """Why Pillow could not identify ``payload``, for the error message."""
    kind = sniff(payload)
    if kind not in IMAGE_KINDS:
        return f"not an image: the payload is {describe(payload)}"
    if kind == "webp" and not features.check("webp"):
        why = "this Pillow build has no WEBP support"
    elif formats is not None:
        listed = kind.upper() in (name.upper() for name in formats)  # Pillow takes the names in any case
        why = "corrupt header" if listed else f"{kind.upper()} is not in formats={formats}"
    else:
        why = "corrupt or truncated header, or a variant Pillow does not read"
    return f"cannot read this {kind.upper()} image ({why}): the payload is {describe(payload)}"


def _load(image: PILImage.Image, allow_truncated: bool) -> None:
    """``image.load()``, strict about truncation whatever the global ``LOAD_TRUNCATED_IMAGES`` says."""
    try:
        with _TRUNCATED.holding(allow_truncated):
            image.load()
    except Exception as exc:
        raise DecodeError(f"truncated or corrupt {image.format} image of {image.width}x{image.height} "
                          f"({type(exc).__name__}: {exc})") from exc


def _jpeg_verifier() -> Optional[Any]:
    """``verify(payload) -> None | str`` (libjpeg's first warning or error of a whole decode), or None when
    neither the C extension nor simplejpeg is installed.  The C extension passes over the two warnings about
    metadata alone (JFIF 2.x, an unknown Adobe transform); simplejpeg stops at them, so they are refused."""
    if _jpegregion is not None and hasattr(_jpegregion, "verify"):
        return _jpegregion.verify
    module = _simplejpeg()
    if module is None:
        return None

    def verify(payload: Any) -> Optional[str]:
        try:  # the smallest DCT scale, luma only: every byte of the scans is still decoded
            module.decode_jpeg(payload, colorspace="GRAY", min_width=1, min_height=1, strict=True)
        except Exception as exc:
            return str(exc) or type(exc).__name__
        return None

    return verify


def _refuse_warned(payload: Any, image: PILImage.Image) -> None:
    """``Image(strict=True)``: a DecodeError for a JPEG that libjpeg warns about (or fails on)."""
    verify = _jpeg_verifier()
    message = verify(payload) if verify is not None else None
    if message is not None:
        raise DecodeError(f"corrupt JPEG image of {image.width}x{image.height}: libjpeg says {message!r}; "
                          f"strict=True refuses it (strict=False decodes what libjpeg can, with grey or "
                          f"smeared blocks where the data is damaged)")


_WIDE_GREY = ("I;16", "I;16L", "I;16B", "I;16N")


def _eight_bit(image: PILImage.Image) -> PILImage.Image:
    """A 16-bit grey image (``I;16*``) as 8-bit ``L``: its high byte, as OpenCV and MXNet's ``imdecode``
    scale it.  Pillow's ``convert("L")`` clips at 255 instead (a 0..65535 ramp came out all white but its
    first pixel).  (32-bit ``I`` images have no one range: converted as Pillow does.)"""
    return PILImage.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8), "L")


def _orientation(image: PILImage.Image) -> int:
    """The EXIF orientation that is still to be applied to ``image`` once loaded (1: none)."""
    if image.format == "TIFF" and _tiff_upright_on_load():
        return 1  # Pillow reports the upright size and turns the pixels upright itself
    try:
        value = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # corrupt EXIF: show the image as stored
        return 1
    return value if value in _TRANSPOSE else 1


@lru_cache(maxsize=1)
def _tiff_upright_on_load() -> bool:
    """Whether this Pillow turns TIFFs upright by their orientation tag on its own (12.x does, at ``load()``):
    probed with a 2x1 TIFF tagged "rotate 90", which such a Pillow opens as 1x2."""
    exif = PILImage.Exif()
    exif[_EXIF_ORIENTATION] = 6
    out = io.BytesIO()
    PILImage.new("L", (2, 1)).save(out, "TIFF", exif=exif.tobytes())
    try:
        return PILImage.open(io.BytesIO(out.getvalue())).size == (1, 2)
    except Exception:  # pragma: no cover - a Pillow without TIFF: nothing to turn
        return False


class _PillowDecoder(Value):
    """What ``Image`` and ``Mask`` share: open, load, plan and run one resize (both are frozen dataclasses)."""

    size: Optional[Tuple[int, int]]
    resize: str
    max_pixels: int
    formats: Optional[Tuple[str, ...]]
    crop: Optional[Crop]
    flip: float

    # an image: the formats sniff names, and "other" for the rest Pillow opens (PPM, ICO, TGA, ...)
    payload_kinds = IMAGE_KINDS | {"other"}

    @property
    def random(self) -> bool:
        """Whether the output depends on the sample's key: a random crop, or ``flip`` (the decoder protocol's
        ``random`` flag, see :mod:`parrecio.decoders.base`)."""
        return self.flip > 0 or (self.crop is not None and self.crop.random)

    def _check_augment(self) -> None:
        """Validate and normalize ``crop`` and ``flip`` (``__post_init__`` of Image and Mask)."""
        crop, flip = check_crop(self.crop), check_flip(self.flip)
        if crop is not None and self.size is None:
            raise ValueError(f"crop={crop!r} needs size=...: the crop is resized to it")
        if crop is not None and self.resize != "stretch":
            raise ValueError(f"crop={crop!r} decides the source box itself: leave resize='stretch' "
                             f"(got resize={self.resize!r})")
        derive(self, crop=crop, flip=flip)

    def _plan_of(self, width: int, height: int, key: Optional[int]) -> Optional[_Plan]:
        """The resize of a ``width x height`` upright image for the sample with ``key`` (None: no resize).

        The draws, from :func:`~parrecio.decoders.augment.sample_rng`, are the crop's, then the flip's, as
        torchvision's ``RandomResizedCrop`` then ``RandomHorizontalFlip`` draw them.
        """
        rng = sample_rng(key) if self.random else None
        if self.size is None:
            plan = None if not self.flip else _Plan(0.0, 0.0, width, height, width, height, 0, 0)
        else:
            out_h, out_w = self.size
            if self.crop is None:
                plan = _plan(self.resize, width, height, out_w, out_h)
            else:
                plan = _Plan(*self.crop.box(width, height, out_w, out_h, rng), out_w, out_h, 0, 0)
        if plan is not None and self.flip and rng.random() < self.flip:  # type: ignore[union-attr]
            plan = plan._replace(flip=True)
        return plan

    # -- geometry --------------------------------------------------------------------------------------
    def geometry(self, width: int, height: int, key: Optional[int] = None) -> Geometry:
        """Where a point of a ``width x height`` source image lands in this decoder's output.

        ``width`` and ``height`` are the source image's size in pixels (as decoded: after EXIF transpose
        when that is on).  Without ``size`` the output is the source itself (scale 1, offset 0).  ``key``
        is the sample's key when the decoder is ``random``: the geometry of that sample's crop and flip
        (what ``BoundingBoxes(image=...)`` and ``Mask`` use to follow the image).
        """
        width, height = int(width), int(height)
        plan = self._plan_of(width, height, key)
        if plan is None:
            return Geometry(1.0, 1.0, 0.0, 0.0, width, height)
        frame_w, frame_h = (width, height) if self.size is None else (self.size[1], self.size[0])
        scale_x, scale_y = plan.content_w / plan.box_w, plan.content_h / plan.box_h
        offset_x, offset_y = plan.pad_x - plan.box_x * scale_x, plan.pad_y - plan.box_y * scale_y
        if plan.flip:
            scale_x, offset_x = -scale_x, frame_w - offset_x
        return Geometry(scale_x, scale_y, offset_x, offset_y, frame_w, frame_h)

    def letterbox_params(self, width: int, height: int) -> Tuple[float, int, int]:
        """``(scale, pad_x, pad_y)`` of ``resize="letterbox"`` for a ``width x height`` source image.

        ``x_out = x * scale + pad_x`` (likewise y), up to the rounding of the scaled size to whole pixels
        (under half a pixel at the far edge; :meth:`geometry` has the exact per-axis scales).
        """
        if self.size is None or self.resize != "letterbox":
            raise ValueError(f"letterbox_params needs size=... and resize='letterbox' ({self!r})")
        out_h, out_w = self.size
        plan = _plan("letterbox", width, height, out_w, out_h)
        return min(out_w / width, out_h / height), plan.pad_x, plan.pad_y

    # -- decoding steps --------------------------------------------------------------------------------
    def _open_load(self, payload: Any, draft_mode: Optional[str], draft: float, allow_truncated: bool,
                   exif_transpose: bool, key: Optional[int] = None) -> "_Loaded":
        """Open and check the header, plan the resize, maybe ask libjpeg for a DCT-scaled decode, then load
        strictly.

        ``draft`` is 0 (no DCT scaling) or the gap: the scaled image must be at least ``draft`` times as
        large as what the planned resize reads.
        """
        image = _open(payload, self.max_pixels, self.formats)
        if getattr(self, "strict", False) and image.format in _JPEG_FORMATS:
            _refuse_warned(payload, image)
        raw_size = image.size
        if exif_transpose and image.format == "PNG" and "exif" not in image.info:
            # A PNG's eXIf chunk may follow its pixels: Pillow's getexif() loads the image to look -- under
            # the global LOAD_TRUNCATED_IMAGES, which accepted a PNG cut short.  Loaded strictly first.
            _load(image, allow_truncated)
        orientation = _orientation(image) if exif_transpose else 1
        upright = (raw_size[1], raw_size[0]) if orientation >= 5 else raw_size
        plan = self._plan_of(upright[0], upright[1], key)
        if (self.crop is not None and orientation == 1 and _jpegregion is not None and image.format in _JPEG_FORMATS
                and image.mode in ("RGB", "L")):
            loaded = self._region_load(payload, image, plan, draft_mode, draft)
            if loaded is not None:
                return loaded
        factors = (1.0, 1.0)
        if (draft or draft_mode) and image.format in _JPEG_FORMATS:
            request = self._draft_request(raw_size, orientation, draft, plan) if draft else None
            result = image.draft(draft_mode, request)
            if result is not None:
                # result[1] is the original image's extent in the scaled image: (0, 0, W/s, H/s).
                factors = (result[1][2] / raw_size[0], result[1][3] / raw_size[1])
        _load(image, allow_truncated)
        return _Loaded(image, raw_size, orientation, factors, plan)

    def _region_load(self, payload: Any, image: PILImage.Image, plan: _Plan, draft_mode: Optional[str],
                     gap: float) -> Optional["_Loaded"]:
        """Decode only the rows and columns of the JPEG that the crop reads (``_jpegregion``), at the DCT
        scale Pillow's ``draft`` would pick; None when libjpeg does not take it (Pillow decodes it whole).

        The region is the crop box plus a margin: ``_UPSAMPLE_MARGIN`` columns each side, beyond which
        libjpeg's chroma upsampling at a region edge cannot reach (inside it the pixels are a whole
        decode's), and, unless the box is cut out, then resized (:meth:`_cuts_out`), the resize filter's
        reach around the box (``resize(box=)`` reads around it, ``reducing_gap`` too).

        The region goes to Pillow *framed*: in an image of ``x1 x y1`` pixels, the whole decode's
        coordinates, of which only the region is written (and read: the rest is left uninitialized).  So
        ``resize(box=)`` gets the very box, and computes the very filter weights, of the whole decode: the
        same pixels, not within a grey level (a box shifted to the region's origin rounds differently:
        1 level, and up to 17 with ``resample="box"``).  Mask's colour (RGB) masks are framed as their
        class ids (read from the region's colours), an L image.

        Damage is judged on the whole file, not on the crop: after the region the C side checks that the
        rest of the scan cannot fail (else decodes it and reads its markers up to EOI) and gives None,
        Pillow's verdict, on any libjpeg warning or error anywhere.
        """
        if not _ends_in_eoi(payload):
            return None  # cut short: Pillow says it (strictness), without decoding twice
        width, height = image.size
        scale = _dct_scale((width, height), self._draft_request((width, height), 1, gap, plan) if gap else None)
        fx = fy = 1.0 / scale
        scaled_w, scaled_h = -(-width // scale), -(-height // scale)
        bx, by, bw, bh = plan.box_x * fx, plan.box_y * fy, plan.box_w * fx, plan.box_h * fy
        mx, my = _UPSAMPLE_MARGIN, 0
        if not self._cuts_out(scale == 1, (bx, by, bw, bh)):  # resize(box=): the filter's reach
            support = _FILTER_SUPPORT[getattr(self, "resample", "nearest")]
            mx += math.ceil(support * max(1.0, bw / plan.content_w)) + 2
            my += math.ceil(support * max(1.0, bh / plan.content_h)) + 2
        x0, y0 = max(0, math.floor(bx) - mx), max(0, math.floor(by) - my)
        x1, y1 = min(scaled_w, math.ceil(bx + bw) + mx), min(scaled_h, math.ceil(by + bh) + my)
        target = getattr(self, "mode", None)  # Image's output mode; Mask (class ids) has none
        # libjpeg's own grey (luma) only where the whole decode has it too; a grey JPEG for RGB output comes
        # as RGBX (grey replicated, as Pillow's L -> RGB); RGB -> L is Pillow's conversion, on the region.
        gray = draft_mode == "L" or (image.mode == "L" and target != "RGB")
        colour_mask = target is None and not gray  # its ids are read from every pixel: the region alone
        convert = target == "L" and not gray
        framed = not (colour_mask or convert)
        got = _jpegregion.decode_region(payload, x0, y0, x1 - x0, y1 - y0, scale,
                                        (_REGION_GRAY if gray else 0) | (_REGION_FRAMED if framed else 0))
        if got is None:
            return None
        buf, ox, decoded_w = got
        mode = "L" if gray else "RGBX"  # RGBX: 4 bytes a pixel, Pillow's own layout (no unpacking)
        if framed:  # (y1 rows of x1 pixels, the region at (ox, y0); only it is written, only it is read)
            return _Loaded(PILImage.frombuffer(mode, (x1, y1), buf, "raw", mode, 0, 1), (width, height), 1,
                           (fx, fy), plan)
        region = PILImage.frombuffer(mode, (decoded_w, y1 - y0), buf, "raw", mode, 0, 1)
        frame = np.empty((y1, x1), np.uint8)  # the region's grey levels or class ids, framed as above
        # (a colour mask's ids are read from its colours here, the region's only: the frame around it is
        # never written.  Resized unframed, at the region's origin, Pillow's nearest picked other pixels
        # for a fractional box than the whole decode's; a nearest resize of the ids picks the same)
        frame[y0:, ox:] = self._ids(region) if colour_mask else np.asarray(region.convert("L"))
        return _Loaded(PILImage.frombuffer("L", (x1, y1), frame, "raw", "L", 0, 1), (width, height), 1,
                       (fx, fy), plan)

    def _draft_request(self, raw_size: Tuple[int, int], orientation: int, gap: float,
                       plan: Optional[_Plan]) -> Optional[Tuple[int, int]]:
        """The smallest whole-image size (raw frame) to decode: ``gap`` times what the resize reads."""
        if self.size is None or plan is None:
            return None
        swap = orientation >= 5
        width, height = (raw_size[1], raw_size[0]) if swap else raw_size
        need_w = math.ceil(width * plan.content_w / plan.box_w * gap - 1e-6)
        need_h = math.ceil(height * plan.content_h / plan.box_h * gap - 1e-6)
        return (need_h, need_w) if swap else (need_w, need_h)

    def _cuts_out(self, full_scale: bool, box: Sequence[float]) -> bool:
        """Whether the crop ``box`` is cut out, then resized (see :meth:`_resize`), not ``resize(box=)``."""
        return (full_scale and isinstance(getattr(self, "crop", None), RandomResizedCrop)
                and all(v == int(v) for v in box))

    def _resize(self, loaded: "_Loaded", image: PILImage.Image, resample: int,
                reducing_gap: Optional[float]) -> PILImage.Image:
        """Run the planned resize in the raw (not yet EXIF-transposed) frame: one Pillow call.

        A ``RandomResizedCrop`` box (whole pixels) in an image decoded at full scale is cut out first and
        the cut-out resized, which is what torchvision's ``RandomResizedCrop`` does to a PIL image
        (``resize(box=)`` would let the filter read the pixels just outside the box); any other box goes
        to ``resize(box=)``: a ``CenterCrop`` is then the same whether its box falls on whole pixels or
        not (``CenterCrop(1.0)`` is ``resize="shorter"`` for every image size).
        """
        plan = loaded.plan
        swap = loaded.orientation >= 5
        raw_w, raw_h = loaded.raw_size
        x0, y0, box_w, box_h = _raw_box(loaded.orientation, raw_w, raw_h, plan)
        size = (plan.content_h, plan.content_w) if swap else (plan.content_w, plan.content_h)
        fx, fy = loaded.factors
        x0, y0 = x0 * fx, y0 * fy
        box = (max(0.0, x0), max(0.0, y0), min(image.width, x0 + box_w * fx), min(image.height, y0 + box_h * fy))
        if size == image.size and box == (0, 0, image.width, image.height):
            return image
        if self._cuts_out(loaded.factors == (1.0, 1.0), box):
            return image.crop(tuple(int(v) for v in box)).resize(size, resample, reducing_gap=reducing_gap)
        return image.resize(size, resample, box=box, reducing_gap=reducing_gap)


class _Loaded(NamedTuple):
    image: PILImage.Image
    raw_size: Tuple[int, int]        # (width, height) from the header, before any draft
    orientation: int                 # EXIF orientation to undo (1: none)
    factors: Tuple[float, float]     # draft scale: decoded pixels per header pixel, per axis
    plan: Optional[_Plan]            # the sample's resize (None: none), upright frame


def _ends_in_eoi(payload: Any) -> bool:
    """Whether a JPEG has its end-of-image marker after its first scan begins: ``FF D9`` never occurs in
    entropy-coded data (an ``FF`` byte there is stuffed as ``FF 00``), so a file cut short lacks it,
    wherever the cut.  Usually the last two bytes; else (bytes after the marker, as some cameras write)
    it is looked for past the headers, whose EXIF thumbnail may hold an end marker of its own."""
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if bytes(view[-2:]) == b"\xff\xd9":
        return True
    data = view.tobytes()
    pos = 2  # after SOI: marker segments (FF xx, a 2-byte big-endian length) up to the first SOS
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xDA:
            return data.find(b"\xff\xd9", pos) >= 0
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return False


def _dct_scale(size: Tuple[int, int], request: Optional[Tuple[int, int]]) -> int:
    """The DCT scale denominator Pillow's ``draft(mode, request)`` picks for a JPEG of ``size``: the
    largest of 8, 4, 2 that keeps the image at least ``request``, else 1 (no request, or upscaling)."""
    if not request:
        return 1
    ratio = min(size[0] // request[0], size[1] // request[1])
    return next((s for s in (8, 4, 2) if ratio >= s), 1)


def _floats(value: Union[float, Sequence[float], None]) -> Union[float, Tuple[float, ...], None]:
    """``mean``/``std`` as given, made hashable: None, a float, or a tuple of floats."""
    if value is None or isinstance(value, (int, float, np.number)):
        return None if value is None else float(value)
    return tuple(float(v) for v in value)


def _check_max_pixels(max_pixels: Any) -> int:
    if not is_int(max_pixels):
        raise TypeError(f"max_pixels must be a positive int, got {max_pixels!r}")
    if max_pixels < 1:
        raise ValueError(f"max_pixels must be positive, got {max_pixels!r}")
    return int(max_pixels)


def _fill_value(fill: Any) -> Union[int, Tuple[int, ...]]:
    """``Image``'s ``fill`` as an int or a tuple of ints, each 0..255 (floats and bools refused)."""
    scalar = isinstance(fill, (int, float, np.integer, np.floating))
    values = (fill,) if scalar else () if isinstance(fill, str) or not hasattr(fill, "__iter__") else tuple(fill)
    if not values or not all(is_int(v) for v in values):
        raise TypeError(f"fill must be an int or a sequence of ints in 0..255, got {fill!r}")
    if not all(0 <= v <= 255 for v in values):
        raise ValueError(f"fill must be an int or a sequence of ints in 0..255, got {fill!r}")
    return int(fill) if scalar else tuple(int(v) for v in values)


def _fill_array(fill: Union[int, Sequence[int]], channels: Optional[int]) -> np.ndarray:
    arr = np.asarray(fill, dtype=np.int64)
    if arr.ndim > 1 or np.any(arr < 0) or np.any(arr > 255):
        raise ValueError(f"fill must be an int or a sequence of ints in 0..255, got {fill!r}")
    if arr.ndim == 1 and channels is not None and arr.size not in (1, channels):
        raise ValueError(f"fill has {arr.size} values but the output has {channels} channels")
    return arr


def _spatial(layout: str, rows: slice, cols: slice) -> tuple:
    return (rows, cols) if layout == "HWC" else (slice(None), rows, cols)


def _place(arr: np.ndarray, plan: Optional[_Plan], frame: Optional[Tuple[int, int]], layout: str,
           fill: np.ndarray, out: Optional[np.ndarray], lut: Optional[np.ndarray] = None) -> np.ndarray:
    """Copy ``arr`` (already in ``layout``) into ``out`` (allocated when ``None``), padding with ``fill``.

    ``frame`` is the output's ``(height, width)``; ``plan`` says where the content goes in it, and whether
    the frame is mirrored (the copy then reads ``arr`` backwards: no extra pass).  With ``lut``
    (:func:`~parrecio.decoders.augment.normalization_lut`) pixels and fill become float32 on the way.
    """
    if plan is not None and plan.flip:
        arr = arr[:, :, ::-1] if layout == "CHW" else arr[:, ::-1]
    if plan is None or frame is None or (plan.content_h, plan.content_w) == frame:
        if out is None:
            if lut is None:
                return np.array(arr, order="C")  # a writable copy (np.asarray of a Pillow image is read-only)
            out = np.empty(arr.shape, np.float32)
        write_pixels(out, arr, lut, layout)
        return out
    frame_h, frame_w = frame
    if out is None:
        shape = (frame_h, frame_w) + arr.shape[2:] if layout == "HWC" else (arr.shape[0], frame_h, frame_w)
        out = np.empty(shape, arr.dtype if lut is None else np.float32)
    y0 = plan.pad_y
    x0 = frame_w - plan.pad_x - plan.content_w if plan.flip else plan.pad_x
    y1, x1 = y0 + plan.content_h, x0 + plan.content_w
    write_pixels(out[_spatial(layout, slice(y0, y1), slice(x0, x1))], arr, lut, layout)
    if lut is not None:  # the fill, normalized as the pixels are
        fill = lut[np.arange(lut.shape[0]), np.broadcast_to(fill, (lut.shape[0],))]
        fill = fill[0] if arr.ndim == 2 else fill
    value = fill if layout == "HWC" or fill.ndim == 0 else fill[:, None, None]
    for rows, cols in ((slice(0, y0), slice(None)), (slice(y1, None), slice(None)),
                       (slice(y0, y1), slice(0, x0)), (slice(y0, y1), slice(x1, None))):
        out[_spatial(layout, rows, cols)] = value
    return out

@dataclass(frozen=True, repr=False)
class Image(_PillowDecoder):
    """An encoded image (JPEG, PNG, GIF, BMP, TIFF, ... whatever Pillow reads) -> ``uint8`` numpy array.

    Parameters
    ----------
    size:
        ``(height, width)`` in pixels of the output (an ``int`` means a square), or ``None`` to keep each
        image's own size.  With a ``size`` and ``mode`` other than ``"keep"`` the decoder has a fixed
        ``output_spec`` and a ``decode_into``: the pipeline writes straight into shared memory.
    mode:
        ``"RGB"`` (3 channels), ``"L"`` (8-bit grey, Pillow's ITU-R 601-2 luma) or ``"keep"`` (Pillow's own
        mode, e.g. ``P`` palette indices, ``RGBA``; then no fixed ``output_spec``).  Alpha is dropped,
        not composited.
    resize:
        ``"stretch"``, ``"letterbox"`` or ``"shorter"`` (see the module docstring); ignored without ``size``.
    layout:
        ``"HWC"`` (``(h, w, 3)``; ``(h, w)`` for ``"L"``) or ``"CHW"`` (``(3, h, w)``; ``(1, h, w)`` for ``"L"``).
    max_pixels:
        Refuse images whose header claims more than this many pixels (width * height), before decoding.
    fill:
        Letterbox padding value, 0..255: one int, or one per channel (e.g. ``(124, 116, 104)``).
    resample:
        Pillow filter name: ``"bilinear"`` (default, as torchvision), ``"bicubic"``, ``"lanczos"``,
        ``"hamming"``, ``"box"`` or ``"nearest"``.  All but ``"nearest"`` are antialiased when reducing.
    draft:
        Let libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale (DCT scaling) when the scaled image is still at
        least ``draft`` times as large as what the resize reads (``True`` means 1.0; 2.0 keeps a 2x margin
        and moves pixels less; below 1.0, down to 0.5, the resize may enlarge the scaled image by up to
        ``1 / draft``: ``0.75`` lets ImageNet-sized photos decode at 1/2 for 224 px, about 1.2x Pillow-SIMD's
        rate and 0.9 grey levels off on average; ``0.5`` about 1.35x and 1.7 levels off; README "Decoders",
        ``bench/fast_decode.py``).  Faster on big JPEGs, slightly different pixels.  Needs ``size``; with
        ``mode="L"`` it also decodes luma only.  Default ``False``: exact.
    reducing_gap:
        Pillow's ``resize(reducing_gap=...)``: box-reduce by an integer factor first when the image shrinks
        by at least this factor (>= 1.0; 2.0 or 3.0 are typical).  Default ``None``: exact.
    exif_transpose:
        Turn images upright by their EXIF orientation tag (as ``ImageOps.exif_transpose``).  Default
        ``False``: pixels as stored, as MXNet, OpenCV's ``imdecode`` and ``PIL.Image.open`` give them (a TIFF
        comes upright either way: Pillow turns it by its tag itself).
    allow_truncated:
        Accept truncated images (the missing part grey), as Pillow's ``LOAD_TRUNCATED_IMAGES`` would.
        Default ``False``: a truncated image raises :class:`DecodeError`, whatever that global says.
    strict:
        Refuse a JPEG that libjpeg reports as corrupt (a :class:`DecodeError` naming libjpeg's message)
        instead of returning the pixels it could make of it: libjpeg only *warns* about damaged
        entropy-coded data, a scan cut short before an EOI marker or bytes out of place, and fills the
        blocks it cannot read with grey or smears; Pillow drops those warnings.  The check is a whole
        1/8-scale luma decode (``_jpegregion.verify``, else simplejpeg's strict decode; ImportError here
        when neither is installed), none when simplejpeg decoded the image itself (its decode is strict
        already).  Default ``False``: what libjpeg can decode is returned, as Pillow, MXNet and
        torchvision do, because most such files still make usable samples and the check costs time.
        Not with ``allow_truncated``.
    formats:
        Pillow format names to try (e.g. ``("JPEG", "PNG")``), or ``None`` for every format Pillow has.
    backend:
        Who decodes JPEG payloads: ``"pillow"`` (default), ``"simplejpeg"`` (needs ``pip install
        'parrecio[fast]'``; ImportError here when it is missing) or ``"auto"`` (simplejpeg when it is
        installed and decodes the reference JPEGs exactly as Pillow does in this process, else Pillow).
        Other formats, and JPEGs simplejpeg does not take, always go through Pillow; the output is the same
        (see "JPEG backends" in the module docstring).
    crop:
        ``RandomResizedCrop(scale, ratio)`` (training: torchvision's box, drawn per sample) or
        ``CenterCrop(fraction)`` (validation), from :mod:`parrecio.decoders.augment`: the source box that
        is resized to ``size`` (needs ``size``, and ``resize="stretch"``).  Default ``None``: the whole
        image, placed by ``resize``.
    flip:
        Probability (0..1) of mirroring the output left to right, drawn per sample.
    mean, std:
        Normalize: the output becomes ``float32`` ``(pixel / 255 - mean) / std``, per channel, in units of
        the 0..1 pixel range (torchvision's ``Normalize`` after ``ToTensor``; ``IMAGENET_MEAN`` and
        ``IMAGENET_STD`` are in :mod:`parrecio.decoders.augment`; MXNet's 0..255 ``mean_r`` is ``/ 255``).
        One number, or one per channel; either may be left ``None`` (0, resp. 1).  Written through a
        256-entry table per channel straight into ``out``.  Not with ``mode="keep"``.

    With ``crop=RandomResizedCrop(...)`` or ``flip`` the decoder is ``random``: in the pipeline it gets each
    sample's key (see :mod:`parrecio.decoders.base`), so a sample's crop and flip depend only on the
    reader's seed, the epoch, the shard and the sample's position, and ``BoundingBoxes(image=...)``
    follows them.  Called directly, ``decoder(payload, key=k)`` decodes like sample ``k``; without a key
    it draws one from ``random``.

    Calling the decoder returns a new, writable, C-contiguous array.  Errors: :class:`DecodeError` for
    non-images (naming what the bytes look like), corrupt or truncated images and decompression bombs.
    """

    size: Optional[Size] = None
    mode: str = "RGB"
    resize: str = "stretch"
    layout: str = "HWC"
    max_pixels: int = 64_000_000
    fill: Union[int, Sequence[int]] = 0
    resample: str = "bilinear"
    draft: Union[bool, float] = False
    reducing_gap: Optional[float] = None
    exif_transpose: bool = False
    allow_truncated: bool = False
    strict: bool = False
    formats: Optional[Sequence[str]] = None
    backend: str = "pillow"
    crop: Optional[Crop] = None
    flip: float = 0.0
    mean: Union[float, Sequence[float], None] = None
    std: Union[float, Sequence[float], None] = None

    def __post_init__(self) -> None:
        mode, layout, resample, reducing_gap = self.mode, self.layout, self.resample, self.reducing_gap
        draft, max_pixels, backend, fill = self.draft, self.max_pixels, self.backend, self.fill
        if not isinstance(mode, str) or mode not in ("RGB", "L", "keep"):
            raise ValueError(f"mode must be 'RGB', 'L' or 'keep', got {mode!r}")
        if not isinstance(layout, str) or layout not in ("HWC", "CHW"):
            raise ValueError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
        if not isinstance(resample, str) or resample not in RESAMPLING:
            raise ValueError(f"resample must be one of {tuple(RESAMPLING)}, got {resample!r}")
        if reducing_gap is not None:
            reducing_gap = check_real("reducing_gap", reducing_gap, 1.0, math.inf,
                                      want="None or a finite number >= 1.0")
        if not isinstance(draft, (bool, np.bool_)):
            draft = check_real("draft", draft, 0.5, math.inf, want="a bool or a finite gap >= 0.5")
        max_pixels = _check_max_pixels(max_pixels)
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "simplejpeg":
            _require_simplejpeg()
        strict = check_bool("strict", self.strict)
        if strict and self.allow_truncated:
            raise ValueError("strict=True refuses the truncated JPEGs that allow_truncated=True accepts: "
                             "pass one of them")
        if strict and _jpeg_verifier() is None:
            raise ImportError(f"Image(strict=True) checks JPEGs with parrecio's C extension (_jpegregion, built "
                              f"at install where a C compiler and libjpeg's headers are) or with simplejpeg, "
                              f"and neither is here: {_INSTALL_HINT}", name="simplejpeg")
        derive(self, strict=strict, size=_size_pair(self.size), resize=_check_resize(self.resize),
               max_pixels=max_pixels,
               fill=_fill_value(fill), draft=draft if isinstance(draft, float) else bool(draft),
               reducing_gap=reducing_gap,
               exif_transpose=check_bool("exif_transpose", self.exif_transpose),
               allow_truncated=check_bool("allow_truncated", self.allow_truncated),
               formats=_check_formats(self.formats))
        self._check_augment()
        channels = {"RGB": 3, "L": 1}.get(mode)
        lut = None
        if self.mean is not None or self.std is not None:
            if channels is None:
                raise ValueError("mean/std normalize RGB or L pixels: not with mode='keep'")
            lut = normalization_lut(self.mean, self.std, channels)
            derive(self, mean=_floats(self.mean), std=_floats(self.std))
        spec: Optional[ArraySpec] = None
        if self.size is not None and channels is not None:
            h, w = self.size
            shape = (h, w, 3) if channels == 3 else (h, w)
            if layout == "CHW":
                shape = (channels, h, w)
            spec = ArraySpec(shape, np.uint8 if lut is None else np.float32)
        derive(self, _fill=_fill_array(self.fill, channels), _lut=lut, output_spec=spec)

    @property
    def jpeg_backend(self) -> str:
        """Who decodes JPEG payloads in this process: ``"simplejpeg"`` or ``"pillow"`` (``"auto"`` resolved)."""
        if self.backend == "pillow" or (self.formats is not None
                                        and "JPEG" not in (f.upper() for f in self.formats)):
            return "pillow"
        if self.backend == "simplejpeg":
            _require_simplejpeg()  # unpickled where it is missing: say so, not "corrupt image"
            return "simplejpeg"
        return "simplejpeg" if _simplejpeg_matches_pillow() else "pillow"

    def _simplejpeg_load(self, payload: Any, module: Any, draft_mode: Optional[str],
                         gap: float, key: Optional[int] = None) -> Optional[_Loaded]:
        """Decode a JPEG with simplejpeg as ``_open_load`` would with Pillow, or ``None``: let Pillow do it.

        Pillow's steps are mirrored exactly: the same bomb checks on the header, the same EXIF orientation,
        the same draft scale (1/2, 1/4 or 1/8: the largest ``s`` with ``W // s`` and ``H // s`` at least the
        request) and draft box (``factors = 1/s``), luma-only decoding only where ``draft`` asks for it.
        """
        try:
            height, width, colorspace, _ = module.decode_jpeg_header(payload)
        except Exception:  # corrupt or unusual header: Pillow says what is wrong, or reads it
            return None
        if colorspace not in ("YCbCr", "Gray") or width < 1 or height < 1:
            return None  # CMYK, YCCK, RGB-coded: Pillow's conversions
        pixels = width * height
        if pixels > self.max_pixels:
            raise DecodeError(f"JPEG image of {width}x{height} = {pixels} pixels refused: more than "
                              f"max_pixels={self.max_pixels} (a decompression bomb?)")
        orientation = 1
        if self.exif_transpose:  # simplejpeg ignores EXIF: Pillow reads it from the header (no decode)
            try:
                orientation = _orientation(PILImage.open(io.BytesIO(payload), formats=("JPEG",)))
            except Exception:
                return None
        upright = (height, width) if orientation >= 5 else (width, height)
        plan = self._plan_of(upright[0], upright[1], key)
        scale = _dct_scale((width, height), self._draft_request((width, height), orientation, gap, plan)
                           if gap else None)
        gray = colorspace == "Gray" or draft_mode == "L"  # as Pillow: L for grey JPEGs, luma-only draft
        out_w, out_h = -(-width // scale), -(-height // scale)
        # RGBX: Pillow keeps RGB pixels in 4 bytes, so an RGBX array maps into an image without a copy
        # (a packed RGB one would be unpacked first); the X byte is dropped after the resize.
        mode = "L" if gray else "RGBX"
        try:
            arr = module.decode_jpeg(payload, colorspace="GRAY" if gray else "RGBX", fastdct=False,
                                     fastupsample=False, min_height=out_h, min_width=out_w, strict=True)
        except Exception:  # truncated, corrupt, or only warned about: Pillow's verdict and pixels
            return None
        if arr.shape[:2] != (out_h, out_w):  # a scale Pillow would not pick: stay exact
            return None
        image = PILImage.frombuffer(mode, (out_w, out_h), arr, "raw", mode, 0, 1)
        return _Loaded(image, (width, height), orientation, (1.0 / scale, 1.0 / scale), plan)

    def _decode(self, payload: Any, key: Optional[int] = None) -> Tuple[np.ndarray, Optional[_Plan]]:
        """The decoded, converted, resized, upright content as an array in ``layout``, and its plan."""
        draft_mode = "L" if self.draft and self.mode == "L" else None
        gap = float(self.draft) if self.size is not None else 0.0  # True -> 1.0
        loaded = None
        if self.backend != "pillow" and _prefix3(payload) == _JPEG_MAGIC and self.jpeg_backend == "simplejpeg":
            loaded = self._simplejpeg_load(payload, _simplejpeg(), draft_mode, gap, key)
        if loaded is None:
            loaded = self._open_load(payload, draft_mode, gap, self.allow_truncated, self.exif_transpose, key)
        image = loaded.image
        rgbx = image.mode == "RGBX" and self.mode != "L"  # simplejpeg's: RGB after the resize (same pixels)
        try:
            if self.mode != "keep" and image.mode != self.mode and not rgbx:
                if image.mode in ("P", "PA"):
                    image.info.pop("transparency", None)  # alpha is dropped anyway; spares a warning
                if image.mode in _WIDE_GREY:
                    image = _eight_bit(image)
                image = image.convert(self.mode)
            plan = loaded.plan
            if self.size is not None:
                image = self._resize(loaded, image, RESAMPLING[self.resample], self.reducing_gap)
            if rgbx:
                image = image.convert("RGB")
            if loaded.orientation != 1:
                image = image.transpose(_TRANSPOSE[loaded.orientation])
            arr = np.asarray(image)
        except DecodeError:
            raise
        except Exception as exc:  # a mode Pillow cannot convert or resize
            raise DecodeError(f"cannot convert a {image.format or ''} {image.mode} image of {image.width}x"
                              f"{image.height} to {self.mode}: {type(exc).__name__}: {exc}") from exc
        if self.layout == "CHW":
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
        return arr, plan

    def decode_into(self, payload: Any, out: np.ndarray, key: Optional[int] = None) -> None:
        """Decode ``payload`` into ``out``, an array of ``output_spec``'s shape and dtype (may be a view);
        ``key``: the sample's key, for a ``random`` decoder."""
        arr, plan = self._decode(payload, key)
        _place(arr, plan, self.size, self.layout, self._fill, out, self._lut)

    def __call__(self, payload: Any, key: Optional[int] = None) -> np.ndarray:
        """Decode ``payload`` (bytes-like) to a new ``uint8`` array (``float32`` with ``mean``/``std``; see
        the class docstring for shapes); ``key``: the sample's key, for a ``random`` decoder."""
        if self.output_spec is not None:
            out = np.empty(self.output_spec.shape, self.output_spec.dtype)
            self.decode_into(payload, out, key)
            return out
        arr, plan = self._decode(payload, key)
        try:
            return _place(arr, plan, self.size, self.layout, self._fill, None, self._lut)
        except ValueError as exc:  # mode="keep": a per-channel fill that does not fit this image's mode
            raise DecodeError(f"fill={self.fill!r} does not fit an image of shape {arr.shape}: {exc}") from exc
