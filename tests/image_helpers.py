"""Deterministic test images, generated on the fly (no committed binaries).

``photo(width, height, seed)`` draws something photo-like: smooth colour gradients, soft-edged shapes, a
textured region and seeded sensor noise, so that JPEG encoding, DCT scaling and resampling behave as on
real photographs (no flat areas that hide differences, no pure noise that defeats compression).
The encoders below turn it into JPEG / PNG bytes; the ``*_claiming`` helpers craft tiny files whose
headers claim a huge size (decompression bombs) with valid checksums.
"""

from __future__ import annotations

import io
import struct
import zlib
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np
from PIL import Image

__all__ = ["photo", "encode", "jpeg", "png", "png_claiming", "jpeg_claiming", "palette_mask", "mask_png",
           "with_exif_orientation", "gt_boxes_json"]


@lru_cache(maxsize=64)
def photo(width: int = 320, height: int = 240, seed: int = 0) -> np.ndarray:
    """A photo-like ``uint8 (height, width, 3)`` RGB array, the same for the same arguments (read-only)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    # Sky-to-ground gradient with a tilt that depends on the seed.
    base = np.stack([
        80 + 120 * v + 30 * np.sin(3 * u + seed),
        110 + 90 * (1 - v) + 25 * np.cos(2 * v + u),
        170 - 110 * v + 40 * u,
    ], axis=-1)
    # Soft-edged ellipses and a few rectangles (objects with edges).
    for _ in range(6):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(0.05, 0.3) * width, rng.uniform(0.05, 0.3) * height
        edge = np.minimum((((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 - 1) * 12, 60)
        inside = 1 / (1 + np.exp(edge))
        base += inside[..., None] * (rng.uniform(-90, 90, 3) - base * 0.3)
    for _ in range(3):
        x0, y0 = rng.integers(0, width - 8), rng.integers(0, height - 8)
        x1, y1 = x0 + rng.integers(8, width // 3 + 9), y0 + rng.integers(8, height // 3 + 9)
        base[y0:y1, x0:x1] = rng.uniform(0, 255, 3)
    # Multi-scale smooth noise (foliage, clouds), a textured patch and sensor noise.
    for cell, amp in ((48, 22.0), (12, 12.0), (3, 7.0)):
        base += _smooth_noise(rng, width, height, cell)[..., None] * amp * rng.uniform(0.6, 1.4, 3)
    texture = 18 * np.sin(x * 0.9 + 0.3 * seed) * np.cos(y * 1.1)
    base += (texture * (u > 0.55) * (v > 0.5))[..., None]
    base += rng.normal(0, 4, base.shape)
    arr = np.clip(base, 0, 255).astype(np.uint8)
    arr.flags.writeable = False
    return arr


def _smooth_noise(rng: np.random.Generator, width: int, height: int, cell: int) -> np.ndarray:
    """Gaussian noise on a grid of ``cell`` pixels, bilinearly interpolated (pure numpy)."""
    grid = rng.normal(size=(height // cell + 2, width // cell + 2)).astype(np.float32)
    gy, gx = np.arange(height, dtype=np.float32) / cell, np.arange(width, dtype=np.float32) / cell
    iy, ix = gy.astype(int), gx.astype(int)
    fy, fx = (gy - iy)[:, None], (gx - ix)[None, :]
    top = grid[iy][:, ix] * (1 - fx) + grid[iy][:, ix + 1] * fx
    bottom = grid[iy + 1][:, ix] * (1 - fx) + grid[iy + 1][:, ix + 1] * fx
    return top * (1 - fy) + bottom * fy


def encode(arr: np.ndarray, fmt: str = "JPEG", mode: Optional[str] = None, **params) -> bytes:
    """Encode an array with Pillow; ``mode`` converts first (e.g. ``"L"``); ``params`` go to ``save``."""
    image = Image.fromarray(arr)
    if mode is not None and image.mode != mode:
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


@lru_cache(maxsize=64)
def jpeg(width: int = 320, height: int = 240, seed: int = 0, quality: int = 90, mode: str = "RGB",
         **params) -> bytes:
    """A photo-like JPEG (``quality`` 1..100, ``mode`` ``"RGB"`` or ``"L"``)."""
    return encode(photo(width, height, seed), "JPEG", mode=mode, quality=quality, **params)


@lru_cache(maxsize=64)
def png(width: int = 320, height: int = 240, seed: int = 0, mode: str = "RGB") -> bytes:
    """A photo-like PNG in ``mode`` (``"RGB"``, ``"L"``, ``"RGBA"``, ``"P"``)."""
    arr = photo(width, height, seed)
    if mode == "P":
        return _encode_image(Image.fromarray(arr).quantize(64), "PNG")
    if mode == "RGBA":
        alpha = (np.arange(width, dtype=np.uint16)[None, :] * 255 // max(width - 1, 1)).astype(np.uint8)
        rgba = np.dstack([arr, np.broadcast_to(alpha, (height, width))])
        return _encode_image(Image.fromarray(rgba, "RGBA"), "PNG")
    return encode(arr, "PNG", mode=mode)


def _encode_image(image: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """A tiny (1x1 data) PNG whose IHDR claims ``width x height``, with correct CRCs."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    idat = zlib.compress(b"\x00\x00\x00\x00")
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
            + _png_chunk(b"IEND", b""))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small real JPEG whose SOF0 frame header is patched to claim ``width x height`` (<= 65535)."""
    data = bytearray(jpeg(16, 16, seed=1))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def palette_mask(width: int, height: int, classes: int = 5, seed: int = 0) -> np.ndarray:
    """A ``uint8 (height, width)`` class-id map of blobs (ids 0..classes-1)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    ids = np.zeros((height, width), np.uint8)
    for c in range(1, classes):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.1, 0.35) * min(width, height)
        ids[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = c
    return ids


def mask_png(ids: np.ndarray, mode: str = "P", colors: Optional[Sequence[Sequence[int]]] = None) -> bytes:
    """Encode class ids as a ``P`` (palette), ``L`` or ``RGB`` (via ``colors``) PNG."""
    if mode == "L":
        return _encode_image(Image.fromarray(ids, "L"), "PNG")
    if mode == "RGB":
        table = np.asarray(colors, dtype=np.uint8)
        return _encode_image(Image.fromarray(table[ids], "RGB"), "PNG")
    image = Image.new("P", (ids.shape[1], ids.shape[0]))
    palette = [v for i in range(256) for v in ((i * 47) % 256, (i * 91) % 256, (i * 139) % 256)]
    image.putpalette(palette)
    image.frombytes(ids.tobytes())
    return _encode_image(image, "PNG")


def with_exif_orientation(arr: np.ndarray, orientation: int, quality: int = 95) -> bytes:
    """A JPEG of ``arr`` carrying EXIF orientation tag ``orientation`` (1..8)."""
    image = Image.fromarray(arr)
    exif = image.getexif()
    exif[0x0112] = orientation
    return _encode_image(image, "JPEG", quality=quality, exif=exif.tobytes())


def gt_boxes_json(boxes, width: int = 500, height: int = 375, **extra) -> bytes:
    """Ground Truth bounding-box label JSON: ``boxes`` are ``(class_id, left, top, width, height)``."""
    import orjson

    doc = {"image_size": [{"width": width, "height": height, "depth": 3}],
           "annotations": [{"class_id": c, "left": l, "top": t, "width": w, "height": h}
                           for c, l, t, w, h in boxes]}
    doc.update(extra)
    return orjson.dumps(doc)
