"""parrecio.integrations.ray: read_recordio against ParallelReader (same samples, same bytes), read tasks
split along .idx ranges without cutting a group, iter_torch_batches, and errors that name the record.
Skipped where Ray Data is not installed (pip install 'parrecio[ray]').  One Ray instance of 2 CPUs for the
whole module; the data (JPEG + boxes JSON + class id groups, MXNet image records) is generated here."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from image_helpers import gt_boxes_json, jpeg  # noqa: E402
from parrecio import CorruptRecordError, DecodeError, ParallelReader, RecordWriter, SourceError  # noqa: E402
from parrecio.decoders import (BoundingBoxes, ClassLabel, Image, ImageRecord, Json,  # noqa: E402
                               RandomResizedCrop, Raw)
from parrecio.decoders.base import sample_key  # noqa: E402
from parrecio.integrations.ray import RecordIODatasource, plan_ranges, read_recordio  # noqa: E402
from parrecio.recordio.index import IndexMismatch  # noqa: E402
from parrecio.recordio.irheader import IRHeader, pack  # noqa: E402
from ray.data.block import BlockAccessor  # noqa: E402

# Ray 2.60's DataContext.get_current() warns about its own deprecated settings
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")

FIELDS = {"image": Image(size=(32, 32)), "boxes": BoundingBoxes(max_boxes=4), "label": ClassLabel()}
NF = len(FIELDS)
# file name -> (first sample number, samples, indexed?); c.rec sits in a directory given as a directory
FILES = {"a.rec": (0, 30, True), "b.rec": (100, 11, False), os.path.join("more", "c.rec"): (200, 7, True)}


def _group(i: int, image: bytes = b"") -> list:
    """Sample ``i``: its JPEG (seeded by ``i``), its boxes (class ``i``), its class id ``i``."""
    boxes = gt_boxes_json([(i, 1, 2, 10, 8), (1, 0, 0, 5, 5)], 40, 30)
    return [image or jpeg(40, 30, seed=i, quality=80), boxes, str(i).encode()]


def _write(path, samples, indexed: bool, groups=None) -> list:
    """Write the groups of ``samples``; return the byte offset of each group's first record."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    idx = os.path.splitext(path)[0] + ".idx" if indexed else None
    starts = []
    with RecordWriter(str(path), index=idx) as w:
        for i in samples:
            records = groups(i) if groups else _group(i)
            starts.append(w.write(records[0]))
            for r in records[1:]:
                w.write(r)
    return starts


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The files, the paths given to the readers, and the ``(path, offset)`` of every sample in order."""
    root = tmp_path_factory.mktemp("ray")
    expected = []
    for name, (first, n, indexed) in FILES.items():
        path = str(root / name)
        expected += [(path, off) for off in _write(path, range(first, first + n), indexed)]
    paths = [str(root / "a.rec"), str(root / "b.rec"), str(root / "more")]  # a directory, too
    return root, paths, expected


def _parallel_reader(paths, fields) -> list:
    with ParallelReader(paths, fields, workers=1) as reader:
        return list(reader)


def _same(got, want) -> None:
    """Byte-equal: same dtype, same shape, same bytes (python scalars from Ray rows count as arrays)."""
    if isinstance(want, bytes):
        assert got == want
        return
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


def test_every_sample_once_byte_equal_to_parallel_reader(ray_cluster, data):
    _, paths, expected = data
    want = _parallel_reader(paths, FIELDS)
    ctx = ray.data.DataContext.get_current()
    before = ctx.execution_options.preserve_order
    ctx.execution_options.preserve_order = True
    try:
        ds = read_recordio(paths, FIELDS, include_paths=True, include_offsets=True, override_num_blocks=6)
        rows = ds.take_all()
    finally:
        ctx.execution_options.preserve_order = before
    assert [(r["path"], r["offset"]) for r in rows] == expected      # each sample once, in file order
    assert len(rows) == len(want) == 48
    for row, sample in zip(rows, want):
        assert set(row) == set(FIELDS) | {"path", "offset"}
        for name in FIELDS:
            _same(row[name], sample[name])
    assert ds.count() == 48


def test_indexed_file_read_by_several_tasks_whole_groups(ray_cluster, data):
    root, paths, expected = data
    source = RecordIODatasource(paths, FIELDS)
    ranges = source.read_ranges(6)
    a, b, c = (str(root / name) for name in FILES)
    mine = [r for r in ranges if r.path == a]
    assert len(mine) > 1 and [(r.start, r.stop) for r in mine][0][0] == 0 and mine[-1].stop == 30
    assert all(x.stop == y.start for x, y in zip(mine, mine[1:]))           # consecutive, no gap
    assert [r for r in ranges if r.path == b] == [(b, None, None)]        # no .idx: one task, streamed
    starts = {p: [o for q, o in expected if q == p] for p in (a, b, c)}
    planned = {(r.path, r.start, r.stop) for r in ranges}

    ds = read_recordio(paths, FIELDS, include_paths=True, include_offsets=True, override_num_blocks=6)
    blocks = [BlockAccessor.for_block(t).to_batch_format("numpy") for t in ray.get(ds.to_arrow_refs())]
    ran = set()
    for block in blocks:
        (path,) = set(block["path"])                                      # a block comes from one task
        offs = block["offset"].tolist()
        first = starts[path].index(offs[0])
        assert offs == starts[path][first:first + len(offs)]            # whole, consecutive groups
        ran.add((path, None, None) if path == b else (path, first, first + len(offs)))
        # the fields of each row belong to one group, at the task's edges too
        first_sample = FILES[os.path.relpath(path, root)][0]
        for k, (image, boxes, label) in enumerate(zip(block["image"], block["boxes"], block["label"])):
            i = first_sample + first + k
            assert label == i and boxes[0, 0] == i
            _same(image, FIELDS["image"](jpeg(40, 30, seed=i, quality=80)))
    assert ran == planned                                               # every planned task ran, no other
    assert len([r for r in ran if r[0] == a]) > 1


def test_plan_ranges_rule():
    # one task per unindexed file; the rest shared by size, at least 1, at most one per group
    assert plan_ranges([None, 30, None, 7], [10, 300, 10, 70], 6) == \
        [(0, None, None), (1, 0, 10), (1, 10, 20), (1, 20, 30), (2, None, None), (3, 0, 7)]
    assert plan_ranges([2, 0, None], [100, 0, 5], 50) == [(0, 0, 1), (0, 1, 2), (2, None, None)]
    assert plan_ranges([10, 10], [1, 1], 1) == [(0, 0, 10), (1, 0, 10)]
    ranges = plan_ranges([1000, 3], [10_000, 30], 64)
    assert sum(1 for r in ranges if r[0] == 0) == 63 and [r for r in ranges if r[0] == 1] == [(1, 0, 3)]
    assert all(b - a in (15, 16) for f, a, b in ranges if f == 0)


def test_ragged_bytes_json_and_image_records(ray_cluster, data, tmp_path):
    _, paths, _ = data
    fields = {"jpeg": Raw(), "boxes": BoundingBoxes(), "label": Json()}
    want = _parallel_reader(paths, fields)
    got = read_recordio(paths, fields, include_offsets=True).take_all()
    got.sort(key=lambda r: (r["label"] >= 200, r["label"] >= 100, r["offset"]))   # file order, then offset
    assert len(got) == len(want)
    for row, sample in zip(got, want):
        assert row["jpeg"] == sample["jpeg"] and row["label"] == sample["label"]
        _same(row["boxes"], sample["boxes"])                               # (2, 5) float32, ragged column

    rec = str(tmp_path / "im2rec.rec")                                   # MXNet image records, indexed
    _write(rec, range(9), True, groups=lambda i: [pack(IRHeader(0, float(i), i, 0), jpeg(40, 30, seed=i))])
    decoder = ImageRecord(Image(size=(16, 16)), label_width=1)
    want = _parallel_reader(rec, decoder)
    ds = read_recordio(rec, decoder, include_offsets=True, override_num_blocks=3)
    assert len(RecordIODatasource(rec, decoder).read_ranges(3)) == 3
    got = sorted(ds.take_all(), key=lambda r: r["offset"])
    assert set(got[0]) == {"image", "label", "offset"}
    for row, (image, label) in zip(got, want):
        _same(row["image"], image)
        _same(row["label"], label)


def test_random_decoders_one_key_per_sample(ray_cluster, data):
    """A random crop + flip and the boxes that follow it: one key per sample, from (seed, epoch, file,
    index in file), so the image and its boxes agree and the split into tasks changes nothing."""
    _, paths, expected = data
    image = Image(size=(16, 16), crop=RandomResizedCrop(), flip=0.5)
    fields = {"image": image, "boxes": BoundingBoxes(max_boxes=4, image=image), "label": ClassLabel()}

    def rows(**options):
        ds = read_recordio(paths, fields, include_paths=True, include_offsets=True, **options)
        return sorted(ds.take_all(), key=lambda r: (r["path"], r["offset"]))

    six, two = rows(seed=3, epoch=1, override_num_blocks=6), rows(seed=3, epoch=1, override_num_blocks=2)
    files = RecordIODatasource(paths, fields).paths
    for row, other in zip(six, two):
        assert (row["path"], row["offset"]) == (other["path"], other["offset"])
        _same(row["image"], other["image"])
        _same(row["boxes"], other["boxes"])
        n = files.index(row["path"])
        key = sample_key(3, 1, n, [o for p, o in expected if p == row["path"]].index(row["offset"]))
        jpeg_bytes, boxes_json, _ = _group(int(row["label"]))
        _same(row["image"], image(jpeg_bytes, key=key))
        _same(row["boxes"], fields["boxes"](boxes_json, key=key))
    fresh, again = rows(), rows()                                          # seed=None: new crops each pass
    assert any(not np.array_equal(x["image"], y["image"]) for x, y in zip(fresh, again))
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        read_recordio(paths, fields, epoch=-1)


@pytest.mark.parametrize("workers", [0, 2])
def test_random_crops_equal_parallel_reader_for_one_file(ray_cluster, data, workers):
    """One file, one seed, one epoch: the Ray datasource's random crops, flips and the boxes that follow
    them are ParallelReader's, byte for byte (both draw sample_key(seed, epoch, 0, index), and decode
    through parrecio.pipeline.decode), however Ray splits the file into tasks."""
    root, _, _ = data
    path = str(root / "a.rec")
    image = Image(size=(16, 16), crop=RandomResizedCrop(), flip=0.5)
    fields = {"image": image, "boxes": BoundingBoxes(max_boxes=4, image=image), "label": ClassLabel()}
    with ParallelReader(path, fields, workers=workers, seed=11) as reader:
        reader.set_epoch(2)
        want = list(reader)
    rows = read_recordio(path, fields, seed=11, epoch=2, include_offsets=True, override_num_blocks=4).take_all()
    rows.sort(key=lambda r: r["offset"])
    assert len(rows) == len(want) == 30
    flipped = 0
    for row, sample in zip(rows, want):
        for name in fields:
            _same(row[name], sample[name])
        plain = Image(size=(16, 16))(_group(int(row["label"]))[0])
        flipped += not np.array_equal(row["image"], plain)
    assert flipped > 10  # the crops are random indeed: the comparison is not of unaugmented images


def test_iter_torch_batches(ray_cluster, data):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ray.train")          # what iter_torch_batches imports (ray[train]: pydantic)
    _, paths, _ = data
    want = {int(s["label"]): s for s in _parallel_reader(paths, FIELDS)}
    ds = read_recordio(paths, FIELDS, override_num_blocks=4).select_columns(["image", "boxes", "label"])
    seen = []
    for batch in ds.iter_torch_batches(batch_size=8):
        assert batch["image"].dtype == torch.uint8 and batch["image"].shape[1:] == (32, 32, 3)
        assert batch["boxes"].dtype == torch.float32 and batch["boxes"].shape[1:] == (4, 5)
        assert batch["label"].dtype == torch.int64
        for image, boxes, label in zip(batch["image"], batch["boxes"], batch["label"].tolist()):
            assert torch.equal(image, torch.from_numpy(want[label]["image"]))
            assert torch.equal(boxes, torch.from_numpy(want[label]["boxes"]))
            seen.append(label)
    assert sorted(seen) == sorted(want)


def test_bad_paths_options_and_indexes(ray_cluster, data, tmp_path):
    root, paths, _ = data
    missing = str(tmp_path / "nope.rec")
    with pytest.raises(SourceError, match="no such file or directory.*nope.rec"):
        read_recordio([paths[0], missing], FIELDS)
    with pytest.raises(SourceError, match=r"s3:// URLs are not supported"):
        read_recordio("s3://bucket/train.rec", FIELDS)
    # a file of another format among the .rec files: refused when the dataset is made, as ParallelReader
    # refuses it, also under on_error="skip" (which read it as 0 samples, with a warning in a worker's log)
    import gzip
    other = tmp_path / "b.rec"
    other.write_bytes(gzip.compress(open(paths[0], "rb").read()))
    for on_error in ("raise", "skip"):
        with pytest.raises(SourceError, match=r"b\.rec.*gzip-compressed; decompress it first"):
            read_recordio([paths[0], str(other)], FIELDS, on_error=on_error)
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
        read_recordio(paths, FIELDS, on_error="ignore")
    with pytest.raises(ValueError, match="join must be"):
        read_recordio(paths, FIELDS, join="mx")
    with pytest.raises(ValueError, match="max_record_bytes must be >= 1"):
        read_recordio(paths, FIELDS, max_record_bytes=0)
    with pytest.raises(ValueError, match="override_num_blocks must be >= 1"):
        read_recordio(paths, FIELDS, override_num_blocks=0)
    with pytest.raises(TypeError, match="unexpected keyword.*overide_num_blocks"):
        read_recordio(paths, FIELDS, overide_num_blocks=4)
    with pytest.raises(ValueError, match=r"column name\(s\) \['path'\]"):
        read_recordio(paths, {"path": Raw(), "b": Raw(), "c": Raw()}, include_paths=True)
    with pytest.raises(TypeError, match="field 'image'.*cannot be pickled"):
        read_recordio(paths, {"image": _Unpicklable(), "b": Raw(), "c": Raw()})
    # an .idx that is not this file's: an offset past its end, named with the file
    shutil.copy(root / "a.rec", tmp_path / "short.rec")
    shutil.copy(root / "a.idx", tmp_path / "short.idx")
    os.truncate(tmp_path / "short.rec", 1000)
    with pytest.raises(CorruptRecordError, match=r"lists a record at byte offset \d+, at or past the end") \
            as info:
        read_recordio(str(tmp_path / "short.rec"), FIELDS)
    assert info.value.source == str(tmp_path / "short.rec") and info.value.offset >= 1000
    # records added after the .idx was written: found when its last record is read, whatever on_error says
    # (else they were left out without a word)
    shutil.copy(root / "a.rec", tmp_path / "more.rec")
    shutil.copy(root / "a.idx", tmp_path / "more.idx")
    with RecordWriter(str(tmp_path / "extra.rec")) as w:
        for r in _group(999):
            w.write(r)
    with open(tmp_path / "more.rec", "ab") as f:
        f.write((tmp_path / "extra.rec").read_bytes())
    for on_error in ("raise", "skip"):
        with pytest.raises(CorruptRecordError, match="another record follows it there") as info:
            read_recordio(str(tmp_path / "more.rec"), FIELDS, on_error=on_error, override_num_blocks=3).take_all()
        assert isinstance(info.value, IndexMismatch)
    # bytes inserted after the .idx was written: every later offset is off, each group there failed as a
    # damaged sample and on_error="skip" left out the rest of the file without an error (found by an audit)
    data = (root / "a.rec").read_bytes()
    at = _write(str(tmp_path / "probe.rec"), range(3), indexed=False)[2]  # (where the third group starts)
    (tmp_path / "grown.rec").write_bytes(data[:at] + b"\0" * 12 + data[at:])
    shutil.copy(root / "a.idx", tmp_path / "grown.idx")
    for on_error in ("raise", "skip"):
        with pytest.raises(IndexMismatch, match="12 bytes later too: bytes were inserted into the file after the "
                                                "index was written"):
            read_recordio(str(tmp_path / "grown.rec"), FIELDS, on_error=on_error).take_all()
    # a record count that is not a multiple of the group size
    with pytest.raises(CorruptRecordError, match="not a multiple of the group size 4"):
        read_recordio(paths[0], {**FIELDS, "extra": Raw()})
    # use_index=False: the same file, one streamed task (its last group is then incomplete: read-time error)
    assert RecordIODatasource(paths[0], FIELDS, use_index=False).read_ranges(8) == [(paths[0], None, None)]


class _Unpicklable:
    def __call__(self, payload):
        return payload

    def __reduce__(self):
        raise TypeError("no pickling")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Sample 5 of 9 has an undecodable image: in an indexed file (split into tasks) and in a plain one."""
    root = tmp_path_factory.mktemp("ray-broken")
    out = {}
    for name, indexed in (("idx.rec", True), ("plain.rec", False)):
        path = str(root / name)
        starts = _write(path, range(9), indexed, groups=lambda i: _group(i, b"not a jpeg" if i == 5 else b""))
        out[name] = (path, starts[5])
    return out


