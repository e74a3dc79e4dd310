"""Local Pipe-mode emulation: SageMaker wrapper framing, augmented manifests, and ``parrecio pipe-serve``."""

import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from parrecio import Tuning
from parrecio.cli.main import main
from parrecio.errors import SourceError
from parrecio.recordio import RecordReader, RecordWriter
from parrecio.recordio.framing import MAGIC_BYTES
from parrecio.recordio.wrapper import encode_sagemaker_record, write_sagemaker_recordio
from parrecio.sources import resolve
from parrecio.tools.emulate import EpochRecords, serve_pipe_channel
from parrecio.tools.manifest import iter_manifest_records
from recordio_helpers import frame
from source_helpers import (frame_flags, make_jpeg, make_payloads, read_epoch, records_of, wait_for_path,
                            write_rec)

N_IMAGES = 12


def wrapped(payloads, split_bytes=None) -> bytes:
    out = io.BytesIO()
    write_sagemaker_recordio(payloads, out, split_bytes)
    return out.getvalue()


# -- framing ---------------------------------------------------------------------------------------------

def test_wrapper_framing_exact_bytes():
    head = lambda cflag, n: MAGIC_BYTES + ((cflag << 29) | n).to_bytes(4, "little")  # noqa: E731
    assert wrapped([b"abcde"], split_bytes=2) == (
        head(1, 2) + b"ab\0\0" + head(2, 2) + b"cd\0\0" + head(3, 1) + b"e\0\0\0")
    assert wrapped([b"", b"abcd"], split_bytes=4) == head(0, 0) + head(0, 4) + b"abcd"
    payloads = make_payloads(20, seed=1)  # no magic inside: the same bytes as MXNet's writer
    out = io.BytesIO()
    with RecordWriter(out) as writer:
        for p in payloads:
            writer.write(p)
    assert wrapped(payloads) == out.getvalue()
    with pytest.raises(ValueError, match="split_bytes"):
        list(encode_sagemaker_record(b"x", 0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=70), max_size=8), st.integers(1, 30), st.integers(0, 3))
def test_wrapper_framing_round_trips_with_concat_join(payloads, split, magic_at):
    payloads = [p[:magic_at * 4] + MAGIC_BYTES + p[magic_at * 4:] if i % 2 else p for i, p in enumerate(payloads)]
    data = wrapped(payloads, split_bytes=split)
    assert records_of(data, join="concat") == payloads  # no magic dropped, parts concatenated
    assert all(length <= split for _, length in frame_flags(data))


# -- manifests -------------------------------------------------------------------------------------------

@pytest.fixture
def dataset(tmp_path):
    """An augmented manifest of real JPEGs (refs relative, absolute and file://) with GT bounding boxes."""
    (tmp_path / "imgs").mkdir()
    jpegs, boxes, lines = [], [], []
    for i in range(N_IMAGES):
        jpeg = make_jpeg(i, size=(30 + 7 * i, 20 + 3 * i))
        (tmp_path / "imgs" / f"img{i}.jpg").write_bytes(jpeg)
        ref = [f"imgs/img{i}.jpg", str(tmp_path / "imgs" / f"img{i}.jpg"),
               f"file://{tmp_path}/imgs/img{i}.jpg"][i % 3]
        box = {"image_size": [{"width": 30 + 7 * i, "height": 20 + 3 * i, "depth": 3}],
               "annotations": [{"class_id": i % 3, "left": i, "top": 2, "width": 10, "height": 5 + i}]}
        meta = {"class-map": {"0": "cat", "1": "dog", "2": "bird"}, "type": "groundtruth/object-detection"}
        lines.append(json.dumps({"source-ref": ref, "bounding-box": box, "bounding-box-metadata": meta}))
        jpegs.append(jpeg)
        boxes.append(orjson.dumps(box))
    manifest = tmp_path / "train.manifest"
    manifest.write_text("\n".join(lines[:5]) + "\n\n" + "\n".join(lines[5:]) + "\n")  # a blank line: skipped
    return manifest, jpegs, boxes


def expected(jpegs, boxes, order=None):
    order = range(len(jpegs)) if order is None else order
    return [rec for i in order for rec in (jpegs[i], boxes[i])]


