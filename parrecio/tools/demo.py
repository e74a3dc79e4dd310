"""The built-in demo: a small augmented-manifest stream (``[JPEG][Ground Truth boxes JSON]`` per sample)
made on the spot, and a ParallelReader run over it.  ``parrecio demo`` runs it; nothing is downloaded.

The pictures are photo-like (smooth gradients, soft-edged objects, texture and sensor noise), so that
JPEG decoding costs about what it costs on real photographs; a few base pictures are cropped and
mirrored into many samples of varied sizes (300-600 px sides, like ImageNet).
"""

from __future__ import annotations

import io
import os
import time
from typing import Iterator, Tuple

import numpy as np
import orjson

__all__ = ["photo", "build_demo_stream", "run_demo"]


def photo(width: int, height: int, seed: int) -> np.ndarray:
    """A photo-like ``uint8 (height, width, 3)`` picture, the same for the same arguments."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / width, y / height
    img = np.stack([90 + 110 * v + 30 * np.sin(3 * u + seed), 120 + 80 * (1 - v) + 20 * np.cos(2 * v + u),
                    170 - 100 * v + 40 * u], axis=-1)
    for _ in range(7):  # soft-edged objects
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(0.05, 0.3) * width, rng.uniform(0.05, 0.3) * height
        inside = 1 / (1 + np.exp(np.minimum((((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 - 1) * 10, 60)))
        img += inside[..., None] * (rng.uniform(-90, 90, 3) - img * 0.3)
    for cell, amp in ((40, 20.0), (8, 10.0)):  # clouds and foliage: coarse noise, upsampled
        coarse = rng.normal(0, 1, (height // cell + 2, width // cell + 2, 3)).astype(np.float32)
        img += amp * np.kron(coarse, np.ones((cell, cell, 1), np.float32))[:height, :width]
    img += 15 * (np.sin(x * 0.8) * np.cos(y * 1.3))[..., None] * (u > 0.5)[..., None]  # texture
    img += rng.normal(0, 4, img.shape)  # sensor noise
    return np.clip(img, 0, 255).astype(np.uint8)


def _samples(n: int, seed: int) -> Iterator[Tuple[bytes, bytes]]:
    from PIL import Image as PILImage
    rng = np.random.default_rng(seed)
    bases = [photo(720, 560, seed + k) for k in range(8)]
    for i in range(n):
        base = bases[i % len(bases)]
        w, h = int(rng.integers(300, 601)), int(rng.integers(300, 601))
        w, h = min(w, 720), min(h, 560)
        x0, y0 = int(rng.integers(0, 720 - w + 1)), int(rng.integers(0, 560 - h + 1))
        crop = base[y0:y0 + h, x0:x0 + w]
        if i % 2:
            crop = crop[:, ::-1]
        buf = io.BytesIO()
        PILImage.fromarray(np.ascontiguousarray(crop)).save(buf, "JPEG", quality=90)
        boxes = []
        for _ in range(int(rng.integers(1, 5))):
            bw, bh = int(rng.integers(20, w // 2)), int(rng.integers(20, h // 2))
            boxes.append({"class_id": int(rng.integers(0, 10)), "left": int(rng.integers(0, w - bw)),
                          "top": int(rng.integers(0, h - bh)), "width": bw, "height": bh})
        label = {"image_size": [{"width": w, "height": h, "depth": 3}], "annotations": boxes}
        yield buf.getvalue(), orjson.dumps(label)


def build_demo_stream(path: str, n: int = 512, seed: int = 0) -> dict:
    """Write ``n`` samples ``[JPEG][boxes JSON]`` as RecordIO to ``path``, with its ``.idx`` beside it (every
    record's offset, as ``pack`` writes it: so ``len()`` and the global shuffle work from the start); return
    a summary."""
    from ..recordio import RecordWriter
    from ..recordio.paths import index_path
    nbytes = 0
    with RecordWriter(path, index=index_path(path)) as w:
        for jpeg, label in _samples(n, seed):
            w.write(jpeg)
            w.write(label)
            nbytes += len(jpeg)
    return {"path": path, "index": index_path(path), "samples": n, "records": 2 * n,
            "mean_jpeg_kb": nbytes / n / 1024,
            "file_mb": os.path.getsize(path) / 2**20}


def run_demo(path: str, workers: int, batch_size: int, size: int, out=print) -> dict:
    """Decode the demo stream in one process, then with ParallelReader; print what a batch looks like
    and both rates.  Returns the figures."""
    from ..decoders import BoundingBoxes, Image
    from ..pipeline import ParallelReader
    from ..recordio import RecordReader

    fields = {"image": Image(size=(size, size)), "boxes": BoundingBoxes(max_boxes=8)}
    t0 = time.perf_counter()
    n_single = 0
    with RecordReader(path) as rr:
        it = iter(rr)
        for img_rec, box_rec in zip(it, it):
            fields["image"](img_rec.payload)
            fields["boxes"](box_rec.payload)
            n_single += 1
            if n_single == 128:
                break
    single = n_single / (time.perf_counter() - t0)

    with ParallelReader(path, fields=fields, workers=workers, batch_size=batch_size) as reader:
        rates = []
        first_at = None
        for epoch in range(2):  # the second pass shows the steady state: processes already running
            t0 = time.perf_counter()
            n = 0
            for batch in reader:
                if first_at is None:
                    first_at = time.perf_counter() - t0
                    out(f"first batch after {first_at:.2f} s:")
                    for name, col in batch.items():
                        out(f"  {name:6s} {type(col).__name__} shape={col.shape} dtype={col.dtype}")
                    out(f"  boxes[0] =\n{np.array2string(batch['boxes'][0][:3], precision=1, suppress_small=True)}"
                        f"  (class, x0, y0, x1, y1; -1 rows pad to max_boxes)")
                n += len(batch["image"])
            rates.append(n / (time.perf_counter() - t0))
        st = reader.stats
    out(f"one process, same decoders: {single:7.1f} samples/s")
    out(f"ParallelReader, {workers} workers: {rates[1]:7.1f} samples/s ({rates[1] / single:.2f}x; "
        f"first pass{', starting the processes included' if workers else ''}: {rates[0]:.1f})")
    out(f"stages: reading {st.read_time:.2f} s, consumer waiting for decoders {st.wait_workers_time:.2f} s, "
        f"reader waiting for the consumer {st.wait_consumer_time:.2f} s; bottleneck: {st.bottleneck}")
    rate = rates[1]
    return {"single_process_rate": single, "parallel_rate": rate, "samples": n, "first_batch_s": first_at}
