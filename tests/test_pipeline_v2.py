"""Pipeline v2: regular files read in place, spans and packed columns, the persistent poller, adaptive
chunks, the frozen config, and the reader's own CPU figure."""

from __future__ import annotations

import fcntl
import io
import os
import threading
import time

import numpy as np
import pytest

from parrecio import IRHeader, pack, ParallelReader, RecordReader, SourceError, Tuning
from parrecio.decoders import Image, ImageRecord, Json
from parrecio.pipeline.config import PipelineConfig
from parrecio.pipeline.mapped import PREFIX, MappedFiles, map_stream
from parrecio.pipeline.poller import Poller
from parrecio.pipeline.wire import pack_column, unpack_column
from parrecio.recordio.framing import MAGIC_BYTES
from pipeline_helpers import FailOn, Fixed, Pair, digest_array, feed_fifo, payloads, write_rec

MAGIC = MAGIC_BYTES


class Echo:
    """payload -> bytes (a decoded field whose value travels back pickled)."""

    def __call__(self, payload):
        return bytes(payload)


def _records(n, seed):
    recs = payloads(n, seed=seed)
    for i in range(3, n, 17):  # multipart records (the magic at aligned offsets): held, via the ring
        recs[i] = MAGIC + recs[i] + b"\0" * (-len(recs[i]) % 4) + MAGIC + b"tail"
    return recs


# -- regular files read in place ------------------------------------------------------------------------
def test_mapped_file_byte_exact_with_multipart_groups_and_shards(tmp_path, no_leaks):
    recs = _records(600, seed=21)
    path = tmp_path / "m.rec"
    write_rec(path, recs)
    with ParallelReader(path, fields=None, workers=1) as r:
        assert list(r) == recs
    groups = [tuple(recs[i:i + 2]) for i in range(0, 600, 2)]
    with ParallelReader(path, fields=[Echo(), Echo()], workers=2) as r:
        assert list(r) == groups
        assert r.stats.chunks >= 1
    for shard in range(3):
        with ParallelReader(path, fields=[Echo(), Echo()], workers=2, num_shards=3, shard_index=shard) as r:
            assert list(r) == groups[shard::3]


def test_mapped_file_skip_matches_record_reader(tmp_path, no_leaks):
    recs = payloads(300, seed=5)
    path = tmp_path / "c.rec"
    offsets = write_rec(path, recs)
    data = bytearray(path.read_bytes())
    data[offsets[100]:offsets[100] + 4] = b"XXXX"  # a broken magic: one region to skip
    data[offsets[200] + 4:offsets[200] + 8] = (1 << 28).to_bytes(4, "little")  # a hostile length
    path.write_bytes(bytes(data))
    rr = RecordReader(path, on_corrupt="skip", max_record_bytes=1 << 20)
    want = [rec.payload for rec in rr]
    with ParallelReader(path, fields=Echo(), workers=2, on_error="skip", tuning=Tuning(max_record_bytes=1 << 20)) as r:
        assert list(r) == want
        assert r.stats.skipped_records == rr.skipped_records >= 2


def test_file_object_positioned_mid_file(tmp_path, no_leaks):
    recs = payloads(50, seed=8)
    path = tmp_path / "f.rec"
    offsets = write_rec(path, recs)
    with open(path, "rb") as f:
        f.seek(offsets[3])
        with ParallelReader(f, fields=Echo(), workers=1) as r:
            assert list(r) == recs[3:]


def test_stdin_from_a_regular_file(tmp_path):
    import subprocess
    import sys
    recs = payloads(200, seed=9)
    path = tmp_path / "s.rec"
    write_rec(path, recs)
    script = tmp_path / "read_stdin.py"
    script.write_text(
        "import hashlib\n"
        "from parrecio import ParallelReader\n"
        "if __name__ == '__main__':\n"
        "    h = hashlib.sha256()\n"
        "    with ParallelReader('-', fields=None, workers=1) as r:\n"
        "        for b in r:\n"
        "            h.update(b)\n"
        "    print(h.hexdigest())\n")
    with open(path, "rb") as stdin:
        out = subprocess.run([sys.executable, str(script)], stdin=stdin, capture_output=True, text=True,
                             timeout=120)
    import hashlib
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hashlib.sha256(b"".join(recs)).hexdigest()