@pytest.mark.parametrize("name", ["idx.rec", "plain.rec"])
def test_decode_error_names_file_offset_and_sample(ray_cluster, broken, name):
    path, offset = broken[name]
    with pytest.raises(DecodeError) as info:
        read_recordio(path, FIELDS, override_num_blocks=3).take_all()
    message = str(info.value)
    assert f"field 'image' ({FIELDS['image']!r})" in message
    assert f"(sample 5, byte offset {offset} of {path})" in message
    err = info.value  # Ray's RayTaskError(DecodeError): its attributes are our error's (.cause)
    assert (err.index, err.offset, err.source) == (5, offset, path)
    rows = read_recordio(path, FIELDS, on_error="skip", override_num_blocks=3).take_all()
    assert sorted(r["label"] for r in rows) == [0, 1, 2, 3, 4, 6, 7, 8]


def test_blocks_grow_and_split(ray_cluster, tmp_path):
    """A streamed file of more rows than first allocated, and blocks cut at the target block size."""
    path = str(tmp_path / "many.rec")
    _write(path, range(700), False, groups=lambda i: [str(i).encode()])
    rows = read_recordio(path, ClassLabel()).take_all()
    assert [r["0"] for r in rows] == list(range(700))
    ctx = ray.data.DataContext.get_current()
    before = ctx.target_max_block_size
    ctx.target_max_block_size = 1024                                     # 128 rows of int64
    try:
        ds = read_recordio(path, ClassLabel(), include_offsets=True)
        blocks = [BlockAccessor.for_block(t).to_batch_format("numpy") for t in ray.get(ds.to_arrow_refs())]
    finally:
        ctx.target_max_block_size = before
    assert len(blocks) >= 6 and max(len(b["0"]) for b in blocks) <= 128
    assert sorted(int(v) for b in blocks for v in b["0"]) == list(range(700))