def test_iter_manifest_records(dataset):
    manifest, jpegs, boxes = dataset
    assert list(iter_manifest_records(str(manifest), ["source-ref", "bounding-box"])) == expected(jpegs, boxes)
    assert jpegs[0].startswith(b"\xff\xd8") and json.loads(boxes[1])["annotations"][0]["class_id"] == 1
    meta = list(iter_manifest_records(str(manifest), ["bounding-box-metadata"], order=[3]))
    assert meta == [orjson.dumps({"class-map": {"0": "cat", "1": "dog", "2": "bird"},
                                  "type": "groundtruth/object-detection"})]


def test_manifest_values_keep_integers_beyond_64_bits(tmp_path):
    """orjson reads an integer beyond 64 bits as a float: the records said 1.2345678901234568e+29 where the
    manifest said 123456789012345678901234567890 (an id of a labelling job, say)."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": 123456789012345678901234567890, "label": {"k": [-18446744073709551617, 1.5]}}\n'
                        '{"id": 7, "label": {"k": [18446744073709551615, "\u00e9"]}}\n')
    got = list(iter_manifest_records(str(manifest), ["id", "label"]))
    assert got == [b"123456789012345678901234567890", b'{"k":[-18446744073709551617,1.5]}',
                   b"7", orjson.dumps({"k": [18446744073709551615, "\u00e9"]})]
    # 19 digits below -2**63 (orjson: -9.223372036854776e+18); -2**63 itself and 2**64 - 1 are ints to it
    manifest.write_text('{"id": -9223372036854775809, "label": [-9999999999999999999, -9223372036854775808]}\n')
    assert list(iter_manifest_records(str(manifest), ["id", "label"])) == [
        b"-9223372036854775809", b"[-9999999999999999999,-9223372036854775808]"]


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_reference_to_what_is_no_regular_file_is_refused_by_name(tmp_path, kind):
    """A FIFO referenced by a manifest (or listed by pack list) was opened and read: it waited for a writer
    for ever, printing nothing; /dev/zero would be read until memory ran out."""
    import os
    from parrecio.tools import pack as pack_tool
    target = tmp_path / "p.jpg"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        target = "/dev/zero"
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"source-ref": str(target)}) + "\n")
    what = {"fifo": "a FIFO", "folder": "a folder", "device": "a character device"}[kind]
    with pytest.raises(SourceError, match=rf"line 1: cannot read source-ref .*: not a regular file \({what}\)"):
        list(iter_manifest_records(str(manifest), ["source-ref"]))
    with pytest.raises(SourceError, match=rf"cannot read image {target}: not a regular file \({what}\)"):
        pack_tool._read_file(str(target))


@pytest.mark.parametrize("line, names, message", [
    ('{"source-ref": "s3://bucket/a.jpg"}', ["source-ref"], "line 1: source-ref: cannot fetch 's3://bucket/a.jpg': "
                                                            "only local files are read here"),
    ('{"source-ref": "file://host/a.jpg"}', ["source-ref"], "line 1: source-ref: cannot read 'file://host/a.jpg'"),
    ('{"source-ref": "missing.jpg"}', ["source-ref"], "line 1: cannot read source-ref 'missing.jpg'"),
    ('{"source-ref": 3}', ["source-ref"], "should be a path or URL string"),
    ('{"a": 1}', ["a", "b"], "line 1: no attribute 'b' \\(the line has 'a'\\)"),
    ('{"a": 1', ["a"], "line 1: not valid JSON"),
    ('[1, 2]', ["a"], "expected a JSON object"),
])
def test_manifest_errors_name_the_line(tmp_path, line, names, message):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(line + "\n")
    with pytest.raises(SourceError, match=message):
        list(iter_manifest_records(str(manifest), names))


def test_manifest_needs_attribute_names(dataset):
    manifest, _, _ = dataset
    with pytest.raises(SourceError, match="needs attribute names"):
        EpochRecords([str(manifest)])


# -- pipe-serve --------------------------------------------------------------------------------------------

def pipe_serve(root, *args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "parrecio.cli", "pipe-serve", "--root", str(root), *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen) -> str:
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return err.decode()


def read_served_epochs(root, epochs, channel="train"):
    """The raw bytes of each served epoch, read through resolve() like a training script would."""
    wait_for_path(root / "config" / "inputdataconfig.json")
    source = resolve(channel, sm_input_dir=str(root), fifo_timeout=20)
    assert source.default_join == "concat"
    return [read_epoch(source, e)[0][1] for e in range(epochs)]


def test_pipe_serve_manifest_two_epochs_multipart(dataset, tmp_path):
    manifest, jpegs, boxes = dataset
    root = tmp_path / "sm"
    proc = pipe_serve(root, "--channel", "train", "--epochs", 2, "--split-bytes", 200,
                      "--attribute-names", "source-ref,bounding-box", manifest)
    try:
        raws = read_served_epochs(root, 2)
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    for raw in raws:
        assert [bytes(r.payload) for r in RecordReader(io.BytesIO(raw), join="concat")] == expected(jpegs, boxes)
        flags = frame_flags(raw)
        assert {1, 2, 3} <= {cflag for cflag, _ in flags} and max(n for _, n in flags) <= 200
    config = json.loads((root / "config" / "inputdataconfig.json").read_text())
    assert config["train"]["TrainingInputMode"] == "Pipe" and config["train"]["RecordWrapperType"] == "RecordIO"
    assert (root / "config" / "resourceconfig.json").exists()
    assert os.listdir(root / "data") == []  # every FIFO removed
    assert "epoch 1: wrote" in err


def test_pipe_serve_shuffle_is_a_seeded_permutation_per_epoch(dataset, tmp_path):
    manifest, jpegs, boxes = dataset
    root = tmp_path / "sm"
    proc = pipe_serve(root, "--epochs", 2, "--shuffle", "--seed", 7, "--split-bytes", 300, "--quiet",
                      "--attribute-names", "source-ref,bounding-box", manifest)
    try:
        raws = read_served_epochs(root, 2)
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    orders = []
    for raw in raws:
        records = records_of(raw, join="concat")
        order = [jpegs.index(jpeg) for jpeg in records[::2]]
        assert sorted(order) == list(range(N_IMAGES))
        assert records == expected(jpegs, boxes, order)  # each image keeps its own boxes
        orders.append(order)
    assert orders[0] != orders[1]
    for epoch, order in enumerate(orders):  # reproducible: epoch e is random.Random(seed + e)
        perm = list(range(N_IMAGES))
        random.Random(7 + epoch).shuffle(perm)
        assert order == perm


@pytest.mark.parametrize("shuffle", [False, True])
def test_serve_rec_files_rewrapped(tmp_path, shuffle):
    a, b = make_payloads(30, seed=1, hi=400), make_payloads(20, seed=2, hi=400)
    a[3] = b"head" + MAGIC_BYTES + b"tail"  # MXNet's writer splits here; served whole again
    write_rec(tmp_path / "a.rec", a)
    write_rec(tmp_path / "b.rec", b)
    root = tmp_path / "sm"
    thread = threading.Thread(target=serve_pipe_channel, daemon=True, args=(
        str(root), "val", [str(tmp_path / "a.rec"), str(tmp_path / "b.rec")]),
        kwargs=dict(epochs=2, shuffle=shuffle, seed=3, split_bytes=64))
    thread.start()
    raws = read_served_epochs(root, 2, channel="val")
    thread.join(10)
    epochs = [records_of(raw, join="concat") for raw in raws]
    if shuffle:
        assert sorted(epochs[0]) == sorted(a + b) and epochs[0] != epochs[1] and epochs[0] != a + b
    else:
        assert epochs == [a + b, a + b]


def test_reader_closing_early_ends_only_that_epoch(tmp_path):
    big = [bytes([65 + i]) * 200_000 for i in range(5)]  # more than a pipe buffer
    write_rec(tmp_path / "big.rec", big)
    root = tmp_path / "sm"
    log = []
    thread = threading.Thread(target=serve_pipe_channel, daemon=True,
                              args=(str(root), "train", [str(tmp_path / "big.rec")]),
                              kwargs=dict(epochs=2, log=log.append))
    thread.start()
    wait_for_path(root / "config" / "inputdataconfig.json")
    source = resolve("train", sm_input_dir=str(root), fifo_timeout=20)
    [stream] = source.streams(0)
    with stream.file as f:
        assert f.read(100)[8:100] == b"A" * 92
    assert records_of(read_epoch(source, 1)[0][1], join="concat") == big
    thread.join(10)
    assert not thread.is_alive() and "epoch 0: the reader closed early" in log


def test_an_interrupted_epoch_ends_inside_a_record(tmp_path):
    """pipe-serve stopped mid-epoch (Ctrl-C, SIGTERM) flushed the whole records it had buffered: the
    FIFO ended at a record boundary and the reader saw an epoch that looked complete (266 of 400
    records, no error).  It now ends inside a record: the reader says the stream was cut short."""
    from parrecio.errors import CorruptRecordError
    from parrecio.tools.emulate import _serve_epoch
    fifo = tmp_path / "train_0"
    os.mkfifo(fifo)
    recs = make_payloads(50, seed=4, hi=500)

    def interrupted():
        yield from recs[:20]
        raise KeyboardInterrupt
    errors = []

    def serve():
        try:
            _serve_epoch(str(fifo), interrupted(), None)
        except KeyboardInterrupt as exc:
            errors.append(exc)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with open(fifo, "rb") as f:
        data = f.read()
    thread.join(10)
    assert errors and data.startswith(b"".join(b"".join(encode_sagemaker_record(r)) for r in recs[:20]))
    got = []
    with pytest.raises(CorruptRecordError, match="truncated"):
        for _, view in RecordReader(io.BytesIO(data), join="concat").iter_views():
            got.append(bytes(view))
    assert got == recs[:20]


@pytest.mark.parametrize("split", [None, 7])
def test_an_epoch_interrupted_at_any_byte_ends_inside_a_frame(split):
    """The interrupt came after a frame head had gone out (a 1-byte label's): the magic written to end the
    epoch inside a record became that record's payload and padding, and the epoch looked whole, its last
    label b'\\n'.  Now what the FIFO took is known to the byte: at a frame's end the buffered frames and
    the magic follow, inside one nothing does.  Interrupted at every byte of the stream, through writes
    that take at most 5 bytes: the reader gets a prefix of the records, then the truncation error."""
    from parrecio.errors import CorruptRecordError
    from parrecio.tools.epoch_writer import EpochWriter
    recs = [b"", b"a", b"bc", b"def", b"ghij", b"klmno", b"\x0a\x23\xd7\xce" * 3, bytes(range(40)), b"z"]
    whole = b"".join(b"".join(encode_sagemaker_record(r, split)) for r in recs)
    for cut in range(len(whole)):
        out = bytearray()
        armed = [True]

        def write(fd, view):
            if armed[0] and len(out) == cut:
                armed[0] = False
                raise KeyboardInterrupt  # (a signal: os.write raises and took nothing)
            n = min(len(view), 5, cut - len(out)) if armed[0] else len(view)
            out.extend(view[:n])
            return n
        w = EpochWriter(-1, 16, write)
        with pytest.raises(KeyboardInterrupt):
            try:
                w.write_records(recs, split)
            except KeyboardInterrupt:
                w.cut_short()
                raise
        assert bytes(out[:cut]) == whole[:cut]
        got = []
        with pytest.raises(CorruptRecordError, match="truncated"):
            for _, view in RecordReader(io.BytesIO(bytes(out)), join="concat").iter_views():
                got.append(bytes(view))
        assert got == recs[:len(got)], cut


def test_pipe_serve_refuses_bad_sources_before_it_serves(tmp_path):
    """A manifest line naming a missing file, or a source that is no RecordIO: refused at once, with the
    line or the file named; it used to surface only after a reader opened the FIFO, as a stream cut
    short on the reader's side (the cause on pipe-serve's stderr), or never, with no reader."""
    (tmp_path / "ok.jpg").write_bytes(make_jpeg(1))
    (tmp_path / "bad.manifest").write_text(
        json.dumps({"source-ref": "ok.jpg", "label": 1}) + "\n"
        + json.dumps({"source-ref": "nope.jpg", "label": 2}) + "\n")
    (tmp_path / "pic.jpg").write_bytes(make_jpeg(1))
    damaged = bytearray(frame(b"x" * 12) + frame(b"second"))
    damaged[:4] = b"\0\0\0\0"  # (a RecordIO file whose first magic is lost: it was called no RecordIO)
    (tmp_path / "damaged.rec").write_bytes(damaged)
    for args, message in (
            ((tmp_path / "damaged.rec",), "damaged.rec: the file's start is damaged, but RecordIO records follow "
                                          "(a frame head at byte offset 20); pipe-serve serves whole records"),
            (("--attribute-names", "source-ref,label", tmp_path / "bad.manifest"),
             f"bad.manifest line 2: cannot read source-ref 'nope.jpg' ({tmp_path / 'nope.jpg'}): no such file"),
            (("--attribute-names", "source-ref,missing", tmp_path / "bad.manifest"),
             "bad.manifest line 1: no attribute 'missing'"),
            ((tmp_path / "pic.jpg",), "pic.jpg: not a RecordIO stream")):
        root = tmp_path / "sm"
        proc = pipe_serve(root, *args)
        err = finish(proc)
        assert proc.returncode == 1 and message in err and "Traceback" not in err, err
        assert not (root / "data").exists() or os.listdir(root / "data") == []


def test_pipe_serve_sigterm_while_waiting_removes_the_fifo(tmp_path):
    write_rec(tmp_path / "x.rec", [b"x"])
    root = tmp_path / "sm"
    proc = pipe_serve(root, "--epochs", 3, tmp_path / "x.rec")
    try:
        wait_for_path(root / "data" / "train_0")
        proc.send_signal(signal.SIGTERM)
    finally:
        err = finish(proc)
    assert proc.returncode == 130 and "interrupted" in err
    assert os.listdir(root / "data") == []


def test_a_second_pipe_serve_of_a_channel_is_refused_and_the_first_serves_on(tmp_path):
    """A second server of the same channel removed the first one's FIFO as a stale one, and the first
    waited for a reader for ever.  Now it is refused by name; another channel of the same root is served."""
    write_rec(tmp_path / "x.rec", [b"x", b"yz"])
    root = tmp_path / "sm"
    served = [b"".join(b"".join(encode_sagemaker_record(r)) for r in (b"x", b"yz"))]
    first = pipe_serve(root, tmp_path / "x.rec")
    other = None
    try:
        wait_for_path(root / "data" / "train_0")
        second = pipe_serve(root, tmp_path / "x.rec")
        err = finish(second)
        assert second.returncode == 1 and err.strip() == (
            f"parrecio pipe-serve: error: channel 'train' under {root} is served already (another "
            f"pipe-serve): serve each channel once"), err
        other = pipe_serve(root, "--channel", "validation", tmp_path / "x.rec")
        wait_for_path(root / "data" / "validation_0")
        assert read_served_epochs(root, 1, "validation") == served
        assert read_served_epochs(root, 1) == served
    finally:
        for proc in (first, other):  # (each ends, also when an assertion above failed)
            if proc is not None:
                finish(proc)
    assert first.returncode == 0 and other.returncode == 0


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["pipe-serve", "--root", str(tmp_path), str(tmp_path / "nothing.rec")]) == 1
    assert "parrecio pipe-serve: error: no such file or directory" in capsys.readouterr().err
    assert main(["pipe-serve", "--root", str(tmp_path), "--channel", "bad/name", str(tmp_path)]) == 1
    assert main([]) == 2
    with pytest.raises(SystemExit):
        main(["--version"])


def test_parallel_reader_end_to_end_on_a_served_channel(dataset, tmp_path):
    """pipe-serve -> ParallelReader("train"): two epochs of (JPEG bytes, boxes), in order, multipart joined."""
    from parrecio import ParallelReader
    from parrecio.decoders.basic import Json, Raw

    manifest, jpegs, boxes = dataset
    root = tmp_path / "sm"
    proc = pipe_serve(root, "--epochs", 2, "--split-bytes", 256, "--quiet",
                      "--attribute-names", "source-ref,bounding-box", manifest)
    try:
        wait_for_path(root / "config" / "inputdataconfig.json")
        with ParallelReader("train", fields=[Raw(), Json()], workers=1, sm_input_dir=str(root),
                            fifo_timeout=20) as reader:
            epochs = [list(reader), list(reader)]
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    for samples in epochs:
        assert [jpeg for jpeg, _ in samples] == jpegs
        assert [orjson.dumps(box) for _, box in samples] == boxes


def test_parallel_reader_breaks_epoch_0_then_reads_epoch_1_decoded(dataset, tmp_path):
    """An early break in epoch 0 closes its FIFO so that pipe-serve moves on; epoch 1 is complete and
    decodes to exactly what the decoders give on the original files."""
    import numpy as np
    from parrecio import ParallelReader
    from parrecio.decoders import BoundingBoxes, Image

    manifest, jpegs, boxes = dataset
    root = tmp_path / "sm"
    proc = pipe_serve(root, "--epochs", 2, "--split-bytes", 512, "--quiet",
                      "--attribute-names", "source-ref,bounding-box", manifest)
    image, box = Image(size=(32, 32)), BoundingBoxes()
    try:
        wait_for_path(root / "config" / "inputdataconfig.json")
        with ParallelReader("train", fields=[image, box], workers=2, batch_size=2, sm_input_dir=str(root),
                            fifo_timeout=20) as reader:
            for first in reader:
                break
            epoch1 = list(reader)
    finally:
        err = finish(proc)
    assert proc.returncode == 0, err
    assert np.array_equal(first[0][0], image(jpegs[0]))
    got_images = np.concatenate([b[0] for b in epoch1])
    got_boxes = [x for b in epoch1 for x in b[1]]
    assert len(got_images) == len(jpegs)
    assert np.array_equal(got_images, np.stack([image(j) for j in jpegs]))
    assert all(np.array_equal(g, box(b)) for g, b in zip(got_boxes, boxes))


def test_epoch_records_count_is_known_where_it_is_cheap(dataset, tmp_path):
    """The progress total: manifest lines x attributes, an .idx's records, or what shuffling indexed."""
    manifest, _, _ = dataset
    names = ["source-ref", "bounding-box"]
    indexed, bare = tmp_path / "indexed.rec", tmp_path / "bare.rec"
    with RecordWriter(str(indexed), index=True) as writer:
        for i in range(7):
            writer.write(b"r%d" % i)
    write_rec(bare, [b"a", b"b", b"c"])
    cases = [([manifest], 2 * N_IMAGES, False), ([indexed], 7, False), ([indexed, manifest], 7 + 2 * N_IMAGES, False),
             ([bare], None, False), ([bare, manifest], 3 + 2 * N_IMAGES, True)]
    for paths, count, shuffle in cases:
        plan = EpochRecords([str(p) for p in paths], attribute_names=names, shuffle=shuffle)
        assert plan.count() == count, paths
        if count is not None:
            assert len(list(plan.records(0))) == count
    assert EpochRecords([str(bare)]).count() is None and len(list(EpochRecords([str(bare)]).records(0))) == 3