def test_map_stream_and_a_file_that_changed(tmp_path):
    path = tmp_path / "x.rec"
    write_rec(path, [b"a" * 100, b"b" * 100])
    f = open(path, "rb")
    mm, name, start, check = map_stream(f)
    assert name.startswith(PREFIX) and name.endswith(str(path)) and start == 0
    assert bytes(mm[8:12]) == b"aaaa"
    check()
    maps = MappedFiles()
    assert bytes(maps.get(name)[8:12]) == b"aaaa"
    mm.close()
    assert map_stream(io.BytesIO(b"xyz")) is None  # not a file descriptor
    r, w = os.pipe()
    with os.fdopen(r, "rb") as pipe_r:
        assert map_stream(pipe_r) is None           # a pipe is read through the ring
    os.close(w)
    time.sleep(0.01)
    write_rec(path, [b"c" * 100])                   # rewritten in place: shorter, a new mtime
    changed = rf"{path} changed while it was being read: it was truncated from 216 to 108 bytes"
    with pytest.raises(SourceError, match=changed):
        check()                                     # the reader process's check, before each chunk
    with pytest.raises(SourceError, match=changed):
        maps.get(name)                              # a mapping kept by a worker is checked at each task
    with pytest.raises(SourceError, match=changed):
        MappedFiles().get(name)
    f.close()
    maps.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_fifo_gets_the_largest_pipe_buffer(tmp_path, no_leaks, workers):
    """Whoever reads the FIFO -- the reader process, or the consumer itself with ``workers=0`` -- grows
    its kernel buffer (with 64 KiB, ``workers=0`` read Pipe mode at 0.37-0.40x a plain loop)."""
    recs = payloads(100, seed=11)
    src = tmp_path / "src.rec"
    write_rec(src, recs)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with open("/proc/sys/fs/pipe-max-size") as f:
        biggest = int(f.read())
    got = []
    reader = ParallelReader(str(fifo), fields=None, workers=workers)
    t = threading.Thread(target=lambda: got.extend(reader))
    t.start()
    fd = os.open(fifo, os.O_WRONLY)
    try:
        deadline = time.monotonic() + 30  # its reader enlarges the pipe once it has it open
        while fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < biggest and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) == biggest
        os.write(fd, src.read_bytes())
    finally:
        os.close(fd)
    t.join(60)
    reader.close()
    assert got == recs


# -- columns and spans --------------------------------------------------------------------------------
def test_pack_column_round_trip():
    rng = np.random.default_rng(0)
    boxes = [rng.random((k, 5), dtype=np.float32) for k in (3, 0, 7, 1)]
    packed = pack_column(boxes)
    assert type(packed).__name__ == "_Packed"
    out = unpack_column(packed)
    assert len(out) == 4 and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(out, boxes))
    assert [a.shape for a in out] == [(3, 5), (0, 5), (7, 5), (1, 5)]
    for col in ([np.zeros(3, np.int32), np.zeros(3, np.int64)],       # dtypes differ
                [np.zeros((2, 5)), np.zeros((2, 4))],                 # trailing shapes differ
                [np.zeros(3), b"x"],                                  # not all arrays
                [np.float32(1.0), np.float32(2.0)],                   # 0-d
                [np.array([1, None], dtype=object)] * 2,              # objects
                [{"a": 1}], [], None):
        assert unpack_column(pack_column(col)) is col


def test_poller_watch_and_wait():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        p = Poller()
        calls = []

        def objs():
            calls.append(1)
            return [r1, r2]

        p.watch("a", objs)
        p.watch("a", objs)
        assert len(calls) == 1                      # same key: the set is not even asked for
        assert p.wait(0) == []
        os.write(w2, b"x")
        assert p.wait(1) == [r2]
        os.close(w1)
        w1 = None
        assert set(p.wait(1)) == {r1, r2}           # a closed write end makes the read end ready
        p.watch("b", lambda: [r2])
        assert p.wait(1) == [r2]
    finally:
        for fd in (r1, r2, w1, w2):
            if fd is not None:
                os.close(fd)