def test_driver_node_only_and_raw_records(ray_cluster, data):
    root, paths, expected = data
    assert not RecordIODatasource(paths[0], None, driver_node_only=True).supports_distributed_reads
    assert RecordIODatasource(paths[0], None).supports_distributed_reads
    rows = read_recordio(paths[1], None, include_offsets=True, driver_node_only=True).take_all()
    assert set(rows[0]) == {"record", "offset"} and len(rows) == 3 * 11        # fields=None: every record
    assert sorted(r["offset"] for r in rows)[::3] == [o for p, o in expected if p == paths[1]]
    with pytest.raises(SourceError, match="local:// URLs are not supported; .*driver_node_only=True"):
        read_recordio("local://" + paths[0], FIELDS)


def test_groups_after_a_corrupt_region_are_realigned_as_parallel_reader_does(ray_cluster, tmp_path):
    """A streamed file with the first record of sample 5 damaged (parrecio/pipeline/resync.py): the
    fields' payload kinds tell the next sample's start, so sample 5 alone is lost, as in ParallelReader;
    with fields that cannot tell ([Raw, Raw, Raw]) the task stops with the damage's offset."""
    path = str(tmp_path / "damaged.rec")
    starts = _write(path, range(10), False)
    data = bytearray(open(path, "rb").read())
    data[starts[5]] ^= 0xFF
    open(path, "wb").write(bytes(data))
    rows = read_recordio(path, FIELDS, on_error="skip").take_all()
    assert sorted(r["label"] for r in rows) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    with ParallelReader(path, FIELDS, workers=0, on_error="skip") as reader:
        assert sorted(int(s["label"]) for s in reader) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    with pytest.raises(CorruptRecordError) as info:
        read_recordio(path, [Raw(), Raw(), Raw()], on_error="skip").take_all()
    assert info.value.offset == starts[5]
    assert "cannot tell which record starts the next sample" in str(info.value)


