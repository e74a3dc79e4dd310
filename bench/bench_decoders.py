"""Single-core throughput of parrecio's decoders against plain Pillow, on the same JPEG bytes.

    python bench/bench_decoders.py [--images DIR | --rec FILE] [--count N] [--size 224] [--repeat 5]

``--images DIR`` takes ``DIR/*.jpg`` (and ``*.jpeg``), ``--rec FILE`` the JPEG records of a RecordIO file
(``bench/data/aug.rec``: real photographs, ``bench/data.py``); without either, ``--count`` photo-like
500x375 JPEGs (quality 90) are generated.  Every case decodes every image ``--repeat`` times in this one process (one
core), cases interleaved; each image keeps its best time over the passes, and a case's rate is images
over the sum of those times (steady even when other processes share the cores).  An ``accuracy``
section measures how far the optional fast paths (``draft``, ``reducing_gap``) move pixels from the
exact result, on the same images, at the benchmark size and at a quarter of it (where DCT scaling
applies more often).  With simplejpeg installed (``pip install 'parrecio[fast]'``) the ``Image`` cases
also run with ``backend="simplejpeg"``, side by side, and ``accuracy`` adds how far that backend moves
pixels from the Pillow backend (zero where both decode alike).

Prints one JSON document: the PIL build in use, the inputs, ``throughput`` and ``accuracy``.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import io
import json
import math
import os
import platform
import sys
import time
import zlib
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import orjson
import PIL
from PIL import Image as PILImage

from parrecio.decoders import BoundingBoxes, ClassLabel, Image, ImageRecord, RandomResizedCrop
from parrecio.recordio.irheader import IRHeader, pack


def simplejpeg_version() -> str | None:
    try:
        return importlib.metadata.version("simplejpeg")
    except importlib.metadata.PackageNotFoundError:
        return None


def pil_build() -> Dict[str, str]:
    """Which PIL is loaded: version, distribution (Pillow or Pillow-SIMD), libjpeg version, file."""
    dists = importlib.metadata.packages_distributions().get("PIL", [])
    from PIL import features

    return {"PIL.__version__": PIL.__version__, "distribution": ",".join(dists) or "unknown",
            "libjpeg": str(features.version("jpg")), "file": os.path.dirname(PIL.__file__)}


def load_images(directory: str | None, count: int, rec: str | None = None) -> List[bytes]:
    if rec:
        from parrecio import RecordReader
        with RecordReader(rec) as reader:
            jpegs = [bytes(r.payload) for r in reader if bytes(r.payload[:3]) == b"\xff\xd8\xff"][:count]
        if not jpegs:
            sys.exit(f"no JPEG records in {rec}")
        return jpegs
    if directory:
        paths = sorted(glob.glob(os.path.join(directory, "*.jpg")) + glob.glob(os.path.join(directory, "*.jpeg")))
        if not paths:
            sys.exit(f"no *.jpg in {directory}")
        return [open(p, "rb").read() for p in paths[:count]]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from image_helpers import jpeg  # the tests' photo-like generator

    return [jpeg(500, 375, seed=s, quality=90) for s in range(count)]


def rates(cases: Dict[str, Tuple[Callable, Sequence]], repeat: int, chunk: int = 1) -> Dict[str, float]:
    """Items per second of each case ``name -> (fn, items)``.

    Cases run interleaved, ``repeat`` rounds; each item (or chunk of ``chunk`` items) keeps its fastest
    time over the rounds, and the rate is items / sum of those times.  Taking the best per item, with the
    cases interleaved, keeps the figures steady when other processes share the cores.
    """
    best = {name: [float("inf")] * math.ceil(len(items) / chunk) for name, (_, items) in cases.items()}
    clock = time.perf_counter
    for _ in range(repeat):
        for name, (fn, items) in cases.items():
            times = best[name]
            for k in range(len(times)):
                part = items[k * chunk:(k + 1) * chunk]
                start = clock()
                for item in part:
                    fn(item)
                elapsed = clock() - start
                if elapsed < times[k]:
                    times[k] = elapsed
    return {name: round(len(items) / sum(best[name]), 1) for name, (_, items) in cases.items()}


def gt_label(rng: np.random.Generator, width: int = 500, height: int = 375) -> bytes:
    boxes = [{"class_id": int(rng.integers(0, 20)), "left": int(rng.integers(0, 300)),
              "top": int(rng.integers(0, 200)), "width": int(rng.integers(10, 200)),
              "height": int(rng.integers(10, 170))} for _ in range(int(rng.integers(1, 8)))]
    return orjson.dumps({"image_size": [{"width": width, "height": height, "depth": 3}], "annotations": boxes})


def _keyed(decoder: Image, out: np.ndarray) -> Callable[[bytes], None]:
    """A random decoder called as the pipeline calls it, with a sample key (one per image: the same crop
    on every pass, so that each image's best time compares like with like)."""
    return lambda b: decoder.decode_into(b, out, key=zlib.crc32(b))


def throughput(images: List[bytes], size: int, repeat: int) -> Dict[str, float]:
    out = np.empty((size, size, 3), np.uint8)
    records = [pack(IRHeader(0, float(i % 10), i, 0), b) for i, b in enumerate(images)]
    multi = [pack(IRHeader(0, [1.0, 2.0, 3.0], i, 0), b) for i, b in enumerate(images)]
    rng = np.random.default_rng(0)
    labels = [gt_label(rng) for _ in range(1000)]

    def into(decoder: Image) -> Callable[[bytes], None]:
        return lambda b: decoder.decode_into(b, out)

    record = ImageRecord(Image(size), label_width=0)
    record_multi = ImageRecord(Image(size), label_width=3)
    outs = (out, np.empty(3, np.float32))
    label0 = np.empty((), np.float32)
    cases: Dict[str, Callable] = {
        "pillow_open_load (decode only)": lambda b: PILImage.open(io.BytesIO(b)).load(),
        "pillow_convert_resize_default (bicubic) + asarray":
            lambda b: np.asarray(PILImage.open(io.BytesIO(b)).convert("RGB").resize((size, size))),
        "pillow_convert_resize_bilinear + asarray":
            lambda b: np.asarray(PILImage.open(io.BytesIO(b)).convert("RGB").resize((size, size),
                                                                                  PILImage.BILINEAR)),
        "Image(size) stretch, decode_into": into(Image(size)),
        "Image(size) stretch, __call__": Image(size),
        "Image(size) letterbox, decode_into": into(Image(size, resize="letterbox")),
        "Image(size) shorter, decode_into": into(Image(size, resize="shorter")),
        "Image(size) stretch CHW, decode_into": lambda b, d=Image(size, layout="CHW"),
            o=np.empty((3, size, size), np.uint8): d.decode_into(b, o),
        "Image(size) stretch draft=True, decode_into": into(Image(size, draft=True)),
        "Image(size) stretch draft=0.75, decode_into": into(Image(size, draft=0.75)),
        "Image(size, crop=RandomResizedCrop()), decode_into (key i)": _keyed(Image(size, crop=RandomResizedCrop()), out),
        "Image(size, crop=RandomResizedCrop(), draft=0.75), decode_into (key i)":
            _keyed(Image(size, crop=RandomResizedCrop(), draft=0.75), out),
        "Image(size) stretch strict=True, decode_into": into(Image(size, strict=True)),
        "Image(size) stretch reducing_gap=2.0, decode_into": into(Image(size, reducing_gap=2.0)),
        "Image() no resize, __call__": Image(),
    }
    if simplejpeg_version():
        import simplejpeg

        cases["simplejpeg decode only (RGB)"] = lambda b: simplejpeg.decode_jpeg(b, colorspace="RGB")
        for name, make in (("Image(size) stretch", lambda **k: Image(size, **k)),
                           ("Image(size) letterbox", lambda **k: Image(size, resize="letterbox", **k)),
                           ("Image(size) shorter", lambda **k: Image(size, resize="shorter", **k)),
                           ("Image(size) stretch draft=True", lambda **k: Image(size, draft=True, **k)),
                           ("Image(size) stretch strict=True", lambda **k: Image(size, strict=True, **k))):
            cases[f"{name}, decode_into, backend=simplejpeg"] = into(make(backend="simplejpeg"))
        cases["Image(size) stretch CHW, decode_into, backend=simplejpeg"] = \
            lambda b, d=Image(size, layout="CHW", backend="simplejpeg"), o=np.empty((3, size, size), np.uint8): \
            d.decode_into(b, o)
        cases["Image() no resize, __call__, backend=simplejpeg"] = Image(backend="simplejpeg")
        record_sj = ImageRecord(Image(size, backend="simplejpeg"), label_width=0)
    else:
        record_sj = None
    result = rates({name: (fn, images) for name, fn in cases.items()}
                   | {"ImageRecord(Image(size), label_width=0), decode_into":
                      (lambda p: record.decode_into(p, (out, label0)), records),
                      "ImageRecord(Image(size), label_width=3), decode_into":
                      (lambda p: record_multi.decode_into(p, outs), multi)}
                   | ({"ImageRecord(Image(size, backend=simplejpeg), label_width=0), decode_into":
                       (lambda p: record_sj.decode_into(p, (out, label0)), records)} if record_sj else {}),
                   repeat)
    result |= rates({"BoundingBoxes() labels/s": (BoundingBoxes(), labels),
                     "BoundingBoxes(max_boxes=16, normalize=True) labels/s":
                     (BoundingBoxes(normalize=True, max_boxes=16), labels),
                     "ClassLabel() labels/s": (ClassLabel(), [b"%d" % (i % 10) for i in range(1000)])},
                    repeat, chunk=50)
    return result


def differences(images: List[bytes], size: int, reference: Dict | None = None, **fast) -> Dict[str, float]:
    """Pixel differences (0..255 scale) of ``Image(size, **fast)`` against ``Image(size, **reference)``."""
    exact, other = Image(size, **(reference or {})), Image(size, **fast)
    diffs, changed = [], 0
    for b in images:
        key = zlib.crc32(b) if exact.random else None  # the same crop on both sides
        d = np.abs(exact(b, key=key).astype(np.int16) - other(b, key=key).astype(np.int16))
        changed += bool(d.any())
        diffs.append(d.ravel())
    every = np.concatenate(diffs)
    return {"images_changed": changed, "images": len(images), "mean_abs": round(float(every.mean()), 3),
            "worst_image_mean_abs": round(max(float(d.mean()) for d in diffs), 3),
            "p99_abs": int(np.percentile(every, 99)), "max_abs": int(every.max()),
            "share_over_2": round(float((every > 2).mean()), 5)}


def accuracy(images: List[bytes], size: int) -> Dict[str, Dict[str, float]]:
    result = {}
    for target in (size, max(8, size // 4)):
        for name, fast in (("draft=True", {"draft": True}), ("draft=2.0", {"draft": 2.0}),
                           ("draft=0.75", {"draft": 0.75}), ("draft=0.5", {"draft": 0.5}),
                           ("reducing_gap=2.0", {"reducing_gap": 2.0}),
                           ("reducing_gap=3.0", {"reducing_gap": 3.0})):
            result[f"{name} at {target}x{target}"] = differences(images, target, **fast)
    for name, fast in (("crop=RandomResizedCrop() draft=0.75", {"draft": 0.75}),
                       ("crop=RandomResizedCrop() draft=True", {"draft": True})):
        result[f"{name} at {size}x{size}"] = differences(images, size, {"crop": RandomResizedCrop()},
                                                         crop=RandomResizedCrop(), **fast)
    if simplejpeg_version():  # the backend against Pillow, each option on both sides
        for name, options in (("", {}), (" resize=letterbox", {"resize": "letterbox"}),
                              (" resize=shorter", {"resize": "shorter"}), (" mode=L", {"mode": "L"}),
                              (" draft=True", {"draft": True}), (" draft=True mode=L", {"draft": True, "mode": "L"})):
            for target in (size, max(8, size // 4)):
                result[f"backend=simplejpeg{name} vs pillow at {target}x{target}"] = differences(
                    images, target, reference=options, backend="simplejpeg", **options)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", help="directory of *.jpg files (default: generated photo-like JPEGs)")
    parser.add_argument("--rec", help="a RecordIO file whose JPEG records are the images (bench/data/aug.rec)")
    parser.add_argument("--count", type=int, default=64, help="at most this many images (default 64)")
    parser.add_argument("--size", type=int, default=224, help="output side in pixels (default 224)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="passes; each image's best time counts (default 5)")
    parser.add_argument("--no-accuracy", action="store_true", help="skip the accuracy section")
    args = parser.parse_args(argv)
    images = load_images(args.images, args.count, args.rec)
    sizes = [PILImage.open(io.BytesIO(b)).size for b in images]
    doc = {
        "pil": pil_build(),
        "simplejpeg": simplejpeg_version(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "inputs": {"source": args.rec or args.images or "generated photo-like 500x375 q90", "images": len(images),
                   "mean_bytes": int(np.mean([len(b) for b in images])),
                   "mean_size_wxh": [int(np.mean([s[0] for s in sizes])), int(np.mean([s[1] for s in sizes]))],
                   "size": args.size, "repeat": args.repeat},
        "throughput_per_s": throughput(images, args.size, args.repeat),
    }
    if not args.no_accuracy:
        doc["accuracy_vs_exact"] = accuracy(images, args.size)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