def test_pipe_serve_progress_bar_counts_every_record_it_serves(dataset, tmp_path, monkeypatch):
    manifest, jpegs, boxes = dataset
    bars = []

    class Recorder:  # stands in for parrecio.cli.progress.bar (tqdm itself: test_cli's terminal test)
        def __init__(self, total, desc, unit="records"):
            self.total, self.desc, self.n, self.open = total, desc, 0, None
            bars.append(self)

        def __enter__(self):
            self.open = True
            return self

        def __exit__(self, *exc):
            self.open = False

        def update(self, n):
            self.n += n

    monkeypatch.setattr("parrecio.cli.progress.bar", Recorder)
    root = tmp_path / "sm"
    raws = []
    reader = threading.Thread(target=lambda: raws.extend(read_served_epochs(root, 2)), daemon=True)
    reader.start()
    args = ["pipe-serve", "--root", str(root), "--epochs", "2", "--attribute-names", "source-ref,bounding-box",
            str(manifest)]
    assert main(args) == 0  # in this thread: pipe-serve installs a SIGTERM handler
    reader.join(20)
    assert len(raws) == 2 and all(records_of(raw, "concat") == expected(jpegs, boxes) for raw in raws)
    assert [(b.desc, b.total, b.n, b.open) for b in bars] == \
        [(f"pipe-serve: epoch {e}", 2 * N_IMAGES, 2 * N_IMAGES, False) for e in range(2)]
    bars.clear()
    reader = threading.Thread(target=lambda: read_served_epochs(root, 1), daemon=True)
    reader.start()
    assert main(args[:3] + ["--epochs", "1", "--quiet"] + args[5:]) == 0
    reader.join(20)
    assert bars == []  # --quiet: no bar, no lines


