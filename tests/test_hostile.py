"""Hostile input through the whole pipeline (ParallelReader): a huge length word, a decompression bomb,
deeply nested JSON, a truncated JPEG, pure garbage, a file cut short, an empty file.

docs/ARCHITECTURE.md section 3, invariants 6 (clear errors naming the byte offset and the sample index; ``skip``
counts instead) and 7 (bounded input: refused, never allowed to exhaust memory), checked end to end with
a reader process and decoder processes, plus invariant 4 (no hang: every run is under an alarm) and 5
(the ``no_leaks`` fixture: no child process, no /dev/shm segment left).
"""

from __future__ import annotations

import struct
import time
from typing import NamedTuple

import numpy as np
import orjson
import psutil
import pytest

from parrecio import CorruptRecordError, DecodeError, ParallelReader, ParrecioError
from parrecio.decoders import Image, Json
from parrecio.recordio.framing import MAGIC
from image_helpers import jpeg, png_claiming
from pipeline_helpers import Fixed, deadline, digest_array, write_rec

M = struct.pack("<I", MAGIC)
HUGE = (1 << 29) - 1  # the largest length an lrec word can hold (cflag 0)




def collect(reader, limit: float = 30.0):
    """Iterate ``reader`` under a deadline: ``(samples, error or None)``; only ParrecioError is caught."""
    out = []
    err = None
    with deadline(limit):
        try:
            for s in reader:
                out.append(s)
        except ParrecioError as exc:
            err = exc
    return out, err


def clean_payloads(n: int, seed: int, lo: int = 1, hi: int = 300):
    """Random payloads without the RecordIO magic anywhere (so that no resync can land inside one)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = rng.integers(0, 256, int(rng.integers(lo, hi)), dtype=np.uint8).tobytes()
        out.append(b.replace(M, b"MAGC"))
    return out


def frames(recs):
    """The bytes of ``recs`` framed by RecordWriter, and each record's offset within them."""
    import io
    from parrecio.recordio import RecordWriter
    buf = io.BytesIO()
    offs = []
    w = RecordWriter(buf)
    for r in recs:
        offs.append(w.tell())
        w.write(r)
    w.flush()
    return buf.getvalue(), offs


def values(samples, fields):
    """Comparable form of delivered samples: bytes for raw, bytes of the digest array for Fixed."""
    if fields is None:
        return list(samples)
    return [bytes(np.asarray(s)) for s in samples]


def expected_values(recs, fields):
    return list(recs) if fields is None else [bytes(digest_array(r)) for r in recs]


