"""Real-size runs: JPEG-sized records, more than three laps of the default 64 MiB input ring per epoch,
through every way a group reaches the decoders, each checked exactly once, byte for byte, in the order
``workers=0`` gives with the same seed, for two epochs.

- ``test_ring_laps_local``: ~220 MB of ``[~100 KB payload][JSON]`` groups from a local file: unshuffled
  (mapped, read in place: the control), through the shuffle buffer (no ``.idx``) and through the global
  index permutation (``.idx`` beside the file); ``fields=[Raw(), Json()]``, ``workers=2`` against 0.
- ``test_ring_laps_s3``: the same groups as an ``s3://`` prefix of four objects cut at group
  boundaries, on moto's S3 server (127.0.0.1), unshuffled (streamed into the ring) and shuffled (the
  shuffle buffer: no ``.idx`` objects).
- ``test_manifest_images`` / ``test_manifest_raw_json``: the reproduction of the issue -- 1000 ~100 KB
  JPEG photographs as ``[JPEG][Ground Truth boxes JSON]`` groups (~100 MB), ``manifest.rec`` with and
  without a ``.idx``, ``ParallelReader('manifest.rec', fields=[Image(size=224), BoundingBoxes()],
  workers=2, batch_size=64, shuffle=True)`` (the first pass died with ``PipelineError: the reader
  process failed on 'manifest.rec': ValueError: memoryview assignment: lvalue and rvalue have different
  structures``), shuffled and not, and with ``fields=[Raw(), Json()]``.  Decoding is the costly part, so
  ``workers=0`` decodes the 1000 images once (``inline_pixels``: a digest of each array, and four
  compared with ``np.array_equal`` to the decoder called directly) and gives each case its order with
  ``[Raw(), Json()]`` (the order is the plan's, whatever the fields; a group's pixels depend on its bytes
  only); each ``workers=2`` sample is compared with both.  (Before the fix the crash needed the ring
  nearly drained when its head passed 16 MiB: the ``[Raw(), Json()]`` cases hit it on every run, the
  image cases, where the decoders are the bottleneck and the ring stays full, did not here;
  ``tests/test_ring.py`` pins the allocator itself.)

Every case: each group once per epoch, each delivered pair belongs together (ids in the payload or the
pixels, and in the label), the order of ``workers=0`` (and, where documented, of the plan: stream order,
the ``(seed, epoch)`` permutation), different orders in the two shuffled epochs, no re-run or replaced
worker, nothing left behind (``no_leaks``).  The data is generated here, once per module, never committed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import types

import numpy as np
import pytest

from parrecio import ParallelReader
from parrecio.decoders import BoundingBoxes, Image, Json, Raw
from parrecio.pipeline.plan import indexed_order
from source_helpers import moto_endpoint, use_moto
from real_scale_helpers import RING, LapData, Manifest, exactly_once, first_difference, group_slices, read_stamp

SEED = 7
EPOCHS = 2
SHUFFLE_BUFFER = 1024   # ParallelReader's default
BUCKET = "parrecio-real-scale"


# -- data ----------------------------------------------------------------------------------------------
def _link(src, dst) -> None:
    try:
        os.link(src, dst)      # the same bytes under another name, without an .idx beside it
    except OSError:
        shutil.copyfile(src, dst)


@pytest.fixture(scope="module")
def laps(tmp_path_factory):
    """~220 MB of [payload][label] groups: ``indexed/data.rec`` + ``data.idx`` and ``plain/data.rec``."""
    data = LapData()
    assert data.total >= 3.2 * RING  # an epoch laps the default ring more than three times
    root = tmp_path_factory.mktemp("laps")
    (root / "indexed").mkdir()
    (root / "plain").mkdir()
    starts = data.write(str(root / "indexed" / "data.rec"), str(root / "indexed" / "data.idx"))
    _link(root / "indexed" / "data.rec", root / "plain" / "data.rec")
    return types.SimpleNamespace(data=data, starts=starts, plain=str(root / "plain" / "data.rec"),
                                 indexed=str(root / "indexed" / "data.rec"))


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """1000 [JPEG ~100 KB][boxes JSON] groups: ``idx/manifest.rec`` + ``manifest.idx`` and
    ``plain/manifest.rec``."""
    data = Manifest()
    root = tmp_path_factory.mktemp("manifest")
    (root / "idx").mkdir()
    (root / "plain").mkdir()
    data.write(str(root / "idx" / "manifest.rec"), str(root / "idx" / "manifest.idx"))
    assert 90e6 < sum(data.sizes) < 120e6 and min(data.sizes) > 80_000
    _link(root / "idx" / "manifest.rec", root / "plain" / "manifest.rec")
    return types.SimpleNamespace(data=data, plain=str(root / "plain" / "manifest.rec"),
                                 indexed=str(root / "idx" / "manifest.rec"))


# -- S3 on moto (as tests/test_sources_s3.py) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def moto_url():
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    yield from moto_endpoint()


@pytest.fixture(scope="module")
def s3_laps(moto_url, laps):
    """The lap data as ``s3://parrecio-real-scale/laps/part-{0..3}.rec``, cut at group boundaries (no
    ``.idx`` objects: shuffling uses the shuffle buffer)."""
    import boto3
    from botocore.config import Config
    try:  # no CRC of 220 MB on both sides where botocore computes one by default (>= 1.36)
        config = Config(request_checksum_calculation="when_required")
    except TypeError:
        config = None
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing", config=config)
    client.create_bucket(Bucket=BUCKET)
    with open(laps.indexed, "rb") as f:
        for k, (begin, end) in enumerate(group_slices(laps.starts, 4)):
            f.seek(begin)
            client.put_object(Bucket=BUCKET, Key=f"laps/part-{k}.rec", Body=f.read(end - begin))
    return f"s3://{BUCKET}/laps/"


@pytest.fixture
def aws(moto_url, monkeypatch, tmp_path):
    """The standard AWS configuration pointing at moto, and nothing of the machine's."""
    use_moto(monkeypatch, moto_url, tmp_path)


