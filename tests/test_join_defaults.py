"""Files the library writes, and files MXNet wrote, read back exactly with every default (``join="auto"``,
:mod:`parrecio.recordio.joins`): ``ParallelReader`` (workers 0 and 2, streamed and by index),
``RecordReader``, ``IndexedRecordReader`` and the CLI's ``cat``, ``inspect`` and ``extract``.

Before ``join="auto"`` a ``pack manifest --split-bytes`` file read with the defaults gave damaged payloads
without an error (joined the MXNet way), and MXNet's own multipart file read with ``join="concat"``
lost the magic bytes of 14 of its 34 payloads."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from parrecio import IndexedRecordReader, ParallelReader, RecordReader, RecordWriter
from parrecio.decoders import Raw
from parrecio.recordio.joins import AmbiguousJoin
from parrecio.recordio.wrapper import write_sagemaker_recordio
from image_helpers import jpeg
from recordio_helpers import GOLDEN, load_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_PAYLOADS = [bytes.fromhex(r["payload"]) for r in load_manifest()["records"]]


def cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "parrecio.cli", *map(str, args)], capture_output=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc.stdout


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: (path of a .rec with its .idx, the payloads in order)}: pack manifest with and without
    --split-bytes (images of ~3-12 KB, parts of 4000 bytes: most records multipart), pack images, and
    MXNet's golden file."""
    root = tmp_path_factory.mktemp("joins")
    images = root / "images"
    blobs = []
    lines = []
    for i in range(24):
        blob = jpeg(64 + 8 * (i % 9), 48 + 8 * (i % 7), seed=i, quality=95)
        (images / "c").mkdir(parents=True, exist_ok=True)
        (images / "c" / f"{i:02d}.jpg").write_bytes(blob)
        blobs.append(blob)
        label = {"annotations": [{"class_id": i % 3, "left": 1, "top": 2, "width": 3, "height": 4}],
                 "image_size": [{"width": 64, "height": 48}]}
        lines.append(json.dumps({"source-ref": str(images / "c" / f"{i:02d}.jpg"), "bounding-box": label}))
    manifest = root / "train.manifest"
    manifest.write_text("\n".join(lines) + "\n")
    out = {}
    for name, extra in (("manifest", ()), ("manifest-split", ("--split-bytes", 4000)),
                        ("manifest-split-odd", ("--split-bytes", 1001))):
        path = root / f"{name}.rec"
        cli("pack", "manifest", manifest, path, "--attribute-names", "source-ref,bounding-box", "--quiet", *extra)
        with RecordReader(str(path), join="concat") as r:  # the writer's own convention
            want = [rec.payload for rec in r]
        assert want[0::2] == blobs
        index_of_concat(path, path.with_suffix(".idx"))
        out[name] = (path, want)
    path = root / "images.rec"
    cli("pack", "images", images, path)
    with IndexedRecordReader(str(path), join="mxnet") as r:
        out["images"] = (path, [r.read_at(o) for o in r.offsets])
    golden = root / "mxnet.rec"
    shutil.copy(os.path.join(GOLDEN, "mxnet.rec"), golden)
    shutil.copy(os.path.join(GOLDEN, "mxnet.idx"), root / "mxnet.idx")
    out["mxnet"] = (golden, GOLDEN_PAYLOADS)
    return out


def index_of_concat(rec, idx):
    """An .idx of the record starts of a concat-framed file (keys 0..n-1)."""
    import struct
    data = rec.read_bytes()
    starts, pos = [], 0
    while pos < len(data):
        _, lrec = struct.unpack_from("<II", data, pos)
        cflag, n = lrec >> 29, lrec & ((1 << 29) - 1)
        if cflag in (0, 1):
            starts.append(pos)
        pos += 8 + (n + 3) // 4 * 4
    idx.write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(starts)))


NAMES = ["manifest", "manifest-split", "manifest-split-odd", "images", "mxnet"]


@pytest.mark.parametrize("name", NAMES)
def test_record_readers_read_them_exactly_by_default(files, name):
    path, want = files[name]
    with RecordReader(str(path)) as r:
        assert [rec.payload for rec in r] == want
        if name.startswith("manifest-split"):
            assert r.guess.join == "concat"
        if name == "mxnet":
            assert r.guess.join == "mxnet"
    with IndexedRecordReader(str(path)) as r:
        offsets = r.offsets
        assert [r.read_at(o) for o in reversed(offsets)] == want[::-1]  # decided at any record, any order


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_parallel_reader_reads_them_exactly_by_default(files, name, workers, shuffle, no_leaks):
    path, want = files[name]
    with ParallelReader(str(path), fields=Raw(), workers=workers, shuffle=shuffle, seed=3) as reader:
        got = list(reader)
    assert (sorted(got) if shuffle else got) == (sorted(want) if shuffle else want)


