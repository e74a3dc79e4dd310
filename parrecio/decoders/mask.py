"""``Mask``: semantic-segmentation masks (the PNG of a Ground Truth ``-ref`` attribute) -> ``uint8 (H, W)``
class ids, resized with NEAREST so that no id is invented.  Built on :mod:`parrecio.decoders.image`'s
machinery (same opening, size checks, strict loading and geometry as ``Image``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Tuple

import numpy as np
from PIL import Image as PILImage

from ..errors import DecodeError
from .checks import is_int, check_bool, check_int, check_real
from .base import ArraySpec
from .image import (Size, _PillowDecoder, _Plan, _check_formats, _check_max_pixels, _check_resize, _place,
                    _size_pair)
from .value import derive, shown_as

__all__ = ["Mask"]


_HEX = frozenset("0123456789abcdefABCDEF")


def _parse_color(value: Any) -> int:
    """``"#rrggbb"``, ``(r, g, b)`` or a Ground Truth ``{"hex-color": "#rrggbb", ...}`` -> 0xRRGGBB."""
    if isinstance(value, dict):
        value = value.get("hex-color")
    if isinstance(value, str):
        text = value.lstrip("#")
        if len(text) == 6 and set(text) <= _HEX:
            return int(text, 16)
    elif isinstance(value, (tuple, list)) and len(value) >= 3 and all(is_int(v) for v in value[:3]):
        r, g, b = (int(v) for v in value[:3])
        if all(0 <= v <= 255 for v in (r, g, b)):
            return (r << 16) | (g << 8) | b
    raise ValueError(f"colors: not a colour: {value!r} (use '#rrggbb', (r, g, b) or "
                     f"{{'hex-color': '#rrggbb'}})")


def _show_colors(colors: Tuple[Tuple[int, int], ...]) -> dict:
    """The normalized ``colors`` as the constructor takes them: ``{class_id: "#rrggbb"}``."""
    return {class_id: f"#{rgb:06x}" for class_id, rgb in colors}


@dataclass(frozen=True, repr=False)
class Mask(_PillowDecoder):
    """A semantic-segmentation mask image (Ground Truth ``-ref`` PNG) -> ``uint8 (H, W)`` class ids.

    Class ids are read as stored: palette indices for ``P`` images, values for ``L`` (and for 16/32-bit
    grey, which must then be <= 255), 0/1 for ``1``; an alpha band is ignored.  RGB(A) masks need
    ``colors``: the colour of each class.

    Parameters
    ----------
    size:
        ``(height, width)`` of the output (an ``int`` means a square), or ``None`` for the mask's own size.
        With a size the decoder has a fixed ``output_spec`` ``(h, w) uint8`` and a ``decode_into``.
    resize:
        ``"stretch"``, ``"letterbox"`` or ``"shorter"``, with the same geometry as :class:`Image` (use the
        same value as the image's decoder so that mask and image stay aligned).  Always NEAREST.
    fill:
        Class id of letterbox padding (e.g. 255, the usual "ignore" label).
    colors:
        For RGB masks: ``colors[i]`` is the colour of class ``i`` (``"#rrggbb"`` or ``(r, g, b)``), or a
        mapping ``{class_id: colour}`` -- Ground Truth's ``internal-color-map`` from the ``-metadata``
        attribute (``{"0": {"hex-color": "#ffffff", ...}, ...}``) can be passed as it is.
    unknown:
        Class id for RGB colours not in ``colors``; ``None`` (default) raises :class:`DecodeError` instead.
    max_pixels, allow_truncated, formats:
        As for :class:`Image`.
    crop, flip:
        As for :class:`Image`: give the mask the image decoder's ``crop`` and ``flip`` and it gets the
        same box and the same flip for the same sample (the key is per sample, not per field).
    resolution:
        The mask's pixels per image pixel, along each side (``2``: the masks are stored at twice their
        images' width and height; ``0.5``: at half), 1/64..64.  With a ``crop`` the box is drawn for the
        image's size (the mask's divided by ``resolution``, rounded) and scaled to the mask's, so the mask
        gets the same relative box as its image.  A mask decoder cannot see the image's size: a mask at
        another resolution than its image with the default ``1.0`` gets a box drawn for its own size,
        unrelated to the image's.  Without ``crop`` the geometry is relative already and this changes
        nothing.
    """

    size: Optional[Size] = None
    resize: str = "stretch"
    fill: int = 0
    #: normalized to sorted ``(class_id, 0xRRGGBB)`` pairs, so that the decoder hashes
    colors: Any = field(default=None, metadata=shown_as(_show_colors))
    unknown: Optional[int] = None
    max_pixels: int = 64_000_000
    allow_truncated: bool = False
    formats: Optional[Sequence[str]] = None
    crop: Any = None
    flip: float = 0.0
    resolution: float = 1.0

    def __post_init__(self) -> None:
        fill = check_int("fill", self.fill, 0, 255, want="a class id in 0..255")
        unknown = None if self.unknown is None else \
            check_int("unknown", self.unknown, 0, 255, want="None or a class id in 0..255")
        size, colors = _size_pair(self.size), self._freeze_colors(self.colors)
        derive(self, size=size, resize=_check_resize(self.resize), fill=fill, unknown=unknown,
               max_pixels=_check_max_pixels(self.max_pixels),
               allow_truncated=check_bool("allow_truncated", self.allow_truncated),
               formats=_check_formats(self.formats), colors=colors,
               resolution=check_real("resolution", self.resolution, 1 / 64, 64.0, want="a number in 1/64..64"))
        self._check_augment()
        color_keys, color_ids = self._color_table(colors)
        derive(self, _color_keys=color_keys, _color_ids=color_ids, _fill=np.asarray(self.fill, dtype=np.int64),
               output_spec=None if size is None else ArraySpec(size, np.uint8))

    @staticmethod
    def _freeze_colors(colors: Any) -> Optional[Tuple[Tuple[int, int], ...]]:
        """``colors`` as a hashable, picklable tuple of ``(class_id, 0xRRGGBB)``."""
        if colors is None:
            return None
        if isinstance(colors, tuple) and all(isinstance(p, tuple) and len(p) == 2 and all(is_int(v) for v in p)
                                             for p in colors):  # already frozen (dataclasses.replace)
            items = [(class_id, f"#{int(rgb):06x}") for class_id, rgb in colors]  # a bad rgb: not 6 hex digits
        elif isinstance(colors, str) or not hasattr(colors, "__iter__"):
            raise TypeError(f"colors must be a sequence of colours or a mapping {{class_id: colour}}, got {colors!r}")
        else:
            items = colors.items() if hasattr(colors, "items") else enumerate(colors)
        pairs = []
        for key, value in items:
            if isinstance(key, str) and key.strip().isdigit():  # Ground Truth's internal-color-map: "0": ...
                key = int(key)
            if not is_int(key) or not 0 <= key <= 255:
                raise ValueError(f"class ids of colors must be ints in 0..255, got {key!r}")
            pairs.append((int(key), _parse_color(value)))
        if not pairs:  # (every RGB mask's colour would be unknown: an IndexError per sample)
            raise ValueError("colors is empty: give the colour of each class")
        keys = [c for _, c in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("two classes have the same colour in colors")
        return tuple(sorted(pairs))

    @staticmethod
    def _color_table(colors: Optional[Tuple[Tuple[int, int], ...]]) -> Tuple[np.ndarray, np.ndarray]:
        pairs = sorted(colors or (), key=lambda p: p[1])
        return (np.array([c for _, c in pairs], dtype=np.uint32),
                np.array([i for i, _ in pairs], dtype=np.uint8))

    def _plan_of(self, width: int, height: int, key: Optional[int]) -> Optional[_Plan]:
        """The image decoder's plan, for a mask at ``resolution`` times its image's size: with a ``crop`` the
        box is drawn for the image's size and scaled to the mask's (the same relative box)."""
        if self.resolution == 1.0 or self.crop is None:
            return super()._plan_of(width, height, key)
        image_w = max(1, round(width / self.resolution))
        image_h = max(1, round(height / self.resolution))
        plan = super()._plan_of(image_w, image_h, key)
        fx, fy = width / image_w, height / image_h
        return plan._replace(box_x=plan.box_x * fx, box_y=plan.box_y * fy, box_w=plan.box_w * fx,
                             box_h=plan.box_h * fy)

    def _ids(self, image: PILImage.Image) -> np.ndarray:
        """Class ids of a loaded (maybe resized) mask image, ``uint8 (h, w)``."""
        mode = image.mode
        if mode in ("P", "L"):
            return np.asarray(image)
        if mode in ("PA", "LA"):
            return np.asarray(image)[..., 0]
        if mode == "1":
            return np.asarray(image).astype(np.uint8)
        if mode in ("RGB", "RGBA", "RGBX"):
            return self._map_colors(np.asarray(image))
        if mode.startswith("I") or mode == "F":
            arr = np.asarray(image)
            if arr.size and (arr.min() < 0 or arr.max() > 255):
                raise DecodeError(f"{mode} mask has values {arr.min()}..{arr.max()}: class ids must be 0..255")
            return arr.astype(np.uint8)
        raise DecodeError(f"cannot read class ids from a {mode} mask image")

    def _map_colors(self, rgb: np.ndarray) -> np.ndarray:
        if self.colors is None:
            raise DecodeError("RGB mask: pass Mask(colors=...) (e.g. the -metadata internal-color-map) to map "
                              "colours to class ids")
        packed = (rgb[..., 0].astype(np.uint32) << 16) | (rgb[..., 1].astype(np.uint32) << 8) | rgb[..., 2]
        keys = self._color_keys
        pos = np.minimum(np.searchsorted(keys, packed), len(keys) - 1)
        known = keys[pos] == packed
        ids = self._color_ids[pos]
        if not known.all():
            if self.unknown is None:
                bad = int(packed[~known].flat[0])
                raise DecodeError(f"RGB mask has colour #{bad:06x}, not in colors (pass unknown=... to map "
                                  f"such pixels to one class id)")
            ids = np.where(known, ids, np.uint8(self.unknown))
        return ids

    def _decode(self, payload: Any, key: Optional[int] = None) -> Tuple[np.ndarray, Optional[_Plan]]:
        loaded = self._open_load(payload, None, 0.0, self.allow_truncated, False, key)
        image = loaded.image
        if self.size is not None:
            if image.mode not in ("P", "L", "PA", "LA", "RGB", "RGBA", "1"):
                # exotic modes: class ids first, then resize the ids
                image = PILImage.fromarray(self._ids(image), "L")
            image = self._resize(loaded, image, PILImage.Resampling.NEAREST, None)
        return self._ids(image), loaded.plan

    def decode_into(self, payload: Any, out: np.ndarray, key: Optional[int] = None) -> None:
        """Decode ``payload`` into ``out``, a ``uint8`` array of shape ``size`` (may be a view); ``key``: the
        sample's key, for a ``random`` mask (give it the image's ``crop`` and ``flip``: same key, same box)."""
        ids, plan = self._decode(payload, key)
        _place(ids, plan, self.size, "HWC", self._fill, out)

    def __call__(self, payload: Any, key: Optional[int] = None) -> np.ndarray:
        """Decode ``payload`` (bytes-like) to a new ``uint8 (H, W)`` array of class ids."""
        ids, plan = self._decode(payload, key)
        return _place(ids, plan, self.size, "HWC", self._fill, None)