# -- running and checking ----------------------------------------------------------------------------------
def read_laps(channel, data: LapData, *, workers: int, shuffle: bool):
    """Two epochs of ``(Raw, Json)`` samples, each checked against the data set as it comes: per epoch
    the ids in delivery order; the stats, the config and ``len(reader)`` after the first pass."""
    orders = []
    with ParallelReader(channel, fields=[Raw(), Json()], workers=workers, shuffle=shuffle, seed=SEED) as reader:
        for epoch in range(EPOCHS):
            assert reader.epoch == epoch
            orders.append([data.check(raw, label) for raw, label in reader])
            if epoch == 0:
                length = len(reader)
        return orders, reader.stats, reader.config, length


def check_orders(orders, reference, n: int, mode) -> None:
    """Each epoch: every group once, the order of ``workers=0``, the order the plan documents."""
    for epoch, ids in enumerate(orders):
        msg = exactly_once(ids, n)
        assert not msg, f"epoch {epoch}: {msg}"
        msg = first_difference(ids, reference[epoch])
        assert not msg, f"epoch {epoch}: the order is not that of workers=0 with the same seed: {msg}"
        if mode is None:
            assert ids == list(range(n)), f"epoch {epoch}: not in stream order: {first_difference(ids, range(n))}"
        elif mode == "index":  # the global permutation drawn from (seed, epoch)
            plan = [g for _, g in indexed_order([n], shuffle=True, seed=SEED, epoch=epoch, num_shards=1,
                                                shard_index=0, even=None)]
            msg = first_difference(ids, plan)
            assert not msg, f"epoch {epoch}: not the permutation of (seed, epoch): {msg}"
        else:  # a shuffle buffer: a group leaves it at the earliest when it is read
            assert ids != list(range(n))
            late = [(p, g) for p, g in enumerate(ids) if g > p + SHUFFLE_BUFFER]
            assert not late, f"epoch {epoch}: groups out before the shuffle buffer had read them: {late[:5]}"
    if mode is not None:
        assert orders[0] != orders[1], "both shuffled epochs in the same order"


def check_stats(stats, n: int, *, records: int, nbytes: int) -> None:
    assert stats.epochs == EPOCHS
    assert stats.samples == EPOCHS * n
    assert stats.records == EPOCHS * records
    assert stats.bytes == EPOCHS * nbytes
    assert (stats.skipped, stats.skipped_records, stats.sharded_out) == (0, 0, 0)
    assert (stats.reruns, stats.workers_replaced) == (0, 0), stats