def test_streamed_file_ending_inside_a_group_as_parallel_reader(ray_cluster, tmp_path):
    """A streamed file whose last group lacks its last record: ``on_error="skip"`` drops that group alone
    (the groups before it byte-equal to ParallelReader's), ``"raise"`` names its offset and sample index,
    as the one group stream words it for every mode."""
    path = str(tmp_path / "cut.rec")
    with RecordWriter(path) as w:
        for i in range(7):
            w.write(f"a{i}".encode())
            w.write(f"b{i}".encode())
        w.write(b"a7")
    rows = read_recordio(path, [Raw(), Raw()], on_error="skip", include_offsets=True).take_all()
    with ParallelReader(path, [Raw(), Raw()], workers=0, on_error="skip") as reader:
        want = [(bytes(a), bytes(b)) for a, b in reader]
    assert sorted((bytes(r["0"]), bytes(r["1"])) for r in rows) == want == [
        (f"a{i}".encode(), f"b{i}".encode()) for i in range(7)]
    with pytest.raises(CorruptRecordError) as info:
        read_recordio(path, [Raw(), Raw()]).take_all()
    assert "inside a group: 1 of 2 records" in str(info.value)
    assert info.value.index == 7 and info.value.offset == 7 * 2 * 12


def test_json_ints_past_int64_keep_their_values(ray_cluster, tmp_path):
    """A Json() field whose integers pass int64 (a uint64 hash, an id): numpy made the block's column float64
    -- 9223372036854775813 came back 9.223372036854776e+18, and the other ints floats -- when they shared
    a block; one per block, they were exact.  Now such a column is of objects, as ray.data.from_items makes
    it, and ints within int64 stay an int64 column."""
    path = tmp_path / "j.rec"
    values = [1, 2, 2**63 + 5, 3, 2**64 - 1]  # (orjson reads ints up to uint64; past that, floats)
    with RecordWriter(str(path)) as w:
        for v in values:
            w.write(str(v).encode())
    rows = read_recordio(str(path), Json(), override_num_blocks=1).take_all()
    got = [r[next(iter(r))] for r in rows]
    assert got == values and all(type(v) is int for v in got)
    assert got == [v["item"] for v in ray.data.from_items(values).take_all()]
    small = tmp_path / "s.rec"
    with RecordWriter(str(small)) as w:
        for v in (1, 2, 3):
            w.write(str(v).encode())
    batch = next(iter(read_recordio(str(small), Json(), override_num_blocks=1).iter_batches(batch_format="numpy")))
    column = next(iter(batch.values()))
    assert column.dtype == np.int64 and column.tolist() == [1, 2, 3]
