"""Data for tests/test_real_scale.py, generated on the fly (nothing committed).

Two data sets, each of ``[payload][label JSON]`` groups (an augmented manifest):

- :class:`LapData`: ``n`` JPEG-sized payloads (60-140 KB, ~100 KB on average) of seeded random bytes,
  ~220 MB in all, so that one epoch runs more than three laps of the default 64 MiB input ring.  Payload
  ``i`` starts and ends with its id and is rebuilt from a 16 MiB pool (:meth:`LapData.payload`), so a
  delivered group is checked byte for byte, and its label ``{"id": i, "n": len}`` against it.
- :class:`Manifest`: ``n`` real ~100 KB JPEGs (photo-like, 480x360 at quality 98) with Ground Truth
  bounding-box labels.  Image ``i`` carries its id twice: in a COM segment after SOI (the bytes), and
  stamped into its pixels as 16 black/white squares in the top-left corner (:func:`stamp_id`), which
  survive decoding at 224x224 (:func:`read_stamp`), so that a decoded image can be told from every
  other and paired with its label; the label's first box has ``class_id = i``.

Both write a RecordIO file with its ``.idx`` (``RecordWriter(index=...)``) and return the group offsets,
from which S3 objects are cut at group boundaries (:func:`group_slices`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from typing import Dict, List, Sequence, Tuple

import numpy as np
from PIL import Image as PILImage

from image_helpers import photo
from parrecio.recordio import RecordWriter

__all__ = ["MIB", "RING", "MAGIC_BYTES", "LapData", "Manifest", "stamp_id", "read_stamp", "group_slices",
           "first_difference", "exactly_once"]

MIB = 1 << 20
RING = 64 * MIB                       # the default Tuning().ring_bytes
MAGIC_BYTES = struct.pack("<I", 0xCED7230A)


# -- order and exact-once checks, with short messages ---------------------------------------------------
def exactly_once(ids: Sequence[int], n: int) -> str:
    """'' when ``ids`` is a permutation of ``range(n)``, else what is wrong (missing, duplicated)."""
    if len(ids) == n and sorted(ids) == list(range(n)):
        return ""
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=n) if len(ids) else np.zeros(n, int)
    missing = np.flatnonzero(counts == 0)
    dup = np.flatnonzero(counts > 1)
    out_of_range = [i for i in ids if not 0 <= i < n]
    return (f"{len(ids)} groups delivered for {n}: {len(missing)} missing (first {missing[:8].tolist()}), "
            f"{len(dup)} more than once (first {dup[:8].tolist()}), out of range {out_of_range[:8]}")


def first_difference(a: Sequence[int], b: Sequence[int]) -> str:
    """'' when the sequences are equal, else where they first differ."""
    if list(a) == list(b):
        return ""
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"lengths {len(a)} / {len(b)}; first difference at position {k}: {list(a[k:k + 5])} / {list(b[k:k + 5])}"


# -- JPEG-sized random payloads --------------------------------------------------------------------------
class LapData:
    """``n`` groups ``[payload i][{"id": i, "n": len}]``; payload ``i`` = ``HEAD(i) + pool[off:off+len] +
    TAIL(i)``.  The pool holds no RecordIO magic, so no record is split into a multipart one."""

    HEAD = struct.Struct("<4sI")
    TAIL = struct.Struct("<I4s")

    def __init__(self, n: int = 2200, seed: int = 5, lo: int = 60_000, hi: int = 140_000) -> None:
        rng = np.random.default_rng(seed)
        pool = bytearray(rng.bytes(16 * MIB))
        at = pool.find(MAGIC_BYTES)
        while at >= 0:            # (about one in 250 seeds has one) break it up
            pool[at] ^= 0xFF
            at = pool.find(MAGIC_BYTES)
        self.pool = bytes(pool)
        self.n = n
        self.lens = rng.integers(lo, hi, n).tolist()
        self.offs = [int(rng.integers(0, len(self.pool) - k)) for k in self.lens]
        self.total = sum(self.lens) + 16 * n   # payload bytes of the [payload] records
        self.total_bytes = self.total + sum(len(self.label_bytes(i)) for i in range(n))  # of every record

    def payload(self, i: int) -> bytes:
        o, k = self.offs[i], self.lens[i]
        return self.HEAD.pack(b"RSp<", i) + self.pool[o:o + k] + self.TAIL.pack(i, b">RSp")

    def label(self, i: int) -> dict:
        return {"id": i, "n": self.lens[i] + 16}

    def label_bytes(self, i: int) -> bytes:
        return json.dumps(self.label(i), sort_keys=True).encode()

    def write(self, path: str, index: str) -> List[int]:
        """The groups as ``path`` (RecordIO) and ``index`` (its .idx); returns each group's byte offset
        and, last, the file's length."""
        starts = []
        with RecordWriter(path, index=index) as w:
            for i in range(self.n):
                starts.append(w.write(self.payload(i), key=2 * i))
                w.write(self.label_bytes(i), key=2 * i + 1)
        return starts + [os.path.getsize(path)]

    def check(self, raw, label) -> int:
        """The id of a delivered ``(Raw, Json)`` group, after checking that its payload and label are
        those of that id, byte for byte."""
        i = label.get("id") if isinstance(label, dict) else None
        assert isinstance(i, int) and 0 <= i < self.n, f"not a label of this data set: {label!r}"
        assert label == self.label(i), f"group {i}: label {label!r}"
        raw = bytes(raw)
        if raw != self.payload(i):
            head = self.HEAD.unpack_from(raw)[1] if len(raw) >= 8 else None
            raise AssertionError(f"group {i}: its payload is not payload {i} ({len(raw)} bytes, "
                                 f"expected {self.lens[i] + 16}; it starts with the id {head})")
        return i