def _frame(cflag: int, payload: bytes) -> bytes:
    return MAGIC_BYTES + struct.pack("<I", (cflag << 29) | len(payload)) + payload + b"\0" * (-len(payload) % 4)


@pytest.mark.parametrize("convention", ["concat", "mxnet"])
def test_shuffled_records_are_read_by_their_files_convention(tmp_path, convention):
    """pipe-serve --shuffle read each record alone, with join="auto" deciding from that record on: a file
    of SageMaker's 1024-byte parts stopped mid-epoch (AmbiguousJoin), and one of MXNet's (parts cut at a
    magic) was served with payloads it does not hold (the magic between the parts left out)."""
    if convention == "concat":
        payloads = [bytes([i]) * n for i, n in enumerate([1500, 10, 2000, 20, 30])]
        data = b""
        for p in payloads:
            parts = [p[i:i + 1024] for i in range(0, len(p), 1024)]
            data += b"".join(_frame(0 if len(parts) == 1 else 1 if k == 0 else 3 if k == len(parts) - 1 else 2, q)
                             for k, q in enumerate(parts))
    else:  # a long single-part record tells "mxnet"; two records cut at the magic they hold
        payloads = [b"L" * 100, b"a" * 8 + MAGIC_BYTES + b"b" * 8, b"c" * 8 + MAGIC_BYTES + b"d" * 8, b"X" * 100]
        data = _frame(0, payloads[0]) + b"".join(_frame(1, p[:8]) + _frame(3, p[12:]) for p in payloads[1:3])
        data += _frame(0, payloads[3])
    path = tmp_path / "x.rec"
    path.write_bytes(data)
    plan = EpochRecords([str(path)], shuffle=True, seed=1)
    for epoch in range(3):
        assert sorted(plan.records(epoch)) == sorted(payloads)
    assert sorted(EpochRecords([str(path)], shuffle=True, join=convention).records(0)) == sorted(payloads)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_new_job_resumed_at_a_later_epoch_reads_the_jobs_first_fifo(tmp_path, workers):
    """SageMaker numbers each job's FIFOs from 0.  A job resumed from a checkpoint of epoch 2 waited for
    train_2 (fifo_timeout, 600 s by default), then failed with advice to raise fifo_timeout; it reads
    train_0, then train_1, with epoch 2's and 3's order."""
    from parrecio import ParallelReader
    payloads = [b"%03d" % i for i in range(40)]
    write_rec(tmp_path / "a.rec", payloads)
    root = tmp_path / "sm"
    thread = threading.Thread(target=serve_pipe_channel, daemon=True, args=(str(root), "train", [str(tmp_path / "a.rec")]),
                              kwargs=dict(epochs=2))
    thread.start()
    wait_for_path(root / "config" / "inputdataconfig.json")
    kw = dict(sm_input_dir=str(root), fifo_timeout=20, workers=workers, shuffle=True, shuffle_buffer=8, seed=5)
    with ParallelReader("train", **kw) as r:
        state = dict(r.state_dict(), epoch=2, position=10)
        r.load_state_dict(state)
        rest = list(r)
        following = list(r)
    thread.join(10)
    assert not thread.is_alive()
    assert len(rest) == 30 and len(following) == 40 and sorted(following) == payloads
    assert set(rest) < set(payloads) and rest != following[10:]  # epoch 2's order, then epoch 3's


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pass_that_never_opened_its_fifo_leaves_it_to_the_next(tmp_path, workers):
    """A pass that timed out waiting for train_0 (it came late), or was ended before it read anything,
    did not use train_0 up: the next pass, of this reader or of a new one, reads it (it waited for
    train_1, then failed advising a longer fifo_timeout)."""
    from parrecio import ParallelReader
    from parrecio.errors import SourceError as _SourceError
    payloads = [b"%03d" % i for i in range(30)]
    write_rec(tmp_path / "a.rec", payloads)
    root = tmp_path / "sm"
    write_channel_config = __import__("parrecio.tools.emulate", fromlist=["x"]).write_channel_config
    write_channel_config(str(root), "train")
    kw = dict(sm_input_dir=str(root), fifo_timeout=1, workers=workers)
    with ParallelReader("train", **kw) as r:
        with pytest.raises(_SourceError, match="did not appear within 1 s"):
            list(r)
    thread = threading.Thread(target=serve_pipe_channel, daemon=True, args=(str(root), "train", [str(tmp_path / "a.rec")]),
                              kwargs=dict(epochs=2))
    thread.start()
    with ParallelReader("train", **dict(kw, fifo_timeout=20)) as r:
        if workers == 0:  # a pass started and ended at once, before it read anything (with workers its
            it = iter(r)  # reader process may have opened the FIFO already: then that one is used up)
            del it
        assert list(r) == payloads
        assert list(r) == payloads
    thread.join(10)
    assert not thread.is_alive()
