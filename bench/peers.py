"""Peers of parrecio on the same MXNet image file (``bench/data/images.rec`` + ``.idx``), same output
(224x224 RGB uint8 batches of 64).  Each peer runs in its own interpreter (its own venv) and prints one
JSON line::

    bench/.venvs/torch/bin/python bench/peers.py torch  --data bench/data [--workers 2]
    bench/.venvs/torch/bin/python bench/peers.py pillow --data bench/data     # one process, stock Pillow
    bench/.venvs/mx/bin/python     bench/peers.py mxnet  --data bench/data --dtype uint8
    .venv/bin/python    bench/peers.py parrecio --data bench/data [--workers 2]

- ``torch``: ``DataLoader(dataset, batch_size=64, num_workers=W)`` over a map-style dataset that reads a
  record by its ``.idx`` offset (``os.pread``; the file is opened lazily in each worker) and does stock
  Pillow ``open -> convert("RGB") -> resize((224, 224))`` + ``np.asarray`` (default collate stacks them
  into a ``uint8`` tensor ``(64, 224, 224, 3)``).
- ``mxnet``: ``mx.io.ImageRecordIter(data_shape=(3, 224, 224), batch_size=64, preprocess_threads=2,
  resize=224, dtype=...)`` (MXNet resizes the shorter side to 224 and centre-crops; without ``resize``
  it would only crop, doing less work than the others).  MXNet 1.9.1 caps the decode threads at
  ``omp_get_num_procs() / 2 - 1``: on 2 cores one thread, whatever ``preprocess_threads`` says
  (bench/bench_augment.py lifts the cap with a preloaded shim).
- ``pillow``: the same decode as ``torch``'s dataset in a plain loop, one process.
- ``parrecio``: ``ParallelReader(images.rec, fields=ImageRecord(Image(size=(224, 224))), workers=W,
  batch_size=64)`` (Pillow-SIMD in the dev venv).

``--augment``: every peer does ImageNet training augmentation instead, float32 CHW out:
RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + horizontal flip (p=0.5) + normalize with
ImageNet's mean/std.  ``torch`` (run it with the dev venv's python for Pillow-SIMD) does it in its
Dataset as torchvision would (``crop().resize(BILINEAR)``, ``transpose``, ``/255``, ``(x - mean) / std``,
in numpy); ``mxnet`` with ``random_resized_crop=True, rand_mirror=True, mean_*/std_*``; ``parrecio``
with ``Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=..., std=..., layout="CHW")``.

Loaders are timed like ``bench_pipeline``: the first epoch warms up; each later epoch is timed from its
first batch to its end (``images_per_s``, the best epoch) and in full (``epoch_full``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
_MAGIC = 0xCED7230A
_IR = struct.Struct("<IfQQ")


def _pil_build() -> str:
    import importlib.metadata
    import PIL
    for dist in ("Pillow-SIMD", "pillow-simd", "Pillow", "pillow"):
        try:
            return f"{importlib.metadata.distribution(dist).metadata['Name']} {PIL.__version__}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"PIL {PIL.__version__}"


def read_index(path: str) -> List[int]:
    offsets = []
    with open(path) as f:
        for line in f:
            if line.strip():
                offsets.append(int(line.split("\t")[1]))
    return offsets


class RecFile:
    """Random access to single-frame records by offset (plain ``os.pread``; opened lazily per process)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = None
        self.pid = None

    def read(self, offset: int) -> bytes:
        if self.fd is None or self.pid != os.getpid():
            self.fd = os.open(self.path, os.O_RDONLY)
            self.pid = os.getpid()
        magic, lrec = struct.unpack("<II", os.pread(self.fd, 8, offset))
        assert magic == _MAGIC and lrec >> 29 == 0, "multipart or corrupt record"
        return os.pread(self.fd, lrec & ((1 << 29) - 1), offset + 8)


def decode_pil(payload: bytes) -> Tuple[Any, float]:
    import numpy as np
    from PIL import Image
    flag, label, _, _ = _IR.unpack_from(payload)
    img = Image.open(io.BytesIO(memoryview(payload)[24 + 4 * flag:]))
    arr = np.asarray(img.convert("RGB").resize((224, 224)))
    return arr, label


MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def rrc_box(rng, width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> Tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, with Python's ``random`` (left, top, w, h)."""
    import math
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(lo, hi))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            return rng.randint(0, width - w), top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def augment_pil(payload: Any, rng, normalize: bool = True) -> Any:
    """Decode + RandomResizedCrop(224) + flip + ToTensor/Normalize, as a torchvision Dataset would (numpy)."""
    import numpy as np
    from PIL import Image
    img = Image.open(io.BytesIO(payload)).convert("RGB")
    x, y, w, h = rrc_box(rng, *img.size)
    img = img.crop((x, y, x + w, y + h)).resize((224, 224), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    arr = np.asarray(img)
    if not normalize:
        return arr
    t = arr.transpose(2, 0, 1).astype(np.float32) / 255.0  # ToTensor
    t = (t - np.array(MEAN, np.float32)[:, None, None]) / np.array(STD, np.float32)[:, None, None]  # Normalize
    return np.ascontiguousarray(t)


def _timed_epochs(make_iter, count_of, epochs: int, cap: int = 0) -> Dict[str, Any]:
    steady, full = [], []
    warm = {}
    for e in range(epochs):
        t0 = time.perf_counter()
        n = 0
        t_first = None
        for batch in make_iter():
            k = count_of(batch)
            if t_first is None:
                t_first, n_first = time.perf_counter(), k
            n += k
        t_end = time.perf_counter()
        if cap:
            n = min(n, cap)
        if e == 0:
            warm = {"first_epoch_images_per_s": round(n / (t_end - t0), 1),
                    "first_batch_s": round(t_first - t0, 3)}
            continue
        steady.append((n - n_first) / (t_end - t_first))
        full.append(n / (t_end - t0))
    return {"images": n, "images_per_s": round(max(steady), 1), "epochs_steady": [round(x, 1) for x in steady],
            "epoch_full": [round(x, 1) for x in full], **warm}


# -- peers ---------------------------------------------------------------------------------------------------
def peer_torch(data: str, workers: int, epochs: int, augment: bool = False) -> Dict[str, Any]:
    import random

    import torch
    from torch.utils.data import DataLoader, Dataset

    class RecDataset(Dataset):
        def __init__(self, rec: str, idx: str) -> None:
            self.offsets = read_index(idx)
            self.rec = RecFile(rec)
            self.rng = random.Random(0)

        def __len__(self) -> int:
            return len(self.offsets)

        def __getitem__(self, i: int):
            payload = self.rec.read(self.offsets[i])
            if augment:
                flag, label, _, _ = _IR.unpack_from(payload)
                return augment_pil(memoryview(payload)[24 + 4 * flag:], self.rng), label
            return decode_pil(payload)

    ds = RecDataset(os.path.join(data, "images.rec"), os.path.join(data, "images.idx"))
    loader = DataLoader(ds, batch_size=64, num_workers=workers)
    shape = []

    def count(batch):
        if not shape:
            shape.append([list(batch[0].shape), str(batch[0].dtype)])
        return batch[0].shape[0]

    res = _timed_epochs(lambda: iter(loader), count, epochs)
    return {"peer": "torch DataLoader" + (" + augment" if augment else ""), "num_workers": workers,
            "batch_shape": shape[0],
            "torch": torch.__version__, "pil": _pil_build(), "torch_threads": torch.get_num_threads(), **res}


def peer_pillow(data: str, limit: int, passes: int) -> Dict[str, Any]:
    offsets = read_index(os.path.join(data, "images.idx"))[:limit]
    rec = RecFile(os.path.join(data, "images.rec"))
    payloads = [rec.read(o) for o in offsets]
    rates = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for p in payloads:
            arr, _ = decode_pil(p)
        rates.append(len(payloads) / (time.perf_counter() - t0))
    assert arr.shape == (224, 224, 3)
    return {"peer": "pillow loop (1 process)", "pil": _pil_build(), "images": len(payloads),
            "images_per_s": round(max(rates), 1), "passes_images_per_s": [round(r, 1) for r in rates]}


def peer_mxnet(data: str, dtype: str, threads: int, epochs: int, augment: bool = False) -> Dict[str, Any]:
    import mxnet as mx
    if augment:  # ImageNet training augmentation, float32 (MXNet's mean/std are in 0..255 units)
        extra = dict(random_resized_crop=True, min_random_area=0.08, max_random_area=1.0,
                     min_aspect_ratio=3 / 4, max_aspect_ratio=4 / 3, rand_mirror=True,
                     mean_r=MEAN[0] * 255, mean_g=MEAN[1] * 255, mean_b=MEAN[2] * 255,
                     std_r=STD[0] * 255, std_g=STD[1] * 255, std_b=STD[2] * 255)
        dtype = "float32"
    else:
        extra = dict(resize=224)
    it = mx.io.ImageRecordIter(path_imgrec=os.path.join(data, "images.rec"),
                               path_imgidx=os.path.join(data, "images.idx"),
                               data_shape=(3, 224, 224), batch_size=64,
                               preprocess_threads=threads, dtype=dtype, shuffle=False,
                               round_batch=False, **extra)
    shape = []
    first = [True]

    def make():
        if not first[0]:
            it.reset()
        first[0] = False
        return it

    def count(batch):
        d = batch.data[0]
        if not shape:
            shape.append([list(d.shape), str(d.dtype)])
        d.wait_to_read()
        return d.shape[0] - batch.pad

    # MXNet fills the last batch by wrapping around and still reports pad=0: count the file's images once
    res = _timed_epochs(make, count, epochs, cap=len(read_index(os.path.join(data, "images.idx"))))
    cores = len(os.sched_getaffinity(0))
    return {"peer": f"mxnet ImageRecordIter ({dtype}{', augment' if augment else ''})", "mxnet": mx.__version__,
            "dtype": dtype,
            "preprocess_threads_requested": threads,
            "preprocess_threads_effective": max(1, min(threads, cores // 2 - 1)),
            "note": "MXNet 1.9.1 caps decode threads at omp_get_num_procs()/2 - 1 (iter_image_recordio_2.cc); "
                    + ("random_resized_crop + rand_mirror + mean/std" if augment else
                       "resize=224 (shorter side) + centre crop"), "batch_shape": shape[0], **res}


def peer_parrecio(data: str, workers: int, epochs: int, augment: bool = False) -> Dict[str, Any]:
    import parrecio
    from parrecio import ParallelReader
    from parrecio.decoders import IMAGENET_MEAN, IMAGENET_STD, Image, ImageRecord, RandomResizedCrop
    shape = []

    def count(batch):
        images, labels = batch
        if not shape:
            shape.append([list(images.shape), str(images.dtype)])
        return len(images)

    image = Image(size=(224, 224))
    if augment:
        image = Image(size=224, crop=RandomResizedCrop(), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                      layout="CHW")
    with ParallelReader(os.path.join(data, "images.rec"), fields=ImageRecord(image),
                        workers=workers, batch_size=64) as r:
        res = _timed_epochs(lambda: iter(r), count, epochs)
        stats = r.stats.as_dict()
    return {"peer": "parrecio ParallelReader" + (" + augment" if augment else ""), "workers": workers, "parrecio": parrecio.__version__,
            "pil": _pil_build(), "batch_shape": shape[0], **res,
            "stats": {k: stats[k] for k in ("wait_workers_time", "wait_consumer_time", "read_time")}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="one peer loader; prints one JSON line")
    ap.add_argument("peer", choices=["torch", "pillow", "mxnet", "parrecio"])
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3, help="epochs (the first one warms up)")
    ap.add_argument("--dtype", default="uint8")
    ap.add_argument("--limit", type=int, default=1000, help="images for the pillow loop")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--augment", action="store_true", help="ImageNet training augmentation, float32 CHW")
    args = ap.parse_args(argv)
    if args.peer == "torch":
        res = peer_torch(args.data, args.workers, args.epochs, args.augment)
    elif args.peer == "pillow":
        res = peer_pillow(args.data, args.limit, args.passes)
    elif args.peer == "mxnet":
        res = peer_mxnet(args.data, args.dtype, args.workers, args.epochs, args.augment)
    else:
        res = peer_parrecio(args.data, args.workers, args.epochs, args.augment)
    res["load"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