# -- JPEG photographs with Ground Truth boxes --------------------------------------------------------------
W, H = 480, 360
STAMP_BITS, STAMP_PX = 16, 12


def stamp_id(arr: np.ndarray, i: int) -> None:
    """Write ``i`` (16 bits) into the top-left corner: square k (12x12 px) white for a 1, black for 0."""
    for k in range(STAMP_BITS):
        arr[:STAMP_PX, k * STAMP_PX:(k + 1) * STAMP_PX] = 255 if (i >> k) & 1 else 0


def read_stamp(img: np.ndarray, width: int = W, height: int = H) -> int:
    """The id stamped by :func:`stamp_id` into a ``width x height`` image, read back from ``img``
    (``(h, w, 3)`` uint8, that image resized (stretched) to any size down to ~100 px)."""
    h, w = img.shape[:2]
    y = int((STAMP_PX / 2) * h / height)
    value = 0
    for k in range(STAMP_BITS):
        x = int((k * STAMP_PX + STAMP_PX / 2) * w / width)
        if int(img[y, x].mean()) > 127:
            value |= 1 << k
    return value


class Manifest:
    """``n`` groups ``[JPEG i][Ground Truth boxes JSON i]``, about ``n * 100 KB``."""

    def __init__(self, n: int = 1000, seed: int = 21, quality: int = 98) -> None:
        self.n, self.quality = n, quality
        self.bases = [photo(800, 600, seed + k) for k in range(2)]  # ~0.3 s each, cached
        self.digests: List[bytes] = []
        self.sizes: List[int] = []
        self.variant: Dict[int, int] = {}   # ids whose first encoding held the RecordIO magic
        self.total_bytes = 0                # payload bytes of every record (JPEGs and labels)

    def pixels(self, i: int) -> np.ndarray:
        """Image ``i``: a 480x360 crop of one of the base photos (offset, flip by id), stamped."""
        v = self.variant.get(i, 0)
        base = self.bases[i % 2]
        dx, dy = (i * 37 + v * 11) % (800 - W), (i * 53 + v * 7) % (600 - H)
        arr = np.array(base[dy:dy + H, dx:dx + W])
        if (i // 2) % 2:
            arr = np.ascontiguousarray(arr[:, ::-1])
        stamp_id(arr, i)
        return arr

    def jpeg(self, i: int) -> bytes:
        """JPEG ``i``, with a COM segment naming it right after SOI."""
        buf = io.BytesIO()
        PILImage.fromarray(self.pixels(i)).save(buf, "JPEG", quality=self.quality)
        data = buf.getvalue()
        com = f"parrecio real-scale image {i}".encode()
        return data[:2] + b"\xff\xfe" + struct.pack(">H", len(com) + 2) + com + data[2:]

    def label(self, i: int) -> dict:
        """Ground Truth label: the first box has ``class_id = i``; 1-3 boxes."""
        boxes = [{"class_id": i, "left": (i * 7) % 300, "top": (i * 3) % 200,
                  "width": 40 + i % 100, "height": 30 + i % 80}]
        for k in range(i % 3):
            boxes.append({"class_id": k, "left": 10 * k, "top": 5 * k, "width": 20 + k, "height": 25 + k})
        return {"image_size": [{"width": W, "height": H, "depth": 3}], "annotations": boxes}

    def boxes(self, i: int) -> np.ndarray:
        """What ``BoundingBoxes()`` gives for label ``i``: ``float32 (k, 5)`` ``[cls, x0, y0, x1, y1]``."""
        return np.array([[a["class_id"], a["left"], a["top"], a["left"] + a["width"], a["top"] + a["height"]]
                         for a in self.label(i)["annotations"]], np.float32)

    def write(self, path: str, index: str) -> List[int]:
        starts = []
        with RecordWriter(path, index=index) as w:
            for i in range(self.n):
                data = self.jpeg(i)
                while MAGIC_BYTES in data:   # keep every record single-part (rare: a new crop)
                    self.variant[i] = self.variant.get(i, 0) + 1
                    data = self.jpeg(i)
                self.digests.append(hashlib.sha256(data).digest())
                self.sizes.append(len(data))
                label = json.dumps(self.label(i)).encode()
                starts.append(w.write(data, key=2 * i))
                w.write(label, key=2 * i + 1)
                self.total_bytes += len(data) + len(label)
        return starts + [os.path.getsize(path)]


def group_slices(starts: Sequence[int], parts: int) -> List[Tuple[int, int]]:
    """``parts`` byte ranges ``(begin, end)`` of a file, cut at group boundaries (``starts``: each group's
    offset and, last, the file's length), of about equal numbers of groups."""
    n = len(starts) - 1
    cuts = [round(k * n / parts) for k in range(parts + 1)]
    return [(starts[a], starts[b]) for a, b in zip(cuts, cuts[1:])]
