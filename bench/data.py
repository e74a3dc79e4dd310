"""Benchmark data: ImageNet-like JPEGs cut from real photographs that ship inside PyPI packages.

Two steps, in two environments (scikit-image and matplotlib pull in plain Pillow, which must never enter
the runtime venv where Pillow-SIMD lives)::

    # 1. export the source photographs as PNG (any venv with scikit-image + matplotlib, e.g. imgdata)
    bench/.venvs/imgdata/bin/python bench/data.py export-sources --out bench/data/sources
    # 2. cut N JPEGs from them and write the streams (the runtime venv: parrecio + Pillow-SIMD)
    .venv/bin/python bench/data.py build --n 2000 --out bench/data

``build`` writes, under ``--out``:

- ``aug.rec``: an augmented-manifest stream, two records per sample: ``[JPEG][Ground Truth JSON]``
  (``{"image_size": [{"width", "height", "depth": 3}], "annotations": [{"class_id", "left", "top",
  "width", "height"}, ...]}`` with 1-4 boxes inside the image);
- ``images.rec`` + ``images.idx``: an MXNet image record file, one record per sample:
  ``pack(IRHeader(0, float(label), i, 0), jpeg)``, ``label`` = the id of the source photograph, key ``i``;
- ``meta.json``: counts, mean width/height, mean JPEG bytes, sources, seed.

Everything is deterministic for a given ``--seed`` (and Pillow build: the JPEG encoder is libjpeg(-turbo)).
Each image is a random crop (aspect 4:3, 3:4, 3:2, 1:1 or 16:9; 50-100 % of the largest such crop) of one
source photo, optionally mirrored, rescaled (Lanczos) so that its longer side is 375..600 px and its
shorter side >= 300 px (mean about 500x375, like ImageNet), and encoded at quality ``--quality`` +-4 (default 90, 4:2:0 chroma like most camera JPEGs).

Known limit: the bundled photographs are small and mostly already JPEG-smoothed, so at quality 90 the
JPEGs average about 50 KB, half of ImageNet's ~110 KB (pixel counts match; entropy-decoding work is lower).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import Dict, List

import numpy as np

# (module, name) -> the sources we export.  Only colour photographs (no charts, phantoms, logos).
SKIMAGE_SOURCES = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
                   "motorcycle_left", "motorcycle_right", "retina"]
MPL_SOURCES = ["grace_hopper.jpg"]

ASPECTS = [(4, 3)] * 7 + [(3, 4)] * 1 + [(3, 2)] * 2 + [(1, 1)] + [(16, 9)]


def export_sources(out: str) -> None:
    """Write the bundled photographs as lossless PNG (needs scikit-image and matplotlib)."""
    import skimage.data
    from PIL import Image
    os.makedirs(out, exist_ok=True)
    written = []
    for name in SKIMAGE_SOURCES:
        if name.startswith("motorcycle_"):  # stereo_motorcycle() -> (left, right, disparity)
            arr = np.asarray(skimage.data.stereo_motorcycle()[0 if name.endswith("left") else 1])
        else:
            arr = np.asarray(getattr(skimage.data, name)())
        if arr.ndim == 2:
            arr = np.stack([arr] * 3, axis=-1)
        arr = arr[..., :3].astype(np.uint8)
        path = os.path.join(out, f"skimage_{name}.png")
        Image.fromarray(arr).save(path)
        written.append((path, arr.shape))
    import matplotlib.cbook
    for name in MPL_SOURCES:
        with matplotlib.cbook.get_sample_data(name) as f:
            img = Image.open(f).convert("RGB")
            img.load()
        path = os.path.join(out, f"mpl_{os.path.splitext(name)[0]}.png")
        img.save(path)
        written.append((path, (img.height, img.width, 3)))
    for path, shape in written:
        print(f"{path}: {shape[1]}x{shape[0]}")


def _sources(src_dir: str) -> List[str]:
    paths = sorted(os.path.join(src_dir, p) for p in os.listdir(src_dir) if p.endswith(".png"))
    if not paths:
        sys.exit(f"no *.png under {src_dir}: run `bench/data.py export-sources` first (in the imgdata venv)")
    return paths


def _cut(img, rng: np.random.Generator):
    """A random crop of ``img`` (PIL, RGB), rescaled to an ImageNet-like size."""
    from PIL import Image
    aw, ah = ASPECTS[rng.integers(len(ASPECTS))]
    W, H = img.size
    # largest crop of that aspect inside the source, then 35-100 % of it (linear)
    cw_max = min(W, H * aw / ah)
    f = rng.uniform(0.5, 1.0)
    cw = cw_max * f
    ch = cw * ah / aw
    x0 = rng.uniform(0, W - cw)
    y0 = rng.uniform(0, H - ch)
    # output: longer side 375..600 (mean ~500), shorter side >= 300
    longer = int(np.clip(rng.normal(505, 60), 375, 600))
    if aw >= ah:
        ow, oh = longer, max(300, round(longer * ah / aw))
    else:
        oh, ow = longer, max(300, round(longer * aw / ah))
    out = img.resize((ow, oh), Image.Resampling.LANCZOS, box=(x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return out


def _boxes(rng: np.random.Generator, w: int, h: int) -> List[Dict[str, int]]:
    boxes = []
    for _ in range(int(rng.integers(1, 5))):
        bw = int(rng.uniform(0.1, 0.8) * w)
        bh = int(rng.uniform(0.1, 0.8) * h)
        left = int(rng.integers(0, w - bw + 1))
        top = int(rng.integers(0, h - bh + 1))
        boxes.append({"class_id": int(rng.integers(0, 20)), "left": left, "top": top,
                      "width": bw, "height": bh})
    return boxes


def build(n: int, out: str, src_dir: str, seed: int, quality: int = 90) -> dict:
    from PIL import Image
    import parrecio
    from parrecio import IRHeader, RecordWriter, pack

    srcs = _sources(src_dir)
    images = []
    for p in srcs:
        im = Image.open(p).convert("RGB")
        im.load()
        images.append(im)
    os.makedirs(out, exist_ok=True)
    sizes, nbytes, labels = [], [], []
    aug_path = os.path.join(out, "aug.rec")
    rec_path = os.path.join(out, "images.rec")
    idx_path = os.path.join(out, "images.idx")
    with RecordWriter(aug_path) as aug, RecordWriter(rec_path, index=idx_path) as rec:
        for i in range(n):
            rng = np.random.default_rng([seed, i])
            label = int(rng.integers(len(images)))
            img = _cut(images[label], rng)
            q = int(rng.integers(quality - 4, quality + 5))
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=min(q, 100))
            jpeg = buf.getvalue()
            w, h = img.size
            doc = {"image_size": [{"width": w, "height": h, "depth": 3}], "annotations": _boxes(rng, w, h)}
            aug.write(jpeg)
            aug.write(json.dumps(doc, separators=(",", ":")).encode())
            rec.write(pack(IRHeader(0, float(label), i, 0), jpeg), key=i)
            sizes.append((w, h))
            nbytes.append(len(jpeg))
            labels.append(label)
    sz = np.array(sizes, dtype=np.float64)
    meta = {
        "count": n,
        "seed": seed,
        "quality": quality,
        "mean_width": round(float(sz[:, 0].mean()), 1),
        "mean_height": round(float(sz[:, 1].mean()), 1),
        "min_side": int(sz.min()),
        "max_side": int(sz.max()),
        "mean_bytes": round(float(np.mean(nbytes)), 1),
        "total_jpeg_bytes": int(np.sum(nbytes)),
        "sources": [os.path.basename(p) for p in srcs],
        "per_source": {os.path.basename(p): int(np.sum(np.array(labels) == k)) for k, p in enumerate(srcs)},
        "files": {name: os.path.getsize(os.path.join(out, name))
                  for name in ("aug.rec", "images.rec", "images.idx")},
        "aug_records_per_sample": 2,
        "encoder": _pil_build(),
        "parrecio": parrecio.__version__,
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def _pil_build() -> str:
    import importlib.metadata
    import PIL
    for dist in ("Pillow-SIMD", "pillow-simd", "Pillow", "pillow"):
        try:
            return f"{importlib.metadata.distribution(dist).metadata['Name']} {PIL.__version__}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"PIL {PIL.__version__}"


def ensure(out: str = None, n: int = 2000, seed: int = 0) -> dict:
    """Return meta.json of the data set under ``out`` (default bench/data), building it if missing."""
    out = out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    meta_path = os.path.join(out, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            return json.load(f)
    return build(n, out, os.path.join(out, "sources"), seed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export-sources", help="write the bundled photographs as PNG (imgdata venv)")
    e.add_argument("--out", default="bench/data/sources")
    b = sub.add_parser("build", help="cut N JPEGs and write aug.rec, images.rec/.idx, meta.json")
    b.add_argument("--n", type=int, default=2000)
    b.add_argument("--out", default="bench/data")
    b.add_argument("--sources", default=None, help="PNG directory (default OUT/sources)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--quality", type=int, default=90, help="mean JPEG quality (each image: +-4)")
    args = ap.parse_args(argv)
    if args.cmd == "export-sources":
        export_sources(args.out)
    else:
        meta = build(args.n, args.out, args.sources or os.path.join(args.out, "sources"), args.seed,
                     args.quality)
        print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
