"""How much of a wrong multipart join ``Image(strict=True)`` catches, against the default.

    .venv/bin/python -m bench.bench_strict [--count 300] [--split-bytes 4096]

Writes photo-like JPEGs (``bench_decoders.load_images``' generator, at two sizes) as concat-split
multipart records (SageMaker's wrapper, ``pack manifest --split-bytes``), reads them back with the wrong
join (``join="mxnet"``: 4 bytes of magic inserted at every cut), and counts, per size: the payloads that
came back damaged, those the default ``Image()`` refuses (the rest decode to grey or smeared blocks
without a word), those ``Image(strict=True)``'s check refuses, and whole payloads it refuses (should be
0).  The decode-rate cost of ``strict`` is in ``bench.bench_decoders`` (``strict=True`` rows).  Prints
one JSON document.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
from typing import Sequence

import numpy as np
from PIL import Image as PILImage

from parrecio import DecodeError, ParallelReader
from parrecio.decoders import Image
from parrecio.decoders import image as image_mod
from parrecio.decoders.image import _jpeg_verifier
from parrecio.recordio.wrapper import write_sagemaker_recordio


def photo_jpegs(count: int, width: int, height: int, quality: int = 90) -> list:
    """Smooth, photo-like JPEGs: gradients with coarse noise (not white noise: real photos compress)."""
    rng = np.random.default_rng(width * height)
    out = []
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in range(count):
        coarse = rng.normal(0, 40, (height // 16 + 1, width // 16 + 1, 3)).repeat(16, 0).repeat(16, 1)
        base = np.stack([x * 0.5 + i, y * 0.6, (x + y) * 0.3], axis=-1) + coarse[:height, :width]
        base += rng.normal(0, 6, base.shape)
        buf = io.BytesIO()
        PILImage.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def measure(images: list, split_bytes: int, folder: str) -> dict:
    path = os.path.join(folder, "split.rec")
    with open(path, "wb") as f:
        write_sagemaker_recordio(images, f, split_bytes)
    with ParallelReader(path, fields=None, workers=0, join="mxnet") as reader:
        read = [bytes(p) for p in reader]
    damaged = [i for i, (got, want) in enumerate(zip(read, images)) if got != want]
    verify = _jpeg_verifier()
    default = Image()
    default_refuses = 0
    for i in damaged:
        try:
            default(read[i])
        except DecodeError:
            default_refuses += 1
    strict = sum(verify(read[i]) is not None for i in damaged)
    whole = [i for i in range(len(read)) if i not in set(damaged)]
    return {"images": len(images), "mean_bytes": int(np.mean([len(b) for b in images])),
            "multipart": sum(len(b) > split_bytes for b in images), "damaged": len(damaged),
            "default_refuses": default_refuses, "strict_refuses": strict,
            "strict_refuses_whole": sum(verify(read[i]) is not None for i in whole)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="images per size (default 300)")
    parser.add_argument("--split-bytes", type=int, default=4096, help="part size of the writer (default 4096)")
    args = parser.parse_args(argv)
    doc = {"split_bytes": args.split_bytes,
           "checker": "_jpegregion.verify" if image_mod._jpegregion is not None else "simplejpeg strict decode"}
    with tempfile.TemporaryDirectory() as folder:
        for width, height in ((160, 120), (320, 240), (500, 375)):
            doc[f"{width}x{height}"] = measure(photo_jpegs(args.count, width, height), args.split_bytes, folder)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
