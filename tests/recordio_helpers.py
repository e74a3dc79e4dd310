"""Helpers shared by the ``tests/test_recordio_*.py`` files: hand-built frames, golden data, odd sources."""

from __future__ import annotations

import io
import json
import os
import random
import struct
from typing import List, Optional, Sequence

M = struct.pack("<I", 0xCED7230A)
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def frame(part: bytes, cflag: int = 0, *, length: Optional[int] = None, magic: bytes = M,
          pad: bool = True) -> bytes:
    """One frame built by hand: ``magic``, lrec (``length`` overrides the real one), part, zero padding."""
    n = len(part) if length is None else length
    out = magic + struct.pack("<I", (cflag << 29) | n) + part
    if pad:
        out += b"\0" * (-len(part) % 4)
    return out


def mxnet_frames(payload: bytes) -> bytes:
    """``payload`` framed as dmlc-core writes it (independent reimplementation, for cross-checks)."""
    parts: List[bytes] = []
    start = 0
    for i in range(0, len(payload) & ~3, 4):
        if payload[i:i + 4] == M:
            parts.append(payload[start:i])
            start = i + 4
    parts.append(payload[start:])
    if len(parts) == 1:
        return frame(parts[0])
    flags = [1] + [2] * (len(parts) - 2) + [3]
    return b"".join(frame(p, c) for p, c in zip(parts, flags))


def concat_frames(payload: bytes, sizes: Sequence[int]) -> bytes:
    """``payload`` cut into parts of the given ``sizes`` (the rest in a last part), concat convention.

    With a single part (``sizes`` empty and nothing to cut) the record is one ``cflag 0`` frame.
    """
    parts: List[bytes] = []
    at = 0
    for n in sizes:
        parts.append(payload[at:at + n])
        at += n
    parts.append(payload[at:])
    if len(parts) == 1:
        return frame(parts[0])
    flags = [1] + [2] * (len(parts) - 2) + [3]
    return b"".join(frame(p, c) for p, c in zip(parts, flags))


class ShortReads(io.RawIOBase):
    """A binary file object over ``data`` whose reads return 1..``most`` bytes (like a pipe or socket)."""

    def __init__(self, data: bytes, seed: int = 0, most: int = 7, *, has_readinto: bool = True) -> None:
        self._data = memoryview(bytes(data))
        self._at = 0
        self._rng = random.Random(seed)
        self._most = most
        self.reads = 0
        if not has_readinto:
            self.readinto = None  # type: ignore[assignment]

    def readable(self) -> bool:
        return True

    def _take(self, n: int) -> bytes:
        self.reads += 1
        k = min(n, self._rng.randint(1, self._most), len(self._data) - self._at)
        out = self._data[self._at:self._at + k].tobytes()
        self._at += k
        return out

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self._take(len(b))
        b[:len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        return self._take(n if n >= 0 else len(self._data))


class ReadOnly:
    """A minimal file object with only ``read`` (no ``readinto``), short reads of 1..7 bytes."""

    def __init__(self, data: bytes, seed: int = 0) -> None:
        self._inner = ShortReads(data, seed)
        self.name = "readonly-source"

    def read(self, n: int) -> bytes:
        return self._inner.read(n)


def load_manifest() -> dict:
    """The manifest of the MXNet-written golden files (see ``tests/make_golden.py``)."""
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        return json.load(f)


def golden_bytes(name: str) -> bytes:
    with open(os.path.join(GOLDEN, name), "rb") as f:
        return f.read()