def check_laps(name: str, data: LapData, orders, ref, stats, config, length, mode, *, stream: bool) -> None:
    """The common checks of a lap test (``stream``: the source is read into ring windows)."""
    n = data.n
    assert config.shuffle_mode == mode
    assert length == n
    check_orders(orders, ref, n, mode)
    check_stats(stats, n, records=2 * n, nbytes=data.total_bytes)
    ring = config.ring_bytes  # 64 MiB unless /dev/shm is short of it (then smaller: more laps)
    assert ring <= RING
    laps = data.total_bytes / ring
    copied = stats.reader_copied_bytes
    if mode == "buffer":  # every group copied into the ring once, from the shuffle buffer
        assert copied == EPOCHS * data.total_bytes, f"{name}: {copied} bytes copied"
    elif mode == "index":  # every group read by its offsets and placed in the ring (at most one copy)
        assert 3 * EPOCHS * ring <= copied <= EPOCHS * data.total_bytes, f"{name}: {copied} bytes copied"
    else:  # read in place: a mapped file, or a stream read straight into ring windows
        assert copied == 0, f"{name}: {copied} bytes copied, expected none"
    if mode is not None or stream:
        assert laps >= 3, f"{name}: {laps:.2f} laps of a {ring} B ring per epoch"


LOCAL = {"unshuffled": (False, None, "plain"), "shuffle-buffer": (True, "buffer", "plain"),
         "index-shuffle": (True, "index", "indexed")}


@pytest.mark.parametrize("case", list(LOCAL))
def test_ring_laps_local(laps, case, no_leaks):
    """~220 MB a pass from a local file, two epochs, workers=2 against workers=0."""
    shuffle, mode, which = LOCAL[case]
    path = getattr(laps, which)
    ref, _, ref_config, _ = read_laps(path, laps.data, workers=0, shuffle=shuffle)
    assert ref_config.shuffle_mode == mode
    orders, stats, config, length = read_laps(path, laps.data, workers=2, shuffle=shuffle)
    check_laps(case, laps.data, orders, ref, stats, config, length, mode, stream=False)


@pytest.mark.parametrize("shuffle", [False, True], ids=["unshuffled", "shuffle-buffer"])
def test_ring_laps_s3(s3_laps, aws, laps, shuffle, no_leaks):
    """The same groups as an s3:// prefix of four objects: streamed into the ring (unshuffled), or
    through the shuffle buffer (no .idx objects), two epochs, workers=2 against workers=0."""
    mode = "buffer" if shuffle else None
    ref, _, ref_config, _ = read_laps(s3_laps, laps.data, workers=0, shuffle=shuffle)
    assert ref_config.shuffle_mode == mode and not ref_config.index_paths
    orders, stats, config, length = read_laps(s3_laps, laps.data, workers=2, shuffle=shuffle)
    check_laps(f"s3 {mode}", laps.data, orders, ref, stats, config, length, mode, stream=True)


# -- the reproduction ---------------------------------------------------------------------------------
def snippet(path, workers: int, shuffle: bool, fields) -> ParallelReader:
    """ParallelReader('manifest.rec', fields=..., workers=2, batch_size=64, shuffle=True), as reported."""
    return ParallelReader(path, fields=fields, workers=workers, batch_size=64, shuffle=shuffle, seed=SEED)


MANIFEST = {"plain-shuffled": ("plain", True, "buffer"), "idx-shuffled": ("indexed", True, "index"),
            "plain-unshuffled": ("plain", False, None)}


def image_digest(image: np.ndarray) -> bytes:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).digest()


def check_image(data: Manifest, image, boxes, where: str) -> int:
    """The id of a delivered (image, boxes) sample: boxes exactly those of its label, the image the one
    stamped with the same id."""
    assert boxes.dtype == np.float32 and boxes.ndim == 2 and len(boxes), f"{where}: {boxes!r}"
    i = int(boxes[0, 0])
    assert 0 <= i < data.n and np.array_equal(boxes, data.boxes(i)), f"{where}: {boxes}"
    assert read_stamp(image) == i, f"{where}: the image of group {read_stamp(image)} with the boxes of {i}"
    return i


