"""The optional simplejpeg JPEG decoder behind ``Image(backend="simplejpeg" | "auto")``: finding the
module, and the once-per-process check that it decodes exactly as this Pillow does (see "JPEG backends"
in :mod:`parrecio.decoders.image`)."""

from __future__ import annotations

import io
from typing import Any, Optional

import numpy as np
from PIL import Image as PILImage

_INSTALL_HINT = "pip install 'parrecio[fast]' (or: pip install simplejpeg)"
_simplejpeg_module: Any = None      # the module once imported, False when it is not installed
_auto_verdict: Optional[bool] = None  # "auto": whether simplejpeg decodes like Pillow in this process
_JPEG_MAGIC = b"\xff\xd8\xff"


def _simplejpeg() -> Any:
    """The simplejpeg module, or ``None`` when it is not installed (imported once per process)."""
    global _simplejpeg_module
    if _simplejpeg_module is None:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = False
        _simplejpeg_module = simplejpeg
    return _simplejpeg_module or None


def _require_simplejpeg() -> Any:
    module = _simplejpeg()
    if module is None:
        raise ImportError(f"Image(backend='simplejpeg') needs the simplejpeg package: {_INSTALL_HINT}",
                          name="simplejpeg")
    return module


def _reference_jpegs() -> list:
    """Small JPEGs of the kinds the backends must agree on, encoded by this Pillow (odd sizes on purpose)."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:45, 0:61].astype(np.float32)
    base = np.stack([x * 4, y * 5, (x + y) * 2.5], axis=-1) + rng.normal(0, 24, (45, 61, 3))
    image = PILImage.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    out = []
    for target, params in ((image, dict(quality=90)), (image, dict(quality=90, subsampling=0)),
                           (image, dict(quality=75, subsampling=1)), (image, dict(quality=85, progressive=True)),
                           (image.convert("L"), dict(quality=90))):
        buf = io.BytesIO()
        target.save(buf, "JPEG", **params)
        out.append(buf.getvalue())
    return out


def _simplejpeg_matches_pillow() -> bool:
    """Whether simplejpeg decodes the reference JPEGs exactly as Pillow does (full size, 1/2, luma only)."""
    global _auto_verdict
    if _auto_verdict is None:
        module = _simplejpeg()
        verdict = module is not None
        try:
            for data in (_reference_jpegs() if verdict else ()):
                for colorspace, scale in (("RGB", 1), ("RGB", 2), ("GRAY", 2)):
                    image = PILImage.open(io.BytesIO(data))
                    mode = "L" if colorspace == "GRAY" or image.mode == "L" else "RGB"
                    if scale > 1 or colorspace == "GRAY":
                        image.draft(mode, (image.width // scale, image.height // scale))
                    theirs = np.asarray(image.convert(mode))
                    ours = module.decode_jpeg(data, colorspace="GRAY" if mode == "L" else "RGB",
                                              min_width=image.width, min_height=image.height)
                    if ours.shape[:2] != theirs.shape[:2] or not np.array_equal(ours.reshape(theirs.shape),
                                                                                theirs):
                        verdict = False
        except Exception:  # an unexpected simplejpeg: stay on Pillow
            verdict = False
        _auto_verdict = verdict
    return _auto_verdict


def _prefix3(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload[:3]
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return bytes(view[:3])
