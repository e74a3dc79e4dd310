"""Per-core decode + resize against Pillow-SIMD's own, round by round (#27 item 2).

    python bench/fast_decode.py [--rec bench/data/aug.rec] [--count 500] [--rounds 5] [--size 224]

One process, one core.  Each round runs every case over the same JPEGs, the cases taking turns image by
image; within a round each image keeps its best time over ``--repeat`` passes, and a case's rate is
images over the sum of those times.  Every ratio is taken against the baseline *of the same round*, so
a machine that slows down between rounds moves both sides:

- ``pillow``: Pillow-SIMD's own ``open -> convert("RGB") -> resize(size, BILINEAR) -> asarray``, copied
  into the output array (what a torch Dataset does), against ``Image(size)`` exact, ``draft=0.75`` and
  ``draft=0.5``;
- ``pillow_rrc``: torchvision's RandomResizedCrop on a PIL image (``open -> convert -> crop(box) ->
  resize``), with the very box ``Image(crop=RandomResizedCrop())`` draws for the image's key, against
  the fused path (``_jpegregion``: only the crop's rows and columns decoded), plain and with ``draft``.

``quality`` measures how far each fast path moves pixels from the exact result on the same images
(grey levels 0..255: mean absolute difference over every pixel, the worst image's mean, the largest),
and, for scale, how far the exact path moves with bicubic instead of bilinear resampling.
Prints one JSON document: per round ``rate`` per case and ``ratio`` to its baseline, then ``median`` and
``min`` ratio over the rounds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
import zlib
from typing import Callable, Dict, List, Tuple

import numpy as np
from PIL import Image as PILImage

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_decoders import differences, load_images, pil_build  # noqa: E402
from parrecio.decoders import Image, RandomResizedCrop  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DRAFTS = (True, 0.75, 0.5)


def cases(size: int) -> Dict[str, Tuple[str, Callable[[bytes, np.ndarray], None]]]:
    """name -> (its baseline's name, fn(jpeg, out))."""
    bilinear = PILImage.BILINEAR
    crop = Image(size, crop=RandomResizedCrop())

    def pillow(b: bytes, out: np.ndarray) -> None:
        out[...] = np.asarray(PILImage.open(io.BytesIO(b)).convert("RGB").resize((size, size), bilinear))

    def pillow_rrc(b: bytes, out: np.ndarray) -> None:
        image = PILImage.open(io.BytesIO(b)).convert("RGB")
        plan = crop._plan_of(image.width, image.height, zlib.crc32(b))
        box = (plan.box_x, plan.box_y, plan.box_x + plan.box_w, plan.box_y + plan.box_h)
        out[...] = np.asarray(image.crop(box).resize((size, size), bilinear))

    def into(decoder: Image) -> Callable[[bytes, np.ndarray], None]:
        if decoder.random:  # the same crop for the image on every pass and in the baseline
            return lambda b, out: decoder.decode_into(b, out, key=zlib.crc32(b))
        return decoder.decode_into

    out: Dict[str, Tuple[str, Callable[[bytes, np.ndarray], None]]] = {
        "pillow": ("pillow", pillow), "Image exact": ("pillow", into(Image(size)))}
    for d in DRAFTS:
        out[f"Image draft={d}"] = ("pillow", into(Image(size, draft=d)))
    out["pillow_rrc"] = ("pillow_rrc", pillow_rrc)
    out["Image crop=RRC"] = ("pillow_rrc", into(crop))
    for d in DRAFTS:
        out[f"Image crop=RRC draft={d}"] = ("pillow_rrc", into(Image(size, crop=RandomResizedCrop(), draft=d)))
    return out


def one_round(cases_: Dict[str, Tuple[str, Callable[[bytes, np.ndarray], None]]], images: List[bytes],
              size: int, repeat: int) -> Dict[str, float]:
    """Images per second of every case: each image's best time over ``repeat`` passes.  The cases take
    turns image by image (starting with a different case at each image), so that a machine whose speed
    drifts during the round moves every case alike."""
    table = list(cases_.items())
    out = np.empty((size, size, 3), np.uint8)
    best = [[float("inf")] * len(images) for _ in table]
    clock = time.process_time  # this process's CPU: other tenants of the machine do not count
    k = len(table)
    for _ in range(repeat):
        for i, b in enumerate(images):
            for j in range(k):
                c = (i + j) % k
                t0 = clock()
                table[c][1][1](b, out)
                dt = clock() - t0
                if dt < best[c][i]:
                    best[c][i] = dt
    return {name: len(images) / sum(t) for (name, _), t in zip(table, best)}


def quality(images: List[bytes], size: int) -> Dict[str, Dict[str, float]]:
    # for scale: how far the exact path moves when only the resampling filter changes
    result = {"resample=bicubic (exact)": differences(images, size, resample="bicubic")}
    for d in DRAFTS:
        result[f"draft={d}"] = differences(images, size, draft=d)
        result[f"crop=RRC draft={d}"] = differences(images, size, {"crop": RandomResizedCrop()},
                                                    crop=RandomResizedCrop(), draft=d)
    return result


def main(argv: List[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rec", default=os.path.join(HERE, "data", "aug.rec"),
                    help="RecordIO file whose JPEG records are the images (bench/data.py builds it)")
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2, help="passes per round; each image's best counts")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--no-quality", action="store_true")
    args = ap.parse_args(argv)
    rec = args.rec if os.path.exists(args.rec) else None  # else generated photo-like JPEGs
    images = load_images(None, args.count, rec)
    table = cases(args.size)
    rounds = []
    for _ in range(args.rounds):
        rates = one_round(table, images, args.size, args.repeat)
        rounds.append({name: {"rate": round(r, 1), "ratio": round(r / rates[table[name][0]], 3)}
                       for name, r in rates.items()})
    summary = {name: {"median_ratio": round(statistics.median(r[name]["ratio"] for r in rounds), 3),
                      "min_ratio": round(min(r[name]["ratio"] for r in rounds), 3),
                      "median_rate": round(statistics.median(r[name]["rate"] for r in rounds), 1),
                      "baseline": table[name][0]}
               for name in table}
    doc = {"pil": pil_build(), "images": len(images), "source": rec or "generated photo-like 500x375 q90",
           "load": [round(x, 2) for x in os.getloadavg()], "summary": summary, "rounds": rounds}
    if not args.no_quality:
        doc["quality_vs_exact"] = quality(images, args.size)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