@pytest.fixture(scope="module")
def inline_pixels(manifest):
    """workers=0's decoded images, one pass of the snippet (unshuffled): image digest per id.  A
    group's pixels depend on its bytes only (no random decoder), not on its position, epoch or file."""
    data = manifest.data
    decode = Image(size=224)
    digests = {}
    with snippet(manifest.plain, 0, False, [Image(size=224), BoundingBoxes()]) as reader:
        for b, (images, boxes) in enumerate(reader):
            for k, (image, box) in enumerate(zip(images, boxes)):
                i = check_image(data, image, box, f"workers=0 batch {b} sample {k}")
                if b == 0 and k < 4:  # the decoder's own result, called directly, pixel for pixel
                    assert np.array_equal(image, decode(data.jpeg(i)))
                digests[i] = image_digest(image)
    assert sorted(digests) == list(range(data.n))
    return digests


def inline_orders(path, shuffle: bool, n: int):
    """The ids workers=0 delivers in two epochs of the snippet with the same seed (fields=[Raw(), Json()]:
    the order is the plan's, whatever the fields)."""
    orders = []
    with snippet(path, 0, shuffle, [Raw(), Json()]) as reader:
        for _ in range(EPOCHS):
            orders.append([label["annotations"][0]["class_id"] for _, labels in reader for label in labels])
    return orders


@pytest.mark.parametrize("case", list(MANIFEST))
def test_manifest_images(manifest, inline_pixels, case, no_leaks):
    """The snippet: [Image(size=224), BoundingBoxes()], workers=2, batch_size=64, 1000 ~100 KB JPEGs,
    two epochs: every group once per epoch with its own boxes, the pixels workers=0 decodes (sha256 of the
    array), in the order of workers=0 with the same seed; full batches of 64 and the short last one."""
    which, shuffle, mode = MANIFEST[case]
    data, n = manifest.data, manifest.data.n
    path = getattr(manifest, which)
    orders = []
    with snippet(path, 2, shuffle, [Image(size=224), BoundingBoxes()]) as reader:
        assert reader.config.shuffle_mode == mode
        for epoch in range(EPOCHS):
            ids: list = []
            sizes = []
            for b, (images, boxes) in enumerate(reader):
                assert images.shape == (len(boxes), 224, 224, 3) and images.dtype == np.uint8
                for k, (image, box) in enumerate(zip(images, boxes)):
                    where = f"epoch {epoch} batch {b} sample {k}"
                    i = check_image(data, image, box, where)
                    assert image_digest(image) == inline_pixels[i], \
                        f"{where}: group {i}'s pixels differ from workers=0's"
                    ids.append(i)
                sizes.append(len(boxes))
            assert sizes == [64] * (n // 64) + [n % 64]
            orders.append(ids)
            if epoch == 0:
                assert len(reader) == len(sizes)
        stats = reader.stats
    check_orders(orders, inline_orders(path, shuffle, n), n, mode)
    check_stats(stats, n, records=2 * n, nbytes=data.total_bytes)


@pytest.mark.parametrize("which", ["plain", "indexed"], ids=["plain-shuffled", "idx-shuffled"])
def test_manifest_raw_json(manifest, which, no_leaks):
    """The same manifest with fields=[Raw(), Json()], shuffled, two epochs: each JPEG byte for byte
    (sha256) with its own label, in the order of workers=0."""
    data, n = manifest.data, manifest.data.n
    path = getattr(manifest, which)
    runs = {}
    for workers in (0, 2):
        orders = []
        with snippet(path, workers, True, [Raw(), Json()]) as reader:
            for epoch in range(EPOCHS):
                ids = []
                for raws, labels in reader:
                    assert len(raws) == len(labels) <= 64
                    for raw, label in zip(raws, labels):
                        i = label["annotations"][0]["class_id"]
                        assert label == data.label(i)
                        assert hashlib.sha256(raw).digest() == data.digests[i], f"group {i}: not its JPEG"
                        ids.append(i)
                orders.append(ids)
            runs[workers] = orders, reader.stats, reader.config
    orders, stats, config = runs[2]
    check_orders(orders, runs[0][0], n, config.shuffle_mode)
    check_stats(stats, n, records=2 * n, nbytes=data.total_bytes)
    assert config.shuffle_mode == ("index" if which == "indexed" else "buffer")