def test_batches_after_skips_are_exact_copies(tmp_path, no_leaks):
    recs = payloads(203, seed=13)
    for i in (5, 6, 70, 150):
        recs[i] = b"BAD" + recs[i]
    path = tmp_path / "b.rec"
    write_rec(path, recs)
    good = [digest_array(r) for r in recs if not r.startswith(b"BAD")]
    with ParallelReader(path, fields=FailOn(b"BAD"), workers=2, batch_size=8, on_error="skip") as r:
        batches = list(r)
        assert r.stats.skipped == 4
    assert [len(b) for b in batches] == [8] * (len(good) // 8) + [len(good) % 8]
    assert np.array_equal(np.concatenate(batches), np.stack(good))


def test_full_batches_are_views_of_their_slot(tmp_path, no_leaks):
    recs = payloads(64, seed=14)
    path = tmp_path / "v.rec"
    write_rec(path, recs)
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=8) as r:
        batches = list(r)
    assert all(b.base is not None and not b.flags.owndata for b in batches)
    assert np.array_equal(np.concatenate(batches), np.stack([digest_array(x) for x in recs]))


def test_tuple_specs_batched_and_single(tmp_path, no_leaks):
    from PIL import Image as PILImage
    rng = np.random.default_rng(3)
    recs, labels = [], []
    for i in range(40):
        buf = io.BytesIO()
        PILImage.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(buf, "JPEG")
        recs.append(pack(IRHeader(0, float(i % 7), i, 0), buf.getvalue()))
        labels.append(float(i % 7))
    path = tmp_path / "ir.rec"
    write_rec(path, recs)
    dec = ImageRecord(Image(size=(16, 16)), label_width=0)
    want = [dec(r) for r in recs]
    with ParallelReader(path, fields=dec, workers=2, batch_size=16) as r:
        out = list(r)
    images = np.concatenate([b[0] for b in out])
    assert np.array_equal(images, np.stack([w[0] for w in want]))
    assert np.concatenate([np.asarray(b[1]) for b in out]).tolist() == labels
    with ParallelReader(path, fields=dec, workers=2) as r:
        single = list(r)
    assert len(single) == 40
    for (img, lab), (wi, wl) in zip(single, want):
        assert np.array_equal(img, wi) and float(lab) == float(wl)
    with ParallelReader(path, fields=[Pair()], workers=2, batch_size=16) as r:  # a ragged part too
        (arrs, dicts), = list(r)[0]
    assert np.array_equal(arrs, np.stack([digest_array(x) for x in recs[:16]]))
    assert dicts == [{"n": len(x)} for x in recs[:16]]


# -- chunks, config, stats -----------------------------------------------------------------------------
def test_adaptive_chunks_for_small_records(tmp_path, no_leaks):
    import orjson
    recs = [orjson.dumps({"i": i, "k": "x" * (i % 30)}) for i in range(20000)]
    path = tmp_path / "j.rec"
    write_rec(path, recs)
    want = [orjson.loads(x) for x in recs]
    with ParallelReader(path, fields=Json(), workers=2) as r:
        assert list(r) == want
        adaptive = r.stats.chunks
    with ParallelReader(path, fields=Json(), workers=2, tuning=Tuning(chunk_groups=32)) as r:
        assert list(r) == want
        fixed = r.stats.chunks
    assert fixed >= 20000 // 32 and adaptive <= fixed // 10