def peak_rss(pid: int) -> int:
    """Peak resident set (VmHWM) of ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# -- a hostile length word --------------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [None, Fixed()], ids=["raw", "fixed"])
def test_huge_length_word_in_the_middle(tmp_path, fields, no_leaks):
    recs = clean_payloads(40, seed=1)
    head, _ = frames(recs[:17])
    tail, _ = frames(recs[17:])
    bad_at = len(head)
    path = tmp_path / "huge.rec"
    path.write_bytes(head + M + struct.pack("<I", HUGE) + tail)
    rss0 = psutil.Process().memory_info().rss

    with ParallelReader(path, fields=fields, workers=2) as reader:
        out, err = collect(reader)
    assert isinstance(err, CorruptRecordError), err
    assert err.offset == bad_at and err.index == 17
    assert f"byte offset {bad_at}" in str(err) and "sample 17" in str(err)
    assert str(HUGE) in str(err)  # it says which length was refused
    assert values(out, fields) == expected_values(recs[:17], fields)

    with ParallelReader(path, fields=fields, workers=2, on_error="skip") as reader:
        out, err = collect(reader)
        assert err is None
        assert values(out, fields) == expected_values(recs, fields)
        assert reader.stats.skipped_records == 1
        assert reader.stats.skipped_bytes == 8
    # 512 MiB were claimed; nothing of that size was ever allocated in the consumer
    assert psutil.Process().memory_info().rss - rss0 < 64 << 20


# -- a decompression bomb ------------------------------------------------------------------------------------

def _image_json_stream(tmp_path, n=12, bomb_at=5):
    imgs = [jpeg(40, 30, seed=i) for i in range(n)]
    imgs[bomb_at] = png_claiming(50000, 50000)
    recs = []
    for i, im in enumerate(imgs):
        recs += [im, b'{"i": %d}' % i]
    path = tmp_path / "bomb.rec"
    offsets = write_rec(path, recs)
    return path, recs, offsets


def test_decompression_bomb_is_refused_without_allocating(tmp_path, no_leaks):
    path, recs, offsets = _image_json_stream(tmp_path)
    fields = [Image(size=(32, 32)), Json()]
    proc = psutil.Process()
    rss0 = proc.memory_info().rss

    with ParallelReader(path, fields=fields, workers=2) as reader:
        out, err = collect(reader)
        worker_peaks = [peak_rss(p) for p in reader.worker_pids]
    assert isinstance(err, DecodeError), err
    assert err.index == 5 and err.offset == offsets[10]
    assert "sample 5" in str(err) and f"byte offset {offsets[10]}" in str(err)
    assert "bomb" in str(err) and ("2500000000" in str(err) or "50000x50000" in str(err))
    assert [s[1] for s in out] == [{"i": i} for i in range(5)]
    assert all(s[0].shape == (32, 32, 3) for s in out)
    # 50000*50000*3 bytes = 7.5 GB would have been the allocation: no decoder came anywhere near
    assert max(worker_peaks) < 400 << 20, worker_peaks

    with ParallelReader(path, fields=fields, workers=2, on_error="skip") as reader:
        out, err = collect(reader)
        assert err is None
        assert [s[1]["i"] for s in out] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
        assert reader.stats.skipped == 1 and reader.stats.samples == 11
        worker_peaks = [peak_rss(p) for p in reader.worker_pids]
    assert max(worker_peaks) < 400 << 20, worker_peaks
    assert proc.memory_info().rss - rss0 < 64 << 20


# -- nested JSON, truncated JPEG -----------------------------------------------------------------------------

def test_deeply_nested_json(tmp_path, no_leaks):
    recs = [b'{"a": %d}' % i for i in range(10)]
    recs[4] = b"[" * 100_000
    recs[7] = b"[" * 100_000 + b"]" * 100_000  # well-formed, but 100000 levels deep
    path = tmp_path / "nested.rec"
    offsets = write_rec(path, recs)
    with ParallelReader(path, fields=Json(), workers=2) as reader:
        out, err = collect(reader)
    assert isinstance(err, DecodeError) and err.index == 4 and err.offset == offsets[4], err
    assert f"sample 4, byte offset {offsets[4]}" in str(err)
    assert out == [{"a": i} for i in range(4)]
    with ParallelReader(path, fields=Json(), workers=2, on_error="skip") as reader:
        out, err = collect(reader)
        assert err is None and reader.stats.skipped == 2
    assert out == [{"a": i} for i in (0, 1, 2, 3, 5, 6, 8, 9)]


def test_json_as_deep_as_orjson_reads_travels_back(tmp_path, no_leaks):
    """1024 levels (orjson's limit) decode with workers=0; with workers their pickling ran past Python's
    recursion limit, and the sample was an error there alone."""
    deep_list = b"[" * 1024 + b"]" * 1024
    deep_dict = b'{"a":' * 1023 + b"[]" + b"}" * 1023
    recs = [b"[0]", deep_list, b"[1]", deep_dict, b"[2]"]
    path = tmp_path / "deep.rec"
    write_rec(path, recs)
    for workers in (0, 2):
        with ParallelReader(path, fields=Json(), workers=workers) as reader:
            out, err = collect(reader)
        assert err is None, (workers, err)
        assert [flat(v) for v in out] == [r.decode() for r in recs], workers


def flat(value) -> str:
    """``value`` as compact JSON, without recursion (``==`` and every encoder recurse past 1000 levels)."""
    out, todo = [], [value]
    while todo:
        v = todo.pop()
        if isinstance(v, Token):  # brackets, commas and keys, pushed below
            out.append(v.text)
        elif isinstance(v, list):
            parts = [part for item in v for part in (Token(","), item)][1:]
            todo.extend([Token("]"), *reversed(parts), Token("[")])
        elif isinstance(v, dict):
            parts = [part for k, item in v.items() for part in (Token(","), Token(f'"{k}":'), item)][1:]
            todo.extend([Token("}"), *reversed(parts), Token("{")])
        else:
            out.append(orjson.dumps(v).decode())
    return "".join(out)


class Token(NamedTuple):
    text: str


def test_truncated_jpeg(tmp_path, no_leaks):
    recs = [jpeg(48, 40, seed=i) for i in range(8)]
    recs[3] = recs[3][: len(recs[3]) // 2]
    recs[6] = recs[6][:200]  # only the headers survive
    path = tmp_path / "trunc_jpeg.rec"
    offsets = write_rec(path, recs)
    fields = Image(size=(32, 32))
    with ParallelReader(path, fields=fields, workers=2) as reader:
        out, err = collect(reader)
    assert isinstance(err, DecodeError) and err.index == 3 and err.offset == offsets[3], err
    assert "truncated" in str(err).lower() or "corrupt" in str(err).lower()
    assert len(out) == 3
    with ParallelReader(path, fields=fields, workers=2, on_error="skip", batch_size=4) as reader:
        batches, err = collect(reader)
        assert err is None and reader.stats.skipped == 2
    assert [len(b) for b in batches] == [4, 2]
    ref = Image(size=(32, 32))
    good = [ref(r) for i, r in enumerate(recs) if i not in (3, 6)]
    assert np.array_equal(np.concatenate(batches), np.stack(good))


# -- garbage, truncation, empty --------------------------------------------------------------------------

@pytest.mark.parametrize("fields", [None, Fixed()], ids=["raw", "fixed"])
def test_garbage_stream(tmp_path, fields, no_leaks):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes().replace(M, b"MAGC")
    assert data[:4] != M
    path = tmp_path / "garbage.rec"
    path.write_bytes(data)
    t0 = time.monotonic()
    with ParallelReader(path, fields=fields, workers=2) as reader:
        out, err = collect(reader, 20)
    assert isinstance(err, CorruptRecordError) and err.offset == 0 and err.index == 0, err
    assert "bad magic" in str(err) and "byte offset 0" in str(err)
    assert out == []
    with ParallelReader(path, fields=fields, workers=2, on_error="skip") as reader:
        out, err = collect(reader, 20)
        assert err is None and out == []
        assert reader.stats.skipped_records == 1
        assert reader.stats.skipped_bytes == len(data)
        assert reader.stats.samples == 0
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("fields", [None, Fixed()], ids=["raw", "fixed"])
@pytest.mark.parametrize("cut", ["payload", "header", "padding"])
def test_file_cut_short(tmp_path, fields, cut, no_leaks):
    recs = clean_payloads(30, seed=4, lo=50, hi=400)
    recs[20] = recs[20][:101]  # 3 bytes of padding
    data, offs = frames(recs)
    at = offs[20] + {"payload": 8 + 60, "header": 5, "padding": 8 + 101 + 1}[cut]
    path = tmp_path / "cut.rec"
    path.write_bytes(data[:at])
    with ParallelReader(path, fields=fields, workers=2) as reader:
        out, err = collect(reader)
    assert isinstance(err, CorruptRecordError) and err.offset == offs[20] and err.index == 20, err
    assert "truncated" in str(err) and f"byte offset {offs[20]}" in str(err)
    assert values(out, fields) == expected_values(recs[:20], fields)
    with ParallelReader(path, fields=fields, workers=2, on_error="skip") as reader:
        out, err = collect(reader)
        assert err is None and reader.stats.skipped_records == 1
    assert values(out, fields) == expected_values(recs[:20], fields)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_empty_stream(tmp_path, on_error, batch_size, no_leaks):
    path = tmp_path / "empty.rec"
    path.write_bytes(b"")
    with ParallelReader(path, fields=[Fixed(), Json()], workers=2, on_error=on_error,
                        batch_size=batch_size) as reader:
        for _ in range(2):  # two epochs
            out, err = collect(reader, 15)
            assert err is None and out == []
        assert reader.stats.samples == 0 and reader.stats.skipped == 0
        assert reader.stats.skipped_records == 0
