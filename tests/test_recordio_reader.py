"""RecordReader: sources (paths, file objects, short reads, pipes), joins, views, lifetime."""

from __future__ import annotations

import io
import os
import random
import socket
import threading
import tracemalloc

import pytest

from parrecio import CorruptRecordError, RecordReader, RecordWriter, SourceError
from parrecio.recordio import DEFAULT_CHUNK_SIZE
from recordio_helpers import M, ReadOnly, ShortReads, concat_frames, frame

PAYLOADS = [b"", b"a", b"abcd", M, b"xy" + M + b"z", b"abcd" + M, M + M, bytes(range(256)) * 3, b"q" * 5001]


def _stream(payloads=PAYLOADS) -> bytes:
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        for p in payloads:
            w.write(p)
    return buf.getvalue()


def _payloads(reader) -> list:
    return [r.payload for r in reader]


def test_empty_stream_yields_nothing():
    assert _payloads(RecordReader(io.BytesIO(b""))) == []


def test_file_objects_of_every_kind(tmp_path):
    data = _stream()
    path = tmp_path / "a.rec"
    path.write_bytes(data)
    assert _payloads(RecordReader(str(path))) == PAYLOADS
    assert _payloads(RecordReader(path)) == PAYLOADS
    with open(path, "rb") as f:  # buffered: readinto1
        assert _payloads(RecordReader(f)) == PAYLOADS
    with open(path, "rb", buffering=0) as f:
        assert _payloads(RecordReader(f)) == PAYLOADS
    assert _payloads(RecordReader(io.BytesIO(data))) == PAYLOADS


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("chunk_size", [8, 11, 64, DEFAULT_CHUNK_SIZE])
def test_short_reads(seed, chunk_size):
    data = _stream()
    src = ShortReads(data, seed=seed)
    assert _payloads(RecordReader(src, chunk_size=chunk_size)) == PAYLOADS
    assert src.reads > len(data) // 7  # really read in small pieces


def test_read_only_source_without_readinto():
    data = _stream()
    r = RecordReader(ReadOnly(data), chunk_size=16)
    assert _payloads(r) == PAYLOADS
    assert r.source_name == "readonly-source"


@pytest.mark.parametrize("buffering", [0, -1])
def test_real_pipe_fed_in_small_writes(buffering):
    data = _stream(PAYLOADS * 20)
    rfd, wfd = os.pipe()
    rng = random.Random(3)

    def feed():
        with os.fdopen(wfd, "wb", buffering=0) as w:
            at = 0
            while at < len(data):
                n = rng.randint(1, 300)
                w.write(data[at:at + n])
                at += n

    t = threading.Thread(target=feed)
    t.start()
    try:
        with os.fdopen(rfd, "rb", buffering=buffering) as f:
            got = _payloads(RecordReader(f, chunk_size=4096))
    finally:
        t.join(10)
    assert got == PAYLOADS * 20


@pytest.mark.parametrize("wrap", ["socket", "makefile"])
def test_socket(wrap):
    data = _stream(PAYLOADS * 5)
    a, b = socket.socketpair()

    def feed():
        with a:
            for at in range(0, len(data), 97):
                a.sendall(data[at:at + 97])

    t = threading.Thread(target=feed)
    t.start()
    try:
        with b:
            src = b if wrap == "socket" else b.makefile("rb")
            got = _payloads(RecordReader(src, chunk_size=1000))
    finally:
        t.join(10)
    assert got == PAYLOADS * 5


def test_offsets_are_stream_offsets():
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        offsets = [w.write(p) for p in PAYLOADS]
    assert [r.offset for r in RecordReader(io.BytesIO(buf.getvalue()), chunk_size=8)] == offsets


def test_iter_views_zero_copy_and_documented_lifetime():
    data = _stream([b"abcd" * 10, b"efgh" * 10, b"ab" + M + b"cd"])
    r = RecordReader(io.BytesIO(data))
    views = r.iter_views()
    off0, v0 = next(views)
    assert isinstance(v0, memoryview) and off0 == 0
    assert v0.obj is r._buf  # a slice of the reader's buffer: no copy
    assert bytes(v0) == b"abcd" * 10
    off1, v1 = next(views)
    assert v1.obj is v0.obj and bytes(v1) == b"efgh" * 10
    _, v2 = next(views)
    assert bytes(v2) == b"ab" + M + b"cd"
    assert list(views) == []


def test_records_larger_than_the_chunk_grow_the_buffer():
    payloads = [b"s", os.urandom(10000), b"t", os.urandom(70000)]
    r = RecordReader(ShortReads(_stream(payloads), most=5000), chunk_size=1024)
    assert _payloads(r) == payloads
    assert len(r._buf) < 70000 + 8 + 70000 // 4 + 1024