@pytest.mark.parametrize("name", NAMES)
def test_cli_reads_them_exactly_by_default(files, name, tmp_path):
    path, want = files[name]
    lines = cli("cat", path, "--format", "hex").decode().splitlines()  # index, offset, hex
    assert [bytes.fromhex(line.split("\t")[2]) if line.count("\t") == 2 else b"" for line in lines] == want
    report = json.loads(cli("inspect", path, "--json"))
    assert report["records"] == len(want)
    if name.startswith("manifest-split"):
        assert report["join"].startswith("auto: concat (")
    elif name == "mxnet":
        assert report["join"].startswith("auto: mxnet (")
    else:
        assert report["join"] == "auto: either (no multipart records)"
    cli("extract", path, "--all", "--out", tmp_path / "x")
    written = sorted((tmp_path / "x").iterdir())
    assert len(written) == len(want)


def test_a_stream_that_fits_both_conventions_is_refused_naming_it():
    """One multipart record whose parts fit MXNet's aligned-magic cut and a fixed split alike, and
    nothing else that tells: an error that says so and what to pass, in every reader; explicit joins read it."""
    payload = b"x" * 8 + b"\x0a\x23\xd7\xce" + b"y" * 4  # MXNet: parts 8 and 4 bytes
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        w.write(b"abc")
        w.write(payload)
    data = buf.getvalue()
    with pytest.raises(AmbiguousJoin, match=r"cannot tell how the multipart record at byte 12 was written: "
                                             r"its parts are 8 bytes.*pass join='mxnet' or join='concat'"):
        list(RecordReader(io.BytesIO(data)))
    assert [r.payload for r in RecordReader(io.BytesIO(data), join="mxnet")] == [b"abc", payload]
    assert [r.payload for r in RecordReader(io.BytesIO(data), join="concat")] == [b"abc", b"x" * 8 + b"y" * 4]
    with ParallelReader(io.BytesIO(data), workers=0) as reader:
        with pytest.raises(AmbiguousJoin):
            list(reader)


def test_a_single_part_record_longer_than_the_parts_decides_mxnet_ahead():
    """The record alone fits both; one later record longer than its parts tells (the look-ahead)."""
    first = b"x" * 8 + b"\x0a\x23\xd7\xce" + b"y" * 4
    later = [b"z" * 5, b"w" * 40]
    buf = io.BytesIO()
    with RecordWriter(buf) as w:
        for p in [first] + later:
            w.write(p)
    r = RecordReader(io.BytesIO(buf.getvalue()), chunk_size=8)
    assert [x.payload for x in r] == [first] + later and r.guess.join == "mxnet"
    # and a fixed split of the same sizes: two multipart records cut at 8 bytes tell concat
    split = io.BytesIO()
    write_sagemaker_recordio([b"a" * 12, b"b" * 3, b"c" * 16], split, split_bytes=8)
    r = RecordReader(io.BytesIO(split.getvalue()), chunk_size=8)
    assert [x.payload for x in r] == [b"a" * 12, b"b" * 3, b"c" * 16] and r.guess.join == "concat"


def test_pack_manifest_with_one_split_record_reads_back_by_default(tmp_path):
    """``pack manifest --split-bytes 16384`` of a manifest where one image only is longer: its parts of
    exactly 16384 bytes fitted MXNet's convention too, and every reader refused the file as ambiguous.
    The packer cuts parts one byte short of a multiple of 4, which tells the convention at once."""
    import numpy as np
    from PIL import Image as PILImage
    rng = np.random.default_rng(2)
    noise = PILImage.fromarray(rng.integers(0, 256, (160, 160, 3), dtype=np.uint8))
    buf = io.BytesIO()
    noise.save(buf, "JPEG", quality=95)
    blobs = [jpeg(64, 48, seed=i) for i in range(5)] + [buf.getvalue()]
    assert max(map(len, blobs[:5])) < 16384 < len(blobs[5]) < 4 * 16384
    lines = []
    for i, blob in enumerate(blobs):
        (tmp_path / f"{i}.jpg").write_bytes(blob)
        lines.append(json.dumps({"source-ref": str(tmp_path / f"{i}.jpg"), "label": i}))
    (tmp_path / "m.manifest").write_text("\n".join(lines) + "\n")
    out = tmp_path / "m.rec"
    cli("pack", "manifest", tmp_path / "m.manifest", out, "--attribute-names", "source-ref,label",
        "--split-bytes", 16384, "--quiet")
    want = [x for i, blob in enumerate(blobs) for x in (blob, str(i).encode())]
    with RecordReader(str(out)) as r:
        assert [rec.payload for rec in r] == want and r.guess.join == "concat"
    with ParallelReader(str(out), fields=[Raw(), Raw()], workers=2) as reader:
        assert [p for group in reader for p in group] == want
    assert json.loads(cli("inspect", out, "--json"))["join"].startswith("auto: concat (")