@pytest.mark.parametrize("workers", [2, 3])
def test_ramp_up_first_chunks_fill_one_slot_between_the_workers(tmp_path, workers, no_leaks):
    """With fixed-shape outputs a chunk is two batches, but each worker's first chunk is only its share
    of the first batch: the first batch waits for batch_size / workers decodes per worker."""
    recs = payloads(100, seed=4)
    path = tmp_path / "r.rec"
    write_rec(path, recs)
    want = np.stack([digest_array(x) for x in recs])
    with ParallelReader(path, fields=Fixed(), workers=workers, batch_size=8) as r:
        got = list(r)
        assert np.array_equal(np.concatenate(got), want) and [len(b) for b in got] == [8] * 12 + [4]
        first = workers * (8 // workers)                 # 8 (2 workers) or 6 (3 workers) samples
        assert r.stats.chunks == workers + -(-(100 - first) // 16)
        assert got[0].base is not None and not got[0].flags.owndata  # still a view of its slot


def test_chunks_of_a_mapped_file_are_two_batches_of_large_records_those_in_the_ring_a_share_of_it(tmp_path,
                                                                                                  no_leaks):
    """A chunk in the ring is held to 1/8 of it (1 MiB floor), so that the ring holds several; a chunk read
    in place from a mapped file takes no ring space and is held only to its share of the mapped budget
    (config.mapped_chunk_bytes): two batches of ~40 KB records make one task there, however small the
    ring, and the consumer pays its per-task cost per two batches (not per 25 records)."""
    rng = np.random.default_rng(5)
    recs = [rng.integers(0, 256, 40_000 + i % 7, dtype=np.uint8).tobytes() for i in range(400)]
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    want = np.stack([digest_array(x) for x in recs])
    tuning = Tuning(ring_bytes=8 << 20)  # chunks in the ring: at most 1 MiB, ~26 of these records
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=16, tuning=tuning) as r:
        cfg = r.config
        assert cfg.chunk_bytes == 1 << 20 and cfg.mapped_chunk_bytes == (32 << 20) // 6
        assert np.array_equal(np.concatenate(list(r)), want)
        assert r.stats.chunks == 2 + -(-(400 - 16) // 32)  # the ramp-up's two, then 32 groups each
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    feeder = feed_fifo(path, fifo, 1 << 20, 0)
    try:
        with ParallelReader(str(fifo), fields=Fixed(), workers=2, batch_size=16, tuning=tuning) as r:
            assert np.array_equal(np.concatenate(list(r)), want)
            # (chunks are cut at 1 MiB, 26-27 records: at least one more chunk per 32 groups)
            assert r.stats.chunks >= 2 + -(-(400 - 16) // 27)
    finally:
        feeder.wait(30)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_chunk_per_group_many_messages_per_read_same_samples_as_one_process(tmp_path, workers, no_leaks):
    """One group per chunk and per task: the reader's Chunk messages and the workers' result frames pile up
    in their pipes and are taken many per read (wire.MessageReader, wire.FrameReader); every sample comes
    out once, in order, equal to workers=0 and to a plain reference, ragged values too."""
    recs = payloads(4000, seed=9, max_len=300)
    path = tmp_path / "many.rec"
    write_rec(path, recs)
    want = [(digest_array(a), digest_array(b), {"n": len(b)}) for a, b in zip(recs[0::2], recs[1::2])]
    fields = [Fixed(), Pair()]

    def flat(samples):
        return [(x, arr, meta) for x, (arr, meta) in samples]

    with ParallelReader(path, fields=fields, workers=0) as r:
        inline = flat(r)
    with ParallelReader(path, fields=fields, workers=workers, tuning=Tuning(chunk_groups=1)) as r:
        got = flat(r)
        assert r.stats.chunks == 2000
    for run in (inline, got):
        assert len(run) == 2000
        assert all(np.array_equal(a, x) and np.array_equal(b, y) and m == meta
                   for (a, b, m), (x, y, meta) in zip(run, want))


def test_config_is_frozen_and_reader_cpu_is_counted(tmp_path, no_leaks):
    recs = payloads(3000, seed=2, max_len=2000)
    path = tmp_path / "c.rec"
    write_rec(path, recs)
    with ParallelReader(path, fields=Fixed(), workers=1, batch_size=32, seed=7) as r:
        cfg = r.config
        assert isinstance(cfg, PipelineConfig) and cfg.seed == 7 and cfg.batch_size == 32
        with pytest.raises(Exception):
            cfg.seed = 8
        list(r)
        first = r.stats.reader_cpu
        list(r)
        assert 0 < first < r.stats.reader_cpu