def test_memory_is_bounded_by_the_chunk_not_the_stream():
    data = _stream([os.urandom(1000)] * 8000)  # 8 MB
    src = io.BytesIO(data)
    tracemalloc.start()
    try:
        n = sum(len(v) for _, v in RecordReader(src, chunk_size=256 << 10).iter_views())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 8_000_000
    assert peak < 1 << 20


def test_iteration_resumes_where_it_stopped():
    r = RecordReader(io.BytesIO(_stream()), chunk_size=16)
    first = []
    for rec in r:
        first.append(rec.payload)
        if len(first) == 3:
            break
    assert first + _payloads(r) == PAYLOADS
    assert _payloads(r) == []


def test_one_iteration_at_a_time():
    r = RecordReader(io.BytesIO(_stream()))
    it = iter(r)
    next(it)
    with pytest.raises(RuntimeError):
        next(r.iter_views())


def test_mxnet_join_reinserts_the_magic_concat_does_not():
    data = frame(b"abcd", 1) + frame(b"", 2) + frame(b"ef", 3) + frame(b"z")
    assert _payloads(RecordReader(io.BytesIO(data))) == [b"abcd" + M + M + b"ef", b"z"]
    assert _payloads(RecordReader(io.BytesIO(data), join="concat")) == [b"abcdef", b"z"]


def test_concat_multipart_with_arbitrary_part_sizes():
    rng = random.Random(7)
    payloads, data = [], b""
    for n in range(40):
        p = bytes(rng.getrandbits(8) for _ in range(n * 3)) + (M if n % 5 == 0 else b"")
        sizes = [rng.randint(0, 9) for _ in range(rng.randint(0, 4))]
        payloads.append(p)
        data += concat_frames(p, sizes)
    for chunk_size in (8, 29, 4096):
        r = RecordReader(ShortReads(data, seed=chunk_size), join="concat", chunk_size=chunk_size)
        assert _payloads(r) == payloads


def test_arguments_are_validated():
    with pytest.raises(ValueError, match="join"):
        RecordReader(io.BytesIO(b""), join="dmlc")
    with pytest.raises(ValueError, match="on_corrupt"):
        RecordReader(io.BytesIO(b""), on_corrupt="ignore")
    with pytest.raises(ValueError, match="chunk_size"):
        RecordReader(io.BytesIO(b""), chunk_size=4)
    with pytest.raises(TypeError):
        RecordReader(12.5)
    with pytest.raises(SourceError, match="nope.rec"):
        RecordReader("/nonexistent/nope.rec")


def test_close_owns_only_what_it_opened(tmp_path):
    path = tmp_path / "a.rec"
    path.write_bytes(_stream())
    with RecordReader(path) as r:
        f = r._file
        next(iter(r))
    assert r.closed and f.closed
    with pytest.raises(ValueError):
        list(r)
    src = io.BytesIO(_stream())
    with RecordReader(src) as r:
        pass
    assert not src.closed


def test_source_name_in_errors(tmp_path):
    path = tmp_path / "bad.rec"
    path.write_bytes(b"garbage!")
    with pytest.raises(CorruptRecordError) as e:
        list(RecordReader(path))
    assert e.value.source == str(path) and str(path) in str(e.value)
    with pytest.raises(CorruptRecordError) as e:
        list(RecordReader(io.BytesIO(b"garbage!"), source_name="channel train"))
    assert "channel train" in str(e.value)


class _FlakyReads(ShortReads):
    """Short reads that fail once with an OSError after ``fail_after`` reads."""

    def __init__(self, data: bytes, fail_after: int) -> None:
        super().__init__(data, seed=1)
        self.fail_after = fail_after

    def readinto(self, b):
        if self.reads == self.fail_after:
            self.reads += 1
            raise OSError(5, "Input/output error")
        return super().readinto(b)


def test_read_error_is_a_source_error_then_resume_or_sticky():
    """After a read error, iteration resumes exactly where it stopped, even when the error struck inside a
    record (its start stays buffered while it is read); never garbage, never a lost record."""
    data = _stream()
    outcomes = set()
    for fail_after in range(1, len(data) // 3, 3):
        r = RecordReader(_FlakyReads(data, fail_after=fail_after), chunk_size=16, source_name="flaky")
        got = []
        try:
            for rec in r:
                got.append(rec.payload)
        except SourceError as err:
            assert "flaky" in str(err)
        else:
            continue  # fewer reads than fail_after
        assert got == PAYLOADS[:len(got)]
        try:
            rest = _payloads(r)
        except SourceError as err:
            assert "cannot resume" in str(err)
            outcomes.add("sticky")
        else:
            assert got + rest == PAYLOADS
            outcomes.add("resumed")
    assert outcomes == {"resumed"}