def _mxnet_file(path, payloads):
    """``payloads`` framed as dmlc-core writes them (cut at every aligned magic), with the ``.idx``
    MXIndexedRecordIO writes: an independent writer (recordio_helpers.mxnet_frames)."""
    from recordio_helpers import mxnet_frames
    data, offs = b"", []
    for p in payloads:
        offs.append(len(data))
        data += mxnet_frames(p)
    path.write_bytes(data)
    path.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(offs)))


M4 = b"\x0a\x23\xd7\xce"


def test_two_records_cut_at_one_size_are_no_split_when_a_later_record_is_longer(tmp_path):
    """MXNet records A and B both hold the magic at byte 8 (parts 8 and 4, 8 and 8), then a 100-byte
    record: the two cuts at 8 bytes said "concat" at once and the magic of both was dropped (dmlc-core
    reads them with it).  The look-ahead goes on past them: the long record decides MXNet's."""
    payloads = [b"A" * 8 + M4 + b"a" * 4, b"B" * 8 + M4 + b"b" * 8, b"C" * 100]
    path = tmp_path / "m.rec"
    _mxnet_file(path, payloads)
    for chunk in (8, 64, 1 << 16):
        with RecordReader(io.BytesIO(path.read_bytes()), chunk_size=chunk) as r:
            assert [x.payload for x in r] == payloads and r.guess.join == "mxnet"
    with RecordReader(str(path)) as r:
        assert [x.payload for x in r] == payloads and r.guess.join == "mxnet"
    with ParallelReader(str(path), workers=0) as reader:
        assert [bytes(p) for p in reader] == payloads


@pytest.mark.parametrize("first", [0, 2])
def test_reading_by_index_decides_the_same_whichever_record_comes_first(tmp_path, first, no_leaks):
    """[A (cut at 8), C (100 bytes, one part), B (cut at 8)] read by index, B first (a shuffle): B and A
    were two cuts at 8 -- "concat" -- before C was probed; every seed but one returned A and B without
    their magic."""
    payloads = [b"A" * 8 + M4 + b"a" * 8, b"C" * 100, b"B" * 8 + M4 + b"b" * 8]
    path = tmp_path / "m.rec"
    _mxnet_file(path, payloads)
    with IndexedRecordReader(path) as r:
        assert r[first] == payloads[first] and [r[k] for k in range(3)] == payloads
    for seed in range(6):
        with ParallelReader(str(path), workers=0 if seed % 2 else 2, shuffle=True, seed=seed) as reader:
            assert sorted(bytes(p) for p in reader) == sorted(payloads), seed


def test_an_ambiguous_record_read_again_by_index_is_still_ambiguous(tmp_path, no_leaks):
    """One MXNet record cut at its aligned magic (parts of 200 and 96 bytes), the others shorter: by index
    it cannot be told from a fixed split, every time it is read.  Its second read counted it as a second
    record cut at 200 bytes and decided "concat", dropping its magic -- and check_index's probe read (the
    CLI's extract) and a shuffled pass each read it twice."""
    middle = b"\x11" * 200 + M4 + b"\x11" * 96
    payloads = [b"a" * 100, middle, b"b" * 100]
    path = tmp_path / "m.rec"
    _mxnet_file(path, payloads)
    with IndexedRecordReader(path) as r:
        for _ in range(3):
            with pytest.raises(AmbiguousJoin, match="cannot tell how the multipart record at byte 108 was written"):
                r[1]
        assert r[0] == payloads[0] and r[2] == payloads[2]
    for workers, on_error in ((0, "raise"), (1, "raise"), (1, "skip")):
        with ParallelReader(str(path), workers=workers, shuffle=True, on_error=on_error) as reader:
            with pytest.raises(AmbiguousJoin):
                list(reader)
    with RecordReader(str(path), join="mxnet") as r:  # what the file holds
        assert [x.payload for x in r] == payloads
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "parrecio.cli", "extract", str(path), "--index", "1"],
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 1 and proc.stdout == b"" and b"cannot tell how the multipart record" in proc.stderr


def test_a_fixed_split_with_nothing_longer_after_its_cuts_still_reads_as_concat(tmp_path):
    """SageMaker's split (parts of 8 bytes): short records between and after the cut ones say nothing
    against it; the look-ahead reaches the end (or its bound) and decides concat."""
    want = [b"a" * 12, b"b" * 3, b"c" * 16, b"d" * 8, b"e" * 2]
    split = io.BytesIO()
    write_sagemaker_recordio(want, split, split_bytes=8)
    for chunk in (8, 1 << 16):
        r = RecordReader(io.BytesIO(split.getvalue()), chunk_size=chunk)
        assert [x.payload for x in r] == want and r.guess.join == "concat"
        assert "no record in the stream up to byte 100 (its end, or bytes that are no record) is longer" in r.guess.why
    path = tmp_path / "s.rec"
    path.write_bytes(split.getvalue())
    with RecordReader(str(path)) as r:
        assert [x.payload for x in r] == want and r.guess.join == "concat"


def test_a_damaged_record_does_not_keep_the_join_from_being_decided_by_index(tmp_path, no_leaks):
    """Deciding the join at the first multipart record read probes the long records: one with a damaged
    length word raised out of the probe, every multipart record of the file failed with its error (3 of 3
    lost under skip).  A probe that fails tells nothing; the next long record decides."""
    from recordio_helpers import frame
    recs, data, offs = [], b"", []
    for i in range(12):
        if i % 4 == 1:  # MXNet multipart: the magic at offset 16 of the payload
            body = b"M%02d-" % i + b"m" * 12 + M4 + b"tail%02d-" % i + b"t" * 8
            fr = frame(body[:16], 1) + frame(body[20:], 3)
        else:
            body = b"S%02d-" % i + b"s" * (8 if i < 10 else 60)  # records 10 and 11: long, single-part
            fr = frame(body)
        recs.append(body)
        offs.append(len(data))
        data += fr
    data = bytearray(data)
    data[offs[10] + 4:offs[10] + 8] = (60 - 16).to_bytes(4, "little")  # record 10 ends amid its own bytes
    path = tmp_path / "p.rec"
    path.write_bytes(bytes(data))
    path.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(offs)))
    with IndexedRecordReader(path) as r:
        assert [r[k] for k in (1, 5, 9)] == [recs[1], recs[5], recs[9]]
    with ParallelReader(str(path), workers=0, shuffle=True, on_error="skip") as reader:
        got = sorted(bytes(p) for p in reader)
        assert got == sorted(recs[:10] + recs[11:]) and reader.stats.skipped == 1


@pytest.mark.parametrize("extra", [4, 0], ids=["over", "at"])
def test_max_record_bytes_counts_the_magics_put_back_whether_join_is_named_or_guessed(tmp_path, extra, no_leaks):
    """``max_record_bytes`` bounds the joined payload: an MXNet record of three parts whose joined bytes
    (with the two magics put back) are 4 over the limit (their concatenation 4 under) was refused with
    ``join="mxnet"`` and delivered with the default ``join="auto"``, which reads the parts concatenated
    and puts the magics back after the check.  Now both refuse it, by every reader; a record exactly at
    the limit passes both."""
    from parrecio import CorruptRecordError, Tuning
    limit = 1 << 14
    big = b"a" * 6000 + M4 + b"b" * 6000 + M4 + b"c" * (limit - 12008 + extra)
    assert len(big) == limit + extra and big.count(M4) == 2  # its parts concatenated: 8 bytes fewer
    payloads = [b"x" * 9000, big, b"y" * 10]  # the long single-part record first: auto decides "mxnet"
    path = tmp_path / "m.rec"
    _mxnet_file(path, payloads)

    def outcome(make):
        try:
            return [bytes(p) for p in make()]
        except CorruptRecordError as exc:
            return exc

    readers = {
        "ParallelReader": lambda join: lambda: list(ParallelReader(
            str(path), workers=0, join=join, tuning=Tuning(max_record_bytes=limit))),
        "ParallelReader, shuffled by index, 2 workers": lambda join: lambda: sorted(ParallelReader(
            str(path), workers=2, join=join, shuffle=True, seed=1, tuning=Tuning(max_record_bytes=limit)),
            key=len),
        "RecordReader": lambda join: lambda: [r.payload for r in RecordReader(
            str(path), join=join or "auto", max_record_bytes=limit)],
        "IndexedRecordReader": lambda join: lambda: [IndexedRecordReader(
            path, join=join or "auto", max_record_bytes=limit)[k] for k in range(3)],
    }
    for name, make in readers.items():
        named, guessed = outcome(make("mxnet")), outcome(make(None))
        if extra:
            assert isinstance(named, CorruptRecordError), name
            assert isinstance(guessed, CorruptRecordError), f"{name}: {len(big)} bytes > {limit} delivered"
            assert "exceeds max_record_bytes" in str(guessed) and guessed.offset == len(mxnet_frames_of(payloads[0]))
        else:
            assert named == guessed and sorted(named, key=len) == sorted(payloads, key=len), name


def mxnet_frames_of(payload):
    from recordio_helpers import mxnet_frames
    return mxnet_frames(payload)
